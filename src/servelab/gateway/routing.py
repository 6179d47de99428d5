"""Where a request goes: the :class:`Router` turns (public model, body, task tag, prompt prefix) into a
:class:`RoutePlan`, an ordered list of upstream :class:`Target` s plus an optional shadow target.

Policies, in the order they apply:

1. **Task routing.** A request that names no model (or ``"auto"``) and carries a tag (header
   ``X-Servelab-Task`` by default) listed in ``tasks`` goes to that tag's public model
   (``summarize -> small``); an explicit model always wins, unknown tags are ignored.
2. **Alias -> backend models.** A public model name has weighted targets ``(backend, upstream model)``.
   Targets are grouped by ``(backend pool, upstream model)``: replicas of the same model in the same pool
   form one group, a canary (another pool or another model) is another group.
3. **Weighted split (canary).** One group is drawn with probability weight / total weight. The draw is a
   stable hash of the ``request_id`` given to :meth:`Router.plan` (the same key always lands in the same
   group, on every gateway replica), otherwise random. The server never passes a client-chosen value
   here: random per request, or an HMAC session key when ``routing.session_header`` is set.
4. **Replica choice inside the group.** Backends whose breaker is open (or half-open with its probe slots
   taken) and backends at their ``max_in_flight`` are skipped. A replica with weight 0 is a standby: it
   is used only as a retry alternative after the weighted replicas of its group.
   - Without a prefix (or with affinity off): **least outstanding requests** (relative to
     ``max_in_flight`` when every replica of the group has one), ties broken by a hash of the request id.
   - With a prompt prefix and affinity on (``affinity_chars`` > 0): **rendezvous (HRW) hashing** of the
     first ``affinity_chars`` characters: every replica gets the score ``blake2b(prefix, replica)`` and the
     best score wins, so every gateway process sends the same prefix to the same replica (its prefix/KV
     cache is warm there), and removing one replica moves only the prefixes it owned (Thaler & Ravishankar,
     "Using name-based mappings to increase hit rates", IEEE/ACM ToN 6(1), 1998). **Bounded loads:** a
     replica is taken only if its outstanding count stays within ``ceil(balance_factor * (total + 1) / n)``
     (``total`` = outstanding over the ``n`` available replicas); otherwise the next replica in hash order
     is tried, so one hot prefix cannot pile onto one replica (Mirrokni, Thorup, Zadimoghaddam,
     "Consistent Hashing with Bounded Loads", SODA 2018, https://arxiv.org/abs/1608.01350, checked
     2026-11-30; the same rule as HAProxy's ``hash-balance-factor``,
     https://docs.haproxy.org/2.8/configuration.html#4-hash-balance-factor). With ``balance_factor`` c no replica
     carries more than about c times the mean load. Loads are this process's own outstanding counts.
5. **Retry alternatives**: the other available replicas of the chosen group, in the same order, then the
   other groups (heavier weight first).
6. **Fallback chain**: each ``fallback`` entry names another public model and degrade parameters (a lower
   ``max_tokens`` cap, other body fields); its targets follow with role ``fallback`` and the overrides.
   If no target of the requested model is available the plan starts with the fallback. Every fallback
   model is checked with the caller's ``may_use`` (tenant/key permissions) and left out when refused,
   and targets/shadow outside the caller's ``pools`` are left out: a request never reaches a model or
   pool its key may not use.
7. **Shadow**: with ``shadow.sample_rate`` r, a share r of requests (stable per request id) also gets a
   shadow target whose answer the server discards (migration comparisons, seeds 003 §15).
8. **Endpoint picker**: with a ``picker`` (:class:`servelab.gateway.picker.Picker`, ``routing.picker.policy``
   other than ``default``/``prefix``), step 4's replica order comes from the picker (round robin, least
   outstanding, power of two choices, or the engine-aware scores); its decision for the primary group is
   :attr:`RoutePlan.pick`.

Outstanding requests are counted with :meth:`Router.acquire` / :class:`~servelab.gateway.leases.Lease` (per
backend, shared by all Routers built with the same :class:`~servelab.gateway.leases.LoadTracker`, so a hot
reload keeps the counts). The descriptors and the plan are in :mod:`servelab.gateway.routespec`, the
hashes in :mod:`servelab.gateway.hashing`, the counts in :mod:`servelab.gateway.leases`.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from servelab.gateway.breaker import BreakerBoard
from servelab.gateway.errors import GatewayError, echo
from servelab.gateway.hashing import affinity_text, hrw_order, stable_unit
from servelab.gateway.leases import Lease, LoadTracker
from servelab.gateway.routespec import (
    FALLBACK,
    PRIMARY,
    RETRY,
    SHADOW,
    Backend,
    FallbackSpec,
    ModelRoute,
    RoutePlan,
    Target,
    TargetSpec,
)
from servelab.wire.errors import ConfigError

__all__ = ["Router"]

_EMPTY: Mapping[str, Any] = MappingProxyType({})


# ---------------------------------------------------------------- router
@dataclass
class _Group:
    key: tuple[str, str]
    weight: float
    specs: list[TargetSpec]


class Router:
    """Routing table built from plain descriptors. Raises :class:`~servelab.wire.errors.ConfigError` (a
    ``ValueError``) naming the bad entry: duplicate backend, unknown backend/model in a target, fallback
    or task, negative weight, a model whose weights are all 0, ``balance_factor`` < 1.

    ``tasks``: task tag -> public model. ``breakers``: shared :class:`BreakerBoard` (default: a private
    one). ``load``: shared :class:`LoadTracker`. ``affinity_chars``: default prefix length for affinity
    (0 = off). ``balance_factor``: c >= 1 of the bounded-load rule (1.25 = at most ~25 % above the mean).
    ``seed``: seeds the draws made for requests without an id (tests). ``picker``: a
    :class:`servelab.gateway.picker.Picker` that orders the replicas of a group (module doc, step 8).
    """

    def __init__(
        self,
        backends: Sequence[Backend],
        models: Sequence[ModelRoute],
        tasks: Mapping[str, str] | None = None,
        breakers: BreakerBoard | None = None,
        load: LoadTracker | None = None,
        affinity_chars: int = 0,
        balance_factor: float = 1.25,
        max_fallback_depth: int = 3,
        seed: int | None = None,
        picker: Any = None,
    ) -> None:
        self.backends: dict[str, Backend] = {}
        for b in backends:
            if b.name in self.backends:
                raise ConfigError(f"backends: name {b.name!r} appears twice; give each backend its own name")
            if b.max_in_flight < 0:
                raise ConfigError(f"backends.{b.name}.max_in_flight {b.max_in_flight} must be >= 0 (0 = no limit)")
            self.backends[b.name] = b
        self.models: dict[str, ModelRoute] = {}
        for m in models:
            if m.name in self.models:
                raise ConfigError(f"models: {m.name!r} appears twice")
            if not m.targets:
                raise ConfigError(f"models.{m.name}.targets is empty; list at least one backend")
            for t in m.targets:
                self._check_target(f"models.{m.name}.targets", t.backend, t.model)
                if t.weight < 0 or not math.isfinite(t.weight):
                    raise ConfigError(f"models.{m.name}.targets: weight {t.weight} of {t.backend} must be >= 0")
            if sum(t.weight for t in m.targets) <= 0:
                raise ConfigError(f"models.{m.name}.targets: all weights are 0; give one a weight > 0")
            if m.shadow is not None:
                self._check_target(f"models.{m.name}.shadow", m.shadow.backend, m.shadow.model)
                if not 0 <= m.shadow.sample_rate <= 1:
                    raise ConfigError(f"models.{m.name}.shadow.sample_rate {m.shadow.sample_rate} must be in [0, 1]")
            self.models[m.name] = m
        for m in self.models.values():
            for f in m.fallback:
                if f.model not in self.models:
                    raise ConfigError(
                        f"models.{m.name}.fallback: unknown model {f.model!r}; known: {', '.join(sorted(self.models))}"
                    )
                if f.max_tokens is not None and f.max_tokens < 1:
                    raise ConfigError(f"models.{m.name}.fallback.max_tokens {f.max_tokens} must be >= 1")
        self.tasks = dict(tasks or {})
        for tag, model in self.tasks.items():
            if model not in self.models:
                raise ConfigError(
                    f"routing.tasks.{tag}: unknown model {model!r}; known: {', '.join(sorted(self.models))}"
                )
        if balance_factor < 1:
            raise ConfigError(f"routing.balance_factor {balance_factor} must be >= 1")
        if affinity_chars < 0:
            raise ConfigError(f"routing.affinity_chars {affinity_chars} must be >= 0 (0 = off)")
        self.breakers = breakers if breakers is not None else BreakerBoard()
        self.load = load if load is not None else LoadTracker()
        self.affinity_chars = affinity_chars
        self.balance_factor = balance_factor
        self.max_fallback_depth = max_fallback_depth
        self._rng = random.Random(seed)
        self.picker = picker if picker is not None and picker.active else None
        # the picker's context and first decision of the plan() being built (plan() never awaits)
        self._pick_ctx: Any = None
        self._pick: Any = None
        self._groups: dict[str, list[_Group]] = {name: self._build_groups(m) for name, m in self.models.items()}

    def _check_target(self, where: str, backend: str, model: str) -> None:
        b = self.backends.get(backend)
        if b is None:
            raise ConfigError(
                f"{where}: unknown backend {backend!r}; known: {', '.join(sorted(self.backends)) or 'none'}"
            )
        if b.models and model not in b.models:
            raise ConfigError(
                f"{where}: backend {backend!r} does not list model {model!r} "
                f"(its models: {', '.join(b.models)}); add it to backends.{backend}.models"
            )

    def _build_groups(self, m: ModelRoute) -> list[_Group]:
        groups: dict[tuple[str, str], _Group] = {}
        for t in m.targets:
            key = (self.backends[t.backend].pool, t.model)
            g = groups.setdefault(key, _Group(key, 0.0, []))
            g.weight += t.weight
            g.specs.append(t)
        # stable order: the same in every process, whatever the config's listing order of equal groups
        return sorted(groups.values(), key=lambda g: g.key)

    # -- public queries
    def resolve_model(self, public_model: str | None, task_tag: str | None = None) -> str:
        """The public model that serves a request: ``tasks[task_tag]`` when the request names no model
        (None, "" or ``"auto"``) and the tag is known, else ``public_model`` ("" if None). Check
        permissions on this name."""
        if (not public_model or public_model == "auto") and task_tag and task_tag in self.tasks:
            return self.tasks[task_tag]
        return public_model or ""

    def backend(self, name: str) -> Backend:
        """The backend descriptor ``name`` (KeyError if unknown)."""
        return self.backends[name]

    def available(self, backend: str) -> bool:
        """Backend known, its breaker admits traffic and it is below ``max_in_flight``."""
        b = self.backends.get(backend)
        if b is None:
            return False
        if b.max_in_flight and self.load.outstanding(backend) >= b.max_in_flight:
            return False
        return self.breakers.get(backend).available()

    # -- planning
    def plan(
        self,
        public_model: str | None,
        body: Mapping[str, Any] | None = None,
        task_tag: str | None = None,
        prompt_prefix: str = "",
        request_id: str | None = None,
        *,
        may_use: Callable[[str], bool] | None = None,
        pools: Collection[str] | None = None,
    ) -> RoutePlan:
        """Route one request. ``body``: the client's JSON body (reads ``max_tokens``/``max_completion_tokens``
        to apply fallback caps). ``prompt_prefix``: text for prefix affinity (see :func:`affinity_text`).
        ``request_id``: makes the weighted split and shadow sampling deterministic; the server passes a
        value the client cannot choose (None = random draws, or an HMAC session key, see
        :class:`~servelab.gateway.config.RoutingSection`).

        Permissions: ``may_use(public_model)`` is asked for every other public model the request can reach
        (each fallback step, at any depth; the requested one was checked by the caller): a step it refuses
        is left out (its own chain is still walked, each model checked) and named in
        :attr:`RoutePlan.denied`. ``pools``: backend pools the caller may use (None = any): targets and the
        shadow outside them are left out.

        Raises :class:`~servelab.gateway.errors.GatewayError` 404 ``model_not_found`` for an unknown
        model, 503 ``model_busy`` (with ``retry_after_s``) when every candidate is at ``max_in_flight``
        or unavailable and no fallback is available either.
        """
        body = body or {}
        name = self.resolve_model(public_model, task_tag)
        task = task_tag if name != (public_model or "") else None
        route = self.models.get(name)
        if route is None:
            raise GatewayError(
                404,
                f"the model '{echo(public_model)}' does not exist; GET /v1/models lists the models you can use",
                code="model_not_found",
                param="model",
            )
        u = stable_unit(request_id, "split") if request_id else self._rng.random()
        tie = request_id if request_id else f"{self._rng.random():.17f}"
        chars = self.affinity_chars if route.affinity_chars is None else route.affinity_chars
        prefix = prompt_prefix[:chars] if chars > 0 else ""
        in_pools = (lambda b: True) if pools is None else (lambda b: self.backends[b].pool in pools)
        self._pick = None
        if self.picker is not None:
            s = self.picker.settings
            self._pick_ctx = self.picker.context(affinity_text(body, s.block_chars * s.max_blocks), request_id, tie)
        own = [t for t in self._model_targets(name, u, tie, prefix, PRIMARY, _EMPTY) if in_pools(t.backend)]
        targets = list(own)
        seen = {(t.backend, t.upstream_model) for t in targets}
        denied: list[str] = []
        for t in self._fallbacks(route, body, {name}, 1, u, tie, prefix, _EMPTY, may_use, denied):
            if (t.backend, t.upstream_model) not in seen and in_pools(t.backend):  # not already a retry
                targets.append(t)
                seen.add((t.backend, t.upstream_model))
        pick, self._pick = self._pick, None
        ctx, self._pick_ctx = self._pick_ctx, None
        if not targets:
            raise self._unavailable(name)
        if pick is not None and (not own or pick.chosen != own[0].backend):
            pick = None  # the picker ordered a fallback group only: the plan's primary was not its choice
        if pick is not None and self.picker is not None:
            self.picker.commit(pick, own[0].backend, ctx)
        shadow = None
        if route.shadow is not None and route.shadow.sample_rate > 0:
            v = stable_unit(request_id, "shadow") if request_id else self._rng.random()
            if v < route.shadow.sample_rate and self.available(route.shadow.backend) and in_pools(route.shadow.backend):
                shadow = self._target(route.shadow.backend, route.shadow.model, name, SHADOW, _EMPTY)
        return RoutePlan(
            public_model=name,
            targets=tuple(targets),
            shadow=shadow,
            task=task,
            degraded=not own,
            affinity=hashlib.blake2b(prefix.encode(), digest_size=8).hexdigest() if prefix else None,
            denied=tuple(denied),
            pick=pick.record() if pick is not None else None,
            why=f"picker {pick.policy}: {pick.how}" if pick is not None else None,
        )

    def _target(self, backend: str, model: str, public: str, role: str, overrides: Mapping[str, Any]) -> Target:
        b = self.backends[backend]
        return Target(backend, model, public, b.base_url, b.kind, role, overrides)

    def _model_targets(
        self, name: str, u: float, tie: str, prefix: str, role: str, overrides: Mapping[str, Any]
    ) -> list[Target]:
        groups = self._groups[name]
        total = sum(g.weight for g in groups)
        chosen = groups[-1]
        acc = 0.0
        for g in groups:
            acc += g.weight
            if g.weight > 0 and u * total < acc:
                chosen = g
                break
        order = [chosen] + sorted((g for g in groups if g is not chosen), key=lambda g: (-g.weight, g.key))
        out: list[Target] = []
        used: set[str] = set()
        for g in order:
            for spec in self._order_replicas(g, tie, prefix):
                if spec.backend in used:
                    continue
                used.add(spec.backend)
                r = role if role != PRIMARY else (PRIMARY if not out else RETRY)
                out.append(self._target(spec.backend, spec.model, name, r, overrides))
        return out

    def _order_replicas(self, g: _Group, tie: str, prefix: str) -> list[TargetSpec]:
        specs = [s for s in g.specs if self.available(s.backend)]
        if len(specs) <= 1:
            return specs
        load = {s.backend: self.load.outstanding(s.backend) for s in specs}
        if self.picker is not None and self._pick_ctx is not None:
            by_name = {s.backend: s for s in specs}
            names, pick = self.picker.order(
                list(by_name),
                {s.backend: s.weight for s in specs},
                load,
                {n: self.backends[n].max_in_flight for n in by_name},
                self._pick_ctx,
            )
            if self._pick is None:
                self._pick = pick
            return [by_name[n] for n in names]
        if prefix:
            by_name = {s.backend: s for s in specs}
            ranked = [by_name[n] for n in hrw_order(prefix, by_name)]
            cap = math.ceil(self.balance_factor * (sum(load.values()) + 1) / len(specs))
            live = [s for s in ranked if s.weight > 0] or ranked
            first = next((s for s in live if load[s.backend] + 1 <= cap), live[0])
            return [first] + [s for s in ranked if s is not first]
        caps = [self.backends[s.backend].max_in_flight for s in specs]
        relative = all(c > 0 for c in caps)
        tie_rank = {n: i for i, n in enumerate(hrw_order(tie, [s.backend for s in specs]))}

        def key(s: TargetSpec) -> tuple[bool, float, int]:  # weight-0 replicas are standby: last
            n = load[s.backend]
            return (
                s.weight <= 0,
                n / self.backends[s.backend].max_in_flight if relative else float(n),
                tie_rank[s.backend],
            )

        return sorted(specs, key=key)

    def _fallbacks(
        self,
        route: ModelRoute,
        body: Mapping[str, Any],
        visited: set[str],
        depth: int,
        u: float,
        tie: str,
        prefix: str,
        inherited: Mapping[str, Any],
        may_use: Callable[[str], bool] | None = None,
        denied: list[str] | None = None,
    ) -> list[Target]:
        if depth > self.max_fallback_depth:
            return []
        out: list[Target] = []
        for f in route.fallback:
            if f.model in visited:
                continue
            overrides = self._degrade(body, f, inherited)
            if may_use is None or may_use(f.model):
                out.extend(self._model_targets(f.model, u, tie, prefix, FALLBACK, overrides))
            elif denied is not None and f.model not in denied:
                denied.append(f.model)
            out.extend(
                self._fallbacks(
                    self.models[f.model],
                    body,
                    visited | {f.model},
                    depth + 1,
                    u,
                    tie,
                    prefix,
                    overrides,
                    may_use,
                    denied,
                )
            )
        return out

    @staticmethod
    def _degrade(body: Mapping[str, Any], f: FallbackSpec, inherited: Mapping[str, Any]) -> Mapping[str, Any]:
        o = dict(inherited)
        o.update(f.params)
        if f.max_tokens is not None:
            for k in ("max_tokens", "max_completion_tokens"):
                cur = o.get(k, body.get(k))
                if isinstance(cur, int) and not isinstance(cur, bool):
                    o[k] = min(cur, f.max_tokens)
            if "max_tokens" not in o and "max_completion_tokens" not in o:
                o["max_tokens"] = f.max_tokens
        return MappingProxyType(o)

    def _unavailable(self, name: str) -> GatewayError:
        names = {t.backend for t in self.models[name].targets}
        opens = [self.breakers.get(n).open_remaining_s for n in names if self.breakers.get(n).state == "open"]
        wait = min(opens) if opens and len(opens) == len(names) else 1.0
        wait = max(1.0, wait)
        return GatewayError(
            503,
            f"the model is busy or temporarily unavailable, retry in {math.ceil(wait)} s",
            type="server_error",
            code="model_busy",
            retry_after_s=wait,
        )

    # -- outstanding accounting
    def acquire(self, target: Target) -> Lease | None:
        """Take a slot on ``target``'s backend for one attempt: None when it is at ``max_in_flight`` or its
        breaker refuses (open, or half-open with every probe slot taken). Release the :class:`Lease`."""
        b = self.backends.get(target.backend)
        if b is None:
            return None
        if b.max_in_flight and self.load.outstanding(b.name) >= b.max_in_flight:
            return None
        br = self.breakers.get(b.name)
        if not br.allow():
            return None
        self.load._inc(b.name)
        return Lease(target, self.load, br)

    def release(self, lease: Lease, outcome: str = "success") -> None:
        """Same as ``lease.release(outcome)``."""
        lease.release(outcome)
