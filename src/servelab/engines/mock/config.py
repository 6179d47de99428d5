"""The mock engine's configuration: :class:`MockConfig` (every option, its unit, bound and default) and the
checks that refuse impossible values, so the CLI, the in-process server and the launcher's settings
(:mod:`servelab.engines.mock.launch`) share one definition."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import Field

from servelab.wire.dialects import ENGINE_DIALECTS, EngineDialect

__all__ = ["DIALECTS", "FAILURE_RATES", "Dialect", "MockConfig", "check_failure_rates", "validate_config"]

#: Wire dialects the mock can speak: the engines of the dialect table.
Dialect = EngineDialect
DIALECTS: tuple[str, ...] = ENGINE_DIALECTS


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
    delay, before any body; run in-process
    (:func:`~servelab.engines.mock.server.start_mock`) it ends the host process. ``None`` never crashes.
    ``error_message`` is the text of injected HTTP errors and in-stream error events (``None``: a plain
    "mock-engine injected ..." text); set it to what a real engine says in trouble (``"CUDA error: out of
    memory (/opt/vllm/worker.py:812, batch 7f3a9c)"``) to check that a client or gateway keeps it from end
    users. ``context_tokens`` > 0 is the model's context window: a request whose prompt words (+ its
    ``max_tokens``, except on llama-server, which checks the prompt only) exceed it gets the dialect's
    context-overflow error (docs/engine-wire.md case 18: 400 on vLLM/SGLang/llama-server with their wording and
    llama-server's ``n_prompt_tokens``/``n_ctx``, 422 on TGI; Ollama truncates silently, so it answers and
    its usage counts ``context_tokens`` prompt tokens).
    ``prefill_tokens_per_s`` / ``itl_ms_per_running`` > 0 switch streamed answers to continuous-batching
    timing of a known law (:mod:`servelab.engines.mock.batch`: first token after ``ttft_ms`` + prompt /
    rate, each later chunk ``itl_ms + itl_ms_per_running * (running batch - 1)`` ms apart).
    Raises nothing itself; :func:`validate_config` checks the values.
    """

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535, description="TCP port; 0 = a free port")] = 0
    ttft_ms: Annotated[float, Field(ge=0, description="time to first token chunk, ms")] = 0.0
    itl_ms: Annotated[float, Field(ge=0, description="time between token chunks, ms")] = 0.0
    output_tokens: Annotated[
        int, Field(ge=0, description="tokens generated per answer (fewer if max_tokens is smaller)")
    ] = 16
    tokens_per_chunk: Annotated[int, Field(ge=1, description="tokens per streamed chunk")] = 1
    dialect: Annotated[Dialect, Field(description="the engine whose wire format it speaks")] = "vllm"
    reasoning_tokens: Annotated[int, Field(ge=0, description="reasoning tokens before the answer")] = 0
    seed: Annotated[int, Field(description="seed of the failure draws")] = 0
    fail_http_rate: Annotated[float, Field(ge=0, le=1, description="probability of an HTTP error status")] = 0.0
    fail_http_status: Annotated[int, Field(ge=100, le=599, description="status of injected HTTP errors")] = 500
    stream_error_rate: Annotated[float, Field(ge=0, le=1, description="probability of an in-stream error event")] = 0.0
    cut_rate: Annotated[float, Field(ge=0, le=1, description="probability of a cut connection mid-stream")] = 0.0
    hang_rate: Annotated[float, Field(ge=0, le=1, description="probability of a hung request")] = 0.0
    hang_s: Annotated[float, Field(ge=0, description="how long a hung request stalls, s")] = 30.0
    max_inflight: Annotated[int, Field(ge=0, description="cap on running requests (0 = none)")] = 0
    overload_status: Annotated[
        int | None, Field(ge=100, le=599, description="status beyond max_inflight (null = by dialect)")
    ] = None
    model: Annotated[str, Field(min_length=1, description="model name listed by /v1/models")] = "mock"
    invalid_json: Annotated[bool, Field(description="answer schema requests with broken JSON")] = False
    bad_tool_call: Annotated[
        Literal["none", "json", "schema", "name"],
        Field(
            description="tool calls with arguments cut short (json), arguments against the schema (schema) or "
            "an unknown function name (name)"
        ),
    ] = "none"
    crash_after_requests: Annotated[
        int | None, Field(ge=0, description="exit while answering request N+1 (null = never)")
    ] = None
    error_message: Annotated[
        str | None, Field(min_length=1, description="text of injected errors (null = a plain mock text)")
    ] = None
    context_tokens: Annotated[
        int, Field(ge=0, description="context window in prompt words + max_tokens (0 = unlimited)")
    ] = 0
    prefill_tokens_per_s: Annotated[
        float, Field(ge=0, description="prefill rate: the first token comes prompt/rate s after ttft_ms (0 = off)")
    ] = 0.0
    itl_ms_per_running: Annotated[
        float, Field(ge=0, description="ms added to itl_ms per other answer decoding at once (0 = off)")
    ] = 0.0
    prefix_cache_blocks: Annotated[
        int,
        Field(
            ge=0,
            description="prefix-cache blocks of 16 words kept (LRU); 0 = no prefix cache (servelab.engines.mock.cache)",
        ),
    ] = 0


#: the failure-rate fields: exclusive bands of one uniform draw per request, so their sum is <= 1
FAILURE_RATES = ("fail_http_rate", "stream_error_rate", "cut_rate", "hang_rate")


def check_failure_rates(values: Any) -> None:
    """Raise :class:`ValueError` when the :data:`FAILURE_RATES` of ``values`` (attributes) add up to more than 1."""
    if sum(float(getattr(values, n)) for n in FAILURE_RATES) > 1.0 + 1e-9:
        raise ValueError(
            "fail_http_rate + stream_error_rate + cut_rate + hang_rate must be <= 1 (the failure "
            "rates add up to more than 1)"
        )


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
