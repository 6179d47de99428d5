"""The chat candidate flow (:class:`~servelab.trial.candidate_flow.CandidateFlow`): round 0 of a
candidate (:mod:`~servelab.trial.flows.chat.candidate`), its repeat rounds of the goal's mix at the
effective level, its figures and economics, and the chat decision (:mod:`servelab.trial.decide`)."""

from __future__ import annotations

import os

from servelab.engines.url import UrlFields
from servelab.trial.candidate_flow import CandidateRun
from servelab.trial.candidates import Candidate
from servelab.trial.context import TrialContext
from servelab.trial.flows.chat.benching import ChatBench
from servelab.trial.flows.chat.candidate import ChatCandidate
from servelab.trial.flows.chat.economics import economics
from servelab.trial.flows.chat.openloop import OpenLoop
from servelab.trial.flows.chat.quality import QualityGate
from servelab.trial.results import (
    CandidateIdentity,
    CandidateResult,
    Decision,
    EnvironmentRow,
    GoalRow,
    Host,
    MethodRow,
)

__all__ = ["ChatFlow"]


class ChatFlow:
    """The chat flow of a trial (``ctx``: the trial's)."""

    def __init__(self, ctx: TrialContext) -> None:
        self.ctx = ctx
        self.bench = ChatBench(ctx)
        self.gate = QualityGate(ctx, self.bench)
        self.open = OpenLoop(ctx, self.bench)
        self.candidate = ChatCandidate(ctx, self.bench, self.gate, self.open)

    def candidate_estimate_s(self) -> float:
        """The mean time from a candidate's launch to the end of its first load step so far."""
        return self.ctx.budget.candidate_estimate_s()

    def run_candidate(self, cand: Candidate, host: Host) -> CandidateRun:
        """Round 0 of ``cand`` (:class:`~servelab.trial.flows.chat.candidate.ChatCandidate`)."""
        return self.candidate.run(cand, host)

    def repeat(self, cand: Candidate, result: CandidateResult, files: dict[str, str], repeat: int) -> None:
        """Repeat round ``repeat`` of ``cand``'s mix at the level round 0 found effective, on a freshly
        started engine (the experiment's ``repeats``; run after every candidate's round 0, so rounds
        interleave A B A B). Steps are added to ``result.steps``; nothing runs when round 0 met no
        level; a failure is said and leaves the earlier rounds standing."""
        from servelab.trial.decide import effective_step

        name, kind = cand.name, cand.kind
        round0 = [s for s in result.steps if s.workload == "mix" and (s.repeat or 0) == 0]
        level = effective_step(round0, self.ctx.judged, self.ctx.exp.goal.error_budget).max_step_meeting_slo
        levels = [m for m in self.ctx.exp.steps.load_models(self.ctx.exp.goal.burstiness) if m.label == level]
        mix0 = [s for s in round0 if not s.skipped and s.step == level]
        est = sum(self.ctx.budget.step_estimate_s(name, "mix", s.step) for s in mix0)
        est += (result.cold_start.health_s or 0.0) if result.cold_start is not None else 0.0
        if not mix0 or not self.ctx.budget.allows(est):
            if mix0:
                self.ctx.budget.skip(f"{name}/mix/repeat{repeat + 1}")
                self.ctx.say(f"[{name}] repeat {repeat + 1} not run: trial budget (estimated {est:.0f} s)")
            return
        ext = cand if isinstance(cand, UrlFields) else None
        api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
        running = None
        try:
            if kind.launched:
                running = kind.launch(
                    cand.settings,
                    model=cand.model,
                    log_dir=str(self.ctx.out / "candidates" / name / f"engine-r{repeat + 1}"),
                )
                base_url, model = running.base_url, None
            else:
                assert ext is not None
                base_url, model = ext.url.rstrip("/"), ext.model_name
            self.ctx.say(f"[{name}] repeat {repeat + 1}/{self.ctx.exp.repeats} of the mix at {level}")
            result.steps += self.open.mix_sweep(
                name, base_url, model, api_key, None, files, repeat, self.ctx.budget.clock(), levels
            )
            if self.open.arrival_repeat_needed(name, result, repeat) and self.open.arrival_repeat_fits(
                name, result, repeat
            ):
                self.open.arrival(name, base_url, model, api_key, None, result, files, repeat=repeat)
        except Exception as e:  # noqa: BLE001 — a failed repeat leaves the earlier rounds standing
            self.ctx.say(f"[{name}] repeat {repeat + 1} failed: {type(e).__name__}: {e}")
        finally:
            if running is not None:
                running.stop()

    def finish(self, cand: Candidate, result: CandidateResult) -> None:
        """The effective step of every round, then the economics."""
        from servelab.trial.decide import effective_step

        result.apply(effective_step(result.steps, self.ctx.judged, self.ctx.exp.goal.error_budget))
        economics(self.ctx, cand, result)

    def rows(self, goal: GoalRow, method: MethodRow) -> None:
        """The chat rows are the orchestrator's as they are."""

    def decide(
        self,
        results: dict[str, CandidateResult],
        identities: dict[str, CandidateIdentity],
        *,
        goal: GoalRow,
        environment: EnvironmentRow,
        method: MethodRow,
    ) -> Decision:
        """:func:`servelab.trial.decide.decide`."""
        from servelab.trial.decide import decide

        return decide(results, identities, goal=goal, environment=environment, method=method)
