"""GatewayMetrics' counting histogram (inter-token gaps) exposes exactly what prometheus-client's own
Histogram exposes for the same observations."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from servelab.gateway.metrics import _ITL_BUCKETS_S, GatewayMetrics


def test_counting_histogram_equals_prometheus_histogram() -> None:
    ref_reg = CollectorRegistry()
    ref = Histogram(
        "servelab_gateway_inter_token_seconds",
        "Time between token chunks at the gateway",
        ("model",),
        buckets=_ITL_BUCKETS_S,
        registry=ref_reg,
    )
    ours = GatewayMetrics()
    rng = random.Random(1)
    values = [
        rng.choice([0.0, 0.0005, 0.001, 2.5, 99.0]) if rng.random() < 0.2 else rng.expovariate(50) for _ in range(2000)
    ]  # includes values exactly on bucket edges and above the last one
    for i, v in enumerate(values):
        model = "a" if i % 3 else "b"
        ref.labels(model).observe(v)
        ours.model(model, "be")[1].observe(v)
    ours.model("a", "be")[1].add(0.01, 3)
    for _ in range(3):
        ref.labels("a").observe(0.01)

    def pick(text: bytes) -> list[str]:
        return sorted(
            ln
            for ln in text.decode().splitlines()
            if ln.startswith("servelab_gateway_inter_token_seconds") and "_created" not in ln
        )

    got, want = pick(ours.expose()), pick(generate_latest(ref_reg))
    assert len(want) == 2 * (len(_ITL_BUCKETS_S) + 3)  # buckets, +Inf, _count, _sum per model
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        gk, gv = g.rsplit(" ", 1)
        wk, wv = w.rsplit(" ", 1)
        assert gk == wk and abs(float(gv) - float(wv)) <= 1e-9 * max(1.0, abs(float(wv))), (g, w)
    assert "# TYPE servelab_gateway_inter_token_seconds histogram" in ours.expose().decode()
