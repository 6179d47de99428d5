"""The gateway's file-descriptor budget: how many client connections a port may hold, and how to tell
our own fd exhaustion from a broken engine.

Every client connection costs one descriptor, and while its request is proxied a second one to the
engine (plus, briefly, Redis/PostgreSQL connections); health checks, the ledger, log files, the event
loop and the listening sockets need a few more. A reverse proxy can therefore hold at most about half
its descriptor limit in client connections (nginx: "each proxied request ties up one slot on the client
side and one on the upstream side", and ``worker_rlimit_nofile`` must be at least twice
``worker_connections`` plus headroom; https://www.netdata.cloud/guides/nginx/nginx-worker-connections-are-not-enough/
and https://nginx.org/en/docs/ngx_core_module.html#worker_rlimit_nofile, checked 2026-12-01).
:func:`default_max_connections` applies that rule to ``RLIMIT_NOFILE``.

:func:`is_local_resource_error` recognises EMFILE/ENFILE/ENOBUFS/ENOMEM anywhere in an exception's
chain (aiohttp wraps the ``OSError`` of ``socket()``/``connect()`` in ``ClientConnectorError.os_error``):
such a failure is this process's problem, so it must never count against an engine's breaker.
"""

from __future__ import annotations

import errno

__all__ = ["FD_RESERVE", "LOCAL_ERRNOS", "default_max_connections", "is_local_resource_error", "nofile_limit"]

#: descriptors kept back for everything that is not a client connection (health checks, ledger, Redis,
#: logs, listening sockets, the event loop, imported extension modules)
FD_RESERVE = 64
#: errno values that mean "this process or host ran out of a resource", not "the peer failed"
LOCAL_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def nofile_limit() -> int:
    """The soft ``RLIMIT_NOFILE`` of this process (descriptors); ``1 << 20`` when unlimited or unknown
    (no :mod:`resource` module)."""
    try:
        import resource
    except ImportError:  # not POSIX
        return 1 << 20
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return 1 << 20 if soft == resource.RLIM_INFINITY or soft <= 0 else int(soft)


def default_max_connections(nofile: int, admin_max_connections: int = 0, reserve: int = FD_RESERVE) -> int:
    """Client connections the API port may hold when ``server.max_connections`` is not set:
    ``(nofile - reserve - admin_max_connections) // 2`` (one upstream descriptor per proxied client
    connection, see the module doc), at least 8. ``nofile``: the descriptor limit (:func:`nofile_limit`).
    Example: ``ulimit -n 1024`` and 32 admin connections -> 464."""
    return max(8, (int(nofile) - reserve - max(0, admin_max_connections)) // 2)


def is_local_resource_error(exc: BaseException | None) -> bool:
    """True when ``exc`` or an exception it wraps (``os_error``, ``__cause__``, ``__context__``; at most
    8 links) is an :class:`OSError` whose errno is in :data:`LOCAL_ERRNOS` (too many open files in this
    process or the system, no buffer space, no memory)."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno in LOCAL_ERRNOS:
            return True
        inner = getattr(exc, "os_error", None)
        if isinstance(inner, OSError) and inner.errno in LOCAL_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False
