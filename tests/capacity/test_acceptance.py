"""Issue 23 acceptance: the mock engine with continuous-batching timing of a known law
(servelab.engines.mock.batch) is load-tested by ``servelab bench`` (closed loop 1, 2, 4, 8 against
4 slots, prompts of 80-1000 words, outputs 12-36 tokens); the fitted law is within 5 % of the mock's
and every held-out step's TTFT P50/P95 and output tokens/s are predicted within 10 %; then
``servelab capacity`` runs end to end on that evidence with the example profile.

The base latency is 100 ms so the client's own fixed cost on this box (HTTP round trip and parsing,
~3 ms measured here) is under 5 % of it: the fitted base is what the client sees, the mock's plus that.
~40 s of wall time."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import start_mock_process, stop_mock_process

from servelab.capacity.evidence import from_bench
from servelab.capacity.fit import fit
from servelab.capacity.validate import validate

ROOT = Path(__file__).resolve().parents[2]
LAW = {"ttft_ms": 100.0, "prefill_tokens_per_s": 5000.0, "itl_ms": 15.0, "itl_ms_per_running": 5.0, "slots": 4}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("cap")
    rng = random.Random(1)
    with (d / "prompts.jsonl").open("w") as f:
        for _ in range(64):
            f.write(
                json.dumps(
                    {
                        "prompt": " ".join(["w"] * rng.choice([80, 200, 400, 700, 1000])),
                        "max_tokens": rng.choice([12, 20, 28, 36]),
                    }
                )
                + "\n"
            )
    mock = start_mock_process(
        "--dialect",
        "llamacpp",
        "--ttft-ms",
        str(LAW["ttft_ms"]),
        "--itl-ms",
        str(LAW["itl_ms"]),
        "--prefill-tokens-per-s",
        str(LAW["prefill_tokens_per_s"]),
        "--itl-ms-per-running",
        str(LAW["itl_ms_per_running"]),
        "--max-inflight",
        str(LAW["slots"]),
        "--output-tokens",
        "64",
    )
    try:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "servelab.cli",
                "bench",
                "--url",
                mock.base_url,
                "--dataset",
                str(d / "prompts.jsonl"),
                "-c",
                "1,2,4,8",
                "-n",
                "16",
                "--warmup",
                "1",
                "-q",
                "-o",
                str(d / "run"),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    finally:
        stop_mock_process(mock.proc)
    return d / "run"


def test_fit_recovers_the_mock_law_within_5_percent(bench_run: Path) -> None:
    rep, _ = fit(from_bench(bench_run), bootstrap=20)
    p = rep.params
    assert p.slots == LAW["slots"] and p.slots_identified
    for got, want in (
        (p.prefill_base_s * 1e3, LAW["ttft_ms"]),
        (p.prefill_tokens_per_s, LAW["prefill_tokens_per_s"]),
        (p.decode_base_s * 1e3, LAW["itl_ms"]),
        (p.decode_per_running_s * 1e3, LAW["itl_ms_per_running"]),
    ):
        assert got is not None and abs(got - want) <= 0.05 * want, (got, want, rep)


def test_held_out_steps_predicted_within_10_percent(bench_run: Path) -> None:
    v = validate(from_bench(bench_run), bootstrap=10)
    assert [c.step for c in v.steps] == ["dataset/c1", "dataset/c2", "dataset/c4", "dataset/c8"]
    for c in v.steps:
        for pr in (c.ttft_p50_s, c.ttft_p95_s, c.output_tps):
            assert pr.error is not None and abs(pr.error) <= 0.10, (c.step, pr)
    # c8 queues behind 4 slots: its TTFT is several times c4's, so a model without slots would miss it
    c4, c8 = v.steps[2], v.steps[3]
    assert c8.ttft_p50_s.measured and c4.ttft_p50_s.measured and c8.ttft_p50_s.measured > 2 * c4.ttft_p50_s.measured


def test_capacity_command_end_to_end(bench_run: Path, tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "capacity",
            str(ROOT / "examples/traffic.yaml"),
            "--bench",
            f"np1={bench_run}",
            "--bench",
            f"np4={bench_run}",
            "--bootstrap",
            "5",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    for needle in (
        "peak rate:",
        "concurrent streams:",
        "held-out error:",
        "replicas:",
        "burst:",
        "cost:",
        "what if peak x2:",
        "what if outputs x2:",
        "tier small:",
        "blended:",
    ):
        assert needle in r.stdout, needle
    from servelab.capacity.results import CapacityReport

    rep = CapacityReport.model_validate_json(out.read_bytes())
    plan = rep.candidates["np4"].plan
    assert plan is not None and plan.replicas is not None and plan.capacity_per_replica_rps
    # replicas = ceil(offered peak / (capacity * (1 - headroom)))
    assert plan.replicas * plan.capacity_per_replica_rps * (1 - plan.headroom) >= rep.peak.offered_peak_rps.value
    assert (plan.replicas - 1) * plan.capacity_per_replica_rps * (1 - plan.headroom) < rep.peak.offered_peak_rps.value
    assert [w.change for w in plan.what_if] == ["peak x2", "outputs x2", "long share +10 points"]
    assert plan.what_if[0].replicas is not None and plan.what_if[0].replicas >= plan.replicas
