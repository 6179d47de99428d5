"""The gateway file's process sections (servelab.gateway.config): ``server`` (ports, bounds, timeouts,
connection limits, the access log), ``admin``, ``state`` (Redis) and ``ledger`` (SQLite or PostgreSQL, the
write-ahead spool)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from servelab.gateway.confignames import ENV
from servelab.wire.config import FrozenModel

__all__ = ["AdminSection", "LedgerSection", "ServerSection", "StateSection"]


class ServerSection(FrozenModel):
    """Where the gateway listens and the bounds every request must respect.

    ``port``/``admin_port`` 0 pick a free port; ``admin_port`` null runs no admin app. ``max_body_bytes``
    larger bodies get 413. ``max_tokens_limit``: a request asking for more output tokens (``max_tokens`` x
    ``n`` choices, x the prompts of a batched ``/v1/completions``) gets 400; a request that gives no
    ``max_tokens`` is sent with ``default_max_tokens`` (default: ``max_tokens_limit``) divided by its
    sequences, so every request's output is bounded and its token reservation known. Every length field of
    every engine dialect counts, the largest one is the bound, and exactly one bound is forwarded, in the
    field the backend's kind reads (:mod:`servelab.gateway.lengths`); ``engine_length_fields``: ``map``
    (default) or ``refuse`` the engine-specific ones (``n_predict``, ``options.num_predict``, ...).
    ``max_json_depth``: bodies nested deeper get 400 at parse time (orjson refuses to serialise 254 and
    more levels, measured with orjson 3.13 on 2026-12-01, so the forwarding path needs a bound below it;
    JSON-schema tools rarely need 20). ``access_log``: ``-`` = stderr, a
    path = append JSON lines there, null = off. ``shutdown_grace_s``: how long in-flight requests may
    finish on SIGTERM. Host/port changes take effect on restart only (a reload logs that).

    Connections (both ports, :mod:`servelab.gateway.listener`): ``header_timeout_s``, ``body_timeout_s``
    (gap between reads), ``body_total_timeout_s`` and ``keepalive_timeout_s`` close slow or idle clients
    (nginx's are 60/60/-/75 s; shorter here, since API clients send small requests at once);
    ``max_connections`` (API) and ``admin_max_connections`` cap open connections, and
    ``max_connections_per_client`` those of one client address on the API port (default half the API
    cap): at a cap the oldest header-incomplete connection (idle, or its headers still arriving) of the
    address holding the most is closed, else the new one gets a 503 (429 at the address's own cap).
    ``admin_host`` binds the admin API (default loopback). ``public_metrics`` also serves ``/metrics`` on
    the API port (it is always on the admin port, behind the admin token). These take effect on restart.
    """

    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8080, ge=0, le=65535, description="OpenAI API port (0 = free port)")
    admin_port: int | None = Field(8081, ge=0, le=65535, description="admin API port; null = no admin app")
    max_body_bytes: int = Field(1_048_576, ge=1024, description="largest request body, bytes (else 413)")
    max_tokens_limit: int = Field(
        4096,
        ge=1,
        description="largest output a request may ask for: max_tokens x n "
        "(x prompts on /v1/completions), tokens (else 400)",
    )
    default_max_tokens: int | None = Field(None, ge=1, description="max_tokens sent when a request gives none")
    engine_length_fields: Literal["map", "refuse"] = Field(
        "map",
        description="engine-specific length fields (n_predict, max_new_tokens, options.num_predict, ...): "
        "map = count them in the bound and send the backend's own field, refuse = 400",
    )
    max_json_depth: int = Field(
        64, ge=2, le=200, description="deepest nesting of arrays/objects a request body may have (else 400)"
    )
    access_log: str | None = Field("-", description="'-' = stderr, a file path, or null = off")
    shutdown_grace_s: float = Field(10.0, ge=0, description="time in-flight requests get on SIGTERM, s")
    # connection discipline of both ports (servelab.gateway.listener; nginx client_header_timeout,
    # client_body_timeout, keepalive_timeout: https://nginx.org/en/docs/http/ngx_http_core_module.html)
    admin_host: str = Field(
        "127.0.0.1",
        description="address the admin API binds (separate from host, so --host 0.0.0.0 does not expose it)",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=3600,
        description="time from accept (or a request's first "
        "byte on a kept-alive connection) to complete headers, s (else 408/close)",
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="longest gap between two reads of a request body, s (else 408)"
    )
    body_total_timeout_s: float = Field(
        120.0, gt=0, le=3600, description="longest time to receive a whole request body, s (else 408)"
    )
    keepalive_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="idle keep-alive connections are closed after this long, s"
    )
    max_connections: int | None = Field(
        None,
        ge=1,
        description="open client connections on the API port; null = "
        "(RLIMIT_NOFILE - 64 - admin_max_connections) / 2 (one upstream fd each)",
    )
    admin_max_connections: int = Field(32, ge=1, description="open connections on the admin port")
    max_connections_per_client: int | None = Field(
        None,
        ge=1,
        description="open API connections of one client address (the peer, or X-Forwarded-For behind "
        "trusted_proxies); null = half of max_connections. At it, the address's oldest connection still sending "
        "its headers (or idle) is closed, else 429 (nginx limit_conn)",
    )
    public_metrics: bool = Field(
        False,
        description="also serve /metrics on the API port without auth (it names "
        "backends and breaker states); it is always on the admin port, behind the "
        "admin token",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses/CIDRs of proxies in front of "
        "the gateway; only their X-Forwarded-For is read (servelab.gateway.clientip)",
    )
    # request bodies and outputs (break-it report on 4b30bb7, defects 3-5; servelab.gateway.bodies,
    # servelab.gateway.logprobs)
    request_compression: bool = Field(
        False,
        description="accept request bodies with Content-Encoding gzip or "
        "deflate (inflated piece by piece, never past max_body_bytes); false = 415",
    )
    max_top_logprobs: int = Field(
        20,
        ge=0,
        le=1000,
        description="largest top_logprobs (chat) / n_probs a request may ask for (OpenAI: 20), else 400",
    )
    max_logprobs: int = Field(
        5, ge=0, le=1000, description="largest logprobs on /v1/completions (OpenAI's legacy maximum: 5), else 400"
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="a client that reads nothing of its response "
        "for this long is cut and its upstream released, s (nginx send_timeout: 60)",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, v: list[str]) -> list[str]:
        import ipaddress

        for i, net in enumerate(v):
            try:
                ipaddress.ip_network(net, strict=False)
            except ValueError:
                raise ValueError(
                    f"trusted_proxies[{i}] {net!r} is not an IP address or CIDR (e.g. 10.0.0.0/8)"
                ) from None
        return v

    @model_validator(mode="after")
    def _default_le_limit(self) -> ServerSection:
        if self.default_max_tokens is not None and self.default_max_tokens > self.max_tokens_limit:
            raise ValueError(
                f"server.default_max_tokens {self.default_max_tokens} is above max_tokens_limit "
                f"{self.max_tokens_limit}; lower it"
            )
        return self


class AdminSection(FrozenModel):
    """The admin API's credential: a bearer token read from the environment variable ``token_env``, or
    checked against ``token_sha256`` (hex SHA-256 of the token) so the file holds no secret."""

    token_env: str | None = Field("SERVELAB_ADMIN_TOKEN", pattern=ENV, description="env var holding the admin token")
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="hex SHA-256 of the admin token")


class StateSection(FrozenModel):
    """Shared state: ``redis_url`` null keeps limits and breaker state in memory (one replica); a Redis URL
    lets N gateway replicas share one limit per key.

    The limiter's Redis connections (:func:`servelab.gateway.limits.redis_client`), per gateway process:
    ``redis_max_connections`` pooled connections (default: the API port's connection cap / 16, within
    4-32, :func:`servelab.gateway.limits.redis_pool_size`); a request that finds them all busy waits up to
    ``redis_pool_timeout_s`` seconds for one (then 503 ``limits_unavailable``). A broken connection (Redis
    restarted) is reconnected and the command retried; a settle that cannot reach Redis is retried in the
    background until it lands. These take effect on restart."""

    redis_url: str | None = Field(None, description="redis://host:port/db, rediss://… or unix://…; null = memory")
    redis_max_connections: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="pooled Redis connections of the "
        "limiter per gateway process; null = API connection cap / 16, "
        "within 4-32",
    )
    redis_pool_timeout_s: float = Field(
        5.0,
        gt=0,
        le=60,
        description="longest wait for a free pooled Redis connection before a request gets 503 limits_unavailable, s",
    )

    @field_validator("redis_url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^(redis|rediss|unix)://", v):
            raise ValueError(f"{v!r} is not a Redis URL; use redis://HOST:PORT/DB")
        return v


class LedgerSection(FrozenModel):
    """Where one usage row per request is written: SQLite (``sqlite_path``, default ``gateway-usage.db``
    next to the config file) or PostgreSQL (``postgres_dsn``); not both.

    ``spool_path``: folder of the write-ahead journal (:mod:`servelab.gateway.journal`): every admitted
    request is written there before it is forwarded, and rows the database could not take (PostgreSQL
    down) wait there until it can; default ``<sqlite_path>.spool``, or ``gateway-usage.spool`` next to the
    config file with PostgreSQL (replicas on one host may share it: each process locks its own segments
    and replays only those of dead processes). ``fsync_interval_s``: how often the journal is flushed to
    the disk (a crashed gateway loses nothing; a power loss at most this much)."""

    sqlite_path: str | None = Field(None, description="SQLite file (relative to the config file's folder)")
    postgres_dsn: str | None = Field(None, description="postgresql://user@host:port/db")
    spool_path: str | None = Field(
        None,
        description="write-ahead journal folder (relative to the config "
        "file's folder); default <sqlite_path>.spool or gateway-usage.spool",
    )
    fsync_interval_s: float = Field(0.2, gt=0, le=60, description="journal fsync interval, s")

    @model_validator(mode="after")
    def _one(self) -> LedgerSection:
        if self.sqlite_path is not None and self.postgres_dsn is not None:
            raise ValueError("ledger: give sqlite_path or postgres_dsn, not both")
        if self.postgres_dsn is not None and not re.match(r"^postgres(ql)?://", self.postgres_dsn):
            raise ValueError("ledger.postgres_dsn: not a postgresql:// URL; use postgresql://USER@HOST:PORT/DB")
        if self.sqlite_path is None and self.postgres_dsn is None:
            object.__setattr__(self, "sqlite_path", "gateway-usage.db")
        if self.spool_path is None and self.sqlite_path != ":memory:":
            object.__setattr__(
                self, "spool_path", f"{self.sqlite_path}.spool" if self.sqlite_path else "gateway-usage.spool"
            )
        return self
