#!/usr/bin/env python3
"""How much this machine's own scheduling disturbs sub-millisecond timing (no servelab code involved).

Two measurements, printed with the command that made them:
- stalls: one busy loop per CPU (pinned, both at once) records every gap > 0.2 ms in its own monotonic
  clock; on a VM whose host deschedules vCPUs the gaps are ms long while the guest reports no steal.
- pipe round trips: a parent and a child process ping one byte through pipes (2 ms apart), P50/P99/max.
Run as root to add SCHED_FIFO to the round trips like the timing tests do:

    .venv/bin/python benches/host_noise.py --seconds 5
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import time


def _stalls(cpu: int, seconds: float, q: mp.Queue) -> None:
    os.sched_setaffinity(0, {cpu})
    now = time.perf_counter_ns
    last = now()
    end = last + int(seconds * 1e9)
    gaps: list[float] = []
    while last < end:
        t = now()
        if t - last > 200_000:
            gaps.append((t - last) / 1e6)
        last = t
    q.put((cpu, sorted(gaps)))


def _rtt_us(n: int, fifo: bool) -> list[float]:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    pid = os.fork()
    if pid == 0:
        while (b := os.read(r1, 1)) != b"q":
            os.write(w2, b)
        os._exit(0)
    if fifo:
        for p in (0, pid):
            with contextlib.suppress(OSError):  # PermissionError without root
                os.sched_setscheduler(p, os.SCHED_FIFO, os.sched_param(10))
    out = []
    for _ in range(n):
        t = time.perf_counter_ns()
        os.write(w1, b"x")
        os.read(r2, 1)
        out.append((time.perf_counter_ns() - t) / 1e3)
        time.sleep(0.002)
    os.write(w1, b"q")
    os.waitpid(pid, 0)
    return sorted(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="busy-loop time per CPU, seconds")
    ap.add_argument("--round-trips", type=int, default=2000, help="pipe round trips per policy")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    q: mp.Queue = mp.Queue()
    procs = [mp.Process(target=_stalls, args=(c, a.seconds, q)) for c in cpus]
    for p in procs:
        p.start()
    res = dict(q.get() for _ in procs)
    for p in procs:
        p.join()
    for c in cpus:
        g = res[c]
        print(
            f"CPU {c}: {len(g)} gaps > 0.2 ms in {a.seconds:g} s, {sum(x > 1 for x in g)} > 1 ms, "
            f"longest {', '.join(f'{x:.2f}' for x in g[-3:]) or '-'} ms"
        )
    for fifo in (False, True):
        rt = _rtt_us(a.round_trips, fifo)
        n = len(rt)
        print(
            f"pipe round trip ({'SCHED_FIFO' if fifo else 'default policy'}), n={n}: P50 {rt[n // 2]:.0f} us, "
            f"P99 {rt[int(n * 0.99)]:.0f} us, max {rt[-1]:.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
