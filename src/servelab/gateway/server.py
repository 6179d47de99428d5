"""The gateway's aiohttp server: the OpenAI API in front of many engines, and its hot path.

Per request (``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``):
auth (key -> tenant) -> body size (413) -> JSON + field types (400) -> model resolution (task header,
404, 403) -> capability registry (400) -> limits admit (429) -> route plan -> upstream attempts
(retries with backoff only before the first byte reached the client, on connection failures, 429, 503;
then the fallback chain) -> pass-through -> usage -> ledger row + limits settle (exactly once, also on
errors and client disconnects) -> one JSON access-log line.

Streaming pass-through: every upstream read that completes at least one SSE event is written to the
client at once (``X-Accel-Buffering: no``, one ``write`` per upstream read, bytes unchanged except an
engine-specific ``finish_reason`` such as TGI's ``stop_sequence``, mapped to OpenAI's by :func:`openai_finish`
in the few chunks that carry a finish reason as a string; the same in whole answers). The gateway
parses only what it must: every event until the first token (to time TTFT at the first token-carrying
chunk, ENGINE_WIRE.md case 1), and afterwards only blocks that contain ``"usage":{`` or ``"error"``
(a bytes search first, ``orjson`` only on a hit). Upstream always gets ``stream_options.include_usage``
(case 9); the usage-only chunk (``choices: []``, case 7) is removed when the client did not ask for it.
An error inside a 200 stream (case 15, any dialect) becomes one clean OpenAI error event followed by
``data: [DONE]``; an upstream that stops mid-way gets the same treatment.

Accounting: tokens come from the engine's ``usage``. When it never arrived (client disconnected, upstream
cut off), the gateway charges the prompt estimate (:func:`~servelab.gateway.capabilities.estimate_prompt_tokens`,
a lower bound) plus one token per token-carrying chunk it forwarded: what it saw being served, never the
reservation. A request that reached no engine (refused, or every attempt failed before any byte) is
charged 0.

Hot reload (:meth:`Gateway.reload`, on SIGHUP or a change of the file's mtime/size/content): a new
:class:`_Snapshot` is built from the new file and swapped in with one assignment; each request holds the
snapshot it started with until it ends, so in-flight streams keep their config. A bad file leaves the
running config in force; the error line is logged and kept in :attr:`Gateway.last_reload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import os
import re
import secrets
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson
from aiohttp import web

from servelab.gateway import capabilities as caps_mod
from servelab.gateway import lengths
from servelab.gateway.breaker import BreakerBoard, BreakerSettings, RetryBudget, backoff_s
from servelab.gateway.config import GatewayConfig, load_config
from servelab.gateway import bodies, clientip, degrade, logprobs, policy, scopes, scrub
from servelab.gateway.served import ServedCount, choices_per_prompt
from servelab.gateway.errors import GatewayError, bad_request
from servelab.gateway.limits import safe_url
from servelab.gateway.fdbudget import is_local_resource_error
from servelab.gateway.listener import GuardedRunner, settings_for
from servelab.gateway.metrics import CONTENT_TYPE_LATEST, GatewayMetrics, HistogramBatch
from servelab.gateway.routing import Backend as RouteBackend
from servelab.gateway.routing import FallbackSpec, LoadTracker, ModelRoute, Router, ShadowSpec, Target, TargetSpec
from servelab.gateway.routing import affinity_text
from servelab.wire.client import ConfigError
from servelab.wire.types import normalize_finish

__all__ = ["Gateway", "RELOAD_POLL_S", "map_finish_bytes", "openai_finish"]

log = logging.getLogger("servelab.gateway")
_now = time.monotonic_ns

#: How often the config file is checked for changes (seconds).
RELOAD_POLL_S = 1.0
_RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"
_STALE = (aiohttp.ServerDisconnectedError,)
_CONNECT_ERRORS = (aiohttp.ClientConnectionError, ConnectionError, OSError)
_ENDPOINT_PATH = {"chat": "/v1/chat/completions", "completions": "/v1/completions", "embeddings": "/v1/embeddings"}
#: the public routes and their method (for the 404/405 answers)
_ROUTES = {"/v1/chat/completions": "POST", "/v1/completions": "POST", "/v1/embeddings": "POST", "/v1/models": "GET",
           "/health": "GET", "/health/live": "GET", "/metrics": "GET"}
#: OpenAI's finish reasons (https://platform.openai.com/docs/api-reference/chat/object, checked 2026-11-30)
_OPENAI_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})
#: a finish reason given as a JSON string: unescaped quotes cannot occur inside a JSON string value, so
#: this matches real ``finish_reason`` keys only, never text that mentions one
_FINISH_RE = re.compile(rb'("finish_reason":\s*")([^"\\]*)(")')
_FINISH_MARKS = (b'"finish_reason":"', b'"finish_reason": "')
#: a top-level or nested ``"model": "<string>"`` member; a key is preceded by ``{`` or ``,`` (whitespace
#: allowed), which an escaped quote inside a string value never is, so generated text is never touched
_MODEL_RE = re.compile(rb'(?<=[{,])(\s*)"model"\s*:\s*"(?:[^"\\]|\\.)*"')


def openai_finish(raw: str) -> str:
    """An engine's finish reason as OpenAI's: ``stop_sequence``/``eos_token``/``eos`` -> ``stop``,
    ``max_tokens`` -> ``length`` (:data:`servelab.wire.types.FINISH_ALIASES`, ENGINE_WIRE.md case 11);
    OpenAI's own values unchanged. Values with no OpenAI meaning (vLLM ``abort``, ``repetition``, anything
    unknown) are passed on unchanged rather than given a meaning they may not have."""
    if raw in _OPENAI_FINISH:
        return raw
    n = normalize_finish(raw)
    return n if n in _OPENAI_FINISH else raw


def _finish_sub(m: re.Match[bytes]) -> bytes:
    v = m.group(2).decode("utf-8", "replace")
    w = openai_finish(v)
    return m.group(0) if w == v else m.group(1) + w.encode() + m.group(3)


def map_finish_bytes(data: bytes) -> bytes:
    """``data`` (SSE events or a JSON body) with every ``"finish_reason":"<engine value>"`` mapped by
    :func:`openai_finish`; every other byte unchanged (the same object when nothing needed mapping)."""
    if not any(mark in data for mark in _FINISH_MARKS):
        return data
    out = _FINISH_RE.sub(_finish_sub, data)
    return data if out == data else out


def _count_token_events(block: bytes) -> int:
    """Token-carrying events in ``block`` by a bytes count (no JSON parse): ``data:`` lines that are not
    ``[DONE]``, an empty delta or empty content (the hot path's estimate, module doc)."""
    return (block.count(b"data:") - block.count(b"data: [DONE]") - block.count(b'"delta":{}')
            - block.count(b'"content":""') - block.count(b'"text":""'))


class _Snapshot:
    """Everything derived from one config file; never mutated after it is built, so a request can keep
    using the one it started with while a reload installs the next."""

    def __init__(self, cfg: GatewayConfig, version: int, breakers: BreakerBoard, load: LoadTracker) -> None:
        self.cfg = cfg
        self.version = version
        self.backends = {b.name: b for b in cfg.backends}
        route_backends = [RouteBackend(name=b.name, kind=b.kind, base_url=b.base_url, models=tuple(b.models),
                                       max_in_flight=b.max_in_flight or 0, pool=b.pool,
                                       health_path=b.health_path or ("/health" if b.kind == "embedder" else None))
                          for b in cfg.backends]
        self.route_backends = route_backends
        for b in cfg.backends:  # every backend has a breaker from the start (shared-state sync, metrics)
            breakers.get(b.name)
        routes = []
        for name, m in cfg.models.items():
            sh = None
            if m.shadow is not None:
                sh = ShadowSpec(m.shadow.target.backend, cfg.upstream_model(m.shadow.target), m.shadow.sample_rate)
            routes.append(ModelRoute(
                name=name,
                targets=tuple(TargetSpec(t.backend, cfg.upstream_model(t),
                                         t.weight * self.backends[t.backend].weight) for t in m.targets),
                fallback=tuple(FallbackSpec(f.model, f.max_tokens, dict(f.params)) for f in m.fallback),
                shadow=sh))
        self.router = Router(route_backends, routes, tasks=cfg.routing.tasks, breakers=breakers, load=load,
                             affinity_chars=cfg.routing.affinity_chars,
                             balance_factor=cfg.routing.balance_factor)
        self.timeouts = {b.name: aiohttp.ClientTimeout(total=None, sock_connect=b.connect_timeout_s,
                                                       connect=None, sock_read=b.read_timeout_s)
                         for b in cfg.backends}
        self.auth_headers: dict[str, dict[str, str]] = {}
        for b in cfg.backends:
            key = os.environ.get(b.api_key_env, "") if b.api_key_env else ""
            self.auth_headers[b.name] = {"Authorization": f"Bearer {key}"} if key else {}
        # strings never shown to a client: backend names, upstream model names, URLs
        hide = {b.name for b in cfg.backends} | {b.base_url for b in cfg.backends}
        hide |= {mname for b in cfg.backends for mname in b.models if mname not in cfg.models}
        self.hide = tuple(sorted(hide, key=len, reverse=True))
        self.redact = {t: [re.compile(p) for p in ten.redact] for t, ten in cfg.tenants.items()}
        self.pool_of = {b.name: b.pool for b in cfg.backends}
        self.model_cards = {name: _model_card(name, m) for name, m in cfg.models.items()}
        self.retry_budget: RetryBudget | None = None  # set by the Gateway (kept across reloads)


def _breaker_settings(cfg: GatewayConfig) -> BreakerSettings:
    bs = cfg.breaker
    return BreakerSettings(consecutive_failures=bs.consecutive_failures, error_rate=bs.error_rate,
                           window_s=bs.window_s, min_requests=bs.min_requests, open_s=bs.open_s)


def _model_card(name: str, m: Any) -> dict[str, Any]:
    c = m.capabilities
    return {"id": name, "object": "model", "created": 0, "owned_by": "servelab",
            "capabilities": c.model_dump(mode="json"), **({"description": m.description} if m.description else {})}


@dataclass(slots=True)
class _Req:
    """Per-request state kept for the access log, metrics, ledger and settle."""

    rid: str
    endpoint: str
    t0_ns: int
    ts: float
    key_id: str = "-"
    tenant: str = "-"
    model: str = "-"
    backend: str | None = None
    upstream_model: str | None = None
    status: int = 0
    outcome: str = "ok"
    error_code: str | None = None
    ttft_ns: int | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_est: int = 0
    token_events: int = 0
    served: bool = False
    retries: int = 0
    fallback: bool = False
    stream: bool = False
    prompt_text: str | None = None
    #: ``"model":"<public name>"`` as JSON bytes: replaces the engine's own model name in what is forwarded
    model_field: bytes = b""
    #: the engine's own ``"model":...`` member as last seen (exact bytes), for the fast replace
    model_seen: bytes = b""
    #: the client's own X-Request-ID (validated), logged apart from ``rid``
    client_rid: str | None = None
    #: the output bound per sequence this request reserved (tokens); what is forwarded never exceeds it
    out_cap: int = 0
    #: what a degrade rule did (degrade.Decision.log_record), for the access log
    degraded: dict[str, Any] | None = None
    #: the client IP limits count (servelab.gateway.clientip) and the key's application
    client_ip: str | None = None
    application: str | None = None
    #: sampling defaults applied and values clamped (policy.Applied.log_record)
    policy: dict[str, Any] | None = None
    #: usage per choice and request-wide (servelab.gateway.served): what n > 1 / prompt lists served
    tally: ServedCount | None = None
    #: the output bound forwarded to the engine on the attempt that answered (tokens per sequence)
    sent_cap: int = 0


class _UpstreamFailed(Exception):
    """An attempt failed before any byte reached the client; ``retry`` says whether another target may
    be tried (connection failure, timeout, engine 429/5xx or an error answer: degrade.another_target),
    ``error`` is what the client gets if none is left."""

    def __init__(self, error: GatewayError, retry: bool, reason: str) -> None:
        super().__init__(error.message)
        self.error = error
        self.retry = retry
        self.reason = reason


class _AccessLog:
    """One JSON line per request to stderr or a file (``server.access_log``); writes are unbuffered
    bytes so a crash loses no finished request's line."""

    def __init__(self, where: str | None) -> None:
        self.where = where
        self._f: IO[bytes] | None = None
        if where == "-":
            self._f = sys.stderr.buffer
        elif where:
            Path(where).parent.mkdir(parents=True, exist_ok=True)
            self._f = open(where, "ab", buffering=0)  # noqa: SIM115 - closed in close()

    def write(self, rec: dict[str, Any]) -> None:
        if self._f is not None:
            try:
                self._f.write(orjson.dumps(rec) + b"\n")
                if self.where == "-":
                    self._f.flush()
            except (OSError, ValueError) as e:  # a full disk must not fail requests
                log.warning("access log write failed: %s", e)

    def close(self) -> None:
        if self._f is not None and self.where not in (None, "-"):
            self._f.close()
        self._f = None


def _reason(e: BaseException) -> str:
    """One line for an exception: its class and first message line (OSError: its strerror)."""
    msg = (e.strerror if isinstance(e, OSError) and e.strerror else str(e)).strip().splitlines()
    return f"{type(e).__name__}: {msg[0]}" if msg else type(e).__name__


def _request_id(request: web.Request) -> str:
    """A fresh id made by the gateway (24 hex characters, 96 random bits): the ``X-Request-ID`` of every
    answer, the access log's and ledger's ``request_id``. Never the client's own ``X-Request-ID``, which
    a client can repeat or choose to steer anything keyed on it (see :func:`_client_request_id`)."""
    return secrets.token_hex(12)


def _client_request_id(request: web.Request) -> str | None:
    """The client's ``X-Request-ID`` when it is 1-128 characters of ``[A-Za-z0-9._:-]`` (else None): kept
    as ``client_request_id`` in the access log and sent to engines as ``X-Client-Request-ID``, never used
    as the gateway's id nor for routing."""
    rid = request.headers.get("X-Request-ID")
    return rid if rid and _RID.match(rid) else None


def _listener_fields(s: Any) -> tuple[Any, ...]:
    """The ``server`` fields the listeners take at start (a change needs a restart)."""
    return (s.admin_host, s.header_timeout_s, s.body_timeout_s, s.body_total_timeout_s, s.keepalive_timeout_s,
            s.max_connections, s.admin_max_connections, s.send_timeout_s)


def _error_response(e: GatewayError, rid: str) -> web.Response:
    return web.Response(status=e.status, body=e.body(), content_type="application/json",
                        headers={"X-Request-ID": rid, **e.headers()})


def _retry_after(resp: aiohttp.ClientResponse) -> float | None:
    v = resp.headers.get("Retry-After")
    try:
        return float(v) if v is not None else None
    except ValueError:
        return None


class Gateway:
    """One gateway: the OpenAI app (:attr:`app`), optionally the admin app, shared upstream session,
    limiter, ledger, key store, breakers, health checks and the hot-reloadable config.

    ``config``: a validated :class:`GatewayConfig`; ``config_path``: the file it came from (enables
    reload on change/SIGHUP). ``host``/``port``/``admin_port``/``admin_host`` override the file's ``server``
    section (``port=0`` = free port; read :attr:`port` after :meth:`start`); the admin app binds
    ``admin_host`` (default ``server.admin_host``, 127.0.0.1), never ``host``. Both ports run under
    :class:`~servelab.gateway.listener.GuardedRunner` (timeouts, connection cap, quiet parser errors).
    Components can be injected (tests, embedding): ``ledger``, ``limiter``, ``keystore``. Use
    ``await start()`` / ``await close()``.
    """

    def __init__(self, config: GatewayConfig, config_path: str | Path | None = None, *, host: str | None = None,
                 port: int | None = None, admin_port: int | None = -1, ledger: Any = None, limiter: Any = None,
                 keystore: Any = None, watch: bool = True, admin_host: str | None = None) -> None:
        self.config_path = Path(config_path) if config_path is not None else None
        self.host = host or config.server.host
        self.port = config.server.port if port is None else port
        self.admin_port = config.server.admin_port if admin_port == -1 else admin_port
        self.admin_host = admin_host or config.server.admin_host  # never follows host: admin stays on loopback
        self.metrics = GatewayMetrics()
        self._degrade = degrade.Degrader(self.metrics.registry)  # survives reloads (its TTFT window)
        # with state.redis_url the breakers' open states are shared by every replica using that Redis
        self._redis: Any = None
        if config.state.redis_url:
            import redis.asyncio as aioredis

            self._redis = aioredis.from_url(config.state.redis_url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self.breakers = BreakerBoard(_breaker_settings(config), redis=self._redis)
        self.load = LoadTracker()
        self._version = 0
        self.snap = self._build(config)
        self.retry_budget = RetryBudget(ratio=config.retry.budget_ratio)
        self.last_reload: dict[str, Any] = {"ok": True, "version": 1, "at": time.time(), "error": None,
                                            "source": "start"}
        self._ledger = ledger
        self._limiter = limiter
        self._keystore = keystore
        self._own_keystore = False
        self._watch = watch and self.config_path is not None
        self._file_sig = self._signature()
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._health: Any = None
        self._readiness: Any = None  # readiness.Readiness, made at the first /health
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._access = _AccessLog(config.server.access_log)
        self._shadow_sem = asyncio.Semaphore(16)
        #: HMAC key of routing.session_header when its env var is unset (this process only)
        self._session_secret = secrets.token_bytes(32)
        self.app = self._make_app()

    # ------------------------------------------------------------------ lifecycle
    def _build(self, cfg: GatewayConfig) -> _Snapshot:
        self._version += 1
        return _Snapshot(cfg, self._version, self.breakers, self.load)

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 40)  # bodies are bounded per request (413), not here
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/embeddings", self._embeddings)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health_ep)
        r.add_get("/health/live", self._live_ep)
        r.add_get("/metrics", self._public_metrics_ep)
        r.add_route("*", "/{tail:.*}", self._unknown_path)  # last: only what no route above serves
        return app

    async def _unknown_path(self, request: web.Request) -> web.Response:
        """404/405 as an OpenAI error (the SDK parses it), naming the routes; a path that lacks ``/v1``
        (the usual base_url mistake) is told so."""
        path = request.path[:200]
        allowed = _ROUTES.get(path)
        if allowed is not None and allowed == request.method:
            # routed by the raw path, decoded only here: /v1/chat%2Fcompletions (break-it report on 4b30bb7)
            e = GatewayError(404, f"no such endpoint: {request.raw_path[:200]} (an encoded '/' is not a path "
                             f"separator); send {request.method} {path} with plain slashes", code="unknown_path")
            return _error_response(e, _request_id(request))
        if allowed is not None:
            e = GatewayError(405, f"{path} takes {allowed} requests, not {request.method}",
                             code="method_not_allowed")
            return web.Response(status=405, body=e.body(), content_type="application/json",
                                headers={"Allow": allowed, "X-Request-ID": _request_id(request)})
        hint = ""
        if "/v1" + path in _ROUTES:
            hint = f"; did you mean /v1{path}? set the client's base_url to end in /v1"
        served = ", ".join(f"{m} {p}" for p, m in _ROUTES.items())
        e = GatewayError(404, f"no such endpoint: {request.method} {path}{hint} (this gateway serves {served})",
                         code="unknown_path")
        return _error_response(e, _request_id(request))

    async def start(self) -> None:
        """Open the ledger, limiter, key store, upstream session and health checks; bind the API (and
        admin) ports. Raises :class:`OSError` when a port cannot be bound, ConfigError for bad parts."""
        cfg = self.snap.cfg
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=30),
            cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, skip_auto_headers=("User-Agent",))
        if self._redis is not None:
            try:
                await self._redis.ping()
            except Exception as e:  # redis.exceptions.RedisError, OSError
                raise ConfigError(f"state.redis_url: cannot reach Redis at {safe_url(cfg.state.redis_url or '')} "
                                  f"({_reason(e)}); start Redis there, or set state.redis_url: null "
                                  "(one replica, limits and breakers in memory)") from None
        if self._ledger is None:
            from servelab.gateway.journal import DurableLedger
            from servelab.gateway.ledger import PostgresLedger, SqliteLedger

            store: PostgresLedger | SqliteLedger
            if cfg.ledger.postgres_dsn:
                store = PostgresLedger(cfg.ledger.postgres_dsn)
            else:
                assert cfg.ledger.sqlite_path is not None  # LedgerSection sets it when there is no postgres_dsn
                store = SqliteLedger(cfg.ledger.sqlite_path)
            # write-ahead journal: a crash or a database outage loses no usage (servelab.gateway.journal)
            self._ledger = (DurableLedger(store, cfg.ledger.spool_path, cfg.ledger.fsync_interval_s)
                            if cfg.ledger.spool_path else store)
            try:
                await self._ledger.start()
            except ConfigError:
                raise
            except Exception as e:  # sqlite3.Error, OSError, asyncpg errors: name the field, not a port
                if cfg.ledger.postgres_dsn:
                    raise ConfigError(f"ledger.postgres_dsn: cannot use PostgreSQL at "
                                      f"{safe_url(cfg.ledger.postgres_dsn)} ({_reason(e)}); check host, port, "
                                      "user and database (createdb it first), or use ledger.sqlite_path") from None
                raise ConfigError(f"ledger.sqlite_path: cannot open {cfg.ledger.sqlite_path} ({_reason(e)}); "
                                  "give a path in a writable folder") from None
        else:
            await self._ledger.start()
        if self._limiter is None:
            from servelab.gateway.limits import MemoryLimiter, RedisLimiter

            self._limiter = RedisLimiter(cfg.state.redis_url) if cfg.state.redis_url else MemoryLimiter()
        await self._seed_budgets()
        if self._keystore is None:
            self._keystore = self._new_keystore(cfg)
            self._own_keystore = True
        start = getattr(self._keystore, "start", None)
        if start is not None:
            await start()
        await self.breakers.start()  # Redis sync of open states (no-op without state.redis_url)
        await self._start_health()
        self._runner = GuardedRunner(self.app, settings_for(cfg.server, "api"), on_event=self._conn_event,
                                     access_log=None, handler_cancellation=True,
                                     shutdown_timeout=cfg.server.shutdown_grace_s)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, backlog=2048, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.admin_port is not None:
            await self._start_admin()
        if self._watch:
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_loop())
        log.info("gateway listening on http://%s:%d/v1 (config version %d)", self.host, self.port, self.snap.version)

    async def _seed_budgets(self) -> None:
        """Token budgets count the ledger's spend (durable; survives restarts and a Redis without
        persistence): the limiter's counters are raised to the ledger's sums (limits.py module doc)."""
        spend_fn = getattr(self._ledger, "budget_spend", None)
        seed = getattr(self._limiter, "seed_budgets", None)
        if spend_fn is None or seed is None:
            return
        try:
            spend = await spend_fn()
            await seed(spend, tuple(self.snap.cfg.tenants))
        except Exception as e:  # fail closed: a budget that forgot its spend is no budget
            raise ConfigError(f"token budgets: cannot load their spend from the ledger into the limiter "
                              f"({_reason(e)}); "
                              "check ledger.* and state.redis_url") from None
        if spend:
            log.info("budgets: spend of %d keys (%d tokens) loaded from the ledger", len(spend), sum(spend.values()))
        if hasattr(self._limiter, "budget_source"):  # RedisLimiter: seeds again if Redis loses the counters
            self._limiter.budget_source = spend_fn

    def _new_keystore(self, cfg: GatewayConfig) -> Any:
        from servelab.gateway.keys import KeyStore

        try:
            return KeyStore(cfg.keys, ledger=self._ledger, tenants=cfg.tenants)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    async def _admin_reload(self) -> dict[str, Any]:
        res = await self.reload("admin")
        if not res["ok"]:
            raise ConfigError(res["error"])
        return res

    async def _start_admin(self) -> None:
        from servelab.gateway.admin import make_admin_app

        adm = self.snap.cfg.admin
        admin_app = make_admin_app(self._keystore, adm.token_env, token_sha256=adm.token_sha256,
                                   reload_hook=self._admin_reload, backends_hook=self.backend_states,
                                   ledger=self._ledger)
        admin_app.router.add_get("/metrics", self._metrics_ep)  # behind the admin token (its middleware)
        self._admin_runner = GuardedRunner(admin_app, settings_for(self.snap.cfg.server, "admin"),
                                           on_event=self._conn_event, access_log=None)
        await self._admin_runner.setup()
        site = web.TCPSite(self._admin_runner, self.admin_host, self.admin_port, reuse_address=True)
        await site.start()
        self.admin_port = self._admin_runner.addresses[0][1]

    async def _start_health(self) -> None:
        cfg = self.snap.cfg
        if self._health is not None:
            await self._health.close()
            self._health = None
        if not cfg.health.enabled:
            return
        from servelab.gateway.health import HealthChecker

        self._health = HealthChecker(self.snap.route_backends, self.breakers, interval_s=cfg.health.interval_s,
                                     timeout_s=cfg.health.timeout_s)
        await self._health.start()

    async def close(self) -> None:
        """Stop accepting, let in-flight requests finish (``shutdown_grace_s``), flush the ledger."""
        if self._watch_task is not None:
            self._watch_task.cancel()
            try:
                await self._watch_task
            except asyncio.CancelledError:
                pass
            except Exception as e:  # noqa: BLE001 - a dead watcher must not skip the shutdown grace below
                log.error("config watcher had stopped: %s", _reason(e))
            self._watch_task = None
        if self._admin_runner is not None:
            await self._admin_runner.cleanup()
            self._admin_runner = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._health is not None:
            await self._health.close()
            self._health = None
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self.breakers.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        for part in (self._keystore, self._limiter, self._ledger):
            closer = getattr(part, "close", None)
            if closer is not None:
                with contextlib.suppress(Exception):
                    await closer()
        self._access.close()

    # public accessors for the admin app
    @property
    def ledger(self) -> Any:
        """The usage ledger (:class:`servelab.gateway.ledger.Ledger`)."""
        return self._ledger

    @property
    def keystore(self) -> Any:
        """The key store (:class:`servelab.gateway.keys.KeyStore`)."""
        return self._keystore

    @property
    def limiter(self) -> Any:
        """The limiter (:class:`servelab.gateway.limits.Limiter`)."""
        return self._limiter

    @property
    def config(self) -> GatewayConfig:
        """The config in force now."""
        return self.snap.cfg

    def backend_states(self) -> dict[str, dict[str, Any]]:
        """Per backend: breaker state, health, requests in flight (for the admin API)."""
        br = self.breakers.snapshot()
        hs = self._health.snapshot() if self._health is not None else {}
        return {b.name: {"kind": b.kind, "pool": b.pool, "in_flight": self.load.outstanding(b.name),
                         "breaker": br.get(b.name, {"state": "closed"}), "health": hs.get(b.name)}
                for b in self.snap.cfg.backends}

    def _spawn(self, coro: Any) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ reload
    def _signature(self) -> tuple[int, int, str] | None:
        if self.config_path is None:
            return None
        try:
            st = self.config_path.stat()
            return (st.st_mtime_ns, st.st_size, hashlib.sha256(self.config_path.read_bytes()).hexdigest())
        except OSError:
            return None

    async def reload(self, source: str = "api") -> dict[str, Any]:
        """Load the config file again and swap it in atomically. Returns :attr:`last_reload`
        (``{"ok", "version", "at", "error", "source"}``). On any error (bad YAML, bad field, unknown
        reference) the running config stays in force and ``error`` holds the one-line reason naming the
        field. Sections that need a restart (server ports/host, state, ledger) keep their running values
        and the reload says so in ``warnings``."""
        if self.config_path is None:
            self.last_reload = {"ok": False, "version": self.snap.version, "at": time.time(), "source": source,
                                "error": "this gateway was started without a config file; nothing to reload"}
            return self.last_reload
        self._file_sig = self._signature()
        old = self.snap.cfg
        try:
            cfg = load_config(self.config_path)
            snap = self._build(cfg)
            breaker_settings = _breaker_settings(cfg)
        except Exception as e:  # noqa: BLE001 - any failure (RecursionError from deep YAML, MemoryError)
            # leaves the running config in force; ConfigError/ValueError already name the field
            msg = str(e) if isinstance(e, (ConfigError, ValueError)) else (
                f"{self.config_path}: cannot be loaded ({_reason(e)}); fix the file (too deeply nested or "
                "too large?) and save it again")
            self.metrics.reloads.labels("error").inc()
            log.error("config reload (%s) failed, keeping version %d: %s", source, self.snap.version, msg)
            self.last_reload = {"ok": False, "version": self.snap.version, "at": time.time(), "error": msg,
                                "source": source}
            return self.last_reload
        warnings = [f"{name} changed: restart the gateway to apply it"
                    for name, a, b in (("server.host/port/admin_port", (old.server.host, old.server.port,
                                                                         old.server.admin_port),
                                        (cfg.server.host, cfg.server.port, cfg.server.admin_port)),
                                       ("state", old.state, cfg.state), ("ledger", old.ledger, cfg.ledger),
                                       ("server connection limits/admin_host", _listener_fields(old.server),
                                        _listener_fields(cfg.server)))
                    if a != b]
        for w in warnings:
            log.warning("config reload: %s", w)
        if self._own_keystore and (old.keys != cfg.keys or old.tenants != cfg.tenants):
            try:
                self._keystore.update_config_keys(cfg.keys, cfg.tenants)  # swaps its table atomically
            except ValueError as e:
                self.metrics.reloads.labels("error").inc()
                self.last_reload = {"ok": False, "version": self.snap.version, "at": time.time(),
                                    "error": f"{self.config_path}: {e}", "source": source}
                return self.last_reload
        self.snap = snap  # the atomic swap: new requests see the new config, running ones keep theirs
        if old.breaker != cfg.breaker:
            self.breakers.reconfigure(breaker_settings)  # thresholds change, breaker states stay
        self.retry_budget.ratio = cfg.retry.budget_ratio
        if old.server.access_log != cfg.server.access_log:
            old_log, self._access = self._access, _AccessLog(cfg.server.access_log)
            old_log.close()
        if (old.backends != cfg.backends or old.health != cfg.health) and self._session is not None:
            await self._start_health()
        self.metrics.reloads.labels("ok").inc()
        log.info("config reloaded (%s): version %d", source, snap.version)
        self.last_reload = {"ok": True, "version": snap.version, "at": time.time(), "error": None,
                            "source": source, "warnings": warnings}
        return self.last_reload

    async def _watch_loop(self) -> None:
        """Poll the file every :data:`RELOAD_POLL_S`; reload on a change. Never dies of a failed reload
        (one line logged; the next change is tried again)."""
        while True:
            await asyncio.sleep(RELOAD_POLL_S)
            try:
                sig = self._signature()
                if sig is not None and sig != self._file_sig:
                    await self.reload("file change")
            except Exception as e:  # noqa: BLE001 - the watcher outlives any one bad file
                self._file_sig = self._signature()
                log.error("config watch: reload failed, keeping version %d: %s", self.snap.version, _reason(e))

    def install_signal_handlers(self, stop: Callable[[], None]) -> None:
        """SIGHUP -> reload; SIGINT/SIGTERM -> ``stop()``. Call inside the running loop (CLI)."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGHUP, lambda: self._spawn(self.reload("SIGHUP")))
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(s, stop)

    # ------------------------------------------------------------------ small endpoints
    async def _health_ep(self, request: web.Request) -> web.Response:
        """Readiness (:mod:`servelab.gateway.readiness`): 200 ``ok``/``degraded`` when this replica can
        serve, 503 ``unavailable`` with ``reasons`` when no backend is up or Redis (``state.redis_url``)
        does not answer; ``checks`` shows Redis and ledger state."""
        names = [b.name for b in self.snap.cfg.backends]
        up = [n for n in names if self.breakers.get(n).state != "open"
              and (self._health is None or self._health.is_up(n))]
        if self._readiness is None:
            from servelab.gateway.readiness import Readiness

            self._readiness = Readiness(self._redis, self._ledger)
        checks = await self._readiness.checks()
        reasons = [] if up else ["no backend is up"]
        if checks.get("redis", "ok") != "ok":
            reasons.append(f"Redis (state.redis_url) is {checks['redis']}: limits cannot be checked")
        degraded = [f"ledger is {checks['ledger']}: usage is kept locally until it is back"] \
            if checks.get("ledger", "ok") != "ok" else []
        status = "unavailable" if reasons else ("degraded" if degraded else "ok")
        return web.Response(status=503 if reasons else 200, content_type="application/json",
                            body=orjson.dumps({"status": status, "reasons": reasons + degraded, "checks": checks,
                                               "backends_up": len(up), "backends": len(names),
                                               "config_version": self.snap.version}))

    async def _live_ep(self, request: web.Request) -> web.Response:
        """Liveness: 200 while the process and its event loop run (checks nothing else)."""
        return web.Response(content_type="application/json", body=b'{"status":"alive"}')

    async def _public_metrics_ep(self, request: web.Request) -> web.Response:
        """``/metrics`` on the API port: only with ``server.public_metrics`` (it names backends and breaker
        states); otherwise 404 pointing to the admin port."""
        if self.snap.cfg.server.public_metrics:
            return await self._metrics_ep(request)
        e = GatewayError(404, "no such endpoint: /metrics is served on the admin port (with the admin token); "
                         "set server.public_metrics: true to serve it here", code="unknown_path")
        return _error_response(e, _request_id(request))

    def _conn_event(self, port: str, reason: str) -> None:
        self.metrics.connection_events.labels(port, reason).inc()

    async def _metrics_ep(self, request: web.Request) -> web.Response:
        self.metrics.set_breakers({n: s["state"] for n, s in self.breakers.snapshot().items()})
        for port, runner in (("api", self._runner), ("admin", self._admin_runner)):
            if isinstance(runner, GuardedRunner):
                self.metrics.connections.labels(port).set(runner.connections())
        resp = web.Response(body=self.metrics.expose())
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _authenticate(self, request: web.Request) -> Any:
        info = self._keystore.authenticate(request.headers.get("Authorization"))
        if asyncio.iscoroutine(info):
            info = await info
        return info

    async def _models(self, request: web.Request) -> web.Response:
        rid = _request_id(request)
        try:
            key = await self._authenticate(request)
        except GatewayError as e:
            return _error_response(e, rid)
        snap = self.snap
        data = [card for name, card in snap.model_cards.items() if self._may_use(snap, key, name)]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}), content_type="application/json",
                            headers={"X-Request-ID": rid})

    @staticmethod
    def _may_use(snap: _Snapshot, key: Any, model: str) -> bool:
        """The key's own list (already intersected with its tenant's by the key store) and the tenant's
        list in the config in force."""
        if key.allowed_models is not None and model not in key.allowed_models:
            return False
        return snap.cfg.tenant_may_use(key.tenant, model)

    def _degrade_hook(self, snap: _Snapshot, key: Any, r: _Req) -> degrade.Decision | None:
        """The degrade decision for request ``r`` of ``key`` (servelab.gateway.degrade): sets ``r.degraded``
        and ``r.model`` (a ``route_to``), raises its refusal; None when no rule applies."""
        deg = self._degrade.decide(snap.cfg, key, r.model, r.prompt_est, self.load.outstanding,
                                   lambda m: self._may_use(snap, key, m))
        if deg is None:
            return None
        r.degraded = deg.log_record()
        if deg.refusal is not None:
            raise deg.refusal
        r.model = deg.model
        return deg

    # ------------------------------------------------------------------ the hot path
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "embeddings")

    async def _handle(self, request: web.Request, endpoint: str) -> web.StreamResponse:
        snap = self.snap  # this request's config for its whole life
        r = _Req(_request_id(request), endpoint, _now(), time.time(), client_rid=_client_request_id(request))
        admission = None
        in_flight = None
        try:
            key = await self._authenticate(request)
            r.key_id, r.tenant = key.key_id, key.tenant
            body = await self._read_json(request, snap.cfg.server.max_body_bytes, snap.cfg.server.max_json_depth,
                                         snap.cfg.server.request_compression)
            model = body.get("model")
            task = request.headers.get(snap.cfg.routing.task_header)
            if model in (None, "", "auto") and task and task in snap.cfg.routing.tasks:
                model = snap.cfg.routing.tasks[task]
            if not isinstance(model, str) or not model:
                raise bad_request("'model' must be a model name (GET /v1/models lists yours)", param="model",
                                  code="invalid_type")
            model = snap.router.resolve_model(model, task)
            entry = snap.cfg.models.get(model)
            if entry is None:
                raise GatewayError(404, f"the model '{model}' does not exist; GET /v1/models lists the models "
                                   "you can use", code="model_not_found", param="model")
            r.model = model
            if not self._may_use(snap, key, model):
                raise GatewayError(403, f"this API key may not use the model '{model}'; GET /v1/models lists "
                                   "the models it may use", code="model_not_allowed", param="model")
            server = snap.cfg.server
            pol = policy.apply(body, policy.bounds_for(snap.cfg, model, task), endpoint)  # sampling per model/task
            want = caps_mod.validate_request(endpoint, body, server.max_tokens_limit, server.engine_length_fields)
            logprobs.check_logprobs(endpoint, body, server.max_top_logprobs, server.max_logprobs)  # 400 above caps
            asked = want.max_tokens  # the LARGEST bound over every dialect's length fields (lengths.py)
            seqs = caps_mod.output_sequences(endpoint, body)
            r.prompt_est = caps_mod.estimate_prompt_tokens(endpoint, body)
            r.tally = ServedCount(choices_per_prompt(endpoint, body, seqs), seqs)
            deg = self._degrade_hook(snap, key, r)  # under pressure, by the key's priority class
            model, entry = r.model, snap.cfg.models[r.model]
            out_cap = 0
            if endpoint != "embeddings":
                limit = server.max_tokens_limit
                if seqs > limit or (asked is not None and asked * seqs > limit):
                    which = "n" if seqs > limit or "n" in body else "prompt"
                    raise bad_request(
                        f"{seqs} sequences x max_tokens {asked or 1} is above this gateway's limit of {limit} "
                        f"output tokens per request (max_tokens applies to each of the {seqs} sequences: n choices"
                        f"{' per prompt' if endpoint == 'completions' else ''}); lower n or max_tokens",
                        param=which, code="max_tokens_too_large")
                default_cap = max(1, (server.default_max_tokens or limit) // seqs)
                ctx = entry.capabilities.context_tokens
                if ctx:  # the injected default must still fit the context
                    default_cap = max(1, min(default_cap, ctx - r.prompt_est))
                out_cap = asked if asked is not None else default_cap
                if want.unbounded:  # n_predict/num_predict -1: "no limit" = the gateway's default
                    out_cap = max(out_cap, default_cap)
                out_cap = pol.output_cap(out_cap, asked, max(1, limit // seqs))  # policy, then degrade
                r.policy = pol.log_record()
                out_cap = degrade.cap(out_cap, deg)
            caps_mod.check_request(entry, endpoint, body, r.prompt_est, model_name=model, max_tokens=out_cap)
            if endpoint != "embeddings":  # one bound, in the gateway's form; each attempt maps it (lengths.py)
                lengths.canonicalise(body, out_cap, want.min_tokens)
            r.out_cap = out_cap
            r.stream = endpoint != "embeddings" and body.get("stream") is True
            tenant_cfg = snap.cfg.tenants.get(key.tenant)
            if tenant_cfg is not None and tenant_cfg.log_prompts:
                text = caps_mod.prompt_text(endpoint, body)
                for pat in snap.redact.get(key.tenant, ()):
                    text = pat.sub("[REDACTED]", text)
                r.prompt_text = text
            r.client_ip = clientip.client_ip(request.remote, request.headers.getall("X-Forwarded-For", ()),
                                             clientip.trusted_networks(tuple(server.trusted_proxies)))
            r.application = scopes.application_of(snap.cfg, key.key_id)
            extra = scopes.extra_scopes(snap.cfg, key.key_id, key.tenant, model, r.client_ip)
            try:
                admission = await self._limiter.admit(key.key_id, key.tenant, model, r.prompt_est + out_cap * seqs,
                                                      key.limits, key.tenant_limits,
                                                      **({"extra": extra} if extra else {}))
            except GatewayError as e:
                if e.status == 429:
                    self.metrics.limit_rejections.labels(getattr(e, "limit", "other")).inc()
                raise
            self._journal_admit(r, admission)  # write-ahead: on disk before anything is forwarded
            in_flight = self.metrics.model(model)[3]
            in_flight.inc()
            self.retry_budget.record_request()
            return await self._proxy(request, snap, r, body, task, key)
        except GatewayError as e:
            r.status = e.status
            r.outcome = "error"
            r.error_code = e.code
            return _error_response(e, r.rid)
        except asyncio.CancelledError:
            r.outcome = "client_disconnect"
            raise
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            r.outcome = "client_disconnect"
            return web.Response(status=499)
        except Exception:  # a bug must not reach the client as a stack trace
            log.exception("request %s failed inside the gateway", r.rid)
            r.status, r.outcome, r.error_code = 500, "error", "internal_error"
            err = GatewayError(500, "the gateway failed on this request; retry, and report the request id "
                               f"{r.rid} if it persists", code="internal_error")
            return _error_response(err, r.rid)
        finally:
            if in_flight is not None:
                in_flight.dec()
            self._finish(snap, r, admission)

    async def _read_json(self, request: web.Request, limit: int, max_depth: int = 64,
                         compressed: bool = False) -> dict[str, Any]:
        """The body as a JSON object. Raises GatewayError 413 above ``limit`` bytes (also once inflated),
        415/400 for a Content-Encoding refused or corrupt (``compressed``: server.request_compression;
        servelab.gateway.bodies), 400 ``invalid_json`` for bad JSON or a non-object, 400
        ``json_too_deep`` when nested deeper than ``max_depth``."""
        raw = await bodies.read_body(request, limit, compressed)
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise bad_request(f"the body is not valid JSON ({str(e).split(':')[0]}); send a JSON object",
                              code="invalid_json") from None
        if not isinstance(body, dict):
            raise bad_request("the body must be a JSON object", code="invalid_json")
        caps_mod.check_depth(raw, body, max_depth)
        return body

    def _finish(self, snap: _Snapshot, r: _Req, admission: Any) -> None:
        """Metrics + access log now; settle + ledger in a task that survives the handler's cancellation."""
        e2e_ns = _now() - r.t0_ns
        if r.status == 0:
            r.status = 499 if r.outcome == "client_disconnect" else 200
        m = self.metrics
        m.requests.labels(r.model, r.backend or "none", str(r.status)).inc()
        if r.model != "-":
            m.model(r.model)[2].observe(e2e_ns / 1e9)
        used = self._used_tokens(r)
        if r.prompt_tokens is not None:
            m.tokens.labels(r.model, "prompt").inc(r.prompt_tokens)
        if r.completion_tokens is not None:
            m.tokens.labels(r.model, "completion").inc(r.completion_tokens)
        rec: dict[str, Any] = {
            "ts": round(r.ts, 3), "request_id": r.rid, "key_id": r.key_id, "tenant": r.tenant, "model": r.model,
            "backend": r.backend, "endpoint": r.endpoint, "stream": r.stream, "status": r.status,
            "outcome": r.outcome, "error_code": r.error_code,
            "ttft_ms": round(r.ttft_ns / 1e6, 3) if r.ttft_ns is not None else None,
            "e2e_ms": round(e2e_ns / 1e6, 3), "prompt_tokens": r.prompt_tokens,
            "completion_tokens": r.completion_tokens, "charged_tokens": used, "retries": r.retries,
            "fallback": r.fallback, "config_version": snap.version, "client_request_id": r.client_rid}
        if r.degraded is not None:
            rec["degraded"] = r.degraded
        if r.client_ip is not None:
            rec["client_ip"] = r.client_ip
        if r.policy is not None:
            rec["policy"] = r.policy
        if r.application is not None:
            rec["application"] = r.application
        if r.status == 200 and r.model != "-":
            self._degrade.observe(r.model, r.ttft_ns)
        if r.prompt_text is not None:
            rec["prompt"] = r.prompt_text
        self._access.write(rec)
        if admission is not None:
            self._spawn(self._settle(snap, r, admission, used))

    @staticmethod
    def _used_tokens(r: _Req) -> int:
        """Tokens charged: the engine's usage; else prompt estimate + forwarded token chunks if anything
        was served; else 0 (module doc)."""
        if r.prompt_tokens is not None or r.completion_tokens is not None:
            # never below the token events forwarded (each carried one token at least; served.py)
            return (r.prompt_tokens or 0) + max(r.completion_tokens or 0, r.token_events)
        if r.served:
            return r.prompt_est + r.token_events
        return 0

    @staticmethod
    def _billed(r: _Req) -> tuple[int, int]:
        """(prompt, completion) tokens of the ledger row: the engine's usage, else the prompt estimate and
        the token chunks forwarded if anything was served, else 0."""
        pt = r.prompt_tokens if r.prompt_tokens is not None else (r.prompt_est if r.served else 0)
        ct = (max(r.completion_tokens, r.token_events) if r.completion_tokens is not None
              else (r.token_events if r.served else 0))
        return pt, ct

    def _journal_admit(self, r: _Req, admission: Any) -> None:
        """The write-ahead row of an admitted request (outcome ``incomplete``, its reservation), with a
        probe of what it served so far (servelab.gateway.journal)."""
        admit = getattr(self._ledger, "admit", None)
        if admit is None:
            return
        from servelab.gateway.ledger import UsageRow

        def live() -> dict[str, Any]:
            pt, ct = self._billed(r)
            return {"prompt_tokens": pt, "completion_tokens": ct, "status": r.status, "backend": r.backend,
                    "upstream_model": r.upstream_model}

        admit(str(getattr(admission, "uid", id(admission))), UsageRow(
            request_id=r.rid, ts=r.ts, key_id=r.key_id, tenant=r.tenant, model=r.model, backend=None,
            upstream_model=None, prompt_tokens=0, completion_tokens=0,
            reserved_tokens=getattr(admission, "reserved_tokens", 0), status=0, outcome="incomplete"), live)

    async def _settle(self, snap: _Snapshot, r: _Req, admission: Any, used: int) -> None:
        from servelab.gateway.ledger import UsageRow, token_cost

        try:
            await self._limiter.settle(admission, used)
        except Exception as e:
            log.error("limits settle failed for request %s: %s", r.rid, e)
        pt, ct = self._billed(r)
        entry = snap.cfg.models.get(r.model)
        c = entry.capabilities if entry is not None else None
        cost = token_cost(pt, ct, c.price_in_per_1m if c else None, c.price_out_per_1m if c else None)
        row = UsageRow(
            request_id=r.rid, ts=r.ts, key_id=r.key_id, tenant=r.tenant, model=r.model, backend=r.backend,
            upstream_model=r.upstream_model, prompt_tokens=pt, completion_tokens=ct,
            reserved_tokens=getattr(admission, "reserved_tokens", 0), status=r.status,
            outcome=r.outcome if r.outcome in ("ok", "error", "client_disconnect") else "error", cost=cost)
        try:
            settle = getattr(self._ledger, "settle", None)  # DurableLedger: the journal's final line too
            jid = str(getattr(admission, "uid", id(admission)))
            await (settle(jid, row) if settle is not None else self._ledger.record(row))
        except Exception as e:
            log.error("ledger write failed for request %s: %s", r.rid, e)

    # ------------------------------------------------------------------ upstream
    async def _proxy(self, request: web.Request, snap: _Snapshot, r: _Req, body: dict[str, Any],
                     task: str | None, key: Any = None) -> web.StreamResponse:
        tenant = snap.cfg.tenants.get(r.tenant)
        pools = set(tenant.pools) if tenant is not None and tenant.pools is not None else None
        # every model the request can reach is checked against the key's and tenant's permissions
        may_use = (lambda m: self._may_use(snap, key, m)) if key is not None else (
            lambda m: snap.cfg.tenant_may_use(r.tenant, m))
        plan = snap.router.plan(r.model, body, task, affinity_text(body), self._split_key(snap, request, r),
                                may_use=may_use, pools=pools)
        for m in plan.denied:
            self.metrics.fallbacks_denied.labels(r.model, m).inc()
            log.info("request %s: fallback %s of %s skipped: key %s may not use it", r.rid, m, r.model, r.key_id)
        targets = list(plan.targets)
        if plan.shadow is not None:
            self._spawn(self._shadow(snap, plan.shadow, body, r))
        retry = snap.cfg.retry
        client_usage = (isinstance(body.get("stream_options"), dict)
                        and bool(body["stream_options"].get("include_usage")))
        tried = 0
        last: _UpstreamFailed | None = None
        for target in targets:
            if tried > retry.attempts:
                break
            lease = snap.router.acquire(target)
            if lease is None:  # saturated (max_in_flight) or breaker open: next target, no attempt spent
                continue
            if tried > 0:
                if not self.retry_budget.try_retry():
                    lease.release("neutral")
                    break
                r.retries += 1
                self.metrics.retries.labels(r.model, last.reason if last else "other").inc()
                await asyncio.sleep(backoff_s(tried, retry.backoff_s, retry.backoff_max_s))
            tried += 1
            try:
                resp = await self._attempt(request, snap, r, target, body, client_usage, lease)
                if target.public_model != r.model:
                    r.fallback = True
                    self.metrics.fallbacks.labels(r.model).inc()
                return resp
            except _UpstreamFailed as f:
                last = f
                if not f.retry:
                    raise f.error from None
        if last is not None:
            raise last.error
        raise GatewayError(503, "the model is busy or temporarily unavailable, retry in 1 s", type="server_error",
                           code="model_busy", retry_after_s=1.0)

    def _split_key(self, snap: _Snapshot, request: web.Request, r: _Req) -> str | None:
        """The key of the canary split / shadow draw: None (random per request) unless
        ``routing.session_header`` is set and sent, then HMAC-SHA256(session secret, key id + value)
        (config.RoutingSection): stable per session, not computable by the client."""
        header = snap.cfg.routing.session_header
        value = request.headers.get(header) if header else None
        if not value:
            return None
        secret = os.environ.get(snap.cfg.routing.session_secret_env, "").encode() or self._session_secret
        return hmac.new(secret, f"{r.key_id}\x00{value}".encode(), hashlib.sha256).hexdigest()

    def _upstream_body(self, target: Target, body: dict[str, Any], stream: bool, r: _Req | None = None) -> bytes:
        """The bytes sent to ``target``: its model name and overrides, exactly one output bound in the
        field its kind reads, never above the request's reserved ``r.out_cap`` (lengths.for_backend)."""
        up = target.request_body(body)
        if r is not None and r.out_cap:
            up = lengths.for_backend(target.kind, r.endpoint, up, r.out_cap)
            r.sent_cap = next((v for f in ("max_completion_tokens", "max_tokens")
                               if isinstance(v := up.get(f), int) and not isinstance(v, bool)), r.out_cap)
        if stream:
            so = up.get("stream_options")
            up["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
        return orjson.dumps(up)

    async def _attempt(self, request: web.Request, snap: _Snapshot, r: _Req, target: Target, body: dict[str, Any],
                       client_usage: bool, lease: Any) -> web.StreamResponse:
        """One upstream try. Raises :class:`_UpstreamFailed` when nothing reached the client yet."""
        assert self._session is not None
        url = snap.backends[target.backend].base_url + _ENDPOINT_PATH[r.endpoint]
        data = self._upstream_body(target, body, r.stream, r)
        headers = {"Content-Type": "application/json", "X-Request-ID": r.rid, **snap.auth_headers[target.backend]}
        if r.client_rid is not None:  # validated charset and length: safe to pass on, apart from ours
            headers["X-Client-Request-ID"] = r.client_rid
        if r.stream:
            headers["Accept"] = "text/event-stream"
        outcome = "failure"
        resp = None
        try:
            for stale in range(3):
                try:
                    resp = await self._session.post(url, data=data, headers=headers,
                                                    timeout=snap.timeouts[target.backend])
                    break
                except _STALE:
                    if stale == 2:
                        raise
                    # a pooled keep-alive connection the engine had closed (llama-server closes after
                    # each stream): nothing was sent or answered, so a fresh connection is no retry
            assert resp is not None
            status = resp.status
            if status >= 300:
                raw = await resp.read()
                gerr = scrub.from_body(raw, status, r.rid, target.backend, snap.hide, _retry_after(resp),
                                       caps_mod.prompt_text(r.endpoint, body) if status < 500 else None)
                # 429: the engine is busy, not broken (retried/fallen back, but no breaker failure)
                outcome = "neutral" if status == 429 else ("failure" if status >= 500 else "success")
                raise _UpstreamFailed(gerr, degrade.another_target(gerr), str(status))
            r.backend, r.upstream_model = target.backend, target.upstream_model
            r.model_field = b'"model":' + orjson.dumps(target.public_model)
            ctype = resp.headers.get("Content-Type", "")
            if r.stream and "text/event-stream" in ctype:
                out, ok = await self._pipe_stream(request, snap, r, resp, client_usage)
            else:
                out, ok = await self._pipe_whole(snap, r, resp)
            outcome = "neutral" if ok is None else ("success" if ok else "failure")
            return out
        except _UpstreamFailed:
            raise
        except TimeoutError:
            outcome = "failure"
            if r.served:
                raise
            raise _UpstreamFailed(GatewayError(504, "the model did not answer in time; retry, or lower max_tokens",
                                               type="server_error", code="upstream_timeout"), True, "timeout") from None
        except asyncio.CancelledError:
            outcome = "neutral"
            raise
        except _CONNECT_ERRORS as e:
            if is_local_resource_error(e):  # EMFILE/ENFILE here: our problem, never the engine's breaker
                outcome = "neutral"
                if r.served:
                    raise
                log.warning("request %s: no file descriptor or buffer left for an upstream connection (%s)",
                            r.rid, _reason(e))
                raise _UpstreamFailed(GatewayError(503, "the gateway is overloaded, retry in 1 s", type="server_error",
                                                   code="gateway_overloaded", retry_after_s=1.0),
                                      False, "local") from None
            if r.served:
                raise
            log.info("request %s: backend %s unreachable: %s", r.rid, target.backend, type(e).__name__)
            raise _UpstreamFailed(GatewayError(503, "the model is temporarily unavailable, retry in 1 s",
                                               type="server_error", code="model_unavailable", retry_after_s=1.0),
                                  True, "connect") from None
        finally:
            if resp is not None:
                resp.close()
            lease.release(outcome)

    async def _pipe_whole(self, snap: _Snapshot, r: _Req,
                          resp: aiohttp.ClientResponse) -> tuple[web.StreamResponse, bool]:
        """A whole JSON answer (non-streamed request, or an engine that ignored ``stream``): forwarded
        unchanged after its usage is read, except engine finish reasons mapped to OpenAI's."""
        raw = await resp.read()
        try:
            ev = orjson.loads(raw)
        except orjson.JSONDecodeError:
            ev = None
        gerr = (scrub.from_event(ev, r.rid, r.backend, snap.hide) if isinstance(ev, dict)
                else scrub.from_body(raw, 200, r.rid, r.backend, snap.hide))  # engine text: log only
        if gerr is not None:
            raise _UpstreamFailed(gerr, degrade.another_target(gerr), "protocol")
        if r.tally is not None:
            r.tally.take_whole(ev, r.sent_cap or r.out_cap)  # per-choice lower bounds (served.py)
        usage = ev.get("usage")
        if isinstance(usage, dict):
            self._take_usage(r, usage)
        r.served = True
        r.status = 200
        r.ttft_ns = _now() - r.t0_ns
        return web.Response(body=_public_model(map_finish_bytes(raw), r), content_type="application/json",
                            headers={"X-Request-ID": r.rid}), True

    @staticmethod
    def _take_usage(r: _Req, usage: dict[str, Any], choices: Any = None) -> None:
        """Record one ``usage`` (``choices``: its event's choices, None for a whole answer). Multi-sequence
        requests are tallied per choice (servelab.gateway.served): llama-server counts one choice per usage."""
        if r.tally is not None and r.tally.sequences > 1:
            if choices is not None:
                r.tally.take(usage, choices)
            r.prompt_tokens = r.tally.prompt(r.prompt_est)
            r.completion_tokens = r.tally.completion()
            return
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if isinstance(pt, int):
            r.prompt_tokens = pt
        if isinstance(ct, int):
            r.completion_tokens = ct
        elif r.endpoint == "embeddings" and isinstance(pt, int):
            r.completion_tokens = 0

    async def _pipe_stream(  # noqa: C901 - the per-chunk hot loop, kept whole: each split adds calls per chunk
            self, request: web.Request, snap: _Snapshot, r: _Req, resp: aiohttp.ClientResponse,
            client_usage: bool) -> tuple[web.StreamResponse, bool | None]:
        """Forward the SSE body read by read. Returns (response, complete): complete is False when the
        stream ended in an error event or was cut off (the client then got a clean error event + [DONE]),
        None when the client went away (says nothing about the backend).
        Raises :class:`_UpstreamFailed` when it fails before any byte reached the client."""
        out: web.StreamResponse | None = None
        buf = b""
        first = False
        saw_done = False
        saw_finish = False
        last_ns = 0
        ttft_h, itl_h, _, _ = self.metrics.model(r.model)
        itl = HistogramBatch(itl_h)  # flushed when the stream ends
        chat = r.endpoint == "chat"
        error: GatewayError | None = None
        cut = False
        try:
            async for data in resp.content.iter_any():
                buf = buf + data if buf else data
                end = buf.rfind(b"\n\n")
                if end < 0:
                    if b"\r\n\r\n" not in buf:
                        continue
                    buf = buf.replace(b"\r\n", b"\n")
                    end = buf.rfind(b"\n\n")
                block, buf = buf[:end + 2], buf[end + 2:]
                if not first or b'"usage":{' in block or b'"usage": {' in block or b'"error"' in block:
                    block, ntok, error, done = self._inspect(block, snap, r, client_usage, chat)
                    saw_done = saw_done or done
                else:
                    ntok = _count_token_events(block)
                    if block.endswith(_DONE):
                        saw_done = True
                if b'"finish_reason":"' in block or b'"finish_reason": "' in block:
                    saw_finish = True
                    block = map_finish_bytes(block)  # TGI "stop_sequence" -> "stop"
                if b'"model"' in block:
                    block = _public_model(block, r)
                if error is not None and out is None and not block:
                    # nothing sent yet: the client gets a proper HTTP error instead of a 200 stream
                    raise _UpstreamFailed(error, degrade.another_target(error), "stream_error")
                # charged before the write: a client that leaves during it still pays for what the engine
                # already produced and the gateway received
                r.token_events += ntok
                if block:
                    try:
                        if out is None:
                            out, _ = await self._prepare(request, r)  # headers leave with this block
                        # aiohttp writes one chunked frame per call and waits only when the socket's
                        # buffer is above its limit; writing to the transport directly measured no
                        # faster here (benches/gateway_overhead.py, 2026-11-30) and bypassed its API
                        await out.write(block)
                    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                        # the client went away without the handler being cancelled: stop here; leaving
                        # this function closes the upstream response, which cancels the engine's work
                        r.outcome = "client_disconnect"
                        self._charge_unread(snap, r, buf, resp, client_usage, chat)
                        return (out if out is not None else web.Response(status=499)), None
                if ntok > 0:
                    t = _now()
                    if not first:
                        first = True
                        r.ttft_ns = t - r.t0_ns
                        ttft_h.observe(r.ttft_ns / 1e9)
                        ntok -= 1
                    elif last_ns:
                        itl.add((t - last_ns) / 1e9 / ntok, ntok)
                    last_ns = t
                if saw_done or error is not None:
                    break
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, TimeoutError) as e:
            if out is None:
                raise
            log.info("request %s: upstream stream broke after the first byte: %s", r.rid, type(e).__name__)
            cut = True
        except asyncio.CancelledError:  # the client went away (handler cancelled)
            if out is not None:
                self._charge_unread(snap, r, buf, resp, client_usage, chat)
            raise
        finally:
            itl.flush()
        if error is None and not saw_done and not saw_finish:
            cut = True
        if out is None:  # an empty 200 body
            raise _UpstreamFailed(GatewayError(502, "the model closed the connection without answering; retry",
                                               type="server_error", code="upstream_error"), True, "connect")
        if error is None and cut:
            error = GatewayError(502, "the model stopped answering mid-way; retry the request", type="server_error",
                                 code="upstream_cut_off")
        if error is not None:
            self.metrics.stream_errors.labels(r.model, r.backend or "none").inc()
            r.outcome = "error"
            r.error_code = error.code
            await out.write(error.event() + _DONE)
        elif buf.strip():
            await out.write(buf)
        await out.write_eof()
        return out, error is None

    def _charge_unread(self, snap: _Snapshot, r: _Req, buf: bytes, resp: aiohttp.ClientResponse,
                       client_usage: bool, chat: bool) -> None:
        """The client left mid-stream: also charge the complete events the engine already delivered to
        this process but that were not forwarded (``buf`` and the upstream read buffer; a usage chunk among
        them is taken as usage). An incomplete trailing event is not charged: what it is cannot be told."""
        with contextlib.suppress(Exception):
            buf += resp.content.read_nowait()
        end = buf.replace(b"\r\n", b"\n").rfind(b"\n\n")
        if end >= 0:
            _, ntok, _, _ = self._inspect(buf.replace(b"\r\n", b"\n")[:end + 2], snap, r, client_usage, chat)
            r.token_events += ntok

    async def _prepare(self, request: web.Request, r: _Req) -> tuple[web.StreamResponse, Any]:
        """The 200 SSE response, prepared: (response, its payload writer)."""
        out = web.StreamResponse(status=200, headers={**_SSE_HEADERS, "X-Request-ID": r.rid})
        out.enable_chunked_encoding()
        writer = await out.prepare(request)
        r.served = True
        r.status = 200
        return out, writer

    def _inspect(self, block: bytes, snap: _Snapshot, r: _Req, client_usage: bool,
                 chat: bool) -> tuple[bytes, int, GatewayError | None, bool]:
        """Slow path for one block of complete events: find usage, errors, token-carrying events; drop
        the usage-only chunk unless the client asked for usage. Returns (bytes to forward, token events,
        error, saw [DONE])."""
        kept: list[bytes] = []
        ntok = 0
        done = False
        changed = False
        for ev_bytes in block.split(b"\n\n"):
            if not ev_bytes.strip():
                continue
            payload = b"\n".join(line[5:].lstrip(b" ") for line in ev_bytes.split(b"\n") if line.startswith(b"data:"))
            if payload == b"[DONE]":
                done = True
                kept.append(ev_bytes)
                continue
            try:
                ev = orjson.loads(payload) if payload else None
            except orjson.JSONDecodeError:
                ev = None
            if not isinstance(ev, dict):
                kept.append(ev_bytes)
                continue
            gerr = scrub.from_event(ev, r.rid, r.backend, snap.hide)  # engine text: log only
            if gerr is not None:
                head = b"\n\n".join(kept) + b"\n\n" if kept else b""
                return head, ntok, gerr, done
            choices = ev.get("choices")
            usage = ev.get("usage")
            if isinstance(usage, dict):
                self._take_usage(r, usage, choices if isinstance(choices, list) else [])
                if not choices and not client_usage:
                    changed = True
                    continue
            if choices and _carries_token(choices, chat):
                ntok += 1
            kept.append(ev_bytes)
        if not changed and kept:
            return block, ntok, None, done
        return (b"\n\n".join(kept) + b"\n\n") if kept else b"", ntok, None, done

    # ------------------------------------------------------------------ shadow
    async def _shadow(self, snap: _Snapshot, target: Target, body: dict[str, Any], r: _Req) -> None:
        """Send a copy to the shadow target (non-streamed, answer discarded, never charged); at most 16
        at a time, dropped beyond that so shadows never queue behind each other."""
        if self._shadow_sem.locked() or self._session is None:
            return
        async with self._shadow_sem:
            lease = snap.router.acquire(target)
            if lease is None:
                return
            outcome = "neutral"
            try:
                up = target.request_body(body)
                if r.out_cap:
                    up = lengths.for_backend(target.kind, r.endpoint, up, r.out_cap)
                up["stream"] = False
                up.pop("stream_options", None)
                url = snap.backends[target.backend].base_url + _ENDPOINT_PATH[r.endpoint]
                async with self._session.post(url, data=orjson.dumps(up), timeout=snap.timeouts[target.backend],
                                              headers={"Content-Type": "application/json",
                                                       "X-Request-ID": r.rid + "-shadow",
                                                       **snap.auth_headers[target.backend]}) as resp:
                    await resp.read()
                    outcome = "success" if resp.status < 500 else "failure"
                    self.metrics.requests.labels(r.model, target.backend, f"shadow_{resp.status}").inc()
            except (aiohttp.ClientError, OSError, TimeoutError):
                outcome = "failure"
            finally:
                lease.release(outcome)


def _public_model(data: bytes, r: _Req) -> bytes:
    """``data`` (a JSON body or SSE events) with every ``"model"`` member set to the public model that
    answered: the engine's own name (llama-server: its GGUF path; vLLM: ``--served-model-name``) is an
    internal detail, and OpenAI clients read ``model`` back for logs and cost."""
    if not r.model_field:
        return data
    seen = r.model_seen
    if seen:  # hot path: the engine repeats the same member in every chunk; bytes.replace is ~20x the regex
        out = data.replace(seen, r.model_field)
        if out is not data or seen == r.model_field:
            return out

    def sub(m: re.Match[bytes]) -> bytes:
        r.model_seen = m.group(0)[len(m.group(1)):]
        return m.group(1) + r.model_field

    return _MODEL_RE.sub(sub, data)


def _carries_token(choices: Any, chat: bool) -> bool:
    """True when a chunk's choices carry generated text, reasoning or a tool-call fragment."""
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        if chat:
            d = ch.get("delta")
            if isinstance(d, dict) and (d.get("content") or d.get("reasoning_content") or d.get("reasoning")
                                        or d.get("tool_calls")):
                return True
        elif ch.get("text"):
            return True
    return False

