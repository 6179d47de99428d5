"""Issue 9, defect 9: ``servelab bench`` under a hostile operator — the real CLI (``.venv/bin/servelab``)
against the project's mock engine.

- every bad value is refused with one line on stderr, a non-zero exit and no traceback (it used to
  be accepted with exit 0, or to print a traceback, or to hang for ``--set input_tokens=100000000``),
  prompts longer than the real llama-server's context included;
- SIGTERM stops a run like SIGINT (partial summary, exit 128 + 15) instead of dying with nothing;
- after SIGTERM or kill -9, ``requests.jsonl`` is intact and ``servelab summarize DIR`` rebuilds a
  summary whose request count equals its lines, with the bench's own summary code;
- the value parsers never raise anything but ConfigError (hypothesis, in-process).
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from servelab.bench.analysis.slo import parse_slo
from servelab.bench.cli import _overrides
from servelab.bench.load.config import BenchConfig
from servelab.bench.load.step import arrival_offsets_s
from servelab.bench.options import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, split_list
from servelab.bench.workloads.lengths import parse_length
from servelab.bench.workloads.registry import parse_ratio
from servelab.wire.client import ConfigError

SERVELAB = str(Path(sys.executable).parent / "servelab")


def run(*args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SERVELAB, *args], capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> None:
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-2000:])
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr[-2000:]
    err = r.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("servelab: error: "), err
    assert needle in err, err


def lines_of(path: Path) -> tuple[list[dict], bool]:
    """Parsed lines of requests.jsonl; fails on any damaged line but a last one without newline."""
    raw = path.read_bytes()
    parts = raw.split(b"\n")
    out, cut = [], False
    for i, p in enumerate(parts):
        if not p.strip():
            continue
        try:
            out.append(json.loads(p))
        except ValueError:
            assert i == len(parts) - 1, f"line {i + 1} of {len(parts)} is damaged"
            cut = True
    return out, cut


def bad_value_cases(tmp: Path) -> list[tuple[list[str], str]]:
    afile = tmp / "a-file"
    afile.write_text("x")
    old_run = tmp / "old-run"
    old_run.mkdir()
    (old_run / "requests.jsonl").write_text("")
    deep = tmp / "deep.jsonl"
    deep.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    deep300 = tmp / "deep300.jsonl"
    deep300.write_text('{"messages": [{"role": "user", "content": ' + "[" * 300 + "]" * 300 + "}]}\n")
    bigint = tmp / "bigint.jsonl"
    bigint.write_text('{"messages": [{"role": "user", "content": "hi", "n": 123456789012345678901234567890}]}\n')
    big_max = tmp / "big-max-tokens.jsonl"  # item 7: a max_tokens past 2^64 reached the JSON encoder (traceback)
    big_max.write_text('{"prompt": "x", "max_tokens": 1234567890123456789012345678901}\n')
    return [
        # item 7 of the second attack: each of these exited 0 or printed a traceback
        (["--dataset", str(big_max)], f"from 1 to {MAX_OUTPUT_TOKENS}"),
        (["--rate", "1e-300"], "--rate '1e-300': input should be greater than or equal to 0.001"),
        (["--rate", "1e7"], "--rate '1e7': input should be less than or equal to 1000000"),
        (["--rate", "1", "--arrival", "gamma", "--burstiness", "1e-300"], "greater than or equal to 0.01"),
        (["--rate", "1", "--arrival", "gamma", "--burstiness", "1000"], "less than or equal to 100"),
        (["--rate", "0.01", "--duration", "10"], "less than one per step"),
        (["--rate", "0.001", "-n", "1000000"], "more than 604800 s"),
        (["--concurrency", "1,,2"], "--concurrency '1,,2': item 2 of 3 is empty"),
        (["--concurrency", ","], "--concurrency ',': no values given"),
        (["--rate", "1,,2"], "--rate '1,,2': item 2 of 3 is empty"),
        (["--rate", ""], "--rate '': no values given"),
        (["-c", "1", "--slo", ","], "SLO ',': no values given"),
        (["-c", "1", "--slo", "ttft_p95<=1s,"], "item 2 of 2 is empty"),
        (["-c", "1", "--slo", ""], "--slo ''"),
        (["-c", "1", "-w", ""], "--workload '': no values given"),
        (["-c", "1", "-w", "short-qa,,rag"], "item 2 of 3 is empty"),
        (["-c", "1", "-w", "mix", "--set", "ratio=short-qa:1,,rag:1"], "--set ratio 'short-qa:1,,rag:1': item 2"),
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "-1"], "--timeout"),
        (["--max-concurrency", "0", "--rate", "5"], "--max-concurrency"),
        (["--max-concurrency", "2"], "open loop"),
        (["--warmup", "-1"], "--warmup"),
        (["--slo", "error_rate<=200%"], "at most 100%"),
        (["--slo", "error_rate<=250"], "at most 100%"),
        (["--slo", "ttft_p95<=0ms"], "> 0"),
        (["--slo", "e2e_p99<=1.2.3s"], "not a number"),
        (["--rate", "5", "--arrival", "gamma", "--burstiness", "0"], "--burstiness"),
        (["--burstiness", "2"], "--arrival gamma"),
        (["--rate", "nan"], "--rate"),
        (["--rate", "1", "--concurrency", "4"], "not both"),
        (["--concurrency", "0"], "--concurrency"),
        (["--requests", "0"], "--requests"),
        (["--requests", "100000000000"], "--requests"),
        (["--duration", "nan"], "--duration"),
        (["--rate", "1000000", "--duration", "600"], "arrivals"),
        (["--seed", "-1"], "--seed"),
        (["--engine-parallel", "8"], "only apply with --engine"),
        (["--out", str(afile)], "existing file"),
        (["--out", str(afile / "sub")], "cannot create"),
        (["--out", "/proc/servelab-cannot-write-here"], "cannot create"),
        (["--out", str(old_run)], "already holds a run"),
        (["--dataset", str(deep)], "nested too deeply"),
        (["--dataset", str(deep300)], "cannot be sent as JSON"),
        (["--dataset", str(bigint)], "cannot be sent as JSON"),
        (["--set", "input_tokens=100000000"], f"at most {MAX_PROMPT_TOKENS} tokens"),
        (["--set", "output_tokens=100000000"], "at most"),
        (["--set", "input_tokens=nan"], "input_tokens"),
        (["--set", "input_tokens=normal:nan,3"], "input_tokens"),
        (["--workload", "mix", "--set", "ratio=short-qa:100000000000"], "ratio"),
        (["--set", "extra=" + "[" * 50_000 + "]" * 50_000], "nested too deeply"),
        (["--set", 'extra={"a": ' + "[" * 300 + "]" * 300 + "}"], "cannot be sent as JSON"),
        (["--workload", "shared-prefix", "--set", "prefix_tokens=100000000"], "at most"),
    ]


# Runs each command line through servelab.cli.main in ONE child process (a console-script start per case
# costs ~0.5 s of CPU); each case's fd 1 and fd 2 go to files of their own, so anything written to them,
# by any object, is in that case's output; an exception that escapes main is printed as its traceback.
_MANY = r"""
import json, os, sys, tempfile, traceback
from servelab.cli import main
keep_out, keep_err = os.dup(1), os.dup(2)
for args in json.load(sys.stdin):
    with tempfile.TemporaryFile() as o, tempfile.TemporaryFile() as e:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(o.fileno(), 1); os.dup2(e.fileno(), 2)
        rc = 0
        try:
            main(args)
        except SystemExit as x:
            if isinstance(x.code, int):
                rc = x.code
            elif x.code is not None:
                print(x.code, file=sys.stderr); rc = 1
        except BaseException:
            traceback.print_exc(); rc = 1
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(keep_out, 1); os.dup2(keep_err, 2)
        o.seek(0); e.seek(0)
        got = {"rc": rc, "out": o.read().decode(errors="replace"), "err": e.read().decode(errors="replace")}
    print(json.dumps(got), flush=True)
