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
"""

from __future__ import annotations

import copy
import math
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue

from servelab.bench.analysis.slo import Objective, parse_slo
from servelab.bench.load.step import LoadModel
from servelab.bench.options import MAX_CONCURRENCY, MAX_OUTPUT_TOKENS, MAX_RATE_RPS, MAX_REQUESTS_PER_STEP, MAX_STEP_S
from servelab.bench.workloads.registry import WORKLOADS, make_workload, mixable_workloads, parse_ratio
from servelab.engines import registry
from servelab.engines.llamacpp import LlamaCppSettings
from servelab.engines.mock.launch import MockSettings
from servelab.engines.registry import ENV_NAME_PATTERN, EngineKind, EngineSettings
from servelab.engines.url import UrlSettings
from servelab.engines.vllm import VllmSettings
from servelab.trial.embed_spec import EmbeddingsOptions, embeddings_conflicts
from servelab.trial.identity import Declared
from servelab.trial.lifecycle import LifecycleOptions
from servelab.trial.served_checks import CheckName, default_checks
from servelab.wire.config import (
    PublishedSchema,
    StrictModel,
    json_schema_of,
    read_yaml_file,
    suggest,
    validation_error_line,
)
from servelab.wire.errors import ConfigError
from servelab.wire.jsontypes import JsonObject

__all__ = [
    "SCHEMA_PATH",
    "AnyCandidate",
    "ArrivalTest",
    "Budget",
    "Candidate",
    "CapacitySearch",
    "Experiment",
    "Goal",
    "LlamaCppCandidate",
    "LlamaCppSettings",
    "MockCandidate",
    "MockSettings",
    "Quality",
    "Sample",
    "Steps",
    "UrlCandidate",
    "UrlSettings",
    "VllmCandidate",
    "VllmSettings",
    "WorkloadItem",
    "candidate_model",
    "candidate_union",
    "default_experiment",
    "describe_validation_error",
    "json_schema",
    "load_experiment",
    "PUBLISHED_SCHEMA",
]

#: The committed JSON Schema file (regenerate with ``servelab schema write``).
SCHEMA_PATH = Path(__file__).with_name("experiment.schema.json")

_NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


def __getattr__(name: str) -> Any:
    if name == "ENGINES":  # engine kinds a candidate can name (``candidates[i].engine``): the registry's
        return tuple(k.kind for k in registry.kinds())
    raise AttributeError(name)


_ENV_NAME = ENV_NAME_PATTERN
#: sub-features the smoke test can require of a candidate
SmokeCheck = Literal["streaming", "usage", "json_schema", "stop", "tools", "reasoning", "cancellation"]
_ALL_SMOKE: tuple[SmokeCheck, ...] = ("streaming", "usage", "json_schema", "stop")


def _resolve_path(value: str, info: ValidationInfo, what: str, fix: str) -> str:
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


# ---------------------------------------------------------------------------------------------------
# goal


class Sample(StrictModel):
    """One business sample of the quality gate: a request and a check on its answer.

    Give exactly one of ``prompt`` (a user message) or ``messages`` (a chat, ``[{role, content}]``), and
    at least one check: ``expect_regex`` (Python regex searched in the answer text) and/or
    ``expect_json_schema`` (the answer must be JSON valid against it; the request then asks for
    ``response_format: json_schema``). ``max_tokens`` caps the answer (tokens, default 64).
    Raises (at validation) a one-line error for a bad regex, a bad schema or a missing check.
    """

    name: str | None = Field(None, pattern=_NAME_PATTERN, description="label in the report; default s<index>")
    prompt: str | None = Field(None, min_length=1, description="user message text")
    messages: list[dict[str, Any]] | None = Field(
        None, min_length=1, description="chat messages [{role, content}] instead of prompt"
    )
    expect_regex: str | None = Field(None, description="Python regex that must be found in the answer text")
    expect_json_schema: dict[str, Any] | None = Field(None, description="JSON Schema the answer must satisfy")
    max_tokens: int = Field(64, ge=1, le=MAX_OUTPUT_TOKENS, description="answer length cap, tokens")

    @field_validator("expect_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"invalid regex {v!r} ({e}); write a Python regular expression") from None
        return v

    @field_validator("expect_json_schema")
    @classmethod
    def _schema(cls, v: JsonObject | None) -> JsonObject | None:
        if v is not None:
            import jsonschema

            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a valid JSON Schema ({e.message}); fix the schema") from None
        return v

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[JsonObject] | None) -> list[JsonObject] | None:
        for m in v or ():
            if not isinstance(m.get("role"), str) or "content" not in m:
                raise ValueError("each message needs 'role' and 'content', e.g. {role: user, content: 'Hi'}")
        return v

    @model_validator(mode="after")
    def _one_request_one_check(self) -> Sample:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if self.expect_regex is None and self.expect_json_schema is None:
            raise ValueError("give a check: expect_regex and/or expect_json_schema")
        return self


class Quality(StrictModel):
    """Quality gates. A candidate that fails one is excluded from the ranking, with the reason.

    ``structured_valid_min``: minimum fraction (0-1) of schema-valid answers among the
    ``structured_requests`` (default 8) requests of the ``structured`` workload that the gate sends
    when the experiment lists that workload (default 0.5). ``samples``: business samples (:class:`Sample`);
    ``samples_pass_min``: minimum fraction (0-1) of them that must pass (default 0.0 = informational).
    ``smoke``: required sub-features checked before the load steps — ``streaming`` (tokens arrive as
    SSE chunks), ``usage`` (token usage reported), ``json_schema`` (``response_format`` json_schema
    honoured), ``stop`` (stop sequences honoured); default all four.
    """

    structured_valid_min: float = Field(0.5, ge=0, le=1, description="min fraction of schema-valid structured answers")
    structured_requests: int = Field(
        8, ge=1, le=MAX_REQUESTS_PER_STEP, description="requests of the structured set sent by the quality gate"
    )
    samples: list[Sample] = Field(default_factory=list, description="business samples: request + check")
    samples_pass_min: float = Field(0.0, ge=0, le=1, description="min fraction of samples passing (0 = informational)")
    smoke: list[SmokeCheck] = Field(
        default_factory=lambda: list(_ALL_SMOKE),
        description="sub-features the smoke test requires (a failure excludes the candidate)",
    )


class Budget(StrictModel):
    """Budget of the trial. ``max_minutes``: wall-clock limit in minutes (``None`` = none);
    ``price_per_hour``: cost of the machine per hour in ``currency`` (``None`` = no cost figures)."""

    max_minutes: float | None = Field(None, gt=0, description="wall-clock limit of the trial, minutes")
    price_per_hour: float | None = Field(None, ge=0, description="machine price per hour, in currency")
    currency: str = Field("USD", min_length=1, description="currency of price_per_hour")


_SLO_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {
                "type": "string",
                "description": "METRIC_STAT<=VALUE[ms|s|%], comma-separated",
                "examples": ["ttft_p95<=2s,itl_p95<=300ms,error_rate<=1%"],
            },
            {
                "type": "object",
                "additionalProperties": {"type": ["string", "number"]},
                "description": "mapping METRIC_STAT -> limit",
                "examples": [{"ttft_p95": "2s", "error_rate": "1%"}],
            },
            {"type": "null"},
        ],
        "default": None,
        "description": "SLOs (servelab.bench.analysis.slo syntax); null = no SLO (the error budget still applies)",
    }
)


class Goal(StrictModel):
    """What the chosen engine must achieve.

    - ``task``: free text (shown in the record and report).
    - ``task_kind``: ``chat`` (default) or ``embeddings``: candidates serve ``/v1/embeddings``, the
      embeddings gate replaces the smoke tests and quality gate, the load steps send the experiment's
      ``embeddings:`` requests and candidates are ranked on inputs/s at the SLO
      (:mod:`servelab.trial.flows.embeddings`; chat-only fields are refused, :mod:`servelab.trial.embed_spec`).
    - ``slo``: objectives in :func:`servelab.bench.analysis.slo.parse_slo` syntax, as a string
      (``"ttft_p95<=2s,itl_p95<=300ms,error_rate<=1%"``) or a mapping (``{ttft_p95: 2s, error_rate: 1%}``,
      stored as the equivalent string); ``None`` = none. Latencies in s/ms, error rate in % or a fraction.
    - ``workload_slo``: per-workload SLOs, workload name -> objectives in the same syntax
      (``{structured: "ttft_p95<=5s"}``): judged on that workload's requests only — its own sweep and its
      class inside the mix (:mod:`servelab.trial.verdicts`), in addition to ``slo``; each key must be
      one of the experiment's workloads.
    - ``error_budget``: max failed/submitted per load step (fraction, default 0.01); a step above it
      breaks the sweep like an SLO.
    - ``quality``: :class:`Quality` gates.
    - ``expected_rate_rps``: the stated arrival rate (requests/s) for the arrival test; required when
      ``arrival_test.enabled``.
    - ``burstiness``: gamma shape k of inter-arrival times (1 = Poisson, < 1 burstier; CV = 1/sqrt(k)).
    - ``mix``: workload ratio of the arrival test, ``"short-qa:3,structured:1"`` (sets short-qa, rag,
      long-gen, structured); ``None`` = the experiment's mixable workloads, weight 1 each.
    - ``budget``: :class:`Budget`.
    - ``peak_rate_rps``: the peak arrival rate (requests/s) the replicas are planned for (003 §21);
      ``None`` = ``expected_rate_rps``. ``headroom``: fraction of a replica's capacity at the SLO left
      free at that peak (default 0.3: plan each replica to 70 % of its capacity).
    """

    task: str | None = Field(None, description="what the service does (free text)")
    task_kind: Literal["chat", "embeddings"] = Field(
        "chat",
        description="chat (the chat flow) or embeddings (/v1/embeddings servers: embeddings gate, "
        "inputs/s at the SLO; servelab.trial.flows.embeddings)",
    )
    slo: Annotated[str | None, _SLO_SCHEMA] = None
    workload_slo: dict[str, str] = Field(
        default_factory=dict,
        description="per-workload SLOs: workload name -> METRIC_STAT<=VALUE[ms|s|%],… judged "
        "on that workload's requests (its sweep and its class in the mix)",
        examples=[{"structured": "ttft_p95<=5s"}],
    )
    error_budget: float = Field(0.01, ge=0, le=1, description="max failed/submitted per load step (fraction)")
    quality: Quality = Field(default_factory=Quality)
    expected_rate_rps: float | None = Field(None, gt=0, description="stated arrival rate, requests/s")
    burstiness: float = Field(0.5, gt=0, description="gamma shape k of arrivals (1 = Poisson, <1 = bursty)")
    mix: str | None = Field(
        None, description="arrival-test ratio, e.g. short-qa:3,structured:1", examples=["short-qa:3,structured:1"]
    )
    budget: Budget = Field(default_factory=Budget)
    peak_rate_rps: float | None = Field(
        None, gt=0, description="peak arrival rate to plan replicas for, requests/s (null = expected_rate_rps)"
    )
    headroom: float = Field(0.3, ge=0, lt=1, description="fraction of each replica's capacity kept free at the peak")

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, dict):
            parts = []
            for k, lim in v.items():
                if isinstance(lim, bool) or not isinstance(lim, (str, int, float)):
                    raise ValueError(f"limit of {k!r} must be a value like 2s, 300ms or 1%, got {lim!r}")
                parts.append(f"{k}<={str(lim).strip().lstrip('<=').strip()}")
            v = ",".join(parts)
        if not isinstance(v, str):
            raise ValueError("give a string like 'ttft_p95<=2s,error_rate<=1%' or a mapping {ttft_p95: 2s}")
        try:
            parse_slo(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("workload_slo", mode="before")
    @classmethod
    def _workload_slo(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("give a mapping workload -> SLO, e.g. {structured: 'ttft_p95<=5s'}")
        out = {}
        for k, text in v.items():
            out[k] = cls._slo(text)
            if not out[k]:
                raise ValueError(f"{k}: give the workload's SLO, e.g. 'ttft_p95<=5s', or leave the key out")
        return out

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_ratio(v)
            except ConfigError as e:
                raise ValueError(f"{e}; sets: {', '.join(mixable_workloads())}") from None
        return v

    @property
    def objectives(self) -> list[Objective]:
        """The parsed SLOs (:class:`servelab.bench.analysis.slo.Objective`; limits in seconds or a fraction)."""
        return parse_slo(self.slo)


# ---------------------------------------------------------------------------------------------------
# candidates


class Candidate(StrictModel):
    """Common fields of a candidate (one engine kind + model + settings).

    ``name``: unique, ``[A-Za-z0-9_.-]+``. ``engine``: a kind of :mod:`servelab.engines.registry`
    (built in: ``llamacpp``, ``vllm``, ``url``, ``mock``). ``model``: a local model file or folder (must
    exist; relative to the experiment file); ``None`` = the engine default (llamacpp: Gemma 3 270M GGUF;
    vllm: the HF folder servelab converts from that GGUF; url/mock: no local weights). ``settings``:
    the kind's ``Settings`` model. ``price_per_hour``: what this candidate's hardware costs per hour
    (declared: hardware-specific; ``None`` = ``goal.budget.price_per_hour``). The concrete class of
    each kind is built from the registry by :func:`candidate_model` (:data:`LlamaCppCandidate`,
    :data:`VllmCandidate`, :data:`UrlCandidate`, :data:`MockCandidate` …).
    """

    name: str = Field(pattern=_NAME_PATTERN, description="unique candidate name, [A-Za-z0-9_.-]+")
    engine: str
    model: str | None = Field(None, description="model file/folder; null = engine default")
    price_per_hour: float | None = Field(
        None, ge=0, description="hardware price per hour, in goal.budget.currency (null = goal.budget.price_per_hour)"
    )
    restart: Literal["never", "once"] = Field(
        "never",
        description="once: an engine that exits during the load steps is started again once (recovery time recorded)",
    )
    declared: Declared | None = Field(
        None, description="facts the server cannot tell (image digest, GPUs, TP/PP/DP); recorded with source 'declared'"
    )
    if typing.TYPE_CHECKING:  # the field is added per kind by candidate_model (narrowed to kind.Settings)
        settings: EngineSettings

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        engine = info.data.get("engine")
        kind = registry.get(engine) if isinstance(engine, str) and engine in registry.names() else None
        if kind is not None and kind.launched and not kind.takes_model:
            raise ValueError(
                f"engine {engine!r} takes no model file; remove model (the {kind.title} engine "
                "names its model in settings)"
            )
        path = _resolve_path(
            v,
            info,
            "model path",
            "give an existing model file or folder (relative to the experiment file), or null for the engine default",
        )
        if kind is not None and not kind.launched and Path(path).is_file():  # url: a copy of the served weights
            from servelab.modelfile.gguf_meta import check_gguf

            try:
                check_gguf(path)
            except ConfigError:
                raise ValueError(
                    f"{v!r} is not a GGUF file; give the local copy of the served weights as a GGUF "
                    "file or an HF folder, or null"
                ) from None
        return path

    @property
    def kind(self) -> EngineKind:
        """This candidate's engine kind (:class:`servelab.engines.registry.EngineKind`)."""
        return registry.get(self.engine)

    @property
    def launched(self) -> bool:
        """Whether servelab starts this engine (every kind but ``url``)."""
        return self.kind.launched

    def recorded_settings(self) -> JsonObject:
        """The settings as the record's identity holds them: every field, ``None`` values left out."""
        return self.settings.model_dump(mode="json", exclude_none=True)

    def launch_settings(self) -> JsonObject:
        """The engine settings for :func:`servelab.engines.start_engine` (``settings=``): every settings
        field except ``port`` and ``ready_timeout_s``, ``None`` values left out (launcher default)."""
        return self.settings.model_dump(mode="json", exclude_none=True, exclude={"port", "ready_timeout_s"})

    def launch_kwargs(self) -> dict[str, float]:
        """Keyword arguments for the launcher: ``port`` (when set) and ``ready_timeout_s`` (seconds,
        when the engine has one)."""
        d = self.settings.model_dump()
        return {k: d[k] for k in ("port", "ready_timeout_s") if d.get(k) is not None}


