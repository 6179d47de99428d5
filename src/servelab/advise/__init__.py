"""``servelab advise``: which engines to verify first for a task, a model, hardware and a load, which
to leave out and why, the exact-combination checklist of ../shared/seeds/000 §5, a capacity plan, and a
``servelab trial`` experiment file for the candidates.

Public: :func:`advise` (→ :class:`Advice`), :func:`write_experiment`, :func:`resolve_task`.
"""

from __future__ import annotations

from servelab.advise.core import Advice, advise, parse_tokens
from servelab.advise.tasks import TASKS, TaskSpec, resolve_task

__all__ = ["TASKS", "Advice", "TaskSpec", "advise", "parse_tokens", "resolve_task", "write_experiment"]


def write_experiment(advice: Advice, path: str) -> str:
    """Write a ``servelab trial`` experiment for ``advice`` to ``path`` and validate it; see
    :func:`servelab.advise.experiment.write_experiment`."""
    from servelab.advise.experiment import write_experiment as _write

    return _write(advice, path)
