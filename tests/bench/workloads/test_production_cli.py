"""The production-like workloads through ``servelab bench`` against ``servelab mock-engine``: multi-turn
sessions, trace replay in each format, agent loops with the mock's bad tool calls, the mixed Chinese/English
set; the same files as any run (requests.jsonl, a typed summary.json) and one clear line for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.bench.results import Summary
from servelab.modelfile.tokenizer import _default_model_path, load_tokenizer

SERVELAB = [sys.executable, "-m", "servelab.cli"]


def bench(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SERVELAB, "bench", "--quiet", *args], capture_output=True, text=True, timeout=timeout)


def load(out: Path) -> tuple[dict, list[dict]]:
    raw = (out / "summary.json").read_text()
    Summary.model_validate_json(raw)  # typed: every key is in the schema
    return json.loads(raw), [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines() if x.strip()]


def test_sessions_history_grows_as_specified(mock_engine, tmp_path: Path) -> None:
    """3 sessions x 4 turns per step: 12 requests per step, turn k's prompt = the mock's word count of the
    system prompt, the user messages so far and k earlier answers of 7 words each."""
    mp = mock_engine("--output-tokens", "7")
    out = tmp_path / "s"
    r = bench(
        "--url",
        mp.base_url,
        "--sessions",
        "3",
        "--turns",
        "4",
        "--concurrency",
        "1,3",
        "--set",
        "first_tokens=60",
        "--set",
        "turn_tokens=12",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert [s["step"] for s in summary["steps"]] == ["c1", "c3"] and summary["complete"]
    assert len(lines) == 24 and not any(x["warmup"] for x in lines)
    assert sorted(x["id"] for x in lines) == list(range(24))
    for s in summary["steps"]:
        assert s["counts"]["submitted"] == s["counts"]["succeeded"] == 12
        x = s["sessions"]
        assert x["sessions"] == x["sessions_ok"] == 3 and x["session_success"] == 1.0
        assert [t["n"] for t in x["turns"]] == [3, 3, 3, 3]
        means = [t["prompt_tokens_mean"] for t in x["turns"]]
        # each later turn adds one answer (7 words) and one follow-up (~12 tokens of words)
        assert all(b - a >= 7 for a, b in zip(means, means[1:], strict=False)), means
        assert all(t["cached_share"] is None for t in x["turns"])  # the mock reports no cached tokens
    assert "sessions 3/3 succeeded" in r.stdout


def test_sessions_from_a_file(mock_engine, tmp_path: Path) -> None:
    mp = mock_engine("--output-tokens", "3")
    f = tmp_path / "sg.json"
    f.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "one two"},
                        {"from": "gpt", "value": "x"},
                        {"from": "human", "value": "three four five"},
                    ]
                }
            ]
        )
    )
    out = tmp_path / "f"
    r = bench(
        "--url", mp.base_url, "--sessions-file", str(f), "--sessions", "2", "--concurrency", "2", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    x = summary["steps"][0]["sessions"]
    assert x["sessions"] == 2 and x["source"] == str(f) and len(lines) == 4
    # turn 1 = "one two" + the 3-word answer + "three four five"
    assert sorted(t["prompt_tokens_mean"] for t in x["turns"]) == [2, 8]


def _trace(tmp_path: Path, fmt: str, t_ms: list[int]) -> Path:
    if fmt == "mooncake":
        p = tmp_path / "t.jsonl"
        p.write_text(
            "".join(
                json.dumps({"timestamp": t, "input_length": 1100, "output_length": 3, "hash_ids": [0, 1, 2 + k]}) + "\n"
                for k, t in enumerate(t_ms)
            )
        )
    elif fmt == "azure":
        p = tmp_path / "t.csv"
        p.write_text(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n"
            + "".join(f"2023-11-16 18:15:{t / 1000:09.6f},40,3\n" for t in t_ms)
        )
    else:
        p = tmp_path / "t.csv"
        p.write_text(
            "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
            + "".join(f"{t / 1000},ChatGPT,40,{0 if k == 1 else 3},43,API log\n" for k, t in enumerate(t_ms))
        )
    return p


@pytest.mark.parametrize("fmt", ["mooncake", "azure", "burstgpt"])
def test_trace_replay(mock_engine, tmp_path: Path, fmt: str) -> None:
    """Every row replayed once in one open-loop step at the trace's times (speed 2, a window), schedule lag
    reported; BurstGPT's failed row (0 response tokens) is skipped and counted."""
    t_ms = [0, 40, 80, 80, 120, 200, 260, 300, 400, 420, 2000]  # the last one is outside the window
    p = _trace(tmp_path, fmt, t_ms)
    mp = mock_engine("--ttft-ms", "0", "--itl-ms", "0")
    out = tmp_path / "r"
    r = bench("--url", mp.base_url, "--trace", str(p), "--trace-speed", "2", "--trace-window", "0:1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    assert len(summary["steps"]) == 1
    s = summary["steps"][0]
    expect = 9 if fmt == "burstgpt" else 10
    assert s["counts"]["submitted"] == s["counts"]["succeeded"] == expect == len(lines)
    rp = s["replay"]
    assert rp["format"] == fmt and rp["speed"] == 2 and rp["window_s"] == [0, 1] and rp["requests"] == expect
    assert rp["skipped"]["outside the time window"] == 1
    assert (rp["skipped"].get("failed in the original service (0 response tokens)") == 1) == (fmt == "burstgpt")
    assert s["load"]["kind"] == "open" and s["load"]["arrival"] == "trace"
    assert abs(rp["duration_s"] - 0.21) < 1e-6  # 420 ms of trace at speed 2 (Azure: wall times as floats)
    assert rp["schedule_lag_p99_s"] is not None and s["schedule_lag_s"]["count"] == expect
    assert rp["schedule_lag_p99_s"] < 0.05  # the exact 1 ms bound is tested in test_traces (with retries)
    sched = sorted(x["t_ns"]["scheduled"] for x in lines)
    kept = [t for t in t_ms if t < 1000 and not (fmt == "burstgpt" and t == 40)]
    assert [round((t - sched[0]) / 1e6) for t in sched] == [round((t - kept[0]) / 2) for t in kept]
    if fmt == "mooncake":  # requests 2.. share blocks 0 and 1 (1024 tokens) with request 1
        assert rp["shared_prefix_tokens"] == 1024 * (expect - 1)
    assert "replayed" in r.stdout


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("none", None),
        ("json", "tool_args_invalid_json"),
        ("schema", "tool_args_schema_mismatch"),
        ("name", "tool_call_unknown_name"),
    ],
)
def test_agent_loop(mock_engine, tmp_path: Path, bad: str, reason: str | None) -> None:
    """4 loops of 3 tool steps + the final answer: with good calls every loop completes (16 requests, the
    last of each loop ends with a tool message); each bad-call kind is caught at step 0 and ends its loop."""
    mp = mock_engine("--output-tokens", "5", "--bad-tool-call", bad)
    out = tmp_path / "a"
    r = bench(
        "--url", mp.base_url, "-w", "agent", "-n", "4", "--concurrency", "2", "--set", "tool_steps=3", "--out", str(out)
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    a = summary["steps"][0]["agent"]
    assert a["loops"] == 4 and a["tool_steps"] == 3
    if reason is None:
        assert a["loops_completed"] == 4 and len(lines) == 16
        assert [(t["step"], t["n"], t["valid"], t["tool_calls"]) for t in a["steps"]] == [
            (0, 4, 4, 4),
            (1, 4, 4, 4),
            (2, 4, 4, 4),
            (3, 4, 4, 0),
        ]  # the final step answers in text
        final = [x for x in lines if not x.get("tool_calls")]
        assert len(final) == 4 and all(x["text"] for x in final)
    else:
        assert a["loops_completed"] == 0 and len(lines) == 4
        assert a["steps"] == [
            {
                "step": 0,
                "n": 4,
                "valid": 0,
                "tool_calls": 4,
                "invalid": {reason: 4},
                "e2e_p50_s": a["steps"][0]["e2e_p50_s"],
            }
        ]
        assert all(reason in x["gate_failures"] for x in lines)


def test_mixed_lang_exact_lengths_and_tokens_per_char(mock_engine, tmp_path: Path) -> None:
    gguf = _default_model_path()
    counter = load_tokenizer(gguf)
    mp = mock_engine("--output-tokens", "4")
    out = tmp_path / "m"
    r = bench(
        "--url",
        mp.base_url,
        "-w",
        "mixed-lang",
        "-n",
        "6",
        "--concurrency",
        "2",
        "--warmup",
        "0",
        "--tokenizer",
        gguf,
        "--set",
        "input_tokens=100-400",
        "--endpoint",
        "completions",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    summary, lines = load(out)
    lang = summary["steps"][0]["language"]
    assert "zh_CN gettext catalogs" in lang["source"] and lang["tokenizer"] == counter.name
    targets = [x["prompt_tokens_target"] for x in lines]
    assert len(lines) == 6 and all(100 <= t <= 400 for t in targets)
    assert lang["tokens"] == sum(targets)
    assert lang["tokens_per_char"] == pytest.approx(sum(targets) / lang["characters"])
    assert 0.15 < lang["han_share"] < 0.6  # mixed: Chinese and English both present
    # servelab summarize keeps the workload's own block (not computable from requests.jsonl) and says so
    rb = subprocess.run([*SERVELAB, "summarize", "--quiet", str(out)], capture_output=True, text=True, timeout=120)
    assert rb.returncode == 0, rb.stderr
    rebuilt, _ = load(out)
    assert rebuilt["steps"][0]["language"] == lang
    assert "language" in rebuilt["rebuilt"]["kept_from_summary"]


@pytest.mark.parametrize(
    ("args", "msg"),
    [
        (["--trace", "/nonexistent/t.jsonl"], "no such file"),
        (["--trace", "{csv}", "--trace-format", "mooncake"], "not JSON"),
        (["--trace", "{csv}", "--trace-window", "5:2"], "--trace-window '5:2'"),
        (["--trace", "{csv}", "--trace-window", "x"], "START:END"),
        (["--trace", "{csv}", "--trace-speed", "0"], "--trace-speed 0"),
        (["--trace", "{csv}", "--rate", "3"], "leave out --rate"),
        (["--trace-speed", "2"], "add --trace FILE"),
        (["--sessions", "0"], "--sessions 0"),
        (["--sessions", "2", "--think-time-s", "-1"], "--think-time-s -1"),
        (["--sessions-file", "/nonexistent/s.json"], "no such file"),
        (["--sessions", "2", "--workers", "2"], "one process"),
        (["--batch-size", "8"], "add --endpoint embeddings"),
        (["--endpoint", "embeddings", "--batch-size", "0"], "--batch-size 0"),
        (["-w", "agent", "--set", "tool_steps=99"], "tool_steps=99"),
        (["-w", "agent", "--endpoint", "completions"], "use --endpoint chat"),
        (["--rag-top-k", "3"], "add -w rag-docs"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], msg: str) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,10,2\n")
    r = bench(
        "--url",
        "http://127.0.0.1:9/v1",
        *[a.replace("{csv}", str(csv)) for a in args],
        "--out",
        str(tmp_path / "o"),
        timeout=60,
    )
    assert r.returncode == 2, (r.returncode, r.stderr)
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and msg in err[0] and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "o").exists()  # refused before any run directory is made
