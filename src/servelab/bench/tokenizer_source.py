"""The client tokenizer of a bench run: ``--tokenizer``, else the GGUF llama-server names at ``/props`` when
it is on this machine (for embeddings, the embedder checkpoint's ``tokenizer.json``); ``None`` means
lengths are approximate and token counts come from the server alone."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.wire.client import ConfigError

if TYPE_CHECKING:
    pass


__all__ = ["client_tokenizer"]


def client_tokenizer(tokenizer: str | None, base_url: str, endpoint: str) -> tuple[str | None, Any]:
    """``(tokenizer path, TokenCounter or None)``: ``--tokenizer``, else what the server names (llama-server
    ``/props``; for embeddings the embedder checkpoint's tokenizer.json, :func:`_embedder_tokenizer`)."""
    if tokenizer is None:
        tokenizer = _tokenizer_from_server(base_url)
        if tokenizer and endpoint == "embeddings":
            tokenizer = _embedder_tokenizer(tokenizer)
    if not tokenizer:
        return tokenizer, None
    from servelab.modelfile.tokenizer import load_tokenizer

    return tokenizer, load_tokenizer(tokenizer)  # (a checkpoint's fixed padding is turned off there)


def _embedder_tokenizer(path: str) -> str | None:
    """For ``--endpoint embeddings``: the server's GGUF when servelab reads its tokenizer, else the
    all-MiniLM-L6-v2 checkpoint's ``tokenizer.json`` when the server runs servelab's converted GGUF of it
    (servelab does not rebuild BERT WordPiece tokenizers from a GGUF), else ``None`` (lengths approximate)."""
    from servelab.engines.embedder import MODEL_ID, weights_dir

    if MODEL_ID in Path(path).name:
        try:
            return str(weights_dir() / "tokenizer.json")
        except ConfigError:
            return None
    return path


def _tokenizer_from_server(base_url: str) -> str | None:
    """llama-server reports its GGUF path at /props; use it when that file is on this machine."""
    import json
    import urllib.request

    root = base_url[:-3] if base_url.endswith("/v1") else base_url
    try:
        with urllib.request.urlopen(root + "/props", timeout=5) as r:
            path = json.loads(r.read()).get("model_path")
    except Exception:  # noqa: BLE001 — any failure just means "unknown"
        return None
    return path if path and os.path.isfile(path) else None
