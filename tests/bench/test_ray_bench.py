"""``servelab bench --ray`` on a real local Ray cluster: a head and a second node, each its own
``ray start --block`` process on this machine (1 CPU each, small memory: fits a 2-core CI box), so one
load-generator actor lands on each node. Checks merged counts against the mock's own count, the open-loop
schedule against a single process with the same seed, and percentiles against the concatenated records.
The cluster is torn down at the end, every process of it (each node runs in a session of its own)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.engines.base import free_port
from test_bench_workers import assert_pooled_percentiles, bench, intended_offsets, load, mock_requests

RAY = Path(sys.executable).with_name("ray")
NODE_ARGS = ["--num-cpus", "1", "--memory", str(1 << 30), "--object-store-memory", str(80 << 20),
             "--disable-usage-stats", "--block"]


def _session_pids(sid: int) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, ProcessLookupError, PermissionError):
            pass
    return out


def _stop_session(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the node's whole session (ray start and every daemon it started), SIGKILL what is left."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _session_pids(proc.pid):
            time.sleep(0.2)
        if not _session_pids(proc.pid):
            break
    proc.wait(10)


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.3)
    raise RuntimeError(f"ray node did not start: {log.read_text(errors='replace')[-2000:]}")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """``HOST:PORT`` of a two-node Ray cluster on this machine."""
    tmp = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: Ray's socket paths must fit AF_UNIX
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        head_log = tmp / "head.log"
        procs.append(subprocess.Popen([str(RAY), "start", "--head", "--port", str(port), "--include-dashboard", "false",
                                       "--temp-dir", str(tmp / "ray"), *NODE_ARGS], stdout=open(head_log, "wb"),
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True))
        _wait_for(head_log, "block forever", procs[0])
        node_log = tmp / "node.log"
        procs.append(subprocess.Popen([str(RAY), "start", "--address", f"127.0.0.1:{port}", *NODE_ARGS],
                                      stdout=open(node_log, "wb"), stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True))
        _wait_for(node_log, "block forever", procs[1])
        yield f"127.0.0.1:{port}"
    finally:
        for p in reversed(procs):
            _stop_session(p)
        left = [pid for p in procs for pid in _session_pids(p.pid)]
        subprocess.run(["rm", "-rf", str(tmp)], check=False)
        assert not left, f"ray processes left: {left}"


def test_ray_open_loop_merged_like_one_process(ray_cluster, mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "3", "--itl-ms", "2", "--output-tokens", "8")
    one, two = tmp_path / "one", tmp_path / "ray"
    common = ["--url", m.base_url, "--rate", "30", "--arrival", "poisson", "--requests", "36", "--warmup", "2",
              "--seed", "7"]
    r = bench(*common, "--out", str(one))
    assert r.returncode == 0, r.stderr
    before = mock_requests(m.root)
    r = bench(*common, "--ray", ray_cluster, "--workers", "2", "--out", str(two), timeout=300)
    assert r.returncode == 0, r.stderr
    summary, lines = load(two)
    gen = summary["generator"]
    assert gen["mode"] == "ray" and gen["ray_address"] == ray_cluster
    assert len({w["node_id"] for w in gen["workers"]}) == 2  # one actor on each node
    assert all(w["same_clock"] and w["rtt_s"] > 0 and w["wall_offset_s"] is not None for w in gen["workers"])
    # merged counts equal the requests sent, by the mock's own count
    assert mock_requests(m.root) - before == len(lines) == 36 + 2
    s = summary["steps"][0]
    assert s["counts"]["submitted"] == 36 == sum(w["finished"] for w in s["workers"])
    assert {x["worker"] for x in lines if not x["warmup"]} == {0, 1}
    # one global schedule: the same intended send times as the single process, to the nanosecond
    assert intended_offsets(lines, "r30") == intended_offsets(load(one)[1], "r30")
    assert_pooled_percentiles(s, lines)
    assert all(w["cpu_fraction"] is not None for w in s["workers"])


def test_ray_closed_loop_per_node(ray_cluster, mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "3", "--itl-ms", "2", "--output-tokens", "8")
    out = tmp_path / "run"
    r = bench("--url", m.base_url, "--ray", ray_cluster, "--workers-per-node", "1", "--concurrency", "4",
              "--requests", "24", "--warmup", "0", "--out", str(out), timeout=300)
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert mock_requests(m.root) == len(lines) == 24
    s = summary["steps"][0]
    assert [(w["concurrency"], w["assigned"], w["finished"]) for w in s["workers"]] == [(2, 12, 12), (2, 12, 12)]
    assert_pooled_percentiles(s, lines)
