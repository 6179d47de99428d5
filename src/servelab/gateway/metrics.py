"""Prometheus metrics of the gateway, with stable names (docs/gateway-design.md).

Names (all prefixed ``servelab_gateway_``; seconds and token counts as the suffixes say):

- ``requests_total{model,backend,status}`` counter: finished requests by public model, backend that
  answered (``none`` when none did) and HTTP status (a stream that failed after its 200 counts as ``200``
  plus ``stream_errors_total``);
- ``stream_errors_total{model,backend}`` counter: 200 streams that ended in an error event or cut off;
- ``ttft_seconds{model}`` histogram: request received -> first token-carrying chunk written to the client
  (never the role-only chunk or the headers, ENGINE_WIRE.md case 1), measured at the gateway;
- ``inter_token_seconds{model}`` histogram: time between token-carrying chunks written to the client
  (a read carrying k events adds k observations of gap/k);
- ``request_duration_seconds{model}`` histogram: E2E, request received -> last byte written;
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
gateway's own overhead (target: added TTFT P99 <= 2 ms) and engine-scale latencies alike.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

__all__ = ["CONTENT_TYPE_LATEST", "GatewayMetrics", "HistogramBatch"]

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
        self.stream_errors = Counter(p + "stream_errors_total", "200 streams ended by an error or cut off",
                                     ("model", "backend"), registry=r)
        self.ttft = Histogram(p + "ttft_seconds", "Time to first token at the gateway", ("model",),
                              buckets=_TTFT_BUCKETS_S, registry=r)
        self.itl = Histogram(p + "inter_token_seconds", "Time between token chunks at the gateway", ("model",),
                             buckets=_ITL_BUCKETS_S, registry=r)
        self.e2e = Histogram(p + "request_duration_seconds", "Request received to last byte written", ("model",),
                             buckets=_E2E_BUCKETS_S, registry=r)
        self.tokens = Counter(p + "tokens_total", "Tokens as reported by the engines", ("model", "direction"),
                              registry=r)
        self.in_flight = Gauge(p + "in_flight", "Requests in flight", ("model",), registry=r)
        self.retries = Counter(p + "retries_total", "Upstream retries before the first byte", ("model", "reason"),
                               registry=r)
        self.fallbacks = Counter(p + "fallbacks_total", "Requests answered by a fallback model", ("model",),
                                 registry=r)
        self.fallbacks_denied = Counter(p + "fallbacks_denied_total", "Fallback steps left out because the "
                                        "key/tenant may not use that model", ("model", "fallback"), registry=r)
        self.breaker_state = Gauge(p + "breaker_state", "Circuit breaker: 0 closed, 1 half-open, 2 open",
                                   ("backend",), registry=r)
        self.limit_rejections = Counter(p + "limit_rejections_total", "Requests refused by a limit", ("limit",),
                                        registry=r)
        self.reloads = Counter(p + "config_reloads_total", "Config reloads by result", ("result",), registry=r)
        self.connection_events = Counter(p + "connection_events_total", "Connections closed or refused by the "
                                         "listener (servelab.gateway.listener.EVENTS)", ("port", "reason"),
                                         registry=r)
        self.connections = Gauge(p + "connections", "Open client connections", ("port",), registry=r)
        self._children: dict[str, tuple[Any, Any, Any, Any]] = {}

    def model(self, model: str) -> tuple[Any, Any, Any, Any]:
        """Cached children ``(ttft, inter_token, e2e, in_flight)`` for ``model``."""
        c = self._children.get(model)
        if c is None:
            c = self._children[model] = (self.ttft.labels(model), self.itl.labels(model), self.e2e.labels(model),
                                         self.in_flight.labels(model))
        return c

    def set_breakers(self, states: dict[str, str]) -> None:
        """Set ``breaker_state`` from ``{backend: "closed"|"half_open"|"open"}``."""
        for name, s in states.items():
            self.breaker_state.labels(name).set(_BREAKER_VALUE.get(s, 0))

    def expose(self) -> bytes:
        """The Prometheus text exposition of every family."""
        return generate_latest(self.registry)


class HistogramBatch:
    """Observations of one histogram child counted locally (one ``bisect`` per value, no lock) and added
    to the child in one :meth:`flush`: the streaming loop's per-token inter-token observations cost a
    list increment instead of ``Histogram.observe`` (a lock and a bucket scan per call).

    The result equals calling ``child.observe(v)`` for every value (same buckets: ``v <= upper bound``,
    same sum). Uses the child's bucket list of prometheus-client (``_upper_bounds``/``_buckets``/
    ``_sum``, stable since 0.4); if a version lacks them, :meth:`add` falls back to ``observe``.
    """

    __slots__ = ("_child", "_bounds", "_counts", "_sum")

    def __init__(self, child: Any) -> None:
        self._child = child
        bounds = getattr(child, "_upper_bounds", None)
        if not (hasattr(child, "_buckets") and hasattr(child, "_sum")):
            bounds = None
        self._bounds: list[float] | None = list(bounds) if bounds is not None else None
        self._counts = [0] * len(self._bounds) if self._bounds is not None else []
        self._sum = 0.0

    def add(self, value_s: float, n: int = 1) -> None:
        """Count ``n`` observations of ``value_s``."""
        if self._bounds is None:
            for _ in range(n):
                self._child.observe(value_s)
            return
        self._counts[bisect_left(self._bounds, value_s)] += n
        self._sum += value_s * n

    def flush(self) -> None:
        """Add what was counted to the histogram (call once the stream ended; safe to call again)."""
        if self._bounds is None:
            return
        child, counts = self._child, self._counts
        for i, c in enumerate(counts):
            if c:
                child._buckets[i].inc(c)
                counts[i] = 0
        if self._sum:
            child._sum.inc(self._sum)
            self._sum = 0.0
