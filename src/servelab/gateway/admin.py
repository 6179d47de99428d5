"""The gateway's admin API: its own aiohttp app on its own port, with its own credential.

Every request needs ``Authorization: Bearer <admin token>``. The token is read from the environment
variable named in the config (``admin.token_env``) or checked against ``admin.token_sha256``; both sides
are hashed with SHA-256 and compared with :func:`hmac.compare_digest` (constant time, no length leak).

Endpoints (JSON in and out; errors use the OpenAI error body):

- ``POST /admin/keys`` ``{"tenant": str, "allowed_models": [str] | null, "key_id": str | null,
  "limits": {"rpm"|"tpm"|"max_concurrency"|"token_budget": int}}`` -> 201 ``{"key_id", "tenant",
  "allowed_models", "created_ts", "key"}``; ``key`` (the secret) appears in this response only.
- ``GET /admin/keys`` -> ``{"keys": [{"key_id", "tenant", "allowed_models", "source", "created_ts",
  "revoked", "limits"}]}`` (no secrets, no hashes).
- ``DELETE /admin/keys/{key_id}`` -> ``{"key_id", "revoked": true}``; 404 when unknown or already revoked.
- ``POST /admin/reload`` -> ``{"reloaded": true, "result": ...}`` from the server's reload hook; 400
  with the config error line when the new config is invalid (the hook raised :class:`ConfigError` or
  returned ``{"ok": false, "error": ...}``; the running config stays).
- ``GET /admin/backends`` -> ``{"backends": ...}`` from the server's backend-state hook.
- ``GET /admin/usage?group_by=key_id,model&since_ts=&until_ts=`` -> ``{"totals": [...]}`` (ledger sums);
  ``since_ts``/``until_ts`` are finite epoch seconds >= 0 with ``since_ts <= until_ts`` (else 400).
- ``GET /admin/shadow?model=&agree=0.9`` -> :class:`servelab.gateway.shadow.ShadowReport` (old vs new per
  model over the mirrored requests this replica recorded; ``agree``: similarity in [0, 1] that counts as
  the same answer, else 400).

Input is validated like the config file: ``limits`` by the config's own model (each of ``rpm``, ``tpm``,
``max_concurrency``, ``token_budget`` a whole number >= 1 or null, as ``tenants.*`` in the config; 0 is
refused there and here). Every answer is JSON in OpenAI's error shape, also for unknown paths (404),
wrong methods (405) and failures: a key/usage database that cannot be reached (PostgreSQL down, SQLite
unwritable) answers 503 ``database_unavailable`` with ``Retry-After``; any other failure 500
``internal_error`` (details in the server log only).
"""

from __future__ import annotations

import hashlib
import hmac
import inspect
import logging
import math
import os
import sqlite3
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web
from pydantic import ValidationError

from servelab.gateway.config import SharedLimits
from servelab.gateway.errors import openai_error_body
from servelab.gateway.keys import KeyStore
from servelab.gateway.ledger import Ledger
from servelab.wire.errors import ConfigError

__all__ = ["ADMIN_TOKEN_MIN_CHARS", "admin_token_digest", "make_admin_app"]

log = logging.getLogger("servelab.gateway.admin")

Hook = Callable[[], Any | Awaitable[Any]]
#: the shortest admin token accepted (characters); 16 hex characters = 64 bits
ADMIN_TOKEN_MIN_CHARS = 16


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def _error(
    status: int, message: str, code: str | None = None, param: str | None = None, headers: dict[str, str] | None = None
) -> web.Response:
    typ = {
        401: "authentication_error",
        404: "invalid_request_error",
        501: "server_error",
        500: "server_error",
        503: "server_error",
    }.get(status, "invalid_request_error")
    return web.Response(
        body=openai_error_body(message, typ, code, param),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _db_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "the database cannot be used now" (not a bug): OS/connection errors,
    timeouts, SQLite operational errors, asyncpg's errors (when installed)."""
    errs: tuple[type[BaseException], ...] = (OSError, TimeoutError, sqlite3.OperationalError)
    try:
        import asyncpg

        errs += (asyncpg.PostgresError, asyncpg.InterfaceError)
    except ImportError:  # pragma: no cover - asyncpg is a dependency
        pass
    return errs


def _limits_error(limits: dict[str, Any]) -> str | None:
    """None when ``limits`` passes the config's rules (:class:`~servelab.gateway.config.SharedLimits`,
    strict types: JSON numbers only), else one line naming the field."""
    try:
        SharedLimits.model_validate(limits, strict=True)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(x) for x in err.get("loc", ()))
        if err.get("type") == "extra_forbidden":
            return f"limits.{where}: unknown limit; use rpm, tpm, max_concurrency or token_budget"
        return (
            f"limits.{where}: {err.get('msg', 'invalid')}, got {err.get('input')!r}; give a whole number >= 1 "
            "or null for unlimited (as in the config file)"
        )
    return None


