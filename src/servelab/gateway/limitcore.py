"""The parts both limiters share (:mod:`servelab.gateway.limits` describes the algorithm): a scope's
:class:`Limits`, the 429 a refusal answers with (:class:`LimitExceeded`, its one-line message), the
:class:`Admission` that settle closes, the :class:`Limiter` protocol, and the budget scopes seeded from the
ledger."""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from servelab.gateway.errors import GatewayError

#: Length of the RPM/TPM window: one minute, as the names say.
MINUTE_S = 60.0


@dataclass(frozen=True)
class Limits:
    """Limits of one scope (a key or a tenant). ``None`` = unlimited.

    - ``rpm``: requests admitted per sliding minute;
    - ``tpm``: tokens (reserved at admission, corrected to actual at settle) per sliding minute;
    - ``max_concurrency``: requests in flight at once;
    - ``token_budget``: tokens over the scope's lifetime (until the counter is reset).
    """

    rpm: int | None = None
    tpm: int | None = None
    max_concurrency: int | None = None
    token_budget: int | None = None

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_concurrency", "token_budget"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise ValueError(f"limits.{name}: {v!r} is not a whole number >= 0; use null for unlimited")

    @property
    def unlimited(self) -> bool:
        """True when no limit is set (admission is free and touches no shared state)."""
        return self.rpm is None and self.tpm is None and self.max_concurrency is None and self.token_budget is None

    @classmethod
    def from_obj(cls, obj: Any) -> Limits:
        """Build from a mapping or any object with ``rpm``/``tpm``/``max_concurrency``/``token_budget``
        attributes (e.g. a pydantic tenant config); missing fields are unlimited. ``None`` -> unlimited."""
        if obj is None:
            return cls()
        if isinstance(obj, Limits):
            return obj
        get = obj.get if isinstance(obj, Mapping) else (lambda k, d=None: getattr(obj, k, d))
        return cls(
            rpm=get("rpm"), tpm=get("tpm"), max_concurrency=get("max_concurrency"), token_budget=get("token_budget")
        )

    def merged(self, override: Limits | None) -> Limits:
        """These limits with every non-``None`` field of ``override`` taking precedence."""
        if override is None:
            return self
        return Limits(*(o if o is not None else s for s, o in zip(_fields(self), _fields(override), strict=True)))


def _fields(lim: Limits) -> tuple[int | None, ...]:
    return (lim.rpm, lim.tpm, lim.max_concurrency, lim.token_budget)


class LimitExceeded(GatewayError):
    """429 from a limit. ``limit`` is ``"rpm"``, ``"tpm"``, ``"concurrency"`` or ``"budget"`` (for the
    ``servelab_gateway_limit_rejections_total{limit}`` metric); ``scope`` is ``"key"`` or ``"tenant"``."""

    def __init__(self, limit: str, scope: str, message: str, type: str, code: str, retry_after_s: float | None) -> None:
        super().__init__(429, message, type=type, code=code, retry_after_s=retry_after_s)
        self.limit = limit
        self.scope = scope
        #: what :func:`_reject` made it from, so :meth:`without_outputs` can word it for another route
        self.made_of: tuple[str, str, str, int, int, int, float | None, str] | None = None

    def without_outputs(self) -> LimitExceeded:
        """This 429 worded for a route with no output tokens (embeddings, rerank: no ``max_tokens``): its
        advice is to send fewer or shorter inputs."""
        return self if self.made_of is None else _reject(*self.made_of, outputs=False)


#: How each scope is named to the client in a 429 (``{tenant}`` and ``{name}`` filled in).
_WHO = {
    "key": "this API key",
    "tenant": "your team ({tenant})",
    "app": "your application ({name})",
    "model": "the model {name} for your team",
    "ip": "your network address",
}


def _reject(
    kind: str,
    scope: str,
    tenant: str,
    limit: int,
    used: int,
    reserve: int,
    wait_s: float | None,
    name: str = "",
    outputs: bool = True,
) -> LimitExceeded:
    """The user-facing 429 for ``kind`` (rpm|tpm|tpm_too_large|concurrency|budget) on ``scope`` (key,
    tenant, app, model, ip; ``name``: the app, model or IP). ``outputs`` False: the route has no output
    tokens (embeddings, rerank), so the advice names the inputs, not ``max_tokens``."""
    e = _reject_text(kind, scope, tenant, limit, used, reserve, wait_s, name, outputs)
    e.made_of = (kind, scope, tenant, limit, used, reserve, wait_s, name)
    return e


