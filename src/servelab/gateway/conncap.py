"""Who holds a gateway port's connections: the state its connections share (:class:`PortGuard`) and the
connection cap, kept by :class:`CappedHandler`, the layer of :class:`~servelab.gateway.listener.GuardedHandler`
that counts, sheds and refuses connections; :mod:`servelab.gateway.listener` adds the timeouts and the
quiet error handling on top.

**Connection cap** ``max_connections`` per port, and ``max_connections_per_client`` per client address
(the TCP peer; behind a proxy listed in ``trusted_proxies``, the client that proxy names in
``X-Forwarded-For``, :mod:`servelab.gateway.clientip`). A connection is *header-incomplete* while
nothing of it is being handled: idle (waiting for a request's first byte) or part of a request line or
header block sent. A new connection from an address at its own cap closes that address's oldest
header-incomplete connection, else gets a one-line 429 and is closed. A new connection at the port's
cap closes the oldest header-incomplete connection of the address holding the most connections (the
next biggest holder when that one has none), else gets a one-line 503 and is closed at once, so the
process never runs out of descriptors (:mod:`servelab.gateway.fdbudget`) and a flood of half-open
connections (one byte each, re-opened as they close) cannot lock real clients out: each real request
sends its headers at once and is no longer sheddable, while the flood sheds itself. nginx keeps the
same two bounds as ``limit_conn`` per ``$binary_remote_addr`` (no default) and ``worker_connections``
(reusing idle connections when they run out); Envoy bounds the process with its overload manager
(``envoy.resource_monitors.downstream_connections``) and a listener with its ``connection_limit``
filter, neither per address (docs/gateway-design.md compares the defaults). A proxy's connection is
counted under the proxy until its request's headers name the client (it cannot be checked at accept);
then, over the client's cap, that request gets the 429
(:meth:`~servelab.gateway.listener.GuardedHandler.handle_error` answers :class:`ClientCapExceeded`).

Uses these aiohttp internals (checked against aiohttp 3.14.5): ``RequestHandler._manager``,
``_messages``, ``_waiter``, ``_force_close``; tests/gateway/test_connection_flood.py fails if an
aiohttp upgrade changes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, cast

from aiohttp.web_protocol import RequestHandler
from aiohttp.web_server import Server

from servelab.gateway import clientip
from servelab.gateway.malformed import raw_response as _raw_response
from servelab.gateway.portsettings import ListenerSettings
from servelab.gateway.ratelog import RateLimitedLog

__all__ = ["EVENTS", "CappedHandler", "ClientCapExceeded", "PortGuard", "client_cap_message", "peer_address"]

#: the listener's logger (the lines of a port's connections are logged under one name)
log = logging.getLogger("servelab.gateway.listener")

#: reasons passed to ``on_event``
EVENTS = (
    "idle_timeout",
    "header_timeout",
    "body_timeout",
    "refused",
    "evicted",
    "bad_request",
    "send_timeout",
    "client_refused",
)


class PortGuard:
    """State shared by every connection of one port: settings, the rate-limited log, the event hook."""

    __slots__ = ("settings", "ratelog", "on_event", "refusal", "client_refusal", "counts", "clients", "open", "trusted")

    def __init__(
        self,
        settings: ListenerSettings,
        on_event: Callable[[str, str], None] | None,
        trusted_proxies: tuple[str, ...] = (),
    ) -> None:
        self.settings = settings
        self.ratelog = RateLimitedLog(log)
        self.on_event = on_event
        self.counts = dict.fromkeys(EVENTS, 0)
        self.refusal = _raw_response(
            503,
            "Service Unavailable",
            "this gateway has too many open connections; retry in 1 s",
            "too_many_connections",
            "server_error",
            "Retry-After: 1\r\n",
        )
        self.client_refusal = _raw_response(
            429,
            "Too Many Requests",
            client_cap_message(settings),
            "too_many_connections",
            "rate_limit_error",
            "Retry-After: 1\r\n",
        )
        #: client address -> its open connections, oldest first (a dict used as an ordered set)
        self.clients: dict[str, dict[CappedHandler, None]] = {}
        self.open = 0  # connections registered in ``clients``
        self.trusted = clientip.trusted_networks(tuple(trusted_proxies))

    def shed_victim(self) -> CappedHandler | None:
        """The oldest header-incomplete connection of the biggest holder that has one, or None."""
        if not self.clients:
            return None
        biggest = max(self.clients.values(), key=len)
        victim = _oldest_sheddable(biggest)
        if victim is not None:
            return victim
        for conns in sorted(self.clients.values(), key=len, reverse=True):
            victim = _oldest_sheddable(conns) if conns is not biggest else None
            if victim is not None:
                return victim
        return None

    def event(self, reason: str) -> None:
        self.counts[reason] += 1
        if self.on_event is not None:
            try:
                self.on_event(self.settings.name, reason)
            except Exception as e:  # noqa: BLE001 — a metrics bug must not break connection handling
                log.debug("listener on_event failed: %r", e)


def client_cap_message(s: ListenerSettings) -> str:
    return (
        f"this client address has {s.max_connections_per_client} connections open to the gateway "
        f"(server.max_connections_per_client); reuse or close them, retry in 1 s"
    )


class ClientCapExceeded(Exception):
    """Marks a request refused by the per-client connection cap (behind a trusted proxy)."""


def _sheddable(h: CappedHandler) -> bool:
    """True when ``h`` is header-incomplete (idle or part of a request's head sent; nothing of it handled)."""
    return (
        not h._force_close
        and (h._g_idle or h._g_hdr_at > 0)
        and not h._messages
        and h._waiter is not None
        and not h._waiter.done()
    )


def _oldest_sheddable(conns: dict[CappedHandler, None]) -> CappedHandler | None:
    for h in conns:  # insertion order: oldest first
        if _sheddable(h):
            return h
    return None


def peer_address(transport: Any) -> str:
    try:
        p = transport.get_extra_info("peername") if transport is not None else None
    except Exception:  # noqa: BLE001 — no peer name is not an error
        p = None
    return str(p[0]) if isinstance(p, (tuple, list)) and p else "?"


class CappedHandler(RequestHandler):
    """aiohttp's per-connection protocol counted under the port's connection cap (module doc): at accept
    it sheds a header-incomplete connection or refuses this one; it is counted for its client address
    until it is lost. Header-incomplete is read from ``_g_idle`` and ``_g_hdr_at``, which the timeouts'
    layer (:class:`~servelab.gateway.listener.GuardedHandler`) keeps."""

    __slots__ = ("_g", "_g_hdr_at", "_g_idle", "_g_key", "_g_peer", "_g_proxy")

    def __init__(self, manager: Server, guard: PortGuard, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._g = guard
        self._g_hdr_at = 0.0  # deadline of the current request's headers; 0 = not waiting for headers
        self._g_idle = True  # no byte of a next request since accept / the last response (evictable)
        self._g_key: str | None = None  # the client address this connection counts for (None: not counted)
        self._g_peer = "?"
        self._g_proxy = False  # the peer is a trusted proxy: the client is named by X-Forwarded-For

    # ------------------------------------------------------------------ accept: the cap
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        g = self._g
        peer = self._g_peer = peer_address(transport)
        self._g_proxy = clientip.is_trusted(peer, g.trusted)
        if self._manager is not None:
            per_client = g.settings.max_connections_per_client
            mine = g.clients.get(peer)
            if per_client and not self._g_proxy and mine is not None and len(mine) >= per_client:
                victim = _oldest_sheddable(mine)
                if victim is None:
                    self._refuse(transport, per_client=True)
                    return
                victim._g_shed()
            if g.open >= g.settings.max_connections:
                victim = g.shed_victim()
                if victim is None:
                    self._refuse(transport)
                    return
                victim._g_shed()
        super().connection_made(transport)
        self._g_rekey(peer)

    # ------------------------------------------------------------------ who holds the connections
    def _g_rekey(self, key: str) -> None:
        """Count this connection for client address ``key`` (newest of that address's connections)."""
        if key == self._g_key:
            return
        self._g_forget()
        g = self._g
        self._g_key = key
        g.clients.setdefault(key, {})[self] = None
        g.open += 1

    def _g_forget(self) -> None:
        """Stop counting this connection (idempotent: shed, then lost)."""
        key, self._g_key = self._g_key, None
        if key is None:
            return
        g = self._g
        g.open -= 1
        conns = g.clients.get(key)
        if conns is not None:
            conns.pop(self, None)
            if not conns:
                del g.clients[key]

    def _g_shed(self) -> None:
        """Close this header-incomplete connection to make room for a new one."""
        self._g_forget()
        self.force_close()
        self._g.event("evicted")

    def _refuse(self, transport: asyncio.BaseTransport, per_client: bool = False) -> None:
        """Answer a one-line 503 (the port's cap) or 429 (the address's cap) and close, without
        registering the connection or starting a task."""
        g = self._g
        self._manager = None  # connection_lost then does nothing
        with contextlib.suppress(Exception):  # a TCP transport: it writes, unless the peer is already gone
            cast(asyncio.WriteTransport, transport).write(g.client_refusal if per_client else g.refusal)
        transport.close()
        if per_client:
            g.event("client_refused")
            g.ratelog(
                "%s port: refused a connection from %s: it has %d connections open "
                "(server.max_connections_per_client), none header-incomplete",
                g.settings.name,
                self._g_peer,
                g.settings.max_connections_per_client,
            )
            return
        g.event("refused")
        g.ratelog(
            "%s port: refused a connection from %s: %d connections open (server.%s); header-incomplete "
            "ones are closed first, none was",
            g.settings.name,
            self._g_peer,
            g.settings.max_connections,
            "max_connections" if g.settings.name == "api" else "admin_max_connections",
        )

    def connection_lost(self, exc: BaseException | None) -> None:
        self._g_forget()
        super().connection_lost(exc)
