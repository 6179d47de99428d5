"""Sampling policy per model and task (issue 14 item 1, seed 003 §20): the gateway, not the front end,
decides the sampling parameters' defaults and bounds.

``models.<m>.sampling`` and ``routing.task_sampling.<task>`` (:class:`servelab.gateway.config.SamplingPolicy`;
the task is the request's ``routing.task_header``) give, per parameter (``temperature``, ``top_p``,
``top_k``, ``min_p``, ``frequency_penalty``, ``presence_penalty``, ``repetition_penalty``, ``max_tokens``,
``stop``):

- a ``default`` sent when the request has none (the task's default first, else the model's);
- bounds ``min``/``max`` (``max_items`` for ``stop``): a value outside is **clamped** into range or
  **refused** with 400 ``parameter_out_of_range`` naming the parameter and the allowed range
  (``on_violation`` per parameter, else the policy's; ``refuse`` when either policy says so).

The task's bounds never widen the model's: both apply (the task header is the client's to choose, so
it may only narrow what the operator allows for the model). ``max_tokens`` is applied to the request's
output bound over every dialect's length field (:mod:`servelab.gateway.lengths`), after the gateway's
own limit. What changed is written to the access log's ``policy`` field:
``{"defaults": {param: value}, "clamped": {param: [asked, sent]}}``.

Values that are not numbers (or a ``stop`` that is not a string or list) are left for the request
validation and the engine to reject.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.gateway.errors import GatewayError

__all__ = ["Applied", "NUMERIC", "apply", "bounds_for", "resolve"]

#: numeric parameters a policy can govern (body field names; vLLM/SGLang/llama-server extensions included)
NUMERIC = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


@dataclass(frozen=True)
class _Bound:
    default: Any
    lo: float | None
    hi: float | None
    refuse: bool


@dataclass
class Applied:
    """What :func:`apply` did: ``defaults`` (param -> value sent), ``clamped`` (param -> [asked, sent]);
    ``max_tokens``: the output bound rule still to apply (see :meth:`output_cap`)."""

    defaults: dict[str, Any] = field(default_factory=dict)
    clamped: dict[str, list[Any]] = field(default_factory=dict)
    max_tokens: _Bound | None = None

    def output_cap(self, out_cap: int, asked: int | None, limit: int) -> int:
        """The output bound (tokens) after the ``max_tokens`` rule: its default (never above ``limit``,
        the gateway's own bound per sequence) when the request asked none (``asked`` None), clamped to
        [min, max] or refused (raises :class:`GatewayError` 400)."""
        b = self.max_tokens
        if b is None:
            return out_cap
        if asked is None and b.default is not None:
            sent = max(1, min(int(b.default), limit))
            self.defaults["max_tokens"] = sent
            return sent
        lo, hi = b.lo, b.hi
        if (hi is not None and out_cap > hi) or (lo is not None and out_cap < lo):
            if b.refuse:
                raise _out_of_range("max_tokens", out_cap, lo, hi, b.default)
            sent = int(min(hi, out_cap) if hi is not None and out_cap > hi else lo or out_cap)
            self.clamped["max_tokens"] = [out_cap, sent]
            return sent
        return out_cap

    def log_record(self) -> dict[str, Any] | None:
        """The access log's ``policy`` field, or None when nothing changed."""
        if not self.defaults and not self.clamped:
            return None
        return {"defaults": self.defaults, "clamped": self.clamped}


def _out_of_range(name: str, value: Any, lo: float | None, hi: float | None, default: Any) -> GatewayError:
    rng = f"[{_fmt(lo) if lo is not None else '-inf'}, {_fmt(hi) if hi is not None else 'inf'}]"
    dflt = f" (default {default})" if default is not None else ""
    return GatewayError(
        400,
        f"{name} {value} is outside what this model allows for this task {rng}; send a "
        f"value in that range or leave it out{dflt}",
        code="parameter_out_of_range",
        param=name,
    )


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def resolve(model_policy: Any, task_policy: Any) -> dict[str, _Bound]:
    """The effective bound per parameter of a model's and a task's :class:`SamplingPolicy` (either may
    be None): default task-first, bounds intersected, refuse when either refuses."""
    out: dict[str, _Bound] = {}
    for name in (*NUMERIC, "max_tokens", "stop"):
        specs = [(p, getattr(p, name)) for p in (task_policy, model_policy) if p is not None and getattr(p, name)]
        if not specs:
            continue
        default = next((s.default for _, s in specs if s.default is not None), None)
        refuse = any((s.on_violation or p.on_violation) == "refuse" for p, s in specs)
        if name == "stop":
            caps = [s.max_items for _, s in specs if s.max_items is not None]
            out[name] = _Bound(default, None, min(caps) if caps else None, refuse)
            continue
        los = [s.min for _, s in specs if s.min is not None]
        his = [s.max for _, s in specs if s.max is not None]
        out[name] = _Bound(default, max(los) if los else None, min(his) if his else None, refuse)
    return out


_CACHE: dict[tuple[int, str, str | None], tuple[Any, dict[str, _Bound]]] = {}


def bounds_for(cfg: Any, model: str, task: str | None) -> dict[str, _Bound]:
    """:func:`resolve` of ``models.<model>.sampling`` and ``routing.task_sampling.<task>`` in ``cfg``,
    cached per config (empty when neither is set)."""
    k = (id(cfg), model, task)
    hit = _CACHE.get(k)
    if hit is not None and hit[0] is cfg:
        return hit[1]
    entry = cfg.models.get(model)
    tp = cfg.routing.task_sampling.get(task) if task else None
    bounds = resolve(entry.sampling if entry is not None else None, tp)
    if len(_CACHE) > 1024:
        _CACHE.clear()
    _CACHE[k] = (cfg, bounds)
    return bounds


def apply(body: dict[str, Any], bounds: dict[str, _Bound], endpoint: str) -> Applied:
    """Apply ``bounds`` (:func:`resolve`) to the request ``body`` in place: defaults for absent
    parameters, clamped values, or raise :class:`GatewayError` 400 ``parameter_out_of_range`` for a
    refused one. Embedding and rerank requests are left alone. ``max_tokens`` is returned in
    :attr:`Applied.max_tokens` for :meth:`Applied.output_cap`."""
    done = Applied()
    if endpoint in ("embeddings", "rerank") or not bounds:
        return done
    for name, b in bounds.items():
        if name == "max_tokens":
            done.max_tokens = b
            continue
        v = body.get(name)
        if name == "stop":
            if v is None and b.default is not None:
                body["stop"] = list(b.default)
                done.defaults["stop"] = list(b.default)
            elif isinstance(v, list) and b.hi is not None and len(v) > b.hi:
                if b.refuse:
                    raise GatewayError(
                        400,
                        f"stop has {len(v)} sequences; this model takes at most {int(b.hi)} for this task: send fewer",
                        code="parameter_out_of_range",
                        param="stop",
                    )
                body["stop"] = v[: int(b.hi)]
                done.clamped["stop"] = [len(v), int(b.hi)]
            continue
        if v is None:
            if b.default is not None:
                body[name] = b.default
                done.defaults[name] = b.default
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if (b.lo is not None and v < b.lo) or (b.hi is not None and v > b.hi):
            if b.refuse:
                raise _out_of_range(name, v, b.lo, b.hi, b.default)
            sent = b.hi if b.hi is not None and v > b.hi else b.lo
            if isinstance(v, int) and sent is not None and float(sent).is_integer():
                sent = int(sent)
            body[name] = sent
            done.clamped[name] = [v, sent]
    return done
