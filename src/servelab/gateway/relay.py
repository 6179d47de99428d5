"""The relay: an engine's answer passed on to the client, streamed read by read or whole.

Streaming pass-through: every upstream read that completes at least one SSE event
(:func:`servelab.gateway.sse.split_complete`) is written to the client at once (``X-Accel-Buffering: no``,
one ``write`` per upstream read, bytes unchanged except an engine-specific ``finish_reason`` such as TGI's
``stop_sequence``, mapped to OpenAI's by :func:`openai_finish` in the few chunks that carry a finish reason
as a string, and the engine's own ``model`` name replaced by the public one (:func:`public_model`); the
same in whole answers). The relay parses only what it must: every event until the first token (to time
TTFT at the first token-carrying chunk, docs/engine-wire.md case 1), and afterwards only blocks that contain
``"usage":{`` or ``"error"`` (a bytes search first, ``orjson`` only on a hit). The usage-only chunk
(``choices: []``, case 7) is removed when the client did not ask for it. An error inside a 200 stream
(case 15, any dialect) becomes one clean OpenAI error event followed by ``data: [DONE]``; an upstream that
stops mid-way gets the same treatment. Engine error text never reaches the client (servelab.gateway.scrub).

Metrics: ``ttft_seconds`` at the first token-carrying chunk written, ``inter_token_seconds`` per token
chunk (a read carrying k events adds k observations of gap/k), ``stream_errors_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from servelab.gateway import degrade, scrub
from servelab.gateway.errors import GatewayError
from servelab.gateway.metrics import GatewayMetrics
from servelab.gateway.reqstate import RequestState, UpstreamFailed
from servelab.gateway.sse import DONE, DONE_EVENT, count_token_events, events, split_complete
from servelab.wire.stream import choices_carry_token
from servelab.wire.types import normalize_finish

__all__ = ["Relay", "map_finish_bytes", "openai_finish", "public_model", "whole_answer"]

log = logging.getLogger("servelab.gateway")
_now = time.monotonic_ns

#: the longest wait (s) after a stream's last event for the end of the engine's body (:func:`close_upstream`)
TAIL_WAIT_S = 0.05
#: the background reads of :func:`close_upstream` (kept referenced until done)
_TAILS: set[asyncio.Task[None]] = set()


def close_upstream(resp: aiohttp.ClientResponse, done: bool) -> None:
    """Let go of the engine's response ``resp``. A stream that ended well (``done``: its last event read) is
    usually followed by the chunked body's closing chunk, often in a later TCP segment; a response closed
    before its end of body closes its connection, and every next request then opens a new one (a TCP connect
    each, TIME_WAIT sockets piling up at high request rates). So that end is read in a background task, for
    at most :data:`TAIL_WAIT_S` s, and the connection goes back to the pool; an engine that keeps sending or
    fails just loses its connection. In the background because the handler may be cancelled the moment the
    client has its answer (a client that closes at once), and the request is complete by then."""
    if not done or resp.content.at_eof():
        resp.close()
        return
    task = asyncio.get_running_loop().create_task(_drain_then_close(resp))
    _TAILS.add(task)
    task.add_done_callback(_TAILS.discard)


async def _drain_then_close(resp: aiohttp.ClientResponse) -> None:
    content = resp.content
    try:
        with contextlib.suppress(TimeoutError, aiohttp.ClientError):
            async with asyncio.timeout(TAIL_WAIT_S):
                while not content.at_eof() and await content.readany():
                    pass
    finally:
        resp.close()  # after the end of body: a no-op for a connection already back in the pool


_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
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
    ``max_tokens`` -> ``length`` (:data:`servelab.wire.types.FINISH_ALIASES`, docs/engine-wire.md case 11);
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


def public_model(data: bytes, r: RequestState) -> bytes:
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
        r.model_seen = m.group(0)[len(m.group(1)) :]
        return m.group(1) + r.model_field

    return _MODEL_RE.sub(sub, data)


def whole_answer(raw: bytes, r: RequestState, hide: tuple[str, ...]) -> Any:
    """A whole 200 answer ``raw`` decoded (None when it is not JSON). Raises :class:`UpstreamFailed` when it
    carries an engine error or is not JSON: the engine's text goes to the log only (servelab.gateway.scrub)."""
    try:
        ev = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ev = None
    gerr = (
        scrub.from_event(ev, r.rid, r.backend, hide)
        if isinstance(ev, dict)
        else scrub.from_body(raw, 200, r.rid, r.backend, hide)
    )
    if gerr is not None:
        raise UpstreamFailed(gerr, degrade.another_target(gerr), "protocol")
    return ev


