"""Stable hashes for routing decisions: a per-key number in [0, 1) (:func:`stable_unit`, for draws that must
agree across gateway processes), rendezvous order (:func:`hrw_order`, Thaler & Ravishankar, "Using
name-based mappings to increase hit rates", IEEE/ACM ToN 6(1), 1998) and the prompt text that prefix
affinity hashes (:func:`affinity_text`). Hashes are ``hashlib.blake2b`` (stable across processes and Python
versions; never ``hash()``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["affinity_text", "hrw_order", "stable_unit"]


def _digest(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def stable_unit(key: str, salt: str = "") -> float:
    """A number in [0, 1) that depends only on ``key`` and ``salt`` (blake2b, same in every process)."""
    return _digest(f"{salt}\x00{key}".encode()) / 2.0**64


def hrw_order(key: str, names: Iterable[str]) -> list[str]:
    """``names`` by decreasing rendezvous score ``blake2b(key, name)`` (ties by name): the first is the
    owner of ``key``; dropping a name changes the owner only of the keys that name owned."""
    k = hashlib.blake2b(key.encode(), digest_size=16).digest()
    return sorted(names, key=lambda n: (-_digest(k + b"\x00" + n.encode()), n))


def affinity_text(body: Mapping[str, Any], max_chars: int = 256) -> str:
    """The first ``max_chars`` characters of what the engine will see first: chat ``messages`` as
    ``role: text`` lines (text parts of multi-part contents only) or the completions ``prompt``.
    Returns "" when the body has neither."""
    if max_chars <= 0:
        return ""
    parts: list[str] = []
    size = 0
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if not isinstance(m, Mapping):
                continue
            c = m.get("content")
            if isinstance(c, list):
                c = "".join(p.get("text", "") for p in c if isinstance(p, Mapping) and isinstance(p.get("text"), str))
            if not isinstance(c, str):
                c = ""
            piece = f"{m.get('role', '')}: {c}\n"
            parts.append(piece)
            size += len(piece)
            if size >= max_chars:
                break
    else:
        p = body.get("prompt")
        if isinstance(p, list):
            p = p[0] if p and isinstance(p[0], str) else ""
        if isinstance(p, str):
            parts.append(p)
    return "".join(parts)[:max_chars]
