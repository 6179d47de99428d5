"""Confidence intervals servelab puts on every figure it shows: pure functions, no I/O.

- :func:`quantile_interval`: a distribution-free interval for a percentile (P50/P95/P99) from the
  order statistics of the sample. The exact binomial argument (Conover, *Practical Nonparametric
  Statistics*, 3rd ed., Wiley 1999, §3.2, "confidence interval for a quantile"; Hahn & Meeker,
  *Statistical Intervals*, Wiley 1991, §5.2, https://doi.org/10.1002/9780470316771): for a sample of
  ``n`` and the ``q`` quantile, ``P(X_(r) <= x_q) = P(Binomial(n, q) >= r)``. Integer ranks make that
  coverage jump (n = 8, median: 99.2 % or 93.0 %, nothing between), so each bound is the *fractional
  order statistic* of Hutson (1999), "Calculating nonparametric confidence intervals for quantiles
  using fractional order statistics", J. Applied Statistics 26(3):343-353,
  https://doi.org/10.1080/02664769922458: the real rank ``u`` solving ``I_q(u, n+1-u) = gamma``
  (``I`` the regularized incomplete beta; at integer ``u`` this is the binomial probability above),
  and ``X_(u)`` interpolated between the two order statistics around it. Percentiles are equivariant
  under monotone maps, so the interval may be formed on ``log x`` and mapped back; servelab does so
  for positive samples (latencies, rates): at integer ranks nothing changes (still exact), and between
  ranks log-linear interpolation follows a right-skewed tail better than linear (seeded simulation,
  tests/bench/analysis/test_intervals.py: lognormal and exponential samples of 8-24, coverage of P50/P95/P99
  within 95 % ± 1.6 points; linear interpolation gave 92.4 % for P99 at n = 8). Each side of a
  two-sided interval has confidence 97.5 %. A side whose rank falls outside ``1..n`` cannot be
  bounded by any sample value of that size (the upper side of P95 needs ``n >= 72``, of P99
  ``n >= 368``): it is reported **unbounded** (``None``) and the other side then carries the whole
  5 % (a one-sided 95 % bound), so the stated interval is a 95 % one either way.
- :func:`mean_interval`: Student-t interval of a mean from independent samples (repeats, time blocks).
- :func:`ratio_interval`: the ratio of two rates (geometric means of their samples) with a Welch
  interval on the log scale (Welch 1947, Biometrika 34:28-35, https://doi.org/10.1093/biomet/34.1-2.28;
  ratios of benchmark means as recommended by Kalibera & Jones, "Rigorous Benchmarking in Reasonable
  Time", ISMM 2013, https://doi.org/10.1145/2464157.2464160), and whether it excludes 1.
- :func:`paired_ratio_interval`: the same ratio when the two were measured in interleaved rounds
  (A B A B): per round, the difference of mean log block rates, so drift common to a round cancels;
  its variance from the within-run spread of the blocks (pooled, Welch-Satterthwaite df) and, with
  three rounds or more, from the spread between rounds when that is larger.
- :func:`paired_rounds_ratio`: with three rounds or more, the paired t interval over the rounds'
  whole-run figures (what the trial's decision uses then: the rounds are the replicates; time blocks
  of one short run on a real engine alternate and overstate its uncertainty).
- :func:`proportion_interval`: the Clopper-Pearson exact interval of a failure rate (Clopper & Pearson
  1934, Biometrika 26:404-413, https://doi.org/10.1093/biomet/26.4.404).
- :func:`slo_verdict`: ``met`` / ``broken`` / ``undetermined`` for ``stat <= limit`` from an interval.

The incomplete beta is the continued fraction of Numerical Recipes (Press et al., 3rd ed., 2007,
§6.4), accurate to ~1e-12 here; the Student-t quantile inverts its CDF by bisection.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Literal, NamedTuple

import numpy as np

__all__ = [
    "LEVEL",
    "Bounds",
    "Ratio",
    "SloVerdict",
    "beta_inc",
    "mean_interval",
    "paired_ratio_interval",
    "paired_rounds_ratio",
    "proportion_interval",
    "quantile_interval",
    "quantile_min_n",
    "ratio_interval",
    "slo_verdict",
    "t_quantile",
]

LEVEL = 0.95
"""Confidence level of every interval servelab reports."""

SloVerdict = Literal["met", "broken", "undetermined"]


class Bounds(NamedTuple):
    """An interval: ``lo``/``hi`` (``None`` = unbounded on that side), its confidence ``level``, the
    sample size ``n`` and the ``method`` (``order-statistics``, ``t``, ``welch-log``)."""

    lo: float | None
    hi: float | None
    level: float
    n: int
    method: str

    @property
    def bounded(self) -> bool:
        """Both sides are finite numbers."""
        return self.lo is not None and self.hi is not None


class Ratio(NamedTuple):
    """``a / b`` with its interval; ``significant``: the interval excludes 1."""

    ratio: float
    lo: float
    hi: float
    level: float
    significant: bool
    df: float


# ----------------------------------------------------------------------------------------- special functions


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta (modified Lentz; Numerical Recipes §6.4)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-14:
            break
    return h


def beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``.
    Raises ``ValueError`` outside that domain."""
    if a <= 0 or b <= 0 or not 0.0 <= x <= 1.0:
        raise ValueError(f"beta_inc needs a, b > 0 and 0 <= x <= 1, got a={a}, b={b}, x={x}")
    if x in (0.0, 1.0):
        return x
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def _t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * beta_inc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df > 0`` degrees of freedom (``t_quantile(0.975, 1)``
    = 12.706). Raises ``ValueError`` for ``p`` outside (0, 1) or ``df <= 0``."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if _t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ----------------------------------------------------------------------------------------- quantiles


