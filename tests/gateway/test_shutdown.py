"""servelab.gateway.shutdown: a step that overruns is named and left behind; the watchdog ends a process
whose shutdown does not finish, naming the step."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time

import pytest

from servelab.gateway.shutdown import Shutdown


def test_a_step_that_never_finishes_is_named_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    sd = Shutdown()
    ran: list[str] = []

    async def forever() -> None:
        await asyncio.Event().wait()

    async def flush() -> None:
        ran.append("flush")

    async def main() -> tuple[bool, bool]:
        return await sd.step("closing Redis", forever(), 0.1), await sd.step("closing the ledger", flush())

    with caplog.at_level(logging.ERROR, logger="servelab.gateway.shutdown"):
        assert asyncio.run(main()) == (False, True)
    assert ran == ["flush"] and sd.left_behind == ["closing Redis"]
    assert [r.getMessage() for r in caplog.records] == [
        "shutdown: closing Redis did not finish within 0.1 s; going on without it"
    ]


def test_the_watchdog_ends_a_shutdown_stuck_in_a_step() -> None:
    """A process whose event loop waits for ever in a step: the watchdog ends it (status 1) at its deadline,
    one line naming the step."""
    code = textwrap.dedent(
        """
        import asyncio, logging
        from servelab.gateway.shutdown import Shutdown
        logging.basicConfig(level=logging.INFO)
        sd = Shutdown()
        async def main():
            sd.arm(0.3)
            await sd.step("draining the API port", asyncio.Event().wait(), 60)
        asyncio.run(main())
        """
    )
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert lines == [
        "ERROR:servelab.gateway.shutdown:shutdown: the shutdown was still in step 'draining the API port' "
        "0.3 s after the stop signal; exiting now"
    ], p.stderr
    assert took < 10, took
