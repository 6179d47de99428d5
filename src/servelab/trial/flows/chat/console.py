"""The chat flow's console lines: a load step's outcome and the quality gate's figures."""

from __future__ import annotations

from servelab.bench.results import StepSummary
from servelab.trial.results import QualityCheck

__all__ = ["gate_text", "step_line"]


def gate_text(c: QualityCheck) -> str:
    """``structured_valid_fraction 0.75 (min 0.50) ok`` / ``... FAILED`` / ``samples_pass_fraction 0.50
    (informational: no minimum)``."""
    if c.undetermined:
        return f"{c.name} undetermined ({c.ran}/{c.planned} requests ran within the budget)"
    if c.informational:
        return f"{c.name} {c.value or 0:.2f} (informational: no minimum)"
    return f"{c.name} {c.value or 0:.2f} (min {c.limit or 0:.2f}) {'ok' if c.ok else 'FAILED'}"


def step_line(name: str, s: StepSummary) -> str:
    if s.skipped:
        return f"[{name}] {s.workload} {s.step}: skipped ({s.skipped_reason})"
    c = s.counts

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    tps = s.throughput.output_tokens_per_s
    slo = "" if not s.slo else (" SLO met" if s.slo_met else " SLO BROKEN: " + ", ".join(
        f"{v.objective} (was {v.value:.3g})" if v.value is not None else v.objective
        for v in s.slo if not v.met))
    return (f"[{name}] {s.workload} {s.step}: {c.succeeded}/{c.submitted} ok, TTFT p95 "
            f"{ms(s.ttft_s.p95)}, ITL p95 {ms(s.itl_s.p95)}, {tps or 0:.1f} out tok/s{slo}")
