"""Findings of the user review of ``servelab gateway`` (issue 4), each pinned by a test that failed before
its fix: start-up errors that named the wrong part (or printed a traceback), the engine's own model name
(for llama-server a file path) reaching clients, ``n`` choices escaping the token reservation, plain-text
404/405 pages, and a Redis outage flooding the log."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from conftest import ADMIN_TOKEN, gateway_key, start_gateway, stop_gateway
from gateway.test_server import post
from services import postgres_cluster


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _config(tmp: Path, **over: Any) -> dict[str, Any]:
    _, entry = gateway_key("k1", "t")
    cfg: dict[str, Any] = {
        "server": {"port": 0, "admin_port": 0, "access_log": str(tmp / "access.log")},
        "ledger": {"sqlite_path": str(tmp / "usage.db")},
        "backends": [{"name": "b", "kind": "mock", "base_url": f"http://127.0.0.1:{_free_port()}", "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {}},
        "keys": [entry],
        "health": {"enabled": False},
    }
    cfg.update(over)
    return cfg


def _run_cli(
    tmp: Path, cfg: dict[str, Any], timeout_s: float = 60, admin_token: str = ADMIN_TOKEN
) -> subprocess.CompletedProcess[str]:
    p = tmp / "g.yaml"
    p.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, SERVELAB_ADMIN_TOKEN=admin_token)
    return subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "--config", str(p)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
    )


def _assert_one_line(r: subprocess.CompletedProcess[str], field: str, *words: str) -> None:
    err = r.stderr.strip()
    assert r.returncode == 2, (r.returncode, err)
    assert err.count("\n") == 0 and err.startswith("servelab: error: "), err
    assert "Traceback" not in err and "free port" not in err, err
    assert field in err, err
    for w in words:
        assert w in err, err


# ------------------------------------------------------------------ start-up errors name the part at fault
def test_unwritable_ledger_path_is_named_not_a_port_problem(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    r = _run_cli(tmp_path, _config(tmp_path, ledger={"sqlite_path": str(blocker / "usage.db")}))
    _assert_one_line(r, "ledger.sqlite_path", str(blocker / "usage.db"))


@pytest.mark.parametrize("token", ["x", "0123456789abcde"])
def test_short_admin_token_is_refused_at_start(tmp_path: Path, token: str) -> None:
    """Issue 9: a 1-character admin token only warned; anything under 16 characters is now refused."""
    r = _run_cli(tmp_path, _config(tmp_path), admin_token=token)
    _assert_one_line(r, "SERVELAB_ADMIN_TOKEN", f"is {len(token)} characters", "shorter than 16")
    if len(token) > 1:
        assert token not in r.stderr, r.stderr  # the refused token is never echoed


def test_unreachable_redis_is_refused_at_start(tmp_path: Path) -> None:
    r = _run_cli(tmp_path, _config(tmp_path, state={"redis_url": f"redis://:hunter2@127.0.0.1:{_free_port()}/0"}))
    _assert_one_line(r, "state.redis_url", "redis_url: null")
    assert "hunter2" not in r.stderr  # the password in the URL is not printed


def test_unreachable_postgres_is_named(tmp_path: Path) -> None:
    """PostgreSQL down at start: the gateway starts not ready (test_durability has the whole outage) and
    names the field in /health and its log, never the password."""
    dsn = f"postgresql://postgres:hunter2@127.0.0.1:{_free_port()}/servelab"
    gw = start_gateway(_config(tmp_path, ledger={"postgres_dsn": dsn}), tmp_path / "gw")
    try:
        st, _, raw = post(gw.url.removesuffix("/v1") + "/health", None)
        assert st == 503 and b"ledger.postgres_dsn" in raw and b"unreachable" in raw, raw
        assert b"hunter2" not in raw and "hunter2" not in gw.stderr(), (raw, gw.stderr())
    finally:
        stop_gateway(gw.proc)


def test_postgres_wrong_database_and_role_one_line_no_traceback(tmp_path: Path) -> None:
    with postgres_cluster() as pg:
        base = pg.dsn.rsplit("/", 1)[0]
        r = _run_cli(tmp_path, _config(tmp_path, ledger={"postgres_dsn": base + "/no_such_db"}))
        _assert_one_line(r, "ledger.postgres_dsn", "no_such_db")
        user_dsn = base.replace("postgres@", "nobody@", 1) + "/postgres"
        r = _run_cli(tmp_path, _config(tmp_path, ledger={"postgres_dsn": user_dsn}))
        _assert_one_line(r, "ledger.postgres_dsn", "nobody")


def test_redis_outage_is_logged_once_not_every_sync(caplog: pytest.LogCaptureFixture) -> None:
    """Before: one WARNING per sync interval (5 a second) for as long as Redis was down."""
    import asyncio
    import logging

    import redis.asyncio as aioredis

    from servelab.gateway.breaker import BreakerBoard

    async def main() -> None:
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        # no retries in this client: a refused connect fails its sync at once (redis-py's default retries
        # with backoff made each sync ~3 s); the board's own handling of the failure is what is tested
        r = aioredis.Redis(host="127.0.0.1", port=_free_port(), socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
        board = BreakerBoard(redis=r, sync_interval_s=0.02)
        board.get("b")
        calls = 0
        sync = board.sync_once

        async def counted() -> dict[str, float]:
            nonlocal calls
            calls += 1
            return await sync()

        board.sync_once = counted  # type: ignore[method-assign]
        await board.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and calls < 10:
            await asyncio.sleep(0.05)
        await board.close()
        assert calls >= 10
        await r.aclose()

    with caplog.at_level(logging.WARNING, logger="servelab.gateway.breaker"):
        asyncio.run(main())
    assert caplog.text.count("breaker sync through Redis failed") == 1, caplog.text


# ------------------------------------------------------------------ responses name the public model
def test_responses_name_the_public_model_not_the_engines(gateway: Any, mock_engine: Any) -> None:
    """Before: the engine's own name went to the client (llama-server answers with its GGUF file path,
    e.g. "/root/.cache/.../gemma-3-270m-q4_k_m.gguf"). OpenAI SDK users read ``model`` back (cost
    tracking, logging); it must be the name they asked for."""
    import openai

    eng = mock_engine("--dialect", "vllm", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    hidden = "/srv/weights/internal-upstream.gguf"
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": [hidden]}],
            "models": {"pub": {"targets": [{"backend": "b", "model": hidden}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )
    c = openai.OpenAI(base_url=gw.url, api_key=key, max_retries=0)
    msgs = [{"role": "user", "content": 'quote {"model":"x"} back'}]
    assert c.chat.completions.create(model="pub", messages=msgs, max_tokens=4).model == "pub"
    chunks = list(
        c.chat.completions.create(
            model="pub", messages=msgs, max_tokens=4, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks and {ch.model for ch in chunks} == {"pub"}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)  # text untouched
    assert c.completions.create(model="pub", prompt="hi", max_tokens=2).model == "pub"
    assert {ch.model for ch in c.completions.create(model="pub", prompt="hi", max_tokens=2, stream=True)} == {"pub"}
    log = gw.access_log.read_text() if gw.access_log.exists() else ""
    assert hidden not in log


# ------------------------------------------------------------------ n choices count in the output bound
def test_n_choices_are_bounded_and_reserved(gateway: Any, mock_engine: Any) -> None:
    """Before: ``n`` was not looked at, so ``n: 1000, max_tokens: 1000`` passed a 1000-token output limit
    and reserved 1000 tokens against TPM/budget for up to 1,000,000 generated."""
    import urllib.error
    import urllib.request

    eng = mock_engine("--dialect", "vllm", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_tokens_limit": 1000},
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )

    def post(body: dict[str, Any], path: str = "/chat/completions") -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(
            gw.url + path,
            data=orjson.dumps(body),
            method="POST",
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return r.status, orjson.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, orjson.loads(e.read())

    msgs = [{"role": "user", "content": "hi"}]
    st, b = post({"model": "m", "messages": msgs, "n": 1000, "max_tokens": 1000})
    assert st == 400 and b["error"]["param"] == "n" and "1000" in b["error"]["message"], b
    st, b = post({"model": "m", "messages": msgs, "n": 3, "max_tokens": 400})  # 1200 > 1000
    assert st == 400 and b["error"]["code"] == "max_tokens_too_large", b
    for bad in ("2", 0, -1, 1.5, True):
        st, b = post({"model": "m", "messages": msgs, "n": bad, "max_tokens": 4})
        assert st == 400 and b["error"]["param"] == "n", (bad, b)
    st, b = post({"model": "m", "prompt": ["a", "b", "c"], "n": 2, "max_tokens": 200}, "/completions")
    assert st == 400 and b["error"]["code"] == "max_tokens_too_large", b  # 3 prompts x 2 x 200
    st, b = post({"model": "m", "messages": msgs, "n": 3, "max_tokens": 300})
    assert st == 200, b
    # nothing charged for the refusals; the served one reserved n x max_tokens
    deadline = time.monotonic() + 10
    rows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        req = urllib.request.Request(gw.admin_url + "/admin/usage", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as r:
            rows = orjson.loads(r.read())["totals"]
        if rows:
            break
        time.sleep(0.2)
    assert len(rows) == 1 and rows[0]["requests"] == 1, rows
    assert rows[0]["reserved_tokens"] >= 900, rows


# ------------------------------------------------------------------ unknown paths answer like OpenAI
def test_unknown_path_and_wrong_method_are_openai_errors(gateway: Any, mock_engine: Any) -> None:
    """Before: aiohttp's plain-text ``404: Not Found`` / ``405: Method Not Allowed``, which the OpenAI SDK
    cannot parse; the commonest cause (base_url without /v1) is now named."""
    import openai

    eng = mock_engine("--dialect", "vllm")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )
    no_v1 = openai.OpenAI(base_url=gw.root, api_key=key, max_retries=0)
    with pytest.raises(openai.NotFoundError) as ei:
        no_v1.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    err = ei.value.body
    assert isinstance(err, dict) and err["code"] == "unknown_path" and "/v1/chat/completions" in err["message"], err
    assert "/v1" in err["message"] and "base_url" in err["message"]
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as hi:
        urllib.request.urlopen(gw.url + "/chat/completions", timeout=10)  # GET
    assert hi.value.code == 405 and hi.value.headers["Allow"] == "POST"
    body = orjson.loads(hi.value.read())
    assert body["error"]["code"] == "method_not_allowed" and "POST" in body["error"]["message"]


def test_removing_the_last_config_key_leaves_an_empty_section_that_loads(tmp_path: Path) -> None:
    """Before: deleting the last entry under ``keys:`` (admin-created keys still in use) left YAML null and
    the reload was refused with "keys: input should be a valid list, got None"."""
    from servelab.gateway.config import load_config

    cfg = _config(tmp_path)
    text = (
        yaml.safe_dump({k: v for k, v in cfg.items() if k != "keys"})
        + "keys:\n  # all keys made with servelab keys create\n"
    )
    p = tmp_path / "g.yaml"
    p.write_text(text)
    assert load_config(p).keys == []
    p.write_text(text.replace("tenants:\n  t: {}\n", "tenants:\n"))
    assert load_config(p).tenants == {}


# ------------------------------------------------------------------ engine messages are hidden word-wise
def test_hidden_names_are_replaced_as_whole_names_not_inside_words() -> None:
    """Before: with a backend serving upstream model "m" (as in examples/gateway.yaml) llama-server's
    "Field 'temperature' ... must be number" reached the client as "Field 'tethe modelperature' ... type
    the modelust be nuthe modelber"."""
    from servelab.gateway.errors import sanitize_upstream_message

    hide = ("m", "llama-a", "gemma-3-270m", "http://127.0.0.1:8001")
    msg = (
        "Field 'temperature': [json.exception.type_error.302] type must be number, but is string; "
        "model m on llama-a (gemma-3-270m, M) at http://127.0.0.1:8001 failed"
    )
    out = sanitize_upstream_message(msg, hide)
    assert out is not None
    assert "Field 'temperature'" in out and "type must be number, but is string" in out, out
    for h in ("llama-a", "gemma-3-270m", "8001", " m ", " M)"):
        assert h not in out, out
    assert out.count("the model") == 4, out  # llama-a, gemma-3-270m, M, the URL ("model m" reads "model")
