"""What a request is charged: tokens for the limits settle and the ledger row, and the write-ahead row.

Tokens come from the engine's ``usage``. When it never arrived (client disconnected, upstream cut off),
the gateway charges the prompt estimate (:func:`~servelab.gateway.capabilities.estimate_prompt_tokens`,
a lower bound) plus one token per token-carrying chunk it forwarded: what it saw being served, never the
reservation. A request that reached no engine (refused, or every attempt failed before any byte) is
charged 0. Settle and the ledger row happen exactly once per admitted request, also on errors and client
disconnects (the gateway runs :func:`settle` in a task that outlives the handler).
"""

from __future__ import annotations

import logging
from typing import Any

from servelab.gateway.ledger import UsageRow, token_cost
from servelab.gateway.limits import Admission, Limiter
from servelab.gateway.reqstate import RequestState
from servelab.gateway.snapshot import Snapshot

__all__ = ["billed", "journal_admit", "settle", "used_tokens"]

log = logging.getLogger("servelab.gateway")


def used_tokens(r: RequestState) -> int:
    """Tokens charged: the engine's usage; else prompt estimate + forwarded token chunks if anything
    was served; else 0 (module doc). Feeds the limits settle and the access log's ``charged_tokens``."""
    if r.prompt_tokens is not None or r.completion_tokens is not None:
        # never below the token events forwarded (each carried one token at least; served.py)
        return (r.prompt_tokens or 0) + max(r.completion_tokens or 0, r.token_events)
    if r.served:
        return r.prompt_est + r.token_events
    return 0


def billed(r: RequestState) -> tuple[int, int]:
    """(prompt, completion) tokens of the ledger row: the engine's usage, else the prompt estimate and
    the token chunks forwarded if anything was served, else 0."""
    pt = r.prompt_tokens if r.prompt_tokens is not None else (r.prompt_est if r.served else 0)
    ct = (
        max(r.completion_tokens, r.token_events)
        if r.completion_tokens is not None
        else (r.token_events if r.served else 0)
    )
    return pt, ct


def journal_admit(ledger: Any, r: RequestState, admission: Admission) -> None:
    """The write-ahead row of an admitted request (outcome ``incomplete``, its reservation), with a
    probe of what it served so far (servelab.gateway.journal)."""
    admit = getattr(ledger, "admit", None)
    if admit is None:
        return

    def live() -> dict[str, Any]:
        pt, ct = billed(r)
        return {
            "prompt_tokens": pt,
            "completion_tokens": ct,
            "status": r.status,
            "backend": r.backend,
            "upstream_model": r.upstream_model,
        }

    admit(
        str(getattr(admission, "uid", id(admission))),
        UsageRow(
            request_id=r.rid,
            ts=r.ts,
            key_id=r.key_id,
            tenant=r.tenant,
            model=r.model,
            backend=None,
            upstream_model=None,
            prompt_tokens=0,
            completion_tokens=0,
            reserved_tokens=getattr(admission, "reserved_tokens", 0),
            status=0,
            outcome="incomplete",
        ),
        live,
    )


async def settle(
    ledger: Any, limiter: Limiter, snap: Snapshot, r: RequestState, admission: Admission, used: int
) -> None:
    """Settle ``r``'s limits reservation at ``used`` tokens and write its ledger row (DurableLedger: the
    journal's final line too); failures are logged with the request id, never raised."""
    try:
        await limiter.settle(admission, used)
    except Exception as e:  # noqa: BLE001 — a failed settle is logged and retried, never the client's error
        log.error("limits settle failed for request %s: %s", r.rid, e)
    pt, ct = billed(r)
    entry = snap.cfg.models.get(r.model)
    c = entry.capabilities if entry is not None else None
    cost = token_cost(pt, ct, c.price_in_per_1m if c else None, c.price_out_per_1m if c else None)
    row = UsageRow(
        request_id=r.rid,
        ts=r.ts,
        key_id=r.key_id,
        tenant=r.tenant,
        model=r.model,
        backend=r.backend,
        upstream_model=r.upstream_model,
        prompt_tokens=pt,
        completion_tokens=ct,
        reserved_tokens=getattr(admission, "reserved_tokens", 0),
        status=r.status,
        outcome=r.outcome if r.outcome in ("ok", "error", "client_disconnect") else "error",
        cost=cost,
    )
    try:
        settle = getattr(ledger, "settle", None)  # DurableLedger: the journal's final line too
        jid = str(getattr(admission, "uid", id(admission)))
        await (settle(jid, row) if settle is not None else ledger.record(row))
    except Exception as e:  # noqa: BLE001 — a failed ledger write must not fail an answered request
        log.error("ledger write failed for request %s: %s", r.rid, e)
