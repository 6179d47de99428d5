"""Adding a workload set is one module: this test module *is* that module. It declares a toy set (its
request builder, its own ``--set`` key), registers it, and runs it in ``servelab bench`` and in a trial
(where it is also the goal's mix, the ranked figure) — nothing outside this file changes."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from servelab.bench.workloads.kinds import WorkloadContext, WorkloadKind
from servelab.bench.workloads.registry import register_workload, unregister_workload
from servelab.wire import RequestSpec

pytestmark = pytest.mark.timeout(300)

# ---------------------------------------------------------------------------------------------------
# the set: everything a new workload needs


def build_toy(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    """Request ``i`` asks to count to a seeded number; ``answer_tokens`` (default 6) caps the answer."""
    answer = int(ctx.overrides.get("answer_tokens", 6))

    def make(i: int) -> RequestSpec:
        n = random.Random(f"toy:{ctx.seed}:{i}").randint(3, 9)
        return ctx.request(f"toy request {i}: count to {n}", answer, "toy", None)

    return make


TOY = WorkloadKind(
    "toy",
    "count to a small number (a toy set of the tests)",
    build_toy,
    mixable=True,
    keys=frozenset({"answer_tokens"}),
)


@pytest.fixture(scope="module")
def toy() -> Iterator[WorkloadKind]:
    kind = register_workload(TOY)
    try:
        yield kind
    finally:
        unregister_workload("toy")


# ---------------------------------------------------------------------------------------------------
# a bench and a trial


def _max_tokens_received(root: str) -> list[int]:
    """The answer cap of every chat request the mock received."""
    import urllib.request

    with urllib.request.urlopen(root + "/mock/records", timeout=10) as r:
        records = json.loads(r.read())
    return [
        x["sampling"].get("max_tokens") or x["sampling"].get("max_completion_tokens")
        for x in records
        if x["endpoint"] == "chat"
    ]


def test_servelab_bench_runs_the_new_set(toy: WorkloadKind, mock_engine, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from servelab.cli import app

    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "4")
    out = tmp_path / "run"
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "--url",
            m.base_url,
            "-w",
            "toy",
            "--set",
            "toy.answer_tokens=5",
            "--concurrency",
            "1,2",
            "-n",
            "3",
            "--warmup",
            "0",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert r.exit_code == 0, r.output
    summary = json.loads((out / "summary.json").read_text())
    assert [(s["workload"], s["step"], s["counts"]["succeeded"]) for s in summary["steps"]] == [
        ("toy", "c1", 3),
        ("toy", "c2", 3),
    ]
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert {x["workload"] for x in lines} == {"toy"}
    assert _max_tokens_received(m.root) == [5] * 6  # the set's own key (--set toy.answer_tokens=5) was sent


def test_a_trial_runs_the_new_set_and_mixes_it(toy: WorkloadKind, tmp_path: Path) -> None:
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import Experiment

    exp = Experiment.model_validate(
        {
            "name": "toy-workload",
            "goal": {"slo": "ttft_p95<=5s", "quality": {"smoke": ["streaming", "usage"]}},
            "candidates": [
                {"name": "m", "engine": "mock", "settings": {"ttft_ms": 1, "itl_ms": 1, "output_tokens": 4}}
            ],
            "workloads": [{"name": "toy", "set": {"answer_tokens": 5}}],
            "steps": {"concurrency": [1, 2]},
            "requests_per_step": 3,
            "warmup": 0,
            "timeout_s": 20,
            "repeats": 1,
            "arrival_test": {"enabled": False},
        }
    )
    assert exp.arrival_mix == "toy:1"  # the only mixable workload of the experiment
    rec = TrialRunner(exp, tmp_path / "run", progress=lambda s: None).run()
    res = rec.results.candidates["m"]
    assert res.status == "ranked" and rec.decision.adopt == "m"
    assert [(s.workload, s.step) for s in res.steps] == [("toy", "c1"), ("toy", "c2"), ("mix", "c1"), ("mix", "c2")]
    mix = json.loads((tmp_path / "run/candidates/m/mix/requests.jsonl").read_text().splitlines()[0])
    assert mix["workload"] == "toy" and res.effective_throughput is not None
