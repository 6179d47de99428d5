"""The trial flow end to end on mock candidates (fast, exact): a good candidate is ranked and adopted,
one whose JSON-schema output is invalid is excluded by the smoke test with that reason, one that
crashes mid-step is recorded as failed, the trial goes on, and no engine process is left."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import psutil
import pytest


def _exp(tmp_path, body: str):
    p = tmp_path / "exp.yaml"
    p.write_text(textwrap.dedent(body))
    return p


EXP = """
name: mocks
goal:
  task: "chat"
  slo: "ttft_p95<=500ms,error_rate<=5%"
  quality: {structured_valid_min: 0.8}
  expected_rate_rps: 20
  burstiness: 0.5
  mix: "short-qa:3,structured:1"
candidates:
  - {name: good, engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 12}}
  - {name: badjson, engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 12, invalid_json: true}}
  - {name: crashy, engine: mock, settings: {ttft_ms: 5, itl_ms: 2, output_tokens: 12, crash_after_requests: 40}}
  - {name: slow, engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 12, dialect: sglang}}
workloads: [short-qa, structured]
steps: {concurrency: [1, 2, 4]}
requests_per_step: 6
warmup: 1
seed: 0
timeout_s: 10
arrival_test: {enabled: true, requests: 8}
"""


@pytest.fixture(scope="module")
def trial(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trial")
    exp = _exp(tmp, EXP)
    out = tmp / "run"
    env_db = str(tmp / "records.db")
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out), "--no-report"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**__import__("os").environ, "SERVELAB_RECORDS_DB": env_db},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r, json.loads((out / "record.json").read_text()), out


def test_record_rows_and_verdicts(trial):
    r, rec, out = trial
    for key in ("goal", "identity", "environment", "method", "results", "evidence", "decision"):
        assert rec[key], key
    res = rec["results"]["candidates"]
    assert res["good"]["status"] == "ranked" and res["slow"]["status"] == "ranked"
    assert res["badjson"]["status"] == "excluded" and "json_schema" in res["badjson"]["reason"]
    assert res["crashy"]["status"] == "failed" and "exited" in res["crashy"]["reason"]
    v = rec["decision"]["verdicts"]
    assert v["badjson"]["verdict"] == "exclude" and v["crashy"]["verdict"] == "exclude"
    assert {v["good"]["verdict"], v["slow"]["verdict"]} == {"adopt", "backup"}
    assert "decision:" in r.stdout and "record:" in r.stdout


def test_steps_cold_start_and_evidence(trial):
    _, rec, out = trial
    good = rec["results"]["candidates"]["good"]
    assert [s["step"] for s in good["steps"] if s["workload"] == "short-qa"] == ["c1", "c2", "c4"]
    assert good["max_step_meeting_slo"] == "c4"
    cs = good["cold_start"]
    assert 0 < cs["port_open_s"] <= cs["health_s"] <= cs["first_token_s"]
    assert good["arrival_run"]["counts"]["submitted"] == 8
    for f in rec["evidence"]["files"]["good"].values():
        assert (out / f).exists(), f
    assert all(good["smoke"][k]["ok"] for k in ("streaming", "usage", "json_schema", "stop"))


def test_no_engine_left_running(trial):
    _, rec, _ = trial
    for name, ident in rec["identity"]["candidates"].items():
        pid = (ident.get("engine") or {}).get("pid")
        if pid:
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, name


def test_bad_experiment_is_one_line(tmp_path):
    p = _exp(
        tmp_path,
        EXP.replace(
            "engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 12}}",
            "engine: mokc, settings: {ttft_ms: 5}}",
            1,
        ),
    )
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(p), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "candidates[0].engine" in r.stderr


def test_port_in_use_is_one_line_and_starts_nothing(tmp_path):
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        p = _exp(
            tmp_path,
            EXP.replace(
                "settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 12}}", f"settings: {{ttft_ms: 5, port: {port}}}}}", 1
            ),
        )
        r = subprocess.run(
            [sys.executable, "-m", "servelab.cli", "trial", str(p), "--out", str(tmp_path / "o")],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
        assert "candidates[0].settings.port" in r.stderr and "in use" in r.stderr
        assert r.stderr.strip().count("\n") == 0
        assert "starting" not in r.stdout
    finally:
        srv.close()


SLOW_EXP = """
name: interrupted
goal: {task: "chat", slo: "ttft_p95<=5s", expected_rate_rps: 20}  # capacity probes start at 20 req/s
candidates:
  - {name: first, engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 8}}
  - {name: second, engine: mock, settings: {ttft_ms: 5, itl_ms: 40, output_tokens: 200}}
  - {name: third, engine: mock, settings: {ttft_ms: 5, itl_ms: 1, output_tokens: 8}}
