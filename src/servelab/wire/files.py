"""Small runtime helpers every part shares: reading a user's YAML file with one-line errors, and
turning on uvloop for servers."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import yaml

from servelab.wire.client import ConfigError


def read_yaml_file(path: str | Path, *, what: str, missing_fix: str, empty_fix: str) -> Any:
    """Read and parse the YAML file ``path`` (a user's experiment, gateway config, …).

    Returns the parsed document (never ``None``). Raises :class:`ConfigError` with one line that names
    the file and the fix: missing file (``missing_fix``), a folder, unreadable or non-UTF-8 text, a
    YAML syntax error (with line and column), an empty file (``empty_fix``). ``what`` names the kind
    of file in messages ("experiment", "gateway config").
    """
    src = str(path)
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{src}: no such {what} file; {missing_fix}")
    if p.is_dir():
        raise ConfigError(f"{src}: is a folder; give the {what}'s YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{src}: cannot read as UTF-8 text ({e}); give a YAML file") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        what_err = e.problem or e.context or "syntax error"
        raise ConfigError(f"{src}: {where}invalid YAML: {what_err}; fix the indentation or quoting there") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{src}: invalid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        raise ConfigError(f"{src}: the file is empty; {empty_fix}")
    return data


def install_uvloop() -> bool:
    """Make uvloop the asyncio event loop policy when it is installed (the ``fast`` extra); returns
    whether it did. Call before ``asyncio.run``."""
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
