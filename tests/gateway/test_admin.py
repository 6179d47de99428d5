"""Admin API on a real port: bearer credential (env var or its SHA-256), keys create/list/revoke, reload and
backend hooks, usage totals; and ``servelab keys create|list|revoke`` against it (one-line errors)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import sys
from pathlib import Path

import aiohttp
import orjson
import pytest
from aiohttp import web

from servelab.gateway.admin import make_admin_app
from servelab.gateway.keys import KeyStore
from servelab.gateway.ledger import SqliteLedger, UsageRow
from servelab.wire.errors import ConfigError

TOKEN = "admin-token-0123456789abcdef"
TENANTS = {"ta": {"allowed_models": ["gemma"]}, "tb": {}}
SERVELAB = str(Path(sys.executable).with_name("servelab"))


@contextlib.asynccontextmanager
async def admin_server(tmp_path, **hooks):
    """A real admin app on a free port: yields ``(base_url, keystore, ledger)``."""
    led = SqliteLedger(tmp_path / "admin.db")
    await led.start()
    ks = KeyStore([], led, TENANTS)
    await ks.start()
    app = make_admin_app(ks, "TEST_ADMIN_TOKEN", ledger=led, **hooks)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}", ks, led
    finally:
        await runner.cleanup()
        await led.close()


@pytest.fixture(autouse=True)
def _token(monkeypatch):
    monkeypatch.setenv("TEST_ADMIN_TOKEN", TOKEN)


async def call(session, method, url, token=TOKEN, **kw):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with session.request(method, url, headers=headers, **kw) as r:
        return r.status, orjson.loads(await r.read()), r.headers


def test_missing_credential_is_a_config_error(monkeypatch) -> None:
    monkeypatch.delenv("TEST_ADMIN_TOKEN")
    with pytest.raises(ConfigError, match="TEST_ADMIN_TOKEN is empty"):
        make_admin_app(KeyStore(), "TEST_ADMIN_TOKEN")


def test_auth_keys_crud_hooks_usage(tmp_path) -> None:
    reloads = []

    async def reload_hook():
        reloads.append(1)
        if len(reloads) == 2:
            raise ConfigError("models.gemma.targets[0].backend: 'x' is not a backend")
        if len(reloads) == 3:  # a hook that reports the failure instead of raising
            return {"ok": False, "error": "tenants.t.rpm: must be >= 1"}
        return {"version": len(reloads) + 1}

    async def go():
        async with (
            admin_server(
                tmp_path, reload_hook=reload_hook, backends_hook=lambda: {"llama-a": {"breaker": "closed"}}
            ) as (base, ks, led),
            aiohttp.ClientSession() as s,
        ):
            for tok in (None, "wrong", TOKEN[:-1]):
                st, body, hdr = await call(s, "GET", f"{base}/admin/keys", token=tok)
                assert st == 401 and body["error"]["code"] == "invalid_admin_token"
                assert hdr["WWW-Authenticate"] == "Bearer"
            st, body, _ = await call(s, "GET", f"{base}/nothing-here", token="wrong")
            assert st == 401  # no route enumeration without the credential
            st, body, _ = await call(
                s,
                "POST",
                f"{base}/admin/keys",
                json={"tenant": "ta", "allowed_models": ["gemma"], "limits": {"rpm": 9}},
            )
            assert st == 201 and body["key"].startswith(f"sk-sl-{body['key_id']}-")
            key, key_id = body["key"], body["key_id"]
            assert ks.authenticate(f"Bearer {key}").limits.rpm == 9
            st, body, _ = await call(s, "GET", f"{base}/admin/keys")
            assert st == 200 and [k["key_id"] for k in body["keys"]] == [key_id]
            assert key.rsplit("-", 1)[1] not in orjson.dumps(body).decode()
            assert "sha256" not in body["keys"][0]
            for bad, code in (
                ({"tenant": "zz"}, "invalid_key_request"),
                ({}, "missing_tenant"),
                ({"tenant": "ta", "x": 1}, "unknown_field"),
                ({"tenant": "ta", "limits": {"rpm": -1}}, "invalid_key_request"),
            ):
                st, body, _ = await call(s, "POST", f"{base}/admin/keys", json=bad)
                assert st == 400 and body["error"]["code"] == code, (bad, body)
            st, body, _ = await call(s, "DELETE", f"{base}/admin/keys/{key_id}")
            assert st == 200 and body == {"key_id": key_id, "revoked": True}
            st, body, _ = await call(s, "DELETE", f"{base}/admin/keys/{key_id}")
            assert st == 404
            st, body, _ = await call(s, "POST", f"{base}/admin/reload")
            assert st == 200 and body == {"reloaded": True, "result": {"version": 2}}
            st, body, _ = await call(s, "POST", f"{base}/admin/reload")
            assert st == 400 and "running config stays" in body["error"]["message"]
            assert "models.gemma.targets[0].backend" in body["error"]["message"]
            st, body, _ = await call(s, "POST", f"{base}/admin/reload")
            assert st == 400 and "tenants.t.rpm: must be >= 1" in body["error"]["message"]
            st, body, _ = await call(s, "GET", f"{base}/admin/backends")
            assert st == 200 and body == {"backends": {"llama-a": {"breaker": "closed"}}}
            await led.record(UsageRow("r1", 1.0, "k", "ta", "gemma", "llama-a", "g", 10, 5, 100, 200, "ok", 0.5))
            await led.record(UsageRow("r2", 2.0, "k", "ta", "gemma", "llama-a", "g", 1, 2, 100, 200, "ok", 0.25))
            st, body, _ = await call(s, "GET", f"{base}/admin/usage?group_by=tenant")
            assert st == 200 and len(body["totals"]) == 1
            t = body["totals"][0]
            assert (t["tenant"], t["requests"], t["total_tokens"], t["cost"]) == ("ta", 2, 18, 0.75)
            st, body, _ = await call(s, "GET", f"{base}/admin/usage?group_by=secret")
            assert st == 400

    asyncio.run(go())


def test_token_sha256_credential_and_missing_hooks(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("TEST_ADMIN_TOKEN")

    async def go():
        app = make_admin_app(
            KeyStore([], None, TENANTS), "TEST_ADMIN_TOKEN", token_sha256=hashlib.sha256(TOKEN.encode()).hexdigest()
        )
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        base = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            async with aiohttp.ClientSession() as s:
                assert (await call(s, "GET", f"{base}/admin/keys"))[0] == 200
                assert (await call(s, "GET", f"{base}/admin/keys", token="x" * 30))[0] == 401
                for method, path in (("POST", "/admin/reload"), ("GET", "/admin/backends"), ("GET", "/admin/usage")):
                    assert (await call(s, method, base + path))[0] == 501
        finally:
            await runner.cleanup()

    asyncio.run(go())


async def cli(*args: str, token: str | None = TOKEN) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "SERVELAB_ADMIN_TOKEN"}
    if token is not None:
        env["SERVELAB_ADMIN_TOKEN"] = token
    p = await asyncio.create_subprocess_exec(
        SERVELAB, "keys", *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await p.communicate()
    return p.returncode, out.decode(), err.decode()


def test_keys_cli_against_the_admin_port(tmp_path) -> None:
    async def go():
        async with admin_server(tmp_path) as (base, ks, _):
            rc, out, err = await cli("create", "--tenant", "ta", "--models", "gemma", "--rpm", "3", "--admin-url", base)
            assert rc == 0, err
            key = out.strip()
            assert key.startswith("sk-sl-") and "not shown again" in err
            info = ks.authenticate(f"Bearer {key}")
            assert info.tenant == "ta" and info.limits.rpm == 3
            rc, out, err = await cli("list", "--json", "--admin-url", base)
            assert rc == 0 and orjson.loads(out)["keys"][0]["key_id"] == info.key_id
            assert key.rsplit("-", 1)[1] not in out
            rc, out, err = await cli("list", "--admin-url", base)
            assert rc == 0 and info.key_id in out and "active" in out
            rc, out, err = await cli("revoke", info.key_id, "--admin-url", base)
            assert rc == 0 and f"revoked {info.key_id}" in out
            # errors: one line, exit 2, no traceback
            for args, token, needle in (
                (("revoke", info.key_id), TOKEN, "admin port answered 404: no active key"),
                (("create", "--tenant", "nope"), TOKEN, "is not in the config"),
                (("list",), "wrong-token", "rejected the token in SERVELAB_ADMIN_TOKEN"),
                (("list",), None, "SERVELAB_ADMIN_TOKEN is empty"),
                (("create", "--tenant", "ta", "--key-id", "a-b"), TOKEN, "--key-id"),
            ):
                rc, out, err = await cli(*args, "--admin-url", base, token=token)
                assert rc == 2 and needle in err, (args, err)
                assert err.count("\n") == 1 and "Traceback" not in err
        rc, out, err = await cli("list", "--admin-url", base)  # server gone
        assert rc == 2 and "cannot reach the gateway's admin port" in err

    asyncio.run(go())


def test_keys_cli_with_a_running_gateway(gateway, mock_engine) -> None:
    """``servelab keys create`` on a real gateway process: the new key serves a request at once, is refused
    for a model its tenant may not use, and gets 401 right after ``servelab keys revoke``."""
    from conftest import ADMIN_TOKEN

    eng = mock_engine("--dialect", "vllm", "--output-tokens", "2")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m", "m2"]}],
            "models": {
                "m": {"targets": [{"backend": "b", "model": "m"}]},
                "m2": {"targets": [{"backend": "b", "model": "m2"}]},
            },
            "tenants": {"t": {"allowed_models": ["m"]}},
            "keys": [],
        }
    )

    async def go():
        rc, out, err = await cli("create", "--tenant", "t", "--admin-url", gw.admin_url, token=ADMIN_TOKEN)
        assert rc == 0, err
        key = out.strip()
        rc, _, err = await cli("create", "--tenant", "nope", "--admin-url", gw.admin_url, token=ADMIN_TOKEN)
        assert rc == 2 and "is not in the config" in err

        async with aiohttp.ClientSession() as s:

            async def chat(model):
                async with s.post(
                    f"{gw.url}/chat/completions",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]},
                ) as r:
                    return r.status

            assert await chat("m") == 200
            assert await chat("m2") in (403, 404)
            key_id = key.split("-")[2]
            rc, out, err = await cli("revoke", key_id, "--admin-url", gw.admin_url, token=ADMIN_TOKEN)
            assert rc == 0, err
            assert await chat("m") == 401

    asyncio.run(go())