def _timestamp(q: Any, name: str) -> float | None:
    """Query parameter ``name`` as finite epoch seconds >= 0 (None when absent); raises ValueError."""
    if name not in q:
        return None
    try:
        v = float(q[name])
    except ValueError:
        raise ValueError(f"{name}: {q[name][:40]!r} is not a number; give epoch seconds, e.g. 1764547200") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name}: {q[name][:40]!r} is not a finite time >= 0; give epoch seconds, e.g. 1764547200")
    return v


async def _call(hook: Hook) -> Any:
    res = hook()
    return await res if inspect.isawaitable(res) else res


def admin_token_digest(token_env: str | None = "SERVELAB_ADMIN_TOKEN", token_sha256: str | None = None) -> bytes:
    """The SHA-256 digest the admin credential is checked against: of the token in env var ``token_env``,
    else ``token_sha256`` (hex). Raises :class:`ConfigError` (one line, with the fix) when neither is set
    or the token is shorter than :data:`ADMIN_TOKEN_MIN_CHARS` (a guessable admin credential is refused
    at start, not warned about)."""
    token = os.environ.get(token_env, "") if token_env else ""
    if token.strip():
        if len(token.strip()) < ADMIN_TOKEN_MIN_CHARS:
            raise ConfigError(
                f"admin: the token in {token_env} is {len(token.strip())} characters, shorter than "
                f"{ADMIN_TOKEN_MIN_CHARS}; export a long random one, e.g. {token_env}="
                "$(python -c 'import secrets; print(secrets.token_hex(32))')"
            )
        return hashlib.sha256(token.strip().encode()).digest()
    if token_sha256:
        try:
            return bytes.fromhex(token_sha256)
        except ValueError:
            raise ConfigError(
                "admin.token_sha256: not hex; put the SHA-256 (64 hex characters) of the admin token there"
            ) from None
    raise ConfigError(
        f"admin: environment variable {token_env or '(admin.token_env)'} is empty and "
        "admin.token_sha256 is not set; export a long random token, e.g. "
        f"{token_env or 'SERVELAB_ADMIN_TOKEN'}="
        "$(python -c 'import secrets; print(secrets.token_hex(32))')"
    )


