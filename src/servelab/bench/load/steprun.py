"""What one load step of a bench left, as :class:`servelab.bench.load.runner.Bench` gathers it before the step is
summarised: :class:`StepRun` (the records this process sent, or the lines the workers sent, the worker reports,
the lost parts), :func:`this_process` (this process's report as the step's only load generator),
:func:`line_id` (the request id of a ``requests.jsonl`` line) and :func:`pruned` (a result model as the summary
records it).
"""

from __future__ import annotations

from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import TypeVar

import orjson

from servelab.bench.analysis import metrics as M
from servelab.bench.load.lines import HOSTNAME
from servelab.bench.load.merge import summary_record
from servelab.bench.load.saturation import CpuMeter, worker_step
from servelab.bench.load.step import LoadModel
from servelab.bench.load.worker import LineBatch
from servelab.bench.results import LostPart, RequestLine, ResultModel, WorkerStep
from servelab.wire.types import RequestRecord

__all__ = ["StepRun", "line_id", "pruned", "this_process"]

_M = TypeVar("_M", bound=ResultModel)


def pruned(model: _M) -> _M:
    """``model`` without the fields it holds as ``None``, as the summary records them (unset, not null)."""
    return type(model).model_validate(model.model_dump(exclude_none=True))


def this_process(
    meter: CpuMeter, load: LoadModel, recs: list[RequestRecord], assigned: int | None, dispatch_ns: list[int] | None
) -> WorkerStep:
    """The report of this process as the step's only load generator (worker 0): its CPU over the step,
    its concurrency, ``assigned`` requests (``None``: a step ended by its duration or a driven workload)
    and the schedule and dispatch lags of its finished requests ``recs``."""
    lags = [x for x in (M.schedule_lag_s(r) for r in recs) if x is not None]
    return worker_step(
        0,
        HOSTNAME,
        meter,
        concurrency=load.concurrency if load.kind == "closed" else load.max_concurrency,
        assigned=assigned,
        finished=len(recs),
        schedule_lags_s=lags,
        dispatch_lags_ns=dispatch_ns,
    )


@dataclass
class StepRun:
    """What one load step left: its records (single process) or lines (workers), the worker reports,
    the lost parts, and the single process's dispatch-lag samples."""

    records: list[RequestRecord] = dc_field(default_factory=list)
    batches: list[LineBatch] = dc_field(default_factory=list)
    workers: list[WorkerStep] = dc_field(default_factory=list)
    lost: list[LostPart] = dc_field(default_factory=list)
    dispatch_ns: list[int] | None = None

    def lines(self) -> list[bytes]:
        """Every line the workers sent, in arrival order."""
        return [line for b in self.batches for line in b.split()]

    def finished(self) -> list[RequestRecord]:
        """The finished records, aligned for summaries (:func:`servelab.bench.load.merge.summary_record`)."""
        if self.batches:
            return sorted(
                (summary_record(RequestLine.model_validate_json(b)) for b in self.lines()), key=lambda r: r.request_id
            )
        return [r for r in self.records if r.end_ns is not None]


def line_id(line: bytes) -> int:
    """The request id of a ``requests.jsonl`` line (written first: ``{"id":123,...``)."""
    if line.startswith(b'{"id":'):
        end = line.find(b",", 6)
        if end > 6:
            return int(line[6:end])
    return int(orjson.loads(line)["id"])
