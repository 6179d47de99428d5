"""Per-key and per-tenant limits: requests/minute (RPM), tokens/minute (TPM), concurrency, token budget.

The server calls :meth:`Limiter.admit` after authentication and before routing, and
:meth:`Limiter.settle` exactly once when the request ends (success, error or client disconnect).

Algorithm (both implementations, identical semantics)
-----------------------------------------------------
- **RPM: sliding log.** Every admission is logged with its time; a request is admitted when fewer than
  ``rpm`` admissions lie in the half-open window ``(now - window_s, now]``. This is exact: *for every
  instant t, the admissions with time in (t - window_s, t] number at most rpm* (each admission checked
  the count of exactly that window before adding itself). The cheaper "sliding window counter" (two
  fixed buckets weighted by overlap, https://blog.cloudflare.com/counting-things-a-lot-of-different-things/,
  checked 2026-11-30) assumes uniform arrivals in the previous bucket and can admit up to ~2x rpm in a
  true sliding minute after a burst at a bucket edge; the log costs one entry per request in the window,
  which is bounded by rpm itself (or by the request rate when only TPM is set).
- **TPM: weighted sliding log.** Each admission logs ``reserve_tokens`` (prompt estimate + max_tokens, as
  OpenAI counts against TPM at request time: https://platform.openai.com/docs/guides/rate-limits, checked
  2026-11-30) and a running sum is kept next to the log, so admission is O(expired entries). A request is
  admitted when ``sum_in_window + reserve_tokens <= tpm``. :meth:`settle` rewrites that entry in place
  (same timestamp) from reserved to actual tokens, so the window holds what was really used.
- **Concurrency:** a set of in-flight admissions; with Redis each entry is a lease that expires after
  ``lease_s`` so a crashed gateway replica cannot hold slots forever.
- **Token budget:** a lifetime counter of tokens (reserved while in flight, actual once settled);
  admission needs ``spent + reserve_tokens <= token_budget``. Rejected with 429
  ``insufficient_quota`` (OpenAI's type/code for an exhausted quota, which retrying does not fix).
  The ledger is the durable record of that spend: at start the gateway calls :meth:`seed_budgets` with
  the ledger's sums per key (:meth:`servelab.gateway.ledger.SqliteLedger.budget_spend`), so a budget
  survives a restart, a crash and a Redis without persistence (as LiteLLM keeps spend in its database,
  https://docs.litellm.ai/docs/proxy/db_info, checked 2026-12-01). Seeding never lowers a counter.
  With Redis, seeding also sets a marker per tenant (``<prefix>:{<tenant>}:seeded``, no TTL); the admit
  script refuses a budgeted scope whose tenant has no marker (Redis was flushed, restarted without
  persistence, or the marker evicted), and :class:`RedisLimiter` then seeds again from the ledger
  (:attr:`RedisLimiter.budget_source`) before admitting, so spend the ledger counted is never forgotten.

Time: :class:`RedisLimiter` reads the clock with Redis ``TIME`` inside the script (microseconds), so N
gateway replicas with skewed clocks share one timeline; the invariant above holds on the Redis clock,
with no "+1": the check and the reservation are one script, so no second replica can slip in between.
A client timing requests with its own clock sees the same bound except at the window edges, blurred by
its network round trip to the gateway and the gateway's to Redis. Every admission counts, also one that
later fails upstream or is cancelled (as with OpenAI's limits).
:class:`MemoryLimiter` uses ``time.monotonic()`` of its process (one replica).

Redis connections (:func:`redis_client`): one ``BlockingConnectionPool`` per process, sized from the API
port's connection cap (:func:`redis_pool_size`); a command that finds every connection busy waits for one
up to ``pool_timeout_s`` instead of failing (redis-py's default asyncio pool raises "Too many connections"
past 100, which turned a burst of 400 requests into 300 x 503 with a healthy Redis). A connection that
broke (Redis restarted, a proxy dropped it) is reconnected and the command sent again (redis-py ``Retry``
with jittered exponential backoff on ``ConnectionError``/``TimeoutError``; ``health_check_interval_s``
PINGs a connection idle longer than that before using it): both scripts are idempotent per admission
(an ``<prefix>:{<tenant>}:a:<uid>`` marker set by admit and deleted by settle), so a command retried after a
lost reply never reserves or corrects twice. A settle that still cannot reach Redis is kept and retried
in the background (:attr:`RedisLimiter.pending_settles`) until it lands: a finished request's slot frees
when Redis answers again, never only at ``lease_s``.

Scopes: ``limits`` apply to the key alone; ``tenant_limits`` (optional) to all keys of the tenant together;
``extra`` scopes (``(kind, name, Limits)``, built by :mod:`servelab.gateway.scopes`) to all the tenant's
requests of one application (``app``), one public model (``model``) or one client IP (``ip``). All are
checked and reserved atomically: either every scope admits and reserves, or nothing changes. Every scope
lives inside its tenant's Redis hash tag, so one script still touches one Cluster slot.
"""

from __future__ import annotations

from servelab.gateway.limitcore import MINUTE_S, Admission, Limiter, LimitExceeded, Limits
from servelab.gateway.memlimiter import MemoryLimiter
from servelab.gateway.redislimiter import POOL_MIN, POOL_SHARE, RedisLimiter, redis_client, redis_pool_size, safe_url

__all__ = [
    "MINUTE_S",
    "POOL_MIN",
    "POOL_SHARE",
    "Admission",
    "LimitExceeded",
    "Limiter",
    "Limits",
    "MemoryLimiter",
    "RedisLimiter",
    "redis_client",
    "redis_pool_size",
    "safe_url",
]
