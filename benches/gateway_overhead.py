#!/usr/bin/env python3
"""What a proxy in front of an engine costs: direct vs through ``servelab gateway`` vs through LiteLLM's
proxy, against the same servelab mock engine, each proxy pinned to one core. Run by hand (not a test).

    .venv/bin/python benches/gateway_overhead.py                  # all three, ~3-5 min here
    .venv/bin/python benches/gateway_overhead.py --targets direct,litellm

Set-up (once, ~3 min): LiteLLM in its own venv, never servelab's:
``python3 -m venv ~/.cache/servelab/peers/litellm && ~/.cache/servelab/peers/litellm/bin/pip install
'litellm[proxy]==1.108.7'`` (newer ones fail to resolve here, MACHINE_NOTES 2026-11-30).

Latency part (per number of streams 1, 16, 64, 256): the mock answers with a fixed TTFT and a fixed
delay between tokens (``--ttft-ms``, ``--itl-ms``; ``--output-tokens`` a range), so everything above the
direct run's numbers is what the proxy adds. By default an open loop (``--loop open``): Poisson arrivals
at streams / mean request time, so that many streams are in flight on average with independent phases
(a closed loop on a fixed schedule keeps all streams' chunks in the same millisecond; ``--loop closed``
still measures that worst case). The client is ``servelab bench`` (the same measuring code
as every servelab benchmark: TTFT at the first token-carrying SSE event, inter-chunk gaps from each
event's arrival), run once per target with all concurrency steps. Printed per step and target:
TTFT P50/P99, inter-chunk P99, and for the proxies the added TTFT P50/P99 and added inter-chunk P99
(target minus direct, in ms).

Other APIs (``--apis chat,messages,responses``): the servelab target's latency steps again as Anthropic
Messages and OpenAI Responses requests (``servelab bench --endpoint``, TTFT at each API's first content
event), which the gateway translates to the mock's chat completions; rows ``servelab:messages`` and
``servelab:responses``, their added numbers against the direct chat run (translation included).

Throughput part (``max requests/s on one core``): a second mock with zero delays, ``--rps-concurrency``
streams for ``--rps-duration-s`` seconds; printed: requests/s achieved, and requests per CPU-second of
the proxy's whole process tree (``req/core-s``: the proxy's requests/s per core, robust to the client or
mock being the bottleneck, which the direct row's requests/s shows). The ratio line divides servelab's
req/core-s by LiteLLM's (issue 4's target: >= 5x; added TTFT P99 <= 2 ms at 256 streams).

Placement on this 2-core box: the proxy under test on ``--proxy-cpu`` (1), the mock and the client on
``--client-cpu`` (0), for every target alike. The "direct check" lines say whether the direct baseline
itself kept the mock's schedule at each step (client + mock core not saturated; with ``--itl-ms 20`` at
256 streams it was not: direct TTFT P50 79 ms for a 50 ms mock), so the added numbers are the proxy's.
Both proxies run with their default logging to a file and one worker process. Artefacts (bench run
folders, configs, logs) stay in ``--workdir``. Both CPU options take taskset lists (``2,3``, ``8-11``): on a
machine with a core per gateway worker, give the proxy N cores and the client enough to load them
(``--client-workers K``: ``servelab bench --workers K``; ``--mocks M``: M zero-delay mocks, one CPU each, the
gateway's model split evenly over them), e.g. on 16 cores
``--proxy-cpu 12-13 --client-cpu 0-11 --client-workers 6 --mocks 4 --gateway-workers 1,2 --rounds 6``.

Several gateway workers (``--gateway-workers 1,2``, ``--rounds K``): the ``servelab`` target runs once per
entry, in that order, the whole list K times with every other round reversed (this box is noisy; a drift
then favours no entry). An entry ``N`` is ``servelab gateway --workers N`` with ``state.redis_url`` set to a
redis-server this script starts on the client CPU (also for N = 1, so the configs are the same; with no
limits configured no request touches Redis); ``Ni`` is the control, N separate one-process gateways on one
port that share nothing (:func:`start_independent`). Every process is pinned to ``--proxy-cpu`` (taskset
is inherited), so on one proxy CPU ``req/core-s`` compares the cost per request of N processes sharing a
core with one process. Rows are named ``servelab-w<N>[i][@<MS>ms]`` (``#k`` for the k-th run of the same
entry); closing lines give each run's requests per worker (access logs), each multi-process run's
req/core-s against the 1-worker run of its round (``wN`` also against ``wNi``), and per comparison the
median, range and number of rounds within 10 % (issue 15 item 6). ``--rps-only`` skips the latency part.

Variants of one gateway (``--variants``, ``--rounds K``): the ``servelab`` target runs once per variant, the
list K times with every other round reversed, and the closing lines give each run's req/core-s against the first
variant's in the same round (then the median and range of those paired ratios). A variant is ``NAME`` (this
checkout) or ``NAME=OPT[+OPT]`` with ``src:DIR`` (that ``src/`` as the gateway's PYTHONPATH only: an older commit
checked out with ``git worktree add``, measured by the same client and mock) and ``tracing[:RATIO]`` (the
config's ``tracing`` section exporting over OTLP/HTTP to a receiver this script starts on the client CPU, sample
ratio 1 unless given). ``--gateway-src DIR`` sets the same PYTHONPATH for a plain ``servelab`` run. Examples:
``--targets direct,servelab --rps-only --rounds 6 --variants now,old=src:/tmp/wt-old/src`` (a regression) and
``--variants off,on=tracing`` (what tracing costs).

Processes that share a core pay for it: each switch between them leaves the next one a cold L1/L2 cache, and
the kernel switches two busy processes every slice (EEVDF's default here: 1.4 ms). An entry ``N@MS``
(``--gateway-workers 1,2,1@20,2@20``) makes every thread of that run's gateway request a scheduler slice of
MS ms (:func:`set_slice`; Linux >= 6.12), so the same code runs with fewer switches: the difference between
``2`` and ``2@20`` against their 1-worker runs is what the time-sharing costs, not the workers' shared
state. The ``preempted/core-s`` column counts involuntary context switches of the proxy's processes per
CPU-second of them. A slice is a measuring device, not a setting to deploy: a worker holding the core for
20 ms delays the other worker's streams by as much.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import hashlib
import json
import os
import secrets
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from servelab.engines.mock.launch import MockLauncher
from servelab.engines.spawn import free_port

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
LITELLM = CACHE / "peers" / "litellm" / "bin" / "litellm"
SERVELAB = Path(sys.executable).parent / "servelab"
MODEL = "m"
_SYS_SCHED_SETATTR, _SYS_SCHED_GETATTR = 314, 315  # x86_64 (arch/x86/entry/syscalls/syscall_64.tbl)
SLICE_MIN_MS, SLICE_MAX_MS = 0.1, 100.0


@dataclass
class Proxy:
    """A started proxy: its API root, bearer key, process and log; ``others``: more processes serving the same
    port (``--gateway-workers 2i``: independent gateways), counted and stopped with it."""

    name: str
    base_url: str
    api_key: str | None
    proc: subprocess.Popen[bytes] | None
    log: Path | None
    others: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def processes(self) -> list[psutil.Process]:
        """Every process of the proxy's process trees (none for ``direct``)."""
        out: list[psutil.Process] = []
        for proc in [self.proc, *self.others] if self.proc is not None else []:
            with contextlib.suppress(psutil.Error):
                root = psutil.Process(proc.pid)
                out += [root, *root.children(recursive=True)]
        return out

    def cpu_s(self) -> float:
        """User+system CPU seconds of the proxy's whole process trees so far (0 for ``direct``)."""
        total = 0.0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def switches(self) -> int:
        """Involuntary context switches so far of the proxy's processes (every thread, psutil)."""
        total = 0
        for p in self.processes():
            with contextlib.suppress(psutil.Error):
                total += p.num_ctx_switches().involuntary
        return total

    def stop(self) -> None:
        """SIGTERM each process group of the proxy, SIGKILL after 10 s."""
        for proc in [self.proc, *self.others] if self.proc is not None else []:
            if proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, 15)
                proc.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, 9)


