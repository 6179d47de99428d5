"""Issue 9, defects 1, 4, 5 and 6 through a real gateway process (mock engines and the real llama-server):

1. output-length fields of every dialect bound the request (the largest one), and what is forwarded
   carries one bound <= the reserved cap: ``max_tokens: 1, max_completion_tokens: 3000`` against vLLM
   semantics and ``max_tokens: 8, n_predict: 300, ignore_eos: true`` against llama-server no longer
   escape the cap, the TPM limit or the budget;
4. a fallback (or shadow) to a model / pool the key may not use is skipped, never served;
5. the gateway makes its own request ids; a client's X-Request-ID is logged apart and steers nothing;
6. a body nested 300 deep gets 400, not 500.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import gateway_key, launch_llama
from gateway.test_server import post

from servelab.gateway.hashing import stable_unit


def _chat(model: str, **kw: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "say something"}], **kw}


def _ledger(gw: Any) -> list[dict[str, Any]]:
    time.sleep(0.6)  # the settle task and the SQLite writer thread
    con = sqlite3.connect(gw.config["ledger"]["sqlite_path"])
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute("SELECT * FROM servelab_usage")]
    finally:
        con.close()


def _records(mock: Any) -> list[dict[str, Any]]:
    return orjson.loads(post(mock.root + "/mock/records", None)[2])


# ------------------------------------------------------------------ defect 1: length fields


def test_vllm_max_completion_tokens_is_reserved_and_counted(gateway: Any, mock_engine: Any) -> None:
    """Before: the gateway reserved min(max_tokens, max_completion_tokens) = 1 while vLLM obeys
    max_completion_tokens = 3000; five requests spent 16,506 tokens against TPM 2,000 / budget 5,000."""
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "3000")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "v", "kind": "vllm", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "v"}]}},
            "tenants": {"t": {"tpm": 2000, "token_budget": 5000}},
            "keys": [entry],
        }
    )
    url = gw.url + "/chat/completions"
    statuses = [post(url, _chat("m", max_tokens=1, max_completion_tokens=3000), key)[0] for _ in range(5)]
    assert statuses == [429] * 5, statuses  # reserves 3000 (+ prompt) > TPM 2000: refused, never served
    assert _records(eng) == []
    # a bound that fits: the engine gets exactly one bound, the largest asked for (1500), and no more
    got = []
    for _ in range(5):
        st, _, raw = post(url, _chat("m", max_tokens=1, max_completion_tokens=1500), key)
        got.append(st)
        if st == 200:
            assert orjson.loads(raw)["usage"]["completion_tokens"] == 1500
    assert got[0] == 200 and got.count(200) == 1, got  # the second would exceed the TPM window
    rows = _ledger(gw)
    served = sum(r["prompt_tokens"] + r["completion_tokens"] for r in rows)
    assert served <= 2000, rows
    assert all(r["completion_tokens"] <= r["reserved_tokens"] for r in rows), rows
    assert [r["output_tokens"] for r in _records(eng)] == [1500]


def test_engine_length_fields_can_be_refused(gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "llamacpp", "--output-tokens", "50")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_tokens_limit": 64, "engine_length_fields": "refuse"},
            "backends": [{"name": "l", "kind": "llamacpp", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "l"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    st, _, raw = post(gw.url + "/chat/completions", _chat("m", max_tokens=8, n_predict=20), key)
    err = orjson.loads(raw)["error"]
    assert st == 400 and err["param"] == "n_predict" and err["code"] == "unsupported_parameter", raw
    st, _, raw = post(gw.url + "/chat/completions", _chat("m", max_tokens=8, min_tokens=9), key)
    assert st == 400 and orjson.loads(raw)["error"]["param"] == "min_tokens", raw
    st, _, raw = post(gw.url + "/chat/completions", _chat("m", max_tokens=8), key)
    assert st == 200 and orjson.loads(raw)["usage"]["completion_tokens"] == 8


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from launch_llama(tmp_path_factory, ctx_size=1024, parallel=1)


def test_llama_server_n_predict_cannot_escape_the_cap(gateway: Any, llama: Any) -> None:
    """Before: ``max_tokens: 8, n_predict: 300, ignore_eos: true`` with max_tokens_limit 64 got 300 tokens
    from llama-server (n_predict wins there) while the gateway checked and reserved 8 (limit 32 here)."""
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_tokens_limit": 32},
            "backends": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "base_url": llama.base_url,
                    "models": ["gemma"],
                    "read_timeout_s": 120,
                }
            ],
            "models": {"gemma": {"targets": [{"backend": "llama"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    url = gw.url + "/chat/completions"
    st, _, raw = post(url, _chat("gemma", max_tokens=8, n_predict=300, ignore_eos=True), key)
    assert st == 400 and orjson.loads(raw)["error"]["param"] == "n_predict", raw
    for body in (
        _chat("gemma", max_tokens=8, n_predict=20, ignore_eos=True),
        _chat("gemma", max_tokens=20, n_predict=8, ignore_eos=True),
        _chat("gemma", options={"num_predict": 20}, ignore_eos=True),
        _chat("gemma", n_predict=-1, ignore_eos=True),
    ):  # "no limit" = the gateway's default
        st, _, raw = post(url, body, key)
        assert st == 200, raw
        ct = orjson.loads(raw)["usage"]["completion_tokens"]
        want = 32 if body.get("n_predict") == -1 else 20  # ignore_eos: exactly the one forwarded bound
        assert ct == want, (body, ct)
    st, _, raw = post(url, _chat("gemma", max_tokens=8, n_predict=20, ignore_eos=True, stream=True), key)
    assert st == 200 and raw.count(b"data:") >= 20
    rows = _ledger(gw)
    assert len(rows) >= 5 and max(r["completion_tokens"] for r in rows) <= 32, rows  # the 400 was never admitted
    assert all(r["completion_tokens"] <= r["reserved_tokens"] for r in rows), rows


# ------------------------------------------------------------------ defect 4: permissions on every reachable model


def test_fallback_to_a_model_the_tenant_may_not_use_is_skipped(gateway: Any, mock_engine: Any) -> None:
    """Before: tenant A may use ``afb`` (whose backend is down) whose fallback is ``secret`` (tenant B
    only): A got 403 for ``secret`` but 200 with ``"model": "secret"`` through ``afb``."""
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "4")
    shadow = mock_engine("--dialect", "vllm", "--output-tokens", "4")
    ka, ea = gateway_key("ka", "A")
    kb, eb = gateway_key("kb", "B")
    kc, ec = gateway_key("kc", "C")
    gw = gateway(
        {
            "backends": [
                {"name": "down", "kind": "mock", "base_url": "http://127.0.0.1:9", "models": ["x"]},
                {"name": "s", "kind": "mock", "base_url": eng.root, "models": ["x"]},
                {"name": "sh", "kind": "mock", "base_url": shadow.root, "models": ["x"], "pool": "canary"},
            ],
            "models": {
                "afb": {"targets": [{"backend": "down"}], "fallback": [{"model": "secret"}]},
                "secret": {"targets": [{"backend": "s"}]},
                "open": {"targets": [{"backend": "s"}], "shadow": {"target": {"backend": "sh"}, "sample_rate": 1.0}},
            },
            "tenants": {
                "A": {"allowed_models": ["afb", "open"], "pools": ["default"]},
                "B": {"allowed_models": ["secret"]},
                "C": {"allowed_models": ["*"]},
            },
            "keys": [ea, eb, ec],
            "retry": {"attempts": 2, "backoff_s": 0},
            "health": {"enabled": False},
        }
    )
    url = gw.url + "/chat/completions"
    assert post(url, _chat("secret"), ka)[0] == 403
    for _ in range(3):
        st, _, raw = post(url, _chat("afb"), ka)
        assert st in (502, 503), (st, raw)
        assert b"secret" not in raw
    assert _records(eng) == []  # nothing of A's ever reached secret's engine
    st, _, raw = post(url, _chat("afb"), kc)  # a tenant allowed both still gets the fallback
    assert st == 200 and orjson.loads(raw)["model"] == "secret"
    assert post(url, _chat("secret"), kb)[0] == 200
    # shadow: A may not use pool "canary", so its prompts are never mirrored there; C's are
    assert post(url, _chat("open"), ka)[0] == 200
    time.sleep(0.5)
    assert _records(shadow) == []
    assert post(url, _chat("open"), kc)[0] == 200
    deadline = time.monotonic() + 5
    while not _records(shadow) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_records(shadow)) == 1
    recs = [r for r in gw.access_records() if r["key_id"] == "ka" and r["model"] == "afb"]
    assert len(recs) == 3 and all(not r["fallback"] and r["backend"] != "s" for r in recs), recs
    assert "fallback secret of afb skipped" in gw.stderr()


# ------------------------------------------------------------------ defect 5: request ids


def _canary_id() -> str:
    """A client id whose hash put the old split in the canary group (u >= 0.92 with groups
    [(a, m) 92, (b, m) 8]): before the fix it steered 100 of 100 requests to the canary."""
    i = 0
    while stable_unit(f"pick-{i}", "split") < 0.92:
        i += 1
    return f"pick-{i}"


def _canary_setup(gateway: Any, mock_engine: Any, canary_weight: float, **over: Any) -> tuple[Any, ...]:
    """A stable (pool a) and a canary (pool b) mock behind model ``m``: (gateway, key, stable, canary)."""
    stable = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    canary = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    key, entry = gateway_key("k1", "t")
    env = over.pop("env", None)
    gw = gateway(
        {
            "backends": [
                {"name": "stable", "kind": "mock", "base_url": stable.root, "models": ["m"], "pool": "a"},
                {"name": "canary", "kind": "mock", "base_url": canary.root, "models": ["m"], "pool": "b"},
            ],
            "models": {
                "m": {
                    "targets": [
                        {"backend": "stable", "weight": 100 - canary_weight},
                        {"backend": "canary", "weight": canary_weight},
                    ]
                }
            },
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
            **over,
        },
        env=env,
    )
    return gw, key, stable, canary


def test_client_request_id_steers_nothing_and_is_logged_apart(gateway: Any, mock_engine: Any) -> None:
    gw, key, stable, canary = _canary_setup(gateway, mock_engine, 8)
    url = gw.url + "/chat/completions"
    chosen = _canary_id()
    ids = []
    for _ in range(100):
        st, h, _ = post(url, _chat("m"), key, headers={"X-Request-ID": chosen})
        assert st == 200
        ids.append(h["X-Request-ID"])
    on_canary = len(_records(canary))
    assert on_canary < 30, on_canary  # ~8 expected; the chosen id sent all 100 there before
    assert len(set(ids)) == 100 and chosen not in ids
    recs = [r for r in gw.access_records() if r.get("client_request_id") == chosen]
    assert len(recs) == 100 and {r["request_id"] for r in recs} == set(ids)
    rows = _ledger(gw)
    assert len({r["request_id"] for r in rows}) == len(rows) == 100
    engine_ids = {r["request_id"] for r in _records(stable) + _records(canary)}
    assert engine_ids == set(ids)  # engines see the gateway's ids (the client's goes as X-Client-Request-ID)
    # an unsafe client id is dropped, not logged
    st, h, _ = post(url, _chat("m"), key, headers={"X-Request-ID": "a b\tc" + "x" * 200})
    assert st == 200 and gw.access_records()[-1]["client_request_id"] is None


def test_session_affinity_is_opt_in_and_keyed_by_hmac(gateway: Any, mock_engine: Any) -> None:
    gw, key, _, _ = _canary_setup(
        gateway,
        mock_engine,
        50,
        routing={"session_header": "X-Session-ID"},
        env={"SERVELAB_SESSION_SECRET": "s3cret-for-tests"},
    )
    url = gw.url + "/chat/completions"
    for sess in ("alpha", "beta", "gamma"):
        n0 = len(gw.access_records())
        for _ in range(10):
            assert post(url, _chat("m"), key, headers={"X-Session-ID": sess})[0] == 200
        assert len({r["backend"] for r in gw.access_records()[n0:]}) == 1  # one session, one group
    # without the header: drawn per request, both groups get traffic
    n0 = len(gw.access_records())
    for _ in range(30):
        assert post(url, _chat("m"), key)[0] == 200
    assert len({r["backend"] for r in gw.access_records()[n0:]}) == 2


# ------------------------------------------------------------------ defect 6: deep JSON


def test_deeply_nested_body_is_400_not_500(gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_json_depth": 40},
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    url = gw.url + "/chat/completions"
    for depth in (41, 300, 1000, 5000):
        deep = b"[" * depth + b"]" * depth
        raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":' + deep + b"}"
        st, _, out = post(url, None, key, raw=raw)
        err = orjson.loads(out)["error"]
        assert st == 400 and err["code"] in ("json_too_deep", "invalid_json"), (depth, out)
    ok = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":' + b"[" * 30 + b"]" * 30 + b"}"
    assert post(url, None, key, raw=ok)[0] == 200
    assert "Traceback" not in gw.stderr()


def test_health_live_is_always_200(gateway: Any, tmp_path: Path) -> None:
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "mock", "base_url": "http://127.0.0.1:9", "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"interval_s": 0.2, "timeout_s": 0.2},
        }
    )
    time.sleep(1.0)
    st, _, raw = post(gw.root + "/health", None)
    assert st == 503 and "no backend is up" in orjson.loads(raw)["reasons"]
    st, _, raw = post(gw.root + "/health/live", None)
    assert st == 200 and orjson.loads(raw) == {"status": "alive"}
