"""Reading a request body: its size bound, and its ``Content-Encoding``.

aiohttp's server parser inflates a compressed request body by itself, in the event loop, before the
handler can say no (aiohttp 3.14.5 ``HttpRequestParser(auto_decompress=True)``, the default): a 1 MB gzip
of zeros became 1 GB in the loop, stalling every stream, even for a request answered 401 or 413 (break-it
report on 4b30bb7, defect 4), and a corrupt gzip body was a 500 with a traceback (defect 3). So the
gateway's listeners run with ``auto_decompress=False`` (:class:`~servelab.gateway.listener.GuardedRunner`)
and the body is read here, after authentication:

- no ``Content-Encoding`` (or ``identity``): read up to ``limit_bytes``, else 413;
- ``gzip``/``x-gzip``/``deflate`` with ``server.request_compression: false`` (the default): 415
  ``unsupported_content_encoding`` (nginx passes a compressed body on unchanged and OpenAI's API takes
  none, so clients rarely send one);
- with ``server.request_compression: true``: inflated piece by piece with :mod:`zlib` as the compressed
  bytes arrive, each piece bounded (``max_length``) so the inflated size is checked every piece and never
  grows past ``limit_bytes`` (413), and the loop is yielded to between pieces; a corrupt stream is 400
  ``invalid_body_encoding`` with one rate-limited log line (no traceback, no body byte);
- any other encoding (``br``, ``zstd``, a list of several): 415 naming what is accepted.

``deflate`` is read as zlib-wrapped (RFC 9110 section 8.4.1.2) or raw (what some clients send), like
aiohttp's own decoder.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from typing import Any

from servelab.gateway.errors import GatewayError, bad_request
from servelab.gateway.listener import RateLimitedLog

__all__ = ["ACCEPTED_ENCODINGS", "INFLATE_PIECE_BYTES", "read_body"]

log = logging.getLogger("servelab.gateway.bodies")
_ratelog = RateLimitedLog(log)

#: Content-Encoding values inflated when ``server.request_compression`` is on
ACCEPTED_ENCODINGS = ("gzip", "x-gzip", "deflate")
#: most inflated bytes made per zlib call (then the size check, and a yield to the loop)
INFLATE_PIECE_BYTES = 256 * 1024
_READ_BYTES = 65536


def _too_big(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"the request body is larger than this gateway's limit of {limit} bytes; send a shorter prompt",
        code="request_too_large",
    )


async def read_body(request: Any, limit_bytes: int, allow_compressed: bool) -> bytes:
    """The body of ``request`` (an aiohttp request whose parser did not inflate it), inflated when its
    ``Content-Encoding`` is accepted (module doc). Raises GatewayError 413 above ``limit_bytes`` (raw, or
    inflated), 415 for a Content-Encoding not taken, 400 ``invalid_body_encoding`` for a corrupt one."""
    enc = request.headers.get("Content-Encoding", "").strip().lower()
    if enc in ("", "identity"):
        if request.content_length is not None and request.content_length > limit_bytes:
            raise _too_big(limit_bytes)
        chunks = []
        size = 0
        while chunk := await request.content.read(_READ_BYTES):
            size += len(chunk)
            if size > limit_bytes:
                raise _too_big(limit_bytes)
            chunks.append(chunk)
        return b"".join(chunks)
    if enc not in ACCEPTED_ENCODINGS or not allow_compressed:
        taken = (
            "gzip or deflate (server.request_compression is on)"
            if allow_compressed
            else "none (server.request_compression is off)"
        )
        raise GatewayError(
            415,
            f"this gateway does not take request bodies with Content-Encoding {enc[:40]!r}; "
            f"send the body uncompressed (accepted encodings: {taken})",
            code="unsupported_content_encoding",
        )
    if request.content_length is not None and request.content_length > limit_bytes:
        raise _too_big(limit_bytes)  # the compressed body alone is already too large
    d: Any = zlib.decompressobj(wbits=31 if enc != "deflate" else 15)
    first = True
    out: list[bytes] = []
    size = raw_size = 0
    try:
        while True:
            chunk = await request.content.read(_READ_BYTES)
            if not chunk:
                break
            raw_size += len(chunk)
            if raw_size > limit_bytes:
                raise _too_big(limit_bytes)
            if first and enc == "deflate" and (chunk[0] & 0x0F) != 8:  # no zlib header: raw deflate
                d = zlib.decompressobj(wbits=-15)
            first = False
            data = chunk
            while data:
                piece = d.decompress(data, INFLATE_PIECE_BYTES)
                size += len(piece)
                if size > limit_bytes:
                    raise _too_big(limit_bytes)
                out.append(piece)
                data = d.unconsumed_tail
                if d.eof and d.unused_data and enc != "deflate":  # gzip: the next member (RFC 1952 2.2)
                    data = d.unused_data
                    d = zlib.decompressobj(wbits=31)
                if data:
                    await asyncio.sleep(0)  # a long run of pieces never holds the loop
        if not d.eof:
            raise zlib.error("truncated stream")
    except zlib.error as e:
        _ratelog("request body with Content-Encoding %s could not be inflated: %s", enc, str(e)[:80])
        raise bad_request(
            f"the request body's Content-Encoding {enc} cannot be decoded (corrupt or truncated); "
            "send the body uncompressed or valid " + enc,
            code="invalid_body_encoding",
        ) from None
    return b"".join(out)
