"""Load models: closed loop at a fixed concurrency, open loop at a constant / Poisson / gamma rate.

A load step sends the given request specs (in order) and returns one :class:`RequestRecord` per
submitted request. Stopping by count sends them all; stopping by duration stops *starting* requests
when the duration has passed, lets in-flight ones finish for at most ``drain_s`` and then cancels the
rest (counted as ``cancelled``). Every request that was started is returned, so totals add up.

Open-loop arrivals are drawn once, up front, from ``numpy.random.default_rng(seed)`` so the request
sequence and its timing are reproducible. Gamma arrivals with shape ``k`` have the same mean rate and
a coefficient of variation ``1/sqrt(k)`` (k < 1 is burstier than Poisson, k = 1 is Poisson) — the
model guidellm and vLLM's ``benchmark_serving --burstiness`` use (read 2026-11-30).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from servelab.bench.load.waketimer import sleep_until_ns as sleep_until_ns  # re-exported: callers import it from here
from servelab.wire.client import send
from servelab.wire.types import RequestRecord, RequestSpec

_now = time.monotonic_ns

#: request id -> the W3C ``traceparent`` header that request is sent with (``--otlp-endpoint``:
#: :meth:`servelab.bench.tracing.TraceIds.header`)
Traceparent = Callable[[int], str]


def request_headers(
    headers: dict[str, str] | None, traceparent: Traceparent | None, request_id: int
) -> dict[str, str] | None:
    """The headers request ``request_id`` is sent with: ``headers``, plus its ``traceparent`` when tracing
    (``traceparent`` given), so its client span's ids reach the server (a gateway continues the trace)."""
    return headers if traceparent is None else {**(headers or {}), "traceparent": traceparent(request_id)}


@dataclass
class LoadModel:
    """What load to apply in one step.

    ``kind``: ``"closed"`` (``concurrency`` workers, each sends its next request as soon as its
    previous one ended) or ``"open"`` (requests arrive at ``rate_rps`` requests/s regardless of
    completions; ``arrival`` = ``constant`` | ``poisson`` | ``gamma`` with ``gamma_shape``; optional
    ``max_concurrency`` caps requests in flight — arrivals that wait for a slot show up as schedule
    lag). ``duration_s`` (optional) stops starting new requests after that many seconds.
    """

    kind: str = "closed"
    concurrency: int = 1
    rate_rps: float | None = None
    arrival: str = "poisson"
    gamma_shape: float = 0.5
    max_concurrency: int | None = None
    duration_s: float | None = None

    @property
    def label(self) -> str:
        """Short name of the step, e.g. ``c4`` or ``r2.5``."""
        return f"c{self.concurrency}" if self.kind == "closed" else f"r{self.rate_rps:g}"


