"""The base launcher's port retry (one loop for every engine kind, engines/base.py ``spawn_on_port``):
a free port lost to a race before the server binds it is retried on a new port; a fixed port is not."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servelab.engines.exits import EngineStartError
from servelab.engines.mock.launch import mock_argv
from servelab.engines.spawn import spawn_on_port

pytestmark = pytest.mark.timeout(120)

_LOSE_THE_RACE = "import sys; print('error: couldn\\'t bind HTTP server socket: address already in use'); sys.exit(1)"


def test_a_bind_race_is_retried_on_a_new_port(tmp_path: Path) -> None:
    ports: list[int] = []

    def argv_for(port: int) -> list[str]:
        ports.append(port)
        if len(ports) == 1:
            return [sys.executable, "-c", _LOSE_THE_RACE]
        return mock_argv({}, "127.0.0.1", port)

    eng = spawn_on_port(
        "racer",
        argv_for,
        host="127.0.0.1",
        port=None,
        log_path_for=lambda p: tmp_path / f"racer-{p}.log",
        ready_timeout_s=60,
    )
    try:
        assert len(ports) == 2 and eng.port == ports[1]
        assert "address already in use" in (tmp_path / f"racer-{ports[0]}.log").read_text()
        assert eng.get("/health")[0] == 200
    finally:
        eng.stop()


def test_a_fixed_port_is_tried_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def argv_for(port: int) -> list[str]:
        calls.append(port)
        return [sys.executable, "-c", _LOSE_THE_RACE]

    with pytest.raises(EngineStartError) as ei:
        spawn_on_port(
            "racer",
            argv_for,
            host="127.0.0.1",
            port=47999,
            log_path_for=lambda p: tmp_path / "r.log",
            ready_timeout_s=30,
        )
    assert calls == [47999] and getattr(ei.value, "bind_failed", False)


def test_attempts_are_bounded(tmp_path: Path) -> None:
    calls: list[int] = []

    def argv_for(port: int) -> list[str]:
        calls.append(port)
        return [sys.executable, "-c", _LOSE_THE_RACE]

    with pytest.raises(EngineStartError):
        spawn_on_port(
            "racer",
            argv_for,
            host="127.0.0.1",
            port=None,
            attempts=3,
            log_path_for=lambda p: tmp_path / f"r-{p}.log",
            ready_timeout_s=30,
        )
    assert len(calls) == 3
