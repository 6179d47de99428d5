"""Launch the mock engine (:mod:`servelab.engines.mock`) as a child process, like a real engine.

``MockLauncher(settings).start()`` runs ``python -m servelab.engines.mock --host H --port P ...`` through
:func:`~servelab.engines.base.spawn_engine` (own session, ``/health`` wait, cold-start times, stop kills
the whole group), so code that drives real engines (bench, candidate smoke tests) can be tested
against a fast, deterministic server whose failures are injected on purpose (``invalid_json``,
``crash_after_requests``, failure rates; see :class:`~servelab.engines.mock.MockConfig`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import servelab
from servelab.engines.base import (EngineLauncher, EngineStartError, RunningEngine, free_port, runtime_identity,
                                   spawn_engine)
from servelab.engines.mock import MockConfig, validate_config
from servelab.wire.client import ConfigError

__all__ = ["MOCK_SETTINGS", "MockLauncher", "check_mock_settings", "mock_argv"]

#: Settings a :class:`MockLauncher` accepts: the :class:`MockConfig` field names, each with its default.
MOCK_SETTINGS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(MockConfig)}

# the type each field takes (MockConfig's annotations are strings under ``from __future__ import annotations``)
_KINDS: dict[str, str] = {f.name: str(f.type).replace(" ", "") for f in dataclasses.fields(MockConfig)}


def _check_value(key: str, value: Any) -> Any:
    """``value`` if it fits field ``key`` (ints are accepted for float fields), else ConfigError."""
    kind = _KINDS[key]
    optional = kind.endswith("|None")
    base = kind.removesuffix("|None")
    if value is None and optional:
        return None
    ok = {"bool": isinstance(value, bool),
          "int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "str": isinstance(value, str)}.get(base, True)
    if not ok:
        want = {"bool": "true or false", "int": "an integer", "float": "a number", "str": "a string"}[base]
        raise ConfigError(f"mock setting {key!r} must be {want}{' or null' if optional else ''}, got {value!r}")
    return float(value) if base == "float" else value


def check_mock_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``settings`` (MockConfig field names) and return them as a plain dict.

    Raises :class:`ConfigError` (one line) for an unknown key, a value of the wrong type or an
    impossible value (what :func:`~servelab.engines.mock.validate_config` rejects).
    """
    out: dict[str, Any] = {}
    for key, value in (settings or {}).items():
        if key not in MOCK_SETTINGS:
            raise ConfigError(f"unknown mock setting {key!r}: choose from {', '.join(MOCK_SETTINGS)}")
        out[key] = _check_value(key, value)
    try:
        validate_config(MockConfig(**out))
    except ValueError as e:
        raise ConfigError(f"mock settings: {e}") from None
    return out


def mock_argv(settings: Mapping[str, Any], host: str, port: int, python: str | None = None) -> list[str]:
    """The command line of a mock engine with ``settings`` (already checked) listening on ``host:port``.

    Settings equal to ``None`` or ``False`` are left out (their CLI defaults); ``host``/``port`` in
    ``settings`` are ignored in favour of the arguments.
    """
    argv = [python or sys.executable, "-m", "servelab.engines.mock", "--host", host, "--port", str(port)]
    for key, value in settings.items():
        if key in ("host", "port") or value is None or value is False:
            continue
        opt = "--" + key.replace("_", "-")
        argv += [opt] if value is True else [opt, str(value)]
    return argv


class MockLauncher(EngineLauncher):
    """Start the servelab mock engine as a separate process.

    Args:
        settings: :class:`~servelab.engines.mock.MockConfig` fields (``ttft_ms``, ``dialect``,
            ``invalid_json``, ``crash_after_requests`` ...); unknown keys raise :class:`ConfigError`.
            ``host``/``port`` here are used when the arguments of the same name are not given.
        host: address to listen on (default ``settings["host"]`` or ``127.0.0.1``).
        port: TCP port; ``None`` (or 0) picks a free port and retries on a bind race.
        log_dir: directory for the log ``mock-engine-PORT.log`` (default: a new temp dir).
        ready_timeout_s: seconds to wait for ``/health`` 200.
        python: interpreter to run (default: this one, ``sys.executable``).

    The started engine's ``identity`` is ``{"engine": "servelab-mock", "version": servelab.__version__,
    "settings": <every MockConfig field, host and port as used>, "argv": [...], "model": {"path": None,
    "sha256": None}, ...}`` plus ``host``, ``port``, ``base_url``, ``pid``, ``log_path``, ``started_at``.
    """

    name = "servelab-mock"

    def __init__(self, settings: Mapping[str, Any] | None = None, host: str | None = None, port: int | None = None,
                 log_dir: str | os.PathLike[str] | None = None, ready_timeout_s: float = 60.0,
                 python: str | None = None):
        self.settings = check_mock_settings(settings)
        self.host = host if host is not None else str(self.settings.get("host", MOCK_SETTINGS["host"]))
        port = port if port is not None else self.settings.get("port")
        self.port = port or None
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigError(f"--port must be 1..65535, got {self.port}")
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.python = python

    def start(self) -> RunningEngine:
        """Start the mock, wait for ``/health`` 200 and fill ``identity``.

        Raises :class:`EngineStartError` when the process exits or does not get ready in time.
        """
        log_dir = Path(self.log_dir) if self.log_dir is not None else Path(tempfile.mkdtemp(prefix="servelab-mock-"))
        log_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # the child imports the same servelab as this process, installed or not
        src = str(Path(servelab.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        attempts = 1 if self.port is not None else 3
        for attempt in range(attempts):
            port = self.port if self.port is not None else free_port(self.host)
            argv = mock_argv(self.settings, self.host, port, self.python)
            try:
                eng = spawn_engine(self.name, argv, host=self.host, port=port,
                                   log_path=log_dir / f"mock-engine-{port}.log", env=env,
                                   ready_timeout_s=self.ready_timeout_s,
                                   model_name=str(self.settings.get("model", MOCK_SETTINGS["model"])))
                break
            except EngineStartError as e:
                if attempt + 1 < attempts and getattr(e, "bind_failed", False):
                    continue
                raise
        eng.identity = {
            "engine": "servelab-mock",
            "version": servelab.__version__,
            "settings": {**MOCK_SETTINGS, **self.settings, "host": self.host, "port": port},
            "argv": list(eng.argv),
            "model": {"path": None, "sha256": None},
            **runtime_identity(eng),
        }
        return eng
