"""What every piece of a trial shares while it runs: the experiment, the run folder, the console, the
budget, the objectives judged and the workload tokenizer (the first candidate's, kept for all so that
every candidate sees the same prompts)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from servelab.bench.analysis.slo import Objective
from servelab.trial.budget import TrialBudget
from servelab.trial.goal import Goal
from servelab.trial.spec import Experiment

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["Progress", "TrialContext", "trial_objectives"]

Progress = Callable[[str], None]


def trial_objectives(goal: Goal) -> list[Objective]:
    """The goal's SLOs (:attr:`Goal.objectives`) plus ``goal.error_budget`` as an ``error_rate``
    objective when the SLO does not state one."""
    objs = list(goal.objectives)
    if not any(o.metric == "error_rate" for o in objs):
        objs.append(Objective("error_rate", "rate", float(goal.error_budget)))
    return objs


@dataclass
class TrialContext:
    """One trial's shared state. ``objectives``: what the bench checks per step (the goal's SLO and
    error budget); ``judged``: those plus the per-workload SLOs, which only the trial judges;
    ``counter``: the workload tokenizer once a candidate's weights gave one (``None``: approximate
    lengths)."""

    exp: Experiment
    out: Path
    say: Progress
    budget: TrialBudget
    objectives: list[Objective] = field(default_factory=list)
    judged: list[Objective] = field(default_factory=list)
    counter: TokenCounter | None = None

    @classmethod
    def of(cls, exp: Experiment, out: Path, say: Progress, budget: TrialBudget | None = None) -> TrialContext:
        """The context of ``exp`` run into ``out`` (a fresh budget on ``budget``'s clock when given)."""
        from servelab.trial.verdicts import scoped_objectives  # goal.workload_slo: judged by the trial only

        objectives = trial_objectives(exp.goal)
        fresh = TrialBudget(exp.goal.budget.max_minutes, budget.clock if budget is not None else time.monotonic)
        return cls(
            exp=exp,
            out=Path(out),
            say=say,
            budget=fresh,
            objectives=objectives,
            judged=[*objectives, *scoped_objectives(exp.goal.workload_slo)],
        )