def _rank(n: int, q: float, coverage: float) -> float:
    """The real rank ``u`` in ``[0, n+1]`` with ``I_q(u, n+1-u) = coverage`` (Hutson 1999): the
    probability that the fractional order statistic ``X_(u)`` lies at or below the true ``q``
    quantile. ``I_q(u, n+1-u)`` falls from 1 (u -> 0) to 0 (u -> n+1), so bisection finds it."""
    lo, hi = 1e-9, n + 1 - 1e-9
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if beta_inc(mid, n + 1 - mid, q) > coverage:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _at_rank(xs: np.ndarray, u: float) -> float:
    """``X_(u)`` for a real rank ``1 <= u <= n`` of sorted ``xs``: between adjacent order statistics,
    linear (Hutson 1999, eq. 2) on the log scale when every value is > 0 (module doc), else linear."""
    k = int(math.floor(u))
    if k >= len(xs):
        return float(xs[-1])
    frac = u - k
    a, b = float(xs[k - 1]), float(xs[k])
    if frac <= 0:
        return a
    if xs[0] > 0:
        return math.exp(math.log(a) + frac * (math.log(b) - math.log(a)))
    return a + frac * (b - a)


@lru_cache(maxsize=4096)
def _sides(n: int, q: float, level: float) -> tuple[float | None, float | None]:
    """The real ranks of the lower and upper bounds (``None``: unbounded) at ``level`` (they depend on
    ``n``, ``q`` and ``level`` only, so they are cached)."""
    alpha = 1.0 - level
    lo_u = _rank(n, q, 1.0 - alpha / 2)  # P(X_(u) <= x_q) = 97.5 %
    hi_u = _rank(n, q, alpha / 2)  # P(X_(u) >= x_q) = 97.5 %
    lo_ok, hi_ok = lo_u >= 1.0, hi_u <= n
    if lo_ok and hi_ok:
        return lo_u, hi_u
    if lo_ok:  # upper side unbounded: the lower bound alone at 95 %
        u = _rank(n, q, level)
        return (u if u >= 1.0 else None), None
    if hi_ok:
        u = _rank(n, q, alpha)
        return None, (u if u <= n else None)
    return None, None


def quantile_min_n(q: float, level: float = LEVEL) -> int:
    """The smallest sample size whose ``level`` interval for the ``q`` quantile is bounded on both
    sides (P50: 6, P95: 72, P99: 368 at 95 %)."""
    n = 1
    while True:
        lo, hi = _sides(n, q, level)
        if lo is not None and hi is not None:
            return n
        n += 1


