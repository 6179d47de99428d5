"""servelab.gateway.shutdown: a step that overruns is named and left behind; the watchdog ends a process
whose shutdown does not finish, naming the step."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
import time
from pathlib import Path

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


def test_a_second_ctrl_c_cuts_the_drain_of_a_gateway_run_alone(gateway, mock_engine) -> None:
    """One process, a 60 s stream in flight, the default 10 s grace: a second SIGINT cuts the stream, its usage
    row is written, and the process is gone within HURRY_S."""
    import signal

    import httpx
    from conftest import gateway_key, ledger_usage

    from servelab.gateway.shutdown import HURRY_S

    eng = mock_engine("--dialect", "vllm", "--output-tokens", "600", "--itl-ms", "100")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    with httpx.stream("POST", gw.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()  # kept: a dropped iterator closes the response
        assert next(chunks)  # in flight
        rid = r.headers["x-request-id"]
        gw.proc.send_signal(signal.SIGINT)
        time.sleep(0.5)
        assert gw.proc.poll() is None  # draining: the grace is 10 s
        t0 = time.monotonic()
        gw.proc.send_signal(signal.SIGINT)
        gw.proc.wait(HURRY_S + 1.0)
        took = time.monotonic() - t0
    assert took < HURRY_S + 1.0
    assert "a second stop signal (in step 'draining the API port')" in gw.stderr(), gw.stderr()[-2000:]
    ledger_usage(Path(gw.config["ledger"]["sqlite_path"]), rid, timeout_s=0.0)  # the cut stream's row
    import sqlite3

    with sqlite3.connect(gw.config["ledger"]["sqlite_path"]) as con:
        (outcome,) = con.execute("SELECT outcome FROM servelab_usage WHERE request_id = ?", (rid,)).fetchone()
    assert outcome == "error"  # cut by the gateway's shutdown, not a client that left
    line = next(x for x in gw.access_log.read_text().splitlines() if rid in x)
    assert '"error_code":"gateway_shutdown"' in line.replace(" ", ""), line
