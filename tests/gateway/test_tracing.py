"""OpenTelemetry traces of gateway requests (servelab.gateway.tracing; issue 24 item 2).

A real gateway process exports over OTLP/HTTP to a tiny receiver (tests/otlp_receiver.py: http.server in a
thread), which decodes the protobuf with the message classes opentelemetry-proto ships; the spans' GenAI attributes,
their parent/child links, the trace id the mock engine received in ``traceparent`` and the absence of the
prompt's text are checked on what arrived.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

pytest.importorskip("opentelemetry.sdk")
from otlp_receiver import Receiver, attrs

SECRET = "zebra-quasar-7731"  # in every prompt: must appear in no span unless the tenant logs prompts
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A mock engine, the receiver, and a gateway tracing every request to it: model ``m`` on backend
    ``b``; ``m2`` on a backend nothing listens on, falling back to ``m``; tenant ``t`` (no prompt
    logging) and ``tp`` (``log_prompts``)."""
    rx = Receiver()
    eng = start_mock_process("--ttft-ms", "5", "--itl-ms", "1", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    key_p, entry_p = gateway_key("k2", "tp")
    cfg = {
        "backends": [
            {"name": "b", "kind": "mock", "base_url": eng.root, "models": ["up-m"]},
            {
                "name": "dead",
                "kind": "vllm",
                "base_url": "http://127.0.0.1:9",
                "models": ["up-d"],
                "connect_timeout_s": 0.5,
            },
        ],
        "models": {
            "m": {"targets": [{"backend": "b"}]},
            "m2": {"targets": [{"backend": "dead"}], "fallback": [{"model": "m"}]},
        },
        "tenants": {"t": {}, "tp": {"log_prompts": True, "redact": []}},
        "keys": [entry, entry_p],
        "health": {"enabled": False},
        "retry": {"backoff_s": 0.01},
        "tracing": {"endpoint": rx.url, "sample_ratio": 1.0, "service_name": "gw-under-test"},
    }
    gw = start_gateway(cfg, tmp_path_factory.mktemp("traced"))
    try:
        yield {"rx": rx, "eng": eng, "gw": gw, "key": key, "key_p": key_p}
    finally:
        stop_gateway(gw.proc)
        stop_mock_process(eng.proc)
        rx.server.shutdown()


def _chat(
    url: str, key: str, model: str, headers: dict[str, str] | None = None, stream: bool = True
) -> tuple[int, str]:
    async def go() -> tuple[int, str]:
        body = {
            "model": model,
            "stream": stream,
            "max_tokens": 4,
            "messages": [{"role": "user", "content": f"say hello {SECRET}"}],
        }
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}", **(headers or {})}
            ) as r,
        ):
            await r.read()
            return r.status, r.headers["X-Request-ID"]

    import asyncio

    return asyncio.run(go())


def _engine_record(eng: Any, rid: str) -> dict[str, Any]:
    import urllib.request

    with urllib.request.urlopen(eng.root + "/mock/records", timeout=5) as f:
        recs = orjson.loads(f.read())
    return next(r for r in recs if r["request_id"] == rid)


