"""What the listener says about a malformed HTTP request: one line and an OpenAI error code per aiohttp
parser error class, built from the class only, never from its message, which quotes the request bytes
(:func:`describe_parse_error`); the raw error response written before any handler exists
(:func:`raw_response`); where in the code an error was raised, without message or locals (:func:`where`)."""

from __future__ import annotations

import traceback

from aiohttp import http_exceptions as hx

from servelab.gateway.errors import openai_error_body

__all__ = ["describe_parse_error", "raw_response", "where"]


def raw_response(
    status: int, reason: str, message: str, code: str, typ: str = "invalid_request_error", extra: str = ""
) -> bytes:
    body = openai_error_body(message, typ, code)
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        f"{extra}Connection: close\r\n\r\n"
    )
    return head.encode() + body


#: parser error class -> (what to log and tell the client, OpenAI error code); the most specific first
_PARSE_ERRORS: tuple[tuple[type[BaseException], str, str], ...] = (
    (
        hx.LineTooLong,
        "a request line or header field is longer than {limit} bytes; send shorter headers "
        "(an API key is under 100 characters)",
        "header_too_large",
    ),
    (
        hx.BadHttpMethod,
        "the request line is not HTTP/1.1 (bytes after a body shorter than its Content-Length, "
        "or HTTPS sent to an HTTP port?); send an exact Content-Length, use http://",
        "bad_http_request",
    ),
    (hx.InvalidHeader, "a header field is malformed; send 'Name: value' lines", "bad_http_header"),
    (hx.InvalidURLError, "the request target is not a valid URL path", "bad_http_request"),
    (
        hx.BadStatusLine,
        "the request line is malformed (bytes after a body shorter than its Content-Length?); "
        "send 'METHOD /path HTTP/1.1' and an exact Content-Length",
        "bad_http_request",
    ),
    (
        hx.TransferEncodingError,
        "the chunked body is malformed; send valid chunked encoding or a Content-Length",
        "bad_http_body",
    ),
    (
        hx.ContentLengthError,
        "the body is shorter than its Content-Length; send exactly that many bytes",
        "bad_http_body",
    ),
    (hx.ContentEncodingError, "the body's Content-Encoding cannot be decoded; send it uncompressed", "bad_http_body"),
    (hx.HttpProcessingError, "the HTTP request is malformed", "bad_http_request"),
)


def describe_parse_error(exc: BaseException | None, limit: int = 8190) -> tuple[str, str]:
    """(one-line description, OpenAI error code) for an aiohttp parser error, built only from its
    class, never from its message (which quotes the request bytes)."""
    if type(exc) is hx.BadHttpMessage and str(getattr(exc, "message", "")).startswith("Data after"):
        # aiohttp's fixed prefix for bytes following a 'Connection: close' request (only the prefix is read)
        return (
            "bytes follow the body of a 'Connection: close' request (is Content-Length shorter than the "
            "body?); send an exact Content-Length"
        ), "bad_http_body"
    for cls, text, code in _PARSE_ERRORS:
        if isinstance(exc, cls):
            return text.format(limit=limit), code
    return "the HTTP request is malformed", "bad_http_request"


def where(exc: BaseException) -> str:
    """``file.py:line in func`` of the innermost frame of ``exc``'s traceback (no message, no locals)."""
    tb = traceback.extract_tb(exc.__traceback__)
    if not tb:
        return "?"
    f = tb[-1]
    return f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno} in {f.name}"
