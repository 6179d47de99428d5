"""The Grafana dashboard (servelab.gateway.dashboards; issue 24 item 4): every panel's query returns data
from a real Prometheus (Debian package ``prometheus``) scraping a real gateway every second, after traffic
that exercises each panel (answers, a refusal, an rpm limit, a failed attempt with fallback, streams cut by
the engine)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import orjson
import pytest
from conftest import (
    gateway_key,
    prom_query,
    start_gateway,
    start_mock_process,
    start_prometheus,
    stop_gateway,
    stop_mock_process,
    stop_process,
)

from servelab.gateway.dashboards import dashboard, panel_queries

_query = prom_query


def _concrete(expr: str) -> str:
    """The query as Grafana sends it with model = All and a 1 s scrape interval."""
    return expr.replace("$__rate_interval", "1m").replace("$model", ".*")


async def _traffic(url: str, key: str, key_lim: str) -> list[int]:
    async def one(s: aiohttp.ClientSession, k: str, model: str, stream: bool) -> int:
        body = {"model": model, "stream": stream, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        async with s.post(url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {k}"}) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession() as s:
        calls = [one(s, key, "m", i % 2 == 0) for i in range(12)]
        calls += [one(s, key, "m2", False), one(s, key, "flaky", True), one(s, key, "flaky", True)]
        calls += [one(s, "sk-sl-k1-" + "0" * 64, "m", False)]  # 401
        out = list(await asyncio.gather(*calls))
        out += [await one(s, key_lim, "m", False), await one(s, key_lim, "m", False)]  # rpm 1: the second is 429
        return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Prometheus scraping a gateway (two vLLM-dialect mock engines, one with a prefix cache (KV use), one
    cutting its streams, and a backend nothing listens on) every second, after the traffic; yields Prometheus'
    URL."""
    if shutil.which("prometheus") is None:
        pytest.skip("no prometheus (apt-get install -y prometheus)")
    folder = tmp_path_factory.mktemp("dashboard")
    good = start_mock_process(
        "--dialect", "vllm", "--ttft-ms", "5", "--itl-ms", "2", "--output-tokens", "8", "--prefix-cache-blocks", "64"
    )  # it reports KV use only with a cache
    bad = start_mock_process("--dialect", "vllm", "--stream-error-rate", "1.0", "--output-tokens", "8")
    key, entry = gateway_key("k1", "t")
    key_lim, entry_lim = gateway_key("k2", "lim")
    cfg = {
        "backends": [
            {"name": "good", "kind": "vllm", "base_url": good.root, "models": ["up-m"]},
            {"name": "bad", "kind": "vllm", "base_url": bad.root, "models": ["up-f"]},
            {
                "name": "dead",
                "kind": "vllm",
                "base_url": "http://127.0.0.1:9",
                "models": ["up-d"],
                "connect_timeout_s": 0.5,
            },
        ],
        "models": {
            "m": {"targets": [{"backend": "good"}]},
            "flaky": {"targets": [{"backend": "bad"}]},
            "m2": {"targets": [{"backend": "dead"}], "fallback": [{"model": "m"}]},
        },
        "tenants": {"t": {}, "lim": {"rpm": 1}},
        "keys": [entry, entry_lim],
        "server": {"public_metrics": True},
        "health": {"interval_s": 0.5},
        "retry": {"backoff_s": 0.01},
    }
    gw = start_gateway(cfg, folder / "gw")
    prom = start_prometheus(folder, [gw.root.split("//", 1)[1]])
    url = prom.url
    try:
        statuses = asyncio.run(_traffic(gw.url, key, key_lim))
        assert 401 in statuses and 429 in statuses and statuses.count(200) >= 13, statuses
        # two scrapes of the gateway after the traffic, so every rate() has two samples
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if (
                    len(_query(url, 'count_over_time(up{job="servelab-gateway"}[1m])'))
                    and float(_query(url, 'count_over_time(up{job="servelab-gateway"}[1m])')[0]["value"][1]) >= 4
                ):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail("prometheus did not scrape the gateway: " + prom.log.read_text()[-2000:])
        yield url
    finally:
        stop_process(prom.proc, 10.0)
        stop_gateway(gw.proc)
        stop_mock_process(good.proc)
        stop_mock_process(bad.proc)


def test_every_panel_query_returns_data_from_a_live_prometheus(live: str) -> None:
    queries = panel_queries(dashboard())
    assert len(queries) >= 15
    empty = [f"{title}: {expr}" for title, expr in queries if not _query(live, _concrete(expr))]
    assert not empty, "panels with no data:\n" + "\n".join(empty)


def test_dashboard_imports_as_is_with_the_datasource_as_a_variable() -> None:
    board = dashboard()
    names = {v["name"]: v for v in board["templating"]["list"]}
    assert names["datasource"]["type"] == "datasource" and names["datasource"]["query"] == "prometheus"
    panels = [p for p in board["panels"] if p["type"] != "row"]
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert len({p["id"] for p in board["panels"]}) == len(board["panels"])  # unique ids: Grafana keys on them
    assert all(p["fieldConfig"]["defaults"]["unit"] for p in panels)  # each panel says its unit


def test_cli_prints_the_dashboard() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "dashboard"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
    )
    assert out.returncode == 0, out.stderr
    assert orjson.loads(out.stdout) == dashboard()
