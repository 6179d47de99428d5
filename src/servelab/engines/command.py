"""The engine kind ``command``: any engine started by its own command line (vLLM, SGLang, TensorRT-LLM,
TGI, LMDeploy, Ollama, llama-server …), launched, timed, identified and stopped by servelab.

A ``command`` candidate gives ``argv`` (a list, run without a shell), ``env``, ``cwd``, where the API
root will be (``host``, ``port`` or a ``{port}`` placeholder in ``argv``, ``api_root``), a readiness
probe (``GET path`` answering ``status``, or ``first_token``: the first streamed token), the start
timeout, the stop signal and its grace period. The base launcher (:mod:`servelab.engines.base`) runs
it in its own process group with its output in the run folder, times process start -> port open ->
ready -> first token, and stops the whole group (children included) with no process left.

The settings are in :mod:`servelab.engines.command_settings`, the identity the launcher records
(what servelab knows because it started the process, what the server says, the facts comparable with
a built-in launcher's) in :mod:`servelab.engines.command_identity`; this module keeps the launcher and
the kind. docs/command-candidates.md has worked examples for seven engines.
"""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import psutil

from servelab.engines.base import EngineLauncher
from servelab.engines.command_identity import command_identity, resolve_binary
from servelab.engines.command_settings import CommandSettings, ReadyProbe
from servelab.engines.exits import EngineStartError, tail_lines
from servelab.engines.kind import EngineKind, Readiness, ServerMetrics
from servelab.engines.running import RunningEngine
from servelab.engines.secrets import redact_env
from servelab.engines.spawn import GUARD_SCRIPT, free_port, log_dir_or_temp, spawn_on_port
from servelab.wire.errors import ConfigError

__all__ = ["CommandKind", "CommandLauncher", "port_owner"]

_PLACEHOLDERS = re.compile(r"\{(port|host)\}")


# ---------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------


def port_owner(port: int) -> str | None:
    """``"pid N (name)"`` of the process listening on TCP ``port``, when the OS tells (psutil)."""
    try:
        for c in psutil.net_connections(kind="tcp"):
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN and c.pid:
                try:
                    return f"pid {c.pid} ({psutil.Process(c.pid).name()})"
                except psutil.Error:
                    return f"pid {c.pid}"
    except (psutil.Error, OSError):
        pass
    return None


def _port_taken(host: str, port: int) -> bool:
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            return e.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


#: the guard in front of the engine (``guard: true``): :data:`servelab.engines.spawn.GUARD_SCRIPT`
_GUARD = GUARD_SCRIPT


