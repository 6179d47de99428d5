"""A trial with two real llama-server configurations (Gemma 3 270M, 1 slot vs 2 slots): a complete
record whose every 000 §12 row is filled, a decision, the records index, and a report that renders
in headless Chromium. Two interleaved rounds: the real-engine proof of restarting each candidate for
a later round. No capacity search: it is engine-independent open-loop load, proven on a mock of
llama-server's dialect (tests/trial/test_capacity.py) and rendered in Chromium by
tests/trial/test_report.py; nothing here reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest
from browser_check import _assert_rendered, _chart_count, _chromium_run

EXP = """
name: two-llama
goal:
  task: "chat: short Q&A + structured output"
  slo: "ttft_p95<=20s,error_rate<=1%"
  quality: {structured_valid_min: 0.0, structured_requests: 2,
            samples: [{prompt: "Reply with the single word OK.", expect_regex: ".", max_tokens: 4}]}
  expected_rate_rps: 1
  burstiness: 0.5
  mix: "short-qa:1,structured:1"
  budget: {max_minutes: 10, price_per_hour: 0.10, currency: USD}
candidates:
  - {name: np1, engine: llamacpp, settings: {parallel: 1, ctx_size: 2048}}
  - {name: np2, engine: llamacpp, settings: {parallel: 2, ctx_size: 2048}}
workloads:
  - {name: short-qa, set: {input_tokens: 32, output_tokens: 10}}
  - {name: structured, set: {input_tokens: 64, output_tokens: 32}}
steps: {concurrency: [1, 2]}
requests_per_step: 3
warmup: 0
seed: 0
timeout_s: 120
ignore_eos: true
arrival_test: {enabled: true, requests: 4}
repeats: 2
capacity: {enabled: false}
"""


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    from servelab.engines.llamacpp import find_llama_server

    if find_llama_server() is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server is not built: run 'servelab engine build llamacpp'")
        pytest.skip("llama-server not built; set SERVELAB_REQUIRE_ENGINE to fail instead")
    tmp = tmp_path_factory.mktemp("trial")
    exp = tmp / "exp.yaml"
    exp.write_text(textwrap.dedent(EXP))
    out = tmp / "run"
    env = {**os.environ, "SERVELAB_RECORDS_DB": str(tmp / "records.db")}
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=1200,
        env=env,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return r, json.loads((out / "record.json").read_text()), out, env


def test_every_record_row_is_filled(trial):
    _, rec, out, _ = trial
    g = rec["goal"]
    assert g["task"] and g["slo"] == ["ttft_p95<=20s", "error_rate<=1%"] and g["expected_rate_rps"] == 1
    for name in ("np1", "np2"):
        ident = rec["identity"]["candidates"][name]
        assert len(ident["model"]["sha256"]) == 64 and ident["engine"]["binary"]["sha256"]
        assert ident["engine"]["slots"] == int(name[-1])
        res = rec["results"]["candidates"][name]
        assert res["status"] == "ranked", res.get("reason")
        assert all(v["ok"] for v in res["smoke"].values()), res["smoke"]
        assert res["quality"]["passed"] and res["quality"]["checks"]
        assert res["effective_throughput"]["output_tokens_per_s"] > 0
        assert res["tail_latency"]["ttft_p95_s"] > 0 and res["error_rate"] == 0
        assert res["peak_rss_bytes"] > 50 * 2**20
        assert res["cost"]["per_1m_output_tokens"] > 0
        assert 0 < res["cold_start"]["health_s"] <= res["cold_start"]["first_token_s"]
        assert res["arrival_run"]["counts"]["submitted"] == 4
        # the engine's own /metrics were read during the steps, next to the client's figures
        assert any(s["server"] for s in res["steps"]), "no server metrics sampled"
        for f in rec["evidence"]["files"][name].values():
            assert (out / f).exists(), f
    env = rec["environment"]
    assert env["host"]["logical_cores"] and env["host"]["ram_bytes"] and env["parallel_layout"]
    m = rec["method"]
    assert m["requests_per_step"] == 3 and m["token_definition"] and m["cache_state"] and m["duration_s"] > 0
    assert rec["evidence"]["reproduce"].startswith("servelab trial")
    d = rec["decision"]
    assert sorted(v["verdict"] for v in d["verdicts"].values()) == ["adopt", "backup"]
    assert all(v["reasons"] for v in d["verdicts"].values())
    assert d["comparisons"][0]["differs_in"] == ["settings.parallel"]
    assert d["scope"] and d["recheck_when"]


def test_records_index_lists_it(trial):
    _, rec, out, env = trial
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "records", "list", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert rec["trial_id"] in r.stdout


def test_no_engine_left(trial):
    _, rec, _, _ = trial
    for ident in rec["identity"]["candidates"].values():
        pid = ident["engine"]["pid"]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_report_renders_in_chromium(trial, tmp_path):
    r, _, out, _ = trial
    page = out / "report.html"
    assert f"report: {page}" in r.stdout
    charts = _chart_count(page.read_text())
    res = _chromium_run(page, tmp_path / "profile", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    _assert_rendered(res.stdout, charts)
