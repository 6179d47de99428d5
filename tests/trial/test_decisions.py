"""Issue 12 acceptance on mock engines of known timing, through the real trial flow (servelab trial):

- the mix throughput equals what the engine delivered (within 2 %) — counted from the mock's own record
  of every token chunk it wrote (``/mock/records``, same monotonic clock) inside the trial's steady
  window — never a sum of separate runs;
- two identical candidates: "no significant difference"; one whose requests take 30 % longer:
  significantly different at the default repeats, the ratio's interval covering the engines' own ratio;
- record.json carries intervals, cost and replicas and validates against the committed schema.

The mocks are started here (``engine: url`` candidates) so their records can be read after the trial;
they stream on an absolute schedule (first token ``ttft_ms`` after the request starts, then a chunk
every ``itl_ms``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request

import jsonschema
import pytest
from conftest import start_mock_process, stop_process

from servelab.trial.results import RECORD_SCHEMA_PATH
from servelab.trial.spec import default_experiment

TTFT_MS, ITL_MS, TOKENS = 20.0, 10.0, 16
SLOW_ITL_MS = (1.3 * (TTFT_MS + (TOKENS - 1) * ITL_MS) - TTFT_MS) / (TOKENS - 1)  # 30 % longer requests
REPEATS = default_experiment().repeats


def _trial(tmp, body: str) -> tuple[dict, str]:
    exp = tmp / "exp.yaml"
    exp.write_text(textwrap.dedent(body))
    out = tmp / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out), "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SERVELAB_RECORDS_DB": str(tmp / "records.db")},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads((out / "record.json").read_text()), r.stdout


def server_tps(records: list[dict], start_ns: int, stop_ns: int) -> float:
    """Output tokens the mock wrote inside [start_ns, stop_ns) per second (its own record)."""
    n = sum(
        k
        for r in records
        for t, k in zip(r["token_write_ns"], r["token_counts"], strict=True)
        if start_ns <= t < stop_ns
    )
    return n / ((stop_ns - start_ns) / 1e9)


MOCK = ["--ttft-ms", str(TTFT_MS), "--output-tokens", str(TOKENS)]
EXP = f"""
name: known-timing
goal:
  slo: "ttft_p95<=2s,error_rate<=5%"
  quality: {{structured_valid_min: 0.5, smoke: [streaming, usage]}}
  mix: "short-qa:3,structured:1"
  expected_rate_rps: 5
  peak_rate_rps: 20
  headroom: 0.3
  budget: {{price_per_hour: 2.0, currency: USD}}
candidates:
  - {{name: fast, engine: url, url: "{{fast}}", settings: {{}}}}
  - {{name: twin, engine: url, url: "{{twin}}", settings: {{}}}}
  - {{name: slow, engine: url, url: "{{slow}}", price_per_hour: 1.0, settings: {{}}}}
workloads: [short-qa, structured]
steps: {{concurrency: [2, 4]}}
requests_per_step: 24
warmup: 1
timeout_s: 20
repeats: {REPEATS}
arrival_test: {{enabled: true, requests: 4}}  # read only for its verdicts being recorded (last test)
capacity: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def known(tmp_path_factory):
    mocks = {
        n: start_mock_process(*MOCK, "--itl-ms", str(itl))
        for n, itl in (("fast", ITL_MS), ("twin", ITL_MS), ("slow", SLOW_ITL_MS))
    }
    try:
        rec, out = _trial(
            tmp_path_factory.mktemp("known"),
            EXP.replace("{fast}", mocks["fast"].base_url)
            .replace("{twin}", mocks["twin"].base_url)
            .replace("{slow}", mocks["slow"].base_url),
        )
        seen = {
            n: json.loads(urllib.request.urlopen(m.root + "/mock/records", timeout=10).read()) for n, m in mocks.items()
        }
    finally:
        for m in mocks.values():
            stop_process(m.proc)
    return rec, out, {n: (v["records"] if isinstance(v, dict) else v) for n, v in seen.items()}


