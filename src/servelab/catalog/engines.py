"""The engine catalog: inference engines, pipeline libraries and serving platforms named in
../shared/seeds/000 (§1–§4, §11), with stack layers, tasks, input/output modalities, hardware platforms,
weight formats, quantisations, features and lifecycle (``data/engines.yaml``, validated by
:class:`servelab.catalog.schema.EngineEntry`). Every row carries ``source`` and ``checked``.
"""

from __future__ import annotations

from servelab.catalog.schema import DATA_DIR, EngineCatalog, EngineEntry, catalog_entries, lookup

ENGINES_FILE = DATA_DIR / "engines.yaml"

__all__ = ["ENGINES_FILE", "EngineEntry", "find_engine", "load_engines"]


def load_engines() -> list[EngineEntry]:
    """Every engine entry, in file order (validated once per process; entries are frozen).
    Raises :class:`~servelab.wire.errors.ConfigError` if the packaged file is invalid."""
    return list(catalog_entries(ENGINES_FILE, EngineCatalog))


def find_engine(name: str) -> EngineEntry:
    """The entry whose name or alias is ``name`` (case, ``-``, ``_`` and spaces ignored).
    Raises :class:`~servelab.wire.errors.ConfigError` with the nearest names when there is none."""
    return lookup(catalog_entries(ENGINES_FILE, EngineCatalog), name, "engine", "servelab catalog engines")
