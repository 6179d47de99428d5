"""The shared wire layer: OpenAI types, SSE stream accumulation, the async client, error normalisation.

Every other part (bench, trial, gateway, engines) imports from here and not from each other.
"""

from servelab.wire.client import ConfigError, build_body, make_session, normalize_base_url, send
from servelab.wire.errors import error_from_body, error_from_event
from servelab.wire.stream import StreamParser, apply_event
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, ToolCall, WireError, normalize_finish

__all__ = [
    "ConfigError", "FailureClass", "RequestRecord", "RequestSpec", "StreamParser", "ToolCall", "WireError",
    "apply_event", "build_body", "error_from_body", "error_from_event", "make_session", "normalize_base_url",
    "normalize_finish", "send",
]