_CANDIDATE_MODELS: dict[str, tuple[EngineKind, type[Candidate]]] = {}


def candidate_model(kind: str | EngineKind) -> type[Candidate]:
    """The candidate model of an engine kind: :class:`Candidate` + the kind's ``candidate_fields`` +
    ``engine: Literal[kind]`` + ``settings: kind.Settings`` (built once per registered kind).
    Raises :class:`ConfigError` for an unknown kind name."""
    k = registry.get(kind) if isinstance(kind, str) else kind
    hit = _CANDIDATE_MODELS.get(k.kind)
    if hit is not None and hit[0] is k:
        return hit[1]
    # the kind's own fields come after name/engine/model (pydantic orders fields by reversed MRO)
    bases: tuple[type[BaseModel], ...] = (Candidate,) if k.candidate_fields is None else (k.candidate_fields, Candidate)
    name = "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", k.kind) if p) + "Candidate"
    engine: Any = Literal[k.kind]  # a Literal of a value known at run time
    model = typing.cast(
        "type[Candidate]",
        create_model(
            name,
            __base__=bases,
            __module__=__name__,
            __doc__=f"``engine: {k.kind}`` — {k.summary}",
            engine=(engine, Field(description=f"engine kind: {k.kind}")),
            settings=(k.Settings, Field(default_factory=k.Settings, description=f"{k.title} settings")),
        ),
    )
    _CANDIDATE_MODELS[k.kind] = (k, model)
    return model


