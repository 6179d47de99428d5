"""``servelab bench`` end to end against ``servelab mock-engine``: files written, totals that add up
with injected failures, a server that dies mid-run, Ctrl-C, open-loop client queueing, SLO sweeps,
and one clear line for bad input."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from servelab.engines.spawn import free_port

SERVELAB = [sys.executable, "-m", "servelab.cli"]


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVELAB, "bench", "--quiet", *args], capture_output=True, text=True, timeout=timeout)


def load(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]
    return summary, lines


def assert_totals(summary: dict, lines: list[dict]) -> None:
    measured = [x for x in lines if not x["warmup"]]
    total = 0
    for s in summary["steps"]:
        if s.get("skipped"):
            continue
        c = s["counts"]
        assert c["submitted"] == c["succeeded"] + sum(c["failed"].values()) == c["succeeded"] + c["failed_total"]
        mine = [x for x in measured if x["step"] == s["step"] and x["workload"] == s["workload"]]
        assert len(mine) == c["submitted"]
        assert sum(1 for x in mine if x["failure"] is None) == c["succeeded"]
        for cls, n in c["failed"].items():
            assert sum(1 for x in mine if x["failure"] == cls) == n, cls
        total += c["submitted"]
    assert total == len(measured)


def test_files_and_totals(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "2", "--output-tokens", "12")
    out = tmp_path / "run"
    r = bench(
        "--url",
        m.base_url,
        "--workload",
        "short-qa,structured",
        "--concurrency",
        "1,4",
        "--requests",
        "12",
        "--warmup",
        "2",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert summary["complete"] and [(s["workload"], s["step"]) for s in summary["steps"]] == [
        ("short-qa", "c1"),
        ("short-qa", "c4"),
        ("structured", "c1"),
        ("structured", "c4"),
    ]
    assert len(lines) == 4 * (12 + 2)
    assert_totals(summary, lines)
    s = summary["steps"][1]
    assert s["counts"]["succeeded"] == 12 and s["ttft_s"]["p50"] >= 0.005
    assert s["throughput"]["output_tokens_per_s"] > 0 and s["tokens"]["output_source"] == {"usage": 12}
    # the structured set's answers are validated against their schema (the mock returns valid JSON)
    st = summary["steps"][2]
    assert st["counts"]["gate_failed"] == 0 and st["goodput"]["good_fraction"] == 1.0
    for f in ("config.json", "identity.json"):
        assert json.loads((out / f).read_text())
    assert "short-qa" in r.stdout and "summary.json" in r.stdout


@pytest.mark.parametrize("dialect", ["vllm", "sglang", "tgi", "llamacpp", "ollama"])
def test_injected_failures_add_up(mock_engine, tmp_path, dialect):
    m = mock_engine(
        "--dialect",
        dialect,
        "--ttft-ms",
        "2",
        "--itl-ms",
        "1",
        "--output-tokens",
        "8",
        "--fail-http-rate",
        "0.15",
        "--cut-rate",
        "0.1",
        "--stream-error-rate",
        "0.1",
        "--hang-rate",
        "0.05",
        "--seed",
        "3",
    )
    out = tmp_path / "run"
    r = bench(
        "--url",
        m.base_url,
        "--concurrency",
        "8",
        "--requests",
        "60",
        "--warmup",
        "0",
        "--timeout",
        "1",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert_totals(summary, lines)
    with urllib.request.urlopen(m.root + "/mock/stats") as resp:
        stats = json.loads(resp.read())
    c = summary["steps"][0]["counts"]
    injected = stats["injected"]
    assert c["failed"]["http_status"] == injected["http_status"]
    assert c["failed"]["cut_off"] == injected["cut_off"]
    assert c["failed"]["stream_error"] == injected["stream_error"]
    assert c["failed"]["timeout"] == injected["hang"]
    assert c["failed_total"] > 0 and c["succeeded"] == 60 - c["failed_total"]


def test_server_dies_mid_run(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "20", "--output-tokens", "10")
    out = tmp_path / "run"
    p = subprocess.Popen(
        [
            *SERVELAB,
            "bench",
            "--quiet",
            "--url",
            m.base_url,
            "--concurrency",
            "2",
            "--requests",
            "200",
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(2.5)
    m.proc.kill()
    m.proc.wait()
    so, se = p.communicate(timeout=120)
    assert p.returncode == 0, se
    summary, lines = load(out)
    assert_totals(summary, lines)
    c = summary["steps"][0]["counts"]
    assert c["submitted"] == 200 and 0 < c["succeeded"] < 200
    assert c["failed"]["connect"] > 0  # refused connections after the kill


def test_ctrl_c_keeps_finished_requests(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "20", "--output-tokens", "10")
    out = tmp_path / "run"
    p = subprocess.Popen(
        [
            *SERVELAB,
            "bench",
            "--quiet",
            "--url",
            m.base_url,
            "--concurrency",
            "2",
            "--requests",
            "500",
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    time.sleep(3)
    p.send_signal(signal.SIGINT)
    so, se = p.communicate(timeout=60)
    assert p.returncode == 130, se
    assert "Traceback" not in se
    summary, lines = load(out)
    assert summary["complete"] is False
    assert (
        summary["steps"] and summary["steps"][0]["partial"] is True and summary["steps"][0]["counts"]["succeeded"] > 5
    )
    assert len(lines) > 5 and sum(1 for x in lines if x["failure"] is None) > 5


def test_open_loop_client_queueing_is_reported(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "50", "--itl-ms", "5", "--output-tokens", "10")
    out = tmp_path / "run"
    # 20 req/s but only 1 in flight and each takes ~100 ms: arrivals must wait -> schedule lag grows
    r = bench(
        "--url",
        m.base_url,
        "--rate",
        "20",
        "--arrival",
        "constant",
        "--max-concurrency",
        "1",
        "--requests",
        "20",
        "--warmup",
        "0",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    lag = summary["steps"][0]["schedule_lag_s"]
    assert lag["max"] > 0.5 and lag["p50"] > 0.2
    out2 = tmp_path / "run2"
    r = bench(
        "--url",
        m.base_url,
        "--rate",
        "5",
        "--arrival",
        "constant",
        "--requests",
        "10",
        "--warmup",
        "0",
        "--out",
        str(out2),
    )
    summary2, _ = load(out2)
    assert summary2["steps"][0]["schedule_lag_s"]["p99"] < 0.05


def test_sweep_stops_after_slo_break(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "40", "--itl-ms", "1", "--output-tokens", "4")
    out = tmp_path / "run"
    r = bench(
        "--url",
        m.base_url,
        "--concurrency",
        "1,2,4",
        "--requests",
        "4",
        "--warmup",
        "0",
        "--slo",
        "ttft_p95<=10ms",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, _ = load(out)
    steps = summary["steps"]
    assert steps[0]["slo_met"] is False and steps[0]["slo"][0]["value"] >= 0.04
    assert [s["skipped"] for s in steps] == [False, True, True]
    assert steps[0]["counts"]["gate_failed"] == 4 and steps[0]["goodput"]["requests_per_s"] == 0


def _one_line_error(r: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout
    err = r.stderr.strip()
    assert err.count("\n") == 0, err
    for n in needles:
        assert n in err, err


def test_bad_input_one_line(tmp_path, mock_engine):
    port = free_port()
    _one_line_error(bench("--url", f"http://127.0.0.1:{port}/v1", "--out", str(tmp_path / "a")), "cannot connect")
    m = mock_engine()
    _one_line_error(bench("--url", m.root + "/nope", "--out", str(tmp_path / "b")), "404", "/v1")
    _one_line_error(bench("--url", m.base_url, "--slo", "ttft<=fast", "--out", str(tmp_path / "c")), "invalid SLO")
    _one_line_error(bench("--url", m.base_url, "--dataset", str(tmp_path / "missing.jsonl")), "does not exist")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "hi"}\n{not json\n')
    _one_line_error(bench("--url", m.base_url, "--dataset", str(bad), "--out", str(tmp_path / "d")), "bad.jsonl")
    notgguf = tmp_path / "model.gguf"
    notgguf.write_bytes(b"PK\x03\x04 this is a zip")
    _one_line_error(bench("--engine", "llamacpp", "--engine-model", str(notgguf), "--out", str(tmp_path / "e")), "GGUF")
    _one_line_error(bench("--url", "ftp://x", "--out", str(tmp_path / "f")), "http")
    _one_line_error(bench("--url", m.base_url, "--workload", "poetry", "--out", str(tmp_path / "g")), "workload")


def test_not_openai_server(tmp_path):
    port = free_port()
    (tmp_path / "v1").mkdir()
    (tmp_path / "v1" / "models").write_text("<html>hello</html>")
    srv = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(50):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        _one_line_error(
            bench("--url", f"http://127.0.0.1:{port}/v1", "--out", str(tmp_path / "x")),
            "not an OpenAI-compatible server",
        )
    finally:
        srv.kill()
        srv.wait()
