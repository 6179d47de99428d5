"""OpenAI Responses (``POST /v1/responses``) translated to chat completions, served statelessly.

The Responses API as documented (https://platform.openai.com/docs/api-reference/responses and
/responses-streaming; checked 2026-12-01) mapped onto the chat-completions request every backend serves:

- ``instructions`` -> the first ``system`` message; ``input`` as a string (one user message) or items:
  messages (``role`` ``user``/``assistant``/``system``/``developer``, the last sent as ``system``; content a
  string or ``input_text``/``output_text``/``input_image`` parts), ``function_call`` items (-> the assistant's
  ``tool_calls``, consecutive calls in one message) and ``function_call_output`` items (-> ``tool``
  messages); ``reasoning`` items of earlier turns are dropped (chat completions has no field for them).
- ``max_output_tokens`` (1 ... ``server.max_tokens_limit``; absent: the gateway's default) -> ``max_tokens``;
  ``temperature``, ``top_p``, ``parallel_tool_calls`` as they are; ``tools`` of type ``function`` ->
  function tools; ``tool_choice`` ``auto``/``none``/``required``/``{"type": "function", "name"}``;
  ``text.format`` ``json_schema``/``json_object`` -> ``response_format``.
- accepted and not forwarded: ``store`` (nothing is ever stored: every answer says ``store: false``),
  ``metadata`` (echoed), ``user``, ``safety_identifier``, ``prompt_cache_key``, ``service_tier``,
  ``include``, ``reasoning`` (an engine reasons by its own template), ``truncation: "disabled"``.
- refused with one 400 line naming the field: ``previous_response_id`` and ``conversation`` (this gateway
  keeps no responses: replicas share no store and a per-tenant one would hold prompts the ledger
  deliberately does not; send the whole conversation in ``input``, as ``store: false`` clients do),
  ``background``, ``prompt``, ``truncation: "auto"``, built-in tools (``web_search``, ``file_search``,
  ``code_interpreter``, ``computer_use_preview``, ``mcp``, ...), item types it cannot carry, unknown fields.

The answer is a ``response`` object (``status`` ``completed``, or ``incomplete`` with ``incomplete_details
.reason: "max_output_tokens"`` when the bound cut it) with ``reasoning``, ``message`` (``output_text``) and
``function_call`` output items, and ``usage`` = the gateway's own count (what the ledger records). A stream
is the documented typed sequence, every event with its ``sequence_number``: ``response.created``,
``response.in_progress``, per item ``response.output_item.added``, its parts and deltas
(``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``; ``response.reasoning_text.delta``/``.done``;
``response.function_call_arguments.delta``/``.done``), ``response.output_item.done``, then
``response.completed`` (or ``response.incomplete``) with the whole response and its usage. A stream that
breaks after its first byte ends in ``response.failed``. Errors before the stream are OpenAI's shape, as for
chat completions.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from servelab.gateway.apis import RequestState, StreamingApi
from servelab.gateway.apis.chatstream import Part, answer_parts
from servelab.gateway.errors import GatewayError, bad_request

__all__ = ["ResponsesApi", "to_chat"]

_ACCEPTED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "stream",
        "text",
        "store",
        "metadata",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "include",
        "reasoning",
        "truncation",
        "stream_options",
    }
)
_STATEFUL = ("previous_response_id", "conversation")
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _content(v: Any, where: str) -> str | list[dict[str, Any]]:
    if isinstance(v, str):
        return v
    if not isinstance(v, list):
        raise bad_request(
            f"'{where}' must be a string or a list of content parts, got {_type_name(v)}",
            param=where,
            code="invalid_type",
        )
    parts: list[dict[str, Any]] = []
    for i, p in enumerate(v):
        kind = p.get("type") if isinstance(p, dict) else None
        if kind in _TEXT_PARTS and isinstance(p, dict) and isinstance(p.get("text", p.get("refusal")), str):
            parts.append({"type": "text", "text": p.get("text", p.get("refusal"))})
        elif kind == "input_image" and isinstance(p, dict) and isinstance(p.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": p["image_url"]}})
        else:
            raise bad_request(
                f"'{where}[{i}]': a {str(kind)[:40]!r} part is not supported here (input_text, "
                "output_text and input_image with an image_url are)",
                param=f"{where}[{i}]",
                code="unsupported_content",
            )
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _items(v: Any) -> list[dict[str, Any]]:
    if isinstance(v, str):
        return [{"role": "user", "content": v}]
    if not isinstance(v, list) or not v:
        raise bad_request("'input' must be a string or a non-empty list of items", param="input", code="invalid_value")
    out: list[dict[str, Any]] = []
    for i, it in enumerate(v):
        where = f"input[{i}]"
        kind = it.get("type", "message") if isinstance(it, dict) else None
        if not isinstance(it, dict):
            raise bad_request(f"'{where}' must be an object", param=where, code="invalid_type")
        if kind == "message":
            role = _ROLES.get(it.get("role"))  # type: ignore[arg-type]
            if role is None:
                raise bad_request(
                    f"'{where}.role' must be user, assistant, system or developer",
                    param=f"{where}.role",
                    code="invalid_value",
                )
            out.append({"role": role, "content": _content(it.get("content"), f"{where}.content")})
        elif kind == "function_call":
            if not all(isinstance(it.get(k), str) for k in ("call_id", "name", "arguments")):
                raise bad_request(
                    f"'{where}' needs string 'call_id', 'name' and 'arguments'", param=where, code="invalid_value"
                )
            call = {
                "id": it["call_id"],
                "type": "function",
                "function": {"name": it["name"], "arguments": it["arguments"]},
            }
            if out and out[-1]["role"] == "assistant" and "tool_calls" in out[-1]:
                out[-1]["tool_calls"].append(call)
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = it.get("output")
            if not isinstance(it.get("call_id"), str):
                raise bad_request(
                    f"'{where}.call_id' must be the call_id of the function_call it answers",
                    param=f"{where}.call_id",
                    code="invalid_value",
                )
            text = output if isinstance(output, str) else _content(output, f"{where}.output")
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": it["call_id"],
                    "content": text if isinstance(text, str) else orjson.dumps(text).decode(),
                }
            )
        elif kind == "reasoning":
            continue
        else:
            raise bad_request(
                f"'{where}': a {str(kind)[:40]!r} item is not supported (message, function_call, "
                "function_call_output and reasoning items are)",
                param=where,
                code="unsupported_item",
            )
    return out


def _tools(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise bad_request(f"'tools' must be a list, got {_type_name(v)}", param="tools", code="invalid_type")
    out = []
    for i, t in enumerate(v):
        kind = t.get("type") if isinstance(t, dict) else None
        if kind != "function" or not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise bad_request(
                f"'tools[{i}]': the built-in tool {str(kind)[:60]!r} is not available through this "
                "gateway (it has no tool runner); only function tools with a name are",
                param=f"tools[{i}]",
                code="unsupported_tool",
            )
        fn = {"name": t["name"], "parameters": t.get("parameters") or {"type": "object", "properties": {}}}
        for k in ("description", "strict"):
            if t.get(k) is not None:
                fn[k] = t[k]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: Any) -> Any:
    if v in ("auto", "none", "required"):
        return v
    if isinstance(v, dict) and v.get("type") == "function" and isinstance(v.get("name"), str):
        return {"type": "function", "function": {"name": v["name"]}}
    raise bad_request(
        '\'tool_choice\' must be auto, none, required or {"type": "function", "name": ...}',
        param="tool_choice",
        code="invalid_value",
    )


def _text_format(v: Any) -> dict[str, Any] | None:
    fmt = v.get("format") if isinstance(v, dict) else None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if fmt is None or kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema" and isinstance(fmt, dict) and isinstance(fmt.get("schema"), dict):
        return {
            "type": "json_schema",
            "json_schema": {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt},
        }
    raise bad_request(
        '\'text.format\' must be {"type": "text"}, {"type": "json_object"} or '
        '{"type": "json_schema", "name", "schema"}',
        param="text.format",
        code="invalid_value",
    )


def to_chat(body: dict[str, Any], max_tokens_limit: int) -> dict[str, Any]:
    """The chat-completions body for a Responses ``body`` (module doc). ``max_tokens_limit``: the gateway's
    cap on ``max_output_tokens`` (tokens). Raises GatewayError 400 naming the field."""
    for k in _STATEFUL:
        if body.get(k) is not None:
            raise bad_request(
                f"'{k}' is not supported: this gateway keeps no responses (stateless, as with "
                "store: false); send the whole conversation in 'input'",
                param=k,
                code="unsupported_parameter",
            )
    for k in body:
        if k not in _ACCEPTED:
            raise bad_request(
                f"'{k[:60]}' is not a field this gateway's /v1/responses accepts",
                param=k[:60],
                code="unsupported_parameter",
            )
    if body.get("truncation") not in (None, "disabled"):
        raise bad_request(
            "'truncation' must be 'disabled': this gateway does not drop input to fit the context",
            param="truncation",
            code="unsupported_parameter",
        )
    msgs = _items(body.get("input"))
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise bad_request("'instructions' must be a string", param="instructions", code="invalid_type")
        msgs.insert(0, {"role": "system", "content": body["instructions"]})
    chat: dict[str, Any] = {"model": body.get("model"), "messages": msgs}
    mt = body.get("max_output_tokens")
    if mt is not None:
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise bad_request(
                f"'max_output_tokens' must be an integer >= 1, got {mt!r}"[:200],
                param="max_output_tokens",
                code="invalid_value",
            )
        if mt > max_tokens_limit:
            raise bad_request(
                f"'max_output_tokens' {mt} is above this gateway's limit of {max_tokens_limit} tokens; "
                f"ask for {max_tokens_limit} or fewer",
                param="max_output_tokens",
                code="max_tokens_too_large",
            )
        chat["max_tokens"] = mt
    for k in ("temperature", "top_p", "parallel_tool_calls", "stream"):
        if body.get(k) is not None:
            chat[k] = body[k]
    if body.get("tools"):
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    fmt = _text_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    if chat.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}
    return chat


class ResponsesApi(StreamingApi):
    """One ``/v1/responses`` request (module doc): the translation and the stream's state."""

    name = "responses"
    native: str | None = "responses"

    def __init__(self) -> None:
        super().__init__()
        self.echo: dict[str, Any] = {}
        self.created = int(time.time())
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # finished items
        self.item: dict[str, Any] | None = None  # the open item
        self.tools: dict[int, dict[str, Any]] = {}  # chat tool index -> its function_call item

    def translate(self, body: dict[str, Any], max_tokens_limit: int) -> dict[str, Any]:
        chat = to_chat(body, max_tokens_limit)
        self.source = dict(body)
        self.echo = {
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "metadata": body.get("metadata") if isinstance(body.get("metadata"), dict) else {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "temperature": body.get("temperature"),
            "top_p": body.get("top_p"),
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "text": body.get("text") if isinstance(body.get("text"), dict) else {"format": {"type": "text"}},
        }
        return chat

    def _response(
        self,
        r: RequestState,
        status: str,
        output: list[dict[str, Any]],
        usage: bool,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        u = None
        if usage:
            pt, ct = r.prompt_tokens or 0, r.completion_tokens or 0
            u = {
                "input_tokens": pt,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": ct,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": pt + ct,
            }
        return {
            "id": f"resp_{r.rid}",
            "object": "response",
            "created_at": self.created,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "model": r.model,
            "output": output,
            "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None},
            "store": False,
            "truncation": "disabled",
            "usage": u,
            **self.echo,
        }

    def _status(self) -> str:
        return "incomplete" if self.finish == "length" else "completed"

    def whole(self, answer: dict[str, Any], r: RequestState) -> bytes:
        reasoning, text, calls, self.finish = answer_parts(answer)
        out: list[dict[str, Any]] = []
        if reasoning:
            out.append(_reasoning_item(r, reasoning))
        if text or not calls:
            out.append(_message_item(r, text, "completed"))
        for i, c in enumerate(calls):
            out.append(
                {
                    "type": "function_call",
                    "id": f"fc_{r.rid}_{i}",
                    "call_id": c.call_id,
                    "name": c.name,
                    "arguments": c.arguments,
                    "status": "completed",
                }
            )
        return orjson.dumps(self._response(r, self._status(), out, True))

    # ---------------------------------------------------------------- streaming
    def _ev(self, kind: str, data: dict[str, Any]) -> bytes:
        ev = {"type": kind, "sequence_number": self.seq, **data}
        self.seq += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(ev) + b"\n\n"

    def opening(self, r: RequestState) -> bytes:
        resp = self._response(r, "in_progress", [], False)
        return self._ev("response.created", {"response": resp}) + self._ev("response.in_progress", {"response": resp})

    def _index(self) -> int:
        return len(self.output)

    def _close(self) -> bytes:
        it = self.item
        if it is None:
            return b""
        self.item = None
        i = self._index()
        out = b""
        if it["type"] == "message":
            text = it["content"][0]["text"]
            ids = {"item_id": it["id"], "output_index": i, "content_index": 0}
            out += self._ev("response.output_text.done", {**ids, "text": text, "logprobs": []})
            out += self._ev("response.content_part.done", {**ids, "part": it["content"][0]})
        elif it["type"] == "reasoning":
            ids = {"item_id": it["id"], "output_index": i, "content_index": 0}
            out += self._ev("response.reasoning_text.done", {**ids, "text": it["content"][0]["text"]})
        else:
            out += self._ev(
                "response.function_call_arguments.done",
                {"item_id": it["id"], "output_index": i, "arguments": it["arguments"]},
            )
        it["status"] = "completed"
        out += self._ev("response.output_item.done", {"output_index": i, "item": it})
        self.output.append(it)
        return out

    def _open(self, it: dict[str, Any]) -> bytes:
        out = self._close()
        self.item = it
        shown = {**it, "content": []} if "content" in it else it
        out += self._ev("response.output_item.added", {"output_index": self._index(), "item": shown})
        if it["type"] == "message":
            out += self._ev(
                "response.content_part.added",
                {
                    "item_id": it["id"],
                    "output_index": self._index(),
                    "content_index": 0,
                    "part": dict(it["content"][0]),
                },
            )
        return out

    def on_part(self, p: Part, r: RequestState) -> bytes:
        out = b""
        it = self.item
        if p.kind == "reasoning":
            if it is None or it["type"] != "reasoning":
                out += self._open(_reasoning_item(r, "", len(self.output)))
            assert self.item is not None
            self.item["content"][0]["text"] += p.text
            return out + self._ev(
                "response.reasoning_text.delta",
                {"item_id": self.item["id"], "output_index": self._index(), "content_index": 0, "delta": p.text},
            )
        if p.kind == "text":
            if it is None or it["type"] != "message":
                out += self._open(_message_item(r, "", "in_progress", len(self.output)))
            assert self.item is not None
            self.item["content"][0]["text"] += p.text
            return out + self._ev(
                "response.output_text.delta",
                {
                    "item_id": self.item["id"],
                    "output_index": self._index(),
                    "content_index": 0,
                    "delta": p.text,
                    "logprobs": [],
                },
            )
        if p.index not in self.tools:
            call = {
                "type": "function_call",
                "id": f"fc_{r.rid}_{p.index}",
                "call_id": p.call_id or f"call_{r.rid}_{p.index}",
                "name": p.name or "",
                "arguments": "",
                "status": "in_progress",
            }
            self.tools[p.index] = call
            out += self._open(call)
        call = self.tools[p.index]
        if p.text and call is self.item:
            call["arguments"] += p.text
            out += self._ev(
                "response.function_call_arguments.delta",
                {"item_id": call["id"], "output_index": self._index(), "delta": p.text},
            )
        return out

    def closing(self, r: RequestState) -> bytes:
        out = self._close()
        status = self._status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self._ev(kind, {"response": self._response(r, status, self.output, True)})

    def failure(self, e: GatewayError, r: RequestState) -> bytes:
        err = {"code": e.code or "server_error", "message": e.message}
        return self._ev("response.failed", {"response": self._response(r, "failed", self.output, True, err)})


def _message_item(r: RequestState, text: str, status: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "message",
        "id": f"msg_{r.rid}_{n}",
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
    }


def _reasoning_item(r: RequestState, text: str, n: int = 0) -> dict[str, Any]:
    return {
        "type": "reasoning",
        "id": f"rs_{r.rid}_{n}",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }
