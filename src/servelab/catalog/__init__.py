"""The catalogs servelab selects from: inference engines (``engines.yaml``), hardware
(``hardware.yaml``) and models (``models.yaml``, plus readers of config.json / GGUF headers).

Public functions (each ``find_*`` raises :class:`servelab.wire.errors.ConfigError` naming the nearest
known names when a name is unknown):

- :func:`load_engines`, :func:`find_engine` — engine projects, their stack layers, tasks, modalities,
  platforms, features and lifecycle (every row with ``source`` and ``checked``);
- :func:`load_hardware`, :func:`find_hardware` — devices with memory, bandwidth, dense TFLOPS and
  interconnect;
- :func:`load_models`, :func:`find_model` — model entries (``servelab.catalog.models``).

Nothing is fetched at run time: the data files ship with the package. The functions import their
modules on first use (a command that needs no catalog does not load one). Module order, no cycles:
``schema`` <- ``engines``, ``hardware``, ``models`` <- ``params`` <- ``readers`` <- ``resolve``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["find_engine", "find_hardware", "find_model", "load_engines", "load_hardware", "load_models"]


def load_engines() -> Any:
    """Every engine entry (see :func:`servelab.catalog.engines.load_engines`)."""
    from servelab.catalog.engines import load_engines as _load

    return _load()


def find_engine(name: str) -> Any:
    """An engine by name or alias (see :func:`servelab.catalog.engines.find_engine`). Raises
    ConfigError with the nearest names."""
    from servelab.catalog.engines import find_engine as _find

    return _find(name)


def load_hardware() -> Any:
    """Every hardware entry (see :func:`servelab.catalog.hardware.load_hardware`)."""
    from servelab.catalog.hardware import load_hardware as _load

    return _load()


def find_hardware(name: str) -> Any:
    """A device by name or alias (see :func:`servelab.catalog.hardware.find_hardware`). Raises
    ConfigError with the nearest names."""
    from servelab.catalog.hardware import find_hardware as _find

    return _find(name)


def load_models(*args: Any, **kwargs: Any) -> Any:
    """Every model entry of the model catalog (see :func:`servelab.catalog.models.load_models`)."""
    from servelab.catalog.models import load_models as _load

    return _load(*args, **kwargs)


def find_model(name_or_path: str, *args: Any, **kwargs: Any) -> Any:
    """A model by catalog name/alias or by a local path (config.json folder or GGUF file); see
    :func:`servelab.catalog.resolve.find_model`. Raises ConfigError with the nearest names."""
    from servelab.catalog.resolve import find_model as _find

    return _find(name_or_path, *args, **kwargs)