def test_mix_throughput_is_what_the_engine_delivered_never_the_sum(known):
    rec, _, served = known
    for name in ("fast", "twin", "slow"):
        c = rec["results"]["candidates"][name]
        mix = [s for s in c["steps"] if s["workload"] == "mix" and not s["skipped"]]
        # round 1 sweeps both levels; each later round re-runs the effective one (c4)
        assert len(mix) == 2 + (REPEATS - 1) and {s["repeat"] for s in mix} == set(range(REPEATS))
        assert [s["step"] for s in mix if s["repeat"]] == ["c4"] * (REPEATS - 1)
        for s in mix:
            st = s["steady"]
            truth = server_tps(served[name], st["start_ns"], st["stop_ns"])
            assert st["output_tokens_per_s"] == pytest.approx(truth, rel=0.02), (name, s["step"], truth)
            assert set(s["by_class"]) == {"short-qa", "structured"}  # the classes ran together
        eff = c["effective_throughput"]
        assert eff["workload"] == "mix" and eff["at_step"] == "c4" and eff["basis"] == "steady window"
        c4 = [s["steady"] for s in mix if s["step"] == "c4"]
        truth = sum(server_tps(served[name], st["start_ns"], st["stop_ns"]) for st in c4) / len(c4)
        assert eff["output_tokens_per_s"] == pytest.approx(truth, rel=0.02)
        per = [
            s["throughput"]["output_tokens_per_s"]
            for s in c["steps"]
            if s["workload"] != "mix" and s["step"] == "c4" and not s["skipped"]
        ]
        assert len(per) == 2 and eff["output_tokens_per_s"] < 0.75 * sum(per)  # not the old-style sum
        assert set(c["per_workload"]) == {"short-qa", "structured"}  # reported apart


def test_identical_no_significant_difference_thirty_percent_significant(known):
    rec, _, served = known
    d = rec["decision"]
    assert d["ranking"][2] == "slow" and set(d["ranking"][:2]) == {"fast", "twin"}
    first, second = d["differences"]
    # identical engines: no difference the decision acts on (the interval may exclude 1 by a fraction of a
    # per cent on mocks this precise; that is reported as "no material difference")
    assert first["significant"] is False, first["text"]
    assert first["text"].startswith(("no significant difference", "no material difference")), first["text"]
    assert 1 / 1.02 < first["ratio"] < 1.02
    assert second["significant"] is True
    res = rec["results"]["candidates"]

    def truth(n: str) -> float:
        c4 = [s["steady"] for s in res[n]["steps"] if s["workload"] == "mix" and s["step"] == "c4"]
        return sum(server_tps(served[n], st["start_ns"], st["stop_ns"]) for st in c4) / len(c4)

    true_ratio = truth(second["a"]) / truth("slow")
    assert 1.2 < true_ratio < 1.35  # requests 30 % longer; the client's turnaround between requests dilutes it
    assert second["ci"]["lo"] <= true_ratio <= second["ci"]["hi"] and second["ci"]["lo"] > 1.0
    assert d["significant"] is False and d["tie_break"]
    top = d["verdicts"][d["ranking"][0]]["reasons"]
    assert any("ranked first by the tie-break" in r for r in top)
    assert d["comparability"]["same_tokenizer"] is True


def test_record_carries_intervals_cost_replicas_and_validates(known):
    rec, _, _ = known
    jsonschema.validate(rec, json.loads(RECORD_SCHEMA_PATH.read_text()))
    assert rec["schema_version"] == 3
    fast, slow = rec["results"]["candidates"]["fast"], rec["results"]["candidates"]["slow"]
    et = fast["effective_throughput"]
    assert et["output_tokens_per_s_ci"]["method"] == "t-repeats" if REPEATS > 1 else "t-blocks"
    assert et["output_tokens_per_s_ci"]["lo"] <= et["output_tokens_per_s"] <= et["output_tokens_per_s_ci"]["hi"]
    assert fast["tail_latency"]["ttft_p95_ci"]["method"] == "order-statistics"
    step = next(s for s in fast["steps"] if not s["skipped"])
    assert step["ttft_s"]["p50_ci"]["lo"] <= step["ttft_s"]["p50"] <= step["ttft_s"]["p50_ci"]["hi"]
    assert {v["verdict"] for v in fast["slo_verdicts"]} <= {"met", "broken", "undetermined"}
    # cost per 10k output tokens at the declared price per hour (slow declares its own)
    cost = fast["cost"]
    assert cost["per_10k_output_tokens"] == pytest.approx(2.0 / 3600 / et["output_tokens_per_s"] * 1e4)
    assert cost["per_1m_output_tokens"] == pytest.approx(cost["per_10k_output_tokens"] * 100)
    assert cost["per_10k_ci"]["lo"] <= cost["per_10k_output_tokens"] <= cost["per_10k_ci"]["hi"]
    assert slow["cost"]["price_per_hour"] == 1.0
    rep = fast["replicas"]
    cap = et["requests_per_s"]
    assert rep["peak_rps"] == 20 and rep["headroom"] == 0.3 and rep["replicas"] >= 20 / (cap * 0.7) - 1
    assert fast["arrival_verdicts"] and rec["decision"]["budget_note"]
