"""The shared layer: OpenAI types, SSE stream accumulation, the async client, errors (:class:`ConfigError`
and engine error normalisation), config files (strict models, YAML, one-line validation errors, published
JSON Schemas: :mod:`servelab.wire.config`), the Prometheus text reader (:mod:`servelab.wire.prometheus`)
and the engine dialect table (:mod:`servelab.wire.dialects`, docs/engine-wire.md).

Every other part (bench, trial, gateway, engines) imports from here and not from each other.
"""

from servelab.wire.client import build_body, make_session, normalize_base_url, send
from servelab.wire.errors import ConfigError, error_from_body, error_from_event
from servelab.wire.stream import StreamParser, apply_event
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, ToolCall, WireError, normalize_finish

__all__ = [
    "ConfigError",
    "FailureClass",
    "RequestRecord",
    "RequestSpec",
    "StreamParser",
    "ToolCall",
    "WireError",
    "apply_event",
    "build_body",
    "error_from_body",
    "error_from_event",
    "make_session",
    "normalize_base_url",
    "normalize_finish",
    "send",
]
