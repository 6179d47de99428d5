"""Client-side OpenTelemetry spans of ``servelab bench --otlp-endpoint`` (servelab.bench.tracing; issue 24
item 2): a real ``servelab bench`` process against the mock engine exports to the OTLP receiver of
tests/otlp_receiver.py, which decodes the protobuf; the spans are checked against the run's own
``requests.jsonl`` and against the ``traceparent`` the mock engine recorded for each request."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import MockProcess, start_mock_process, stop_mock_process

from servelab.bench.load.config import BenchConfig
from servelab.bench.tracing import TraceIds
from servelab.wire.client import ConfigError
from servelab.wire.otel import ratio_sampled, traceparent

SECRET = "zebra-quasar-7731"  # in every prompt: must appear in no export


@pytest.mark.parametrize(
    ("values", "needle"),
    [
        ({"otlp_endpoint": "ftp://collector"}, "--otlp-endpoint 'ftp://collector': not an http(s) URL"),
        ({"otlp_endpoint": ""}, "--otlp-endpoint '': not an http(s) URL"),
        ({"otlp_endpoint": "http://h:4318/v1/traces", "otlp_sample_ratio": 1.5}, "--otlp-sample-ratio 1.5"),
        ({"otlp_endpoint": "http://h:4318/v1/traces", "otlp_sample_ratio": -0.1}, "--otlp-sample-ratio -0.1"),
        ({"otlp_endpoint": "http://h:4318/v1/traces", "otlp_sample_ratio": float("nan")}, "finite"),
        ({"otlp_sample_ratio": 0.5}, "add --otlp-endpoint URL"),
        ({"otlp_endpoint": "http://h:4318/v1/traces", "ray": "auto"}, "not yet trace those of --ray workers"),
    ],
)
def test_bad_otlp_options_are_one_line(values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError) as e:
        BenchConfig.checked(base_url="http://127.0.0.1:1", **values)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_otlp_options_default_off_and_accept_a_ratio() -> None:
    off = BenchConfig.checked(base_url="http://127.0.0.1:1")
    assert off.otlp_endpoint is None and off.otlp_sample_ratio is None
    on = BenchConfig.checked(base_url="http://x", otlp_endpoint=" http://h:4318/v1/traces ", otlp_sample_ratio=0)
    assert on.otlp_endpoint == "http://h:4318/v1/traces" and on.otlp_sample_ratio == 0


def test_trace_ids_are_stable_per_request_and_sampled_as_the_sdk_samples() -> None:
    sampling = pytest.importorskip("opentelemetry.sdk.trace.sampling")
    ids = TraceIds(0.3)
    assert ids.ids(7) == ids.ids(7) and ids.ids(7) != ids.ids(8)
    assert TraceIds(0.3).ids(7) != ids.ids(7)  # a new run, a new nonce
    sdk = sampling.TraceIdRatioBased(0.3)
    got = [ids.ids(i) for i in range(2000)]
    for trace_id, _, sampled in got:
        assert sampled == sdk.should_sample(None, trace_id, "x").decision.is_sampled()
    share = sum(s for *_, s in got) / len(got)
    assert 0.25 < share < 0.35, share  # 2000 draws at 0.3: sd 0.01
    t, s, sampled = got[0]
    assert ids.header(0) == traceparent(t, s, sampled) == f"00-{t:032x}-{s:016x}-{'01' if sampled else '00'}"
    assert ratio_sampled(t, 1.0) and not ratio_sampled(t, 0.0)


def test_missing_opentelemetry_is_one_line_naming_the_option(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``servelab bench --otlp-endpoint`` without OpenTelemetry: exit 2 and one line naming the option and the
    fix, said by the CLI before the run directory is made (and so before any ``--engine`` would start)."""
    from servelab.bench.tracing import BenchTracer
    from servelab.cli import main

    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    out = tmp_path / "run"
    args = ["bench", "--quiet", "--url", "http://127.0.0.1:1/v1", "-n", "2", "--out", str(out)]
    with pytest.raises(SystemExit) as ex:
        main([*args, "--otlp-endpoint", "http://127.0.0.1:4318/v1/traces"])
    err = capsys.readouterr().err
    assert ex.value.code == 2 and err.count("\n") == 1, err
    msg = err.strip().removeprefix("servelab: error: ")
    assert msg.startswith("--otlp-endpoint: ") and "servelab[otel]" in msg and "leave --otlp-endpoint out" in msg
    assert not out.exists(), "the run directory was made before the missing install was said"
    with pytest.raises(ConfigError) as e:  # the tracer, built without the CLI, says the same line
        BenchTracer("http://127.0.0.1:4318/v1/traces", 1.0, "http://127.0.0.1:8080/v1", "chat")
    assert str(e.value) == msg


