"""One config's derived state (:class:`Snapshot`): routes, timeouts, upstream auth, what to hide from
clients. Built once per config file and never mutated, so a hot reload swaps in a new one with one
assignment while each request keeps the one it started with (servelab.gateway.server)."""

from __future__ import annotations

import os
import re
from typing import Any

import aiohttp

from servelab.gateway.breaker import BreakerBoard, BreakerSettings, RetryBudget
from servelab.gateway.config import GatewayConfig, ModelEntry
from servelab.gateway.leases import LoadTracker
from servelab.gateway.picker import Picker, PickerSettings, PickerState, ScoreWeights
from servelab.gateway.routespec import Backend as RouteBackend
from servelab.gateway.routespec import FallbackSpec, ModelRoute, ShadowSpec, TargetSpec
from servelab.gateway.routing import Router

__all__ = ["Snapshot", "breaker_settings", "model_card"]


class Snapshot:
    """Everything derived from one config file; never mutated after it is built, so a request can keep
    using the one it started with while a reload installs the next."""

    def __init__(
        self,
        cfg: GatewayConfig,
        version: int,
        breakers: BreakerBoard,
        load: LoadTracker,
        picks: PickerState | None = None,
    ) -> None:
        self.cfg = cfg
        self.version = version
        self.backends = {b.name: b for b in cfg.backends}
        route_backends = [
            RouteBackend(
                name=b.name,
                kind=b.kind,
                base_url=b.base_url,
                models=tuple(b.models),
                max_in_flight=b.max_in_flight or 0,
                pool=b.pool,
                health_path=b.health_path,
            )
            for b in cfg.backends
        ]
        self.route_backends = route_backends
        for b in cfg.backends:  # every backend has a breaker from the start (shared-state sync, metrics)
            breakers.get(b.name)
        routes = []
        for name, m in cfg.models.items():
            sh = None
            if m.shadow is not None:
                sh = ShadowSpec(m.shadow.target.backend, cfg.upstream_model(m.shadow.target), m.shadow.sample_rate)
            routes.append(
                ModelRoute(
                    name=name,
                    targets=tuple(
                        TargetSpec(t.backend, cfg.upstream_model(t), t.weight * self.backends[t.backend].weight)
                        for t in m.targets
                    ),
                    fallback=tuple(FallbackSpec(f.model, f.max_tokens, dict(f.params)) for f in m.fallback),
                    shadow=sh,
                )
            )
        pk = cfg.routing.picker
        picker = Picker(
            PickerSettings(
                pk.policy,
                ScoreWeights(**pk.weights.model_dump()),
                pk.stale_after_s,
                pk.block_chars,
                pk.max_blocks,
                pk.index_blocks,
                cfg.routing.balance_factor,
            ),
            picks if picks is not None else PickerState(),
        )
        self.router = Router(
            route_backends,
            routes,
            tasks=cfg.routing.tasks,
            breakers=breakers,
            load=load,
            affinity_chars=cfg.routing.affinity_chars,
            balance_factor=cfg.routing.balance_factor,
            picker=picker,
        )
        self.timeouts = {
            b.name: aiohttp.ClientTimeout(
                total=None, sock_connect=b.connect_timeout_s, connect=None, sock_read=b.read_timeout_s
            )
            for b in cfg.backends
        }
        self.auth_headers: dict[str, dict[str, str]] = {}
        for b in cfg.backends:
            key = os.environ.get(b.api_key_env, "") if b.api_key_env else ""
            self.auth_headers[b.name] = {"Authorization": f"Bearer {key}"} if key else {}
        # strings never shown to a client: backend names, upstream model names, URLs
        hide = {b.name for b in cfg.backends} | {b.base_url for b in cfg.backends}
        hide |= {mname for b in cfg.backends for mname in b.models if mname not in cfg.models}
        self.hide = tuple(sorted(hide, key=len, reverse=True))
        self.redact = {t: [re.compile(p) for p in ten.redact] for t, ten in cfg.tenants.items()}
        self.pool_of = {b.name: b.pool for b in cfg.backends}
        self.model_cards = {name: model_card(name, m) for name, m in cfg.models.items()}
        self.retry_budget: RetryBudget | None = None  # set by the Gateway (kept across reloads)


def breaker_settings(cfg: GatewayConfig) -> BreakerSettings:
    """The breaker thresholds of ``cfg.breaker``."""
    bs = cfg.breaker
    return BreakerSettings(
        consecutive_failures=bs.consecutive_failures,
        error_rate=bs.error_rate,
        window_s=bs.window_s,
        min_requests=bs.min_requests,
        open_s=bs.open_s,
    )


def model_card(name: str, m: ModelEntry) -> dict[str, Any]:
    """The ``GET /v1/models`` entry of public model ``name``: OpenAI's fields plus its capabilities."""
    c = m.capabilities
    return {
        "id": name,
        "object": "model",
        "created": 0,
        "owned_by": "servelab",
        "capabilities": c.model_dump(mode="json"),
        **({"description": m.description} if m.description else {}),
    }
