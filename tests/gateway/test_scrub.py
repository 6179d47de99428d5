"""Issue 14 item 3: nothing internal reaches an end user.

Mock engines of every ENGINE_WIRE.md dialect answer like a real engine in trouble (``--error-message``
with a CUDA out-of-memory text, a file path, a batch id; ``--context-tokens`` for the dialects' context
overflow errors) behind one real ``servelab gateway`` subprocess. The client must get a plain message
per error class (HTTP errors, whole 200 answers carrying an error and error events mid-stream) with
none of the engine's words; the gateway's log must carry the engine's text with the request id. A 4xx
about the client's own input keeps its useful wording; a context overflow says how many tokens to drop.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process
from gateway.test_bounds_and_routing import llama  # noqa: F401  (the real llama-server, context 1024)
from gateway.test_server import events, post

from servelab.engines.mock import DIALECTS

pytestmark = pytest.mark.timeout(180)

OOM = (
    "CUDA error: out of memory; tried to allocate 2.00 GiB on GPU 0 (/opt/vllm/worker/model_runner.py:812, "
    "batch 7f3a9c12, req-4411) at http://10.0.0.7:8000/v1"
)
#: what must never appear in anything a client receives
SECRETS = (
    "cuda",
    "memory",
    "gib",
    "gpu",
    "/opt",
    "model_runner",
    "7f3a9c12",
    "req-4411",
    "10.0.0.7",
    "8000",
    "mock-engine",
)
SAFE_400 = "temperature must be non-negative, got -1.0."
INTERNAL_400 = "invalid tensor shape in batch 7f3a9c12 on device cuda:0"
#: llama-server started without --reranking/--embeddings
NOT_SERVED_501 = "This server does not support reranking. Start it with `--reranking`"
LEAKY_400 = "model /opt/x.gguf at http://10.0.0.5:9000 rejected: bad request"


def _mock(*args: str) -> Any:
    return start_mock_process("--model", "up", "--output-tokens", "6", *args)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str, dict[str, Any]]]:
    mocks: dict[str, Any] = {}
    try:
        for d in DIALECTS:
            mocks[f"{d}-http"] = _mock("--dialect", d, "--fail-http-rate", "1", "--error-message", OOM)
            mocks[f"{d}-stream"] = _mock("--dialect", d, "--stream-error-rate", "1", "--error-message", OOM)
            mocks[f"{d}-ctx"] = _mock("--dialect", d, "--context-tokens", "10")
        mocks["safe400"] = _mock("--fail-http-rate", "1", "--fail-http-status", "400", "--error-message", SAFE_400)
        mocks["internal400"] = _mock(
            "--fail-http-rate", "1", "--fail-http-status", "400", "--error-message", INTERNAL_400
        )
        mocks["auth401"] = _mock(
            "--fail-http-rate",
            "1",
            "--fail-http-status",
            "401",
            "--error-message",
            "invalid api key sk-upstream-secret for 10.0.0.7",
        )
        mocks["np501"] = _mock("--fail-http-rate", "1", "--fail-http-status", "501", "--error-message", NOT_SERVED_501)
        mocks["leaky400"] = _mock("--fail-http-rate", "1", "--fail-http-status", "400", "--error-message", LEAKY_400)
        key, entry = gateway_key("k1", "t")
        cfg = {
            "backends": [
                {"name": f"secret-backend-{n}", "kind": "mock", "base_url": p.root, "models": ["up"]}
                for n, p in mocks.items()
            ],
            "models": {n: {"targets": [{"backend": f"secret-backend-{n}", "model": "up"}]} for n in mocks},
            "tenants": {"t": {}},
            "keys": [entry],
            "retry": {"attempts": 0},
            "health": {"enabled": False},
            "breaker": {"consecutive_failures": 10_000, "min_requests": 100_000},
        }
        gw = start_gateway(cfg, Path(tmp_path_factory.mktemp("gw")))
        try:
            yield gw, key, mocks
        finally:
            stop_gateway(gw.proc)
    finally:
        for p in mocks.values():
            stop_mock_process(p.proc)


def _clean(raw: bytes, mocks: dict[str, Any]) -> None:
    low = raw.decode(errors="replace").lower()
    for word in (*SECRETS, "secret-backend", 'up"', *(str(p.root.rsplit(":", 1)[1]) for p in mocks.values())):
        assert word not in low, f"{word!r} reached the client: {raw[:600]!r}"


def _chat(model: str, stream: bool = False, words: int = 2, **kw: Any) -> dict[str, Any]:
    return {"model": model, "stream": stream, "messages": [{"role": "user", "content": "w " * words}], **kw}


@pytest.mark.parametrize("dialect", DIALECTS)
def test_engine_500_text_stays_in_the_log(setup: Any, dialect: str) -> None:
    """An engine 500 with a CUDA OOM text, a path and a batch id: the client gets 502 "the model failed
    while answering; retry the request"; the gateway log has the engine's text and the request id."""
    gw, key, mocks = setup
    for stream in (False, True):
        st, h, raw = post(gw.url + "/chat/completions", _chat(f"{dialect}-http", stream), key)
        assert st == 502, raw
        err = orjson.loads(raw)["error"]
        assert err["message"] == "the model failed while answering; retry the request"
        assert err["code"] == "upstream_error" and err["type"] == "server_error"
        _clean(raw, mocks)
        rid = h["X-Request-ID"]
        line = next((x for x in gw.stderr().splitlines() if f"request {rid}:" in x and "answered 500" in x), None)
        assert line is not None and "CUDA error: out of memory" in line and "7f3a9c12" in line, gw.stderr()[-2000:]
        rec = next(r for r in gw.access_records() if r["request_id"] == rid)
        assert rec["status"] == 502 and rec["error_code"] == "upstream_error"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_error_event_mid_stream_and_in_a_200_body_is_plain(setup: Any, dialect: str) -> None:
    """An error event inside a 200 stream (after tokens went out): the client gets the tokens, then one
    clean OpenAI-shaped error event and ``[DONE]``; non-streamed, the engine's 500 (or 200 error body)
    becomes the same plain 502."""
    gw, key, mocks = setup
    st, h, raw = post(gw.url + "/chat/completions", _chat(f"{dialect}-stream", True), key)
    assert st == 200, raw
    evs = events(raw)
    assert evs[-1] == b"[DONE]" and any(b'"content"' in e for e in evs), raw
    err = orjson.loads(evs[-2])["error"]
    assert err["message"] == "the model failed while answering; retry the request", err
    _clean(raw, mocks)
    assert f"request {h['X-Request-ID']}:" in gw.stderr()
    st, _, raw = post(gw.url + "/chat/completions", _chat(f"{dialect}-stream"), key)
    assert st == 502 and orjson.loads(raw)["error"]["code"] == "upstream_error", raw
    _clean(raw, mocks)


