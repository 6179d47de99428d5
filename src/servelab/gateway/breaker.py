"""Failure handling policy of the gateway: per-backend circuit breakers, a retry budget and backoff.

- :class:`CircuitBreaker`: closed -> open after ``consecutive_failures`` failures in a row, or when the
  error rate over the last ``window_s`` seconds reaches ``error_rate`` with at least ``min_requests``
  requests in that window; open for ``open_s`` seconds; then half-open, letting ``half_open_probes``
  requests through at a time; ``half_open_successes`` successes close it, one failure reopens it.
  A health checker can force it open at once (:meth:`CircuitBreaker.force_open`) and let traffic probe
  it again when the backend answers its readiness check (:meth:`CircuitBreaker.health_up`).
  The states and the consecutive/windowed triggers follow the usual breaker pattern (Nygard, "Release It!",
  2nd ed. 2018, ch. 5) and Envoy's outlier detection ``consecutive_5xx`` + ``failure_percentage``
  with ``failure_percentage_request_volume`` (https://www.envoyproxy.io/docs/envoy/latest/intro/
  arch_overview/upstream/outlier, checked 2026-11-30).
- :class:`BreakerBoard`: one breaker per backend name, kept across config reloads, optionally sharing
  the *open* state through Redis so every gateway replica stops sending to a backend that one replica
  saw fail: key ``{prefix}:breaker:{backend}`` written with ``SET ... NX PX open_ms`` (atomic, expires by
  itself, so no clock comparison between hosts), read with one Lua ``PTTL`` script per sync.
- :class:`RetryBudget`: retries allowed while ``retries <= ratio * requests + min_retries`` over a
  sliding ``window_s`` (deposit/withdraw budget of Finagle's ``RetryBudget`` and tower's
  ``retry::budget``; same purpose as Envoy's cluster ``retry_budget`` "limit on concurrent retries in
  relation to the number of active requests"; sources: https://twitter.github.io/finagle/docs/com/
  twitter/finagle/service/RetryBudget$.html, https://docs.rs/tower/latest/tower/retry/budget/
  struct.Budget.html, https://www.envoyproxy.io/docs/envoy/latest/api-v3/config/cluster/v3/
  circuit_breaker.proto, all checked 2026-11-30).
- :func:`backoff_s`: capped exponential backoff with full jitter.

Everything on the request path is synchronous and O(1) (no I/O); the Redis exchange runs in
:meth:`BreakerBoard.sync_once` / a background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "BreakerBoard",
    "BreakerSettings",
    "CircuitBreaker",
    "RetryBudget",
    "backoff_s",
    "CLOSED",
    "OPEN",
    "HALF_OPEN",
]

log = logging.getLogger("servelab.gateway.breaker")

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

#: Buckets per sliding window (error rate and retry budget): resolution is ``window_s / 10``.
_BUCKETS = 10


@dataclass(frozen=True)
class BreakerSettings:
    """Thresholds of one :class:`CircuitBreaker` (same names as the ``breaker:`` block of the config).

    ``consecutive_failures`` (count, >= 1): failures in a row that open the breaker.
    ``error_rate`` (0 < r <= 1): failed share of the requests of the last ``window_s`` seconds that opens
    it, once that window holds at least ``min_requests`` requests. ``open_s``: seconds it stays open
    before probes are let through. ``half_open_probes``: requests allowed in flight while half-open;
    ``half_open_successes``: successes needed to close again. Raises :class:`ValueError` on bad values.
    """

    consecutive_failures: int = 5
    error_rate: float = 0.5
    window_s: float = 10.0
    min_requests: int = 10
    open_s: float = 5.0
    half_open_probes: int = 1
    half_open_successes: int = 1

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError(f"breaker.consecutive_failures {self.consecutive_failures} must be >= 1")
        if not 0 < self.error_rate <= 1:
            raise ValueError(f"breaker.error_rate {self.error_rate} must be in (0, 1]")
        if self.window_s <= 0 or self.open_s <= 0:
            raise ValueError("breaker.window_s and breaker.open_s must be > 0 seconds")
        if self.min_requests < 1 or self.half_open_probes < 1 or self.half_open_successes < 1:
            raise ValueError("breaker.min_requests, half_open_probes and half_open_successes must be >= 1")


class _Window:
    """Counts of two kinds of events over the last ``window_s`` seconds, in ``_BUCKETS`` time buckets."""

    __slots__ = ("_width_s", "_slots", "_a", "_b")

    def __init__(self, window_s: float) -> None:
        self._width_s = window_s / _BUCKETS
        self._slots = [-1] * _BUCKETS  # bucket index (time // width) each slot currently holds
        self._a = [0] * _BUCKETS
        self._b = [0] * _BUCKETS

    def _slot(self, now: float) -> int:
        idx = int(now // self._width_s)
        i = idx % _BUCKETS
        if self._slots[i] != idx:
            self._slots[i] = idx
            self._a[i] = 0
            self._b[i] = 0
        return i

    def add(self, now: float, a: int = 0, b: int = 0) -> None:
        i = self._slot(now)
        self._a[i] += a
        self._b[i] += b

    def totals(self, now: float) -> tuple[int, int]:
        idx = int(now // self._width_s)
        live = [i for i in range(_BUCKETS) if idx - _BUCKETS < self._slots[i] <= idx]
        return sum(self._a[i] for i in live), sum(self._b[i] for i in live)

    def clear(self) -> None:
        self._slots = [-1] * _BUCKETS


class CircuitBreaker:
    """Breaker of one backend. Not thread-safe; meant for one asyncio event loop.

    Use: ``if br.allow(): ...send...; br.on_success() / br.on_failure()``, or ``br.on_neutral()`` when the
    attempt ended without saying anything about the backend (client disconnected, 4xx of the client).
    Every :meth:`allow` that returned True must be followed by exactly one of the three.
    ``clock`` returns seconds (monotonic). ``on_open(name, open_s)`` is called each time it opens.
    """

    def __init__(
        self,
        name: str,
        settings: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_open: Callable[[str, float], None] | None = None,
    ) -> None:
        self.name = name
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._on_open = on_open
        self._state = CLOSED
        self._open_until = 0.0
        self._consecutive = 0
        self._window = _Window(self.settings.window_s)
        self._probes_in_flight = 0
        self._probe_successes = 0
        self.opened_at: float | None = None  #: clock time of the last transition to open
        self.open_reason: str | None = None  #: "consecutive", "error_rate", "probe", "health", "shared"
        self.transitions = 0  #: number of state changes (for metrics/tests)

    # -- state
    @property
    def state(self) -> str:
        """``closed``, ``open`` or ``half_open``; an open breaker whose time is up reads half-open."""
        if self._state == OPEN and self._clock() >= self._open_until:
            self._set(HALF_OPEN)
            self._probes_in_flight = 0
            self._probe_successes = 0
        return self._state

    @property
    def open_remaining_s(self) -> float:
        """Seconds until an open breaker lets probes through (0 when not open)."""
        return max(0.0, self._open_until - self._clock()) if self.state == OPEN else 0.0

    def available(self) -> bool:
        """True if :meth:`allow` would admit a request now (does not take a probe slot)."""
        s = self.state
        return s == CLOSED or (s == HALF_OPEN and self._probes_in_flight < self.settings.half_open_probes)

    def allow(self) -> bool:
        """Admit one request: always when closed, never when open, up to ``half_open_probes`` at a time
        when half-open (the admitted request is a probe)."""
        s = self.state
        if s == CLOSED:
            return True
        if s == HALF_OPEN and self._probes_in_flight < self.settings.half_open_probes:
            self._probes_in_flight += 1
            return True
        return False

    # -- outcomes
    def on_success(self) -> None:
        """The admitted request succeeded (complete answer, or a clean client-side 4xx)."""
        now = self._clock()
        s = self.state
        if s == HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            self._probe_successes += 1
            if self._probe_successes >= self.settings.half_open_successes:
                self._close()
            return
        if s == OPEN:  # admitted before another request opened the breaker: says nothing new
            return
        self._consecutive = 0
        self._window.add(now, a=1)

    def on_failure(self) -> None:
        """The admitted request failed because of the backend (connect error, 5xx, broken stream, timeout)."""
        now = self._clock()
        s = self.state
        if s == HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            self._trip("probe")
            return
        if s == OPEN:  # a request admitted before another one opened the breaker
            return
        self._consecutive += 1
        self._window.add(now, a=1, b=1)
        st = self.settings
        if self._consecutive >= st.consecutive_failures:
            self._trip("consecutive")
            return
        total, failed = self._window.totals(now)
        if total >= st.min_requests and failed >= st.error_rate * total:
            self._trip("error_rate")

    def on_neutral(self) -> None:
        """The admitted request ended without evidence either way: frees a half-open probe slot only."""
        if self._state == HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)

    # -- external signals
    def force_open(self, reason: str = "health", open_s: float | None = None) -> None:
        """Open now for ``open_s`` (default ``settings.open_s``) seconds, or extend an open period."""
        until = self._clock() + (self.settings.open_s if open_s is None else open_s)
        if self._state == OPEN:
            if until > self._open_until:
                self._open_until = until
                if self._on_open is not None and reason != "shared":  # renew the shared state (SET NX)
                    self._on_open(self.name, until - self._clock())
            return
        self._trip(reason, until=until)

    def health_up(self) -> None:
        """The backend passed its readiness check: an open breaker goes half-open at once so real
        traffic can probe it (a closed or half-open one is left alone)."""
        if self._state == OPEN and self.open_reason in ("health", "shared"):
            self._open_until = self._clock()

    def reset(self) -> None:
        """Closed, counters cleared (admin action)."""
        self._close()

    # -- internals
    def _set(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.transitions += 1

    def _close(self) -> None:
        self._set(CLOSED)
        self._consecutive = 0
        self._window.clear()
        self._probes_in_flight = 0
        self._probe_successes = 0
        self.open_reason = None

    def _trip(self, reason: str, until: float | None = None) -> None:
        now = self._clock()
        open_s = self.settings.open_s if until is None else max(0.0, until - now)
        self._set(OPEN)
        self._open_until = now + open_s
        self.opened_at = now
        self.open_reason = reason
        self._consecutive = 0
        self._window.clear()
        self._probes_in_flight = 0
        self._probe_successes = 0
        log.warning("breaker %s open for %.1f s (%s)", self.name, open_s, reason)
        if self._on_open is not None and reason != "shared":
            self._on_open(self.name, open_s)


class BreakerBoard:
    """The breakers of all backends, by backend name; optionally shared through Redis.

    ``redis``: a ``redis.asyncio.Redis`` client (or None: state stays in this process). ``prefix``: key
    prefix. Keep one board for the life of the gateway and hand it to every new :class:`~servelab.gateway.
    routing.Router` built on reload, so breaker state survives a reload. With Redis, call
    :meth:`start` once inside the event loop (a task pulls the shared state every ``sync_interval_s``)
    and :meth:`close` at shutdown; a breaker that opens here is published at once (SET NX PX).
    """

    _PTTL_LUA = "local r = {} for i, k in ipairs(KEYS) do r[i] = redis.call('PTTL', k) end return r"

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        redis: Any = None,
        prefix: str = "servelab:gateway",
        sync_interval_s: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings or BreakerSettings()
        self.redis = redis
        self.prefix = prefix
        self.sync_interval_s = sync_interval_s
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}
        self._pending: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._pttl = redis.register_script(self._PTTL_LUA) if redis is not None else None

    def reconfigure(self, settings: BreakerSettings) -> None:
        """Apply new thresholds (config reload) to every breaker, keeping its state; a changed
        ``window_s`` starts an empty error-rate window."""
        self.settings = settings
        for br in self._breakers.values():
            if br.settings.window_s != settings.window_s:
                br._window = _Window(settings.window_s)
            br.settings = settings

    def get(self, name: str) -> CircuitBreaker:
        """The breaker of backend ``name`` (created closed on first use)."""
        br = self._breakers.get(name)
        if br is None:
            br = CircuitBreaker(
                name, self.settings, self._clock, on_open=self._publish_soon if self.redis is not None else None
            )
            self._breakers[name] = br
        return br

    __getitem__ = get

    def names(self) -> list[str]:
        """Backend names with a breaker."""
        return list(self._breakers)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """``{backend: {"state", "open_remaining_s", "open_reason"}}`` for the admin API and metrics."""
        return {
            n: {"state": b.state, "open_remaining_s": round(b.open_remaining_s, 3), "open_reason": b.open_reason}
            for n, b in self._breakers.items()
        }

    def key(self, name: str) -> str:
        """Redis key holding the shared open state of backend ``name``."""
        return f"{self.prefix}:breaker:{name}"

    # -- Redis sharing
    async def publish_open(self, name: str, open_s: float) -> bool:
        """Write "``name`` is open for ``open_s`` s" for every replica (SET NX PX: the first opener's
        period stands). Returns True if this call set the key. No-op (False) without Redis."""
        if self.redis is None:
            return False
        return bool(await self.redis.set(self.key(name), "1", nx=True, px=max(1, int(open_s * 1000))))

    def _publish_soon(self, name: str, open_s: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        t = loop.create_task(self._publish_logged(name, open_s))
        self._pending.add(t)
        t.add_done_callback(self._pending.discard)

    async def _publish_logged(self, name: str, open_s: float) -> None:
        try:
            await self.publish_open(name, open_s)
        except Exception as e:  # noqa: BLE001 — Redis down must not break routing: the local breaker still works
            log.warning("breaker %s: could not share the open state through Redis: %s", name, e)

    async def sync_once(self, names: Iterable[str] | None = None) -> dict[str, float]:
        """Read the shared open state of ``names`` (default: every known backend) and open the local
        breaker of each backend another replica opened, for the time left there.
        Returns ``{name: remaining_s}`` of the shared-open ones."""
        if self.redis is None or self._pttl is None:
            return {}
        ns = list(self._breakers) if names is None else list(names)
        if not ns:
            return {}
        pttls = await self._pttl(keys=[self.key(n) for n in ns])
        shared: dict[str, float] = {}
        for n, ms in zip(ns, pttls, strict=True):
            ms = int(ms)
            if ms > 0:
                shared[n] = ms / 1000.0
                br = self.get(n)
                if br.state != OPEN:
                    br.force_open("shared", open_s=ms / 1000.0)
        return shared

    async def start(self) -> None:
        """Start the background sync task (only with Redis; idempotent)."""
        if self.redis is None or self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        # one line when the sync starts failing and one when it works again, not one per interval
        failing = False
        while True:
            try:
                await self.sync_once()
                if failing:
                    log.warning("breaker sync through Redis works again")
                    failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — the Redis sync loop outlives any error
                if not failing:
                    log.warning(
                        "breaker sync through Redis failed (local breakers still work; logged again "
                        "only after it recovers): %s",
                        e,
                    )
                    failing = True
            await asyncio.sleep(self.sync_interval_s)

    async def close(self) -> None:
        """Stop the sync task and wait for pending publications."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)


