"""Limits in this process's memory (:class:`MemoryLimiter`): exact for one gateway replica; the algorithm
is in :mod:`servelab.gateway.limits`."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from servelab.gateway.limitcore import (
    MINUTE_S,
    Admission,
    Limits,
    _begin_settle,
    _budget_scopes,
    _check_args,
    _reject,
)


@dataclass
class _MemScope:
    name: str  # "key" | "tenant" | "app" | "model" | "ip"
    limits: Limits
    label: str = ""  # the app, model or IP of an extra scope (shown in its 429)
    rpm_log: deque[float] = field(default_factory=deque)  # admission times (monotonic s)
    tpm_log: dict[str, tuple[float, int]] = field(default_factory=dict)  # uid -> (time, tokens), in order
    tpm_sum: int = 0
    in_flight: set[str] = field(default_factory=set)
    spent: int = 0

    def trim(self, cutoff: float) -> None:
        while self.rpm_log and self.rpm_log[0] <= cutoff:
            self.rpm_log.popleft()
        while self.tpm_log:
            uid, (t, tok) = next(iter(self.tpm_log.items()))
            if t > cutoff:
                break
            del self.tpm_log[uid]
            self.tpm_sum -= tok


class MemoryLimiter:
    """Limits in this process's memory: exact for one gateway replica (use :class:`RedisLimiter` for N).

    ``window_s``: RPM/TPM window (60 s; tests shorten it). Counters of the token budget live as long as
    the process. Not thread-safe; call from one event loop (``admit``/``settle`` never await inside).
    """

    def __init__(self, window_s: float = MINUTE_S) -> None:
        self.window_s = window_s
        self._scopes: dict[tuple[str, str], _MemScope] = {}

    def _scope(self, kind: str, name: str, limits: Limits) -> _MemScope:
        s = self._scopes.get((kind, name))
        if s is None:
            s = self._scopes[(kind, name)] = _MemScope(kind, limits)
        s.limits = limits
        return s

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
        """Admit or raise :class:`LimitExceeded` (429) naming the limit. Checks key scope, then tenant,
        then the ``extra`` scopes in order."""
        _check_args(reserve_tokens)
        now = time.monotonic()
        scopes = []
        if not limits.unlimited:
            scopes.append(self._scope("key", f"{tenant}\0{key_id}", limits))
        if tenant_limits is not None and not tenant_limits.unlimited:
            scopes.append(self._scope("tenant", tenant, tenant_limits))
        for kind, name, lim in extra:
            if not lim.unlimited:
                sc = self._scope(kind, f"{tenant}\0{name}", lim)
                sc.label = name
                scopes.append(sc)
        cutoff = now - self.window_s
        for s in scopes:
            lim = s.limits
            s.trim(cutoff)
            if lim.rpm is not None and len(s.rpm_log) >= lim.rpm:
                wait = s.rpm_log[0] + self.window_s - now if s.rpm_log else None
                raise _reject("rpm", s.name, tenant, lim.rpm, len(s.rpm_log), reserve_tokens, wait, s.label)
            if lim.tpm is not None and s.tpm_sum + reserve_tokens > lim.tpm:
                if reserve_tokens > lim.tpm:
                    raise _reject("tpm_too_large", s.name, tenant, lim.tpm, s.tpm_sum, reserve_tokens, None, s.label)
                need, acc, wait = s.tpm_sum + reserve_tokens - lim.tpm, 0, self.window_s
                for t, tok in s.tpm_log.values():
                    acc += tok
                    if acc >= need:
                        wait = t + self.window_s - now
                        break
                raise _reject("tpm", s.name, tenant, lim.tpm, s.tpm_sum, reserve_tokens, wait, s.label)
            if lim.max_concurrency is not None and len(s.in_flight) >= lim.max_concurrency:
                raise _reject(
                    "concurrency", s.name, tenant, lim.max_concurrency, len(s.in_flight), reserve_tokens, 1.0, s.label
                )
            if lim.token_budget is not None and s.spent + reserve_tokens > lim.token_budget:
                raise _reject("budget", s.name, tenant, lim.token_budget, s.spent, reserve_tokens, None, s.label)
        adm = Admission(key_id, tenant, model, reserve_tokens, time.time())
        taken = []
        for s in scopes:
            lim = s.limits
            flags = (lim.tpm is not None, lim.max_concurrency is not None, lim.token_budget is not None)
            if lim.rpm is not None:
                s.rpm_log.append(now)
            if flags[0]:
                s.tpm_log[adm.uid] = (now, reserve_tokens)
                s.tpm_sum += reserve_tokens
            if flags[1]:
                s.in_flight.add(adm.uid)
            if flags[2]:
                s.spent += reserve_tokens
            taken.append((s, flags))
        adm._scopes = tuple(taken)
        return adm

    async def settle(self, admission: Admission, used_tokens: int) -> float:
        """Release concurrency, correct TPM and budget from reserved to ``used_tokens``. Returns the
        settle time (epoch s). Raises ``RuntimeError`` on a second settle of the same admission."""
        _begin_settle(admission, used_tokens)
        delta = used_tokens - admission.reserved_tokens
        for s, (tpm_on, conc_on, budget_on) in admission._scopes:
            if tpm_on and admission.uid in s.tpm_log:
                t, _ = s.tpm_log[admission.uid]
                s.tpm_log[admission.uid] = (t, used_tokens)
                s.tpm_sum += delta
            if conc_on:
                s.in_flight.discard(admission.uid)
            if budget_on:
                s.spent += delta
        return time.time()

    async def seed_budgets(self, spend: Mapping[tuple[str, str], int], tenants: Sequence[str] = ()) -> None:
        """Raise the budget counters to the ledger's spend: ``spend`` maps ``(tenant, key_id)`` to tokens
        (the key scope gets its own sum, the tenant scope the sum of its keys). A counter already higher
        (requests in flight) keeps its value. Call before the first :meth:`admit`. ``tenants``: unused here
        (the Redis limiter marks them seeded)."""
        for kind, name, tokens in _budget_scopes(spend):
            s = self._scope(kind, name, Limits())
            s.spent = max(s.spent, tokens)

    async def close(self) -> None:
        """Nothing to release (kept for the :class:`Limiter` protocol)."""
