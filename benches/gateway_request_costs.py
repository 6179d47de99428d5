#!/usr/bin/env python3
"""What single pieces of the gateway's per-request work cost, in-process (microseconds a call, median of
``--repeats`` timings of ``--number`` calls each). Run by hand (not a test); the figures depend on the machine.

    .venv/bin/python benches/gateway_request_costs.py

- ``timeline marks``: the nine events marked for a plain streamed request (``received`` is implicit)
  (servelab.gateway.timeline.Timeline.mark);
- ``timeline record``: their compact access-log form (Timeline.record);
- ``timeline JSON``: that form through orjson, as the access-log line carries it;
- ``tracing begin+headers`` (with ``opentelemetry-sdk`` installed): what every request pays while tracing is on,
  sampled or not: the client's ``traceparent`` extracted, ids drawn, the sampler asked (ratio 0.1), the
  ``traceparent`` for the engine built (servelab.gateway.tracing.Tracing.begin, RequestTrace.headers). The
  exporter points at a closed port and nothing is sampled into it during the timing that matters.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
from collections.abc import Callable
from typing import Any

import orjson

from servelab.gateway.timeline import Timeline

ROUTED = {"candidates": [["mock0", "primary", 25]], "why": "prefix affinity (rendezvous hash of the prompt's start)"}
ATTEMPT = {"n": 1, "backend": "mock0", "role": "primary", "in_flight": 25, "age_s": 0.5, "running": 0.0, "waiting": 0.0}


def _marks(tl: Timeline) -> None:
    tl.events.clear()
    tl.mark("checked")
    tl.mark("admitted")
    tl.mark("routed", ROUTED)
    tl.mark("attempt", ATTEMPT)
    tl.mark("connected", {"reused": True})
    tl.mark("headers", {"status": 200})
    tl.mark("first_token", None, time.monotonic_ns())
    tl.mark("last_token", None, time.monotonic_ns())
    tl.mark("done", {"status": 200})


def _tracing() -> Callable[[], Any] | None:
    try:
        from multidict import CIMultiDict, CIMultiDictProxy

        from servelab.gateway.config import TracingSection
        from servelab.gateway.tracing import Tracing
    except ImportError:
        return None
    t = Tracing.from_section(TracingSection(endpoint="http://127.0.0.1:9/v1/traces", sample_ratio=0.1))
    if t is None:
        return None
    h = CIMultiDictProxy(CIMultiDict({"Host": "gw", "Authorization": "Bearer x", "Content-Type": "application/json"}))
    return lambda: t.begin(h).headers(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--number", type=int, default=20000, help="calls per timing")
    ap.add_argument("--repeats", type=int, default=5, help="timings per piece (the median is printed)")
    a = ap.parse_args()
    if a.number < 1 or a.repeats < 1:
        ap.error("--number and --repeats must be >= 1")
    tl = Timeline()
    t0 = time.monotonic_ns()
    _marks(tl)
    rec = tl.record(t0)
    pieces: dict[str, Callable[[], Any]] = {
        "timeline marks (9 events)": lambda: _marks(tl),
        "timeline record": lambda: tl.record(t0),
        "timeline JSON (orjson)": lambda: orjson.dumps(rec),
    }
    trace = _tracing()
    if trace is not None:
        pieces["tracing begin+headers (ratio 0.1)"] = trace
    for name, fn in pieces.items():
        runs = [timeit.timeit(fn, number=a.number) / a.number * 1e6 for _ in range(a.repeats)]
        print(
            f"{name:<36} {statistics.median(runs):6.2f} us  (range {min(runs):.2f}-{max(runs):.2f}, "
            f"{a.repeats} x {a.number} calls)"
        )


if __name__ == "__main__":
    main()
