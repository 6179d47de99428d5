"""The gateway's configuration file: pydantic models, loading with one-line errors, the published JSON Schema.

``load_config(path)`` reads a YAML file (example: ``examples/gateway.yaml``; sketch and meaning in
docs/gateway-design.md) and returns a validated, immutable :class:`GatewayConfig`, or raises
:class:`servelab.wire.ConfigError` with one line ``FILE: FIELD.PATH: PROBLEM; FIX`` — also for cross-field
mistakes (a target naming an unknown backend, a key of an unknown tenant, …). The server keeps the running
config when a reload fails, and shows that line (log + admin).

``gateway.schema.json`` next to this module is generated from the models for editors (YAML language
servers); ``servelab schema write`` regenerates it, ``servelab schema check`` verifies it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from servelab.wire.config import FrozenModel, PublishedSchema, json_schema_of, read_yaml_file, validation_error_line
from servelab.wire.dialects import KINDS, Kind
from servelab.wire.errors import ConfigError

__all__ = [
    "BACKEND_KINDS",
    "SCHEMA_PATH",
    "AdminSection",
    "Backend",
    "BreakerSection",
    "Capabilities",
    "EngineFields",
    "FallbackStep",
    "GatewayConfig",
    "HealthSection",
    "KeyEntry",
    "LedgerSection",
    "ModelEntry",
    "RetrySection",
    "RoutingSection",
    "ServerSection",
    "Shadow",
    "SharedLimits",
    "StateSection",
    "Target",
    "Tenant",
    "TracingSection",
    "json_schema",
    "load_config",
    "parse_config",
    "PUBLISHED_SCHEMA",
]

#: Engine kinds a backend can be: the dialect table's (:mod:`servelab.wire.dialects`, docs/engine-wire.md).
BACKEND_KINDS = KINDS
#: The committed JSON Schema (regenerate with ``servelab schema write``).
SCHEMA_PATH = Path(__file__).with_name("gateway.schema.json")

_NAME = r"^[A-Za-z0-9_.:-]{1,128}$"
_KEY_ID = r"^[A-Za-z0-9_]{1,64}$"  # no '-': keys are sk-sl-<key_id>-<secret>
_ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: Redaction applied to logged prompts when a tenant sets ``log_prompts`` and gives no ``redact`` list:
#: e-mail addresses, API-key-like tokens, and runs of 9+ digits (card, phone, account numbers).
DEFAULT_REDACT = (r"[\w.+-]+@[\w-]+\.[\w.-]+", r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}", r"\d[\d -]{7,}\d")


class ServerSection(FrozenModel):
    """Where the gateway listens and the bounds every request must respect.

    ``port``/``admin_port`` 0 pick a free port; ``admin_port`` null runs no admin app. ``max_body_bytes``
    larger bodies get 413. ``max_tokens_limit``: a request asking for more output tokens (``max_tokens`` x
    ``n`` choices, x the prompts of a batched ``/v1/completions``) gets 400; a request that gives no
    ``max_tokens`` is sent with ``default_max_tokens`` (default: ``max_tokens_limit``) divided by its
    sequences, so every request's output is bounded and its token reservation known. Every length field of
    every engine dialect counts, the largest one is the bound, and exactly one bound is forwarded, in the
    field the backend's kind reads (:mod:`servelab.gateway.lengths`); ``engine_length_fields``: ``map``
    (default) or ``refuse`` the engine-specific ones (``n_predict``, ``options.num_predict``, ...).
    ``max_json_depth``: bodies nested deeper get 400 at parse time (orjson refuses to serialise 254 and
    more levels, measured with orjson 3.13 on 2026-12-01, so the forwarding path needs a bound below it;
    JSON-schema tools rarely need 20). ``access_log``: ``-`` = stderr, a
    path = append JSON lines there, null = off. ``shutdown_grace_s``: how long in-flight requests may
    finish on SIGTERM. Host/port changes take effect on restart only (a reload logs that).

    Connections (both ports, :mod:`servelab.gateway.listener`): ``header_timeout_s``, ``body_timeout_s``
    (gap between reads), ``body_total_timeout_s`` and ``keepalive_timeout_s`` close slow or idle clients
    (nginx's are 60/60/-/75 s; shorter here, since API clients send small requests at once);
    ``max_connections`` (API) and ``admin_max_connections`` cap open connections, and
    ``max_connections_per_client`` those of one client address on the API port (default half the API
    cap): at a cap the oldest header-incomplete connection (idle, or its headers still arriving) of the
    address holding the most is closed, else the new one gets a 503 (429 at the address's own cap).
    ``admin_host`` binds the admin API (default loopback). ``public_metrics`` also serves ``/metrics`` on
    the API port (it is always on the admin port, behind the admin token). These take effect on restart.
    """

    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8080, ge=0, le=65535, description="OpenAI API port (0 = free port)")
    admin_port: int | None = Field(8081, ge=0, le=65535, description="admin API port; null = no admin app")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="largest request body, bytes (else 413)")
    max_tokens_limit: int = Field(
        4096,
        ge=1,
        description="largest output a request may ask for: max_tokens x n "
        "(x prompts on /v1/completions), tokens (else 400)",
    )
    default_max_tokens: int | None = Field(None, ge=1, description="max_tokens sent when a request gives none")
    engine_length_fields: Literal["map", "refuse"] = Field(
        "map",
        description="engine-specific length fields (n_predict, max_new_tokens, options.num_predict, ...): "
        "map = count them in the bound and send the backend's own field, refuse = 400",
    )
    max_json_depth: int = Field(
        64, ge=2, le=200, description="deepest nesting of arrays/objects a request body may have (else 400)"
    )
    access_log: str | None = Field("-", description="'-' = stderr, a file path, or null = off")
    shutdown_grace_s: float = Field(10.0, ge=0, description="time in-flight requests get on SIGTERM, s")
    # connection discipline of both ports (servelab.gateway.listener; nginx client_header_timeout,
    # client_body_timeout, keepalive_timeout: https://nginx.org/en/docs/http/ngx_http_core_module.html)
    admin_host: str = Field(
        "127.0.0.1",
        description="address the admin API binds (separate from host, so --host 0.0.0.0 does not expose it)",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="time from accept (or a request's first "
        "byte on a kept-alive connection) to complete headers, s (else 408/close)",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest gap between two reads of a request body, s (else 408)"
    )
    body_total_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="longest time to receive a whole request body, s (else 408)"
    )
    keepalive_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="idle keep-alive connections are closed after this long, s"
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="open client connections on the API port; null = "
        "(RLIMIT_NOFILE - 64 - admin_max_connections) / 2 (one upstream fd each)",
    )
    admin_max_connections: int = Field(32, ge=1, description="open connections on the admin port")
    max_connections_per_client: int | None = Field(
        None,
        ge=1,
        description="open API connections of one client address (the peer, or X-Forwarded-For behind "
        "trusted_proxies); null = half of max_connections. At it, the address's oldest connection still sending "
        "its headers (or idle) is closed, else 429 (nginx limit_conn)",
    )
    public_metrics: bool = Field(
        False,
        description="also serve /metrics on the API port without auth (it names "
        "backends and breaker states); it is always on the admin port, behind the "
        "admin token",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses/CIDRs of proxies in front of "
        "the gateway; only their X-Forwarded-For is read (servelab.gateway.clientip)",
    )
    # request bodies and outputs (break-it report on 4b30bb7, defects 3-5; servelab.gateway.bodies,
    # servelab.gateway.logprobs)
    request_compression: bool = Field(
        False,
        description="accept request bodies with Content-Encoding gzip or "
        "deflate (inflated piece by piece, never past max_body_bytes); false = 415",
    )
    max_top_logprobs: int = Field(
        20,
        ge=0,
        le=1000,
        description="largest top_logprobs (chat) / n_probs a request may ask for (OpenAI: 20), else 400",
    )
    max_logprobs: int = Field(
        5, ge=0, le=1000, description="largest logprobs on /v1/completions (OpenAI's legacy maximum: 5), else 400"
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="a client that reads nothing of its response "
        "for this long is cut and its upstream released, s (nginx send_timeout: 60)",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        import ipaddress

        for i, net in enumerate(v):
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies[{i}] {net!r} is not an IP address or CIDR (e.g. 10.0.0.0/8)"
                ) from None
        return v

    @model_validator(mode="after")
    def _default_le_limit(self) -> ServerSection:
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"server.default_max_tokens {self.default_max_tokens} is above max_tokens_limit "
                f"{self.max_tokens_limit}; lower it"
            )
        return self


class AdminSection(FrozenModel):
    """The admin API's credential: a bearer token read from the environment variable ``token_env``, or
    checked against ``token_sha256`` (hex SHA-256 of the token) so the file holds no secret."""

    token_env: str | None = Field("SERVELAB_ADMIN_TOKEN", pattern=_ENV, description="env var holding the admin token")
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the admin token")


class StateSection(FrozenModel):
    """Shared state: ``redis_url`` null keeps limits and breaker state in memory (one replica); a Redis URL
    lets N gateway replicas share one limit per key.

    The limiter's Redis connections (:func:`servelab.gateway.limits.redis_client`), per gateway process:
    ``redis_max_connections`` pooled connections (default: the API port's connection cap / 16, within
    4-32, :func:`servelab.gateway.limits.redis_pool_size`); a request that finds them all busy waits up to
    ``redis_pool_timeout_s`` seconds for one (then 503 ``limits_unavailable``). A broken connection (Redis
    restarted) is reconnected and the command retried; a settle that cannot reach Redis is retried in the
    background until it lands. These take effect on restart."""

    redis_url: str | None = Field(None, description="redis://host:port/db, rediss://… or unix://…; null = memory")
    redis_max_connections: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="pooled Redis connections of the "
        "limiter per gateway process; null = API connection cap / 16, "
        "within 4-32",
    )
    redis_pool_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="longest wait for a free pooled Redis connection before a request gets 503 limits_unavailable, s",
    )

    @field_validator("redis_url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://", v):
            raise ValueError(f"{v!r} is not a Redis URL; use redis://HOST:PORT/DB")
        return v


class LedgerSection(FrozenModel):
    """Where one usage row per request is written: SQLite (``sqlite_path``, default ``gateway-usage.db``
    next to the config file) or PostgreSQL (``postgres_dsn``); not both.

    ``spool_path``: folder of the write-ahead journal (:mod:`servelab.gateway.journal`): every admitted
    request is written there before it is forwarded, and rows the database could not take (PostgreSQL
    down) wait there until it can; default ``<sqlite_path>.spool``, or ``gateway-usage.spool`` next to the
    config file with PostgreSQL (replicas on one host may share it: each process locks its own segments
    and replays only those of dead processes). ``fsync_interval_s``: how often the journal is flushed to
    the disk (a crashed gateway loses nothing; a power loss at most this much)."""

    sqlite_path: str | None = Field(None, description="SQLite file (relative to the config file's folder)")
    postgres_dsn: str | None = Field(None, description="postgresql://user@host:port/db")
    spool_path: str | None = Field(
        None,
        description="write-ahead journal folder (relative to the config "
        "file's folder); default <sqlite_path>.spool or gateway-usage.spool",
    )
    fsync_interval_s: float = Field(0.2, gt=0, le=60, description="journal fsync interval, s")

    @model_validator(mode="after")
    def _one(self) -> LedgerSection:
        if self.sqlite_path is not None and self.postgres_dsn is not None:
            raise ValueError("ledger: give sqlite_path or postgres_dsn, not both")
        if self.postgres_dsn is not None and not re.match(r"^postgres(ql)?://", self.postgres_dsn):
            raise ValueError("ledger.postgres_dsn: not a postgresql:// URL; use postgresql://USER@HOST:PORT/DB")
        if self.sqlite_path is None and self.postgres_dsn is None:
            object.__setattr__(self, "sqlite_path", "gateway-usage.db")
        if self.spool_path is None and self.sqlite_path != ":memory:":
            object.__setattr__(
                self, "spool_path", f"{self.sqlite_path}.spool" if self.sqlite_path else "gateway-usage.spool"
            )
        return self


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
    (null = what its kind serves, ``servelab.wire.dialects``: ``messages`` on vllm and llamacpp; ``[]`` =
    always translate).
    """

    name: str = Field(pattern=_NAME, description="unique backend name (never shown to clients)")
    kind: Kind = Field(description="engine kind: readiness endpoint and error dialect")
    base_url: str = Field(description="engine root URL, e.g. http://127.0.0.1:8001")
    models: list[str] = Field(min_length=1, description="upstream model names this engine serves")
    weight: float = Field(1.0, ge=0, description="share among replicas of the same target")
    pool: str = Field("default", pattern=_NAME, description="pool name (tenants may be limited to pools)")
    health_path: str | None = Field(None, description="readiness path; default by kind (/health, / on Ollama)")
    connect_timeout_s: float = Field(2.0, gt=0, description="TCP connect timeout, s")
    read_timeout_s: float = Field(300.0, gt=0, description="longest wait between two reads (incl. TTFT), s")
    max_in_flight: int | None = Field(None, ge=1, description="requests in flight before it counts as saturated")
    api_key_env: str | None = Field(None, pattern=_ENV, description="env var holding the engine's API key")
    native_apis: list[Literal["messages"]] | None = Field(
        None,
        description="APIs forwarded unchanged (Anthropic messages); null = what its kind serves natively, "
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
            if not re.match(_NAME, name):
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


class SharedLimits(FrozenModel):
    """Limits on all keys of a tenant together (null = unlimited); same units as :class:`Tenant`."""

    rpm: int | None = Field(None, ge=1, description="requests per minute, all keys together")
    tpm: int | None = Field(None, ge=1, description="tokens per minute, all keys together")
    max_concurrency: int | None = Field(None, ge=1, description="requests in flight, all keys together")
    token_budget: int | None = Field(None, ge=1, description="total tokens, all keys together")


class ScopeLimits(FrozenModel):
    """Limits of one extra scope of a tenant (an application, a model, a client IP; servelab.gateway.scopes):
    all the tenant's requests in that scope together. No token budget: budgets are durable per key and
    tenant only (seeded from the ledger)."""

    rpm: int | None = Field(None, ge=1, description="requests per minute")
    tpm: int | None = Field(None, ge=1, description="tokens per minute")
    max_concurrency: int | None = Field(None, ge=1, description="requests in flight")


class Tenant(FrozenModel):
    """A team or application. ``allowed_models`` (``["*"]`` = every model). Limits apply to *each key* of
    the tenant (the rate-limit identity is the authenticated key; null = unlimited): ``rpm`` requests/min,
    ``tpm`` tokens/min (prompt + output; reserved as prompt estimate + max_tokens, settled to the engine's
    usage), ``max_concurrency`` requests in flight, ``token_budget`` tokens in total; ``shared_limits``
    apply to all its keys together. ``pools`` null = any. ``log_prompts`` writes prompt text into the
    access log after the ``redact`` regexes replace matches with ``[REDACTED]``."""

    allowed_models: list[str] = Field(default_factory=lambda: ["*"])
    rpm: int | None = Field(None, ge=1, description="requests per minute")
    tpm: int | None = Field(None, ge=1, description="tokens per minute")
    max_concurrency: int | None = Field(None, ge=1, description="requests in flight")
    token_budget: int | None = Field(None, ge=1, description="total tokens")
    shared_limits: SharedLimits = Field(default_factory=SharedLimits, description="limits of all keys together")
    pools: list[str] | None = Field(None, description="backend pools it may use; null = any")
    log_prompts: bool = Field(False, description="log prompt text (redacted) in the access log")
    redact: list[str] = Field(default_factory=lambda: list(DEFAULT_REDACT), description="regexes to redact")
    priority: str = Field(
        "standard",
        pattern=_NAME,
        description="priority class of its keys (degrade.rules match it); a key's own priority wins",
    )
    application_limits: dict[str, ScopeLimits] = Field(
        default_factory=dict, description="per application (keys[].application): all its keys together"
    )
    model_limits: dict[str, ScopeLimits] = Field(
        default_factory=dict, description="per public model: all the tenant's keys together"
    )
    ip_limits: ScopeLimits | None = Field(
        None,
        description="per client IP (server.trusted_proxies decides when "
        "X-Forwarded-For counts): all the tenant's keys together",
    )

    @field_validator("redact")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for i, pat in enumerate(v):
            try:
                re.compile(pat)
            except re.error as e:
                raise ValueError(f"redact[{i}] {pat!r} is not a valid regular expression ({e})") from None
        return v


class KeyEntry(FrozenModel):
    """An API key declared in the file: its ``id`` (the ``<key_id>`` of ``sk-sl-<key_id>-<secret>``), its
    ``tenant`` and ``sha256`` = hex SHA-256 of the ``<secret>`` part (the secret itself is never stored;
    ``servelab keys generate`` prints a key and its entry). Optional ``allowed_models`` narrows the
    tenant's list; optional limits override the tenant's per-key limits."""

    id: str = Field(pattern=_KEY_ID)
    tenant: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key's secret part")
    allowed_models: list[str] | None = Field(None, description="subset of the tenant's models; null = all of them")
    rpm: int | None = Field(None, ge=1, description="override of the tenant's per-key rpm")
    tpm: int | None = Field(None, ge=1, description="override of the tenant's per-key tpm")
    max_concurrency: int | None = Field(None, ge=1, description="override of the tenant's per-key max_concurrency")
    token_budget: int | None = Field(None, ge=1, description="override of the tenant's per-key token_budget")
    priority: str | None = Field(
        None,
        pattern=_NAME,
        description="priority class (degrade.rules); null = the "
        "tenant's. Bound to the key: no client header can change it",
    )
    application: str | None = Field(
        None,
        pattern=_NAME,
        description="application this key belongs to (tenants.<t>.application_limits, access log); bound to the key",
    )


class DegradeWhen(FrozenModel):
    """Pressure on the requested model, as this gateway process sees it; the rule fires when ANY set
    threshold is reached. ``in_flight``: requests in flight on the model's target backends, summed;
    ``in_flight_ratio``: that sum over the sum of their ``max_in_flight`` (only when every target backend
    has one); ``ttft_p95_ms``: P95 of the model's gateway-measured TTFT over the last ``degrade.window_s``
    (with at least ``degrade.min_samples`` requests)."""

    in_flight: int | None = Field(None, ge=1, description="requests in flight on the model's backends")
    in_flight_ratio: float | None = Field(None, gt=0, le=1, description="in flight / max_in_flight (0-1]")
    ttft_p95_ms: float | None = Field(None, gt=0, description="recent TTFT P95 of the model, ms")

    @model_validator(mode="after")
    def _some(self) -> DegradeWhen:
        if self.in_flight is None and self.in_flight_ratio is None and self.ttft_p95_ms is None:
            raise ValueError("set at least one of in_flight, in_flight_ratio, ttft_p95_ms")
        return self


class DegradeRule(FrozenModel):
    """Under pressure (``when``), requests of the ``priorities`` classes to ``models`` (null = any) are
    degraded: ``pause`` refuses them all (503 ``model_busy``, e.g. batch traffic), ``route_to`` another
    (cheaper) public model, ``max_tokens`` caps the output, and prompts above ``max_prompt_tokens`` (the
    gateway's estimate) are refused with 503 ``long_prompt_refused``, a message saying by how much to
    shorten; refusals carry ``Retry-After: retry_after_s``. The first matching rule applies
    (servelab.gateway.degrade)."""

    name: str = Field(pattern=_NAME, description="rule name (metrics and access log)")
    priorities: list[str] = Field(min_length=1, description="priority classes it applies to")
    models: list[str] | None = Field(None, description="public models it applies to; null = any")
    when: DegradeWhen
    route_to: str | None = Field(None, description="public model to send these requests to")
    max_tokens: int | None = Field(None, ge=1, description="cap on max_tokens")
    max_prompt_tokens: int | None = Field(None, ge=1, description="longer prompts are refused")
    pause: bool = Field(False, description="refuse every request of these classes while pressed (503, Retry-After)")
    retry_after_s: float = Field(5.0, gt=0, description="Retry-After of a refusal, s")

    @model_validator(mode="after")
    def _acts(self) -> DegradeRule:
        if self.route_to is None and self.max_tokens is None and self.max_prompt_tokens is None and not self.pause:
            raise ValueError("set at least one action: pause, route_to, max_tokens or max_prompt_tokens")
        return self


class DegradeSection(FrozenModel):
    """Degrade rules by priority class under pressure (issue 14 item 2). ``window_s``/``min_samples``:
    the TTFT window of ``when.ttft_p95_ms``."""

    rules: list[DegradeRule] = Field(default_factory=list)
    window_s: float = Field(30.0, gt=0, le=3600, description="TTFT window of ttft_p95_ms, s")
    min_samples: int = Field(20, ge=1, description="fewest TTFTs in the window before ttft_p95_ms counts")


class PickerWeightsSection(FrozenModel):
    """Weights (>= 0, unitless) of the ``engine`` policy's scorers (servelab.gateway.picker); 0 turns one off."""

    queue: float = Field(2.0, ge=0, description="engine queue: 1 / (1 + waiting)")
    running: float = Field(1.0, ge=0, description="running vs slots: 1 - min(1, load / slots)")
    kv: float = Field(1.0, ge=0, description="KV-cache headroom: 1 - kv_usage (when every replica reports it)")
    prefix: float = Field(3.0, ge=0, description="share of the prompt's leading blocks last sent to the replica")
    session: float = Field(2.0, ge=0, description="1 on the session key's rendezvous owner")


class PickerSection(FrozenModel):
    """The endpoint picker that orders the replicas of a group (servelab.gateway.picker): ``policy``
    ``default`` (least outstanding, or prefix affinity with ``affinity_chars`` > 0), ``prefix`` (the same),
    ``round_robin``, ``least_outstanding``, ``power_of_two`` or ``engine`` (weighted scores from the engines'
    own /metrics gauges, scraped every ``health.interval_s``). ``stale_after_s``: gauges older than this make
    the ``engine`` policy fall back to least outstanding (counted). ``block_chars``/``max_blocks``: prompt
    blocks hashed for the prefix scorer; ``index_blocks``: block hashes remembered per replica (LRU)."""

    policy: Literal["default", "round_robin", "least_outstanding", "power_of_two", "prefix", "engine"] = Field(
        "default", description="how a replica is chosen inside a group"
    )
    weights: PickerWeightsSection = Field(default_factory=PickerWeightsSection)
    stale_after_s: float = Field(3.0, gt=0, description="seconds after which a replica's scraped gauges are stale")
    block_chars: int = Field(64, ge=8, le=65536, description="prompt characters per prefix block")
    max_blocks: int = Field(64, ge=1, le=4096, description="prefix blocks hashed per prompt")
    index_blocks: int = Field(50_000, ge=0, description="block hashes remembered per replica (LRU; 0 = none)")


class RoutingSection(FrozenModel):
    """Per-task routing: a request whose ``task_header`` names a task in ``tasks`` and whose body gives
    no model (or ``"auto"``) goes to that public model. ``affinity_chars``: leading prompt characters hashed
    to keep one prefix on one replica (KV/prefix cache reuse; 0 = off, least outstanding requests only);
    ``balance_factor``: how far above the mean load a replica may go before a prefix spills to the next
    (see :mod:`servelab.gateway.routing`). The canary split and shadow sampling are drawn at random per
    request, never from a client-chosen value, unless ``session_header`` names a header: then the draw is
    keyed by HMAC-SHA256(key = env ``session_secret_env``, message = API key id + header value), so one
    session stays in one group, a client cannot compute offline which value lands where, and another key's
    sessions are not steered by it (prefix affinity picks a replica *inside* a group only)."""

    task_header: str = Field("X-Servelab-Task")
    tasks: dict[str, str] = Field(default_factory=dict, description="task name -> public model")
    task_sampling: dict[str, SamplingPolicy] = Field(
        default_factory=dict,
        description="task name (task_header) -> sampling defaults and bounds, on top of the model's",
    )
    affinity_chars: int = Field(256, ge=0, description="prompt characters hashed for prefix affinity; 0 = off")
    balance_factor: float = Field(1.25, ge=1, description="bounded-load factor of prefix affinity (>= 1)")
    session_header: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9-]{1,64}$",
        description="client header whose "
        "value keeps one session in one canary group (keyed by HMAC of the API "
        "key id and the value); null = each request drawn at random",
    )
    session_secret_env: str = Field(
        "SERVELAB_SESSION_SECRET",
        pattern=_ENV,
        description="env var with the HMAC key of session_header (same on every replica); unset = a per-process key",
    )
    picker: PickerSection = Field(default_factory=PickerSection, description="replica choice inside a group")


class RetrySection(FrozenModel):
    """Retries before the first byte reached the client, on connection failures, 429 and 503 only:
    ``attempts`` extra tries, ``backoff_s`` first wait (doubled per try, at most ``backoff_max_s``), and
    ``budget_ratio`` caps retries at that share of requests (no retry storm)."""

    attempts: int = Field(2, ge=0, le=10)
    backoff_s: float = Field(0.05, ge=0)
    backoff_max_s: float = Field(1.0, ge=0)
    budget_ratio: float = Field(0.2, ge=0, le=10)


class BreakerSection(FrozenModel):
    """Per-backend circuit breaker: opens after ``consecutive_failures`` or when the error rate over
    ``window_s`` exceeds ``error_rate`` (with at least ``min_requests``), stays open ``open_s``, then
    lets probes through (half-open)."""

    consecutive_failures: int = Field(5, ge=1)
    error_rate: float = Field(0.5, gt=0, le=1)
    window_s: float = Field(10.0, gt=0)
    min_requests: int = Field(10, ge=1)
    open_s: float = Field(5.0, gt=0)


class HealthSection(FrozenModel):
    """Active readiness checks of every backend each ``interval_s`` (timeout ``timeout_s``)."""

    enabled: bool = True
    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)


