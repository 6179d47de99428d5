"""The gateway server against servelab's mock engine (several dialects), as a real subprocess.

One module-scoped gateway serves most tests (its models point at mock engines speaking vLLM, SGLang, TGI,
llama-server and Ollama dialects, with failure injection); tests that rewrite the config or need their
own counters start their own gateway.
"""

from __future__ import annotations

import asyncio
import socket
import time
import urllib.error
import urllib.request
from itertools import pairwise
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from conftest import ADMIN_TOKEN, gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

DIALECTS = ("vllm", "sglang", "tgi", "llamacpp", "ollama")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(
    url: str,
    body: Any,
    key: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    method: str = "POST",
) -> tuple[int, dict[str, str], bytes]:
    """One request with urllib; returns (status, headers, body) also for 4xx/5xx."""
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (None if body is None else orjson.dumps(body))
    req = urllib.request.Request(url, data=data, headers=h, method=method if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def events(body: bytes) -> list[bytes]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [line[5:].strip() for line in body.split(b"\n") if line.startswith(b"data:")]


def chat(model: str, stream: bool = True, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "say something"}], "stream": stream, **kw}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Mock engines + one gateway over them. Yields a namespace with .gw, .key, .other_key, .mocks."""
    mocks: dict[str, Any] = {}
    started = []
    try:
        for d in DIALECTS:
            mocks[d] = start_mock_process("--dialect", d, "--output-tokens", "6")
        mocks["slow"] = start_mock_process("--dialect", "vllm", "--output-tokens", "12", "--itl-ms", "40")
        mocks["busy"] = start_mock_process("--dialect", "vllm", "--fail-http-rate", "1", "--fail-http-status", "503")
        mocks["cut"] = start_mock_process("--dialect", "vllm", "--cut-rate", "1", "--output-tokens", "8")
        mocks["serr-vllm"] = start_mock_process("--dialect", "vllm", "--stream-error-rate", "1")
        mocks["serr-llamacpp"] = start_mock_process("--dialect", "llamacpp", "--stream-error-rate", "1")
        mocks["serr-sglang"] = start_mock_process("--dialect", "sglang", "--stream-error-rate", "1")
        mocks["bad400"] = start_mock_process("--dialect", "vllm", "--fail-http-rate", "1", "--fail-http-status", "400")
        started = list(mocks.values())
        dead = f"http://127.0.0.1:{_free_port()}"
        backends = [
            {
                "name": f"be-{n}",
                "kind": "mock",
                "base_url": m.root,
                "models": ["m"],
                "pool": "p2" if n == "vllm" else "p1",
            }
            for n, m in mocks.items()
        ]
        backends.append({"name": "be-dead", "kind": "mock", "base_url": dead, "models": ["m"], "pool": "p1"})
        models: dict[str, Any] = {
            f"m-{d}": {"targets": [{"backend": f"be-{d}"}], "capabilities": {"context_tokens": 512}} for d in DIALECTS
        }
        models["m-vllm"]["capabilities"] = {"context_tokens": 512, "json_schema": False, "tools": False}
        models["rich"] = {
            "targets": [{"backend": "be-vllm"}],
            "capabilities": {
                "context_tokens": 4096,
                "tools": True,
                "json_schema": True,
                "input_modalities": ["text", "image"],
            },
        }
        for n in ("slow", "cut", "serr-vllm", "serr-llamacpp", "serr-sglang", "bad400"):
            models[n] = {"targets": [{"backend": f"be-{n}"}]}
        # the first target is tried first (its group has all the weight), the second only as a retry
        models["retry-connect"] = {
            "targets": [{"backend": "be-dead", "weight": 1}, {"backend": "be-vllm", "weight": 0}]
        }
        models["retry-503"] = {"targets": [{"backend": "be-busy", "weight": 1}, {"backend": "be-vllm", "weight": 0}]}
        models["falls-back"] = {
            "targets": [{"backend": "be-dead"}],
            "fallback": [{"model": "m-sglang", "max_tokens": 3}],
        }
        models["secret"] = {"targets": [{"backend": "be-vllm"}]}
        key, entry = gateway_key("k1", "t")
        key2, entry2 = gateway_key("k2", "u")
        cfg = {
            "server": {"max_body_bytes": 4096, "max_tokens_limit": 1000},
            "backends": backends,
            "models": models,
            "tenants": {
                "t": {"allowed_models": [m for m in models if m != "secret"]},
                "u": {"allowed_models": ["m-vllm"], "rpm": 1},
            },
            "keys": [entry, entry2],
            "health": {"enabled": False},
            "retry": {"attempts": 2, "backoff_s": 0.01, "budget_ratio": 1.0},
            "breaker": {"consecutive_failures": 50, "min_requests": 1000},
        }
        gw = start_gateway(cfg, tmp_path_factory.mktemp("gw"))
    except BaseException:
        for m in started or mocks.values():
            stop_mock_process(m.proc)
        raise

    class Env:
        pass

    e = Env()
    e.gw, e.key, e.other_key, e.mocks = gw, key, key2, mocks
    yield e
    stop_gateway(gw.proc)
    for m in mocks.values():
        stop_mock_process(m.proc)


def _err(body: bytes) -> dict[str, Any]:
    d = orjson.loads(body)
    assert set(d) == {"error"} and {"message", "type", "param", "code"} <= set(d["error"]), d
    return d["error"]


# ------------------------------------------------------------------------------------------ bad input


def test_auth_errors_are_openai_shaped_401(env: Any) -> None:
    url = env.gw.url + "/chat/completions"
    for key in (None, "sk-nope", "sk-sl-k1-" + "0" * 64):
        st, h, b = post(url, chat("m-vllm"), key)
        assert st == 401, b
        e = _err(b)
        assert e["type"] == "authentication_error" and e["code"] == "invalid_api_key"
        assert h.get("X-Request-ID")
    st, _, b = post(env.gw.url + "/models", None, None)
    assert st == 401


def test_model_errors_404_403_and_bad_json_400(env: Any) -> None:
    url = env.gw.url + "/chat/completions"
    st, _, b = post(url, chat("no-such-model"), env.key)
    assert st == 404 and _err(b)["code"] == "model_not_found"
    st, _, b = post(url, chat("secret"), env.key)
    assert st == 403 and _err(b)["code"] == "model_not_allowed"
    st, _, b = post(url, None, env.key, raw=b"{not json")
    assert st == 400 and _err(b)["code"] == "invalid_json"
    st, _, b = post(url, None, env.key, raw=b"[1, 2]")
    assert st == 400
    for bad, param in (
        (chat("m-vllm", messages="hi"), "messages"),
        (chat("m-vllm", stream="yes"), "stream"),
        (chat("m-vllm", max_tokens="10"), "max_tokens"),
        ({"messages": []}, "model"),
        (chat("m-vllm", max_tokens=0), "max_tokens"),
    ):
        st, _, b = post(url, bad, env.key)
        assert st == 400, (bad, b)
        assert _err(b)["param"] == param, b
    # completions with a prompt of the wrong type
    st, _, b = post(env.gw.url + "/completions", {"model": "m-vllm", "prompt": 5}, env.key)
    assert st == 400 and _err(b)["param"] == "prompt"


def test_unknown_model_is_echoed_cut_to_100_chars_on_every_api(env: Any) -> None:
    """A 100,000-character ``model`` came back whole in the 404 of chat, messages, responses and rerank;
    the message now repeats its first 100 characters and an ellipsis (3,000 here: the body limit is 4 KiB)."""
    name = "x" * 3000
    bodies = {
        "/chat/completions": chat(name),
        "/messages": {"model": name, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        "/responses": {"model": name, "input": "hi"},
        "/rerank": {"model": name, "query": "q", "documents": ["a", "b"]},
    }
    for path, body in bodies.items():
        st, _, b = post(env.gw.url + path, body, env.key)
        assert st == 404, (path, st, b[:300])
        msg = orjson.loads(b)["error"]["message"]
        assert "x" * 100 + "…" in msg and "x" * 101 not in msg and len(msg) < 300, (path, msg[:300])


def test_body_size_413_and_max_tokens_limit_400(env: Any) -> None:
    url = env.gw.url + "/chat/completions"
    big = chat("m-vllm", messages=[{"role": "user", "content": "x" * 5000}])
    st, _, b = post(url, big, env.key)
    assert st == 413 and _err(b)["code"] == "request_too_large"
    st, _, b = post(url, chat("m-vllm", max_tokens=1001), env.key)
    assert st == 400 and _err(b)["code"] == "max_tokens_too_large" and "1000" in _err(b)["message"]
    assert post(url, chat("m-vllm", max_tokens=1000, stream=False), env.key)[0] == 400  # > 512 context
    assert post(url, chat("rich", max_tokens=1000, stream=False), env.key)[0] == 200


def test_registry_refuses_what_the_model_does_not_support(env: Any) -> None:
    url = env.gw.url + "/chat/completions"
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    image = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    cases = [
        (chat("m-vllm", tools=tools), "tools_not_supported", "tools"),
        (chat("m-vllm", messages=image), "modality_not_supported", "messages"),
        (chat("m-vllm", response_format=rf), "json_schema_not_supported", "response_format"),
        (
            chat("m-vllm", messages=[{"role": "user", "content": "word " * 600}], max_tokens=200),
            "context_length_exceeded",
            "messages",
        ),
    ]
    before = orjson.loads(post(env.mocks["vllm"].root + "/mock/stats", None)[2])["requests"]
    for body, code, param in cases:
        st, _, b = post(url, body, env.key)
        e = _err(b)
        assert st == 400 and e["code"] == code and e["param"] == param, b
        assert "it supports" in e["message"] or "context" in e["message"]
        assert "512-token context" in e["message"]
    after = orjson.loads(post(env.mocks["vllm"].root + "/mock/stats", None)[2])["requests"]
    assert after == before, "a refused request reached the engine"
    # the model that declares them accepts the same requests
    for body, _, _ in cases[:3]:
        assert post(url, {**body, "model": "rich", "stream": False}, env.key)[0] == 200


def test_limits_429_with_retry_after(env: Any) -> None:
    url = env.gw.url + "/chat/completions"
    assert post(url, chat("m-vllm", stream=False), env.other_key)[0] == 200
    st, h, b = post(url, chat("m-vllm", stream=False), env.other_key)
    assert st == 429 and int(h["Retry-After"]) >= 1
    assert _err(b)["code"] == "rate_limit_exceeded"


# ------------------------------------------------------------------------------------ pass-through


@pytest.mark.parametrize("dialect", DIALECTS)
def test_stream_passthrough_same_events_as_direct(env: Any, dialect: str) -> None:
    """Every event the engine sends reaches the client unchanged, except the usage-only chunk the gateway
    asked for on the client's behalf; with include_usage the stream equals the engine's byte for byte
    (up to the per-response id/created)."""
    mock = env.mocks[dialect]
    for include_usage in (False, True):
        body = chat(f"m-{dialect}")
        direct_body = {**body, "model": "m"}
        if include_usage:
            body["stream_options"] = direct_body["stream_options"] = {"include_usage": True}
        st, h, via = post(env.gw.url + "/chat/completions", {**body, "max_tokens": 100}, env.key)
        assert st == 200 and h["X-Accel-Buffering"] == "no" and h["Content-Type"] == "text/event-stream"
        _, _, direct = post(mock.base_url + "/chat/completions", {**direct_body, "max_tokens": 100})
        ev_via, ev_direct = events(via), events(direct)
        usage_only = [
            e
            for e in ev_direct
            if e.startswith(b"{") and orjson.loads(e).get("choices") == [] and orjson.loads(e).get("usage")
        ]
        if include_usage:
            assert len(ev_via) == len(ev_direct), (ev_via, ev_direct)
        else:
            assert len(ev_via) == len(ev_direct) - len(usage_only), (ev_via, ev_direct)
            assert not any(b'"choices":[]' in e for e in ev_via)
        assert ev_via[-1] == b"[DONE]"
        text = b"".join(
            orjson.loads(e)["choices"][0].get("delta", {}).get("content", "").encode()
            for e in ev_via
            if e != b"[DONE]"
            and orjson.loads(e).get("choices")
            and orjson.loads(e)["choices"][0].get("delta", {}).get("content")
        )
        assert text == b" tok0 tok1 tok2 tok3 tok4 tok5"
    # the engine's usage was recorded even when the client did not ask for it
    time.sleep(0.2)
    recs = [r for r in env.gw.access_records() if r["model"] == f"m-{dialect}" and r["stream"]]
    assert recs and all(r["completion_tokens"] == 6 and r["prompt_tokens"] == 2 for r in recs), recs


def test_finish_reasons_mapped_to_openai_and_other_bytes_untouched() -> None:
    from servelab.gateway.relay import map_finish_bytes

    common = (
        b'data: {"choices":[{"index":0,"delta":{"content":" a"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
    )
    assert map_finish_bytes(common) is common  # OpenAI's values: the very same bytes object
    tgi = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":"stop_sequence"}]}\n\n'
    )
    assert map_finish_bytes(tgi) == tgi.replace(b'"stop_sequence"', b'"stop"')
    assert map_finish_bytes(b'{"finish_reason": "eos_token", "x": 1}') == b'{"finish_reason": "stop", "x": 1}'
    assert (
        map_finish_bytes(b'[{"finish_reason":"max_tokens"},{"finish_reason":"length"}]')
        == b'[{"finish_reason":"length"},{"finish_reason":"length"}]'
    )
    # text that merely mentions one (quotes escaped inside a JSON string) and values with no OpenAI meaning
    quoted = b'{"content":"say \\"finish_reason\\":\\"stop_sequence\\"","finish_reason":"abort"}'
    assert map_finish_bytes(quoted) is quoted


def test_chunks_are_forwarded_as_they_arrive(env: Any) -> None:
    """With 40 ms between engine chunks, the client sees each token chunk about 40 ms after the previous
    one: nothing is held back and coalesced."""

    async def run() -> list[float]:
        times: list[float] = []
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                env.gw.url + "/chat/completions", json=chat("slow"), headers={"Authorization": f"Bearer {env.key}"}
            ) as r,
        ):
            assert r.status == 200
            buf = b""
            async for data in r.content.iter_any():
                buf += data
                while b"\n\n" in buf:
                    ev, buf = buf.split(b"\n\n", 1)
                    if b'"content":" tok' in ev:
                        times.append(time.monotonic())
        return times

    times = asyncio.run(run())
    assert len(times) == 12
    gaps = [b - a for a, b in pairwise(times)]
    # coalescing would show gaps near 0 followed by large ones; pass-through keeps them near 40 ms
    assert sum(1 for g in gaps if g > 0.02) >= 9, gaps


def test_request_id_round_trip_and_access_log(env: Any) -> None:
    """The gateway makes its own id (issue 9 defect 5); the client's is logged and passed on apart."""
    rid = "trace-abc.123"
    st, h, _ = post(
        env.gw.url + "/chat/completions", chat("m-tgi", stream=False), env.key, headers={"X-Request-ID": rid}
    )
    gid = h["X-Request-ID"]
    assert st == 200 and gid != rid and len(gid) == 24
    recs = orjson.loads(post(env.mocks["tgi"].root + "/mock/records", None)[2])
    assert (gid, rid) in [(r["request_id"], r["client_request_id"]) for r in recs], "the engine did not get the ids"
    time.sleep(0.2)
    line = next(r for r in env.gw.access_records() if r["request_id"] == gid)
    assert line["client_request_id"] == rid
    assert line["key_id"] == "k1" and line["tenant"] == "t" and line["backend"] == "be-tgi"
    assert line["status"] == 200 and line["e2e_ms"] > 0 and line["completion_tokens"] == 6
    raw = env.gw.access_log.read_text()
    assert env.key not in raw and "say something" not in raw and "Bearer" not in raw
    # an invalid client id is not kept at all
    _, h, _ = post(
        env.gw.url + "/chat/completions",
        chat("m-tgi", stream=False),
        env.key,
        headers={"X-Request-ID": "bad id with spaces"},
    )
    assert h["X-Request-ID"] != "bad id with spaces" and len(h["X-Request-ID"]) >= 16
    time.sleep(0.2)
    assert next(r for r in env.gw.access_records() if r["request_id"] == h["X-Request-ID"])["client_request_id"] is None


