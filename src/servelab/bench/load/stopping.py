"""Stop signals of ``servelab bench``: SIGTERM stops a run exactly as SIGINT (Ctrl-C) does.

Either signal cancels the run: requests in flight are cancelled (and recorded as ``cancelled``),
the interrupted step is summarised as ``partial``, ``summary.json`` is written with ``complete:
false`` and ``stopped_by`` naming the signal, and the process exits with ``128 + signal number``
(130 for SIGINT, 143 for SIGTERM: the shell's convention for a process ended by a signal,
https://www.gnu.org/software/bash/manual/html_node/Exit-Status.html, read 2026-12-01).
``requests.jsonl`` needs no handling: each line is written and flushed as its request ends, so
even SIGKILL leaves every finished request in it (``servelab summarize DIR`` rebuilds the summary).

Outside the event loop (engine start, tokenizer load) SIGTERM raises :class:`KeyboardInterrupt`
like SIGINT, so the same clean-up paths run (the engine a run started is stopped).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Coroutine
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")


class StopSignals:
    """Context manager: while active, SIGTERM behaves like SIGINT (module doc).

    ``signum`` is the signal that stopped the run (``None`` if none did); :meth:`stopped` records
    SIGINT when a :class:`KeyboardInterrupt` came without a SIGTERM. ``exit_code`` is ``128 + signum``.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: Any = None

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self.signum = signum
        raise KeyboardInterrupt

    def _install(self) -> None:
        signal.signal(signal.SIGTERM, self._on_sigterm)

    def __enter__(self) -> StopSignals:
        self._previous = signal.getsignal(signal.SIGTERM)
        self._install()
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)

    def stopped(self) -> int:
        """Call when a stop was caught: returns the signal (SIGINT unless SIGTERM was seen)."""
        if self.signum is None:
            self.signum = int(signal.SIGINT)
        return self.signum

    @property
    def name(self) -> str:
        """``"SIGINT"``/``"SIGTERM"`` (``""`` before any stop)."""
        return signal.Signals(self.signum).name if self.signum else ""

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (130 SIGINT, 143 SIGTERM)."""
        return 128 + (self.signum or int(signal.SIGINT))

    async def guard(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` in the running event loop with SIGTERM cancelling it (the task it runs in),
        as asyncio does for SIGINT; the loop's handler is replaced by this object's again after."""
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()

        def on_term() -> None:
            self.signum = int(signal.SIGTERM)
            if task is not None:
                task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, on_term)
        except (NotImplementedError, RuntimeError):  # no loop signal support (Windows): keep the raise
            return await coro
        try:
            return await coro
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            self._install()
