"""servelab's errors: :class:`ConfigError` (bad user input, every part raises it) and the normalisation
of engine error bodies across dialects (docs/engine-wire.md cases 15, 17, 18, 19).

Three error body shapes exist in the wild (:data:`servelab.wire.dialects.ErrorShape`, each dialect's in
the dialect table):

- nested ``{"error": {"message", "type", "code"}}`` — OpenAI, vLLM, llama-server, Ollama (``code`` int or str);
- flat ``{"object": "error", "message", "type", "code"}`` — SGLang, old vLLM;
- TGI's ``{"error": "text", "error_type": "validation"}``.
"""

from __future__ import annotations

from typing import Any

import orjson

from servelab.wire.dialects import DIALECTS
from servelab.wire.types import WireError

__all__ = ["RETRYABLE_STATUS", "ConfigError", "error_from_body", "error_from_event", "is_context_overflow"]


class ConfigError(ValueError):
    """Bad user input (a URL, an option, a file, a field): its message is one line that names the problem
    and the fix. The ``servelab`` CLI prints it as ``servelab: error: MESSAGE`` and exits 2; the gateway
    shows it in its log and admin API when a reload fails."""


#: Statuses worth a retry before the first byte: the engines' "overloaded" answers (docs/engine-wire.md case 19).
RETRYABLE_STATUS = frozenset(
    d.stream.overload_status for d in DIALECTS.values() if d.stream is not None and d.stream.overload_status is not None
)


def error_from_event(event: Any, status: int | None) -> WireError | None:
    """Return the :class:`WireError` an event or body carries, or ``None`` if it carries none.

    ``event`` is a decoded JSON value (any type: non-dicts carry no error). ``status`` is the HTTP
    status of the response it came in (200 for an error inside a stream).
    """
    if not isinstance(event, dict):
        return None
    err = event.get("error")
    if isinstance(err, dict):
        msg = err.get("message")
        return WireError(
            status=status, message=str(msg if msg is not None else err), type=err.get("type"), code=err.get("code")
        )
    if isinstance(err, str):
        return WireError(status=status, message=err, type=event.get("error_type"), code=event.get("code"))
    if event.get("object") == "error":
        return WireError(
            status=status, message=str(event.get("message", "")), type=event.get("type"), code=event.get("code")
        )
    return None


def error_from_body(body: bytes, status: int | None) -> WireError:
    """Normalise a whole non-2xx response body. Never raises: a body that is not JSON becomes the
    message (first 300 characters), so an HTML error page from a proxy is still reported."""
    try:
        decoded = orjson.loads(body)
    except orjson.JSONDecodeError:
        decoded = None
    found = error_from_event(decoded, status)
    if found is not None:
        return found
    text = body.decode("utf-8", "replace").strip()
    return WireError(status=status, message=text[:300] or f"HTTP {status}")


def is_context_overflow(error: WireError) -> bool:
    """True when an error says the prompt does not fit the context (docs/engine-wire.md case 18):
    llama-server's ``exceed_context_size_error``, vLLM/SGLang 400s naming the context length, TGI 422."""
    text = f"{error.type} {error.code} {error.message}".lower()
    return (
        "exceed_context_size" in text
        or "context length" in text
        or "context_length" in text
        or "maximum context" in text
        or ("input validation" in text and "tokens" in text)
        or (error.status == 422 and "token" in text)
    )