def _wait_ready(
    url: str,
    proc: subprocess.Popen[bytes],
    log: Path,
    timeout_s: float,
    headers: dict[str, str] | None = None,
    line: str | None = None,
) -> None:
    """Until ``url`` answers 200 and, with ``line``, the log holds it (``servelab gateway --workers N``
    prints its ``listening on`` line once every worker is up: /health answers as soon as worker 0 is,
    and the others' start-up CPU must not fall into the measured window)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(
                f"{url}: the proxy exited ({proc.returncode}); log {log}:\n" + log.read_text(errors="replace")[-3000:]
            )
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
                if r.status == 200 and (line is None or line in log.read_text(errors="replace")):
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s; log {log}")


def cpu_list(spec: str) -> list[int]:
    """A taskset-style CPU list (``1``, ``2,3``, ``8-11``) as CPU numbers. Raises ValueError naming the
    problem for anything else, or for a CPU this process may not run on."""
    cpus: list[int] = []
    for part in spec.split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"{spec!r} is not a CPU list like 1, 2,3 or 8-11")
        cpus += range(int(lo), int(hi or lo) + 1)
    allowed = os.sched_getaffinity(0)
    if not cpus or not set(cpus) <= allowed:
        raise ValueError(f"CPU list {spec!r}: this machine lets this process use CPUs {sorted(allowed)}")
    return cpus


def _spawn(argv: list[str], cpus: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``argv`` under ``taskset -c cpus`` (inherited by its children), its own session, output to ``log``."""
    with open(log, "ab") as lf:
        return subprocess.Popen(
            ["taskset", "-c", cpus, *argv],
            stdout=lf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )


