"""The gateway's one SSE splitter.

The relay (:mod:`servelab.gateway.relay`) forwards an engine's stream read by read and must not parse
what it only passes on, so it works on *blocks*: the complete events a read completed, as bytes
(:func:`split_complete`), and looks inside a block only when it must (:func:`events`). Whole-stream
parsing with timing, for the shadow comparison, is the wire layer's
:class:`servelab.wire.stream.StreamParser`; both read the same SSE framing (``data:`` lines, events
ended by a blank line, ``\\r\\n`` accepted; https://html.spec.whatwg.org/multipage/server-sent-events.html,
read 2026-12-01) and the relay asks the wire layer's :func:`servelab.wire.stream.choices_carry_token` whether a
chunk carries a token, the rule the measurements stamp ``chunk_ns`` by.
"""

from __future__ import annotations

from collections.abc import Iterator

__all__ = ["DONE", "DONE_EVENT", "count_token_events", "events", "split_complete"]

#: the payload and the whole event that end an OpenAI stream
DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


def split_complete(buf: bytes) -> tuple[bytes, bytes] | None:
    """``buf`` (bytes read so far) as (complete events, the incomplete rest), or None when no event is
    complete yet. ``\\r\\n`` line ends are turned into ``\\n`` when the buffer holds no ``\\n\\n`` (an engine
    that uses them everywhere); the block ends with ``\\n\\n``."""
    end = buf.rfind(b"\n\n")
    if end < 0:
        if b"\r\n\r\n" not in buf:
            return None
        buf = buf.replace(b"\r\n", b"\n")
        end = buf.rfind(b"\n\n")
    return buf[: end + 2], buf[end + 2 :]


def events(block: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Each non-empty event of ``block`` (complete events, :func:`split_complete`) as (its raw bytes
    without the blank line, its ``data`` payload: the ``data:`` lines joined by ``\\n``, one leading space
    dropped per line)."""
    for ev in block.split(b"\n\n"):
        if ev.strip():
            yield ev, b"\n".join(line[5:].lstrip(b" ") for line in ev.split(b"\n") if line.startswith(b"data:"))


def count_token_events(block: bytes) -> int:
    """Token-carrying events in ``block`` by a bytes count (no JSON parse; the relay's estimate once the
    first token passed): ``data:`` lines that are not ``[DONE]``, an empty delta or empty content."""
    return (
        block.count(b"data:")
        - block.count(b"data: [DONE]")
        - block.count(b'"delta":{}')
        - block.count(b'"content":""')
        - block.count(b'"text":""')
    )
