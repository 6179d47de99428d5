#!/usr/bin/env python3
"""What ``servelab bench --otlp-endpoint`` costs the bench (servelab.bench.tracing). Run by hand (not a test).

    .venv/bin/python benches/bench_otlp_cost.py [N]

Two figures: the per-request hot-path cost (building the ``traceparent`` header while the request is timed),
and the cost of one span built after its step ended (off the request clock; between steps), both per request,
CPU of this process; the spans are exported to an in-process OTLP receiver (tests/otlp_receiver.py), whose
decoding shares this process's GIL, so the second figure is an upper bound.
"""

from __future__ import annotations

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


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20000)
