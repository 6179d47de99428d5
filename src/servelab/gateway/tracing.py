"""OpenTelemetry traces of gateway requests, built from each request's timeline and exported over OTLP/HTTP.

Off unless the config's ``tracing.endpoint`` is set (:class:`~servelab.gateway.config.TracingSection`);
then ``opentelemetry-sdk`` and ``opentelemetry-exporter-otlp-proto-http`` (the ``otel`` extra) are imported,
and a gateway without them refuses to start with one line saying so.

Per request (:class:`Tracing`):

- at arrival (:meth:`Tracing.begin`): the client's W3C ``traceparent``/``tracestate`` are read with
  OpenTelemetry's own propagator; the trace continues the client's trace when it sent a valid one, else a
  new trace id is drawn. Whether the request is traced is decided here, once, by ``ParentBased(
  TraceIdRatioBased(sample_ratio))``: the client's sampled flag when it sent one, else ``sample_ratio``;
- for each upstream attempt (:meth:`RequestTrace.traceparent`): a span id is drawn for the attempt's span
  and sent to the engine as ``traceparent`` (the same trace id; flag 01 when traced), so an engine that
  exports its own spans (vLLM ``--otlp-traces-endpoint``) makes them children of the attempt. Untraced
  requests pass the trace on too (flag 00): the engine and later hops see one trace id;
- at the end (:meth:`Tracing.finish`): nothing was made while the request ran; the spans are built now
  from the timeline (:mod:`servelab.gateway.timeline`) with the ids already drawn, and handed to the SDK's
  batch processor, which exports from its own thread. Nothing is done per token.

Spans of one traced request (timestamps: the gateway's clock; attributes per the OpenTelemetry GenAI
semantic conventions, https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/, plus ``servelab.*``):

- ``{operation} {model}`` (kind SERVER; ``{operation}`` alone when refused before the model was read), the
  whole request, child of the client's span if any:
  ``gen_ai.operation.name`` (``chat``, ``text_completion``, ``embeddings``), ``gen_ai.provider.name`` (the
  answering engine's kind, ``servelab`` when none answered), ``gen_ai.request.model`` (the public model
  asked for), ``gen_ai.response.model`` (the model name the answering engine serves),
  ``gen_ai.request.stream``, ``gen_ai.usage.input_tokens``/``output_tokens`` (tokens),
  ``gen_ai.usage.cache_read.input_tokens`` (prompt tokens the engine took from its cache),
  ``gen_ai.response.time_to_first_chunk`` (s), ``server.address``/``server.port`` (the engine that
  answered), ``http.response.status_code``, ``error.type`` (the error code, or ``client_disconnect``) when it
  did not end well (status ERROR from 500 up); ``servelab.request_id``, ``servelab.tenant``,
  ``servelab.key_id``, ``servelab.backend``, ``servelab.retries``, ``servelab.fallback``; events ``routed``
  (the candidates and why), ``skipped``, ``first_token``, ``last_token``, ``client_left``;
- ``gateway admission`` (INTERNAL): received until admitted or refused; ``servelab.limiter_wait_ms``
  (ms between the checks and the limits' decision); a refusal's ``error.type``, ``servelab.limit``,
  ``servelab.scope``; event ``checked``;
- ``{operation} {backend}`` (CLIENT), one per upstream attempt, its span id the one sent to the engine:
  ``servelab.attempt`` (1 = first), ``servelab.backend``, ``servelab.backend.role``, ``server.address``/
  ``server.port``, ``gen_ai.provider.name``, ``servelab.gateway_in_flight`` (the gateway's other requests
  there), the engine's gauges at their last scrape (``servelab.engine.running``/``waiting``/``slots``,
  ``servelab.engine.kv_usage`` 0-1, ``servelab.engine.gauges_age_s`` s), ``http.response.status_code``,
  ``error.type`` (the failure's cause: a status, ``timeout``, ``connect``...); the engine's own account on
  the attempt that answered (``servelab.engine.prompt_n``/``prompt_ms``/``cache_n``/``predicted_n``/
  ``predicted_ms``/``cached_tokens``: llama.cpp ``timings``, tokens and ms); events ``connected``
  (``reused``), ``headers``, ``first_token``, ``last_token``.

No prompt or output text is put in a span. Only when the request's tenant sets ``log_prompts`` does the
request span carry ``servelab.prompt``: the same redacted text the access log gets. The answer's text is
never kept by the gateway, so it is never in a span.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from servelab.wire.otel import EXPORT_DELAY_MS, OPERATION, traceparent, tracer_provider

if TYPE_CHECKING:
    from servelab.gateway.config import TracingSection
    from servelab.gateway.reqstate import RequestState
    from servelab.gateway.snapshot import Snapshot

__all__ = ["EXPORT_DELAY_MS", "OPERATION", "RequestTrace", "Tracing", "traceparent"]

log = logging.getLogger("servelab.gateway.tracing")

#: engine gauges of the ``attempt`` event -> span attribute
_GAUGES = {
    "running": "servelab.engine.running",
    "waiting": "servelab.engine.waiting",
    "slots": "servelab.engine.slots",
    "kv_usage": "servelab.engine.kv_usage",
    "age_s": "servelab.engine.gauges_age_s",
}


class RequestTrace:
    """The trace of one request while it runs: the trace id, the request span's id, the client's span
    (an OpenTelemetry context, or None), whether it is traced, and the span id drawn for each attempt."""

    __slots__ = ("trace_id", "span_id", "parent", "sampled", "tracestate", "attempts", "_ids")

    def __init__(
        self, trace_id: int, span_id: int, parent: Any, sampled: bool, tracestate: str | None, ids: Any
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent = parent
        self.sampled = sampled
        self.tracestate = tracestate
        #: attempt number (1 = first) -> the span id sent to that attempt's engine
        self.attempts: dict[int, int] = {}
        self._ids = ids

    def headers(self, n: int) -> dict[str, str]:
        """The trace headers for attempt ``n``: ``traceparent`` naming that attempt's span (drawn once
        per attempt), and the client's ``tracestate`` when it sent one."""
        sid = self.attempts.get(n)
        if sid is None:
            sid = self.attempts[n] = self._ids.generate_span_id()
        out = {"traceparent": traceparent(self.trace_id, sid, self.sampled)}
        if self.tracestate:
            out["tracestate"] = self.tracestate
        return out


