"""The per-candidate checks of what the server really serves (seed 003 §20), run from the trial flow:

- ``context``: :func:`servelab.trial.context_check.check_context` up to the context the candidate
  declares or the server states (the ``context_tokens`` identity fact: llama.cpp ``GET /props``
  ``n_ctx`` per slot, vLLM ``GET /v1/models`` ``max_model_len``, a launcher's setting) — the longest
  prompt answered whole and what the server does past it (clear error, silent truncation);
- ``template``: :func:`servelab.trial.template_check.check_template` against the model file's own chat
  template (GGUF ``tokenizer.chat_template``, or an HF folder's ``tokenizer_config.json``
  ``chat_template`` / ``chat_template.jinja``) — is the prompt the server builds the one the template makes.

Each is bounded in time (the context search by ``budget_s``, cut to what the trial budget has left) and
never fails the candidate: what could not be checked is named in :attr:`ServedChecks.skipped`. The
results go to ``results.candidates.<name>.checks`` and two identity facts (``accepted_context_tokens``,
source ``context check``; ``chat_template``, source ``template check``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from servelab.bench.results import ResultModel
from servelab.engines.probe import Fact
from servelab.trial.context_check import ContextCheck, check_context
from servelab.trial.template_check import TemplateCheck, check_template
from servelab.wire.jsontypes import JsonObject

__all__ = ["CheckName", "ServedChecks", "default_checks", "model_chat_template", "run_checks"]

CheckName = Literal["context", "template"]


def default_checks() -> list[CheckName]:
    """The experiment's ``checks`` when unset: the chat-template check only (a few requests); the context
    search sends prompts up to the whole context for up to a minute, so it is asked for by name."""
    return ["template"]


class ServedChecks(ResultModel):
    """``results.candidates.<name>.checks``: the :class:`ContextCheck` and :class:`TemplateCheck` that
    ran (``None``: not asked for, or skipped) and ``skipped``: check -> why it did not run."""

    context: ContextCheck | None = None
    template: TemplateCheck | None = None
    skipped: dict[str, str] = Field(default_factory=dict)


def model_chat_template(model: JsonObject | None) -> tuple[str | None, str, str, str]:
    """(template source or ``None``, where it came from, BOS text, EOS text) of a candidate's weights
    identity ``model`` (``path`` of a GGUF file or ``hf_dir`` of an HF folder); ``(None, …)`` when the
    model has none or cannot be read."""
    m = model or {}
    path = m.get("path") or m.get("hf_dir")
    if not isinstance(path, str) or not Path(path).exists():
        return None, "no local model file", "", ""
    p = Path(path)
    if p.is_dir():
        cfg: JsonObject = {}
        with contextlib.suppress(OSError, ValueError):
            cfg = json.loads((p / "tokenizer_config.json").read_text(encoding="utf-8"))
        tmpl = cfg.get("chat_template")
        jinja = p / "chat_template.jinja"
        if not isinstance(tmpl, str) and jinja.is_file():
            tmpl = jinja.read_text(encoding="utf-8")

        def tok(x: Any) -> str:
            return str(x.get("content", "")) if isinstance(x, dict) else str(x or "")

        return (
            tmpl if isinstance(tmpl, str) else None,
            "model file (HF tokenizer_config.json)",
            tok(cfg.get("bos_token")),
            tok(cfg.get("eos_token")),
        )
    from servelab.modelfile.gguf_meta import read_arrays, read_metadata

    try:
        kv = read_metadata(p)
        tmpl = kv.get("tokenizer.chat_template")
        if not isinstance(tmpl, str) or not tmpl:
            return None, "model file (GGUF)", "", ""
        tokens = read_arrays(p, {"tokenizer.ggml.tokens"}).get("tokenizer.ggml.tokens") or []
    except Exception:  # noqa: BLE001 — an unreadable file is no reference
        return None, "model file (unreadable)", "", ""

    def at(key: str) -> str:
        i = kv.get(key)
        return str(tokens[i]) if isinstance(i, int) and 0 <= i < len(tokens) else ""

    return (
        tmpl,
        "model file (GGUF tokenizer.chat_template)",
        at("tokenizer.ggml.bos_token_id"),
        at("tokenizer.ggml.eos_token_id"),
    )


def _served_model(base_url: str, model: str | None, api_key: str | None) -> str:
    from servelab.wire.client import make_session
    from servelab.wire.preflight import preflight

    async def go() -> str:
        hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
        async with make_session() as s:
            m, _ = await preflight(s, base_url, model, hdrs)
            return str(m)

    return asyncio.run(go())


def run_checks(
    which: list[CheckName],
    identity: Any,
    base_url: str,
    model: str | None,
    api_key: str | None,
    *,
    budget_s: float | None = None,
    context_budget_s: float = 60.0,
    timeout_s: float = 60.0,
) -> ServedChecks | None:
    """Run the checks in ``which`` on the server at ``base_url`` (OpenAI API root; ``model``: the model
    name to send, ``None`` = the server's first) for a candidate whose
    :class:`~servelab.trial.results.CandidateIdentity` is ``identity`` (its ``facts`` give the context
    size and get the results; its ``model`` the reference template). ``budget_s``: what the trial budget
    has left (``None``: no budget): the context search gets at most ``context_budget_s`` of it.
    ``None`` when ``which`` is empty. Never raises."""
    out = ServedChecks()
    skipped: dict[str, str] = {}
    if not which:
        return None
    try:
        served = _served_model(base_url, model, api_key)
    except Exception as e:  # noqa: BLE001 — reported
        return ServedChecks(skipped={w: f"no model name from the server: {e}" for w in which})
    facts: dict[str, Fact] = dict(identity.facts)
    if "context" in which:
        ctx = facts.get("context_tokens")
        limit = (
            ctx.value if ctx is not None and isinstance(ctx.value, int) and not isinstance(ctx.value, bool) else None
        )
        allowed = context_budget_s if budget_s is None else min(context_budget_s, budget_s)
        if limit is None or limit < 32:
            skipped["context"] = "no context size known (no context_tokens fact from the launcher or the server)"
        elif allowed <= 1:
            skipped["context"] = "trial budget spent (goal.budget.max_minutes)"
        else:
            c = check_context(
                base_url,
                served,
                limit,
                step_tokens=max(16, limit // 64),
                budget_s=allowed,
                timeout_s=timeout_s,
                api_key=api_key,
            )
            out.context = ContextCheck.model_validate(c.model_dump())  # every field set: written in full
            if c.accepted_tokens is not None:
                facts["accepted_context_tokens"] = Fact(value=c.accepted_tokens, source=f"context check ({c.verdict})")
    if "template" in which:
        tmpl, where, bos, eos = model_chat_template(identity.model)
        t = check_template(
            base_url, served, tmpl, reference=where, bos_token=bos, eos_token=eos, timeout_s=min(timeout_s, 30.0)
        )
        out.template = TemplateCheck.model_validate(t.model_dump())
        facts["chat_template"] = Fact(value=t.verdict if tmpl else "none in the model file", source="template check")
    identity.facts = facts
    if skipped:
        out.skipped = skipped
    return out
