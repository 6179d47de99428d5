"""The timeline of one gateway request: what happened to it and when, kept compactly in its access-log line
(field ``timeline``) so ``servelab gateway explain REQUEST_ID`` can say where the time went
(:mod:`servelab.gateway.explain`).

Each event is ``[name, ms]`` or ``[name, ms, {attributes}]``; ``ms`` is milliseconds since the request was
received (the gateway's monotonic clock, 0.001 ms resolution). Events, in the order they can occur:

- ``received`` (0);
- ``checked``: authentication, body, model, policy and degrade checks done;
- ``admitted``: the limits let it in (the time since ``checked`` is the limiter's);
- ``refused`` ``{status, code, limit?, scope?, retry_after_s?}``: an admission step or a limit refused it;
- ``routed`` ``{candidates: [[backend, role, in_flight], ...], why}``: the route plan, in order, with the
  requests the gateway had in flight on each backend then; ``why``: how the order was chosen;
- ``skipped`` ``{backend, why}``: a candidate passed over without an attempt (``breaker open``,
  ``saturated``: at ``max_in_flight``);
- ``attempt`` ``{n, backend, role, in_flight, running?, waiting?, slots?}``: attempt ``n`` (1 = first)
  sent; ``in_flight``: other requests the gateway had on that backend; ``running``/``waiting``/``slots``:
  the engine's own gauges at the last scrape when known (:mod:`servelab.gateway.enginegauges`);
- ``connected`` ``{reused}``: the upstream TCP connection is ready (``reused``: a pooled keep-alive one);
- ``headers`` ``{status}``: the engine's response headers arrived;
- ``failed`` ``{n, backend, cause, status?, code?}``: the attempt failed before any byte reached the
  client (``cause``: the HTTP status, ``timeout``, ``connect``, ``stream_error``, ``protocol``...);
- ``first_token``, ``last_token``: the first and last token-carrying chunk written to the client;
- ``engine`` ``{prompt_n, prompt_ms, cache_n, predicted_n, predicted_ms, cached_tokens}``: the engine's
  own account where it gives one: llama.cpp's ``timings`` (prompt tokens evaluated and their ms, tokens
  reused from the prompt cache, tokens generated and their ms) and OpenAI's
  ``usage.prompt_tokens_details.cached_tokens`` (tokens; any engine that sends it);
- ``client_left``: the client went away before the answer ended;
- ``done`` ``{status}``: the access-log line was written.

Recording costs a list append per event (about ten a request), nothing per token; ``connected`` comes from
the upstream session's connector (:class:`TimedConnector`), not from aiohttp's client tracing, whose signals
cost every request about 40 Python calls whether or not anything listens (benches/README.md).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from operator import itemgetter
from typing import Any

import aiohttp

__all__ = [
    "CURRENT",
    "ENGINE_FIELDS",
    "TimedConnector",
    "Timeline",
    "attempt_event",
    "engine_account",
    "route_event",
    "skip_reason",
]

_now = time.monotonic_ns
_BY_TIME = itemgetter(1)

#: llama.cpp ``timings`` members kept (tokens and ms; docs/engine-wire.md)
ENGINE_FIELDS = ("prompt_n", "prompt_ms", "cache_n", "predicted_n", "predicted_ms")


def engine_account(ev: dict[str, Any]) -> dict[str, Any] | None:
    """What an engine said about its own work on a request in the answer ``ev`` (a whole JSON body or
    one SSE event): llama.cpp's ``timings`` (:data:`ENGINE_FIELDS`: token counts, ms) and
    ``usage.prompt_tokens_details.cached_tokens`` (tokens). None when it says nothing."""
    out: dict[str, Any] = {}
    timings = ev.get("timings")
    if isinstance(timings, dict):
        for k in ENGINE_FIELDS:
            v = timings.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = round(v, 3) if isinstance(v, float) else v
    usage = ev.get("usage")
    if isinstance(usage, dict):
        details = usage.get("prompt_tokens_details")
        if isinstance(details, dict):
            cached = details.get("cached_tokens")
            if isinstance(cached, int) and not isinstance(cached, bool):
                out["cached_tokens"] = cached
    return out or None


class Timeline:
    """The events of one request (module doc), on the monotonic clock in ns; :meth:`record` makes the
    access log's compact form relative to the request's start."""

    __slots__ = ("events", "engine", "engine_ns")

    def __init__(self) -> None:
        self.events: list[tuple[str, int, dict[str, Any] | None]] = []
        #: the engine's own account (:func:`engine_account`), merged over the events that carried one
        self.engine: dict[str, Any] | None = None
        self.engine_ns = 0

    def mark(self, name: str, attrs: dict[str, Any] | None = None, at_ns: int | None = None) -> None:
        """Record event ``name`` now (or at ``at_ns``, monotonic ns) with optional attributes."""
        self.events.append((name, _now() if at_ns is None else at_ns, attrs))

    def has(self, name: str) -> bool:
        """Whether event ``name`` was recorded."""
        return any(e[0] == name for e in self.events)

    def last_connection_reused(self) -> bool:
        """Whether the latest upstream connection handed out (``connected`` event) was a pooled keep-alive
        one (:class:`TimedConnector`); False when none was handed out yet."""
        for name, _, attrs in reversed(self.events):
            if name == "connected":
                return bool(attrs and attrs.get("reused"))
        return False

    def take_engine(self, ev: dict[str, Any]) -> None:
        """Keep the engine's account carried by ``ev`` (:func:`engine_account`), if any."""
        acc = engine_account(ev)
        if acc is not None:
            self.engine = {**(self.engine or {}), **acc}
            self.engine_ns = _now()

    def refused(self, e: Any) -> None:
        """Record a refusal by admission or a limit (``e``: the :class:`~servelab.gateway.errors.GatewayError`;
        a limit's 429 also names its ``limit`` and ``scope``)."""
        attrs: dict[str, Any] = {"status": e.status, "code": e.code}
        for k in ("limit", "scope", "retry_after_s"):
            v = getattr(e, k, None)
            if v is not None:
                attrs[k] = round(v, 3) if isinstance(v, float) else v
        self.mark("refused", attrs)

    def record(self, t0_ns: int) -> list[list[Any]]:
        """The compact form: ``[[name, ms], [name, ms, attrs], ...]``, ms since ``t0_ns``, in time order
        (the engine's account as one ``engine`` event when its last part arrived)."""
        events = self.events if not self.engine else [*self.events, ("engine", self.engine_ns, self.engine)]
        return [
            ["received", 0.0],
            *(
                [name, round((t - t0_ns) / 1e6, 3), attrs] if attrs else [name, round((t - t0_ns) / 1e6, 3)]
                for name, t, attrs in sorted(events, key=_BY_TIME)
            ),
        ]


