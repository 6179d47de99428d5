"""Prometheus metrics of the gateway, with stable names (docs/gateway-design.md).

Names (all prefixed ``servelab_gateway_``; seconds and token counts as the suffixes say):

- ``requests_total{model,backend,status}`` counter: finished requests by public model, backend that
  answered (``none`` when none did) and HTTP status (a stream that failed after its 200 counts as ``200``
  plus ``stream_errors_total``);
- ``api_requests_total{api,status}`` counter: the same requests by the API they came in on (``chat``,
  ``completions``, ``embeddings``, ``messages``, ``count_tokens``, ``responses``: a fixed handful,
  :func:`servelab.gateway.accesslog.api_name`) and HTTP status; ``api_tokens_total{api,direction}`` counter:
  ``prompt``/``completion`` tokens by API, so Messages or Responses traffic is told from chat;
- ``stream_errors_total{model,backend}`` counter: 200 streams that ended in an error event or cut off;
- ``ttft_seconds{model,backend}`` histogram: request received -> first token-carrying chunk written to the
  client (never the role-only chunk or the headers, docs/engine-wire.md case 1), measured at the gateway, by
  public model and the backend that answered (bounded: both come from the config);
- ``inter_token_seconds{model}`` histogram: time between token-carrying chunks written to the client
  (a read carrying k events adds k observations of gap/k);
- ``request_duration_seconds{model,backend}`` histogram: E2E, request received -> last byte written (backend
  ``none`` when no backend answered);
- ``tokens_total{model,direction}`` counter: ``prompt``/``completion`` tokens as the engine reported them;
- ``in_flight{model}`` gauge; ``retries_total{model,reason}`` counter (``connect``, ``429``, ``503``,
  ``saturated``); ``fallbacks_total{model}`` counter; ``breaker_state{backend}`` gauge (0 closed,
  1 half-open, 2 open); ``limit_rejections_total{limit}`` counter (rpm, tpm, concurrency, budget);
  ``config_reloads_total{result}`` counter (ok, error); ``connection_events_total{port,reason}`` counter
  (``api``/``admin``; ``idle_timeout``, ``header_timeout``, ``body_timeout``, ``refused``, ``evicted``,
  ``bad_request``) and
  ``connections{port}`` gauge (open client connections, set when scraped); ``degraded_total{model,rule,action}``
  counter (degrade actions applied under pressure: ``pause``, ``route``, ``cap_max_tokens``,
  ``refuse_long_prompt``; registered by :class:`servelab.gateway.degrade.Degrader` in this registry).

Each gateway has its own :class:`prometheus_client.CollectorRegistry` (several gateways in one test
process do not collide). Bucket edges: TTFT 1 ms-60 s, inter-token 0.5 ms-2.5 s, chosen to resolve the
gateway's own overhead (target: added TTFT P99 <= 2 ms) and engine-scale latencies alike. Every family
goes through prometheus-client's public API; ``inter_token_seconds`` is a :class:`CountingHistogram`
(a custom collector: one ``bisect`` per token instead of ``Histogram.observe``'s lock and scan).

Several worker processes (``servelab gateway --workers N``, :mod:`servelab.gateway.workers`): the
supervisor sets ``PROMETHEUS_MULTIPROC_DIR`` for every worker, so prometheus-client keeps counters,
histograms and gauges in per-process files there (its multiprocess mode,
https://prometheus.github.io/client_python/multiprocess/, read 2026-12-01) and :meth:`GatewayMetrics.expose`
renders all workers' families summed through its ``MultiProcessCollector`` (gauges: ``in_flight`` and
``connections`` summed over live workers, ``breaker_state`` the maximum over live workers). The custom
``inter_token_seconds`` collector writes its counts to ``itl_<pid>.json`` in that folder every
:data:`FLUSH_S` (:meth:`GatewayMetrics.flush`) and the exposition sums every worker's file (the scraped
worker's own counts live), so another worker's inter-token counts can be up to :data:`FLUSH_S` old.
Counts of a worker that died stay in the sum (counters never go back). The engine gauges
(servelab.gateway.enginegauges: each backend's own queue, running and KV figures) are not summed: every
worker scrapes the engines, and ``/metrics`` shows the answering worker's view, so each backend once
(:meth:`GatewayMetrics.add_local`).
"""

