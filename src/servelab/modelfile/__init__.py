"""servelab.modelfile: model files (GGUF metadata, cached SHA-256) and client-side tokenizers.

``from servelab.modelfile import read_metadata, sha256_file, load_tokenizer``. The tokenizer module
(which imports ``tokenizers``) is loaded on first use.
"""

from __future__ import annotations

from typing import Any

from servelab.modelfile.gguf_meta import cache_dir, is_gguf, read_arrays, read_metadata, sha256_file

__all__ = ["TokenCounter", "cache_dir", "is_gguf", "load_tokenizer", "read_arrays", "read_metadata", "sha256_file"]


def __getattr__(name: str) -> Any:
    if name in ("TokenCounter", "load_tokenizer"):
        from servelab.modelfile import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(name)