def arrival_offsets_s(n: int, rate_rps: float, arrival: str, seed: int, gamma_shape: float = 0.5) -> np.ndarray:
    """Send offsets (seconds from the step start) of ``n`` open-loop arrivals at ``rate_rps``.

    ``constant``: evenly spaced ``1/rate``; ``poisson``: exponential gaps with mean ``1/rate``;
    ``gamma``: gamma gaps with shape ``k`` and scale ``1/(rate*k)`` (same mean, CV ``1/sqrt(k)``).
    The first request goes at offset 0.

    Raises ``ValueError`` for a rate or shape that is not finite and > 0, and for offsets that are
    not finite or do not fit in int64 nanoseconds (292 years): a rate of 1e-300 req/s would overflow
    the clock and send every request at once. ``servelab bench`` bounds both first
    (:data:`servelab.bench.options.MIN_RATE_RPS`, :data:`~servelab.bench.options.MIN_BURSTINESS`).
    """
    if not (math.isfinite(rate_rps) and rate_rps > 0):
        raise ValueError(f"rate_rps must be finite and > 0, got {rate_rps!r}")
    if arrival == "gamma" and not (math.isfinite(gamma_shape) and gamma_shape > 0):
        raise ValueError(f"gamma_shape must be finite and > 0, got {gamma_shape!r}")
    mean_gap_s = 1.0 / rate_rps  # inf below ~1e-308 req/s
    scale_s = mean_gap_s / gamma_shape if arrival == "gamma" else mean_gap_s
    if not math.isfinite(scale_s):
        raise ValueError(f"rate_rps {rate_rps:g} (gamma_shape {gamma_shape:g}) gives no finite gap between arrivals")
    rng = np.random.default_rng(seed)
    if arrival == "constant":
        gaps = np.full(n, mean_gap_s)
    elif arrival == "poisson":
        gaps = rng.exponential(mean_gap_s, n)
    elif arrival == "gamma":
        gaps = rng.gamma(gamma_shape, scale_s, n)
    else:
        raise ValueError(f"unknown arrival process {arrival!r}")
    if n == 0:
        return gaps
    gaps[0] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below, not warned about
        offsets = np.cumsum(gaps)
    if not np.isfinite(offsets[-1]) or offsets[-1] >= _MAX_OFFSET_NS / 1e9:
        raise ValueError(
            f"{n} arrivals at {rate_rps:g} requests/s ({arrival}) reach {offsets[-1]:.3g} s, past the "
            f"{_MAX_OFFSET_NS / 1e9:.3g} s a step's clock holds; raise the rate or send fewer requests"
        )
    return offsets


_MAX_OFFSET_NS = float(2**62)  # int64 nanoseconds with room for the step's start time added


class CyclicSpecs(Sequence[RequestSpec]):
    """``n`` requests drawn cyclically from a finite pool (duration-bounded steps need more requests
    than are worth generating with exact token lengths). Immutable, indexable."""

    def __init__(self, pool: list[RequestSpec], n: int) -> None:
        if not pool:
            raise ValueError("empty request pool")
        self._pool, self._n = pool, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._pool[i % len(self._pool)]