class RetryBudget:
    """Retries allowed as a share of recent requests, so retries cannot multiply load in an outage.

    :meth:`record_request` deposits one request (call it once per client request, not per attempt);
    :meth:`try_retry` withdraws one retry if ``retries_in_window < ratio * requests_in_window +
    min_retries`` over the last ``window_s`` seconds, else returns False. ``ratio`` 0.2 = at most one
    retry per five requests (plus the floor ``min_retries`` per window for quiet periods).
    Sources: Finagle ``RetryBudget(ttl, minRetriesPerSec, percentCanRetry)`` and tower ``Budget(ttl,
    min_per_sec, retry_percent)`` (URLs in the module doc, checked 2026-11-30). Raises
    :class:`ValueError` on negative ``ratio``/``min_retries`` or ``window_s`` <= 0.
    """

    def __init__(
        self,
        ratio: float = 0.2,
        min_retries: int = 3,
        window_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if ratio < 0 or min_retries < 0 or window_s <= 0:
            raise ValueError("retry budget: ratio and min_retries must be >= 0 and window_s > 0")
        self.ratio = ratio
        self.min_retries = min_retries
        self._clock = clock
        self._window = _Window(window_s)  # a = requests, b = retries

    def record_request(self) -> None:
        """Deposit one client request."""
        self._window.add(self._clock(), a=1)

    def try_retry(self) -> bool:
        """Withdraw one retry if the budget allows it (True), else False."""
        now = self._clock()
        requests, retries = self._window.totals(now)
        if retries < self.ratio * requests + self.min_retries:
            self._window.add(now, b=1)
            return True
        return False

    def remaining(self) -> int:
        """Retries the budget would allow right now (count)."""
        requests, retries = self._window.totals(self._clock())
        return max(0, math.ceil(self.ratio * requests + self.min_retries - retries))


def backoff_s(attempt: int, base_s: float = 0.05, cap_s: float = 2.0, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``attempt`` (1 = first retry): full jitter,
    ``uniform(0, min(cap_s, base_s * 2 ** (attempt - 1)))``.

    Full jitter spreads retries of many clients so they do not arrive in lockstep (M. Brooker,
    "Exponential Backoff And Jitter", https://aws.amazon.com/blogs/architecture/exponential-backoff-and-jitter/;
    gRPC A6 ``random(0, min(initialBackoff*backoffMultiplier**(n-1), maxBackoff))``,
    https://github.com/grpc/proposal/blob/master/A6-client-retries.md; both checked 2026-11-30).
    Raises :class:`ValueError` if ``attempt`` < 1 or a duration is negative.
    """
    if attempt < 1 or base_s < 0 or cap_s < 0:
        raise ValueError(f"backoff_s: attempt {attempt} must be >= 1 and durations >= 0")
    ceiling = min(cap_s, base_s * 2.0 ** min(attempt - 1, 60))
    return (rng or random).uniform(0.0, ceiling)
