"""OpenTelemetry pieces the gateway's and the bench's traces share: the W3C ``traceparent`` header, the ratio
sampling rule, the GenAI operation of each endpoint, and the tracer provider (OTLP/HTTP exporter behind a batch
processor, with ids planned by the caller).

Nothing here imports OpenTelemetry at module level: :func:`tracer_provider` imports ``opentelemetry-sdk`` and
``opentelemetry-exporter-otlp-proto-http`` (the ``otel`` extra) when called, so a gateway or a bench with
tracing off never loads them.
"""

from __future__ import annotations

import importlib
from typing import Any

from servelab.wire.errors import ConfigError

__all__ = ["OPERATION", "ExportFailures", "ratio_sampled", "require_otel", "traceparent", "tracer_provider"]

#: endpoint -> ``gen_ai.operation.name`` (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/);
#: an endpoint not listed is named as it is
OPERATION = {"chat": "chat", "completions": "text_completion", "embeddings": "embeddings"}
#: the batch processor's wait before exporting what it holds (ms); a full batch (512 spans) leaves at once
EXPORT_DELAY_MS = 1000
_MAX_ID = (1 << 64) - 1


def traceparent(trace_id: int, span_id: int, sampled: bool) -> str:
    """The W3C ``traceparent`` header (version 00) of span ``span_id`` in trace ``trace_id``
    (https://www.w3.org/TR/trace-context/#traceparent-header)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{'01' if sampled else '00'}"


def ratio_sampled(trace_id: int, ratio: float) -> bool:
    """Whether ``TraceIdRatioBased(ratio)`` samples ``trace_id``: its low 64 bits below ``ratio * 2**64``
    (``opentelemetry.sdk.trace.sampling.TraceIdRatioBased``, the rule the gateway's sampler applies), so a
    decision taken without the SDK agrees with one taken with it."""
    bound = round(ratio * (_MAX_ID + 1))
    return trace_id & _MAX_ID < bound


def require_otel(option: str, off: str) -> None:
    """Import what :func:`tracer_provider` needs (``opentelemetry-sdk``, ``opentelemetry-exporter-otlp-proto-http``),
    so a caller can refuse a tracing option before it sets anything up. Raises :class:`ConfigError` (one line
    naming ``option``, the install command and ``off``, how to turn tracing off) when one is not installed."""
    try:
        for name in ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.http.trace_exporter"):
            importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(
            f"{option}: tracing needs OpenTelemetry ({e.name} is not installed); pip install 'servelab[otel]', or {off}"
        ) from None


class ExportFailures:
    """What the exporter of a :func:`tracer_provider` failed to send: ``spans`` and ``batches`` (counts)."""

    def __init__(self) -> None:
        self.spans = 0
        self.batches = 0


def tracer_provider(
    endpoint: str,
    *,
    resource: dict[str, Any],
    export_timeout_s: float,
    option: str,
    off: str,
    schedule_delay_ms: int = EXPORT_DELAY_MS,
) -> tuple[Any, Any, ExportFailures]:
    """A ``TracerProvider`` (sampler ALWAYS_ON: the caller decides what to record) exporting to ``endpoint``
    over OTLP/HTTP protobuf through a ``BatchSpanProcessor``, with ``resource`` attributes, and its id
    source: an object whose ``trace_id``/``span_id`` fields, when set (non-zero), are the ids the next span
    started without a parent gets (each used once; random otherwise), so a span gets the ids a
    ``traceparent`` already carried; and the count of spans the exporter failed to send.
    ``export_timeout_s``: one export's limit (s). Raises :class:`ConfigError` (one line naming ``option`` and
    ``off``, how to turn tracing off) when OpenTelemetry is not installed (:func:`require_otel`)."""
    require_otel(option, off)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult
    from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
    from opentelemetry.sdk.trace.sampling import ALWAYS_ON

    class _Planned(IdGenerator):
        """Hands the SDK the ids already sent on (one pending trace id and span id), else random ones."""

        def __init__(self) -> None:
            self.rand = RandomIdGenerator()
            self.trace_id = 0
            self.span_id = 0

        def generate_span_id(self) -> int:
            v, self.span_id = self.span_id, 0
            return v or self.rand.generate_span_id()

        def generate_trace_id(self) -> int:
            v, self.trace_id = self.trace_id, 0
            return v or self.rand.generate_trace_id()

    failures = ExportFailures()

    class _Counting(OTLPSpanExporter):
        def export(self, spans: Any) -> Any:
            result = super().export(spans)
            if result != SpanExportResult.SUCCESS:
                failures.spans += len(spans)
                failures.batches += 1
            return result

    planned = _Planned()
    provider = TracerProvider(sampler=ALWAYS_ON, resource=Resource.create(resource), id_generator=planned)
    exporter = _Counting(endpoint=endpoint, timeout=export_timeout_s)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=schedule_delay_ms))
    return provider, planned, failures
