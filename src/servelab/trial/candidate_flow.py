"""The contract between the trial's orchestrator (:mod:`servelab.trial.flow`) and a candidate flow (one
per task kind, :mod:`servelab.trial.flows`): the orchestrator owns the loop over candidates, the budget
skips, Ctrl-C, the interleaved repeat rounds, the decision and the record; a flow owns what happens to
one candidate and how its figures are ranked."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from servelab.trial.candidates import Candidate
from servelab.trial.results import (
    CandidateIdentity,
    CandidateResult,
    Decision,
    EnvironmentRow,
    GoalRow,
    Host,
    MethodRow,
)

__all__ = ["CandidateFlow", "CandidateRun"]


class CandidateRun(NamedTuple):
    """What round 0 of one candidate left: its identity, its result and its evidence files (key -> path
    relative to the run folder)."""

    identity: CandidateIdentity
    result: CandidateResult
    files: dict[str, str]


class CandidateFlow(Protocol):
    """One task kind's candidate flow. Every method but :meth:`run_candidate` is called after round 0
    of every candidate; none raises for a candidate's failure (it is recorded in the result)."""

    def candidate_estimate_s(self) -> float:
        """Estimated seconds of the next candidate's round 0 (what the budget is asked before it)."""
        ...

    def run_candidate(self, cand: Candidate, host: Host) -> CandidateRun:
        """Round 0 of ``cand``. May raise :class:`KeyboardInterrupt` (the orchestrator writes a partial
        record) or :class:`~servelab.wire.errors.ConfigError` for input that cannot run at all."""
        ...

    def repeat(self, cand: Candidate, result: CandidateResult, files: dict[str, str], round_: int) -> None:
        """Repeat round ``round_`` (1-based count of earlier rounds) of a ranked candidate, into
        ``result`` and ``files``; what the budget cannot hold is skipped and said."""
        ...

    def finish(self, cand: Candidate, result: CandidateResult) -> None:
        """A ranked candidate's figures once every round ran (effective step, economics …)."""
        ...

    def rows(self, goal: GoalRow, method: MethodRow) -> None:
        """Adjust the record's goal and method rows to what this flow measured."""
        ...

    def decide(
        self,
        results: dict[str, CandidateResult],
        identities: dict[str, CandidateIdentity],
        *,
        goal: GoalRow,
        environment: EnvironmentRow,
        method: MethodRow,
    ) -> Decision:
        """The decision over every candidate."""
        ...