def start_litellm(mock_url: str, work: Path, cpu: str) -> Proxy:
    """LiteLLM 1.108.7 proxy on one core: one model ``m`` -> ``openai/m`` at the mock, offline settings
    from MACHINE_NOTES (LITELLM_MASTER_KEY, LITELLM_LOCAL_MODEL_COST_MAP=True)."""
    if not LITELLM.is_file():
        raise SystemExit(f"LiteLLM is not installed at {LITELLM}; see this file's docstring")
    cfg = {
        "model_list": [
            {"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}", "api_base": mock_url, "api_key": "x"}}
        ]
    }
    path = work / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    key = "sk-bench-" + secrets.token_hex(8)
    log = work / "litellm.log"
    proc = _spawn(
        [str(LITELLM), "--config", str(path), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
        cpu,
        log,
        {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    _wait_ready(f"http://127.0.0.1:{port}/health/liveliness", proc, log, 120)
    return Proxy("litellm", f"http://127.0.0.1:{port}/v1", key, proc, log)


def start_redis(work: Path, cpu: str) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server without persistence on a free port, pinned to ``cpu``: (process, URL)."""
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit(
            "--gateway-workers needs redis-server on PATH (scripts/setup.sh installs it: apt-get install -y "
            "redis-server)"
        )
    port = free_port()
    proc = _spawn(
        [exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"], cpu, work / "redis.log"
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, f"redis://127.0.0.1:{port}/0"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"redis-server did not start: {(work / 'redis.log').read_text(errors='replace')[-500:]}")


_RECEIVER = r"""
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
try:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
except ImportError:
    ExportTraceServiceRequest = None
count = {"exports": 0, "bytes": 0, "spans": 0}
class H(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        count["exports"] += 1
        count["bytes"] += len(body)
        if ExportTraceServiceRequest is not None and self.headers.get("Content-Encoding") != "gzip":
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            count["spans"] += sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)
        with open(sys.argv[2], "w") as f:
            json.dump(count, f)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def start_otlp_receiver(work: Path, cpu: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A local OTLP/HTTP traces endpoint on ``cpu`` (the client's) that answers 200 to every export and
    keeps counts (exports, bytes, spans decoded with opentelemetry-proto) in ``otlp-count.json``: (process,
    traces URL, counts file). It stands in for a collector, so ``--variants NAME=tracing`` measures what
    building and exporting the spans costs the gateway, not a collector's own work."""
    port = free_port()
    counts = work / "otlp-count.json"
    proc = _spawn([sys.executable, "-c", _RECEIVER, str(port), str(counts)], cpu, work / "otlp-receiver.log")
    url = f"http://127.0.0.1:{port}/v1/traces"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            import socket

            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return proc, url, counts
        except OSError:
            time.sleep(0.05)
    proc.kill()
    sys.exit(f"the OTLP receiver did not start: {(work / 'otlp-receiver.log').read_text(errors='replace')[-500:]}")


@dataclass(frozen=True)
class Variant:
    """One entry of ``--variants``: a gateway run from ``src`` (PYTHONPATH; None = this checkout) with tracing
    sampled at ``trace_ratio`` to the local OTLP receiver (None = tracing off), in round ``round`` (0-based)."""

    src: str | None
    trace_ratio: float | None
    round: int


def _variant_targets(ap: argparse.ArgumentParser, spec: str | None, rounds: int) -> dict[str, Variant]:
    """``--variants now,old=src:/tmp/wt-old/src`` or ``off,on=tracing`` (``tracing:0.1``: that sample ratio;
    options joined by ``+``) with ``rounds`` -> runs ``servelab-now#1, servelab-old#1``, then the list
    reversed in the next round, and so on (a drift of the machine favours no entry)."""
    if not spec:
        return {}
    if rounds < 1:
        ap.error("--rounds must be >= 1")
    entries: list[tuple[str, Variant]] = []
    for item in spec.split(","):
        name, _, opts = item.strip().partition("=")
        src, ratio = None, None
        for opt in filter(None, opts.split("+")):
            key, _, val = opt.partition(":")
            if key == "src" and val and Path(val.split(":")[-1]).is_dir():
                src = val
            elif key == "tracing":
                try:
                    ratio = float(val) if val else 1.0
                except ValueError:
                    ratio = -1.0
                if not 0 < ratio <= 1:
                    ap.error(f"--variants {item!r}: tracing takes a sample ratio in (0, 1], e.g. tracing:0.1")
            else:
                ap.error(
                    f"--variants {item!r}: give NAME or NAME=OPT[+OPT] with OPT src:DIR (an existing src/ "
                    "folder) or tracing[:RATIO], e.g. now,old=src:/tmp/wt-old/src or off,on=tracing"
                )
        if not name.isidentifier():
            ap.error(f"--variants {item!r}: a name is letters, digits and _ (e.g. now, old, traced)")
        entries.append((name, Variant(src, ratio, 0)))
    if len({n for n, _ in entries}) != len(entries):
        ap.error(f"--variants {spec!r}: every name once")
    out: dict[str, Variant] = {}
    for r in range(rounds):
        for name, v in entries if r % 2 == 0 else entries[::-1]:
            out[f"servelab-{name}" + (f"#{r + 1}" if rounds > 1 else "")] = Variant(v.src, v.trace_ratio, r)
    return out


def _print_variant_ratio(variants: dict[str, Variant], rps: dict[str, tuple[float, float]], first: str) -> None:
    """Per round, each variant's req/core-s against the first variant's of the same round (runs of one round
    ran within a minute; no figure is averaged over runs that did not run together), then per variant the
    median and range of those paired ratios."""
    if len({t.split("#")[0] for t in variants}) < 2:
        return
    groups: dict[str, list[float]] = {}
    print(f"\nreq/core-s against servelab-{first} of the same round:")
    for rnd in sorted({v.round for v in variants.values()}):
        runs = {t.split("#")[0]: t for t, v in variants.items() if v.round == rnd and t in rps}
        base = runs.get(f"servelab-{first}")
        if base is None:
            continue
        parts = []
        for name, t in runs.items():
            if t == base:
                continue
            r = rps[t][1] / rps[base][1]
            groups.setdefault(name, []).append(r)
            parts.append(f"{name} {rps[t][1]:.1f} / {rps[base][1]:.1f} = {r:.3f}")
        print(f"  round {rnd + 1}: " + "; ".join(parts))
    for name, rs in groups.items():
        print(
            f"{name} / servelab-{first}: median {statistics.median(rs):.3f} over {len(rs)} paired round(s), "
            f"range {min(rs):.3f}-{max(rs):.3f}"
        )


def _gateway_config(urls: list[str], work: Path, tag: str, port: int, secret: str) -> dict[str, Any]:
    """The benchmark's gateway config: one backend per mock URL, the public model split evenly over them, one
    key (``secret``), no limits, SQLite ledger and JSON access log named after ``tag`` in ``work``."""
    return {
        "server": {
            "host": "127.0.0.1",
            "port": port,
            "admin_port": None,
            "max_tokens_limit": 4096,
            "access_log": str(work / f"gateway-{tag}-access.log"),
        },
        "ledger": {"sqlite_path": str(work / f"gateway-{tag}-usage.db")},
        "backends": [
            {"name": f"mock{i}", "kind": "mock", "base_url": u.removesuffix("/v1"), "models": [MODEL]}
            for i, u in enumerate(urls)
        ],
        "models": {MODEL: {"targets": [{"backend": f"mock{i}", "model": MODEL} for i in range(len(urls))]}},
        "tenants": {"bench": {"allowed_models": ["*"]}},
        "keys": [{"id": "bench", "tenant": "bench", "sha256": hashlib.sha256(secret.encode()).hexdigest()}],
    }


def _gateway_env(src: str | None) -> dict[str, str] | None:
    """The environment additions of a gateway process: ``PYTHONPATH`` = ``src`` (``--gateway-src``: another
    checkout's ``src/`` folder, so the same client and mock measure an older gateway), else nothing."""
    return {"PYTHONPATH": src} if src else None


def start_servelab(
    mock_url: str | list[str],
    work: Path,
    cpu: str,
    tag: str,
    workers: int = 0,
    redis_url: str | None = None,
    src: str | None = None,
    tracing: tuple[str, float] | None = None,
) -> Proxy:
    """``servelab gateway`` on CPUs ``cpu``: one backend per mock URL (the public model ``m`` split evenly
    over them), one key, no limits, SQLite ledger and JSON access log in ``work`` (its defaults).
    ``workers`` > 0: ``--workers N`` with ``state.redis_url`` = ``redis_url`` (0: the plain command, no Redis).
    ``src``: the gateway's PYTHONPATH (:func:`_gateway_env`); ``tracing``: (OTLP/HTTP traces URL, sample ratio)
    sets the config's ``tracing`` section (None: tracing off, the default)."""
    urls = [mock_url] if isinstance(mock_url, str) else mock_url
    secret = secrets.token_hex(32)  # the gateway requires 64 hex characters
    port = free_port()
    cfg = _gateway_config(urls, work, tag, port, secret)
    if workers:
        cfg["state"] = {"redis_url": redis_url}
    if tracing is not None:
        cfg["tracing"] = {"endpoint": tracing[0], "sample_ratio": tracing[1]}
    path = work / f"gateway-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = work / f"gateway-{tag}.log"
    proc = _spawn(
        [str(SERVELAB), "gateway", "--config", str(path), *(["--workers", str(workers)] if workers else [])],
        cpu,
        log,
        _gateway_env(src),
    )
    # the command's own line, printed once every worker is up (each worker's log line "servelab.gateway: gateway
    # listening on ..." also says "listening on": waiting for that let the bench open its keep-alive
    # connections while worker 1 was still starting, and worker 0 then served every request of the run)
    _wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 60, line="servelab gateway listening on")
    return Proxy("servelab", f"http://127.0.0.1:{port}/v1", f"sk-sl-bench-{secret}", proc, log)


def start_independent(urls: list[str], work: Path, cpu: str, tag: str, n: int) -> Proxy:
    """``n`` separate one-process gateways on one port (the control of ``--gateway-workers Ni``): each is
    ``servelab gateway --worker-index i --no-admin`` (the flag a supervisor gives its workers: the API port
    bound with SO_REUSEPORT) started by this script, with its own config, ledger and access log and no
    ``state.redis_url``, so they share nothing but the port and the core."""
    port = free_port()
    procs: list[subprocess.Popen[bytes]] = []
    secret = secrets.token_hex(32)
    for i in range(n):
        cfg = _gateway_config(urls, work, f"{tag}-{i}", port, secret)
        path = work / f"gateway-{tag}-{i}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        log = work / f"gateway-{tag}-{i}.log"
        proc = _spawn(
            [str(SERVELAB), "gateway", "--config", str(path), "--worker-index", str(i), "--no-admin"], cpu, log
        )
        procs.append(proc)
        _wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 60, line="servelab gateway listening on")
    return Proxy(
        "servelab",
        f"http://127.0.0.1:{port}/v1",
        f"sk-sl-bench-{secret}",
        procs[0],
        work / f"gateway-{tag}-0.log",
        procs[1:],
    )


def run_bench(
    p: Proxy,
    out: Path,
    cpu: str,
    concurrency: list[int] | None,
    requests: int | None,
    duration_s: float | None,
    warmup: int,
    output_tokens: str,
    rate_rps: float | None = None,
    workers: int = 1,
    endpoint: str = "chat",
) -> dict[str, Any]:
    """Run ``servelab bench`` (pinned to the CPU list ``cpu``, ``--workers`` ``workers``) against ``p`` and
    return its summary.json: closed loop at ``concurrency``, or open loop (Poisson arrivals) at ``rate_rps``.
    ``endpoint``: the API the bench speaks (``--endpoint``: chat, messages, responses; TTFT at each API's first
    content event, servelab.wire.apis)."""
    # open loop: the same rate twice, the first step warms every connection (the bench's own warmup runs as a
    # closed loop of 1 in open mode: minutes at 0.8 s a request); the caller keeps the last step
    load = (
        ["--rate", f"{rate_rps:g},{rate_rps:g}", "--arrival", "poisson"]
        if rate_rps
        else ["--concurrency", ",".join(map(str, concurrency or []))]
    )
    argv = [
        "taskset",
        "-c",
        cpu,
        str(SERVELAB),
        "bench",
        "--url",
        p.base_url,
        "--model",
        MODEL,
        "--workload",
        "short-qa",
        "--set",
        "input_tokens=32",
        "--set",
        f"output_tokens={output_tokens}",
        *load,
        "--warmup",
        str(0 if rate_rps else warmup),
        "--no-stop-on-slo",
        "--timeout",
        "120",
        "--quiet",
        "--out",
        str(out),
        *(["--workers", str(workers)] if workers > 1 else []),
        *(["--endpoint", endpoint] if endpoint != "chat" else []),
    ]
    argv += ["--requests", str(requests)] if requests else ["--duration", str(duration_s)]
    env = {**os.environ, "OPENAI_API_KEY": p.api_key or ""}
    r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        raise SystemExit(f"servelab bench against {p.name} failed ({r.returncode}):\n{r.stdout[-3000:]}")
    return json.loads((out / "summary.json").read_text())


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.2f}"


def _steps(summary: dict[str, Any], key: int | None = None) -> dict[int, dict[str, Any]]:
    """Steps by concurrency (``key`` for a one-step open-loop run)."""
    return {
        key if key is not None else int(s["load"]["concurrency"]): s for s in summary["steps"] if not s.get("skipped")
    }  # with ``key``: the last step wins (the first one was the warm-up)


@dataclass(frozen=True)
class GatewayRun:
    """One run of the ``servelab`` target under ``--gateway-workers``: ``--workers`` count, the scheduler slice
    every gateway thread requests (ms; None = the kernel's default), the round it belongs to (0-based), and
    ``independent``: N separate one-process gateways on the same port instead of ``--workers N`` (the control
    that shares nothing: no supervisor, no Redis, no multiprocess metrics, own ledger and access log each)."""

    workers: int
    slice_ms: float | None
    round: int
    independent: bool = False


def _worker_targets(ap: argparse.ArgumentParser, spec: str | None, rounds: int = 1) -> dict[str, GatewayRun]:
    """``--gateway-workers 1,2,2@20`` with ``rounds`` = 2 -> runs in order ``servelab-w1#1, servelab-w2#1,
    servelab-w2@20ms#1`` (round 0), then the same list reversed (round 1: ``servelab-w2@20ms#2, ...``), so a
    drift of the machine during the rounds does not favour one entry. Labels carry ``#k`` (the k-th run of
    the same entry) when an entry runs more than once."""
    if not spec:
        return {}
    if rounds < 1:
        ap.error("--rounds must be >= 1")
    entries: list[tuple[int, bool, float | None]] = []
    for item in spec.split(","):
        n_s, _, slice_s = item.strip().partition("@")
        independent = n_s.endswith("i")
        try:
            n, slice_ms = int(n_s.removesuffix("i")), (float(slice_s) if slice_s else None)
        except ValueError:
            ap.error(
                f"--gateway-workers {spec!r}: give worker counts like 1,2,1,2 (2i: two independent "
                "gateways), each optionally with a scheduler slice in ms (2@20)"
            )
        if n < 1 or (independent and n < 2):
            ap.error("--gateway-workers: every count must be >= 1 (Ni: >= 2)")
        if slice_ms is not None and not SLICE_MIN_MS <= slice_ms <= SLICE_MAX_MS:
            ap.error(f"--gateway-workers {item!r}: the kernel takes slices of {SLICE_MIN_MS:g}-{SLICE_MAX_MS:g} ms")
        entries.append((n, independent, slice_ms))
    order = [(r, e) for r in range(rounds) for e in (entries if r % 2 == 0 else entries[::-1])]
    total = {e: sum(1 for _, x in order if x == e) for e in entries}
    out: dict[str, GatewayRun] = {}
    seen: dict[tuple[int, bool, float | None], int] = {}
    for r, e in order:
        seen[e] = seen.get(e, 0) + 1
        name = f"servelab-w{e[0]}" + ("i" if e[1] else "") + (f"@{e[2]:g}ms" if e[2] is not None else "")
        out[name + (f"#{seen[e]}" if total[e] > 1 else "")] = GatewayRun(e[0], e[2], r, e[1])
    return out


def set_slice(proxy: Proxy, slice_ms: float) -> float:
    """Ask for a scheduler slice of ``slice_ms`` for every thread of ``proxy``'s processes: Linux >= 6.12
    EEVDF takes a SCHED_OTHER task's ``sched_runtime`` (sched_setattr(2)) as its requested slice, clamped to
    0.1-100 ms (Peter Zijlstra's patch "sched/eevdf: Use sched_attr::sched_runtime to set request/slice
    suggestion", 2023-05-22, in mainline since 6.12; read 2026-12-02; on this machine's 6.18 kernel the default
    reads back 1.4 ms and a set slice reads back as set). A longer slice means fewer
    switches between processes that share a core, each of which leaves the next one a cold L1/L2 cache.
    Returns the slice read back from the main thread (ms). Raises SystemExit naming the problem when the
    kernel refuses."""
    libc = ctypes.CDLL(None, use_errno=True)
    ns = int(slice_ms * 1e6)
    # struct sched_attr (56 bytes): size, policy, flags, nice, priority, runtime, deadline, period, util_min/max
    attr = ctypes.create_string_buffer(struct.pack("IIQiIQQQII", 56, 0, 0, 0, 0, ns, 0, 0, 0, 0), 56)
    tids = []
    for p in proxy.processes():
        with contextlib.suppress(OSError):
            tids += [int(t) for t in os.listdir(f"/proc/{p.pid}/task")]
    for tid in tids:
        if libc.syscall(_SYS_SCHED_SETATTR, tid, attr, 0) != 0:
            err = ctypes.get_errno()
            if err == errno.ESRCH:  # a thread that ended meanwhile
                continue
            raise SystemExit(
                f"sched_setattr(slice {slice_ms:g} ms) failed: {os.strerror(err)}; a custom slice "
                "needs Linux >= 6.12 on x86_64 (drop the @MS of --gateway-workers)"
            )
    back = ctypes.create_string_buffer(56)
    if proxy.proc is None or libc.syscall(_SYS_SCHED_GETATTR, proxy.proc.pid, back, 56, 0) != 0:
        return float("nan")
    return struct.unpack("IIQiIQQQII", back.raw)[5] / 1e6


def _worker_split(work: Path, tag: str) -> dict[int, int]:
    """Requests per gateway worker, from the access logs' ``worker`` field (warmup included): the run's one
    log, or each independent gateway's own (``<tag>-<i>-access.log``)."""
    out: dict[int, int] = {}
    for access_log in [work / f"{tag}-access.log", *sorted(work.glob(f"{tag}-[0-9]*-access.log"))]:
        with contextlib.suppress(OSError), open(access_log, "rb") as f:
            for line in f:
                w = json.loads(line).get("worker")
                out[w] = out.get(w, 0) + 1
    return out


def _print_worker_ratio(
    gw_workers: dict[str, GatewayRun], rps: dict[str, tuple[float, float]], split: dict[str, dict[int, int]]
) -> None:
    """Each run's requests per worker; each multi-worker run's req/core-s against the 1-worker run of the same
    round (with the same slice when the list has one, else the default slice; runs of one round ran minutes
    apart at most, and no figure is a mean over runs that did not run together); per entry over the rounds,
    the median, range and count of those paired ratios within 10 %; and ``wN / wNi`` per round, what the
    workers' shared state costs over N processes that share nothing."""
    if not gw_workers:
        return
    print(
        "\nrequests per gateway worker (access log): "
        + "; ".join(
            f"{t} " + " / ".join(f"w{w}: {n}" for w, n in sorted(split.get(t, {}).items(), key=lambda x: str(x[0])))
            for t in gw_workers
            if t in rps
        )
    )
    by_round = {(g.round, g.workers, g.independent, g.slice_ms): t for t, g in gw_workers.items() if t in rps}
    groups: dict[str, list[float]] = {}
    pairs = []
    for t, g in gw_workers.items():
        if g.workers == 1 or t not in rps:
            continue
        name = f"w{g.workers}" + ("i" if g.independent else "") + (f"@{g.slice_ms:g}ms" if g.slice_ms else "")
        bases = [("w1", by_round.get((g.round, 1, False, g.slice_ms)) or by_round.get((g.round, 1, False, None)))]
        if not g.independent:
            bases.append((f"w{g.workers}i", by_round.get((g.round, g.workers, True, g.slice_ms))))
        for base_name, b in bases:
            if b is None:
                continue
            r = rps[t][1] / rps[b][1]
            groups.setdefault(f"{name} / {base_name}", []).append(r)
            pairs.append(f"{t} / {b}: {rps[t][1]:.1f} / {rps[b][1]:.1f} = {r:.3f}")
    if not pairs:
        return
    print("req/core-s, each multi-worker run against the runs of its round it compares with: " + "; ".join(pairs))
    for key, rs in groups.items():
        within = sum(1 for r in rs if r >= 0.9)
        print(
            f"{key}: median {statistics.median(rs):.3f} over {len(rs)} paired round(s), range "
            f"{min(rs):.3f}-{max(rs):.3f}, {within} of {len(rs)} at >= 0.900 (within 10 %)"
        )


def _print_latency(
    a: argparse.Namespace, lat: dict[str, dict[int, dict[str, Any]]], conc: list[int], targets: list[str], mean_s: float
) -> None:
    """The latency table (target minus direct) and the direct check (is the client + mock core queueing?)."""
    loop = f"open loop, Poisson arrivals at streams / {mean_s:.2f} s" if a.loop == "open" else "closed loop"
    print(f"\nLatency (ms; {loop}; mock TTFT {a.ttft_ms:g} ms, ITL {a.itl_ms:g} ms, {a.output_tokens} tokens)")
    w = max(9, *(len(t) for t in targets))  # "servelab:messages": the servelab target spoken in another API
    hdr = (
        f"{'streams':>7} {'target':<{w}} {'n':>5} {'fail':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'chunk p99':>9} "
        f"{'+TTFT p50':>9} {'+TTFT p99':>9} {'+chunk p99':>10}"
    )
    print(hdr)
    for c in conc:
        d = lat["direct"].get(c)
        for t in targets:
            s = lat.get(t, {}).get(c)
            if s is None:
                continue
            tt, ch = s["ttft_s"], s["itl_chunk_s"]
            add = ["", "", ""]
            if t != "direct" and d is not None:
                add = [
                    _ms(tt["p50"] - d["ttft_s"]["p50"]),
                    _ms(tt["p99"] - d["ttft_s"]["p99"]),
                    _ms(ch["p99"] - d["itl_chunk_s"]["p99"]),
                ]
            failed = s["counts"]["submitted"] - s["counts"]["succeeded"]
            print(
                f"{c:>7} {t:<{w}} {s['counts']['submitted']:>5} {failed:>4} {_ms(tt['p50']):>9} {_ms(tt['p99']):>9} "
                f"{_ms(ch['p99']):>9} {add[0]:>9} {add[1]:>9} {add[2]:>10}"
            )
    # is the direct baseline itself queueing on the client + mock core? Then "added" numbers mean little
    print(
        f"\nDirect check (client + mock on CPU {a.client_cpu}): the direct run must show the mock's own "
        f"schedule (TTFT {a.ttft_ms:g} ms, chunk gap {a.itl_ms:g} ms)"
    )
    for c in conc:
        d = lat.get("direct", {}).get(c)
        if d is None:
            continue
        extra_ttft_ms = (d["ttft_s"]["p50"] - a.ttft_ms / 1e3) * 1e3
        extra_chunk_ms = (d["itl_chunk_s"]["p99"] - a.itl_ms / 1e3) * 1e3
        saturated = extra_ttft_ms > max(2.0, 0.05 * a.ttft_ms) or extra_chunk_ms > max(5.0, 0.1 * a.itl_ms)
        print(
            f"{c:>7} streams: TTFT p50 +{extra_ttft_ms:.2f} ms, chunk p99 +{extra_chunk_ms:.2f} ms over the "
            f"schedule; CPU {a.client_cpu} busy {d['cpu_busy_pct']['client']:.0f} % -> "
            + (
                "SATURATED: the client + mock core queues, added numbers at this step are not the proxy's "
                "alone; raise --itl-ms or lower the streams"
                if saturated
                else "not saturated"
            )
        )


def _apis(ap: argparse.ArgumentParser, spec: str) -> list[str]:
    """``--apis``: chat first, then messages and/or responses; a bad list is one argparse error line."""
    apis = [x.strip() for x in spec.split(",") if x.strip()]
    if set(apis) - {"chat", "messages", "responses"} or "chat" not in apis:
        ap.error("--apis takes chat, messages, responses (chat always included), e.g. --apis chat,messages")
    return ["chat", *[x for x in dict.fromkeys(apis) if x != "chat"]]


def _latency(
    p: Proxy,
    label: str,
    api: str,
    a: argparse.Namespace,
    work: Path,
    conc: list[int],
    mean_s: float,
    client_cpus: list[int],
    proxy_cpus: list[int],
) -> dict[int, dict[str, Any]]:
    """The latency part against ``p`` spoken in ``api``: one step per concurrency, each its own bench run so
    request counts can differ (open loop: the rate that keeps that many streams in flight); each step with the
    busiest client and proxy CPU's share."""
    out: dict[int, dict[str, Any]] = {}
    for c in conc:
        n = max(a.min_requests, a.requests_per_stream * c)
        psutil.cpu_percent(percpu=True)  # starts the per-CPU busy-share interval
        rate = c / mean_s if a.loop == "open" else None
        s = run_bench(
            p,
            work / f"{label.replace(':', '-')}-c{c}",
            a.client_cpu,
            [c],
            n,
            None,
            warmup=c,
            output_tokens=a.output_tokens,
            rate_rps=rate,  # every connection warm
            workers=a.client_workers,
            endpoint=api,
        )
        busy = psutil.cpu_percent(percpu=True)
        out.update(_steps(s, c))
        out[c]["cpu_busy_pct"] = {
            "client": max(busy[i] for i in client_cpus),
            "proxy": max(busy[i] for i in proxy_cpus),
        }
    return out


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="direct,servelab,litellm", help="comma list: direct,servelab,litellm")
    ap.add_argument("--concurrency", default="1,16,64,256", help="concurrent streams per step")
    ap.add_argument(
        "--requests-per-stream",
        type=int,
        default=4,
        help="measured requests per step = this x streams (at least --min-requests)",
    )
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="mock time to first token, ms")
    ap.add_argument(
        "--itl-ms",
        type=float,
        default=50.0,
        help="mock delay between tokens, ms (50: 256 streams "
        "= ~5k chunks/s, which the client + mock core carries without queueing; see the direct check)",
    )
    ap.add_argument(
        "--output-tokens",
        default="8-24",
        help="tokens per answer (one per chunk): N, or LO-HI drawn "
        "uniformly per request, so closed-loop streams do not stay in lockstep (equal lengths make all "
        "streams of a step arrive in the same millisecond, every round)",
    )
    ap.add_argument(
        "--loop",
        choices=("open", "closed"),
        default="open",
        help="latency part: open = Poisson arrivals at streams / mean request time (streams in flight "
        "on average, independent phases); closed = that many workers. A closed loop on a fixed "
        "TTFT/ITL schedule keeps every stream's chunks in the same millisecond forever (durations "
        "are multiples of the ITL), which measures burst queueing, not per-chunk cost",
    )
    ap.add_argument("--rps-concurrency", type=int, default=64, help="streams in the throughput run")
    ap.add_argument("--rps-duration-s", type=float, default=10.0, help="seconds of the throughput run")
    ap.add_argument(
        "--proxy-cpu",
        default="1",
        help="CPU list of the proxy (taskset -c syntax: 1, 2,3, 8-11); a gateway's workers share it",
    )
    ap.add_argument("--client-cpu", default="0", help="CPU list of the client, the mocks and Redis")
    ap.add_argument(
        "--client-workers",
        type=int,
        default=1,
        help="servelab bench --workers of the client (a "
        "machine with a core per gateway worker needs more than one client core to load them)",
    )
    ap.add_argument(
        "--mocks",
        type=int,
        default=1,
        help="zero-delay mock processes of the throughput part, each "
        "on one CPU of --client-cpu in turn; the gateway splits requests evenly over them",
    )
    ap.add_argument("--workdir", default=None, help="artefacts folder (default: a new temp dir)")
    ap.add_argument(
        "--apis",
        default="chat",
        help="comma list of the APIs the servelab target is measured in "
        "(chat, messages, responses): each extra one is the same latency steps sent as Anthropic "
        "Messages or OpenAI Responses, translated by the gateway to the mock's chat completions; its "
        "added TTFT is against the direct chat run, so it includes the translation",
    )
    ap.add_argument(
        "--gateway-workers",
        default=None,
        help="comma list of worker counts for the servelab target, "
        "run in this order (e.g. 1,2,1,2), each with Redis (module doc); default: one plain run",
    )
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the --gateway-workers list this many times, every "
        "other round in reverse order; ratios pair runs of the same round",
    )
    ap.add_argument("--rps-only", action="store_true", help="only the throughput part")
    ap.add_argument(
        "--gateway-src",
        default=None,
        help="PYTHONPATH of the servelab gateway process only (another "
        "checkout's src/, e.g. a git worktree of an older commit): the same client and mock measure it",
    )
    ap.add_argument(
        "--variants",
        default=None,
        help="comma list of gateway variants NAME[=OPT[+OPT]], OPT "
        "src:DIR (that src/ as the gateway's PYTHONPATH) or tracing[:RATIO] (OTLP export to a local "
        "receiver): e.g. now,old=src:/tmp/wt-old/src or off,on=tracing; run --rounds times, "
        "alternating, with each round's ratio to the first",
    )
    return ap


