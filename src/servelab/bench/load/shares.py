"""How one load step is split among load-generator workers, exactly and deterministically
(:func:`plan_step`; the rules are in :mod:`servelab.bench.load.workers`): each worker's share of the
concurrency or of the arrival schedule, and the request specs it sends."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, overload

from servelab.bench.analysis.slo import Objective
from servelab.bench.load.step import LoadModel
from servelab.bench.tracing import TraceIds
from servelab.wire.types import RequestSpec


def split_count(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal counts, the first ``total % parts`` one larger:
    ``split_count(5, 2) == [3, 2]``. Raises ``ValueError`` for ``parts < 1``."""
    if parts < 1:
        raise ValueError(f"cannot split among {parts} workers")
    q, r = divmod(total, parts)
    return [q + (1 if k < r else 0) for k in range(parts)]


@dataclass(frozen=True)
class Share(Sequence[int]):
    """The global request indices ``j < n`` of one worker: those with ``offset <= j % period < offset +
    width``, in increasing order (closed loop: ``period`` = concurrency, the worker's loop slots;
    open loop: ``period`` = workers, ``width`` 1). Indexable without listing them (a step bounded by
    ``--duration`` may hold millions)."""

    n: int
    period: int
    offset: int
    width: int

    def __len__(self) -> int:
        full, rem = divmod(self.n, self.period)
        return full * self.width + max(0, min(rem, self.offset + self.width) - self.offset)

    @overload
    def __getitem__(self, k: int) -> int: ...

    @overload
    def __getitem__(self, k: slice) -> list[int]: ...

    def __getitem__(self, k: int | slice) -> int | list[int]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        size = len(self)
        if k < 0:
            k += size
        if not 0 <= k < size:
            raise IndexError(k)
        q, r = divmod(k, self.width)
        return q * self.period + self.offset + r


class Picked(Sequence[Any]):
    """For the ``k``-th request of ``share`` (global index ``j = share[k]``): ``base + j`` when ``items`` is
    None (its id); ``items[k]`` when ``own`` (the worker's own specs, in share order); else
    ``items[j % len(items)]`` (the pool of a duration-bounded step, cycled as
    :class:`servelab.bench.load.step.CyclicSpecs` does)."""

    def __init__(self, share: Share, items: Sequence[Any] | None = None, base: int = 0, own: bool = False) -> None:
        self._share, self._items, self._base, self._own = share, items, base, own

    def __len__(self) -> int:
        return len(self._share)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if self._own and self._items is not None:
            if not -len(self) <= k < len(self):
                raise IndexError(k)
            return self._items[k]
        j = self._share[k]
        return self._base + j if self._items is None else self._items[j % len(self._items)]


@dataclass
class RunContext:
    """What every worker needs for the whole run (sent once): the server, the per-request work
    (``counter``: the client tokenizer or ``None``; ``objectives`` for the per-request gates;
    ``trace_ids``: with ``--otlp-endpoint``, the run's trace ids, whose ``traceparent`` each request carries)."""

    base_url: str
    model: str
    headers: dict[str, str] | None
    timeout_s: float
    objectives: list[Objective]
    counter: Any = None
    drain_s: float = 30.0
    trace_ids: TraceIds | None = None


@dataclass
class StepTask:
    """One worker's share of one step (or of its warmup): ``load`` is the worker's own load (its
    concurrency, or the rate and its part of ``max_concurrency``); request ``k`` of the share has id
    ``first_id + j`` for ``j = share[k]`` and is ``pool[k]`` when ``own`` (only the worker's own specs are
    sent), else ``pool[j % len(pool)]`` (a cycled pool); ``offsets_ns`` (open loop)
    are the intended send offsets of the share from the common start; ``assigned`` how many it should
    finish (``None``: a closed loop ended by ``--duration``)."""

    worker: int
    step: str
    step_index: int
    step_workload: str
    warmup: bool
    load: LoadModel
    pool: list[RequestSpec]
    share: Share
    first_id: int
    offsets_ns: list[int] | None = None
    assigned: int | None = None
    own: bool = False


def plan_step(
    load: LoadModel,
    pool: list[RequestSpec],
    n: int,
    workers: list[int],
    *,
    first_id: int,
    step: str,
    step_index: int,
    step_workload: str,
    warmup: bool,
    offsets_ns: Sequence[int] | None = None,
    fixed_count: bool = True,
) -> dict[int, StepTask]:
    """Split one step of ``n`` requests (drawn cyclically from ``pool``) among ``workers`` (their
    indices, in order) as the module doc says; returns ``{worker: task}`` (workers with no share of a
    closed loop left out). ``offsets_ns``: the step's global open-loop schedule (``n`` values, ns);
    ``fixed_count`` False: ``n`` is only a bound (a closed loop ended by ``--duration``), so no worker
    has an ``assigned`` count.
    Raises ``ValueError`` for an open loop without its schedule or a cap below the number of workers."""
    out: dict[int, StepTask] = {}
    w = len(workers)
    dur_ns = int(load.duration_s * 1e9) if load.duration_s else None
    if load.kind == "closed":
        slots = split_count(max(1, load.concurrency), w)
        a = 0
        for k, c in zip(workers, slots, strict=True):
            if c:
                share = Share(n, max(1, load.concurrency), a, c)
                assigned = len(share) if fixed_count else None
                specs, own = _specs_for(pool, n, share)
                out[k] = StepTask(
                    k,
                    step,
                    step_index,
                    step_workload,
                    warmup,
                    replace(load, concurrency=c),
                    specs,
                    share,
                    first_id,
                    None,
                    assigned,
                    own,
                )
            a += c
        return out
    if offsets_ns is None or len(offsets_ns) != n:
        raise ValueError("an open-loop step needs its global schedule, one offset per request")
    caps: list[int | None] = [None] * w
    if load.max_concurrency:
        if load.max_concurrency < w:
            raise ValueError(f"--max-concurrency {load.max_concurrency} is below the {w} workers")
        caps = list(split_count(load.max_concurrency, w))
    for pos, (k, cap) in enumerate(zip(workers, caps, strict=True)):
        share = Share(n, w, pos, 1)
        offs = [int(offsets_ns[j]) for j in share]
        assigned = sum(1 for o in offs if dur_ns is None or o < dur_ns)
        specs, own = _specs_for(pool, n, share)
        out[k] = StepTask(
            k,
            step,
            step_index,
            step_workload,
            warmup,
            replace(load, max_concurrency=cap),
            specs,
            share,
            first_id,
            offs,
            assigned,
            own,
        )
    return out


def _specs_for(pool: list[RequestSpec], n: int, share: Share) -> tuple[list[RequestSpec], bool]:
    """What a worker is sent of the step's requests: its own (``own`` True) when the step lists every
    request, else the whole (short, cycled) pool."""
    if len(pool) >= n:
        return [pool[j] for j in share], True
    return pool, False
