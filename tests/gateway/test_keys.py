"""API keys: format, hashing, authentication (401s), secrets never shown, create/revoke persisted in the
ledger database, config keys, tenant policy."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import pytest

from servelab.gateway.errors import GatewayError
from servelab.gateway.keys import KeyStore, TenantPolicy, format_key, hash_secret, parse_key
from servelab.gateway.ledger import SqliteLedger
from servelab.gateway.limits import Limits

SECRET = "0123456789abcdef" * 4
TENANTS = {
    "ta": {"allowed_models": ["gemma", "small"], "rpm": 60, "tpm": 1000, "token_budget": 10**6},
    "tb": {"allowed_models": ["*"], "log_prompts": True},
}
CONFIG_KEYS = [
    {"id": "k1", "tenant": "ta", "sha256": hash_secret(SECRET)},
    {"id": "k2", "tenant": "tb", "sha256": hash_secret("f" * 64), "rpm": 5},
]


def store(ledger=None) -> KeyStore:
    return KeyStore(CONFIG_KEYS, ledger, TENANTS)


def test_format_parse_and_hash() -> None:
    key = format_key("k1", SECRET)
    assert key == f"sk-sl-k1-{SECRET}"
    assert parse_key(key) == ("k1", SECRET)
    for bad in (
        "sk-sl-k1",
        f"sk-xx-k1-{SECRET}",
        f"sk-sl-k-1-{SECRET}",
        "sk-sl-k1-" + "g" * 64,
        "sk-sl-k1-" + "a" * 63,
        f"sk-sl--{SECRET}",
    ):
        assert parse_key(bad) is None, bad
    assert hash_secret(SECRET) == hashlib.sha256(SECRET.encode()).hexdigest()


def test_authenticate_config_key_and_tenant_policy() -> None:
    ks = store()
    info = ks.authenticate(f"Bearer sk-sl-k1-{SECRET}")
    assert (info.key_id, info.tenant, info.allowed_models) == ("k1", "ta", ("gemma", "small"))
    assert info.limits == Limits(rpm=60, tpm=1000, token_budget=10**6) and info.tenant_limits.unlimited
    assert info.allows("gemma") and not info.allows("big")
    assert ks.authenticate(f"sk-sl-k1-{SECRET}").key_id == "k1"  # bare key accepted too
    k2 = ks.authenticate("bearer sk-sl-k2-" + "f" * 64)
    assert k2.allowed_models is None and k2.log_prompts and k2.limits == Limits(rpm=5)
    assert SECRET not in repr(info) and SECRET not in str(info)


@pytest.mark.parametrize(
    "header,needle",
    [
        (None, "Missing API key"),
        ("", "Missing API key"),
        ("Bearer ", "Malformed"),
        ("Bearer abc", "Malformed"),
        ("Basic dXNlcjpwYXNz", "Malformed"),
        (f"Bearer sk-sl-k1-{'0' * 64}", "Incorrect or revoked"),  # wrong secret
        (f"Bearer sk-sl-nokey-{SECRET}", "Incorrect or revoked"),  # unknown id
        ("Bearer sk-sl-k2-" + SECRET, "Incorrect or revoked"),  # k1's secret under k2's id
    ],
)
def test_authenticate_rejects_with_401(header, needle) -> None:
    with pytest.raises(GatewayError) as ei:
        store().authenticate(header)
    e = ei.value
    assert (e.status, e.type, e.code) == (401, "authentication_error", "invalid_api_key")
    assert needle in e.message and SECRET not in e.message and "0" * 64 not in e.message


def test_config_validation_is_one_clear_line() -> None:
    with pytest.raises(ValueError, match=r"keys\[k9\]\.tenant: 'nope' is not a tenant"):
        KeyStore([{"id": "k9", "tenant": "nope", "sha256": "a" * 64}], None, TENANTS)
    with pytest.raises(ValueError, match=r"keys\[k9\]\.sha256: not 64 hex"):
        KeyStore([{"id": "k9", "tenant": "ta", "sha256": "xyz"}], None, TENANTS)
    with pytest.raises(ValueError, match="appears twice"):
        KeyStore(CONFIG_KEYS + CONFIG_KEYS[:1], None, TENANTS)
    with pytest.raises(ValueError, match="no '-'"):
        KeyStore([{"id": "a-b", "tenant": "ta", "sha256": "a" * 64}], None, TENANTS)
    assert TenantPolicy.from_obj({"allowed_models": ["*", "x"]}).allowed_models is None


def test_create_revoke_persist_and_refresh(tmp_path, caplog) -> None:
    caplog.set_level(logging.DEBUG)

    async def go():
        led = SqliteLedger(tmp_path / "keys.db")
        await led.start()
        ks = store(led)
        await ks.start()
        with pytest.raises(ValueError, match="not allowed for tenant 'ta'"):  # never wider than its tenant
            await ks.create("ta", ["gemma", "big"], {"rpm": 7})
        new = await ks.create("ta", ["gemma"], {"rpm": 7})
        assert new.key.startswith(f"sk-sl-{new.key_id}-") and len(new.key.rsplit("-", 1)[1]) == 64
        assert new.key not in repr(new)
        info = ks.authenticate(f"Bearer {new.key}")
        # the key's list is within what its tenant may use; its rpm overrides the tenant's
        assert info.allowed_models == ("gemma",) and info.limits == Limits(rpm=7, tpm=1000, token_budget=10**6)
        assert info.source == "admin"
        # persisted: another store (another replica / a restart) on the same database knows it
        other = store(led)
        with pytest.raises(GatewayError):
            other.authenticate(f"Bearer {new.key}")
        await other.refresh()
        assert other.authenticate(f"Bearer {new.key}").key_id == new.key_id
        # revoke an admin key and a config key; both stay revoked after a restart
        assert await ks.revoke(new.key_id) and await ks.revoke("k1")
        assert not await ks.revoke(new.key_id) and not await ks.revoke("nope")
        for k in (new.key, f"sk-sl-k1-{SECRET}"):
            with pytest.raises(GatewayError):
                ks.authenticate(f"Bearer {k}")
        await led.close()
        led2 = SqliteLedger(tmp_path / "keys.db")
        await led2.start()
        restarted = store(led2)
        await restarted.start()
        for k in (new.key, f"sk-sl-k1-{SECRET}"):
            with pytest.raises(GatewayError):
                restarted.authenticate(f"Bearer {k}")
        assert restarted.authenticate("Bearer sk-sl-k2-" + "f" * 64).key_id == "k2"
        listed = {d["key_id"]: d for d in restarted.list()}
        assert listed["k1"]["revoked"] and listed[new.key_id]["revoked"] and not listed["k2"]["revoked"]
        assert listed[new.key_id]["limits"] == {"rpm": 7} and listed[new.key_id]["source"] == "admin"
        # a rotated config key (new hash under the same id) is active again
        rotated = "e" * 64
        restarted.update_config_keys([{"id": "k1", "tenant": "ta", "sha256": hash_secret(rotated)}])
        assert restarted.authenticate(f"Bearer sk-sl-k1-{rotated}").key_id == "k1"
        with pytest.raises(ValueError, match="already used"):
            await restarted.create("ta", key_id=new.key_id)  # ids are never reused
        with pytest.raises(ValueError, match="not in the config"):
            await restarted.create("nope")
        with pytest.raises(ValueError, match="unknown limit"):
            await restarted.create("ta", limits={"rps": 1})
        await led2.close()
        return new.key

    key = asyncio.run(go())
    secret = key.rsplit("-", 1)[1]
    assert secret not in caplog.text and SECRET not in caplog.text
    db = (
        (tmp_path / "keys.db").read_bytes() + (tmp_path / "keys.db-wal").read_bytes()
        if (tmp_path / "keys.db-wal").exists()
        else (tmp_path / "keys.db").read_bytes()
    )
    assert secret.encode() not in db and hash_secret(secret).encode() in db


def test_refresh_loop_picks_up_keys_from_another_replica(tmp_path) -> None:
    async def go():
        led = SqliteLedger(tmp_path / "k.db")
        await led.start()
        a, b = store(led), store(led)
        await a.start()
        await b.start(refresh_interval_s=0.05)
        new = await a.create("tb")
        await asyncio.sleep(0.3)
        assert b.authenticate(f"Bearer {new.key}").tenant == "tb"
        await b.close()
        await led.close()

    asyncio.run(go())
