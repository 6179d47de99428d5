"""Gateway test fixtures.

``gateway(config_dict)`` starts ``servelab gateway`` as a subprocess from a config given as a Python dict
and returns a :class:`GatewayProcess` (``.url`` = OpenAI API root ending in ``/v1``, ``.admin_url``,
``.admin_token``, ``.config_path``, ``.access_log`` path, ``.log_path`` = the process's stderr file).
The fixture fills in what a test rarely cares about: ``server.port``/``admin_port`` 0 (free ports),
``server.access_log`` and ``ledger.sqlite_path`` in the test's tmp folder, ``SERVELAB_ADMIN_TOKEN`` in the
process's environment. Every process is stopped at teardown. Example::

    def test_x(gateway, mock_engine):
        eng = mock_engine("--dialect", "vllm")
        key, entry = gateway_key("k1", "t")
        gw = gateway({"backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["m"]}],
                      "models": {"m": {"targets": [{"backend": "b"}]}},
                      "tenants": {"t": {}}, "keys": [entry]})
        openai.OpenAI(base_url=gw.url, api_key=key).chat.completions.create(...)

:func:`gateway_key` makes a valid ``sk-sl-<id>-<secret>`` key and its ``keys:`` entry. For module-scoped
setups use :func:`start_gateway`/:func:`stop_gateway` directly, and ``start_mock_process``/``stop_mock_process``
(re-exported from tests/conftest.py, which this file shadows as module ``conftest``):
``from conftest import gateway_key, start_gateway, start_mock_process``.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from by_path import load_module

# tests/conftest.py is shadowed by this file as module "conftest"; load it under its own name so
# module-scoped fixtures here can start mock engines (start_mock_process / stop_mock_process). Once this file
# is collected it is the module "conftest" for every later ``from conftest import ...`` (tests/trial/
# included), so it re-exports the root helpers by name.
_ROOT = load_module("servelab_tests_root_conftest", Path(__file__).resolve().parents[1] / "conftest.py")
MockProcess = _ROOT.MockProcess
high_priority = _ROOT.high_priority
start_mock_process = _ROOT.start_mock_process
stop_mock_process = _ROOT.stop_mock_process
stop_process = _ROOT.stop_process

_LISTEN = re.compile(rb"listening on (http://\S+/v1)(?: \(admin (http://\S+)\))?")
ADMIN_TOKEN = "test-admin-token-" + "0" * 16


def gateway_key(key_id: str = "k1", tenant: str = "t") -> tuple[str, dict[str, str]]:
    """A fresh API key ``sk-sl-<key_id>-<64 hex>`` and its config entry ``{id, tenant, sha256}``."""
    from servelab.gateway.keys import format_key, hash_secret

    secret = secrets.token_hex(32)
    return format_key(key_id, secret), {"id": key_id, "tenant": tenant, "sha256": hash_secret(secret)}


@dataclass
class GatewayProcess:
    """A running gateway subprocess and where to find its files."""

    proc: subprocess.Popen[bytes]
    url: str
    admin_url: str | None
    config_path: Path
    access_log: Path
    log_path: Path
    admin_token: str = ADMIN_TOKEN
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> str:
        """The URL without ``/v1`` (for ``/health`` and ``/metrics``)."""
        return self.url[: -len("/v1")]

    def write_config(self, config: dict[str, Any]) -> None:
        """Replace the config file atomically (rename), as an editor or deploy tool would; the gateway
        notices within about a second. Fills the same defaults as the fixture."""
        cfg = _fill(copy.deepcopy(config), self.config_path.parent, keep_ports=self.config)
        tmp = self.config_path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(cfg, sort_keys=False))
        os.replace(tmp, self.config_path)
        self.config = cfg

    def sighup(self) -> None:
        """Ask for a reload now."""
        self.proc.send_signal(signal.SIGHUP)

    def access_records(self) -> list[dict[str, Any]]:
        """The access-log lines written so far, decoded."""
        import orjson

        if not self.access_log.exists():
            return []
        return [orjson.loads(x) for x in self.access_log.read_bytes().splitlines() if x.strip()]

    def access_record(self, rid: str) -> dict[str, Any]:
        """The access-log line of request ``rid`` as written so far (no wait); AssertionError when none."""
        rec = next((r for r in self.access_records() if r["request_id"] == rid), None)
        assert rec is not None, f"no access-log line for {rid}"
        return rec

    def stderr(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _fill(cfg: dict[str, Any], folder: Path, keep_ports: dict[str, Any] | None = None) -> dict[str, Any]:
    server = cfg.setdefault("server", {})
    if keep_ports:
        server.setdefault("port", keep_ports["server"]["port"])
        server.setdefault("admin_port", keep_ports["server"]["admin_port"])
    server.setdefault("port", 0)
    server.setdefault("admin_port", 0)
    server.setdefault("access_log", str(folder / "access.log"))
    cfg.setdefault("ledger", {"sqlite_path": str(folder / "usage.db")})
    cfg.setdefault("health", {"interval_s": 0.5})
    return cfg


def start_gateway(
    config: dict[str, Any],
    folder: Path,
    *args: str,
    env: dict[str, str] | None = None,
    timeout_s: float = 30.0,
    preexec_fn: Any = None,
) -> GatewayProcess:
    """Write ``config`` (defaults filled, see module doc) to ``folder/gateway.yaml`` and start
    ``servelab gateway`` on it (``preexec_fn``: run in the child before exec, e.g. to lower its
    RLIMIT_NOFILE). Raises :class:`RuntimeError` with the process's stderr if it does not announce
    itself within ``timeout_s``."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = _fill(copy.deepcopy(config), folder)
    path = folder / "gateway.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log_path = folder / "gateway.stderr"
    e = dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_ADMIN_TOKEN=ADMIN_TOKEN, **(env or {}))
    with open(log_path, "wb") as errf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "servelab.cli", "gateway", "--config", str(path), *args],
            stdout=subprocess.PIPE,
            stderr=errf,
            env=e,
            preexec_fn=preexec_fn,
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = _LISTEN.search(line)
        if m:
            # the actual ports, so a rewritten config keeps them (a port change needs a restart)
            from urllib.parse import urlparse

            cfg["server"]["port"] = urlparse(m.group(1).decode()).port
            if m.group(2):
                cfg["server"]["admin_port"] = urlparse(m.group(2).decode()).port
            return GatewayProcess(
                proc,
                m.group(1).decode(),
                m.group(2).decode() if m.group(2) else None,
                path,
                Path(cfg["server"]["access_log"]),
                log_path,
                config=cfg,
            )
        if not line and proc.poll() is not None:
            break
    stop_gateway(proc)
    raise RuntimeError(f"gateway did not start: {log_path.read_text(errors='replace')[-3000:]}")


