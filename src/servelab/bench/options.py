"""Validation of ``servelab bench`` values, once, in typed models: the limits of every option and the
one-line error that names the option and the fix.

The models (:class:`servelab.bench.runner.BenchConfig`, :class:`EngineOptions`) declare each field with
:func:`opt`, which carries the field's command-line flag and a hint next to its constraints;
:func:`config_error` turns a pydantic :class:`~pydantic.ValidationError` into a
:class:`~servelab.wire.ConfigError` such as ``--timeout 0.0: input should be greater than 0; give
the per-request limit in seconds, e.g. --timeout 120``.

Limits servelab sets itself (documented in docs/summary-schema.md and the README bench section):

- :data:`MAX_PROMPT_TOKENS` and :data:`MAX_OUTPUT_TOKENS`: 1,048,576 tokens (2^20) per request, the
  largest context lengths served in practice (1M-token models such as Qwen2.5-1M); a longer prompt
  takes minutes to build per request and no engine would accept it.
- :data:`MAX_REQUESTS_PER_STEP`: 1,000,000 requests per step (their specs are built up front).
- :data:`MAX_MIX_WEIGHT`: 1,000 per set in a ``mix`` ratio (a block holds ``sum(weights)`` requests).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servelab.wire.client import ConfigError

MAX_PROMPT_TOKENS = 1_048_576
MAX_OUTPUT_TOKENS = 1_048_576
MAX_REQUESTS_PER_STEP = 1_000_000
MAX_MIX_WEIGHT = 1_000


def opt(default: Any = ..., *, cli: str, hint: str, **constraints: Any) -> Any:
    """A pydantic ``Field(default, **constraints)`` that also records the option's command-line
    flag ``cli`` (e.g. ``"--timeout"``) and a ``hint`` (how to fix a bad value) for :func:`config_error`.
    ``default_factory=`` may replace ``default``."""
    return Field(default, json_schema_extra={"cli": cli, "hint": hint}, **constraints)


def _show(value: Any) -> str:
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value) or value == int(value)):
        return str(value)
    if isinstance(value, str):
        return repr(value)
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def config_error(exc: ValidationError, fields: Mapping[str, Any]) -> ConfigError:
    """One line for the first error of ``exc``: ``FLAG VALUE: WHAT IS WRONG; HINT``.

    ``fields`` maps field names to pydantic ``FieldInfo`` (a model's ``model_fields``, a pydantic
    dataclass's ``__pydantic_fields__``); a field without :func:`opt` metadata is named as it is.
    A model-level validator's message (raised as ``ValueError``) is returned as it is."""
    err = exc.errors(include_url=False)[0]
    msg = str(err.get("msg", "invalid value"))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    loc = err.get("loc") or ()
    if not loc:
        return ConfigError(msg)
    name = str(loc[0])
    info = fields.get(name)
    extra = getattr(info, "json_schema_extra", None) or {}
    flag = extra.get("cli", name) if isinstance(extra, dict) else name
    hint = extra.get("hint") if isinstance(extra, dict) else None
    msg = msg[:1].lower() + msg[1:]
    return ConfigError(f"{flag} {_show(err.get('input'))}: {msg}" + (f"; {hint}" if hint else ""))


class EngineOptions(BaseModel):
    """``--engine-parallel`` (slots, count) and ``--engine-ctx`` (total context, tokens) of an engine
    ``servelab bench --engine`` starts. ``ctx_tokens = 0`` means the model's trained context
    (llama-server ``-c 0``, https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md,
    read 2026-12-01). Raises :class:`pydantic.ValidationError` (see :meth:`checked`)."""

    model_config = ConfigDict(extra="forbid")

    parallel: int = opt(4, cli="--engine-parallel", ge=1, le=1024,
                        hint="give the number of slots, 1 to 1024, e.g. --engine-parallel 4")
    ctx_tokens: int = opt(8192, cli="--engine-ctx", ge=0, le=MAX_PROMPT_TOKENS * 64,
                          hint="give the total context in tokens (0 = the model's own), e.g. --engine-ctx 8192")

    @classmethod
    def checked(cls, **values: Any) -> EngineOptions:
        """Validate ``values``; raises :class:`ConfigError` (one line) instead of a ValidationError."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise config_error(e, cls.model_fields) from None
