"""Per-dialect encoding of the mock engine's answers: the SSE events of a stream (role, token, finish, usage,
``[DONE]`` and in-stream errors), error bodies and the context-overflow answer, each in the shape the
dialect table (:mod:`servelab.wire.dialects`, docs/engine-wire.md) gives the engine it imitates."""

from __future__ import annotations

import time
from typing import Any

import orjson

from servelab.engines.mock.config import DIALECTS, MockConfig
from servelab.engines.mock.plan import Plan
from servelab.wire.dialects import DIALECTS as WIRE_DIALECTS
from servelab.wire.dialects import stream_rules

__all__ = ["DONE", "HOLD_HEADERS", "REASONING_FIELD", "Encoder", "context_overflow", "error_body", "stream_trailer"]

#: Dialects that hold the HTTP headers until the first token (docs/engine-wire.md case 20).
HOLD_HEADERS = frozenset(d for d in DIALECTS if stream_rules(d).holds_headers)
#: Name of the reasoning field in a delta (case 10).
REASONING_FIELD = {d: f for d in DIALECTS if (f := WIRE_DIALECTS[d].reasoning_field)}
#: The end of an SSE stream (every dialect).
DONE = b"data: [DONE]\n\n"


def _dumps(o: Any) -> bytes:
    return orjson.dumps(o)


