"""The :class:`~servelab.bench.load.config.BenchConfig` load fields of a trial's load steps: closed loop
(``concurrency``) or open loop (``rates_rps`` with the arrival process of the first step)."""

from __future__ import annotations

from typing import NamedTuple

from servelab.bench.load.step import LoadModel

__all__ = ["BenchLoad", "bench_load"]


class BenchLoad(NamedTuple):
    """The :class:`BenchConfig` load fields for a list of load steps: ``concurrency`` (closed loop) or
    ``rates_rps`` (open loop, req/s) with the arrival process of the first step."""

    concurrency: list[int] | None
    rates_rps: list[float] | None
    arrival: str = "poisson"
    gamma_shape: float = 0.5
    max_concurrency: int | None = None


def bench_load(models: list[LoadModel]) -> BenchLoad:
    """:class:`BenchLoad` for the load steps ``models`` (all closed loop or all open loop, as
    :meth:`Steps.load_models` and :meth:`Experiment.arrival_load` give them)."""
    if all(m.kind == "closed" for m in models):
        return BenchLoad([m.concurrency for m in models], None)
    first = models[0]
    return BenchLoad(
        None, [float(m.rate_rps or 0) for m in models], first.arrival, first.gamma_shape, first.max_concurrency
    )
