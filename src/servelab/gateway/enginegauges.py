"""Engine gauges in one place: the gateway scrapes each backend's own Prometheus ``/metrics`` and exports
its queue, running and KV-cache gauges labelled by backend, so dashboards and alerts need one scrape target
(issue 24 item 5), and the request timeline records how busy the engine was when an attempt was sent.

Names per backend kind: the engine registry's :class:`~servelab.engines.kind.ServerMetrics` (``llamacpp``,
``vllm``: running, waiting, KV use), else the dialect table's ``running_gauge``/``waiting_gauge``
(:mod:`servelab.wire.dialects`: sglang, tgi); for kinds without names of their own (``mock``, ``openai``)
the first running/waiting name of any dialect the page holds. Series of one name are summed over their
labels (vLLM labels by ``model_name``). llama.cpp's slot count comes from ``GET /props``
(``total_slots``) once per backend.

Exported (prometheus-client custom collector, in the gateway's registry), per ``backend`` and ``kind``:

- ``servelab_gateway_engine_requests_running`` gauge: requests the engine is running (count);
- ``servelab_gateway_engine_requests_waiting`` gauge: requests queued in the engine (count);
- ``servelab_gateway_engine_kv_cache_usage_ratio`` gauge: KV-cache use, 0-1 (engines that report it);
- ``servelab_gateway_engine_slots`` gauge: llama.cpp's parallel slots (count);
- ``servelab_gateway_engine_scrape_up`` gauge: 1 when the last scrape of the backend's ``/metrics``
  succeeded, 0 when it failed (engine down, no ``--metrics``);
- ``servelab_gateway_engine_scrape_age_seconds`` gauge: seconds since the last successful scrape;
- ``servelab_gateway_engine_scrape_oversize_total`` counter: scrapes refused because the page was larger
  than ``max_bytes``.

**Bounds**: a scrape reads at most ``max_bytes`` bytes of ``/metrics`` (a ``Content-Length`` above it is
refused before reading; a body, chunked or endless, is cut at the limit) and takes at most ``timeout_s``
seconds in all (aiohttp's total timeout: a slow trickle ends there too), so a broken or hostile backend
can neither grow the gateway's memory past about ``max_bytes`` per backend nor stall its scrape loop. An
oversize page drops the backend's gauges (:meth:`EngineGauges.state` is None until the next good scrape),
so the endpoint picker falls back to least outstanding at once instead of using the older figures until
they turn stale. A failed scrape (timeout, refused, non-200) keeps the last good figures, which turn stale
by their age (``routing.picker.stale_after_s``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from servelab.wire.dialects import DIALECTS
from servelab.wire.prometheus import parse_prometheus_text

__all__ = ["DEFAULT_MAX_BYTES", "EngineGauges", "EngineNames", "OversizeError", "names_for", "read_bounded"]

log = logging.getLogger("servelab.gateway.enginegauges")

_P = "servelab_gateway_engine_"

#: Default bound of one ``/metrics`` page (bytes), a round figure far above what one engine's page holds
#: (its gauges and histograms for a few models and label sets); a larger page is a misbehaving backend.
DEFAULT_MAX_BYTES = 4 * 1024 * 1024


class OversizeError(ValueError):
    """A ``/metrics`` page larger than the scrape's byte bound."""


async def read_bounded(r: aiohttp.ClientResponse, max_bytes: int) -> bytes:
    """The body of ``r``, at most ``max_bytes`` bytes; raises :class:`OversizeError` (without reading on)
    when ``Content-Length`` or the bytes received exceed it."""
    if r.content_length is not None and r.content_length > max_bytes:
        raise OversizeError(f"Content-Length {r.content_length} > {max_bytes} bytes")
    chunks: list[bytes] = []
    n = 0
    while True:
        chunk = await r.content.read(min(65536, max_bytes + 1 - n))
        if not chunk:
            return b"".join(chunks)
        n += len(chunk)
        if n > max_bytes:
            raise OversizeError(f"more than {max_bytes} bytes")
        chunks.append(chunk)


@dataclass(frozen=True)
class EngineNames:
    """Metric names (without labels) meaning running requests, waiting requests and KV use (0-1), each a
    tuple of candidates: the first one the page holds is read."""

    running: tuple[str, ...]
    waiting: tuple[str, ...]
    kv_usage: tuple[str, ...]


