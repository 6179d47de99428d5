"""What a bench run tells whoever watches it: typed events as the run goes (ready, a step or its warmup
starting, prompts being built, requests finishing, a step's summary), and the one question it asks
before each load step, answered by a return value: :class:`Proceed` or :class:`Skip` (a trial's budget
stops a run this way; the bench records that step and every later one as skipped with the reason)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from servelab.bench.results import StepSummary
from servelab.wire.types import RequestRecord

__all__ = [
    "BenchEvent",
    "BenchObserver",
    "Preparing",
    "PromptBuilt",
    "Proceed",
    "Ready",
    "RequestDone",
    "RequestsDone",
    "Skip",
    "StepDone",
    "StepStarted",
    "StepVerdict",
    "Watcher",
]


@dataclass(frozen=True)
class Ready:
    """The server answered the preflight; ``model`` is the model the run sends to."""

    model: str


@dataclass(frozen=True)
class StepStarted:
    """A load step (or its warmup, ``warmup``) starts sending: ``total`` requests (``None``: bounded by
    ``duration_s`` or by the workload itself)."""

    workload: str
    step: str
    warmup: bool
    total: int | None
    duration_s: float | None = None


@dataclass(frozen=True)
class Preparing:
    """Building a step's prompts is taking long (very long inputs): ``done`` of ``total`` built so far."""

    what: str
    total: int
    done: int


@dataclass(frozen=True)
class PromptBuilt:
    """One more prompt of a step announced by :class:`Preparing` is built."""


@dataclass(frozen=True)
class RequestDone:
    """A request sent by this process finished (its line is written)."""

    record: RequestRecord


@dataclass(frozen=True)
class RequestsDone:
    """A batch of ``count`` finished requests arrived from a load-generator worker, ``failed`` of them
    failed."""

    count: int
    failed: int


@dataclass(frozen=True)
class StepDone:
    """A step's summary, as written to ``summary.json`` (also for a step skipped, by an SLO or a
    :class:`Skip`)."""

    summary: StepSummary


BenchEvent = Ready | StepStarted | Preparing | PromptBuilt | RequestDone | RequestsDone | StepDone


@dataclass(frozen=True)
class Proceed:
    """Run the step."""


@dataclass(frozen=True)
class Skip:
    """Do not run the step, nor any later one: each is recorded as skipped with ``reason``, and the
    summary's ``stopped_by`` is ``by``."""

    reason: str
    by: str = "budget"


StepVerdict = Proceed | Skip


class BenchObserver(Protocol):
    """Whoever watches a bench run (the CLI's progress bars, a trial's budget and console)."""

    def on_event(self, event: BenchEvent) -> None:
        """``event`` happened."""
        ...

    def before_step(self, workload: str, step: str) -> StepVerdict:
        """Whether load step ``workload``/``step`` may run (asked once per step, before its warmup)."""
        ...


class Watcher:
    """An observer that lets every step run and ignores every event; subclass what you need."""

    def on_event(self, event: BenchEvent) -> None:
        """Nothing."""

    def before_step(self, workload: str, step: str) -> StepVerdict:
        """:class:`Proceed`."""
        return Proceed()
