"""Peak load formulas (servelab.capacity.peak) against hand-computed values."""

from __future__ import annotations

from servelab.capacity.peak import peak_load
from servelab.capacity.profile import TrafficProfile


def _profile(**kw: object) -> TrafficProfile:
    base = {
        "daily_active_users": 8640,
        "requests_per_user_per_day": 10,
        "peak_to_mean": 4,
        "retry_rate": 0.05,
        "burst_factor": 3,
        "input_tokens": {"values": [100, 300]},
        "output_tokens": {"mean": 50},
        "long_share": 0.1,
        "long_input_tokens": {"mean": 2200},
    }
    return TrafficProfile.model_validate({**base, **kw})


def test_peak_formulas() -> None:
    pk = peak_load(_profile(), hold_s=2.0)
    assert abs(pk.mean_rps.value - 1.0) < 1e-12  # 8640 * 10 / 86400
    assert abs(pk.peak_rps.value - 4.0) < 1e-12
    assert abs(pk.offered_peak_rps.value - 4.2) < 1e-12  # retries
    assert abs(pk.burst_rps.value - 12.6) < 1e-12
    assert abs(pk.concurrent_streams.value - 8.4) < 1e-12  # Little: 4.2 * 2 s
    assert abs(pk.mean_input_tokens - (0.9 * 200 + 0.1 * 2200)) < 1e-9
    assert abs(pk.output_tps.value - 4.2 * 50) < 1e-9
    assert "86400" in pk.mean_rps.formula and "Little" in pk.concurrent_streams.formula


def test_hourly_shape_and_declared_hold() -> None:
    shape = [1.0] * 23 + [13.0]  # mean 36/24 = 1.5, peak 13
    pk = peak_load(_profile(peak_to_mean=None, hourly_shape=shape, stream_hold_s=5.0), hold_s=99.0)
    assert abs(pk.peak_rps.value - 13 / 1.5) < 1e-9
    assert abs(pk.concurrent_streams.value - pk.offered_peak_rps.value * 5.0) < 1e-9


def test_lognormal_lengths_hit_mean_and_p95() -> None:
    import numpy as np

    p = _profile(output_tokens={"mean": 200, "p95": 600})
    x = p.output_tokens.sample(200_000, np.random.default_rng(0))
    assert abs(x.mean() - 200) < 0.02 * 200 and abs(np.percentile(x, 95) - 600) < 0.03 * 600
