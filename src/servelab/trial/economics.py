"""Cost per output token and replicas for the peak (003 §19: "cost per 10k output tokens" and
"machines for peak concurrency"; §21: plan the peak as part of normal operation). Pure functions.

- cost per N output tokens = ``price_per_hour / 3600 / tokens_per_s * N``, in the price's currency;
  its interval comes from the rate's (cost falls as the rate rises, so the bounds swap).
- replicas = ``ceil(peak_rps / (capacity_rps * (1 - headroom)))``: each replica is planned to run at
  ``1 - headroom`` of its capacity at the SLO, the rest kept for bursts; its interval from the
  capacity's (``[highest rate that held, lowest that broke)`` of the search).
"""

from __future__ import annotations

import math

from servelab.bench.results import Interval
from servelab.trial.results import Cost, Replicas

__all__ = ["cost", "replicas"]


def _per(price_per_hour: float, tokens_per_s: float, n: float) -> float:
    return price_per_hour / 3600.0 / tokens_per_s * n


def cost(
    price_per_hour: float | None, currency: str, tokens_per_s: float | None, ci: Interval | None, basis: str
) -> Cost | None:
    """:class:`~servelab.trial.results.Cost` per 10k and 1M output tokens at ``tokens_per_s`` (> 0)
    for a machine at ``price_per_hour``; ``ci``: the rate's interval (a bound <= 0 or missing leaves
    that side of the cost unbounded). ``None`` without a price or a rate."""
    if price_per_hour is None or not tokens_per_s or tokens_per_s <= 0:
        return None

    def iv(n: float) -> Interval | None:
        if ci is None:
            return None
        hi = _per(price_per_hour, ci.lo, n) if ci.lo is not None and ci.lo > 0 else None
        lo = _per(price_per_hour, ci.hi, n) if ci.hi is not None and ci.hi > 0 else None
        return Interval(lo=lo, hi=hi, level=ci.level, n=ci.n, method=ci.method)

    return Cost(
        price_per_hour=price_per_hour,
        currency=currency,
        tokens_per_s=tokens_per_s,
        basis=basis,
        per_10k_output_tokens=_per(price_per_hour, tokens_per_s, 1e4),
        per_1m_output_tokens=_per(price_per_hour, tokens_per_s, 1e6),
        per_10k_ci=iv(1e4),
        per_1m_ci=iv(1e6),
    )


def replicas(
    peak_rps: float | None, headroom: float, capacity_rps: float | None, capacity_hi_rps: float | None, basis: str
) -> Replicas | None:
    """:class:`~servelab.trial.results.Replicas` for ``peak_rps`` (requests/s) at ``headroom`` (0..1)
    from ``capacity_rps`` (the highest rate that held) and ``capacity_hi_rps`` (the lowest that broke;
    ``None``: unknown, the upper side of the capacity is open). ``None`` without a peak or a capacity."""
    if peak_rps is None or not capacity_rps or capacity_rps <= 0:
        return None
    usable = 1.0 - headroom

    def need(cap: float) -> int:
        return max(1, math.ceil(peak_rps / (cap * usable) - 1e-9))

    n = need(capacity_rps)
    lo = need(capacity_hi_rps) if capacity_hi_rps else None
    return Replicas(
        peak_rps=peak_rps, headroom=headroom, replicas=n, lo=lo, hi=n, capacity_rps=capacity_rps, basis=basis
    )
