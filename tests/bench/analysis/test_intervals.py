"""Confidence intervals (servelab.bench.analysis.intervals): coverage of the percentile intervals on a known
latency distribution at every sample size the default trial uses, unbounded sides where the sample is
too small, special functions against reference values, ratio significance, SLO verdicts.

Every simulation is seeded (numpy default_rng), so the figures are the same on every run."""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from servelab.bench.analysis.intervals import (
    Bounds,
    beta_inc,
    mean_interval,
    proportion_interval,
    quantile_interval,
    quantile_min_n,
    ratio_interval,
    slo_verdict,
    t_quantile,
)
from servelab.trial.spec import default_experiment


def default_sizes() -> list[int]:
    """Every sample size a percentile of the default trial is computed from: one load step, the
    load steps pooled over the repeats, the arrival-rate run, one capacity-search probe."""
    e = default_experiment()
    sizes = {e.requests_per_step, e.arrival_test.requests}
    repeats = getattr(e, "repeats", 1)
    sizes.add(e.requests_per_step * repeats)
    cap = getattr(e, "capacity", None)
    if cap is not None and getattr(cap, "enabled", False):
        sizes.add(cap.requests)
    return sorted(sizes)


SIGMA = 0.6  # lognormal latency (median 1 s, long right tail), as TTFT/E2E look under load


def _true_quantile(q: float) -> float:
    return math.exp(SIGMA * NormalDist().inv_cdf(q))


@pytest.mark.parametrize("q", [0.5, 0.95, 0.99])
def test_percentile_interval_coverage_at_default_sizes(q: float) -> None:
    rng = np.random.default_rng(20261201)
    true = _true_quantile(q)
    trials = 4000  # >= 400 per size (acceptance); 4000 keeps the estimate's own noise near ±0.35 %
    for n in default_sizes():
        covered = 0
        for _ in range(trials):
            b = quantile_interval(rng.lognormal(0.0, SIGMA, n), q)
            covered += (b.lo is None or b.lo <= true) and (b.hi is None or b.hi >= true)
        cov = covered / trials
        assert 0.93 <= cov <= 0.97, f"P{q * 100:g} n={n}: coverage {cov:.3f} outside 93-97 %"


def test_coverage_holds_for_other_shapes_and_bounded_sizes() -> None:
    """Distribution-free: the same holds for an exponential and at a size where P95 is bounded."""
    rng = np.random.default_rng(7)
    for n, q in ((100, 0.95), (30, 0.5), (8, 0.95)):
        true = -math.log(1 - q)
        cov = np.mean(
            [
                (b.lo is None or b.lo <= true) and (b.hi is None or b.hi >= true)
                for b in (quantile_interval(rng.exponential(1.0, n), q) for _ in range(2000))
            ]
        )
        assert 0.93 <= cov <= 0.97, (n, q, cov)


def test_small_samples_are_unbounded_not_bare_numbers() -> None:
    assert quantile_min_n(0.5) == 6 and quantile_min_n(0.95) == 72 and quantile_min_n(0.99) == 368
    x = np.arange(1.0, 9.0)  # n = 8
    p95 = quantile_interval(x, 0.95)
    assert p95.hi is None and p95.lo is not None and not p95.bounded  # upper side needs 72 samples
    p50 = quantile_interval(x, 0.5)
    assert p50.bounded and p50.lo < 4.5 < p50.hi
    assert quantile_interval([], 0.5) == Bounds(None, None, 0.95, 0, "order-statistics")
    big = quantile_interval(np.arange(1.0, 101.0), 0.95)
    assert big.bounded and big.lo < 95 < big.hi <= 100


def test_special_functions_match_reference_values() -> None:
    # Student t: tables (Abramowitz & Stegun 26.7); incomplete beta at integers = binomial tail
    assert t_quantile(0.975, 1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(0.975, 10) == pytest.approx(2.2281, abs=1e-4)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.95996, abs=1e-4)
    n, q = 8, 0.5
    for r in range(1, n + 1):
        tail = sum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(r, n + 1))
        assert beta_inc(r, n + 1 - r, q) == pytest.approx(tail, abs=1e-12)


def test_ratio_identical_vs_thirty_percent() -> None:
    rng = np.random.default_rng(3)
    false_pos = 0
    for _ in range(400):
        a, b = rng.normal(100, 10, 8), rng.normal(100, 10, 8)
        r = ratio_interval(a, b)
        assert r is not None
        false_pos += r.significant
    assert false_pos / 400 <= 0.10
    hits = [ratio_interval(rng.normal(130, 13, 8), rng.normal(100, 10, 8)) for _ in range(200)]
    assert all(h is not None for h in hits)
    assert np.mean([h.significant and h.lo > 1 for h in hits if h]) >= 0.9
    assert ratio_interval([1.0], [1.0, 2.0]) is None  # one sample: no interval


def test_mean_interval_and_slo_verdicts() -> None:
    m = mean_interval([10.0, 12.0, 11.0, 13.0], method="t-blocks")
    assert m.lo < 11.5 < m.hi and m.method == "t-blocks" and m.n == 4
    assert mean_interval([5.0]).lo is None
    assert slo_verdict(Bounds(1.0, 2.0, 0.95, 10, "x"), 3.0) == "met"
    assert slo_verdict(Bounds(3.5, None, 0.95, 10, "x"), 3.0) == "broken"
    assert slo_verdict(Bounds(1.0, None, 0.95, 10, "x"), 3.0) == "undetermined"  # upper side unbounded
    assert slo_verdict(Bounds(2.0, 4.0, 0.95, 10, "x"), 3.0) == "undetermined"
    assert slo_verdict(None, 3.0) == "undetermined"


def test_clopper_pearson_error_rate() -> None:
    b = proportion_interval(0, 8)
    assert b.lo == 0.0 and b.hi == pytest.approx(1 - 0.025 ** (1 / 8), abs=1e-9)  # 0 of 8: up to 37 %
    assert slo_verdict(b, 0.01) == "undetermined"  # 8 requests cannot show error_rate <= 1 %
    assert slo_verdict(proportion_interval(0, 400), 0.01) == "met"
    assert slo_verdict(proportion_interval(5, 10), 0.01) == "broken"
    rng = np.random.default_rng(11)  # coverage of the exact interval is >= 95 %
    ivs = [proportion_interval(int(k), 40) for k in rng.binomial(40, 0.1, 2000)]
    cov = np.mean([b.lo <= 0.1 <= b.hi for b in ivs])
    assert cov >= 0.95
