"""``servelab mock-engine``: a small, fast OpenAI-compatible streaming server for tests and calibration.

It speaks the wire dialect of one real engine (vLLM, SGLang, TGI, llama-server or Ollama, as the
dialect table :mod:`servelab.wire.dialects` and docs/engine-wire.md describe them), streams deterministic
tokens (`` tok0``, `` tok1`` ...) on an absolute time schedule (first token at ``recv + ttft_ms``, then
one chunk every ``itl_ms``), injects failures reproducibly (one ``random.Random(seed)`` draw per
completion request, in arrival order) and records, per request, the ``time.monotonic_ns()`` at which it
wrote every token-carrying chunk, so a client's measurements can be checked against what the server
really did (``GET /mock/records``).

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` true or false),
``GET /v1/models``, ``GET /health`` (and ``GET /``), ``GET /metrics`` (Prometheus text), and the
mock-only ``GET /mock/records``, ``GET /mock/stats``, ``POST /mock/reset``.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import random
import signal
import socket
import sys
import time
import dataclasses
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
import typer
from aiohttp import web
from pydantic import Field

from servelab.engines.mockbatch import DecodeBatch
from servelab.engines.mockcache import BLOCK_WORDS, PrefixCache, prompt_words
from servelab.engines.mockinfo import info_routes, model_card
from servelab.wire.dialects import DIALECTS as WIRE_DIALECTS
from servelab.wire.dialects import ENGINE_DIALECTS, EngineDialect, stream_rules
from servelab.wire.files import install_uvloop

_now = time.monotonic_ns

#: Wire dialects the mock can speak: the engines of the dialect table.
Dialect = EngineDialect
DIALECTS: tuple[str, ...] = ENGINE_DIALECTS
#: Dialects that hold the HTTP headers until the first token (docs/engine-wire.md case 20).
HOLD_HEADERS = frozenset(d for d in DIALECTS if stream_rules(d).holds_headers)
#: Name of the reasoning field in a delta (case 10).
REASONING_FIELD = {d: f for d in DIALECTS if (f := WIRE_DIALECTS[d].reasoning_field)}
#: Injected failure kinds, as counted in ``/mock/stats``.
INJECTED_KINDS = ("http_status", "stream_error", "cut_off", "hang", "overload")

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
#: body fields a :class:`MockRecord` keeps in ``sampling`` (OpenAI's plus common engine extensions)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
                   "repetition_penalty", "stop", "seed", "max_tokens", "max_completion_tokens")
_DONE = b"data: [DONE]\n\n"


@dataclass
class MockConfig:
    """Configuration of the mock engine. Units are in the field names; rates are probabilities in [0, 1].

    ``port=0`` picks a free port. ``ttft_ms``/``itl_ms`` are the time to the first token chunk and between
    token chunks (0 and 0 = never sleep). ``output_tokens`` tokens are generated (fewer if the request's
    ``max_tokens`` is smaller), ``tokens_per_chunk`` per chunk, after ``reasoning_tokens`` reasoning tokens.
    The failure rates are exclusive bands of one uniform draw per request (http, stream error, cut, hang);
    ``hang_s`` is how long a hung request stalls before its connection is closed. ``max_inflight`` > 0
    caps running requests: beyond it the mock answers ``overload_status`` (default by dialect: 429 on TGI,
    503 elsewhere), except llama-server which defers (queues) requests unless ``overload_status`` is set.
    ``invalid_json`` makes answers to ``response_format`` ``json_schema``/``json_object`` requests broken
    JSON (the object cut after a comma, e.g. ``{"name":"tok0",``). ``crash_after_requests`` = N makes the
    process exit with ``os._exit(3)`` in the middle of answering completion request N+1 (counted from
    start, like ``/mock/stats`` ``requests``; a reset does not re-arm it): a streamed answer stops after
    about half its token chunks (before any token when it has only one), a non-streamed one after its
    delay, before any body; run in-process (:func:`start_mock`) it ends the host process. ``None`` never crashes.
    ``error_message`` is the text of injected HTTP errors and in-stream error events (``None``: a plain
    "mock-engine injected ..." text); set it to what a real engine says in trouble (``"CUDA error: out of
    memory (/opt/vllm/worker.py:812, batch 7f3a9c)"``) to check that a client or gateway keeps it from end
    users. ``context_tokens`` > 0 is the model's context window: a request whose prompt words (+ its
    ``max_tokens``, except on llama-server, which checks the prompt only) exceed it gets the dialect's
    context-overflow error (docs/engine-wire.md case 18: 400 on vLLM/SGLang/llama-server with their wording and
    llama-server's ``n_prompt_tokens``/``n_ctx``, 422 on TGI; Ollama truncates silently, so it answers and
    its usage counts ``context_tokens`` prompt tokens).
    ``prefill_tokens_per_s`` / ``itl_ms_per_running`` > 0 switch streamed answers to continuous-batching
    timing of a known law (:mod:`servelab.engines.mockbatch`: first token after ``ttft_ms`` + prompt /
    rate, each later chunk ``itl_ms + itl_ms_per_running * (running batch - 1)`` ms apart).
    Raises nothing itself; :func:`validate_config` checks the values.
    """

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535, description="TCP port; 0 = a free port")] = 0
    ttft_ms: Annotated[float, Field(ge=0, description="time to first token chunk, ms")] = 0.0
    itl_ms: Annotated[float, Field(ge=0, description="time between token chunks, ms")] = 0.0
    output_tokens: Annotated[int, Field(ge=0, description="tokens generated per answer (fewer if max_tokens is "
                                                          "smaller)")] = 16
    tokens_per_chunk: Annotated[int, Field(ge=1, description="tokens per streamed chunk")] = 1
    dialect: Annotated[Dialect, Field(description="the engine whose wire format it speaks")] = "vllm"
    reasoning_tokens: Annotated[int, Field(ge=0, description="reasoning tokens before the answer")] = 0
    seed: Annotated[int, Field(description="seed of the failure draws")] = 0
    fail_http_rate: Annotated[float, Field(ge=0, le=1, description="probability of an HTTP error status")] = 0.0
    fail_http_status: Annotated[int, Field(ge=100, le=599, description="status of injected HTTP errors")] = 500
    stream_error_rate: Annotated[float, Field(ge=0, le=1, description="probability of an in-stream error "
                                                                      "event")] = 0.0
    cut_rate: Annotated[float, Field(ge=0, le=1, description="probability of a cut connection mid-stream")] = 0.0
    hang_rate: Annotated[float, Field(ge=0, le=1, description="probability of a hung request")] = 0.0
    hang_s: Annotated[float, Field(ge=0, description="how long a hung request stalls, s")] = 30.0
    max_inflight: Annotated[int, Field(ge=0, description="cap on running requests (0 = none)")] = 0
    overload_status: Annotated[int | None, Field(ge=100, le=599, description="status beyond max_inflight "
                                                                            "(null = by dialect)")] = None
    model: Annotated[str, Field(min_length=1, description="model name listed by /v1/models")] = "mock"
    invalid_json: Annotated[bool, Field(description="answer schema requests with broken JSON")] = False
    bad_tool_call: Annotated[Literal["none", "json", "schema", "name"], Field(
        description="tool calls with arguments cut short (json), arguments against the schema (schema) or "
                    "an unknown function name (name)")] = "none"
    crash_after_requests: Annotated[int | None, Field(ge=0, description="exit while answering request N+1 "
                                                                        "(null = never)")] = None
    error_message: Annotated[str | None, Field(min_length=1, description="text of injected errors "
                                                                         "(null = a plain mock text)")] = None
    context_tokens: Annotated[int, Field(ge=0, description="context window in prompt words + max_tokens "
                                                           "(0 = unlimited)")] = 0
    prefill_tokens_per_s: Annotated[float, Field(ge=0, description="prefill rate: the first token comes "
                                                                   "prompt/rate s after ttft_ms (0 = off)")] = 0.0
    itl_ms_per_running: Annotated[float, Field(ge=0, description="ms added to itl_ms per other answer decoding "
                                                                 "at once (0 = off)")] = 0.0
    prefix_cache_blocks: Annotated[int, Field(ge=0, description="prefix-cache blocks of 16 words kept (LRU); "
                                                                "0 = no prefix cache (servelab.engines.mockcache)")] = 0


#: the failure-rate fields: exclusive bands of one uniform draw per request, so their sum is <= 1
FAILURE_RATES = ("fail_http_rate", "stream_error_rate", "cut_rate", "hang_rate")


def check_failure_rates(values: Any) -> None:
    """Raise :class:`ValueError` when the :data:`FAILURE_RATES` of ``values`` (attributes) add up to more than 1."""
    if sum(float(getattr(values, n)) for n in FAILURE_RATES) > 1.0 + 1e-9:
        raise ValueError("fail_http_rate + stream_error_rate + cut_rate + hang_rate must be <= 1 (the failure "
                         "rates add up to more than 1)")


def validate_config(cfg: MockConfig) -> None:
    """Raise :class:`ValueError` with a one-line message naming the CLI flag if ``cfg`` holds an impossible
    value. The rules are the bounds declared on :class:`MockConfig`'s fields (checked with pydantic),
    plus :func:`check_failure_rates`."""
    from pydantic import TypeAdapter, ValidationError

    try:
        TypeAdapter(MockConfig).validate_python(dataclasses.asdict(cfg))
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        name = str(err["loc"][0]) if err.get("loc") else "config"
        flag, value = "--" + name.replace("_", "-"), err.get("input")
        if name == "dialect":
            raise ValueError(f"--dialect {value!r} is not one of {', '.join(DIALECTS)}") from None
        if name in FAILURE_RATES:
            raise ValueError(f"{flag} {value} is not a probability in [0, 1]") from None
        msg = str(err.get("msg", ""))
        raise ValueError(f"{flag} {value}: {msg[:1].lower() + msg[1:]}") from None
    check_failure_rates(cfg)


class MockRecord:
    """What the mock did for one request; all times are ``time.monotonic_ns()`` values.

    ``token_write_ns[i]`` is taken right before the write of the i-th token-carrying chunk, which carried
    ``token_counts[i]`` tokens. ``headers_ns`` is when the status line and headers were handed to the
    transport (with held headers, together with the first token). ``injected`` is ``None`` or one of
    :data:`INJECTED_KINDS`. ``request_id``: the ``X-Request-Id`` header (the servelab gateway's own id)
    or a sequence number; ``client_request_id``: the ``X-Client-Request-ID`` header the gateway passes on
    (the client's id), or None. ``sampling``: the sampling fields of the request body as received
    (:data:`SAMPLING_FIELDS` present in it), so what a gateway forwarded can be checked.
    """

    __slots__ = ("request_id", "client_request_id", "endpoint", "stream", "model", "recv_ns", "headers_ns",
                 "token_write_ns", "token_counts", "done_ns", "injected", "status", "output_tokens", "prompt_tokens",
                 "finish_reason", "sampling", "cached_tokens", "traceparent")

    def __init__(self, request_id: str, recv_ns: int) -> None:
        self.request_id = request_id
        self.client_request_id: str | None = None
        self.recv_ns = recv_ns
        self.endpoint = ""
        self.stream = True
        self.model: str | None = None
        self.headers_ns: int | None = None
        self.token_write_ns: list[int] = []
        self.token_counts: list[int] = []
        self.done_ns: int | None = None
        self.injected: str | None = None
        self.status: int | None = None
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.finish_reason: str | None = None
        self.sampling: dict[str, Any] = {}
        #: prompt words found in the prefix cache (--prefix-cache-blocks; 0 without one)
        self.cached_tokens = 0
        #: the W3C ``traceparent`` header received (a tracing gateway's attempt span), or None
        self.traceparent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The record as a JSON-ready dict (the shape of one ``/mock/records`` item)."""
        return {k: getattr(self, k) for k in self.__slots__}


# --------------------------------------------------------------------------------------------------
# request content: pieces of generated text

def _count_words(body: dict[str, Any]) -> int:
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
        return [_value_from_schema(items, it, j) if it != "object" else _object_from_schema(items)
                for j in range(n if isinstance(n, int) else 0)]
    if t == "object":
        return _object_from_schema(p)
    return f"tok{i}"


def _break_json(text: str) -> str:
    """``text`` (a JSON object) cut so that it no longer parses: after its last top-level-ish comma
    (``{"name":"tok0",``), else without its closing brace (``{"answer":"mock"``)."""
    cut = text.rfind(",")
    return text[:cut + 1] if cut > 0 else text[:-1]


def _split(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class _Plan:
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


def _plan(cfg: MockConfig, body: dict[str, Any], chat: bool) -> _Plan:
    plan = _Plan()
    mt = body.get("max_completion_tokens", body.get("max_tokens"))
    limit = mt if isinstance(mt, int) and mt >= 0 else None
    k = cfg.tokens_per_chunk
    tools = body.get("tools") if chat else None
    tool_choice = body.get("tool_choice", "auto")
    msgs = body.get("messages")
    if tool_choice == "auto" and isinstance(msgs, list) and msgs and isinstance(msgs[-1], dict) \
            and msgs[-1].get("role") == "tool":
        tools = None  # an agent loop's tool result came back: answer it in text, as a model does
    rf = body.get("response_format")
    pieces: list[tuple[str, str]] = []  # (kind, text) one token each
    if chat:
        pieces += [("r", f" think{i}") for i in range(cfg.reasoning_tokens)]
    if tools and isinstance(tools, list) and tool_choice != "none" and isinstance(tools[0], dict):
        fn = tools[0].get("function") or {}
        if isinstance(tool_choice, dict):
            fn_named = (tool_choice.get("function") or {}).get("name")
            fn = next((t.get("function") or {} for t in tools if isinstance(t, dict)
                       and (t.get("function") or {}).get("name") == fn_named), fn)
            plan.named_tool = True
        plan.tool_name = str(fn.get("name") or "tool")
        args = orjson.dumps(_object_from_schema(fn.get("parameters"))).decode()
        if cfg.bad_tool_call == "json":
            args = _break_json(args)
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
            text = _break_json(text)
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


# --------------------------------------------------------------------------------------------------
# dialect encoding

def _dumps(o: Any) -> bytes:
    return orjson.dumps(o)


class _Encoder:
    """Pre-encoded byte pieces of one response in one dialect; each method returns one SSE event (bytes)."""

    def __init__(self, cfg: MockConfig, dialect: str, chat: bool, model: str, rid: int,
                 prompt_tokens: int, plan: _Plan) -> None:
        self.d = dialect
        self.w = w = stream_rules(dialect)
        self.chat = chat
        self.plan = plan
        self.prompt_tokens = prompt_tokens
        self.cached = 0  # prompt words found in the prefix cache (servelab.engines.mockcache)
        self.cfg = cfg
        created = int(time.time())
        mdl = _dumps(model)
        if chat:
            cid = f"chatcmpl-mock{rid:x}"
            self.head = (b'data: {"id":"' + cid.encode() + b'","object":"chat.completion.chunk","created":'
                         + str(created).encode() + b',"model":' + mdl + b',"choices":[{"index":0,"delta":')
            self.usage_head = (b'data: {"id":"' + (b"" if w.usage_id_empty else cid.encode())
                               + b'","object":"chat.completion.chunk","created":' + str(created).encode()
                               + b',"model":' + mdl + b',"choices":[],"usage":')
        else:
            cid = f"cmpl-mock{rid:x}"
            self.head = (b'data: {"id":"' + cid.encode() + b'","object":"text_completion","created":'
                         + str(created).encode() + b',"model":' + mdl + b',"choices":[{"index":0,"text":')
            self.usage_head = (b'data: {"id":"' + cid.encode() + b'","object":"text_completion","created":'
                               + str(created).encode() + b',"model":' + mdl + b',"choices":[],"usage":')
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

    def token(self, kind: str, text: str, first_tool: bool, finish: str | None, usage: bytes | None = None,
              extra: bytes = b"") -> bytes:
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
                call = (b'{"index":0,"id":"' + self.plan.tool_id.encode() + b'","type":"function","function":'
                        + fn + b"}")
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
        u: dict[str, Any] = {"prompt_tokens": self.prompt_tokens, "completion_tokens": g,
                             "total_tokens": self.prompt_tokens + g}
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
        return _dumps({"cache_n": self.cached, "prompt_n": self.prompt_tokens, "prompt_ms": c.ttft_ms,
                       "predicted_n": n, "predicted_ms": pred_ms,
                       "predicted_per_second": (n / pred_ms * 1000.0) if pred_ms else 0.0})

    def error_event(self, message: str) -> bytes:
        """An error inside a 200 stream in this dialect's shape (case 15)."""
        if WIRE_DIALECTS[self.d].error_shape == "text":
            ev: dict[str, Any] = {"error": message, "error_type": "generation"}
        elif self.d == "sglang":
            ev = {"error": {"object": "error", "message": message, "type": "InternalServerError",
                            "param": None, "code": 500}}
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
        return _dumps({"object": "error", "message": message, "type": _status_type(status), "param": None,
                       "code": status})
    if dialect == "llamacpp":
        return _dumps({"error": {"code": status, "message": message, "type": "server_error"
                                 if status >= 500 else "invalid_request_error"}})
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
        return 400, _dumps({"error": {"code": 400, "message": "the request exceeds the available context size, "
                                      "try increasing it", "type": "exceed_context_size_error",
                                      "n_prompt_tokens": prompt_tokens, "n_ctx": ctx}})
    total = prompt_tokens + out
    if total <= ctx:
        return None
    if d == "tgi":
        return status, _dumps({"error": f"Input validation error: `inputs` tokens + `max_new_tokens` must be <= {ctx}. "
                                     f"Given: {prompt_tokens} `inputs` tokens and {out} `max_new_tokens`",
                            "error_type": "validation"})
    if d == "sglang":
        msg = (f"Requested token count exceeds the model's maximum context length of {ctx} tokens. You requested "
               f"a total of {total} tokens: {prompt_tokens} tokens from the input messages and {out} tokens for "
               "the completion. Please reduce the number of tokens in the input messages or the completion to "
               "fit within the limit.")
        return 400, error_body(d, 400, msg)
    msg = (f"This model's maximum context length is {ctx} tokens. However, you requested {total} tokens "
           f"({prompt_tokens} in the messages, {out} in the completion). Please reduce the length of the "
           "messages or completion.")
    return 400, error_body(d, 400, msg)


def _status_type(status: int) -> str:
    return {400: "BadRequestError", 404: "NotFoundError", 429: "TooManyRequests",
            503: "ServiceUnavailableError"}.get(status, "InternalServerError")


# --------------------------------------------------------------------------------------------------
# the server

def _trailer(enc: _Encoder, plan: _Plan, d: str,
             include_usage: bool) -> tuple[str | None, bytes | None, bytes, bytes]:
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
    return last_finish, last_usage, last_extra, trailer + _DONE


class MockServer:
    """A running mock engine. ``port`` is the bound port, ``base_url`` the API root (``http://h:p/v1``).

    ``records`` (list of :class:`MockRecord`) and ``stats`` are the live data behind ``/mock/records`` and
    ``/mock/stats``. Call :meth:`close` to stop (in-flight requests are cancelled after 1 s).
    """

    def __init__(self, config: MockConfig) -> None:
        validate_config(config)
        self.config = config
        self.records: list[MockRecord] = []
        self.port = 0
        self.host = config.host
        self._runner: web.AppRunner | None = None
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self.requests = 0
        self.completed = 0
        self.running = 0
        self.injected = dict.fromkeys(INJECTED_KINDS, 0)
        self._queue: asyncio.Semaphore | None = None
        self._delays_ns = int(config.ttft_ms * 1e6), int(config.itl_ms * 1e6)
        self._batch = (DecodeBatch(config.ttft_ms, config.itl_ms, config.prefill_tokens_per_s,
                                   config.itl_ms_per_running)
                       if DecodeBatch.wanted(config.prefill_tokens_per_s, config.itl_ms_per_running) else None)
        self._received = 0  # completion requests since start (not reset): arms crash_after_requests
        self.waiting = 0  # requests waiting for a slot (llama-server dialect with max_inflight)
        self.cache = PrefixCache(config.prefix_cache_blocks) if config.prefix_cache_blocks else None
        self._kv_words = 0  # prompt + answer words of the requests running now (KV use with a prefix cache)

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1`` (IPv6 hosts in brackets)."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{h}:{self.port}/v1"

    # -- lifecycle
    async def start(self) -> None:
        """Bind and start serving; raises :class:`OSError` if the address is taken."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        r = app.router
        r.add_post("/v1/chat/completions", self._chat)
        r.add_post("/v1/completions", self._completions)
        r.add_post("/chat/completions", self._chat)
        r.add_post("/completions", self._completions)
        r.add_get("/v1/models", self._models)
        r.add_get("/health", self._health)
        r.add_get("/", self._root)
        r.add_get("/metrics", self._metrics)
        r.add_get("/mock/records", self._records)
        r.add_get("/mock/stats", self._stats)
        r.add_post("/mock/reset", self._reset)
        for method, path, handler in info_routes(self.config.dialect, self.config.model, self.config.context_tokens):
            r.add_route(method, path, handler)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        fam = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(fam, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.config.port))
        except OSError:
            sock.close()
            await self._runner.cleanup()
            raise
        self.port = sock.getsockname()[1]
        site = web.SockSite(self._runner, sock, backlog=1024)
        await site.start()
        if (self.config.max_inflight > 0 and self.config.overload_status is None
                and stream_rules(self.config.dialect).overload_status is None):  # llama-server defers
            self._queue = asyncio.Semaphore(self.config.max_inflight)

    async def close(self) -> None:
        """Stop serving; idempotent."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    def reset(self) -> None:
        """Clear records and counters, empty the prefix cache and re-seed the failure RNG (a run after a reset
        is reproducible)."""
        self.records.clear()
        if self.cache is not None:
            self.cache = PrefixCache(self.cache.capacity)
        self.requests = 0
        self.completed = 0
        self.injected = dict.fromkeys(INJECTED_KINDS, 0)
        self._rng = random.Random(self.config.seed)
        self._ids = itertools.count()

    def stats(self) -> dict[str, Any]:
        """Counts: completion requests received, completed normally, running now, injected failures by kind."""
        return {"requests": self.requests, "completed": self.completed, "running": self.running,
                "injected": dict(self.injected), "dialect": self.config.dialect}

    # -- small endpoints
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            model_card(self.config.dialect, self.config.model, self.config.context_tokens)]},
            dumps=lambda o: orjson.dumps(o).decode())

    async def _health(self, request: web.Request) -> web.Response:
        if self.config.dialect == "llamacpp":
            return web.json_response({"status": "ok"})
        return web.Response(status=200)

    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running" if self.config.dialect == "ollama" else "servelab mock-engine")

    async def _metrics(self, request: web.Request) -> web.Response:
        d = self.config.dialect
        lines = [
            "# HELP mock_requests_total Completion requests received.", "# TYPE mock_requests_total counter",
            f"mock_requests_total {self.requests}",
            "# HELP mock_requests_running Completion requests in flight.", "# TYPE mock_requests_running gauge",
            f"mock_requests_running {self.running}",
            "# TYPE mock_requests_completed_total counter", f"mock_requests_completed_total {self.completed}",
        ]
        for kind, n in self.injected.items():
            lines.append(f'mock_injected_failures_total{{kind="{kind}"}} {n}')
        w = stream_rules(d)
        if w.running_gauge and w.waiting_gauge:
            lines += [f"# TYPE {w.running_gauge} gauge", f"{w.running_gauge} {self.running - self.waiting}",
                      f"# TYPE {w.waiting_gauge} gauge", f"{w.waiting_gauge} {self.waiting}"]
        if self.cache is not None:  # servelab.engines.mockcache: vLLM's counter names, KV use in the dialect's
            lines += ["# TYPE vllm:prefix_cache_queries_total counter",
                      f"vllm:prefix_cache_queries_total {self.cache.queries}",
                      "# TYPE vllm:prefix_cache_hits_total counter", f"vllm:prefix_cache_hits_total {self.cache.hits}"]
            kv = {"vllm": "vllm:kv_cache_usage_perc", "sglang": "sglang:token_usage"}.get(d)
            if kv:
                usage = min(1.0, self._kv_words / (self.cache.capacity * BLOCK_WORDS))
                lines += [f"# TYPE {kv} gauge", f"{kv} {usage:.6g}"]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    async def _records(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps([r.to_dict() for r in self.records]),
                            content_type="application/json")

    async def _stats(self, request: web.Request) -> web.Response:
        return web.Response(body=orjson.dumps(self.stats()), content_type="application/json")

    async def _reset(self, request: web.Request) -> web.Response:
        self.reset()
        return web.Response(body=b'{"ok":true}', content_type="application/json")

    # -- generation
    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, False)

    def _error(self, status: int, message: str) -> web.Response:
        return web.Response(status=status, body=error_body(self.config.dialect, status, message),
                            content_type="application/json")

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        recv = _now()
        cfg = self.config
        seq = next(self._ids)
        rec = MockRecord(request.headers.get("X-Request-Id") or str(seq), recv)
        rec.client_request_id = request.headers.get("X-Client-Request-ID")
        rec.traceparent = request.headers.get("traceparent")
        rec.endpoint = "chat" if chat else "completions"
        self.records.append(rec)
        self.requests += 1
        self._received += 1
        crash = cfg.crash_after_requests is not None and self._received > cfg.crash_after_requests
        try:
            body = orjson.loads(await request.read())
            if not isinstance(body, dict):
                raise ValueError("body is not a JSON object")
        except ValueError as e:  # orjson.JSONDecodeError is a ValueError
            if crash:
                _crash(self._received)
            rec.status = 400
            rec.done_ns = _now()
            return self._error(400, f"invalid JSON body: {e}")
        model = body.get("model")
        rec.model = model if isinstance(model, str) else None
        stream = bool(body.get("stream", False))
        rec.stream = stream
        rec.prompt_tokens = _count_words(body)
        rec.sampling = {k: body[k] for k in SAMPLING_FIELDS if k in body}
        if crash:  # no overload answer and no failure draw: this one is answered until the crash
            plan = _plan(cfg, body, chat)
            rec.output_tokens = plan.generated
            rec.finish_reason = plan.finish
            self.running += 1
            try:
                return await self._respond(request, rec, body, chat, plan, "crash", seq, stream, recv)
            finally:
                self.running -= 1
        overflow = context_overflow(cfg, body, rec.prompt_tokens)
        if (overflow is None and stream_rules(cfg.dialect).overflow_status is None
                and 0 < cfg.context_tokens < rec.prompt_tokens):
            rec.prompt_tokens = cfg.context_tokens  # Ollama keeps the last num_ctx tokens, says nothing
        if overflow is not None:
            rec.status = overflow[0]
            rec.done_ns = _now()
            return web.Response(status=overflow[0], body=overflow[1], content_type="application/json")
        if cfg.max_inflight > 0 and self._queue is None and self.running >= cfg.max_inflight:
            status = cfg.overload_status or stream_rules(cfg.dialect).overload_status or 503
            rec.injected = "overload"
            rec.status = status
            self.injected["overload"] += 1
            rec.done_ns = _now()
            return self._error(status, "Too many requests in flight; try again later" if status == 429
                               else "Service Unavailable: the request queue is full")
        # one draw per request, in arrival order: bands http | stream_error | cut | hang | none
        u = self._rng.random()
        kind = None
        edge = cfg.fail_http_rate
        if u < edge:
            kind = "http_status"
        elif u < (edge := edge + cfg.stream_error_rate):
            kind = "stream_error"
        elif u < (edge := edge + cfg.cut_rate):
            kind = "cut_off"
        elif u < edge + cfg.hang_rate:
            kind = "hang"
        if kind is not None:
            rec.injected = kind
            self.injected[kind] += 1
        if kind == "http_status":
            rec.status = cfg.fail_http_status
            rec.done_ns = _now()
            return self._error(cfg.fail_http_status, cfg.error_message or "mock-engine injected failure")
        plan = _plan(cfg, body, chat)
        rec.output_tokens = plan.generated
        rec.finish_reason = plan.finish
        self.running += 1
        try:
            if self._queue is not None:  # llama-server defers: the schedule starts when a slot frees
                self.waiting += 1
                try:
                    await self._queue.acquire()
                finally:
                    self.waiting -= 1
                try:
                    return await self._cached(request, rec, body, chat, plan, kind, seq, stream, _now())
                finally:
                    self._queue.release()
            return await self._cached(request, rec, body, chat, plan, kind, seq, stream, recv)
        finally:
            self.running -= 1

    async def _cached(self, request: web.Request, rec: MockRecord, body: dict[str, Any], chat: bool,
                      plan: _Plan, kind: str | None, seq: int, stream: bool, origin: int) -> web.StreamResponse:
        """:meth:`_respond` after the prefix-cache lookup (when the mock has one) and with the request's
        words counted as KV in use while it runs."""
        if self.cache is None:
            return await self._respond(request, rec, body, chat, plan, kind, seq, stream, origin)
        rec.cached_tokens = min(rec.prompt_tokens, self.cache.lookup(prompt_words(body)))
        words = rec.prompt_tokens + plan.generated
        self._kv_words += words
        try:
            return await self._respond(request, rec, body, chat, plan, kind, seq, stream, origin)
        finally:
            self._kv_words -= words

    async def _respond(self, request: web.Request, rec: MockRecord, body: dict[str, Any], chat: bool,
                       plan: _Plan, kind: str | None, seq: int, stream: bool, origin: int) -> web.StreamResponse:
        model = rec.model or self.config.model
        enc = _Encoder(self.config, self.config.dialect, chat, model, seq, rec.prompt_tokens, plan)
        enc.cached = rec.cached_tokens
        if stream:
            so = body.get("stream_options")
            include_usage = isinstance(so, dict) and bool(so.get("include_usage"))
            return await self._stream(request, rec, enc, plan, kind, include_usage, origin)
        return await self._whole(request, rec, enc, plan, kind, chat, model, origin)

    async def _stream(self, request: web.Request, rec: MockRecord, enc: _Encoder, plan: _Plan,
                      kind: str | None, include_usage: bool, origin: int) -> web.StreamResponse:
        d = self.config.dialect
        ttft_ns, itl_ns = self._delays_ns
        law = self._batch
        delay = ttft_ns > 0 or itl_ns > 0 or law is not None
        target = gap = 0
        sleep = asyncio.sleep
        hold = d in HOLD_HEADERS
        resp = web.StreamResponse(status=200, headers=_SSE_HEADERS)
        resp.enable_chunked_encoding()
        rec.status = 200
        role = enc.role_chunk()
        if not hold:
            writer = await resp.prepare(request)
            rec.headers_ns = _now()
            if role:  # vLLM: headers and role chunk go out at once (case 20)
                await resp.write(role)
                role = b""
            elif callable(send_headers := getattr(writer, "send_headers", None)):
                send_headers()  # TGI, /v1/completions: headers at once, no body yet
            else:  # pragma: no cover - older aiohttp buffers headers until the first body bytes
                await resp.write(b": mock\n\n")
        chunks = plan.chunks
        n = len(chunks)
        cut_at = max(1, n // 2) if kind in ("stream_error", "cut_off") else (1 if kind == "hang" else -1)
        if kind == "crash":
            cut_at = n // 2  # 0 (before any token) when there are fewer than two chunks
        chat = enc.chat
        # the trailer after the last token chunk: finish, usage, [DONE] (one write with the last token)
        last_finish, last_usage, last_extra, trailer = _trailer(enc, plan, d, include_usage)
        write = resp.write
        token_write_ns = rec.token_write_ns
        token_counts = rec.token_counts
        first_tool = True
        try:
            for i in range(n):
                if i == cut_at:
                    return await self._fail_stream(request, resp, rec, enc, kind)
                ck, text, ntok = chunks[i]
                if i == n - 1:
                    data = enc.token(ck, text, first_tool and ck == "t", last_finish, last_usage, last_extra) + trailer
                else:
                    data = enc.token(ck, text, first_tool and ck == "t", None)
                if ck == "t":
                    first_tool = False
                if delay:
                    target = (origin + ttft_ns + i * itl_ns if law is None
                              else law.target_ns(origin, i, target, gap, rec.prompt_tokens - rec.cached_tokens))
                    rem = target - _now()
                    if rem > 0:
                        await sleep(rem / 1e9)
                if role or i == 0 and hold:
                    data = role + data
                    role = b""
                    await resp.prepare(request)  # buffers the held headers; they leave with this write
                    rec.headers_ns = _now()
                t = _now()
                token_write_ns.append(t)
                await write(data)
                token_counts.append(ntok)
                if law is not None:
                    gap = law.wrote(i)  # joins the running batch at its first chunk (left in finally)
            if n == 0 and kind == "crash":
                return await self._fail_stream(request, resp, rec, enc, kind)
            if n == 0:
                if hold:
                    await resp.prepare(request)
                    rec.headers_ns = _now()
                await write(role + (enc.finish_chunk(plan.finish) if chat and not enc.w.finish_with_last_token else
                                    enc.head + (b'{"content":""}' if chat else b'""') + enc.mid
                                    + b'"' + plan.finish.encode() + b'"' + enc.tail) + trailer)
            if n == cut_at:  # one-chunk streams: fail after the only token
                return await self._fail_stream(request, resp, rec, enc, kind)
            await resp.write_eof()
        except (ConnectionError, asyncio.CancelledError):
            rec.done_ns = _now()
            raise
        finally:
            if law is not None and token_counts:
                law.decoding -= 1  # it left the running batch (finished, failed or cut)
        rec.done_ns = _now()
        self.completed += 1
        return resp

    async def _fail_stream(self, request: web.Request, resp: web.StreamResponse, rec: MockRecord,
                           enc: _Encoder, kind: str | None) -> web.StreamResponse:
        """Inject ``kind`` into a started stream: error event, cut connection, or stall then cut."""
        if not resp.prepared:
            await resp.prepare(request)
            rec.headers_ns = _now()
        if kind == "crash":
            writer = await resp.prepare(request)  # the prepared writer; held headers still buffered
            if callable(send_headers := getattr(writer, "send_headers", None)):
                send_headers()  # so the crash is mid-response: status line and headers went out
            _crash(self._received)
        if kind == "stream_error":
            data = enc.error_event(self.config.error_message or "mock-engine injected error during generation")
            if enc.done_after_error:
                data += _DONE
            await resp.write(data)
            if enc.done_after_error:
                await resp.write_eof()
            else:
                _abort(request)
        elif kind == "hang":
            await asyncio.sleep(self.config.hang_s)
            _abort(request)
        else:
            _abort(request)
        rec.done_ns = _now()
        return resp

    async def _whole(self, request: web.Request, rec: MockRecord, enc: _Encoder, plan: _Plan,
                     kind: str | None, chat: bool, model: str, origin: int) -> web.StreamResponse:
        ttft_ns, itl_ns = self._delays_ns
        n = len(plan.chunks)
        if ttft_ns or itl_ns:
            rem = origin + ttft_ns + max(0, n - 1) * itl_ns - _now()
            if rem > 0:
                await asyncio.sleep(rem / 1e9)
        if kind == "crash":
            _crash(self._received)
        if kind == "hang":
            await asyncio.sleep(self.config.hang_s)
            _abort(request)
            rec.done_ns = _now()
            return web.Response(status=200)
        if kind == "cut_off":
            _abort(request)
            rec.done_ns = _now()
            return web.Response(status=200)
        if kind == "stream_error":
            rec.status = 500
            rec.done_ns = _now()
            return self._error(500, self.config.error_message or "mock-engine injected error during generation")
        content = "".join(t for k, t, _ in plan.chunks if k == "c")
        reasoning = "".join(t for k, t, _ in plan.chunks if k == "r")
        args = "".join(t for k, t, _ in plan.chunks if k == "t")
        usage: dict[str, Any] = {"prompt_tokens": rec.prompt_tokens, "completion_tokens": plan.generated,
                                 "total_tokens": rec.prompt_tokens + plan.generated}
        if self.cache is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": rec.cached_tokens}
        fr = plan.finish
        if fr == "stop":
            fr = stream_rules(self.config.dialect).stop_finish
        if chat:
            msg: dict[str, Any] = {"role": "assistant", "content": content if not args else None}
            if reasoning:
                msg[REASONING_FIELD[self.config.dialect]] = reasoning
            if plan.tool_name is not None:
                msg["tool_calls"] = [{"id": plan.tool_id, "type": "function",
                                      "function": {"name": plan.tool_name, "arguments": args}}]
            out: dict[str, Any] = {"id": f"chatcmpl-mock{rec.request_id}", "object": "chat.completion",
                                   "created": int(time.time()), "model": model,
                                   "choices": [{"index": 0, "message": msg, "logprobs": None, "finish_reason": fr}],
                                   "usage": usage}
        else:
            out = {"id": f"cmpl-mock{rec.request_id}", "object": "text_completion", "created": int(time.time()),
                   "model": model, "choices": [{"index": 0, "text": content, "logprobs": None, "finish_reason": fr}],
                   "usage": usage}
        payload = orjson.dumps(out)
        rec.status = 200
        rec.headers_ns = t = _now()
        rec.token_write_ns.append(t)
        rec.token_counts.append(plan.generated)
        resp = web.Response(status=200, body=payload, content_type="application/json")
        rec.done_ns = _now()
        self.completed += 1
        return resp


def _crash(received: int) -> None:
    """Exit the process at once with status 3 (no cleanup, no flushing of Python buffers): the injected
    crash of ``crash_after_requests``. Bytes already handed to the kernel still reach the client."""
    try:
        os.write(2, f"servelab mock-engine: injected crash at completion request {received}; "
                    "exiting with status 3\n".encode())
    except OSError:
        pass
    os._exit(3)


def _abort(request: web.Request) -> None:
    """Close the connection now (buffered bytes still go out): the body ends without its last chunk."""
    tr = request.transport
    if tr is not None:
        tr.close()


async def start_mock(config: MockConfig) -> MockServer:
    """Start a mock engine in the running event loop and return it (``.port``, ``.base_url``, ``close()``).

    Raises :class:`ValueError` for a bad config and :class:`OSError` if the address cannot be bound.
    """
    server = MockServer(config)
    await server.start()
    return server


def serve(config: MockConfig, announce: bool = True) -> None:
    """Run the mock until SIGINT/SIGTERM (uvloop if importable); blocking. Prints
    ``mock-engine (<dialect>) listening on http://HOST:PORT/v1`` once bound when ``announce``.
    Raises :class:`ValueError` for a bad config and :class:`OSError` if the address cannot be bound."""
    validate_config(config)
    install_uvloop()

    async def main() -> None:
        server = await start_mock(config)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, stop.set)
            except (NotImplementedError, RuntimeError):  # pragma: no cover - non-Unix
                pass
        if announce:
            print(f"mock-engine ({config.dialect}) listening on {server.base_url}", flush=True)
        try:
            await stop.wait()
        finally:
            await server.close()

    asyncio.run(main())


