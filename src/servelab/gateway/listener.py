"""Connection discipline for the gateway's listening ports (API and admin), as a trusted edge proxy keeps it.

aiohttp's server has a keep-alive timeout but no header or body timeout, no cap on connections, and it
logs a parser error as an ERROR traceback that holds the offending bytes (an ``Authorization`` header
over 8,190 bytes, i.e. the API key) and answers a 400 that echoes them. :class:`GuardedRunner` is an
:class:`aiohttp.web.AppRunner` whose connections are :class:`GuardedHandler` s (a subclass of aiohttp's
:class:`~aiohttp.web_protocol.RequestHandler`) adding:

- **Header timeout** ``header_timeout_s``: from accept, or from the first byte of a request on a
  kept-alive connection, until its headers are complete; then 408 (when some bytes came) or a plain
  close, like nginx ``client_header_timeout`` (default 60 s; "If a client does not transmit the entire
  header within this time, the request is terminated with the 408 (Request Time-out) error",
  https://nginx.org/en/docs/http/ngx_http_core_module.html#client_header_timeout) and Envoy
  ``request_headers_timeout`` (https://www.envoyproxy.io/docs/envoy/v1.39.0/faq/configuration/timeouts,
  both checked 2026-12-01).
- **Body timeouts**: ``body_timeout_s`` between two reads of the body (nginx ``client_body_timeout``:
  "set only for a period between two successive read operations"), and ``body_total_timeout_s`` for
  the whole body (a client dripping one byte just inside the gap cannot hold a connection for hours;
  Apache ``mod_reqtimeout``'s body limit plays that role). A ``Content-Length`` larger than what is sent
  ends here. While the gateway itself is not reading (aiohttp paused the socket because the handler
  has not consumed the buffer yet) the gap does not run.
- **Send timeout** ``send_timeout_s``: a client that reads nothing of its response for this long is cut
  (the transport aborted, so the handler is cancelled and its upstream response closed, which frees the
  engine's slot), like nginx ``send_timeout`` (default 60 s; "set only between two successive write
  operations ... If the client does not receive anything within this time, the connection is closed",
  https://nginx.org/en/docs/http/ngx_http_core_module.html#send_timeout, checked 2026-12-01). The timer
  runs only while the transport's write buffer is above its high-water mark (asyncio's
  ``pause_writing``) and stops at ``resume_writing``; when it fires and the buffer has shrunk since it
  was armed (the client took some bytes) it is armed again, so a slow client that keeps reading is never
  cut, and a stream whose client keeps up costs no timer at all.
- **Keep-alive idle timeout** ``keepalive_timeout_s``: aiohttp's own ``keepalive_timeout`` (nginx
  ``keepalive_timeout`` 75 s; Envoy ``idle_timeout`` 1 h).
- **Connection cap** ``max_connections`` per port and ``max_connections_per_client`` per client address
  (behind a trusted proxy, the client its ``X-Forwarded-For`` names), header-incomplete connections
  shed first, else a one-line 503 or 429: :class:`~servelab.gateway.conncap.CappedHandler`, the layer
  below :class:`GuardedHandler` (:mod:`servelab.gateway.conncap` has the rule and how nginx and Envoy
  bound the same).
- **Parser errors** (:class:`aiohttp.http_exceptions.BadHttpMessage`, ``LineTooLong``, ...): one log line
  naming the kind of error and the peer address, never a header or body byte, at most
  :data:`LOG_BURST` lines per :data:`LOG_WINDOW_S` (the next line logged says how many were suppressed; the
  ``connection_events_total`` metric counts every one);
  the client gets an OpenAI-shaped 400 with a fixed message, never its own bytes. A handler exception
  (500) is logged as one line with its class and the code location, without its message (it may hold
  request data).

Cost on the hot path: one timer per request for its headers (none when the headers arrive in the
first read, the usual case), one per body that does not arrive in one read, and a time stamp per body
read; nothing at all while a response streams. Timeouts, refusals and evictions are reported through
``on_event(port_name, reason)`` (reasons: :data:`EVENTS`) for metrics.

Uses these aiohttp internals (checked against aiohttp 3.14.5): ``RequestHandler._manager``,
``_messages``, ``_request_count``, ``_waiter``, ``_current_request``, ``_force_close``,
``_reading_paused``/``_buffer_paused``, ``_next_keepalive_close_time``,
``Server._connections``/``_kwargs``/``_loop``, ``web_protocol._ErrInfo`` (a queued request answered by
:meth:`GuardedHandler.handle_error`); the attack tests (tests/gateway/test_hostile_connections.py,
tests/gateway/test_connection_flood.py) fail if an aiohttp upgrade changes them.

A port's limits and how they follow from the config are in :mod:`servelab.gateway.portsettings`, the log
budget in :mod:`servelab.gateway.ratelog`, what is said about a malformed request in
:mod:`servelab.gateway.malformed`, who holds a port's connections (the shared :class:`PortGuard`, the
cap) in :mod:`servelab.gateway.conncap`; this module keeps the timeouts, the error handling and the
runner.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import sys
from collections.abc import Callable
from typing import Any, cast

from aiohttp import http_exceptions as hx
from aiohttp import web
from aiohttp.streams import EMPTY_PAYLOAD
from aiohttp.web_protocol import RequestHandler, _ErrInfo
from aiohttp.web_server import Server

from servelab.gateway import clientip
from servelab.gateway.conncap import (
    EVENTS,
    CappedHandler,
    ClientCapExceeded,
    PortGuard,
    client_cap_message,
    peer_address,
)
from servelab.gateway.errors import openai_error_body
from servelab.gateway.malformed import describe_parse_error
from servelab.gateway.malformed import raw_response as _raw_response
from servelab.gateway.malformed import where as _where
from servelab.gateway.portsettings import ListenerSettings, default_per_client, settings_for
from servelab.gateway.ratelog import LOG_BURST, LOG_WINDOW_S, RateLimitedLog

__all__ = [
    "EVENTS",
    "LOG_BURST",
    "LOG_WINDOW_S",
    "GuardedHandler",
    "GuardedRunner",
    "ListenerSettings",
    "RateLimitedLog",
    "default_per_client",
    "describe_parse_error",
    "settings_for",
]

log = logging.getLogger("servelab.gateway.listener")

if sys.platform == "linux":
    import fcntl
    import termios

    #: the ioctl that reads a TCP socket's send queue (Linux SIOCOUTQ == TIOCOUTQ, man 7 tcp)
    _SIOCOUTQ: int | None = termios.TIOCOUTQ
else:  # elsewhere only the transport's own buffer counts
    _SIOCOUTQ = None


class GuardedHandler(CappedHandler):
    """aiohttp's per-connection protocol with the header/body timeouts, the connection cap
    (:class:`~servelab.gateway.conncap.CappedHandler`) and the quiet parser-error handling of this module
    (see the module doc). Built by :class:`_GuardedServer`."""

    __slots__ = (
        "_g_timer",
        "_g_due",
        "_g_body",
        "_g_body_last",
        "_g_body_end",
        "_g_send_timer",
        "_g_send_left",
    )

    def __init__(self, manager: Server, guard: PortGuard, **kwargs: Any) -> None:
        super().__init__(manager, guard, **kwargs)
        self._g_timer: asyncio.TimerHandle | None = None
        self._g_due = 0.0
        self._g_body: Any = None  # the StreamReader of a body still arriving
        self._g_body_last = 0.0
        self._g_body_end = 0.0
        self._g_send_timer: asyncio.TimerHandle | None = None  # armed only while writing is paused
        self._g_send_left = (0, 0)  # _g_unsent() when that timer was armed

    # ------------------------------------------------------------------ accept and loss: the timers
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # the cap: counted, or refused (then no transport)
        if self.transport is None:
            return
        self._g_hdr_at = self._loop.time() + self._g.settings.header_timeout_s
        self._g_arm(self._g_hdr_at)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._g_timer is not None:
            self._g_timer.cancel()
            self._g_timer = None
        if self._g_send_timer is not None:
            self._g_send_timer.cancel()
            self._g_send_timer = None
        self._g_body = None
        super().connection_lost(exc)  # no longer counted (CappedHandler)

    # ------------------------------------------------------------------ a client behind a trusted proxy
    def _g_proxied_client(self) -> None:
        """Behind a trusted proxy, once a request's headers are complete: count the connection for the
        client its ``X-Forwarded-For`` names, and answer that request 429 when the client is over its cap."""
        g = self._g
        head = self._messages[-1][0] if self._messages else None
        headers = getattr(head, "headers", None)
        if headers is None:  # a parser error: answered by handle_error
            return
        client = clientip.client_ip(self._g_peer, headers.getall("X-Forwarded-For", ()), g.trusted)
        self._g_rekey(client)
        cap = g.settings.max_connections_per_client
        if cap and client != self._g_peer and len(g.clients[client]) > cap:
            self._messages[-1] = (_ErrInfo(status=429, exc=ClientCapExceeded(), message=""), EMPTY_PAYLOAD)
            self._g_body = None

    # ------------------------------------------------------------------ reads: header and body progress
    def data_received(self, data: bytes) -> None:
        if self._manager is None:
            return
        if self._g_idle and data:  # the first byte of the next request
            self._g_idle = False
            if not self._g_hdr_at:
                self._g_hdr_at = self._loop.time() + self._g.settings.header_timeout_s
                self._g_arm(self._g_hdr_at)
            # from now on the header timeout governs, not aiohttp's keep-alive timer (which would close
            # the connection silently mid-headers); aiohttp re-checks this time when its timer fires
            self._next_keepalive_close_time = max(self._next_keepalive_close_time, self._g_hdr_at + 1.0)
        n = self._request_count
        super().data_received(data)
        if self._request_count != n:  # the headers of one or more requests are complete
            self._g_hdr_at = 0.0
            payload = self._messages[-1][1] if self._messages else None
            if payload is not None and payload is not EMPTY_PAYLOAD and not payload.is_eof():
                s = self._g.settings
                now = self._loop.time()
                self._g_body, self._g_body_last, self._g_body_end = payload, now, now + s.body_total_timeout_s
                self._g_arm(min(now + s.body_timeout_s, self._g_body_end))
            else:
                self._g_body = None
            if self._g_proxy:
                self._g_proxied_client()
        elif self._g_body is not None:
            if self._g_body.is_eof():
                self._g_body = None
            else:
                self._g_body_last = self._loop.time()

    async def finish_response(self, request: Any, resp: Any, start_time: float | None) -> Any:
        res = await super().finish_response(request, resp, start_time)
        if self._g_body is None or self._g_body.is_eof():
            # idle until the next request's first byte (aiohttp's keep-alive timer runs); a body still
            # arriving (aiohttp reads and drops it, "lingering") stays under the body timeouts
            self._g_body = None
            self._g_idle = True
            self._g_hdr_at = 0.0
            if self._g_proxy and self._g_key is not None:
                self._g_rekey(self._g_peer)  # idle again: the proxy's, not the last client's
        return res

    # ------------------------------------------------------------------ writes: the send timeout
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._g_send_timer is None and self._manager is not None:
            self._g_send_arm()

    def _g_unsent(self) -> tuple[int, int]:
        """(bytes in the transport's buffer, bytes in the kernel's send queue): on Linux ``SIOCOUTQ``
        (unsent + unacknowledged, man 7 tcp), else 0. Either shrinking means the client took bytes: the
        kernel's when it reads (and, with a large loopback send buffer, long before the transport's
        shrinks); the transport's when the kernel takes more. aiohttp may add to the transport's buffer
        while writing is paused, and the kernel's grows as it takes from the transport, so each is
        compared on its own."""
        tr = self.transport
        if tr is None:
            return (0, 0)
        n = tr.get_write_buffer_size()
        k = 0
        sock = tr.get_extra_info("socket")
        if _SIOCOUTQ is not None and sock is not None:
            with contextlib.suppress(OSError, ValueError):
                k = struct.unpack("i", fcntl.ioctl(sock.fileno(), _SIOCOUTQ, b"\0\0\0\0"))[0]
        return (n, k)

    def _g_send_arm(self) -> None:
        self._g_send_left = self._g_unsent()
        self._g_send_timer = self._loop.call_later(self._g.settings.send_timeout_s, self._g_send_expired)

    def resume_writing(self) -> None:
        if self._g_send_timer is not None:
            self._g_send_timer.cancel()
            self._g_send_timer = None
        super().resume_writing()

    def _g_send_expired(self) -> None:
        self._g_send_timer = None
        now = self._g_unsent()
        if self.transport is not None and (now[0] < self._g_send_left[0] or now[1] < self._g_send_left[1]):
            self._g_send_arm()  # some bytes left for the client since: it reads, slowly (not cut)
            return
        g = self._g
        g.event("send_timeout")
        g.ratelog(
            "%s port: cut a connection from %s: it read nothing of its response for %g s (server.send_timeout_s)",
            g.settings.name,
            peer_address(self.transport),
            g.settings.send_timeout_s,
        )
        if self.transport is not None:
            self.transport.abort()  # connection_lost cancels the handler: its upstream is closed

    # ------------------------------------------------------------------ the one timer
    def _g_arm(self, when: float) -> None:
        """Make sure the check runs no later than ``when`` (loop time); an earlier timer is kept."""
        t = self._g_timer
        if t is not None:
            if self._g_due <= when:
                return
            t.cancel()
        self._g_due = when
        self._g_timer = self._loop.call_at(when, self._g_check)

    def _g_check(self) -> None:
        self._g_timer = None
        if self._manager is None or self._force_close or self.transport is None:
            return
        s = self._g.settings
        now = self._loop.time()
        nxt = 0.0
        if self._g_hdr_at:
            if now < self._g_hdr_at:
                nxt = self._g_hdr_at
            elif self._waiter is not None and not self._waiter.done():  # nothing else in progress
                if self._g_idle:  # not a byte came: close quietly (counted, not logged)
                    self._g.event("idle_timeout")
                    self.force_close()
                    return
                self._timeout(
                    "header_timeout",
                    f"the request headers did not arrive within "
                    f"{s.header_timeout_s:g} s; send the whole request without pauses",
                    answer=True,
                )
                return
            else:  # a request is being handled (pipelining): the keep-alive timer covers what follows
                self._g_hdr_at = 0.0
        body = self._g_body
        if body is not None:
            if body.is_eof():
                self._g_body = None
            else:
                if self._reading_paused or self._buffer_paused:  # we are not reading: not the client's fault
                    self._g_body_last = now
                gap_at = self._g_body_last + s.body_timeout_s
                if now >= gap_at or now >= self._g_body_end:
                    req = self._current_request
                    answer = req is not None and req.writer is not None and req.writer.output_size == 0
                    limit = (
                        f"{s.body_timeout_s:g} s between two reads"
                        if now >= gap_at
                        else f"{s.body_total_timeout_s:g} s in all"
                    )
                    self._timeout(
                        "body_timeout",
                        f"the request body did not arrive in time ({limit}; is "
                        "Content-Length larger than the body?); send the whole body at once",
                        answer=answer,
                    )
                    return
                due = min(gap_at, self._g_body_end)
                nxt = due if not nxt else min(nxt, due)
        if nxt:
            self._g_arm(nxt)

    def _timeout(self, reason: str, message: str, answer: bool) -> None:
        g = self._g
        g.event(reason)
        g.ratelog(
            "%s port: closed a connection from %s: %s",
            g.settings.name,
            peer_address(self.transport),
            reason.replace("_", " "),
        )
        if answer and self.transport is not None:
            with contextlib.suppress(Exception):
                self.transport.write(_raw_response(408, "Request Timeout", message, "request_timeout"))
        self.force_close()

    # ------------------------------------------------------------------ errors: one quiet line
    def handle_error(
        self, request: Any, status: int = 500, exc: BaseException | None = None, message: str | None = None
    ) -> web.StreamResponse:
        """The response for a parser error (400) or a handler that raised (500) / timed out (504): an
        OpenAI error with a fixed message, ``Connection: close``; one rate-limited log line without
        any request byte. Raises :class:`ConnectionError` when a response was already being sent
        (as aiohttp's own)."""
        g = self._g
        peer = peer_address(self.transport)
        if isinstance(exc, ClientCapExceeded):
            text, code, typ = client_cap_message(g.settings), "too_many_connections", "rate_limit_error"
            g.event("client_refused")
            g.ratelog(
                "%s port: refused a request from %s (via proxy %s): over server.max_connections_per_client",
                g.settings.name,
                self._g_key,
                peer,
            )
        elif isinstance(exc, hx.HttpProcessingError) or (status == 400 and exc is None):
            text, code = describe_parse_error(exc, self.max_field_size)
            g.event("bad_request")
            g.ratelog(
                "%s port: rejected a malformed request from %s: %s (%s)",
                g.settings.name,
                peer,
                type(exc).__name__ if exc is not None else "error",
                code,
            )
            typ = "invalid_request_error"
            status = exc.code if isinstance(exc, hx.HttpProcessingError) and 400 <= exc.code < 500 else 400
        elif isinstance(exc, ConnectionError):  # the client went away (or a timeout closed it) mid-request
            log.debug("%s port: client gone during a request (%s)", g.settings.name, type(exc).__name__)
            text, code, typ = "the connection was closed", "client_disconnect", "invalid_request_error"
        elif status == 504:
            text, code, typ = (
                "the gateway did not finish this request in time; retry",
                "gateway_timeout",
                "server_error",
            )
            g.ratelog("%s port: a request handler timed out (peer %s)", g.settings.name, peer)
        else:
            text, code, typ = "the gateway failed on this request; retry", "internal_error", "server_error"
            g.ratelog(
                "%s port: unhandled %s at %s (peer %s)",
                g.settings.name,
                type(exc).__name__ if exc is not None else "error",
                _where(exc) if exc is not None else "?",
                peer,
            )
        if request.writer.output_size > 0:
            raise ConnectionError("a response was already being sent; cannot send the error response")
        resp = web.Response(status=status, body=openai_error_body(text, typ, code), content_type="application/json")
        if status == 429:
            resp.headers["Retry-After"] = "1"
        resp.force_close()
        return resp

    def log_exception(self, *args: Any, **kw: Any) -> None:
        """aiohttp's other exception logs (``Unhandled exception`` in its loop): one line, class only."""
        exc = kw.get("exc_info")
        name = type(exc).__name__ if isinstance(exc, BaseException) else "error"
        self._g.ratelog(
            "%s port: connection error %s (%s)", self._g.settings.name, name, str(args[0])[:80] if args else ""
        )


class _GuardedServer(Server):
    """aiohttp's low-level :class:`~aiohttp.web_server.Server` building :class:`GuardedHandler` s."""

    _guard: PortGuard

    def __call__(self) -> RequestHandler:
        return GuardedHandler(self, self._guard, loop=self._loop, **self._kwargs)


class GuardedRunner(web.AppRunner):
    """An :class:`aiohttp.web.AppRunner` for ``app`` whose connections follow ``settings`` (module doc).

    ``on_event(port_name, reason)``: called for every timeout, refusal, eviction and malformed request
    (reasons: :data:`EVENTS`); ``trusted_proxies``: ``server.trusted_proxies`` (whose ``X-Forwarded-For`` names
    the client a per-client cap counts). Other keyword arguments go to :class:`aiohttp.web.AppRunner`
    (``keepalive_timeout`` is taken from ``settings``). :attr:`counts`: events so far by reason;
    :meth:`connections`: open connections now."""

    def __init__(
        self,
        app: web.Application,
        settings: ListenerSettings,
        *,
        on_event: Callable[[str, str], None] | None = None,
        trusted_proxies: tuple[str, ...] = (),
        **kwargs: Any,
    ) -> None:
        kwargs["keepalive_timeout"] = settings.keepalive_timeout_s
        # aiohttp would inflate a compressed request body in the loop, before the handler could refuse it;
        # bodies are inflated (or refused) by servelab.gateway.bodies instead
        kwargs.setdefault("auto_decompress", False)
        super().__init__(app, **kwargs)
        self.guard = PortGuard(settings, on_event, trusted_proxies)

    def set_trusted_proxies(self, cidrs: tuple[str, ...]) -> None:
        """Use ``server.trusted_proxies`` ``cidrs`` (validated) for connections accepted from now on."""
        self.guard.trusted = clientip.trusted_networks(tuple(cidrs))

    @property
    def counts(self) -> dict[str, int]:
        """Events so far by reason (:data:`EVENTS`)."""
        return dict(self.guard.counts)

    def connections(self) -> int:
        """Client connections open on this runner now."""
        srv = self.server
        return len(srv._connections) if srv is not None else 0

    async def _make_server(self) -> Server:
        srv = await super()._make_server()
        srv.__class__ = _GuardedServer  # same state, only the protocol factory differs
        guarded = cast(_GuardedServer, srv)
        guarded._guard = self.guard
        return guarded
