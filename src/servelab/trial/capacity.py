"""Capacity in requests/s at the SLO: an open-loop search for the highest arrival rate whose
objectives still hold (003 §21 plans replicas with it; a concurrency step is not a request rate).

:func:`search` brackets, then bisects: from ``start_rps`` it doubles the rate until a probe breaks
(or halves it until one holds), then halves the bracket ``[held, broke)`` until its width is at most
``tolerance`` of the held rate or the probes run out. A probe is one open-loop run at a rate
(:class:`Probe`: it *held* when every objective held on its point estimates and the error budget;
``probe`` is a callback, so the search is pure and is tested against a mock of known service rate).
The answer is the highest rate that held; the true capacity lies in ``[held, broke)``, which is
reported as its interval: the **resolution of the search**, not a confidence interval (each probe's
held/broke verdict is taken as exact, ``level`` 1.0, ``method`` ``bracket``; each probe's own
statistical uncertainty is in its step summary, and a probe near the capacity may flip between runs).
:data:`RESOLUTION_NOTE` says so in the record (``capacity.interval_note``). Under open loop above
capacity the queue grows without bound, so a probe past it breaks the TTFT objectives (queueing
shows in TTFT, not in throughput).
"""

from __future__ import annotations

from collections.abc import Callable

from servelab.bench.results import Interval
from servelab.trial.results import Capacity, Probe

__all__ = ["RESOLUTION_NOTE", "search"]

RESOLUTION_NOTE = (
    "resolution of the search, not a confidence interval: the highest rate that held and the lowest "
    "that broke, each probe's verdict taken as exact"
)


def search(
    probe: Callable[[float], Probe],
    start_rps: float,
    *,
    max_probes: int = 4,
    tolerance: float = 0.05,
    floor_rps: float = 1e-3,
    ceiling_rps: float = 1e4,
) -> Capacity:
    """The :class:`~servelab.trial.results.Capacity` found by probing ``probe(rate_rps)`` (module doc).

    ``start_rps`` > 0: the first rate; ``max_probes``: probes at most; ``tolerance``: relative bracket
    width to stop at; ``floor_rps``/``ceiling_rps``: rates the search does not go past. Raises
    ``ValueError`` for ``start_rps <= 0`` or ``max_probes < 1``."""
    if start_rps <= 0 or max_probes < 1:
        raise ValueError(f"capacity search needs start_rps > 0 and max_probes >= 1, got {start_rps}, {max_probes}")
    probes: list[Probe] = []
    held: float | None = None
    broke: float | None = None

    def run(rate: float) -> bool:
        p = probe(rate)
        probes.append(p)
        return p.held

    rate = start_rps
    while len(probes) < max_probes:  # bracket
        if run(rate):
            held = rate
            if broke is not None or rate * 2 > ceiling_rps:
                break
            rate *= 2
        else:
            broke = rate
            if held is not None or rate / 2 < floor_rps:
                break
            rate /= 2
    while (
        held is not None and broke is not None and len(probes) < max_probes and (broke - held) / held > tolerance
    ):  # bisect
        mid = (held + broke) / 2
        if run(mid):
            held = mid
        else:
            broke = mid
    note = None
    if held is None:
        note = f"no rate down to {min(p.rate_rps for p in probes):g} req/s held its objectives"
    elif broke is None:
        note = f"every rate up to {held:g} req/s held: the capacity is higher (more probes would find it)"
    interval = None if held is None else Interval(lo=held, hi=broke, level=1.0, n=len(probes), method="bracket")
    best = max((p for p in probes if p.held), key=lambda p: p.rate_rps, default=None)
    return Capacity(
        rate_rps=held,
        broke_at_rps=broke,
        interval=interval,
        interval_note=RESOLUTION_NOTE if interval is not None else None,
        output_tokens_per_s=best.output_tokens_per_s if best else None,
        probes=probes,
        note=note,
    )
