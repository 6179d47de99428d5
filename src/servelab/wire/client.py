"""The one async HTTP/SSE client every part of servelab uses to talk to an OpenAI-compatible server.

It always streams and always asks for usage (``stream_options.include_usage``, docs/engine-wire.md case 9),
stamps every phase of a request with ``time.monotonic_ns()`` and classifies every failure, so the
totals of a run always add up: submitted = succeeded + failed by class.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson

from servelab.wire.apis import (
    API_ENDPOINTS,
    MessagesStreamParser,
    ResponsesStreamParser,
    api_headers,
    messages_body,
    responses_body,
    usage_counts,
)
from servelab.wire.errors import ConfigError as ConfigError  # re-exported: it lived here before wire/errors.py
from servelab.wire.errors import error_from_body
from servelab.wire.stream import StreamParser, apply_event, finalize_tool_calls
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, WireError

_now = time.monotonic_ns


def normalize_base_url(url: str) -> str:
    """Return ``url`` without a trailing slash; raise :class:`ConfigError` if it is not http(s).

    The base URL is the OpenAI API root, e.g. ``http://127.0.0.1:8080/v1``; servelab appends
    ``/chat/completions`` or ``/completions``.
    """
    u = url.strip().rstrip("/")
    if not (u.startswith("http://") or u.startswith("https://")):
        raise ConfigError(f"--url {url!r} is not an http(s) URL; give the API root, e.g. http://127.0.0.1:8080/v1")
    for suffix in ("/chat/completions", "/completions"):
        if u.endswith(suffix):
            u = u[: -len(suffix)]
    return u


def build_body(model: str, spec: RequestSpec, stream: bool = True) -> dict[str, Any]:
    """The JSON body for ``spec``: streaming with usage requested, ``max_tokens`` set, extras merged; for the
    ``messages`` and ``responses`` endpoints the API's own body (:mod:`servelab.wire.apis`; raises
    :class:`ConfigError` for a field the API does not define)."""
    if spec.endpoint == "messages":
        return messages_body(model, spec, stream)
    if spec.endpoint == "responses":
        return responses_body(model, spec, stream)
    body: dict[str, Any] = {"model": model, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    if spec.endpoint == "chat":
        body["messages"] = spec.messages
    else:
        body["prompt"] = spec.prompt
    if spec.max_tokens is not None:
        body["max_tokens"] = spec.max_tokens
    if spec.extra:
        body.update(spec.extra)
    return body


def make_session(max_connections: int = 0, connect_timeout_s: float = 10.0) -> aiohttp.ClientSession:
    """An aiohttp session tuned for load generation: no connection cap unless given, no cookie jar,
    no automatic decompression work on the hot path beyond what the server asks for."""
    conn = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ttl_dns_cache=300, enable_cleanup_closed=False)
    return aiohttp.ClientSession(
        connector=conn,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s),
        skip_auto_headers=("User-Agent",),
        json_serialize=lambda o: orjson.dumps(o).decode(),
    )


async def send(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    spec: RequestSpec,
    rec: RequestRecord,
    timeout_s: float = 600.0,
    headers: dict[str, str] | None = None,
    on_chunk: Callable[[RequestRecord], None] | None = None,
) -> RequestRecord:
    """Send ``spec`` as a streaming request and fill ``rec`` with timestamps, text, usage and outcome.

    ``timeout_s`` bounds the whole request (headers may legitimately wait for the first token on
    SGLang/llama-server/Ollama, docs/engine-wire.md case 20, so there is no separate header timeout).
    Never raises for wire problems: they end up in ``rec.failure``/``rec.error``. Re-raises
    :class:`asyncio.CancelledError` after marking the record ``cancelled``.
    """
    path = API_ENDPOINTS.get(spec.endpoint) or ("/chat/completions" if spec.endpoint == "chat" else "/completions")
    body = orjson.dumps(build_body(model, spec))
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if headers:
        hdrs.update(headers)
    hdrs = api_headers(spec.endpoint, hdrs)
    parser_cls = _PARSERS.get(spec.endpoint, StreamParser)
    rec.max_tokens = spec.max_tokens
    rec.prompt_tokens_target = spec.prompt_tokens_target
    for attempt in range(_MAX_STALE_RETRIES + 1):
        stale = await _attempt(
            session,
            base_url + path,
            body,
            hdrs,
            rec,
            timeout_s,
            on_chunk,
            retry_ok=attempt < _MAX_STALE_RETRIES,
            parser_cls=parser_cls,
        )
        if not stale:
            break
        # the pooled keep-alive connection had been closed by the server (llama-server closes after
        # each stream, as curl also sees: "Connection died, retrying a fresh connect"): nothing was
        # answered, so send again; each try drops one dead pooled connection, and a dead server ends
        # the loop with a refused fresh connect (ClientConnectorError, never retried)
        rec.conn_retries += 1
    finalize(rec)
    return rec


#: the stream parser of each endpoint spoken in another API's shape (chat and completions: StreamParser)
_PARSERS: dict[str, type[StreamParser]] = {"messages": MessagesStreamParser, "responses": ResponsesStreamParser}
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)
_MAX_STALE_RETRIES = 16


async def _attempt(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    hdrs: dict[str, str],
    rec: RequestRecord,
    timeout_s: float,
    on_chunk: Callable[[RequestRecord], None] | None,
    retry_ok: bool,
    parser_cls: type[StreamParser] = StreamParser,
) -> bool:
    """One try of :func:`send`. Returns True (and leaves ``rec`` clean) when the request failed on a
    reused connection before any response byte and may be retried; otherwise fills ``rec``."""
    parser = parser_cls(rec)
    try:
        async with asyncio.timeout(timeout_s):
            rec.sent_ns = _now()
            async with session.post(url, data=body, headers=hdrs) as resp:
                rec.headers_ns = _now()
                rec.status = resp.status
                if resp.status >= 300:
                    raw = await resp.read()
                    rec.end_ns = _now()
                    rec.failure = FailureClass.HTTP_STATUS
                    rec.error = error_from_body(raw, resp.status)
                    return False
                ctype = resp.headers.get("Content-Type", "")
                if "text/event-stream" not in ctype:
                    await _non_stream(resp, rec, parser)
                else:
                    feed = parser.feed
                    async for data in resp.content.iter_any():
                        feed(data, _now())
                        if on_chunk is not None:
                            on_chunk(rec)
                    parser.close(_now())
    except asyncio.CancelledError:
        rec.end_ns = _now()
        rec.failure = FailureClass.CANCELLED
        raise
    except TimeoutError:
        rec.end_ns = _now()
        rec.failure = FailureClass.TIMEOUT
        rec.error = WireError(status=rec.status, message=f"no complete response within {timeout_s:g} s")
    except (
        aiohttp.ClientConnectorError,
        aiohttp.ClientOSError,
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientResponseError,
        ConnectionError,
    ) as e:
        rec.end_ns = _now()
        if (
            retry_ok
            and rec.headers_ns is None
            and isinstance(e, _STALE)
            and not isinstance(e, aiohttp.ClientConnectorError)
        ):
            rec.sent_ns = rec.end_ns = None
            return True
        if rec.headers_ns is None:
            rec.failure = FailureClass.CONNECT
        else:
            # a body that stopped mid-way: whatever events arrived stay recorded
            parser.close(rec.end_ns)
            if rec.failure is None or rec.failure is FailureClass.PROTOCOL:
                rec.failure = FailureClass.CUT_OFF
        rec.error = rec.error or WireError(status=rec.status, message=f"{type(e).__name__}: {e}")
    except aiohttp.ClientError as e:
        rec.end_ns = _now()
        rec.failure = FailureClass.CONNECT if rec.headers_ns is None else FailureClass.CUT_OFF
        rec.error = WireError(status=rec.status, message=f"{type(e).__name__}: {e}")
    return False


async def _non_stream(resp: aiohttp.ClientResponse, rec: RequestRecord, parser: StreamParser) -> None:
    """A 2xx answer that is not SSE: accept a whole OpenAI JSON body (server ignored ``stream``),
    classify anything else (an HTML page, a JSON without ``choices``) as a protocol failure."""
    raw = await resp.read()
    t = _now()
    rec.first_byte_ns = t if raw else None
    rec.end_ns = t
    try:
        ev = orjson.loads(raw)
    except orjson.JSONDecodeError:
        ev = None
    if isinstance(ev, dict) and ("choices" in ev or "error" in ev or ev.get("object") == "error"):
        rec.first_event_ns = t
        rec.events = 1
        apply_event(rec, ev, t, parser)
        if rec.failure is None and rec.finish_reason_raw is None and not rec.content:
            rec.failure = FailureClass.PROTOCOL
        return
    rec.failure = FailureClass.PROTOCOL
    ctype = resp.headers.get("Content-Type", "?")
    rec.error = WireError(
        status=rec.status,
        message=f"not an OpenAI-compatible response (Content-Type {ctype}): " + raw[:120].decode("utf-8", "replace"),
    )


def finalize(rec: RequestRecord) -> None:
    """Fill token counts from ``usage`` (the source of truth) after the stream ended.

    ``output_tokens_source`` says where the output count came from: ``usage`` (server), or, when no
    usage arrived, ``chunks`` (one token per token-carrying event — a lower bound when engines
    send several tokens per chunk). :func:`servelab.bench.tokens.cross_check` later adds the client
    tokenizer count, and replaces the ``chunks`` fallback with ``tokenizer`` when one is available.
    """
    if rec.tool_calls:
        finalize_tool_calls(rec)
    u = rec.usage
    if u:  # chat/completions usage, or the Messages/Responses API's own (servelab.wire.apis.usage_counts)
        pt, ct, cached = usage_counts(u)
        if pt is not None:
            rec.prompt_tokens = pt
        if ct is not None:
            rec.output_tokens = ct
            rec.output_tokens_source = "usage"
        if cached is not None:
            rec.cached_tokens = cached  # absent = unknown, never 0 (case 22)
    if rec.output_tokens is None and rec.chunk_ns:
        rec.output_tokens = len(rec.chunk_ns)
        rec.output_tokens_source = "chunks"
    elif rec.output_tokens is None:
        rec.output_tokens = 0 if rec.failure is None else None
        rec.output_tokens_source = "chunks" if rec.failure is None else None
