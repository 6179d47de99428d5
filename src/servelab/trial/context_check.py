"""The context check (seed 003 §20): the prompt length a server actually accepts, and what it does past it.

A declared context ("-c 8192", ``max_model_len``) is not what a request gets: llama-server splits ``-c``
over its ``-np`` slots, an engine may reserve room for the completion, and some servers (Ollama) cut an
over-long prompt without a word, so a RAG answer silently loses its documents. :func:`check_context`
finds the longest prompt the server answers by bracketing then bisecting (to ``step_tokens``, within a
time budget) and classifies what happens past it:

- ``clear_error``: a 4xx answer (the client can tell) — the engine's message is kept (one line);
- ``truncates``: a 2xx answer whose ``usage.prompt_tokens`` is smaller than what was sent — flagged,
  with the largest prompt that was still counted whole;
- ``accepts_limit``: the whole ``limit_tokens`` was accepted and counted (nothing above was tried);
- ``undetermined``: the budget ran out, or the server failed in some other way (5xx, no usage).

Prompts are ``"the the the …"`` on ``/v1/completions`` with ``max_tokens: 1`` (one word is one token
in the tokenizers tested here — Gemma 3's SPM, and the mock's words; the server's own ``usage`` is the
measure, and an offset such as a BOS token is calibrated from the first, short probe). Lengths below
are the server's prompt-token counts unless named ``sent``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import BaseModel, Field

__all__ = ["ContextCheck", "ContextProbe", "check_context"]

Verdict = Literal["clear_error", "truncates", "accepts_limit", "undetermined"]


class ContextProbe(BaseModel):
    """One request of the search: ``sent_words`` in the prompt, the HTTP ``status`` (``None``: no answer),
    ``prompt_tokens`` from usage (``None``: not stated), ``error`` (one line) and ``elapsed_s``."""

    sent_words: int
    status: int | None = None
    prompt_tokens: int | None = None
    error: str | None = None
    elapsed_s: float = 0.0


class ContextCheck(BaseModel):
    """Result of :func:`check_context`.

    ``accepted_tokens``: the longest prompt answered and counted whole (server tokens; ``None`` if even
    the first probe failed); ``first_failing_tokens``: the shortest prompt past it that was refused or
    cut (expected server tokens, ``None`` = none found); ``verdict`` (see the module doc);
    ``resolution_tokens``: the gap between the two when the search converged; ``offset_tokens``: what the
    server adds to the words sent (BOS, template); ``message``: the server's refusal text (first line);
    ``probes``: every request, in order; ``elapsed_s``: the whole search.
    """

    limit_tokens: int
    accepted_tokens: int | None = None
    first_failing_tokens: int | None = None
    verdict: Verdict = "undetermined"
    resolution_tokens: int | None = None
    offset_tokens: int = 0
    message: str | None = None
    probes: list[ContextProbe] = Field(default_factory=list)
    elapsed_s: float = 0.0


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


async def _probe(session: aiohttp.ClientSession, url: str, model: str, words: int, timeout_s: float) -> ContextProbe:
    t0 = time.monotonic()
    body = {"model": model, "prompt": " ".join(["the"] * words), "max_tokens": 1, "temperature": 0, "stream": False}
    p = ContextProbe(sent_words=words)
    try:
        async with session.post(url, data=orjson.dumps(body), timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            raw = await r.read()
            p.status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        p.error = _one_line(f"{type(e).__name__}: {e}")
        p.elapsed_s = time.monotonic() - t0
        return p
    p.elapsed_s = time.monotonic() - t0
    data: Any
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        data = None
    if p.status >= 300:
        err = data.get("error", data) if isinstance(data, dict) else raw.decode("utf-8", "replace")
        msg = err.get("message", err) if isinstance(err, dict) else err
        p.error = _one_line(str(msg))
        return p
    usage = data.get("usage") if isinstance(data, dict) else None
    pt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    p.prompt_tokens = pt if isinstance(pt, int) else None
    return p


def check_context(
    base_url: str,
    model: str,
    limit_tokens: int,
    *,
    step_tokens: int = 16,
    start_words: int = 16,
    budget_s: float = 120.0,
    timeout_s: float = 60.0,
    api_key: str | None = None,
) -> ContextCheck:
    """Find the longest prompt the server at ``base_url`` (OpenAI API root) answers whole, up to
    ``limit_tokens`` (the declared context), to within ``step_tokens``, spending at most ``budget_s``
    seconds (each request bounded by ``timeout_s``). ``model``: the served model id.

    Raises :class:`ValueError` for a ``limit_tokens`` or ``step_tokens`` below 1, or ``start_words`` not
    below ``limit_tokens``; everything the server does is a result, never an exception.
    """
    if limit_tokens < 1 or step_tokens < 1 or not 0 < start_words < limit_tokens:
        raise ValueError(
            f"need limit_tokens >= 1, step_tokens >= 1 and 0 < start_words < limit_tokens "
            f"(got {limit_tokens}, {step_tokens}, {start_words})"
        )
    t0 = time.monotonic()
    out = ContextCheck(limit_tokens=limit_tokens)
    url = base_url.rstrip("/") + "/completions"
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    return asyncio.run(_search(out, url, model, headers, step_tokens, start_words, budget_s, timeout_s, t0))


async def _search(
    out: ContextCheck,
    url: str,
    model: str,
    headers: dict[str, str],
    step_tokens: int,
    start_words: int,
    budget_s: float,
    timeout_s: float,
    t0: float,
) -> ContextCheck:
    limit_tokens = out.limit_tokens
    headers = {"Content-Type": "application/json", **headers}
    async with aiohttp.ClientSession(headers=headers) as session:

        async def ask(words: int) -> ContextProbe:
            p = await _probe(session, url, model, words, timeout_s)
            out.probes.append(p)
            return p

        first = await ask(start_words)
        if first.status is None or first.status >= 300 or first.prompt_tokens is None:
            out.message = first.error or "no usage.prompt_tokens in the answer"
            out.elapsed_s = time.monotonic() - t0
            return out
        out.offset_tokens = first.prompt_tokens - start_words
        out.accepted_tokens = first.prompt_tokens

        def whole(p: ContextProbe) -> bool:
            return (
                p.status is not None
                and p.status < 300
                and p.prompt_tokens is not None
                and p.prompt_tokens >= p.sent_words + out.offset_tokens
            )

        lo_words = start_words  # answered whole
        hi_words = max(limit_tokens - out.offset_tokens, start_words + 1)  # the declared limit, in words
        failing: ContextProbe | None = None
        top = await ask(hi_words)
        if whole(top):
            out.accepted_tokens, out.verdict = top.prompt_tokens, "accepts_limit"
        else:
            failing = top
            while hi_words - lo_words > step_tokens and time.monotonic() - t0 < budget_s:
                mid = (lo_words + hi_words) // 2
                p = await ask(mid)
                if whole(p):
                    lo_words, out.accepted_tokens = mid, p.prompt_tokens
                else:
                    hi_words, failing = mid, p
            converged = hi_words - lo_words <= step_tokens
            out.first_failing_tokens = hi_words + out.offset_tokens
            out.resolution_tokens = hi_words - lo_words if converged else None
            if failing.status is not None and 400 <= failing.status < 500:
                out.verdict, out.message = ("clear_error" if converged else "undetermined"), failing.error
            elif failing.status is not None and failing.status < 300 and failing.prompt_tokens is not None:
                out.verdict = "truncates"  # flagged even before convergence: a cut prompt was seen
                out.message = (
                    f"answered a {failing.sent_words + out.offset_tokens}-token prompt but counted "
                    f"{failing.prompt_tokens}: the prompt was cut without an error"
                )
            else:
                out.message = failing.error or "answer without usage.prompt_tokens"
    out.elapsed_s = time.monotonic() - t0
    return out
