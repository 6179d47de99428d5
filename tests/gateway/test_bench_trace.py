"""One trace from the bench client through the gateway to the engine (issue 24 item 2): ``servelab bench
--otlp-endpoint`` sends each request through a real gateway tracing to the same OTLP receiver
(tests/otlp_receiver.py) in front of the mock engine; the gateway's request span must be the child of the
bench's span, and the engine must have received the gateway's attempt span as its parent."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

pytest.importorskip("opentelemetry.sdk")
from otlp_receiver import Receiver, attrs


def test_bench_span_is_the_parent_of_the_gateway_request_span(tmp_path: Path) -> None:
    rx = Receiver()
    eng = start_mock_process("--ttft-ms", "5", "--itl-ms", "1", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    cfg: dict[str, Any] = {
        "backends": [{"name": "b", "kind": "mock", "base_url": eng.root, "models": ["up-m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {}},
        "keys": [entry],
        "health": {"enabled": False},
        "tracing": {"endpoint": rx.url, "sample_ratio": 0.0, "service_name": "gw-under-test"},
    }
    gw = start_gateway(cfg, tmp_path / "gw")
    try:
        out = tmp_path / "run"
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "servelab.cli",
                "bench",
                "--quiet",
                "--url",
                gw.url,
                "--model",
                "m",
                "--api-key",
                key,
                "-n",
                "4",
                "--warmup",
                "0",
                "-c",
                "2",
                "--out",
                str(out),
                "--otlp-endpoint",
                rx.url,
            ],  # fmt: skip
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        n = len((out / "requests.jsonl").read_bytes().splitlines())
        assert n == 4
        # the gateway's own ratio is 0: it traces these requests only because the bench's traceparent says so
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with rx.lock:
                spans = list(rx.spans)
            bench = [s for s in spans if attrs(s).get("servelab.bench.request_id") is not None]
            roots = [s for s in spans if s.kind == 2]  # SPAN_KIND_SERVER: the gateway's request spans
            if len(bench) >= n and len(roots) >= n:
                break
            time.sleep(0.2)
        assert len(bench) == n and len(roots) == n, (len(bench), len(roots))
        by_id = {s.span_id: s for s in bench}
        with urllib.request.urlopen(eng.root + "/mock/records", timeout=5) as f:
            engine_got = {rec["traceparent"] for rec in orjson.loads(f.read())}
        for root in roots:
            parent = by_id.get(root.parent_span_id)
            assert parent is not None, f"gateway span {root.name} has no bench span as its parent"
            assert root.trace_id == parent.trace_id
            assert root.name == "chat m" and parent.name == "chat m"
            # the bench's span encloses the gateway's (one host, one clock pair): sent before, ended after
            assert parent.start_time_unix_nano <= root.start_time_unix_nano + 5_000_000
            assert root.end_time_unix_nano <= parent.end_time_unix_nano + 5_000_000
            attempt = next(s for s in spans if s.parent_span_id == root.span_id and s.kind == 3)
            assert f"00-{root.trace_id.hex()}-{attempt.span_id.hex()}-01" in engine_got
            assert attrs(root)["gen_ai.usage.output_tokens"] == attrs(parent)["gen_ai.usage.output_tokens"] == 4
    finally:
        stop_gateway(gw.proc)
        stop_mock_process(eng.proc)
        rx.server.shutdown()
