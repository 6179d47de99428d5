"""The gateway file's callers (servelab.gateway.config): ``tenants`` with their limits, budgets and
permissions, ``keys`` defined in the file, and ``degrade`` (what each priority class gets under pressure)."""

from __future__ import annotations

import re

from pydantic import Field, field_validator, model_validator

from servelab.gateway.confignames import DEFAULT_REDACT, KEY_ID, NAME
from servelab.wire.config import FrozenModel

__all__ = ["DegradeRule", "DegradeSection", "DegradeWhen", "KeyEntry", "ScopeLimits", "SharedLimits", "Tenant"]


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
        pattern=NAME,
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

    id: str = Field(pattern=KEY_ID)
    tenant: str
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the key's secret part")
    allowed_models: list[str] | None = Field(None, description="subset of the tenant's models; null = all of them")
    rpm: int | None = Field(None, ge=1, description="override of the tenant's per-key rpm")
    tpm: int | None = Field(None, ge=1, description="override of the tenant's per-key tpm")
    max_concurrency: int | None = Field(None, ge=1, description="override of the tenant's per-key max_concurrency")
    token_budget: int | None = Field(None, ge=1, description="override of the tenant's per-key token_budget")
    priority: str | None = Field(
        None,
        pattern=NAME,
        description="priority class (degrade.rules); null = the "
        "tenant's. Bound to the key: no client header can change it",
    )
    application: str | None = Field(
        None,
        pattern=NAME,
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

    name: str = Field(pattern=NAME, description="rule name (metrics and access log)")
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