def _reject_text(
    kind: str,
    scope: str,
    tenant: str,
    limit: int,
    used: int,
    reserve: int,
    wait_s: float | None,
    name: str,
    outputs: bool,
) -> LimitExceeded:
    who = _WHO.get(scope, "this API key").format(tenant=tenant, name=name)
    holds = "prompt + max_tokens" if outputs else "its inputs"
    lower = "lower max_tokens or shorten the prompt" if outputs else "send fewer or shorter inputs"
    retry = f"; retry in {max(1, math.ceil(wait_s))} s" if wait_s is not None else ""
    if kind == "rpm":
        return LimitExceeded(
            "rpm",
            scope,
            f"Rate limit reached for requests per minute (RPM) on {who}: limit {limit}, used {used}{retry}",
            "requests",
            "rate_limit_exceeded",
            wait_s,
        )
    if kind == "tpm":
        return LimitExceeded(
            "tpm",
            scope,
            f"Rate limit reached for tokens per minute (TPM) on {who}: limit "
            f"{limit}, used {used}, requested {reserve}{retry}; "
            + (
                "a lower max_tokens reserves fewer tokens"
                if outputs
                else "fewer or shorter inputs reserve fewer tokens"
            ),
            "tokens",
            "rate_limit_exceeded",
            wait_s,
        )
    if kind == "tpm_too_large":
        return LimitExceeded(
            "tpm",
            scope,
            f"Request too large for the tokens per minute (TPM) limit of {who}: "
            f"it reserves {reserve} tokens ({holds}), the limit is {limit}; {lower}",
            "tokens",
            "rate_limit_exceeded",
            None,
        )
    if kind == "concurrency":
        return LimitExceeded(
            "concurrency",
            scope,
            f"Too many requests in flight on {who}: limit {limit} at once; retry when one of them has finished",
            "requests",
            "rate_limit_exceeded",
            wait_s,
        )
    left = max(0, limit - used)
    detail = (
        "is used up"
        if left == 0
        else f"has {left} tokens left, this request reserves {reserve} ({holds}); "
        + ("lower max_tokens" if outputs else "send fewer or shorter inputs")
    )
    return LimitExceeded(
        "budget",
        scope,
        f"The token budget of {who} ({limit} tokens) {detail}; ask your administrator for more",
        "insufficient_quota",
        "insufficient_quota",
        None,
    )


@dataclass
class Admission:
    """One admitted request; pass it to :meth:`Limiter.settle` exactly once.

    ``admitted_ts``: admission time in epoch seconds on the limiter's clock (Redis ``TIME`` for
    :class:`RedisLimiter`). ``reserved_tokens``: what TPM and the budget hold until settle.
    """

    key_id: str
    tenant: str
    model: str
    reserved_tokens: int
    admitted_ts: float
    uid: str = field(default_factory=lambda: secrets.token_hex(8))
    settled: bool = False
    _scopes: tuple[Any, ...] = field(default=(), repr=False)


class Limiter(Protocol):
    """What the server needs from a limiter (see the module docstring for semantics)."""

    async def admit(
        self,
        key_id: str,
        tenant: str,
        model: str,
        reserve_tokens: int,
        limits: Limits,
        tenant_limits: Limits | None = None,
        extra: Sequence[tuple[str, str, Limits]] = (),
    ) -> Admission: ...

    async def settle(self, admission: Admission, used_tokens: int) -> float: ...

    async def close(self) -> None: ...


def _check_args(reserve_tokens: int) -> None:
    if not isinstance(reserve_tokens, int) or reserve_tokens < 0:
        raise ValueError(f"reserve_tokens must be a whole number >= 0, got {reserve_tokens!r}")


def _begin_settle(admission: Admission, used_tokens: int) -> None:
    if admission.settled:
        raise RuntimeError(f"admission {admission.uid} settled twice; settle exactly once per admission")
    if not isinstance(used_tokens, int) or used_tokens < 0:
        raise ValueError(f"used_tokens must be a whole number >= 0, got {used_tokens!r}")
    admission.settled = True


def _budget_scopes(spend: Mapping[tuple[str, str], int]) -> list[tuple[str, str, int]]:
    """``(kind, name, tokens)`` per key scope (``tenant\0key_id``, as the limiters name it) and per tenant."""
    out: list[tuple[str, str, int]] = []
    tenants: dict[str, int] = {}
    for (tenant, key_id), tokens in spend.items():
        out.append(("key", f"{tenant}\0{key_id}", int(tokens)))
        tenants[tenant] = tenants.get(tenant, 0) + int(tokens)
    out += [("tenant", t, n) for t, n in tenants.items()]
    return out