def candidate_union() -> Any:
    """``Annotated[Union[<candidate model of every registered kind>], Discriminator("engine")]``."""
    models = tuple(candidate_model(k) for k in registry.kinds())
    return Annotated[Union[models], Discriminator("engine")]  # noqa: UP007 — a union of a runtime tuple


class _CandidateUnion:
    """Marker in ``Annotated[Candidate, _CandidateUnion()]``: validate as the registry's candidate union
    at the time the schema is built (:class:`Experiment` rebuilds when a kind is registered)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return handler.generate_schema(candidate_union())

    def resolved_type(self) -> Any:
        """The union this marker stands for now (read by :func:`servelab.wire.config.error_problem`)."""
        return candidate_union()


#: a candidate of any registered kind, chosen by ``engine``
AnyCandidate = Annotated[Candidate, _CandidateUnion()]
LlamaCppCandidate = candidate_model("llamacpp")
VllmCandidate = candidate_model("vllm")
UrlCandidate = candidate_model("url")
MockCandidate = candidate_model("mock")


# ---------------------------------------------------------------------------------------------------
# workloads, steps, arrival test


class WorkloadItem(StrictModel):
    """One workload: a built-in set by ``name`` (a key of :data:`servelab.bench.workloads.registry.WORKLOADS`)
    with optional ``set`` overrides (the bench's ``--set``: ``input_tokens``, ``output_tokens`` in
    tokens, ``ratio``, ``lang``, …), or a ``dataset`` (JSONL/ShareGPT file, relative to the experiment
    file) whose entries without a length get ``max_tokens_default`` tokens. In YAML a bare name
    (``short-qa``) means ``{name: short-qa}``."""

    name: Annotated[
        str | None,
        WithJsonSchema(
            {
                "anyOf": [{"type": "string", "enum": list(WORKLOADS)}, {"type": "null"}],
                "default": None,
                "description": "built-in workload set",
            }
        ),
    ] = None
    set: dict[str, Any] = Field(default_factory=dict, description="workload parameter overrides (bench --set)")
    dataset: str | None = Field(None, description="JSONL or ShareGPT JSON file instead of a built-in set")
    max_tokens_default: int = Field(256, ge=1, description="dataset: max_tokens of entries without one")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in WORKLOADS:
            raise ValueError(
                f"unknown workload {v!r}{suggest(v, WORKLOADS)}; choose from {', '.join(WORKLOADS)}"
                " or give {dataset: FILE}"
            )
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset_exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        return _resolve_path(
            v, info, "dataset", "give an existing JSONL/ShareGPT file (relative to the experiment file)"
        )

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadItem:
        if (self.name is None) == (self.dataset is None):
            raise ValueError("give exactly one of name (a built-in set) or dataset (a file)")
        if self.dataset is not None and self.set:
            raise ValueError("set applies to built-in workloads only; remove it for a dataset")
        if self.name is not None:
            try:
                make_workload(self.name, None, **self.set)
            except ConfigError as e:
                raise ValueError(f"set: {e}") from None
        return self

    @property
    def label(self) -> str:
        """The workload name as the bench reports it: the set name or ``dataset:<file name>``."""
        return self.name if self.name is not None else f"dataset:{Path(self.dataset or '').name}"

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        obj = handler(core_schema)
        return {"anyOf": [{"type": "string", "enum": list(WORKLOADS), "description": "a built-in set by name"}, obj]}


class Steps(StrictModel):
    """The load steps, raised in order until an SLO or the error budget breaks.

    Exactly one of ``concurrency`` (closed loop: that many requests in flight; ints >= 1) or ``rates``
    (open loop: arrivals per second, > 0), each strictly increasing. Open loop only: ``arrival``
    (``constant`` | ``poisson`` | ``gamma``, shape ``goal.burstiness``) and ``max_concurrency`` (cap on
    requests in flight; ``None`` = none)."""

    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] | None = Field(
        None, description="closed-loop levels"
    )
    rates: list[Annotated[float, Field(gt=0, le=MAX_RATE_RPS)]] | None = Field(
        None, description="open-loop rates, requests/s"
    )
    arrival: Literal["constant", "poisson", "gamma"] = Field("poisson", description="open loop: arrival process")
    max_concurrency: int | None = Field(None, ge=1, description="open loop: cap on requests in flight")

    @model_validator(mode="after")
    def _one_kind(self) -> Steps:
        if (self.concurrency is None) == (self.rates is None):
            raise ValueError("give exactly one of concurrency: [1, 2, 4, 8] or rates: [0.5, 1, 2]")
        levels = self.levels
        if not levels:
            raise ValueError("give at least one step")
        if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
            raise ValueError(f"steps must be strictly increasing (load is raised step by step), got {levels}")
        return self

    @property
    def kind(self) -> Literal["closed", "open"]:
        """``closed`` (concurrency) or ``open`` (rates)."""
        return "closed" if self.concurrency is not None else "open"

    @property
    def levels(self) -> list[float]:
        """The concurrency levels or the rates, in order."""
        return list(self.concurrency if self.concurrency is not None else self.rates or [])

    def load_models(self, burstiness: float = 0.5) -> list[LoadModel]:
        """One :class:`servelab.bench.load.step.LoadModel` per step (labels ``c4`` / ``r0.5``);
        ``burstiness`` is the gamma shape used when ``arrival`` is ``gamma``."""
        if self.concurrency is not None:
            return [LoadModel(kind="closed", concurrency=c) for c in self.concurrency]
        return [
            LoadModel(
                kind="open",
                rate_rps=r,
                arrival=self.arrival,
                gamma_shape=burstiness,
                max_concurrency=self.max_concurrency,
            )
            for r in self.rates or []
        ]


class ArrivalTest(StrictModel):
    """The run at the stated arrival rate (``goal.expected_rate_rps``, gamma arrivals of shape
    ``goal.burstiness``, workload ``mix`` of ratio ``goal.mix``) after the load steps.

    ``enabled`` (default true); ``requests``: number of requests (default 16); ``max_concurrency``:
    cap on requests in flight (``None`` = none); ``set``: overrides for the mix workload (bench ``--set``).
    """

    enabled: bool = Field(True, description="run the arrival test")
    requests: int = Field(16, ge=1, le=MAX_REQUESTS_PER_STEP, description="requests in the arrival test")
    max_concurrency: int | None = Field(None, ge=1, description="cap on requests in flight")
    set: dict[str, Any] = Field(default_factory=dict, description="mix workload overrides (bench --set)")


class CapacitySearch(StrictModel):
    """The open-loop search for the highest arrival rate whose objectives hold
    (:mod:`servelab.trial.capacity`), on the goal's mix, after the load steps.

    ``enabled`` (default true); ``requests``: requests per probe (default 12); ``max_probes``: probes
    at most (default 4: bracketing by doubling, then bisection); ``start_rps``: the first rate
    (``None`` = ``goal.expected_rate_rps``, else the completed requests/s at the ranked level);
    ``tolerance``: stop bisecting when the bracket is this narrow, relative (default 0.05);
    ``arrival``: ``goal`` (gamma of shape ``goal.burstiness``), ``poisson`` or ``constant``."""

    enabled: bool = Field(True, description="run the capacity search")
    requests: int = Field(12, ge=2, le=MAX_REQUESTS_PER_STEP, description="requests per probe")
    max_probes: int = Field(4, ge=1, le=30, description="probes at most")
    start_rps: float | None = Field(None, gt=0, description="first rate, requests/s (null = expected rate)")
    tolerance: float = Field(0.05, gt=0, lt=1, description="relative width of the bracket to stop at")
    arrival: Literal["goal", "poisson", "constant"] = Field("goal", description="arrival process of the probes")


# ---------------------------------------------------------------------------------------------------
# experiment


def _default_steps() -> Steps:
    return Steps(concurrency=[1, 2, 4, 8])


def _default_workloads() -> list[WorkloadItem]:
    return [WorkloadItem(name="short-qa"), WorkloadItem(name="structured")]


class LoadGenerator(StrictModel):
    """Who sends the load of the load steps and the arrival test (``servelab bench --workers/--ray``,
    docs/distributed-bench.md): ``workers`` processes on this host (default 1: the trial's own process),
    or with ``ray`` (a Ray cluster address, or ``auto``) that many Ray actors in total, or
    ``workers_per_node`` actors on every node. The quality gate and the smoke tests always run in the
    trial's process (a handful of requests)."""

    workers: int = Field(1, ge=1, le=4096, description="load-generator processes (or Ray actors in total)")
    workers_per_node: int | None = Field(None, ge=1, le=4096, description="Ray actors on every node (with ray)")
    ray: str | None = Field(None, min_length=1, description="Ray cluster address (HOST:PORT or auto)")

    @model_validator(mode="after")
    def _ray_needed(self) -> LoadGenerator:
        if self.workers_per_node is not None and self.ray is None:
            raise ValueError(
                "load_generator.workers_per_node places Ray actors on every node: set "
                "load_generator.ray (a cluster address or auto)"
            )
        if self.workers_per_node is not None and self.workers != 1:
            raise ValueError("load_generator: give workers (in total) or workers_per_node, not both")
        return self


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

    name: str | None = Field(None, pattern=_NAME_PATTERN, description="experiment name; default: the file name")
    goal: Goal = Field(default_factory=Goal)
    candidates: list[AnyCandidate] = Field(min_length=1, description="engines to compare")
    workloads: list[WorkloadItem] = Field(default_factory=_default_workloads, min_length=1)
    steps: Steps = Field(default_factory=_default_steps)
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
    _NAME_PATTERN: "use letters, digits, '_', '.' or '-'",
    _ENV_NAME: "an environment variable name is letters, digits and '_', not starting with a digit",
}


def non_finite_path(data: Any, path: str = "") -> tuple[str, str] | None:
    """The first float in ``data`` (parsed YAML: dicts, lists, scalars) that is infinite or not a
    number, as (``a.b[0].c``, its YAML spelling ``.inf``/``-.inf``/``.nan``); ``None`` when there is
    none. Every number of an experiment (timeouts, rates, engine settings) must be finite: ``timeout_s:
    .inf`` used to pass ``--check``."""
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