from __future__ import annotations

import math
import os
from bisect import bisect_left
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

__all__ = ["CONTENT_TYPE_LATEST", "FLUSH_S", "CountingHistogram", "GatewayMetrics", "multiprocess_dir"]

#: seconds between a worker's writes of its inter-token counts (and connection gauge) in multiprocess mode
FLUSH_S = 1.0


def multiprocess_dir() -> str | None:
    """``PROMETHEUS_MULTIPROC_DIR`` when set (several workers), else None (one process)."""
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


_TTFT_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_ITL_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_E2E_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class GatewayMetrics:
    """The gateway's metric families in their own registry. :meth:`expose` renders the text format.

    Per-model children of the hot-path histograms are cached (``labels()`` costs a dict lookup and a
    lock per call; the stream loop calls :meth:`model` once per request and then uses the children).
    """

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "servelab_gateway_"
        self.requests = Counter(p + "requests_total", "Finished requests", ("model", "backend", "status"), registry=r)
        self.api_requests = Counter(
            p + "api_requests_total", "Finished requests by the API they came in on", ("api", "status"), registry=r
        )
        self.api_tokens = Counter(
            p + "api_tokens_total", "Tokens as reported by the engines, by API", ("api", "direction"), registry=r
        )
        self.stream_errors = Counter(
            p + "stream_errors_total", "200 streams ended by an error or cut off", ("model", "backend"), registry=r
        )
        self.ttft = Histogram(
            p + "ttft_seconds",
            "Time to first token at the gateway",
            ("model", "backend"),
            buckets=_TTFT_BUCKETS_S,
            registry=r,
        )
        # per-token observations: plain counts behind the public collector API (CountingHistogram)
        self.itl = CountingHistogram(
            p + "inter_token_seconds",
            "Time between token chunks at the gateway",
            ("model",),
            _ITL_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            p + "request_duration_seconds",
            "Request received to last byte written",
            ("model", "backend"),
            buckets=_E2E_BUCKETS_S,
            registry=r,
        )
        self.tokens = Counter(
            p + "tokens_total", "Tokens as reported by the engines", ("model", "direction"), registry=r
        )
        self.in_flight = Gauge(
            p + "in_flight", "Requests in flight", ("model",), registry=r, multiprocess_mode="livesum"
        )
        self.retries = Counter(
            p + "retries_total", "Upstream retries before the first byte", ("model", "reason"), registry=r
        )
        self.fallbacks = Counter(p + "fallbacks_total", "Requests answered by a fallback model", ("model",), registry=r)
        self.fallbacks_denied = Counter(
            p + "fallbacks_denied_total",
            "Fallback steps left out because the key/tenant may not use that model",
            ("model", "fallback"),
            registry=r,
        )
        self.breaker_state = Gauge(
            p + "breaker_state",
            "Circuit breaker: 0 closed, 1 half-open, 2 open",
            ("backend",),
            registry=r,
            multiprocess_mode="livemax",
        )
        self.limit_rejections = Counter(
            p + "limit_rejections_total", "Requests refused by a limit", ("limit",), registry=r
        )
        self.reloads = Counter(p + "config_reloads_total", "Config reloads by result", ("result",), registry=r)
        self.connection_events = Counter(
            p + "connection_events_total",
            "Connections closed or refused by the listener (servelab.gateway.listener.EVENTS)",
            ("port", "reason"),
            registry=r,
        )
        self.connections = Gauge(
            p + "connections", "Open client connections", ("port",), registry=r, multiprocess_mode="livesum"
        )
        self.multiproc_dir = multiprocess_dir()
        self._flushed = -1.0
        self._children: dict[tuple[str, str], tuple[Any, Any, Any, Any]] = {}
        self._in_flight: dict[str, Any] = {}
        self._finished: dict[tuple[str, str, int, str], tuple[Any, Any]] = {}
        self._tokens: dict[tuple[str, str, str], tuple[Any, Any]] = {}
        self._local: list[Any] = []

    def model(self, model: str, backend: str | None) -> tuple[Any, Any, Any, Any]:
        """Cached children ``(ttft, inter_token, e2e, in_flight)`` for ``model`` answered by ``backend``
        (None: no backend answered, labelled ``none``); inter_token and in_flight are by model only."""
        key = (model, backend or "none")
        c = self._children.get(key)
        if c is None:
            c = self._children[key] = (
                self.ttft.labels(model, key[1]),
                self.itl.labels(model),
                self.e2e.labels(model, key[1]),
                self.in_flight_of(model),
            )
        return c

    def in_flight_of(self, model: str) -> Any:
        """The cached ``in_flight{model}`` child (counted before any backend is chosen)."""
        g = self._in_flight.get(model)
        if g is None:
            g = self._in_flight[model] = self.in_flight.labels(model)
        return g

    def finished(
        self, model: str, backend: str, status: int, api: str, prompt_tokens: int | None, completion_tokens: int | None
    ) -> None:
        """Count one finished request: ``requests_total{model,backend,status}``, ``api_requests_total{api,status}``
        and, where the engine reported them, its tokens in ``tokens_total`` and ``api_tokens_total``. The
        children are cached by their label values (bounded: models and backends come from the config,
        ``api`` is one of six, statuses a handful), so a request costs dict lookups, not six ``labels()``."""
        c = self._finished.get((model, backend, status, api))
        if c is None:
            st = str(status)
            c = self._finished[(model, backend, status, api)] = (
                self.requests.labels(model, backend, st),
                self.api_requests.labels(api, st),
            )
        c[0].inc()
        c[1].inc()
        if prompt_tokens is not None:
            t = self._token_children(model, api, "prompt")
            t[0].inc(prompt_tokens)
            t[1].inc(prompt_tokens)
        if completion_tokens is not None:
            t = self._token_children(model, api, "completion")
            t[0].inc(completion_tokens)
            t[1].inc(completion_tokens)

    def _token_children(self, model: str, api: str, direction: str) -> tuple[Any, Any]:
        """Cached ``(tokens_total{model,direction}, api_tokens_total{api,direction})`` children."""
        t = self._tokens.get((model, api, direction))
        if t is None:
            t = self._tokens[(model, api, direction)] = (
                self.tokens.labels(model, direction),
                self.api_tokens.labels(api, direction),
            )
        return t

    def add_local(self, collector: Any) -> None:
        """Register ``collector``, a custom collector of what this process itself observed (the engine gauges,
        servelab.gateway.enginegauges), in this registry. In multiprocess mode :meth:`expose` adds it from the
        worker that answers the scrape only: every worker scrapes the same engines, so one worker's view has
        each backend once (summing the workers' views would count each engine's queue N times)."""
        self.registry.register(collector)
        self._local.append(collector)

    def set_breakers(self, states: dict[str, str]) -> None:
        """Set ``breaker_state`` from ``{backend: "closed"|"half_open"|"open"}``."""
        for name, s in states.items():
            self.breaker_state.labels(name).set(_BREAKER_VALUE.get(s, 0))

    def expose(self) -> bytes:
        """The Prometheus text exposition of every family (of every worker in multiprocess mode)."""
        if self.multiproc_dir is None:
            return generate_latest(self.registry)
        from prometheus_client import multiprocess

        self.flush()
        reg = CollectorRegistry()
        multiprocess.MultiProcessCollector(reg, self.multiproc_dir)
        reg.register(_MergedHistogram(self.itl, self.multiproc_dir))
        for c in self._local:
            reg.register(c)
        return generate_latest(reg)

    def flush(self) -> None:
        """Multiprocess mode: write this worker's inter-token counts to ``itl_<pid>.json`` (atomically,
        only when they changed). No-op in one process."""
        if self.multiproc_dir is None:
            return
        state = [[list(v), c.counts, c.sum] for v, c in self.itl._children.items()]
        total = sum(sum(c.counts) + c.sum for c in self.itl._children.values())
        if total == self._flushed:
            return
        path = Path(self.multiproc_dir) / f"itl_{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(state))
        os.replace(tmp, path)
        self._flushed = total