def _start_proxy(
    t: str,
    phase: str,
    urls: list[str],
    a: argparse.Namespace,
    work: Path,
    gw_workers: dict[str, GatewayRun],
    redis_url: str | None,
    variants: dict[str, Variant] | None = None,
    otlp_url: str | None = None,
) -> Proxy:
    """The proxy of target ``t`` for ``phase`` in front of the mock(s) at ``urls`` (``direct``: the first mock)."""
    if variants and t in variants:
        v = variants[t]
        tracing = (otlp_url, v.trace_ratio) if v.trace_ratio is not None and otlp_url else None
        p = start_servelab(urls, work, a.proxy_cpu, f"{phase}-{t}", src=v.src or a.gateway_src, tracing=tracing)
        p.name = t
        return p
    if t == "direct":
        return Proxy("direct", urls[0], None, None, None)
    if t == "litellm":
        return start_litellm(urls[0], work, a.proxy_cpu)
    if t not in gw_workers:
        return start_servelab(urls, work, a.proxy_cpu, phase, src=a.gateway_src)
    g = gw_workers[t]
    p = (
        start_independent(urls, work, a.proxy_cpu, f"{phase}-{t}", g.workers)
        if g.independent
        else start_servelab(urls, work, a.proxy_cpu, f"{phase}-{t}", g.workers, redis_url)
    )
    p.name = t
    if g.slice_ms is not None:
        print(f"[{t}] scheduler slice {set_slice(p, g.slice_ms):g} ms (read back)", flush=True)
    return p


