"""``servelab gateway --workers N`` (issue 15 item 6): N processes on one port sharing a real Redis.

Acceptance: with ``--workers 2`` and an RPM limit of 12, 60 requests get exactly 12 answers (both workers
served some, by the access log's ``worker`` field); one ``/metrics`` shows both workers' counts; SIGTERM
leaves no process; a killed worker is restarted; N > 1 without Redis is refused with one line.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from conftest import (
    ADMIN_TOKEN,
    gateway_key,
    start_gateway,
    start_mock_process,
    stop_gateway,
    stop_mock_process,
    stop_process,
)
from services import redis_server

from servelab.gateway.server import WORKER_KEYS_REFRESH_S
from servelab.gateway.shutdown import HURRY_S, OVERRUN_S
from servelab.gateway.workers import CRASH_WINDOW_S, KILL_AFTER_S, shared_core_warning

RPM = 12
SENT = 60
TOKENS = 6


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as r:
        yield r.url


@pytest.fixture(scope="module")
def mock():
    m = start_mock_process("--dialect", "vllm", "--output-tokens", str(TOKENS), "--itl-ms", "5")
    yield m
    stop_mock_process(m.proc)


def _config(mock: Any, redis_url: str | None, entry: dict[str, str], rpm: int | None = RPM) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "backends": [{"name": "be", "kind": "mock", "base_url": mock.root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "be"}]}},
        "tenants": {"t": {"allowed_models": ["m"], "rpm": rpm}},
        "keys": [entry],
        "health": {"enabled": False},
    }
    if redis_url:
        cfg["state"] = {"redis_url": redis_url}
    return cfg


def _post(url: str, key: str) -> int:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    req = urllib.request.Request(
        url, data=body, headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code


def _metrics(gw: Any) -> dict[str, float]:
    req = urllib.request.Request(gw.admin_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def _total(m: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in m.items() if k.startswith(prefix))


def _worker_pids(gw: Any) -> tuple[int, int, int]:
    """(worker 0's pid, worker 1's pid, the supervisor's pid): the supervisor is the Popen, the workers its
    children, told apart by their ``--worker-index``."""
    sup = psutil.Process(gw.proc.pid)
    by_index = {}
    for c in sup.children():
        argv = c.cmdline()
        by_index[int(argv[argv.index("--worker-index") + 1])] = c.pid
    assert set(by_index) == {0, 1}, by_index
    return by_index[0], by_index[1], sup.pid


def _wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            break
        time.sleep(0.1)
    return alive


def test_two_workers_answer_exactly_the_rpm_limit_and_share_metrics(tmp_path: Path, mock: Any, redis_url: str) -> None:
    key, entry = gateway_key("k1", "t")
    prom = tmp_path / "prom"  # a given PROMETHEUS_MULTIPROC_DIR is used (emptied first) and kept
    prom.mkdir()
    (prom / "counter_1.db").write_bytes(b"stale")
    gw = start_gateway(
        _config(mock, redis_url, entry), tmp_path / "gw", "--workers", "2", env={"PROMETHEUS_MULTIPROC_DIR": str(prom)}
    )
    try:
        w0, w1, sup = _worker_pids(gw)
        assert not (prom / "counter_1.db").exists()
        url = gw.url + "/chat/completions"
        with ThreadPoolExecutor(8) as ex:
            statuses = list(ex.map(lambda _: _post(url, key), range(SENT)))
        assert statuses.count(200) == RPM, statuses
        assert statuses.count(429) == SENT - RPM, statuses
        recs = gw.access_records()
        assert len(recs) == SENT
        served = {r["worker"] for r in recs}
        assert served == {0, 1}, f"one worker took every connection: {served}"
        ok_by_worker = {w: sum(1 for r in recs if r["worker"] == w and r["status"] == 200) for w in (0, 1)}
        assert sum(ok_by_worker.values()) == RPM
        # one metrics view (worker 0's admin port) sums both workers; worker 1's inter-token counts
        # arrive within metrics.FLUSH_S
        time.sleep(1.5)
        m = _metrics(gw)
        assert _total(m, "servelab_gateway_requests_total{") == SENT
        assert m['servelab_gateway_requests_total{backend="be",model="m",status="200"}'] == RPM
        assert m['servelab_gateway_limit_rejections_total{limit="rpm"}'] == SENT - RPM
        assert m['servelab_gateway_ttft_seconds_count{backend="be",model="m"}'] == RPM
        # inter-token counts: one file per worker (by pid), non-empty exactly for the workers that streamed,
        # and the exposed count is their sum
        files = {int(f.stem.split("_")[1]): orjson.loads(f.read_bytes()) for f in prom.glob("itl_*.json")}
        assert set(files) <= {w0, w1}
        per_worker = {pid: sum(sum(counts) for _, counts, _ in rows) for pid, rows in files.items()}
        assert {pid for pid, n in per_worker.items() if n > 0} == {
            pid for pid, w in ((w0, 0), (w1, 1)) if ok_by_worker[w] > 0
        }, (per_worker, ok_by_worker)
        itl = m['servelab_gateway_inter_token_seconds_count{model="m"}']
        assert itl == sum(per_worker.values()) and 0 < itl <= RPM * (TOKENS - 1), m
        # SIGTERM to the supervisor stops every worker and leaves no process
        gw.proc.send_signal(signal.SIGTERM)
        assert gw.proc.wait(30) == 0
        assert _wait_gone([w0, w1, sup], 5) == []
    finally:
        stop_gateway(gw.proc)


def test_engine_gauges_appear_once_per_backend_under_two_workers(tmp_path: Path, mock: Any, redis_url: str) -> None:
    """Every worker scrapes the engine; /metrics (multiprocess mode) shows each backend's engine gauges once,
    from the answering worker, with the engine's own running/waiting figures (the mock's vLLM gauges)."""
    key, entry = gateway_key("k1", "t")
    cfg = _config(mock, redis_url, entry, rpm=None)
    cfg["health"] = {"enabled": True, "interval_s": 0.5, "timeout_s": 2}
    gw = start_gateway(cfg, tmp_path / "gw", "--workers", "2")
    try:
        assert _post(gw.url + "/chat/completions", key) == 200
        deadline = time.monotonic() + 15
        lines: list[str] = []
        while time.monotonic() < deadline:
            req = urllib.request.Request(gw.admin_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                text = r.read().decode()
            lines = [ln for ln in text.splitlines() if ln.startswith("servelab_gateway_engine_")]
            if any(ln.startswith('servelab_gateway_engine_scrape_up{backend="be",kind="mock"} 1') for ln in lines):
                break
            time.sleep(0.25)
        for name in ("scrape_up", "requests_running", "requests_waiting", "scrape_age_seconds"):
            series = [ln for ln in lines if ln.startswith(f'servelab_gateway_engine_{name}{{backend="be"')]
            assert len(series) == 1, (name, lines)
        assert any(ln.endswith(" 1.0") for ln in lines if ln.startswith("servelab_gateway_engine_scrape_up{")), lines
    finally:
        stop_gateway(gw.proc)


def test_a_killed_worker_is_restarted_and_the_port_keeps_serving(tmp_path: Path, mock: Any, redis_url: str) -> None:
    key, entry = gateway_key("k2", "t")
    gw = start_gateway(_config(mock, redis_url, entry), tmp_path / "gw", "--workers", "2")
    try:
        w0, w1, _ = _worker_pids(gw)
        os.kill(w1, signal.SIGKILL)
        sup = psutil.Process(gw.proc.pid)
        deadline = time.monotonic() + CRASH_WINDOW_S + 20
        kids: list[int] = []
        while time.monotonic() < deadline:
            kids = sorted(c.pid for c in sup.children() if c.status() != psutil.STATUS_ZOMBIE)
            if len(kids) == 2 and w1 not in kids:
                break
            time.sleep(0.2)
        assert w0 in kids and w1 not in kids and len(kids) == 2, kids
        assert "worker 1" in gw.stderr() and "restarting" in gw.stderr()
        time.sleep(2.0)  # the new worker binds the port
        url = gw.url + "/chat/completions"
        statuses = [_post(url, key) for _ in range(6)]
        assert statuses == [200] * 6, statuses
    finally:
        stop_gateway(gw.proc)


def _versions_by_worker(gw: Any, since: int) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for r in gw.access_records()[since:]:
        out.setdefault(r["worker"], set()).add(r["config_version"])
    return out


def test_sighup_and_admin_reload_reach_every_worker(tmp_path: Path, mock: Any, redis_url: str) -> None:
    key, entry = gateway_key("k4", "t")
    gw = start_gateway(_config(mock, redis_url, entry, rpm=None), tmp_path / "gw", "--workers", "2")
    try:
        url = gw.url + "/chat/completions"
        for expected, trigger in ((2, "sighup"), (3, "admin")):
            if trigger == "sighup":
                gw.sighup()  # to the supervisor, which passes it on
            else:
                req = urllib.request.Request(
                    gw.admin_url + "/admin/reload",
                    data=b"",
                    method="POST",
                    headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
                )
                with urllib.request.urlopen(req, timeout=10) as r:
                    assert r.status == 200
            time.sleep(1.5)
            since = len(gw.access_records())
            with ThreadPoolExecutor(8) as ex:
                assert set(ex.map(lambda _: _post(url, key), range(30))) == {200}
            assert _versions_by_worker(gw, since) == {0: {expected}, 1: {expected}}, trigger
    finally:
        stop_gateway(gw.proc)


def _admin(gw: Any, method: str, path: str, body: Any = None) -> Any:
    req = urllib.request.Request(
        gw.admin_url + path,
        method=method,
        data=None if body is None else orjson.dumps(body),
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        return orjson.loads(r.read())


def test_keys_created_and_revoked_on_worker_0_reach_every_worker(tmp_path: Path, mock: Any, redis_url: str) -> None:
    _, entry = gateway_key("k5", "t")
    gw = start_gateway(_config(mock, redis_url, entry, rpm=None), tmp_path / "gw", "--workers", "2")
    try:
        url = gw.url + "/chat/completions"
        created = _admin(gw, "POST", "/admin/keys", {"tenant": "t"})
        time.sleep(WORKER_KEYS_REFRESH_S + 1.0)
        since = len(gw.access_records())
        with ThreadPoolExecutor(8) as ex:
            assert set(ex.map(lambda _: _post(url, created["key"]), range(30))) == {200}
        assert set(_versions_by_worker(gw, since)) == {0, 1}
        _admin(gw, "DELETE", f"/admin/keys/{created['key_id']}")
        time.sleep(WORKER_KEYS_REFRESH_S + 1.0)
        since = len(gw.access_records())
        with ThreadPoolExecutor(8) as ex:
            assert set(ex.map(lambda _: _post(url, created["key"]), range(30))) == {401}
        assert set(_versions_by_worker(gw, since)) == {0, 1}
    finally:
        stop_gateway(gw.proc)


def _open_stream(gw: Any, key: str) -> http.client.HTTPConnection:
    """A streamed chat request on a fresh connection, its first bytes read (so it is in flight)."""
    u = urllib.parse.urlparse(gw.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True})
    c.request("POST", u.path + "/chat/completions", body, {"Authorization": f"Bearer {key}"})
    r = c.getresponse()
    assert r.status == 200 and r.read1(1), r.status
    return c


def _idle_keepalive(gw: Any) -> http.client.HTTPConnection:
    """A keep-alive connection that got one answer and stays open, idle."""
    u = urllib.parse.urlparse(gw.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", "/health/live")
    assert c.getresponse().read() is not None
    return c


@contextlib.contextmanager
def _busy_gateway(tmp_path: Path, redis_url: str, grace_s: float | None = None) -> Iterator[Any]:
    """A ``--workers 2`` gateway over a slow engine (60 s streams) after a key was created and revoked on
    worker 0, with 4 streams in flight and 4 idle keep-alive connections; all stopped after."""
    slow = start_mock_process("--dialect", "vllm", "--output-tokens", "600", "--itl-ms", "100")
    conns: list[http.client.HTTPConnection] = []
    gw = None
    try:
        key, entry = gateway_key("k6", "t")
        cfg = _config(slow, redis_url, entry, rpm=None)
        if grace_s is not None:
            cfg["server"] = {"shutdown_grace_s": grace_s}
        gw = start_gateway(cfg, tmp_path / "gw", "--workers", "2")
        created = _admin(gw, "POST", "/admin/keys", {"tenant": "t"})
        _admin(gw, "DELETE", f"/admin/keys/{created['key_id']}")
        conns += [_open_stream(gw, key) for _ in range(4)]
        conns += [_idle_keepalive(gw) for _ in range(4)]
        yield gw
    finally:
        for c in conns:
            c.close()
        if gw is not None:
            stop_gateway(gw.proc)
        stop_mock_process(slow.proc)


def _ledger_outcomes(gw: Any) -> list[str]:
    import sqlite3

    with sqlite3.connect(Path(gw.config["ledger"]["sqlite_path"])) as con:
        return [r[0] for r in con.execute("SELECT outcome FROM servelab_usage")]


def test_no_worker_outlives_a_supervisor_stopped_like_the_tests_stop_it(tmp_path: Path, redis_url: str) -> None:
    """SIGTERM to the supervisor, SIGKILL 10 s later (``stop_process(proc, 10)``, what ``stop_gateway`` does):
    with streams in flight the workers drain for ``shutdown_grace_s`` (15 s), the supervisor is killed
    mid-drain, and the kernel's SIGTERM (PR_SET_PDEATHSIG) must end the workers within HURRY_S. That SIGTERM
    was swallowed and they lived on ~20 s (aiohttp waits up to the grace twice). The cut streams keep their
    ledger rows."""
    with _busy_gateway(tmp_path, redis_url, grace_s=15.0) as gw:
        w0, w1, _ = _worker_pids(gw)
        t0 = time.monotonic()
        stop_process(gw.proc, 10.0)
        took = time.monotonic() - t0
        assert took >= 9.0, f"the supervisor stopped in {took:.1f} s: the streams were not in flight"
        assert _wait_gone([w0, w1], HURRY_S + 1.0) == [], "a worker outlived its supervisor"
        assert "the supervisor is gone (in step 'draining the API port')" in gw.stderr()
        assert len(_ledger_outcomes(gw)) == 4, _ledger_outcomes(gw)


def test_workers_of_a_killed_supervisor_stop_within_their_bound_and_keep_usage(tmp_path: Path, redis_url: str) -> None:
    """SIGKILL of the supervisor alone: the workers get SIGTERM from the kernel, drain for the grace (1 s),
    cut the streams still running and exit within grace + OVERRUN_S; each cut stream has its ledger row."""
    with _busy_gateway(tmp_path, redis_url, grace_s=1.0) as gw:
        w0, w1, sup = _worker_pids(gw)
        os.kill(sup, signal.SIGKILL)
        gw.proc.wait(5)
        assert _wait_gone([w0, w1], 1.0 + OVERRUN_S) == []
        outcomes = _ledger_outcomes(gw)
        assert len(outcomes) == 4, outcomes  # the 4 streams (health and admin calls are not billed)


def test_a_worker_ends_its_own_shutdown_before_the_supervisor_would_kill_it() -> None:
    assert OVERRUN_S < KILL_AFTER_S


def test_workers_without_redis_refused_with_one_line(tmp_path: Path, mock: Any) -> None:
    _, entry = gateway_key("k3", "t")
    gw_dir = tmp_path / "gw"
    gw_dir.mkdir()
    import yaml

    path = gw_dir / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **_config(mock, None, entry),
                "server": {"port": 0, "admin_port": 0},
                "ledger": {"sqlite_path": str(gw_dir / "usage.db")},
            }
        )
    )
    p = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "--config", str(path), "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, SERVELAB_ADMIN_TOKEN=ADMIN_TOKEN),
    )
    assert p.returncode == 2, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, p.stderr
    assert "--workers 2 needs state.redis_url" in lines[0] and "Traceback" not in p.stderr


def test_more_workers_than_cpus_is_warned_about() -> None:
    assert shared_core_warning(2, 2) is None and shared_core_warning(1, 1) is None
    w = shared_core_warning(3, 2)
    assert w is not None and "--workers 3 on 2 CPU(s)" in w and "time-share" in w


def test_the_warning_is_logged_by_the_command(tmp_path: Path, mock: Any) -> None:
    """Pinned to one CPU, ``--workers 2`` warns (the line comes before Redis is contacted: a dead URL is enough
    to stop it right after)."""
    _, entry = gateway_key("k4", "t")
    import yaml

    path = tmp_path / "gateway.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **_config(mock, "redis://127.0.0.1:1/0", entry),
                "server": {"port": 0, "admin_port": 0},
                "ledger": {"sqlite_path": str(tmp_path / "usage.db")},
            }
        )
    )
    p = subprocess.run(
        [
            "taskset",
            "-c",
            "0",
            sys.executable,
            "-m",
            "servelab.cli",
            "gateway",
            "--config",
            str(path),
            "--workers",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, SERVELAB_ADMIN_TOKEN=ADMIN_TOKEN),
    )
    assert "--workers 2 on 1 CPU(s): workers will time-share cores" in p.stderr, p.stderr
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