def names_for(kind: str) -> EngineNames:
    """The gauge names of backend ``kind`` (module doc)."""
    from servelab.engines import registry

    try:
        m = registry.get(kind).metrics
        running, waiting, kv = m.running, m.waiting, m.kv_usage
    except Exception:  # noqa: BLE001 - ConfigError for a kind the registry does not hold (sglang, tgi, openai)
        running = waiting = kv = None
    d = next((x.stream for k, x in DIALECTS.items() if k == kind and x.stream is not None), None)
    running = running or (d.running_gauge if d is not None else None)
    waiting = waiting or (d.waiting_gauge if d is not None else None)
    if running and waiting:
        return EngineNames((running,), (waiting,), (kv,) if kv else ())
    every = [x.stream for x in DIALECTS.values() if x.stream is not None]
    return EngineNames(
        tuple(x.running_gauge for x in every if x.running_gauge),
        tuple(x.waiting_gauge for x in every if x.waiting_gauge),
        ("vllm:kv_cache_usage_perc",),
    )


def _pick(values: dict[str, float], candidates: tuple[str, ...]) -> float | None:
    """The sum over label sets of the first candidate name present in ``values`` (series key -> value)."""
    for name in candidates:
        found = [v for k, v in values.items() if k == name or k.startswith(name + "{")]
        if found:
            return sum(found)
    return None


@dataclass
class _State:
    kind: str
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    slots: int | None = None
    up: bool | None = None
    at: float | None = None  # time.monotonic() of the last good scrape
    oversize: int = 0  # scrapes refused for size


