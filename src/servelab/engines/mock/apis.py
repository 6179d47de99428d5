"""The mock engine's native Anthropic Messages (``POST /v1/messages``) and OpenAI Responses
(``POST /v1/responses``) routes, as vLLM serves them itself (``vllm/entrypoints/anthropic``,
``vllm/entrypoints/openai/responses``): what a gateway passes through unchanged lands here.

A request is read as the chat request it stands for (:func:`chat_of`: ``system``/``instructions`` and the
messages or ``input`` items as messages, ``max_tokens``/``max_output_tokens``, ``stop_sequences``), so its
prompt size (:func:`servelab.engines.mock.plan.count_words`), its answer (:func:`plan_answer`: the same
tokens, reasoning and length cut as the chat route) and its token schedule (``ttft_ms`` + i x ``itl_ms``,
the fixed schedule; the batch law, queue and prefix cache of the chat route are not applied here) match
the chat route's, and a translated and a passed-through request give the same text and usage. Tools are
not planned here (an answer is text, with reasoning when the mock reasons).

Whole answers are the API's object (a Messages ``message``; a Responses ``response`` with ``store: false``,
``status`` ``completed`` or ``incomplete``). Streams are the API's documented sequences: Messages
``message_start``, ``ping``, per block ``content_block_start``/``_delta``/``_stop``, ``message_delta``
(``stop_reason``, usage ``input_tokens``/``output_tokens``), ``message_stop``; Responses ``response.created``,
``response.in_progress``, per item ``response.output_item.added`` (+ ``response.content_part.added``),
deltas, their ``.done`` events, ``response.output_item.done``, ``response.completed`` (or
``response.incomplete``) with usage, every event numbered (``sequence_number``). The injected failures are
the chat route's draw (:meth:`MockServer.draw`): ``http_status`` answers the error status, ``stream_error``
sends the API's error event mid-stream (Messages ``error``; Responses ``error`` then ``response.failed``),
``cut_off`` closes the connection mid-stream, ``hang`` stalls ``hang_s`` then closes. Each request is a
:class:`MockRecord` with ``endpoint`` ``messages``/``responses`` and, in ``sampling``, the body's sampling
and length fields as received (``max_output_tokens``, ``store`` included).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import orjson
from aiohttp import web

from servelab.engines.mock.config import MockConfig
from servelab.engines.mock.encoders import error_body
from servelab.engines.mock.plan import Plan, count_words, plan_answer

__all__ = ["NATIVE_ROUTES", "api_handler", "chat_of"]

#: the path of each API the mock serves natively
NATIVE_ROUTES = {"/v1/messages": "messages", "/v1/responses": "responses"}
#: body fields kept in a record's ``sampling`` (what a gateway forwarded)
_KEPT = (
    "temperature",
    "top_p",
    "top_k",
    "stop_sequences",
    "max_tokens",
    "max_output_tokens",
    "store",
    "metadata",
    "user",
)
_STOP_REASON = {"stop": "end_turn", "length": "max_tokens"}
_now = time.monotonic_ns


class Server(Protocol):
    """What a native route uses of :class:`servelab.engines.mock.server.MockServer`."""

    config: MockConfig
    completed: int
    running: int

    @property
    def delays_ns(self) -> tuple[int, int]: ...

    def new_record(self, request: web.Request, endpoint: str) -> tuple[Any, int]: ...

    def draw(self, rec: Any) -> str | None: ...


def _text(v: Any) -> Any:
    """A content value as chat carries it: a string, or text parts (other parts dropped)."""
    if isinstance(v, list):
        return [
            {"type": "text", "text": p["text"]} for p in v if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    return v if isinstance(v, str) else ""


def chat_of(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """The chat-completions request a Messages or Responses ``body`` stands for (module doc)."""
    msgs: list[dict[str, Any]] = []
    system = body.get("system" if api == "messages" else "instructions")
    if system:
        msgs.append({"role": "system", "content": _text(system)})
    if api == "messages":
        items = body.get("messages")
        limit = body.get("max_tokens")
    else:
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else items
        limit = body.get("max_output_tokens")
    for it in items if isinstance(items, list) else ():
        if isinstance(it, dict) and it.get("role") is not None:
            msgs.append({"role": it["role"], "content": _text(it.get("content"))})
    chat: dict[str, Any] = {"messages": msgs}
    if isinstance(limit, int):
        chat["max_tokens"] = limit
    if api == "messages" and isinstance(body.get("stop_sequences"), list):
        chat["stop"] = body["stop_sequences"]
    return chat


def _sse(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


class _Answer:
    """One answer's events in its API (module doc): :meth:`opening`, :meth:`delta` per token chunk,
    :meth:`closing`, :meth:`failure`, and :meth:`whole`."""

    def __init__(self, api: str, rid: str, model: str, prompt: int, plan: Plan) -> None:
        self.api, self.rid, self.model, self.prompt, self.plan = api, rid, model, prompt, plan
        self.seq = 0
        self.blocks: list[dict[str, Any]] = []  # finished/open blocks (Messages) or items (Responses)
        self.kind = ""  # the open block's chunk kind: "r" reasoning, "c" text

    def ev(self, kind: str, data: dict[str, Any]) -> bytes:
        if self.api == "messages":
            return _sse(kind, data)
        self.seq += 1
        return _sse(kind, {"sequence_number": self.seq - 1, **data})

    def usage(self) -> dict[str, Any]:
        u: dict[str, Any] = {"input_tokens": self.prompt, "output_tokens": self.plan.generated}
        if self.api == "responses":
            u.update(
                input_tokens_details={"cached_tokens": 0},
                output_tokens_details={"reasoning_tokens": sum(n for k, _, n in self.plan.chunks if k == "r")},
                total_tokens=self.prompt + self.plan.generated,
            )
        return u

    def response(self, status: str, usage: bool) -> dict[str, Any]:
        return {
            "id": f"resp_mock{self.rid}",
            "object": "response",
            "created_at": int(time.time()),
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.model,
            "output": [b for b in self.blocks if b.get("status") == "completed"],
            "store": False,
            "usage": self.usage() if usage else None,
        }

    def _status(self) -> str:
        return "incomplete" if self.plan.finish == "length" else "completed"

    def opening(self) -> bytes:
        if self.api == "messages":
            msg: dict[str, Any] = {
                "id": f"msg_mock{self.rid}",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": self.prompt, "output_tokens": 0},
            }
            return self.ev("message_start", {"message": msg}) + self.ev("ping", {})
        resp = self.response("in_progress", False)
        return self.ev("response.created", {"response": resp}) + self.ev("response.in_progress", {"response": resp})

    def _ids(self) -> dict[str, Any]:
        i = len(self.blocks) - 1
        if self.api == "messages":
            return {"index": i}
        return {"item_id": self.blocks[i]["id"], "output_index": i, "content_index": 0}

    def _open(self, kind: str) -> bytes:
        out = self._close()
        self.kind = kind
        i = len(self.blocks)
        if self.api == "messages":
            block = (
                {"type": "thinking", "thinking": "", "signature": ""} if kind == "r" else {"type": "text", "text": ""}
            )
            self.blocks.append(dict(block))
            return out + self.ev("content_block_start", {"index": i, "content_block": block})
        part: dict[str, Any] = (
            {"type": "reasoning_text", "text": ""}
            if kind == "r"
            else {"type": "output_text", "text": "", "annotations": []}
        )
        item: dict[str, Any] = {"id": f"{'rs' if kind == 'r' else 'msg'}_mock{self.rid}_{i}", "status": "in_progress"}
        item.update({"type": "reasoning", "summary": []} if kind == "r" else {"type": "message", "role": "assistant"})
        self.blocks.append({**item, "content": [part]})
        out += self.ev("response.output_item.added", {"output_index": i, "item": {**item, "content": []}})
        if kind == "c":
            out += self.ev("response.content_part.added", {**self._ids(), "part": part})
        return out

    def _close(self) -> bytes:
        if not self.kind:
            return b""
        kind, self.kind = self.kind, ""
        ids = self._ids()
        if self.api == "messages":
            return self.ev("content_block_stop", ids)
        it = self.blocks[-1]
        it["status"] = "completed"
        part = it["content"][0]
        if kind == "r":
            out = self.ev("response.reasoning_text.done", {**ids, "text": part["text"]})
        else:
            out = self.ev("response.output_text.done", {**ids, "text": part["text"]})
            out += self.ev("response.content_part.done", {**ids, "part": part})
        return out + self.ev("response.output_item.done", {"output_index": ids["output_index"], "item": it})

    def delta(self, kind: str, text: str) -> bytes:
        kind = "r" if kind == "r" else "c"
        out = self._open(kind) if kind != self.kind else b""
        block = self.blocks[-1]
        if self.api == "messages":
            field = "thinking" if kind == "r" else "text"
            block[field] += text
            return out + self.ev(
                "content_block_delta", {"index": len(self.blocks) - 1, "delta": {"type": f"{field}_delta", field: text}}
            )
        block["content"][0]["text"] += text
        name = "response.reasoning_text.delta" if kind == "r" else "response.output_text.delta"
        return out + self.ev(name, {**self._ids(), "delta": text})

    def closing(self) -> bytes:
        out = self._close()
        if self.api == "messages":
            stop = {"stop_reason": _STOP_REASON.get(self.plan.finish, "end_turn"), "stop_sequence": None}
            return out + self.ev("message_delta", {"delta": stop, "usage": self.usage()}) + self.ev("message_stop", {})
        status = self._status()
        kind = "response.completed" if status == "completed" else "response.incomplete"
        return out + self.ev(kind, {"response": self.response(status, True)})

    def failure(self, message: str) -> bytes:
        if self.api == "messages":
            return self.ev("error", {"error": {"type": "api_error", "message": message}})
        failed = {**self.response("failed", False), "error": {"code": "server_error", "message": message}}
        return self.ev("error", {"code": "server_error", "message": message, "param": None}) + self.ev(
            "response.failed", {"response": failed}
        )

    def whole(self) -> bytes:
        for kind, text, _ in self.plan.chunks:
            self.delta(kind, text)
        self._close()
        if self.api == "responses":
            return orjson.dumps(self.response(self._status(), True))
        content = [{k: v for k, v in b.items()} for b in self.blocks]
        return orjson.dumps(
            {
                "id": f"msg_mock{self.rid}",
                "type": "message",
                "role": "assistant",
                "model": self.model,
                "content": content,
                "stop_reason": _STOP_REASON.get(self.plan.finish, "end_turn"),
                "stop_sequence": None,
                "usage": self.usage(),
            }
        )


def api_handler(server: Server, api: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of ``api`` (``messages``/``responses``) on ``server`` (module doc)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        cfg = server.config
        rec, _ = server.new_record(request, api)
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as e:
            rec.status = 400
            rec.done_ns = _now()
            return web.Response(
                status=400,
                body=error_body(cfg.dialect, 400, f"invalid JSON body: {e}"),
                content_type="application/json",
            )
        chat = chat_of(api, body)
        model = str(body["model"]) if isinstance(body.get("model"), str) else cfg.model
        rec.model, rec.stream = model, bool(body.get("stream", False))
        rec.prompt_tokens = count_words(chat)
        rec.sampling = {k: body[k] for k in _KEPT if k in body}
        kind = server.draw(rec)
        if kind == "http_status":
            rec.status = cfg.fail_http_status
            rec.done_ns = _now()
            msg = cfg.error_message or "mock-engine injected failure"
            body = error_body(cfg.dialect, cfg.fail_http_status, msg)
            return web.Response(status=cfg.fail_http_status, body=body, content_type="application/json")
        plan = plan_answer(cfg, chat, True)
        rec.output_tokens, rec.finish_reason = plan.generated, plan.finish
        answer = _Answer(api, rec.request_id, model, rec.prompt_tokens, plan)
        server.running += 1
        try:
            if rec.stream:
                return await _stream(server, request, rec, answer, kind)
            return await _whole(server, request, rec, answer, kind)
        finally:
            server.running -= 1

    return handle


async def _stream(
    server: Server, request: web.Request, rec: Any, answer: _Answer, kind: str | None
) -> web.StreamResponse:
    ttft_ns, itl_ns = server.delays_ns
    resp = web.StreamResponse(status=200, headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    rec.status, rec.headers_ns = 200, _now()
    await resp.write(answer.opening())  # as vLLM: the opening events with the headers, before any token
    chunks = answer.plan.chunks
    cut_at = max(1, len(chunks) // 2) if kind in ("stream_error", "cut_off") else (1 if kind == "hang" else -1)
    try:
        for i, (ck, text, ntok) in enumerate(chunks):
            if i == cut_at:
                return await _fail(server, request, resp, rec, answer, kind)
            rem = rec.recv_ns + ttft_ns + i * itl_ns - _now()
            if rem > 0:
                await asyncio.sleep(rem / 1e9)
            data = answer.delta(ck, text)
            if i == len(chunks) - 1:
                data += answer.closing()
            rec.token_write_ns.append(_now())
            await resp.write(data)
            rec.token_counts.append(ntok)
        if not chunks:
            await resp.write(answer.closing())
        if cut_at >= len(chunks) > 0:  # one-chunk streams: fail after the only token
            return await _fail(server, request, resp, rec, answer, kind)
        await resp.write_eof()
    except (ConnectionError, asyncio.CancelledError):
        rec.done_ns = _now()
        raise
    rec.done_ns = _now()
    server.completed += 1
    return resp


async def _fail(
    server: Server, request: web.Request, resp: web.StreamResponse, rec: Any, answer: _Answer, kind: str | None
) -> web.StreamResponse:
    """Inject ``kind`` into a started stream: the API's error events, a cut connection, or a stall then cut."""
    if kind == "stream_error":
        await resp.write(answer.failure(server.config.error_message or "mock-engine injected error during generation"))
        await resp.write_eof()
    else:
        if kind == "hang":
            await asyncio.sleep(server.config.hang_s)
        if request.transport is not None:
            request.transport.close()
    rec.done_ns = _now()
    return resp


async def _whole(
    server: Server, request: web.Request, rec: Any, answer: _Answer, kind: str | None
) -> web.StreamResponse:
    ttft_ns, itl_ns = server.delays_ns
    rem = rec.recv_ns + ttft_ns + max(0, len(answer.plan.chunks) - 1) * itl_ns - _now()
    if rem > 0:
        await asyncio.sleep(rem / 1e9)
    if kind in ("hang", "cut_off"):
        await _fail(server, request, web.StreamResponse(), rec, answer, kind)
        return web.Response(status=200)
    if kind == "stream_error":
        rec.status = 500
        rec.done_ns = _now()
        msg = server.config.error_message or "mock-engine injected error during generation"
        return web.Response(
            status=500, body=error_body(server.config.dialect, 500, msg), content_type="application/json"
        )
    payload = answer.whole()
    rec.status = 200
    rec.headers_ns = t = _now()
    rec.token_write_ns.append(t)
    rec.token_counts.append(answer.plan.generated)
    rec.done_ns = _now()
    server.completed += 1
    return web.Response(status=200, body=payload, content_type="application/json")
