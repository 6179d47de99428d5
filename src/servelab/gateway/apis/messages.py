"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``) translated to chat completions.

The Messages API as documented (https://docs.anthropic.com/en/api/messages, /en/api/messages-streaming,
/en/api/errors; checked 2026-12-01) mapped onto the chat-completions request every backend serves:

- ``system`` (a string or text blocks) -> the first ``system`` message; ``messages`` with ``text``,
  ``image`` (base64 or URL source), ``tool_use`` (-> the assistant's ``tool_calls``, arguments as JSON) and
  ``tool_result`` (-> ``tool`` messages, placed before the rest of that user turn) blocks; ``thinking`` and
  ``redacted_thinking`` blocks of earlier turns are dropped (chat completions has no field for them);
  ``cache_control`` is ignored (prefix caching is the engine's own).
- ``max_tokens`` (required, 1 ... ``server.max_tokens_limit``), ``stop_sequences`` -> ``stop``,
  ``temperature``/``top_p``/``top_k`` as they are (the sampling policy of the model then applies).
- ``tools`` (custom tools: ``name``, ``description``, ``input_schema``) -> function tools;
  ``tool_choice`` ``auto``/``any``/``tool``/``none`` -> ``auto``/``required``/the named function/``none``,
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``.
- accepted and not forwarded: ``metadata`` (a user id is not the engine's business), ``service_tier``,
  ``thinking`` (an engine reasons or not by its own template), the ``anthropic-version`` and
  ``anthropic-beta`` headers.
- refused with one 400 line naming the field: server tools (``web_search_*``, ``bash_*``, ...), ``mcp_servers``,
  ``container``, block types it cannot carry (``document``, ``search_result``, ...), any unknown field.

The answer: chat finish ``stop`` -> ``end_turn`` (``stop_sequence`` when the engine says which stop string
ended it, vLLM's ``stop_reason``), ``length`` -> ``max_tokens``, ``tool_calls`` (or a tool call under
``stop``) -> ``tool_use``; reasoning text -> a ``thinking`` block (``signature`` empty: no signature is made
up). Usage is the gateway's own count of the request (what the ledger records): ``input_tokens`` =
the engine's prompt tokens, ``output_tokens`` its completion tokens. A stream is the documented sequence
``message_start``, ``ping``, then per block ``content_block_start``/``content_block_delta``.../
``content_block_stop``, then ``message_delta`` (``stop_reason``, ``usage``) and ``message_stop``. Chat
streams report usage only at their end, so ``message_start`` carries ``input_tokens: 0`` and
``message_delta`` the exact ``input_tokens`` and ``output_tokens`` (the SDKs take the delta's values).

Errors are Anthropic's shape ``{"type": "error", "error": {"type", "message"}, "request_id"}`` with the
status the gateway decided; 503 and 529 are ``overloaded_error``. ``/v1/messages/count_tokens`` is counted
by the engine that would serve the request (a one-token generation; its prompt usage is the answer), so
it goes through the same keys, limits and ledger.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from servelab.gateway.apis import RequestState, StreamingApi
from servelab.gateway.apis.chatstream import Part, answer_parts, stop_string
from servelab.gateway.errors import GatewayError, bad_request

__all__ = ["CountTokensApi", "MessagesApi", "anthropic_error_body", "anthropic_error_type"]

#: Anthropic error ``type`` by HTTP status (https://docs.anthropic.com/en/api/errors)
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}
_STOP_REASON = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_TOP_FIELDS = frozenset(
    {
        "model",
        "messages",
        "max_tokens",
        "system",
        "stop_sequences",
        "temperature",
        "top_p",
        "top_k",
        "tools",
        "tool_choice",
        "stream",
        "metadata",
        "service_tier",
        "thinking",
    }
)
_COUNT_FIELDS = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking"})
_SKIPPED_BLOCKS = frozenset({"thinking", "redacted_thinking"})


def anthropic_error_type(status: int) -> str:
    """Anthropic's error ``type`` for HTTP ``status``: ``overloaded_error`` for 503/529, ``api_error`` for
    other 5xx."""
    return _TYPE_BY_STATUS.get(status, "api_error" if status >= 500 else "invalid_request_error")


def anthropic_error_body(e: GatewayError, rid: str) -> bytes:
    """``{"type": "error", "error": {"type", "message"}, "request_id"}`` for ``e`` (its message is already
    free of internals)."""
    return orjson.dumps(
        {"type": "error", "error": {"type": anthropic_error_type(e.status), "message": e.message}, "request_id": rid}
    )


def _type_name(v: Any) -> str:
    return "null" if v is None else type(v).__name__


def _text_of(v: Any, where: str) -> str:
    """A string, or text blocks joined (system, tool_result content)."""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        out = []
        for i, b in enumerate(v):
            if not isinstance(b, dict) or b.get("type") != "text" or not isinstance(b.get("text"), str):
                raise bad_request(
                    f'\'{where}[{i}]\' must be a text block {{"type": "text", "text": ...}}',
                    param=f"{where}[{i}]",
                    code="invalid_value",
                )
            out.append(b["text"])
        return "\n".join(out)
    raise bad_request(
        f"'{where}' must be a string or a list of text blocks, got {_type_name(v)}", param=where, code="invalid_type"
    )


def _image(b: dict[str, Any], where: str) -> dict[str, Any]:
    src = b.get("source")
    if isinstance(src, dict) and src.get("type") == "base64" and isinstance(src.get("data"), str):
        url = f"data:{src.get('media_type') or 'image/png'};base64,{src['data']}"
    elif isinstance(src, dict) and src.get("type") == "url" and isinstance(src.get("url"), str):
        url = src["url"]
    else:
        raise bad_request(
            f"'{where}.source' must be a base64 or url image source", param=f"{where}.source", code="invalid_value"
        )
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(b: dict[str, Any], where: str) -> dict[str, Any]:
    tid = b.get("tool_use_id")
    if not isinstance(tid, str) or not tid:
        raise bad_request(
            f"'{where}.tool_use_id' must be the id of the tool_use block it answers",
            param=f"{where}.tool_use_id",
            code="invalid_value",
        )
    content = b.get("content", "")
    text = _text_of(
        [x for x in content if not (isinstance(x, dict) and x.get("type") == "image")]
        if isinstance(content, list)
        else content,
        f"{where}.content",
    )
    if b.get("is_error") is True:
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": tid, "content": text}


def _turn(m: Any, i: int) -> list[dict[str, Any]]:
    """One Anthropic message as chat messages (tool results first, as the chat API orders them)."""
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise bad_request(f"'{where}' must be an object with 'role' and 'content'", param=where, code="invalid_type")
    role = m.get("role")
    if role not in ("user", "assistant"):
        raise bad_request(
            f"'{where}.role' must be 'user' or 'assistant', got {role!r}"[:200],
            param=f"{where}.role",
            code="invalid_value",
        )
    content = m.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad_request(
            f"'{where}.content' must be a string or a list of content blocks, got {_type_name(content)}",
            param=f"{where}.content",
            code="invalid_type",
        )
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    for j, b in enumerate(content):
        bw = f"{where}.content[{j}]"
        kind = b.get("type") if isinstance(b, dict) else None
        if kind == "text" and isinstance(b, dict) and isinstance(b.get("text"), str):
            parts.append({"type": "text", "text": b["text"]})
        elif kind == "image" and isinstance(b, dict) and role == "user":
            parts.append(_image(b, bw))
        elif kind == "tool_result" and isinstance(b, dict) and role == "user":
            tools.append(_tool_result(b, bw))
        elif kind == "tool_use" and isinstance(b, dict) and role == "assistant":
            if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                raise bad_request(f"'{bw}' needs a string 'id' and 'name'", param=bw, code="invalid_value")
            calls.append(
                {
                    "id": b["id"],
                    "type": "function",
                    "function": {"name": b["name"], "arguments": orjson.dumps(b.get("input") or {}).decode()},
                }
            )
        elif kind in _SKIPPED_BLOCKS and role == "assistant":
            continue
        else:
            raise bad_request(
                f"'{bw}': a {str(kind)[:40]!r} block is not supported in a {role} message here "
                "(text, image, tool_use and tool_result blocks are)",
                param=bw,
                code="unsupported_content",
            )
    out = list(tools)
    if calls:
        out.append({"role": "assistant", "content": _join(parts) or None, "tool_calls": calls})
    elif parts or not tools:
        out.append({"role": role, "content": _join(parts) if all(p["type"] == "text" for p in parts) else parts})
    return out


def _join(parts: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in parts)


def _tools(v: Any) -> list[dict[str, Any]]:
    if not isinstance(v, list):
        raise bad_request(f"'tools' must be a list, got {_type_name(v)}", param="tools", code="invalid_type")
    out = []
    for i, t in enumerate(v):
        kind = t.get("type", "custom") if isinstance(t, dict) else None
        if kind != "custom" or not isinstance(t, dict):
            raise bad_request(
                f"'tools[{i}]': the server tool {str(kind)[:60]!r} is not available through this "
                "gateway (it has no tool runner); define it as a custom tool with name, "
                "description and input_schema",
                param=f"tools[{i}]",
                code="unsupported_tool",
            )
        if not isinstance(t.get("name"), str) or not isinstance(t.get("input_schema", {}), dict):
            raise bad_request(
                f"'tools[{i}]' needs a string 'name' and an object 'input_schema'",
                param=f"tools[{i}]",
                code="invalid_value",
            )
        fn: dict[str, Any] = {"name": t["name"], "parameters": t.get("input_schema") or {"type": "object"}}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(v: Any, chat: dict[str, Any]) -> None:
    kind = v.get("type") if isinstance(v, dict) else None
    if kind == "auto":
        chat["tool_choice"] = "auto"
    elif kind == "any":
        chat["tool_choice"] = "required"
    elif kind == "none":
        chat["tool_choice"] = "none"
    elif kind == "tool" and isinstance(v, dict) and isinstance(v.get("name"), str):
        chat["tool_choice"] = {"type": "function", "function": {"name": v["name"]}}
    else:
        raise bad_request(
            '\'tool_choice\' must be {"type": "auto"|"any"|"none"} or {"type": "tool", "name": ...}',
            param="tool_choice",
            code="invalid_value",
        )
    if isinstance(v, dict) and v.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def to_chat(body: dict[str, Any], max_tokens_limit: int, fields: frozenset[str] = _TOP_FIELDS) -> dict[str, Any]:
    """The chat-completions body for an Anthropic Messages ``body`` (module doc). ``max_tokens_limit``:
    the gateway's cap on ``max_tokens`` (tokens). Raises GatewayError 400 naming the field."""
    for k in body:
        if k not in fields:
            raise bad_request(
                f"'{k[:60]}' is not a field this gateway's /v1/messages accepts",
                param=k[:60],
                code="unsupported_parameter",
            )
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise bad_request(
            "'messages' must be a non-empty list of {role, content}", param="messages", code="invalid_value"
        )
    chat: dict[str, Any] = {"model": body.get("model"), "messages": []}
    if "system" in body:
        chat["messages"].append({"role": "system", "content": _text_of(body["system"], "system")})
    for i, m in enumerate(msgs):
        chat["messages"] += _turn(m, i)
    if "max_tokens" in fields:
        mt = body.get("max_tokens")
        if mt is None:
            raise bad_request(
                "'max_tokens' is required: the most tokens to generate",
                param="max_tokens",
                code="missing_required_parameter",
            )
        if not isinstance(mt, int) or isinstance(mt, bool) or mt < 1:
            raise bad_request(
                f"'max_tokens' must be an integer >= 1, got {mt!r}"[:200], param="max_tokens", code="invalid_value"
            )
        if mt > max_tokens_limit:
            raise bad_request(
                f"'max_tokens' {mt} is above this gateway's limit of {max_tokens_limit} tokens; ask "
                f"for {max_tokens_limit} or fewer",
                param="max_tokens",
                code="max_tokens_too_large",
            )
        chat["max_tokens"] = mt
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
            raise bad_request(
                "'stop_sequences' must be a list of non-empty strings", param="stop_sequences", code="invalid_value"
            )
        chat["stop"] = stops
    for k in ("temperature", "top_p", "top_k"):
        if k in body:
            chat[k] = body[k]
    if "stream" in body:
        chat["stream"] = body["stream"]
    if "tools" in body:
        chat["tools"] = _tools(body["tools"])
    if "tool_choice" in body:
        _tool_choice(body["tool_choice"], chat)
    if chat.get("stream") is True:
        chat["stream_options"] = {"include_usage": True}
    return chat


def _usage(r: RequestState) -> dict[str, int]:
    return {"input_tokens": r.prompt_tokens or 0, "output_tokens": r.completion_tokens or 0}


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class MessagesApi(StreamingApi):
    """One ``/v1/messages`` request (module doc): the translation and the stream's state."""

    name = "messages"
    native: str | None = "messages"

    def __init__(self) -> None:
        super().__init__()
        self.stops: list[str] = []
        self.block = -1  # index of the open content block, -1 = none
        self.block_kind = ""
        self.tool_blocks: dict[int, int] = {}  # chat tool-call index -> content block index
        self.tool_called = False
        self.stop_seq: str | None = None

    def key_header(self, request: web.Request) -> str | None:
        """``x-api-key`` (how the Anthropic SDKs send a key), else ``Authorization: Bearer``; an empty
        ``x-api-key`` counts as absent, so it does not hide a Bearer key sent beside it."""
        key = request.headers.get("x-api-key")
        if key is not None and key.strip():
            return key
        value = request.headers.get("Authorization")
        if value is None:
            raise GatewayError(
                401,
                "Missing API key: send it as 'x-api-key: sk-sl-...' (or 'Authorization: Bearer sk-sl-...')",
                code="invalid_api_key",
            )
        return value

    def translate(self, body: dict[str, Any], max_tokens_limit: int) -> dict[str, Any]:
        chat = to_chat(body, max_tokens_limit)
        self.stops = list(chat.get("stop") or ())
        self.source = dict(body)
        return chat

    def _stop_reason(self) -> str:
        if self.stop_seq is not None:
            return "stop_sequence"
        if self.tool_called and self.finish in ("stop", "tool_calls"):
            return "tool_use"
        return _STOP_REASON.get(self.finish, "end_turn")

    def whole(self, answer: dict[str, Any], r: RequestState) -> bytes:
        reasoning, text, calls, self.finish = answer_parts(answer)
        self.tool_called = bool(calls)
        self.stop_seq = stop_string(answer, self.stops)
        content: list[dict[str, Any]] = []
        if reasoning:
            content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
        if text:
            content.append({"type": "text", "text": text})
        for c in calls:
            try:
                args = orjson.loads(c.arguments) if c.arguments else {}
            except orjson.JSONDecodeError:
                args = {"_unparsed_arguments": c.arguments}  # the model's broken JSON, kept for the client
            content.append({"type": "tool_use", "id": c.call_id, "name": c.name, "input": args})
        return orjson.dumps(
            {
                "id": f"msg_{r.rid}",
                "type": "message",
                "role": "assistant",
                "model": r.model,
                "content": content,
                "stop_reason": self._stop_reason(),
                "stop_sequence": self.stop_seq,
                "usage": _usage(r),
            }
        )

    # ---------------------------------------------------------------- streaming
    def opening(self, r: RequestState) -> bytes:
        msg: dict[str, Any] = {
            "id": f"msg_{r.rid}",
            "type": "message",
            "role": "assistant",
            "model": r.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _sse("message_start", {"message": msg}) + _sse("ping", {})

    def _close_block(self) -> bytes:
        if self.block < 0 or not self.block_kind:
            return b""
        self.block_kind = ""
        return _sse("content_block_stop", {"index": self.block})

    def _open(self, kind: str, block: dict[str, Any]) -> bytes:
        out = self._close_block()
        self.block += 1
        self.block_kind = kind
        return out + _sse("content_block_start", {"index": self.block, "content_block": block})

    def on_chunk(self, ev: dict[str, Any]) -> None:
        if self.stop_seq is None:
            self.stop_seq = stop_string(ev, self.stops)

    def on_part(self, p: Part, r: RequestState) -> bytes:
        out = b""
        if p.kind == "reasoning":
            if self.block_kind != "thinking":
                out += self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return out + _sse(
                "content_block_delta", {"index": self.block, "delta": {"type": "thinking_delta", "thinking": p.text}}
            )
        if p.kind == "text":
            if self.block_kind != "text":
                out += self._open("text", {"type": "text", "text": ""})
            return out + _sse(
                "content_block_delta", {"index": self.block, "delta": {"type": "text_delta", "text": p.text}}
            )
        self.tool_called = True
        if p.index not in self.tool_blocks:
            out += self._open(
                "tool",
                {"type": "tool_use", "id": p.call_id or f"toolu_{r.rid}_{p.index}", "name": p.name or "", "input": {}},
            )
            self.tool_blocks[p.index] = self.block
        if p.text:
            out += _sse(
                "content_block_delta",
                {"index": self.tool_blocks[p.index], "delta": {"type": "input_json_delta", "partial_json": p.text}},
            )
        return out

    def closing(self, r: RequestState) -> bytes:
        return (
            self._close_block()
            + _sse(
                "message_delta",
                {"delta": {"stop_reason": self._stop_reason(), "stop_sequence": self.stop_seq}, "usage": _usage(r)},
            )
            + _sse("message_stop", {})
        )

    def failure(self, e: GatewayError, r: RequestState) -> bytes:
        return _sse("error", {"error": {"type": anthropic_error_type(e.status), "message": e.message}})

    def error_response(self, e: GatewayError, rid: str) -> web.Response:
        return web.Response(
            status=e.status,
            body=anthropic_error_body(e, rid),
            content_type="application/json",
            headers={"X-Request-ID": rid, "request-id": rid, **e.headers()},
        )


class CountTokensApi(MessagesApi):
    """``/v1/messages/count_tokens``: the request's prompt counted by the engine that would serve it (a
    one-token generation, not streamed); answers ``{"input_tokens": N}``."""

    name = "count_tokens"
    native = None

    def translate(self, body: dict[str, Any], max_tokens_limit: int) -> dict[str, Any]:
        chat = to_chat(body, max_tokens_limit, _COUNT_FIELDS)
        chat["max_tokens"] = 1
        return chat

    def whole(self, answer: dict[str, Any], r: RequestState) -> bytes:
        if r.prompt_tokens is None:
            raise GatewayError(
                502,
                "the model did not report its prompt tokens; the count is unavailable",
                type="server_error",
                code="upstream_error",
            )
        return orjson.dumps({"input_tokens": r.prompt_tokens})
