"""Random request bodies (hypothesis) against a real in-process gateway with the mock engine behind it
(issue 9, defects 1 and 6 and the fuzz part of the acceptance): nested up to far beyond any limit, huge
numbers, odd types for every field the gateway or any engine dialect reads (every output-length field
included), unicode, raw bytes. Asserts: the gateway itself never answers 5xx (an engine-side 5xx is
relayed as 502/503/504 with an upstream code, never ``internal_error``), every error is OpenAI-shaped,
nothing is logged at ERROR, every 200 answer respects ``max_tokens_limit``, and the whole run takes
well under 30 s (~150 examples).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from conftest import gateway_key, start_mock_process, stop_mock_process
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servelab.gateway.config import parse_config
from servelab.gateway.server import Gateway

LIMIT = 48  # server.max_tokens_limit
#: the mock's answer length; a 200 must carry no more than LIMIT tokens (per sequence) whatever was asked
MOCK_TOKENS = 200
UPSTREAM_CODES = {"upstream_error", "upstream_timeout", "model_unavailable", "model_busy", "upstream_cut_off"}
KNOWN_FIELDS = [
    "model",
    "messages",
    "prompt",
    "input",
    "stream",
    "stream_options",
    "max_tokens",
    "max_completion_tokens",
    "n_predict",
    "max_new_tokens",
    "min_tokens",
    "ignore_eos",
    "n",
    "n_cmpl",
    "best_of",
    "tools",
    "tool_choice",
    "functions",
    "response_format",
    "guided_json",
    "temperature",
    "stop",
    "options",
    "parameters",
    "sampling_params",
    "reasoning_effort",
    "logprobs",
    "user",
    "metadata",
]

_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)  # any unicode but lone surrogates
_scalar = (
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.sampled_from([-2, -1, 0, 1, 7, LIMIT, LIMIT + 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json = st.recursive(
    _scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4), max_leaves=12
)
#: a value nested ``depth`` arrays/objects deep (the deep-JSON attack: 300 deep gave 500)
_deep = st.tuples(st.integers(1, 600), st.booleans(), _scalar).map(
    lambda t: orjson.loads(("[" * t[0] + "]" * t[0]) if t[1] else ('{"a":' * t[0] + "1" + "}" * t[0]))
)
_length_obj = st.dictionaries(
    st.sampled_from(["max_new_tokens", "num_predict", "min_new_tokens", "temperature"]), _scalar, max_size=3
)
_field_value = st.one_of(_json, _deep, _length_obj, st.lists(_length_obj, max_size=2))
_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | _scalar, "content": _text | _json}
)
_base = {
    "chat": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    "completions": {"model": "m", "prompt": "hi"},
    "embeddings": {"model": "m", "input": "hi"},
}
_PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}


@st.composite
def _bodies(draw: Any) -> tuple[str, bytes]:
    endpoint = draw(st.sampled_from(sorted(_PATHS)))
    kind = draw(st.sampled_from(["mutated", "mutated", "mutated", "json", "bytes"]))
    if kind == "bytes":
        return endpoint, draw(st.binary(max_size=120))
    if kind == "json":
        return endpoint, _dumps(draw(_json | _deep))
    body = dict(_base[endpoint])
    body["stream"] = draw(st.booleans())
    for name in draw(st.lists(st.sampled_from(KNOWN_FIELDS), max_size=4, unique=True)):
        if name == "messages":
            body[name] = draw(st.lists(_message, max_size=3) | _field_value)
        elif name in ("max_tokens", "max_completion_tokens", "n_predict", "max_new_tokens", "min_tokens"):
            body[name] = draw(st.integers(-3, 10**6) | st.integers(-(2**70), 2**70) | _field_value)
        else:
            body[name] = draw(_field_value)
    return endpoint, _dumps(body)


def _dumps(v: Any) -> bytes:
    # the stdlib encoder: orjson itself refuses to write the 254+ levels this test sends
    return json.dumps(v, ensure_ascii=False).encode()


class _ErrorLog(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def inproc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A :class:`Gateway` in this process (own event loop in a thread) in front of a vLLM-dialect mock."""
    mock = start_mock_process("--dialect", "vllm", "--output-tokens", str(MOCK_TOKENS))
    tmp = tmp_path_factory.mktemp("fuzz")
    key, entry = gateway_key("kf", "t")
    cfg = parse_config(
        {
            "server": {"port": 0, "admin_port": None, "max_tokens_limit": LIMIT, "access_log": None},
            "ledger": {"sqlite_path": str(tmp / "usage.db")},
            "backends": [{"name": "b", "kind": "vllm", "base_url": mock.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "retry": {"attempts": 0},
            "breaker": {"consecutive_failures": 10_000, "min_requests": 100_000},
        }
    )
    loop = asyncio.new_event_loop()
    gw = Gateway(cfg, port=0, admin_port=None, watch=False)
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(gw.start())
        ready.set()
        loop.run_forever()

    th = threading.Thread(target=run, name="fuzz-gateway", daemon=True)
    th.start()
    errors = _ErrorLog()
    logging.getLogger("servelab.gateway").addHandler(errors)
    try:
        assert ready.wait(30), "the in-process gateway did not start"
        yield gw, key, errors
    finally:
        logging.getLogger("servelab.gateway").removeHandler(errors)
        asyncio.run_coroutine_threadsafe(gw.close(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        th.join(10)
        stop_mock_process(mock.proc)


def _completion_tokens(data: bytes) -> list[int]:
    """completion_tokens of a JSON answer, or per-choice token events of an SSE stream."""
    if data.startswith(b"{"):
        u = orjson.loads(data).get("usage") or {}
        return [u["completion_tokens"]] if isinstance(u.get("completion_tokens"), int) else []
    return []


def test_random_bodies_never_get_a_gateway_5xx(inproc: Any) -> None:
    gw, key, errors = inproc
    conn = http.client.HTTPConnection("127.0.0.1", gw.port, timeout=30)
    seen: dict[int, int] = {}
    t0 = time.monotonic()

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(case=_bodies())
    def check(case: tuple[str, bytes]) -> None:
        endpoint, body = case
        conn.request(
            "POST",
            _PATHS[endpoint],
            body=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        resp = conn.getresponse()
        data = resp.read()
        seen[resp.status] = seen.get(resp.status, 0) + 1
        if resp.status >= 400:
            err = orjson.loads(data)["error"]  # OpenAI-shaped whatever came in
            assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str), data
            assert set(err) >= {"message", "type", "param", "code"}, data
            assert resp.status < 500 or err["code"] in UPSTREAM_CODES, (body[:300], data[:300])
        else:
            assert resp.status == 200, data[:300]
            for ct in _completion_tokens(data):
                assert ct <= LIMIT, (body[:300], ct)  # one bound <= the cap reached the engine

    try:
        check()
    finally:
        conn.close()
    took = time.monotonic() - t0
    print(f"\nstatus counts: {dict(sorted(seen.items()))} in {took:.1f} s")
    assert took < 30, took
    assert seen.get(400, 0) > 20 and seen.get(200, 0) > 5, seen  # it reaches validation and the engine
    assert errors.lines == [], errors.lines[:5]
