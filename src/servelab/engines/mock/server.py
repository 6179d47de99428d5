"""The mock engine's HTTP server (aiohttp): :class:`MockServer` answers completion requests on the schedule
and with the failures its :class:`~servelab.engines.mock.config.MockConfig` asks for, and records, per
request, the ``time.monotonic_ns()`` at which it wrote every token-carrying chunk (:class:`MockRecord`),
so a client's measurements can be checked against what the server really did.

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` true or false), Anthropic
``POST /v1/messages`` and OpenAI ``POST /v1/responses`` served natively (:mod:`servelab.engines.mock.apis`),
``POST /v1/rerank`` and ``/rerank`` (a deterministic score, :mod:`servelab.engines.mock.rerank`),
``GET /v1/models``, ``GET /health`` (and ``GET /``), ``GET /metrics`` (Prometheus text), the dialect's
identity endpoints (:mod:`servelab.engines.mock.info`), and the mock-only ``GET /mock/records``,
``GET /mock/stats``, ``POST /mock/reset``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import random
import socket
import time
from typing import Any

import orjson
from aiohttp import web

from servelab.engines.mock.apis import NATIVE_ROUTES, api_handler
from servelab.engines.mock.batch import DecodeBatch
from servelab.engines.mock.cache import BLOCK_WORDS, PrefixCache, prompt_words
from servelab.engines.mock.config import MockConfig, validate_config
from servelab.engines.mock.encoders import (
    DONE,
    HOLD_HEADERS,
    REASONING_FIELD,
    Encoder,
    context_overflow,
    error_body,
    stream_trailer,
)
from servelab.engines.mock.info import info_routes, model_card
from servelab.engines.mock.plan import Plan, count_words, plan_answer
from servelab.engines.mock.rerank import rerank_handler
from servelab.wire.dialects import stream_rules

__all__ = ["INJECTED_KINDS", "SAMPLING_FIELDS", "MockRecord", "MockServer", "start_mock"]

_now = time.monotonic_ns

#: Injected failure kinds, as counted in ``/mock/stats``.
INJECTED_KINDS = ("http_status", "stream_error", "cut_off", "hang", "overload")

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
#: body fields a :class:`MockRecord` keeps in ``sampling`` (OpenAI's plus common engine extensions)
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "stop",
    "seed",
    "max_tokens",
    "max_completion_tokens",
)


class MockRecord:
    """What the mock did for one request; all times are ``time.monotonic_ns()`` values.

    ``token_write_ns[i]`` is taken right before the write of the i-th token-carrying chunk, which carried
    ``token_counts[i]`` tokens. ``headers_ns`` is when the status line and headers were handed to the
    transport (with held headers, together with the first token). ``injected`` is ``None`` or one of
    :data:`INJECTED_KINDS`. ``request_id``: the ``X-Request-Id`` header (the servelab gateway's own id)
    or a sequence number; ``client_request_id``: the ``X-Client-Request-ID`` header the gateway passes on
    (the client's id), or None. ``sampling``: the sampling fields of the request body as received
    (:data:`SAMPLING_FIELDS` present in it), so what a gateway forwarded can be checked.
    """

    __slots__ = (
        "request_id",
        "client_request_id",
        "endpoint",
        "stream",
        "model",
        "recv_ns",
        "headers_ns",
        "token_write_ns",
        "token_counts",
        "done_ns",
        "injected",
        "status",
        "output_tokens",
        "prompt_tokens",
        "finish_reason",
        "sampling",
        "cached_tokens",
        "traceparent",
    )

    def __init__(self, request_id: str, recv_ns: int) -> None:
        self.request_id = request_id
        self.client_request_id: str | None = None
        self.recv_ns = recv_ns
        self.endpoint = ""
        self.stream = True
        self.model: str | None = None
        self.headers_ns: int | None = None
        self.token_write_ns: list[int] = []
        self.token_counts: list[int] = []
        self.done_ns: int | None = None
        self.injected: str | None = None
        self.status: int | None = None
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.finish_reason: str | None = None
        self.sampling: dict[str, Any] = {}
        #: prompt words found in the prefix cache (--prefix-cache-blocks; 0 without one)
        self.cached_tokens = 0
        #: the W3C ``traceparent`` header received (a tracing gateway's attempt span), or None
        self.traceparent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the shape of one ``/mock/records`` item)."""
        return {k: getattr(self, k) for k in self.__slots__}


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
        self._queue: asyncio.Semaphore | None = None
        self._delays_ns = int(config.ttft_ms * 1e6), int(config.itl_ms * 1e6)
        self._batch = (
            DecodeBatch(config.ttft_ms, config.itl_ms, config.prefill_tokens_per_s, config.itl_ms_per_running)
            if DecodeBatch.wanted(config.prefill_tokens_per_s, config.itl_ms_per_running)
            else None
        )
        self._received = 0  # completion requests since start (not reset): arms crash_after_requests
        self.waiting = 0  # requests waiting for a slot (llama-server dialect with max_inflight)
        self.cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache_blocks else None
        self._kv_words = 0  # prompt + answer words of the requests running now (KV use with a prefix cache)

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
            self._queue = asyncio.Semaphore(self.config.max_inflight)

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
                usage = min(1.0, self._kv_words / (self.cache.capacity * BLOCK_WORDS))
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

    def _error(self, status: int, message: str) -> web.Response:
        return web.Response(
            status=status, body=error_body(self.config.dialect, status, message), content_type="application/json"
        )

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
        self._received += 1
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

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        cfg = self.config
        rec, seq = self.new_record(request, "chat" if chat else "completions")
        recv = rec.recv_ns
        crash = cfg.crash_after_requests is not None and self._received > cfg.crash_after_requests
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as e:  # orjson.JSONDecodeError is a ValueError
            if crash:
                _crash(self._received)
            rec.status = 400
            rec.done_ns = _now()
            return self._error(400, f"invalid JSON body: {e}")
        model = body.get("model")
        rec.model = model if isinstance(model, str) else None
        stream = bool(body.get("stream", False))
        rec.stream = stream
        rec.prompt_tokens = count_words(body)
        rec.sampling = {k: body[k] for k in SAMPLING_FIELDS if k in body}
        if crash:  # no overload answer and no failure draw: this one is answered until the crash
            plan = plan_answer(cfg, body, chat)
            rec.output_tokens = plan.generated
            rec.finish_reason = plan.finish
            self.running += 1
            try:
                return await self._respond(request, rec, body, chat, plan, "crash", seq, stream, recv)
            finally:
                self.running -= 1
        overflow = context_overflow(cfg, body, rec.prompt_tokens)
        if (
            overflow is None
            and stream_rules(cfg.dialect).overflow_status is None
            and 0 < cfg.context_tokens < rec.prompt_tokens
        ):
            rec.prompt_tokens = cfg.context_tokens  # Ollama keeps the last num_ctx tokens, says nothing
        if overflow is not None:
            rec.status = overflow[0]
            rec.done_ns = _now()
            return web.Response(status=overflow[0], body=overflow[1], content_type="application/json")
        if cfg.max_inflight > 0 and self._queue is None and self.running >= cfg.max_inflight:
            status = cfg.overload_status or stream_rules(cfg.dialect).overload_status or 503
            rec.injected = "overload"
            rec.status = status
            self.injected["overload"] += 1
            rec.done_ns = _now()
            return self._error(
                status,
                "Too many requests in flight; try again later"
                if status == 429
                else "Service Unavailable: the request queue is full",
            )
        kind = self.draw(rec)
        if kind == "http_status":
            rec.status = cfg.fail_http_status
            rec.done_ns = _now()
            return self._error(cfg.fail_http_status, cfg.error_message or "mock-engine injected failure")
        plan = plan_answer(cfg, body, chat)
        rec.output_tokens = plan.generated
        rec.finish_reason = plan.finish
        self.running += 1
        try:
            if self._queue is not None:  # llama-server defers: the schedule starts when a slot frees
                self.waiting += 1
                try:
                    await self._queue.acquire()
                finally:
                    self.waiting -= 1
                try:
                    return await self._cached(request, rec, body, chat, plan, kind, seq, stream, _now())
                finally:
                    self._queue.release()
            return await self._cached(request, rec, body, chat, plan, kind, seq, stream, recv)
        finally:
            self.running -= 1

    async def _cached(
        self,
        request: web.Request,
        rec: MockRecord,
        body: dict[str, Any],
        chat: bool,
        plan: Plan,
        kind: str | None,
        seq: int,
        stream: bool,
        origin: int,
    ) -> web.StreamResponse:
        """:meth:`_respond` after the prefix-cache lookup (when the mock has one) and with the request's
        words counted as KV in use while it runs."""
        if self.cache is None:
            return await self._respond(request, rec, body, chat, plan, kind, seq, stream, origin)
        rec.cached_tokens = min(rec.prompt_tokens, self.cache.lookup(prompt_words(body)))
        words = rec.prompt_tokens + plan.generated
        self._kv_words += words
        try:
            return await self._respond(request, rec, body, chat, plan, kind, seq, stream, origin)
        finally:
            self._kv_words -= words

    async def _respond(
        self,
        request: web.Request,
        rec: MockRecord,
        body: dict[str, Any],
        chat: bool,
        plan: Plan,
        kind: str | None,
        seq: int,
        stream: bool,
        origin: int,
    ) -> web.StreamResponse:
        model = rec.model or self.config.model
        enc = Encoder(self.config, self.config.dialect, chat, model, seq, rec.prompt_tokens, plan)
        enc.cached = rec.cached_tokens
        if stream:
            so = body.get("stream_options")
            include_usage = isinstance(so, dict) and bool(so.get("include_usage"))
            return await self._stream(request, rec, enc, plan, kind, include_usage, origin)
        return await self._whole(request, rec, enc, plan, kind, chat, model, origin)

    async def _stream(
        self,
        request: web.Request,
        rec: MockRecord,
        enc: Encoder,
        plan: Plan,
        kind: str | None,
        include_usage: bool,
        origin: int,
    ) -> web.StreamResponse:
        d = self.config.dialect
        ttft_ns, itl_ns = self._delays_ns
        law = self._batch
        delay = ttft_ns > 0 or itl_ns > 0 or law is not None
        target = gap = 0
        sleep = asyncio.sleep
        hold = d in HOLD_HEADERS
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        resp.enable_chunked_encoding()
        rec.status = 200
        role = enc.role_chunk()
        if not hold:
            writer = await resp.prepare(request)
            rec.headers_ns = _now()
            if role:  # vLLM: headers and role chunk go out at once (case 20)
                await resp.write(role)
                role = b""
            elif callable(send_headers := getattr(writer, "send_headers", None)):
                send_headers()  # TGI, /v1/completions: headers at once, no body yet
            else:  # pragma: no cover - older aiohttp buffers headers until the first body bytes
                await resp.write(b": mock\n\n")
        chunks = plan.chunks
        n = len(chunks)
        cut_at = max(1, n // 2) if kind in ("stream_error", "cut_off") else (1 if kind == "hang" else -1)
        if kind == "crash":
            cut_at = n // 2  # 0 (before any token) when there are fewer than two chunks
        chat = enc.chat
        # the trailer after the last token chunk: finish, usage, [DONE] (one write with the last token)
        last_finish, last_usage, last_extra, trailer = stream_trailer(enc, plan, d, include_usage)
        write = resp.write
        token_write_ns = rec.token_write_ns
        token_counts = rec.token_counts
        first_tool = True
        try:
            for i in range(n):
                if i == cut_at:
                    return await self._fail_stream(request, resp, rec, enc, kind)
                ck, text, ntok = chunks[i]
                if i == n - 1:
                    data = enc.token(ck, text, first_tool and ck == "t", last_finish, last_usage, last_extra) + trailer
                else:
                    data = enc.token(ck, text, first_tool and ck == "t", None)
                if ck == "t":
                    first_tool = False
                if delay:
                    target = (
                        origin + ttft_ns + i * itl_ns
                        if law is None
                        else law.target_ns(origin, i, target, gap, rec.prompt_tokens - rec.cached_tokens)
                    )
                    rem = target - _now()
                    if rem > 0:
                        await sleep(rem / 1e9)
                if role or i == 0 and hold:
                    data = role + data
                    role = b""
                    await resp.prepare(request)  # buffers the held headers; they leave with this write
                    rec.headers_ns = _now()
                t = _now()
                token_write_ns.append(t)
                await write(data)
                token_counts.append(ntok)
                if law is not None:
                    gap = law.wrote(i)  # joins the running batch at its first chunk (left in finally)
            if n == 0 and kind == "crash":
                return await self._fail_stream(request, resp, rec, enc, kind)
            if n == 0:
                if hold:
                    await resp.prepare(request)
                    rec.headers_ns = _now()
                await write(
                    role
                    + (
                        enc.finish_chunk(plan.finish)
                        if chat and not enc.w.finish_with_last_token
                        else enc.head
                        + (b'{"content":""}' if chat else b'""')
                        + enc.mid
                        + b'"'
                        + plan.finish.encode()
                        + b'"'
                        + enc.tail
                    )
                    + trailer
                )
            if n == cut_at:  # one-chunk streams: fail after the only token
                return await self._fail_stream(request, resp, rec, enc, kind)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            rec.done_ns = _now()
            raise
        finally:
            if law is not None and token_counts:
                law.decoding -= 1  # it left the running batch (finished, failed or cut)
        rec.done_ns = _now()
        self.completed += 1
        return resp

    async def _fail_stream(
        self, request: web.Request, resp: web.StreamResponse, rec: MockRecord, enc: Encoder, kind: str | None
    ) -> web.StreamResponse:
        """Inject ``kind`` into a started stream: error event, cut connection, or stall then cut."""
        if not resp.prepared:
            await resp.prepare(request)
            rec.headers_ns = _now()
        if kind == "crash":
            writer = await resp.prepare(request)  # the prepared writer; held headers still buffered
            if callable(send_headers := getattr(writer, "send_headers", None)):
                send_headers()  # so the crash is mid-response: status line and headers went out
            _crash(self._received)
        if kind == "stream_error":
            data = enc.error_event(self.config.error_message or "mock-engine injected error during generation")
            if enc.done_after_error:
                data += DONE
            await resp.write(data)
            if enc.done_after_error:
                await resp.write_eof()
            else:
                _abort(request)
        elif kind == "hang":
            await asyncio.sleep(self.config.hang_s)
            _abort(request)
        else:
            _abort(request)
        rec.done_ns = _now()
        return resp

    async def _whole(
        self,
        request: web.Request,
        rec: MockRecord,
        enc: Encoder,
        plan: Plan,
        kind: str | None,
        chat: bool,
        model: str,
        origin: int,
    ) -> web.StreamResponse:
        ttft_ns, itl_ns = self._delays_ns
        n = len(plan.chunks)
        if ttft_ns or itl_ns:
            rem = origin + ttft_ns + max(0, n - 1) * itl_ns - _now()
            if rem > 0:
                await asyncio.sleep(rem / 1e9)
        if kind == "crash":
            _crash(self._received)
        if kind == "hang":
            await asyncio.sleep(self.config.hang_s)
            _abort(request)
            rec.done_ns = _now()
            return web.Response(status=200)
        if kind == "cut_off":
            _abort(request)
            rec.done_ns = _now()
            return web.Response(status=200)
        if kind == "stream_error":
            rec.status = 500
            rec.done_ns = _now()
            return self._error(500, self.config.error_message or "mock-engine injected error during generation")
        content = "".join(t for k, t, _ in plan.chunks if k == "c")
        reasoning = "".join(t for k, t, _ in plan.chunks if k == "r")
        args = "".join(t for k, t, _ in plan.chunks if k == "t")
        usage: dict[str, Any] = {
            "prompt_tokens": rec.prompt_tokens,
            "completion_tokens": plan.generated,
            "total_tokens": rec.prompt_tokens + plan.generated,
        }
        if self.cache is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": rec.cached_tokens}
        fr = plan.finish
        if fr == "stop":
            fr = stream_rules(self.config.dialect).stop_finish
        if chat:
            msg: dict[str, Any] = {"role": "assistant", "content": content if not args else None}
            if reasoning:
                msg[REASONING_FIELD[self.config.dialect]] = reasoning
            if plan.tool_name is not None:
                msg["tool_calls"] = [
                    {"id": plan.tool_id, "type": "function", "function": {"name": plan.tool_name, "arguments": args}}
                ]
            out: dict[str, Any] = {
                "id": f"chatcmpl-mock{rec.request_id}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": fr}],
                "usage": usage,
            }
        else:
            out = {
                "id": f"cmpl-mock{rec.request_id}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": model,
                "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": fr}],
                "usage": usage,
            }
        payload = orjson.dumps(out)
        rec.status = 200
        rec.headers_ns = t = _now()
        rec.token_write_ns.append(t)
        rec.token_counts.append(plan.generated)
        resp = web.Response(status=200, body=payload, content_type="application/json")
        rec.done_ns = _now()
        self.completed += 1
        return resp


def _crash(received: int) -> None:
    """Exit the process at once with status 3 (no cleanup, no flushing of Python buffers): the injected
    crash of ``crash_after_requests``. Bytes already handed to the kernel still reach the client."""
    with contextlib.suppress(OSError):
        os.write(
            2,
            f"servelab mock-engine: injected crash at completion request {received}; exiting with status 3\n".encode(),
        )
    os._exit(3)


def _abort(request: web.Request) -> None:
    """Close the connection now (buffered bytes still go out): the body ends without its last chunk."""
    tr = request.transport
    if tr is not None:
        tr.close()


async def start_mock(config: MockConfig) -> MockServer:
    """Start a mock engine in the running event loop and return it (``.port``, ``.base_url``, ``close()``).

    Raises :class:`ValueError` for a bad config and :class:`OSError` if the address cannot be bound.
    """
    server = MockServer(config)
    await server.start()
    return server