def mock_engine_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (IP or host name)."),
    port: int = typer.Option(0, "--port", help="TCP port to bind; 0 picks a free port."),
    ttft_ms: float = typer.Option(0.0, "--ttft-ms",
        help="Time to first token, in milliseconds after the request arrives."),
    itl_ms: float = typer.Option(0.0, "--itl-ms", help="Time between token chunks, in milliseconds."),
    output_tokens: int = typer.Option(16, "--output-tokens",
        help="Answer tokens per request (count; capped by max_tokens)."),
    tokens_per_chunk: int = typer.Option(1, "--tokens-per-chunk", help="Tokens per streamed chunk (count)."),
    dialect: str = typer.Option("vllm", "--dialect", help="Wire dialect: vllm, sglang, tgi, llamacpp or ollama."),
    reasoning_tokens: int = typer.Option(0, "--reasoning-tokens",
        help="Reasoning tokens streamed before the answer (count)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the failure-injection RNG (integer)."),
    fail_http_rate: float = typer.Option(0.0, "--fail-http-rate",
        help="Probability (0-1) of answering with --fail-http-status."),
    fail_http_status: int = typer.Option(500, "--fail-http-status", help="HTTP status code of injected HTTP failures."),
    stream_error_rate: float = typer.Option(0.0, "--stream-error-rate",
        help="Probability (0-1) of an error event inside a 200 stream."),
    cut_rate: float = typer.Option(0.0, "--cut-rate", help="Probability (0-1) of closing the connection mid-stream."),
    hang_rate: float = typer.Option(0.0, "--hang-rate", help="Probability (0-1) of stalling after the first chunk."),
    hang_s: float = typer.Option(30.0, "--hang-s", help="How long a hung request stalls, in seconds."),
    max_inflight: int = typer.Option(0, "--max-inflight", help="Running-request cap (count); 0 = no cap."),
    overload_status: int | None = typer.Option(None, "--overload-status",
        help="HTTP status beyond --max-inflight (default: 429 on tgi, 503 elsewhere, queueing on llamacpp)."),
    model: str = typer.Option("mock", "--model",
        help="Model name listed by /v1/models (any requested name is echoed)."),
    invalid_json: bool = typer.Option(False, "--invalid-json",
        help="Answer response_format json_schema/json_object requests with JSON cut short (not parseable)."),
    bad_tool_call: str = typer.Option("none", "--bad-tool-call",
        help="Tool calls that a gate must catch: json (arguments cut short), schema (arguments missing the "
             "required fields), name (a function that was not offered); none = valid calls."),
    crash_after_requests: int | None = typer.Option(None, "--crash-after-requests",
        help="After this many completion requests (count), exit with status 3 in the middle of answering the next "
             "one; unset = never."),
    error_message: str | None = typer.Option(
        None, "--error-message",
        help="Text of injected HTTP errors and in-stream error events (e.g. a CUDA out-of-memory message); "
             "unset = a plain mock text."),
    context_tokens: int = typer.Option(
        0, "--context-tokens",
        help="Context window (prompt words + max_tokens, count): larger requests get the dialect's "
             "context-overflow error; 0 = unlimited."),
    prefill_tokens_per_s: float = typer.Option(
        0.0, "--prefill-tokens-per-s",
        help="Continuous-batching timing: the first token comes --ttft-ms + prompt words / this rate (tokens/s) "
             "after service starts; 0 = off."),
    itl_ms_per_running: float = typer.Option(
        0.0, "--itl-ms-per-running",
        help="Continuous-batching timing: each later chunk comes --itl-ms + this many ms per other answer "
             "decoding at once; 0 = off. Slots: --max-inflight with --dialect llamacpp."),
    prefix_cache_blocks: int = typer.Option(
        0, "--prefix-cache-blocks",
        help="Prefix cache of this many 16-word blocks (LRU): cached prompt words skip prefill and are "
             "reported as usage.prompt_tokens_details.cached_tokens and vllm:prefix_cache_hits_total; 0 = off."),
) -> None:
    """Run a mock OpenAI-compatible engine that streams deterministic tokens on a fixed schedule."""
    cfg = MockConfig(host=host, port=port, ttft_ms=ttft_ms, itl_ms=itl_ms, output_tokens=output_tokens,
                     tokens_per_chunk=tokens_per_chunk, dialect=typing.cast(Dialect, dialect),  # MockConfig checks it
                     reasoning_tokens=reasoning_tokens,
                     seed=seed, fail_http_rate=fail_http_rate, fail_http_status=fail_http_status,
                     stream_error_rate=stream_error_rate, cut_rate=cut_rate, hang_rate=hang_rate, hang_s=hang_s,
                     max_inflight=max_inflight, overload_status=overload_status, model=model,
                     invalid_json=invalid_json, bad_tool_call=typing.cast(Any, bad_tool_call),
                     crash_after_requests=crash_after_requests,
                     error_message=error_message, context_tokens=context_tokens,
                     prefill_tokens_per_s=prefill_tokens_per_s, itl_ms_per_running=itl_ms_per_running,
                     prefix_cache_blocks=prefix_cache_blocks)
    try:
        validate_config(cfg)
        serve(cfg)
    except (ValueError, OSError) as e:
        print(f"servelab mock-engine: error: {e}", file=sys.stderr)
        raise typer.Exit(2) from None


if __name__ == "__main__":
    typer.run(mock_engine_command)
