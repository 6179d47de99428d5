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
folders, configs, logs) stay in ``--workdir``.

Several gateway workers (``--gateway-workers 1,2,1,2``): the ``servelab`` target runs once per entry, in
that order (alternate them: this box is noisy), each as ``servelab gateway --workers N`` with
``state.redis_url`` set to a redis-server this script starts on the client CPU (also for N = 1, so
the configs are the same; with no limits configured no request touches Redis). Every worker is pinned
to ``--proxy-cpu`` with the supervisor (taskset is inherited), so ``req/core-s`` compares the cost per
request of N processes sharing a core with one process; rows are named ``servelab-w<N>`` (``#k`` for the
k-th run of the same N); closing lines give each run's requests per worker (access log) and each
multi-worker run's req/core-s against the 1-worker run just before it (issue 15 item 6: within 10 %).
``--rps-only`` skips the latency part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from servelab.engines.base import free_port
from servelab.engines.mocklaunch import MockLauncher

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
LITELLM = CACHE / "peers" / "litellm" / "bin" / "litellm"
SERVELAB = Path(sys.executable).parent / "servelab"
MODEL = "m"


@dataclass
class Proxy:
    """A started proxy: its API root, bearer key, process and log."""

    name: str
    base_url: str
    api_key: str | None
    proc: subprocess.Popen[bytes] | None
    log: Path | None

    def cpu_s(self) -> float:
        """User+system CPU seconds of the proxy's whole process tree so far (0 for ``direct``)."""
        if self.proc is None:
            return 0.0
        try:
            root = psutil.Process(self.proc.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0.0
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    def stop(self) -> None:
        """SIGTERM the proxy's process group, SIGKILL after 10 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, 15)
            self.proc.wait(10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, 9)
            except ProcessLookupError:
                pass


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float,
                headers: dict[str, str] | None = None, line: str | None = None) -> None:
    """Until ``url`` answers 200 and, with ``line``, the log holds it (``servelab gateway --workers N``
    prints its ``listening on`` line once every worker is up: /health answers as soon as worker 0 is,
    and the others' start-up CPU must not fall into the measured window)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the proxy exited ({proc.returncode}); log {log}:\n"
                             + log.read_text(errors="replace")[-3000:])
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as r:
                if r.status == 200 and (line is None or line in log.read_text(errors="replace")):
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{url} not ready after {timeout_s:.0f} s; log {log}")


def _spawn(argv: list[str], cpu: int, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with open(log, "ab") as lf:
        return subprocess.Popen(["taskset", "-c", str(cpu), *argv], stdout=lf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, **(env or {})})


def start_litellm(mock_url: str, work: Path, cpu: int) -> Proxy:
    """LiteLLM 1.108.7 proxy on one core: one model ``m`` -> ``openai/m`` at the mock, offline settings
    from MACHINE_NOTES (LITELLM_MASTER_KEY, LITELLM_LOCAL_MODEL_COST_MAP=True)."""
    if not LITELLM.is_file():
        raise SystemExit(f"LiteLLM is not installed at {LITELLM}; see this file's docstring")
    cfg = {"model_list": [{"model_name": MODEL, "litellm_params": {"model": f"openai/{MODEL}",
                                                                   "api_base": mock_url, "api_key": "x"}}]}
    path = work / "litellm.yaml"
    path.write_text(yaml.safe_dump(cfg))
    port = free_port()
    key = "sk-bench-" + secrets.token_hex(8)
    log = work / "litellm.log"
    proc = _spawn([str(LITELLM), "--config", str(path), "--host", "127.0.0.1", "--port", str(port),
                   "--num_workers", "1"], cpu, log,
                  {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"})
    _wait_ready(f"http://127.0.0.1:{port}/health/liveliness", proc, log, 120)
    return Proxy("litellm", f"http://127.0.0.1:{port}/v1", key, proc, log)


def start_redis(work: Path, cpu: int) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server without persistence on a free port, pinned to ``cpu``: (process, URL)."""
    exe = shutil.which("redis-server")
    if exe is None:
        sys.exit("--gateway-workers needs redis-server on PATH (scripts/setup.sh installs it: apt-get install -y "
                 "redis-server)")
    port = free_port()
    proc = _spawn([exe, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"], cpu,
                  work / "redis.log")
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


def start_servelab(mock_url: str, work: Path, cpu: int, tag: str, workers: int = 0,
                   redis_url: str | None = None) -> Proxy:
    """``servelab gateway`` on one core: one backend (the mock), public model ``m``, one key, no limits,
    SQLite ledger and JSON access log in ``work`` (its defaults). ``workers`` > 0: ``--workers N`` with
    ``state.redis_url`` = ``redis_url`` (0: the plain command, no Redis)."""
    secret = secrets.token_hex(32)  # the gateway requires 64 hex characters
    port = free_port()
    cfg = {"server": {"host": "127.0.0.1", "port": port, "admin_port": None, "max_tokens_limit": 4096,
                      "access_log": str(work / f"gateway-{tag}-access.log")},
           "ledger": {"sqlite_path": str(work / f"gateway-{tag}-usage.db")},
           "backends": [{"name": "mock", "kind": "mock", "base_url": mock_url.removesuffix("/v1"),
                         "models": [MODEL]}],
           "models": {MODEL: {"targets": [{"backend": "mock", "model": MODEL}]}},
           "tenants": {"bench": {"allowed_models": ["*"]}},
           "keys": [{"id": "bench", "tenant": "bench", "sha256": hashlib.sha256(secret.encode()).hexdigest()}]}
    if workers:
        cfg["state"] = {"redis_url": redis_url}
    path = work / f"gateway-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log = work / f"gateway-{tag}.log"
    proc = _spawn([str(SERVELAB), "gateway", "--config", str(path),
                   *(["--workers", str(workers)] if workers else [])], cpu, log)
    # the command's own line, printed once every worker is up (each worker's log line "servelab.gateway: gateway
    # listening on ..." also says "listening on": waiting for that let the bench open its keep-alive
    # connections while worker 1 was still starting, and worker 0 then served every request of the run)
    _wait_ready(f"http://127.0.0.1:{port}/health", proc, log, 60, line="servelab gateway listening on")
    return Proxy("servelab", f"http://127.0.0.1:{port}/v1", f"sk-sl-bench-{secret}", proc, log)


def run_bench(p: Proxy, out: Path, cpu: int, concurrency: list[int] | None, requests: int | None,
              duration_s: float | None, warmup: int, output_tokens: str,
              rate_rps: float | None = None) -> dict[str, Any]:
    """Run ``servelab bench`` (pinned to ``cpu``) against ``p`` and return its summary.json: closed loop at
    ``concurrency``, or open loop (Poisson arrivals) at ``rate_rps`` when given."""
    # open loop: the same rate twice, the first step warms every connection (the bench's own warmup runs as a
    # closed loop of 1 in open mode: minutes at 0.8 s a request); the caller keeps the last step
    load = ["--rate", f"{rate_rps:g},{rate_rps:g}", "--arrival", "poisson"] if rate_rps else \
        ["--concurrency", ",".join(map(str, concurrency or []))]
    argv = ["taskset", "-c", str(cpu), str(SERVELAB), "bench", "--url", p.base_url, "--model", MODEL,
            "--workload", "short-qa", "--set", "input_tokens=32", "--set", f"output_tokens={output_tokens}",
            *load, "--warmup", str(0 if rate_rps else warmup),
            "--no-stop-on-slo", "--timeout", "120", "--quiet", "--out", str(out)]
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
    return {key if key is not None else int(s["load"]["concurrency"]): s for s in summary["steps"]
            if not s.get("skipped")}  # with ``key``: the last step wins (the first one was the warm-up)


def _worker_targets(ap: argparse.ArgumentParser, spec: str | None) -> dict[str, int]:
    """``--gateway-workers 1,2,1`` -> ``{"servelab-w1#1": 1, "servelab-w2": 2, "servelab-w1#2": 1}`` (in order)."""
    if not spec:
        return {}
    try:
        counts = [int(x) for x in spec.split(",")]
    except ValueError:
        ap.error(f"--gateway-workers {spec!r}: give worker counts like 1,2,1,2")
    if not counts or min(counts) < 1:
        ap.error("--gateway-workers: every count must be >= 1")
    out: dict[str, int] = {}
    seen: dict[int, int] = {}
    for n in counts:
        seen[n] = seen.get(n, 0) + 1
        out[f"servelab-w{n}" + (f"#{seen[n]}" if counts.count(n) > 1 else "")] = n
    return out


def _worker_split(access_log: Path) -> dict[int, int]:
    """Requests per gateway worker, from the access log's ``worker`` field (warmup included)."""
    out: dict[int, int] = {}
    try:
        with open(access_log, "rb") as f:
            for line in f:
                w = json.loads(line).get("worker")
                out[w] = out.get(w, 0) + 1
    except OSError:
        pass
    return out


def _print_worker_ratio(gw_workers: dict[str, int], rps: dict[str, tuple[float, float]],
                        split: dict[str, dict[int, int]]) -> None:
    """Each run's requests per worker, and each run's req/core-s against the 1-worker run just before it
    (runs side by side in time; never a mean over runs that did not run together)."""
    if not gw_workers:
        return
    print("\nrequests per gateway worker (access log): " + "; ".join(
        f"{t} " + " / ".join(f"w{w}: {n}" for w, n in sorted(split.get(t, {}).items(), key=lambda x: str(x[0])))
        for t in gw_workers if t in rps))
    prev: str | None = None
    pairs = []
    for t, n in gw_workers.items():
        if t not in rps:
            continue
        if n == 1:
            prev = t
        elif prev is not None:
            pairs.append(f"{t} / {prev}: {rps[t][1]:.1f} / {rps[prev][1]:.1f} = {rps[t][1] / rps[prev][1]:.3f}")
    if pairs:
        print("req/core-s, each multi-worker run against the 1-worker run before it: " + "; ".join(pairs))


def _print_latency(a: argparse.Namespace, lat: dict[str, dict[int, dict[str, Any]]], conc: list[int],
                   targets: list[str], mean_s: float) -> None:
    """The latency table (target minus direct) and the direct check (is the client + mock core queueing?)."""
    loop = (f"open loop, Poisson arrivals at streams / {mean_s:.2f} s" if a.loop == "open" else "closed loop")
    print(f"\nLatency (ms; {loop}; mock TTFT {a.ttft_ms:g} ms, ITL {a.itl_ms:g} ms, {a.output_tokens} tokens)")
    hdr = f"{'streams':>7} {'target':<9} {'n':>5} {'fail':>4} {'TTFT p50':>9} {'TTFT p99':>9} {'chunk p99':>9} " \
          f"{'+TTFT p50':>9} {'+TTFT p99':>9} {'+chunk p99':>10}"
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
                add = [_ms(tt["p50"] - d["ttft_s"]["p50"]), _ms(tt["p99"] - d["ttft_s"]["p99"]),
                       _ms(ch["p99"] - d["itl_chunk_s"]["p99"])]
            failed = s["counts"]["submitted"] - s["counts"]["succeeded"]
            print(f"{c:>7} {t:<9} {s['counts']['submitted']:>5} {failed:>4} {_ms(tt['p50']):>9} {_ms(tt['p99']):>9} "
                  f"{_ms(ch['p99']):>9} {add[0]:>9} {add[1]:>9} {add[2]:>10}")
    # is the direct baseline itself queueing on the client + mock core? Then "added" numbers mean little
    print(f"\nDirect check (client + mock on CPU {a.client_cpu}): the direct run must show the mock's own "
          f"schedule (TTFT {a.ttft_ms:g} ms, chunk gap {a.itl_ms:g} ms)")
    for c in conc:
        d = lat.get("direct", {}).get(c)
        if d is None:
            continue
        extra_ttft_ms = (d["ttft_s"]["p50"] - a.ttft_ms / 1e3) * 1e3
        extra_chunk_ms = (d["itl_chunk_s"]["p99"] - a.itl_ms / 1e3) * 1e3
        saturated = extra_ttft_ms > max(2.0, 0.05 * a.ttft_ms) or extra_chunk_ms > max(5.0, 0.1 * a.itl_ms)
        print(f"{c:>7} streams: TTFT p50 +{extra_ttft_ms:.2f} ms, chunk p99 +{extra_chunk_ms:.2f} ms over the "
              f"schedule; CPU {a.client_cpu} busy {d['cpu_busy_pct']['client']:.0f} % -> "
              + ("SATURATED: the client + mock core queues, added numbers at this step are not the proxy's "
                 "alone; raise --itl-ms or lower the streams" if saturated else "not saturated"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="direct,servelab,litellm", help="comma list: direct,servelab,litellm")
    ap.add_argument("--concurrency", default="1,16,64,256", help="concurrent streams per step")
    ap.add_argument("--requests-per-stream", type=int, default=4, help="measured requests per step = this x "
                    "streams (at least --min-requests)")
    ap.add_argument("--min-requests", type=int, default=200)
    ap.add_argument("--ttft-ms", type=float, default=50.0, help="mock time to first token, ms")
    ap.add_argument("--itl-ms", type=float, default=50.0, help="mock delay between tokens, ms (50: 256 streams "
                    "= ~5k chunks/s, which the client + mock core carries without queueing; see the direct check)")
    ap.add_argument("--output-tokens", default="8-24", help="tokens per answer (one per chunk): N, or LO-HI drawn "
                    "uniformly per request, so closed-loop streams do not stay in lockstep (equal lengths make all "
                    "streams of a step arrive in the same millisecond, every round)")
    ap.add_argument("--loop", choices=("open", "closed"), default="open",
                    help="latency part: open = Poisson arrivals at streams / mean request time (streams in flight "
                         "on average, independent phases); closed = that many workers. A closed loop on a fixed "
                         "TTFT/ITL schedule keeps every stream's chunks in the same millisecond forever (durations "
                         "are multiples of the ITL), which measures burst queueing, not per-chunk cost")
    ap.add_argument("--rps-concurrency", type=int, default=64, help="streams in the throughput run")
    ap.add_argument("--rps-duration-s", type=float, default=10.0, help="seconds of the throughput run")
    ap.add_argument("--proxy-cpu", type=int, default=1)
    ap.add_argument("--client-cpu", type=int, default=0)
    ap.add_argument("--workdir", default=None, help="artefacts folder (default: a new temp dir)")
    ap.add_argument("--gateway-workers", default=None, help="comma list of worker counts for the servelab target, "
                    "run in this order (e.g. 1,2,1,2), each with Redis (module doc); default: one plain run")
    ap.add_argument("--rps-only", action="store_true", help="only the throughput part")
    a = ap.parse_args()
    targets = [t.strip() for t in a.targets.split(",") if t.strip()]
    if targets[0] != "direct":
        targets = ["direct", *[t for t in targets if t != "direct"]]
    bad = set(targets) - {"direct", "servelab", "litellm"}
    if bad:
        ap.error(f"unknown target(s) {', '.join(sorted(bad))}; choose from direct, servelab, litellm")
    gw_workers = _worker_targets(ap, a.gateway_workers)  # target label -> --workers (servelab-w<N>[#k])
    if gw_workers:
        i = targets.index("servelab") if "servelab" in targets else len(targets)
        targets = [*targets[:i], *gw_workers, *targets[i + 1:]]
    conc = [int(x) for x in a.concurrency.split(",")]
    out_lo, out_hi = (int(x) for x in (str(a.output_tokens).split("-") * 2)[:2])
    # the mock's cap is out_hi; each request's max_tokens picks its length. Mean request duration -> the
    # open-loop rate that keeps `c` streams in flight on average (Little's law: L = lambda * W)
    mean_s = (a.ttft_ms + ((out_lo + out_hi) / 2 - 1) * a.itl_ms) / 1e3
    work = Path(a.workdir or tempfile.mkdtemp(prefix="gateway-overhead-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"workdir {work}; mock ttft {a.ttft_ms} ms, itl {a.itl_ms} ms, {a.output_tokens} tokens; "
          f"proxy on CPU {a.proxy_cpu}, mock + client on CPU {a.client_cpu}", flush=True)
    lat_mock = MockLauncher({"ttft_ms": a.ttft_ms, "itl_ms": a.itl_ms, "output_tokens": out_hi,
                             "model": MODEL}, log_dir=work).start()
    rps_mock = MockLauncher({"output_tokens": out_hi, "model": MODEL}, log_dir=work).start()
    for eng in (lat_mock, rps_mock):
        os.sched_setaffinity(eng.process.pid, {a.client_cpu})
    redis_proc, redis_url = start_redis(work, a.client_cpu) if gw_workers else (None, None)
    lat: dict[str, dict[int, dict[str, Any]]] = {}
    rps: dict[str, tuple[float, float]] = {}
    split: dict[str, dict[int, int]] = {}
    try:
        for t in targets:
            phases = (("rps", rps_mock),) if a.rps_only else (("latency", lat_mock), ("rps", rps_mock))
            for phase, mock in phases:
                p: Proxy
                if t == "direct":
                    p = Proxy("direct", mock.base_url, None, None, None)
                elif t == "litellm":
                    p = start_litellm(mock.base_url, work, a.proxy_cpu)
                elif t in gw_workers:
                    p = start_servelab(mock.base_url, work, a.proxy_cpu, f"{phase}-{t}", gw_workers[t], redis_url)
                    p.name = t
                else:
                    p = start_servelab(mock.base_url, work, a.proxy_cpu, phase)
                try:
                    print(f"[{t}] {phase} ...", flush=True)
                    if phase == "latency":
                        # one step per concurrency, each its own bench run so request counts can differ
                        lat[t] = {}
                        for c in conc:
                            n = max(a.min_requests, a.requests_per_stream * c)
                            psutil.cpu_percent(percpu=True)  # starts the per-CPU busy-share interval
                            rate = c / mean_s if a.loop == "open" else None
                            s = run_bench(p, work / f"{t}-c{c}", a.client_cpu, [c], n, None, warmup=c,
                                          output_tokens=a.output_tokens, rate_rps=rate)  # every connection warm
                            busy = psutil.cpu_percent(percpu=True)
                            lat[t].update(_steps(s, c))
                            lat[t][c]["cpu_busy_pct"] = {"client": busy[a.client_cpu], "proxy": busy[a.proxy_cpu]}
                    else:
                        cpu0 = p.cpu_s()
                        s = run_bench(p, work / f"{t}-rps", a.client_cpu, [a.rps_concurrency], None,
                                      a.rps_duration_s, warmup=a.rps_concurrency, output_tokens=a.output_tokens)
                        cpu = p.cpu_s() - cpu0
                        step = _steps(s)[a.rps_concurrency]
                        # the proxy's CPU covers warmup + measured requests: count both
                        lines = (work / f"{t}-rps" / "requests.jsonl").read_bytes().splitlines()
                        served = sum(1 for ln in lines if json.loads(ln)["failure"] is None)
                        rps[t] = (step["throughput"]["requests_per_s"] or 0.0,
                                  served / cpu if cpu > 0 else float("nan"))
                        if t in gw_workers:
                            split[t] = _worker_split(work / f"gateway-{phase}-{t}-access.log")
                finally:
                    p.stop()
    finally:
        lat_mock.stop()
        rps_mock.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)

    if lat:
        _print_latency(a, lat, conc, targets, mean_s)
    print(f"\nThroughput ({a.rps_concurrency} streams, {a.rps_duration_s:g} s, zero-delay mock, "
          f"{a.output_tokens} tokens; proxy alone on CPU {a.proxy_cpu})")
    print(f"{'target':<9} {'req/s':>8} {'req/core-s':>11}")
    for t in targets:
        if t in rps:
            r, per_core = rps[t]
            print(f"{t:<9} {r:>8.1f} {'' if t == 'direct' else f'{per_core:.1f}':>11}")
    _print_worker_ratio(gw_workers, rps, split)
    if "servelab" in rps and "litellm" in rps:
        print(f"\nservelab / LiteLLM: req/s {rps['servelab'][0] / rps['litellm'][0]:.1f}x, "
              f"req per proxy core-second {rps['servelab'][1] / rps['litellm'][1]:.1f}x (target >= 5x)")
    top = max(conc)
    if "servelab" in lat and top in lat["servelab"]:
        added = (lat["servelab"][top]["ttft_s"]["p99"] - lat["direct"][top]["ttft_s"]["p99"]) * 1e3
        print(f"servelab added TTFT P99 at {top} streams: {added:.2f} ms (target <= 2 ms)")
    print(f"artefacts: {work}")


if __name__ == "__main__":
    main()
