"""The trial's wall-clock budget (``goal.budget.max_minutes``): what each piece of work is estimated to
take from what the trial has measured so far, whether it may start, and what was left out for it."""

from __future__ import annotations

import time
from collections.abc import Callable

from servelab.trial.results import BudgetUse

__all__ = ["TrialBudget"]


class TrialBudget:
    """The wall-clock budget of a trial, ``goal.budget.max_minutes`` (``None`` = no limit).

    Before each piece of work the flow asks :meth:`allows` with an estimate of its wall time in
    seconds, from what this trial has measured so far:

    - a candidate: the mean, over the candidates before it, of the time from its launch to the end of
      its first load step (launch, cold start, smoke tests, quality gate, first step); 0 for the first;
    - a load step: this candidate's previous step of the same workload (closed loop: a fixed number of
      requests takes about as long at the next level once the engine is saturated), else the same step
      of an earlier candidate, else 0;
    - the arrival test: ``requests / expected_rate_rps`` plus the slowest E2E of the last load step.

    Work starts while the remaining budget exceeds its estimate; otherwise it is not started and is
    named in :attr:`skipped` (``CANDIDATE``, ``CANDIDATE/WORKLOAD/STEP`` or ``CANDIDATE/arrival``).
    Work already running is never cut, so a trial ends at most one piece of work past its budget.
    ``clock``: seconds, monotonic (a test passes a fake one).
    """

    def __init__(self, max_minutes: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = None if max_minutes is None else float(max_minutes) * 60.0
        self.clock = clock
        self.t0 = clock()
        self.skipped: list[str] = []
        self._steps: dict[tuple[str, str, str], float] = {}  # (candidate, workload, step) -> seconds, in order
        self._to_first_step: dict[str, float] = {}  # candidate -> launch .. end of its first load step, seconds

    def elapsed_s(self) -> float:
        """Seconds since the trial started."""
        return self.clock() - self.t0

    def remaining_s(self) -> float | None:
        """Seconds left (negative once overspent); ``None`` without a budget."""
        return None if self.limit_s is None else self.limit_s - self.elapsed_s()

    def allows(self, estimate_s: float) -> bool:
        """Whether work estimated at ``estimate_s`` seconds may start (always without a budget)."""
        rem = self.remaining_s()
        return rem is None or rem > max(0.0, estimate_s)

    def skip(self, what: str) -> None:
        """Record that ``what`` was not started for budget."""
        self.skipped.append(what)

    def record_step(self, candidate: str, workload: str, step: str, seconds: float, started_at: float) -> None:
        """A load step of ``candidate`` took ``seconds`` (warmup included); ``started_at`` is the clock
        time the candidate started (for its time to the first step)."""
        self._steps[(candidate, workload, step)] = seconds
        self._to_first_step.setdefault(candidate, self.clock() - started_at)

    def step_estimate_s(self, candidate: str, workload: str, step: str) -> float:
        """Estimated seconds of ``candidate``'s step ``workload/step`` (see the class doc)."""
        own = [d for (c, w, _), d in self._steps.items() if c == candidate and w == workload]
        if own:
            return own[-1]
        same = [d for (_, w, st), d in self._steps.items() if w == workload and st == step]
        return same[-1] if same else 0.0

    def candidate_estimate_s(self) -> float:
        """Estimated seconds from a candidate's launch to the end of its first load step."""
        t = list(self._to_first_step.values())
        return sum(t) / len(t) if t else 0.0

    def use(self) -> BudgetUse | None:
        """The record's ``method.budget`` (``None`` without a budget)."""
        if self.limit_s is None:
            return None
        spent = self.elapsed_s()
        note = ""
        if self.skipped:
            note = (
                f"trial budget of {self.limit_s / 60:g} min (goal.budget.max_minutes) spent: not started "
                f"for budget: {', '.join(self.skipped)}; the decision covers only the work that ran"
            )
        return BudgetUse(
            limit_s=self.limit_s, spent_s=spent, exhausted=bool(self.skipped), skipped=list(self.skipped), note=note
        )
