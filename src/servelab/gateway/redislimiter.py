"""Limits shared by every gateway replica through Redis (:class:`RedisLimiter`: one Lua script per admit and
settle, Redis' clock), and the Redis client the gateway's shared state uses (:func:`redis_client`, a pool sized
by :func:`redis_pool_size`); the algorithm and the connection behaviour are described in
:mod:`servelab.gateway.limits`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from servelab.gateway.errors import GatewayError
from servelab.gateway.limitcore import (
    MINUTE_S,
    Admission,
    Limits,
    _begin_settle,
    _budget_scopes,
    _check_args,
    _fields,
    _reject,
)

log = logging.getLogger("servelab.gateway.limits")

# KEYS[1]: a budget counter. ARGV[1]: tokens. Raises the counter to ARGV[1] (never lowers it).
_SEED_LUA = """
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local seed = tonumber(ARGV[1])
if seed > cur then redis.call('SET', KEYS[1], seed) end
return math.max(cur, seed)
"""

# KEYS per scope (5): rpm log, tpm log, tpm sum, concurrency leases, budget counter; then the admission's
# marker (KEYS[n * 5 + 1]: set when admitted, so a retried admit of the same uid returns the first result
# and reserves nothing twice); then optionally the tenant's "seeded" marker (KEYS[n * 5 + 2]): when given
# and absent, nothing is admitted ('unseeded').
# ARGV: uid, reserve, window_us, lease_us, nscopes, then per scope: rpm, tpm, conc, budget (-1 = none).
# Returns {1, now_us} when admitted, {0, scope_index, kind, used, wait_us, now_us} when rejected.
_ADMIT_LUA = """
local uid, reserve = ARGV[1], tonumber(ARGV[2])
local window, lease, n = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local done = redis.call('GET', KEYS[n * 5 + 1])
if done then return {1, tonumber(done)} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cutoff = now - window
local marker = KEYS[n * 5 + 2]
if marker and redis.call('EXISTS', marker) == 0 then return {0, 0, 'unseeded', 0, -1, now} end
local function tokens(member) return tonumber(string.match(member, ':(%d+)$')) end
for i = 0, n - 1 do
  local k, a = i * 5, 6 + i * 4
  local rpm, tpm = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local conc, budget = tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if rpm >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 1], '-inf', cutoff)
    local count = redis.call('ZCARD', KEYS[k + 1])
    if count >= rpm then
      local wait = -1
      if count > 0 then wait = tonumber(redis.call('ZRANGE', KEYS[k + 1], 0, 0, 'WITHSCORES')[2]) + window - now end
      return {0, i, 'rpm', count, wait, now}
    end
  end
  if tpm >= 0 then
    local old = redis.call('ZRANGEBYSCORE', KEYS[k + 2], '-inf', cutoff)
    if #old > 0 then
      local freed = 0
      for _, m in ipairs(old) do freed = freed + tokens(m) end
      redis.call('DECRBY', KEYS[k + 3], freed)
      redis.call('ZREMRANGEBYSCORE', KEYS[k + 2], '-inf', cutoff)
    end
    if redis.call('ZCARD', KEYS[k + 2]) == 0 then redis.call('DEL', KEYS[k + 3]) end
    local used = tonumber(redis.call('GET', KEYS[k + 3]) or '0')
    if used + reserve > tpm then
      if reserve > tpm then return {0, i, 'tpm_too_large', used, -1, now} end
      local need, acc, wait = used + reserve - tpm, 0, window
      local entries = redis.call('ZRANGE', KEYS[k + 2], 0, -1, 'WITHSCORES')
      for j = 1, #entries, 2 do
        acc = acc + tokens(entries[j])
        if acc >= need then wait = tonumber(entries[j + 1]) + window - now; break end
      end
      return {0, i, 'tpm', used, wait, now}
    end
  end
  if conc >= 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 4], '-inf', now)
    local c = redis.call('ZCARD', KEYS[k + 4])
    if c >= conc then return {0, i, 'concurrency', c, 1000000, now} end
  end
  if budget >= 0 then
    local spent = tonumber(redis.call('GET', KEYS[k + 5]) or '0')
    if spent + reserve > budget then return {0, i, 'budget', spent, -1, now} end
  end