def _errors_middleware(db_errors: tuple[type[BaseException], ...]) -> Any:
    """The admin app's error middleware: every failure as an OpenAI-shaped JSON answer (never aiohttp's
    plain-text pages); ``db_errors``, the key/usage database's driver errors, become 503 + Retry-After."""

    @web.middleware
    async def errors(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            code = {404: "unknown_path", 405: "method_not_allowed", 413: "request_too_large"}.get(e.status)
            msg = {
                404: f"no such admin endpoint: {request.method} {request.path[:200]}",
                405: f"{request.path[:200]} does not take {request.method}",
            }.get(e.status, e.reason)
            return _error(e.status, msg, code)
        except db_errors as e:
            log.error(
                "admin: %s %s: the key/usage database is unavailable: %s: %s",
                request.method,
                request.path[:200],
                type(e).__name__,
                str(e).splitlines()[0][:200] if str(e) else "",
            )
            return _error(
                503,
                "the key/usage database is unavailable; retry in a few seconds",
                "database_unavailable",
                headers={"Retry-After": "5"},
            )
        except Exception:
            log.exception("admin: %s %s failed", request.method, request.path[:200])
            return _error(500, "the admin API failed on this request; see the gateway log", "internal_error")

    return errors


def _auth_middleware(digest: bytes) -> Any:
    """The admin app's auth middleware: 401 unless ``Authorization: Bearer T`` with sha256(T) == ``digest``
    (compared in constant time)."""

    @web.middleware
    async def auth(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        given = hashlib.sha256(token.strip().encode()).digest() if scheme.lower() == "bearer" else b""
        if not hmac.compare_digest(given, digest):
            return _error(
                401,
                "admin token missing or wrong: send 'Authorization: Bearer <admin token>'",
                "invalid_admin_token",
                headers={"WWW-Authenticate": "Bearer"},
            )
        return await handler(request)

    return auth


def _key_request_error(body: Any, tenants: Any) -> web.Response | None:
    """The 400 answer for a ``POST /admin/keys`` body that is not ``{tenant, allowed_models?, key_id?,
    limits?}`` with valid values (``tenants``: the names allowed, ``None`` = any), else ``None``."""
    if not isinstance(body, dict) or not isinstance(body.get("tenant"), str):
        return _error(400, "'tenant' (a string) is required", "missing_tenant", "tenant")
    unknown = sorted(set(body) - {"tenant", "allowed_models", "key_id", "limits"})
    if unknown:
        return _error(
            400, f"unknown field(s) {unknown}; use tenant, allowed_models, key_id, limits", "unknown_field", unknown[0]
        )
    models = body.get("allowed_models")
    if models is not None and (not isinstance(models, list) or not all(isinstance(m, str) for m in models)):
        return _error(400, "'allowed_models' must be a list of model names or null", "bad_models", "allowed_models")
    limits = body.get("limits") or {}
    if not isinstance(limits, dict):
        return _error(400, "'limits' must be an object like {\"rpm\": 60}", "bad_limits", "limits")
    bad = _limits_error(limits)
    if bad is not None:
        return _error(400, bad, "invalid_key_request", "limits")
    if body.get("key_id") is not None and not isinstance(body["key_id"], str):
        return _error(400, "'key_id' must be a string or null", "invalid_key_request", "key_id")
    if tenants is not None and body["tenant"] not in tenants:
        return _error(
            400,
            f"tenant {body['tenant']!r} is not in the config; use one of {sorted(tenants)}",
            "invalid_key_request",
            "tenant",
        )
    return None


def _usage_query(q: Any) -> tuple[tuple[str, ...], float | None, float | None]:
    """``(group_by, since_ts, until_ts)`` of a ``GET /admin/usage`` query; raises ValueError (one line)
    for a bad timestamp or a window that ends before it starts."""
    group_by = tuple(g for g in q.get("group_by", "key_id,model").split(",") if g)
    since = _timestamp(q, "since_ts")
    until = _timestamp(q, "until_ts")
    if since is not None and until is not None and since > until:
        raise ValueError(f"since_ts {since:g} is after until_ts {until:g}; swap them")
    return group_by, since, until


def _shadow_handler(shadow_hook: Callable[[str | None, float], Any] | None) -> Any:
    """The ``GET /admin/shadow`` handler over ``shadow_hook`` (501 without one)."""

    async def shadow(request: web.Request) -> web.Response:
        if shadow_hook is None:
            return _error(501, "this gateway has no shadow report", "not_supported")
        q = request.query
        try:
            agree = float(q.get("agree", "0.9"))
        except ValueError:
            return _error(
                400, f"agree: {q['agree'][:40]!r} is not a number; give a similarity in [0, 1], e.g. 0.9", "bad_query"
            )
        try:
            rep = shadow_hook(q.get("model") or None, agree)
        except ValueError as e:
            return _error(400, str(e), "bad_query")
        return _json(rep.model_dump(mode="json") if hasattr(rep, "model_dump") else rep)

    return shadow


def make_admin_app(
    keystore: KeyStore | Any,
    token_env: str | None = "SERVELAB_ADMIN_TOKEN",
    *,
    token_sha256: str | None = None,
    reload_hook: Hook | None = None,
    backends_hook: Hook | None = None,
    ledger: Ledger | None = None,
    tenants_hook: Callable[[], Any] | None = None,
    shadow_hook: Callable[[str | None, float], Any] | None = None,
) -> web.Application:
    """Build the admin :class:`aiohttp.web.Application` (the caller runs it on the admin port).

    ``keystore``: the server's :class:`KeyStore` (create/revoke take effect at once on this replica).
    Or pass the running gateway object itself (anything with ``keystore``, ``ledger``, ``config.admin``,
    ``config.tenants``, ``reload()``, ``backend_states()``): every other argument is then taken from it.
    ``tenants_hook()``: the tenant names keys may be created for (default: the key store's tenants).
    ``token_env`` / ``token_sha256``: the credential (see :func:`admin_token_digest`; raises
    :class:`ConfigError` when missing). ``reload_hook()``: reloads the config, returns a JSON-able summary,
    raises :class:`ConfigError` for an invalid file. ``backends_hook()``: JSON-able backend state.
    ``ledger``: for ``GET /admin/usage``. ``shadow_hook(model, agree)``: the shadow report (a pydantic
    model or JSON-able value) for ``GET /admin/shadow``, raising ValueError for a bad ``agree``.
    Hooks may be plain or async callables; a missing one answers 501.
    """
    if not isinstance(keystore, KeyStore) and hasattr(keystore, "keystore"):
        gw = keystore
        keystore, ledger = gw.keystore, gw.ledger
        token_env, token_sha256 = gw.config.admin.token_env, gw.config.admin.token_sha256
        reload_hook, backends_hook = gw.reload, gw.backend_states
        tenants_hook = lambda: gw.config.tenants  # noqa: E731 (read at each call: follows reloads)
        shadow_hook = getattr(getattr(gw, "shadows", None), "report", None)
    digest = admin_token_digest(token_env, token_sha256)

    errors = _errors_middleware(_db_errors())

    auth = _auth_middleware(digest)

    async def create_key(request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return _error(400, 'the body is not JSON; send {"tenant": "..."}', "invalid_json")
        refused = _key_request_error(body, None if tenants_hook is None else tenants_hook())
        if refused is not None:
            return refused
        try:
            new = await keystore.create(
                body["tenant"], body.get("allowed_models"), body.get("limits") or {}, body.get("key_id")
            )
        except ValueError as e:
            return _error(400, str(e), "invalid_key_request")
        return _json(
            {
                "key_id": new.key_id,
                "tenant": new.tenant,
                "created_ts": new.created_ts,
                "allowed_models": None if new.allowed_models is None else list(new.allowed_models),
                "key": new.key,
            },
            status=201,
        )

    async def list_keys(request: web.Request) -> web.Response:
        return _json({"keys": keystore.list()})

    async def revoke_key(request: web.Request) -> web.Response:
        key_id = request.match_info["key_id"]
        if not await keystore.revoke(key_id):
            return _error(404, f"no active key with id {key_id!r}; see GET /admin/keys", "key_not_found")
        return _json({"key_id": key_id, "revoked": True})

    async def reload(request: web.Request) -> web.Response:
        if reload_hook is None:
            return _error(501, "this gateway has no reload hook", "not_supported")
        try:
            result = await _call(reload_hook)
        except ConfigError as e:
            return _error(400, f"reload refused, the running config stays: {e}", "invalid_config")
        except Exception as e:
            log.exception("admin: reload failed")
            return _error(500, f"reload failed, the running config stays: {type(e).__name__}: {e}", "reload_failed")
        if isinstance(result, dict) and result.get("ok") is False:  # a hook that reports instead of raising
            return _error(400, f"reload refused, the running config stays: {result.get('error')}", "invalid_config")
        return _json({"reloaded": True, "result": result})

    async def backends(request: web.Request) -> web.Response:
        if backends_hook is None:
            return _error(501, "this gateway has no backend-state hook", "not_supported")
        return _json({"backends": await _call(backends_hook)})

    async def usage(request: web.Request) -> web.Response:
        if ledger is None:
            return _error(501, "this gateway has no ledger", "not_supported")
        try:
            totals = await ledger.totals(*_usage_query(request.query))
        except ValueError as e:
            return _error(400, str(e), "bad_query")
        return _json({"totals": totals})

    app = web.Application(middlewares=[errors, auth])
    app.router.add_post("/admin/keys", create_key)
    app.router.add_get("/admin/keys", list_keys)
    app.router.add_delete("/admin/keys/{key_id}", revoke_key)
    app.router.add_post("/admin/reload", reload)
    app.router.add_get("/admin/backends", backends)
    app.router.add_get("/admin/usage", usage)
    app.router.add_get("/admin/shadow", _shadow_handler(shadow_hook))
    return app
