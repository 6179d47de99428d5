"""OpenAI-shaped errors of the gateway, with plain user-facing messages.

Every error a client sees has the body OpenAI's API uses,
``{"error": {"message": str, "type": str, "param": str|null, "code": str|null}}``
(https://platform.openai.com/docs/guides/error-codes, checked 2026-11-30), so the official SDKs raise
their usual exception classes (``BadRequestError``, ``AuthenticationError``, ``RateLimitError`` …).
Messages say what happened and what to do ("the model is busy, retry in 2 s"); they never carry a stack
trace, an internal URL, a backend name or an upstream model name; what an engine's error becomes for the
client is decided in :mod:`servelab.gateway.scrub` (one fixed message per error class, the engine's text
to the log only).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import orjson

__all__ = [
    "GatewayError",
    "bad_request",
    "echo",
    "openai_error_body",
    "sanitize_upstream_message",
]

#: OpenAI error ``type`` by HTTP status (the SDKs pick their exception class from the status).
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
    503: "server_error",
    504: "server_error",
}


class GatewayError(Exception):
    """An error answered to the client as an OpenAI-shaped body with HTTP ``status``.

    ``message`` is shown to end users: plain, actionable, no internals. ``type`` defaults from the status
    (``invalid_request_error``, ``authentication_error``, ``permission_error``, ``rate_limit_error``,
    ``server_error``). ``code`` is a stable machine-readable string (``model_not_found``,
    ``context_length_exceeded``, ``rate_limit_exceeded`` …), ``param`` the request field at fault.
    ``retry_after_s`` (seconds, > 0) becomes a ``Retry-After`` header (whole seconds, rounded up).
    ``retryable`` False adds ``x-should-retry: false``, which the OpenAI and Anthropic SDKs obey instead
    of retrying a 5xx on their own (for an answer that no retry can change).
    """

    def __init__(
        self,
        status: int,
        message: str,
        type: str | None = None,
        code: str | None = None,
        param: str | None = None,
        retry_after_s: float | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.code = code
        self.param = param
        self.retry_after_s = retry_after_s
        self.retryable = retryable

    def body(self) -> bytes:
        """The JSON body (bytes) of this error."""
        return openai_error_body(self.message, self.type, self.code, self.param)

    def headers(self) -> dict[str, str]:
        """Extra response headers: ``Retry-After`` (integer seconds, at least 1) when ``retry_after_s`` is set;
        ``x-should-retry: false`` when the error is not ``retryable``."""
        out = {} if self.retryable else {"x-should-retry": "false"}
        if self.retry_after_s is not None:
            out["Retry-After"] = str(max(1, int(-(-self.retry_after_s // 1))))
        return out

    def event(self) -> bytes:
        """This error as one SSE event (``data: {...}\\n\\n``) for a stream that already started."""
        return b"data: " + self.body() + b"\n\n"

    def __repr__(self) -> str:
        return f"GatewayError({self.status}, {self.message!r}, code={self.code!r})"


def openai_error_body(
    message: str, type: str = "invalid_request_error", code: str | None = None, param: str | None = None
) -> bytes:
    """``{"error": {"message", "type", "param", "code"}}`` as bytes (OpenAI's error object)."""
    return orjson.dumps({"error": {"message": message, "type": type, "param": param, "code": code}})


#: most characters of a client's own value (a model name, a field) repeated in an error message
ECHO_CHARS = 100


def echo(value: object, limit: int = ECHO_CHARS) -> str:
    """``value`` (a client's own string) as an error message repeats it: its first ``limit`` characters
    and an ellipsis when longer, so a 100,000-character model name does not come back whole."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "…"


def bad_request(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    """A 400 ``invalid_request_error`` naming ``param``."""
    return GatewayError(400, message, code=code, param=param)


_URL = re.compile(r"\b(?:https?|wss?|tcp|unix)://\S+", re.I)
_HOSTPORT = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\blocalhost(?::\d+)?\b", re.I)
_TRACE = re.compile(r"Traceback \(most recent call last\)|File \"[^\"]+\", line \d+|\bat [\w.$]+\([\w.]+:\d+\)")
_PATH = re.compile(r"(?<![\w.])/(?:[\w.-]+/)+[\w.-]+")
#: marks for a hidden name and for a removed URL, host:port or path while a message is cleaned
_HIDDEN, _GONE = "\x00H\x00", "\x00G\x00"
#: a preposition whose object (a URL, host, path) was removed: "at <url>", "on <host>"
_PLACE_GONE = re.compile(r"\s*\b(?:at|on|from|to|via|in|by|under)\s+\x00G\x00", re.I)
#: a noun whose name was removed or hidden: "model <path>" -> "model"
_NAMED_GONE = re.compile(r"\b(model|file|backend|server|host)\s+\x00[HG]\x00", re.I)


def sanitize_upstream_message(
    message: str, hide: Iterable[str] = (), replace_with: str = "the model", max_chars: int = 300
) -> str | None:
    """An upstream error message made safe to show: URLs, host:port, file paths and every string in
    ``hide`` (backend names, upstream model names) removed; only the first line; at most ``max_chars``.

    Returns ``None`` when the message looks like a stack trace or nothing useful is left, so the caller
    uses its own generic wording instead.
    """
    if not message or _TRACE.search(message):
        return None
    text = message.strip().splitlines()[0] if message.strip() else ""
    for h in sorted((h for h in hide if h), key=len, reverse=True):
        # whole names only: a backend or upstream model "m" must not turn "number" into "nuthe modelber"
        text = re.sub(r"(?<![\w./-])" + re.escape(h) + r"(?![\w/-]|\.\w)", _HIDDEN, text, flags=re.I)
    text = _URL.sub(_GONE, text)
    text = _HOSTPORT.sub(_GONE, text)
    text = _PATH.sub(_GONE, text)
    # the sentence without what was removed: "model /opt/x.gguf at http://h:9000 rejected" reads
    # "model rejected", not "model at rejected"; a hidden name elsewhere reads as ``replace_with``
    text = _PLACE_GONE.sub("", text)
    text = _NAMED_GONE.sub(r"\1", text)
    text = text.replace(_HIDDEN, replace_with).replace(_GONE, "")
    text = re.sub(r"\(\s*[,;]?\s*\)", "", text)
    text = re.sub(r"\s+([,;:)])", r"\1", re.sub(r"\s{2,}", " ", text)).strip(" :;,-")
    if len(text) < 3:
        return None
    return text[:max_chars]