class Encoder:
    """Pre-encoded byte pieces of one response in one dialect; each method returns one SSE event (bytes)."""

    def __init__(
        self, cfg: MockConfig, dialect: str, chat: bool, model: str, rid: int, prompt_tokens: int, plan: Plan
    ) -> None:
        self.d = dialect
        self.w = w = stream_rules(dialect)
        self.chat = chat
        self.plan = plan
        self.prompt_tokens = prompt_tokens
        self.cached = 0  # prompt words found in the prefix cache (servelab.engines.mock.cache)
        self.cfg = cfg
        created = int(time.time())
        mdl = _dumps(model)
        if chat:
            cid = f"chatcmpl-mock{rid:x}"
            self.head = (
                b'data: {"id":"'
                + cid.encode()
                + b'","object":"chat.completion.chunk","created":'
                + str(created).encode()
                + b',"model":'
                + mdl
                + b',"choices":[{"index":0,"delta":'
            )
            self.usage_head = (
                b'data: {"id":"'
                + (b"" if w.usage_id_empty else cid.encode())
                + b'","object":"chat.completion.chunk","created":'
                + str(created).encode()
                + b',"model":'
                + mdl
                + b',"choices":[],"usage":'
            )
        else:
            cid = f"cmpl-mock{rid:x}"
            self.head = (
                b'data: {"id":"'
                + cid.encode()
                + b'","object":"text_completion","created":'
                + str(created).encode()
                + b',"model":'
                + mdl
                + b',"choices":[{"index":0,"text":'
            )
            self.usage_head = (
                b'data: {"id":"'
                + cid.encode()
                + b'","object":"text_completion","created":'
                + str(created).encode()
                + b',"model":'
                + mdl
                + b',"choices":[],"usage":'
            )
        # tail after finish_reason: vLLM/TGI omit usage on ordinary chunks; others send usage: null (case 8)
        self.tail = b'}],"usage":null}\n\n' if w.usage_null_on_chunks else b"}]}\n\n"
        self.mid = b',"logprobs":null,"finish_reason":'
        self.role_prefix = b'{"role":"assistant",' if w.role_on_every_chunk else b"{"
        self.rfield = REASONING_FIELD[dialect].encode()

    # -- chat deltas
    def role_chunk(self) -> bytes:
        """First chunk: ``role`` with ``content: ""`` (vLLM/SGLang) or ``content: null`` (llama-server)."""
        if not self.chat or self.w.role_chunk == "none":
            return b""
        content = b"null" if self.w.role_chunk == "null" else b'""'
        return self.head + b'{"role":"assistant","content":' + content + b"}" + self.mid + b"null" + self.tail

    def token(
        self, kind: str, text: str, first_tool: bool, finish: str | None, usage: bytes | None = None, extra: bytes = b""
    ) -> bytes:
        """One token-carrying chunk (with ``finish`` on vLLM's last chunk and on /v1/completions)."""
        fr = b"null" if finish is None else b'"' + finish.encode() + b'"'
        tail = self.tail
        if usage is not None:
            tail = b'}],"usage":' + usage + extra + b"}\n\n"
        if not self.chat:
            return self.head + _dumps(text) + self.mid + fr + tail
        if kind == "c":
            delta = self.role_prefix + b'"content":' + _dumps(text) + b"}"
        elif kind == "r":
            delta = self.role_prefix + b'"' + self.rfield + b'":' + _dumps(text) + b"}"
        else:
            if self.w.tool_calls_whole or first_tool:
                fn = b'{"name":' + _dumps(self.plan.tool_name) + b',"arguments":' + _dumps(text) + b"}"
                call = (
                    b'{"index":0,"id":"' + self.plan.tool_id.encode() + b'","type":"function","function":' + fn + b"}"
                )
            else:
                call = b'{"index":0,"function":{"arguments":' + _dumps(text) + b"}}"
            delta = self.role_prefix + b'"tool_calls":[' + call + b"]}"
        return self.head + delta + self.mid + fr + tail

    def finish_chunk(self, finish: str) -> bytes:
        """The finish on its own chunk: ``delta: {}`` (SGLang, llama-server), TGI's ``content: ""``."""
        wire = self.w.stop_finish if finish == "stop" else finish
        delta = b'{"role":"assistant","content":""}' if self.w.role_on_every_chunk else b"{}"
        out = self.head + delta + self.mid + b'"' + wire.encode() + b'"' + self.tail
        if self.w.chat_usage == "always":  # TGI: usage on every stream's end, unasked
            out += self.usage_head + self.usage_bytes() + b"}\n\n"
        return out

    def usage_bytes(self, generated: int | None = None) -> bytes:
        g = self.plan.generated if generated is None else generated
        u: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": g,
            "total_tokens": self.prompt_tokens + g,
        }
        if self.cfg.prefix_cache_blocks:
            u["prompt_tokens_details"] = {"cached_tokens": self.cached}
        return _dumps(u)

    def usage_chunk(self) -> bytes:
        """Usage after the finish with ``choices: []`` (``id: ""`` on TGI)."""
        return self.usage_head + self.usage_bytes() + b"}\n\n"

    def timings(self) -> bytes:
        """llama-server's ``timings`` object (per-response prompt/predicted counts and times)."""
        c = self.cfg
        n = self.plan.generated
        pred_ms = c.itl_ms * max(0, len(self.plan.chunks) - 1)
        return _dumps(
            {
                "cache_n": self.cached,
                "prompt_n": self.prompt_tokens,
                "prompt_ms": c.ttft_ms,
                "predicted_n": n,
                "predicted_ms": pred_ms,
                "predicted_per_second": (n / pred_ms * 1000.0) if pred_ms else 0.0,
            }
        )

    def error_event(self, message: str) -> bytes:
        """An error inside a 200 stream in this dialect's shape (case 15)."""
        if WIRE_DIALECTS[self.d].error_shape == "text":
            ev: dict[str, Any] = {"error": message, "error_type": "generation"}
        elif self.d == "sglang":
            ev = {
                "error": {
                    "object": "error",
                    "message": message,
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            }
        elif self.d == "llamacpp":
            ev = {"error": {"code": 500, "message": message, "type": "server_error"}}
        else:
            ev = {"error": {"message": message, "type": "InternalServerError", "param": None, "code": 500}}
        return b"data: " + _dumps(ev) + b"\n\n"

    @property
    def done_after_error(self) -> bool:
        """vLLM, SGLang and TGI send ``[DONE]`` after an in-stream error; llama-server and Ollama close (case 16)."""
        return self.w.done_after_error


def error_body(dialect: str, status: int, message: str) -> bytes:
    """A non-2xx body in the dialect's error shape (docs/engine-wire.md case 17)."""
    shape = WIRE_DIALECTS[dialect].error_shape
    if shape == "text":
        etype = "overloaded" if status == 429 else ("validation" if status in (400, 422) else "generation")
        return _dumps({"error": message, "error_type": etype})
    if shape == "flat":
        return _dumps(
            {"object": "error", "message": message, "type": _status_type(status), "param": None, "code": status}
        )
    if dialect == "llamacpp":
        return _dumps(
            {
                "error": {
                    "code": status,
                    "message": message,
                    "type": "server_error" if status >= 500 else "invalid_request_error",
                }
            }
        )
    if dialect == "ollama":
        return _dumps({"error": {"message": message, "type": "api_error", "param": None, "code": None}})
    return _dumps({"error": {"message": message, "type": _status_type(status), "param": None, "code": status}})


def context_overflow(cfg: MockConfig, body: dict[str, Any], prompt_tokens: int) -> tuple[int, bytes] | None:
    """``(status, body)`` of the dialect's context-overflow answer when ``prompt_tokens`` (+ the request's
    ``max_tokens``/``max_completion_tokens``/``max_new_tokens``, except on llama-server) exceed
    ``cfg.context_tokens``; ``None`` when it fits, when ``context_tokens`` is 0, and on Ollama (it
    truncates silently). Wording per docs/engine-wire.md case 18, as the engines phrase it (vLLM
    ``serving_engine``, SGLang ``tokenizer_manager``, TGI ``validation.rs``, llama-server ``server.cpp``;
    read 2026-12-01)."""
    ctx = cfg.context_tokens
    status = stream_rules(cfg.dialect).overflow_status
    if ctx <= 0 or status is None:
        return None
    mt = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_new_tokens")))
    out = mt if isinstance(mt, int) and mt > 0 else 0
    d = cfg.dialect
    if d == "llamacpp":
        if prompt_tokens < ctx:
            return None
        return 400, _dumps(
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                    "n_prompt_tokens": prompt_tokens,
                    "n_ctx": ctx,
                }
            }
        )
    total = prompt_tokens + out
    if total <= ctx:
        return None
    if d == "tgi":
        return status, _dumps(
            {
                "error": f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {ctx}. "
                f"Given: {prompt_tokens} `inputs` tokens and {out} `max_new_tokens`",
                "error_type": "validation",
            }
        )
    if d == "sglang":
        msg = (
            f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
            f"a total of {total} tokens: {prompt_tokens} tokens from the input messages and {out} tokens for "
            "the completion. Please reduce the number of tokens in the input messages or the completion to "
            "fit within the limit."
        )
        return 400, error_body(d, 400, msg)
    msg = (
        f"This model's maximum context length is {ctx} tokens. However, you requested {total} tokens "
        f"({prompt_tokens} in the messages, {out} in the completion). Please reduce the length of the "
        "messages or completion."
    )
    return 400, error_body(d, 400, msg)


