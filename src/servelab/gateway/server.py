"""The gateway's aiohttp server: the OpenAI API in front of many engines; lifecycle, hot reload and the
per-request orchestration of the modules that do each job.

Per request (``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings``, ``/v1/rerank`` (and
``/rerank``, vLLM's and TEI's path) forwarded as they are; ``/v1/messages``,
``/v1/messages/count_tokens`` and ``/v1/responses`` translated to chat completions by
:mod:`servelab.gateway.apis`), each step in its own module:

1. admission (:mod:`servelab.gateway.admission`): auth, body checks, model, policy, degrade, output
   bound, limits (401/413/415/400/404/403/429);
2. the write-ahead journal row (:mod:`servelab.gateway.accounting`, servelab.gateway.journal);
3. upstream selection, retry and fallback (:mod:`servelab.gateway.upstream`), and the shadow copy
   (:mod:`servelab.gateway.shadow`);
4. the relay of the answer, streamed or whole (:mod:`servelab.gateway.relay`, one SSE splitter in
   :mod:`servelab.gateway.sse`);
5. metrics and one JSON access-log line (:mod:`servelab.gateway.accesslog`) at once; limits settle and the
   ledger row in a task that survives the handler's cancellation (:mod:`servelab.gateway.accounting`).

Start-up: a misconfigured part (bad DSN, wrong database or role, unwritable path, Redis unreachable, an
admin token under 16 characters) stops the start with one line naming the field. PostgreSQL that is
merely down (connection refused or timed out) does not: the gateway starts, binds its ports and is not
ready (``/health`` 503 naming the field ``ledger.postgres_dsn``, never its address: the error itself goes
to the log; API requests 503 ``service_starting`` with
``Retry-After``; admin keys/usage 503 ``database_unavailable``) while it retries the database
(:data:`LEDGER_RETRY_S` doubling to :data:`LEDGER_RETRY_MAX_S`); once it answers, keys created through
the admin API and token-budget spend are loaded from it and the replica serves. Nothing is served
before: keys kept only in the database would be refused and budgets could not be enforced (they fail
closed). An outage after start is absorbed by the write-ahead journal (servelab.gateway.journal).

The small endpoints (``/health``, ``/metrics``, ``/v1/models``, the 404/405 answer) are in
:mod:`servelab.gateway.endpoints`, hot reload in :mod:`servelab.gateway.reloading` (mixins of
:class:`Gateway`). Hot reload (:meth:`Gateway.reload`, on SIGHUP or a change of the file's mtime/size/content): a new
:class:`~servelab.gateway.snapshot.Snapshot` is built from the new file and swapped in with one
assignment; each request holds the snapshot it started with until it ends, so in-flight streams keep
their config. A bad file leaves the running config in force; the error line is logged and kept in
:attr:`Gateway.last_reload`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from servelab.gateway import degrade
from servelab.gateway.accesslog import AccessLog, access_record, api_name
from servelab.gateway.accounting import journal_admit, settle, used_tokens
from servelab.gateway.admission import Admitter
from servelab.gateway.apis import ApiAdapter
from servelab.gateway.apis.messages import CountTokensApi, MessagesApi
from servelab.gateway.apis.responses import ResponsesApi
from servelab.gateway.breaker import BreakerBoard, RetryBudget
from servelab.gateway.closing import Closing
from servelab.gateway.config import GatewayConfig
from servelab.gateway.endpoints import Endpoints, error_response, request_id, starting
from servelab.gateway.enginegauges import EngineGauges
from servelab.gateway.errors import GatewayError
from servelab.gateway.leases import LoadTracker
from servelab.gateway.ledger import Ledger
from servelab.gateway.ledgerstart import LEDGER_RETRY_MAX_S, LEDGER_RETRY_S, WORKER_KEYS_REFRESH_S, LedgerStart
from servelab.gateway.limits import Admission, Limiter, safe_url
from servelab.gateway.listener import GuardedRunner, settings_for
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.picker import PickerState
from servelab.gateway.relay import Relay, map_finish_bytes, openai_finish
from servelab.gateway.reloading import RELOAD_POLL_S, HotReload
from servelab.gateway.reqstate import RequestState
from servelab.gateway.shadow import ShadowBook, ShadowSide
from servelab.gateway.shutdown import ADMIN_DRAIN_S, Shutdown
from servelab.gateway.snapshot import Snapshot, breaker_settings
from servelab.gateway.timeline import TimedConnector
from servelab.gateway.tracing import Tracing
from servelab.gateway.upstream import Upstream, reason
from servelab.gateway.workers import worker_session_key
from servelab.wire.client import ConfigError

__all__ = [
    "Gateway",
    "LEDGER_RETRY_MAX_S",
    "LEDGER_RETRY_S",
    "RELOAD_POLL_S",
    "WORKER_KEYS_REFRESH_S",
    "map_finish_bytes",
    "openai_finish",
]

log = logging.getLogger("servelab.gateway")
_now = time.monotonic_ns

#: seconds an idle upstream keep-alive connection stays in the gateway's pool: under the engines' own idle
#: timeouts (vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, uvicorn's ``timeout_keep_alive`` default, under
#: SGLang's server, and cpp-httplib's ``CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND``, serving llama-server: all 5 s)
UPSTREAM_IDLE_S = 4.0
_RID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def _client_request_id(request: web.Request) -> str | None:
    """The client's ``X-Request-ID`` when it is 1-128 characters of ``[A-Za-z0-9._:-]`` (else None): kept
    as ``client_request_id`` in the access log and sent to engines as ``X-Client-Request-ID``, never used
    as the gateway's id nor for routing."""
    rid = request.headers.get("X-Request-ID")
    return rid if rid and _RID.match(rid) else None


