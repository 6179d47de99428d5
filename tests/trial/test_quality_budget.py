"""The quality gate within the trial budget (servelab.trial.quality_budget), on mock engines of known
timing: a slow engine's structured gate (estimated from its first measured gate request) does not fit
in the budget, is skipped, recorded in method.budget and named in the verdict, and the candidate is
excluded as "undetermined", never passed; a fast engine in the same trial passes its gate in full."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from servelab.trial.quality_budget import GateTiming
from servelab.wire.types import RequestRecord

ITL_SLOW_MS = 150.0
STRUCTURED_TOKENS = 64


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("qbudget")
    exp = {
        "name": "quality-budget",
        "goal": {
            "slo": "ttft_p95<=5s",
            "budget": {"max_minutes": 0.5},
            "quality": {
                "smoke": ["streaming", "usage"],
                "structured_requests": 8,
                "structured_valid_min": 0.5,
                "samples": [
                    {"name": "ok", "prompt": "Say OK", "expect_regex": "tok", "max_tokens": 8},
                    {"name": "ok2", "prompt": "Say OK", "expect_regex": "tok", "max_tokens": 8},
                ],
            },
        },
        "candidates": [
            {"name": "slow", "engine": "mock", "settings": {"ttft_ms": 5, "itl_ms": ITL_SLOW_MS, "output_tokens": 6}},
            {"name": "fast", "engine": "mock", "settings": {"ttft_ms": 5, "itl_ms": 1, "output_tokens": 6}},
        ],
        "workloads": [
            {"name": "short-qa", "set": {"output_tokens": 6}},
            {"name": "structured", "set": {"output_tokens": STRUCTURED_TOKENS}},
        ],
        "steps": {"concurrency": [1]},
        "requests_per_step": 3,
        "warmup": 0,
        "repeats": 1,
        "mix_sweep": False,
        "arrival_test": {"enabled": False},
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


def test_slow_gate_skipped_undetermined_and_named(record: dict) -> None:
    slow = record["results"]["candidates"]["slow"]
    q = slow["quality"]
    assert q["undetermined"] is True and q["passed"] is False
    st = next(c for c in q["checks"] if c["name"] == "structured_valid_fraction")
    assert st["undetermined"] and st["ran"] == 0 and st["planned"] == 8 and not st["ok"]
    # the estimate: 8 requests x 64 tokens x ~150 ms/token (~77 s) > the 30 s budget
    est = float(st["note"].split("estimated ")[1].split(" s")[0])
    assert 8 * STRUCTURED_TOKENS * ITL_SLOW_MS / 1000 * 0.8 <= est <= 8 * STRUCTURED_TOKENS * ITL_SLOW_MS / 1000 * 1.5
    assert slow["status"] == "excluded" and "quality gate undetermined" in slow["reason"]
    assert "slow/quality/structured" in record["method"]["budget"]["skipped"]
    v = record["decision"]["verdicts"]["slow"]
    assert v["verdict"] == "exclude"
    assert any("undetermined" in r for r in v["reasons"]) and any("quality/structured" in r for r in v["reasons"])


def test_fast_gate_runs_in_full(record: dict) -> None:
    fast = record["results"]["candidates"]["fast"]
    q = fast["quality"]
    assert q["passed"] is True and not q.get("undetermined")
    assert all(not c.get("undetermined") for c in q["checks"]) and len(q["checks"]) == 2
    assert fast["status"] == "ranked"


def test_estimate_from_first_request() -> None:
    ms = 1_000_000
    rec = RequestRecord(request_id=0, workload="sample:x")
    rec.sent_ns, rec.first_token_ns, rec.end_ns, rec.output_tokens = 0, 50 * ms, 50 * ms + 9 * 100 * ms, 10
    t = GateTiming.of(rec)
    assert t is not None and abs(t.ttft_s - 0.05) < 1e-9 and abs(t.tpot_s - 0.1) < 1e-9
    assert abs(t.request_s(128) - (0.05 + 12.8)) < 1e-9
    one = RequestRecord(request_id=1, workload="sample:x")
    one.sent_ns, one.first_token_ns, one.end_ns, one.output_tokens = 0, 200 * ms, 200 * ms, 1
    t1 = GateTiming.of(one)
    assert t1 is not None and abs(t1.tpot_s - 0.2) < 1e-9  # a single token: its E2E per token
    assert GateTiming.of(RequestRecord(request_id=2, workload="x")) is None
