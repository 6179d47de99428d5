"""A bounded shutdown for one gateway process (the only one, or a worker under ``--workers N``).

:meth:`servelab.gateway.server.Gateway.close` runs its steps through :meth:`Shutdown.step`: each step gets a
timeout (:data:`STEP_S`, the API port's drain ``server.shutdown_grace_s`` + :data:`STEP_S`); a step still
running then is logged in one line naming it, left behind (cancelled, not awaited), and the next step runs, so
the ledger flush still happens after a step that hangs on the network.

:meth:`Shutdown.arm` (called at the first SIGTERM/SIGINT) starts a watchdog thread, independent of the event
loop: :data:`OVERRUN_S` seconds after ``shutdown_grace_s`` it logs one line naming the step the shutdown is in
and ends the process (status 1). It covers what no step timeout can: a blocked event loop, and
``asyncio.run``'s own clean-up after ``close()`` (cancelling the tasks left, joining the default executor's
threads, which Python 3.11 does without a timeout). :data:`OVERRUN_S` is below
:data:`servelab.gateway.workers.KILL_AFTER_S`, so a worker ends itself before its supervisor would kill it.

:meth:`Shutdown.hurry` is for a stop signal that arrives while the shutdown runs and there is no one left to
wait for: a worker whose supervisor died (the kernel's ``PR_SET_PDEATHSIG`` SIGTERM,
:mod:`servelab.gateway.workers`; a supervisor killed with threads running sends one per thread), or a second
Ctrl-C of a gateway run alone. It cuts the client connections still open at once (their handlers are
cancelled, their usage rows settled as cut), so the remaining steps, the ledger flush among them, run now, and
sets the watchdog to :data:`HURRY_S`. :meth:`Shutdown.exit_now` ends the process at once (the watchdog, or a
third signal of a gateway run alone): it flushes the synchronous parts (metrics, access log); usage rows not yet
in the ledger are in the write-ahead journal (:mod:`servelab.gateway.journal`, one ``os.write`` per row) and
are written to it at the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["HURRY_S", "OVERRUN_S", "STEP_S", "Shutdown"]

log = logging.getLogger("servelab.gateway.shutdown")

#: seconds each shutdown step but the API drain may take before it is left behind
STEP_S = 3.0
#: seconds the admin port's in-flight requests (key changes, usage queries: short) may take to finish at
#: shutdown; aiohttp then cancels them and waits as long again, so its drain stays within :data:`STEP_S`
ADMIN_DRAIN_S = 1.0
#: seconds after ``server.shutdown_grace_s`` the watchdog ends a shutdown still running (< workers.KILL_AFTER_S)
OVERRUN_S = 8.0
#: seconds a hurried shutdown (:meth:`Shutdown.hurry`) may still take before the watchdog ends the process
HURRY_S = 3.0


class Shutdown:
    """The steps of one process's shutdown (module doc). :attr:`step_name`: the step running now (or the last
    one); :attr:`left_behind`: the steps that overran their timeout; ``last_flush``: synchronous callables run
    by :meth:`exit_now` before the process ends (each guarded)."""

    def __init__(self) -> None:
        self.step_name = "serving"
        self.left_behind: list[str] = []
        self.on_hurry: list[Callable[[], Any]] = []
        self.last_flush: list[Callable[[], Any]] = []
        self.hurried = False
        self._armed_at: float | None = None
        self._timer: threading.Timer | None = None

    @property
    def stopping(self) -> bool:
        """True once :meth:`arm` was called (a stop signal arrived)."""
        return self._armed_at is not None

    async def step(self, name: str, aw: Awaitable[Any], timeout_s: float = STEP_S) -> bool:
        """Await ``aw`` for at most ``timeout_s`` seconds. True when it finished (an exception it raised is
        logged, not raised); False when it overran: logged in one line naming ``name``, cancelled and left."""
        self.step_name = name
        task = asyncio.ensure_future(aw)
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if not done:
            task.cancel()  # not awaited: a step that ignores its cancellation must not hold the shutdown
            self.left_behind.append(name)
            log.error("shutdown: %s did not finish within %.1f s; going on without it", name, timeout_s)
            return False
        if not task.cancelled() and task.exception() is not None:
            log.error("shutdown: %s failed: %s", name, task.exception())
        return True

    def arm(self, deadline_s: float) -> None:
        """Start the watchdog: the process ends ``deadline_s`` seconds from now unless it has exited."""
        if self._timer is not None:
            return
        self._armed_at = time.monotonic()
        self._timer = threading.Timer(deadline_s, self._overrun, args=(deadline_s,))
        self._timer.daemon = True
        self._timer.name = "servelab-shutdown-watchdog"
        self._timer.start()

    def _overrun(self, deadline_s: float) -> None:
        self.exit_now(f"the shutdown was still in step '{self.step_name}' {deadline_s:.1f} s after the stop signal")

    def hurry(self, why: str) -> None:
        """Stop waiting for requests in flight (module doc): log one line (``why``), run :attr:`on_hurry`, and
        end the process :data:`HURRY_S` seconds from now at the latest. Only the first call acts."""
        if self.hurried:
            return
        self.hurried = True
        log.error(
            "shutdown: %s (in step '%s'); cutting the requests in flight and exiting within %.0f s",
            why,
            self.step_name,
            HURRY_S,
        )
        for fn in self.on_hurry:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - a failed cut must not keep the process alive
                log.error("shutdown: cutting the requests in flight failed: %s", e)
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self.arm(HURRY_S)

    def exit_now(self, why: str) -> None:
        """Log one line (``why``), run :attr:`last_flush`, end the process with status 1 (no clean-up)."""
        log.error("shutdown: %s; exiting now", why)
        for fn in self.last_flush:
            with contextlib.suppress(Exception):
                fn()
        for h in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                h.flush()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(1)
