"""The production-like workloads through ``servelab bench`` against the real llama-server (Gemma 3 270M,
prompt lengths exact in its own tokenizer, read from the server's /props) and the real all-MiniLM-L6-v2
embedder. Run one at a time (each starts its own engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from servelab.bench.results import Summary

SERVELAB = [sys.executable, "-m", "servelab.cli"]


def bench(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVELAB, "bench", "--quiet", *args], capture_output=True, text=True, timeout=timeout)


def load(out: Path) -> tuple[dict, list[dict]]:
    raw = (out / "summary.json").read_text()
    Summary.model_validate_json(raw)
    return json.loads(raw), [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]


def test_embeddings(tmp_path: Path) -> None:
    """(First in the file: it runs before the module's Gemma server starts, one engine at a time.) The MiniLM
    embedder: 4 inputs per request, every request's usage.prompt_tokens = the inputs' exact
    lengths in the checkpoint's tokenizer + [CLS]/[SEP] per input."""
    from servelab.engines.embedder import EmbeddingLauncher

    out = tmp_path / "e"
    with EmbeddingLauncher(parallel=2).start() as emb:
        r = bench(
            "--url",
            emb.base_url,
            "--endpoint",
            "embeddings",
            "--batch-size",
            "4",
            "-n",
            "12",
            "--concurrency",
            "1,2",
            "--set",
            "input_tokens=16-200",
            "--out",
            str(out),
        )
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    print("\n", "\n".join(r.stdout.splitlines()[-3:]))
    assert len(lines) == 24 and all(x["failure"] is None for x in lines)
    assert all(x["prompt_tokens"] == x["prompt_tokens_target"] + 2 * 4 for x in lines)
    for s in summary["steps"]:
        e = s["embeddings"]
        assert e["batch_size"] == 4 and e["requests"] == 12 and e["inputs"] == 48 and e["dimensions"] == 384
        assert e["latency"]["n"] == 12 and e["inputs_per_s"] > 0 and e["tokens_per_s"] > 0
        assert 16 <= e["input_tokens"]["min"] <= e["input_tokens"]["max"] <= 200
        assert e["server_tokens_per_input"] == pytest.approx(e["input_tokens"]["mean"] + 2)
        assert "tokenizer" not in e["unit"] or e["tokenizer"]


@pytest.fixture(scope="module")
def gemma() -> Iterator[str]:
    """llama-server with Gemma 3 270M, 2 slots of 4096 tokens, --swa-full (Gemma 3's sliding-window cache
    reuses no prefix without it, see test_traces)."""
    from servelab.engines.llamacpp import LlamaCppLauncher

    with LlamaCppLauncher(parallel=2, ctx_size=8192, extra_args=["--swa-full"]).start() as eng:
        yield eng.base_url


def test_sessions(gemma: str, tmp_path: Path) -> None:
    """Exact first messages: turn 0 has the same prompt length in every session; later turns are served
    mostly from the prompt cache (cached_tokens from usage.prompt_tokens_details)."""
    out = tmp_path / "s"
    r = bench(
        "--url",
        gemma,
        "--sessions",
        "3",
        "--turns",
        "3",
        "--concurrency",
        "1",
        "--set",
        "first_tokens=120",
        "--set",
        "turn_tokens=16",
        "--set",
        "output_tokens=8",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    x = summary["steps"][0]["sessions"]
    print("\n", r.stdout.splitlines()[-2])
    assert len(lines) == 9 and x["sessions_ok"] == 3
    first = {ln["prompt_tokens"] for ln in lines if ln["id"] % 3 == 0}  # closed loop c1: ids in turn order
    assert len(first) == 1, first
    t = x["turns"]
    assert t[0]["prompt_tokens_mean"] < t[1]["prompt_tokens_mean"] < t[2]["prompt_tokens_mean"]
    assert t[1]["cached_share"] > 0.6 and t[2]["cached_share"] > 0.6


def test_mooncake_trace(gemma: str, tmp_path: Path) -> None:
    """--endpoint completions (the default with --trace): every prompt is the trace's input_length plus BOS;
    the second request's two shared 512-token blocks come from the prompt cache (--max-concurrency 1: on a
    loaded 2-core box the first may still run when the second is due; it then waits, shown as schedule lag,
    and the idle slot holding the prefix takes it)."""
    p = tmp_path / "m.jsonl"
    p.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2]},
                {"timestamp": 1000, "input_length": 1300, "output_length": 3, "hash_ids": [0, 1, 3]},
                {"timestamp": 2000, "input_length": 700, "output_length": 3, "hash_ids": [4, 5]},
            ]
        )
    )
    out = tmp_path / "t"
    r = bench("--url", gemma, "--trace", str(p), "--max-concurrency", "1", "--out", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    print("\n", r.stdout.splitlines()[-2])
    lines.sort(key=lambda x: x["id"])
    assert [x["prompt_tokens"] for x in lines] == [1101, 1301, 701]
    assert [x["output_tokens"] for x in lines] == [3, 3, 3]
    assert lines[1]["cached_tokens"] >= 1024 and lines[2]["cached_tokens"] <= 1
    rp = summary["steps"][0]["replay"]
    assert rp["shared_prefix_tokens"] == 1024 and rp["cached_tokens"] >= 1024
    assert rp["schedule_lag_p99_s"] is not None


def test_mixed_lang(gemma: str, tmp_path: Path) -> None:
    out = tmp_path / "m"
    r = bench(
        "--url",
        gemma,
        "-w",
        "mixed-lang",
        "--endpoint",
        "completions",
        "-n",
        "4",
        "--concurrency",
        "2",
        "--warmup",
        "0",
        "--set",
        "input_tokens=200-800",
        "--set",
        "output_tokens=4",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    lang = summary["steps"][0]["language"]
    print("\n", r.stdout.splitlines()[-2])
    assert all(x["prompt_tokens"] == x["prompt_tokens_target"] + 1 for x in lines), lines  # + BOS
    assert "Gemma" in lang["tokenizer"] and lang["tokens"] == sum(x["prompt_tokens_target"] for x in lines)
    assert 0.1 < lang["tokens_per_char"] < 1.0


def test_agent_on_a_model_without_tool_template(gemma: str, tmp_path: Path) -> None:
    """The base Gemma GGUF has no chat template (ChatML fallback, no tool format): step 0 of every loop makes
    no tool call and the gate catches it. First messages are exact (96 tokens): loops i and i + 4 share the
    closing request and differ in their background text, and their prompts are equally long."""
    out = tmp_path / "a"
    r = bench(
        "--url", gemma, "-w", "agent", "-n", "8", "--concurrency", "2", "--set", "output_tokens=16", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    a = summary["steps"][0]["agent"]
    print("\n", r.stdout.splitlines()[-2])
    assert a["loops_completed"] == 0 and a["steps"][0]["invalid"]["tool_call_missing"] == 8  # (+ truncated text)
    assert len(lines) == 8 and all(x["prompt_tokens_target"] == 96 for x in lines)  # every loop ended at step 0
    by_id = {x["id"]: x["prompt_tokens"] for x in lines}
    assert [by_id[i] for i in range(4)] == [by_id[i + 4] for i in range(4)], by_id


def test_rag_docs(gemma: str, tmp_path: Path) -> None:
    out = tmp_path / "r"
    r = bench(
        "--url",
        gemma,
        "-w",
        "rag-docs",
        "-n",
        "3",
        "--concurrency",
        "1",
        "--warmup",
        "0",
        "--rag-top-k",
        "3",
        "--set",
        "output_tokens=4",
        "--out",
        str(out),
        timeout=1200,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    summary, lines = load(out)
    rag = summary["steps"][0]["rag"]
    print("\n", r.stdout.splitlines()[-2])
    assert rag["k"] == 3 and rag["passages"] > 200 and "standard library docstrings" in rag["corpus"]
    assert all(x["prompt_tokens"] > x["prompt_tokens_target"] for x in lines)  # + BOS + the chat template
    assert rag["input_tokens"]["min"] <= min(x["prompt_tokens_target"] for x in lines)
