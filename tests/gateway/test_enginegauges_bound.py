"""Issue 26: a backend's ``/metrics`` cannot grow the gateway's memory or stall its scrape
(servelab.gateway.enginegauges bounds). A hostile page server runs in this process (aiohttp's test server):
a page larger than ``max_bytes`` announced by ``Content-Length``, an endless chunked page, a page that
trickles forever, and a normal page. The oversize pages are refused and counted
(``servelab_gateway_engine_scrape_oversize_total``), the backend's gauges are dropped, and the endpoint
picker falls back to least outstanding at once; the trickle ends at ``timeout_s``."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import CollectorRegistry

from servelab.gateway.enginegauges import EngineGauges
from servelab.gateway.picker import PickContext, Picker, PickerSettings, PickerState

GOOD = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.5\n"
LINE = b"vllm:num_requests_running 1\n" * 2048  # 56 KiB of valid lines


@dataclass
class _Backend:
    name: str
    kind: str
    base_url: str


def _app(sent: dict[str, int], mode: dict[str, str]) -> web.Application:
    async def metrics(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        how = mode.get(name, "good")
        if how == "good":
            return web.Response(body=GOOD)
        if how == "huge":  # announced: 64 MiB
            r = web.StreamResponse(headers={"Content-Length": str(64 * 1024 * 1024)})
        else:
            r = web.StreamResponse()  # chunked, no length
        await r.prepare(request)
        while True:  # endless: only the client's bound ends it
            try:
                if how == "trickle":
                    await r.write(b"# x\n")
                    await asyncio.sleep(0.05)
                else:
                    await r.write(LINE)
                    sent[name] = sent.get(name, 0) + len(LINE)
            except (ConnectionResetError, RuntimeError):
                return r

    app = web.Application()
    app.router.add_get("/{name}/metrics", metrics)
    return app


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_oversize_and_endless_pages_are_cut_counted_and_the_picker_falls_back_at_once() -> None:
    limit = 256 * 1024

    async def go() -> None:
        sent: dict[str, int] = {}
        mode = {"a": "good", "b": "good", "c": "good"}
        async with TestServer(_app(sent, mode)) as srv:
            root = str(srv.make_url("")).rstrip("/")
            backends = [_Backend(n, "vllm", f"{root}/{n}/v1") for n in "abc"]
            g = EngineGauges(backends, interval_s=1.0, timeout_s=5.0, max_bytes=limit)
            reg = CollectorRegistry()
            reg.register(g)
            try:
                for n in "abc":
                    assert await g.scrape_once(n)
                assert g.state("b") is not None and g.state("b")["running"] == 3  # type: ignore[index]
                picker = Picker(PickerSettings("engine"), PickerState(g.state, CollectorRegistry()))
                names = list("abc")
                _, pick = picker.order(
                    names, dict.fromkeys(names, 1.0), {}, dict.fromkeys(names, 0), PickContext(tie="t")
                )
                assert pick.how == "scored"

                mode["b"], mode["c"] = "huge", "endless"
                tracemalloc.start()
                t0 = time.monotonic()
                ok_b = await g.scrape_once("b")
                ok_c = await g.scrape_once("c")
                took = time.monotonic() - t0
                _, peak = tracemalloc.get_traced_memory()
                tracemalloc.stop()
                assert not ok_b and not ok_c
                assert took < 5.0, f"oversize scrapes took {took:.1f} s"  # cut at the limit, not at the timeout
                # the endless page was read to the limit and no further (plus one socket buffer in flight)
                assert peak < 8 * limit, f"peak {peak} B while the bound is {limit} B"
                assert g.state("b") is None and g.state("c") is None and g.state("a") is not None
                for n, v in (("a", 0.0), ("b", 1.0), ("c", 1.0)):
                    assert (
                        reg.get_sample_value(
                            "servelab_gateway_engine_scrape_oversize_total", {"backend": n, "kind": "vllm"}
                        )
                        == v
                    )
                    assert reg.get_sample_value(
                        "servelab_gateway_engine_scrape_up", {"backend": n, "kind": "vllm"}
                    ) == (1.0 if n == "a" else 0.0)
                order, pick = picker.order(
                    names,
                    dict.fromkeys(names, 1.0),
                    {"a": 2, "b": 1, "c": 0},
                    dict.fromkeys(names, 0),
                    PickContext(tie="t"),
                )
                assert pick.how == "fallback_stale" and order == ["c", "b", "a"]
                assert pick.detail.startswith("b: no gauges")

                mode["b"] = "good"  # a good page again: gauges back, the picker scores again
                assert await g.scrape_once("b")
                assert g.state("b") is not None
            finally:
                await g.close()

    _run(go())


def test_a_page_that_trickles_forever_ends_at_the_timeout() -> None:
    async def go() -> None:
        async with TestServer(_app({}, {"a": "trickle"})) as srv:
            root = str(srv.make_url("")).rstrip("/")
            g = EngineGauges([_Backend("a", "vllm", f"{root}/a")], interval_s=1.0, timeout_s=0.5, max_bytes=4096)
            try:
                t0 = time.monotonic()
                assert not await g.scrape_once("a")
                took = time.monotonic() - t0
                assert 0.4 < took < 2.0, took
                assert g.state("a") is None
            finally:
                await g.close()

    _run(go())


def test_max_bytes_must_be_positive() -> None:
    try:
        EngineGauges([], max_bytes=0)
    except ValueError as e:
        assert "max_bytes 0 must be > 0" in str(e)
    else:
        raise AssertionError("max_bytes 0 accepted")