# ------------------------------------------------------------------------------- failures upstream


def test_retry_before_first_byte_on_connection_failure_and_503(env: Any) -> None:
    for model in ("retry-connect", "retry-503"):
        rid = f"retry-{model}"
        st, _, b = post(env.gw.url + "/chat/completions", chat(model), env.key, headers={"X-Request-ID": rid})
        assert st == 200 and events(b)[-1] == b"[DONE]", b
        time.sleep(0.2)
        line = next(r for r in env.gw.access_records() if r["client_request_id"] == rid)
        assert line["retries"] == 1 and line["backend"] == "be-vllm", line


def test_no_retry_after_first_byte_cut_stream_gets_clean_error(env: Any) -> None:
    before = orjson.loads(post(env.mocks["cut"].root + "/mock/stats", None)[2])["requests"]
    st, _, b = post(env.gw.url + "/chat/completions", chat("cut"), env.key)
    assert st == 200
    evs = events(b)
    assert evs[-1] == b"[DONE]"
    err = orjson.loads(evs[-2])["error"]
    assert err["code"] == "upstream_cut_off" and "retry" in err["message"]
    assert any(b"tok0" in e for e in evs), "the tokens before the cut were forwarded"
    after = orjson.loads(post(env.mocks["cut"].root + "/mock/stats", None)[2])["requests"]
    assert after - before == 1, "a stream that had started was retried"


