"""The shipped alert rules against live faults (issue 24 item 3): a real Prometheus (Debian package
``prometheus``) scrapes a real gateway in front of two real llama-server replicas every second and evaluates
the shipped rules (src/servelab/gateway/alerts/rules.yaml) every second, with each rule's ``for:`` shortened
to :data:`FOR_S` and its expression unchanged. Faults: replica ``llama-a`` (one slot) saturated with eight
concurrent streams must fire ``ServelabEngineQueueBacklog`` for it; replica ``llama-b`` killed must fire
``ServelabEngineDown`` for it; each within ``FOR_S`` plus a few scrape and evaluation intervals, and no
alert outside the faults' own (:data:`ALLOWED`): ``ServelabTTFTAboveSLO`` and ``ServelabE2EAboveSLO`` of
the saturated engine's model may join the saturation (its queue is what delays that model's first tokens
and ends on this CPU) and ``ServelabBreakerOpen`` the dead engine (its health checks open its breaker);
any alert for the other model or backend fails the test."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from conftest import gateway_key, launch_llama, prom_alerts, start_gateway, start_prometheus, stop_gateway, stop_process

from servelab.gateway.alerts import rules_text

FOR_S = 3
#: seconds after a fault by which its alert must fire: ``for:`` plus scrape (1 s) and evaluation (1 s)
#: intervals, the gateway's own scrape of the engine (health.interval_s 0.5 s) and slack for a loaded box
FIRE_WITHIN_S = FOR_S + 12
#: every alert a fault may fire, by (alertname, backend or model): the saturated engine's queue and the latency
#: alerts of its model (the queue is what delays its first tokens and ends), the dead engine and its breaker
ALLOWED = {
    ("ServelabEngineQueueBacklog", "llama-a"),
    ("ServelabTTFTAboveSLO", "a"),
    ("ServelabE2EAboveSLO", "a"),
    ("ServelabEngineDown", "llama-b"),
    ("ServelabBreakerOpen", "llama-b"),
}


def _short_rules(folder: Path) -> Path:
    """The shipped rule file with every ``for:`` set to :data:`FOR_S` seconds, expressions untouched."""
    doc = yaml.safe_load(rules_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = f"{FOR_S}s"
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def llama_a(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real llama-server with one slot: the one to saturate."""
    yield from launch_llama(tmp_path_factory, ctx_size=1024, parallel=1)


@pytest.fixture(scope="module")
def llama_b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real llama-server: the one to kill."""
    yield from launch_llama(tmp_path_factory, ctx_size=512, parallel=1)


class _Watch:
    """Polls Prometheus' alerts every 0.5 s in a thread: every (alertname, its backend or else its model) seen
    firing, and when it was first seen."""

    def __init__(self, prom: str) -> None:
        self.prom = prom
        self.first: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for a in prom_alerts(self.prom):
                    if a["state"] == "firing":
                        lab = a["labels"]
                        key = (lab["alertname"], lab.get("backend") or lab.get("model", ""))
                        self.first.setdefault(key, time.monotonic())
            except OSError:
                pass
            self._stop.wait(0.5)

    def wait_for(self, name: str, backend: str, since: float, timeout_s: float) -> float:
        deadline = since + timeout_s
        while time.monotonic() < deadline:
            at = self.first.get((name, backend))
            if at is not None:
                return at - since
            time.sleep(0.2)
        raise AssertionError(f"{name} for {backend} did not fire within {timeout_s} s; seen: {self.first}")

    def stop(self) -> None:
        self._stop.set()
        self._t.join(5)


def test_saturated_and_killed_engines_fire_their_alerts_and_no_others(tmp_path: Path, llama_a, llama_b) -> None:
    key, entry = gateway_key("k1", "t")
    cfg = {
        "backends": [
            {"name": "llama-a", "kind": "llamacpp", "base_url": llama_a.base_url, "models": ["gemma"]},
            {"name": "llama-b", "kind": "llamacpp", "base_url": llama_b.base_url, "models": ["gemma"]},
        ],
        "models": {
            "a": {"targets": [{"backend": "llama-a", "model": "gemma"}]},
            "b": {"targets": [{"backend": "llama-b", "model": "gemma"}]},
        },
        "tenants": {"t": {"allowed_models": ["a", "b"]}},
        "keys": [entry],
        "server": {"public_metrics": True},
        "health": {"interval_s": 0.5, "timeout_s": 2},
    }
    gw = start_gateway(cfg, tmp_path / "gw")
    prom = start_prometheus(tmp_path, [gw.root.split("//", 1)[1]], (_short_rules(tmp_path),))
    watch = _Watch(prom.url)
    try:
        # healthy: both engines scraped, nothing fires
        time.sleep(FOR_S + 3)
        assert watch.first == {}, watch.first

        # fault 1: eight long streams at a one-slot engine, seven of them queued in it; cancelled once the alert
        # fired (the gateway then cancels them upstream), so a slow CPU does not wait for every answer and a
        # fast one still keeps the queue longer than the alert's for:
        body = {
            "model": "a",
            "stream": True,
            "max_tokens": 256,
            "temperature": 0,
            "messages": [{"role": "user", "content": "Count from one to one hundred in words."}],
        }

        async def burst() -> list[int]:
            async def one(s: aiohttp.ClientSession) -> int:
                async with s.post(
                    gw.url + "/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
                ) as r:
                    await r.read()
                    return r.status

            async with aiohttp.ClientSession() as s:
                return list(await asyncio.gather(*(one(s) for _ in range(8))))

        loop = asyncio.new_event_loop()
        task = loop.create_task(burst())

        def run() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)

        t0 = time.monotonic()
        runner = threading.Thread(target=run)
        runner.start()
        try:
            took = watch.wait_for("ServelabEngineQueueBacklog", "llama-a", t0, FIRE_WITHIN_S)
            print(f"ServelabEngineQueueBacklog fired {took:.1f} s after the burst (for: {FOR_S} s)")
        finally:
            loop.call_soon_threadsafe(task.cancel)
            runner.join(60)
            loop.close()
        assert not runner.is_alive()

        # fault 2: the other engine killed
        t1 = time.monotonic()
        llama_b.process.kill()
        took = watch.wait_for("ServelabEngineDown", "llama-b", t1, FIRE_WITHIN_S)
        print(f"ServelabEngineDown fired {took:.1f} s after the kill (for: {FOR_S} s)")

        assert set(watch.first) <= ALLOWED, f"alerts outside the faults fired: {sorted(set(watch.first) - ALLOWED)}"
    finally:
        watch.stop()
        stop_process(prom.proc, 10.0)
        stop_gateway(gw.proc)
