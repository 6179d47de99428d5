"""Validation of ``servelab bench`` values, once, in typed models: the limits of every option and the
one-line error that names the option and the fix.

The models (:class:`servelab.bench.load.config.BenchConfig`, :class:`EngineOptions`) declare each field with
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
- :data:`MIN_RATE_RPS` to :data:`MAX_RATE_RPS`: ``--rate`` from 0.001 requests/s (one arrival every
  1,000 s on average; a lower rate would overflow the arrival clock and fire every request at once)
  to 1,000,000 requests/s (past that every arrival lands in the same microsecond: a burst, not a rate).
- :data:`MIN_BURSTINESS` to :data:`MAX_BURSTINESS`: the gamma shape ``--burstiness`` from 0.01
  (coefficient of variation 10) to 100 (CV 0.1, nearly constant); vLLM's ``benchmark_serving
  --burstiness`` takes the same gamma shape, without bounds
  (https://docs.vllm.ai/en/v0.11.2/cli/bench/serve/, read 2026-12-01).
- :data:`MAX_CONCURRENCY`: 100,000 requests in flight.
- :data:`MAX_WORKERS`: 4,096 load-generator workers (``--workers``, ``--workers-per-node``): far above the cores
  of any one host or the CPUs of a test cluster; a typo such as ``--workers 40000`` is refused, not spawned.
- :data:`MAX_THINK_TIME_S`: 1 hour of mean think time between the turns of a session (``--think-time-s``);
  a user away longer starts a new session, and an unbounded mean (1e22 s) would hang the step.
- :data:`MAX_STEP_S`: 7 days per step (``--duration``; an open-loop step's ``(requests + warmup) / rate``);
  with ``--duration`` the slowest rate must expect at least one arrival (``rate * duration >= 1``).

Comma-separated options (``--concurrency``, ``--rate``, ``--workload``, ``--slo``, the ``ratio``
of ``--set``) are split by :func:`split_list` only: an empty value or an empty item (``1,,2``,
``','``, ``''``) is refused, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from servelab.wire.client import ConfigError

MAX_PROMPT_TOKENS = 1_048_576
MAX_OUTPUT_TOKENS = 1_048_576
MAX_REQUESTS_PER_STEP = 1_000_000
MAX_MIX_WEIGHT = 1_000
MIN_RATE_RPS = 1e-3
MAX_RATE_RPS = 1e6
MIN_BURSTINESS = 0.01
MAX_BURSTINESS = 100.0
MAX_CONCURRENCY = 100_000
MAX_STEP_S = 7 * 86400
MAX_THINK_TIME_S = 3600.0
MAX_WORKERS = 4096


def split_list(text: Any, flag: str | None = None, fix: str | None = None) -> list[str]:
    """The stripped items of a comma-separated option value: ``"1, 2"`` -> ``["1", "2"]``.

    Raises :class:`ConfigError` when ``text`` is not a string, is empty or blank, or has an empty item
    (``"1,,2"``, ``","``, ``"1,"``). The message is ``FLAG 'TEXT': PROBLEM; FIX`` when ``flag`` is
    given, else only ``PROBLEM`` (inside a model, :func:`config_error` adds the flag and hint). A value
    that is already a list (a caller of the Python API) is returned as it is."""
    if isinstance(text, list):
        return text
    problem = None
    if not isinstance(text, str):
        problem = f"expected comma-separated values, got {type(text).__name__}"
        items: list[str] = []
    else:
        items = [x.strip() for x in text.split(",")]
        if not any(items):
            problem = "no values given"
        elif not all(items):
            k = items.index("") + 1
            problem = f"item {k} of {len(items)} is empty (a doubled, leading or trailing comma)"
    if problem is None:
        return items
    if flag is None:
        raise ConfigError(problem)
    raise ConfigError(f"{flag} {_show(text)}: {problem}" + (f"; {fix}" if fix else ""))


_Items = BeforeValidator(split_list)
#: ``--concurrency``: comma-separated counts, 1 to :data:`MAX_CONCURRENCY` each (a list is taken as is).
ConcurrencyList = Annotated[list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]], _Items]
#: ``--rate``: comma-separated finite rates, requests/s, :data:`MIN_RATE_RPS` to :data:`MAX_RATE_RPS`.
RateList = Annotated[list[Annotated[float, Field(ge=MIN_RATE_RPS, le=MAX_RATE_RPS, allow_inf_nan=False)]], _Items]
#: ``--workload``: comma-separated non-empty names (which names exist is checked by the workloads).
NameList = Annotated[list[Annotated[str, Field(min_length=1)]], _Items]


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
        msg = msg[len("Value error, ") :]
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

    parallel: int = opt(
        4, cli="--engine-parallel", ge=1, le=1024, hint="give the number of slots, 1 to 1024, e.g. --engine-parallel 4"
    )
    ctx_tokens: int = opt(
        8192,
        cli="--engine-ctx",
        ge=0,
        le=MAX_PROMPT_TOKENS * 64,
        hint="give the total context in tokens (0 = the model's own), e.g. --engine-ctx 8192",
    )

    @classmethod
    def checked(cls, **values: Any) -> EngineOptions:
        """Validate ``values``; raises :class:`ConfigError` (one line) instead of a ValidationError."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise config_error(e, cls.model_fields) from None


def dataset_max_tokens(value: Any, where: str) -> int:
    """A dataset entry's ``max_tokens``/``output_tokens``: an integer (not a bool) from 1 to
    :data:`MAX_OUTPUT_TOKENS`. Raises :class:`ConfigError` starting with ``where`` (e.g. ``"dataset
    d.jsonl: line 3"``); a value past 2^63 would otherwise reach the JSON encoder and end in a traceback."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise ConfigError(
            f"{where}: max_tokens/output_tokens must be an integer from 1 to {MAX_OUTPUT_TOKENS} "
            f"(servelab's limit per request), got {_show(value)}"
        )
    return value


def scoped_overrides(overrides: dict[str, Any], workload: str) -> dict[str, Any]:
    """The ``--set`` parameters for one workload: ``KEY`` applies to every set, ``SET.KEY`` (e.g.
    ``short-qa.output_tokens``) only to that set and wins over a plain ``KEY``."""
    out = {k: v for k, v in overrides.items() if "." not in k}
    for k, v in overrides.items():
        if "." in k:
            name, key = k.split(".", 1)
            if name == workload:
                out[key] = v
    return out
