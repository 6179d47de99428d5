"""The progress bars of ``servelab bench`` on stderr, driven by the bench's typed events
(:mod:`servelab.bench.events`): one bar per step and warmup, advanced as requests finish."""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, TaskID

from servelab.bench.events import (
    BenchEvent,
    Preparing,
    PromptBuilt,
    Ready,
    RequestDone,
    RequestsDone,
    StepStarted,
    Watcher,
)

__all__ = ["Bars"]


class Bars(Watcher):
    """The bench's progress bars on stderr: one per step (and warmup), advanced as requests finish."""

    def __init__(self, progress: Progress, err: Console, quiet: bool, no_tokenizer: bool) -> None:
        self.progress, self.err, self.quiet, self.no_tokenizer = progress, err, quiet, no_tokenizer
        self.task: TaskID | None = None
        self.fail = 0

    def on_event(self, event: BenchEvent) -> None:
        progress = self.progress
        if isinstance(event, Ready) and self.no_tokenizer:  # after preflight: bad-input errors stay one line
            self.err.print(
                "note: no tokenizer known for this model (pass --tokenizer GGUF|tokenizer.json): prompt "
                "lengths are approximate and the client token-count cross-check is off",
                soft_wrap=True,
            )
        elif isinstance(event, StepStarted):
            self.fail = 0
            self.task = progress.add_task(
                f"{event.workload} {event.step}" + (" warmup" if event.warmup else ""), total=event.total, info=""
            )
        elif isinstance(event, Preparing):  # building prompts takes long (very long inputs): show it
            self.task = progress.add_task(
                f"building prompts {event.what}", total=event.total, completed=event.done, info=""
            )
            if self.quiet:
                self.err.print(f"building prompts for {event.what}: {event.total} requests", soft_wrap=True)
        elif self.task is None:
            return
        elif isinstance(event, PromptBuilt):
            progress.update(self.task, advance=1)
        elif isinstance(event, RequestDone):
            self.fail += event.record.failure is not None
            progress.update(self.task, advance=1, info=f"failed {self.fail}" if self.fail else "")
        elif isinstance(event, RequestsDone):  # a batch from the workers (--workers, --ray)
            self.fail += event.failed
            progress.update(self.task, advance=event.count, info=f"failed {self.fail}" if self.fail else "")