def route_event(plan: Any, outstanding: Callable[[str], int]) -> dict[str, Any]:
    """The ``routed`` event of route plan ``plan`` (:class:`~servelab.gateway.routespec.RoutePlan`):
    ``candidates`` ``[[backend, role, requests in flight there], ...]`` in the order they will be tried,
    and ``why`` (how the first was chosen: the plan's own reason when the router gives one, prefix
    affinity, a fallback first because the model had no target, a task route, else the weighted split)."""
    why = getattr(plan, "why", None)
    if not why:
        parts = []
        if plan.task:
            parts.append(f"task {plan.task}")
        if plan.degraded:
            parts.append("no target of the requested model was available: fallback first")
        parts.append(
            "prefix affinity (rendezvous hash of the prompt's start)"
            if plan.affinity
            else "weighted split, then the fewest requests in flight"
        )
        why = "; ".join(parts)
    return {"candidates": [[t.backend, t.role, outstanding(t.backend)] for t in plan.targets], "why": why}


def skip_reason(router: Any, target: Any) -> str:
    """Why ``router`` (:class:`~servelab.gateway.routing.Router`) gave no lease for ``target``: the
    backend is at its ``max_in_flight`` (requests) or its breaker refused."""
    b = router.backends.get(target.backend)
    if b is None:
        return "not configured"
    if b.max_in_flight and router.load.outstanding(b.name) >= b.max_in_flight:
        return f"saturated: {b.max_in_flight} requests in flight (max_in_flight)"
    return f"breaker {router.breakers.get(b.name).state}"


def attempt_event(
    n: int, target: Any, in_flight: int, engine_state: Callable[[str], dict[str, Any] | None] | None
) -> dict[str, Any]:
    """The ``attempt`` event of attempt ``n`` on ``target``: its backend and role, ``in_flight`` (the
    gateway's other requests on that backend) and the engine's gauges at their last scrape
    (``running``/``waiting`` requests, ``slots``, ``kv_usage`` 0-1, ``age_s``) when ``engine_state`` knows them."""
    ev: dict[str, Any] = {"n": n, "backend": target.backend, "role": target.role, "in_flight": max(0, in_flight)}
    state = engine_state(target.backend) if engine_state is not None else None
    if state:
        ev.update(state)
    return ev


#: the timeline of the upstream request being sent in this task (set by the caller around ``session.post``,
#: read by :class:`TimedConnector`); None outside one
CURRENT: ContextVar[Timeline | None] = ContextVar("servelab_gateway_timeline", default=None)


class TimedConnector(aiohttp.TCPConnector):
    """A TCP connector that records ``connected {reused}`` in the :class:`Timeline` of :data:`CURRENT` when it
    hands out a connection (``reused``: a pooled keep-alive one, told by the protocol object seen before).

    It replaces an aiohttp ``TraceConfig`` (https://docs.aiohttp.org/en/stable/tracing_reference.html): any
    trace config makes aiohttp build a trace context and send six signals with a parameters object each on
    every request (request start, connection reuse, headers sent, chunk sent, request end...) whether or not
    anything listens, about 40 Python calls a request; this costs one override and a set lookup."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._seen: weakref.WeakSet[Any] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: Any) -> Any:
        conn = await super().connect(req, traces, timeout)
        tl = CURRENT.get()
        if tl is not None:
            proto = conn.protocol
            reused = proto in self._seen
            if not reused and proto is not None:
                self._seen.add(proto)
            tl.mark("connected", {"reused": reused})
        return conn