@pytest.mark.parametrize("model", ["serr-vllm", "serr-llamacpp", "serr-sglang"])
def test_error_inside_200_stream_becomes_one_clean_openai_error_event(env: Any, model: str) -> None:
    st, _, b = post(env.gw.url + "/chat/completions", chat(model), env.key)
    assert st == 200
    evs = events(b)
    assert evs[-1] == b"[DONE]" and evs.count(b"[DONE]") == 1
    errs = [orjson.loads(e) for e in evs[:-1] if b'"error"' in e]
    assert len(errs) == 1 and orjson.loads(evs[-2]) == errs[0]
    e = errs[0]["error"]
    assert set(e) == {"message", "type", "param", "code"} and e["type"] == "server_error"
    assert "be-" not in e["message"] and "127.0.0.1" not in e["message"] and "Traceback" not in e["message"]


def test_upstream_4xx_is_normalised_and_hides_the_backend(env: Any) -> None:
    st, _, b = post(env.gw.url + "/chat/completions", chat("bad400"), env.key)
    e = _err(b)
    assert st == 400 and "be-bad400" not in e["message"]


def test_fallback_when_the_pool_is_down_applies_degrade_params(env: Any) -> None:
    rid = "fallback-1"
    st, _, b = post(
        env.gw.url + "/chat/completions", chat("falls-back", max_tokens=50), env.key, headers={"X-Request-ID": rid}
    )
    assert st == 200
    text = "".join(
        orjson.loads(e)["choices"][0]["delta"].get("content") or ""
        for e in events(b)
        if e != b"[DONE]" and orjson.loads(e).get("choices")
    )
    assert text == " tok0 tok1 tok2", "fallback's max_tokens: 3 was not applied"
    time.sleep(0.2)
    line = next(r for r in env.gw.access_records() if r["client_request_id"] == rid)
    assert line["fallback"] is True and line["backend"] == "be-sglang" and line["completion_tokens"] == 3