"""


def run_many(arg_lists: list[list[str]], timeout: float) -> list[subprocess.CompletedProcess[str]]:
    """Each command line through :func:`servelab.cli.main` in one child (as :data:`_MANY`), in order."""
    r = subprocess.run(
        [sys.executable, "-c", _MANY], input=json.dumps(arg_lists), capture_output=True, text=True, timeout=timeout
    )
    got = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and len(got) == len(arg_lists), (r.returncode, len(got), r.stderr[-3000:])
    return [subprocess.CompletedProcess(a, g["rc"], g["out"], g["err"]) for a, g in zip(arg_lists, got, strict=True)]


def test_bad_values_one_line(mock_engine, tmp_path):
    """Each value was accepted with exit 0, or gave a traceback, or hung (input_tokens=1e8). The first
    case runs through the real console script; the others through ``servelab.cli.main`` in one child."""
    m = mock_engine("--output-tokens", "4")
    cases = bad_value_cases(tmp_path)

    def argv(i: int) -> list[str]:
        args = cases[i][0]
        out = ["--out", str(tmp_path / f"run{i}")] if "--out" not in args else []
        n = [] if "--duration" in args else ["-n", "2"]
        return ["bench", "--quiet", "--url", m.base_url, *n, "--warmup", "0", *out, *args]

    results = [run(*argv(0), timeout=60), *run_many([argv(i) for i in range(1, len(cases))], timeout=180)]
    failures = []
    for i, r in enumerate(results):
        args, needle = cases[i]
        try:
            assert_one_line_error(r, needle)
            assert not (tmp_path / f"run{i}" / "requests.jsonl").exists()  # nothing was sent
        except AssertionError as e:
            failures.append(f"{' '.join(args)[:60]}: {str(e)[:300]}")
    assert not failures, "\n".join(failures)


def test_engine_values_checked_before_start(tmp_path):
    r = run("bench", "--quiet", "--engine", "llamacpp", "--engine-parallel", "0", "--out", str(tmp_path / "r"))
    assert_one_line_error(r, "--engine-parallel")
    r = run("bench", "--quiet", "--engine", "llamacpp", "--engine-ctx", "-5", "--out", str(tmp_path / "r"))
    assert_one_line_error(r, "--engine-ctx")


def test_long_prompts_show_progress(mock_engine, tmp_path):
    """Building very long prompts is reported instead of looking like a hang."""
    m = mock_engine("--output-tokens", "2")
    r = run(
        "bench",
        "--quiet",
        "--url",
        m.base_url,
        "-n",
        "16",
        "-c",
        "4",
        "--warmup",
        "0",
        "--set",
        "input_tokens=400000",
        "--out",
        str(tmp_path / "r"),
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "building prompts for short-qa c4: 16 requests" in r.stderr, r.stderr


def _start(m, out: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            SERVELAB,
            "bench",
            "--quiet",
            "--url",
            m.base_url,
            "--concurrency",
            "2",
            "--requests",
            "500",
            "--warmup",
            "0",
            "--out",
            str(out),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_lines(out: Path, n: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    f = out / "requests.jsonl"
    while time.monotonic() < deadline:
        if f.exists() and f.read_bytes().count(b"\n") >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} lines in {f} after {timeout_s} s")


def _summarize_and_check(out: Path, lines: list[dict], truncated: bool) -> dict:
    r = run("summarize", "--quiet", str(out))
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and f"from {len(lines)} requests" in r.stdout, r.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rebuilt"]["lines"] == len(lines)
    assert summary["rebuilt"]["truncated_last_line"] is truncated
    assert summary["complete"] is False and summary["rebuilt"]["partial"] is True
    step = summary["steps"][0]
    assert step["partial"] is True and step["slo_met"] is False
    c = step["counts"]
    assert c["submitted"] == len(lines) == c["succeeded"] + c["failed_total"]
    assert c["succeeded"] == sum(1 for x in lines if x["failure"] is None)
    return summary


def test_sigterm_like_sigint(mock_engine, tmp_path):
    """SIGTERM used to end the run at once (exit -15, no summary of the interrupted step)."""
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "20", "--output-tokens", "10")
    out = tmp_path / "run"
    p = _start(m, out)
    _wait_lines(out, 8)
    p.send_signal(signal.SIGTERM)
    so, se = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGTERM, (p.returncode, se)
    assert "Traceback" not in se and "stopped by SIGTERM" in se, se
    summary = json.loads((out / "summary.json").read_text())
    assert summary["complete"] is False and summary["stopped_by"] == "SIGTERM"
    step = summary["steps"][0]
    assert step["partial"] is True and step["counts"]["succeeded"] >= 8
    lines, cut = lines_of(out / "requests.jsonl")
    assert not cut and step["counts"]["submitted"] == len(lines)
    _summarize_and_check(out, lines, truncated=False)


def test_sigterm_stops_the_engine_it_started(tmp_path):
    """With --engine, SIGTERM used to end the bench with -15 and no summary; now it stops like SIGINT
    and still stops the engine it started."""
    import psutil

    out = tmp_path / "run"
    p = subprocess.Popen(
        [SERVELAB, "bench", "--quiet", "--engine", "mock", "-c", "2", "-n", "5000", "--warmup", "0", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_lines(out, 5)
        children = psutil.Process(p.pid).children(recursive=True)
        assert children, "no engine process"
        p.send_signal(signal.SIGTERM)
        so, se = p.communicate(timeout=60)
        assert p.returncode == 143 and "Traceback" not in se, se
        gone, alive = psutil.wait_procs(children, timeout=15)
        assert not alive, [c.pid for c in alive]
        assert json.loads((out / "summary.json").read_text())["stopped_by"] == "SIGTERM"
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()


def test_kill_9_then_summarize(mock_engine, tmp_path):
    """After kill -9 there was no summary of the run and no command to rebuild one."""
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "20", "--output-tokens", "10")
    out = tmp_path / "run"
    p = _start(m, out)
    _wait_lines(out, 8)
    p.kill()
    p.communicate(timeout=30)
    assert p.returncode == -signal.SIGKILL
    before = json.loads((out / "summary.json").read_text())
    assert before["steps"] == []  # the bench's own summary saw no finished step
    lines, cut = lines_of(out / "requests.jsonl")
    assert len(lines) >= 8
    _summarize_and_check(out, lines, truncated=cut)
    # a crash mid-write leaves half a line: it is ignored and reported, nothing else changes
    with open(out / "requests.jsonl", "ab") as f:
        f.write(b'{"id": 9999, "step": "c2", "workl')
    summary = _summarize_and_check(out, lines, truncated=True)
    assert "cut short" in run("summarize", "-q", str(out)).stdout
    assert summary["steps"][0]["counts"]["submitted"] == len(lines)


def test_summarize_rebuilds_what_the_bench_wrote(mock_engine, tmp_path):
    """One summary code path: a rebuilt summary of a complete run has the bench's numbers."""
    m = mock_engine("--ttft-ms", "30", "--itl-ms", "2", "--output-tokens", "6")
    out = tmp_path / "run"
    r = run(
        "bench",
        "--quiet",
        "--url",
        m.base_url,
        "-w",
        "short-qa,structured",
        "-c",
        "1,2,4",
        "-n",
        "4",
        "--warmup",
        "1",
        "--slo",
        "ttft_p95<=10ms,error_rate<=5%",
        "--out",
        str(out),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    orig = json.loads((out / "summary.json").read_text())
    assert [s["skipped"] for s in orig["steps"]] == [False, True, True, False, True, True]
    r = run("summarize", str(out))
    assert r.returncode == 0 and "run complete" in r.stdout, r.stdout + r.stderr
    new = json.loads((out / "summary.json").read_text())
    assert new["complete"] is True and new["rebuilt"]["partial"] is False and new["slo"] == orig["slo"]
    assert len(new["steps"]) == len(orig["steps"])
    for a, b in zip(orig["steps"], new["steps"], strict=True):
        for k in a:
            if k in ("itl_s", "itl_chunk_s", "output_tps_per_user", "tpot_s"):
                continue  # chunk times are stored to the microsecond: equal to 1e-6 s, checked below
            assert a[k] == b[k], (a["workload"], a["step"], k)
        if not a["skipped"]:
            assert a["itl_chunk_s"]["count"] == b["itl_chunk_s"]["count"]
            assert math.isclose(a["itl_chunk_s"]["mean"], b["itl_chunk_s"]["mean"], abs_tol=2e-6)


def test_summarize_bad_input_one_line(tmp_path, mock_engine):
    assert_one_line_error(run("summarize", str(tmp_path / "nope")), "not a directory")
    assert_one_line_error(run("summarize", str(tmp_path)), "config.json")
    m = mock_engine("--output-tokens", "3")
    out = tmp_path / "run"
    assert (
        run("bench", "-q", "--url", m.base_url, "-n", "3", "-c", "1", "--warmup", "0", "--out", str(out)).returncode
        == 0
    )
    raw = (out / "requests.jsonl").read_bytes().split(b"\n")
    raw[1] = raw[1][:20]  # damage a line that is not the last
    (out / "requests.jsonl").write_bytes(b"\n".join(raw))
    assert_one_line_error(run("summarize", str(out)), "line 2")


# ---------------------------------------------------------------------------------------------------
# The value parsers, in-process: nothing but a valid value or a ConfigError, ever.

_slo_text = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda m, s, op, v, u: f"{m}{s}{op}{v}{u}",
        st.sampled_from(["ttft", "e2e", "itl", "tpot", "ttfat", "schedule_lag", "error_rate", "x"]),
        st.sampled_from(["", "_p50", "_p95", "_p99", "_max", "_mean", "_p7"]),
        st.sampled_from(["<=", "<", "="]),
        st.one_of(st.floats(allow_nan=True, allow_infinity=True).map(str), st.text("0123456789.", max_size=8)),
        st.sampled_from(["", "ms", "s", "%", "h"]),
    ),
)


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(_slo_text, max_size=3).map(",".join))
def test_parse_slo_never_crashes(text):
    try:
        objs = parse_slo(text)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    for o in objs:
        if o.metric == "error_rate":
            assert 0 <= o.limit <= 1
        else:
            assert 0 < o.limit <= 7 * 86400 and math.isfinite(o.limit)


