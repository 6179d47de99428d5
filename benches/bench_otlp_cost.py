#!/usr/bin/env python3
"""What ``servelab bench --otlp-endpoint`` costs the bench (servelab.bench.tracing). Run by hand (not a test).

    .venv/bin/python benches/bench_otlp_cost.py [N]          # the in-process costs, N spans (20000)
    .venv/bin/python benches/bench_otlp_cost.py --runs 8     # and whole benches, off and on (~2 min)

In-process: the per-request hot-path cost (building the ``traceparent`` header while the request is timed),
and the cost of one span built after its step ended (off the request clock; between steps), both per request,
CPU of this process; the spans are exported to an in-process OTLP receiver (tests/otlp_receiver.py), whose
decoding shares this process's GIL, so the second figure is an upper bound.

``--runs R``: R pairs of ``servelab bench -n 400 -c 8`` against the mock engine (TTFT 20 ms, 2 ms between 8
tokens), without and with ``--otlp-endpoint`` (the receiver in this process), the order alternating per pair;
prints each run's median TTFT and E2E and E2E P99 (ms) of the measured requests, then the mean of the
medians per mode.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from otlp_receiver import Receiver

from servelab.bench.tracing import BenchTracer, TraceIds
from servelab.wire.types import RequestRecord


def main(n: int) -> None:
    ids = TraceIds(1.0)
    t = time.perf_counter()
    for i in range(n * 10):
        ids.header(i)
    print(f"traceparent per request (hot path): {(time.perf_counter() - t) / (n * 10) * 1e6:.2f} us")
    rx = Receiver()
    tracer = BenchTracer(rx.url, 1.0, "http://127.0.0.1:8080/v1", "chat")
    tracer.model = "m"
    now = time.monotonic_ns()
    for i in range(n):
        rec = RequestRecord(request_id=i, step="c1", sent_ns=now, first_token_ns=now + 1000, end_ns=now + 5000)
        rec.status, rec.prompt_tokens, rec.output_tokens, rec.max_tokens, rec.finish_reason = 200, 10, 5, 8, "stop"
        tracer.add(rec, 0)
    t = time.perf_counter()
    tracer.flush()
    note = tracer.shutdown()
    dt = time.perf_counter() - t
    print(
        f"span built and exported after the step: {dt / n * 1e6:.1f} us per request "
        f"({n} spans, {len(rx.spans)} received)"
    )
    if note:
        print(note)
    rx.server.shutdown()


def whole_runs(runs: int) -> None:
    import orjson
    from conftest import start_mock_process, stop_mock_process

    rx = Receiver()
    eng = start_mock_process("--ttft-ms", "20", "--itl-ms", "2", "--output-tokens", "8")
    medians: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for k in range(runs):
            for mode in ("on", "off") if k % 2 == 0 else ("off", "on"):
                out = Path(f"/tmp/bench_otlp_cost/{mode}{k}")
                subprocess.run(["rm", "-rf", str(out)], check=True)
                extra = ["--otlp-endpoint", rx.url] if mode == "on" else []
                cmd = [sys.executable, "-m", "servelab.cli", "bench", "--quiet", "--url", eng.base_url, "-n", "400"]
                cmd += ["--warmup", "8", "-c", "8", "--out", str(out), *extra]
                subprocess.run(cmd, check=True, capture_output=True, timeout=300)
                lines = [orjson.loads(x) for x in (out / "requests.jsonl").read_bytes().splitlines()]
                measured = [d for d in lines if not d["warmup"]]
                e2e = sorted(d["e2e_s"] * 1e3 for d in measured)
                ttft = statistics.median(d["ttft_s"] * 1e3 for d in measured)
                medians[mode].append(statistics.median(e2e))
                print(f"{mode:3} ttft_p50 {ttft:.3f} ms  e2e_p50 {statistics.median(e2e):.3f} ms  "
                      f"e2e_p99 {e2e[int(0.99 * len(e2e))]:.3f} ms")  # fmt: skip
        for mode, v in medians.items():
            print(f"{mode}: mean of {len(v)} E2E medians {statistics.mean(v):.3f} ms (sd {statistics.stdev(v):.3f})")
        print(f"spans received: {len(rx.spans)}")
    finally:
        stop_mock_process(eng.proc)
        rx.server.shutdown()


if __name__ == "__main__":
    args = sys.argv[1:]
    if "--runs" in args:
        i = args.index("--runs")
        runs = int(args[i + 1])
        del args[i : i + 2]
    else:
        runs = 0
    main(int(args[0]) if args else 20000)
    if runs:
        whole_runs(runs)
