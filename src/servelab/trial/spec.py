"""The experiment file of ``servelab trial`` (YAML), validated with pydantic; docs/experiment.md.

An experiment states the goal (task, SLOs, error budget, quality gates, the expected arrival rate and
mix, budget), the candidates (engine kind + model + settings, launched by servelab or an existing URL),
the workloads (built-in sets of :mod:`servelab.bench.workloads.registry` or JSONL datasets), the load steps
(concurrency levels or open-loop rates) and the method (requests per step, warmup, seed, timeout).

Public API:

- :func:`load_experiment` reads and validates a file; every problem becomes one
  :class:`servelab.wire.ConfigError` line naming the file, the path of the bad field and the fix, e.g.
  ``experiment.yaml: candidates[0].settings.paralel: unknown field (did you mean 'parallel'?)``.
- :func:`default_experiment` is the built-in experiment (``servelab trial`` with no file).
- :meth:`Experiment.to_yaml` writes an experiment back (it loads to an equal :class:`Experiment`).
- :func:`json_schema` is the JSON Schema for editors; ``servelab schema write`` regenerates the committed
  ``experiment.schema.json`` next to this module (``servelab schema check`` verifies it).

Relative paths in a file (``model``, ``dataset``) are relative to the file's folder and are stored
absolute after loading. Units are in the field names (``_s`` seconds, ``_ms`` milliseconds, ``_rps``
requests per second) or in the field descriptions.

The sections of the file are their own modules: the goal (:mod:`servelab.trial.goal`), the candidates
(:mod:`servelab.trial.candidates`), the load it sends (:mod:`servelab.trial.load_plan`) and the field
rules they share (:mod:`servelab.trial.spec_fields`); this module holds :class:`Experiment`, which
joins them, and its loading, default and schema.
"""

from __future__ import annotations

import copy
import math
import os
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator
from pydantic.json_schema import JsonSchemaValue

from servelab.bench.load.step import LoadModel
from servelab.bench.options import MAX_REQUESTS_PER_STEP, MAX_STEP_S
from servelab.bench.workloads.registry import make_workload, mixable_workloads
from servelab.engines import registry
from servelab.trial.candidates import AnyCandidate, Candidate
from servelab.trial.embed_spec import EmbeddingsOptions, embeddings_conflicts
from servelab.trial.goal import Goal
from servelab.trial.lifecycle import LifecycleOptions
from servelab.trial.load_plan import (
    ArrivalTest,
    CapacitySearch,
    LoadGenerator,
    Steps,
    WorkloadItem,
    default_steps,
    default_workloads,
)
from servelab.trial.served_checks import CheckName, default_checks
from servelab.trial.spec_fields import ENV_NAME, NAME_PATTERN
from servelab.wire.config import PublishedSchema, StrictModel, json_schema_of, read_yaml_file, validation_error_line
from servelab.wire.errors import ConfigError
from servelab.wire.jsontypes import JsonObject

__all__ = [
    "PUBLISHED_SCHEMA",
    "SCHEMA_PATH",
    "Experiment",
    "default_experiment",
    "describe_validation_error",
    "json_schema",
    "load_experiment",
    "non_finite_path",
]

#: The committed JSON Schema file (regenerate with ``servelab schema write``).
SCHEMA_PATH = Path(__file__).with_name("experiment.schema.json")


def __getattr__(name: str) -> Any:
    if name == "ENGINES":  # engine kinds a candidate can name (``candidates[i].engine``): the registry's
        return tuple(k.kind for k in registry.kinds())
    raise AttributeError(name)


# ---------------------------------------------------------------------------------------------------
# experiment