class CommandLauncher(EngineLauncher):
    """Start a ``command`` candidate's engine (:class:`CommandSettings`) and identify it.

    ``log_dir``: where ``<argv0>-<port>.log`` goes (default: a new temp dir); ``api_key``: sent to the
    identity probe. :meth:`start` raises :class:`ConfigError` (port taken, ``argv[0]`` not found,
    ``cwd`` missing, an ``after_ready`` command failed) and :class:`EngineStartError` (exited or not
    ready in time; the log's last lines quoted)."""

    name = "command"

    def __init__(
        self,
        settings: CommandSettings,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        api_key: str | None = None,
        progress: Any = print,
        **_: Any,
    ) -> None:
        self.settings = settings
        self.log_dir = log_dir
        self.api_key = api_key
        self.progress = progress
        self.port = settings.port
        self.host = settings.host
        self.ready_timeout_s = settings.ready_timeout_s

    def env(self) -> tuple[dict[str, str], dict[str, str]]:
        """(the variables servelab sets: ``settings.env``; the process's whole environment)."""
        s = self.settings
        base = dict(os.environ) if s.inherit_env else {"PATH": os.environ.get("PATH", os.defpath)}
        return dict(s.env), {**base, **s.env}

    def argv(self, port: int) -> list[str]:
        """``settings.argv`` with every ``{port}`` and ``{host}`` replaced."""
        sub = {"port": str(port), "host": self.settings.host}
        return [_PLACEHOLDERS.sub(lambda m: sub[m.group(1)], a) for a in self.settings.argv]

    def _env_for(self, env: Mapping[str, str], port: int) -> dict[str, str]:
        sub = {"port": str(port), "host": self.settings.host}
        return {k: _PLACEHOLDERS.sub(lambda m: sub[m.group(1)], v) for k, v in env.items()}

    def full_argv(self, port: int, watch: str = "0") -> list[str]:
        """What is executed for ``port``: :meth:`argv`, behind the guard when ``guard`` is set
        (``watch``: "1" arms the parent-death signal, only for a start from the main thread)."""
        a = self.argv(port)
        if self.settings.guard:
            a = [sys.executable, "-c", _GUARD, str(os.getpid()), watch, "--", *a]
        return a

    def readiness(self) -> tuple[str, int]:
        """(path, HTTP status) the start waits for: ``ready``'s, or ``API_ROOT/models`` 200 before the
        first-token probe of ``ready: first_token``."""
        r = self.settings.ready
        if isinstance(r, ReadyProbe):
            return r.path, r.status
        return self.settings.api_root.rstrip("/") + "/models", 200

    def plan(self, port: int) -> dict[str, Any]:
        """Everything this launcher would do for ``port``, nothing started: ``argv`` (as executed),
        ``env`` (the variables set), ``inherit_env``, ``cwd``, ``base_url``, ``ready`` (path, status or
        first_token), ``ready_timeout_s``, ``stop`` (signal, grace), ``after_ready`` (argvs, timeout),
        ``model_name``. Secret ``env`` values are fingerprints (:func:`servelab.engines.secrets.redact_env`)."""
        s = self.settings
        sub = {"port": str(port), "host": s.host}
        url_host = f"[{s.host}]" if ":" in s.host else s.host
        return {
            "argv": self.full_argv(port),
            "env": redact_env(self._env_for(s.env, port), s.secret_env),
            "inherit_env": s.inherit_env,
            "cwd": s.cwd,
            "base_url": f"http://{url_host}:{port}{s.api_root.rstrip('/')}",
            "ready": [*self.readiness(), s.ready == "first_token"],
            "ready_timeout_s": s.ready_timeout_s,
            "stop": [s.stop_signal, s.stop_grace_s],
            "after_ready": [[_PLACEHOLDERS.sub(lambda m: sub[m.group(1)], a) for a in c] for c in s.after_ready],
            "after_ready_timeout_s": s.after_ready_timeout_s,
            "model_name": s.model_name,
        }

    def _check(self, full_env: Mapping[str, str], cwd: str) -> None:
        s = self.settings
        if not Path(cwd).is_dir():
            raise ConfigError(f"command cwd {cwd!r} is not a folder; create it or fix settings.cwd")
        if resolve_binary(s.argv[0], full_env, cwd) is None:
            raise ConfigError(
                f"command {s.argv[0]!r} is not an executable file or on PATH; give its full path in settings.argv[0]"
            )
        if s.port is not None and _port_taken(s.host, s.port):
            owner = port_owner(s.port)
            raise ConfigError(
                f"command port {s.port} on {s.host} is already taken"
                f"{' by ' + owner if owner else ''}; stop that process, or set port: null and "
                "write {port} in argv"
            )

    def start(self) -> RunningEngine:
        """Start the command, wait for readiness, run ``after_ready``, fill ``identity``."""
        s = self.settings
        log_dir = log_dir_or_temp(self.log_dir, "servelab-command-")
        cwd = s.cwd or str(log_dir)
        env_set, full_env = self.env()
        self._check(full_env, cwd)
        stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(s.argv[0]).name) or "engine"
        ready = s.ready
        health_path, status = self.readiness()
        watch = "1" if threading.current_thread() is threading.main_thread() else "0"

        def argv_for(port: int) -> list[str]:
            return self.full_argv(port, watch)

        port = s.port
        if port is None and any(_PLACEHOLDERS.search(v) for v in env_set.values()):
            port = free_port(s.host)  # the environment names the port (Ollama's OLLAMA_HOST): fixed before start
        if port is not None:
            env_set = self._env_for(env_set, port)
            full_env = {**full_env, **env_set}
        t_start = time.monotonic()
        eng = spawn_on_port(
            stem,
            argv_for,
            host=s.host,
            port=port,
            log_path_for=lambda p: log_dir / f"{stem}-{p}.log",
            env=full_env,
            cwd=cwd,
            ready_timeout_s=s.ready_timeout_s,
            health_path=health_path,
            ready_status=status,
            model_name=s.model_name or "default",
        )
        eng.stop_signal = getattr(signal, s.stop_signal)
        eng.stop_grace_s = s.stop_grace_s
        url_host = f"[{s.host}]" if ":" in s.host else s.host
        eng.base_url = f"http://{url_host}:{eng.port}{s.api_root.rstrip('/')}"
        eng.root_url = f"http://{url_host}:{eng.port}"
        try:
            if s.model_name is None:
                eng.model_name = _first_model_id(eng) or "default"
            if ready == "first_token":
                left = max(1.0, s.ready_timeout_s - (time.monotonic() - t_start))
                eng.measure_first_token(timeout_s=left)
                eng.cold_start["health_s"] = eng.cold_start["first_token_s"]
            for cmd in s.after_ready:
                self._after_ready(cmd, eng, full_env, cwd)
            if s.model_name is None and eng.model_name == "default":
                eng.model_name = _first_model_id(eng) or "default"
            eng.identity = command_identity(eng, s, env_set, full_env, cwd, api_key=self.api_key)
        except BaseException:
            eng.stop()
            raise
        return eng

    def _after_ready(self, cmd: Sequence[str], eng: RunningEngine, env: Mapping[str, str], cwd: str) -> None:
        sub = {"port": str(eng.port), "host": self.settings.host}
        argv = [_PLACEHOLDERS.sub(lambda m: sub[m.group(1)], a) for a in cmd]
        with open(eng.log_path, "ab") as log:
            log.write(f"# servelab: after_ready: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                rc = subprocess.run(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=dict(env),
                    cwd=cwd,
                    timeout=self.settings.after_ready_timeout_s,
                    check=False,
                ).returncode
            except (OSError, subprocess.TimeoutExpired) as e:
                raise ConfigError(f"after_ready command {argv[0]!r} failed: {e}") from None
        if rc != 0:
            raise EngineStartError(
                f"after_ready command {' '.join(argv)} exited with status {rc}; log "
                f"{eng.log_path}:\n" + "\n".join(tail_lines(eng.log_path)),
                tail_lines(eng.log_path),
                rc,
            )