def gateway_view(proc: GatewayProcess, key: str, **extra: Any) -> Any:
    """What API tests read of a started gateway, as attributes: ``url`` (``/v1`` root), ``root``, ``key`` (a
    client key), ``log`` (access-log path), ``db`` (SQLite ledger path), ``proc`` (the
    :class:`GatewayProcess`), and ``extra`` as given."""
    from types import SimpleNamespace

    return SimpleNamespace(
        url=proc.url,
        root=proc.root,
        key=key,
        log=proc.access_log,
        db=Path(proc.config["ledger"]["sqlite_path"]),
        proc=proc,
        **extra,
    )


def ledger_usage(db: Path, rid: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(prompt_tokens, completion_tokens) of the SQLite ledger's row for request ``rid``, waiting up to
    ``timeout_s`` for it (rows are settled in the background after the answer)."""
    import sqlite3

    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as con:
            row = con.execute(
                "SELECT prompt_tokens, completion_tokens FROM servelab_usage WHERE request_id = ?", (rid,)
            ).fetchone()
        if row is not None or time.monotonic() > deadline:
            assert row is not None, f"no ledger row for {rid}"
            return int(row[0]), int(row[1])
        time.sleep(0.05)


def sse_events(
    root: str, path: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float = 10.0
) -> tuple[str, list[tuple[str, Any]]]:
    """POST a streamed request to ``root + path`` (an API whose events are named: Messages, Responses);
    (the request id, every SSE event as (event name, decoded data)) as sent. Asserts 200 and that every
    event is exactly one ``event:`` line and one ``data:`` line."""
    import httpx
    import orjson

    with httpx.stream("POST", root + path, json=body, headers=headers, timeout=timeout_s) as r:
        assert r.status_code == 200, r.read()
        text = r.read().decode()
        rid = r.headers["x-request-id"]
    out = []
    for ev in text.split("\n\n"):
        lines = ev.strip().split("\n")
        if lines != [""]:
            assert lines[0].startswith("event: ") and lines[1].startswith("data: ") and len(lines) == 2, ev
            out.append((lines[0][7:], orjson.loads(lines[1][6:])))
    return rid, out


def stop_gateway(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, SIGKILL after 10 s; always reaps. The processes the gateway started (``--workers N``: its
    workers) must be gone within ``HURRY_S`` + 1 s after it: survivors are killed, then named in an
    AssertionError (a worker that outlives its supervisor is a bug, not something to leave running)."""
    import psutil

    from servelab.gateway.shutdown import HURRY_S

    kids: list[psutil.Process] = []
    if proc.poll() is None:
        with contextlib.suppress(psutil.Error):
            kids = psutil.Process(proc.pid).children(recursive=True)
    stop_process(proc, 10.0)
    _, alive = psutil.wait_procs(kids, timeout=HURRY_S + 1.0)
    if alive:
        names = []
        for p in alive:
            with contextlib.suppress(psutil.Error):
                names.append(f"{p.pid} ({' '.join(p.cmdline()[-3:])})")
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        raise AssertionError(f"gateway processes outlived the gateway by {HURRY_S + 1.0:.0f} s (killed now): {names}")


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Any]:
    """Factory ``gateway(config_dict, *cli_args, env=None) -> GatewayProcess``; each call gets its own
    folder under ``tmp_path``; all processes stop at teardown."""
    started: list[GatewayProcess] = []

    def factory(config: dict[str, Any], *args: str, env: dict[str, str] | None = None) -> GatewayProcess:
        gp = start_gateway(config, tmp_path / f"gw{len(started)}", *args, env=env)
        started.append(gp)
        return gp

    yield factory
    errors = []
    for gp in started:
        try:
            stop_gateway(gp.proc)
        except AssertionError as e:  # stop the others first
            errors.append(e)
    if errors:
        raise errors[0]


