"""The trial's orchestrator: every candidate of an experiment through its task kind's candidate flow
(:mod:`servelab.trial.flows`), then the decision and the record.

The loop, once for every flow:

1. bad input that can be found before any engine starts is refused (:meth:`TrialRunner.preflight`);
2. round 0 of each candidate in order, when the budget holds the flow's estimate of it (otherwise it is
   recorded as not run for budget); a candidate's failure is recorded and the trial goes on; Ctrl-C
   stops the loop, the candidates after it are recorded as not run and a partial record is written;
3. the repeat rounds, interleaved across candidates (A B A B), each ranked candidate once per round;
4. each ranked candidate's figures (:meth:`CandidateFlow.finish`), the decision, what the budget left
   out, and ``record.json`` (:mod:`servelab.trial.rows`).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

from servelab.trial.budget import TrialBudget
from servelab.trial.context import Progress, TrialContext
from servelab.trial.flows import flow_for
from servelab.trial.results import CandidateIdentity, CandidateResult, Host, TrialRecord, write_record
from servelab.trial.rows import budget_in_decision, environment_row, goal_row, method_row, trial_record
from servelab.trial.spec import Experiment
from servelab.wire.errors import ConfigError
from servelab.wire.host import host_identity

__all__ = ["TrialInterrupted", "TrialRunner"]


class TrialInterrupted(KeyboardInterrupt):
    """Raised by :meth:`TrialRunner.run` after Ctrl-C, once the partial ``record.json`` is written
    (``.record`` holds it, with ``record.interrupted`` naming the candidate that was running)."""

    def __init__(self, record: TrialRecord) -> None:
        super().__init__("trial interrupted")
        self.record = record


class TrialRunner:
    """Runs one experiment (a validated :class:`servelab.trial.spec.Experiment`) into ``out``.

    ``run()`` returns the record (see docs/record-schema.md) and writes ``record.json``; it never
    raises for a candidate's failure (that candidate is recorded ``failed`` with the reason) but
    does raise :class:`ConfigError` for bad input found before any engine starts. ``budget``: its
    clock is the trial's (a test passes one on a fake clock)."""

    def __init__(
        self, exp: Experiment, out: Path, progress: Progress = print, budget: TrialBudget | None = None
    ) -> None:
        self.ctx = TrialContext.of(exp, Path(out), progress, budget)

    def preflight(self) -> None:
        """Bad input that can be found before any engine starts: a fixed ``settings.port`` already in
        use. Raises :class:`ConfigError` naming the field and the fix."""
        for i, cand in enumerate(self.ctx.exp.candidates):
            port = cand.settings.fixed_port()
            if not port:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                in_use = sock.connect_ex(("127.0.0.1", int(port))) == 0
            if in_use:
                raise ConfigError(
                    f"candidates[{i}].settings.port: port {port} is already in use on 127.0.0.1; "
                    f"choose a free port or leave it null to pick one"
                )

    def run(self) -> TrialRecord:
        """Run every candidate, decide, and write ``record.json``; returns the record. Raises
        :class:`TrialInterrupted` after Ctrl-C, once the partial record is written."""
        self.preflight()
        ctx = self.ctx = TrialContext.of(self.ctx.exp, self.ctx.out, self.ctx.say, self.ctx.budget)
        exp, budget, say = ctx.exp, ctx.budget, ctx.say
        flow = flow_for(ctx)
        ctx.out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        host = Host.model_validate(host_identity())
        identities: dict[str, CandidateIdentity] = {}
        results: dict[str, CandidateResult] = {}
        files: dict[str, dict[str, str]] = {}
        interrupted: str | None = None

        def not_run(name: str, engine: str, reason: str) -> None:
            identities[name] = CandidateIdentity(engine_kind=engine)
            results[name] = CandidateResult(status="failed", steps=[], reason=reason)
            files[name] = {}

        for cand in exp.candidates:
            if interrupted is not None:
                not_run(cand.name, cand.engine, "not run: the trial was interrupted before this candidate started")
                continue
            est = flow.candidate_estimate_s()
            if not budget.allows(est):
                budget.skip(cand.name)
                not_run(
                    cand.name,
                    cand.engine,
                    f"not run: the trial budget ({exp.goal.budget.max_minutes:g} min, goal.budget.max_minutes) "
                    f"had {max(budget.remaining_s() or 0.0, 0):.0f} s left, less than a candidate takes to "
                    f"its first load step here (~{est:.0f} s)",
                )
                say(f"[{cand.name}] {results[cand.name].reason}")
                continue
            try:
                identities[cand.name], results[cand.name], files[cand.name] = flow.run_candidate(cand, host)
            except KeyboardInterrupt:
                interrupted = cand.name
                not_run(
                    cand.name,
                    cand.engine,
                    "interrupted (Ctrl-C) during this candidate; the requests it "
                    f"finished are in candidates/{cand.name}/steps/requests.jsonl",
                )
                say(f"[{cand.name}] interrupted; writing a partial record")
        for r in range(1, exp.repeats if interrupted is None else 1):  # rounds interleave: A B A B
            for cand in exp.candidates:
                if results[cand.name].status == "ranked":
                    flow.repeat(cand, results[cand.name], files[cand.name], r)
        for cand in exp.candidates:
            if results[cand.name].status == "ranked":
                flow.finish(cand, results[cand.name])
        goal, environment, method = goal_row(ctx), environment_row(host), method_row(ctx, t0, time.time())
        flow.rows(goal, method)
        decision = flow.decide(results, identities, goal=goal, environment=environment, method=method)
        budget_in_decision(ctx, decision, method.budget)
        record = trial_record(
            ctx,
            t0,
            goal=goal,
            environment=environment,
            method=method,
            identities=identities,
            results=results,
            files=files,
            decision=decision,
            interrupted=interrupted,
        )
        write_record(record, ctx.out)
        if interrupted is not None:
            raise TrialInterrupted(record)
        return record