class Experiment(StrictModel):
    """A selection experiment (docs/experiment.md).

    ``name``: ``[A-Za-z0-9_.-]+`` (default: the file name). ``goal``: :class:`Goal`. ``candidates``: at
    least one (:class:`LlamaCppCandidate` | :class:`VllmCandidate` | :class:`UrlCandidate` |
    :class:`MockCandidate`, by ``engine``), unique names. ``workloads``: :class:`WorkloadItem` list
    (default short-qa, structured), each runs its own sweep. ``steps``: :class:`Steps` (default
    concurrency 1, 2, 4, 8). ``requests_per_step``: measured requests per workload and step (default 8).
    ``warmup``: requests before each step, excluded (default 2). ``seed``: request and arrival seed.
    ``timeout_s``: per-request timeout, seconds (default 120). ``ignore_eos``: ask engines for exact output
    lengths (not for structured requests). ``stop_on_slo``: skip higher steps after the first broken one
    (default true). ``arrival_test``: :class:`ArrivalTest`. ``mix_sweep``: run the goal's mix of the
    experiment's own workloads (``goal.mix``, each set with its ``set`` overrides) concurrently at every
    load step — the figure candidates are ranked on (default true; off, a single workload is ranked on
    its own sweep and several are not ranked: their separate runs are never added). ``repeats``: runs
    of the ranked mix level per candidate (default 3), round by round across candidates (A B A B): the
    first round sweeps every level; each later one, on a freshly started engine, re-runs the level the
    first round found effective (the figure the ranking compares). Three is the fewest with which the
    spread between rounds can be estimated (two leave a candidate-specific run effect unseen and let
    noise pass for a difference; tests/trial/test_significance.py). Gates, per-workload sweeps, arrival
    test and capacity search run once.
    ``capacity``: :class:`CapacitySearch`. ``load_generator``: :class:`LoadGenerator` (several processes
    or a Ray cluster for the load steps and the arrival test).
    """

    name: str | None = Field(None, pattern=NAME_PATTERN, description="experiment name; default: the file name")
    goal: Goal = Field(default_factory=Goal)
    candidates: list[AnyCandidate] = Field(min_length=1, description="engines to compare")
    workloads: list[WorkloadItem] = Field(default_factory=default_workloads, min_length=1)
    steps: Steps = Field(default_factory=default_steps)
    requests_per_step: int = Field(
        8, ge=1, le=MAX_REQUESTS_PER_STEP, description="measured requests per workload and step"
    )
    warmup: int = Field(2, ge=0, le=MAX_REQUESTS_PER_STEP, description="warmup requests before each step (excluded)")
    seed: int = Field(0, ge=-(2**63), lt=2**63, description="seed of requests and arrival times")
    timeout_s: float = Field(120.0, gt=0, le=MAX_STEP_S, description="per-request timeout, seconds")
    ignore_eos: bool = Field(True, description="exact output lengths (ignore_eos) except structured requests")
    stop_on_slo: bool = Field(True, description="skip higher steps after the first step that breaks an SLO")
    arrival_test: ArrivalTest = Field(default_factory=ArrivalTest)
    repeats: int = Field(
        3,
        ge=1,
        le=20,
        description="runs of the ranked mix level per candidate, interleaved across candidates (A B A B)",
    )
    mix_sweep: bool = Field(True, description="run the goal's mix concurrently at every load step (the ranked figure)")
    capacity: CapacitySearch = Field(default_factory=CapacitySearch)
    lifecycle: LifecycleOptions = Field(
        default_factory=LifecycleOptions, description="cold vs warm start, restart under load and cancellation"
    )
    checks: list[CheckName] = Field(
        default_factory=default_checks,
        description="served-behaviour checks per candidate after its gates: context "
        "(longest prompt served whole, <= 60 s) and template (the chat "
        "template the server applies vs the model's)",
    )
    load_generator: LoadGenerator = Field(
        default_factory=LoadGenerator, description="processes or Ray actors that send the load steps' load"
    )
    embeddings: EmbeddingsOptions = Field(
        default_factory=EmbeddingsOptions,
        description="requests and gate of an embeddings trial (goal.task_kind: embeddings)",
    )

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data: Any) -> Any:
        where = non_finite_path(data)
        if where is not None:
            path, value = where
            raise ValueError(
                f"{path}: {value} is not a finite number; give a finite value (YAML reads .inf, "
                ".nan and 1.0e+400 as infinite or not a number)"
            )
        return data

    @model_validator(mode="after")
    def _cross_checks(self) -> Experiment:
        seen: dict[str, int] = {}
        for i, c in enumerate(self.candidates):
            if c.name in seen:
                raise ValueError(
                    f"candidates[{i}].name: duplicate name {c.name!r} (also candidates[{seen[c.name]}]); "
                    "give each candidate a unique name"
                )
            seen[c.name] = i
        wseen: dict[str, int] = {}
        for i, w in enumerate(self.workloads):
            if w.label in wseen:
                raise ValueError(
                    f"workloads[{i}]: workload {w.label!r} is listed twice "
                    f"(also workloads[{wseen[w.label]}]); list each once"
                )
            wseen[w.label] = i
        for k in self.goal.workload_slo:
            if k not in wseen:
                raise ValueError(
                    f"goal.workload_slo: {k!r} is not one of the experiment's workloads "
                    f"({', '.join(wseen)}); name a listed workload"
                )
        conflict = embeddings_conflicts(self)  # goal.task_kind: embeddings (servelab.trial.embed_spec)
        if conflict is not None:
            raise ValueError(conflict)
        if self.arrival_test.enabled and self.goal.task_kind == "chat":
            if self.goal.expected_rate_rps is None:
                raise ValueError(
                    "goal.expected_rate_rps: required when arrival_test.enabled is true; give the stated "
                    "arrival rate in requests/s, or set arrival_test.enabled: false"
                )
            if self.goal.mix is None and not any(w.name in mixable_workloads() for w in self.workloads):
                raise ValueError(
                    f"goal.mix: required for the arrival test when no workload is one of "
                    f"{', '.join(mixable_workloads())}; give e.g. short-qa:3,structured:1"
                )
            try:
                make_workload("mix", None, **{**self.arrival_test.set, "ratio": self.arrival_mix})
            except ConfigError as e:
                raise ValueError(f"arrival_test.set: {e}") from None
        return self

    @property
    def arrival_mix(self) -> str:
        """The arrival test's ratio: ``goal.mix``, or the mixable workloads with weight 1 each."""
        if self.goal.mix is not None:
            return self.goal.mix
        names = [w.name for w in self.workloads if w.name in mixable_workloads()]
        return ",".join(f"{n}:1" for n in names) or "short-qa:1"

    def arrival_load(self) -> LoadModel:
        """The arrival test's load: open loop at ``goal.expected_rate_rps``, gamma arrivals of shape
        ``goal.burstiness`` (Poisson when it is 1), ``arrival_test.max_concurrency``.
        Raises :class:`ConfigError` when no rate is set."""
        if self.goal.expected_rate_rps is None:
            raise ConfigError("goal.expected_rate_rps is not set; the arrival test needs a rate in requests/s")
        k = self.goal.burstiness
        return LoadModel(
            kind="open",
            rate_rps=self.goal.expected_rate_rps,
            arrival="poisson" if k == 1 else "gamma",
            gamma_shape=k,
            max_concurrency=self.arrival_test.max_concurrency,
        )

    def candidate(self, name: str) -> Candidate:
        """The candidate called ``name``; raises :class:`KeyError` when there is none."""
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(name)

    def to_dict(self) -> JsonObject:
        """Plain JSON-able dict in file form (aliases such as ``set``; bare workload names)."""
        d = self.model_dump(mode="json", by_alias=True)
        d["workloads"] = [
            w["name"]
            if w["name"] is not None and not w["set"] and w["dataset"] is None and w["max_tokens_default"] == 256
            else w
            for w in d["workloads"]
        ]
        return d

    def to_yaml(self) -> str:
        """The experiment as YAML, every field written out; :func:`load_experiment` of it gives an equal
        :class:`Experiment` (paths are absolute)."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True, width=100)


def _rebuild_on_registry_change() -> None:
    """A kind was registered or removed: rebuild :class:`Experiment`'s candidate union."""
    Experiment.model_rebuild(force=True)