workloads: [short-qa]
steps: {concurrency: [1, 2]}
requests_per_step: 4
warmup: 0
seed: 0
timeout_s: 60
arrival_test: {enabled: false}
"""


@pytest.mark.parametrize(("signame", "code"), [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_writes_a_partial_record_that_report_renders(tmp_path, signame, code):
    """SIGINT (Ctrl-C) or SIGTERM (a service manager's stop) while the second candidate runs: exit 130 / 143,
    record.json written with the first candidate's results, the second marked interrupted, the third not run,
    and `servelab report` renders it."""
    import os
    import signal
    import time

    exp = _exp(tmp_path, SLOW_EXP)
    out = tmp_path / "run"
    env = {**os.environ, "SERVELAB_RECORDS_DB": str(tmp_path / "records.db"), "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out), "--no-report"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen = ""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        seen += line
        if "[second] smoke tests passed" in line:
            time.sleep(1.0)  # inside the 8 s load steps of the slow candidate
            p.send_signal(getattr(signal, signame))
            break
    rest_out, err = p.communicate(timeout=120)
    assert p.returncode == code, seen + rest_out + err
    assert "partial record" in err and ("SIGTERM" in err) == (signame == "SIGTERM"), err
    rec = json.loads((out / "record.json").read_text())
    cands = rec["results"]["candidates"]
    assert cands["first"]["status"] == "ranked"
    assert cands["second"]["status"] == "failed" and "interrupted" in cands["second"]["reason"]
    assert cands["third"]["status"] == "failed" and cands["third"]["reason"].startswith("not run")
    assert rec["interrupted"]["candidate"] == "second"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "report", str(out)], capture_output=True, text=True, timeout=120, env=env
    )
    assert r.returncode == 0, r.stdout + r.stderr
    html = (out / "report.html").read_text()
    assert "Partial trial" in html and "interrupted while <b>second</b>" in html


def test_external_server_down_fails_that_candidate_only(tmp_path):
    """An `engine: url` candidate whose server is not there is recorded as failed with the reason;
    the other candidates still run and the record is written."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exp = _exp(
        tmp_path,
        f"""
name: dead-url
goal: {{task: "chat", slo: "ttft_p95<=5s"}}
candidates:
  - {{name: gone, engine: url, url: "http://127.0.0.1:{port}/v1"}}
  - {{name: ok, engine: mock, settings: {{ttft_ms: 5, itl_ms: 1, output_tokens: 8}}}}
workloads: [short-qa]
steps: {{concurrency: [1]}}
requests_per_step: 3
warmup: 0
seed: 0
timeout_s: 20
arrival_test: {{enabled: false}}
""",
    )
    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out), "--no-report"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "SERVELAB_RECORDS_DB": str(tmp_path / "r.db")},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    cands = json.loads((out / "record.json").read_text())["results"]["candidates"]
    assert cands["gone"]["status"] == "failed" and f"127.0.0.1:{port}" in cands["gone"]["reason"]
    assert cands["ok"]["status"] == "ranked"
