"""servelab.bench.load.waketimer: open-loop arrivals wake on a timerfd (Linux), never early, and a cancelled
wait leaves no descriptor behind. Its precision and CPU cost against the old spin are measured by
benches/generator_capacity.py (timed figures do not belong in unit tests on a shared machine)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

import pytest

from servelab.bench.load import waketimer


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux only")
def test_timerfd_is_used_on_linux() -> None:
    assert waketimer.MODE == "timerfd"


@pytest.mark.parametrize("mode", ["timerfd", "spin"])
def test_never_early_and_no_descriptor_left(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if mode == "spin":
        monkeypatch.setattr(waketimer, "_LIBC", None)

    async def main() -> list[int]:
        early = []
        t = time.monotonic_ns() + 3_000_000
        for i in range(60):
            t += 1_700_000 + 300_000 * (i % 5)  # around and past the 1 ms tail and the 1.5 ms spin
            await waketimer.sleep_until_ns(t)
            early.append(time.monotonic_ns() - t)
        await waketimer.sleep_until_ns(time.monotonic_ns() - 1_000_000)  # already past: returns at once
        return early

    before = _fds()
    lags = asyncio.run(main())
    assert min(lags) >= 0
    assert _fds() == before


def test_cancelled_wait_closes_its_timer() -> None:
    async def main() -> None:
        before = _fds()  # the loop's own descriptors are open by now
        task = asyncio.ensure_future(waketimer.sleep_until_ns(time.monotonic_ns() + 5_000_000_000))
        await asyncio.sleep(0.05)
        assert _fds() == before + (waketimer.MODE == "timerfd")  # the armed timerfd
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert _fds() == before

    asyncio.run(main())
