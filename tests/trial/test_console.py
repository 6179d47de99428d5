"""What a trial prints (servelab.trial.console) and the verdict table that leads the decision
(servelab.trial.decide.table): a step line says which throughput it shows, the quality gate says when
it has nothing to check, and the decision opens with one row per candidate — verdict, the ranked figure
with its interval and where it was measured, the SLO status — before the full reasons, with no empty
line. The decisions are the golden record's (fixtures/golden), so the rows are those of real runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from servelab.bench.results import StepSummary
from servelab.trial.console import decision_lines, embeddings_step_line, gate_line, step_line
from servelab.trial.decide.table import verdict_table
from servelab.trial.results import CandidateResult, Decision, QualityCheck

GOLDEN = Path(__file__).parent / "fixtures" / "golden"


def _golden(name: str) -> tuple[Decision, dict[str, CandidateResult]]:
    """The decision and the candidates' figures of a golden case, recomputed as the trial does."""
    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    assert spec is not None and spec.loader is not None
    mg = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("make_golden", mg)
    spec.loader.exec_module(mg)
    case = mg.read_case(GOLDEN / "cases" / f"{name}.json")
    out = mg.outcome(case)
    cands = dict(case.candidates)
    for n, eff in out.effective.items():
        cands[n].apply(eff)
    return out.decision, cands


def _step(steady: float | None) -> StepSummary:
    return StepSummary.model_validate(
        {
            "workload": "mix",
            "step": "c4",
            "counts": {"submitted": 6, "succeeded": 6},
            "ttft_s": {"count": 6, "p95": 0.007},
            "itl_s": {"count": 6, "p95": 0.006},
            "throughput": {"output_tokens_per_s": 648.3},
            "slo": [{"objective": "ttft_p95<=0.5s", "value": 0.007, "limit": 0.5, "met": True}],
            "slo_met": True,
            **({"steady": {"output_tokens_per_s": steady}} if steady is not None else {}),
        }
    )


def test_step_line_says_which_throughput_it_shows() -> None:
    line = step_line("fast", _step(None))
    assert line == "[fast] mix c4: 6/6 ok, TTFT p95 7 ms, ITL p95 6 ms, 648.3 out tok/s (whole step) SLO met"
    both = step_line("fast", _step(916.5))
    assert "648.3 out tok/s whole step, 916.5 steady window SLO met" in both


def test_embeddings_step_line_says_its_rates_are_the_whole_steps() -> None:
    step = StepSummary.model_validate(
        {
            "workload": "embeddings",
            "step": "c4",
            "embeddings": {
                "batch_size": 4,
                "requests": 20,
                "inputs": 80,
                "inputs_per_s": 181.04,
                "tokens_per_s": 2317.2,
                "latency": {"n": 20, "p95_s": 0.048},
            },
        }
    )
    line = embeddings_step_line("fast", step)
    assert line == (
        "[fast] embeddings c4: 20/20 requests ok, 181.0 inputs/s, 2317 tokens/s (whole step, the ranked "
        "figure), e2e p95 48 ms (n 20)"
    )
    skipped = StepSummary(workload="embeddings", step="c8", skipped=True, skipped_reason="budget")
    assert embeddings_step_line("fast", skipped) == "[fast] embeddings c8: skipped (budget)"


def test_quality_gate_line_with_nothing_to_check() -> None:
    assert gate_line("a", []) == "[a] quality gate: nothing to check"
    check = QualityCheck(name="structured_valid_fraction", value=1.0, limit=0.5, ok=True)
    assert gate_line("a", [check]) == "[a] quality gate: structured_valid_fraction 1.00 (min 0.50) ok"


def test_decision_leads_with_the_verdict_table_then_the_reasons() -> None:
    decision, cands = _golden("mock-three")
    lines = decision_lines(decision, cands)
    assert all(ln.strip() for ln in lines), "an empty line"
    assert lines[0] == "decision:" and lines[1].split() == [
        "candidate",
        "verdict",
        "ranked",
        "on",
        "95",
        "%",
        "CI",
        "measured",
        "SLO",
    ]
    rows = lines[2:5]
    assert [r.split()[:2] for r in rows] == [["twin", "ADOPT"], ["fast", "BACKUP"], ["slow", "BACKUP"]]
    assert (
        "876 out tok/s  815–937  mix at c4, steady window, 3 repeat(s)  met at c4 (by 95 % CI: undetermined)" in rows[0]
    )
    assert "steady window" in lines[5] and "whole-step" in lines[5]
    reasons = lines.index("reasons:")
    assert reasons == 6 and lines[reasons + 1] == "  twin: ADOPT"
    for name, v in decision.verdicts.items():  # every reason, whole, one per line, below the table
        for r in v.reasons:
            assert f"    - {r}" in lines[reasons:], (name, r)
    assert lines[lines.index("comparisons:") + 1].startswith("  fast vs twin: one factor differs: settings.itl_ms")


def test_verdict_table_states_the_slo_and_why_a_figure_is_missing() -> None:
    decision, cands = _golden("mock-breaks")
    rows = {r.candidate: r for r in verdict_table(decision, cands)}
    assert list(rows) == ["steady", "batching", "flaky", "badjson"]  # the ranking, then the excluded
    assert rows["steady"].verdict == "adopt" and rows["steady"].figure == "745 out tok/s"
    assert rows["steady"].interval == "438–1052" and rows["steady"].slo.endswith("none broke up to c8")
    assert (rows["flaky"].verdict, rows["flaky"].figure) == ("exclude", "—")
    assert rows["flaky"].slo == "broke at c1 (error_rate, error_budget)"
    assert rows["badjson"].slo == "not measured (excluded)"
    real, real_cands = _golden("llamacpp-slots")  # the real llama-server run: np1 broke at c1 on both limits
    assert {r.candidate: r.slo for r in verdict_table(real, real_cands)} == {
        "np1": "broke at c1 (ttft_p95, itl_p95)",
        "np4": "not measured (failed)",
    }