class TracingSection(FrozenModel):
    """OpenTelemetry traces of the gateway's requests (servelab.gateway.tracing), exported over OTLP/HTTP;
    off while ``endpoint`` is null. Needs the ``otel`` extra (``pip install 'servelab[otel]'``). ``endpoint``:
    the collector's traces URL (``http://127.0.0.1:4318/v1/traces``); ``sample_ratio``: share of requests
    traced (0-1) when the client sent no ``traceparent``, else the client's sampled flag decides;
    ``service_name``: the resource's ``service.name``; ``export_timeout_s``: one export's limit (s)."""

    endpoint: str | None = Field(
        None, description="OTLP/HTTP traces URL, e.g. http://127.0.0.1:4318/v1/traces; null = tracing off"
    )
    sample_ratio: float = Field(
        1.0, ge=0, le=1, description="share of requests traced (0-1) without a client traceparent"
    )
    service_name: str = Field("servelab-gateway", min_length=1, max_length=128, description="service.name of the spans")
    export_timeout_s: float = Field(10.0, gt=0, le=300, description="longest wait for one OTLP export, s")

    @field_validator("endpoint")
    @classmethod
    def _endpoint(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v.strip()):
            raise ValueError(f"{v!r} is not an http(s) URL; use e.g. http://127.0.0.1:4318/v1/traces")
        return v.strip() if v is not None else None


