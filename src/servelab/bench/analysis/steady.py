"""The steady window of a load step: the time the load was at its target, apart from ramp-up and drain.

A closed loop of ``c`` workers over ``n`` requests ramps up while its first ``c`` requests are being
sent, holds ``c`` in flight until the last request has been sent and the next one ends, then drains.
Throughput over the whole step mixes the three; the seed's rule (000 §10.2: "aggregate throughput uses
a fixed, stated window") is met here by counting only the output tokens *generated inside* the window
(by the arrival times of their stream chunks) over its length. An open loop has no in-flight target;
its steady window is the arrival period, first to last arrival.

The interval on the window's throughput is by batch means: the window is cut into ``blocks`` equal
time blocks, each block's rate is one sample, and :func:`servelab.bench.analysis.intervals.mean_interval`
gives the Student-t interval of their mean (Law, *Simulation Modeling and Analysis*, 5th ed.,
McGraw-Hill 2015, §9.5.3, "batch means"). Blocks of one run share that run's conditions, so this
interval says how steady the run was, not how much another run would differ: repeats measure that.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.bench.analysis.intervals import mean_interval
from servelab.bench.results import Interval, Steady
from servelab.wire.types import RequestRecord

__all__ = ["BLOCKS", "steady_window"]

BLOCKS = 4
"""Time blocks of a steady window for its throughput interval."""

NS = 1e9


def _tokens_at(r: RequestRecord) -> list[tuple[int, float]]:
    """``(chunk arrival ns, tokens)`` of one succeeded request: per-chunk usage where known, else its
    output tokens spread evenly over its chunks."""
    c = r.chunk_ns
    if not c:
        return []
    ks = list(r.chunk_tokens) + [0] * (len(c) - len(r.chunk_tokens))
    if all(k > 0 for k in ks):
        return [(t, float(k)) for t, k in zip(c, ks, strict=True)]
    per = float(r.output_tokens or len(c)) / len(c)
    return [(t, per) for t in c]


def steady_window(recs: Sequence[RequestRecord], target_inflight: int | None, blocks: int = BLOCKS) -> Steady:
    """The :class:`~servelab.bench.results.Steady` window of one step's measured requests.

    ``recs``: the step's records (warmup ones are left out here); ``target_inflight``: the closed
    loop's concurrency, ``None`` for an open loop (window = first to last arrival). Offsets and lengths
    in seconds from the first send; tokens from the servers' usage counts. A window shorter than one
    chunk gap, or a step with no succeeded request, gives a :class:`Steady` with ``note`` saying why
    and ``None`` figures; never raises."""
    measured = [r for r in recs if not r.warmup and r.sent_ns is not None]
    if not measured:
        return Steady(target_inflight=target_inflight, note="no request was sent")
    sends = sorted(int(r.sent_ns) for r in measured if r.sent_ns is not None)
    ends = sorted(int(r.end_ns) for r in measured if r.end_ns is not None)
    t_first, t_last_end = sends[0], (ends[-1] if ends else sends[-1])
    if target_inflight is None:
        start, stop = sends[0], sends[-1]
    elif target_inflight > len(sends):
        return Steady(
            target_inflight=target_inflight,
            ramp_s=(sends[-1] - t_first) / NS,
            drain_s=max(t_last_end - sends[-1], 0) / NS,
            note=f"no steady window: {len(sends)} request(s) never put {target_inflight} in flight",
        )
    else:
        c = max(1, target_inflight)
        start = sends[c - 1]
        last_send = sends[-1]
        after = [e for e in ends if e >= last_send]
        stop = after[0] if after else last_send
    length_s = (stop - start) / NS
    base = Steady(
        target_inflight=target_inflight,
        start_ns=start,
        stop_ns=stop,
        start_offset_s=(start - t_first) / NS,
        steady_s=max(length_s, 0.0),
        ramp_s=(start - t_first) / NS,
        drain_s=max(t_last_end - stop, 0) / NS,
    )
    if length_s <= 0:
        base.note = (
            "no steady window: the load never held its target (fewer requests than the concurrency, or one arrival)"
        )
        return base
    toks = [(t, k) for r in measured if r.failure is None for t, k in _tokens_at(r)]
    inside = sum(k for t, k in toks if start <= t < stop)
    done = sum(1 for r in measured if r.failure is None and r.end_ns is not None and start <= r.end_ns < stop)
    base.output_tokens = inside
    base.output_tokens_per_s = inside / length_s
    base.requests_per_s = done / length_s
    k = max(1, int(blocks))
    edges = [start + (stop - start) * i // k for i in range(k + 1)]
    per_block = [0.0] * k
    for t, n in toks:
        if start <= t < stop:
            i = min(k - 1, int((t - start) * k // (stop - start)))
            per_block[i] += n
    rates = [per_block[i] / ((edges[i + 1] - edges[i]) / NS) for i in range(k) if edges[i + 1] > edges[i]]
    base.blocks = rates
    b = mean_interval(rates, method="t-blocks")
    if b.lo is not None:
        base.output_tokens_per_s_ci = Interval(lo=max(b.lo, 0.0), hi=b.hi, level=b.level, n=b.n, method=b.method)
    return base
