"""API keys of the gateway: format, hashing, lookup, create/revoke.

Format: ``sk-sl-<key_id>-<secret>``; ``secret`` is 64 hex characters (32 bytes from :mod:`secrets`, 256
bits), ``key_id`` (1-64 of ``A-Z a-z 0-9 _``, no ``-``) is public: it appears in logs, the ledger and
``servelab keys list``.

Only ``sha256(secret)`` (hex) is stored: in the config (``keys: [{id, tenant, sha256}]``) or in the ledger
database (keys created through the admin port). A fast hash is the standard choice for machine-generated
secrets of >= 128 bits: slow password hashes (Argon2/bcrypt) exist to make guessing *low-entropy human
passwords* expensive (OWASP Password Storage Cheat Sheet,
https://cheatsheetseries.owasp.org/cheatsheets/Password_Storage_Cheat_Sheet.html), while a 256-bit random
secret cannot be brute-forced from its SHA-256 at any speed
(https://security.stackexchange.com/questions/232753, both checked 2026-11-30); a slow hash would only add
latency to every request. Lookup is by ``key_id`` (a dict), then :func:`hmac.compare_digest` of the hashes,
so timing reveals nothing about the secret.

Secrets are never logged: :class:`KeyInfo` holds none, :class:`NewKey`'s ``repr`` masks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from servelab.gateway.errors import GatewayError
from servelab.gateway.ledger import KeyRecord, Ledger
from servelab.gateway.limits import Limits

__all__ = ["KEY_PREFIX", "KeyInfo", "KeyStore", "NewKey", "TenantPolicy", "format_key", "hash_secret", "parse_key"]

log = logging.getLogger("servelab.gateway.keys")

KEY_PREFIX = "sk-sl-"
SECRET_BYTES = 32
_SECRET = re.compile(r"^[0-9a-f]{64}$")
LIMIT_FIELDS = ("rpm", "tpm", "max_concurrency", "token_budget")
_KEY_ID = re.compile(r"^[A-Za-z0-9_]{1,64}$")  # same rule as config.KeyEntry.id


def hash_secret(secret: str) -> str:
    """Hex SHA-256 of ``secret`` (the value stored in config ``keys[].sha256`` and the ledger)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def format_key(key_id: str, secret: str) -> str:
    """``sk-sl-<key_id>-<secret>``."""
    return f"{KEY_PREFIX}{key_id}-{secret}"


def parse_key(key: str) -> tuple[str, str] | None:
    """``(key_id, secret)`` of a well-formed key, else ``None``."""
    if not key.startswith(KEY_PREFIX):
        return None
    key_id, sep, secret = key[len(KEY_PREFIX) :].partition("-")
    if not sep or not _KEY_ID.match(key_id) or not _SECRET.match(secret):
        return None
    return key_id, secret


def check_key_id(key_id: object) -> str:
    """Return ``key_id`` if valid (1-64 of ``A-Z a-z 0-9 _``) else raise ``ValueError`` saying so."""
    if not isinstance(key_id, str) or not _KEY_ID.match(key_id):
        raise ValueError(f"key id {key_id!r} is invalid: use 1-64 letters, digits or '_' (no '-')")
    return key_id


@dataclass(frozen=True)
class TenantPolicy:
    """What a tenant may do: ``allowed_models`` (``None`` or a list containing ``"*"`` = every model),
    ``limits`` applied to *each* key of the tenant (a key's own overrides win), ``shared_limits`` applied
    to all its keys together (unlimited unless set), ``log_prompts`` (whether prompts may be logged)."""

    allowed_models: tuple[str, ...] | None = None
    limits: Limits = field(default_factory=Limits)
    log_prompts: bool = False
    shared_limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_obj(cls, obj: Any) -> TenantPolicy:
        """From a mapping or an object with attributes (e.g. G1's pydantic tenant config):
        ``allowed_models``, ``rpm``, ``tpm``, ``max_concurrency``, ``token_budget``, ``log_prompts`` and
        optionally ``shared_limits`` (a mapping/object with the same four limit fields)."""
        if isinstance(obj, TenantPolicy):
            return obj
        get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
        models = get("allowed_models")
        models = None if models is None or "*" in models else tuple(models)
        return cls(models, Limits.from_obj(obj), bool(get("log_prompts", False)), Limits.from_obj(get("shared_limits")))


