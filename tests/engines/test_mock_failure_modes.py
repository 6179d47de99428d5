"""Mock engine extras for testing candidates that fail: ``invalid_json`` (broken structured output) and
``crash_after_requests`` (the process dies mid-response).

Crash tests always run the mock as a subprocess: ``os._exit(3)`` in-process would end pytest.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from typing import Any

import aiohttp
import orjson
import pytest

from servelab.engines.mock import DIALECTS, MockConfig, start_mock, validate_config
from servelab.engines.mock.plan import break_json
from servelab.wire.client import make_session, send
from servelab.wire.types import RequestRecord, RequestSpec

pytestmark = pytest.mark.timeout(120)

MSG = [{"role": "user", "content": "give me a person as JSON"}]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array"}},
    "required": ["name", "age", "tags"],
}
RF_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
RF_OBJECT = {"type": "json_object"}


async def _chat(base_url: str, body: dict[str, Any]) -> tuple[int, str]:
    """POST a chat completion; return (status, assembled content) for stream and non-stream answers."""
    async with aiohttp.ClientSession() as s, s.post(base_url + "/chat/completions", json=body) as r:
        raw = await r.read()
    if r.status != 200:
        return r.status, raw.decode()
    if not body.get("stream"):
        return 200, orjson.loads(raw)["choices"][0]["message"]["content"]
    parts: list[str] = []
    for line in raw.decode().splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = orjson.loads(line[6:])
        for ch in ev.get("choices") or []:
            c = (ch.get("delta") or {}).get("content")
            if c:
                parts.append(c)
    return 200, "".join(parts)


def _run_with_mock(cfg: MockConfig, body: dict[str, Any]) -> tuple[int, str]:
    async def main() -> tuple[int, str]:
        server = await start_mock(cfg)
        try:
            return await _chat(server.base_url, body)
        finally:
            await server.close()

    return asyncio.run(main())


# ------------------------------------------------------------------------------------------------
# invalid_json


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("rf", [RF_SCHEMA, RF_OBJECT], ids=["json_schema", "json_object"])
def test_invalid_json_content_does_not_parse(dialect: str, stream: bool, rf: dict[str, Any]) -> None:
    body = {"model": "m", "messages": MSG, "stream": stream, "response_format": rf}
    status, content = _run_with_mock(MockConfig(dialect=dialect, invalid_json=True, tokens_per_chunk=2), body)
    assert status == 200
    assert content.startswith("{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)


@pytest.mark.parametrize("rf", [RF_SCHEMA, RF_OBJECT], ids=["json_schema", "json_object"])
def test_without_invalid_json_the_content_parses(rf: dict[str, Any]) -> None:
    body = {"model": "m", "messages": MSG, "stream": True, "response_format": rf}
    status, content = _run_with_mock(MockConfig(), body)
    assert status == 200
    obj = json.loads(content)
    assert set(obj) == ({"name", "age", "tags"} if rf is RF_SCHEMA else {"answer"})


def test_invalid_json_cut_looks_like_a_truncated_object() -> None:
    body = {"model": "m", "messages": MSG, "stream": True, "response_format": RF_SCHEMA}
    _, valid = _run_with_mock(MockConfig(), body)
    _, broken = _run_with_mock(MockConfig(invalid_json=True), body)
    assert valid.startswith(broken) and broken.endswith(",") and len(broken) < len(valid)


def test_invalid_json_leaves_plain_requests_alone() -> None:
    body = {"model": "m", "messages": MSG, "stream": True}
    status, content = _run_with_mock(MockConfig(invalid_json=True, output_tokens=3), body)
    assert status == 200 and content == " tok0 tok1 tok2"


@pytest.mark.parametrize(
    "obj", [{"answer": "mock"}, {"a": 1, "b": {"c": 2, "d": [1, 2]}}, {"s": "x, y"}, {"e": {}}, {"a": "}"}]
)
def test_break_json_never_parses(obj: dict[str, Any]) -> None:
    text = json.dumps(obj, separators=(",", ":"))
    broken = break_json(text)
    assert text.startswith(broken) and len(broken) < len(text)
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken)


# ------------------------------------------------------------------------------------------------
# crash_after_requests (subprocess only)


def test_validate_crash_after_requests() -> None:
    validate_config(MockConfig(crash_after_requests=0))
    validate_config(MockConfig(crash_after_requests=None))
    with pytest.raises(ValueError, match="--crash-after-requests -1"):
        validate_config(MockConfig(crash_after_requests=-1))


async def _send_n(base_url: str, n: int, stream: bool = True) -> list[RequestRecord]:
    spec = RequestSpec(endpoint="chat", messages=MSG, max_tokens=64, extra={"stream": stream} if not stream else {})
    recs = []
    async with make_session() as session:
        for i in range(n):
            rec = RequestRecord(request_id=i)
            await send(session, base_url, "m", spec, rec, timeout_s=20)
            recs.append(rec)
    return recs


@pytest.mark.parametrize("dialect", DIALECTS)
def test_crash_after_requests_exits_3_mid_stream(mock_engine, dialect: str) -> None:
    mp = mock_engine("--dialect", dialect, "--crash-after-requests", "2", "--output-tokens", "8", "--itl-ms", "2")
    recs = asyncio.run(_send_n(mp.base_url, 3))
    assert [r.ok for r in recs] == [True, True, False]
    ok, crashed = recs[0], recs[2]
    assert ok.output_tokens == 8
    assert crashed.status == 200  # the response had started
    assert 0 < len(crashed.chunk_ns) < 8  # some tokens, not all
    assert not crashed.saw_done
    assert mp.proc.wait(timeout=10) == 3
    err = mp.proc.stderr.read().decode() if mp.proc.stderr else ""
    assert "injected crash at completion request 3" in err and "Traceback" not in err


def test_crash_after_zero_requests_one_token_held_headers(mock_engine) -> None:
    """A one-chunk answer on a dialect that holds its headers: the headers go out, then the crash."""
    mp = mock_engine("--dialect", "llamacpp", "--crash-after-requests", "0", "--output-tokens", "1")
    (rec,) = asyncio.run(_send_n(mp.base_url, 1))
    assert not rec.ok and rec.status == 200 and not rec.chunk_ns
    assert mp.proc.wait(timeout=10) == 3


def test_crash_non_streamed(mock_engine) -> None:
    mp = mock_engine("--crash-after-requests", "1", "--output-tokens", "4")
    recs = asyncio.run(_send_n(mp.base_url, 2, stream=False))
    assert recs[0].ok and not recs[1].ok and recs[1].status is None
    assert mp.proc.wait(timeout=10) == 3


def test_cli_invalid_json_flag(mock_engine) -> None:
    mp = mock_engine("--invalid-json")
    status, content = asyncio.run(
        _chat(mp.base_url, {"model": "m", "messages": MSG, "stream": True, "response_format": RF_SCHEMA})
    )
    assert status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)
    assert mp.proc.poll() is None


def test_cli_help_states_units_of_new_options() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "servelab.engines.mock", "--help"],
        capture_output=True,
        timeout=30,
        env={"COLUMNS": "250", "PATH": "/usr/bin:/bin"},
    )
    out = p.stdout.decode()
    assert p.returncode == 0
    assert "--invalid-json" in out
    line = next(ln for ln in out.splitlines() if "--crash-after-requests" in ln)
    assert "count" in line


def test_cli_negative_crash_after_is_one_line_exit_2() -> None:
    p = subprocess.run(
        [sys.executable, "-m", "servelab.engines.mock", "--crash-after-requests", "-1"], capture_output=True, timeout=30
    )
    assert p.returncode == 2
    err = p.stderr.decode().strip()
    assert len(err.splitlines()) == 1 and "--crash-after-requests -1" in err


def test_stop_sequences_cut_the_answer_before_the_stop_string():
    """Engines end the answer right before a stop string, with finish reason stop (smoke test 'stop')."""
    from servelab.engines.mock.plan import plan_answer

    plan = plan_answer(MockConfig(output_tokens=10), {"stop": ["ok5"], "max_tokens": 10}, chat=True)
    text = "".join(c[1] for c in plan.chunks)
    assert text == " tok0 tok1 tok2 tok3 tok4 t" and plan.finish == "stop"
    plan = plan_answer(MockConfig(output_tokens=10), {"stop": "nope"}, chat=True)
    assert plan.finish == "stop" and "".join(c[1] for c in plan.chunks).endswith("tok9")
    plan = plan_answer(MockConfig(output_tokens=10), {"stop": ["tok9"], "max_tokens": 3}, chat=True)
    assert plan.finish == "length"


# ------------------------------------------------------------------------------------------------
# error_message and context_tokens (what a real engine says in trouble)

OOM = "CUDA error: out of memory (/opt/vllm/worker.py:812, batch 7f3a9c)"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_error_message_is_the_text_of_injected_errors(dialect: str) -> None:
    """``error_message`` replaces the mock's text in injected HTTP errors and in-stream error events,
    in every dialect's error shape (read back with the wire layer's normaliser)."""
    from servelab.wire.errors import error_from_body, error_from_event

    status, raw = _run_with_mock(
        MockConfig(dialect=dialect, fail_http_rate=1.0, error_message=OOM), {"model": "m", "messages": MSG}
    )
    assert status == 500 and error_from_body(raw.encode(), status).message == OOM

    async def stream() -> bytes:
        server = await start_mock(MockConfig(dialect=dialect, stream_error_rate=1.0, error_message=OOM))
        got = b""
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(
                    server.base_url + "/chat/completions", json={"model": "m", "messages": MSG, "stream": True}
                ) as r,
            ):
                async for data in r.content.iter_any():
                    got += data
        except aiohttp.ClientPayloadError:  # llama-server and Ollama close after the error event
            pass
        finally:
            await server.close()
        return got

    raw_stream = asyncio.run(stream())
    events = [orjson.loads(x[6:]) for x in raw_stream.split(b"\n\n") if x.startswith(b"data: {")]
    assert any((e := error_from_event(ev, 200)) is not None and e.message == OOM for ev in events), raw_stream


@pytest.mark.parametrize("dialect", DIALECTS)
def test_context_tokens_answers_the_dialects_overflow_error(dialect: str) -> None:
    """Over ``context_tokens`` each dialect answers its own context-overflow error (ENGINE_WIRE.md case
    18), which the wire layer recognises; Ollama truncates silently; a request that fits is answered."""
    from servelab.wire.errors import error_from_body, is_context_overflow

    cfg = MockConfig(dialect=dialect, context_tokens=10)
    long = {"model": "m", "messages": [{"role": "user", "content": "w " * 12}], "max_tokens": 4}
    status, raw = _run_with_mock(cfg, long)
    if dialect == "ollama":
        assert status == 200
    else:
        assert status == (422 if dialect == "tgi" else 400), raw
        assert is_context_overflow(error_from_body(raw.encode(), status)), raw
        assert "12" in raw and "10" in raw
    short = {"model": "m", "messages": [{"role": "user", "content": "w w"}], "max_tokens": 4}
    assert _run_with_mock(cfg, short)[0] == 200
