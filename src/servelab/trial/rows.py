"""The record's rows that do not depend on the candidate flow: the goal, the environment, the method
(with the budget's use), the evidence and the whole :class:`TrialRecord` around the results and the
decision."""

from __future__ import annotations

from servelab import __version__
from servelab.trial.context import TrialContext
from servelab.trial.results import (
    RECORD_SCHEMA_VERSION,
    Budget,
    BudgetUse,
    CandidateIdentity,
    CandidateResult,
    Decision,
    EnvironmentRow,
    EvidenceRow,
    GoalRow,
    Host,
    IdentityRow,
    Interrupted,
    MethodRow,
    ResultsRow,
    TrialRecord,
)
from servelab.trial.telemetry import host_gpus

__all__ = ["budget_in_decision", "environment_row", "goal_row", "method_row", "trial_record"]


def environment_row(host: Host) -> EnvironmentRow:
    """The machine the candidates ran on (its GPUs from NVML; ``None`` without one)."""
    return EnvironmentRow(
        host=host,
        gpu=host_gpus(),
        instances=1,
        parallel_layout="one engine process per candidate, one at a time, CPU only (no TP/PP/EP/DP)",
    )


def goal_row(ctx: TrialContext) -> GoalRow:
    """The goal as judged: its gates, every objective (per-workload ones included), rate and budget."""
    g = ctx.exp.goal
    return GoalRow(
        task=g.task,
        quality_gates=g.quality.model_dump(mode="json"),
        slo=[o.name for o in ctx.judged],
        workload_slo=dict(g.workload_slo),
        error_budget=g.error_budget,
        expected_rate_rps=g.expected_rate_rps,
        mix=g.mix,
        burstiness=g.burstiness,
        budget=Budget.model_validate(g.budget.model_dump(mode="json")),
    )


def method_row(ctx: TrialContext, t0: float, t1: float) -> MethodRow:
    """How the trial measured (``t0``..``t1``: its start and end, Unix seconds)."""
    e = ctx.exp
    return MethodRow(
        warmup_requests=e.warmup,
        requests_per_step=e.requests_per_step,
        steps=e.steps.model_dump(mode="json"),
        workloads=[w.label for w in e.workloads],
        seed=e.seed,
        arrival_test=e.arrival_test.model_dump(mode="json", by_alias=False),
        ignore_eos=e.ignore_eos,
        timeout_s=e.timeout_s,
        cache_state="prompts differ per step (seeded), identical across candidates; engine prompt/prefix "
        "cache left at the engine's default; warmup requests before each step excluded",
        token_definition="output tokens = server usage.completion_tokens (reasoning included); prompt "
        "lengths exact in the workload tokenizer "
        f"({getattr(ctx.counter, 'name', 'none: approximate')}); client count kept "
        "as a cross-check",
        started_unix_s=t0,
        finished_unix_s=t1,
        duration_s=t1 - t0,
        budget=ctx.budget.use(),
        repeats=e.repeats,
        mix_sweep=e.mix_sweep,
        capacity_search=e.capacity.model_dump(mode="json") if e.capacity.enabled else {},
    )


def budget_in_decision(ctx: TrialContext, decision: Decision, use: BudgetUse | None) -> None:
    """Say in the decision what the budget left out: each affected candidate's verdict gets a reason
    naming its skipped work, and the scope ends with the budget note."""
    if use is None or not use.exhausted:
        return
    for name, verdict in decision.verdicts.items():
        mine = [w.split("/", 1)[1] for w in use.skipped if w.startswith(name + "/")]
        if mine:
            verdict.reasons.append(
                f"not run for budget: {', '.join(mine)} (goal.budget.max_minutes); its "
                "figures cover only the steps that ran"
            )
    note = f"{use.note[:1].upper()}{use.note[1:]}."
    scope = (decision.scope or "").rstrip()
    decision.scope = f"{scope}{'' if scope.endswith('.') else '.'} {note}" if scope else note
    ctx.say(f"budget: {use.note}")


def trial_record(
    ctx: TrialContext,
    t0: float,
    *,
    goal: GoalRow,
    environment: EnvironmentRow,
    method: MethodRow,
    identities: dict[str, CandidateIdentity],
    results: dict[str, CandidateResult],
    files: dict[str, dict[str, str]],
    decision: Decision,
    interrupted: str | None,
) -> TrialRecord:
    """The whole record (docs/record-schema.md); ``interrupted``: the candidate Ctrl-C stopped, if any."""
    out = ctx.out
    record = TrialRecord(
        schema_version=RECORD_SCHEMA_VERSION,
        trial_id=out.name,
        name=ctx.exp.name,
        created_unix_s=t0,
        servelab_version=__version__,
        goal=goal,
        identity=IdentityRow(candidates=identities),
        environment=environment,
        method=method,
        results=ResultsRow(candidates=results),
        evidence=EvidenceRow(
            run_dir=str(out.resolve()),
            experiment="experiment.yaml",
            files=files,
            reproduce=f"servelab trial {out / 'experiment.yaml'} --out {out}-rerun",
        ),
        decision=decision,
    )
    if interrupted is not None:
        record.interrupted = Interrupted(
            candidate=interrupted,
            note="partial record: the trial was stopped by "
            "the user; candidates after it did not run, so the decision covers "
            "only the candidates that finished",
        )
    return record