def test_request_span_continues_the_client_trace_with_genai_attributes_and_children(traced) -> None:
    rx, gw = traced["rx"], traced["gw"]
    status, rid = _chat(gw.url, traced["key"], "m", {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
    assert status == 200
    spans = rx.trace(CLIENT_TRACE, 3)
    by_name = {s.name: s for s in spans}
    assert set(by_name) == {"chat m", "gateway admission", "chat b"}, list(by_name)
    root, adm, att = by_name["chat m"], by_name["gateway admission"], by_name["chat b"]
    assert root.parent_span_id.hex() == CLIENT_SPAN  # continues the client's span
    assert adm.parent_span_id == root.span_id and att.parent_span_id == root.span_id
    assert root.kind == root.SPAN_KIND_SERVER and att.kind == att.SPAN_KIND_CLIENT
    a = attrs(root)
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.provider.name"] == "mock"
    assert a["gen_ai.request.model"] == "m" and a["gen_ai.response.model"] == "up-m"
    assert a["gen_ai.usage.output_tokens"] == 4 and a["gen_ai.usage.input_tokens"] > 0
    assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(traced["eng"].root.rsplit(":", 1)[1])
    assert a["servelab.request_id"] == rid and a["http.response.status_code"] == 200
    assert 0 < a["gen_ai.response.time_to_first_chunk"] < 5 and "error.type" not in a
    assert (
        root.start_time_unix_nano
        <= adm.start_time_unix_nano
        <= adm.end_time_unix_nano
        <= att.start_time_unix_nano
        <= att.end_time_unix_nano
        <= root.end_time_unix_nano
    )
    assert {e.name for e in root.events} >= {"routed", "first_token", "last_token"}
    b = attrs(att)
    assert b["servelab.attempt"] == 1 and b["servelab.backend"] == "b" and b["http.response.status_code"] == 200
    # the engine received the attempt span's own id in the same trace
    tp = _engine_record(traced["eng"], rid)["traceparent"]
    assert tp == f"00-{CLIENT_TRACE}-{att.span_id.hex()}-01"
    with rx.lock:
        assert not any(SECRET.encode() in raw for raw in rx.raw), "prompt text was exported in a span"


def test_failed_attempt_and_fallback_are_child_spans_with_their_error(traced) -> None:
    rx, gw = traced["rx"], traced["gw"]
    trace = "a" * 31 + "1"
    status, rid = _chat(gw.url, traced["key"], "m2", {"traceparent": f"00-{trace}-{'b' * 16}-01"}, stream=False)
    assert status == 200
    spans = rx.trace(trace, 4)
    root = next(s for s in spans if s.name == "chat m2")
    atts = sorted((s for s in spans if s.kind == s.SPAN_KIND_CLIENT), key=lambda s: attrs(s)["servelab.attempt"])
    assert [s.name for s in atts] == ["chat dead", "chat b"]
    first, second = (attrs(s) for s in atts)
    assert first["error.type"] == "connect" and atts[0].status.code == atts[0].status.STATUS_CODE_ERROR
    assert first["gen_ai.provider.name"] == "vllm" and first["server.port"] == 9
    assert "error.type" not in second and second["servelab.attempt"] == 2
    a = attrs(root)
    assert a["servelab.retries"] == 1 and a["servelab.fallback"] is True and a["servelab.backend"] == "b"
    assert _engine_record(traced["eng"], rid)["traceparent"] == f"00-{trace}-{atts[1].span_id.hex()}-01"


def test_new_trace_without_client_header_and_prompt_only_when_tenant_logs_prompts(traced) -> None:
    rx, gw = traced["rx"], traced["gw"]
    status, rid = _chat(gw.url, traced["key_p"], "m")
    assert status == 200
    tp = _engine_record(traced["eng"], rid)["traceparent"]
    version, trace, _span, flags = tp.split("-")
    assert version == "00" and flags == "01" and trace != CLIENT_TRACE
    root = next(s for s in rx.trace(trace, 3) if s.name == "chat m")
    assert root.parent_span_id == b""  # a root: the client sent no traceparent
    a = attrs(root)
    assert SECRET in a["servelab.prompt"] and a["servelab.tenant"] == "tp"


def test_refused_request_has_an_admission_span_with_the_error(traced) -> None:
    rx, gw = traced["rx"], traced["gw"]
    trace = "c" * 31 + "2"
    status, _ = _chat(gw.url, "sk-sl-k1-" + "0" * 64, "m", {"traceparent": f"00-{trace}-{'d' * 16}-01"})
    assert status == 401
    spans = {s.name: s for s in rx.trace(trace, 2)}
    adm = attrs(spans["gateway admission"])
    assert adm["http.response.status_code"] == 401 and adm["error.type"]
    root = attrs(spans["chat"])  # refused before its model was read
    assert root["error.type"] == adm["error.type"] and "gen_ai.request.model" not in root


def test_sampling_follows_the_client_flag_else_the_ratio() -> None:
    from servelab.gateway.config import TracingSection
    from servelab.gateway.tracing import Tracing

    tr = Tracing(TracingSection(endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.0))
    try:
        assert not tr.begin({}).sampled  # ratio 0, no client trace
        t = tr.begin({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
        assert t.sampled and f"{t.trace_id:032x}" == CLIENT_TRACE
        h = t.headers(1)["traceparent"]
        assert h.startswith(f"00-{CLIENT_TRACE}-") and h.endswith("-01") and CLIENT_SPAN not in h
        assert t.headers(1)["traceparent"] == h and t.headers(2)["traceparent"] != h  # one span id per attempt
        assert not tr.begin({"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"}).sampled
        bad = tr.begin({"traceparent": "00-" + "0" * 32 + "-" + CLIENT_SPAN + "-01"})  # invalid: a new trace
        assert f"{bad.trace_id:032x}" != "0" * 32 and bad.parent is None
    finally:
        tr.shutdown()


def test_missing_opentelemetry_is_one_config_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from servelab.gateway.config import TracingSection
    from servelab.gateway.tracing import Tracing
    from servelab.wire.errors import ConfigError

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    with pytest.raises(ConfigError) as e:
        Tracing.from_section(TracingSection(endpoint="http://127.0.0.1:4318/v1/traces"))
    assert "\n" not in str(e.value) and "servelab[otel]" in str(e.value) and str(e.value).startswith("tracing.endpoint")
    assert Tracing.from_section(TracingSection()) is None  # off: nothing imported, nothing needed


def test_gateway_imports_no_opentelemetry_while_tracing_is_off() -> None:
    code = (
        "import sys, servelab.gateway.server, servelab.gateway.cli; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=Path(__file__).parent
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
