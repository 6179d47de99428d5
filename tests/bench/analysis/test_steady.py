"""Steady window of a step (servelab.bench.analysis.steady): ramp-up and drain are left out of the throughput,
which equals what a server of known speed delivered; batch-means interval; open loop; degenerate steps."""

from __future__ import annotations

import pytest

from servelab.bench.analysis.steady import steady_window
from servelab.wire.types import RequestRecord

S = 1_000_000_000


def closed_loop(c: int, n: int, dur_s: float, tokens: int, lead_s: float = 0.0) -> list[RequestRecord]:
    """``n`` requests by ``c`` workers, each request ``dur_s`` long with ``tokens`` evenly spaced one-token
    chunks; worker ``w`` starts ``w * lead_s`` late (a ramp)."""
    recs, free = [], [int(w * lead_s * S) for w in range(c)]
    for i in range(n):
        w = min(range(c), key=lambda j: free[j])
        t0 = free[w]
        r = RequestRecord(
            request_id=i, sent_ns=t0, end_ns=t0 + int(dur_s * S), output_tokens=tokens, output_tokens_source="usage"
        )
        r.chunk_ns = [t0 + int(dur_s * S * (k + 1) / tokens) for k in range(tokens)]
        r.chunk_tokens = [1] * tokens
        recs.append(r)
        free[w] = r.end_ns
    return recs


def test_steady_throughput_is_what_the_server_delivered() -> None:
    # 4 in flight, each request 1 s for 20 tokens: the server delivers 80 tok/s while 4 are in flight
    recs = closed_loop(4, 16, 1.0, 20, lead_s=0.3)
    st = steady_window(recs, 4)
    assert st.ramp_s == pytest.approx(0.9) and st.drain_s > 0
    assert st.output_tokens_per_s == pytest.approx(80.0, rel=0.02)
    # the whole-step figure (tokens / first send..last end) is lower: ramp and drain dilute it
    whole = sum(r.output_tokens for r in recs) / ((max(r.end_ns for r in recs) - min(r.sent_ns for r in recs)) / S)
    assert whole < 0.95 * st.output_tokens_per_s
    assert st.output_tokens_per_s_ci is not None and st.output_tokens_per_s_ci.method == "t-blocks"
    assert st.output_tokens_per_s_ci.lo <= 80.0 <= st.output_tokens_per_s_ci.hi
    assert len(st.blocks) == 4


def test_open_loop_window_and_degenerate_steps() -> None:
    recs = [r for i in range(8) for r in closed_loop(1, 1, 1.0, 10, lead_s=0.0)]
    for i, r in enumerate(recs):  # 8 arrivals 0.5 s apart, each served in 1 s
        shift = int(i * 0.5 * S)
        r.sent_ns, r.end_ns = r.sent_ns + shift, r.end_ns + shift
        r.chunk_ns = [t + shift for t in r.chunk_ns]
    st = steady_window(recs, None)
    assert st.steady_s == pytest.approx(3.5) and st.ramp_s == 0
    assert st.output_tokens_per_s == pytest.approx(20.0, rel=0.1)  # 2 in flight x 10 tok/s
    one = steady_window(closed_loop(4, 1, 1.0, 10), 4)
    assert one.output_tokens_per_s is None and one.note
    assert steady_window([], 2).note == "no request was sent"