def _status_type(status: int) -> str:
    return {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequests", 503: "ServiceUnavailableError"}.get(
        status, "InternalServerError"
    )


def stream_trailer(
    enc: Encoder, plan: Plan, d: str, include_usage: bool
) -> tuple[str | None, bytes | None, bytes, bytes]:
    """What follows the last token chunk of a stream, by dialect: ``(finish reason carried by the last
    token chunk, usage carried by it, extra fields on it, the trailer bytes after it)``; the trailer is
    finish and usage chunks then ``[DONE]``, written with the last token (docs/engine-wire.md cases 20-24)."""
    chat = enc.chat
    w = enc.w
    last_finish = plan.finish if (not chat or w.finish_with_last_token) else None
    last_usage: bytes | None = None
    last_extra = b""
    if chat:
        trailer = b"" if w.finish_with_last_token else enc.finish_chunk(plan.finish)
        if include_usage and w.chat_usage == "asked":
            trailer += enc.usage_chunk()
    else:
        trailer = b""
        if w.completions_usage == "last_chunk":  # usage always rides on the last chunk (case 24)
            last_usage = enc.usage_bytes()
            last_extra = b',"timings":' + enc.timings() if w.completions_timings else b""
        elif include_usage:
            trailer = enc.usage_chunk()
    return last_finish, last_usage, last_extra, trailer + DONE
