"""Break-it report on 4b30bb7, lesser defect "no send timeout": a client that never read its stream kept
its connection and the upstream one 100 s+ (never idle, so the connection cap could not evict it). Now
``server.send_timeout_s`` (nginx send_timeout) cuts it and releases the upstream; a slow client that keeps
reading is not cut (the timer runs only while the write buffer is full: servelab.gateway.listener)."""

from __future__ import annotations

import socket
import time
from typing import Any

import orjson
from conftest import gateway_key

TOKENS = 30000  # ~6 MB of SSE: more than the socket buffers on loopback hold


def _request(gw: Any, key: str) -> bytes:
    body = orjson.dumps(
        {"model": "m", "stream": True, "max_tokens": TOKENS, "messages": [{"role": "user", "content": "hi"}]}
    )
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def _connect(gw: Any, rcvbuf: int = 4096) -> socket.socket:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", int(gw.url.rsplit(":", 1)[1].split("/")[0])))
    return s


def test_client_that_reads_nothing_is_cut_and_slow_reader_is_not(gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "vllm", "--output-tokens", str(TOKENS))
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"send_timeout_s": 1.5, "max_tokens_limit": TOKENS},
            "backends": [{"name": "b", "kind": "vllm", "base_url": eng.root, "models": ["m"], "read_timeout_s": 120}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    # a slow reader: <= 32 KB every 0.3 s for 4 s (longer than the send timeout), then all of it
    slow = _connect(gw, 65536)
    slow.sendall(_request(gw, key))
    got = bytearray()
    t0 = time.monotonic()
    while time.monotonic() - t0 < 4.0:
        got += slow.recv(32768)
        time.sleep(0.3)
    slow.settimeout(60)
    while not (got.endswith(b"\r\n0\r\n\r\n") and b"data: [DONE]" in got[-100:]) and (chunk := slow.recv(1 << 20)):
        got += chunk
    slow.close()
    assert got.endswith(b"0\r\n\r\n") and b"data: [DONE]" in got[-200:], (
        bytes(got[-300:]),
        gw.stderr()[-1500:],
        gw.access_records()[-1:],
    )
    # a client that reads nothing: cut after ~1.5 s once the buffers are full; its request ends
    dead = _connect(gw)
    dead.sendall(_request(gw, key))
    t0 = time.monotonic()
    recs: list[dict[str, Any]] = []
    while time.monotonic() - t0 < 20:
        recs = [r for r in gw.access_records() if r.get("outcome") == "client_disconnect"]
        if recs:
            break
        time.sleep(0.2)
    dead.close()
    assert recs, gw.access_records()[-2:]
    assert time.monotonic() - t0 < 12
    assert "read nothing of its response" in gw.stderr()
    assert [r["outcome"] for r in gw.access_records()].count("ok") == 1  # the slow reader finished