async def run_step(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    specs: Sequence[RequestSpec],
    load: LoadModel,
    *,
    step: str = "",
    seed: int = 0,
    warmup: bool = False,
    first_id: int = 0,
    timeout_s: float = 600.0,
    drain_s: float = 30.0,
    headers: dict[str, str] | None = None,
    on_done: Callable[[RequestRecord, RequestSpec], None] | None = None,
    records: list[RequestRecord] | None = None,
    start_ns: int | None = None,
    offsets_ns: Sequence[int] | None = None,
    ids: Sequence[int] | None = None,
    dispatch_lags_ns: list[int] | None = None,
    traceparent: Traceparent | None = None,
) -> list[RequestRecord]:
    """Run one load step and return every started request's record (in id order).

    ``on_done(rec, spec)`` is called as each request ends (used to append to requests.jsonl at once,
    so a crash or Ctrl-C keeps every finished request). Records get ids ``first_id, first_id+1, …``,
    or ``ids[i]`` for ``specs[i]`` when ``ids`` is given (a worker's share of a step keeps the ids the
    single-process run gives the same requests). Cancellation of this coroutine cancels all in-flight
    requests (they are returned as ``cancelled`` through ``on_done`` before the cancellation propagates).

    A worker of a multi-process run (:mod:`servelab.bench.load.workers`) passes ``start_ns``, the step's
    common start on this host's ``time.monotonic_ns()`` clock (default: now, plus 2 ms in an open loop),
    and, open loop, ``offsets_ns``: the intended send offsets from ``start_ns`` of ``specs`` (its share
    of the one global :func:`arrival_offsets_s` draw; default: drawn here from ``seed``). The duration
    limit counts from ``start_ns``. ``dispatch_lags_ns`` (open loop), when given, receives for each
    arrival how many ns after its intended time the loop woke to send it: the generator's own lateness,
    before any wait for a ``max_concurrency`` slot. ``traceparent`` (``--otlp-endpoint``), when given, maps a
    request id to the W3C ``traceparent`` header that request is sent with.
    """
    if records is None:  # a caller may pass its own list to see the records of an interrupted step
        records = []
    inflight: set[asyncio.Task[None]] = set()
    offs_ns = _schedule(load, len(specs), seed, offsets_ns)
    t0 = start_ns if start_ns is not None else _now() + (_START_LEAD_NS if load.kind == "open" else 0)
    deadline = t0 + int(load.duration_s * 1e9) if load.duration_s else None

    async def one(i: int, spec: RequestSpec, scheduled_ns: int, sem: asyncio.Semaphore | None) -> None:
        rec = RequestRecord(
            request_id=first_id + i if ids is None else ids[i],
            workload=spec.workload,
            step=step,
            warmup=warmup,
            scheduled_ns=scheduled_ns,
        )
        records.append(rec)
        hdrs = request_headers(headers, traceparent, rec.request_id)
        try:
            if sem is not None:
                async with sem:
                    await send(session, base_url, model, spec, rec, timeout_s=timeout_s, headers=hdrs)
            else:
                await send(session, base_url, model, spec, rec, timeout_s=timeout_s, headers=hdrs)
        finally:
            if on_done is not None:
                on_done(rec, spec)

    try:
        if load.kind == "closed":
            it = iter(enumerate(specs))
            if start_ns is not None:
                await sleep_until_ns(t0)

            async def worker() -> None:
                for i, spec in it:
                    now = _now()
                    if deadline is not None and now >= deadline:
                        return
                    await one(i, spec, now, None)

            workers = [asyncio.ensure_future(worker()) for _ in range(max(1, load.concurrency))]
            inflight.update(workers)
            await _wait_with_drain(workers, deadline, drain_s)
        elif load.kind == "open":
            sem = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
            for i, spec in enumerate(specs):
                sched = t0 + offs_ns[i]
                if deadline is not None and sched >= deadline:
                    break
                await sleep_until_ns(sched)
                if dispatch_lags_ns is not None:
                    dispatch_lags_ns.append(_now() - sched)
                task = asyncio.ensure_future(one(i, spec, sched, sem))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
            await _wait_with_drain(list(inflight), deadline, drain_s)
        else:
            raise ValueError(f"unknown load kind {load.kind!r}")
    except asyncio.CancelledError:
        for t in list(inflight):
            t.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
        raise
    records.sort(key=lambda r: r.request_id)
    return records


def _schedule(load: LoadModel, n: int, seed: int, offsets_ns: Sequence[int] | None) -> Sequence[int]:
    """The open-loop send offsets (ns) of a step's ``n`` requests: ``offsets_ns`` as given, or drawn from
    ``seed``; empty for a closed loop. Raises ``ValueError`` for an open loop without a rate or with
    the wrong number of offsets."""
    if load.kind != "open":
        return []
    if not load.rate_rps:
        raise ValueError("open loop needs rate_rps")
    if offsets_ns is not None:
        if len(offsets_ns) != n:
            raise ValueError(f"{len(offsets_ns)} send offsets for {n} requests")
        return offsets_ns
    # drawn before the clock starts, so the draw itself cannot delay the first arrivals
    return (arrival_offsets_s(n, load.rate_rps, load.arrival, seed, load.gamma_shape) * 1e9).astype(np.int64).tolist()


_START_LEAD_NS = 2_000_000  # open loop: the first arrival is 2 ms after the step's setup, not during it


async def _wait_with_drain(tasks: list[asyncio.Task[None]], deadline: int | None, drain_s: float) -> None:
    """Wait for ``tasks``; with a deadline, give in-flight work ``drain_s`` after it, then cancel."""
    if not tasks:
        return
    if deadline is None:
        await asyncio.gather(*tasks)
        return
    remaining = max(0.0, (deadline - _now()) / 1e9) + drain_s
    done, pending = await asyncio.wait(tasks, timeout=remaining)
    for t in pending:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
