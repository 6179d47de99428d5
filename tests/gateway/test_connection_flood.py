"""Half-open connection floods against a real gateway process, with raw sockets from several loopback
addresses (issue 21 item 1).

Connections that send one byte of a request line and wait are not idle, so before the fix the at-cap
eviction never picked them: each lived ``header_timeout_s`` (10 s) and, re-opened as they closed, they
held the whole API port (real requests 0/50, ``/health`` 503). Now one client address may hold at most
``server.max_connections_per_client`` connections (default half the port's cap), and at a cap the oldest
header-incomplete connection of the biggest holder is shed before a new client is refused.

The gateway runs under ``RLIMIT_NOFILE`` 256 (API cap (256 - 64 - 32) / 2 = 80, 40 per address) and the
flood comes from 127.0.0.2-4 (Linux routes all of 127/8 to loopback), so a few hundred sockets suffice;
every test ends in seconds, well inside the 10 s header timeout that would otherwise end the flood.
"""

from __future__ import annotations

import http.client
import resource
import selectors
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import orjson
import pytest
from conftest import ADMIN_TOKEN, gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process

NOFILE = 256
CAP = (NOFILE - 64 - 32) // 2  # servelab.gateway.fdbudget.default_max_connections
FLOODERS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
PER_FLOODER = 70  # 210 half-open connections wanted against a cap of 80
HEADER_S = 10.0  # the default: the flood must not be ended by the header timeout during a test


def _cfg(mock_root: str, entry: dict[str, str], **server: Any) -> dict[str, Any]:
    return {
        "server": {"header_timeout_s": HEADER_S, **server},
        "backends": [{"name": "b", "kind": "mock", "base_url": mock_root, "models": ["m"]}],
        "models": {"m": {"targets": [{"backend": "b"}]}},
        "tenants": {"t": {}},
        "keys": [entry],
        "health": {"enabled": False},
    }


@pytest.fixture(scope="module")
def mock() -> Iterator[Any]:
    m = start_mock_process("--output-tokens", "3")
    yield m
    stop_mock_process(m.proc)


def _addr(url: str) -> tuple[str, int]:
    u = urlparse(url)
    assert u.hostname and u.port
    return u.hostname, u.port


def _low_nofile() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, NOFILE))


def _chat() -> bytes:
    return orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})