def _first_model_id(eng: RunningEngine) -> str | None:
    try:
        status, body = eng.get(
            "/v1/models" if not eng.base_url.endswith("/v1") else eng.base_url[len(eng.root_url) :] + "/models",
            timeout_s=10,
        )
        if status == 200:
            data = json.loads(body).get("data") or []
            if data and isinstance(data[0].get("id"), str):
                return str(data[0]["id"])
    except (OSError, ValueError, AttributeError):
        pass
    return None


# ---------------------------------------------------------------------------------------------------
# the engine kind ``command``
# ---------------------------------------------------------------------------------------------------


class CommandKind(EngineKind[CommandSettings]):
    """``engine: command``: any engine started by its own command line (``settings.argv``)."""

    kind = "command"
    title = "command"
    summary = "any engine started by its own command line (settings.argv, no shell; {port} replaced)"
    Settings = CommandSettings
    takes_model = False
    readiness: ClassVar[Readiness] = Readiness(path="/health")

    @property
    def metrics(self) -> ServerMetrics:  # type: ignore[override]  # the make is detected, not declared
        """Every known engine's metric names (the make of the command is not known beforehand): the
        launched kinds' own (not the mock's, nor this kind's or ``url``'s, which are merges too) and
        SGLang's and TGI's."""
        from servelab.engines.registry import kinds  # at call time: the registry loads this module
        from servelab.engines.url import SGLANG_METRICS, TGI_METRICS

        own = [k.metrics for k in kinds() if k.launched and k.kind != "mock" and not isinstance(k, CommandKind)]
        return ServerMetrics.merged([*own, SGLANG_METRICS, TGI_METRICS])

    def launcher(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> CommandLauncher:
        """:class:`CommandLauncher` for ``settings`` (:class:`CommandSettings`); ``model`` is refused
        (the command line names its model)."""
        if model is not None:
            raise ConfigError("engine 'command' takes no model: name the model in settings.argv")
        return CommandLauncher(self.parse(settings), log_dir=log_dir, **kwargs)