class GatewayConfig(FrozenModel):
    """The whole gateway file. See each section's class for units and defaults."""

    server: ServerSection = Field(default_factory=ServerSection)
    admin: AdminSection = Field(default_factory=AdminSection)
    state: StateSection = Field(default_factory=StateSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    backends: list[Backend] = Field(min_length=1)
    models: dict[str, ModelEntry] = Field(min_length=1)
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    keys: list[KeyEntry] = Field(default_factory=list)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    retry: RetrySection = Field(default_factory=RetrySection)
    breaker: BreakerSection = Field(default_factory=BreakerSection)
    health: HealthSection = Field(default_factory=HealthSection)
    degrade: DegradeSection = Field(default_factory=DegradeSection)
    tracing: TracingSection = Field(default_factory=TracingSection)

    @field_validator("tenants", "keys", mode="before")
    @classmethod
    def _empty_section(cls, v: Any, info: ValidationInfo) -> Any:
        # "keys:" with every entry deleted (or only comments left) is YAML null: read it as "none"
        if v is None:
            return [] if info.field_name == "keys" else {}
        return v

    @model_validator(mode="after")
    def _cross(self) -> GatewayConfig:
        backends: dict[str, Backend] = {}
        for i, b in enumerate(self.backends):
            if b.name in backends:
                raise ValueError(f"backends[{i}].name: {b.name!r} is used twice; give each backend its own name")
            backends[b.name] = b
        for name, m in self.models.items():
            for j, t in enumerate(m.targets):
                _check_target(t, backends, f"models.{name}.targets[{j}]")
            _check_pooled(m.capabilities, f"models.{name}.capabilities")
            for j, f in enumerate(m.fallback):
                if f.model not in self.models:
                    raise ValueError(
                        f"models.{name}.fallback[{j}].model: {f.model!r} is not a model; "
                        f"one of {', '.join(self.models)}"
                    )
                if f.model == name:
                    raise ValueError(f"models.{name}.fallback[{j}].model: a model cannot fall back to itself")
            if m.shadow is not None:
                _check_target(m.shadow.target, backends, f"models.{name}.shadow.target")
        pools = {b.pool for b in self.backends}
        for tname, ten in self.tenants.items():
            for j, mname in enumerate(ten.allowed_models):
                if mname != "*" and mname not in self.models:
                    raise ValueError(
                        f"tenants.{tname}.allowed_models[{j}]: {mname!r} is not a model; "
                        f"one of {', '.join(self.models)} or '*'"
                    )
            for j, p in enumerate(ten.pools or []):
                if p not in pools:
                    raise ValueError(
                        f"tenants.{tname}.pools[{j}]: no backend is in pool {p!r}; pools: {', '.join(sorted(pools))}"
                    )
        seen: set[str] = set()
        for i, k in enumerate(self.keys):
            if k.id in seen:
                raise ValueError(f"keys[{i}].id: {k.id!r} is used twice; key ids must be unique")
            seen.add(k.id)
            if k.tenant not in self.tenants:
                raise ValueError(
                    f"keys[{i}].tenant: {k.tenant!r} is not a tenant; "
                    f"add it under tenants: or use one of {', '.join(self.tenants) or '(none)'}"
                )
        for task, mname in self.routing.tasks.items():
            if mname not in self.models:
                raise ValueError(f"routing.tasks.{task}: {mname!r} is not a model; one of {', '.join(self.models)}")
        _check_model_refs(self)
        return self

    def backend(self, name: str) -> Backend:
        """The backend called ``name``; raises :class:`KeyError` if none."""
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def upstream_model(self, target: Target) -> str:
        """The model name to send to ``target``'s engine (``target.model`` or its backend's first model)."""
        return target.model or self.backend(target.backend).models[0]

    def tenant_may_use(self, tenant: str, model: str) -> bool:
        """True when ``tenant`` exists and lists ``model`` (or ``*``) in ``allowed_models``."""
        t = self.tenants.get(tenant)
        return t is not None and ("*" in t.allowed_models or model in t.allowed_models)


def _check_model_refs(cfg: GatewayConfig) -> None:
    """Every model named by ``tenants.*.model_limits`` and ``degrade.rules`` exists (else ValueError)."""
    refs = [(f"tenants.{tname}.model_limits", m) for tname, ten in cfg.tenants.items() for m in ten.model_limits]
    refs += [
        (f"degrade.rules[{i}] ({rule.name})", m)
        for i, rule in enumerate(cfg.degrade.rules)
        for m in [*(rule.models or []), *([rule.route_to] if rule.route_to else [])]
    ]
    for where, mname in refs:
        if mname not in cfg.models:
            raise ValueError(f"{where}: {mname!r} is not a model; one of {', '.join(cfg.models)}")


def _check_pooled(c: Capabilities, where: str) -> None:
    """An embedding or rerank model serves only its own route: it cannot be both, declare chat features,
    or (rerank) an embedding dimension."""
    if c.embeddings and c.rerank:
        raise ValueError(f"{where}: a model is an embedding model or a rerank model, not both")
    kind = "an embedding" if c.embeddings else ("a rerank" if c.rerank else None)
    if kind is not None and (c.tools or c.json_schema):
        raise ValueError(f"{where}: {kind} model cannot declare tools or json_schema")
    if c.embedding_dimensions is not None and not c.embeddings:
        raise ValueError(f"{where}.embedding_dimensions: only an embedding model (embeddings: true) has one")


def _check_target(t: Target, backends: dict[str, Backend], where: str) -> None:
    b = backends.get(t.backend)
    if b is None:
        raise ValueError(f"{where}.backend: {t.backend!r} is not a backend; one of {', '.join(backends)}")
    if t.model is not None and t.model not in b.models:
        raise ValueError(
            f"{where}.model: backend {t.backend!r} does not serve {t.model!r}; "
            f"it serves {', '.join(b.models)} (add it to its models: list)"
        )


# ---------------------------------------------------------------------------------------------------
# loading


def parse_config(data: Any, source: str = "<config>", base_dir: str | Path | None = None) -> GatewayConfig:
    """Validate a decoded config (a dict). Relative ``ledger.sqlite_path``/``spool_path`` and ``server.access_log``
    are resolved against ``base_dir`` when given. Raises :class:`ConfigError` ``SOURCE: PATH: PROBLEM``."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping (server:, backends:, models:, …), got {type(data).__name__}"
        )
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, source, GatewayConfig)) from None
    if base_dir is not None:
        base = Path(base_dir)
        led = cfg.ledger
        if led.sqlite_path and led.sqlite_path != ":memory:" and not Path(led.sqlite_path).is_absolute():
            cfg = cfg.model_copy(
                update={"ledger": led.model_copy(update={"sqlite_path": str((base / led.sqlite_path).absolute())})}
            )
        led = cfg.ledger
        if led.spool_path and not Path(led.spool_path).is_absolute():
            cfg = cfg.model_copy(
                update={"ledger": led.model_copy(update={"spool_path": str((base / led.spool_path).absolute())})}
            )
        al = cfg.server.access_log
        if al not in (None, "-") and not Path(al).is_absolute():
            cfg = cfg.model_copy(
                update={"server": cfg.server.model_copy(update={"access_log": str((base / al).absolute())})}
            )
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file. Raises :class:`ConfigError` with one line naming the file,
    the field path and the fix: missing file, YAML syntax error (line/column), bad or unknown field,
    unknown backend/model/tenant reference."""
    src = str(path)
    p = Path(path).expanduser()
    data = read_yaml_file(
        path,
        what="gateway config",
        missing_fix="give a YAML file (example: examples/gateway.yaml)",
        empty_fix="write a gateway config (example: examples/gateway.yaml)",
    )
    return parse_config(data, src, p.parent)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the gateway file (what ``gateway.schema.json`` holds)."""
    return json_schema_of(GatewayConfig, "servelab gateway config")


#: ``gateway.schema.json``, written and checked by ``servelab schema write|check``.
PUBLISHED_SCHEMA = PublishedSchema(SCHEMA_PATH, json_schema)
