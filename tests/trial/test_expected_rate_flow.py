"""The expected-rate test through the real flow, on mock engines of known timing: a one-slot engine
(llama-server dialect: requests beyond the slot queue) that serves ~20 req/s gets 50 req/s at the
expected rate, so its queue grows and TTFT P95 is broken in each run: the test is run again in the
next repeat round (an exclusion needs a breach in every run) and the candidate is excluded; an engine
without a slot cap keeps TTFT at a few ms, so its verdict cannot become "broken" and the test is not
repeated for it (curtailed: the budget is kept)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("exprate")
    exp = {
        "name": "expected-rate",
        "goal": {
            "slo": "ttft_p95<=150ms",
            "expected_rate_rps": 50,
            "burstiness": 1.0,
            "mix": "short-qa:1",
            "quality": {"smoke": ["streaming", "usage"]},
        },
        "candidates": [
            {
                "name": "oneslot",
                "engine": "mock",
                "settings": {"dialect": "llamacpp", "max_inflight": 1, "ttft_ms": 5, "itl_ms": 5, "output_tokens": 10},
            },
            {"name": "wide", "engine": "mock", "settings": {"ttft_ms": 5, "itl_ms": 5, "output_tokens": 10}},
        ],
        "workloads": [{"name": "short-qa", "set": {"output_tokens": 10}}],
        "steps": {"concurrency": [1]},
        "requests_per_step": 4,
        "warmup": 0,
        "repeats": 2,
        "arrival_test": {"enabled": True, "requests": 12},
        "capacity": {"enabled": False},
    }
    p = tmp / "exp.yaml"
    p.write_text(yaml.safe_dump(exp))
    out = tmp / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(p), "--out", str(out), "--no-report", "--no-index"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((out / "record.json").read_text())


def test_breach_in_every_run_excludes(record: dict) -> None:
    one = record["results"]["candidates"]["oneslot"]
    assert one["max_step_meeting_slo"] == "c1"  # one at a time it meets the SLO
    assert len(one["arrival_repeats"]) == 1 and one["arrival_repeats"][0]["repeat"] == 1
    v = next(x for x in one["arrival_verdicts"] if x["objective"].startswith("ttft_p95"))
    assert v["rule"] == "each-run" and v["run_verdicts"] == ["broken", "broken"] and v["verdict"] == "broken"
    assert v["ci"]["lo"] > 0.15
    d = record["decision"]["verdicts"]["oneslot"]
    assert d["verdict"] == "exclude" and "expected rate" in d["reasons"][0] and "each of 2 runs" in d["reasons"][0]


def test_no_repeat_when_it_cannot_exclude(record: dict) -> None:
    wide = record["results"]["candidates"]["wide"]
    assert wide.get("arrival_repeats", []) == []
    v = next(x for x in wide["arrival_verdicts"] if x["objective"].startswith("ttft_p95"))
    assert v["verdict"] == "undetermined" and v["rule"] == "one-run" and v["run_verdicts"] == ["undetermined"]
    assert record["decision"]["adopt"] == "wide"
