"""Arrival processes: reproducible, right mean rate, right burstiness."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.bench.load.step import arrival_offsets_s


def test_constant_rate():
    offs = arrival_offsets_s(5, 4.0, "constant", seed=1)
    assert offs == pytest.approx([0, 0.25, 0.5, 0.75, 1.0])


@pytest.mark.parametrize("arrival,cv", [("poisson", 1.0), ("gamma", 1 / np.sqrt(0.25))])
def test_mean_rate_and_cv(arrival, cv):
    offs = arrival_offsets_s(20001, 10.0, arrival, seed=3, gamma_shape=0.25)
    gaps = np.diff(offs)
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_reproducible_by_seed():
    a = arrival_offsets_s(100, 3.0, "poisson", seed=7)
    assert np.array_equal(a, arrival_offsets_s(100, 3.0, "poisson", seed=7))
    assert not np.array_equal(a, arrival_offsets_s(100, 3.0, "poisson", seed=8))


def test_bad_arrival():
    with pytest.raises(ValueError):
        arrival_offsets_s(3, 1.0, "weibull", seed=0)


def test_sleep_until_is_sub_millisecond():
    """Open-loop arrivals wake on time, not on the event loop's 1 ms timer grid (median of 40 waits)."""
    import asyncio
    import time

    from servelab.bench.load.step import sleep_until_ns

    async def main() -> list[int]:
        errs = []
        for i in range(40):
            target = time.monotonic_ns() + 3_300_000 + 100_000 * (i % 7)
            await sleep_until_ns(target)
            errs.append(time.monotonic_ns() - target)
        return errs

    errs = sorted(asyncio.run(main()))
    assert errs[0] >= 0
    assert errs[len(errs) // 2] < 300_000, errs  # median late by < 0.3 ms
