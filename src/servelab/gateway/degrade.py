"""Degrade instead of failing (issue 14 item 2, seed 003 §21).

Two jobs, both decided before anything reaches the client:

1. **Another target after an engine failure.** :func:`another_target` says which failed attempts may
   go on to the next target (a replica, or the model's ``fallback`` steps): connection failures,
   timeouts, engine overload (429/503), engine 5xx and answers that carry an error, all *before the first
   byte* reached the client. A request the engine rejected for its content (4xx: too long, bad
   parameter) is not retried: another engine would reject it too. After the first byte the client gets a
   clean error event, never a second answer.
2. **Degrade rules by priority class under pressure** (``degrade.rules`` in the config,
   :class:`servelab.gateway.config.DegradeRule`). Each key has a priority class (``keys[].priority``,
   else its tenant's ``priority``, default ``standard``), bound to the key: no request field or header
   changes it. Pressure is measured per requested model in this process: requests in flight on its
   target backends (absolute, or over their ``max_in_flight``) and the P95 of the TTFT the gateway
   measured over the last ``degrade.window_s``. The first rule whose priority, model and pressure match
   applies its actions: ``pause`` the class (503 ``model_busy`` with Retry-After, e.g. batch traffic),
   ``route_to`` a cheaper model (when the key may use it), cap ``max_tokens``, refuse prompts over
   ``max_prompt_tokens`` (503 ``long_prompt_refused`` with Retry-After and how much to shorten).

Every applied action is counted in ``servelab_gateway_degraded_total{model,rule,action}`` (``action``:
``pause``, ``route``, ``cap_max_tokens``, ``refuse_long_prompt``) and written to the access log's ``degraded``
field (``{"rule", "priority", "from_model", "actions"}``).

Pressure is per gateway process (in-flight counts and TTFTs are not shared through Redis): each replica
degrades on what it sees, which is what its own queueing costs.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from servelab.gateway.errors import GatewayError

__all__ = ["Decision", "Degrader", "TtftWindow", "another_target", "cap", "priority_of"]

#: error codes (servelab.gateway.scrub and the server's own) after which the next target is tried
_ANOTHER_TARGET = frozenset(
    {"model_busy", "upstream_error", "model_unavailable", "upstream_timeout", "endpoint_not_served"}
)


def another_target(error: GatewayError) -> bool:
    """True when an attempt that failed with ``error`` before the first byte may go on to the next
    target: busy (429/503), 5xx, an error answer, unreachable/misconfigured upstream, timeout, an engine
    that does not serve the endpoint (501: another target's engine may; each target is tried once). False for
    the engine's verdict on the request itself (context too long, bad parameter)."""
    return error.code in _ANOTHER_TARGET


class TtftWindow:
    """Recent TTFTs per model (seconds), for ``when.ttft_p95_ms``.

    Keeps at most ``max_samples`` per model and drops those older than ``window_s``; the P95 is
    recomputed at most every ``refresh_s`` (sorting on every request would cost the hot path).
    """

    def __init__(self, max_samples: int = 512, refresh_s: float = 0.25) -> None:
        self._samples: dict[str, deque[tuple[float, float]]] = {}
        self._cache: dict[str, tuple[float, float | None]] = {}
        self._max = max_samples
        self._refresh_s = refresh_s

    def observe(self, model: str, ttft_s: float, now_s: float | None = None) -> None:
        """Add one TTFT (seconds) of ``model``."""
        q = self._samples.get(model)
        if q is None:
            q = self._samples[model] = deque(maxlen=self._max)
        q.append((time.monotonic() if now_s is None else now_s, ttft_s))

    def p95_s(self, model: str, window_s: float, min_samples: int, now_s: float | None = None) -> float | None:
        """P95 (nearest rank) of ``model``'s TTFTs of the last ``window_s`` seconds, in seconds; ``None``
        with fewer than ``min_samples``."""
        now = time.monotonic() if now_s is None else now_s
        cached = self._cache.get(model)
        if cached is not None and now - cached[0] < self._refresh_s:
            return cached[1]
        q = self._samples.get(model)
        while q and now - q[0][0] > window_s:
            q.popleft()
        vals = sorted(v for _, v in q) if q else []
        p95 = vals[max(0, math.ceil(0.95 * len(vals)) - 1)] if len(vals) >= min_samples else None
        self._cache[model] = (now, p95)
        return p95


def priority_of(cfg: Any, key: Any) -> str:
    """The priority class of ``key`` (a KeyInfo: ``key_id``, ``tenant``): its ``keys[]`` entry's
    ``priority`` in ``cfg``, else its tenant's ``priority``, else ``standard``."""
    by_key = _key_priorities(cfg)
    p = by_key.get(key.key_id)
    if p:
        return p
    t = cfg.tenants.get(key.tenant)
    return t.priority if t is not None else "standard"


_PRIO_CACHE: dict[int, tuple[Any, dict[str, str]]] = {}


def _key_priorities(cfg: Any) -> Mapping[str, str]:
    hit = _PRIO_CACHE.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1]
    table = {k.id: k.priority for k in cfg.keys if k.priority}
    _PRIO_CACHE.clear()  # one config in force at a time (plus the one being replaced)
    _PRIO_CACHE[id(cfg)] = (cfg, table)
    return table