@dataclass(frozen=True)
class KeyInfo:
    """Who is calling (the result of :meth:`KeyStore.authenticate`); holds no secret.

    ``allowed_models``: ``None`` = every model; else the public model names this key may use (the key's
    own list intersected with its tenant's). ``limits``: this key's limits (the tenant's per-key limits
    with the key's overrides); ``tenant_limits``: the tenant's shared limits (all its keys together).
    Pass both to ``Limiter.admit(..., limits=info.limits, tenant_limits=info.tenant_limits)``.
    """

    key_id: str
    tenant: str
    allowed_models: tuple[str, ...] | None
    limits: Limits
    tenant_limits: Limits
    log_prompts: bool = False
    source: str = "config"

    def allows(self, model: str) -> bool:
        """Whether this key may call the public model ``model``."""
        return self.allowed_models is None or model in self.allowed_models


@dataclass(frozen=True)
class NewKey:
    """A key just created: ``key`` is the full ``sk-sl-...`` string, shown once. ``repr`` masks it."""

    key_id: str
    tenant: str
    key: str = field(repr=False)
    allowed_models: tuple[str, ...] | None = None
    created_ts: float = 0.0


@dataclass(frozen=True)
class _Entry:
    key_id: str
    tenant: str
    sha256: str = field(repr=False)
    allowed_models: tuple[str, ...] | None
    limits: Limits
    source: str
    created_ts: float | None = None
    revoked_ts: float | None = None


def _unauthorized(message: str) -> GatewayError:
    return GatewayError(401, message, type="authentication_error", code="invalid_api_key")


