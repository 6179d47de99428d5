"""What a trial prints on the console: a line per load step, the quality gate's line, and the decision —
the verdict table first, then each candidate's reasons one per line, then the identity comparisons.

A step line's throughput is the whole step's (first send to last end, ramp-up and drain included); the
decision ranks on the steady window (in-flight at its target), which is higher when the step is short
against its ramp. Each figure says which one it is, so the two are never read as the same number. An
embeddings step has no steady window: its inputs/s and tokens/s are the whole step's, which is also the
figure its decision ranks, and its line says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from servelab.bench.results import StepSummary
from servelab.trial.decide.table import VerdictRow, verdict_table
from servelab.trial.results import CandidateResult, Decision, QualityCheck

__all__ = ["decision_lines", "embeddings_step_line", "gate_line", "gate_text", "step_line"]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def _tps(s: StepSummary) -> str:
    """``648.3 out tok/s (whole step)``, or both figures once the trial has added the steady window."""
    whole = s.throughput.output_tokens_per_s
    st = s.steady
    if st is not None and st.output_tokens_per_s is not None:
        return f"{whole or 0:.1f} out tok/s whole step, {st.output_tokens_per_s:.1f} steady window"
    return f"{whole or 0:.1f} out tok/s (whole step)"


def step_line(name: str, s: StepSummary) -> str:
    """``[fast] mix c4: 6/6 ok, TTFT p95 7 ms, ITL p95 6 ms, 648.3 out tok/s (whole step) SLO met``."""
    if s.skipped:
        return f"[{name}] {s.workload} {s.step}: skipped ({s.skipped_reason})"
    c = s.counts
    slo = (
        ""
        if not s.slo
        else (
            " SLO met"
            if s.slo_met
            else " SLO BROKEN: "
            + ", ".join(
                f"{v.objective} (was {v.value:.3g})" if v.value is not None else v.objective for v in s.slo if not v.met
            )
        )
    )
    return (
        f"[{name}] {s.workload} {s.step}: {c.succeeded}/{c.submitted} ok, TTFT p95 "
        f"{_ms(s.ttft_s.p95)}, ITL p95 {_ms(s.itl_s.p95)}, {_tps(s)}{slo}"
    )


def embeddings_step_line(name: str, s: StepSummary) -> str:
    """``[fast] embeddings c4: 20/20 requests ok, 181.0 inputs/s, 2317 tokens/s (whole step, the ranked
    figure), e2e p95 48 ms (n 20) SLO met``: rates over the step window, first send to last end."""
    e = s.embeddings
    if s.skipped or e is None:
        return f"[{name}] embeddings {s.step}: skipped ({s.skipped_reason or 'not run'})"
    p95 = e.latency.p95_s
    slo = (
        ""
        if not s.slo
        else (" SLO met" if s.slo_met else " SLO BROKEN: " + ", ".join(v.objective for v in s.slo if not v.met))
    )
    return (
        f"[{name}] embeddings {s.step}: {e.requests}/{e.requests + e.failed_requests} requests ok, "
        f"{e.inputs_per_s or 0:.1f} inputs/s, {e.tokens_per_s or 0:.0f} tokens/s (whole step, the ranked figure), "
        f"e2e p95 {'-' if p95 is None else f'{p95 * 1000:.0f} ms'} (n {e.latency.n}){slo}"
    )


def gate_text(c: QualityCheck) -> str:
    """``structured_valid_fraction 0.75 (min 0.50) ok`` / ``... FAILED`` / ``samples_pass_fraction 0.50
    (informational: no minimum)``."""
    if c.undetermined:
        return f"{c.name} undetermined ({c.ran}/{c.planned} requests ran within the budget)"
    if c.informational:
        return f"{c.name} {c.value or 0:.2f} (informational: no minimum)"
    return f"{c.name} {c.value or 0:.2f} (min {c.limit or 0:.2f}) {'ok' if c.ok else 'FAILED'}"


def gate_line(name: str, checks: Sequence[QualityCheck]) -> str:
    """``[fast] quality gate: structured_valid_fraction 1.00 (min 0.50) ok``; ``nothing to check`` when
    the goal asks for no structured requests and no samples."""
    return f"[{name}] quality gate: " + (", ".join(gate_text(c) for c in checks) or "nothing to check")


def _table(rows: list[VerdictRow]) -> list[str]:
    head = ("candidate", "verdict", "ranked on", "95 % CI", "measured", "SLO")
    cells = [head, *((r.candidate, r.verdict.upper(), r.figure, r.interval, r.measured, r.slo) for r in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(head) - 1)]
    return ["  " + "  ".join([*(v.ljust(w) for v, w in zip(row[:-1], widths, strict=True)), row[-1]]) for row in cells]


def decision_lines(decision: Decision, candidates: Mapping[str, CandidateResult]) -> list[str]:
    """The decision as console lines, none empty: ``decision:``, the verdict table (what each figure is
    measured over said under it), ``reasons:`` per candidate one per line, then ``comparisons:``."""
    rows = verdict_table(decision, candidates)
    out = ["decision:", *_table(rows)]
    if any("steady window" in r.measured for r in rows):
        out.append(
            "  (ranked tok/s: the steady window, ramp-up and drain left out; the step lines above "
            "are whole-step figures)"
        )
    out.append("reasons:")
    for r in rows:
        v = decision.verdict_of(r.candidate)
        out.append(f"  {r.candidate}: {r.verdict.upper()}")
        out.extend(f"    - {reason}" for reason in (v.reasons if v is not None else []) if reason.strip())
    if decision.comparisons:
        out.append("comparisons:")
        out.extend(f"  {c.a} vs {c.b}: {c.note}" for c in decision.comparisons)
    return out
