"""The hardware catalog: GPUs, accelerators, Apple SoCs and CPU sockets with the figures a capacity
plan needs (``data/hardware.yaml``, validated by :class:`servelab.catalog.schema.HardwareEntry`).

A hardware argument on the command line is ``NAME[:COUNT]`` (``H100-80GB:2``, ``laptop-cpu``); see
:func:`parse_hardware_spec`. Every entry states its datasheet ``source`` and ``checked`` date; values
that are derivations or assumptions are listed in the entry's ``estimated`` field.
"""

from __future__ import annotations

import re

from servelab.catalog.schema import DATA_DIR, HardwareCatalog, HardwareEntry, catalog_entries, lookup
from servelab.wire.errors import ConfigError

HARDWARE_FILE = DATA_DIR / "hardware.yaml"

__all__ = ["HARDWARE_FILE", "HardwareEntry", "find_hardware", "load_hardware", "parse_hardware_spec"]


def load_hardware() -> list[HardwareEntry]:
    """Every hardware entry, in file order (validated once per process; entries are frozen).
    Raises :class:`~servelab.wire.errors.ConfigError` if the packaged file is invalid."""
    return list(catalog_entries(HARDWARE_FILE, HardwareCatalog))


def find_hardware(name: str) -> HardwareEntry:
    """The entry whose name or alias is ``name`` (case, ``-``, ``_`` and spaces ignored).
    Raises :class:`~servelab.wire.errors.ConfigError` with the nearest names when there is none."""
    return lookup(catalog_entries(HARDWARE_FILE, HardwareCatalog), name, "hardware", "servelab catalog hardware")


_SPEC = re.compile(r"^\s*(?P<name>[^:]+?)\s*(?::\s*(?P<count>[^:]*?)\s*)?$")


def parse_hardware_spec(spec: str) -> tuple[HardwareEntry, int]:
    """Parse ``NAME[:COUNT]`` into (entry, device count); COUNT defaults to 1.

    Raises :class:`~servelab.wire.errors.ConfigError` (one line) for an empty name, a COUNT that is not
    a whole number ≥ 1, more than one ``:``, an unknown name (nearest names suggested), and a count
    above the entry's ``max_per_node`` × 64 (no catalogued deployment is that large)."""
    m = _SPEC.match(spec or "")
    if not spec or m is None or not m.group("name").strip():
        raise ConfigError(
            f"--hardware {spec!r}: write NAME[:COUNT], e.g. H100-80GB:2 or laptop-cpu "
            "(`servelab catalog hardware` lists the names)"
        )
    raw = m.group("count")
    if raw is None:
        count = 1
    elif not raw.isdigit() or int(raw) < 1:
        raise ConfigError(
            f"--hardware {spec!r}: the device count {raw!r} must be a whole number >= 1, e.g. H100-80GB:2"
        )
    else:
        count = int(raw)
    hw = find_hardware(m.group("name"))
    if count > hw.max_per_node * 64:
        raise ConfigError(
            f"--hardware {spec!r}: {count} devices is beyond {hw.max_per_node * 64} "
            f"({hw.max_per_node} per node x 64 nodes); give the devices of one deployment"
        )
    return hw, count
