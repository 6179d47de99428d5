"""The public ``/health`` names the part at fault, never an address (issue 21 item 6).

The design promises no addresses on the public API port. While PostgreSQL was down at start, ``/health``
said ``starting: ledger.postgres_dsn: PostgreSQL at postgresql://***@127.0.0.1:PORT/servelab is
unreachable``: host, port and database name of the usage database, to anyone. Now it names the field;
the log (the operator's) keeps the address and the error.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import orjson
from conftest import gateway_key
from services import free_port

from servelab.gateway.server import LEDGER_RETRY_S


def _health(gw: Any) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(gw.url.removesuffix("/v1") + "/health", timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_health_names_the_database_field_not_its_address(gateway: Any, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: PostgreSQL is down
    _, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "ledger": {"postgres_dsn": f"postgresql://postgres:hunter2@127.0.0.1:{port}/servelab"},
            "backends": [{"name": "b", "kind": "mock", "base_url": f"http://127.0.0.1:{free_port()}", "models": ["m"]}],
            "models": {"m": {"targets": [{"backend": "b"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
            "health": {"enabled": False},
        }
    )
    # at start, and after the background retries have set the reason again
    for wait_s in (0.0, 3 * LEDGER_RETRY_S + 0.5):
        time.sleep(wait_s)
        st, raw = _health(gw)
        health = orjson.loads(raw)
        assert st == 503 and health["status"] == "unavailable", health
        assert any("ledger.postgres_dsn" in r and "unreachable" in r for r in health["reasons"]), health
        for secret in (str(port), "127.0.0.1", "postgresql://", "servelab", "hunter2", "***"):
            assert secret not in raw.decode(), (secret, raw)
    log = gw.stderr()
    assert f"127.0.0.1:{port}" in log and "hunter2" not in log, log[-2000:]  # the operator's log has the address
