"""Output-length fields: what a request asks for, and the one bound each engine dialect is sent.

Every engine reads its own names for "generate at most N tokens", and several read more than one, with
their own precedence. A gateway that checks one name and forwards the others lets a client ask for 8
tokens in ``max_tokens`` (what the gateway reserves and checks) and for 300 in ``n_predict`` (what
llama-server obeys). So the gateway reads **every** known length field of every dialect
(:data:`BOUND_FIELDS`), takes the **largest** requested value as the request's bound (checked against
``server.max_tokens_limit`` and used for the token reservation), and forwards **exactly one** bound,
``<=`` that value, in the field the backend's dialect reads (:func:`for_backend`); every other length
field is removed from what is forwarded.

What each dialect reads and is sent is the dialect table's :class:`~servelab.wire.dialects.LengthRules`
(sources in docs/engine-wire.md, "Output length"): OpenAI and vLLM/SGLang are sent ``max_completion_tokens``
on chat and ``max_tokens`` on completions, every other dialect ``max_tokens`` (llama-server's
``n_predict`` and Ollama's ``options.num_predict`` are removed, so the alias each reads is the bound);
``min_tokens`` goes, clamped to the bound, only to the dialects that take it (vLLM, SGLang, the mock).

Engine-specific fields (every length field the gateway never sends: ``n_predict``, ``max_new_tokens``,
``parameters.max_new_tokens``, ``sampling_params.max_new_tokens``, ``options.num_predict``,
``sampling_params.min_new_tokens``) are **mapped** by default (counted in the bound like the OpenAI
ones, then removed and replaced by the dialect's field), or **refused** with a 400 naming the field when
``server.engine_length_fields`` is ``refuse``. ``-1``/``-2`` in ``n_predict``/``options.num_predict``
mean "no limit" and count as a request with no bound (the gateway's default applies). ``min_tokens``
above the bound is refused (vLLM refuses it too). All pure functions; errors are
:class:`~servelab.gateway.errors.GatewayError` 400.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from servelab.gateway.errors import bad_request
from servelab.wire.dialects import DIALECTS, Dialect, fields_union

__all__ = [
    "BOUND_FIELDS",
    "DIALECT_OF_KIND",
    "ENGINE_FIELDS",
    "FORWARDERS",
    "LengthRequest",
    "MIN_FIELDS",
    "canonicalise",
    "for_backend",
    "read_lengths",
]

#: Every field any dialect reads as an upper bound on generated tokens: (container or None, name).
BOUND_FIELDS = fields_union(d.lengths.reads for d in DIALECTS.values())
#: Lower bounds on generated tokens.
MIN_FIELDS = fields_union(d.lengths.min_reads for d in DIALECTS.values())
#: The fields the gateway sends (a dialect's bound field, ``min_tokens``): portable, never refused.
_SENT = frozenset(
    {(None, "min_tokens")}
    | {(None, f) for d in DIALECTS.values() for f in (d.lengths.chat_field, d.lengths.completions_field)}
)
#: The fields that are not OpenAI's (mapped or refused, see module doc).
ENGINE_FIELDS = frozenset(BOUND_FIELDS + MIN_FIELDS) - _SENT
_ALL_FIELDS = BOUND_FIELDS + MIN_FIELDS
#: Fields where -1 (and -2) mean "no limit" (llama.cpp, Ollama).
_UNBOUNDED_OK = frozenset(fields_union(d.lengths.no_limit for d in DIALECTS.values()))


def _name(where: str | None, name: str) -> str:
    return f"{where}.{name}" if where else name


@dataclass(frozen=True)
class LengthRequest:
    """What a body asks for: ``max_tokens`` = the largest explicit bound over every length field (tokens,
    None when none is given), ``unbounded`` = some field asked for no limit (-1/-2), ``min_tokens`` = the
    largest lower bound (None if none), ``field`` = the name of the field that gave ``max_tokens``,
    ``engine_fields`` = the engine-specific fields present (dotted names)."""

    max_tokens: int | None
    unbounded: bool
    min_tokens: int | None
    field: str | None
    engine_fields: tuple[str, ...]


def _containers(body: Mapping[str, Any], where: str | None) -> list[Mapping[str, Any]]:
    if where is None:
        return [body]
    c = body.get(where)
    if isinstance(c, Mapping):
        return [c]
    if isinstance(c, list):  # SGLang's sampling_params may be a list (one per prompt)
        return [x for x in c if isinstance(x, Mapping)]
    return []


def read_lengths(body: Mapping[str, Any], max_tokens_limit: int, policy: str = "map") -> LengthRequest:
    """Read every length field of ``body`` (module doc). ``max_tokens_limit``: the gateway's cap (tokens);
    ``policy``: ``map`` or ``refuse`` engine-specific fields.

    Raises GatewayError 400 (``param`` = the dotted field name): a value that is not an integer (``invalid_value``),
    below 1 (except -1/-2 where they mean no limit), above ``max_tokens_limit`` (``max_tokens_too_large``),
    an engine-specific field under ``policy="refuse"`` (``unsupported_parameter``), ``min_tokens`` above
    the bound (``invalid_value``)."""
    best: int | None = None
    best_field: str | None = None
    low: int | None = None
    unbounded = False
    engine: list[str] = []
    for where, name in _ALL_FIELDS:
        if (name if where is None else where) not in body:  # the usual case: nothing to read
            continue
        for c in _containers(body, where):
            v = c.get(name)
            if v is None:
                continue
            full = _name(where, name)
            if (where, name) in ENGINE_FIELDS:
                if policy == "refuse":
                    raise bad_request(
                        f"'{full}' is an engine-specific length field; this gateway takes "
                        "max_tokens or max_completion_tokens only (server.engine_length_fields: "
                        "refuse); send the bound as max_tokens",
                        param=full,
                        code="unsupported_parameter",
                    )
                if full not in engine:
                    engine.append(full)
            if not isinstance(v, int) or isinstance(v, bool):
                raise bad_request(
                    f"'{full}' must be an integer, got {type(v).__name__}", param=full, code="invalid_value"
                )
            if (where, name) in MIN_FIELDS:
                if v < 0:
                    raise bad_request(f"'{full}' must be >= 0, got {v}", param=full, code="invalid_value")
                low = v if low is None else max(low, v)
                continue
            if v in (-1, -2) and (where, name) in _UNBOUNDED_OK:
                unbounded = True
                continue
            if v < 1:
                raise bad_request(f"'{full}' must be an integer >= 1, got {v}", param=full, code="invalid_value")
            if v > max_tokens_limit:
                raise bad_request(
                    f"'{full}' {v} is above this gateway's limit of {max_tokens_limit} tokens; "
                    f"ask for {max_tokens_limit} or fewer",
                    param=full,
                    code="max_tokens_too_large",
                )
            if best is None or v > best:
                best, best_field = v, full
    if low is not None and best is not None and not unbounded and low > best:
        raise bad_request(
            f"'min_tokens' {low} is above the output bound {best} ({best_field}); lower min_tokens",
            param="min_tokens",
            code="invalid_value",
        )
    return LengthRequest(best, unbounded, low, best_field, tuple(engine))


def _strip(body: dict[str, Any], fields: tuple[tuple[str | None, str], ...]) -> None:
    """Remove ``fields`` from ``body`` in place; nested containers are copied before they are changed."""
    for where, name in fields:
        if where is None:
            body.pop(name, None)
            continue
        c = body.get(where)
        if isinstance(c, Mapping) and name in c:
            body[where] = {k: v for k, v in c.items() if k != name}
        elif isinstance(c, list) and any(isinstance(x, Mapping) and name in x for x in c):
            body[where] = [{k: v for k, v in x.items() if k != name} if isinstance(x, Mapping) else x for x in c]


def canonicalise(body: dict[str, Any], max_tokens: int, min_tokens: int | None) -> dict[str, Any]:
    """``body`` (changed in place and returned) in the gateway's own form: every length field removed,
    then ``max_tokens`` = ``max_tokens`` (the request's bound, tokens) and ``min_tokens`` when given
    (clamped to the bound). Routing's fallback caps and :func:`for_backend` read this form."""
    _strip(body, BOUND_FIELDS + MIN_FIELDS)
    body["max_tokens"] = max_tokens
    if min_tokens:
        body["min_tokens"] = min(min_tokens, max_tokens)
    return body


def _forward(body: Mapping[str, Any], cap: int, field: str, keeps_min: bool) -> dict[str, Any]:
    out = dict(body)
    v = out.get("max_tokens")
    bound = min(v, cap) if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else cap
    low = out.get("min_tokens")
    _strip(out, BOUND_FIELDS + MIN_FIELDS)
    out[field] = bound
    if keeps_min and isinstance(low, int) and not isinstance(low, bool) and low > 0:
        out["min_tokens"] = min(low, bound)
    return out


def _forwarder(d: Dialect) -> Callable[[Mapping[str, Any], int, str], dict[str, Any]]:
    """``d``'s forwarding function: its bound field for the endpoint, ``min_tokens`` kept or removed."""
    rules = d.lengths

    def forward(body: Mapping[str, Any], cap: int, endpoint: str) -> dict[str, Any]:
        field = rules.chat_field if endpoint == "chat" else rules.completions_field
        return _forward(body, cap, field, rules.keeps_min_tokens)

    return forward


#: The forwarding function of each dialect: ``f(body, cap_tokens, endpoint) -> body to send``.
FORWARDERS: dict[str, Callable[[Mapping[str, Any], int, str], dict[str, Any]]] = {
    kind: _forwarder(d) for kind, d in DIALECTS.items()
}
#: Backend ``kind`` -> the dialect whose length rules it follows (each kind has its own table entry).
DIALECT_OF_KIND = {kind: kind for kind in DIALECTS}


def _plain(body: Mapping[str, Any], cap: int, endpoint: str) -> dict[str, Any]:
    """A kind the table does not know: ``max_tokens`` alone (the field every OpenAI-compatible server reads)."""
    return _forward(body, cap, "max_tokens", False)


def for_backend(kind: str, endpoint: str, body: Mapping[str, Any], cap: int) -> dict[str, Any]:
    """The body to send to a backend of ``kind`` on ``endpoint`` (``chat``/``completions``/``embeddings``):
    exactly one bound, ``min(body's max_tokens, cap)`` tokens (``cap`` when the body has none, e.g. a
    fallback's params removed it), in the field the dialect reads; every other length field removed.
    Embeddings and rerank bodies are returned unchanged (as a copy). A ``kind`` this module does not know gets
    ``max_tokens`` alone (the field every OpenAI-compatible server reads)."""
    if endpoint in ("embeddings", "rerank"):
        return dict(body)
    return FORWARDERS.get(kind, _plain)(body, cap, endpoint)
