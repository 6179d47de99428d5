"""Launch the mock engine (:mod:`servelab.engines.mock`) as a child process, like a real engine.

``MockLauncher(settings).start()`` runs ``python -m servelab.engines.mock --host H --port P ...`` through
:func:`~servelab.engines.spawn.spawn_engine` (own session, ``/health`` wait, cold-start times, stop kills
the whole group), so code that drives real engines (bench, candidate smoke tests) can be tested
against a fast, deterministic server whose failures are injected on purpose (``invalid_json``,
``crash_after_requests``, failure rates; see :class:`~servelab.engines.mock.config.MockConfig`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import create_model, model_validator

import servelab
from servelab.engines.base import EngineLauncher, runtime_identity
from servelab.engines.kind import (
    EngineIdentity,
    EngineKind,
    EngineSettings,
    PortSetting,
    ServerMetrics,
    ready_timeout_setting,
)
from servelab.engines.mock.config import MockConfig, check_failure_rates
from servelab.engines.running import RunningEngine
from servelab.engines.spawn import log_dir_or_temp, spawn_on_port
from servelab.wire.errors import ConfigError

__all__ = ["MOCK_SETTINGS", "MockKind", "MockLauncher", "MockSettings", "check_mock_settings", "mock_argv"]


class _MockLaunch(EngineSettings):
    """Base of :data:`MockSettings`: the failure-rate rule of :func:`check_failure_rates` and
    :meth:`to_mock_config`."""

    @model_validator(mode="after")
    def _rates(self) -> _MockLaunch:
        check_failure_rates(self)
        return self

    def to_mock_config(self, port: int = 0) -> MockConfig:
        """A :class:`MockConfig` with these settings (``self.port`` wins over ``port``)."""
        kw = self.model_dump(exclude={"port", "ready_timeout_s"})
        own = self.model_dump(include={"port"}).get("port")  # a field of the MockSettings built below
        return MockConfig(port=own if own is not None else port, **kw)


_HINTS = typing.get_type_hints(MockConfig, include_extras=True)

#: Mock engine settings: every :class:`MockConfig` field (same names, types, bounds, defaults and
#: descriptions: MockConfig is the single definition) except ``host`` and ``port``, plus ``port``
#: (``None`` = a free port) and ``ready_timeout_s`` (seconds, default 60).
MockSettings: type[_MockLaunch] = create_model(  # type: ignore[call-overload]  # fields built from MockConfig
    "MockSettings",
    __base__=_MockLaunch,
    __module__=__name__,
    __doc__="Mock engine settings (servelab.engines.mock.MockConfig fields; same names and units).",
    **{f.name: (_HINTS[f.name], f.default) for f in dataclasses.fields(MockConfig) if f.name not in ("host", "port")},
    port=(PortSetting, None),
    ready_timeout_s=(float, ready_timeout_setting(60.0)),
)

#: Settings a :class:`MockLauncher` accepts, each with its default.
MOCK_SETTINGS: dict[str, Any] = {
    n: f.get_default(call_default_factory=True) for n, f in MockSettings.model_fields.items()
}


def check_mock_settings(settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """Validate ``settings`` (:data:`MockSettings` names) and return the keys given, validated (ints
    become floats where the field is a float), in the order given.

    Raises :class:`ConfigError` (one line naming the setting) for an unknown key, a value of the wrong
    type or an impossible value.
    """
    given = dict(settings or {})
    m = MockKind().parse(given)
    return {k: getattr(m, k) for k in given}


def mock_argv(settings: Mapping[str, Any], host: str, port: int, python: str | None = None) -> list[str]:
    """The command line of a mock engine with ``settings`` (already checked) listening on ``host:port``.

    Settings equal to ``None`` or ``False`` are left out (their CLI defaults); ``host``/``port`` and
    ``ready_timeout_s`` in ``settings`` are ignored in favour of the arguments.
    """
    argv = [python or sys.executable, "-m", "servelab.engines.mock", "--host", host, "--port", str(port)]
    for key, value in settings.items():
        if key in ("host", "port", "ready_timeout_s") or value is None or value is False:
            continue
        opt = "--" + key.replace("_", "-")
        argv += [opt] if value is True else [opt, str(value)]
    return argv


class MockLauncher(EngineLauncher):
    """Start the servelab mock engine as a separate process.

    Args:
        settings: :data:`MockSettings` (an instance, or a mapping of its names: ``ttft_ms``, ``dialect``,
            ``invalid_json``, ``crash_after_requests`` ...); unknown keys raise :class:`ConfigError`.
            ``port``/``ready_timeout_s`` here are used when the arguments of the same name are not given.
        host: address to listen on (default ``127.0.0.1``).
        port: TCP port; ``None`` (or 0) picks a free port and retries on a bind race.
        log_dir: directory for the log ``mock-engine-PORT.log`` (default: a new temp dir).
        ready_timeout_s: seconds to wait for ``/health`` 200 (default: the setting, 60).
        python: interpreter to run (default: this one, ``sys.executable``).

    The started engine's ``identity`` is an :class:`~servelab.engines.kind.EngineIdentity` dump:
    ``kind`` ``"mock"``, ``engine`` ``"servelab-mock"``, ``version`` servelab's, ``settings`` (every
    setting, host and port as used), ``argv``, ``model`` ``{"path": None, "sha256": None}``, and
    ``host``, ``port``, ``base_url``, ``pid``, ``log_path``, ``started_at``.
    """

    name = "servelab-mock"

    def __init__(
        self,
        settings: Mapping[str, Any] | EngineSettings | None = None,
        host: str | None = None,
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        ready_timeout_s: float | None = None,
        python: str | None = None,
    ):
        if isinstance(settings, EngineSettings):
            self.config = MockKind().parse(settings)
            self.settings = self.config.model_dump()
        else:
            self.settings = check_mock_settings(settings)
            self.config = MockKind().parse(self.settings)
        self.host = host if host is not None else "127.0.0.1"
        parsed = self.config.model_dump()  # MockSettings is built at import: its fields are not static attributes
        port = port if port is not None else parsed["port"]
        self.port = port or None
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigError(f"--port must be 1..65535, got {self.port}")
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s if ready_timeout_s is not None else float(parsed["ready_timeout_s"])
        self.python = python

    def start(self) -> RunningEngine:
        """Start the mock, wait for ``/health`` 200 and fill ``identity``.

        Raises :class:`EngineStartError` when the process exits or does not get ready in time.
        """
        log_dir = log_dir_or_temp(self.log_dir, "servelab-mock-")
        env = dict(os.environ)
        # the child imports the same servelab as this process, installed or not
        src = str(Path(servelab.__file__).resolve().parent.parent)
        env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        env["PYTHONUNBUFFERED"] = "1"
        eng = spawn_on_port(
            self.name,
            lambda port: mock_argv(self.settings, self.host, port, self.python),
            host=self.host,
            port=self.port,
            log_path_for=lambda port: log_dir / f"mock-engine-{port}.log",
            env=env,
            ready_timeout_s=self.ready_timeout_s,
            health_path=MockKind.readiness.path,
            model_name=str(self.config.model_dump()["model"]),
        )
        used = self.config.model_dump(exclude={"ready_timeout_s"})
        eng.identity = EngineIdentity(
            kind="mock",
            engine="servelab-mock",
            version=servelab.__version__,
            argv=list(eng.argv),
            devices=[],
            settings={**used, "host": self.host, "port": eng.port},
            model={"path": None, "sha256": None},
            **runtime_identity(eng),
        ).model_dump(mode="json")
        return eng


# ---------------------------------------------------------------------------------------------------
# the engine kind ``mock``
# ---------------------------------------------------------------------------------------------------


class MockKind(EngineKind[_MockLaunch]):
    """``engine: mock``: servelab's mock engine in its own process (calibration, failure injection); no
    ``model`` (name the served model with ``settings.model``)."""

    kind = "mock"
    title = "mock"
    summary = "servelab's mock engine (calibration, failure injection); no model file"
    Settings = MockSettings
    takes_model = False

    @property
    def metrics(self) -> ServerMetrics:  # type: ignore[override]  # computed per call: kinds register at run time
        """The mock answers /metrics in the dialect it speaks (any known engine's names) and with its own
        ``mock_requests_running`` gauge and request counters."""
        from servelab.engines.url import any_server_metrics

        own = ServerMetrics(
            running="mock_requests_running", counters=("mock_requests_total", "mock_requests_completed_total")
        )
        return ServerMetrics.merged([any_server_metrics(), own])

    def launcher(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> MockLauncher:
        """:class:`MockLauncher` with ``settings`` (:data:`MockSettings`); ``kwargs`` go to it (``host``,
        ``port``, ``ready_timeout_s``, ``python``). Raises :class:`ConfigError` when ``model`` is given."""
        if model is not None:
            raise ConfigError(
                f"the mock engine takes no model file (got {model!r}); name its model with settings={{'model': NAME}}"
            )
        return MockLauncher(self.parse(settings), log_dir=log_dir, **kwargs)
