"""Capacity in requests/s at the SLO (servelab.trial.capacity): the bracket-then-bisect search on a
fake probe, and through the real trial on a mock engine of known service rate (llama-server dialect
with 2 slots, requests queue for a free slot: service rate = 2 / request time), found within 5 %."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import start_mock_process, stop_process

from servelab.trial.capacity import search
from servelab.trial.results import Probe


def fake(capacity: float):
    calls: list[float] = []

    def probe(rate: float) -> Probe:
        calls.append(rate)
        return Probe(rate_rps=rate, held=rate <= capacity, output_tokens_per_s=rate * 10)

    return probe, calls


def test_bracket_then_bisect() -> None:
    probe, calls = fake(11.76)
    cap = search(probe, 4.0, max_probes=12, tolerance=0.02)
    assert calls[:3] == [4.0, 8.0, 16.0]  # doubling until one breaks
    assert cap.rate_rps <= 11.76 < cap.broke_at_rps and (cap.broke_at_rps - cap.rate_rps) / cap.rate_rps <= 0.02
    assert cap.interval.lo == cap.rate_rps and cap.interval.hi == cap.broke_at_rps
    # the bracket is the search's resolution, and the record says so (not a 95 % interval)
    assert cap.interval.method == "bracket" and cap.interval.level == 1.0
    assert cap.interval_note is not None and "not a confidence interval" in cap.interval_note
    assert cap.output_tokens_per_s == pytest.approx(cap.rate_rps * 10)
    probe, calls = fake(1.0)
    cap = search(probe, 4.0, max_probes=12, tolerance=0.05)
    assert calls[:3] == [4.0, 2.0, 1.0] and 0.95 <= cap.rate_rps <= 1.0  # halving until one holds
    probe, _ = fake(1e9)
    cap = search(probe, 1.0, max_probes=3)
    assert cap.rate_rps == 4.0 and cap.broke_at_rps is None and "higher" in cap.note
    probe, _ = fake(0.0)
    cap = search(probe, 1.0, max_probes=2)
    assert cap.rate_rps is None and "no rate" in cap.note
    with pytest.raises(ValueError):
        search(probe, 0.0)


TTFT_MS, ITL_MS, TOKENS, SLOTS = 20.0, 10.0, 16, 2
SERVICE_RPS = SLOTS / ((TTFT_MS + (TOKENS - 1) * ITL_MS) / 1000)  # 11.76 req/s

EXP = """
name: capacity
goal:
  slo: "ttft_p95<=60ms,error_rate<=5%"
  quality: {smoke: [streaming, usage]}
  mix: "short-qa:1"
  expected_rate_rps: 4
candidates:
  - {name: m, engine: url, url: "URL", settings: {}}
workloads: [short-qa]
steps: {concurrency: [1]}
requests_per_step: 4
warmup: 1
timeout_s: 20
repeats: 1
mix_sweep: false
arrival_test: {enabled: false}
capacity: {requests: 40, max_probes: 9, start_rps: 8, tolerance: 0.05, arrival: constant, model_check: true}
"""
# start_rps 8 (of a service rate of 11.76): one doubling brackets it (8 held, 16 broke), then bisection;
# a start at 4 spent a 10 s probe (40 requests at 4 req/s) on a rate far below the answer. Tolerance 0.05
# (the default): the search stops with held rate a and broken rate b, b < 1.05 a; with a <= 11.76 <= b that
# puts a within 5 % below the service rate, so the 5 % check below fails only when a probe's verdict is wrong
# (0.02 added two probes, at 11.75 and 11.875 req/s, that only narrowed the bracket further).


def test_capacity_search_finds_known_service_rate(tmp_path) -> None:
    m = start_mock_process(
        "--dialect",
        "llamacpp",
        "--max-inflight",
        str(SLOTS),
        "--ttft-ms",
        str(TTFT_MS),
        "--itl-ms",
        str(ITL_MS),
        "--output-tokens",
        str(TOKENS),
    )
    try:
        exp = tmp_path / "exp.yaml"
        exp.write_text(textwrap.dedent(EXP.replace("URL", m.base_url)))
        r = subprocess.run(
            [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(tmp_path / "run"), "--no-report"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "SERVELAB_RECORDS_DB": str(tmp_path / "records.db")},
        )
    finally:
        stop_process(m.proc)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rec = json.loads((tmp_path / "run" / "record.json").read_text())
    cap = rec["results"]["candidates"]["m"]["capacity"]
    assert cap["rate_rps"] == pytest.approx(SERVICE_RPS, rel=0.05), cap
    assert cap["broke_at_rps"] is not None and cap["rate_rps"] < cap["broke_at_rps"]
    assert cap["arrival"] == "constant" and len(cap["probes"]) <= 9
    assert "capacity at the SLO" in " ".join(rec["decision"]["verdicts"]["m"]["reasons"])
    # the capacity model fitted on the candidate's own steps and probes: the mock's 2 slots found
    # (more requests waited than were served), and every probe's verdict reproduced by simulation
    cm = rec["results"]["candidates"]["m"]["capacity_model"]
    assert cm["fit"]["params"]["slots"] == SLOTS and cm["fit"]["params"]["slots_identified"], cm["fit"]
    assert cm["validation"]["steps"] and cm["validation"]["median_abs_error"] is not None
    assert cm["search"]["probes_agreeing"] >= len(cm["search"]["probes"]) - 1, cm["search"]
    # model_check: one extra probe at the rate the model chose, predicted by the fit made before it ran
    ck = cm["check"]
    assert ck["rate_rps"] > 0 and ck["reason"] and ck.get("note") is None, ck
    assert ck["step"]["fitted_on"] == cm["fit"]["steps"] and ck["step"]["requests"] == 40
    assert ck["measured_held"] is not None and ck["predicted_held"] is not None
    assert (tmp_path / "run" / "candidates" / "m" / "capacity" / f"r{ck['rate_rps']:.4g}" / "requests.jsonl").is_file()
    assert len(cap["probes"]) == len(cm["search"]["probes"])  # the extra probe is not one of the search's
