"""Field rules shared by the models of the experiment file (:mod:`servelab.trial.spec`): the name pattern,
the smoke checks a candidate can require, and paths resolved against the file's folder."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import ValidationInfo

from servelab.engines.registry import ENV_NAME_PATTERN

__all__ = ["ALL_SMOKE", "ENV_NAME", "NAME_PATTERN", "SmokeCheck", "resolve_path"]

NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"

ENV_NAME = ENV_NAME_PATTERN
#: sub-features the smoke test can require of a candidate
SmokeCheck = Literal["streaming", "usage", "json_schema", "stop", "tools", "reasoning", "cancellation"]
ALL_SMOKE: tuple[SmokeCheck, ...] = ("streaming", "usage", "json_schema", "stop")


def resolve_path(value: str, info: ValidationInfo, what: str, fix: str) -> str:
    """``value`` as an absolute path (relative to ``context["base_dir"]`` or the working directory);
    raises ValueError when nothing exists there."""
    p = Path(value).expanduser()
    if not p.is_absolute():
        base = (info.context or {}).get("base_dir") if info.context else None
        p = Path(base or os.getcwd()) / p
    p = Path(os.path.abspath(p))
    if not p.exists():
        raise ValueError(f"{what} {value!r} does not exist ({p}); {fix}")
    return str(p)
