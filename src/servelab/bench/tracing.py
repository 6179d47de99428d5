"""Client-side OpenTelemetry spans of ``servelab bench`` (``--otlp-endpoint``): one CLIENT span per request, so
one trace runs bench -> gateway -> engine.

Off unless ``--otlp-endpoint`` is given; then ``opentelemetry-sdk`` and the OTLP/HTTP exporter (the ``otel``
extra) are imported by :class:`BenchTracer` (:func:`servelab.wire.otel.tracer_provider`), and nothing of them
otherwise.

Per request, on the hot path, only :meth:`TraceIds.header`: the request's ``traceparent`` (W3C), whose trace id
and span id are drawn from the run's random 128-bit nonce and the request id (BLAKE2b), so they need no
shared state, and whose sampled flag is the ratio rule of ``TraceIdRatioBased(--otlp-sample-ratio)``
(:func:`servelab.wire.otel.ratio_sampled`): a servelab gateway in front continues the trace and follows the
flag. The spans are built after the request ended (:meth:`BenchTracer.add` keeps the record,
:meth:`BenchTracer.flush` builds them when a step ends) with explicit times: start = ``sent_ns``, end =
``end_ns``, the bench's own stamps (``time.monotonic_ns``, moved to the epoch by one offset read when the
tracer starts), so the span and the summary agree. The SDK's batch processor exports them from its own thread;
:meth:`BenchTracer.shutdown` flushes with a bounded wait and says, in one line, what could not be sent.

Span ``{operation} {model}`` (kind CLIENT; attributes per the OpenTelemetry GenAI semantic conventions,
https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/, read 2026-12-02): ``gen_ai.operation.name``
(``chat``, ``text_completion``, ``embeddings``; another endpoint by its name), ``gen_ai.request.model``,
``gen_ai.request.max_tokens``, ``gen_ai.response.model``, ``gen_ai.usage.input_tokens``/``output_tokens``
(the record's ``prompt_tokens``/``output_tokens``, as in ``requests.jsonl``), ``gen_ai.usage.cache_read.
input_tokens``, ``gen_ai.response.finish_reasons``, ``gen_ai.response.time_to_first_chunk`` (s, the bench's
TTFT), ``server.address``/``server.port``, ``http.response.status_code``, ``error.type`` (the failure class)
with status ERROR when the request failed; ``servelab.bench.step`` (label, e.g. ``c4``),
``servelab.bench.step_index``, ``servelab.bench.request_id``, ``servelab.bench.workload``,
``servelab.bench.warmup``; event ``first_token``. No prompt or output text is put in a span.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from servelab.wire.otel import OPERATION, ratio_sampled, require_otel, traceparent, tracer_provider
from servelab.wire.types import RequestRecord

__all__ = ["SHUTDOWN_TIMEOUT_S", "BenchTracer", "TraceIds", "check_installed"]

#: longest wait for one export (s); an unreachable collector costs at most this per try
EXPORT_TIMEOUT_S = 2.0
#: longest wait at the end of the run for the spans still held to leave (s)
SHUTDOWN_TIMEOUT_S = 4.0
#: spans handed to the batch processor between two waits for it to export them: below its queue (2048
#: spans, ``OTEL_BSP_MAX_QUEUE_SIZE``), which drops what does not fit
CHUNK = 1024
#: the option a missing OpenTelemetry install is reported against, and how to run without it
_OPTION, _OFF = "--otlp-endpoint", "leave --otlp-endpoint out"


def check_installed() -> None:
    """Raise :class:`~servelab.wire.errors.ConfigError` (one line naming ``--otlp-endpoint`` and the fix) when
    OpenTelemetry is not installed: the CLI calls it before it makes the run directory or starts an engine."""
    require_otel(_OPTION, _OFF)


@dataclass(frozen=True)
class TraceIds:
    """The trace ids of a run's requests: request ``rid`` -> (trace id, span id, sampled), a pure function
    of the run's ``nonce`` (16 random bytes) and ``rid``; ``ratio``: the share of traces sampled (0-1)."""

    ratio: float = 1.0
    nonce: bytes = field(default_factory=lambda: os.urandom(16))

    def ids(self, rid: int) -> tuple[int, int, bool]:
        """(trace id, span id, sampled) of request ``rid``; both ids non-zero (W3C: all-zero is invalid)."""
        d = hashlib.blake2b(self.nonce + rid.to_bytes(8, "big", signed=True), digest_size=24).digest()
        trace_id = int.from_bytes(d[:16], "big") or 1
        span_id = int.from_bytes(d[16:], "big") or 1
        return trace_id, span_id, ratio_sampled(trace_id, self.ratio)

    def header(self, rid: int) -> str:
        """The ``traceparent`` header request ``rid`` is sent with."""
        return traceparent(*self.ids(rid))