@dataclass
class Decision:
    """What a degrade rule did to one request. ``model``: the public model it now goes to;
    ``max_tokens``: the output cap (tokens) or None; ``refusal``: the error to answer instead, or None;
    ``actions``: applied action names, for the access log."""

    rule: str
    priority: str
    from_model: str
    model: str
    max_tokens: int | None = None
    refusal: GatewayError | None = None
    actions: list[str] = field(default_factory=list)

    def log_record(self) -> dict[str, Any]:
        """The access log's ``degraded`` field."""
        return {"rule": self.rule, "priority": self.priority, "from_model": self.from_model, "actions": self.actions}


def cap(out_cap: int, decision: Decision | None) -> int:
    """``out_cap`` (tokens) lowered to the decision's ``max_tokens`` when it sets one."""
    if decision is None or decision.max_tokens is None:
        return out_cap
    return min(out_cap, decision.max_tokens)


class Degrader:
    """Applies ``cfg.degrade.rules`` (see module doc). One per gateway (its TTFT window survives config
    reloads); ``registry``: where ``servelab_gateway_degraded_total`` is registered."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.ttft = TtftWindow()
        self.applied = Counter(
            "servelab_gateway_degraded_total",
            "Degrade actions applied under pressure",
            ("model", "rule", "action"),
            registry=registry,
        )

    def observe(self, model: str, ttft_ns: int | None) -> None:
        """Record a served request's TTFT (nanoseconds; None = none)."""
        if ttft_ns is not None:
            self.ttft.observe(model, ttft_ns / 1e9)

    def decide(
        self,
        cfg: Any,
        key: Any,
        model: str,
        prompt_tokens: int,
        outstanding: Callable[[str], int],
        may_use: Callable[[str], bool],
    ) -> Decision | None:
        """The :class:`Decision` for a request of ``key`` to public ``model`` whose prompt is about
        ``prompt_tokens`` tokens, or None when no rule applies. ``outstanding(backend)``: requests in
        flight on a backend; ``may_use(model)``: whether the key may use a model (a ``route_to`` it may
        not use is skipped)."""
        rules = cfg.degrade.rules
        if not rules:
            return None
        prio = priority_of(cfg, key)
        for rule in rules:
            if prio not in rule.priorities or (rule.models is not None and model not in rule.models):
                continue
            if not self._pressed(cfg, rule.when, model, outstanding):
                continue
            d = Decision(rule.name, prio, model, model)
            wait_s = math.ceil(rule.retry_after_s)
            if rule.pause:
                d.refusal = GatewayError(
                    503,
                    f"the model is busy, retry in {wait_s} s",
                    type="server_error",
                    code="model_busy",
                    retry_after_s=rule.retry_after_s,
                )
                d.actions.append("pause")
            elif rule.max_prompt_tokens is not None and prompt_tokens > rule.max_prompt_tokens:
                over = prompt_tokens - rule.max_prompt_tokens
                d.refusal = GatewayError(
                    503,
                    f"the model is under heavy load and takes prompts of at most {rule.max_prompt_tokens} "
                    f"tokens right now; this one has about {prompt_tokens}: shorten it by at least {over} tokens "
                    f"(about {math.ceil(over * 0.75)} words), or retry in {wait_s} s",
                    type="server_error",
                    code="long_prompt_refused",
                    param="messages",
                    retry_after_s=rule.retry_after_s,
                )
                d.actions.append("refuse_long_prompt")
            else:
                if rule.route_to is not None and rule.route_to != model and may_use(rule.route_to):
                    d.model = rule.route_to
                    d.actions.append("route")
                if rule.max_tokens is not None:
                    d.max_tokens = rule.max_tokens
                    d.actions.append("cap_max_tokens")
            if not d.actions:
                continue
            for a in d.actions:
                self.applied.labels(model, rule.name, a).inc()
            return d
        return None

    def _pressed(self, cfg: Any, when: Any, model: str, outstanding: Callable[[str], int]) -> bool:
        entry = cfg.models.get(model)
        if entry is None:
            return False
        if when.in_flight is not None or when.in_flight_ratio is not None:
            backends = {t.backend for t in entry.targets}
            n = sum(outstanding(b) for b in backends)
            if when.in_flight is not None and n >= when.in_flight:
                return True
            if when.in_flight_ratio is not None:
                caps = [cfg.backend(b).max_in_flight for b in backends]
                if all(caps) and n >= when.in_flight_ratio * sum(caps):
                    return True
        if when.ttft_p95_ms is not None:
            p95 = self.ttft.p95_s(model, cfg.degrade.window_s, cfg.degrade.min_samples)
            if p95 is not None and p95 * 1000.0 >= when.ttft_p95_ms:
                return True
        return False
