"""Upstream POSTs over pooled keep-alive connections, sent again on a fresh connection when the pooled one
turns out to be already closed by the engine.

llama-server closes its connection after every stream, just after the stream's last chunk (its chunked
content provider returns false once done, and cpp-httplib then closes), so the gateway's next request can
take that connection from the pool before its FIN is seen. The engine's close then shows, before any
response header, as ``ServerDisconnectedError`` (no answer at all) or, on a pooled connection, as a
``ClientOSError`` while writing the body (EPIPE/ECONNRESET). The engine never read that request, so a
fresh connection is no retry of it. nginx likewise gives a failed cached upstream connection one more try
(ngx_http_upstream.c, ``u->peer.cached``). A refused connect (``ClientConnectorError``) is never stale.
"""

from __future__ import annotations

from typing import Any

import aiohttp

from servelab.gateway.timeline import CURRENT, Timeline

#: what a POST to an engine raises when its connection fails (connect, write or read before the headers)
CONNECT_ERRORS = (aiohttp.ClientConnectionError, ConnectionError, OSError)
#: sends of one request at most: two stale pooled connections in a row, then a fresh one
MAX_SENDS = 3


def stale_connection(e: BaseException, tl: Timeline) -> bool:
    """Whether ``e``, raised before any response header, means the connection was one the engine had
    already closed (module doc); ``tl``: the request's timeline, whose latest ``connected`` event says
    whether the connection came from the pool."""
    if isinstance(e, aiohttp.ServerDisconnectedError):
        return True
    return (
        isinstance(e, aiohttp.ClientOSError)
        and not isinstance(e, aiohttp.ClientConnectorError)
        and tl.last_connection_reused()
    )


async def post(session: aiohttp.ClientSession, url: str, tl: Timeline, **kwargs: Any) -> aiohttp.ClientResponse:
    """``session.post(url, **kwargs)`` with its connection recorded in ``tl`` (``connected``, from the
    session's :class:`~servelab.gateway.timeline.TimedConnector`), sent again on another connection when
    the one taken was stale (:func:`stale_connection`), at most :data:`MAX_SENDS` times in all. Raises what
    the last send raised (:data:`CONNECT_ERRORS`, TimeoutError)."""
    token = CURRENT.set(tl)
    try:
        for n in range(MAX_SENDS):
            try:
                return await session.post(url, **kwargs)
            except CONNECT_ERRORS as e:
                if n == MAX_SENDS - 1 or not stale_connection(e, tl):
                    raise
        raise AssertionError("unreachable: the last send returns or raises")
    finally:
        CURRENT.reset(token)
