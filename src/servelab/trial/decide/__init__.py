"""The trial's decision: from each candidate's load steps to the ranking, the verdicts and their reasons.

Four steps, one module each, all pure (no I/O):

- :mod:`~servelab.trial.decide.effective` — what one candidate sustained at the SLO
  (:func:`effective_step`: the effective level, its figures and intervals, the SLO verdicts);
- :mod:`~servelab.trial.decide.identities` and :mod:`~servelab.trial.decide.compare` — how two
  candidates compare: which identity factors differ, and how far apart their ranked figures are;
- :mod:`~servelab.trial.decide.decision` — the rule: rank, tie-break, adopt / backup / exclude
  (:func:`decide`);
- :mod:`~servelab.trial.decide.wording` (with :mod:`~servelab.trial.decide.fmt`) — the sentences each
  verdict gives, and :mod:`~servelab.trial.decide.table` the short verdict table that leads them.

The names callers use are importable from here.
"""

from __future__ import annotations

from servelab.trial.decide.compare import difference
from servelab.trial.decide.decision import TIE_BREAK, decide
from servelab.trial.decide.effective import candidate_levels, effective_step, ranked_workload
from servelab.trial.decide.identities import (
    VOLATILE_KEYS,
    EngineFacts,
    comparability,
    compare_identities,
    engine_facts,
    identity_factors,
    tokenizer_key,
)
from servelab.trial.decide.wording import budget_note
from servelab.trial.verdicts import MIX, objective_verdicts

__all__ = [
    "MIX",
    "TIE_BREAK",
    "VOLATILE_KEYS",
    "EngineFacts",
    "budget_note",
    "candidate_levels",
    "comparability",
    "compare_identities",
    "decide",
    "difference",
    "effective_step",
    "engine_facts",
    "identity_factors",
    "objective_verdicts",
    "ranked_workload",
    "tokenizer_key",
]
