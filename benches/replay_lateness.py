#!/usr/bin/env python3
"""How late servelab's open loop sends each arrival, for several wake-up tails, against the box's floor.

Replays a 200-request trace (exponential gaps, mean 10 ms, ten simultaneous arrivals at index 50: ~98
req/s) through ``servelab.bench.load.step.run_step`` against ``servelab mock-engine`` at zero delay (its own
process), once per tail per round, interleaved, and a blocking ``time.sleep`` to each instant (no work at
all: what the OS and the VM's host allow). Prints per run the lateness P50/P99 (ms) and the generator's
CPU seconds. Run by hand (not a test), as root for SCHED_FIFO like the tests:

    .venv/bin/python benches/replay_lateness.py --tails-us 200,500,1000 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import re
import resource
import subprocess
import sys
import time

import numpy as np

from servelab.bench.load import waketimer
from servelab.bench.load.step import LoadModel, run_step
from servelab.wire.client import make_session
from servelab.wire.types import RequestSpec


def _offsets_ns() -> list[int]:
    rng = np.random.default_rng(7)
    t_ms = np.sort(np.round(rng.exponential(10.0, 200).cumsum())).astype(int)
    t_ms[50:60] = t_ms[50]
    return [int(t - t_ms[0]) * 1_000_000 for t in t_ms]


def _fifo(pid: int) -> None:
    with contextlib.suppress(OSError):  # PermissionError without root
        os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))


def _lags_ms(base_url: str, offsets: list[int]) -> np.ndarray:
    spec = RequestSpec(endpoint="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=4)

    async def go() -> list[int]:
        lags: list[int] = []
        async with make_session() as s:
            await run_step(
                s,
                base_url,
                "m",
                [spec] * len(offsets),
                LoadModel(kind="open", rate_rps=98.0),
                offsets_ns=offsets,
                dispatch_lags_ns=lags,
            )
        return lags

    return np.asarray(asyncio.run(go())) / 1e6


def _floor_ms(offsets: list[int]) -> np.ndarray:
    t0 = time.monotonic_ns() + 2_000_000
    late = []
    for off in offsets:
        rem = t0 + off - time.monotonic_ns()
        if rem > 0:
            time.sleep(rem / 1e9)
        late.append(max(0, time.monotonic_ns() - t0 - off))
    return np.asarray(late) / 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tails-us", default="200,500,1000", help="timerfd wake-up tails to compare, microseconds")
    ap.add_argument("--rounds", type=int, default=4, help="interleaved rounds (each runs every tail once)")
    a = ap.parse_args()
    tails = [int(x) for x in a.tails_us.split(",")]
    mock = subprocess.Popen(
        [sys.executable, "-m", "servelab.engines.mock", "--port", "0", "--ttft-ms", "0", "--itl-ms", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert mock.stdout is not None
        m = re.search(r"listening on (\S+)", mock.stdout.readline())
        if not m:
            print("mock-engine did not start", file=sys.stderr)
            return 1
        base_url = m.group(1)
        _fifo(0)
        _fifo(mock.pid)
        offsets = _offsets_ns()
        print(f"waketimer mode {waketimer.MODE}; {len(offsets)} arrivals over {offsets[-1] / 1e9:.2f} s")
        for r in range(a.rounds):
            for tail in tails:
                waketimer._TAIL_NS = tail * 1000
                gc.collect()
                gc.disable()
                c0 = resource.getrusage(resource.RUSAGE_SELF)
                lags = _lags_ms(base_url, offsets)
                c1 = resource.getrusage(resource.RUSAGE_SELF)
                gc.enable()
                cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
                print(
                    f"round {r} tail {tail:>5} us: lateness P50 {np.median(lags):.3f} P99 "
                    f"{np.percentile(lags, 99):.3f} max {lags.max():.3f} ms, CPU {cpu:.3f} s"
                )
            f = _floor_ms(offsets)
            print(
                f"round {r} floor (blocking sleep): P50 {np.median(f):.3f} P99 {np.percentile(f, 99):.3f} "
                f"max {f.max():.3f} ms"
            )
    finally:
        mock.terminate()
        mock.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