def _records(n: int) -> list[Any]:
    from servelab.wire.types import RequestRecord

    t = time.monotonic_ns()
    return [
        RequestRecord(request_id=i, step="c8", sent_ns=t, first_token_ns=t + 1000, end_ns=t + 5000, status=200)
        for i in range(n)
    ]


def test_a_step_larger_than_the_export_queue_loses_no_span() -> None:
    """The SDK's batch queue holds 2048 spans and drops the rest: a 5000-request step must arrive whole."""
    pytest.importorskip("opentelemetry.sdk")
    from otlp_receiver import Receiver

    from servelab.bench.tracing import BenchTracer

    rx = Receiver()
    try:
        tracer = BenchTracer(rx.url, 1.0, "http://127.0.0.1:8080/v1", "completions")
        tracer.model = "m"
        for rec in _records(5000):
            tracer.add(rec, 0)
        assert tracer.shutdown() is None
        assert len(rx.spans) == 5000 and len({s.span_id for s in rx.spans}) == 5000
        assert {s.name for s in rx.spans} == {"text_completion m"}
    finally:
        rx.server.shutdown()


def test_an_unreachable_collector_is_said_once_with_what_was_lost() -> None:
    pytest.importorskip("opentelemetry.sdk")
    from servelab.bench.tracing import BenchTracer

    t0 = time.monotonic()
    tracer = BenchTracer("http://127.0.0.1:9/v1/traces", 1.0, "http://127.0.0.1:8080/v1", "chat")
    for rec in _records(3000):
        tracer.add(rec, 0)
    tracer.flush()
    note = tracer.shutdown()
    assert note is not None and "3000 of 3000 spans could not be exported" in note and "\n" not in note
    assert time.monotonic() - t0 < 15  # a refused connection fails fast; the waits are bounded regardless


