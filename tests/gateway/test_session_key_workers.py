"""Sticky canary sessions under ``servelab gateway --workers 2`` without ``SERVELAB_SESSION_SECRET``
(issue 21 item 6).

The split of a session (``routing.session_header``) is keyed by an HMAC whose secret comes from
``routing.session_secret_env``; when that is unset each worker drew its own key, so the same session went
to the canary on one worker and to the primary on the other (2 of 20 sessions flipped), with no warning.
Now the supervisor draws one key and gives it to every worker; the gateway also warns that the key is
drawn at start. Real parts: the supervisor and its two workers, two mock engines, a real Redis.
"""

from __future__ import annotations

import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import gateway_key, start_gateway, start_mock_process, stop_gateway, stop_mock_process
from services import redis_server

SESSIONS = 20
PER_SESSION = 6  # each on a new connection: the kernel spreads them over both workers (SO_REUSEPORT)


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Any, Any]]:
    a = start_mock_process("--dialect", "vllm", "--output-tokens", "2")
    b = start_mock_process("--dialect", "vllm", "--output-tokens", "2")
    yield a, b
    stop_mock_process(a.proc)
    stop_mock_process(b.proc)


def _post(url: str, key: str, session: str) -> str:
    """One chat request carrying ``X-Session-ID: session`` on a new connection; the gateway's request id."""
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    req = urllib.request.Request(
        url + "/chat/completions",
        data=body,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json", "X-Session-ID": session},
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        r.read()
        assert r.status == 200
        return str(r.headers["X-Request-ID"])


def test_a_session_stays_in_one_group_across_workers(
    tmp_path: Path, engines: tuple[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SERVELAB_SESSION_SECRET", raising=False)  # the case of the issue: no secret given
    stable, canary = engines
    key, entry = gateway_key("k1", "t")
    with redis_server() as redis:
        gw = start_gateway(
            {
                "backends": [
                    {"name": "stable", "kind": "mock", "base_url": stable.root, "models": ["m"], "pool": "a"},
                    {"name": "canary", "kind": "mock", "base_url": canary.root, "models": ["m"], "pool": "b"},
                ],
                "models": {
                    "m": {"targets": [{"backend": "stable", "weight": 50}, {"backend": "canary", "weight": 50}]}
                },
                "routing": {"session_header": "X-Session-ID"},
                "state": {"redis_url": redis.url},
                "tenants": {"t": {}},
                "keys": [entry],
                "health": {"enabled": False},
            },
            tmp_path / "gw",
            "--workers",
            "2",
        )
        try:
            sent = {
                _post(gw.url, key, f"session-{s}"): f"session-{s}" for _ in range(PER_SESSION) for s in range(SESSIONS)
            }
            records = {r["request_id"]: r for r in gw.access_records()}
            assert set(sent) <= set(records), "requests missing from the access log"
            backends: dict[str, set[str]] = defaultdict(set)
            workers: dict[str, set[int]] = defaultdict(set)
            for rid, session in sent.items():
                backends[session].add(records[rid]["backend"])
                workers[session].add(records[rid]["worker"])
            on_both = [s for s in workers if workers[s] == {0, 1}]
            # the check means something only when sessions did cross workers (each does with p = 31/32)
            assert len(on_both) >= SESSIONS // 2, dict(workers)
            flipped = sorted(s for s, b in backends.items() if len(b) > 1)
            assert flipped == [], f"{len(flipped)} of {SESSIONS} sessions moved between groups: {flipped}"
            assert {b for bs in backends.values() for b in bs} == {"stable", "canary"}  # both groups are used
            assert "SERVELAB_SESSION_SECRET" in gw.stderr() and "drawn at start" in gw.stderr()
        finally:
            stop_gateway(gw.proc)
