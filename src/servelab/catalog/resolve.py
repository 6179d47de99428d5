"""Resolve what a user names as a model: a catalog name or alias, a Hugging Face ``config.json`` (or its
folder), or a ``.gguf`` file, to one :class:`~servelab.catalog.models.ModelEntry`.

It sits above both sources it chooses between (:mod:`servelab.catalog.models` and
:mod:`servelab.catalog.readers`), so neither imports the other's caller (no import cycle).
"""

from __future__ import annotations

import difflib
from pathlib import Path

from servelab.catalog.models import ModelEntry, load_models
from servelab.catalog.readers import read_model_file
from servelab.wire.errors import ConfigError

__all__ = ["find_model"]


def _index() -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for m in load_models():
        for key in [m.name, *m.aliases]:
            out[key.lower()] = m
    return out


def find_model(name_or_path: str | Path) -> ModelEntry:
    """Resolve a catalog name/alias (case-insensitive), a path to a Hugging Face ``config.json`` or a
    folder holding one, or a ``.gguf`` file, to a :class:`ModelEntry`.

    Files are read by :func:`servelab.catalog.readers.read_model_file`; the entry it returns has
    ``source`` = ``file://...`` semantics recorded in ``notes`` (its ``source`` stays an http URL of the
    format's spec). Raises :class:`ConfigError` naming the closest catalog names (difflib) when the name
    is unknown and no such file exists, or when a file cannot be read.
    """
    key = str(name_or_path).strip()
    hit = _index().get(key.lower())
    if hit is not None:
        return hit
    p = Path(key).expanduser()
    if p.exists():
        return read_model_file(p)
    if "/" in key or "\\" in key or p.suffix.lower() in (".gguf", ".json"):
        raise ConfigError(
            f"model file {key!r} not found; check the path, or pass a catalog name "
            "(`servelab catalog models` lists them)"
        )
    names = sorted({m.name for m in load_models()} | {a for m in load_models() for a in m.aliases})
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.4)
    if not near:
        near = difflib.get_close_matches(key.lower(), [n.lower() for n in names], n=3, cutoff=0.3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ConfigError(
        f"unknown model {key!r}: not in the models catalog and not a config.json/GGUF path{hint} "
        "(list them with `servelab catalog models`, or pass a config.json or .gguf path)"
    )