end
local ttl_ms = math.ceil(window / 1000) + 1000
for i = 0, n - 1 do
  local k, a = i * 5, 6 + i * 4
  if tonumber(ARGV[a]) >= 0 then
    redis.call('ZADD', KEYS[k + 1], now, uid)
    redis.call('PEXPIRE', KEYS[k + 1], ttl_ms)
  end
  if tonumber(ARGV[a + 1]) >= 0 then
    redis.call('ZADD', KEYS[k + 2], now, uid .. ':' .. ARGV[2])
    redis.call('INCRBY', KEYS[k + 3], reserve)
    redis.call('PEXPIRE', KEYS[k + 2], ttl_ms)
    redis.call('PEXPIRE', KEYS[k + 3], ttl_ms)
  end
  if tonumber(ARGV[a + 2]) >= 0 then
    redis.call('ZADD', KEYS[k + 4], now + lease, uid)
    redis.call('PEXPIRE', KEYS[k + 4], math.ceil(lease / 1000) + 1000)
  end
  if tonumber(ARGV[a + 3]) >= 0 then redis.call('INCRBY', KEYS[k + 5], reserve) end
end
redis.call('SET', KEYS[n * 5 + 1], now, 'PX', math.ceil((lease + window) / 1000) + 3600000)
return {1, now}
"""

# KEYS as in admit, with the admission's marker (no seeded marker). ARGV: uid, reserved, used, window_us,
# nscopes, then per scope: tpm_on, conc_on, budget_on. Returns now_us. Deleting the marker is the settle's
# claim: a second run (a retry after a lost reply) or a settle of an admission Redis no longer knows
# (restarted empty, marker expired) changes nothing.
_SETTLE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local uid, reserved, used = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local window, n = tonumber(ARGV[4]), tonumber(ARGV[5])
if redis.call('DEL', KEYS[n * 5 + 1]) == 0 then return now end
local ttl_ms = math.ceil(window / 1000) + 1000
for i = 0, n - 1 do
  local k, a = i * 5, 6 + i * 3
  if ARGV[a] == '1' then
    local old = uid .. ':' .. ARGV[2]
    local score = redis.call('ZSCORE', KEYS[k + 2], old)
    if score then
      redis.call('ZREM', KEYS[k + 2], old)
      redis.call('ZADD', KEYS[k + 2], score, uid .. ':' .. ARGV[3])
      redis.call('INCRBY', KEYS[k + 3], used - reserved)
      redis.call('PEXPIRE', KEYS[k + 2], ttl_ms)
      redis.call('PEXPIRE', KEYS[k + 3], ttl_ms)
    end
  end
  if ARGV[a + 1] == '1' then redis.call('ZREM', KEYS[k + 4], uid) end
  if ARGV[a + 2] == '1' then redis.call('INCRBY', KEYS[k + 5], used - reserved) end
end
return now
"""


def _tag(s: str) -> str:
    """A name safe inside a Redis Cluster hash tag (no braces)."""
    return s.replace("%", "%25").replace("{", "%7B").replace("}", "%7D")


#: fewest and most connections of the limiter's Redis pool in one process (:func:`redis_pool_size`)
POOL_MIN, POOL_MAX = 4, 32
#: API connections per pooled Redis connection when the pool is sized from the connection cap: a script
#: takes well under a millisecond, so one connection serves many requests in flight
POOL_SHARE = 16


def redis_pool_size(max_connections: int, configured: int | None = None) -> int:
    """Connections of one process's limiter pool: ``configured`` (``state.redis_max_connections``) when
    given, else ``max_connections // 16`` (``max_connections``: the API port's connection cap) within
    [4, 32]. 32 stay inside the 64 descriptors :data:`servelab.gateway.fdbudget.FD_RESERVE` keeps back for
    everything that is not a client connection. Example: ``ulimit -n 1024`` -> cap 464 -> 29."""
    if configured is not None:
        return max(1, int(configured))
    return max(POOL_MIN, min(POOL_MAX, int(max_connections) // POOL_SHARE))


def redis_client(
    url: str,
    max_connections: int = POOL_MAX,
    pool_timeout_s: float = 5.0,
    socket_timeout_s: float = 2.0,
    health_check_interval_s: int = 15,
    retries: int = 3,
) -> Any:
    """A ``redis.asyncio.Redis`` on its own ``BlockingConnectionPool`` (closed with the client).

    ``max_connections``: connections of the pool; a command that finds them all busy waits for one up to
    ``pool_timeout_s`` seconds (then ``redis.ConnectionError("No connection available.")``) instead of
    failing at once. ``socket_timeout_s``: longest wait for a reply and for a connect, seconds.
    ``health_check_interval_s``: a connection idle longer than this many seconds is checked with PING
    before use. ``retries``: a command that fails with ``ConnectionError`` or ``TimeoutError`` (a stale
    pooled connection after a Redis restart, a dropped connection) is sent again on a fresh connection up
    to this many times, 10 ms to 0.5 s apart (jittered exponential backoff). redis-py's ``from_url``
    alone gives a pool that fails past 100 connections and connections that never retry."""
    from redis.asyncio import BlockingConnectionPool, Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff

    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=socket_timeout_s,
        socket_keepalive=True,
        health_check_interval=health_check_interval_s,
        retry=Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), retries),
    )
    return Redis.from_pool(pool)


