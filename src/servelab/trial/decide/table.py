"""The short verdict table that leads the decision: one row per candidate with its verdict, the figure it
was ranked on with its 95 % interval and where it was measured, and its SLO status.

The full reasons (:mod:`servelab.trial.decide.wording`) follow it in the console and the report; the
table is what a reader scans first. It is derived from the record (the decision and each candidate's
figures) when shown, so records already written get it too.
"""

from __future__ import annotations

from collections.abc import Mapping

from pydantic import BaseModel

from servelab.bench.results import Interval
from servelab.trial.decide.effective import arrival_broken, weakest
from servelab.trial.decide.fmt import metric_of, num
from servelab.trial.results import CandidateResult, Decision

__all__ = ["VerdictRow", "verdict_table"]


class VerdictRow(BaseModel):
    """One candidate in the verdict table. ``figure``: the ranked figure with its unit (``876 out tok/s``)
    or ``—``; ``interval``: its 95 % interval (``815–937``, ``no interval``, ``—``); ``measured``: where
    (``mix at c4, steady window, 3 repeat(s)``); ``slo``: the SLO status in a few words."""

    candidate: str
    verdict: str
    figure: str
    interval: str
    measured: str
    slo: str


def _span(ci: Interval | None) -> str:
    if ci is None or (ci.lo is None and ci.hi is None):
        return "no interval"
    return f"{'unbounded' if ci.lo is None else num(ci.lo)}–{'unbounded' if ci.hi is None else num(ci.hi)}"


def _figure(c: CandidateResult, metric: str) -> tuple[str, str, str]:
    """(figure, interval, where measured) of the ranked figure."""
    if c.embeddings is not None and c.embeddings.inputs_per_s is not None:
        e = c.embeddings
        return f"{num(e.inputs_per_s)} inputs/s", _span(e.inputs_per_s_ci), f"at {e.at_step or '—'}"
    e2 = c.effective_throughput
    value = None if e2 is None else (e2.output_tokens_per_s if metric == "output_tokens_per_s" else e2.requests_per_s)
    if e2 is None or value is None:
        return "—", "—", "—"
    ci = e2.output_tokens_per_s_ci if metric == "output_tokens_per_s" else e2.requests_per_s_ci
    unit = "out tok/s" if metric == "output_tokens_per_s" else "req/s"
    where = ", ".join(
        x
        for x in (
            f"{e2.workload} at {e2.at_step}" if e2.workload else f"at {e2.at_step}",
            e2.basis,
            f"{e2.repeats} repeat(s)" if e2.repeats else None,
        )
        if x
    )
    return f"{num(value)} {unit}", _span(ci), where


def _slo(c: CandidateResult) -> str:
    """``met at c4 (by 95 % CI: undetermined); broke at c8 (ttft_p95)`` and the like: the highest step
    that met on the point values, the weakest verdict by interval there, and what broke above it."""
    if c.status != "ranked":
        return f"not measured ({c.status})"
    what = ", ".join(dict.fromkeys(metric_of(b.objective) for b in c.broken_by if b.objective))
    broke = f"broke at {c.broken_at}" + (f" ({what})" if what else "") if c.broken_at else None
    if c.max_step_meeting_slo is None:
        return broke or "no load step met it"
    parts = [f"met at {c.max_step_meeting_slo}"]
    if c.slo_verdicts:
        parts[0] += f" (by 95 % CI: {weakest([v.verdict for v in c.slo_verdicts])})"
    if bad := arrival_broken(c):
        parts.append(f"broken at the expected rate ({', '.join(metric_of(v.objective) for v in bad)})")
    top = next((lv.step for lv in reversed(c.levels) if lv.ran), None)
    parts.append(broke or f"none broke up to {top or c.max_step_meeting_slo}")
    return "; ".join(parts)


def verdict_table(decision: Decision, candidates: Mapping[str, CandidateResult]) -> list[VerdictRow]:
    """The table's rows: the ranking's order first, then the excluded candidates in record order."""
    metric = (
        "output_tokens_per_s"
        if decision.comparability is None or decision.comparability.same_tokenizer
        else "requests_per_s"
    )
    order = [*decision.ranking, *(n for n in candidates if n not in decision.ranking)]
    rows = []
    for n in order:
        c = candidates.get(n) or CandidateResult()
        v = decision.verdict_of(n)
        figure, interval, where = _figure(c, metric)
        rows.append(
            VerdictRow(
                candidate=n,
                verdict=v.verdict if v is not None else "—",
                figure=figure,
                interval=interval,
                measured=where,
                slo=_slo(c),
            )
        )
    return rows
