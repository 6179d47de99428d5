"""llama.cpp's ``llama-server`` as the engine kind ``llamacpp``, one job per module:

- :mod:`~servelab.engines.llamacpp.build`: build ``llama-server`` for this host, prove it serves, cache it
  with a manifest, refuse a cached binary this CPU cannot run;
- :mod:`~servelab.engines.llamacpp.weights`: the default GGUF and a GGUF's identity;
- :mod:`~servelab.engines.llamacpp.launch`: :class:`LlamaCppLauncher` (command line, start, identity)
  and :func:`crash_hint`;
- :mod:`~servelab.engines.llamacpp.kind`: :class:`LlamaCppSettings`, the metric names and
  :class:`LlamaCppKind`, which the registry loads.

This package re-exports the names callers use, so ``from servelab.engines.llamacpp import
LlamaCppLauncher`` keeps working; the host's CPU facts stay engine-neutral in :mod:`servelab.engines.isa`.

Usage::

    from servelab.engines.llamacpp import LlamaCppLauncher
    with LlamaCppLauncher(ctx_size=2048, parallel=2).start() as eng:
        eng.base_url   # http://127.0.0.1:PORT/v1
"""

from __future__ import annotations

from servelab.engines.llamacpp.build import ensure_llama_server
from servelab.engines.llamacpp.cache import (
    cached_versions,
    check_host,
    find_llama_server,
    llama_server_info,
    read_manifest,
)
from servelab.engines.llamacpp.kind import LLAMACPP_METRICS, LlamaCppKind, LlamaCppSettings
from servelab.engines.llamacpp.launch import LlamaCppLauncher, crash_hint, llama_server_info_for, up
from servelab.engines.llamacpp.manifest import CMAKE_FLAGS, BuildSpec, IncompatibleBuildError
from servelab.engines.llamacpp.weights import default_model_path, file_sha256, gguf_metadata, model_identity
from servelab.modelfile.gguf_meta import cache_dir, check_gguf

__all__ = [
    "CMAKE_FLAGS",
    "LLAMACPP_METRICS",
    "BuildSpec",
    "IncompatibleBuildError",
    "LlamaCppKind",
    "LlamaCppLauncher",
    "LlamaCppSettings",
    "cache_dir",
    "cached_versions",
    "check_gguf",
    "check_host",
    "crash_hint",
    "default_model_path",
    "ensure_llama_server",
    "file_sha256",
    "find_llama_server",
    "gguf_metadata",
    "llama_server_info",
    "llama_server_info_for",
    "model_identity",
    "read_manifest",
    "up",
]
