"""The engine launcher interface: start an inference server as a child process, wait until it is
ready, measure its cold start, read its memory and Prometheus metrics, and stop it without leaving
orphans.

An :class:`EngineLauncher` knows how to build one engine's command line; :meth:`EngineLauncher.start`
returns a :class:`RunningEngine`, which is also a context manager::

    with SomeLauncher(...).start() as eng:
        eng.base_url          # "http://127.0.0.1:41234/v1"
        eng.measure_first_token()
        eng.read_metrics()

No orphans: the server runs in its own session / process group (``start_new_session=True``);
:meth:`RunningEngine.stop` sends SIGTERM to the group, waits, then SIGKILLs the group and any
descendant that escaped it. On Linux the server process is a child subreaper
(``PR_SET_CHILD_SUBREAPER``): a descendant that calls ``setsid`` and double-forks is re-parented to
it, not to PID 1, so it is still a descendant when the server is stopped. Every live engine is also
stopped by an :mod:`atexit` hook, and on Linux a child started from the main thread gets
``PR_SET_PDEATHSIG=SIGKILL`` so it dies even when Python is killed with SIGKILL (the kernel fires that
signal when the *thread* that forked exits, so it is only set for starts from the main thread).

Readiness follows docs/engine-wire.md case 21: connection
refused during start is normal, llama-server answers 503 ``Loading model`` on ``/health`` while it
loads, ready means ``/health`` answers 200.
"""

from __future__ import annotations

import abc
import math
from datetime import UTC
from typing import Any

from servelab.engines.running import RunningEngine

__all__ = ["EngineLauncher", "human_bytes", "runtime_identity"]


class EngineLauncher(abc.ABC):
    """Knows how to start one engine; :meth:`start` returns a ready :class:`RunningEngine`.

    Subclasses set :attr:`name` and implement :meth:`start` (typically: resolve binary and model,
    build argv, call :func:`spawn_on_port`, fill ``identity`` from a
    :class:`servelab.engines.kind.EngineIdentity`). A launcher is reusable: each :meth:`start`
    call starts a new process. The engine kind that uses it is declared in the same module
    (docs/adding-an-engine.md).
    """

    #: engine name used in identities and messages, e.g. ``"llama.cpp"``, ``"vllm"``
    name: str = "engine"

    @abc.abstractmethod
    def start(self) -> RunningEngine:
        """Start the engine and return it once ``/health`` answers 200.

        Raises :class:`EngineStartError` when it exits or does not get ready in time and
        :class:`servelab.wire.ConfigError` for bad user input (model file, options).
        """

    def up(self) -> RunningEngine:
        """Alias of :meth:`start` (``with launcher.up() as eng: ...``)."""
        return self.start()


def runtime_identity(eng: RunningEngine) -> dict[str, Any]:
    """The per-launch part of every launcher's identity: ``host``, ``port``, ``base_url``, ``pid``,
    ``log_path`` and ``started_at`` (UTC, ISO 8601 seconds). These vary between launches and are left
    out of candidate comparisons."""
    from datetime import datetime

    return {
        "host": eng.host,
        "port": eng.port,
        "base_url": eng.base_url,
        "pid": eng.pid,
        "log_path": str(eng.log_path),
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def human_bytes(n: float) -> str:
    """``n`` bytes as a short human string (``"241.3 MiB"``)."""
    if n is None or not math.isfinite(n):
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
