"""The bootstrap interval of a figure of the capacity model: the 2.5-97.5 % percentiles of the figure
computed under each bootstrap refit (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993,
ch. 13), widened where needed to hold the figure of the point fit itself.

The refits resample requests; a figure that depends non-linearly on the fit (a capacity found by
bisection) can put every refit on one side of the point fit, and a percentile range that excludes the
estimate it belongs to reads as a contradiction. Widening to the point keeps the interval's meaning
(where the figure plausibly lies) and never narrows it; ``method`` says when it happened.

Below :data:`MIN_REFITS` refits the 2.5 and 97.5 % percentiles are the extremes of a handful of values:
the interval is then the range of those refits, not a 95 % interval, and the report says so.
"""

from __future__ import annotations

import numpy as np

from servelab.bench.results import Interval

__all__ = ["MIN_REFITS", "boot_interval", "refits_text"]

#: fewest bootstrap refits whose 2.5-97.5 % range the report calls a 95 % interval (count); below it,
#: the range of the refits is shown as such
MIN_REFITS = 10


def boot_interval(
    vals: list[float], point: float | None = None, method: str = "bootstrap-simulated"
) -> Interval | None:
    """The 2.5-97.5 % range of ``vals`` (one figure per refit, in the figure's unit), widened to hold
    ``point`` (the point fit's figure); ``n`` the number of refits; ``None`` when ``vals`` is empty."""
    if not vals:
        return None
    lo, hi = (float(x) for x in np.percentile(vals, [2.5, 97.5]))
    if point is not None and np.isfinite(point) and not lo <= point <= hi:
        lo, hi = min(lo, float(point)), max(hi, float(point))
        method += ", widened to the point fit"
    return Interval(lo=lo, hi=hi, n=len(vals), method=method)


def refits_text(iv: Interval, lo: str, hi: str) -> str:
    """``iv`` as report text, its bounds already formatted as ``lo`` and ``hi``: the 95 % interval with
    its number of refits, or, below :data:`MIN_REFITS` refits, the range of those refits."""
    widened = "; holds the point fit, outside the refits' range" if "widened" in iv.method else ""
    if iv.n < MIN_REFITS:
        return f"range of {iv.n} bootstrap refits {lo}–{hi}, too few for a 95 % CI{widened}"
    return f"95 % CI {lo}–{hi}, {iv.n} bootstrap refits{widened}"
