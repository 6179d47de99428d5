"""What one request gets from the mock engine: its tokens (reasoning, content, a tool call or a JSON
object for a schema), cut by ``max_tokens`` and stop strings, grouped into chunks, with the finish
reason, as a :class:`Plan` the encoders (:mod:`servelab.engines.mock.encoders`) write in a dialect."""

from __future__ import annotations

from typing import Any

import orjson

from servelab.engines.mock.cache import prompt_words
from servelab.engines.mock.config import MockConfig
from servelab.wire.dialects import stream_rules

__all__ = ["Plan", "break_json", "count_words", "plan_answer"]


def count_words(body: dict[str, Any]) -> int:
    """Prompt size: whitespace-separated words of all message texts (chat) or of the prompt(s)."""
    return len(prompt_words(body))


def _object_from_schema(schema: Any) -> dict[str, Any]:
    """A small JSON object satisfying the required string/number/integer/boolean fields of ``schema``."""
    out: dict[str, Any] = {}
    if not isinstance(schema, dict):
        return {"answer": "mock"}
    raw_props, raw_required = schema.get("properties"), schema.get("required")
    props: dict[str, Any] = raw_props if isinstance(raw_props, dict) else {}
    required: list[Any] = raw_required if isinstance(raw_required, list) else list(props)
    for i, name in enumerate(required):
        p = props.get(name, {}) if isinstance(props.get(name), dict) else {}
        t = p.get("type")
        if isinstance(t, list):
            t = next((x for x in t if x != "null"), "string")
        out[name] = _value_from_schema(p, t, i)
    return out or {"answer": "mock"}


def _value_from_schema(p: dict[str, Any], t: Any, i: int) -> Any:
    """One value of type ``t`` for property schema ``p``: an enum's first member, a number within
    ``minimum``/``maximum``, an array of ``minItems`` items, a nested object, else ``"tok<i>"``."""
    if "enum" in p and p["enum"]:
        return p["enum"][0]
    if t in ("integer", "number"):
        v: float = i if t == "integer" else i + 0.5
        lo, hi = p.get("minimum"), p.get("maximum")
        v = max(v, lo) if isinstance(lo, int | float) else v
        v = min(v, hi) if isinstance(hi, int | float) else v
        return int(v) if t == "integer" else v
    if t == "boolean":
        return True
    if t == "array":
        n = p.get("minItems", 0)
        raw_items = p.get("items")
        items: dict[str, Any] = raw_items if isinstance(raw_items, dict) else {}
        it = items.get("type")
        return [
            _value_from_schema(items, it, j) if it != "object" else _object_from_schema(items)
            for j in range(n if isinstance(n, int) else 0)
        ]
    if t == "object":
        return _object_from_schema(p)
    return f"tok{i}"


def break_json(text: str) -> str:
    """``text`` (a JSON object) cut so that it no longer parses: after its last top-level-ish comma
    (``{"name":"tok0",``), else without its closing brace (``{"answer":"mock"``)."""
    cut = text.rfind(",")
    return text[: cut + 1] if cut > 0 else text[:-1]


