"""The Anthropic Messages and OpenAI Responses stream parsers (servelab.wire.apis) on recorded event streams,
event by event: where the first token is stamped (the first content delta, never ``message_start`` /
``response.created``), which events are token chunks, usage from each API's own fields, finish reasons,
tool calls, errors and cut-off streams; and each API's request body for a chat-shaped spec.

Streams are fed in several splits (one event per read, byte by byte, CRLF, one piece) with fake monotonic
timestamps: every byte of event ``i`` arrives at ``(i + 1) * T`` ns, so each event's arrival time is known.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from servelab.wire.apis import (
    MessagesStreamParser,
    ResponsesStreamParser,
    api_headers,
    messages_body,
    responses_body,
    usage_counts,
)
from servelab.wire.client import build_body, finalize
from servelab.wire.errors import ConfigError
from servelab.wire.stream import StreamParser
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec

T = 1000  # ns between fake event arrivals


def sse(kind: str, data: dict[str, Any]) -> bytes:
    """One named SSE event whose data repeats its type, as both APIs send them."""
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) + b"\n\n"


def _feed(cls: type[StreamParser], events: list[bytes], mode: str) -> RequestRecord:
    rec = RequestRecord(request_id=1, status=200)
    p = cls(rec)
    if mode == "events":
        for i, e in enumerate(events):
            p.feed(e, (i + 1) * T)
    elif mode == "bytes":
        for i, e in enumerate(events):
            for j in range(len(e)):
                p.feed(e[j : j + 1], (i + 1) * T)
    elif mode == "crlf":
        for i, e in enumerate(events):
            p.feed(e.replace(b"\n", b"\r\n"), (i + 1) * T)
    else:
        p.feed(b"".join(events), T)
    p.close((len(events) + 1) * T)
    finalize(rec)
    return rec


def parse(cls: type[StreamParser], events: list[bytes]) -> RequestRecord:
    """Parse ``events`` in every split; the splits must agree; the one-event-per-read record."""
    base = _feed(cls, events, "events")
    for mode in ("bytes", "crlf", "whole"):
        r = _feed(cls, events, mode)
        assert (
            r.content_text,
            r.reasoning_text,
            r.finish_reason_raw,
            r.usage,
            r.failure,
            r.saw_done,
            len(r.chunk_ns),
            r.output_tokens,
            r.prompt_tokens,
        ) == (
            base.content_text,
            base.reasoning_text,
            base.finish_reason_raw,
            base.usage,
            base.failure,
            base.saw_done,
            len(base.chunk_ns),
            base.output_tokens,
            base.prompt_tokens,
        ), mode
        if mode != "whole":
            assert (r.chunk_ns, r.first_token_ns, r.first_answer_ns) == (
                base.chunk_ns,
                base.first_token_ns,
                base.first_answer_ns,
            ), mode
    return base


# ------------------------------------------------------------------------------------------ Anthropic Messages


def msg_start(input_tokens: int = 25, output_tokens: int = 1) -> bytes:
    return sse(
        "message_start",
        {
            "message": {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-x",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens},
            }
        },
    )


def block_start(i: int, block: dict[str, Any]) -> bytes:
    return sse("content_block_start", {"index": i, "content_block": block})


def delta(i: int, d: dict[str, Any]) -> bytes:
    return sse("content_block_delta", {"index": i, "delta": d})


def msg_end(stop: str, usage: dict[str, Any]) -> list[bytes]:
    return [
        sse("message_delta", {"delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage}),
        sse("message_stop", {}),
    ]


def test_messages_text_stream_ttft_at_first_text_delta_and_usage_from_message_delta() -> None:
    """Anthropic's documented text stream: message_start, ping, a text block of two deltas, message_delta with
    the cumulative output_tokens, message_stop. TTFT is the first text_delta (event 5), not message_start."""
    events = [
        msg_start(),
        block_start(0, {"type": "text", "text": ""}),
        sse("ping", {}),
        delta(0, {"type": "text_delta", "text": "Hello"}),
        delta(0, {"type": "text_delta", "text": "!"}),
        sse("content_block_stop", {"index": 0}),
        *msg_end("end_turn", {"output_tokens": 15}),
    ]
    rec = parse(MessagesStreamParser, events)
    assert rec.ok and rec.saw_done and rec.done_ns == 8 * T
    assert rec.first_event_ns == 1 * T and rec.first_token_ns == 4 * T and rec.first_answer_ns == 4 * T
    assert rec.chunk_ns == [4 * T, 5 * T] and rec.chunk_tokens == [0, 0] and rec.last_token_ns == 5 * T
    assert rec.content_text == "Hello!" and rec.response_model == "claude-x"
    assert (rec.finish_reason_raw, rec.finish_reason) == ("end_turn", "stop")
    # output tokens from message_delta (cumulative, replaces message_start's 1), input from message_start
    assert rec.usage == {"input_tokens": 25, "output_tokens": 15}
    assert (rec.prompt_tokens, rec.output_tokens, rec.output_tokens_source) == (25, 15, "usage")
    assert rec.cached_tokens is None


def test_messages_thinking_then_text_and_cache_usage() -> None:
    """Thinking is a token (first_token_ns) but not the answer (first_answer_ns at the text); a
    signature_delta carries none; prompt tokens add the cache reads and writes, cached = the reads."""
    events = [
        msg_start(0, 0),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Let me think"}),
        delta(0, {"type": "signature_delta", "signature": "EqQB"}),
        sse("content_block_stop", {"index": 0}),
        block_start(1, {"type": "text", "text": ""}),
        delta(1, {"type": "text_delta", "text": "42"}),
        sse("content_block_stop", {"index": 1}),
        *msg_end(
            "max_tokens",
            {"input_tokens": 10, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 5, "output_tokens": 7},
        ),
    ]
    rec = parse(MessagesStreamParser, events)
    assert rec.ok and rec.first_token_ns == 3 * T and rec.first_answer_ns == 7 * T and rec.chunk_ns == [3 * T, 7 * T]
    assert rec.reasoning_text == "Let me think" and rec.content_text == "42"
    assert (rec.finish_reason_raw, rec.finish_reason, rec.truncated) == ("max_tokens", "length", True)
    assert (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (105, 7, 90)


def test_messages_tool_use_fragments_joined() -> None:
    events = [
        msg_start(),
        block_start(0, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": ""}),
        delta(0, {"type": "input_json_delta", "partial_json": '{"city": "Pa'}),
        delta(0, {"type": "input_json_delta", "partial_json": 'ris"}'}),
        sse("content_block_stop", {"index": 0}),
        *msg_end("tool_use", {"output_tokens": 9}),
    ]
    rec = parse(MessagesStreamParser, events)
    assert rec.ok and rec.first_token_ns == 4 * T and rec.first_answer_ns is None and rec.chunk_ns == [4 * T, 5 * T]
    assert (rec.finish_reason_raw, rec.finish_reason) == ("tool_use", "tool_calls")
    (call,) = rec.tool_calls.values()
    assert (call.id, call.name, call.arguments, call.arguments_valid) == (
        "toolu_1",
        "get_weather",
        '{"city": "Paris"}',
        True,
    )


def test_messages_error_event_cut_off_and_not_sse() -> None:
    """An error event (overloaded) is a stream_error with its type; a stream without message_stop is cut off
    (even after message_delta); a body of nothing but message_start is cut off too."""
    err = sse("error", {"error": {"type": "overloaded_error", "message": "Overloaded"}})
    rec = parse(
        MessagesStreamParser,
        [
            msg_start(),
            block_start(0, {"type": "text", "text": ""}),
            delta(0, {"type": "text_delta", "text": "Hi"}),
            err,
        ],
    )
    assert rec.failure is FailureClass.STREAM_ERROR and rec.error is not None
    assert (rec.error.type, rec.error.message, rec.error.status) == ("overloaded_error", "Overloaded", 200)
    rec = parse(
        MessagesStreamParser,
        [msg_start(), delta(0, {"type": "text_delta", "text": "Hi"}), msg_end("end_turn", {"output_tokens": 1})[0]],
    )
    assert rec.failure is FailureClass.CUT_OFF and rec.content_text == "Hi"
    assert parse(MessagesStreamParser, [msg_start()]).failure is FailureClass.CUT_OFF


# ------------------------------------------------------------------------------------------ OpenAI Responses


def ev(kind: str, seq: int, **data: Any) -> bytes:
    return sse(kind, {"sequence_number": seq, **data})


RESP = {"id": "resp_1", "object": "response", "status": "in_progress", "model": "gpt-x", "output": [], "usage": None}


def resp_done(kind: str, seq: int, usage: dict[str, Any], **more: Any) -> bytes:
    return ev(kind, seq, response={**RESP, "status": kind.split(".")[1], "usage": usage, **more})


USAGE = {
    "input_tokens": 36,
    "input_tokens_details": {"cached_tokens": 32},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 39,
}


def test_responses_text_stream_ttft_at_first_output_text_delta() -> None:
    """OpenAI's documented text stream: created, in_progress, output_item.added, content_part.added, deltas,
    the .done events, response.completed with usage. TTFT is the first output_text.delta (event 5)."""
    msg = {"type": "message", "id": "msg_1", "status": "in_progress", "role": "assistant", "content": []}
    part = {"type": "output_text", "text": "", "annotations": []}
    ids = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    events = [
        ev("response.created", 0, response=RESP),
        ev("response.in_progress", 1, response=RESP),
        ev("response.output_item.added", 2, output_index=0, item=msg),
        ev("response.content_part.added", 3, part=part, **ids),
        ev("response.output_text.delta", 4, delta="Hi", **ids),
        ev("response.output_text.delta", 5, delta=" there", **ids),
        ev("response.output_text.done", 6, text="Hi there", **ids),
        ev("response.content_part.done", 7, part={**part, "text": "Hi there"}, **ids),
        ev("response.output_item.done", 8, output_index=0, item={**msg, "status": "completed"}),
        resp_done("response.completed", 9, USAGE),
    ]
    rec = parse(ResponsesStreamParser, events)
    assert rec.ok and rec.saw_done and rec.done_ns == 10 * T and rec.response_model == "gpt-x"
    assert rec.first_event_ns == 1 * T and rec.first_token_ns == 5 * T and rec.first_answer_ns == 5 * T
    assert rec.chunk_ns == [5 * T, 6 * T] and rec.content_text == "Hi there"
    assert (rec.finish_reason_raw, rec.finish_reason) == ("completed", "stop")
    assert rec.usage == USAGE and (rec.prompt_tokens, rec.output_tokens, rec.cached_tokens) == (36, 3, 32)


def test_responses_reasoning_function_call_and_incomplete() -> None:
    """Reasoning deltas are tokens, not the answer; function-call arguments are joined per output item and the
    request finishes with tool_calls; response.incomplete (max_output_tokens) is a length finish."""
    fc = {
        "type": "function_call",
        "id": "fc_1",
        "call_id": "call_1",
        "name": "get_weather",
        "arguments": "",
        "status": "in_progress",
    }
    events = [
        ev("response.created", 0, response=RESP),
        ev("response.output_item.added", 1, output_index=0, item={"type": "reasoning", "id": "rs_1"}),
        ev("response.reasoning_text.delta", 2, item_id="rs_1", output_index=0, content_index=0, delta="hmm"),
        ev("response.output_item.added", 3, output_index=1, item=fc),
        ev("response.function_call_arguments.delta", 4, item_id="fc_1", output_index=1, delta='{"city":'),
        ev("response.function_call_arguments.delta", 5, item_id="fc_1", output_index=1, delta='"Oslo"}'),
        resp_done("response.completed", 6, USAGE),
    ]
    rec = parse(ResponsesStreamParser, events)
    assert rec.ok and rec.first_token_ns == 3 * T and rec.first_answer_ns is None
    assert rec.chunk_ns == [3 * T, 5 * T, 6 * T] and rec.reasoning_text == "hmm"
    assert rec.finish_reason == "tool_calls"
    (call,) = rec.tool_calls.values()
    assert (call.id, call.name, call.arguments, call.arguments_valid) == (
        "call_1",
        "get_weather",
        '{"city":"Oslo"}',
        True,
    )
    cut = [
        ev("response.created", 0, response=RESP),
        ev("response.output_text.delta", 1, delta="a"),
        resp_done("response.incomplete", 2, USAGE, incomplete_details={"reason": "max_output_tokens"}),
    ]
    rec = parse(ResponsesStreamParser, cut)
    assert rec.ok and (rec.finish_reason_raw, rec.finish_reason) == ("max_output_tokens", "length")
    # vLLM ends a response cut by its bound with response.completed carrying status "incomplete"
    vllm_cut = [
        *cut[:2],
        ev(
            "response.completed",
            2,
            response={
                **RESP,
                "status": "incomplete",
                "usage": USAGE,
                "incomplete_details": {"reason": "max_output_tokens"},
            },
        ),
    ]
    rec = parse(ResponsesStreamParser, vllm_cut)
    assert rec.ok and (rec.finish_reason_raw, rec.finish_reason) == ("max_output_tokens", "length")


def test_responses_failed_error_and_cut_off() -> None:
    failed = ev(
        "response.failed",
        2,
        response={**RESP, "status": "failed", "error": {"code": "server_error", "message": "backend died"}},
    )
    rec = parse(
        ResponsesStreamParser,
        [ev("response.created", 0, response=RESP), ev("response.output_text.delta", 1, delta="a"), failed],
    )
    assert rec.failure is FailureClass.STREAM_ERROR and rec.error is not None
    assert (rec.error.code, rec.error.message) == ("server_error", "backend died")
    rec = parse(ResponsesStreamParser, [ev("error", 0, code="rate_limit_exceeded", message="slow down", param=None)])
    assert rec.failure is FailureClass.STREAM_ERROR and rec.error is not None and rec.error.message == "slow down"
    rec = parse(
        ResponsesStreamParser,
        [ev("response.created", 0, response=RESP), ev("response.output_text.delta", 1, delta="a")],
    )
    assert rec.failure is FailureClass.CUT_OFF and rec.usage is None
    assert (rec.output_tokens, rec.output_tokens_source) == (1, "chunks")  # no usage came: one per delta, as chat


# ------------------------------------------------------------------------------------------ request bodies


def test_request_bodies_in_each_api_shape_and_refusals() -> None:
    spec = RequestSpec(
        endpoint="messages",
        max_tokens=64,
        extra={"temperature": 0.2, "stop": "END"},
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert (
        build_body("m", spec)
        == messages_body("m", spec)
        == {
            "model": "m",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "stream": True,
            "system": "be brief",
            "temperature": 0.2,
            "stop_sequences": ["END"],
        }
    )
    rf = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "object"}, "strict": True}}
    spec = RequestSpec(
        endpoint="responses",
        max_tokens=64,
        extra={"response_format": rf},
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
    )
    assert (
        build_body("m", spec)
        == responses_body("m", spec)
        == {
            "model": "m",
            "input": [{"type": "message", "role": "user", "content": "hi"}],
            "stream": True,
            "store": False,
            "instructions": "be brief",
            "max_output_tokens": 64,
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": True}},
        }
    )
    with pytest.raises(ConfigError, match="'ignore_eos' is not a field of the messages API"):
        messages_body(
            "m",
            RequestSpec(
                endpoint="messages",
                max_tokens=8,
                extra={"ignore_eos": True},
                messages=[{"role": "user", "content": "hi"}],
            ),
        )
    with pytest.raises(ConfigError, match="needs max_tokens"):
        messages_body("m", RequestSpec(endpoint="messages", messages=[{"role": "user", "content": "hi"}]))
    with pytest.raises(ConfigError, match="'stop' is not a field of the responses API"):
        responses_body(
            "m", RequestSpec(endpoint="responses", extra={"stop": "x"}, messages=[{"role": "user", "content": "hi"}])
        )
    assert api_headers("messages", {"Authorization": "Bearer sk-1"}) == {
        "Authorization": "Bearer sk-1",
        "anthropic-version": "2023-06-01",
        "x-api-key": "sk-1",
    }
    assert api_headers("responses", {"Authorization": "Bearer sk-1"}) == {"Authorization": "Bearer sk-1"}


def test_usage_counts_of_the_three_apis() -> None:
    assert usage_counts(
        {"prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 4}}
    ) == (5, 2, 4)
    assert usage_counts({"input_tokens": 5, "output_tokens": 2}) == (5, 2, None)
    assert usage_counts({"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 0}) == (5, 2, 0)
    assert usage_counts({"input_tokens": 5, "output_tokens": 2, "input_tokens_details": {"cached_tokens": 1}}) == (
        5,
        2,
        1,
    )
    assert usage_counts({"output_tokens": 2}) == (None, 2, None)


def test_usage_counts_cached_prompt_tokens_counted_once_in_each_api() -> None:
    """The same prompt (12 tokens, 8 of them from the cache) as each API reports it: Responses'
    ``input_tokens`` includes the cached ones (vLLM's usage shape, vllm/entrypoints/openai/responses/
    serving.py), Anthropic's excludes them; the prompt is 12 either way."""
    vllm_responses = {
        "input_tokens": 12,
        "input_tokens_details": {
            "cached_tokens": 8,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [12],
            "cached_tokens_per_turn": [8],
        },
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0},
        "total_tokens": 15,
    }
    anthropic = {"input_tokens": 4, "cache_read_input_tokens": 8, "cache_creation_input_tokens": 0, "output_tokens": 3}
    chat = {"prompt_tokens": 12, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 8}}
    assert usage_counts(vllm_responses) == usage_counts(anthropic) == usage_counts(chat) == (12, 3, 8)
