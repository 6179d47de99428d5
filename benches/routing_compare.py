#!/usr/bin/env python3
"""Routing policies compared on the same traffic and the same replicas (issue 26 item 2). Run by hand:

    .venv/bin/python benches/routing_compare.py                   # 3 mock replicas, 5 policies, 4 rounds, ~3 min
    .venv/bin/python benches/routing_compare.py --rounds 6 --sessions 16 --turns 5

Replicas: ``--replicas`` servelab mock engines (vLLM dialect) with a prefix cache (``--prefix-cache-blocks``
blocks of 16 words each, LRU, servelab.engines.mock.cache) and the continuous-batching timing law
(servelab.engines.mock.batch): the first token comes ``--ttft-ms + uncached prompt words / --prefill-tps``
after arrival, so a cache hit is visible in TTFT exactly as the law says. One ``servelab gateway`` per
policy (``routing.picker.policy``: round_robin, least_outstanding, power_of_two, prefix = the router's
rendezvous prefix affinity with bounded loads, engine = the engine-aware picker), all in front of the same
replicas; health checks (and the engine-gauge scrape) every 0.25 s.

Traffic: ``--sessions`` chat sessions at once, each ``--turns`` turns in sequence; a session's system
prompt is one of ``--prefixes`` shared ones (``--system-words`` words), every turn adds a user message of
``--user-words`` words and the previous answer, so turn t's prompt extends turn t-1's (multi-turn reuse) and
sessions share their system prompt (cross-session reuse). Streams with ``include_usage``.

Rounds: each round runs every policy once, in a shuffled order, after resetting every replica (empty caches,
``POST /mock/reset``), so a busy spell of the host hits all policies of a round alike.

Printed per policy (all rounds pooled, 95 % intervals):

- ``cached``: prompt words the engines found cached / prompt words (``usage.prompt_tokens_details.cached_tokens``;
  the engines' ``vllm:prefix_cache_hits_total`` / ``queries_total`` agree, printed as ``engine hit``);
- ``TTFT P50`` / ``TTFT P99`` (ms, client-side, first content chunk) with order-statistics intervals
  (servelab.bench.intervals.quantile_interval), ``E2E P50``;
- ``goodput``: share of requests that completed with TTFT <= ``--slo-ttft-ms`` (Clopper-Pearson interval);
- ``imbalance``: requests on the busiest replica / mean per replica (1 = even);
- ``moved``: share of turns after the first sent to another replica than the session's previous turn
  (the one that held its prefix) — the wrong-routing rate;
- ``route ms``: the gateway's own time from receiving the request to its routing decision (the ``routed``
  event of the access-log timeline), P50 and P99.

Then, for each policy against round robin: the paired-rounds ratio (servelab.bench.intervals.paired_rounds_ratio:
paired t on per-round log ratios, needs >= 3 rounds) of cached share and of TTFT P99, with its 95 % interval
and whether it excludes 1 ("significant"), as the trial does for candidates.
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
from typing import Any

import aiohttp
import orjson
import yaml

from servelab.bench.intervals import paired_rounds_ratio, proportion_interval, quantile_interval

POLICIES = ("round_robin", "least_outstanding", "power_of_two", "prefix", "engine")
_LISTEN = re.compile(rb"listening on (http://\S+/v1)")


def _start(cmd: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", SERVELAB_ADMIN_TOKEN=os.environ.get("SERVELAB_ADMIN_TOKEN")
               or "routing-compare-" + "0" * 32)
    with open(log, "wb") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, env=env)
    assert p.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        m = _LISTEN.search(line)
        if m:
            return p, m.group(1).decode()
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
    return [[" ".join(f"u{rnd}s{s}t{t}w{rng.randrange(10**6)}" for _ in range(args.user_words))
             for t in range(args.turns)] for s in range(args.sessions)]


async def _session(s: aiohttp.ClientSession, url: str, key: str, system: str, users: list[str], sid: int,
                   run: Run) -> None:
    msgs: list[dict[str, str]] = [{"role": "system", "content": system}]
    for t, u in enumerate(users):
        msgs.append({"role": "user", "content": u})
        body = {"model": "chat", "stream": True, "max_tokens": 16, "stream_options": {"include_usage": True},
                "messages": msgs}
        t0 = time.perf_counter()
        ttft = None
        usage: dict[str, Any] = {}
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
                ok = True
        e2e = time.perf_counter() - t0
        run.rows.append({"sid": sid, "turn": t, "rid": rid, "ok": ok and ttft is not None, "ttft": ttft, "e2e": e2e,
                         "prompt": usage.get("prompt_tokens", 0),
                         "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)})
        msgs.append({"role": "assistant", "content": "".join(text)})


async def _engine_counters(s: aiohttp.ClientSession, roots: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for root in roots:
        async with s.get(root + "/metrics") as r:
            for ln in (await r.text()).splitlines():
                if ln.startswith("vllm:prefix_cache_hits_total "):
                    hits += float(ln.split()[1])
                elif ln.startswith("vllm:prefix_cache_queries_total "):
                    queries += float(ln.split()[1])
    return hits, queries


async def _one_run(args: argparse.Namespace, policy: str, gw: dict[str, Any], roots: list[str], key: str,
                   rnd: int) -> Run:
    run = Run(policy)
    systems = [" ".join(f"sys{g}w{k}" for k in range(args.system_words)) for g in range(args.prefixes)]
    users = _prompts(args, rnd)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
        for root in roots:
            async with s.post(root + "/mock/reset") as r:
                await r.read()
        await asyncio.sleep(0.6)  # > 2 scrape intervals: the engine picker sees the emptied replicas
        seen = gw["log"].stat().st_size if gw["log"].exists() else 0
        await asyncio.gather(*(_session(s, gw["url"], key, systems[i % args.prefixes], users[i], i, run)
                               for i in range(args.sessions)))
        run.engine_hits, run.engine_queries = await _engine_counters(s, roots)
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
    v = sorted(values)[min(len(values) - 1, int(q * len(values)))]
    lo = f"{b.lo * 1e3:.0f}" if b.lo is not None else "?"
    hi = f"{b.hi * 1e3:.0f}" if b.hi is not None else "?"
    return f"{v * 1e3:.0f} [{lo}, {hi}]"


def _p99(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else 0.0


def _report(args: argparse.Namespace, runs: dict[str, list[Run]]) -> None:
    print(f"\n{args.replicas} replicas, {args.sessions} sessions x {args.turns} turns, {args.prefixes} shared system "
          f"prompts of {args.system_words} words, {args.rounds} rounds; SLO TTFT <= {args.slo_ttft_ms:g} ms; "
          "95 % intervals")
    print(f"{'policy':<18} {'cached':>7} {'engine hit':>10} {'TTFT P50 ms':>16} {'TTFT P99 ms':>16} "
          f"{'E2E P50 ms':>15} {'goodput':>20} {'imbal':>6} {'moved':>6} {'route ms P50/P99':>17}")
    for policy in POLICIES:
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
        route = (f"{routed[len(routed) // 2]:.2f}/{routed[min(len(routed) - 1, int(0.99 * len(routed)))]:.2f}"
                 if routed else "n/a")
        print(f"{policy:<18} {cached:>7.3f} {ehit:>10.3f} {_q(ttft, 0.5):>16} {_q(ttft, 0.99):>16} "
              f"{_q(e2e, 0.5):>15} {good / max(1, len(rows)):>6.3f} [{gi.lo:.2f}, {gi.hi:.2f}] "
              f"{imbalance:>6.2f} {moved / max(1, moves):>6.3f} {route:>17}")
    print("\npaired rounds vs round_robin (ratio policy / round_robin, 95 % interval; significant = excludes 1):")
    base = runs["round_robin"]
    for policy in POLICIES[1:]:
        rs = runs[policy]
        for name, fig in (("cached share", lambda run: sum(r["cached"] for r in run.rows)
                           / max(1, sum(r["prompt"] for r in run.rows))),
                          ("TTFT P99", lambda run: _p99([r["ttft"] for r in run.rows if r["ok"]]))):
            mine = [fig(run) for run in rs]
            theirs = [fig(run) for run in base]
            if min(theirs) <= 0:  # round robin found nothing cached in some round: the ratio is undefined
                print(f"  {policy:<18} {name:<13} round_robin is 0 in a round: {mine} vs {theirs}")
                continue
            ratio = paired_rounds_ratio(mine, theirs)
            if ratio is None:
                print(f"  {policy:<18} {name:<13} n/a (needs >= 3 rounds, figures > 0)")
            else:
                print(f"  {policy:<18} {name:<13} x{ratio.ratio:.3f} [{ratio.lo:.3f}, {ratio.hi:.3f}] "
                      f"{'significant' if ratio.significant else 'not significant'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--prefixes", type=int, default=3, help="shared system prompts")
    ap.add_argument("--system-words", type=int, default=256)
    ap.add_argument("--user-words", type=int, default=48)
    ap.add_argument("--prefix-cache-blocks", type=int, default=160, help="per replica, 16 words each")
    ap.add_argument("--prefill-tps", type=float, default=4000.0, help="mock prefill rate, words/s")
    ap.add_argument("--ttft-ms", type=float, default=5.0)
    ap.add_argument("--slo-ttft-ms", type=float, default=150.0)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="routing_compare-"))
    work.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        roots = []
        for i in range(args.replicas):
            p, url = _start([sys.executable, "-m", "servelab.engines.mock", "--port", "0", "--dialect", "vllm",
                             "--model", "m", "--output-tokens", "16", "--ttft-ms", str(args.ttft_ms),
                             "--itl-ms", "5", "--itl-ms-per-running", "1", "--prefill-tokens-per-s",
                             str(args.prefill_tps), "--prefix-cache-blocks", str(args.prefix_cache_blocks)],
                            work / f"mock{i}.log")
            procs.append(p)
            roots.append(url[: -len("/v1")])
        from servelab.gateway.keys import format_key, hash_secret

        secret = "0" * 64
        key = format_key("bench", secret)
        gws: dict[str, dict[str, Any]] = {}
        for policy in POLICIES:
            d = work / policy
            d.mkdir(exist_ok=True)
            cfg = {"server": {"port": 0, "admin_port": 0, "access_log": str(d / "access.log")},
                   "ledger": {"sqlite_path": str(d / "usage.db")},
                   "backends": [{"name": f"r{i}", "kind": "vllm", "base_url": r, "models": ["m"]}
                                for i, r in enumerate(roots)],
                   "models": {"chat": {"targets": [{"backend": f"r{i}", "model": "m"} for i in range(len(roots))]}},
                   "tenants": {"t": {"allowed_models": ["chat"]}},
                   "keys": [{"id": "bench", "tenant": "t", "sha256": hash_secret(secret)}],
                   "health": {"interval_s": 0.25},
                   "routing": {"affinity_chars": 256 if policy == "prefix" else 0,
                               "picker": {"policy": policy, "stale_after_s": 1.0}}}
            (d / "gateway.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
            p, url = _start([sys.executable, "-m", "servelab.cli", "gateway", "--config", str(d / "gateway.yaml")],
                            d / "gateway.stderr")
            procs.append(p)
            gws[policy] = {"url": url, "log": d / "access.log"}
        runs: dict[str, list[Run]] = defaultdict(list)
        rng = random.Random(7)
        for rnd in range(args.rounds):
            order = list(POLICIES)
            rng.shuffle(order)
            for policy in order:
                runs[policy].append(asyncio.run(_one_run(args, policy, gws[policy], roots, key, rnd)))
            print(f"round {rnd + 1}/{args.rounds} done ({', '.join(order)})", flush=True)
        _report(args, runs)
        print(f"\nartefacts: {work}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


if __name__ == "__main__":
    main()
