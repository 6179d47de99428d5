"""``summary.json`` from request records: the summary's top (:func:`new_summary`), one step's entry
(:func:`step_summary`: metrics, SLO verdicts, the token cross-check) or a skipped step's, and the atomic
write. The one code path of ``servelab bench`` and ``servelab summarize``."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from servelab import __version__
from servelab.bench.analysis import metrics as M
from servelab.bench.analysis.slo import Objective, evaluate
from servelab.bench.load.step import LoadModel
from servelab.bench.results import (
    SUMMARY_SCHEMA_VERSION,
    StepSummary,
    Summary,
)
from servelab.wire.types import RequestRecord

__all__ = ["new_summary", "skipped_step", "step_summary", "token_check", "with_fields", "write_summary"]


def write_summary(out: Path, summary: Summary) -> None:
    """Write ``out/summary.json`` atomically (a temporary file renamed over it): a reader, or a
    crash mid-write, never sees half a summary. Written with
    :meth:`~servelab.bench.results.ResultModel.to_json_bytes` (keys never set left out)."""
    tmp = out / "summary.json.tmp"
    tmp.write_bytes(summary.to_json_bytes(indent=2))
    tmp.replace(out / "summary.json")


def new_summary(model: str, base_url: str, objectives: list[Objective]) -> Summary:
    """The top of ``summary.json`` before any step ran (``complete: false``, no steps)."""
    return Summary(
        schema_version=SUMMARY_SCHEMA_VERSION,
        servelab_version=__version__,
        model=model,
        base_url=base_url,
        slo=[o.name for o in objectives],
        steps=[],
        started_unix_s=time.time(),
        complete=False,
    )


def skipped_step(workload: str, load: LoadModel, reason: str) -> StepSummary:
    """The summary entry of a step not run, for ``reason`` (an SLO broken at an earlier step, a budget)."""
    return StepSummary.model_validate(
        {"workload": workload, "step": load.label, "load": asdict(load), "skipped": True, "skipped_reason": reason}
    )


def with_fields(step: StepSummary, fields: dict[str, Any]) -> StepSummary:
    """``step`` with ``fields`` (field name → value as JSON data, e.g. a workload's own figures) added,
    validated again: an unknown field or a bad value raises :class:`pydantic.ValidationError`."""
    return StepSummary.model_validate({**step.model_dump(exclude_unset=True), **fields})


def step_summary(
    workload: str,
    load: LoadModel,
    recs: list[RequestRecord],
    objectives: list[Objective],
    tokenizer: str | None,
    started_unix_s: float | None,
    partial: bool = False,
) -> StepSummary:
    """The summary entry of one run step (docs/summary-schema.md): :func:`metrics.summarize` of
    ``recs`` (warmup records are left out by it), SLO verdicts, the token cross-check against the
    client ``tokenizer`` (name; ``None``: no check). ``partial`` marks a step that did not finish
    (interrupted, or rebuilt from an incomplete ``requests.jsonl``); a partial step never meets its SLOs.
    The one code path for both ``servelab bench`` and ``servelab summarize``."""
    s = M.summarize(recs)
    verdicts = evaluate(objectives, s)
    out: dict[str, Any] = {
        "workload": workload,
        "step": load.label,
        "load": asdict(load),
        "started_unix_s": started_unix_s,
        "skipped": False,
    }
    if partial:
        out["partial"] = True
    out.update(s)
    out["slo"] = verdicts
    out["slo_met"] = (not partial) and all(v["met"] for v in verdicts)
    out["token_check"] = token_check(recs, tokenizer)
    return StepSummary.model_validate(out)


def token_check(recs: list[RequestRecord], tokenizer: str | None) -> dict[str, Any] | None:
    """Client tokenizer vs server usage for output tokens: the discrepancy is reported, not hidden.
    ``None`` when no client ``tokenizer`` (name) was used."""
    if tokenizer is None:
        return None
    pairs = [
        (r.client_output_tokens, r.output_tokens)
        for r in recs
        if not r.warmup
        and r.failure is None
        and r.output_tokens_source == "usage"
        and r.client_output_tokens is not None
        and r.output_tokens is not None
    ]
    if not pairs:
        return {"tokenizer": tokenizer, "compared": 0}
    diffs = [a - b for a, b in pairs]
    return {
        "tokenizer": tokenizer,
        "compared": len(pairs),
        "exact": sum(1 for d in diffs if d == 0),
        "mean_diff_tokens": sum(diffs) / len(diffs),
        "max_abs_diff_tokens": max(abs(d) for d in diffs),
    }