class _MergedHistogram:
    """``inter_token_seconds`` summed over every worker's ``itl_<pid>.json`` (multiprocess mode)."""

    def __init__(self, itl: CountingHistogram, folder: str) -> None:
        self.itl, self.folder = itl, Path(folder)

    def describe(self) -> list[HistogramMetricFamily]:
        return self.itl.describe()

    def collect(self) -> list[HistogramMetricFamily]:
        merged: dict[tuple[str, ...], CountingHistogram._Child] = {}
        for f in sorted(self.folder.glob("itl_*.json")):
            try:
                rows = orjson.loads(f.read_bytes())
            except (OSError, orjson.JSONDecodeError):
                continue  # a worker replacing it right now: counted at the next scrape
            for values, counts, total in rows:
                c = merged.setdefault(tuple(values), CountingHistogram._Child(self.itl.bounds))
                if len(counts) == len(c.counts):
                    c.counts = [a + b for a, b in zip(c.counts, counts, strict=True)]
                    c.sum += total
        return self.itl.family(merged)


class CountingHistogram:
    """A labelled histogram kept as plain bucket counts and exposed through prometheus-client's public
    custom-collector API (``registry.register(obj)`` + ``collect()`` yielding a
    :class:`prometheus_client.core.HistogramMetricFamily`; https://prometheus.github.io/client_python/collector/custom/,
    read 2026-12-01). For the stream loop's per-token inter-token observations: :meth:`_Child.add` is one
    ``bisect`` and a list increment (no lock, no per-bucket scan), about 4x cheaper than
    ``Histogram.observe`` here (0.5 vs 2.2 microseconds a call, prometheus-client 0.26, 2026-12-01).

    Same semantics as :class:`prometheus_client.Histogram`: a value counts in every bucket whose upper
    bound is >= it, ``+Inf`` included, plus ``_sum`` and ``_count``. Single-threaded use (the event loop):
    observations and scrapes run on the same thread. No ``_created`` sample.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.bounds = [float(b) for b in buckets] + [math.inf]
        self._children: dict[tuple[str, ...], CountingHistogram._Child] = {}
        registry.register(self)

    class _Child:
        """One label set's counts (per bucket, not cumulative) and sum."""

        __slots__ = ("bounds", "counts", "sum")

        def __init__(self, bounds: list[float]) -> None:
            self.bounds = bounds
            self.counts = [0] * len(bounds)
            self.sum = 0.0

        def add(self, value_s: float, n: int = 1) -> None:
            """Count ``n`` observations of ``value_s`` (seconds)."""
            self.counts[bisect_left(self.bounds, value_s)] += n
            self.sum += value_s * n

        def observe(self, value_s: float) -> None:
            """One observation (as :meth:`prometheus_client.Histogram.observe`)."""
            self.add(value_s, 1)

    def labels(self, *values: str) -> CountingHistogram._Child:
        """The child of one label set (created at first use)."""
        c = self._children.get(values)
        if c is None:
            c = self._children[values] = CountingHistogram._Child(self.bounds)
        return c

    def describe(self) -> list[HistogramMetricFamily]:
        """The family without samples (registry.register checks names with it)."""
        return [HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)]

    def collect(self) -> list[HistogramMetricFamily]:
        """The family with every child's cumulative buckets, sum and count."""
        return self.family(self._children)

    def family(self, children: dict[tuple[str, ...], CountingHistogram._Child]) -> list[HistogramMetricFamily]:
        """``children`` (label values -> counts) as the exposed family."""
        fam = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, c in children.items():
            acc, buckets = 0, []
            for bound, k in zip(c.bounds, c.counts, strict=True):
                acc += k
                buckets.append((floatToGoString(bound), float(acc)))
            fam.add_metric(list(values), buckets, c.sum)
        return [fam]
