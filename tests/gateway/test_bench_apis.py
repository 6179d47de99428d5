"""``servelab bench --endpoint messages|responses`` through the real gateway (its Anthropic Messages and OpenAI
Responses routes) to a mock engine: every request streamed in the API's shape succeeds, its tokens come from
the API's own usage and add up to the gateway ledger's rows, TTFT is stamped at the first content delta, and
the gateway's access log and metrics say which API each request came in on.

One gateway and one mock per module (a few seconds); each test is one small bench run (6 requests).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import ADMIN_TOKEN, gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

N = 6  # measured requests per run
REASONING, ANSWER = 2, 7  # the mock's tokens per answer


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway serving model ``m`` from a vLLM-dialect mock that reasons (2 tokens) then answers (7 tokens),
    first token after 20 ms; one key per API so each run's ledger rows and log lines are its own."""
    tmp = tmp_path_factory.mktemp("bench-apis")
    mock = start_mock_process(
        "--dialect",
        "vllm",
        "--output-tokens",
        str(ANSWER),
        "--reasoning-tokens",
        str(REASONING),
        "--ttft-ms",
        "20",
        "--itl-ms",
        "2",
    )
    keys = {api: gateway_key(f"k_{api}", "t") for api in ("messages", "responses")}
    cfg = {
        "backends": [{"name": "b", "kind": "mock", "base_url": mock.root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {}},
        "keys": [entry for _, entry in keys.values()],
    }
    proc = None
    try:
        proc = start_gateway(cfg, tmp / "gw")
        yield type(
            "GW",
            (),
            {
                "proc": proc,
                "keys": {a: k for a, (k, _) in keys.items()},
                "tmp": tmp,
                "db": Path(proc.config["ledger"]["sqlite_path"]),
            },
        )
    finally:
        if proc is not None:
            stop_gateway(proc.proc)
        stop_mock_process(mock.proc)


def _ledger(db: Path, key_id: str, n: int, timeout_s: float = 5.0) -> tuple[int, int, int]:
    """(rows, prompt tokens, completion tokens) of ``key_id``'s ledger rows, once ``n`` rows are settled."""
    deadline = time.monotonic() + timeout_s
    while True:
        with sqlite3.connect(db) as con:
            rows, pt, ct = con.execute(
                "SELECT COUNT(*), SUM(prompt_tokens), SUM(completion_tokens) FROM servelab_usage WHERE key_id = ?",
                (key_id,),
            ).fetchone()
        if rows >= n or time.monotonic() > deadline:
            return int(rows), int(pt or 0), int(ct or 0)
        time.sleep(0.05)


def _metrics(gw: Any) -> dict[str, float]:
    req = urllib.request.Request(gw.proc.admin_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        lines = [x for x in r.read().decode().splitlines() if x and not x.startswith("#")]
    return {x.rsplit(" ", 1)[0]: float(x.rsplit(" ", 1)[1]) for x in lines}


@pytest.mark.parametrize("api", ["messages", "responses"])
def test_bench_through_gateway_tokens_equal_ledger(gw: Any, api: str) -> None:
    out = gw.tmp / f"run-{api}"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "bench",
            "--url",
            gw.proc.url,
            "--model",
            "m",
            "--api-key",
            gw.keys[api],
            "--endpoint",
            api,
            "-w",
            "short-qa",
            "--set",
            "output_tokens=32",
            "--concurrency",
            "2",
            "--requests",
            str(N),
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "short-qa" in r.stdout  # the same summary table as chat
    summary = json.loads((out / "summary.json").read_text())
    (step,) = summary["steps"]
    assert step["counts"]["succeeded"] == N and step["counts"]["failed_total"] == 0
    assert step["tokens"]["output_source"] == {"usage": N}
    assert step["ttft_s"]["p50"] >= 0.02 and step["itl_s"]["p50"] is not None
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == N
    for x in lines:
        t = x["t_ns"]
        # reasoning deltas first (the first token), then the text deltas (the first answer): 9 token chunks (two
        # may arrive in one read, so the stamps are ordered, not strictly; the exact events: tests/wire)
        assert x["failure"] is None and x["saw_done"] and x["finish_reason"] == "stop"
        assert x["output_tokens"] == REASONING + ANSWER and len(x["chunk_offsets_ms"]) == REASONING + ANSWER
        assert t["first_event"] <= t["first_token"] <= t["first_answer"] <= t["last_token"] <= t["done"]
        assert x["text"] == "".join(f" tok{i}" for i in range(ANSWER)) and x["reasoning"]
    config = json.loads((out / "config.json").read_text())
    assert config["endpoint"] == api
    # the API's own usage, request by request, adds up to the gateway's ledger for this key
    rows, pt, ct = _ledger(gw.db, f"k_{api}", N)
    assert rows == N
    assert (sum(x["prompt_tokens"] for x in lines), sum(x["output_tokens"] for x in lines)) == (pt, ct)
    # the access log and the metrics say which API the requests came in on
    logged = [x for x in gw.proc.access_records() if x["key_id"] == f"k_{api}"]
    assert [(x["api"], x["endpoint"]) for x in logged] == [(api, "chat")] * N
    m = _metrics(gw)
    assert m[f'servelab_gateway_api_requests_total{{api="{api}",status="200"}}'] == N
    assert m[f'servelab_gateway_api_tokens_total{{api="{api}",direction="completion"}}'] == ct
    assert m[f'servelab_gateway_api_tokens_total{{api="{api}",direction="prompt"}}'] == pt


def test_bench_refuses_what_the_api_cannot_carry(gw: Any) -> None:
    """One line, exit 2, before any request: --ignore-eos, the tools workload, a structured set as messages."""
    for args, said in (
        (["--ignore-eos"], "--ignore-eos is not a field of the messages API"),
        (["-w", "tools"], "tools is not one: use --endpoint chat"),
        (["-w", "structured"], "'response_format' is not a field of the messages API"),
    ):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "servelab.cli",
                "bench",
                "--url",
                gw.proc.url,
                "--endpoint",
                "messages",
                "--out",
                str(gw.tmp / "never"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and said in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (gw.tmp / "never").exists()
