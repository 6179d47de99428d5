"""The gateway file's routing and resilience sections (servelab.gateway.config): ``routing`` (tasks, the
session header, the endpoint picker), ``retry``, ``breaker``, ``health`` and ``tracing``."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from servelab.gateway.configmodels import SamplingPolicy
from servelab.gateway.confignames import ENV
from servelab.wire.config import FrozenModel

__all__ = [
    "BreakerSection",
    "HealthSection",
    "PickerSection",
    "PickerWeightsSection",
    "RetrySection",
    "RoutingSection",
    "TracingSection",
]


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
        pattern=ENV,
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
    """Active readiness checks of every backend each ``interval_s`` (timeout ``timeout_s``); the engine-gauge
    scrape of each backend's ``/metrics`` (servelab.gateway.enginegauges) runs on the same clock and reads at
    most ``metrics_max_bytes`` bytes of a page (a larger one is counted as oversize and its gauges dropped)."""

    enabled: bool = True
    interval_s: float = Field(1.0, gt=0)
    timeout_s: float = Field(1.0, gt=0)
    metrics_max_bytes: int = Field(
        4 * 1024 * 1024,
        ge=64 * 1024,
        le=256 * 1024 * 1024,
        description="largest /metrics page read from one backend per scrape, bytes (64 KiB-256 MiB)",
    )


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
