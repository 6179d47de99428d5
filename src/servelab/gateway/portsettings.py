"""Limits of one listening port of the gateway (:class:`ListenerSettings`) and how they follow from the
config's ``server`` section and the process's descriptor limit (:func:`settings_for`); the listener
(:mod:`servelab.gateway.listener`) enforces them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

__all__ = ["ListenerSettings", "default_per_client", "settings_for"]

log = logging.getLogger("servelab.gateway.listener")


@dataclass(frozen=True, slots=True)
class ListenerSettings:
    """Limits of one listening port. ``name``: ``"api"`` or ``"admin"`` (logs, metrics). Times in
    seconds (> 0); ``max_connections``: open client connections on this port (>= 1);
    ``max_connections_per_client``: open connections of one client address (0 = only the port's cap)."""

    name: str
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    body_total_timeout_s: float = 120.0
    keepalive_timeout_s: float = 30.0
    max_connections: int = 512
    send_timeout_s: float = 60.0
    max_connections_per_client: int = 0


def settings_for(server: Any, name: str, nofile: int | None = None) -> ListenerSettings:
    """:class:`ListenerSettings` of port ``name`` (``"api"`` or ``"admin"``) from a config's ``server``
    section (:class:`servelab.gateway.config.ServerSection`). The API port's cap defaults to
    :func:`servelab.gateway.fdbudget.default_max_connections` of ``nofile`` (default: this process's
    ``RLIMIT_NOFILE``), its per-client cap to ``server.max_connections_per_client`` or half the port's cap
    (:func:`default_per_client`); the admin port has no per-client cap."""
    from servelab.gateway.fdbudget import default_max_connections, nofile_limit

    per_client = 0
    if name == "admin":
        cap = server.admin_max_connections
    else:
        nofile = nofile or nofile_limit()
        fit = default_max_connections(nofile, server.admin_max_connections)
        cap = server.max_connections or fit
        if cap > fit:
            log.warning(
                "server.max_connections %d is more than the descriptor limit allows (ulimit -n %d: %d "
                "with an upstream connection each); raise ulimit -n or lower it",
                cap,
                nofile,
                fit,
            )
        per_client = getattr(server, "max_connections_per_client", None) or default_per_client(cap)
    return ListenerSettings(
        name=name,
        header_timeout_s=server.header_timeout_s,
        body_timeout_s=server.body_timeout_s,
        body_total_timeout_s=server.body_total_timeout_s,
        keepalive_timeout_s=server.keepalive_timeout_s,
        max_connections=cap,
        send_timeout_s=getattr(server, "send_timeout_s", 60.0),
        max_connections_per_client=min(per_client, cap),
    )


def default_per_client(max_connections: int) -> int:
    """Connections one client address may hold on the API port when ``server.max_connections_per_client``
    is not set: half the port's cap (at least 1), so one address (or one flood) can never take the whole
    port. Example: ``ulimit -n 1024`` -> port cap 464 -> 232 per address."""
    return max(1, max_connections // 2)
