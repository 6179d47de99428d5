"""The mock engine's HTTP server (aiohttp): :class:`MockServer` binds, routes every endpoint to its handler
and holds the state the handlers share: the per-request records
(:class:`~servelab.engines.mock.record.MockRecord`), the counters behind ``/mock/stats`` and ``/metrics``,
the seeded failure draw, the slot queue, the batch law and the prefix cache. The chat and completions
routes are :mod:`servelab.engines.mock.admission` (which requests are served, and from when) and
:mod:`servelab.engines.mock.respond` (the answer written on its schedule).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` true or false), Anthropic
``POST /v1/messages`` and OpenAI ``POST /v1/responses`` served natively (:mod:`servelab.engines.mock.apis`),
``POST /v1/rerank`` and ``/rerank`` (a deterministic score, :mod:`servelab.engines.mock.rerank`),
``GET /v1/models``, ``GET /health`` (and ``GET /``), ``GET /metrics`` (Prometheus text), the dialect's
identity endpoints (:mod:`servelab.engines.mock.info`), and the mock-only ``GET /mock/records``,
``GET /mock/stats``, ``POST /mock/reset``.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import socket
import time
from typing import Any

import orjson
from aiohttp import web

from servelab.engines.mock.admission import generate
from servelab.engines.mock.apis import NATIVE_ROUTES, api_handler
from servelab.engines.mock.batch import DecodeBatch
from servelab.engines.mock.cache import BLOCK_WORDS, PrefixCache
from servelab.engines.mock.config import MockConfig, validate_config
from servelab.engines.mock.info import info_routes, model_card
from servelab.engines.mock.record import INJECTED_KINDS, MockRecord
from servelab.engines.mock.rerank import rerank_handler
from servelab.wire.dialects import stream_rules

__all__ = ["MockServer", "start_mock"]

_now = time.monotonic_ns


class MockServer:
    """A running mock engine. ``port`` is the bound port, ``base_url`` the API root (``http://h:p/v1``).

    ``records`` (list of :class:`MockRecord`) and ``stats`` are the live data behind ``/mock/records`` and
    ``/mock/stats``. Call :meth:`close` to stop (in-flight requests are cancelled after 1 s).
    """

    def __init__(self, config: MockConfig) -> None:
        validate_config(config)
        self.config = config
        self.records: list[MockRecord] = []
        self.port = 0
        self.host = config.host
        self._runner: web.AppRunner | None = None
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self.requests = 0
        self.completed = 0
        self.running = 0
        self.injected = dict.fromkeys(INJECTED_KINDS, 0)
        self.queue: asyncio.Semaphore | None = None
        self._delays_ns = int(config.ttft_ms * 1e6), int(config.itl_ms * 1e6)
        self.batch = (
            DecodeBatch(config.ttft_ms, config.itl_ms, config.prefill_tokens_per_s, config.itl_ms_per_running)
            if DecodeBatch.wanted(config.prefill_tokens_per_s, config.itl_ms_per_running)
            else None
        )
        self.received = 0  # completion requests since start (not reset): arms crash_after_requests
        self.waiting = 0  # requests waiting for a slot (llama-server dialect with max_inflight)
        self.cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache_blocks else None
        self.kv_words = 0  # prompt + answer words of the requests running now (KV use with a prefix cache)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (IPv6 hosts in brackets)."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/v1"

    # -- lifecycle
    async def start(self) -> None:
        """Bind and start serving; raises :class:`OSError` if the address is taken."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/chat/completions", self._chat)
        r.add_post("/completions", self._completions)
        r.add_post("/v1/rerank", rerank_handler(self.config.model))
        r.add_post("/rerank", rerank_handler(self.config.model))
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health)
        r.add_get("/", self._root)
        r.add_get("/metrics", self._metrics)
        r.add_get("/mock/records", self._records)
        r.add_get("/mock/stats", self._stats)
        r.add_post("/mock/reset", self._reset)
        for path, api in NATIVE_ROUTES.items():
            r.add_post(path, api_handler(self, api))
        for method, path, handler in info_routes(self.config.dialect, self.config.model, self.config.context_tokens):
            r.add_route(method, path, handler)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        fam = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.config.port))
        except OSError:
            sock.close()
            await self._runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()
        if (
            self.config.max_inflight > 0
            and self.config.overload_status is None
            and stream_rules(self.config.dialect).overload_status is None
        ):  # llama-server defers
            self.queue = asyncio.Semaphore(self.config.max_inflight)

    async def close(self) -> None:
        """Stop serving; idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def reset(self) -> None:
        """Clear records and counters, empty the prefix cache and re-seed the failure RNG (a run after a reset
        is reproducible)."""
        self.records.clear()
        if self.cache is not None:
            self.cache = PrefixCache(self.cache.capacity)
        self.requests = 0
        self.completed = 0
        self.injected = dict.fromkeys(INJECTED_KINDS, 0)
        self._rng = random.Random(self.config.seed)
        self._ids = itertools.count()

    def stats(self) -> dict[str, Any]:
        """Counts: completion requests received, completed normally, running now, injected failures by kind."""
        return {
            "requests": self.requests,
            "completed": self.completed,
            "running": self.running,
            "injected": dict(self.injected),
            "dialect": self.config.dialect,
        }

    # -- small endpoints
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [model_card(self.config.dialect, self.config.model, self.config.context_tokens)],
            },
            dumps=lambda o: orjson.dumps(o).decode(),
        )

    async def _health(self, request: web.Request) -> web.Response:
        if self.config.dialect == "llamacpp":
            return web.json_response({"status": "ok"})
        return web.Response(status=200)

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running" if self.config.dialect == "ollama" else "servelab mock-engine")

    async def _metrics(self, request: web.Request) -> web.Response:
        d = self.config.dialect
        lines = [
            "# HELP mock_requests_total Completion requests received.",
            "# TYPE mock_requests_total counter",
            f"mock_requests_total {self.requests}",
            "# HELP mock_requests_running Completion requests in flight.",
            "# TYPE mock_requests_running gauge",
            f"mock_requests_running {self.running}",
            "# TYPE mock_requests_completed_total counter",
            f"mock_requests_completed_total {self.completed}",
        ]
        for kind, n in self.injected.items():
            lines.append(f'mock_injected_failures_total{{kind="{kind}"}} {n}')
        w = stream_rules(d)
        if w.running_gauge and w.waiting_gauge:
            lines += [
                f"# TYPE {w.running_gauge} gauge",
                f"{w.running_gauge} {self.running - self.waiting}",
                f"# TYPE {w.waiting_gauge} gauge",
                f"{w.waiting_gauge} {self.waiting}",
            ]
        if self.cache is not None:  # servelab.engines.mock.cache: vLLM's counter names, KV use in the dialect's
            lines += [
                "# TYPE vllm:prefix_cache_queries_total counter",
                f"vllm:prefix_cache_queries_total {self.cache.queries}",
                "# TYPE vllm:prefix_cache_hits_total counter",
                f"vllm:prefix_cache_hits_total {self.cache.hits}",
            ]
            kv = {"vllm": "vllm:kv_cache_usage_perc", "sglang": "sglang:token_usage"}.get(d)
            if kv:
                usage = min(1.0, self.kv_words / (self.cache.capacity * BLOCK_WORDS))
                lines += [f"# TYPE {kv} gauge", f"{kv} {usage:.6g}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _records(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps([r.to_dict() for r in self.records]), content_type="application/json")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    # -- generation
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, False)

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """The chat (``chat`` true) or completions route on this server
        (:func:`servelab.engines.mock.admission.generate`)."""
        return await generate(self, request, chat)

    def new_record(self, request: web.Request, endpoint: str) -> tuple[MockRecord, int]:
        """A :class:`MockRecord` for a generation request to ``endpoint`` received now, kept in
        :attr:`records` and counted; with the request's sequence number."""
        seq = next(self._ids)
        rec = MockRecord(request.headers.get("X-Request-Id") or str(seq), _now())
        rec.client_request_id = request.headers.get("X-Client-Request-ID")
        rec.traceparent = request.headers.get("traceparent")
        rec.endpoint = endpoint
        self.records.append(rec)
        self.requests += 1
        self.received += 1
        return rec, seq

    def draw(self, rec: MockRecord) -> str | None:
        """The injected failure for ``rec`` (one draw per request, in arrival order: bands http |
        stream_error | cut | hang | none), counted; None = none."""
        cfg = self.config
        u = self._rng.random()
        kind = None
        edge = cfg.fail_http_rate
        if u < edge:
            kind = "http_status"
        elif u < (edge := edge + cfg.stream_error_rate):
            kind = "stream_error"
        elif u < (edge := edge + cfg.cut_rate):
            kind = "cut_off"
        elif u < edge + cfg.hang_rate:
            kind = "hang"
        if kind is not None:
            rec.injected = kind
            self.injected[kind] += 1
        return kind

    @property
    def delays_ns(self) -> tuple[int, int]:
        """(time to first token, inter-token latency) of the fixed schedule, ns."""
        return self._delays_ns


async def start_mock(config: MockConfig) -> MockServer:
    """Start a mock engine in the running event loop and return it (``.port``, ``.base_url``, ``close()``).

    Raises :class:`ValueError` for a bad config and :class:`OSError` if the address cannot be bound.
    """
    server = MockServer(config)
    await server.start()
    return server