def launch_llama(tmp_path_factory: pytest.TempPathFactory, ctx_size: int, parallel: int) -> Iterator[Any]:
    """Yield a started real llama-server (servelab's cached build and model; ``ctx_size`` tokens,
    ``parallel`` slots) and stop it after; skips without a cached build (fails with
    ``SERVELAB_REQUIRE_ENGINE``). For module-scoped fixtures: ``yield from launch_llama(...)``."""
    from servelab.engines.llamacpp import LlamaCppLauncher, find_llama_server

    if find_llama_server() is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("no cached llama-server; SERVELAB_REQUIRE_ENGINE is set")
        pytest.skip("no cached llama-server (run `servelab engine build llamacpp`)")
    eng = LlamaCppLauncher(
        ctx_size=ctx_size, parallel=parallel, log_dir=tmp_path_factory.mktemp("llama"), progress=lambda m: None
    ).start()
    try:
        yield eng
    finally:
        eng.stop()


def prom_query(prom: str, expr: str) -> list[Any]:
    """The result vector of the instant query ``expr`` on the Prometheus at ``prom``."""
    import urllib.parse
    import urllib.request

    import orjson

    with urllib.request.urlopen(prom + "/api/v1/query?" + urllib.parse.urlencode({"query": expr}), timeout=10) as f:
        body = orjson.loads(f.read())
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def prom_alerts(prom: str) -> list[dict[str, Any]]:
    """The alerts Prometheus at ``prom`` holds now (``labels``, ``state``: pending or firing)."""
    import urllib.request

    import orjson

    with urllib.request.urlopen(prom + "/api/v1/alerts", timeout=10) as f:
        return list(orjson.loads(f.read())["data"]["alerts"])


@dataclass
class PromProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_prometheus(folder: Path, targets: list[str], rule_files: tuple[Path, ...] = ()) -> PromProcess:
    """A real Prometheus (Debian package ``prometheus``; skips without it) scraping ``targets`` (host:port)
    every second and evaluating ``rule_files`` every second, its data in ``folder``; ready when it answers."""
    import shutil
    import socket
    import urllib.request

    prom_bin = shutil.which("prometheus")
    if prom_bin is None:
        pytest.skip("no prometheus (apt-get install -y prometheus)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    cfg: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "servelab-gateway", "static_configs": [{"targets": targets}]}],
    }
    if rule_files:
        cfg["rule_files"] = [str(p) for p in rule_files]
    (folder / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    log = folder / "prometheus.log"
    with open(log, "wb") as lf:
        proc = subprocess.Popen(
            [
                prom_bin,
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=lf,
        )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                if r.status == 200:
                    return PromProcess(url, proc, log)
        except OSError:
            time.sleep(0.2)
    stop_process(proc, 5.0)
    pytest.fail("prometheus did not start: " + log.read_text(errors="replace")[-2000:])
