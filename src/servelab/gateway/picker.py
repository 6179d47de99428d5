"""Endpoint picker: which replica of a group serves a request, by a configured policy
(``routing.picker.policy``, :class:`~servelab.gateway.config.PickerSection`). The
:class:`~servelab.gateway.routing.Router` asks :meth:`Picker.order` for the replica order inside the drawn
group; ``default``/``prefix`` leave it to the router's own rule (least outstanding requests, or rendezvous
prefix affinity with bounded loads).

Policies:

- ``round_robin``: replicas in turn (one counter per group, in this process).
- ``least_outstanding``: fewest requests this gateway has in flight there (relative to ``max_in_flight`` when
  every replica has one), ties by a hash of the request key.
- ``power_of_two``: two distinct replicas drawn at random, the less loaded first (Mitzenmacher, "The Power
  of Two Choices in Randomized Load Balancing", IEEE TPDS 12(10), 2001: the maximum load drops from
  Θ(log n / log log n) to Θ(log log n) with two choices). Load = the engine's running + waiting when its
  gauges are fresh, else this gateway's outstanding count.
- ``engine``: every available replica gets a score in [0, 1] from weighted scorers (``routing.picker.weights``,
  a scorer with weight 0 is skipped; the total is the weighted mean over the scorers in use) and the
  highest wins, ties broken by rendezvous hash of the prompt's block chain (same prompt, same replica, on
  every gateway process). The engine's own gauges come from :mod:`servelab.gateway.enginegauges` (scraped
  every ``health.interval_s`` from ``/metrics``; names per engine kind there):

  ============ =====================================================================================
  scorer       score of replica i (higher is better)
  ============ =====================================================================================
  ``queue``    ``1 / (1 + waiting_i)``; ``waiting_i`` = the engine's queue gauge (``vllm:num_requests_waiting``,
               ``sglang:num_queue_reqs``, ``tgi_queue_size``, ``llamacpp:requests_deferred``).
  ``running``  ``1 - min(1, load_i / slots_i)`` when the slots are known (llama.cpp ``total_slots``, else the
               backend's ``max_in_flight``), else ``1 / (1 + load_i)``; ``load_i = max(running_i + waiting_i,
               outstanding_i)``: the engine's gauges are up to one scrape interval old, the gateway's own
               count of requests in flight there is live, the larger is used so requests sent since the
               scrape count.
  ``kv``       ``1 - kv_usage_i`` (``vllm:kv_cache_usage_perc``, ``sglang:token_usage``, 0-1); used only
               when every candidate reports it.
  ``prefix``   ``matched_i / n``: the prompt is cut into ``n`` blocks of ``block_chars`` characters (at most
               ``max_blocks``; a partial last block is not counted, as engines cache only full blocks), each
               block hashed together with all blocks before it (a chain, so block k matches only when blocks
               1..k do); ``matched_i`` = leading blocks found in the index of what this gateway sent to
               replica i (an LRU of ``index_blocks`` block hashes per replica, standing in for the engine's
               prefix cache: approximate, it never sees the engine's evictions).
  ``session``  1 on the rendezvous owner of the session key (``routing.session_header``, HMAC of API key id
               and header value), 0 elsewhere.
  ============ =====================================================================================

  **Load bound** (bounded-load consistent hashing, Mirrokni, Thorup, Zadimoghaddam, SODA 2018,
  https://arxiv.org/abs/1608.01350): a replica whose ``outstanding_i + 1`` exceeds
  ``ceil(balance_factor * (Σ outstanding + 1) / n)`` gets ``prefix`` and ``session`` score 0, so a hot prefix or
  session spills to the next-best replica instead of piling onto one; replicas past the bound are ordered
  after those within it. The bound counts this gateway's own requests in flight (exact and live, as the
  router's prefix affinity does): the engines' gauges lag by up to one scrape interval, and a request that
  ended since the scrape would otherwise count against its replica and push its next turn away.

  **Staleness rule**: the scores are used only when every candidate's gauges were scraped successfully
  within ``stale_after_s`` seconds. Otherwise (never scraped, health checks off, the last page refused as
  larger than the scrape's byte bound, or older than ``stale_after_s``: a ``/metrics`` that fails or times
  out keeps its last good figures until they are that old) the choice falls back to least outstanding
  requests (never blocks, never waits for a scrape) and
  ``servelab_gateway_picker_decisions_total{policy="engine",how="fallback_stale"}`` counts it.

The scorers follow the shape of the Gateway API Inference Extension's endpoint picker and llm-d's inference
scheduler (queue, KV-utilisation and prefix-cache scorers combined by weights, the highest total picked:
https://github.com/kubernetes-sigs/gateway-api-inference-extension, read 2026-12-01); the formulas above are
servelab's own. Each decision is described by :class:`Pick` (``routed`` timeline/access-log ``pick`` event).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from servelab.gateway.hashing import hrw_order, stable_unit

__all__ = [
    "POLICIES",
    "Pick",
    "PickContext",
    "Picker",
    "PickerSettings",
    "PickerState",
    "ScoreWeights",
    "prompt_blocks",
]

#: Every policy name (``default`` = the router's own rule).
POLICIES = ("default", "round_robin", "least_outstanding", "power_of_two", "prefix", "engine")

EngineState = Callable[[str], "dict[str, Any] | None"]


@dataclass(frozen=True)
class ScoreWeights:
    """Weights (>= 0, unitless) of the ``engine`` policy's scorers (module doc)."""

    queue: float = 2.0
    running: float = 1.0
    kv: float = 1.0
    prefix: float = 3.0
    session: float = 2.0


