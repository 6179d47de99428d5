"""What routing works on and what it returns: the descriptors built from the gateway config (:class:`Backend`,
:class:`TargetSpec`, :class:`FallbackSpec`, :class:`ShadowSpec`, :class:`ModelRoute`) and a request's plan
(:class:`RoutePlan` of :class:`Target` s, each with its role). Plain frozen data; the rules that turn one
into the other are in :mod:`servelab.gateway.routing`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = [
    "FALLBACK",
    "PRIMARY",
    "RETRY",
    "SHADOW",
    "Backend",
    "FallbackSpec",
    "ModelRoute",
    "RoutePlan",
    "ShadowSpec",
    "Target",
    "TargetSpec",
]

PRIMARY = "primary"
RETRY = "retry"
FALLBACK = "fallback"
SHADOW = "shadow"

_EMPTY: Mapping[str, Any] = MappingProxyType({})


# ---------------------------------------------------------------- descriptors (plain data, from config)
@dataclass(frozen=True)
class Backend:
    """One engine endpoint. ``kind``: a kind of the dialect table (:mod:`servelab.wire.dialects`; decides the
    health path and the length fields sent). ``base_url``: server root, e.g. ``http://127.0.0.1:8001`` (a
    trailing ``/v1`` is tolerated). ``models``: upstream model names it serves (empty = any).
    ``max_in_flight``: requests the gateway sends it at once (0 = no limit); beyond it the backend is
    skipped. ``pool``: replica pool label (``canary``). ``health_path``: overrides the kind's readiness path."""

    name: str
    kind: str
    base_url: str
    models: tuple[str, ...] = ()
    max_in_flight: int = 0
    pool: str = ""
    health_path: str | None = None


@dataclass(frozen=True)
class TargetSpec:
    """One weighted target of a public model: ``backend`` name, upstream ``model`` name, ``weight`` >= 0."""

    backend: str
    model: str
    weight: float = 1.0


@dataclass(frozen=True)
class FallbackSpec:
    """A fallback step: public ``model`` to use instead, ``max_tokens`` cap (tokens) applied to the body,
    ``params`` other body fields to set (e.g. ``{"temperature": 0}``)."""

    model: str
    max_tokens: int | None = None
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class ShadowSpec:
    """Copy a share ``sample_rate`` (0..1) of requests to ``backend``/``model``; the answer is discarded."""

    backend: str
    model: str
    sample_rate: float


@dataclass(frozen=True)
class ModelRoute:
    """Routing of one public model name. ``affinity_chars``: prompt characters hashed for prefix affinity
    (None = the router's default, 0 = off)."""

    name: str
    targets: tuple[TargetSpec, ...]
    fallback: tuple[FallbackSpec, ...] = ()
    shadow: ShadowSpec | None = None
    affinity_chars: int | None = None


# ---------------------------------------------------------------- plan
@dataclass(frozen=True)
class Target:
    """One upstream attempt. ``role``: primary, retry, fallback or shadow. ``overrides``: body fields the
    server sets before sending (degrade parameters of a fallback). ``public_model``: the public name this
    target serves (differs from the requested one on a fallback)."""

    backend: str
    upstream_model: str
    public_model: str
    base_url: str
    kind: str
    role: str = PRIMARY
    overrides: Mapping[str, Any] = field(default_factory=lambda: _EMPTY, hash=False)

    def request_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``body`` with ``model`` set to the upstream name and the overrides applied."""
        out = dict(body)
        out.update(self.overrides)
        out["model"] = self.upstream_model
        return out


@dataclass(frozen=True)
class RoutePlan:
    """Ordered attempts for one request: ``targets[0]`` is the primary. ``public_model``: after task routing.
    ``degraded``: no target of the requested model was available, the plan starts with a fallback.
    ``affinity``: the HRW key used (hex digest) or None."""

    public_model: str
    targets: tuple[Target, ...]
    shadow: Target | None = None
    task: str | None = None
    degraded: bool = False
    affinity: str | None = None
    #: fallback models left out because the caller may not use them (:meth:`Router.plan` ``may_use``)
    denied: tuple[str, ...] = ()
    #: the endpoint picker's decision for the primary group (:meth:`servelab.gateway.picker.Pick.record`), or None
    pick: Mapping[str, Any] | None = field(default=None, hash=False)
    #: how the primary was chosen, when the picker chose it (the ``routed`` timeline event's ``why``)
    why: str | None = None

    @property
    def primary(self) -> Target:
        return self.targets[0]