class RedisLimiter:
    """Limits shared by every gateway replica through one Redis (>= 6.2; tested with 7.0).

    ``url``: ``redis://host:port/db``. Each :meth:`admit` is one ``EVALSHA`` that reads ``TIME``, checks
    every limit of every scope and reserves in all of them, atomically (Redis runs a script without
    interleaving). All keys of one tenant share the hash tag ``{<prefix>:<tenant>}`` so the script also
    runs on Redis Cluster. Window keys carry a TTL of ``window_s`` + 1 s and lease sets ``lease_s`` + 1 s;
    the budget counter ``<prefix>:{...}:...:budget`` has none (delete it to reset a budget).

    ``lease_s``: a concurrency slot not settled within this time (a replica died mid-request) frees
    itself; set it above the longest request you allow. If Redis is unreachable, :meth:`admit` raises
    ``GatewayError(503, code="limits_unavailable")`` (fail closed: limits are never silently skipped).

    Connections (module doc, :func:`redis_client`): ``max_connections`` pooled connections (default
    :data:`POOL_MAX`; the gateway passes :func:`redis_pool_size` of its connection cap), ``pool_timeout_s``
    longest wait for a free one, ``socket_timeout_s`` longest wait for a reply (seconds). A settle that
    fails is retried in the background, first after 50 ms, then with the wait doubling up to
    ``settle_retry_max_s`` seconds, until it lands; at most ``max_pending_settles`` wait at once (beyond,
    one is given up and its slot frees after ``lease_s``).
    """

    def __init__(
        self,
        url: str,
        window_s: float = MINUTE_S,
        lease_s: float = 900.0,
        prefix: str = "servelab",
        max_connections: int = POOL_MAX,
        pool_timeout_s: float = 5.0,
        socket_timeout_s: float = 2.0,
        settle_retry_max_s: float = 5.0,
        max_pending_settles: int = 100_000,
    ) -> None:
        self.url = url
        self.window_s = window_s
        self.lease_s = lease_s
        self.prefix = prefix
        self.settle_retry_max_s = settle_retry_max_s
        self.max_pending_settles = max_pending_settles
        self._redis = redis_client(
            url, max_connections=max_connections, pool_timeout_s=pool_timeout_s, socket_timeout_s=socket_timeout_s
        )
        self._admit = self._redis.register_script(_ADMIT_LUA)
        self._settle = self._redis.register_script(_SETTLE_LUA)
        self._seed = self._redis.register_script(_SEED_LUA)
        #: ``async () -> {(tenant, key_id): tokens}``: the ledger's budget spend (the gateway sets it to
        #: the ledger's ``budget_spend``); with it, budgeted admits check the tenant's seeded marker
        self.budget_source: Any = None
        self._reseed_lock: Any = None
        #: settles that could not reach Redis yet, by admission uid, oldest first: (admission, used tokens)
        self._pending: dict[str, tuple[Admission, int]] = {}
        self._pending_since = 0.0
        self._retry_task: asyncio.Task[None] | None = None

    @property
    def pending_settles(self) -> int:
        """Settles waiting for Redis (retried in the background until they land)."""
        return len(self._pending)

    def _marker(self, tenant: str) -> str:
        """The tenant's "budgets seeded from the ledger" marker key (same hash tag as its scopes)."""
        return f"{self.prefix}:{{{_tag(tenant)}}}:seeded"

    def _done_key(self, tenant: str, uid: str) -> str:
        """The admission's marker key: set by the admit script, deleted by the settle script (module doc)."""
        return f"{self.prefix}:{{{_tag(tenant)}}}:a:{uid}"

    def _keys(self, kind: str, tenant: str, key_id: str) -> list[str]:
        """The 5 Redis keys of a scope; ``key_id`` is the key id, or the app/model/IP of an extra scope."""
        tail = {"tenant": "t", "key": f"k:{key_id}"}.get(kind) or f"x:{kind}:{_tag(key_id)}"
        base = f"{self.prefix}:{{{_tag(tenant)}}}:" + tail
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:tpm_sum", f"{base}:conc", f"{base}:budget"]

    async def admit(
        self,
        key_id: str,
        tenant: str,
        model: str,
        reserve_tokens: int,
        limits: Limits,
        tenant_limits: Limits | None = None,
        extra: Sequence[tuple[str, str, Limits]] = (),
    ) -> Admission:
        """Admit or raise :class:`LimitExceeded` (429, names the limit; ``retry_after_s`` when waiting
        helps). Unlimited scopes cost no Redis call. ``extra``: (kind, name, limits) scopes of the tenant
        (module doc), checked in the same script."""
        _check_args(reserve_tokens)
        scopes: list[tuple[str, Limits, str]] = []
        if not limits.unlimited:
            scopes.append(("key", limits, key_id))
        if tenant_limits is not None and not tenant_limits.unlimited:
            scopes.append(("tenant", tenant_limits, ""))
        scopes += [(kind, lim, name) for kind, name, lim in extra if not lim.unlimited]
        if not scopes:
            return Admission(key_id, tenant, model, reserve_tokens, time.time())
        keys: list[str] = []
        argv: list[Any] = [None, reserve_tokens, int(self.window_s * 1e6), int(self.lease_s * 1e6), len(scopes)]
        for kind, lim, name in scopes:
            keys += self._keys(kind, tenant, name)
            argv += [-1 if v is None else v for v in _fields(lim)]
        adm = Admission(key_id, tenant, model, reserve_tokens, 0.0)
        argv[0] = adm.uid
        keys.append(self._done_key(tenant, adm.uid))
        budgeted = self.budget_source is not None and any(lim.token_budget is not None for _, lim, _ in scopes)
        unavailable = GatewayError(
            503,
            "the service cannot check usage limits right now; retry in a few seconds",
            type="server_error",
            code="limits_unavailable",
            retry_after_s=2.0,
        )
        try:
            res = await self._admit(keys=keys + [self._marker(tenant)] if budgeted else keys, args=argv)
            if int(res[0]) == 0 and _s(res[2]) == "unseeded":
                await self._reseed(tenant)
                res = await self._admit(keys=keys + [self._marker(tenant)], args=argv)
                if int(res[0]) == 0 and _s(res[2]) == "unseeded":
                    raise RuntimeError("budget counters could not be seeded from the ledger")
        except Exception as e:  # noqa: BLE001 — redis.exceptions.RedisError, OSError: no limiter -> no admission
            log.error("limits: Redis at %s failed on admit: %s", safe_url(self.url), e)
            raise unavailable from None
        if int(res[0]) == 0:
            i, kind, used, wait_us = int(res[1]), _s(res[2]), int(res[3]), float(res[4])
            scope_kind, lim, name = scopes[i]
            limit = {
                "rpm": lim.rpm,
                "tpm": lim.tpm,
                "tpm_too_large": lim.tpm,
                "concurrency": lim.max_concurrency,
                "budget": lim.token_budget,
            }[kind]
            raise _reject(
                kind,
                scope_kind,
                tenant,
                int(limit or 0),
                used,
                reserve_tokens,
                max(wait_us, 1000.0) / 1e6 if wait_us >= 0 else None,
                name,
            )
        adm.admitted_ts = int(res[1]) / 1e6
        adm._scopes = (
            keys,
            tuple(
                (lim.tpm is not None, lim.max_concurrency is not None, lim.token_budget is not None)
                for _, lim, _ in scopes
            ),
        )
        return adm

    async def settle(self, admission: Admission, used_tokens: int) -> float:
        """Release concurrency, correct TPM and budget from reserved to ``used_tokens`` (one EVALSHA).
        Returns the settle time in epoch seconds (Redis clock; this host's clock when Redis did not
        answer). Raises ``RuntimeError`` on a second settle. A Redis failure is logged, not raised: the
        settle is then retried in the background until it lands (:attr:`pending_settles`)."""
        _begin_settle(admission, used_tokens)
        if not admission._scopes:
            return time.time()
        try:
            return await self._settle_once(admission, used_tokens)
        except Exception as e:  # noqa: BLE001 — redis.exceptions.RedisError, OSError: keep it and retry
            self._defer(admission, used_tokens, e)
            return time.time()

    async def _settle_once(self, admission: Admission, used_tokens: int) -> float:
        """Run the settle script once for ``admission`` (idempotent: a second run changes nothing).
        Returns the Redis time in epoch seconds; raises what redis-py raises."""
        keys, flags = admission._scopes
        argv: list[Any] = [admission.uid, admission.reserved_tokens, used_tokens, int(self.window_s * 1e6), len(flags)]
        for f in flags:
            argv += ["1" if x else "0" for x in f]
        return int(await self._settle(keys=keys, args=argv)) / 1e6

    def _defer(self, admission: Admission, used_tokens: int, error: BaseException) -> None:
        """Keep a settle that failed for the background retry (bounded by :attr:`max_pending_settles`)."""
        if not self._pending:
            self._pending_since = time.monotonic()
            log.warning(
                "limits: Redis at %s failed on settle of %s (%s); retrying in the background until it lands",
                safe_url(self.url),
                admission.uid,
                error,
            )
        if len(self._pending) >= self.max_pending_settles:
            uid, _ = next(iter(self._pending.items()))
            del self._pending[uid]
            log.error(
                "limits: %d settles wait for Redis at %s; gave up the oldest (%s): its slot frees after lease_s=%s",
                self.max_pending_settles,
                safe_url(self.url),
                uid,
                self.lease_s,
            )
        self._pending[admission.uid] = (admission, used_tokens)
        if self._retry_task is None or self._retry_task.done():
            self._retry_task = asyncio.get_running_loop().create_task(
                self._retry_settles(), name="servelab-settle-retry"
            )

    async def _retry_settles(self) -> None:
        """Send the pending settles again, oldest first, until none is left: 50 ms after a failure, the
        wait doubling up to :attr:`settle_retry_max_s`."""
        wait = 0.05
        while self._pending:
            await asyncio.sleep(wait)
            for uid, (adm, used) in list(self._pending.items()):
                try:
                    await self._settle_once(adm, used)
                except Exception:  # noqa: BLE001 - Redis still away: wait longer, keep the rest
                    wait = min(wait * 2, self.settle_retry_max_s)
                    break
                self._pending.pop(uid, None)
            else:
                wait = 0.05
        log.warning(
            "limits: the settles that waited for Redis at %s have landed (%.1f s after the first failed)",
            safe_url(self.url),
            time.monotonic() - self._pending_since,
        )

    async def seed_budgets(self, spend: Mapping[tuple[str, str], int], tenants: Sequence[str] = ()) -> None:
        """As :meth:`MemoryLimiter.seed_budgets`, on the Redis counters (one script per counter, in one
        pipeline; a counter other replicas already raised above the ledger's sum keeps its value), then
        the seeded marker of every tenant in ``spend`` and ``tenants`` (module doc).
        Raises the Redis error when Redis cannot be reached."""
        pipe = self._redis.pipeline(transaction=False)
        for kind, name, tokens in _budget_scopes(spend):
            tenant, _, key_id = name.partition("\0")
            await self._seed(keys=[self._keys(kind, tenant, key_id)[4]], args=[tokens], client=pipe)
        for tenant in sorted({t for t, _ in spend} | set(tenants)):
            pipe.set(self._marker(tenant), "1")  # after the counters: a replica seeing it sees them seeded
        await pipe.execute()

    async def _reseed(self, tenant: str) -> None:
        """Redis lost the tenant's marker (flushed or restarted empty): seed every budget again from
        :attr:`budget_source` (one at a time; a concurrent admit finds it done). Raises what the ledger or
        Redis raises (the admit then answers 503: fail closed)."""
        if self._reseed_lock is None:
            self._reseed_lock = asyncio.Lock()
        async with self._reseed_lock:
            if await self._redis.exists(self._marker(tenant)):
                return
            spend = await self.budget_source()
            await self.seed_budgets(spend, (tenant,))
            log.warning(
                "limits: Redis at %s had lost the budget counters (flushed or restarted empty); "
                "seeded again from the ledger (%d keys, %d tokens)",
                safe_url(self.url),
                len(spend),
                sum(spend.values()),
            )

    async def close(self, grace_s: float = 2.0) -> None:
        """Give the pending settles up to ``grace_s`` seconds to land (one line names those that did not:
        their slots free after ``lease_s``), then close the Redis connection pool."""
        task, self._retry_task = self._retry_task, None
        if task is not None and not task.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(task), grace_s)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._pending:
            log.error(
                "limits: %d settles could not reach Redis at %s before shutdown; their slots free after lease_s=%s",
                len(self._pending),
                safe_url(self.url),
                self.lease_s,
            )
        await self._redis.aclose()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def safe_url(url: str) -> str:
    """``url`` without its credentials (``redis://:secret@host`` -> ``redis://***@host``; also DSNs)."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return url