class EngineGauges:
    """Scrapes ``backends`` (objects with ``name``, ``kind``, ``base_url``) every ``interval_s`` seconds
    (each scrape at most ``timeout_s`` seconds and ``max_bytes`` bytes) and exposes the gauges (module doc)
    through :meth:`collect` once registered in a prometheus-client registry. :meth:`state` gives the timeline
    and the endpoint picker what was last seen."""

    def __init__(
        self,
        backends: Sequence[Any],
        interval_s: float = 1.0,
        timeout_s: float = 2.0,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        if interval_s <= 0 or timeout_s <= 0:
            raise ValueError(f"engine gauges: interval_s {interval_s} and timeout_s {timeout_s} must be > 0 s")
        if max_bytes <= 0:
            raise ValueError(f"engine gauges: max_bytes {max_bytes} must be > 0")
        self.interval_s, self.timeout_s, self.max_bytes = interval_s, timeout_s, max_bytes
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.set_backends(backends)

    def set_backends(self, backends: Sequence[Any]) -> None:
        """Scrape these backends from now on (after a reload); kept states of unchanged backends stay."""
        old = getattr(self, "states", {})
        self.backends = {b.name: b for b in backends}
        self.names = {b.name: names_for(b.kind) for b in backends}
        self.states: dict[str, _State] = {
            b.name: old[b.name] if b.name in old and old[b.name].kind == b.kind else _State(b.kind) for b in backends
        }

    def state(self, backend: str) -> dict[str, Any] | None:
        """``{running, waiting, slots, kv_usage, age_s}`` of ``backend`` at its last good scrape (fields it
        does not report left out), or None when it was never scraped or its last page was refused for size."""
        st = self.states.get(backend)
        if st is None or st.at is None:
            return None
        out: dict[str, Any] = {"age_s": round(time.monotonic() - st.at, 3)}
        for k in ("running", "waiting", "slots", "kv_usage"):
            v = getattr(st, k)
            if v is not None:
                out[k] = v
        return out

    @staticmethod
    def _root(base_url: str) -> str:
        root = base_url.rstrip("/")
        return root[:-3] if root.endswith("/v1") else root

    async def scrape_once(self, name: str) -> bool:
        """Scrape backend ``name`` now; returns whether its ``/metrics`` answered and parsed."""
        b, st = self.backends[name], self.states[name]
        if self._session is None:
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True))
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        root = self._root(b.base_url)
        try:
            async with self._session.get(root + "/metrics", timeout=timeout, allow_redirects=False) as r:
                if r.status != 200:
                    raise ValueError(f"http {r.status}")
                body = await read_bounded(r, self.max_bytes)
                values = parse_prometheus_text(body.decode("utf-8", "replace"))
            if st.slots is None and b.kind == "llamacpp":
                with contextlib.suppress(aiohttp.ClientError, ValueError, TimeoutError):
                    async with self._session.get(root + "/props", timeout=timeout, allow_redirects=False) as r:
                        props = orjson.loads(await read_bounded(r, self.max_bytes)) if r.status == 200 else {}
                        slots = props.get("total_slots") if isinstance(props, dict) else None
                        st.slots = slots if isinstance(slots, int) and not isinstance(slots, bool) else None
        except OversizeError as e:
            st.oversize += 1
            st.running = st.waiting = st.kv_usage = st.at = None  # picker: no gauges, least outstanding
            if st.up is not False:
                log.warning("engine gauges: /metrics of backend %s refused: %s", name, e)
            st.up = False
            return False
        except (aiohttp.ClientError, OSError, ValueError, TimeoutError) as e:
            if st.up is not False:
                log.info("engine gauges: /metrics of backend %s not read: %s", name, type(e).__name__)
            st.up = False
            return False
        n = self.names[name]
        st.running, st.waiting, st.kv_usage = (
            _pick(values, n.running),
            _pick(values, n.waiting),
            _pick(values, n.kv_usage),
        )
        st.up, st.at = True, time.monotonic()
        return True

    async def _loop(self, name: str, offset_s: float) -> None:
        await asyncio.sleep(offset_s)
        while True:
            t0 = time.monotonic()
            try:
                if name in self.backends:
                    await self.scrape_once(name)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - one bad page must not end the loop
                log.error("engine gauges: scrape of %s failed unexpectedly: %r", name, e)
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - t0)))

    async def start(self) -> None:
        """One scrape loop per backend, staggered over one interval."""
        await self.stop()
        loop = asyncio.get_running_loop()
        n = max(1, len(self.backends))
        self._tasks = [
            loop.create_task(self._loop(name, i * self.interval_s / n), name=f"engine-gauges:{name}")
            for i, name in enumerate(self.backends)
        ]

    async def stop(self) -> None:
        """Stop the loops (the session stays for a restart; :meth:`close` closes it)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []

    async def close(self) -> None:
        """Stop the loops and close the session."""
        await self.stop()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # prometheus-client custom collector API (https://prometheus.github.io/client_python/collector/custom/)
    def describe(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """The families without samples."""
        return self._families(with_samples=False)

    def collect(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        """The families with one sample per backend that reported the value."""
        return self._families(with_samples=True)

    def _families(self, with_samples: bool) -> list[GaugeMetricFamily | CounterMetricFamily]:
        lab = ["backend", "kind"]
        fams: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
            "running": GaugeMetricFamily(
                _P + "requests_running", "Requests the engine is running (its own gauge)", labels=lab
            ),
            "waiting": GaugeMetricFamily(
                _P + "requests_waiting", "Requests queued in the engine (its own gauge)", labels=lab
            ),
            "kv_usage": GaugeMetricFamily(_P + "kv_cache_usage_ratio", "Engine KV-cache use, 0-1", labels=lab),
            "slots": GaugeMetricFamily(_P + "slots", "llama.cpp parallel slots", labels=lab),
            "up": GaugeMetricFamily(
                _P + "scrape_up", "1 when the last scrape of the engine's /metrics worked", labels=lab
            ),
            "age": GaugeMetricFamily(_P + "scrape_age_seconds", "Seconds since the last good scrape", labels=lab),
            "oversize": CounterMetricFamily(
                _P + "scrape_oversize", "Scrapes of the engine's /metrics refused for size (> max_bytes)", labels=lab
            ),
        }
        if with_samples:
            now = time.monotonic()
            for name, st in self.states.items():
                labels = [name, st.kind]
                for k in ("running", "waiting", "kv_usage", "slots"):
                    v = getattr(st, k)
                    if v is not None:
                        fams[k].add_metric(labels, float(v))
                if st.up is not None:
                    fams["up"].add_metric(labels, 1.0 if st.up else 0.0)
                if st.at is not None:
                    fams["age"].add_metric(labels, now - st.at)
                fams["oversize"].add_metric(labels, float(st.oversize))
        return list(fams.values())
