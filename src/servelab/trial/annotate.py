"""Figures the trial adds to a bench run's step summaries, from its ``requests.jsonl``: the steady
window of each step (:func:`servelab.bench.analysis.steady.steady_window`), the repeat round, and for a ``mix``
step the same figures per class of request in the mix (``by_class``, measured while they ran
together; :func:`servelab.bench.analysis.summarize.step_summary` of each class's requests, with the trial's
objectives), so that a structured request's latency inside the mix is visible apart."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from servelab.bench.analysis.slo import Objective
from servelab.bench.analysis.steady import steady_window
from servelab.bench.analysis.summarize import step_summary
from servelab.bench.load.lines import record_from_json
from servelab.bench.load.step import LoadModel
from servelab.bench.results import RequestLine, StepSummary
from servelab.wire.types import RequestRecord

__all__ = ["annotate"]


def _lines(path: Path) -> list[RequestLine]:
    out: list[RequestLine] = []
    if not path.is_file():
        return out
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                try:
                    out.append(RequestLine.model_validate_json(raw))
                except ValidationError:
                    continue  # a line cut by a crash: the bench's own summary already left it out
    return out


def annotate(
    steps: Sequence[StepSummary], requests_jsonl: Path, objectives: list[Objective], repeat: int | None = None
) -> None:
    """Set ``steady``, ``repeat`` and (``mix`` steps) ``by_class`` on every step of ``steps`` that ran,
    in place, from the bench's ``requests_jsonl``. A missing file leaves the steps as they are."""
    by_step: dict[tuple[str, str], list[RequestRecord]] = {}
    for line in _lines(requests_jsonl):
        if line.warmup:
            continue
        by_step.setdefault((line.step_workload or line.workload, line.step), []).append(record_from_json(line))
    for s in steps:
        s.repeat = repeat
        if s.skipped:
            continue
        recs = by_step.get((s.workload, s.step), [])
        target = s.load.concurrency if s.load.kind == "closed" else None
        s.steady = steady_window(recs, target)
        if s.workload != "mix":
            continue
        load = LoadModel(**s.load.model_dump(exclude_none=True))
        classes: dict[str, list[RequestRecord]] = {}
        for r in recs:
            classes.setdefault(r.workload, []).append(r)
        s.by_class = {}
        for name, rs in classes.items():
            sub = step_summary(name, load, rs, objectives, None, s.started_unix_s)
            sub.steady = None
            s.by_class[name] = sub