def test_client_disconnect_cancels_upstream_and_charges_what_was_served(env: Any) -> None:
    mock = env.mocks["slow"]
    post(mock.root + "/mock/reset", {})

    async def run() -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                env.gw.url + "/chat/completions",
                json=chat("slow"),
                headers={"Authorization": f"Bearer {env.key}", "X-Request-ID": "gone-1"},
            ) as r,
        ):
            n = 0
            async for data in r.content.iter_any():
                n += data.count(b'"content":" tok')
                if n >= 3:
                    break  # leave: the connection is closed

    asyncio.run(run())
    deadline = time.monotonic() + 3
    stats: dict[str, Any] = {}
    while time.monotonic() < deadline:
        stats = orjson.loads(post(mock.root + "/mock/stats", None)[2])
        if stats["running"] == 0:
            break
        time.sleep(0.05)
    assert stats["running"] == 0 and stats["completed"] == 0, stats
    rec = orjson.loads(post(mock.root + "/mock/records", None)[2])[-1]
    assert len(rec["token_write_ns"]) < 12, "the engine kept generating after the client left"
    time.sleep(0.3)
    line = next(r for r in env.gw.access_records() if r["client_request_id"] == "gone-1")
    assert line["outcome"] == "client_disconnect"
    assert 3 <= line["charged_tokens"] - 1 <= 12, line  # prompt estimate (>=1) + chunks forwarded


