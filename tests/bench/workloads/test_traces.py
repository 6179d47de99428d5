"""Trace replay: the three published formats parsed from small files written here, exact prompt lengths,
Mooncake's shared blocks, replay timing against the mock, and the prefix sharing seen by llama-server."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import high_priority
from timing_floor import timer_lateness_ns

from servelab.bench.load.step import LoadModel, run_step
from servelab.bench.workloads.traces import read_trace, replay_offsets_ns, trace_requests
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError
from servelab.wire.client import make_session


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_tokenizer(None)


def _mooncake(path: Path, rows: list[dict]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_mooncake(tmp_path: Path, counter: TokenCounter) -> None:
    p = _mooncake(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 20, "hash_ids": [0, 1, 2]},
            {"timestamp": 0, "input_length": 1300, "output_length": 10, "hash_ids": [0, 1, 3]},
            {"timestamp": 3052, "input_length": 600, "output_length": 5, "hash_ids": [4, 5]},
        ],
    )
    tr = read_trace(p)
    assert tr.format == "mooncake" and [e.t_s for e in tr.entries] == [0, 0, 3.052]
    assert replay_offsets_ns(read_trace(p, speed=2)) == [0, 0, 1_526_000_000]
    specs = trace_requests(tr, counter)
    for s, e in zip(specs, tr.entries, strict=True):
        assert counter.count(s.prompt) == e.input_tokens == s.prompt_tokens_target
        assert s.max_tokens == e.output_tokens and s.extra["ignore_eos"] is True
    a, b, c = (counter.encode(s.prompt) for s in specs)
    shared = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    assert 1024 <= shared < 1024 + 8  # blocks 0 and 1 (2 x 512 tokens) are the same text in both
    assert a[:8] != c[:8]


def test_azure(tmp_path: Path, counter: TokenCounter) -> None:
    p = tmp_path / "AzureLLMInferenceTrace_conv.csv"
    p.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
        "2023-11-16 18:15:51.2225130,879,46\n"
    )
    tr = read_trace(p)
    assert tr.format == "azure" and [round(e.t_s, 6) for e in tr.entries] == [0, 4.314579, 4.541923]
    assert [e.input_tokens for e in tr.entries] == [374, 396, 879]
    assert [counter.count(s.prompt) for s in trace_requests(tr, counter)] == [374, 396, 879]
    win = read_trace(p, start_s=1.0)
    assert len(win.entries) == 2 and win.entries[0].t_s == 0 and win.skipped == {"outside the time window": 1}


def test_burstgpt_skips_failed_rows(tmp_path: Path) -> None:
    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
        "45,ChatGPT,1087,0,1087,Conversation log\n"
        "118,GPT-4,417,276,693,API log\n"
    )
    tr = read_trace(p, max_requests=5)
    assert tr.format == "burstgpt" and [e.t_s for e in tr.entries] == [0, 113]
    assert tr.entries[1].model == "GPT-4" and sum(tr.skipped.values()) == 1


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "missing GeneratedTokens"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,3,4\n", "line 2: TIMESTAMP 'yesterday'"),
        ('{"timestamp": 0}\n', "line 1: needs timestamp"),
        ("hello\n", "give --trace-format"),
    ],
)
def test_bad_files_name_the_line(tmp_path: Path, text: str, msg: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(text)
    with pytest.raises(ConfigError, match=msg):
        read_trace(p)


def _schedule_lags_ms(base_url: str, specs: list, offsets_ns: list[int], rate: float) -> np.ndarray:
    async def go() -> list[int]:
        lags: list[int] = []
        async with make_session() as s:
            recs = await run_step(
                s,
                base_url,
                "m",
                specs,
                LoadModel(kind="open", rate_rps=rate),
                offsets_ns=offsets_ns,
                dispatch_lags_ns=lags,
            )
        assert all(r.ok for r in recs) and len(recs) == len(specs)
        return lags

    return np.asarray(asyncio.run(go())) / 1e6


FORMATS = ("mooncake", "azure", "burstgpt")


def _replay_trace(tmp_path: Path, fmt: str) -> Path:
    """200 arrivals at ~100 req/s (exponential gaps, seed 7, ten at one instant) written in ``fmt``."""
    rng = np.random.default_rng(7)
    t_ms = np.sort(np.round(rng.exponential(10.0, 200).cumsum())).astype(int)
    t_ms[50:60] = t_ms[50]  # ten requests at the same instant
    if fmt == "mooncake":
        return _mooncake(
            tmp_path / "t.jsonl",
            [{"timestamp": int(t), "input_length": 40, "output_length": 4, "hash_ids": [0]} for t in t_ms],
        )
    p = tmp_path / f"{fmt}.csv"
    if fmt == "azure":
        p.write_text(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            + "".join(f"2023-11-16 18:{15 + int(t) // 60000:02d}:{int(t) % 60000 / 1000:09.6f},40,4\n" for t in t_ms)
        )
    else:
        p.write_text(
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            + "".join(f"{t / 1000},ChatGPT,40,4,44,API log\n" for t in t_ms)
        )
    return p


def test_the_three_formats_give_one_schedule(tmp_path: Path) -> None:
    """The same arrivals written as Mooncake, Azure and BurstGPT parse to the same send offsets, rate and
    request sizes: the replay below may pool one round of each format. Azure's wall-clock timestamps go
    through a float of seconds since the epoch (~0.2 us resolution at 1.7e9 s), so offsets agree within
    1 us (a thousandth of the replay's 1 ms bound); the order of arrivals is exact."""
    traces = {fmt: read_trace(_replay_trace(tmp_path, fmt)) for fmt in FORMATS}
    offsets = {fmt: np.asarray(replay_offsets_ns(tr)) for fmt, tr in traces.items()}
    assert all(len(tr.entries) == 200 for tr in traces.values())
    for fmt in ("azure", "burstgpt"):
        assert int(np.abs(offsets[fmt] - offsets["mooncake"]).max()) <= 1_000, fmt
        assert (np.argsort(offsets[fmt], kind="stable") == np.argsort(offsets["mooncake"], kind="stable")).all()
    rates = [tr.rate_rps for tr in traces.values()]
    assert max(rates) - min(rates) <= 1e-6 * min(rates), rates
    for tr in traces.values():
        assert all((e.input_tokens, e.output_tokens) == (40, 4) for e in tr.entries)


def test_replay_keeps_the_trace_times(mock_engine, tmp_path: Path) -> None:
    """200 requests at the trace's own rate (~100 req/s, bursts of simultaneous arrivals included) are
    sent on time: the generator's lateness P99 is within 1 ms of the box's floor for the same schedule.

    The floor is a blocking ``time.sleep`` to each scheduled instant (tests/timing_floor.py): on this VM
    the host deschedules vCPUs for 1-5 ms, so even that wakes > 1 ms late at P99 at times (the CI run
    of 2026-12-01 saw servelab's P99 at 1.4-1.6 ms in three tries). Three rounds of servelab's replay
    are interleaved with three of the floor and the pooled P99s compared; the median lateness must
    also be within 1 ms absolute. Each round replays another format's own parsed trace (requests and
    offsets); :func:`test_the_three_formats_give_one_schedule` shows the three schedules are identical,
    so the rounds are repeats of one schedule, as before when each format ran its own three rounds."""
    traces = [read_trace(_replay_trace(tmp_path, fmt)) for fmt in FORMATS]
    mp = mock_engine("--ttft-ms", "0", "--itl-ms", "0")
    ours: list[np.ndarray] = []
    floor: list[np.ndarray] = []
    for tr in traces:
        assert len(tr.entries) == 200
        specs, offsets = trace_requests(tr, None), replay_offsets_ns(tr)
        gc.collect()
        gc.disable()
        try:
            with high_priority(mp.proc.pid):
                ours.append(_schedule_lags_ms(mp.base_url, specs, offsets, tr.rate_rps))
                floor.append(np.asarray(timer_lateness_ns(offsets)) / 1e6)
        finally:
            gc.enable()
    lags, base = np.concatenate(ours), np.concatenate(floor)
    p99, p99_floor = float(np.percentile(lags, 99)), float(np.percentile(base, 99))
    print(
        f"\n{'/'.join(tr.format for tr in traces)}: {traces[0].rate_rps:.0f} req/s, schedule lag P50 "
        f"{np.median(lags):.3f} ms, P99 {p99:.3f} ms, max {lags.max():.3f} ms; floor (blocking sleep) P50 "
        f"{np.median(base):.3f}, P99 {p99_floor:.3f}, max {base.max():.3f} ms (n={len(lags)} each)"
    )
    assert float(np.median(lags)) <= 1.0, lags
    assert p99 <= p99_floor + 1.0, (p99, p99_floor)


def test_mooncake_sharing_reaches_the_prefix_cache(tmp_path: Path, counter: TokenCounter) -> None:
    """Requests whose leading hash ids match are served from llama-server's prompt cache for those blocks
    (usage prompt_tokens_details.cached_tokens); a request sharing nothing is not. Gemma 3 uses sliding-
    window attention: without ``--swa-full`` llama-server (b11434) reuses nothing of a prompt whose suffix
    changed (cached_tokens 0 for every request, measured), so the server runs with it."""
    from servelab.engines.llamacpp import LlamaCppLauncher

    p = _mooncake(
        tmp_path / "m.jsonl",
        [
            {"timestamp": 0, "input_length": 200, "output_length": 2, "hash_ids": [0, 1, 2, 3]},
            {"timestamp": 500, "input_length": 200, "output_length": 2, "hash_ids": [0, 1, 2, 9]},
            {"timestamp": 1000, "input_length": 200, "output_length": 2, "hash_ids": [7, 8, 5, 6]},
        ],
    )
    tr = read_trace(p)
    specs = trace_requests(tr, counter, block_tokens=50)
    with LlamaCppLauncher(parallel=1, ctx_size=2048, extra_args=["--swa-full"]).start() as eng:

        async def go() -> list:
            async with make_session() as s:
                return await run_step(s, eng.base_url, "m", specs, LoadModel(kind="closed", concurrency=1))

        recs = asyncio.run(go())
    cached = [r.cached_tokens for r in recs]
    print("\ncached tokens per request:", cached)
    assert all(r.ok for r in recs)
    assert cached[1] is not None and 150 <= cached[1] <= 151  # BOS + 3 shared blocks of 50
    assert cached[2] is not None and cached[2] <= 1


def test_window_and_shared_prefix_tokens(tmp_path: Path) -> None:
    from servelab.bench.workloads.traces import parse_window, shared_prefix_tokens

    assert parse_window(None) == (0.0, None) and parse_window("600:") == (600.0, None)
    assert parse_window("10:70") == (10.0, 60.0) and parse_window(":5") == (0.0, 5.0)
    for bad in ("5:2", "x", "10", "-1:4", "1:inf"):
        with pytest.raises(ConfigError, match="--trace-window"):
            parse_window(bad)
    p = _mooncake(
        tmp_path / "s.jsonl",
        [
            {"timestamp": 0, "input_length": 1100, "output_length": 1, "hash_ids": [0, 1, 2]},
            {"timestamp": 1, "input_length": 1300, "output_length": 1, "hash_ids": [0, 1, 3]},  # 2 blocks shared
            {"timestamp": 2, "input_length": 700, "output_length": 1, "hash_ids": [1, 0]},  # same ids, other prefix
            {"timestamp": 3, "input_length": 600, "output_length": 1, "hash_ids": [0, 1, 3]},
        ],
    )  # capped at its length
    assert shared_prefix_tokens(read_trace(p)) == 1024 + 0 + 600
    az = tmp_path / "a.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n")
    assert shared_prefix_tokens(read_trace(az)) is None