class Relay:
    """Passes answers on and records what they carried into the request's :class:`RequestState`
    (usage, token events, TTFT, served, status); ``metrics``: the gateway's."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.metrics = metrics

    async def pipe_whole(
        self, hide: tuple[str, ...], r: RequestState, resp: aiohttp.ClientResponse
    ) -> tuple[web.StreamResponse, bool]:
        """A whole JSON answer (non-streamed request, or an engine that ignored ``stream``): forwarded
        unchanged after its usage is read, except engine finish reasons mapped to OpenAI's."""
        raw = await resp.read()
        ev = whole_answer(raw, r, hide)  # engine error text: log only
        if r.tally is not None:
            r.tally.take_whole(ev, r.sent_cap or r.out_cap)  # per-choice lower bounds (served.py)
        usage = ev.get("usage")
        if isinstance(usage, dict):
            self.take_usage(r, usage)
        r.timeline.take_engine(ev)
        r.served = True
        r.status = 200
        r.ttft_ns = _now() - r.t0_ns
        sent = public_model(map_finish_bytes(raw), r)
        if r.shadow is not None:
            r.shadow.capture.whole(sent)
        if r.api is not None:  # another API's answer (servelab.gateway.apis): translated from the chat answer
            sent = r.api.whole(ev, r)
        return web.Response(body=sent, content_type="application/json", headers={"X-Request-ID": r.rid}), True

    @staticmethod
    def take_usage(r: RequestState, usage: dict[str, Any], choices: Any = None) -> None:
        """Record one ``usage`` (``choices``: its event's choices, None for a whole answer). Multi-sequence
        requests are tallied per choice (servelab.gateway.served): llama-server counts one choice per usage."""
        if r.tally is not None and r.tally.sequences > 1:
            if choices is not None:
                r.tally.take(usage, choices)
            r.prompt_tokens = r.tally.prompt(r.prompt_est)
            r.completion_tokens = r.tally.completion()
            return
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if r.endpoint == "rerank" and not isinstance(pt, int):  # vLLM's rerank usage: total_tokens only
            pt = usage.get("total_tokens")
        if isinstance(pt, int):
            r.prompt_tokens = pt
        if isinstance(ct, int):
            r.completion_tokens = ct
        elif r.endpoint in ("embeddings", "rerank") and isinstance(pt, int):
            r.completion_tokens = 0

    async def pipe_stream(  # noqa: C901 - the per-chunk hot loop, kept whole: each split adds calls per chunk
        self,
        request: web.Request,
        hide: tuple[str, ...],
        r: RequestState,
        resp: aiohttp.ClientResponse,
        client_usage: bool,
    ) -> tuple[web.StreamResponse, bool | None]:
        """Forward the SSE body read by read. Returns (response, complete): complete is False when the
        stream ended in an error event or was cut off (the client then got a clean error event + [DONE]),
        None when the client went away (says nothing about the backend).
        Raises :class:`UpstreamFailed` when it fails before any byte reached the client."""
        out: web.StreamResponse | None = None
        buf = b""
        first = False
        saw_done = False
        saw_finish = False
        last_ns = 0
        ttft_h, itl, _, _ = self.metrics.model(r.model, r.backend)
        error: GatewayError | None = None
        cut = False
        try:
            async for data in resp.content.iter_any():
                buf = buf + data if buf else data
                split = split_complete(buf)
                if split is None:
                    continue
                block, buf = split
                if not first or b'"usage":{' in block or b'"usage": {' in block or b'"error"' in block:
                    block, ntok, error, done = self.inspect(block, hide, r, client_usage)
                    saw_done = saw_done or done
                else:
                    ntok = count_token_events(block)
                    if block.endswith(DONE_EVENT):
                        saw_done = True
                if b'"finish_reason":"' in block or b'"finish_reason": "' in block:
                    saw_finish = True
                    block = map_finish_bytes(block)  # TGI "stop_sequence" -> "stop"
                if b'"model"' in block:
                    block = public_model(block, r)
                if error is not None and out is None and not block:
                    # nothing sent yet: the client gets a proper HTTP error instead of a 200 stream
                    raise UpstreamFailed(error, degrade.another_target(error), "stream_error")
                # charged before the write: a client that leaves during it still pays for what the engine
                # already produced and the gateway received
                r.token_events += ntok
                if block:
                    try:
                        if out is None:
                            out, _ = await self.prepare(request, r)  # headers leave with this block
                        # aiohttp writes one chunked frame per call and waits only when the socket's
                        # buffer is above its limit; writing to the transport directly measured no
                        # faster here (benches/gateway_overhead.py, 2026-11-30) and bypassed its API
                        # another API's stream (servelab.gateway.apis): its events for these chunks
                        await out.write(block if r.api is None else r.api.stream(block, r))
                        if r.shadow is not None:  # a mirrored request: what the client got, for the report
                            r.shadow.capture.feed(block)
                    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
                        # the client went away without the handler being cancelled: stop here; leaving
                        # this function closes the upstream response, which cancels the engine's work
                        r.outcome = "client_disconnect"
                        self.charge_unread(hide, r, buf, resp, client_usage)
                        return (out if out is not None else web.Response(status=499)), None
                if ntok > 0:
                    t = _now()
                    if not first:
                        first = True
                        r.ttft_ns = t - r.t0_ns
                        ttft_h.observe(r.ttft_ns / 1e9)
                        r.timeline.mark("first_token", None, t)
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
                self.charge_unread(hide, r, buf, resp, client_usage)
            raise
        if last_ns:
            r.timeline.mark("last_token", None, last_ns)
        if error is None and not saw_done and not saw_finish:
            cut = True
        if out is None:  # an empty 200 body
            raise UpstreamFailed(
                GatewayError(
                    502,
                    "the model closed the connection without answering; retry",
                    type="server_error",
                    code="upstream_error",
                ),
                True,
                "connect",
            )
        if error is None and cut:
            error = GatewayError(
                502,
                "the model stopped answering mid-way; retry the request",
                type="server_error",
                code="upstream_cut_off",
            )
        if error is not None:
            self.metrics.stream_errors.labels(r.model, r.backend or "none").inc()
            r.outcome = "error"
            r.error_code = error.code
            await out.write(error.event() + DONE_EVENT if r.api is None else r.api.stream_error(error, r))
        elif buf.strip():
            await out.write(buf if r.api is None else r.api.stream(buf + b"\n\n", r))
        if r.api is not None and error is None:
            await out.write(r.api.stream_end(r))
        r.upstream_done = saw_done and error is None
        await out.write_eof()
        return out, error is None

    def charge_unread(
        self, hide: tuple[str, ...], r: RequestState, buf: bytes, resp: aiohttp.ClientResponse, client_usage: bool
    ) -> None:
        """The client left mid-stream: also charge the complete events the engine already delivered to
        this process but that were not forwarded (``buf`` and the upstream read buffer; a usage chunk among
        them is taken as usage). An incomplete trailing event is not charged: what it is cannot be told."""
        with contextlib.suppress(Exception):
            buf += resp.content.read_nowait()
        split = split_complete(buf.replace(b"\r\n", b"\n"))
        if split is not None:
            _, ntok, _, _ = self.inspect(split[0], hide, r, client_usage)
            r.token_events += ntok

    async def prepare(self, request: web.Request, r: RequestState) -> tuple[web.StreamResponse, Any]:
        """The 200 SSE response, prepared: (response, its payload writer)."""
        out = web.StreamResponse(status=200, headers={**_SSE_HEADERS, "X-Request-ID": r.rid})
        out.enable_chunked_encoding()
        writer = await out.prepare(request)
        r.served = True
        r.status = 200
        return out, writer

    def inspect(
        self, block: bytes, hide: tuple[str, ...], r: RequestState, client_usage: bool
    ) -> tuple[bytes, int, GatewayError | None, bool]:
        """Slow path for one block of complete events: find usage, errors, token-carrying events; drop
        the usage-only chunk unless the client asked for usage. Returns (bytes to forward, token events,
        error, saw [DONE])."""
        kept: list[bytes] = []
        ntok = 0
        done = False
        changed = False
        for ev_bytes, payload in events(block):
            if payload == DONE:
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
            gerr = scrub.from_event(ev, r.rid, r.backend, hide)  # engine text: log only
            if gerr is not None:
                head = b"\n\n".join(kept) + b"\n\n" if kept else b""
                return head, ntok, gerr, done
            choices = ev.get("choices")
            usage = ev.get("usage")
            if isinstance(usage, dict):
                self.take_usage(r, usage, choices if isinstance(choices, list) else [])
                r.timeline.take_engine(ev)
                if not choices and not client_usage:
                    changed = True
                    continue
            if choices_carry_token(choices):
                ntok += 1
            kept.append(ev_bytes)
        if not changed and kept:
            return block, ntok, None, done
        return (b"\n\n".join(kept) + b"\n\n") if kept else b"", ntok, None, done