def test_metrics_exposed(env: Any) -> None:
    """/metrics is on the admin port behind the admin token; the public port answers 404 unless
    server.public_metrics (issue 9, defect 8: it names backends and breaker states)."""
    post(env.gw.url + "/chat/completions", chat("m-vllm"), env.key)
    st, _, b = post(env.gw.root + "/metrics", None)
    assert st == 404 and b"admin port" in b, b
    assert post(env.gw.admin_url + "/metrics", None)[0] == 401
    st, h, b = post(env.gw.admin_url + "/metrics", None, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    text = b.decode()
    assert st == 200 and h["Content-Type"].startswith("text/plain")
    for name in (
        "servelab_gateway_requests_total{",
        "servelab_gateway_ttft_seconds_bucket{",
        "servelab_gateway_inter_token_seconds_bucket{",
        "servelab_gateway_tokens_total{",
        "servelab_gateway_in_flight{",
        "servelab_gateway_retries_total{",
        "servelab_gateway_limit_rejections_total{",
    ):
        assert name in text, name
    assert 'servelab_gateway_requests_total{backend="be-vllm",model="m-vllm",status="200"}' in text
    ttft_count = [
        ln
        for ln in text.splitlines()
        if ln.startswith('servelab_gateway_ttft_seconds_count{backend="be-vllm",model="m-vllm"}')
    ]
    assert ttft_count and float(ttft_count[0].split()[-1]) >= 1
    st, _, b = post(env.gw.root + "/health", None)
    assert st == 200 and orjson.loads(b)["status"] == "ok"


def test_models_lists_only_allowed_with_capabilities(env: Any) -> None:
    _, _, b = post(env.gw.url + "/models", None, env.other_key)
    data = orjson.loads(b)["data"]
    assert [m["id"] for m in data] == ["m-vllm"]
    assert data[0]["capabilities"]["context_tokens"] == 512 and data[0]["capabilities"]["tools"] is False
    _, _, b = post(env.gw.url + "/models", None, env.key)
    assert "secret" not in [m["id"] for m in orjson.loads(b)["data"]]


def test_official_openai_sdk(env: Any) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=env.gw.url, api_key=env.key, max_retries=0)
    stream = client.chat.completions.create(
        model="m-sglang",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == " tok0 tok1 tok2 tok3 tok4 tok5" and chunks[-1].usage.completion_tokens == 6
    r = client.completions.create(model="m-llamacpp", prompt="once upon", max_tokens=4)
    assert r.usage.completion_tokens == 4
    assert [m.id for m in client.models.list()][:1] == ["m-vllm"]
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(
            model="m-vllm",
            messages=[{"role": "user", "content": "hi"}],
            tools=[{"type": "function", "function": {"name": "f"}}],
        )
    assert ei.value.code == "tools_not_supported"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=env.gw.url, api_key="sk-wrong", max_retries=0).models.list()
    with pytest.raises(openai.APIError):  # the error event inside a 200 stream surfaces as an exception
        list(
            client.chat.completions.create(model="serr-vllm", messages=[{"role": "user", "content": "hi"}], stream=True)
        )


