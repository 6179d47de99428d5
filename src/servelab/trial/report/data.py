"""What the report reads: the record (records of older schema versions migrated), the per-request JSONL
files it names, and the few facts derived from them that several charts and tables share — a step's
load value, the SLO limits, the chart series. Missing or damaged pieces come back as notes, never as
exceptions."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, JsonValue, ValidationError

from servelab.bench.analysis.slo import parse_slo
from servelab.bench.results import Interval, RequestLine, StepSummary
from servelab.trial.report.fmt import finite
from servelab.trial.results import CandidateResult, JsonObject, TrialRecord, read_record
from servelab.wire import ConfigError

Series = list[tuple[str, str, list[StepSummary]]]
"""Chart series: (label, colour, the steps that ran)."""


def load_record(run_dir: str | Path) -> TrialRecord:
    """Read ``run_dir/record.json`` (docs/record-schema.md) as a :class:`TrialRecord`, records of
    older schema versions migrated (:func:`servelab.trial.results.read_record`).

    Raises :class:`servelab.wire.ConfigError` when ``run_dir`` has no ``record.json``, the file is not
    a JSON object, or it is not a trial record (one line naming the first bad field).
    """
    return read_record(Path(run_dir) / "record.json" if Path(run_dir).is_dir() else Path(run_dir))


def read_jsonl(path: Path) -> tuple[list[RequestLine], str | None]:
    """Request lines of a JSONL file and a note (missing file, bad lines) or None."""
    if not path.is_file():
        return [], f"{path.name} not found"
    rows, bad = [], 0
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(RequestLine.model_validate_json(line))
                except ValidationError:
                    bad += 1
    except OSError as e:
        return [], f"cannot read {path.name}: {e}"
    return rows, (f"{bad} unreadable line(s) skipped" if bad else None)


def safe_rel(run: Path, rel: str | None) -> Path | None:
    """``run/rel`` when ``rel`` is a relative path inside the run folder, else None."""
    if not rel:
        return None
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return run / p


def step_x(step: StepSummary) -> float | None:
    """The load value of a step: concurrency (closed loop) or rate in req/s (open loop)."""
    load = step.load
    v = finite(load.concurrency) if load.kind != "open" else finite(load.rate_rps)
    if v is None:
        m = re.fullmatch(r"[cr]([0-9.]+)", step.step)
        v = float(m.group(1)) if m else None
    return v


def axis_title(steps: list[StepSummary]) -> str:
    """The load axis' title: concurrency, arrival rate, or both."""
    kinds = {s.load.kind for s in steps}
    if kinds == {"open"}:
        return "arrival rate (req/s)"
    if kinds == {"closed"} or not kinds:
        return "concurrency (requests in flight)"
    return "concurrency or rate (req/s)"


def slo_limits(rec: TrialRecord) -> tuple[dict[tuple[str, str], float], float | None, list[str]]:
    """``({(metric, stat): limit_s}, error_rate_limit, objective names)`` from ``goal.slo``;
    unparsable parts are skipped (the report never raises)."""
    lat: dict[tuple[str, str], float] = {}
    err = None
    names = []
    for p in rec.goal.slo:
        try:
            objs = parse_slo(p)
        except ConfigError:
            continue
        for o in objs:
            names.append(o.name)
            if o.metric == "error_rate":
                err = o.limit
            else:
                lat[(o.metric, o.stat)] = o.limit
    return lat, err, names


def workloads(steps: list[StepSummary]) -> list[str]:
    """The workloads of ``steps`` in order of first appearance."""
    return list(dict.fromkeys(s.workload for s in steps))


def series(rec: TrialRecord, label: Callable[[str], str], colors: Callable[[int, str], str]) -> Series:
    """One chart series per candidate of ``rec`` that ran load steps."""
    return [(label(n), colors(i, n), steps) for i, n in enumerate(rec.names()) if (steps := rec.result(n).ran_steps())]


def total_tps(s: StepSummary) -> tuple[float | None, Interval | None]:
    """Total output tok/s of a step (steady window when the trial added one) and its interval."""
    st = s.steady
    if st is not None and st.output_tokens_per_s is not None:
        return st.output_tokens_per_s, st.output_tokens_per_s_ci
    return finite(s.throughput.output_tokens_per_s), None


def pareto_steps(c: CandidateResult) -> list[StepSummary]:
    """The steps a candidate's Pareto points come from: its ranked workload (the mix), else all."""
    ran = c.ran_steps()
    ranked = c.ranked_on or (c.effective_throughput.workload if c.effective_throughput else None)
    mine = [s for s in ran if s.workload == ranked] if ranked else []
    return mine or ran


def dump(m: BaseModel) -> JsonObject:
    """A row of the record as written (keys it did not set left out)."""
    return m.model_dump(mode="json", by_alias=True, exclude_unset=True)


def flat(x: JsonValue, prefix: str = "") -> JsonObject:
    """A nested JSON value as ``{"a.b.c": leaf}``."""
    if isinstance(x, dict):
        out: JsonObject = {}
        for k, v in x.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: x}
