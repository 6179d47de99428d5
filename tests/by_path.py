"""Load a test helper file by its path under a module name of its own: for a file that cannot be imported by
name, such as a ``conftest.py`` that another ``conftest.py`` shadows as module ``conftest``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_module(name: str, path: Path) -> ModuleType:
    """The module ``name`` run from ``path`` the first time it is asked for; after that the same module
    (kept in ``sys.modules``), so its module-level state exists once."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]
