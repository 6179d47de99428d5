#!/usr/bin/env python3
"""How much load can servelab generate on ONE core, compared with guidellm and AIPerf?

Run by hand (not a test), from the repository root, with the project venv:

    .venv/bin/python benches/generator_capacity.py --profile  # ~9 minutes (510 s + 10 s profile)
    .venv/bin/python benches/generator_capacity.py --tools servelab --step-s 4   # servelab only
    .venv/bin/python benches/generator_capacity.py --tools servelab --workers 1,2 --ray   # several workers
    .venv/bin/python benches/generator_capacity.py --tools servelab --workers 1,2 --compare-rates 200,400 \
        --repeats 3 --step-s 6   # CPU per event at fixed rates, interleaved rounds (~3 min)

``--workers 1,2`` runs the servelab search once per worker count (``servelab bench --workers K``, K
processes, each its own event loop), and ``--ray`` once more per count through a Ray cluster the bench
starts on this machine (``ray start --head --num-cpus K``, pinned like the generator; ``servelab bench
--ray``). With K workers the generator is pinned to CPUs 0..K-1 and the mock stays on the last CPU, so
on a 2-core machine two workers share a core with the mock: raw events/s cannot double there, and the
figure to compare is the CPU per event (generator CPU seconds, coordinator and every worker, per SSE
event; Ray actors' CPU from the per-worker ``cpu_s`` of summary.json). Section D prints, per
configuration, the events/s at schedule-lag P99 <= 1 ms and the CPU per event, with its ratio to one
worker's. ``--compare-rates`` skips the search: every configuration runs each of the given constant rates,
configurations interleaved, ``--repeats`` rounds; section E prints each run's CPU per event (and the
coordinator's alone) and its ratio to the 1-worker run of the same round and rate.

Set-up: ``servelab mock-engine --ttft-ms 0 --itl-ms 0`` pinned to CPU 1 (``taskset -c 1``); every load
generator pinned to CPU 0 (``taskset -c 0``, inherited by all its worker processes). The mock streams
``--output-tokens`` token chunks per request in the vLLM dialect, so one response is
``role + N token chunks + usage + [DONE]`` = N+3 SSE events (all three tools ask for usage).

Per tool it reports:

* the highest constant (open-loop) arrival rate the tool sustained, under two criteria: A (the issue's):
  schedule-lag P99 <= 1 ms, >= 95 % of the offered rate achieved, no failures; B (sustained): the same
  with lag P99 <= 50 ms (bounded, not growing). servelab: geometric (x2) then binary search, one
  ``servelab bench --rate R --arrival constant`` per step, lag = ``schedule_lag_s.p99`` of summary.json.
  guidellm: ``--profile kind=constant`` over a coarse list of rates in one process, then two rates inside
  the bracket; lag = its ``request_dispatch_delay`` p99. AIPerf: ``--request-rate LIST --arrival-pattern
  constant``, same two passes; AIPerf reports no schedule lag for request-rate mode (only
  ``credit_to_start_latency``, which leaves out its timing manager), so the lag is derived from its
  per-request ``request_start_ns`` against the ideal constant-rate slots (both are printed). Both peers
  expose or allow a schedule-lag figure, so no closed-loop fallback is needed;
* requests/s and SSE events/s at that rate, counted on the mock's side (``GET /mock/records``) so all
  tools are measured with the same yardstick; the generator's CPU use (all its processes) is shown;
* the TTFT the tool adds: tool-reported TTFT minus the mock's own ``first token write - recv`` per
  request, median and P99 (each tool request is matched one-to-one to the first mock record received
  after its send time, on the shared monotonic clock; the peers' wall-clock stamps are mapped onto it);
* ratios servelab / peer.

The mock's own CPU use during each step is printed too: a step where the mock is near 100 % of its core
measures the mock, not the generator, and is flagged.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
VENV_PY = ROOT / ".venv" / "bin" / "python"
CACHE = Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))
PEERS = CACHE / "peers"
LAG_LIMIT_S = 1e-3
ACHIEVED_MIN = 0.95
GEN_CPU = "0"  # CPUs of the generator (taskset list): set per configuration by --workers
MOCK_CPU = "1"  # the last CPU (set in main)
NICE: list[str] = []  # e.g. ["nice", "-n", "-10"]: set by --nice


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# small helpers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(method: str, url: str, timeout: float = 30.0) -> Any:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    with urllib.request.urlopen(req, timeout=timeout) as r:
        body = r.read()
    return json.loads(body) if body else None


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def proc_cpu_s(pid: int) -> float:
    """user+system CPU seconds of one live process (from /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


# ----------------------------------------------------------------------------------------------
# the mock engine


class Mock:
    def __init__(self, output_tokens: int, workdir: Path) -> None:
        self.port = free_port()
        self.output_tokens = output_tokens
        self.log = workdir / "mock.log"
        cmd = [str(VENV_PY), "-m", "servelab.engines.mock"]
        if _servelab_cli_ok():
            cmd = [str(ROOT / ".venv" / "bin" / "servelab"), "mock-engine"]
        cmd += [
            "--port",
            str(self.port),
            "--ttft-ms",
            "0",
            "--itl-ms",
            "0",
            "--output-tokens",
            str(output_tokens),
            "--dialect",
            "vllm",
            "--model",
            "m",
        ]
        with open(self.log, "wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [*NICE, "taskset", "-c", MOCK_CPU, *cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.root = f"http://127.0.0.1:{self.port}"
        self.base_url = self.root + "/v1"
        t0 = time.monotonic()
        while True:
            try:
                http("GET", self.root + "/health", timeout=2)
                break
            except Exception:  # noqa: BLE001
                if self.proc.poll() is not None or time.monotonic() - t0 > 30:
                    raise RuntimeError(f"mock engine did not start; see {self.log}") from None
                time.sleep(0.1)

    def reset(self) -> None:
        http("POST", self.root + "/mock/reset")

    def records(self) -> list[dict[str, Any]]:
        return http("GET", self.root + "/mock/records", timeout=120)

    def cpu_s(self) -> float:
        return proc_cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_CLI_OK: bool | None = None


def _servelab_cli_ok() -> bool:
    """True when ``servelab bench`` works here (the CLI imports, workloads exist)."""
    global _CLI_OK
    if _CLI_OK is None:
        exe = ROOT / ".venv" / "bin" / "servelab"
        r = subprocess.run([str(exe), "bench", "--help"], capture_output=True, timeout=60)
        w = subprocess.run(
            [str(VENV_PY), "-c", "import servelab.bench.workloads.registry"], capture_output=True, timeout=60
        )
        _CLI_OK = r.returncode == 0 and w.returncode == 0
    return _CLI_OK


# ----------------------------------------------------------------------------------------------
# CPU sampler: mock process, generator process tree, and whole-core busy time of CPU 0 and CPU 1


class Sampler(threading.Thread):
    """Samples every 0.2 s: (t_mono_ns, mock CPU s, generator-tree CPU s, generator pid, per-core busy/total
    jiffies). Lets any window report the mock's and the generator's CPU share and how busy each core was
    in total (a busy core 0 beyond the generator's share means someone else was using it)."""

    def __init__(self, mock_pid: int) -> None:
        super().__init__(daemon=True)
        self.mock_pid = mock_pid
        self.gen_pid: int | None = None
        self.summary_path: Path | None = None  # Ray runs: the actors' pids are read from its generator.workers
        self._extra: list[int] = []
        self.samples: list[tuple[int, float, float, int | None, list[tuple[int, int]]]] = []
        self._stop = threading.Event()

    @staticmethod
    def _cores() -> list[tuple[int, int]]:
        out = []
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("cpu") and line[3].isdigit():
                    v = [int(x) for x in line.split()[1:]]
                    idle = v[3] + v[4]
                    out.append((sum(v) - idle, sum(v)))
        return out

    def _gen_cpu(self) -> float:
        pid = self.gen_pid
        if pid is None:
            return 0.0
        try:
            p = psutil.Process(pid)
            tot = 0.0
            if self.summary_path is not None and not self._extra:
                try:
                    gen = json.loads(self.summary_path.read_text()).get("generator") or {}
                    self._extra = [w["pid"] for w in gen.get("workers", []) if w.get("pid")]
                except (OSError, ValueError):
                    pass
            extra = []
            for x in self._extra:
                with contextlib.suppress(psutil.Error):
                    extra.append(psutil.Process(x))
            for q in [p, *p.children(recursive=True), *extra]:
                try:
                    ct = q.cpu_times()
                    tot += ct.user + ct.system
                except psutil.Error:
                    pass
            return tot
        except psutil.Error:
            return 0.0

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                pid = self.gen_pid
                self.samples.append(
                    (
                        time.monotonic_ns(),
                        proc_cpu_s(self.mock_pid),
                        self._gen_cpu(),
                        pid,
                        self._cores(),
                        _cpu_or_zero(pid),
                    )
                )
            except OSError:
                pass
            self._stop.wait(0.2)

    def stop(self) -> None:
        self._stop.set()

    def window(self, t0: int, t1: int) -> dict[str, float | None]:
        s = [x for x in list(self.samples) if t0 <= x[0] <= t1]
        if len(s) < 2:
            return {"mock": None, "gen": None, "core0": None, "core1": None}
        a, b = s[0], s[-1]
        dt = (b[0] - a[0]) / 1e9
        gen = (b[2] - a[2]) / dt if a[3] == b[3] and a[3] is not None else None
        cores = []
        for i in (int(GEN_CPU.split(",")[0]), int(MOCK_CPU)):
            busy = b[4][i][0] - a[4][i][0]
            tot = b[4][i][1] - a[4][i][1]
            cores.append(busy / tot if tot else None)
        coord = (b[5] - a[5]) / dt if a[3] == b[3] and a[3] is not None else None
        return {"mock": (b[1] - a[1]) / dt, "gen": gen, "core0": cores[0], "core1": cores[1], "coord": coord}


def _cpu_or_zero(pid: int | None) -> float:
    """CPU seconds of ``pid`` alone (the ``servelab bench`` process: the coordinator when it has workers)."""
    if pid is None:
        return 0.0
    try:
        return proc_cpu_s(pid)
    except (OSError, ValueError, IndexError):
        return 0.0


def run_pinned(cmd: list[str], cwd: Path, log_path: Path, timeout: float, sampler: Sampler) -> tuple[int, float]:
    """Run ``cmd`` on the generator core (all its processes inherit the pinning); returns (rc, wall_s)."""
    t0 = time.monotonic()
    env = dict(os.environ)
    env.pop("HF_HUB_OFFLINE", None)  # AIPerf rejects local tokenizer paths with it set
    with open(log_path, "wb") as lf:
        p = subprocess.Popen(
            [*NICE, "taskset", "-c", GEN_CPU, *cmd],
            cwd=cwd,
            stdout=lf,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        sampler.gen_pid = p.pid
        sampler._extra = []
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGTERM)
            try:
                rc = p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                rc = p.wait()
            rc = rc if rc else -1
        finally:
            sampler.gen_pid = None
    return rc, time.monotonic() - t0


# ----------------------------------------------------------------------------------------------
# one measured step (any tool)


@dataclass
class Step:
    tool: str
    offered_rps: float
    lag_p99_s: float | None = None  # the tool's own figure (see lag_source)
    lag_source: str = ""
    failed: int = 0  # failures the tool reported
    tool_rps: float | None = None  # requests/s the tool itself reported
    reqs: list[tuple[int, float]] = field(default_factory=list)  # (send time, monotonic ns; tool TTFT s)
    # filled from the mock's records
    requests: int = 0
    window_s: float = 0.0
    rps: float = 0.0
    events_per_s: float = 0.0
    ttft_added_ms: list[float] = field(default_factory=list)
    unmatched: int = 0
    generator_bound: bool = False  # servelab's own saturation verdict of the step
    cpu: dict[str, float | None] = field(default_factory=dict)
    strict_ok: bool = False
    sustained_ok: bool = False
    why: str = ""

    @property
    def load(self) -> str:
        return f"r{self.offered_rps:g}"


def mock_ttft_s(r: dict[str, Any]) -> float:
    return (r["token_write_ns"][0] - r["recv_ns"]) / 1e9


def attach_mock(steps: list[Step], recs: list[dict[str, Any]], sampler: Sampler) -> None:
    """Match each tool request to the mock record received first after its send time (one-to-one),
    then compute the mock-side rates, the TTFT added and the CPU shares of each step."""
    done = sorted(
        (r for r in recs if r.get("status") == 200 and r.get("done_ns") and r.get("token_write_ns")),
        key=lambda r: r["recv_ns"],
    )
    recv = [r["recv_ns"] for r in done]
    used: set[int] = set()
    for st in steps:
        matched = []
        for sent, ttft in sorted(st.reqs):
            i = bisect.bisect_left(recv, sent - 200_000)  # 0.2 ms slack for wall->monotonic conversion
            while i < len(done) and i in used:
                i += 1
            if i >= len(done) or recv[i] - sent > 1_000_000_000:
                st.unmatched += 1
                continue
            used.add(i)
            matched.append(done[i])
            if ttft is not None:
                st.ttft_added_ms.append((ttft - mock_ttft_s(done[i])) * 1e3)
        st.requests = len(matched)
        if len(matched) >= 2:
            t0 = min(r["recv_ns"] for r in matched)
            t1 = max(r["done_ns"] for r in matched)
            st.window_s = (t1 - t0) / 1e9
            st.rps = len(matched) / st.window_s
            # SSE events per response: role chunk + token chunks + usage chunk + [DONE]
            st.events_per_s = sum(len(r["token_write_ns"]) + 3 for r in matched) / st.window_s
            st.cpu = sampler.window(t0, t1)


def judge(st: Step, lag_limit_s: float, sustain_lag_s: float) -> None:
    why = []
    if st.failed or st.unmatched:
        why.append(f"{st.failed} failed/{st.unmatched} unmatched")
    if st.rps < ACHIEVED_MIN * st.offered_rps:
        why.append(f"achieved {st.rps:.1f} < {ACHIEVED_MIN:.0%} of offered")
    base_ok = not why
    lag = st.lag_p99_s
    st.strict_ok = base_ok and lag is not None and lag <= lag_limit_s
    st.sustained_ok = base_ok and lag is not None and lag <= sustain_lag_s
    if lag is None:
        why.append("no lag figure")
    elif lag > lag_limit_s:
        why.append(f"lag p99 {lag * 1e3:.2f} ms > {lag_limit_s * 1e3:g} ms")
    st.why = "; ".join(why)


def log_step(st: Step) -> None:
    lag = f"{st.lag_p99_s * 1e3:.2f} ms" if st.lag_p99_s is not None else "n/a"
    c = st.cpu
    f = lambda v: f"{v:.0%}" if v is not None else "?"  # noqa: E731
    log(
        f"{st.tool:8s} {st.load:>7s}: strict {'PASS' if st.strict_ok else 'fail'} / sustained "
        f"{'PASS' if st.sustained_ok else 'fail'} | {st.rps:7.1f} req/s {st.events_per_s:8.0f} ev/s | lag p99 {lag}"
        f" | CPU gen {f(c.get('gen'))} mock {f(c.get('mock'))} core0 {f(c.get('core0'))} core1 {f(c.get('core1'))}"
        f"{' | ' + st.why if st.why else ''}"
    )


# ----------------------------------------------------------------------------------------------
# servelab

SERVELAB_DRIVER = r"""
import sys, json
cfg = json.loads(sys.argv[1])
from servelab.bench.load.config import BenchConfig
from servelab.bench.load.runner import Bench
from servelab.wire.types import RequestSpec
counter = None
if cfg.get("tokenizer"):
    from servelab.modelfile.tokenizer import load_tokenizer
    counter = load_tokenizer(cfg["tokenizer"])
words = " ".join(f"w{i}" for i in range(cfg["input_tokens"]))
class WL:
    def __init__(self, seed): self.seed = seed
    def requests(self, n):
        return [RequestSpec(endpoint="chat", max_tokens=cfg["output_tokens"], workload="short-qa",
                            messages=[{"role": "user", "content": f"q{self.seed}-{i} " + words}]) for i in range(n)]
def factory(name, seed): return WL(seed)
bc = BenchConfig(base_url=cfg["url"], model="m", workloads=["short-qa"], rates_rps=[cfg["rate"]],
                 arrival="constant", requests=None, duration_s=cfg["duration"], warmup=0, out=cfg["out"],
                 tokenizer=cfg.get("tokenizer"))
bench = Bench(bc, [], factory, counter=counter)
try:
    import uvloop; run = uvloop.run
except ImportError:
    import asyncio; run = asyncio.run
run(bench.run())
"""


def servelab_cmd(
    mock: Mock, rate: float, a: argparse.Namespace, out: Path, tok: str | None, extra: list[str] | None = None
) -> list[str]:
    if _servelab_cli_ok():
        cmd = [
            str(ROOT / ".venv" / "bin" / "servelab"),
            "bench",
            *(extra or []),
            "--url",
            mock.base_url,
            "--model",
            "m",
            "--rate",
            f"{rate:g}",
            "--arrival",
            "constant",
            "--duration",
            str(a.step_s),
            "--warmup",
            "0",
            "--quiet",
            "--out",
            str(out),
            "--workload",
            "short-qa",
            "--set",
            f"input_tokens={a.input_tokens}",
            "--set",
            f"output_tokens={a.output_tokens}",
        ]
        return cmd + (["--tokenizer", tok] if tok else [])
    cfg = {
        "url": mock.base_url,
        "rate": rate,
        "duration": a.step_s,
        "out": str(out),
        "input_tokens": a.input_tokens,
        "output_tokens": a.output_tokens,
        "tokenizer": tok,
    }
    return [str(VENV_PY), "-c", SERVELAB_DRIVER, json.dumps(cfg)]


def servelab_steps(
    mock: Mock,
    rate: float,
    a: argparse.Namespace,
    work: Path,
    tok: str | None,
    sampler: Sampler,
    tag: str = "servelab",
    extra: list[str] | None = None,
) -> list[Step]:
    out = work / tag / f"r{rate:g}"
    shutil.rmtree(out, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    mock.reset()
    sampler.summary_path = (out / "summary.json") if extra and "--ray" in extra else None
    rc, _ = run_pinned(
        servelab_cmd(mock, rate, a, out, tok, extra), ROOT, out.with_suffix(".log"), a.step_s + 150, sampler
    )
    sampler.summary_path = None
    st = Step(tool=tag, offered_rps=rate, lag_source="servelab summary.json schedule_lag_s.p99")
    try:
        s = json.loads((out / "summary.json").read_text())["steps"][0]
        st.lag_p99_s = s["schedule_lag_s"]["p99"]
        st.tool_rps = s["throughput"]["requests_per_s"]
        st.failed = s["counts"]["failed_total"]
        st.generator_bound = bool((s.get("saturation") or {}).get("generator_bound"))
        for line in (out / "requests.jsonl").read_text().splitlines():
            r = json.loads(line)
            if not r["warmup"] and r["t_ns"]["sent"] is not None:
                st.reqs.append((r["t_ns"]["sent"], r["ttft_s"]))
    except (OSError, KeyError, IndexError, ValueError) as e:
        st.why = f"no usable summary (rc {rc}: {e}); see {out.with_suffix('.log')}"
    attach_mock([st], mock.records(), sampler)
    return [st]


# ----------------------------------------------------------------------------------------------
# peers: one invocation runs several constant rates; wall-clock stamps are mapped onto the monotonic clock


def wall_to_mono_ns(t_wall_s: float, offset_ns: int) -> int:
    return int(t_wall_s * 1e9) - offset_ns


def guidellm_steps(
    mock: Mock, rates: list[float], a: argparse.Namespace, work: Path, tok_dir: str, sampler: Sampler, offset_ns: int
) -> list[Step]:
    exe = PEERS / "guidellm" / "bin" / "guidellm"
    tag = "_".join(f"{r:g}" for r in rates)
    out = work / "guidellm" / f"r{tag}"
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(exe),
        "run",
        "--backend",
        f"kind=openai_http,target={mock.base_url},model=m",
        "--profile",
        "kind=constant",
        "--override",
        "profile.rate",
        ",".join(f"{r:g}" for r in rates),
        "--constraint",
        f"kind=max_duration,seconds={a.step_s:g}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={a.input_tokens},output_tokens={a.output_tokens}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tok_dir}",
        "--output",
        f"kind=json,path={out / 'out.json'}",
        "--disable-console-interactive",
    ]
    mock.reset()
    budget = 90 + len(rates) * (a.step_s + 40)
    rc, wall = run_pinned(cmd, out, out / "log.txt", budget, sampler)
    log(f"guidellm invocation for rates {rates}: rc {rc}, {wall:.0f} s wall")
    steps: list[Step] = []
    try:
        d = json.loads((out / "out.json").read_text())
    except (OSError, ValueError) as e:
        log(f"guidellm: no output ({e}); see {out / 'log.txt'}")
        return steps
    for b in d["benchmarks"]:
        strat = b["config"].get("strategy", {})
        rate = float(strat.get("rate") or 0)
        st = Step(
            tool="guidellm",
            offered_rps=rate,
            lag_source="guidellm request_dispatch_delay p99 (targeted start -> dispatch)",
        )
        m = b["metrics"]
        dd = (m.get("request_dispatch_delay") or {}).get("total") or (m.get("request_dispatch_delay") or {}).get(
            "successful"
        )
        st.lag_p99_s = dd["percentiles"]["p99"] if dd else None
        tot = m["request_totals"]
        st.failed = int(tot.get("errored", 0))  # "incomplete" = cut by the duration limit
        st.tool_rps = tot.get("successful", 0) / b["duration"] if b.get("duration") else None
        for r in b["requests"]["successful"]:
            t = r["info"]["timings"]
            if t.get("request_start") is None:
                continue
            ttft = (t["first_token_iteration"] - t["request_start"]) if t.get("first_token_iteration") else None
            st.reqs.append((wall_to_mono_ns(t["request_start"], offset_ns), ttft))
        steps.append(st)
    attach_mock(steps, mock.records(), sampler)
    return steps


def aiperf_steps(
    mock: Mock, rates: list[float], a: argparse.Namespace, work: Path, tok_dir: str, sampler: Sampler, offset_ns: int
) -> list[Step]:
    exe = PEERS / "aiperf" / "bin" / "aiperf"
    tag = "_".join(f"{r:g}" for r in rates)
    out = work / "aiperf" / f"r{tag}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(exe),
        "profile",
        "--model",
        "m",
        "--url",
        mock.root,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--tokenizer",
        tok_dir,
        "--use-server-token-count",
        "--request-rate",
        ",".join(f"{r:g}" for r in rates),
        "--arrival-pattern",
        "constant",
        "--benchmark-duration",
        f"{a.step_s:g}",
        "--benchmark-grace-period",
        "10",
        "--isl",
        str(a.input_tokens),
        "--osl",
        str(a.output_tokens),
        "--ui",
        "none",
        "--export-level",
        "records",
        "--artifact-dir",
        str(out / "art"),
    ]
    mock.reset()
    budget = 90 + len(rates) * (a.step_s + 40)
    rc, wall = run_pinned(cmd, out, out / "log.txt", budget, sampler)
    log(f"aiperf invocation for rates {rates}: rc {rc}, {wall:.0f} s wall")
    steps: list[Step] = []
    for rate in rates:
        d = out / "art" / f"rate_{float(rate)}" if len(rates) > 1 else out / "art"
        st = Step(
            tool="aiperf",
            offered_rps=rate,
            lag_source="derived from AIPerf request_start_ns vs the ideal constant-rate slots (AIPerf itself "
            "reports only credit_to_start_latency, which excludes its timing manager)",
        )
        try:
            summ = json.loads((d / "profile_export_aiperf.json").read_text())
            lines = (d / "profile_export.jsonl").read_text().splitlines()
        except (OSError, ValueError) as e:
            log(f"aiperf rate {rate:g}: no output ({e}); see {out / 'log.txt'}")
            continue
        starts = []
        for line in lines:
            r = json.loads(line)
            md = r.get("metadata", {})
            if md.get("benchmark_phase") not in (None, "profiling"):
                continue
            if r.get("error"):
                st.failed += 1
            ttft = ((r.get("metrics") or {}).get("time_to_first_token") or {}).get("value")
            start = md.get("request_start_ns")
            if start is None:
                continue
            starts.append(start)
            st.reqs.append((start - offset_ns, ttft / 1e3 if ttft is not None else None))
        starts.sort()
        if starts:
            gap = 1e9 / rate
            raw = [s - i * gap for i, s in enumerate(starts)]
            base = min(raw)
            lags = [(x - base) / 1e9 for x in raw]
            st.lag_p99_s = pct(lags, 99)
        ctsl = summ.get("credit_to_start_latency") or {}
        st.lag_source += f"; AIPerf credit_to_start_latency p99 {ctsl.get('p99', float('nan')):.2f} ms"
        st.tool_rps = (summ.get("request_throughput") or {}).get("avg")
        steps.append(st)
    attach_mock(steps, mock.records(), sampler)
    return steps


# ----------------------------------------------------------------------------------------------
# search and report


def servelab_search(
    mock: Mock,
    a: argparse.Namespace,
    work: Path,
    tok: str | None,
    sampler: Sampler,
    deadline: float,
    tag: str = "servelab",
    extra: list[str] | None = None,
) -> list[Step]:
    """Geometric (x2) growth from --start-rate until the sustained criterion fails, then bisection on a
    geometric scale until the bracket is within 12 %; then, if no rate met the strict lag limit, one
    lower rate (start/4) to see whether any does."""
    steps: list[Step] = []
    lo, hi = 0.0, None
    rate = a.start_rate
    while time.monotonic() < deadline and len(steps) < a.max_trials:
        st = servelab_steps(mock, rate, a, work, tok, sampler, tag, extra)[0]
        judge(st, a.lag_ms / 1e3, a.sustain_lag_ms / 1e3)
        log_step(st)
        steps.append(st)
        if st.sustained_ok:
            lo = max(lo, rate)
        else:
            hi = rate if hi is None else min(hi, rate)
        if hi is None:
            rate *= 2
        elif lo == 0.0:
            rate = hi / 2
            if rate < 1:
                break
        elif hi / lo < 1.12:
            break
        else:
            rate = round(math.sqrt(lo * hi), 1)
    if not any(s.strict_ok for s in steps) and time.monotonic() < deadline:
        low = min(s.offered_rps for s in steps) / 4 if steps else a.start_rate / 4
        st = servelab_steps(mock, low, a, work, tok, sampler, tag, extra)[0]
        judge(st, a.lag_ms / 1e3, a.sustain_lag_ms / 1e3)
        log_step(st)
        steps.append(st)
    return steps


def peer_search(fn: Any, tool: str, a: argparse.Namespace, deadline: float) -> list[Step]:
    """A coarse sweep of constant rates in one invocation (the peers start slowly), then one refining
    invocation with two rates inside the bracket of the sustained criterion."""
    steps: list[Step] = []
    coarse = [r for r in a.peer_rates]
    for st in fn(coarse):
        judge(st, a.lag_ms / 1e3, a.sustain_lag_ms / 1e3)
        log_step(st)
        steps.append(st)
    ok = [s.offered_rps for s in steps if s.sustained_ok]
    bad = [s.offered_rps for s in steps if not s.sustained_ok and (not ok or s.offered_rps > max(ok))]
    if ok and bad and time.monotonic() < deadline:
        lo, hi = max(ok), min(bad)
        refine = [round(lo * (hi / lo) ** (1 / 3), 1), round(lo * (hi / lo) ** (2 / 3), 1)]
        for st in fn(refine):
            judge(st, a.lag_ms / 1e3, a.sustain_lag_ms / 1e3)
            log_step(st)
            steps.append(st)
    elif time.monotonic() >= deadline:
        log(f"{tool}: time budget reached, no refining pass")
    return steps


def best(steps: list[Step], strict: bool) -> Step | None:
    ok = [s for s in steps if (s.strict_ok if strict else s.sustained_ok)]
    return max(ok, key=lambda s: s.events_per_s) if ok else None


def fmt(v: float | None, spec: str = ".0f") -> str:
    return "-" if v is None else format(v, spec)


def print_report(results: dict[str, list[Step]], a: argparse.Namespace, info: dict[str, Any]) -> None:
    print()
    print(
        f"servelab generator capacity vs peers — {time.strftime('%Y-%m-%d %H:%M')} — mock-engine "
        f"(vllm dialect, ttft 0, itl 0, {a.output_tokens} tokens => {a.output_tokens + 3} SSE events/response) "
        f"on CPU {MOCK_CPU}, each generator on CPU {GEN_CPU}; {a.step_s:g} s per step"
    )
    print(
        f"host: {info['cpu']}; load average before the run {info['loadavg']}; mock and generators at niceness "
        f"{a.nice if NICE else 0}"
    )
    for strict in (True, False):
        crit = (
            f"A. schedule-lag P99 <= {a.lag_ms:g} ms (the issue's criterion), >= {ACHIEVED_MIN:.0%} of offered "
            f"rate achieved, no failures"
            if strict
            else f"B. sustained: >= {ACHIEVED_MIN:.0%} of offered rate achieved, no failures, lag P99 <= "
            f"{a.sustain_lag_ms:g} ms (bounded, not growing)"
        )
        print()
        print(crit)
        hdr = (
            f"{'tool':9s} {'rate':>7s} {'events/s/core':>13s} {'req/s/core':>10s} {'lag P99 ms':>10s} "
            f"{'TTFT+ p50 ms':>12s} {'TTFT+ p99 ms':>12s} {'gen CPU':>7s} {'mock CPU':>8s} "
            f"{'core0':>5s} {'ev/CPU-s':>8s}  {'ev/s ratio servelab/tool':>24s}"
        )
        print(hdr)
        print("-" * len(hdr))
        sl = best(results.get("servelab", []), strict)
        for tool, steps in results.items():
            b = best(steps, strict)
            if b is None:
                tried = sorted(steps, key=lambda s: s.offered_rps)
                low = tried[0] if tried else None
                note = (
                    (
                        f"none passed (lowest rate tried {low.offered_rps:g}/s: lag P99 "
                        f"{fmt(low.lag_p99_s and low.lag_p99_s * 1e3, '.2f')} ms, {low.why or 'ok'})"
                    )
                    if low
                    else "not run"
                )
                print(f"{tool:9s} {note}")
                continue
            ratio = "-" if tool == "servelab" or sl is None else f"{sl.events_per_s / b.events_per_s:.2f}x"
            c = b.cpu
            pc = lambda v: "?" if v is None else f"{v:.0%}"  # noqa: E731
            print(
                f"{tool:9s} {b.offered_rps:7g} {b.events_per_s:13.0f} {b.rps:10.1f} "
                f"{fmt(b.lag_p99_s and b.lag_p99_s * 1e3, '.2f'):>10s} "
                f"{fmt(pct(b.ttft_added_ms, 50), '.3f'):>12s} {fmt(pct(b.ttft_added_ms, 99), '.3f'):>12s} "
                f"{pc(c.get('gen')):>7s} {pc(c.get('mock')):>8s} {pc(c.get('core0')):>5s} "
                f"{fmt(b.events_per_s / c['gen'] if c.get('gen') else None):>8s}  {ratio:>24s}"
            )
            if c.get("mock") is not None and c["mock"] > 0.9:
                print(f"{'':9s} ^ the mock used {c['mock']:.0%} of its core here: this figure may be mock-bound")
    common = set.intersection(*[{s.offered_rps for s in st} for st in results.values()]) if results else set()
    if common:
        r = min(common, key=lambda x: abs(x - 50))
        print()
        print(f"C. every tool at the same constant rate, {r:g} req/s (TTFT added and CPU cost at equal load)")
        hdr = (
            f"{'tool':9s} {'req/s':>7s} {'lag P99 ms':>10s} {'TTFT+ p50 ms':>12s} {'TTFT+ p99 ms':>12s} "
            f"{'gen CPU':>7s} {'core0':>5s} {'CPU ms/request':>14s}"
        )
        print(hdr)
        print("-" * len(hdr))
        for tool, steps in results.items():
            s = next(x for x in steps if x.offered_rps == r)
            g = s.cpu.get("gen")
            print(
                f"{tool:9s} {s.rps:7.1f} {fmt(s.lag_p99_s and s.lag_p99_s * 1e3, '.2f'):>10s} "
                f"{fmt(pct(s.ttft_added_ms, 50), '.3f'):>12s} {fmt(pct(s.ttft_added_ms, 99), '.3f'):>12s} "
                f"{'?' if g is None else f'{g:.0%}':>7s} "
                f"{'?' if s.cpu.get('core0') is None else format(s.cpu['core0'], '.0%'):>5s} "
                f"{fmt(g * 1e3 / s.rps if g and s.rps else None, '.3f'):>14s}"
            )
    print()
    print("lag sources:")
    seen = set()
    for tool, steps in results.items():
        for s in steps[:1]:
            src = s.lag_source.split("; AIPerf credit")[0]
            if (tool, src) not in seen:
                seen.add((tool, src))
                print(f"  {tool}: {src}")
    ap = [s for s in results.get("aiperf", [])]
    if ap:
        print(
            "  aiperf's own credit_to_start_latency p99 per rate: "
            + ", ".join(
                f"{s.offered_rps:g}/s {s.lag_source.split('p99 ')[-1]}" for s in sorted(ap, key=lambda s: s.offered_rps)
            )
        )
    print(
        "TTFT+ = tool TTFT - (mock first token write - mock recv), per request; requests matched to mock records "
        "by send time on the shared monotonic clock (peers' wall-clock stamps mapped onto it)"
    )
    print(
        "events/s and req/s are counted on the mock (completed responses / first recv..last done); 'per core' = "
        "the generator was pinned to one core; gen CPU = CPU share of the generator's process tree during that "
        "window; core0 = total busy share of the generator's core (other processes included); ev/CPU-s = events/s "
        "divided by gen CPU (events per second of generator CPU time)"
    )
    print()
    print("all steps (tool, offered rate, mock-side req/s, events/s, lag P99 ms, strict/sustained):")
    for tool, steps in results.items():
        print(
            f"  {tool}: "
            + "; ".join(
                f"{s.offered_rps:g}->{s.rps:.0f} req/s {s.events_per_s:.0f} ev/s "
                f"lag {fmt(s.lag_p99_s and s.lag_p99_s * 1e3, '.2f')}"
                f" {'A' if s.strict_ok else '-'}{'B' if s.sustained_ok else '-'}"
                for s in sorted(steps, key=lambda s: s.offered_rps)
            )
        )


def print_workers_report(
    results: dict[str, list[Step]], configs: list[tuple[str, int, bool]], a: argparse.Namespace
) -> None:
    """Section D: servelab per worker configuration, at its best rate under the strict criterion."""
    print()
    print(
        f"D. servelab on several workers: events/s at schedule-lag P99 <= {a.lag_ms:g} ms (criterion A) and "
        "generator CPU per SSE event (coordinator + every worker)"
    )
    hdr = (
        f"{'config':22s} {'workers':>7s} {'CPUs':>5s} {'rate':>7s} {'events/s':>9s} {'req/s':>7s} "
        f"{'lag P99 ms':>10s} {'gen CPU':>7s} {'CPU us/event':>12s} {'vs 1 worker':>11s} {'gen-bound':>9s}"
    )
    print(hdr)
    print("-" * len(hdr))
    base = None
    for tag, k, _ray in configs:
        b = best(results.get(tag, []), True)
        if b is None or not b.cpu.get("gen"):
            print(
                f"{tag:22s} {k:7d} {'-':>5s} none passed criterion A"
                + (f" (lowest tried {min(s.offered_rps for s in results[tag]):g}/s)" if results.get(tag) else "")
            )
            continue
        us = b.cpu["gen"] / b.events_per_s * 1e6
        if tag == "servelab":
            base = us
        ratio = "-" if base is None or tag == "servelab" else f"{us / base:.2f}x"
        print(
            f"{tag:22s} {k:7d} {min(k, os.cpu_count() or 1):5d} {b.offered_rps:7g} {b.events_per_s:9.0f} "
            f"{b.rps:7.1f} {fmt(b.lag_p99_s and b.lag_p99_s * 1e3, '.2f'):>10s} {b.cpu['gen']:7.0%} {us:12.2f} "
            f"{ratio:>11s} {'yes' if b.generator_bound else 'no':>9s}"
        )
    # CPU per event at equal load: the highest offered rate every configuration ran and sustained (criterion B)
    sets = [
        {x.offered_rps for x in results.get(tag, []) if x.sustained_ok and x.cpu.get("gen")} for tag, _, _ in configs
    ]
    common = set.intersection(*sets) if sets else set()
    if common:
        r = max(common)
        print(f"at the same offered rate, {r:g} req/s (the highest every configuration sustained: criterion B):")
        base = None
        for tag, k, _ray in configs:
            x = next(y for y in results[tag] if y.offered_rps == r and y.sustained_ok and y.cpu.get("gen"))
            us = x.cpu["gen"] / x.events_per_s * 1e6
            base = us if base is None else base
            print(
                f"  {tag:22s} {k:3d} worker(s): {x.events_per_s:8.0f} ev/s, lag P99 "
                f"{fmt(x.lag_p99_s and x.lag_p99_s * 1e3, '.2f')} ms, gen CPU {x.cpu['gen']:.0%}, "
                f"{us:.2f} CPU us/event ({us / base:.2f}x the first), "
                f"generator-bound {'yes' if x.generator_bound else 'no'}"
            )
    print(
        "CPU us/event = generator CPU seconds (whole process tree; Ray actors by pid) / SSE events counted on the "
        f"mock, over the mock-side window; with K workers the generator is pinned to CPUs 0..K-1, the mock to CPU "
        f"{MOCK_CPU}"
    )


def gen_cpus(k: int, ncpu: int, how: str) -> str:
    """The taskset CPU list of a K-worker generator: ``spread`` CPUs 0..K-1 (the last one shared with the
    mock when K = the CPU count), ``one`` CPU 0 for every K (the mock alone on its CPU; K processes
    time-share one core, so CPU per event compares the multi-process cost without the mock in the way)."""
    if how == "one" or k == 1:
        return "0"
    return ",".join(str(c) for c in range(min(k, ncpu)))


@contextlib.contextmanager
def configured(k: int, ray: bool, ncpu: int, a: argparse.Namespace, work: Path) -> Iterator[list[str]]:
    """Pin the generator for a K-worker configuration (sets GEN_CPU), start its local Ray cluster when
    ``ray``, and yield the extra ``servelab bench`` arguments; the cluster is stopped and GEN_CPU reset after."""
    global GEN_CPU
    GEN_CPU = gen_cpus(k, ncpu, a.worker_cpus)
    cluster = LocalRay(GEN_CPU, k, work) if ray else None
    try:
        extra = ["--workers", str(k)] if k > 1 or ray else []
        yield extra + (["--ray", cluster.address] if cluster is not None else [])
    finally:
        if cluster is not None:
            cluster.stop()
        GEN_CPU = "0"


def servelab_compare(
    mock: Mock,
    a: argparse.Namespace,
    work: Path,
    tok: str | None,
    sampler: Sampler,
    configs: list[tuple[str, int, bool]],
    ncpu: int,
) -> dict[str, list[Step]]:
    """``--compare-rates``: every configuration at each fixed rate, ``--repeats`` rounds, the configurations
    interleaved within each round (rate by rate) so that a slow spell of this shared machine hits all of
    them alike; no search."""
    rates = [float(x) for x in a.compare_rates.split(",") if x.strip()]
    out: dict[str, list[Step]] = {tag: [] for tag, _, _ in configs}
    for rnd in range(a.repeats):
        for rate in rates:
            for tag, k, ray in configs:
                with configured(k, ray, ncpu, a, work) as extra:
                    st = servelab_steps(mock, rate, a, work / f"round{rnd + 1}", tok, sampler, tag, extra)[0]
                judge(st, a.lag_ms / 1e3, a.sustain_lag_ms / 1e3)
                log(f"round {rnd + 1}/{a.repeats}:")
                log_step(st)
                out[tag].append(st)
    return out


def us_per_event(st: Step, who: str = "gen") -> float | None:
    """CPU microseconds per SSE event of ``who`` (``gen``: the whole generator; ``coord``: the bench
    process alone) over the step's mock-side window; None when either figure is missing."""
    cpu = st.cpu.get(who)
    return cpu / st.events_per_s * 1e6 if cpu is not None and st.events_per_s else None


def print_compare_report(
    results: dict[str, list[Step]], configs: list[tuple[str, int, bool]], a: argparse.Namespace
) -> None:
    """Section E: CPU per SSE event of each configuration at each fixed rate, per round, and its ratio to
    the 1-worker run of the SAME round and rate (runs of different rounds are never combined into one
    figure; the mean and range of the per-round ratios are printed beside them)."""
    rates = [float(x) for x in a.compare_rates.split(",") if x.strip()]
    base_tag = configs[0][0]
    print()
    print(
        f"E. CPU per SSE event at fixed offered rates, {a.repeats} round(s), configurations interleaved; "
        f"ratio = configuration / {base_tag} of the same round"
    )
    hdr = (
        f"{'rate':>6s} {'config':20s} {'round':>5s} {'req/s':>7s} {'lag P99 ms':>10s} {'gen CPU':>7s} "
        f"{'us/event':>9s} {'coord us/ev':>11s} {'ratio':>6s} {'gen-bound':>9s}"
    )
    print(hdr)
    print("-" * len(hdr))
    for rate in rates:
        per: dict[str, list[Step]] = {tag: [x for x in results[tag] if x.offered_rps == rate] for tag, _, _ in configs}
        for tag, _k, _ray in configs:
            ratios = []
            for i, x in enumerate(per[tag]):
                g = x.cpu.get("gen")
                us, cus = us_per_event(x), us_per_event(x, "coord")
                b = per[base_tag][i] if i < len(per[base_tag]) else None
                bus = us_per_event(b) if b is not None else None
                ratio = us / bus if us and bus and tag != base_tag else None
                if ratio is not None:
                    ratios.append(ratio)
                lag = fmt(x.lag_p99_s and x.lag_p99_s * 1e3, ".2f")
                print(
                    f"{rate:6g} {tag:20s} {i + 1:5d} {x.rps:7.1f} {lag:>10s} "
                    f"{fmt(g and g * 100, '.0f'):>6s}% {fmt(us, '.2f'):>9s} {fmt(cus, '.2f'):>11s} "
                    f"{fmt(ratio, '.3f'):>6s} {'yes' if x.generator_bound else 'no':>9s}"
                    + ("" if x.sustained_ok else "  (not sustained: " + (x.why or "lag") + ")")
                )
            if ratios:
                print(
                    f"{'':6s} {tag:20s} ratio over {len(ratios)} round(s): mean {sum(ratios) / len(ratios):.3f}, "
                    f"min {min(ratios):.3f}, max {max(ratios):.3f}"
                )
    print(
        "us/event = generator CPU seconds (coordinator + every worker) / SSE events counted on the mock over the "
        "mock-side window; coord = the servelab bench process alone (with workers: the coordinator)"
    )


class LocalRay:
    """A one-node Ray cluster for the --ray configurations: ``ray start --head --block`` in a session of its
    own, pinned to the generator's CPUs with ``num_cpus`` actors' worth of CPUs; :meth:`stop` ends the whole
    session."""

    def __init__(self, cpus: str, num_cpus: int, work: Path) -> None:
        self.port = free_port()
        self.tmp = Path(tempfile.mkdtemp(prefix="rg", dir="/tmp"))
        self.log = work / f"ray-head-{num_cpus}.log"
        env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
        ray = ROOT / ".venv" / "bin" / "ray"
        with open(self.log, "wb") as log:  # the child keeps its own copy of the descriptor
            self.proc = subprocess.Popen(
                [
                    "taskset",
                    "-c",
                    cpus,
                    str(ray),
                    "start",
                    "--head",
                    "--block",
                    "--port",
                    str(self.port),
                    "--num-cpus",
                    str(num_cpus),
                    "--memory",
                    str(2 << 30),
                    "--object-store-memory",
                    str(100 << 20),
                    "--include-dashboard",
                    "false",
                    "--disable-usage-stats",
                    "--temp-dir",
                    str(self.tmp),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        t0 = time.monotonic()
        while "block forever" not in self.log.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() - t0 > 120:
                self.stop()
                raise RuntimeError(f"ray head did not start; see {self.log}")
            time.sleep(0.3)
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
            time.sleep(2)
        shutil.rmtree(self.tmp, ignore_errors=True)


def make_tokenizer(dst: Path) -> tuple[str, str, str]:
    """An HF tokenizer folder for the peers: Gemma 3's, written by servelab; else a tiny BPE made with
    `tokenizers` (the mock does not care). Returns (folder, tokenizer.json, how it was made)."""
    tj = dst / "tokenizer.json"
    if tj.is_file():
        return str(dst), str(tj), "cached"
    code = (
        "import sys\nfrom servelab.modelfile.tokenizer import load_tokenizer\n"
        "load_tokenizer(None).save_hf_folder(sys.argv[1])\n"
    )
    r = subprocess.run([str(VENV_PY), "-c", code, str(dst)], capture_output=True, text=True, timeout=300)
    if r.returncode == 0 and tj.is_file():
        return str(dst), str(tj), "servelab load_tokenizer(gemma3 GGUF).save_hf_folder"
    log(f"servelab tokenizer export failed ({r.stderr.strip()[-200:]}); training a tiny BPE instead")
    code = (
        "import sys, json, os\nfrom tokenizers import Tokenizer, models, trainers, pre_tokenizers\n"
        "t = Tokenizer(models.BPE(unk_token='<unk>')); t.pre_tokenizer = pre_tokenizers.Whitespace()\n"
        "tr = trainers.BpeTrainer(vocab_size=2000, special_tokens=['<unk>', '<s>', '</s>'])\n"
        "t.train_from_iterator([open(__file__ if False else sys.argv[2]).read()] * 3, tr)\n"
        "os.makedirs(sys.argv[1], exist_ok=True); t.save(os.path.join(sys.argv[1], 'tokenizer.json'))\n"
        "json.dump({'tokenizer_class': 'PreTrainedTokenizerFast', 'bos_token': '<s>', 'eos_token': '</s>', "
        "'unk_token': '<unk>'}, open(os.path.join(sys.argv[1], 'tokenizer_config.json'), 'w'))\n"
    )
    subprocess.run([str(VENV_PY), "-c", code, str(dst), __file__], check=True, timeout=120)
    return str(dst), str(tj), "tiny BPE trained with tokenizers (fallback)"


def profile_servelab(mock: Mock, rate: float, a: argparse.Namespace, work: Path, tok: str | None) -> None:
    """One servelab step at ``rate`` under cProfile; prints the top functions by own time."""
    import pstats

    out = work / "servelab-profile"
    shutil.rmtree(out, ignore_errors=True)
    prof = work / "servelab.prof"
    cmd = servelab_cmd(mock, rate, a, out, tok)
    drv = work / "driver.py"
    if _servelab_cli_ok():
        drv.write_text("import sys\nfrom servelab.cli import main\nmain(sys.argv[1:])\n")
        args = cmd[1:]
    else:
        drv.write_text(SERVELAB_DRIVER)
        args = [cmd[-1]]
    mock.reset()
    subprocess.run(
        [*NICE, "taskset", "-c", GEN_CPU, str(VENV_PY), "-m", "cProfile", "-o", str(prof), str(drv), *args],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=a.step_s + 120,
    )
    print()
    print(f"cProfile of servelab at {rate:g} req/s (constant), top 25 by own time (whole process incl. start-up):")
    st = pstats.Stats(str(prof))
    st.sort_stats("tottime").print_stats(25)
    print("servelab's own functions, by cumulative time:")
    st.sort_stats("cumulative").print_stats(r"servelab/(wire|bench)/", 20)


def reprint(workdir: Path) -> None:
    """Print the report of an earlier run from its ``results.json`` in ``workdir`` (--reprint)."""
    d = json.loads((workdir / "results.json").read_text())
    old = argparse.Namespace(**d["args"])
    res = {t: [Step(**x) for x in st] for t, st in d["results"].items()}
    for st in res.values():
        for x in st:
            x.reqs = [tuple(r) for r in x.reqs]
    if old.nice:
        NICE[:] = ["nice", "-n", str(old.nice)]
    print_report(res, old, d["info"])


def host_info() -> dict[str, str]:
    """The CPU model (``model name`` in /proc/cpuinfo) and the 1, 5 and 15-minute load averages
    (/proc/loadavg) the report prints."""
    with open("/proc/cpuinfo") as f:
        cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "?")
    with open("/proc/loadavg") as f:
        loadavg = " ".join(f.read().split()[:3])
    return {"cpu": cpu, "loadavg": loadavg}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tools", default="servelab,guidellm,aiperf", help="comma-separated: servelab, guidellm, aiperf")
    ap.add_argument("--output-tokens", type=int, default=64, help="tokens (= token chunks) per response")
    ap.add_argument("--input-tokens", type=int, default=32)
    ap.add_argument("--step-s", type=float, default=5.0, help="seconds per load step")
    ap.add_argument("--start-rate", type=float, default=50.0, help="servelab search: first rate (req/s)")
    ap.add_argument("--max-trials", type=int, default=9, help="servelab search: most steps")
    ap.add_argument(
        "--peer-rates",
        default="12.5,25,50,100,200,400,800",
        help="peers: constant rates of the coarse sweep (one invocation each tool)",
    )
    ap.add_argument("--lag-ms", type=float, default=1.0, help="strict schedule-lag P99 limit (ms)")
    ap.add_argument("--sustain-lag-ms", type=float, default=50.0, help="lag P99 limit of the sustained criterion (ms)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="stop searching after this many seconds")
    ap.add_argument(
        "--servelab-tokenizer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="pass --tokenizer to servelab (per-request client token count, as the peers do)",
    )
    ap.add_argument(
        "--nice",
        type=int,
        default=-10,
        help="niceness of the mock and the generators (default -10: less disturbed by other work on a "
        "shared machine; needs root, else 0 is used); the same for every tool",
    )
    ap.add_argument("--profile", action="store_true", help="also run servelab once under cProfile at its best rate")
    ap.add_argument("--workdir", default=None, help="where run artefacts go (default: a temp dir, kept)")
    ap.add_argument("--reprint", metavar="WORKDIR", help="print the table of an earlier run (its results.json)")
    ap.add_argument(
        "--compare-rates",
        default=None,
        metavar="R1,R2,...",
        help="servelab only: no search; every --workers (and --ray) configuration at each of these "
        "constant rates, interleaved, --repeats rounds; prints section E (CPU per event ratios)",
    )
    ap.add_argument("--repeats", type=int, default=3, help="rounds of --compare-rates")
    ap.add_argument(
        "--worker-cpus",
        choices=("spread", "one"),
        default="spread",
        help="K workers on CPUs 0..K-1 (spread; the last shared with the mock) or all on CPU 0 (one)",
    )
    ap.add_argument(
        "--workers",
        default="1",
        help="servelab: comma-separated worker counts, one search each (servelab bench --workers K; 1 = one process)",
    )
    ap.add_argument(
        "--ray",
        action="store_true",
        help="servelab: also each worker count through a local Ray cluster (servelab bench --ray, K actors)",
    )
    a = ap.parse_args()
    if a.reprint:
        reprint(Path(a.reprint))
        return
    a.peer_rates = [float(x) for x in a.peer_rates.split(",") if x.strip()]
    worker_counts = [int(x) for x in a.workers.split(",") if x.strip()]
    if not worker_counts or min(worker_counts) < 1:
        ap.error("--workers: give worker counts >= 1, e.g. --workers 1,2")
    configs = [("servelab" if k == 1 else f"servelab-w{k}", k, False) for k in worker_counts]
    configs += [(f"servelab-ray-w{k}", k, True) for k in worker_counts] if a.ray else []
    tools = [t.strip() for t in a.tools.split(",") if t.strip()]
    for t in tools:
        if t not in ("servelab", "guidellm", "aiperf"):
            ap.error(f"unknown tool {t}")
        if t != "servelab" and not (PEERS / t / "bin" / t).exists():
            ap.error(f"{t} is not installed in {PEERS / t}: run benches/peers_setup.sh first")
    if shutil.which("taskset") is None or (os.cpu_count() or 1) < 2:
        ap.error("needs taskset and at least 2 CPUs")
    global GEN_CPU, MOCK_CPU
    ncpu = os.cpu_count() or 2
    MOCK_CPU = str(ncpu - 1)
    if a.nice:
        if a.nice < 0 and os.geteuid() != 0:
            log("not root: running at niceness 0")
        else:
            NICE[:] = ["nice", "-n", str(a.nice)]
    work = Path(a.workdir or tempfile.mkdtemp(prefix="servelab-gencap-"))
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    deadline = t_start + a.budget_s
    tok_dir, tok_json, tok_how = make_tokenizer(PEERS / "tokenizer-gemma3")
    log(
        f"tokenizer: {tok_dir} ({tok_how}); work dir {work}; servelab via "
        f"{'servelab bench CLI' if _servelab_cli_ok() else 'Bench API driver (CLI not usable)'}"
    )
    info = host_info()
    mock = Mock(a.output_tokens, work)
    sampler = Sampler(mock.proc.pid)
    sampler.start()
    offset_ns = ((time.time_ns() - time.monotonic_ns()) + (time.time_ns() - time.monotonic_ns())) // 2
    results: dict[str, list[Step]] = {}
    try:
        # give each tool a share of the budget: peers start slowly
        share = {"servelab": 0.3, "guidellm": 0.4, "aiperf": 0.3}
        total = sum(share[t] for t in tools)
        share = {t: share[t] / total for t in tools}
        if a.compare_rates:
            results = servelab_compare(
                mock, a, work, tok_json if a.servelab_tokenizer else None, sampler, configs, ncpu
            )
            tools = []
        for tool in tools:
            t_deadline = min(deadline, time.monotonic() + a.budget_s * share[tool])
            log(f"--- {tool}")
            if tool == "servelab":
                per = (t_deadline - time.monotonic()) / len(configs)
                for tag, k, ray in configs:
                    with configured(k, ray, ncpu, a, work) as extra:
                        log(
                            f"--- {tag}: {k} worker(s){' (Ray)' if ray else ''} on CPUs {GEN_CPU}, "
                            f"mock on CPU {MOCK_CPU}"
                        )
                        results[tag] = servelab_search(
                            mock,
                            a,
                            work,
                            tok_json if a.servelab_tokenizer else None,
                            sampler,
                            min(t_deadline, time.monotonic() + per),
                            tag,
                            extra,
                        )
            elif tool == "guidellm":
                results[tool] = peer_search(
                    lambda rs: guidellm_steps(mock, rs, a, work, tok_dir, sampler, offset_ns), tool, a, t_deadline
                )
            else:
                results[tool] = peer_search(
                    lambda rs: aiperf_steps(mock, rs, a, work, tok_dir, sampler, offset_ns), tool, a, t_deadline
                )
        (work / "results.json").write_text(
            json.dumps(
                {
                    "args": {k: v for k, v in vars(a).items()},
                    "info": info,
                    "results": {t: [asdict(x) for x in st] for t, st in results.items()},
                },
                default=str,
            )
        )
        if a.compare_rates:
            print_compare_report(results, configs, a)
        else:
            print_report(results, a, info)
        if len(configs) > 1 and not a.compare_rates:
            print_workers_report(results, configs, a)
        if a.profile and "servelab" in results:
            b = best(results["servelab"], False) or best(results["servelab"], True)
            if b is not None:
                profile_servelab(mock, b.offered_rps, a, work, tok_json if a.servelab_tokenizer else None)
    finally:
        sampler.stop()
        mock.stop()
        log(f"done in {time.monotonic() - t_start:.0f} s; artefacts in {work}")


if __name__ == "__main__":
    main()
