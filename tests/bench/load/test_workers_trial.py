"""A trial's load steps and arrival test on several load-generator processes (``load_generator`` of the
experiment), on a mock engine: the requests come from two workers, the summaries say so, and the
quality gate stays in the trial's own process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from servelab.trial.flow import TrialRunner
from servelab.trial.spec import Experiment


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_trial_load_steps_on_two_workers(tmp_path):
    exp = {
        "name": "two-workers",
        "goal": {"expected_rate_rps": 40, "quality": {"smoke": ["streaming", "usage"], "structured_requests": 2}},
        "candidates": [{"name": "m", "engine": "mock", "settings": {"ttft_ms": 2, "itl_ms": 1, "output_tokens": 6}}],
        "workloads": ["short-qa", "structured"],
        "steps": {"concurrency": [1, 3]},
        "requests_per_step": 6,
        "warmup": 0,
        "repeats": 1,
        "mix_sweep": False,
        "arrival_test": {"enabled": True, "requests": 8},
        "load_generator": {"workers": 2},
    }
    out = tmp_path / "run"
    rec = TrialRunner(Experiment.model_validate(exp), out, progress=lambda s: None).run()
    cand = out / "candidates" / "m"
    steps = json.loads((cand / "steps" / "summary.json").read_text())
    assert steps["generator"]["mode"] == "processes" and len(steps["generator"]["workers"]) == 2
    lines = _lines(cand / "steps" / "requests.jsonl")
    c3 = [x for x in lines if x["step"] == "c3"]
    assert len(c3) == 2 * 6 and {x["worker"] for x in c3} == {0, 1}
    arrival = _lines(cand / "arrival" / "requests.jsonl")
    assert len(arrival) == 8 and {x["worker"] for x in arrival} == {0, 1}
    assert json.loads((cand / "arrival" / "summary.json").read_text())["generator"]["mode"] == "processes"
    # the quality gate is a handful of requests: sent by the trial's own process
    gate = json.loads((cand / "quality" / "summary.json").read_text())
    assert gate["generator"]["mode"] == "process"
    result = rec.result("m")
    assert [s.step for s in result.steps if s.workload == "short-qa"] == ["c1", "c3"]
    assert all(s.counts.submitted == 6 for s in result.steps)


def test_load_generator_needs_ray_for_per_node():
    with pytest.raises(ValidationError, match="workers_per_node"):
        Experiment.model_validate(
            {"candidates": [{"name": "m", "engine": "mock"}], "load_generator": {"workers_per_node": 2}}
        )
