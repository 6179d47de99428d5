"""A request that takes a pooled keep-alive connection the engine had already closed is sent again on a fresh
connection (servelab.gateway.pooled), as llama-server's close after every stream requires; a refused or
repeatedly reset connection still fails. The engine is a raw asyncio server in this process that answers the
first request of a connection and resets (RST) the connection when a second one arrives on it, without
reading it: what the gateway sees when it reuses a connection whose FIN it has not read yet."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import aiohttp
import pytest

from servelab.gateway import pooled
from servelab.gateway.timeline import TimedConnector, Timeline

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"


class OneShotEngine:
    """Answers the first request of each connection (keep-alive), resets the connection at the next one;
    ``answer_first=False`` resets at the first request. ``connections``/``answered``: counts."""

    def __init__(self, answer_first: bool = True) -> None:
        self.answer_first = answer_first
        self.connections = 0
        self.answered = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        first = True
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError):  # the client closed its connection
                writer.close()
                return
            if not (first and self.answer_first):
                sock = writer.get_extra_info("socket")
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
                writer.transport.abort()
                return
            length = next(
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length")
            )
            await reader.readexactly(length)
            writer.write(ANSWER)
            await writer.drain()
            self.answered += 1
            first = False


async def _posts(engine: OneShotEngine, n: int) -> list[Any]:
    server = await asyncio.start_server(engine.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    out: list[Any] = []
    async with aiohttp.ClientSession(connector=TimedConnector(limit=0, keepalive_timeout=30)) as session:
        for _ in range(n):
            tl = Timeline()
            try:
                resp = await pooled.post(session, f"http://127.0.0.1:{port}/v1/chat/completions", tl, data=b"{}")
                async with resp:
                    out.append((resp.status, await resp.read(), [a for name, _, a in tl.events if name == "connected"]))
            except pooled.CONNECT_ERRORS as e:
                out.append((e, None, [a for name, _, a in tl.events if name == "connected"]))
    server.close()
    await server.wait_closed()
    return out


def test_a_stale_pooled_connection_is_replaced_by_a_fresh_one() -> None:
    engine = OneShotEngine()
    got = asyncio.run(_posts(engine, 3))
    assert [g[:2] for g in got] == [(200, b"{}")] * 3, got
    # the first request opens a connection; each next one takes the pooled (reset) one, then a fresh one
    assert got[0][2] == [{"reused": False}]
    assert got[1][2] == got[2][2] == [{"reused": True}, {"reused": False}], got
    assert engine.connections == 3 and engine.answered == 3


def test_a_connection_reset_every_time_fails_after_at_most_max_sends() -> None:
    engine = OneShotEngine(answer_first=False)
    ((err, _, connected),) = asyncio.run(_posts(engine, 1))
    assert isinstance(err, pooled.CONNECT_ERRORS), err
    assert 1 <= engine.connections <= pooled.MAX_SENDS and engine.answered == 0
    assert all(c == {"reused": False} for c in connected)


def test_a_refused_connection_is_not_sent_again() -> None:
    tl = Timeline()

    async def go() -> None:
        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        async with aiohttp.ClientSession(connector=TimedConnector(limit=0)) as session:
            with pytest.raises(aiohttp.ClientConnectorError):
                await pooled.post(session, f"http://127.0.0.1:{port}/v1/chat/completions", tl, data=b"{}")

    asyncio.run(go())
    assert not tl.has("connected")
    assert not pooled.stale_connection(aiohttp.ClientConnectorError.__new__(aiohttp.ClientConnectorError), tl)
