"""Break-it report on 4b30bb7, defects 3 and 4, through a real gateway process (servelab.gateway.bodies):

3. a corrupt gzip/deflate request body was a 500 with a 35-line traceback per request, not rate-limited;
   now 400 ``invalid_body_encoding`` and at most a burst of one-line log entries;
4. a gzip bomb (1 MB -> 1 GB) stalled the event loop even without a key (aiohttp inflated it in the loop
   before the handler ran; an innocent stream's chunk gap went from 20 ms to 330-800 ms, the 413 took
   3.1 s); now compressed bodies are refused (415) unless ``server.request_compression``, and then
   inflated piece by piece under ``max_body_bytes``, after authentication.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
import urllib.request
import zlib
from typing import Any

import orjson
from conftest import gateway_key
from gateway.test_server import post

BOMB_MB = 1024


def _bomb() -> bytes:
    """A gzip body that inflates to ``BOMB_MB`` MiB of "a" (made in ~1 s: the same full-flushed deflate
    block repeated; its trailer CRC is wrong, which only a reader that inflated it all would notice)."""
    co = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = co.compress(b'{"model":"m","x":"') + co.flush(zlib.Z_FULL_FLUSH)
    block = co.compress(b"a" * (1 << 20)) + co.flush(zlib.Z_FULL_FLUSH)
    return head + block * BOMB_MB + co.compress(b'"}') + co.flush()


def _raw_post(port: int, body: bytes, headers: str) -> tuple[bytes, float]:
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        out = s.recv(4096)
    return out, time.monotonic() - t0


def _gw(gateway: Any, mock_engine: Any, **server: Any) -> tuple[Any, str]:
    eng = mock_engine("--dialect", "vllm", "--itl-ms", "20", "--output-tokens", "60")
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": server,
            "backends": [{"name": "b", "kind": "vllm", "base_url": eng.root, "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    return gw, key


def _chat() -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


def test_compressed_bodies_refused_by_default_and_corrupt_ones_are_400(gateway: Any, mock_engine: Any) -> None:
    gw, key = _gw(gateway, mock_engine)
    url = gw.url + "/chat/completions"
    st, _, raw = post(url, None, key, headers={"Content-Encoding": "gzip"}, raw=gzip.compress(orjson.dumps(_chat())))
    err = orjson.loads(raw)["error"]
    assert st == 415 and err["code"] == "unsupported_content_encoding", raw
    assert "request_compression" in err["message"]
    gw2, key2 = _gw(gateway, mock_engine, request_compression=True)
    url2 = gw2.url + "/chat/completions"
    for enc, data in (
        ("gzip", gzip.compress(orjson.dumps(_chat()))),
        ("deflate", zlib.compress(orjson.dumps(_chat()))),
        ("deflate", zlib.compress(orjson.dumps(_chat()))[2:-4]),
    ):  # zlib-wrapped and raw
        st, _, raw = post(url2, None, key2, headers={"Content-Encoding": enc}, raw=data)
        assert st == 200, (enc, raw)
    st, _, raw = post(url2, None, key2, headers={"Content-Encoding": "br"}, raw=b"xx")
    assert st == 415, raw
    for _ in range(60):  # corrupt and truncated bodies
        for enc, data in (
            ("gzip", b"\x1f\x8bnot gzip at all"),
            ("deflate", b"garbage!"),
            ("gzip", gzip.compress(orjson.dumps(_chat()))[:20]),
        ):
            st, _, raw = post(url2, None, key2, headers={"Content-Encoding": enc}, raw=data)
            assert st == 400 and orjson.loads(raw)["error"]["code"] == "invalid_body_encoding", raw
    err_log = gw2.stderr()
    assert "Traceback" not in err_log, err_log[-2000:]
    lines = [x for x in err_log.splitlines() if "could not be inflated" in x]
    assert 1 <= len(lines) <= 12, len(lines)  # a burst, then suppressed (180 bad bodies sent)


def test_gzip_bomb_neither_stalls_nor_inflates(gateway: Any, mock_engine: Any) -> None:
    gw, key = _gw(gateway, mock_engine, request_compression=True)
    port = int(gw.url.rsplit(":", 1)[1].split("/")[0])
    bomb = _bomb()
    gaps: list[float] = []

    def stream() -> None:
        body = orjson.dumps(
            {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
        )
        req = urllib.request.Request(
            gw.url + "/chat/completions",
            data=body,
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            last = time.monotonic()
            for _line in r:
                now = time.monotonic()
                gaps.append(now - last)
                last = now

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)
    answers = [
        _raw_post(port, bomb, "Content-Encoding: gzip\r\n"),  # no key: 401, never inflated
        _raw_post(port, bomb, f"Authorization: Bearer {key}\r\nContent-Encoding: gzip\r\n"),
    ]
    t.join()
    assert answers[0][0].startswith(b"HTTP/1.1 401"), answers[0][0][:100]
    assert answers[1][0].startswith(b"HTTP/1.1 413"), answers[1][0][:100]
    assert max(a[1] for a in answers) < 1.0, answers  # before: 3.1 s for the 413
    assert gaps and max(gaps[1:]) < 0.15, max(gaps[1:])  # before: 330-800 ms (chunks every 20 ms)