registry.subscribe(_rebuild_on_registry_change)


# ---------------------------------------------------------------------------------------------------
# loading and errors


#: Fixes appended when a string does not match one of these patterns.
_PATTERN_HINTS = {
    NAME_PATTERN: "use letters, digits, '_', '.' or '-'",
    ENV_NAME: "an environment variable name is letters, digits and '_', not starting with a digit",
}


def non_finite_path(data: Any, path: str = "") -> tuple[str, str] | None:
    """The first float in ``data`` (parsed YAML: dicts, lists, scalars) that is infinite or not a
    number, as (``a.b[0].c``, its YAML spelling ``.inf``/``-.inf``/``.nan``); ``None`` when there is
    none. Every number of an experiment (timeouts, rates, engine settings) must be finite: ``timeout_s:
    .inf`` is refused like any other bad value."""
    if isinstance(data, float) and not math.isfinite(data):
        return path or "(top level)", ".nan" if math.isnan(data) else (".inf" if data > 0 else "-.inf")
    if isinstance(data, dict):
        items: Any = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return None
    for k, v in items:
        sub = f"{path}[{k}]" if isinstance(k, int) else (f"{path}.{k}" if path else str(k))
        found = non_finite_path(v, sub)
        if found is not None:
            return found
    return None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line for a pydantic :class:`ValidationError` of an :class:`Experiment`:
    ``SOURCE: PATH: PROBLEM; FIX`` for the first error, plus ``(+N more)`` when there are others."""
    return validation_error_line(exc, source, Experiment, pattern_hints=_PATTERN_HINTS)


def load_experiment(path: str | os.PathLike[str]) -> Experiment:
    """Read and validate an experiment YAML file.

    ``name`` defaults to the file name without extension; relative ``model``/``dataset`` paths are
    resolved against the file's folder. Raises :class:`servelab.wire.ConfigError` with one line naming
    the file, the bad field's path and the fix, for: a missing/unreadable file, a YAML syntax error
    (with line and column), a top level that is not a mapping, and every validation error (unknown
    field with a "did you mean", unknown engine/workload, bad SLO, missing model path, duplicate names…).
    """
    src = str(path)
    p = Path(path).expanduser()
    data = read_yaml_file(
        path,
        what="experiment",
        missing_fix="give an existing YAML file (or run `servelab trial` without a file for the built-in experiment)",
        empty_fix="write an experiment (see docs/experiment.md)",
    )
    if not isinstance(data, dict):
        raise ConfigError(
            f"{src}: the top level must be a mapping (goal:, candidates:, …), got a {type(data).__name__}"
        )
    if data.get("name") is None:
        data["name"] = re.sub(r"[^A-Za-z0-9_.-]+", "-", p.stem).strip("-") or "experiment"
    try:
        return Experiment.model_validate(data, context={"base_dir": str(p.parent.absolute())})
    except ValidationError as e:
        raise ConfigError(describe_validation_error(e, src)) from None


# ---------------------------------------------------------------------------------------------------
# the built-in experiment

_DEFAULT: JsonObject = {
    "name": "llamacpp-slots",
    "goal": {
        "task": "chat: short Q&A + structured output",
        "slo": "ttft_p95<=3s,itl_p95<=400ms,error_rate<=1%",
        "error_budget": 0.01,
        "quality": {
            "structured_valid_min": 0.5,
            "samples": [
                {
                    "name": "say-ok",
                    "prompt": "Reply with the single word OK.",
                    "expect_regex": "(?i)\\bok\\b",
                    "max_tokens": 8,
                },
                {
                    "name": "json-city",
                    "prompt": "Paris is the capital of France. Give the city and the country as JSON.",
                    "expect_json_schema": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
                        "required": ["city", "country"],
                        "additionalProperties": False,
                    },
                    "max_tokens": 48,
                },
            ],
            "samples_pass_min": 0.0,
        },
        "expected_rate_rps": 0.25,
        "peak_rate_rps": 0.5,
        "burstiness": 0.5,
        "mix": "short-qa:3,structured:1",
        "budget": {"max_minutes": 10, "price_per_hour": None, "currency": "USD"},
    },
    "candidates": [
        {"name": "np1", "engine": "llamacpp", "model": None, "settings": {"parallel": 1, "ctx_size": 8192}},
        {"name": "np4", "engine": "llamacpp", "model": None, "settings": {"parallel": 4, "ctx_size": 8192}},
    ],
    "workloads": [
        {"name": "short-qa", "set": {"input_tokens": 64, "output_tokens": 48}},
        {"name": "structured", "set": {"input_tokens": "64-128", "output_tokens": 128}},
    ],
    "steps": {"concurrency": [1, 2, 4]},
    "requests_per_step": 8,
    "warmup": 1,
    "seed": 0,
    "timeout_s": 120,
    "ignore_eos": True,
    "stop_on_slo": True,
    "arrival_test": {"enabled": True, "requests": 12},
    "repeats": 3,
    "mix_sweep": True,
    "capacity": {
        "enabled": True,
        "requests": 8,
        "max_probes": 3,
        "start_rps": None,
        "tolerance": 0.05,
        "arrival": "goal",
    },
}


def default_experiment() -> Experiment:
    """The built-in experiment ``servelab trial`` runs without a file (``examples/llamacpp-slots.yaml``):
    llama-server + Gemma 3 270M with 1 slot (``np1``, ctx 4096) vs 4 parallel slots (``np4``, ctx 8192),
    short-qa (64 in / 48 out tokens) + structured, each swept alone and then as the mix short-qa:3,structured:1
    run together (the ranked figure), concurrency 1, 2, 4 with 8 requests per step, warmup 1, the mix's effective
    level repeated 3 times interleaved (np1 np4 np1 np4 …), SLO ``ttft_p95<=3s,itl_p95<=400ms,error_rate<=1%``,
    arrival test 12 requests at 0.25 rps (gamma k 0.5; replicas planned for a 0.5 rps peak), capacity search of
    at most 3 probes of 8 requests. 0.25 rps lies between the two candidates' capacities at the SLO measured
    on a 2-core box (np1 [0.125, 0.25), np4 [0.375, 0.5) req/s in two trials): at 0.5, np4's own capacity
    edge, the example's decision turned on run-to-run noise (one trial adopted np4, the next excluded both).
    Sized to finish in under 10 minutes on 2 CPU cores (``goal.budget.max_minutes`` 10 skips what does
    not fit and says so)."""
    return Experiment.model_validate(copy.deepcopy(_DEFAULT))


# ---------------------------------------------------------------------------------------------------
# JSON Schema


def json_schema() -> JsonSchemaValue:
    """The JSON Schema (draft 2020-12) of the experiment file, from the pydantic models."""
    return json_schema_of(Experiment, "servelab experiment")


#: ``experiment.schema.json``, written and checked by ``servelab schema write|check``.
PUBLISHED_SCHEMA = PublishedSchema(SCHEMA_PATH, json_schema)