# ------------------------------------------------------------------------------------------ reload


def test_hot_reload_good_bad_and_in_flight_stream_survives(gateway: Any, mock_engine: Any) -> None:
    slow = mock_engine("--dialect", "vllm", "--output-tokens", "30", "--itl-ms", "50")
    fast = mock_engine("--dialect", "sglang", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    cfg: dict[str, Any] = {
        "backends": [
            {"name": "slow", "kind": "mock", "base_url": slow.root, "models": ["m"]},
            {"name": "fast", "kind": "mock", "base_url": fast.root, "models": ["m"]},
        ],
        "models": {"a": {"targets": [{"backend": "slow"}]}},
        "tenants": {"t": {}},
        "keys": [entry],
    }
    gw = gateway(cfg)

    async def stream_while(action: Any) -> bytes:
        async with (
            aiohttp.ClientSession() as s,
            s.post(gw.url + "/chat/completions", json=chat("a"), headers={"Authorization": f"Bearer {key}"}) as r,
        ):
            assert r.status == 200
            first = await r.content.readany()
            await asyncio.get_running_loop().run_in_executor(None, action)
            return first + await r.content.read()

    def models() -> list[str]:
        return [m["id"] for m in orjson.loads(post(gw.url + "/models", None, key)[2])["data"]]

    # good reload by file change, while a 1.5 s stream on model "a" is in flight; the new file drops "a"
    good = {**cfg, "models": {"b": {"targets": [{"backend": "fast"}]}}}

    def change_and_wait() -> None:
        gw.write_config(good)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and models() != ["b"]:
            time.sleep(0.1)

    body = asyncio.run(stream_while(change_and_wait))
    assert models() == ["b"]
    evs = events(body)
    assert evs[-1] == b"[DONE]" and sum(1 for e in evs if b'"content":" tok' in e) == 30, evs[-3:]
    assert post(gw.url + "/chat/completions", chat("a", stream=False), key)[0] == 404
    assert post(gw.url + "/chat/completions", chat("b", stream=False), key)[0] == 200

    # a bad file (unknown backend) leaves the running config in force; the error names the field
    bad = {**cfg, "models": {"c": {"targets": [{"backend": "nope"}]}}}
    gw.write_config(bad)
    gw.sighup()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and "models.c.targets[0].backend" not in gw.stderr():
        time.sleep(0.1)
    assert "models.c.targets[0].backend" in gw.stderr()
    assert models() == ["b"] and post(gw.url + "/chat/completions", chat("b", stream=False), key)[0] == 200
    # the admin port reports it too
    st, _, b = post(gw.admin_url + "/admin/reload", {}, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert st == 400 and "models.c.targets[0].backend" in _err(b)["message"]
    # and a fixed file is picked up again
    gw.write_config({**cfg, "models": {"d": {"targets": [{"backend": "fast"}]}}})
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and models() != ["d"]:
        time.sleep(0.1)
    assert models() == ["d"]


def test_cli_bad_config_is_one_line_exit_2(tmp_path: Path) -> None:
    import subprocess
    import sys

    p = tmp_path / "g.yaml"
    p.write_text("backends: []\nmodels: {}\n")
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "--config", str(p)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "backends" in r.stderr and "Traceback" not in r.stderr