class BenchTracer:
    """The bench's tracer (module doc): ``endpoint`` the OTLP/HTTP traces URL, ``ratio`` the share sampled,
    ``base_url`` the server benchmarked, ``api`` the bench's ``--endpoint``. Raises
    :class:`~servelab.wire.errors.ConfigError` (one line) when OpenTelemetry is not installed."""

    def __init__(self, endpoint: str, ratio: float, base_url: str, api: str) -> None:
        from servelab import __version__

        self.endpoint = endpoint
        self.ids = TraceIds(ratio)
        self.model = ""
        self.operation = OPERATION.get(api, api)
        self._provider, self._planned, self._failures = tracer_provider(
            endpoint,
            resource={"service.name": "servelab-bench"},
            export_timeout_s=EXPORT_TIMEOUT_S,
            option=_OPTION,
            off=_OFF,
        )
        from opentelemetry import trace as api_

        # the exporter's own log lines (a traceback per failed batch) would interleave with the progress bar:
        # what failed is counted and said once, by shutdown
        for name in ("opentelemetry.exporter.otlp.proto.http", "opentelemetry.sdk._shared_internal"):
            logging.getLogger(name).setLevel(logging.CRITICAL)

        self._api = api_
        self._tracer = self._provider.get_tracer("servelab.bench", __version__)
        u = urlsplit(base_url)
        self._server: dict[str, Any] = {"server.address": u.hostname or ""}
        if u.port is not None or u.scheme in ("http", "https"):
            self._server["server.port"] = u.port or (443 if u.scheme == "https" else 80)
        self._epoch_ns = time.time_ns() - time.monotonic_ns()
        self._held: list[tuple[RequestRecord, int]] = []
        self._pending = 0  # spans handed over since the last wait for the exporter
        self._unsent = 0  # spans not built because the collector had already failed
        self.spans = 0

    def add(self, rec: RequestRecord, step_index: int) -> None:
        """Keep finished request ``rec`` (of step ``step_index``) for :meth:`flush`, when it is sampled."""
        if self.ids.ids(rec.request_id)[2]:
            self._held.append((rec, step_index))

    def flush(self) -> None:
        """Build the spans of the requests kept so far and hand them to the batch processor, waiting for it
        to export after every :data:`CHUNK` spans (at most :data:`EXPORT_TIMEOUT_S` s each, so none is dropped
        from its queue); once an export failed, the rest are counted, not built."""
        held, self._held = self._held, []
        for i, (rec, step_index) in enumerate(held):
            if self._pending >= CHUNK:
                self._pending = 0
                done = self._provider.force_flush(timeout_millis=int(EXPORT_TIMEOUT_S * 1000) + 500)
                if not done or self._failures.spans:
                    self._unsent += len(held) - i
                    self._held = []
                    return
            if self._unsent or self._failures.spans:
                self._unsent += len(held) - i
                return
            self._span(rec, step_index)
            self._pending += 1

    def _span(self, rec: RequestRecord, step_index: int) -> None:
        api, base = self._api, self._epoch_ns
        start = rec.sent_ns if rec.sent_ns is not None else rec.scheduled_ns
        end = rec.end_ns if rec.end_ns is not None else start
        a: dict[str, Any] = {
            "gen_ai.operation.name": self.operation,
            "gen_ai.request.model": self.model,
            **self._server,
            "servelab.bench.step": rec.step,
            "servelab.bench.step_index": step_index,
            "servelab.bench.request_id": rec.request_id,
            "servelab.bench.workload": rec.workload,
            "servelab.bench.warmup": rec.warmup,
        }
        for key, v in (
            ("gen_ai.request.max_tokens", rec.max_tokens),
            ("gen_ai.response.model", rec.response_model),
            ("gen_ai.usage.input_tokens", rec.prompt_tokens),
            ("gen_ai.usage.output_tokens", rec.output_tokens),
            ("gen_ai.usage.cache_read.input_tokens", rec.cached_tokens),
            ("http.response.status_code", rec.status),
        ):
            if v is not None:
                a[key] = v
        if rec.finish_reason is not None:
            a["gen_ai.response.finish_reasons"] = [rec.finish_reason]
        if rec.first_token_ns is not None and rec.sent_ns is not None:
            a["gen_ai.response.time_to_first_chunk"] = (rec.first_token_ns - rec.sent_ns) / 1e9
        if rec.failure is not None:
            a["error.type"] = rec.failure.value
        trace_id, span_id, _ = self.ids.ids(rec.request_id)
        self._planned.trace_id, self._planned.span_id = trace_id, span_id
        span = self._tracer.start_span(
            f"{self.operation} {self.model}", kind=api.SpanKind.CLIENT, attributes=a, start_time=base + start
        )
        if rec.first_token_ns is not None:
            span.add_event("first_token", None, base + rec.first_token_ns)
        if rec.failure is not None:
            span.set_status(api.Status(api.StatusCode.ERROR, rec.failure.value))
        span.end(base + end)
        self.spans += 1

    def shutdown(self) -> str | None:
        """Build what is held, export it (waiting at most :data:`SHUTDOWN_TIMEOUT_S` s) and stop the exporter;
        None when every span left, else one line saying how many did not."""
        self.flush()
        done = self._provider.force_flush(timeout_millis=int(SHUTDOWN_TIMEOUT_S * 1000))
        self._provider.shutdown()
        lost = self._failures.spans + self._unsent
        if lost == 0 and done:
            return None
        total = self.spans + self._unsent
        what = f"{lost} of {total} spans" if lost else f"some of {total} spans"
        return (
            f"--otlp-endpoint {self.endpoint}: {what} could not be exported "
            f"(collector unreachable or refusing); the bench's results are unaffected"
        )
