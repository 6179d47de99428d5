"""GatewayMetrics' batched histogram observations equal one observe() per value."""

from __future__ import annotations

import random

from servelab.gateway.metrics import GatewayMetrics, HistogramBatch


def test_histogram_batch_equals_observe_per_value() -> None:
    one, batched = GatewayMetrics(), GatewayMetrics()
    rng = random.Random(1)
    values = [rng.choice([0.0, 0.0005, 0.001, 2.5, 99.0]) if rng.random() < 0.2 else rng.expovariate(50)
              for _ in range(2000)]  # includes values exactly on bucket edges and above the last one
    b = HistogramBatch(batched.model("m")[1])
    for v in values:
        one.model("m")[1].observe(v)
        b.add(v)
    b.add(0.01, 3)
    for _ in range(3):
        one.model("m")[1].observe(0.01)
    assert batched.expose() != one.expose()  # nothing reaches the histogram before the flush
    b.flush()
    b.flush()  # a second flush adds nothing
    pick = lambda m: sorted(ln for ln in m.expose().decode().splitlines()  # noqa: E731
                            if ln.startswith("servelab_gateway_inter_token_seconds") and "_created" not in ln)
    got, want = pick(batched), pick(one)
    assert len(want) > 10
    for g, w in zip(got, want):
        gk, gv = g.rsplit(" ", 1)
        wk, wv = w.rsplit(" ", 1)
        assert gk == wk and abs(float(gv) - float(wv)) <= 1e-9 * max(1.0, abs(float(wv))), (g, w)