class Gateway(HotReload, Endpoints, LedgerStart, Closing):
    """One gateway: the OpenAI app (:attr:`app`), optionally the admin app, shared upstream session,
    limiter, ledger, key store, breakers, health checks and the hot-reloadable config.

    ``config``: a validated :class:`GatewayConfig`; ``config_path``: the file it came from (enables
    reload on change/SIGHUP). ``host``/``port``/``admin_port``/``admin_host`` override the file's ``server``
    section (``port=0`` = free port; read :attr:`port` after :meth:`start`); the admin app binds
    ``admin_host`` (default ``server.admin_host``, 127.0.0.1), never ``host``. Both ports run under
    :class:`~servelab.gateway.listener.GuardedRunner` (timeouts, connection cap, quiet parser errors).
    Components can be injected (tests, embedding): ``ledger``, ``limiter``, ``keystore``. Use
    ``await start()`` / ``await close()``.

    ``worker``: this process's index under ``servelab gateway --workers N`` (:mod:`servelab.gateway.workers`;
    None = the only process): the API port is bound with SO_REUSEPORT (every worker binds the same
    port, the kernel spreads connections), access-log lines carry ``worker``, worker ``i > 0`` journals
    in ``<spool_path>/worker-<i>`` (each worker replays only its own predecessor's segments), an admin
    reload also asks the supervisor (SIGUSR1) to reload the other workers, and in prometheus-client's
    multiprocess mode the inter-token counts are flushed every :data:`~servelab.gateway.metrics.FLUSH_S`.
    """

    def __init__(
        self,
        config: GatewayConfig,
        config_path: str | Path | None = None,
        *,
        host: str | None = None,
        port: int | None = None,
        admin_port: int | None = -1,
        ledger: Ledger | None = None,
        limiter: Limiter | None = None,
        keystore: Any = None,
        watch: bool = True,
        admin_host: str | None = None,
        worker: int | None = None,
    ) -> None:
        self.worker = worker
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
            from servelab.gateway.limits import POOL_MIN, redis_client

            # the breakers' sync is a few commands a second: a small pool that retries on a fresh connection
            # (a stale pooled one after a Redis restart) and waits for a free one instead of failing
            self._redis = redis_client(config.state.redis_url, max_connections=POOL_MIN)
        self.breakers = BreakerBoard(breaker_settings(config), redis=self._redis)
        self.load = LoadTracker()
        self._version = 0
        #: the endpoint picker's prefix index, counters and engine gauges, kept across reloads (gateway.picker)
        self.picks = PickerState(self._engine_state, self.metrics.registry)
        self.snap = self._build(config)
        self.retry_budget = RetryBudget(ratio=config.retry.budget_ratio)
        self.last_reload: dict[str, Any] = {
            "ok": True,
            "version": 1,
            "at": time.time(),
            "error": None,
            "source": "start",
        }
        self._ledger: Any = ledger  # Ledger; DurableLedger adds admit/settle (journal.py)
        self._limiter: Any = limiter  # Limiter; RedisLimiter adds seed_budgets/budget_source
        self._keystore = keystore
        self._own_keystore = False
        self._watch = watch and self.config_path is not None
        self._file_sig = self._signature()
        self._runner: web.AppRunner | None = None
        self._admin_runner: web.AppRunner | None = None
        self._health: Any = None
        self._readiness: Any = None  # readiness.Readiness, made at the first /health
        #: why this replica cannot serve yet (PostgreSQL down at start), None once it can; may name the
        #: database's address (log, admin port); :attr:`not_ready_public` is what the public /health says
        self.not_ready: str | None = None
        self.not_ready_public = ""
        self._ledger_task: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._watch_task: asyncio.Task[None] | None = None
        self._access = AccessLog(config.server.access_log, worker)
        #: the bounded shutdown (servelab.gateway.shutdown); what it flushes when it must end the process at once
        self.shutdown = Shutdown()
        #: set once shutdown closes client connections: a request cut from then on was cut by the gateway
        self._cutting = False
        self.shutdown.last_flush += [self.metrics.flush, self._access.close]
        self.shutdown.on_hurry.append(self._cut_connections)
        #: OpenTelemetry spans of each request over OTLP/HTTP (servelab.gateway.tracing); None = off
        self.tracing = Tracing.from_section(config.tracing, worker)
        self._flush_task: asyncio.Task[None] | None = None
        #: mirrored requests' old-vs-new samples (GET /admin/shadow, servelab gateway shadow-report)
        self.shadows = ShadowBook()
        self.admitter = Admitter(self.metrics, self._degrade, self.load)
        self.relay = Relay(self.metrics)
        # session_secret: HMAC key of routing.session_header when its env var is unset: the one the
        # supervisor drew for all its workers (workers.worker_session_key), else this process's own
        session_key = worker_session_key() if worker is not None else None
        self.upstream = Upstream(
            self.metrics,
            self.relay,
            self.retry_budget,
            self.shadows,
            self._spawn,
            session_secret=session_key or secrets.token_bytes(32),
        )
        #: each backend's own queue/running/KV gauges, re-exported by backend (servelab.gateway.enginegauges)
        self.engine_gauges = EngineGauges(self.snap.route_backends)
        self.metrics.add_local(self.engine_gauges)  # in /metrics once, also under --workers N
        self.upstream.engine_state = self.engine_gauges.state
        self.app = self._make_app()

    # ------------------------------------------------------------------ lifecycle
    def _engine_state(self, backend: str) -> dict[str, Any] | None:
        """The engine gauges of ``backend`` at their last scrape (servelab.gateway.enginegauges), or None."""
        gauges = getattr(self, "engine_gauges", None)  # made after the first snapshot
        return gauges.state(backend) if gauges is not None else None

    def _build(self, cfg: GatewayConfig) -> Snapshot:
        self._version += 1
        return Snapshot(cfg, self._version, self.breakers, self.load, self.picks)

    def _make_app(self) -> web.Application:
        app = web.Application(client_max_size=1 << 40)  # bodies are bounded per request (413), not here
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/v1/embeddings", self._embeddings)
        r.add_post("/v1/rerank", self._rerank)
        r.add_post("/rerank", self._rerank)
        r.add_post("/v1/messages", self._messages)
        r.add_post("/v1/messages/count_tokens", self._count_tokens)
        r.add_post("/v1/responses", self._responses)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health_ep)
        r.add_get("/health/live", self._live_ep)
        r.add_get("/metrics", self._public_metrics_ep)
        r.add_route("*", "/{tail:.*}", self._unknown_path)  # last: only what no route above serves
        return app

    async def start(self) -> None:
        """Open the ledger, limiter, key store, upstream session and health checks; bind the API (and
        admin) ports. Raises :class:`OSError` when a port cannot be bound, ConfigError for bad parts."""
        cfg = self.snap.cfg
        self.upstream.session = aiohttp.ClientSession(
            # idle connections leave the pool before the engine closes them, so a request rarely takes one
            # the engine is closing at that moment; servelab.gateway.pooled sends those again
            connector=TimedConnector(limit=0, limit_per_host=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_IDLE_S),
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        if self._redis is not None:
            try:
                await self._redis.ping()
            except Exception as e:  # noqa: BLE001 — redis.exceptions.RedisError, OSError
                raise ConfigError(
                    f"state.redis_url: cannot reach Redis at {safe_url(cfg.state.redis_url or '')} "
                    f"({reason(e)}); start Redis there, or set state.redis_url: null "
                    "(one replica, limits and breakers in memory)"
                ) from None
        if self._ledger is None:
            from servelab.gateway.journal import DurableLedger
            from servelab.gateway.ledger import SqliteLedger
            from servelab.gateway.ledger_postgres import PostgresLedger

            store: PostgresLedger | SqliteLedger
            if cfg.ledger.postgres_dsn:
                store = PostgresLedger(cfg.ledger.postgres_dsn)
            else:
                assert cfg.ledger.sqlite_path is not None  # LedgerSection sets it when there is no postgres_dsn
                store = SqliteLedger(cfg.ledger.sqlite_path)
            # write-ahead journal: a crash or a database outage loses no usage (servelab.gateway.journal)
            spool = cfg.ledger.spool_path
            if spool and self.worker:  # worker 0 keeps the folder itself (its segments: the one-process ones)
                spool = str(Path(spool) / f"worker-{self.worker}")
            self._ledger = DurableLedger(store, spool, cfg.ledger.fsync_interval_s) if spool else store
            down = await self._start_ledger(cfg)
        else:
            await self._ledger.start()
            down = None
        if self._limiter is None:
            from servelab.gateway.fdbudget import default_max_connections, nofile_limit
            from servelab.gateway.limits import MemoryLimiter, RedisLimiter, redis_pool_size

            if cfg.state.redis_url:  # a pool that queues, sized from the API connection cap (limits.py doc)
                cap = cfg.server.max_connections or default_max_connections(
                    nofile_limit(), cfg.server.admin_max_connections
                )
                pool = redis_pool_size(cap, cfg.state.redis_max_connections)
                self._limiter = RedisLimiter(
                    cfg.state.redis_url, max_connections=pool, pool_timeout_s=cfg.state.redis_pool_timeout_s
                )
            else:
                self._limiter = MemoryLimiter()
        if self._keystore is None:
            self._keystore = self._new_keystore(cfg)
            self._own_keystore = True
        if down is None:
            await self._start_after_ledger()
        else:  # PostgreSQL is down: serve nothing until it answers, but start (module doc "Start-up")
            self._set_not_ready(down)
            log.warning("%s; the gateway starts but answers 503 (and /health is not ready) until it is reachable", down)
            self._ledger_task = asyncio.get_running_loop().create_task(
                self._wait_for_ledger(cfg), name="servelab-ledger-wait"
            )
        self.admitter.keystore, self.admitter.limiter = self._keystore, self._limiter
        await self.breakers.start()  # Redis sync of open states (no-op without state.redis_url)
        await self._start_health()
        self._runner = GuardedRunner(
            self.app,
            settings_for(cfg.server, "api"),
            on_event=self._conn_event,
            trusted_proxies=tuple(cfg.server.trusted_proxies),
            access_log=None,
            handler_cancellation=True,
            shutdown_timeout=cfg.server.shutdown_grace_s,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner,
            self.host,
            self.port,
            backlog=2048,
            reuse_address=True,
            reuse_port=True if self.worker is not None else None,
        )
        await site.start()
        self.port = self._runner.addresses[0][1]
        if self.admin_port is not None:
            await self._start_admin()
        if self._watch:
            self._watch_task = asyncio.get_running_loop().create_task(self._watch_loop())
        if self.metrics.multiproc_dir is not None:
            self._flush_task = asyncio.get_running_loop().create_task(self._flush_loop())
        self._warn_session_secret(cfg)
        log.info("gateway listening on http://%s:%d/v1 (config version %d)", self.host, self.port, self.snap.version)

    def _warn_session_secret(self, cfg: GatewayConfig) -> None:
        """One warning (worker 0 or the only process) when sessions are sticky by a key drawn at start."""
        r = cfg.routing
        if r.session_header and not os.environ.get(r.session_secret_env) and not self.worker:
            log.warning(
                "routing.session_header is set but $%s is not: the session key is drawn at start (one for "
                "all workers of this gateway), so after a restart, or on another replica, a session may "
                "land in another canary group; set %s to the same secret on every replica",
                r.session_secret_env,
                r.session_secret_env,
            )

    def _new_keystore(self, cfg: GatewayConfig) -> Any:
        from servelab.gateway.keys import KeyStore

        try:
            return KeyStore(cfg.keys, ledger=self._ledger, tenants=cfg.tenants)
        except ValueError as e:
            raise ConfigError(str(e)) from None

    async def _admin_reload(self) -> dict[str, Any]:
        res = await self.reload("admin")
        if self.worker is not None and res["ok"]:
            with contextlib.suppress(OSError):  # the supervisor sends SIGHUP to the other workers
                os.kill(os.getppid(), signal.SIGUSR1)
        if not res["ok"]:
            raise ConfigError(res["error"])
        return res

    async def _start_admin(self) -> None:
        from servelab.gateway.admin import make_admin_app

        adm = self.snap.cfg.admin
        admin_app = make_admin_app(
            self._keystore,
            adm.token_env,
            token_sha256=adm.token_sha256,
            reload_hook=self._admin_reload,
            backends_hook=self.backend_states,
            ledger=self._ledger,
            shadow_hook=self.shadows.report,
        )
        admin_app.router.add_get("/metrics", self._metrics_ep)  # behind the admin token (its middleware)
        admin_app.middlewares.append(self._admin_not_ready)  # inside the token check
        self._admin_runner = GuardedRunner(
            admin_app,
            settings_for(self.snap.cfg.server, "admin"),
            on_event=self._conn_event,
            access_log=None,
            shutdown_timeout=ADMIN_DRAIN_S,
        )
        await self._admin_runner.setup()
        site = web.TCPSite(self._admin_runner, self.admin_host, self.admin_port, reuse_address=True)
        await site.start()
        self.admin_port = self._admin_runner.addresses[0][1]

    @web.middleware
    async def _admin_not_ready(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Keys and usage need the ledger: 503 ``database_unavailable`` while it was down since start."""
        if self.not_ready is not None and request.path.startswith(("/admin/keys", "/admin/usage")):
            e = GatewayError(
                503,
                f"the usage database is not reachable yet ({self.not_ready}); retry in 2 s",
                type="server_error",
                code="database_unavailable",
                retry_after_s=2.0,
            )
            return error_response(e, request_id(request))
        return await handler(request)

    async def _start_health(self) -> None:
        cfg = self.snap.cfg
        if self._health is not None:
            await self._health.close()
            self._health = None
            await self.engine_gauges.stop()
        if not cfg.health.enabled:
            return
        from servelab.gateway.health import HealthChecker

        self._health = HealthChecker(
            self.snap.route_backends, self.breakers, interval_s=cfg.health.interval_s, timeout_s=cfg.health.timeout_s
        )
        await self._health.start()
        self.engine_gauges.set_backends(self.snap.route_backends)  # scraped as often as health is checked
        g, h = self.engine_gauges, cfg.health
        g.interval_s, g.timeout_s, g.max_bytes = h.interval_s, h.timeout_s, h.metrics_max_bytes
        await self.engine_gauges.start()

    async def _flush_loop(self) -> None:
        """Multiprocess mode: this worker's connection gauges and inter-token counts to the shared folder."""
        from servelab.gateway.metrics import FLUSH_S

        while True:
            await asyncio.sleep(FLUSH_S)
            try:
                self._set_gauges()
                self.metrics.flush()
            except OSError as e:
                log.warning("metrics flush failed: %s", e)

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
        return {
            b.name: {
                "kind": b.kind,
                "pool": b.pool,
                "in_flight": self.load.outstanding(b.name),
                "breaker": br.get(b.name, {"state": "closed"}),
                "health": hs.get(b.name),
            }
            for b in self.snap.cfg.backends
        }

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        t = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ the hot path
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "completions")

    async def _embeddings(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "embeddings")

    async def _rerank(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "rerank")

    async def _messages(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat", MessagesApi())

    async def _count_tokens(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat", CountTokensApi())

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._handle(request, "chat", ResponsesApi())

    async def _handle(self, request: web.Request, endpoint: str, api: ApiAdapter | None = None) -> web.StreamResponse:
        """One API request through the whole pipeline (module doc). ``api``: the adapter of an API that is
        translated to chat completions (Anthropic Messages, OpenAI Responses; servelab.gateway.apis), whose
        answers and errors are in its own shape."""
        snap = self.snap  # this request's config for its whole life
        r = RequestState(
            request_id(request), endpoint, _now(), time.time(), client_rid=_client_request_id(request), api=api
        )
        if self.tracing is not None:
            r.trace = self.tracing.begin(request.headers)
        answer = error_response if api is None else api.error_response
        admission: Admission | None = None
        in_flight = None
        try:
            if self.not_ready is not None:
                raise starting()
            adm = await self.admitter.check(request, snap, r, endpoint)
            r.timeline.mark("checked")
            admission = await self.admitter.reserve(adm, r.model)
            r.timeline.mark("admitted")
            journal_admit(self._ledger, r, admission)  # write-ahead: on disk before anything is forwarded
            in_flight = self.metrics.in_flight_of(r.model)
            in_flight.inc()
            self.retry_budget.record_request()
            return await self.upstream.proxy(request, snap, r, adm.body, adm.task, adm.key)
        except GatewayError as e:
            r.status = e.status
            r.outcome = "error"
            r.error_code = e.code
            if admission is None:
                r.timeline.refused(e)
            return answer(e, r.rid)
        except asyncio.CancelledError:
            r.outcome = "client_disconnect"
            raise
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            r.outcome = "client_disconnect"
            return web.Response(status=499)
        except Exception:  # a bug must not reach the client as a stack trace
            log.exception("request %s failed inside the gateway", r.rid)
            r.status, r.outcome, r.error_code = 500, "error", "internal_error"
            err = GatewayError(
                500,
                f"the gateway failed on this request; retry, and report the request id {r.rid} if it persists",
                code="internal_error",
            )
            return answer(err, r.rid)
        finally:
            if in_flight is not None:
                in_flight.dec()
            self._finish(snap, r, admission)

    def _finish(self, snap: Snapshot, r: RequestState, admission: Admission | None) -> None:
        """Metrics + access log now; settle + ledger in a task that survives the handler's cancellation."""
        e2e_ns = _now() - r.t0_ns
        if self._cutting and r.outcome == "client_disconnect":  # the gateway closed it, not the client
            r.outcome, r.error_code = "error", "gateway_shutdown"
        if r.status == 0:
            r.status = 499 if r.outcome == "client_disconnect" else 200
        if r.outcome == "client_disconnect":
            r.timeline.mark("client_left")
        r.timeline.mark("done", {"status": r.status})
        m = self.metrics
        m.finished(r.model, r.backend or "none", r.status, api_name(r), r.prompt_tokens, r.completion_tokens)
        if r.model != "-":
            m.model(r.model, r.backend)[2].observe(e2e_ns / 1e9)
        used = used_tokens(r)
        if r.status == 200 and r.model != "-":
            self._degrade.observe(r.model, r.ttft_ns)
        self._access.write(access_record(r, e2e_ns, snap.version, used))
        if self.tracing is not None:
            self.tracing.finish(r, e2e_ns, snap)
        if r.shadow is not None:  # a mirrored request: its primary side, for the shadow report
            r.shadow.primary_done(
                ShadowSide(
                    backend=r.backend,
                    upstream_model=r.upstream_model,
                    status=r.status,
                    complete=r.status == 200 and r.outcome == "ok",
                    ttft_ms=r.ttft_ns / 1e6 if r.ttft_ns is not None else None,
                    e2e_ms=e2e_ns / 1e6,
                    completion_tokens=r.completion_tokens
                    if r.completion_tokens is not None
                    else (r.token_events if r.served else None),
                    error=r.error_code or (None if r.outcome == "ok" else r.outcome),
                )
            )
        if admission is not None:
            self._spawn(settle(self._ledger, self._limiter, snap, r, admission, used))