class Tracing:
    """One gateway's tracer: the OTLP/HTTP exporter behind a batch processor, the sampler and the id
    source. Built by :meth:`from_section` (None when tracing is off); :meth:`shutdown` flushes."""

    def __init__(self, section: TracingSection, worker: int | None = None) -> None:
        attrs: dict[str, Any] = {"service.name": section.service_name}
        if worker is not None:
            attrs["servelab.worker"] = worker
        # the decision is taken at arrival (begin); what reaches finish is to be recorded
        self._provider, self._planned, _ = tracer_provider(
            section.endpoint or "",
            resource=attrs,
            export_timeout_s=section.export_timeout_s,
            option="tracing.endpoint",
            off="set tracing.endpoint: null",
        )
        # tracer_provider imported the SDK (or raised): these come with it
        from opentelemetry import trace as api
        from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._api = api
        self._ids = RandomIdGenerator()
        self._propagator = TraceContextTextMapPropagator()
        self._sampler = ParentBased(TraceIdRatioBased(section.sample_ratio))
        from servelab import __version__

        self._tracer = self._provider.get_tracer("servelab.gateway", __version__)
        self._addresses: dict[str, tuple[str, int | None]] = {}
        self._failed = False

    @classmethod
    def from_section(cls, section: TracingSection, worker: int | None = None) -> Tracing | None:
        """The tracer for ``section``, or None when tracing is off (no ``endpoint``). Raises
        :class:`~servelab.wire.errors.ConfigError` (one line) when OpenTelemetry is not installed."""
        return cls(section, worker) if section.endpoint else None

    def begin(self, headers: Any) -> RequestTrace:
        """The trace of a request whose HTTP headers are ``headers`` (a mapping): the client's
        ``traceparent`` continued when valid, else a new trace; traced or not by the sampler (module doc)."""
        extracted = self._propagator.extract(headers)
        parent = self._api.get_current_span(extracted).get_span_context()
        ctx: Any = None
        if parent.is_valid:
            ctx, trace_id, state = extracted, parent.trace_id, headers.get("tracestate")
        else:
            trace_id, state = self._ids.generate_trace_id(), None
        sampled = self._sampler.should_sample(ctx, trace_id, "request").decision.is_sampled()
        return RequestTrace(
            trace_id,
            self._ids.generate_span_id(),
            ctx,
            sampled,
            state[:512] if isinstance(state, str) else None,
            self._ids,
        )

    def finish(self, r: RequestState, e2e_ns: int, snap: Snapshot) -> None:
        """Build and hand over the spans of finished request ``r`` (module doc) if it is traced;
        ``e2e_ns``: received to last byte (ns). A failure here is logged once, never raised."""
        t = r.trace
        if t is None or not t.sampled:
            return
        try:
            self._emit(r, t, e2e_ns, snap)
        except Exception:  # tracing must never fail a request
            if not self._failed:
                self._failed = True
                log.exception("request %s: its spans could not be built (further failures are not logged)", r.rid)

    def shutdown(self) -> None:
        """Export what is held and stop the exporter's thread (blocks up to the export timeout)."""
        self._provider.shutdown()

    # ------------------------------------------------------------------ building the spans
    def _address(self, snap: Snapshot, backend: str | None) -> tuple[str, int | None] | None:
        b = snap.backends.get(backend) if backend else None
        if b is None:
            return None
        hit = self._addresses.get(b.base_url)
        if hit is None:
            u = urlsplit(b.base_url)
            hit = self._addresses[b.base_url] = (u.hostname or "", u.port)
        return hit

    def _start(
        self, name: str, span_id: int, parent: Any, kind: Any, attrs: dict[str, Any], at_ns: int, trace_id: int = 0
    ) -> Any:
        self._planned.trace_id, self._planned.span_id = trace_id, span_id
        return self._tracer.start_span(name, context=parent, kind=kind, attributes=attrs, start_time=at_ns)

    def _emit(self, r: RequestState, t: RequestTrace, e2e_ns: int, snap: Snapshot) -> None:
        api = self._api
        base = int(r.ts * 1e9) - r.t0_ns  # monotonic ns -> epoch ns
        events = sorted(r.timeline.events, key=lambda e: e[1])
        op = OPERATION.get(r.endpoint, r.endpoint)
        root = self._start(
            f"{op} {r.model}" if r.model != "-" else op,
            t.span_id,
            t.parent,
            api.SpanKind.SERVER,
            self._root_attrs(r, op, snap),
            base + r.t0_ns,
            t.trace_id,
        )
        under = api.set_span_in_context(root)
        self._admission(events, under, base, r.t0_ns)
        self._attempts(r, t, events, under, base, op, snap, r.t0_ns + e2e_ns)
        for name, at, attrs in events:
            if name == "routed" and attrs:
                root.add_event(
                    "routed",
                    {
                        "why": str(attrs.get("why", "")),
                        "candidates": [f"{c[0]} {c[1]} in_flight={c[2]}" for c in attrs.get("candidates", ())],
                    },
                    base + at,
                )
            elif name == "skipped" and attrs:
                root.add_event(
                    "skipped", {"backend": str(attrs.get("backend")), "why": str(attrs.get("why"))}, base + at
                )
            elif name in ("first_token", "last_token", "client_left"):
                root.add_event(name, None, base + at)
        if r.status >= 500:
            root.set_status(api.Status(api.StatusCode.ERROR, r.error_code or str(r.status)))
        root.end(base + r.t0_ns + e2e_ns)

    def _root_attrs(self, r: RequestState, op: str, snap: Snapshot) -> dict[str, Any]:
        b = snap.backends.get(r.backend) if r.backend else None
        a: dict[str, Any] = {
            "gen_ai.operation.name": op,
            "gen_ai.provider.name": b.kind if b else "servelab",
            "gen_ai.request.stream": r.stream,
            "http.response.status_code": r.status,
            "servelab.request_id": r.rid,
            "servelab.tenant": r.tenant,
            "servelab.key_id": r.key_id,
            "servelab.retries": r.retries,
            "servelab.fallback": r.fallback,
        }
        if r.model != "-":  # "-": refused before its model was read
            a["gen_ai.request.model"] = r.model
        if r.upstream_model:
            a["gen_ai.response.model"] = r.upstream_model
        if r.backend:
            a["servelab.backend"] = r.backend
        addr = self._address(snap, r.backend)
        if addr is not None:
            a["server.address"] = addr[0]
            if addr[1] is not None:
                a["server.port"] = addr[1]
        if r.prompt_tokens is not None:
            a["gen_ai.usage.input_tokens"] = r.prompt_tokens
        if r.completion_tokens is not None:
            a["gen_ai.usage.output_tokens"] = r.completion_tokens
        cached = (r.timeline.engine or {}).get("cached_tokens", (r.timeline.engine or {}).get("cache_n"))
        if isinstance(cached, int):
            a["gen_ai.usage.cache_read.input_tokens"] = cached
        if r.ttft_ns is not None:
            a["gen_ai.response.time_to_first_chunk"] = round(r.ttft_ns / 1e9, 6)
        if r.status >= 400 or r.outcome != "ok":
            a["error.type"] = r.error_code or (r.outcome if r.outcome != "ok" else str(r.status))
        if r.client_rid:
            a["servelab.client_request_id"] = r.client_rid
        if r.prompt_text is not None:  # the tenant's log_prompts: the access log's redacted text
            a["servelab.prompt"] = r.prompt_text
        return a

    def _admission(self, events: list[Any], under: Any, base: int, t0_ns: int) -> None:
        checked = next((at for name, at, _ in events if name == "checked"), None)
        end = next(((name, at, attrs) for name, at, attrs in events if name in ("admitted", "refused")), None)
        if end is None:
            return
        name, at, attrs = end
        a: dict[str, Any] = {}
        if name == "admitted" and checked is not None:
            a["servelab.limiter_wait_ms"] = round((at - checked) / 1e6, 3)
        elif name == "refused" and attrs:
            a["error.type"] = str(attrs.get("code") or attrs.get("status"))
            a["http.response.status_code"] = attrs.get("status", 0)
            for k in ("limit", "scope", "retry_after_s"):
                if attrs.get(k) is not None:
                    a[f"servelab.{k}"] = attrs[k]
        span = self._start("gateway admission", 0, under, self._api.SpanKind.INTERNAL, a, base + t0_ns)
        if checked is not None:
            span.add_event("checked", None, base + checked)
        span.end(base + at)

    def _attempts(
        self,
        r: RequestState,
        t: RequestTrace,
        events: list[Any],
        under: Any,
        base: int,
        op: str,
        snap: Snapshot,
        last_ns: int,
    ) -> None:
        api = self._api
        # group the events of each attempt: those between its ``attempt`` and the next one
        groups: list[dict[str, Any]] = []
        end_ns = r.t0_ns
        for name, at, attrs in events:
            end_ns = max(end_ns, at)
            if name == "attempt" and attrs:
                groups.append({"start": at, "attrs": attrs, "events": [], "end": None, "failed": None, "status": None})
            elif groups and groups[-1]["end"] is None:
                g = groups[-1]
                if name == "failed":
                    g["end"], g["failed"] = at, attrs or {}
                elif name == "headers":
                    g["status"] = (attrs or {}).get("status")
                    g["events"].append((name, at, None))
                elif name == "connected":
                    g["events"].append((name, at, {"reused": bool((attrs or {}).get("reused"))}))
                elif name in ("first_token", "last_token"):
                    g["events"].append((name, at, None))
        for i, g in enumerate(groups):
            at_attrs = g["attrs"]
            n, backend = int(at_attrs.get("n", i + 1)), str(at_attrs.get("backend"))
            b = snap.backends.get(backend)
            a: dict[str, Any] = {
                "gen_ai.operation.name": op,
                "gen_ai.provider.name": b.kind if b else "unknown",
                "servelab.attempt": n,
                "servelab.backend": backend,
                "servelab.backend.role": str(at_attrs.get("role")),
                "servelab.gateway_in_flight": int(at_attrs.get("in_flight", 0)),
            }
            addr = self._address(snap, backend)
            if addr is not None:
                a["server.address"] = addr[0]
                if addr[1] is not None:
                    a["server.port"] = addr[1]
            for k, attr in _GAUGES.items():
                v = at_attrs.get(k)
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    a[attr] = v
            if g["status"] is not None:
                a["http.response.status_code"] = g["status"]
            failed = g["failed"]
            if failed is not None:
                a["error.type"] = str(failed.get("cause") or failed.get("code"))
            elif i == len(groups) - 1 and r.timeline.engine:
                for k, v in r.timeline.engine.items():
                    a[f"servelab.engine.{k}"] = v
            sid = t.attempts.get(n, 0)  # 0: no header was sent (an attempt that failed before): a random id
            span = self._start(f"{op} {backend}", sid, under, api.SpanKind.CLIENT, a, base + g["start"])
            for name, at, ev_attrs in g["events"]:
                span.add_event(name, ev_attrs, base + at)
            if failed is not None:
                span.set_status(api.Status(api.StatusCode.ERROR, a["error.type"]))
            end = g["end"] if g["end"] is not None else (groups[i + 1]["start"] if i + 1 < len(groups) else end_ns)
            span.end(base + min(end, last_ns))  # within the request span ("done" is marked just after)
