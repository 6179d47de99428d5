"""Bounds on log-probability fields: how many alternatives per token a request may ask for.

Each alternative costs answer bytes per generated token, so an unbounded count is an amplification: on
llama-server ``/v1/completions`` with ``max_tokens: 8, logprobs: 50000`` answered 39 MB in 6.25 s, and
chat ``top_logprobs: 5000`` 3.5 MB (break-it report on 4b30bb7, defect 5). The gateway reads the field of
every dialect (the :mod:`servelab.gateway.lengths` approach) and refuses a count above its bound with a
400 naming the field; nothing is rewritten, so what is forwarded is what was checked.

What each engine reads (checked 2026-12-01):

- **OpenAI**: chat ``top_logprobs`` 0-20 (with ``logprobs: true``), legacy completions ``logprobs`` 0-5
  (https://platform.openai.com/docs/api-reference/chat/create,
  https://platform.openai.com/docs/api-reference/completions/create). Bounds: ``server.max_top_logprobs``
  (default 20) and ``server.max_logprobs`` (default 5).
- **llama.cpp** (llama-server): ``n_probs`` (native), and on its OpenAI endpoints ``top_logprobs`` (chat)
  and completions ``logprobs`` read as ``n_probs``
  (https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md). ``n_probs`` takes the
  chat bound.
- **vLLM**: chat ``top_logprobs``, completions ``logprobs``, and ``prompt_logprobs`` (an extension: that
  many alternatives for every *prompt* token) on both; the server's own ``--max-logprobs`` is 20 by default
  (https://docs.vllm.ai/en/latest/api/vllm/sampling_params.html). ``prompt_logprobs`` takes the
  completions bound.
- **SGLang**: OpenAI fields as vLLM; native ``top_logprobs_num`` (chat bound)
  (https://github.com/sgl-project/sglang/blob/main/docs/sampling_params.md).
- **TGI**: Messages API ``top_logprobs``; native ``parameters.top_n_tokens`` (chat bound)
  (https://huggingface.github.io/text-generation-inference/).

On chat, ``logprobs`` is a boolean; an integer there (read as a count by some servers) takes the chat
bound. ``-1`` (vLLM: "all vocabulary") and other negative values are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.gateway.errors import bad_request

__all__ = ["COUNT_FIELDS", "check_logprobs"]

#: (container or None, field, which bound: "top" = server.max_top_logprobs, "legacy" = server.max_logprobs)
COUNT_FIELDS: tuple[tuple[str | None, str, str], ...] = (
    (None, "top_logprobs", "top"), (None, "n_probs", "top"), (None, "top_logprobs_num", "top"),
    (None, "top_n_tokens", "top"), ("parameters", "top_n_tokens", "top"), (None, "prompt_logprobs", "legacy"))


def _check(full: str, v: Any, cap: int, setting: str) -> None:
    if v is None:
        return
    if not isinstance(v, int) or isinstance(v, bool):
        raise bad_request(f"'{full}' must be an integer >= 0, got {type(v).__name__}", param=full,
                          code="invalid_value")
    if v < 0:
        raise bad_request(f"'{full}' must be >= 0, got {v}", param=full, code="invalid_value")
    if v > cap:
        raise bad_request(f"'{full}' {v} is above this gateway's limit of {cap} alternatives per token "
                          f"(server.{setting}); ask for {cap} or fewer", param=full, code="logprobs_too_large")


def check_logprobs(endpoint: str, body: Mapping[str, Any], max_top: int, max_legacy: int) -> None:
    """Refuse ``body`` when a log-probability count is above its bound (module doc). ``endpoint``:
    ``chat``/``completions``/``embeddings`` (nothing checked); ``max_top``: ``server.max_top_logprobs``,
    ``max_legacy``: ``server.max_logprobs`` (alternatives per token).

    Raises GatewayError 400: ``logprobs_too_large`` above a bound, ``invalid_value`` for a negative or
    non-integer count (``param`` = the dotted field name)."""
    if endpoint == "embeddings":
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