def _throughput(p: Proxy, t: str, a: argparse.Namespace, work: Path) -> tuple[float, float, float]:
    """One throughput run through ``p``: (requests/s, requests per CPU-second of the proxy, involuntary
    context switches of the proxy per CPU-second of it). The proxy's CPU covers warmup + measured requests,
    so both are counted."""
    cpu0, sw0 = p.cpu_s(), p.switches()
    s = run_bench(
        p,
        work / f"{t}-rps",
        a.client_cpu,
        [a.rps_concurrency],
        None,
        a.rps_duration_s,
        warmup=a.rps_concurrency,
        output_tokens=a.output_tokens,
        workers=a.client_workers,
    )
    cpu = p.cpu_s() - cpu0
    switched = (p.switches() - sw0) / cpu if cpu > 0 else 0.0
    step = _steps(s)[a.rps_concurrency]
    lines = (work / f"{t}-rps" / "requests.jsonl").read_bytes().splitlines()
    served = sum(1 for ln in lines if json.loads(ln)["failure"] is None)
    return step["throughput"]["requests_per_s"] or 0.0, served / cpu if cpu > 0 else float("nan"), switched


def _targets(
    ap: argparse.ArgumentParser, a: argparse.Namespace
) -> tuple[list[str], dict[str, GatewayRun], dict[str, Variant]]:
    """The runs in order (``direct`` first; ``servelab`` replaced by the ``--gateway-workers`` or ``--variants``
    runs), the worker runs and the variant runs by label."""
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    if targets[0] != "direct":
        targets = ["direct", *[t for t in targets if t != "direct"]]
    bad = set(targets) - {"direct", "servelab", "litellm"}
    if bad:
        ap.error(f"unknown target(s) {', '.join(sorted(bad))}; choose from direct, servelab, litellm")
    gw_workers = _worker_targets(ap, a.gateway_workers, a.rounds)  # label servelab-w<N>[@<S>ms][#k] -> its run
    variants = _variant_targets(ap, a.variants, a.rounds)  # label servelab-<name>[#k] -> its run
    if variants and gw_workers:
        ap.error("--variants and --gateway-workers are separate experiments: give one of them")
    if gw_workers or variants:
        i = targets.index("servelab") if "servelab" in targets else len(targets)
        targets = [*targets[:i], *(gw_workers or variants), *targets[i + 1 :]]
    return targets, gw_workers, variants