@pytest.mark.parametrize("dialect", [d for d in DIALECTS if d != "ollama"])
def test_context_overflow_says_how_many_tokens_to_remove(setup: Any, dialect: str) -> None:
    """Each dialect's context overflow (ENGINE_WIRE.md case 18) becomes 400 ``context_length_exceeded``
    with the numbers: prompt tokens, context, and how many tokens to remove (computed by the gateway)."""
    gw, key, mocks = setup
    st, _, raw = post(gw.url + "/chat/completions", _chat(f"{dialect}-ctx", words=12, max_tokens=4), key)
    assert st == 400, raw
    err = orjson.loads(raw)["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    # llama-server checks the prompt alone (12 >= 10: remove 3); the others prompt + max_tokens (16 > 10: 6)
    need = 3 if dialect == "llamacpp" else 6
    assert "12 prompt tokens" in err["message"] and "context of 10 tokens" in err["message"], err
    assert f"remove at least {need} tokens" in err["message"], err
    _clean(raw, mocks)
    assert post(gw.url + "/chat/completions", _chat(f"{dialect}-ctx", words=2, max_tokens=4), key)[0] == 200


def test_a_4xx_about_the_clients_input_keeps_its_words_internals_do_not(setup: Any) -> None:
    """An engine 400 about the request's own values keeps its wording; one naming a tensor, a batch id
    and a device gets the generic 400; an engine 401 (the gateway's upstream key is wrong) is not
    shown as the client's auth problem: 503 "temporarily unavailable"."""
    gw, key, mocks = setup
    st, _, raw = post(gw.url + "/chat/completions", _chat("safe400"), key)
    assert st == 400 and orjson.loads(raw)["error"]["message"] == f"the model rejected the request: {SAFE_400}"
    st, _, raw = post(gw.url + "/chat/completions", _chat("internal400"), key)
    assert st == 400, raw
    assert orjson.loads(raw)["error"]["message"] == (
        "the model rejected the request; check its parameters (values and types)"
    )
    _clean(raw, mocks)
    st, h, raw = post(gw.url + "/chat/completions", _chat("auth401"), key)
    assert st == 503 and orjson.loads(raw)["error"]["code"] == "model_unavailable", raw
    assert "sk-upstream" not in raw.decode() and h.get("Retry-After") == "1"


def test_a_4xx_naming_a_path_and_a_url_reads_as_a_sentence(setup: Any) -> None:
    """An engine 400 "model /opt/x.gguf at http://10.0.0.5:9000 rejected: bad request" reached the client
    as "the model rejected the request: model at rejected: bad request". Now a sentence, and neither
    the path nor the address."""
    gw, key, mocks = setup
    st, _, raw = post(gw.url + "/chat/completions", _chat("leaky400"), key)
    assert st == 400, raw
    msg = orjson.loads(raw)["error"]["message"]
    assert msg == "the model rejected the request: bad request", msg
    for leak in ("/opt", "x.gguf", "10.0.0.5", "9000", "http"):
        assert leak not in msg, msg
    _clean(raw, mocks)


def test_an_engine_501_is_not_served_and_not_worth_a_retry(setup: Any) -> None:
    """llama-server without --reranking answers 501; the gateway said 502 "failed while answering; retry
    the request", which no retry can change. Now 501 ``endpoint_not_served`` with ``x-should-retry: false``
    (the SDKs then do not retry on their own), no engine words, no Retry-After."""
    gw, key, mocks = setup
    st, h, raw = post(gw.url + "/chat/completions", _chat("np501"), key)
    assert st == 501, raw
    err = orjson.loads(raw)["error"]
    assert err["code"] == "endpoint_not_served" and "does not serve this endpoint" in err["message"], err
    assert "retry the request" not in err["message"] and "--reranking" not in err["message"]
    assert h.get("x-should-retry") == "false" and "Retry-After" not in h, h
    _clean(raw, mocks)


def test_real_llama_server_context_overflow_says_how_many_tokens_to_remove(llama: Any, tmp_path: Path) -> None:  # noqa: F811
    """The real llama-server (context 1024) answers a too-long prompt with ``exceed_context_size_error``
    and its ``n_prompt_tokens``/``n_ctx``: the client's 400 has those numbers and how many to remove,
    and neither the engine's wording, its type nor the GGUF path."""
    import re

    key, entry = gateway_key("k1", "t")
    gw = start_gateway(
        {
            "backends": [
                {
                    "name": "llama-secret",
                    "kind": "llamacpp",
                    "base_url": llama.base_url,
                    "models": ["gemma"],
                    "read_timeout_s": 120,
                }
            ],
            "models": {"g": {"targets": [{"backend": "llama-secret"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        },
        tmp_path / "gw",
    )
    try:
        st, h, raw = post(gw.url + "/chat/completions", _chat("g", words=1500, max_tokens=4), key)
        assert st == 400, raw
        err = orjson.loads(raw)["error"]
        m = re.search(
            r"(\d+) prompt tokens do not fit its context of (\d+) tokens; remove at least (\d+) tokens", err["message"]
        )
        assert m and err["code"] == "context_length_exceeded", err
        prompt, ctx, drop = map(int, m.groups())
        assert ctx == 1024 and prompt > 1024 and drop == prompt - ctx + 1
        low = raw.decode().lower()
        assert "exceed_context_size" not in low and "gguf" not in low and "llama-secret" not in low
        assert "exceed_context_size_error" in gw.stderr()  # the engine's own answer is in the log
        assert post(gw.url + "/chat/completions", _chat("g", max_tokens=4), key)[0] == 200
    finally:
        stop_gateway(gw.proc)


def test_user_safe_text_keeps_numbers_and_withholds_ids() -> None:
    """Plain numbers in a validation message stay; hex ids, devices, paths and traces withhold the text."""
    from servelab.gateway.scrub import user_safe_text

    assert (
        user_safe_text("max_tokens must be at most 131072, got 200000")
        == "max_tokens must be at most 131072, got 200000"
    )
    for internal in (
        "request abc123def failed",
        "bad value in batch 7",
        "cuda:0 rejected it",
        'Traceback (most recent call last):\n  File "x.py", line 1',
        "shape error at model_runner.py:12",
        "uuid 123e4567-e89b-12d3-a456-426614174000",
    ):
        assert user_safe_text(internal) is None, internal


def test_an_engine_echoing_the_prompt_does_not_put_it_in_the_log(gateway: Any, mock_engine: Any) -> None:
    """An engine 400 that echoes the request's input (as vLLM's pydantic errors do, cut with ``...``)
    is logged with the echoed prompt replaced by [PROMPT]; the rest of the engine's text stays."""
    from servelab.gateway.scrub import redact_prompt

    assert (
        redact_prompt("bad input_value='hello secret wor...' here", "hello secret world")
        == "bad input_value='[PROMPT]' here"
    )
    marker = "PROMPTMARK" + "9f" * 6
    echo = f"1 validation error: Input should be a valid list [type=list_type, input_value='{marker} tell me...']"
    eng = mock_engine("--fail-http-rate", "1", "--fail-http-status", "400", "--error-message", echo)
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "vllm", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    st, h, _ = post(
        gw.url + "/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": f"{marker} tell me a story"}]},
        key,
    )
    assert st == 400
    line = next(x for x in gw.stderr().splitlines() if f"request {h['X-Request-ID']}:" in x)
    assert marker not in gw.stderr() and "[PROMPT]" in line and "valid list" in line, line