@dataclass(frozen=True)
class PickerSettings:
    """``policy``: one of :data:`POLICIES`; ``weights``; ``stale_after_s``: gauges older than this (seconds)
    are stale; ``block_chars``: prompt characters per prefix block; ``max_blocks``: blocks hashed per prompt;
    ``index_blocks``: block hashes remembered per replica (LRU); ``balance_factor``: c >= 1 of the load bound."""

    policy: str = "default"
    weights: ScoreWeights = field(default_factory=ScoreWeights)
    stale_after_s: float = 3.0
    block_chars: int = 64
    max_blocks: int = 64
    index_blocks: int = 50_000
    balance_factor: float = 1.25

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"routing.picker.policy {self.policy!r} is not one of {', '.join(POLICIES)}")


def prompt_blocks(text: str, block_chars: int, max_blocks: int) -> list[int]:
    """Chained 64-bit blake2b hashes of the full ``block_chars``-character blocks of ``text`` (at most
    ``max_blocks``): hash k covers blocks 1..k, so equal hashes mean equal prefixes."""
    out: list[int] = []
    prev = b""
    for k in range(min(max_blocks, len(text) // block_chars)):
        prev = hashlib.blake2b(prev + text[k * block_chars : (k + 1) * block_chars].encode(), digest_size=8).digest()
        out.append(int.from_bytes(prev, "big"))
    return out


@dataclass(frozen=True)
class PickContext:
    """What one request offers the picker: its prompt ``blocks`` (:func:`prompt_blocks`), ``session`` key
    (None without a session header) and ``tie`` (a per-request key for draws and ties)."""

    blocks: tuple[int, ...] = ()
    session: str | None = None
    tie: str = ""


@dataclass
class Pick:
    """One decision: ``policy``, ``chosen`` backend, ``how`` (``scored``, ``fallback_stale``, ``rotated``,
    ``least_outstanding``, ``two_choices``), ``scores`` per backend (engine policy: each scorer and the
    ``total``; others: the load they compared), ``detail`` (why a fallback)."""

    policy: str
    chosen: str
    how: str
    scores: dict[str, dict[str, float]] = field(default_factory=dict)
    detail: str = ""

    def record(self) -> dict[str, Any]:
        """The ``pick`` event's attributes (timeline, access log)."""
        out: dict[str, Any] = {"policy": self.policy, "chosen": self.chosen, "how": self.how, "scores": self.scores}
        if self.detail:
            out["detail"] = self.detail
        return out


class PickerState:
    """What outlives a config reload: the per-replica prefix index, round-robin counters, the engine gauges
    (``engine_state(backend)`` -> ``{running, waiting, slots, kv_usage, age_s}`` or None,
    :meth:`servelab.gateway.enginegauges.EngineGauges.state`) and the decision counter
    ``servelab_gateway_picker_decisions_total{policy,how}`` (registered in ``registry`` when given)."""

    def __init__(self, engine_state: EngineState | None = None, registry: CollectorRegistry | None = None) -> None:
        self.engine_state = engine_state
        self.index: dict[str, OrderedDict[int, None]] = {}
        self.rr: dict[tuple[str, ...], int] = {}
        self.decisions = Counter(
            "servelab_gateway_picker_decisions_total",
            "Replica choices of the endpoint picker by policy and how the choice was made",
            ("policy", "how"),
            registry=registry if registry is not None else CollectorRegistry(),
        )

    def matched(self, backend: str, blocks: Sequence[int]) -> int:
        """Leading ``blocks`` found in ``backend``'s index (count)."""
        idx = self.index.get(backend)
        if not idx:
            return 0
        n = 0
        for h in blocks:
            if h not in idx:
                break
            n += 1
        return n

    def remember(self, backend: str, blocks: Sequence[int], capacity: int) -> None:
        """``backend`` got a prompt with ``blocks``: they become its most recent entries (LRU, ``capacity``)."""
        if not blocks or capacity <= 0:
            return
        idx = self.index.setdefault(backend, OrderedDict())
        for h in blocks:
            idx[h] = None
            idx.move_to_end(h)
        while len(idx) > capacity:
            idx.popitem(last=False)


class Picker:
    """Orders the available replicas of a group by ``settings.policy`` (module doc). ``state``: the
    :class:`PickerState` kept across reloads."""

    def __init__(self, settings: PickerSettings, state: PickerState) -> None:
        self.settings = settings
        self.state = state

    @property
    def active(self) -> bool:
        """Whether this picker decides (False for ``default``/``prefix``: the router's own rule)."""
        return self.settings.policy not in ("default", "prefix")

    def context(self, text: str, session: str | None, tie: str) -> PickContext:
        """The :class:`PickContext` of a request whose prompt starts with ``text``."""
        s = self.settings
        return PickContext(tuple(prompt_blocks(text, s.block_chars, s.max_blocks)), session, tie)

    def order(
        self,
        names: Sequence[str],
        weights: Mapping[str, float],
        outstanding: Mapping[str, int],
        max_in_flight: Mapping[str, int],
        ctx: PickContext,
    ) -> tuple[list[str], Pick]:
        """The replicas ``names`` (available ones, at least one) in the order to try, and the decision.
        ``weights``: replica weight (0 = standby, tried last); ``outstanding``: this gateway's requests in
        flight per replica; ``max_in_flight``: per replica, 0 = no limit."""
        policy = self.settings.policy
        live = [n for n in names if weights.get(n, 1.0) > 0] or list(names)
        standby = [n for n in names if n not in live]
        if policy == "round_robin":
            key = tuple(sorted(names))
            i = self.state.rr.get(key, 0)
            self.state.rr[key] = i + 1
            k = i % len(live)
            ordered, how = live[k:] + live[:k], "rotated"
            pick = Pick(policy, ordered[0], how, {n: {"in_flight": float(outstanding.get(n, 0))} for n in names})
        elif policy == "power_of_two":
            ordered, pick = self._two_choices(live, outstanding, max_in_flight, ctx)
        elif policy == "engine":
            ordered, pick = self._scored(live, outstanding, max_in_flight, ctx)
        else:
            ordered = self._least(live, outstanding, max_in_flight, ctx)
            pick = Pick(
                policy, ordered[0], "least_outstanding", {n: {"in_flight": float(outstanding.get(n, 0))} for n in names}
            )
        return ordered + standby, pick

    def commit(self, pick: Pick, backend: str, ctx: PickContext) -> None:
        """The plan's primary target is ``backend`` (the group chosen by ``pick``): count the decision and
        remember the prompt's blocks on ``backend`` (the prefix index)."""
        self.state.decisions.labels(pick.policy, pick.how).inc()
        self.state.remember(backend, ctx.blocks, self.settings.index_blocks)

    # -- policies
    @staticmethod
    def _least(
        names: Sequence[str], outstanding: Mapping[str, int], max_in_flight: Mapping[str, int], ctx: PickContext
    ) -> list[str]:
        relative = all(max_in_flight.get(n, 0) > 0 for n in names)
        rank = {n: i for i, n in enumerate(hrw_order(ctx.tie, names))}
        return sorted(
            names,
            key=lambda n: (
                outstanding.get(n, 0) / max_in_flight[n] if relative else float(outstanding.get(n, 0)),
                rank[n],
            ),
        )

    def _fresh(self, names: Sequence[str]) -> tuple[dict[str, dict[str, Any]], str]:
        """The gauges of every replica in ``names`` when all are fresh, else ``({}, why)``."""
        get = self.state.engine_state
        if get is None:
            return {}, "no engine gauges (health checks off)"
        out: dict[str, dict[str, Any]] = {}
        for n in names:
            st = get(n)
            if st is None:
                return {}, f"{n}: no gauges (never scraped, or the last page was refused for size)"
            age = float(st.get("age_s", math.inf))
            if age > self.settings.stale_after_s:
                return {}, f"{n}: gauges {age:.1f} s old > stale_after_s {self.settings.stale_after_s:g}"
            out[n] = st
        return out, ""

    def _load(self, n: str, st: Mapping[str, Any] | None, outstanding: Mapping[str, int]) -> float:
        own = float(outstanding.get(n, 0))
        if st is None:
            return own
        engine = float(st.get("running") or 0.0) + float(st.get("waiting") or 0.0)
        return max(engine, own)

    def _two_choices(
        self, names: Sequence[str], outstanding: Mapping[str, int], max_in_flight: Mapping[str, int], ctx: PickContext
    ) -> tuple[list[str], Pick]:
        gauges, _ = self._fresh(names)
        loads = {n: self._load(n, gauges.get(n), outstanding) for n in names}
        rest = self._least(names, outstanding, max_in_flight, ctx)
        if len(names) < 2:
            return rest, Pick("power_of_two", rest[0], "two_choices", {n: {"load": loads[n]} for n in names})
        i = int(stable_unit(ctx.tie, "p2c-a") * len(names))
        j = int(stable_unit(ctx.tie, "p2c-b") * (len(names) - 1))
        a, b = names[i], [n for n in names if n != names[i]][j]
        first = a if loads[a] <= loads[b] else b
        ordered = [first] + [n for n in rest if n != first]
        return ordered, Pick(
            "power_of_two",
            first,
            "two_choices",
            {n: {"load": loads[n]} for n in (a, b)},
            detail="" if gauges else "loads: gateway in-flight counts (gauges stale or missing)",
        )

    def _scored(
        self, names: Sequence[str], outstanding: Mapping[str, int], max_in_flight: Mapping[str, int], ctx: PickContext
    ) -> tuple[list[str], Pick]:
        gauges, why = self._fresh(names)
        if not gauges:
            ordered = self._least(names, outstanding, max_in_flight, ctx)
            return ordered, Pick(
                "engine",
                ordered[0],
                "fallback_stale",
                {n: {"in_flight": float(outstanding.get(n, 0))} for n in names},
                detail=why,
            )
        w = self.settings.weights
        loads = {n: self._load(n, gauges[n], outstanding) for n in names}
        own = {n: float(outstanding.get(n, 0)) for n in names}
        cap = math.ceil(self.settings.balance_factor * (sum(own.values()) + 1) / len(names))
        use_kv = w.kv > 0 and all(gauges[n].get("kv_usage") is not None for n in names)
        owner = hrw_order(ctx.session, names)[0] if ctx.session and w.session > 0 else None
        nb = len(ctx.blocks)
        scores: dict[str, dict[str, float]] = {}
        over: dict[str, bool] = {}
        for n in names:
            st = gauges[n]
            within = own[n] + 1 <= cap
            over[n] = not within
            slots = st.get("slots") or max_in_flight.get(n, 0)
            parts: dict[str, tuple[float, float]] = {
                "queue": (w.queue, 1.0 / (1.0 + float(st.get("waiting") or 0.0))),
                "running": (w.running, 1.0 - min(1.0, loads[n] / slots) if slots else 1.0 / (1.0 + loads[n])),
            }
            if use_kv:
                parts["kv"] = (w.kv, 1.0 - min(1.0, max(0.0, float(st["kv_usage"]))))
            if nb and w.prefix > 0:
                parts["prefix"] = (w.prefix, self.state.matched(n, ctx.blocks) / nb if within else 0.0)
            if owner is not None:
                parts["session"] = (w.session, 1.0 if n == owner and within else 0.0)
            used = [(wk, s) for wk, s in parts.values() if wk > 0]
            total = sum(wk * s for wk, s in used) / sum(wk for wk, _ in used) if used else 0.0
            scores[n] = {k: round(s, 4) for k, (_, s) in parts.items()}
            scores[n]["load"] = loads[n]
            scores[n]["total"] = round(total, 4)
        key = f"{ctx.blocks[-1]:x}" if ctx.blocks else (ctx.session or ctx.tie)
        rank = {n: i for i, n in enumerate(hrw_order(key, names))}
        ordered = sorted(names, key=lambda n: (over[n], -scores[n]["total"], rank[n]))
        return ordered, Pick("engine", ordered[0], "scored", scores, detail=f"load bound {cap}")
