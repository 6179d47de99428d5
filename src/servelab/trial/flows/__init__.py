"""The candidate flows of a trial, one subpackage per task kind (``goal.task_kind``): what a candidate
goes through between its launch and its figures. :func:`flow_for` picks the experiment's."""

from __future__ import annotations

from servelab.trial.candidate_flow import CandidateFlow
from servelab.trial.context import TrialContext

__all__ = ["flow_for"]


def flow_for(ctx: TrialContext) -> CandidateFlow:
    """The flow of ``ctx.exp.goal.task_kind``: chat (``chat``) or embeddings (``embeddings``)."""
    if ctx.exp.goal.task_kind == "embeddings":
        from servelab.trial.flows.embeddings.flow import EmbeddingsFlow

        return EmbeddingsFlow(ctx)
    from servelab.trial.flows.chat.flow import ChatFlow

    return ChatFlow(ctx)
