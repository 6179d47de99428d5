"""Saturation check: was the load generator, not the server, the limit of a step?

Each load-generator worker (the single bench process, or each ``--workers``/``--ray`` worker) measures
its own process's CPU time over the step (:class:`CpuMeter`, ``resource.getrusage``: user + system
seconds of every thread) and, in an open loop, how late its event loop woke for each arrival. The
step is flagged ``generator_bound`` (:func:`saturation`) when

- a worker's CPU reached :data:`CPU_BOUND_FRACTION` of one core: an asyncio generator is one thread,
  so near 100 % it delays reading responses (TTFT and ITL grow on the client side) and sending
  requests; or
- the step's lag figure passed the step's bound (``--lag-bound-ms``, default 1 ms, the issue's
  criterion for an honest open loop): without ``--max-concurrency`` the P99 of every request's
  schedule lag (``sent - scheduled``); with it, the P99 of the workers' dispatch lag, because waiting
  for a free slot is the server's slowness showing, not the generator's. A closed loop has no
  schedule: only its CPU is checked.

A generator-bound step's latencies and throughput describe the client; add ``--workers`` (or hosts
with ``--ray``) until the flag clears.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass

import numpy as np

from servelab.bench.results import Saturation, WorkerStep

#: a worker at or above this share of one core is taken as saturated (0.9: leaves room for sampling noise
#: of getrusage and for the work a busy asyncio loop does between two requests)
CPU_BOUND_FRACTION = 0.9
#: the default bound on the step's lag P99 (``--lag-bound-ms``), seconds
DEFAULT_LAG_BOUND_S = 1e-3


@dataclass
class CpuMeter:
    """CPU seconds (user + system, all threads) of this process and wall seconds since :meth:`start`
    (``time.monotonic``)."""

    cpu0_s: float = 0.0
    wall0_s: float = 0.0

    @staticmethod
    def _cpu_s() -> float:
        ru = resource.getrusage(resource.RUSAGE_SELF)
        return ru.ru_utime + ru.ru_stime

    def start(self) -> CpuMeter:
        """Start (or restart) measuring; returns ``self``."""
        self.cpu0_s, self.wall0_s = self._cpu_s(), time.monotonic()
        return self

    def read(self) -> tuple[float, float]:
        """``(cpu_s, wall_s)`` since :meth:`start`."""
        return self._cpu_s() - self.cpu0_s, time.monotonic() - self.wall0_s


def p99_s(values_ns: list[int]) -> float | None:
    """P99 (numpy linear interpolation, as :func:`servelab.bench.analysis.metrics.stats`) of nanosecond values, in
    seconds; ``None`` for none."""
    if not values_ns:
        return None
    return float(np.percentile(np.asarray(values_ns, dtype=float), 99)) / 1e9


def worker_step(
    worker: int,
    host: str,
    meter: CpuMeter,
    *,
    concurrency: int | None,
    assigned: int | None,
    finished: int,
    schedule_lags_s: list[float],
    dispatch_lags_ns: list[int] | None,
    start_late_s: float | None = None,
) -> WorkerStep:
    """The :class:`WorkerStep` report of one worker from its meter (read now) and its lag samples
    (``schedule_lags_s``: its requests' ``sent - scheduled``, seconds; ``dispatch_lags_ns``: loop
    wake-up lateness per arrival, ns, or ``None`` in a closed loop)."""
    cpu_s, wall_s = meter.read()
    sl = [x for x in schedule_lags_s if x is not None]
    return WorkerStep(
        worker=worker,
        host=host,
        pid=os.getpid(),
        concurrency=concurrency,
        assigned=assigned,
        finished=finished,
        cpu_s=cpu_s,
        wall_s=wall_s,
        cpu_fraction=cpu_s / wall_s if wall_s > 0 else None,
        schedule_lag_p99_s=float(np.percentile(sl, 99)) if sl else None,
        dispatch_lag_p99_s=p99_s(dispatch_lags_ns) if dispatch_lags_ns is not None else None,
        start_late_s=start_late_s,
    )


def saturation(
    workers: list[WorkerStep],
    *,
    kind: str,
    capped: bool,
    schedule_lag_p99_s: float | None,
    lag_bound_s: float,
    dispatch_lags_ns: list[int] | None = None,
) -> Saturation:
    """The verdict of one step (module doc). ``kind``: ``closed``/``open``; ``capped``: the open loop had
    ``--max-concurrency``; ``schedule_lag_p99_s``: the step's P99 over all its measured requests;
    ``dispatch_lags_ns``: every worker's dispatch-lag samples together (used when ``capped``; the P99 of
    the per-worker P99s is used when only those are known)."""
    reasons: list[str] = []
    for w in workers:
        if w.cpu_fraction is not None and w.cpu_fraction >= CPU_BOUND_FRACTION:
            reasons.append(
                f"worker {w.worker} on {w.host} used {w.cpu_fraction:.0%} of a core (>= {CPU_BOUND_FRACTION:.0%})"
            )
    metric: str | None = None
    value: float | None = None
    if kind == "open":
        if capped:
            metric = "dispatch_lag p99"
            if dispatch_lags_ns:
                value = p99_s(dispatch_lags_ns)
            else:
                per = [w.dispatch_lag_p99_s for w in workers if w.dispatch_lag_p99_s is not None]
                value = max(per) if per else None
        else:
            metric, value = "schedule_lag_s.p99", schedule_lag_p99_s
        if value is not None and value > lag_bound_s:
            reasons.append(f"{metric} {value * 1e3:.3g} ms > bound {lag_bound_s * 1e3:g} ms")
    return Saturation(
        generator_bound=bool(reasons),
        reasons=reasons,
        lag_metric=metric,
        lag_value_s=value,
        lag_bound_s=lag_bound_s if kind == "open" else None,
        cpu_bound_fraction=CPU_BOUND_FRACTION,
    )
