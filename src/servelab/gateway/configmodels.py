"""The gateway file's backends and model registry (servelab.gateway.config): each engine server
(``backends``), and each public model (``models``) with its targets, declared capabilities, fallback chain,
shadow target, sampling policy and engine-field policy."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from servelab.gateway.confignames import ENV, NAME
from servelab.wire.config import FrozenModel
from servelab.wire.dialects import Kind

__all__ = [
    "Backend",
    "Capabilities",
    "EngineFields",
    "FallbackStep",
    "ModelEntry",
    "ParamBound",
    "SamplingPolicy",
    "Shadow",
    "StopBound",
    "Target",
]


class Backend(FrozenModel):
    """One engine server. ``base_url`` is its root (``http://127.0.0.1:8001``; a trailing ``/v1`` is
    accepted and dropped): the gateway calls ``{base_url}/v1/chat/completions`` etc. Upstream URLs come
    only from here, never from a request. ``models``: upstream model names it serves. ``weight``: share
    among replicas serving the same target. ``pool``: a group tenants can be limited to. ``health_path``:
    readiness path (default by ``kind``). ``connect_timeout_s``: TCP connect; ``read_timeout_s``: longest
    silence between two reads, including the wait for the first token (engines that hold their headers
    until the first token, docs/engine-wire.md case 20, need room here). ``max_in_flight``: requests beyond it
    count as saturated (fallback). ``api_key_env``: env var with the engine's API key, sent as Bearer.
    ``native_apis``: the other APIs forwarded to it unchanged instead of translated to chat completions
    (null = what its kind passes through, ``servelab.wire.dialects``: ``messages`` on vllm and llamacpp;
    ``responses`` only where a backend lists it, since vLLM doubles a template's BOS on that route;
    ``[]`` = always translate).
    """

    name: str = Field(pattern=NAME, description="unique backend name (never shown to clients)")
    kind: Kind = Field(description="engine kind: readiness endpoint and error dialect")
    base_url: str = Field(description="engine root URL, e.g. http://127.0.0.1:8001")
    models: list[str] = Field(min_length=1, description="upstream model names this engine serves")
    weight: float = Field(1.0, ge=0, description="share among replicas of the same target")
    pool: str = Field("default", pattern=NAME, description="pool name (tenants may be limited to pools)")
    health_path: str | None = Field(None, description="readiness path; default by kind (/health, / on Ollama)")
    connect_timeout_s: float = Field(2.0, gt=0, description="TCP connect timeout, s")
    read_timeout_s: float = Field(300.0, gt=0, description="longest wait between two reads (incl. TTFT), s")
    max_in_flight: int | None = Field(None, ge=1, description="requests in flight before it counts as saturated")
    api_key_env: str | None = Field(None, pattern=ENV, description="env var holding the engine's API key")
    native_apis: list[Literal["messages", "responses"]] | None = Field(
        None,
        description="APIs forwarded unchanged (Anthropic messages, OpenAI responses); null = what its kind "
        "passes through (vllm and llamacpp: messages; responses only when listed), "
        "[] = always translate to chat completions",
    )

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str) -> str:
        u = v.strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", u):
            raise ValueError(f"{v!r} is not an http(s) URL; use e.g. http://127.0.0.1:8001")
        return u[:-3] if u.endswith("/v1") else u

    @field_validator("health_path")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError(f"{v!r} must start with '/', e.g. /health")
        return v


class Target(FrozenModel):
    """Where a public model can be served: ``backend`` name, the ``model`` name that engine knows
    (default: the backend's first model) and a ``weight`` for weighted splits (canary: 95/5)."""

    backend: str = Field(description="a backend name")
    model: str | None = Field(None, description="upstream model name; default: the backend's first model")
    weight: float = Field(1.0, ge=0, description="relative share of traffic")


class Capabilities(FrozenModel):
    """What a public model supports, declared in the registry and checked before a request reaches an
    engine (docs/gateway-design.md). ``context_tokens`` null = not checked by the gateway (the engine
    still refuses). Prices per million tokens (``currency``); ``typical_*`` latencies as measured by a
    trial; ``tasks`` and ``risk_notes`` are shown in ``/v1/models`` so callers pick knowingly."""

    context_tokens: int | None = Field(None, ge=1, description="context window, tokens (prompt + output)")
    input_modalities: list[Literal["text", "image", "audio"]] = Field(["text"], description="accepted inputs")
    tools: bool = Field(False, description="accepts tools / tool_choice")
    json_schema: bool = Field(False, description="accepts response_format json_schema / json_object")
    reasoning: bool = Field(False, description="streams reasoning text")
    embeddings: bool = Field(False, description="an embedding model: /v1/embeddings only")
    rerank: bool = Field(False, description="a rerank (cross-encoder) model: /v1/rerank and /rerank only")
    embedding_dimensions: int | None = Field(
        None, ge=1, description="length of its embedding vectors; a request's 'dimensions' above it is refused"
    )
    max_input_tokens: int | None = Field(
        None,
        ge=1,
        description="longest single input of an embedding or rerank model, tokens (an embedding input; a "
        "rerank query + one document); null = not checked by the gateway",
    )
    price_in_per_1m: float | None = Field(None, ge=0, description="price per 1M input tokens")
    price_out_per_1m: float | None = Field(None, ge=0, description="price per 1M output tokens")
    currency: str = Field("USD", description="currency of the prices")
    typical_ttft_ms: float | None = Field(None, ge=0, description="typical time to first token, ms")
    typical_tpot_ms: float | None = Field(None, ge=0, description="typical time per output token, ms")
    tasks: list[str] = Field(default_factory=list, description="intended tasks, e.g. summarize, chat")
    risk_notes: str | None = Field(None, description="known risks (quantised, weak at code, …)")


class ParamBound(FrozenModel):
    """Policy for one numeric sampling parameter: ``default`` sent when the request has none; a value
    outside [``min``, ``max``] is clamped or refused (``on_violation``; null = the policy's)."""

    default: float | None = None
    min: float | None = None
    max: float | None = None
    on_violation: Literal["clamp", "refuse"] | None = None

    @model_validator(mode="after")
    def _order(self) -> ParamBound:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        for v in (self.default,):
            if v is not None and ((self.min is not None and v < self.min) or (self.max is not None and v > self.max)):
                raise ValueError(f"default {v} is outside [min, max]")
        return self


class StopBound(FrozenModel):
    """Policy for ``stop``: ``default`` sequences when the request has none; more than ``max_items``
    are cut to the first ``max_items`` or refused (``on_violation``; null = the policy's)."""

    default: list[str] | None = None
    max_items: int | None = Field(None, ge=0)
    on_violation: Literal["clamp", "refuse"] | None = None


class SamplingPolicy(FrozenModel):
    """Defaults and bounds of sampling parameters for a model (``models.<m>.sampling``) or a task
    (``routing.task_sampling.<task>``); see servelab.gateway.policy. ``max_tokens`` bounds the output
    over every dialect's length field. ``on_violation``: clamp (default) or refuse with a 400."""

    on_violation: Literal["clamp", "refuse"] = "clamp"
    temperature: ParamBound | None = None
    top_p: ParamBound | None = None
    top_k: ParamBound | None = None
    min_p: ParamBound | None = None
    frequency_penalty: ParamBound | None = None
    presence_penalty: ParamBound | None = None
    repetition_penalty: ParamBound | None = None
    max_tokens: ParamBound | None = None
    stop: StopBound | None = None


class FallbackStep(FrozenModel):
    """One step of a fallback chain: another public ``model``, and degrade parameters applied when the
    request is sent there: ``max_tokens`` caps the output, ``params`` overrides body fields."""

    model: str = Field(description="public model name to fall back to")
    max_tokens: int | None = Field(None, ge=1, description="cap on max_tokens on this step")
    params: dict[str, Any] = Field(default_factory=dict, description="body fields overridden on this step")


class Shadow(FrozenModel):
    """Mirror a ``sample_rate`` share of requests to ``target`` (answers discarded, never charged)."""

    target: Target
    sample_rate: float = Field(0.0, ge=0, le=1, description="share of requests mirrored (0-1)")


class EngineFields(FrozenModel):
    """Engine fields of a model's requests (:mod:`servelab.gateway.enginefields`): body fields that steer
    an engine's scheduler, KV transfer, template, adapters or server-side code. ``allow``: those the client
    may send (forwarded as sent); ``action``: ``refuse`` any other with 400 ``engine_field_not_allowed``
    (default) or ``drop`` it; ``priority``: priority class -> the ``priority`` value the gateway sends to
    vLLM and SGLang backends (lower = served first; needs vLLM's ``--scheduling-policy priority``), in
    place of the client's."""

    allow: list[str] = Field(
        default_factory=list,
        description="engine fields the client may send for this model (e.g. chat_template_kwargs); forwarded as sent",
    )
    action: Literal["refuse", "drop"] = Field(
        "refuse",
        description="what happens to any other engine field: refuse (400 engine_field_not_allowed) or drop (removed)",
    )
    priority: dict[str, int] = Field(
        default_factory=dict,
        description="priority class -> priority sent to vllm/sglang backends (lower = served first); empty = none sent",
    )

    @field_validator("allow")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        from servelab.gateway.enginefields import ENGINE_FIELDS

        for name in v:
            if name not in ENGINE_FIELDS:
                raise ValueError(
                    f"{name!r} is not an engine field; the known ones are {', '.join(sorted(ENGINE_FIELDS))}"
                )
        return v

    @field_validator("priority")
    @classmethod
    def _classes(cls, v: dict[str, int]) -> dict[str, int]:
        for name in v:
            if not re.match(NAME, name):
                raise ValueError(f"{name!r} is not a priority class name (letters, digits, _.:-)")
        return v


class ModelEntry(FrozenModel):
    """A public model name: its targets (weighted), its declared capabilities, its fallback chain and an
    optional shadow target."""

    targets: list[Target] = Field(min_length=1)
    capabilities: Capabilities = Field(default_factory=Capabilities)
    fallback: list[FallbackStep] = Field(default_factory=list)
    shadow: Shadow | None = None
    sampling: SamplingPolicy | None = Field(None, description="defaults and bounds of sampling parameters")
    engine_fields: EngineFields = Field(
        default_factory=EngineFields,
        description="engine scheduling, "
        "transport and template fields: allowed, refused or dropped; priority "
        "by the key's class",
    )
    description: str | None = None