def main() -> None:
    ap = _parser()
    a = ap.parse_args()
    targets, gw_workers, variants = _targets(ap, a)
    try:
        proxy_cpus, client_cpus = cpu_list(a.proxy_cpu), cpu_list(a.client_cpu)
    except ValueError as e:
        ap.error(str(e))
    if a.client_workers < 1 or a.mocks < 1:
        ap.error("--client-workers and --mocks must be >= 1")
    conc = [int(x) for x in a.concurrency.split(",")]
    apis = _apis(ap, a.apis)
    out_lo, out_hi = (int(x) for x in (str(a.output_tokens).split("-") * 2)[:2])
    # the mock's cap is out_hi; each request's max_tokens picks its length. Mean request duration -> the
    # open-loop rate that keeps `c` streams in flight on average (Little's law: L = lambda * W)
    mean_s = (a.ttft_ms + ((out_lo + out_hi) / 2 - 1) * a.itl_ms) / 1e3
    work = Path(a.workdir or tempfile.mkdtemp(prefix="gateway-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"workdir {work}; mock ttft {a.ttft_ms} ms, itl {a.itl_ms} ms, {a.output_tokens} tokens; "
        f"proxy on CPU {a.proxy_cpu}, mock + client on CPU {a.client_cpu}",
        flush=True,
    )
    lat_mock = MockLauncher(
        {"ttft_ms": a.ttft_ms, "itl_ms": a.itl_ms, "output_tokens": out_hi, "model": MODEL}, log_dir=work
    ).start()
    os.sched_setaffinity(lat_mock.process.pid, set(client_cpus))
    rps_mocks = [MockLauncher({"output_tokens": out_hi, "model": MODEL}, log_dir=work).start() for _ in range(a.mocks)]
    for i, eng in enumerate(rps_mocks):
        os.sched_setaffinity(eng.process.pid, {client_cpus[i % len(client_cpus)]})
    rps_mock = rps_mocks[0]
    redis_proc, redis_url = start_redis(work, a.client_cpu) if gw_workers else (None, None)
    otlp = start_otlp_receiver(work, a.client_cpu) if any(v.trace_ratio for v in variants.values()) else None
    lat: dict[str, dict[int, dict[str, Any]]] = {}
    rps: dict[str, tuple[float, float]] = {}
    split: dict[str, dict[int, int]] = {}
    switches: dict[str, float] = {}  # involuntary context switches of the proxy per CPU-second of it
    try:
        for t in targets:
            phases = (("rps", rps_mock),) if a.rps_only else (("latency", lat_mock), ("rps", rps_mock))
            for phase, mock in phases:
                urls = [m.base_url for m in rps_mocks] if mock is rps_mock else [mock.base_url]
                p = _start_proxy(t, phase, urls, a, work, gw_workers, redis_url, variants, otlp[1] if otlp else None)
                try:
                    print(f"[{t}] {phase} ...", flush=True)
                    if phase == "latency":
                        for api in apis if t == "servelab" else apis[:1]:  # chat, then the same steps in another API
                            label = t if api == "chat" else f"{t}:{api}"
                            lat[label] = _latency(p, label, api, a, work, conc, mean_s, client_cpus, proxy_cpus)
                    else:
                        req_s, per_core_s, switches[t] = _throughput(p, t, a, work)
                        rps[t] = (req_s, per_core_s)
                        if t in gw_workers:
                            split[t] = _worker_split(work, f"gateway-{phase}-{t}")
                finally:
                    p.stop()
    finally:
        lat_mock.stop()
        for m in rps_mocks:
            m.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        if otlp is not None:
            otlp[0].terminate()
            otlp[0].wait(10)

    if lat:
        shown = [x for t in targets for x in (t, *(f"{t}:{api}" for api in apis[1:] if t == "servelab"))]
        _print_latency(a, lat, conc, shown, mean_s)
    print(
        f"\nThroughput ({a.rps_concurrency} streams, {a.rps_duration_s:g} s, zero-delay mock, "
        f"{a.output_tokens} tokens; proxy alone on CPU {a.proxy_cpu})"
    )
    width = max(9, *(len(t) for t in targets))
    print(f"{'target':<{width}} {'req/s':>8} {'req/core-s':>11} {'preempted/core-s':>17}")
    for t in targets:
        if t in rps:
            r, per_core = rps[t]
            direct = t == "direct"
            print(
                f"{t:<{width}} {r:>8.1f} {'' if direct else f'{per_core:.1f}':>11} "
                f"{'' if direct else f'{switches.get(t, 0.0):.0f}':>17}"
            )
    _print_worker_ratio(gw_workers, rps, split)
    if variants:
        _print_variant_ratio(variants, rps, a.variants.split(",")[0].partition("=")[0].strip())
        if otlp is not None and otlp[2].is_file():
            print(f"OTLP receiver (every traced run together): {otlp[2].read_text()}")
    if "servelab" in rps and "litellm" in rps:
        print(
            f"\nservelab / LiteLLM: req/s {rps['servelab'][0] / rps['litellm'][0]:.1f}x, "
            f"req per proxy core-second {rps['servelab'][1] / rps['litellm'][1]:.1f}x (target >= 5x)"
        )
    top = max(conc)
    if "servelab" in lat and top in lat["servelab"]:
        added = (lat["servelab"][top]["ttft_s"]["p99"] - lat["direct"][top]["ttft_s"]["p99"]) * 1e3
        print(f"servelab added TTFT P99 at {top} streams: {added:.2f} ms (target <= 2 ms)")
    print(f"artefacts: {work}")


if __name__ == "__main__":
    main()