# ---------------------------------------------------------------------------------------------- processes
def _bench(url: str, out: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    data = out.parent / f"{out.name}.jsonl"
    data.write_text("".join(orjson.dumps({"prompt": f"q{i} {SECRET}"}).decode() + "\n" for i in range(4)))
    cmd = [sys.executable, "-m", "servelab.cli", "bench", "--quiet", "--url", url, "--dataset", str(data)]
    return subprocess.run(
        [*cmd, "--out", str(out), *args], capture_output=True, text=True, timeout=timeout, cwd=out.parent
    )


def _mock_records(root: str) -> dict[str, dict[str, Any]]:
    with urllib.request.urlopen(root + "/mock/records", timeout=5) as f:
        return {r["traceparent"]: r for r in orjson.loads(f.read())}


def _lines(out: Path) -> dict[int, dict[str, Any]]:
    return {d["id"]: d for d in map(orjson.loads, (out / "requests.jsonl").read_bytes().splitlines())}


@contextlib.contextmanager
def _mock_and_receiver(*mock_args: str) -> Iterator[tuple[MockProcess, Any]]:
    """A mock engine process started with ``mock_args`` and an OTLP receiver (tests/otlp_receiver.py), both
    stopped on leaving."""
    from otlp_receiver import Receiver

    rx = Receiver()
    eng = start_mock_process(*mock_args)
    try:
        yield eng, rx
    finally:
        stop_mock_process(eng.proc)
        rx.server.shutdown()


def test_one_client_span_per_request_agrees_with_the_run_and_the_traceparent_sent(tmp_path: Path) -> None:
    from otlp_receiver import attrs

    with _mock_and_receiver(
        "--ttft-ms", "5", "--itl-ms", "1", "--output-tokens", "6", "--fail-http-rate", "0.3", "--seed", "3"
    ) as (eng, rx):
        out = tmp_path / "run"
        r = _bench(eng.base_url, out, "-n", "8", "--warmup", "1", "-c", "1,2", "--otlp-endpoint", rx.url)
        assert r.returncode in (0, 1), r.stderr  # 1: a step may fail whole by the injected failures
        assert "Traceback" not in r.stderr and "otlp" not in r.stderr.lower()
        lines = _lines(out)
        assert len(lines) == 18  # 2 steps x (8 + 1 warmup)
        deadline = time.monotonic() + 10
        while len(rx.spans) < len(lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        with rx.lock:
            spans, raw = list(rx.spans), b"".join(rx.raw)
        assert len(spans) == len(lines)  # flushed before the bench exited: nothing left to wait for
        sent = _mock_records(eng.root)
        failed = 0
        for s in spans:
            a = attrs(s)
            line = lines[a["servelab.bench.request_id"]]
            assert s.name == "chat mock" and s.kind == 3  # SPAN_KIND_CLIENT
            assert not s.parent_span_id
            assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "mock"
            assert a["server.address"] == "127.0.0.1" and a["server.port"] == int(eng.base_url.split(":")[2][:5])
            assert a["servelab.bench.step"] == line["step"] and a["servelab.bench.warmup"] == line["warmup"]
            assert a["servelab.bench.step_index"] == (0 if line["step"] == "c1" else 1)
            assert a["gen_ai.request.max_tokens"] == line["max_tokens"]
            # the span's times are the bench's own send and last byte: its duration is the run's, to the ns
            assert s.end_time_unix_nano - s.start_time_unix_nano == line["t_ns"]["end"] - line["t_ns"]["sent"]
            tp = f"00-{s.trace_id.hex()}-{s.span_id.hex()}-01"
            assert tp in sent, f"no request reached the engine with {tp}"
            if line["failure"] is None:
                assert a["gen_ai.usage.input_tokens"] == line["prompt_tokens"]
                assert a["gen_ai.usage.output_tokens"] == line["output_tokens"] == 6
                assert a["gen_ai.response.finish_reasons"] == [line["finish_reason"]]
                assert a["gen_ai.response.time_to_first_chunk"] == pytest.approx(line["ttft_s"], abs=1e-9)
                first = next(e for e in s.events if e.name == "first_token")
                assert (
                    first.time_unix_nano - s.start_time_unix_nano == line["t_ns"]["first_token"] - line["t_ns"]["sent"]
                )
                assert s.status.code != 2
            else:
                failed += 1
                assert a["error.type"] == line["failure"] and s.status.code == 2  # STATUS_CODE_ERROR
                assert a["http.response.status_code"] == line["status"] == 500
        assert failed, "the injected failures (30 %) should have failed some of 18 requests"
        assert SECRET.encode() not in raw, "prompt text was exported in a span"
        assert not any(d["text"] and d["text"].encode() in raw for d in lines.values()), "output text exported"


def test_requests_of_worker_processes_carry_their_span_ids(tmp_path: Path) -> None:
    from otlp_receiver import attrs

    with _mock_and_receiver("--ttft-ms", "2", "--itl-ms", "1", "--output-tokens", "3") as (eng, rx):
        out = tmp_path / "run"
        r = _bench(
            eng.base_url, out, "-n", "12", "--warmup", "2", "-c", "4", "--workers", "2", "--otlp-endpoint", rx.url
        )
        assert r.returncode == 0, r.stderr
        lines = _lines(out)
        assert len(lines) == 14 and {d["worker"] for d in lines.values()} == {0, 1}
        with rx.lock:
            spans = list(rx.spans)
        assert len(spans) == len(lines)
        sent = _mock_records(eng.root)
        for s in spans:
            line = lines[attrs(s)["servelab.bench.request_id"]]
            assert f"00-{s.trace_id.hex()}-{s.span_id.hex()}-01" in sent
            assert s.end_time_unix_nano - s.start_time_unix_nano == line["t_ns"]["end"] - line["t_ns"]["sent"]
            assert attrs(s)["gen_ai.usage.output_tokens"] == line["output_tokens"] == 3
            assert abs(s.start_time_unix_nano - time.time_ns()) < 120e9  # the workers' clock is this host's


def test_a_driven_workload_sends_each_turn_with_its_span_traceparent(tmp_path: Path) -> None:
    """Sessions send their own requests (DrivenWorkload.drive): every turn still carries the traceparent of
    its own span, as the plain path's requests do."""
    from otlp_receiver import attrs

    with _mock_and_receiver("--ttft-ms", "2", "--itl-ms", "1", "--output-tokens", "3") as (eng, rx):
        out = tmp_path / "run"
        args = ["--sessions", "2", "--turns", "3", "-c", "2", "--set", "first_tokens=20", "--set", "turn_tokens=8"]
        cmd = [sys.executable, "-m", "servelab.cli", "bench", "--quiet", "--url", eng.base_url, *args]
        r = subprocess.run(
            [*cmd, "--out", str(out), "--otlp-endpoint", rx.url], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        lines = _lines(out)
        assert len(lines) == 6 and {d["workload"] for d in lines.values()} == {"sessions"}
        with rx.lock:
            spans = list(rx.spans)
        assert len(spans) == len(lines)  # flushed before the bench exited
        sent = _mock_records(eng.root)
        assert len(sent) == 6 and None not in sent, "a turn reached the engine without a traceparent"
        for s in spans:
            line = lines[attrs(s)["servelab.bench.request_id"]]
            tp = f"00-{s.trace_id.hex()}-{s.span_id.hex()}-01"
            assert tp in sent, f"no turn reached the engine with {tp}"
            assert sent[tp]["prompt_tokens"] == line["prompt_tokens"]  # the turn of this span, not another
            assert s.end_time_unix_nano - s.start_time_unix_nano == line["t_ns"]["end"] - line["t_ns"]["sent"]


def test_sample_ratio_zero_exports_nothing_and_passes_an_unsampled_traceparent(tmp_path: Path) -> None:
    with _mock_and_receiver("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "2") as (eng, rx):
        out = tmp_path / "run"
        r = _bench(eng.base_url, out, "-n", "4", "--warmup", "0", "-c", "1", "--otlp-endpoint", rx.url,
                   "--otlp-sample-ratio", "0")  # fmt: skip
        assert r.returncode == 0, r.stderr
        sent = list(_mock_records(eng.root))
        assert len(sent) == 4 and all(tp.startswith("00-") and tp.endswith("-00") for tp in sent)
        assert len({tp[3:35] for tp in sent}) == 4  # one trace per request
        time.sleep(1.5)  # past the batch processor's 1 s delay: nothing was held back either
        assert rx.spans == []


def test_unreachable_collector_costs_one_warning_line_and_never_fails_the_run(tmp_path: Path) -> None:
    eng = start_mock_process("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "2")
    try:
        t0 = time.monotonic()
        out = tmp_path / "run"
        r = _bench(
            eng.base_url, out, "-n", "4", "--warmup", "0", "-c", "1", "--otlp-endpoint", "http://127.0.0.1:9/v1/traces"
        )
        took = time.monotonic() - t0
        assert r.returncode == 0, r.stderr
        warn = [x for x in r.stderr.splitlines() if "--otlp-endpoint" in x]
        assert len(warn) == 1 and "4 of 4 spans could not be exported" in warn[0], r.stderr
        assert "Traceback" not in r.stderr
        assert len(_lines(out)) == 4
        assert took < 30, took  # the bench itself takes ~1 s; the shutdown waits at most a few seconds
    finally:
        stop_mock_process(eng.proc)


def test_bench_imports_no_opentelemetry_while_tracing_is_off() -> None:
    code = (
        "import sys, servelab.bench.cli, servelab.bench.load.runner, servelab.bench.console; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