def _split(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


class Plan:
    """What one request will generate: token chunks as (kind, text, ntokens) plus the finish reason.
    kind: ``r`` reasoning, ``c`` content, ``t`` tool-call arguments fragment."""

    __slots__ = ("chunks", "finish", "generated", "tool_name", "tool_id", "named_tool")

    def __init__(self) -> None:
        self.chunks: list[tuple[str, str, int]] = []
        self.finish = "stop"
        self.generated = 0
        self.tool_name: str | None = None
        self.tool_id = "call_mock0"
        self.named_tool = False


def _apply_stop(pieces: list[tuple[str, str]], stops: list[str]) -> tuple[list[tuple[str, str]], bool]:
    """Cut the answer (content pieces) right before the first stop string, as engines do: the text
    before it is kept (a token may be cut part-way), the stop string itself is never sent.
    Returns (pieces, whether a stop string was hit)."""
    text = "".join(p for kind, p in pieces if kind == "c")
    cut = min((i for i in (text.find(x) for x in stops) if i >= 0), default=-1)
    if cut < 0:
        return pieces, False
    out: list[tuple[str, str]] = []
    pos = 0
    for kind, p in pieces:
        if kind != "c":
            out.append((kind, p))
            continue
        if pos + len(p) > cut:
            if cut > pos:
                out.append((kind, p[: cut - pos]))
            break
        out.append((kind, p))
        pos += len(p)
    return out, True


def plan_answer(cfg: MockConfig, body: dict[str, Any], chat: bool) -> Plan:
    """The :class:`Plan` of the answer to request ``body`` (``chat``: /v1/chat/completions) under ``cfg``."""
    plan = Plan()
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = mt if isinstance(mt, int) and mt >= 0 else None
    k = cfg.tokens_per_chunk
    tools = body.get("tools") if chat else None
    tool_choice = body.get("tool_choice", "auto")
    msgs = body.get("messages")
    if (
        tool_choice == "auto"
        and isinstance(msgs, list)
        and msgs
        and isinstance(msgs[-1], dict)
        and msgs[-1].get("role") == "tool"
    ):
        tools = None  # an agent loop's tool result came back: answer it in text, as a model does
    rf = body.get("response_format")
    pieces: list[tuple[str, str]] = []  # (kind, text) one token each
    if chat:
        pieces += [("r", f" think{i}") for i in range(cfg.reasoning_tokens)]
    if tools and isinstance(tools, list) and tool_choice != "none" and isinstance(tools[0], dict):
        fn = tools[0].get("function") or {}
        if isinstance(tool_choice, dict):
            fn_named = (tool_choice.get("function") or {}).get("name")
            fn = next(
                (
                    t.get("function") or {}
                    for t in tools
                    if isinstance(t, dict) and (t.get("function") or {}).get("name") == fn_named
                ),
                fn,
            )
            plan.named_tool = True
        plan.tool_name = str(fn.get("name") or "tool")
        args = orjson.dumps(_object_from_schema(fn.get("parameters"))).decode()
        if cfg.bad_tool_call == "json":
            args = break_json(args)
        elif cfg.bad_tool_call == "schema":
            args = orjson.dumps({"unexpected_field": True}).decode()  # required fields missing
        elif cfg.bad_tool_call == "name":
            plan.tool_name += "_not_offered"
        # fragments on vLLM/SGLang/llama-server/TGI, one whole call on Ollama (cases 13-14)
        pieces += [("t", p) for p in ([args] if stream_rules(cfg.dialect).tool_calls_whole else _split(args, 6))]
    elif isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object"):
        schema = (rf.get("json_schema") or {}).get("schema") if rf.get("type") == "json_schema" else None
        text = orjson.dumps(_object_from_schema(schema) if schema is not None else {"answer": "mock"}).decode()
        if cfg.invalid_json:
            text = break_json(text)
        pieces += [("c", p) for p in _split(text, 4)]
    else:
        pieces += [("c", f" tok{i}") for i in range(cfg.output_tokens)]
    if limit is not None and len(pieces) > limit:
        pieces = pieces[:limit]
        plan.finish = "length"
    stops = body.get("stop")
    if isinstance(stops, str):
        stops = [stops]
    if isinstance(stops, list) and plan.tool_name is None:
        pieces, hit = _apply_stop(pieces, [x for x in stops if isinstance(x, str) and x])
        if hit:
            plan.finish = "stop"
    if plan.tool_name is not None and plan.finish != "length":
        plan.finish = "stop" if plan.named_tool else "tool_calls"  # vLLM named tool_choice: case 12
    plan.generated = len(pieces)
    # group into chunks of k tokens of the same kind
    i = 0
    while i < len(pieces):
        kind = pieces[i][0]
        j = i
        while j < len(pieces) and j - i < k and pieces[j][0] == kind:
            j += 1
        plan.chunks.append((kind, "".join(p[1] for p in pieces[i:j]), j - i))
        i = j
    return plan
