"""The mock engine's ``/v1/chat/completions`` and ``/v1/completions`` routes up to the answer
(:func:`generate`): which requests are served, and from when. In order: the body is read (invalid JSON: 400),
the request is counted and recorded (prompt size, sampling fields), the crash of ``crash_after_requests`` is
armed, a prompt over ``context_tokens`` gets the dialect's overflow answer (or, on Ollama, is truncated
silently), ``max_inflight`` answers the overload status or (llama-server dialect) queues the request for a
slot, the seeded failure draw picks the injected failure, the answer is planned
(:mod:`servelab.engines.mock.plan`), the prefix cache is looked up (:mod:`servelab.engines.mock.cache`),
and :mod:`servelab.engines.mock.respond` writes it, with the request counted as running (and its words as
KV in use) until it ends.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

import orjson
from aiohttp import web

from servelab.engines.mock.cache import prompt_words
from servelab.engines.mock.encoders import context_overflow
from servelab.engines.mock.plan import count_words, plan_answer
from servelab.engines.mock.record import SAMPLING_FIELDS, MockRecord
from servelab.engines.mock.respond import Answer, Responder, crash_now, error_response, respond
from servelab.wire.dialects import stream_rules

__all__ = ["Admitting", "generate"]

_now = time.monotonic_ns


class Admitting(Responder, Protocol):
    """What admission uses of :class:`servelab.engines.mock.server.MockServer`, beyond what the writer does."""

    running: int
    waiting: int
    injected: dict[str, int]
    queue: asyncio.Semaphore | None
    kv_words: int

    def new_record(self, request: web.Request, endpoint: str) -> tuple[MockRecord, int]: ...

    def draw(self, rec: MockRecord) -> str | None: ...


async def generate(server: Admitting, request: web.Request, chat: bool) -> web.StreamResponse:
    """Answer one ``/v1/chat/completions`` (``chat``) or ``/v1/completions`` request on ``server`` (module doc)."""
    cfg = server.config
    rec, seq = server.new_record(request, "chat" if chat else "completions")
    recv = rec.recv_ns
    crash = cfg.crash_after_requests is not None and server.received > cfg.crash_after_requests
    try:
        body = orjson.loads(await request.read())
        if not isinstance(body, dict):
            raise ValueError("body is not a JSON object")
    except ValueError as e:  # orjson.JSONDecodeError is a ValueError
        if crash:
            crash_now(server.received)
        rec.status = 400
        rec.done_ns = _now()
        return error_response(cfg.dialect, 400, f"invalid JSON body: {e}")
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
        server.running += 1
        try:
            return await respond(server, Answer(request, rec, body, chat, plan, "crash", seq, stream), recv)
        finally:
            server.running -= 1
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
    if cfg.max_inflight > 0 and server.queue is None and server.running >= cfg.max_inflight:
        status = cfg.overload_status or stream_rules(cfg.dialect).overload_status or 503
        rec.injected = "overload"
        rec.status = status
        server.injected["overload"] += 1
        rec.done_ns = _now()
        return error_response(
            cfg.dialect,
            status,
            "Too many requests in flight; try again later"
            if status == 429
            else "Service Unavailable: the request queue is full",
        )
    kind = server.draw(rec)
    if kind == "http_status":
        rec.status = cfg.fail_http_status
        rec.done_ns = _now()
        return error_response(cfg.dialect, cfg.fail_http_status, cfg.error_message or "mock-engine injected failure")
    plan = plan_answer(cfg, body, chat)
    rec.output_tokens = plan.generated
    rec.finish_reason = plan.finish
    answer = Answer(request, rec, body, chat, plan, kind, seq, stream)
    server.running += 1
    try:
        if server.queue is not None:  # llama-server defers: the schedule starts when a slot frees
            server.waiting += 1
            try:
                await server.queue.acquire()
            finally:
                server.waiting -= 1
            try:
                return await _cached(server, answer, _now())
            finally:
                server.queue.release()
        return await _cached(server, answer, recv)
    finally:
        server.running -= 1


async def _cached(server: Admitting, a: Answer, origin: int) -> web.StreamResponse:
    """:func:`~servelab.engines.mock.respond.respond` after the prefix-cache lookup (when the mock has one)
    and with the request's words counted as KV in use while it runs."""
    if server.cache is None:
        return await respond(server, a, origin)
    rec = a.rec
    rec.cached_tokens = min(rec.prompt_tokens, server.cache.lookup(prompt_words(a.body)))
    words = rec.prompt_tokens + a.plan.generated
    server.kv_words += words
    try:
        return await respond(server, a, origin)
    finally:
        server.kv_words -= words
