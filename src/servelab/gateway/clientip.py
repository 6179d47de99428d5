"""The client IP a limit counts: the TCP peer, or X-Forwarded-For when the peer is a trusted proxy.

A client can put anything in ``X-Forwarded-For``; only proxies the operator lists in
``server.trusted_proxies`` (addresses or CIDRs) are believed. The rule is nginx's ``realip`` module with
``real_ip_recursive on`` (https://nginx.org/en/docs/http/ngx_http_realip_module.html, read 2026-12-01):

- the peer is not trusted: the client IP is the peer, whatever the header says (a spoofed header from
  an untrusted peer never changes the identity a limit counts);
- the peer is trusted: walk the header's addresses from the right (the hop nearest the gateway) and take
  the first one that is not itself a trusted proxy; if every one is trusted, the leftmost; an entry that
  is not an IP address stops the walk at the hop before it (the last address a trusted proxy vouched for).

Several ``X-Forwarded-For`` headers are read as one comma-joined list, in order (RFC 9110 §5.3).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from functools import lru_cache

__all__ = ["client_ip", "is_trusted", "trusted_networks"]

_Net = ipaddress.IPv4Network | ipaddress.IPv6Network


@lru_cache(maxsize=8)
def trusted_networks(cidrs: tuple[str, ...]) -> tuple[_Net, ...]:
    """``server.trusted_proxies`` parsed (already validated by the config model)."""
    return tuple(ipaddress.ip_network(c, strict=False) for c in cidrs)


def _trusted(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, nets: Sequence[_Net]) -> bool:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return any(addr.version == n.version and addr in n for n in nets)


def _parse(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    t = text.strip()
    if t.startswith("[") and "]" in t:  # "[2001:db8::1]:443"
        t = t[1 : t.index("]")]
    elif t.count(":") == 1:  # "203.0.113.7:51000"
        t = t.split(":", 1)[0]
    try:
        return ipaddress.ip_address(t)
    except ValueError:
        return None


def is_trusted(peer: str | None, trusted: Sequence[_Net]) -> bool:
    """True when the TCP peer address ``peer`` (text) is in one of the ``trusted`` proxy networks."""
    addr = _parse(peer) if peer and trusted else None
    return addr is not None and _trusted(addr, trusted)


def client_ip(peer: str | None, forwarded_for: Iterable[str], trusted: Sequence[_Net]) -> str:
    """The client IP (text) for TCP peer ``peer`` and the ``X-Forwarded-For`` header values
    ``forwarded_for`` under the ``trusted`` proxy networks (module doc). ``peer`` None (a Unix socket)
    is ``"unknown"``."""
    if not peer:
        return "unknown"
    addr = _parse(peer)
    if addr is None or not trusted or not _trusted(addr, trusted):
        return peer
    hops = [h for v in forwarded_for for h in v.split(",") if h.strip()]
    current = addr
    for hop in reversed(hops):
        parsed = _parse(hop)
        if parsed is None:
            break
        current = parsed
        if not _trusted(parsed, trusted):
            break
    if isinstance(current, ipaddress.IPv6Address) and current.ipv4_mapped is not None:
        return str(current.ipv4_mapped)
    return str(current)