_length = st.one_of(
    st.integers(-10, 2 * MAX_PROMPT_TOKENS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.tuples(st.integers(-5, 2 * MAX_PROMPT_TOKENS), st.integers(-5, 99)),
    st.builds(lambda a, b: f"normal:{a},{b}", st.floats(), st.floats()),
    st.builds(lambda a, b: f"{a}-{b}", st.integers(-3, 2 * MAX_PROMPT_TOKENS), st.integers(-3, 10**7)),
)


@settings(max_examples=examples(400), deadline=None)
@given(_length)
def test_parse_length_never_crashes(value):
    import random

    try:
        sample = parse_length(value, "input_tokens")
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    n = sample(random.Random(0))
    assert 1 <= n <= MAX_PROMPT_TOKENS


_number = st.one_of(st.integers(-(10**20), 10**20), st.floats(allow_nan=True, allow_infinity=True), st.none())


@settings(max_examples=examples(300), deadline=None)
@given(
    timeout=_number,
    warmup=_number,
    max_conc=_number,
    gamma=_number,
    requests=_number,
    duration=_number,
    seed=_number,
    conc=st.text("0123456789,-x", max_size=8),
    rate=st.text("0123456789.,-naif", max_size=8),
    ratio=st.text("short-qa:0123456789,rag", max_size=20),
    sets=st.lists(st.text(max_size=12), max_size=2),
)
def test_bench_values_never_crash(timeout, warmup, max_conc, gamma, requests, duration, seed, conc, rate, ratio, sets):
    try:
        values = dict(
            timeout_s=timeout,
            warmup=warmup,
            max_concurrency=max_conc,
            gamma_shape=gamma,
            requests=requests,
            duration_s=duration,
            seed=seed,
            concurrency=conc,
            rates_rps=rate or None,
        )
        values = {k: v for k, v in values.items() if v is not None or k in ("max_concurrency", "requests")}
        cfg = BenchConfig.checked(base_url="http://127.0.0.1:1/v1", **values)
        _overrides(sets)
        parse_ratio(ratio)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert cfg.timeout_s > 0 and math.isfinite(cfg.timeout_s) and cfg.warmup >= 0 and cfg.gamma_shape > 0
    assert cfg.max_concurrency is None or cfg.max_concurrency >= 1
    assert cfg.requests is not None or cfg.duration_s is not None
    assert cfg.concurrency and all(c >= 1 for c in cfg.concurrency)
    assert all(1e-3 <= r <= 1e6 for r in cfg.rates_rps or []) and 0.01 <= cfg.gamma_shape <= 100
    for r in cfg.rates_rps or []:  # every accepted rate and shape gives a usable arrival clock
        n = (cfg.requests or 0) + cfg.warmup
        if n and n / r <= 7 * 86400:
            offs = arrival_offsets_s(n, r, "gamma", cfg.seed, cfg.gamma_shape)
            assert np.isfinite(offs).all() and (offs * 1e9 < 2**63).all()


_list_text = st.one_of(
    st.text(max_size=12),
    st.text(" ,0123456789.-eEnaif", max_size=12),
    st.lists(st.sampled_from(["", " ", "1", "2.5", "-1", "1e-300", "1e400", "nan", "x", "0"]), max_size=4).map(
        ",".join
    ),
)


@settings(max_examples=examples(500), deadline=None)
@given(_list_text)
def test_every_list_option_refuses_empty_items(text):
    """Item 7: ``--concurrency 1,,2``, ``--slo ','`` and ``-w ''`` ran with the empty items dropped
    (exit 0). Every comma-list option now parses through split_list: a value without an empty item, or
    one ConfigError line."""
    items = [x.strip() for x in text.split(",")]
    has_empty = not all(items)
    for flag, parse in (
        ("--concurrency", lambda t: BenchConfig.checked(base_url="http://h/v1", concurrency=t)),
        ("--rate", lambda t: BenchConfig.checked(base_url="http://h/v1", rates_rps=t)),
        ("--workload", lambda t: BenchConfig.checked(base_url="http://h/v1", workloads=t)),
        ("SLO", parse_slo),
        ("--set ratio", parse_ratio),
    ):
        if flag == "SLO" and text == "":
            continue  # an experiment's slo: "" means none; servelab bench --slo '' is refused by BenchConfig
        try:
            got = parse(text)
        except ConfigError as e:
            assert "\n" not in str(e) and str(e), flag
            continue
        assert not has_empty, (flag, text, got)
    if has_empty:
        with pytest.raises(ConfigError, match="empty|no values"):
            split_list(text, "--x")


@settings(max_examples=examples(300), deadline=None)
@given(
    n=st.integers(0, 2000),
    rate=st.floats(allow_nan=True, allow_infinity=True),
    shape=st.floats(allow_nan=True, allow_infinity=True),
    arrival=st.sampled_from(["constant", "poisson", "gamma"]),
)
def test_arrival_clock_is_finite_or_refused(n, rate, shape, arrival):
    """Item 7: --rate 1e-300 overflowed the clock (numpy warnings), then sent every request at once
    while summary.json said 1e-300 req/s. The generator itself now refuses what it cannot schedule."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow warning is a failure too
        try:
            offs = arrival_offsets_s(n, rate, arrival, 0, shape)
        except ValueError as e:
            assert "\n" not in str(e)
            return
    assert len(offs) == n and np.isfinite(offs).all() and (np.diff(offs) >= 0).all()
    assert n == 0 or (offs[0] == 0 and offs[-1] * 1e9 < 2**63)


def test_arrival_clock_refuses_overflow():
    with pytest.raises(ValueError, match="past the"):
        arrival_offsets_s(4, 1e-300, "constant", 0)
    with pytest.raises(ValueError, match="gamma_shape"):
        arrival_offsets_s(4, 1.0, "gamma", 0, float("nan"))


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(st.integers(-10, 2**70), st.booleans(), st.floats(allow_nan=True), st.text(max_size=5), st.none()))
def test_dataset_max_tokens_bounded(value):
    from servelab.bench.options import dataset_max_tokens

    try:
        got = dataset_max_tokens(value, "dataset d.jsonl: line 1")
    except ConfigError as e:
        assert str(e).startswith("dataset d.jsonl: line 1: ") and "\n" not in str(e)
        return
    assert type(got) is int and 1 <= got <= MAX_OUTPUT_TOKENS


def test_help_documents_exit_codes():
    """The stop signals and their exit codes are part of --help (documented, not guessed)."""
    r = run("bench", "--help")
    assert r.returncode == 0 and "143" in r.stdout and "SIGTERM" in r.stdout


def test_prompts_longer_than_the_servers_context_are_refused(tmp_path):
    """llama-server reports its context per slot (/props); prompts that cannot fit used to be sent
    anyway, every request failing with HTTP 400 and the run exiting 0."""
    from servelab.engines.llamacpp import find_llama_server

    if find_llama_server() is None:
        pytest.skip("llama-server not built (servelab engine build llamacpp)")
    r = run(
        "bench",
        "--quiet",
        "--engine",
        "llamacpp",
        "--engine-ctx",
        "1024",
        "--engine-parallel",
        "2",
        "-n",
        "2",
        "-c",
        "1",
        "--warmup",
        "0",
        "--set",
        "input_tokens=600",
        "--out",
        str(tmp_path / "r"),
        timeout=300,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    err = r.stderr.strip().splitlines()[-1]
    assert "600 tokens" in err and "512 tokens per request" in err, err
    assert not (tmp_path / "r" / "requests.jsonl").exists()


_override_value = st.one_of(
    st.integers(-5, 3 * 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=16),
    st.sampled_from(["1-5", "normal:8,2", "en", "zh", "{}", "[1]", "short-qa:1,rag:2", "inf", "1e400"]),
)


@settings(max_examples=examples(300), deadline=None)
@given(
    st.sampled_from(["short-qa", "rag", "long-gen", "structured", "mix", "shared-prefix"]),
    st.dictionaries(
        st.sampled_from(
            [
                "input_tokens",
                "output_tokens",
                "ratio",
                "prefix_tokens",
                "num_prefixes",
                "suffix_tokens",
                "lang",
                "extra",
                "bogus",
            ]
        ),
        _override_value,
        max_size=3,
    ),
)
def test_workload_overrides_never_crash(name, overrides):
    """``--set KEY=VALUE`` for any key and value: a workload or one ConfigError line, never a traceback."""
    from servelab.bench.workloads.registry import make_workload

    try:
        wl = make_workload(name, None, **overrides)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert wl.max_input_tokens is None or 1 <= wl.max_input_tokens <= MAX_PROMPT_TOKENS
    if (wl.max_input_tokens or 0) <= 4096:
        spec = wl.request(0)
        assert 1 <= spec.max_tokens <= MAX_PROMPT_TOKENS