def quantile_interval(
    values: Sequence[float] | np.ndarray, q: float, level: float = LEVEL, n_eff: int | None = None
) -> Bounds:
    """The ``level`` confidence interval for the ``q`` quantile (``0 < q < 1``, e.g. 0.95) of the
    distribution ``values`` were drawn from, by interpolated order statistics (module doc).

    ``n_eff``: when the values are not independent but come in clusters (the inter-token gaps of one
    request), the number of clusters; the ranks are then those of a sample of ``n_eff`` and are
    placed at the same relative position in the pooled values — the worst-case design effect of
    Kish (*Survey Sampling*, Wiley 1965, §5.4: fully correlated within a cluster), so the interval is
    conservative rather than falsely narrow. ``None`` = the values are independent.

    Returns :class:`Bounds` in the unit of ``values`` (``n`` = ``n_eff`` when given); ``lo``/``hi`` is
    ``None`` on a side the sample is too small to bound (then the other side is a one-sided ``level``
    bound); both ``None`` for an empty sample. Raises ``ValueError`` for ``q`` outside (0, 1)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile q must be in (0, 1), got {q}")
    xs = np.sort(np.asarray(values, dtype=float))
    n = int(xs.size)
    m = n if n_eff is None else max(0, min(int(n_eff), n))
    method = "order-statistics" if m == n else "order-statistics-clustered"
    if n == 0 or m == 0:
        return Bounds(None, None, level, m, method)
    lo_u, hi_u = _sides(m, q, level)

    def at(u: float) -> float:
        return _at_rank(xs, min(max(u * n / m, 1.0), float(n)) if m != n else u)

    return Bounds(at(lo_u) if lo_u is not None else None, at(hi_u) if hi_u is not None else None, level, m, method)


# ----------------------------------------------------------------------------------------- means and ratios


def mean_interval(samples: Sequence[float] | np.ndarray, level: float = LEVEL, method: str = "t") -> Bounds:
    """Student-t interval of the mean of independent ``samples`` (repeats, or time blocks of one run):
    ``mean ± t_{(1+level)/2, n-1} · s / sqrt(n)``. Fewer than 2 samples: unbounded (``None``, ``None``).
    ``method`` is recorded as given (``t-repeats``, ``t-blocks``)."""
    a = np.asarray(samples, dtype=float)
    n = int(a.size)
    if n < 2:
        return Bounds(None, None, level, n, method)
    m = float(a.mean())
    half = t_quantile((1 + level) / 2, n - 1) * float(a.std(ddof=1)) / math.sqrt(n)
    return Bounds(m - half, m + half, level, n, method)


def ratio_interval(
    a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, level: float = LEVEL
) -> Ratio | None:
    """``a / b`` for two sets of positive rate samples (requests/s, tokens/s): the ratio of their
    geometric means with a Welch interval on ``log a - log b`` (module doc; df by Welch-Satterthwaite).
    ``significant`` when the interval excludes 1. ``None`` when either side has fewer than 2 samples
    or a sample is not > 0 (no interval can be formed)."""
    la, lb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if la.size < 2 or lb.size < 2 or (la <= 0).any() or (lb <= 0).any():
        return None
    la, lb = np.log(la), np.log(lb)
    d = float(la.mean() - lb.mean())
    va, vb = float(la.var(ddof=1)) / la.size, float(lb.var(ddof=1)) / lb.size
    se2 = va + vb
    if se2 <= 0:
        r = math.exp(d)
        return Ratio(r, r, r, level, d != 0.0, math.inf)
    df = se2**2 / ((va**2 / (la.size - 1) if va else 0.0) + (vb**2 / (lb.size - 1) if vb else 0.0))
    half = t_quantile((1 + level) / 2, df) * math.sqrt(se2)
    lo, hi = math.exp(d - half), math.exp(d + half)
    return Ratio(math.exp(d), lo, hi, level, lo > 1.0 or hi < 1.0, df)


def _beta_ppf(p: float, a: float, b: float) -> float:
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if beta_inc(a, b, mid) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def proportion_interval(k: int, n: int, level: float = LEVEL) -> Bounds:
    """Clopper-Pearson interval of a proportion from ``k`` events in ``n`` trials (failed of submitted
    requests): ``lo = B^-1(alpha/2; k, n-k+1)`` (0 when ``k = 0``), ``hi = B^-1(1-alpha/2; k+1, n-k)``
    (1 when ``k = n``). ``n = 0``: unbounded. Raises ``ValueError`` unless ``0 <= k <= n``."""
    if not 0 <= k <= n:
        raise ValueError(f"proportion_interval needs 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return Bounds(None, None, level, 0, "clopper-pearson")
    alpha = 1.0 - level
    lo = 0.0 if k == 0 else _beta_ppf(alpha / 2, k, n - k + 1)
    hi = 1.0 if k == n else _beta_ppf(1 - alpha / 2, k + 1, n - k)
    return Bounds(lo, hi, level, n, "clopper-pearson")


def paired_ratio_interval(
    a_runs: Sequence[Sequence[float]], b_runs: Sequence[Sequence[float]], level: float = LEVEL
) -> Ratio | None:
    """``a / b`` from rounds of interleaved runs: ``a_runs[r]`` and ``b_runs[r]`` are the block rates
    (> 0) of each candidate's run in round ``r`` (module doc). ``d_r = mean log a_r - mean log b_r``;
    the estimate is ``exp(mean d_r)``. Its variance is the larger of (i) the within-run one,
    ``sum_r (s²_a,r / k_a,r + s²_b,r / k_b,r) / R²`` with Welch-Satterthwaite df, and (ii) with
    ``R >= 3`` rounds, the between-round ``var(d_r) / R`` with ``R - 1`` df. ``None`` when a round has
    fewer than 2 blocks on a side, a rate is not > 0, or the rounds differ in number."""
    if not a_runs or len(a_runs) != len(b_runs):
        return None
    ds, parts = [], []
    for ra, rb in zip(a_runs, b_runs, strict=True):
        la, lb = np.asarray(ra, dtype=float), np.asarray(rb, dtype=float)
        if la.size < 2 or lb.size < 2 or (la <= 0).any() or (lb <= 0).any():
            return None
        la, lb = np.log(la), np.log(lb)
        ds.append(float(la.mean() - lb.mean()))
        parts += [(float(la.var(ddof=1)) / la.size, la.size - 1), (float(lb.var(ddof=1)) / lb.size, lb.size - 1)]
    r_n = len(ds)
    d = float(np.mean(ds))
    within = sum(v for v, _ in parts) / r_n**2
    den = sum((v / r_n**2) ** 2 / k for v, k in parts if v > 0)
    df = within**2 / den if den > 0 else math.inf
    var = within
    if r_n >= 3:
        between = float(np.var(ds, ddof=1)) / r_n
        if between > within:
            var, df = between, float(r_n - 1)
    if var <= 0:
        r = math.exp(d)
        return Ratio(r, r, r, level, d != 0.0, math.inf)
    half = t_quantile((1 + level) / 2, df if math.isfinite(df) else 1e9) * math.sqrt(var)
    lo, hi = math.exp(d - half), math.exp(d + half)
    return Ratio(math.exp(d), lo, hi, level, lo > 1.0 or hi < 1.0, df)


def paired_rounds_ratio(a: Sequence[float], b: Sequence[float], level: float = LEVEL) -> Ratio | None:
    """``a / b`` from ``R >= 3`` rounds of interleaved runs, one whole-run figure (> 0) per candidate and
    round: the paired t interval on ``d_r = log a_r - log b_r`` (mean ``d``, sample SD ``s_d``, ``R - 1``
    df: ``exp(d ± t * s_d / sqrt(R))``; Student 1908, the paired form e.g. NIST/SEMATECH e-Handbook
    §7.3.1, https://www.itl.nist.gov/div898/handbook/prc/section3/prc31.htm, read 2026-12-01). The rounds
    are the independent replicates (a busy spell hits both candidates of a round, and cancels in
    ``d_r``); time blocks inside one run are not (on a real engine a short step's consecutive blocks
    alternate), so they do not enter. ``None`` with fewer than 3 rounds, unequal lengths or a figure
    that is not > 0."""
    if len(a) != len(b) or len(a) < 3:
        return None
    la, lb = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if (la <= 0).any() or (lb <= 0).any():
        return None
    ds = np.log(la) - np.log(lb)
    d, r_n = float(ds.mean()), len(ds)
    sd = float(ds.std(ddof=1))
    if sd <= 0:
        r = math.exp(d)
        return Ratio(r, r, r, level, d != 0.0, float(r_n - 1))
    half = t_quantile((1 + level) / 2, float(r_n - 1)) * sd / math.sqrt(r_n)
    lo, hi = math.exp(d - half), math.exp(d + half)
    return Ratio(math.exp(d), lo, hi, level, lo > 1.0 or hi < 1.0, float(r_n - 1))


# ----------------------------------------------------------------------------------------- SLO verdicts


def slo_verdict(bounds: Bounds | None, limit: float) -> SloVerdict:
    """Whether ``statistic <= limit`` holds by the interval: ``met`` when its upper bound is at or
    below the limit, ``broken`` when its lower bound is above it, else ``undetermined`` (the interval
    straddles the limit or is unbounded on the deciding side; no interval at all is undetermined)."""
    if bounds is None:
        return "undetermined"
    if bounds.hi is not None and bounds.hi <= limit:
        return "met"
    if bounds.lo is not None and bounds.lo > limit:
        return "broken"
    return "undetermined"
