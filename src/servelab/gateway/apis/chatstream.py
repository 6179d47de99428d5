"""Reading chat completions for translation: the parts of one streamed chunk or of one whole answer, in
the order an engine produced them (reasoning text, answer text, tool-call fragments, the finish reason).

Engines differ in where reasoning goes (``reasoning_content`` on llama-server/SGLang/TGI, ``reasoning`` on
vLLM/Ollama; docs/engine-wire.md case 10) and whether a tool call comes whole or in fragments (cases
13-14); both are read here once for every translated API. Only choice 0 is read: the translated APIs
have no ``n``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from servelab.gateway.sse import DONE, events

__all__ = ["Part", "ToolCall", "answer_parts", "chunk_events", "chunk_parts", "stop_string"]

_REASONING = ("reasoning_content", "reasoning")


@dataclass(frozen=True, slots=True)
class Part:
    """One piece of an answer: ``kind`` ``reasoning``/``text`` (``text`` holds it), ``tool`` (``index``:
    the call's position; ``call_id``/``name`` on its first fragment, else None; ``text``: an arguments
    fragment) or ``finish`` (``text``: the chat finish reason)."""

    kind: str
    text: str = ""
    index: int = 0
    call_id: str | None = None
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A whole tool call of a non-streamed answer: its id, function name and arguments (a JSON string)."""

    call_id: str
    name: str
    arguments: str


def _choice0(ev: dict[str, Any]) -> dict[str, Any] | None:
    choices = ev.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def chunk_events(block: bytes) -> Iterator[dict[str, Any] | None]:
    """Each chat chunk of an SSE ``block`` as a dict; None for ``data: [DONE]``; other events skipped."""
    for _, payload in events(block):
        if payload == DONE:
            yield None
            continue
        try:
            ev = orjson.loads(payload) if payload else None
        except orjson.JSONDecodeError:
            continue
        if isinstance(ev, dict):
            yield ev


def chunk_parts(ev: dict[str, Any]) -> Iterator[Part]:
    """The parts of one streamed chat chunk ``ev`` (module doc)."""
    ch = _choice0(ev)
    if ch is None:
        return
    delta = ch.get("delta")
    if isinstance(delta, dict):
        for f in _REASONING:
            v = delta.get(f)
            if isinstance(v, str) and v:
                yield Part("reasoning", v)
                break
        v = delta.get("content")
        if isinstance(v, str) and v:
            yield Part("text", v)
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            for i, tc in enumerate(calls):
                if not isinstance(tc, dict):
                    continue
                fobj = tc.get("function")
                fn: dict[str, Any] = fobj if isinstance(fobj, dict) else {}
                idx = tc.get("index")
                name = fn.get("name")
                args = fn.get("arguments")
                yield Part(
                    "tool",
                    args if isinstance(args, str) else "",
                    idx if isinstance(idx, int) else i,
                    tc.get("id") if isinstance(tc.get("id"), str) else None,
                    name if isinstance(name, str) and name else None,
                )
    fin = ch.get("finish_reason")
    if isinstance(fin, str) and fin:
        yield Part("finish", fin)


def answer_parts(answer: dict[str, Any]) -> tuple[str, str, list[ToolCall], str]:
    """A whole chat completion's choice 0 as (reasoning text, answer text, tool calls, finish reason)."""
    ch = _choice0(answer) or {}
    m = ch.get("message")
    msg: dict[str, Any] = m if isinstance(m, dict) else {}
    reasoning = next((v for f in _REASONING if isinstance(v := msg.get(f), str) and v), "")
    c = msg.get("content")
    text = c if isinstance(c, str) else ""
    calls: list[ToolCall] = []
    for i, tc in enumerate(msg.get("tool_calls") or ()):
        if isinstance(tc, dict) and isinstance(tc.get("function"), dict):
            fn = tc["function"]
            args = fn.get("arguments")
            calls.append(
                ToolCall(
                    str(tc.get("id") or f"call_{i}"),
                    str(fn.get("name") or ""),
                    args if isinstance(args, str) else orjson.dumps(args or {}).decode(),
                )
            )
    fin = ch.get("finish_reason")
    return reasoning, text, calls, fin if isinstance(fin, str) else "stop"


def stop_string(ev: dict[str, Any], stops: list[str]) -> str | None:
    """The stop string that ended choice 0 when the engine says which (vLLM's ``stop_reason``) and it is
    one of ``stops``; else None."""
    ch = _choice0(ev)
    v = ch.get("stop_reason") if ch is not None else None
    return v if isinstance(v, str) and v in stops else None