class KeyStore:
    """Keys from the config plus keys created/revoked through the admin port (persisted in ``ledger``).

    ``config_keys``: mappings or objects with ``id`` (or ``key_id``), ``tenant``, ``sha256`` (hex of the
    secret), optional ``allowed_models`` and limit overrides (``rpm``, ``tpm``, ``max_concurrency``,
    ``token_budget``). ``ledger``: where admin-created keys and revocations live (``None``: in memory
    only, lost at restart). ``tenants``: ``{name: TenantPolicy | mapping | object}`` (e.g. the config's
    ``tenants``); when given, keys of unknown tenants are refused and :class:`KeyInfo` carries the
    tenant's models and limits; when ``None`` the caller applies tenant policy itself and
    :meth:`create` accepts any tenant name (pass ``tenants`` when the admin port is open).

    Raises ``ValueError`` naming the key when a config key is malformed (unknown tenant, bad hash, id
    used twice). A revocation made through the admin port also disables a config key with the same id and
    hash, and survives restarts; a config key with a new hash (rotated) is active again.

    With several replicas sharing one PostgreSQL ledger, keys created on one replica reach the others
    at their next :meth:`refresh` (``start(refresh_interval_s=...)`` runs it periodically).
    """

    def __init__(
        self, config_keys: Iterable[Any] = (), ledger: Ledger | None = None, tenants: Mapping[str, Any] | None = None
    ) -> None:
        self.ledger = ledger
        self.tenants: dict[str, TenantPolicy] | None = None
        self._config: dict[str, _Entry] = {}
        self._persisted: dict[str, _Entry] = {}
        self._active: dict[str, _Entry] = {}
        self._task: asyncio.Task[None] | None = None
        self.update_config_keys(config_keys, tenants)

    def update_config_keys(self, config_keys: Iterable[Any], tenants: Mapping[str, Any] | None = None) -> None:
        """Replace the keys (and tenants, when given) from the config, e.g. after a hot reload; the lookup
        table is swapped atomically. Raises ``ValueError`` (nothing changes) for a malformed key."""
        policies = self.tenants if tenants is None else {name: TenantPolicy.from_obj(t) for name, t in tenants.items()}
        entries: dict[str, _Entry] = {}
        for k in config_keys:
            e = self._config_entry(k, policies)
            if e.key_id in entries:
                raise ValueError(f"keys: id {e.key_id!r} appears twice; give every key its own id")
            entries[e.key_id] = e
        self.tenants, self._config = policies, entries
        self._rebuild()

    @staticmethod
    def _config_entry(k: Any, tenants: Mapping[str, TenantPolicy] | None) -> _Entry:
        get = k.get if isinstance(k, Mapping) else (lambda n, d=None: getattr(k, n, d))
        key_id = get("id") or get("key_id")
        try:
            key_id = check_key_id(key_id)
        except ValueError as e:
            raise ValueError(f"keys: {e}") from None
        tenant, sha = get("tenant"), str(get("sha256") or "").lower()
        if not isinstance(tenant, str) or (tenants is not None and tenant not in tenants):
            raise ValueError(
                f"keys[{key_id}].tenant: {tenant!r} is not a tenant in the config; "
                f"add it under tenants or use one of {sorted(tenants or ())}"
            )
        if not re.fullmatch(r"[0-9a-f]{64}", sha):
            raise ValueError(
                f"keys[{key_id}].sha256: not 64 hex characters; put the SHA-256 of the secret "
                "(the part after the last '-' of the key) there"
            )
        models = get("allowed_models")
        return _Entry(key_id, tenant, sha, None if models is None else tuple(models), Limits.from_obj(k), "config")

    async def start(self, refresh_interval_s: float | None = None) -> None:
        """Load persisted keys/revocations from the ledger (started by the caller); with
        ``refresh_interval_s``, reload them periodically in the background."""
        await self.refresh()
        if refresh_interval_s and self.ledger is not None:
            self._task = asyncio.create_task(self._refresh_loop(refresh_interval_s), name="servelab-keys-refresh")

    async def _refresh_loop(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.refresh()
            except Exception as e:  # noqa: BLE001 — any refresh failure keeps the current keys
                log.error("keys: refresh from the ledger failed (keeping the current keys): %s", e)

    async def refresh(self) -> None:
        """Re-read persisted keys from the ledger and swap the lookup table atomically."""
        if self.ledger is None:
            return
        persisted = {}
        for r in await self.ledger.load_keys():
            persisted[r.key_id] = _Entry(
                r.key_id,
                r.tenant,
                r.sha256,
                r.allowed_models,
                Limits.from_obj(r.limits),
                r.source,
                r.created_ts,
                r.revoked_ts,
            )
        self._persisted = persisted
        self._rebuild()

    def _rebuild(self) -> None:
        active = {}
        for key_id, e in self._config.items():
            p = self._persisted.get(key_id)
            if p is not None and p.revoked_ts is not None and hmac.compare_digest(p.sha256, e.sha256):
                continue  # revoked through the admin port
            active[key_id] = e
        for key_id, p in self._persisted.items():
            if p.source == "admin" and p.revoked_ts is None and key_id not in self._config:
                active[key_id] = p
        self._active = active

    async def close(self) -> None:
        """Stop the refresh task (the ledger is closed by its owner)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def authenticate(self, header_value: str | None) -> KeyInfo:
        """Check an ``Authorization`` header value (``Bearer sk-sl-...``; a bare key is accepted too).

        Returns the caller's :class:`KeyInfo`; raises ``GatewayError(401, code="invalid_api_key")`` with a
        message saying what is wrong (missing, malformed, unknown/revoked) and never echoing the key.
        """
        if not header_value or not header_value.strip():
            raise _unauthorized("Missing API key: send it as 'Authorization: Bearer sk-sl-...'")
        value = header_value.strip()
        scheme, _, rest = value.partition(" ")
        token = rest.strip() if scheme.lower() == "bearer" else value
        parsed = parse_key(token)
        if parsed is None:
            raise _unauthorized(
                "Malformed API key: servelab keys look like 'sk-sl-<id>-<64 hex characters>'; "
                "check that the whole key was copied"
            )
        key_id, secret = parsed
        e = self._active.get(key_id)
        # compare even when the id is unknown, so both paths take the same time
        expected = e.sha256 if e is not None else "0" * 64
        if not hmac.compare_digest(hash_secret(secret), expected) or e is None:
            raise _unauthorized("Incorrect or revoked API key; ask your administrator for a valid key")
        tenant = (self.tenants or {}).get(e.tenant) or TenantPolicy()
        models = e.allowed_models
        if tenant.allowed_models is not None:
            models = tenant.allowed_models if models is None else tuple(m for m in models if m in tenant.allowed_models)
        return KeyInfo(
            e.key_id,
            e.tenant,
            models,
            tenant.limits.merged(e.limits),
            tenant.shared_limits,
            tenant.log_prompts,
            e.source,
        )

    async def create(
        self,
        tenant: str,
        allowed_models: Iterable[str] | None = None,
        limits: Mapping[str, int | None] | None = None,
        key_id: str | None = None,
    ) -> NewKey:
        """Create a key for ``tenant``, persist its hash, make it usable at once; the secret is returned
        only here. Raises ``ValueError`` for an unknown tenant, a bad or taken ``key_id``, bad limits, or
        ``allowed_models`` the tenant may not use (a key never widens its tenant's list)."""
        if not isinstance(tenant, str) or not tenant.strip():
            raise ValueError("tenant: give the name of a tenant from the config")
        if self.tenants is not None and tenant not in self.tenants:
            raise ValueError(f"tenant {tenant!r} is not in the config; use one of {sorted(self.tenants)}")
        key_id = check_key_id(key_id) if key_id else "k" + secrets.token_hex(6)
        if key_id in self._config or key_id in self._persisted:
            raise ValueError(f"key id {key_id!r} is already used (ids are never reused, even after revoke)")
        unknown = sorted(set(limits or {}) - set(LIMIT_FIELDS))
        if unknown:
            raise ValueError(f"unknown limit(s) {unknown}; use {list(LIMIT_FIELDS)}")
        lim = Limits.from_obj(limits)  # validates the values
        clean: dict[str, int | None] = {k: v for k, v in (limits or {}).items() if v is not None}
        models = None if allowed_models is None else tuple(allowed_models)
        pol = (self.tenants or {}).get(tenant)
        if models is not None and pol is not None and pol.allowed_models is not None:
            denied = sorted(set(models) - set(pol.allowed_models) - {"*"})
            if denied or "*" in models:
                raise ValueError(
                    f"allowed_models {denied or ['*']} are not allowed for tenant {tenant!r} (it may use "
                    f"{list(pol.allowed_models)}); give a subset of those, or null for all of them"
                )
        secret = secrets.token_hex(SECRET_BYTES)
        rec = KeyRecord(key_id, tenant, hash_secret(secret), models, clean, time.time())
        if self.ledger is not None:
            await self.ledger.put_key(rec)
        self._persisted[key_id] = _Entry(key_id, tenant, rec.sha256, models, lim, "admin", rec.created_ts)
        self._rebuild()
        log.info("keys: created key %s for tenant %s", key_id, tenant)
        return NewKey(key_id, tenant, format_key(key_id, secret), models, rec.created_ts)

    async def revoke(self, key_id: str) -> bool:
        """Revoke ``key_id`` (admin-created or from the config) at once and persistently. Returns ``False``
        if it is unknown or already revoked."""
        e = self._active.get(key_id)
        if e is None:
            return False
        now = time.time()
        rec = KeyRecord(
            key_id, e.tenant, e.sha256, e.allowed_models, _limits_dict(e.limits), e.created_ts or now, now, e.source
        )
        if self.ledger is not None:
            await self.ledger.put_key(rec)
        self._persisted[key_id] = _Entry(
            key_id, e.tenant, e.sha256, e.allowed_models, e.limits, e.source, rec.created_ts, now
        )
        self._rebuild()
        log.info("keys: revoked key %s", key_id)
        return True

    def list(self) -> list[dict[str, Any]]:
        """Every known key (no hashes, no secrets): ``key_id``, ``tenant``, ``allowed_models``, ``source``
        (``config``/``admin``), ``created_ts``, ``revoked`` (bool), ``limits`` (overrides only)."""
        out = {}
        for src in (self._config, self._persisted):
            for key_id, e in src.items():
                if e.source == "config" and src is self._persisted and key_id in self._config:
                    e = _Entry(**{**self._config[key_id].__dict__, "revoked_ts": e.revoked_ts})
                out[key_id] = {
                    "key_id": key_id,
                    "tenant": e.tenant,
                    "allowed_models": None if e.allowed_models is None else list(e.allowed_models),
                    "source": e.source,
                    "created_ts": e.created_ts,
                    "revoked": key_id not in self._active,
                    "limits": _limits_dict(e.limits),
                }
        return sorted(out.values(), key=lambda d: (d["tenant"], d["key_id"]))


def _limits_dict(lim: Limits) -> dict[str, int | None]:
    return {
        k: v
        for k, v in (
            ("rpm", lim.rpm),
            ("tpm", lim.tpm),
            ("max_concurrency", lim.max_concurrency),
            ("token_budget", lim.token_budget),
        )
        if v is not None
    }
