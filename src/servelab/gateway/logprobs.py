"""Bounds on log-probability fields: how many alternatives per token a request may ask for.

Each alternative costs answer bytes per generated token, so an unbounded count is an amplification: on
llama-server ``/v1/completions`` with ``max_tokens: 8, logprobs: 50000`` answered 39 MB in 6.25 s, and
chat ``top_logprobs: 5000`` 3.5 MB (break-it report on 4b30bb7, defect 5). The gateway reads the field of
every dialect (the :mod:`servelab.gateway.lengths` approach) and refuses a count above its bound with a
400 naming the field; nothing is rewritten, so what is forwarded is what was checked.

The count fields of each dialect are the dialect table's (:mod:`servelab.wire.dialects`; sources in
docs/engine-wire.md, "Log probabilities"): ``top_logprobs`` everywhere, llama-server's ``n_probs``, SGLang's
``top_logprobs_num``, TGI's ``top_n_tokens``/``parameters.top_n_tokens`` take the chat bound
``server.max_top_logprobs`` (default 20, OpenAI's maximum); vLLM's ``prompt_logprobs`` (that many
alternatives for every *prompt* token) and completions ``logprobs`` take ``server.max_logprobs`` (default 5).

On chat, ``logprobs`` is a boolean; an integer there (read as a count by some servers) takes the chat
bound. ``-1`` (vLLM: "all vocabulary") and other negative values are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.gateway.errors import bad_request
from servelab.wire.dialects import DIALECTS

__all__ = ["COUNT_FIELDS", "check_logprobs"]

#: (container or None, field, which bound: "top" = server.max_top_logprobs, "legacy" = server.max_logprobs)
#: every dialect's count fields, those of the chat bound first
COUNT_FIELDS: tuple[tuple[str | None, str, str], ...] = tuple(
    sorted(
        dict.fromkeys((f.field[0], f.field[1], f.bound) for d in DIALECTS.values() for f in d.logprobs),
        key=lambda f: f[2] != "top",
    )
)


def _check(full: str, v: Any, cap: int, setting: str) -> None:
    if v is None:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise bad_request(f"'{full}' must be an integer >= 0, got {type(v).__name__}", param=full, code="invalid_value")
    if v < 0:
        raise bad_request(f"'{full}' must be >= 0, got {v}", param=full, code="invalid_value")
    if v > cap:
        raise bad_request(
            f"'{full}' {v} is above this gateway's limit of {cap} alternatives per token "
            f"(server.{setting}); ask for {cap} or fewer",
            param=full,
            code="logprobs_too_large",
        )


def check_logprobs(endpoint: str, body: Mapping[str, Any], max_top: int, max_legacy: int) -> None:
    """Refuse ``body`` when a log-probability count is above its bound (module doc). ``endpoint``:
    ``chat``/``completions``/``embeddings``/``rerank`` (the last two: nothing checked); ``max_top``:
    ``server.max_top_logprobs``,
    ``max_legacy``: ``server.max_logprobs`` (alternatives per token).

    Raises GatewayError 400: ``logprobs_too_large`` above a bound, ``invalid_value`` for a negative or
    non-integer count (``param`` = the dotted field name)."""
    if endpoint in ("embeddings", "rerank"):
        return
    for where, name, which in COUNT_FIELDS:
        c = body if where is None else body.get(where)
        if not isinstance(c, Mapping) or name not in c:
            continue
        full = name if where is None else f"{where}.{name}"
        if which == "top":
            _check(full, c[name], max_top, "max_top_logprobs")
        else:
            _check(full, c[name], max_legacy, "max_logprobs")
    lp = body.get("logprobs")
    if isinstance(lp, bool):  # chat's flag (some servers take it on completions too): no count
        return
    if endpoint == "completions":
        _check("logprobs", lp, max_legacy, "max_logprobs")
    elif lp is not None:
        _check("logprobs", lp, max_top, "max_top_logprobs")