def _request(
    url: str,
    path: str,
    key: str | None = None,
    source: str = "127.0.0.1",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 8.0,
) -> tuple[int, bytes]:
    """One request on a fresh connection from ``source``: (status, body); a refused or reset connection
    is status 0."""
    host, port = _addr(url)
    c = http.client.HTTPConnection(host, port, timeout=timeout_s, source_address=(source, 0))
    h = {"Content-Type": "application/json", **(headers or {})}
    if key:
        h["Authorization"] = f"Bearer {key}"
    try:
        c.request("POST" if body is not None else "GET", urlparse(url).path + path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.read()
    except (ConnectionError, http.client.HTTPException, TimeoutError, OSError):
        return 0, b""
    finally:
        c.close()


def _open(addr: tuple[str, int], source: str, first: bytes) -> socket.socket | None:
    s = socket.socket()
    try:
        s.bind((source, 0))
        s.settimeout(2)
        s.connect(addr)
        if first:
            s.sendall(first)
        s.setblocking(False)
        return s
    except OSError:
        s.close()
        return None


class Flood:
    """Keeps ``per_source`` connections from each of ``sources`` open to ``addr``, each having sent
    ``first`` (one byte of a request line: header-incomplete), re-opening every one the server closes,
    every ``every_s`` seconds, until :meth:`stop`. :attr:`opened` counts connections opened in all."""

    def __init__(
        self,
        addr: tuple[str, int],
        sources: tuple[str, ...],
        per_source: int,
        first: bytes = b"P",
        every_s: float = 0.1,
    ) -> None:
        self.addr, self.sources, self.per_source, self.first, self.every_s = addr, sources, per_source, first, every_s
        self.opened = 0
        self._stop = threading.Event()
        self._sel = selectors.DefaultSelector()
        self._held: dict[str, int] = dict.fromkeys(sources, 0)
        self._thread = threading.Thread(target=self._run, daemon=True, name="flood")

    def start(self) -> Flood:
        self._thread.start()
        return self

    def open_now(self) -> int:
        return sum(self._held.values())

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0):  # readable: closed by the server (or a 4xx/5xx)
                s = key.fileobj
                assert isinstance(s, socket.socket)
                self._sel.unregister(s)
                self._held[key.data] -= 1
                s.close()
            for src in self.sources:
                while self._held[src] < self.per_source and not self._stop.is_set():
                    s = _open(self.addr, src, self.first)
                    if s is None:
                        break
                    self._sel.register(s, selectors.EVENT_READ, src)
                    self._held[src] += 1
                    self.opened += 1
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for key in list(self._sel.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._sel.close()


def _metric(gw: Any, name: str) -> float:
    req = urllib.request.Request(gw.admin_url + "/metrics", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_half_open_flood_leaves_real_clients_served(tmp_path: Any, mock: Any) -> None:
    """Three addresses hold ~210 connections of one byte each (re-opened as they close) against a port
    capped at 80 (40 per address): real requests from a fourth address and from a flooding address are
    all served, and ``/health`` answers 200, while the flood still holds the port."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 1024:
        pytest.skip("the test process itself needs ~300 descriptors")
    key, entry = gateway_key("k1", "t")
    gw = start_gateway(_cfg(mock.root, entry), tmp_path / "gw", preexec_fn=_low_nofile)
    flood = Flood(_addr(gw.url), FLOODERS, PER_FLOODER)
    try:
        assert _request(gw.url, "/chat/completions", key, body=_chat())[0] == 200
        flood.start()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and flood.opened < CAP + 20:
            time.sleep(0.1)
        time.sleep(0.5)
        held = _metric(gw, 'servelab_gateway_connections{port="api"}')
        assert held >= CAP - 5, f"the flood did not fill the port: {held} of {CAP} ({flood.opened} opened)"
        t0 = time.monotonic()
        results = []
        for i in range(20):
            src = "127.0.0.1" if i % 2 == 0 else FLOODERS[1]  # a bystander, and an address that floods
            results.append((src, _request(gw.url, "/chat/completions", key, src, _chat())[0]))
        health = _request(gw.url.removesuffix("/v1"), "/health")
        elapsed = time.monotonic() - t0
        assert [r for r in results if r[1] != 200] == [], results
        assert health[0] == 200, health
        assert elapsed < HEADER_S - 2, f"served only after {elapsed:.1f} s (the header timeout ended the flood?)"
        assert flood.open_now() >= CAP // 2, "the flood was not holding connections while clients were served"
        assert _metric(gw, 'servelab_gateway_connection_events_total{port="api",reason="evicted"}') > 0
        assert _metric(gw, 'servelab_gateway_connection_events_total{port="api",reason="header_timeout"}') == 0
    finally:
        flood.stop()
        stop_gateway(gw.proc)
    assert "Traceback" not in gw.stderr(), gw.stderr()[-3000:]


def _slow_body(addr: tuple[str, int], source: str, key: str, xff: str | None = None) -> socket.socket:
    """A connection whose request headers are complete and whose body is still arriving (not sheddable)."""
    s = socket.socket()
    s.bind((source, 0))
    s.settimeout(5)
    s.connect(addr)
    extra = f"X-Forwarded-For: {xff}\r\n" if xff else ""
    s.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\n{extra}Content-Length: 100\r\n\r\n{{".encode()
    )
    return s


def test_per_client_cap_refuses_the_next_connection_and_sheds_its_own_half_open(tmp_path: Any, mock: Any) -> None:
    """``max_connections_per_client`` 5: an address holding 5 requests in progress gets 429 for a sixth
    connection while another address is served; an address holding 5 half-open connections gets its
    real request served (its own oldest half-open one is closed)."""
    key, entry = gateway_key("k1", "t")
    gw = start_gateway(_cfg(mock.root, entry, max_connections_per_client=5), tmp_path / "gw")
    addr = _addr(gw.url)
    busy = [_slow_body(addr, "127.0.0.2", key) for _ in range(5)]
    half_open = [s for s in (_open(addr, "127.0.0.3", b"P") for _ in range(5)) if s is not None]
    try:
        time.sleep(0.3)
        st, body = _request(gw.url, "/chat/completions", key, "127.0.0.2", _chat())
        assert st == 429 and orjson.loads(body)["error"]["code"] == "too_many_connections", (st, body)
        assert b"max_connections_per_client" in body
        assert _request(gw.url, "/chat/completions", key, "127.0.0.4", _chat())[0] == 200
        assert len(half_open) == 5
        assert _request(gw.url, "/chat/completions", key, "127.0.0.3", _chat())[0] == 200
        closed = 0
        for s in half_open:
            s.settimeout(2)
            try:
                closed += s.recv(1) == b""
            except (ConnectionError, TimeoutError):
                closed += 1
        assert closed >= 1, "no half-open connection of the address was shed"
        assert _metric(gw, 'servelab_gateway_connection_events_total{port="api",reason="client_refused"}') >= 1
    finally:
        for s in busy + half_open:
            s.close()
        stop_gateway(gw.proc)


def test_per_client_cap_behind_a_trusted_proxy_counts_x_forwarded_for(tmp_path: Any, mock: Any) -> None:
    """Behind a trusted proxy (127.0.0.1) the cap counts the client that ``X-Forwarded-For`` names: a third
    request of 203.0.113.5 while two are in progress gets 429; 203.0.113.6 through the same proxy is
    served; the header sent by an untrusted peer (127.0.0.2) is ignored, so that peer is served."""
    key, entry = gateway_key("k1", "t")
    gw = start_gateway(
        _cfg(mock.root, entry, max_connections_per_client=2, trusted_proxies=["127.0.0.1"]), tmp_path / "gw"
    )
    addr = _addr(gw.url)
    busy = [_slow_body(addr, "127.0.0.1", key, xff="203.0.113.5") for _ in range(2)]
    try:
        time.sleep(0.3)
        xff = {"X-Forwarded-For": "203.0.113.5"}
        st, body = _request(gw.url, "/chat/completions", key, "127.0.0.1", _chat(), headers=xff)
        assert st == 429 and orjson.loads(body)["error"]["code"] == "too_many_connections", (st, body)
        assert (
            _request(
                gw.url, "/chat/completions", key, "127.0.0.1", _chat(), headers={"X-Forwarded-For": "203.0.113.6"}
            )[0]
            == 200
        )
        assert _request(gw.url, "/chat/completions", key, "127.0.0.2", _chat(), headers=xff)[0] == 200
        # the proxy's own connections are not capped at 2: many requests through it at once are served
        assert _request(gw.url, "/chat/completions", key, "127.0.0.1", _chat())[0] == 200
    finally:
        for s in busy:
            s.close()
        stop_gateway(gw.proc)
