"""What this box itself allows for timing: the floor a timing test compares servelab with.

On a virtual machine whose host deschedules its vCPUs for milliseconds (this one: a busy loop sees
1-2 gaps of 1-5 ms per second per vCPU while both run; a blocking-socket reader of the mock's stream
reads a chunk up to 2.7-3.7 ms after the mock wrote it, P99 1.2-1.4 ms, 2026-12-01), no client can
measure every chunk within 1 ms of the engine's own stamps, and a timer cannot fire within 1 ms at
P99. These helpers measure that floor with the least code possible (blocking calls, no event loop,
no HTTP library), so a test can hold servelab to "within X of what the box allows" in the same run.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

_now = time.monotonic_ns


def _token_events(data: bytes) -> int:
    """Token-carrying SSE events in ``data`` (whole events only: every mock write is whole events).

    A token event is a ``data: {...}`` JSON line whose first choice carries non-empty ``delta.content``,
    ``delta.tool_calls`` or ``text`` (the role-only first chunk and the usage/finish trailer are not).
    """
    n = 0
    for line in data.split(b"\n"):
        if not line.startswith(b"data: {"):
            continue
        try:
            obj = json.loads(line[6:])
        except ValueError:
            continue
        choices = obj.get("choices") or []
        if not choices:
            continue
        c = choices[0]
        delta = c.get("delta") or {}
        if delta.get("content") or delta.get("tool_calls") or c.get("text"):
            n += 1
    return n


def raw_stream_stamps(
    base_url: str, body: dict[str, Any], request_ids: list[int], path: str = "/chat/completions"
) -> dict[int, list[int]]:
    """Send each request (``X-Request-Id``) in turn on one keep-alive TCP connection with blocking
    ``sendall``/``recv`` and return ``{request_id: [monotonic ns of the recv that brought each token
    event]}``: the read stamps a client without an event loop, HTTP library or SSE parser gets.

    ``base_url`` is the OpenAI API root (``http://host:port/v1``). Raises AssertionError when the
    stream does not end with ``[DONE]`` within 30 s.
    """
    u = urlsplit(base_url)
    hostport, prefix = u.netloc, u.path.rstrip("/")
    host, port = u.hostname or "127.0.0.1", u.port or 80
    payload = json.dumps({**body, "stream": True}).encode()
    out: dict[int, list[int]] = {}
    with socket.create_connection((host, port), timeout=30) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for rid in request_ids:
            head = (
                f"POST {prefix}{path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\n"
                f"X-Request-Id: {rid}\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            s.sendall(head + payload)
            stamps: list[int] = []
            tail = b""
            while True:
                b = s.recv(65536)
                t = _now()
                assert b, "the mock closed the connection before [DONE]"
                whole, _, tail = (tail + b).rpartition(b"\n\n")
                stamps += [t] * _token_events(whole)
                if b"[DONE]" in whole:
                    break
            # the chunked body's terminator "0\r\n\r\n" may follow in its own write: drain it
            s.settimeout(0.05)
            try:
                while not tail.endswith(b"0\r\n\r\n"):
                    more = s.recv(65536)
                    if not more:
                        break
                    tail += more
            except TimeoutError:
                pass
            s.settimeout(30)
            out[rid] = stamps
    return out


def mock_records(root: str, reset: bool = False) -> dict[str, Any]:
    """The mock's ``/mock/records`` keyed by request id (str); with ``reset`` it is cleared afterwards."""
    with urllib.request.urlopen(root + "/mock/records", timeout=10) as r:
        recs = {str(x["request_id"]): x for x in json.loads(r.read())}
    if reset:
        urllib.request.urlopen(urllib.request.Request(root + "/mock/reset", method="POST"), timeout=10).read()
    return recs


def timer_lateness_ns(offsets_ns: list[int]) -> list[int]:
    """Sleep (``time.sleep``: one clock_nanosleep, blocking) until each offset from now and return how
    late each wake-up was, in ns: the timer + scheduler floor of this box for that schedule."""
    t0 = _now() + 2_000_000
    late: list[int] = []
    for off in offsets_ns:
        target = t0 + off
        rem = target - _now()
        if rem > 0:
            time.sleep(rem / 1e9)
        late.append(max(0, _now() - target))
    return late
