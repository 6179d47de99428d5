"""One test per ENGINE_WIRE.md case (1-24), each with a recorded byte stream as that engine sends it.

Streams are fed through :class:`StreamParser` in several splits (one event per read, byte by byte, one
piece, CRLF line ends) with fake monotonic timestamps: every byte of event ``i`` arrives at
``(i + 1) * 1000`` ns, so an event's arrival time is known exactly whatever the split. Cases about status
codes, header timing and non-SSE bodies go through :func:`send` against a tiny replay server.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web

from servelab.engines.mock import DIALECTS, MockConfig, start_mock
from servelab.wire.client import build_body, finalize, make_session, send
from servelab.wire.errors import RETRYABLE_STATUS, error_from_body, is_context_overflow
from servelab.wire.stream import StreamParser
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, WireError, normalize_finish

pytestmark = pytest.mark.timeout(60)

T = 1000  # ns between fake event arrivals


def ev(obj: Any) -> bytes:
    """One SSE event with a JSON payload."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def chat(
    delta: dict[str, Any] | None,
    finish: str | None = None,
    *,
    cid: str = "chatcmpl-1",
    usage: Any = "omit",
    role_all: bool = False,
    model: str = "m",
) -> bytes:
    """A chat.completion.chunk event; ``usage="omit"`` leaves the key out (vLLM), ``None`` sends null."""
    d = dict(delta or {})
    if role_all:
        d = {"role": "assistant", **d}
    o: dict[str, Any] = {
        "id": cid,
        "object": "chat.completion.chunk",
        "created": 1764460800,
        "model": model,
        "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": finish}],
    }
    if usage != "omit":
        o["usage"] = usage
    return ev(o)


def usage_ev(pt: int, ct: int, cid: str = "chatcmpl-1", extra: dict[str, Any] | None = None) -> bytes:
    u = {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct, **(extra or {})}
    return ev(
        {"id": cid, "object": "chat.completion.chunk", "created": 1764460800, "model": "m", "choices": [], "usage": u}
    )


def _feed(events: list[bytes], mode: str) -> RequestRecord:
    rec = RequestRecord(request_id=1, status=200)
    p = StreamParser(rec)
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
    elif mode == "whole":
        p.feed(b"".join(events), T)
    else:  # pragma: no cover
        raise ValueError(mode)
    p.close((len(events) + 1) * T)
    finalize(rec)
    return rec


def parse(events: list[bytes]) -> RequestRecord:
    """Parse ``events`` in every split; assert the splits agree; return the one-event-per-read record."""
    by = {m: _feed(events, m) for m in ("events", "bytes", "crlf", "whole")}
    base = by["events"]
    for m, r in by.items():
        assert (
            r.content_text,
            r.reasoning_text,
            r.finish_reason_raw,
            r.usage,
            r.failure,
            r.saw_done,
            len(r.chunk_ns),
            r.output_tokens,
            r.output_tokens_source,
        ) == (
            base.content_text,
            base.reasoning_text,
            base.finish_reason_raw,
            base.usage,
            base.failure,
            base.saw_done,
            len(base.chunk_ns),
            base.output_tokens,
            base.output_tokens_source,
        ), m
        if m in ("bytes", "crlf"):  # same arrival time per event whatever the split
            assert (r.chunk_ns, r.first_token_ns, r.first_answer_ns, r.first_event_ns) == (
                base.chunk_ns,
                base.first_token_ns,
                base.first_answer_ns,
                base.first_event_ns,
            ), m
    return base


# ------------------------------------------------------------------------------------------------
# a replay server for status codes, header timing and non-SSE bodies

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def run(coro: Awaitable[Any]) -> Any:
    return asyncio.run(coro)


async def replay(handler: Handler, spec: RequestSpec | None = None, timeout_s: float = 10.0) -> RequestRecord:
    """Serve ``handler`` on a free port and ``send()`` one request to it; return the filled record."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with make_session() as s:
            rec = RequestRecord(request_id=1)
            await send(
                s,
                f"http://127.0.0.1:{port}/v1",
                "m",
                spec or RequestSpec(endpoint="chat", messages=[{"role": "user", "content": "hi"}]),
                rec,
                timeout_s=timeout_s,
            )
            return rec
    finally:
        await runner.cleanup()


def sse(parts: list[tuple[float, bytes]], *, hold_headers: bool = False, head_delay_s: float = 0.0) -> Handler:
    """A handler writing ``parts`` as (delay before, bytes); headers at once or held until the first part."""

    async def h(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        if not hold_headers:
            await resp.prepare(request)
            writer = resp._payload_writer
            writer.send_headers()  # type: ignore[union-attr]
        await asyncio.sleep(head_delay_s)
        for delay, data in parts:
            if delay:
                await asyncio.sleep(delay)
            if not resp.prepared:
                await resp.prepare(request)
            await resp.write(data)
        await resp.write_eof()
        return resp

    return h


def status(code: int, body: bytes, ctype: str = "application/json") -> Handler:
    async def h(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=code, body=body, content_type=ctype)

    return h


# ------------------------------------------------------------------------------------------------
# streaming chat


def test_case01_ttft_at_first_content_not_role_chunk() -> None:
    rec = parse(
        [
            chat({"role": "assistant", "content": ""}),
            chat({"content": "Hello"}),
            chat({"content": " world"}, "stop"),
            DONE,
        ]
    )
    assert rec.first_event_ns == 1 * T  # the role chunk is an event ...
    assert rec.first_token_ns == 2 * T and rec.first_answer_ns == 2 * T  # ... but not a token
    assert rec.chunk_ns == [2 * T, 3 * T] and rec.content_text == "Hello world" and rec.ok

    # over the wire: headers and role chunk at once, first content 60 ms later
    rec = run(
        replay(
            sse([(0, chat({"role": "assistant", "content": ""})), (0.06, chat({"content": "Hi"}, "stop")), (0, DONE)])
        )
    )
    assert rec.ok and rec.first_byte_ns is not None and rec.headers_ns is not None
    assert rec.first_token_ns - rec.first_byte_ns >= 50e6 and rec.first_token_ns - rec.headers_ns >= 50e6


def test_case02_llamacpp_null_role_content_and_missing_role_chunk() -> None:
    rec = parse(
        [
            chat({"role": "assistant", "content": None}, usage=None),
            chat({"content": "A"}, usage=None),
            chat({}, "stop", usage=None),
            DONE,
        ]
    )
    assert rec.ok and rec.content_text == "A" and rec.first_token_ns == 2 * T and rec.chunk_ns == [2 * T]
    # older build: no role chunk at all, the only token also ends generation
    rec = parse([chat({"content": "A"}, "stop", usage=None), DONE])
    assert rec.ok and rec.content_text == "A" and rec.first_token_ns == T and rec.finish_reason == "stop"


def test_case03_tgi_role_on_every_chunk_and_empty_last_chunk() -> None:
    rec = parse(
        [
            chat({"content": "The"}, role_all=True),
            chat({"content": " sky"}, role_all=True),
            chat({"content": ""}, "stop_sequence", role_all=True),
            usage_ev(5, 3, cid=""),
            DONE,
        ]
    )
    assert rec.content_text == "The sky" and rec.ok
    assert rec.chunk_ns == [1 * T, 2 * T] and rec.last_token_ns == 2 * T  # empty last chunk: no token, no gap
    assert rec.finish_reason_raw == "stop_sequence" and rec.finish_reason == "stop"
    assert rec.output_tokens == 3 and rec.output_tokens_source == "usage"


def test_case04_vllm_finishing_chunk_carries_last_text() -> None:
    rec = parse(
        [
            chat({"role": "assistant", "content": ""}),
            chat({"content": "one"}),
            chat({"content": " two"}, "length"),
            usage_ev(4, 2),
            DONE,
        ]
    )
    assert rec.content_text == "one two" and rec.finish_reason == "length" and rec.truncated
    assert rec.chunk_ns == [2 * T, 3 * T] and rec.last_token_ns == 3 * T


def test_case05_finish_on_its_own_empty_delta_chunk() -> None:
    for role in ({"role": "assistant", "content": ""}, {"role": "assistant", "content": None}):
        rec = parse(
            [
                chat(role, usage=None),
                chat({"content": "x"}, usage=None),
                chat({"content": "y"}, usage=None),
                chat({}, "stop", usage=None),
                DONE,
            ]
        )
        assert rec.ok and rec.content_text == "xy" and rec.finish_reason == "stop"
        assert rec.chunk_ns == [2 * T, 3 * T] and rec.last_token_ns == 3 * T


def test_case06_usage_after_finish_is_read() -> None:
    rec = parse([chat({"content": "a"}), chat({}, "stop"), usage_ev(7, 1), DONE])
    assert rec.usage["completion_tokens"] == 1 and rec.prompt_tokens == 7 and rec.saw_done
    assert rec.done_ns == 4 * T
    # finish, then usage, then the connection closes without [DONE]: still a success with usage
    rec = parse([chat({"content": "a"}, "stop"), usage_ev(7, 1)])
    assert rec.ok and not rec.saw_done and rec.output_tokens == 1


def test_case07_usage_chunk_with_empty_choices_and_empty_id() -> None:
    rec = parse([chat({"content": "a"}, "stop"), usage_ev(2, 1, cid=""), DONE])
    assert rec.ok and rec.usage == {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
    # choices: null and a missing choices key are as harmless
    rec = parse(
        [
            chat({"content": "a"}, "stop"),
            ev({"id": "", "choices": None, "usage": {"prompt_tokens": 2, "completion_tokens": 1}}),
            ev({"id": "", "usage": None}),
            DONE,
        ]
    )
    assert rec.ok and rec.output_tokens == 1 and rec.chunk_ns == [T]


def test_case08_usage_missing_or_null_on_ordinary_chunks_is_the_same() -> None:
    omitted = parse([chat({"content": "a"}), chat({"content": "b"}, "stop"), usage_ev(3, 2), DONE])
    null = parse([chat({"content": "a"}, usage=None), chat({"content": "b"}, "stop", usage=None), usage_ev(3, 2), DONE])
    for r in (omitted, null):
        assert r.ok and r.output_tokens == 2 and r.chunk_tokens == [0, 0] and r.chunk_ns == [T, 2 * T]
    assert omitted.usage == null.usage


def test_case09_usage_requested_and_fallback_when_absent() -> None:
    body = build_body("m", RequestSpec(endpoint="chat", messages=[]))
    assert body["stream_options"] == {"include_usage": True} and body["stream"] is True
    rec = parse([chat({"content": "a"}), chat({"content": "b"}), chat({}, "stop"), DONE])
    assert rec.ok and rec.usage is None and rec.output_tokens == 2 and rec.output_tokens_source == "chunks"
    # unasked usage (TGI) is used
    rec = parse(
        [
            chat({"content": "a"}, role_all=True),
            chat({"content": ""}, "eos_token", role_all=True),
            usage_ev(1, 1, cid=""),
            DONE,
        ]
    )
    assert rec.output_tokens_source == "usage" and rec.finish_reason == "stop"


def test_case10_reasoning_fields_and_reasoning_only_truncation() -> None:
    for field in ("reasoning", "reasoning_content"):
        rec = parse(
            [
                chat({"role": "assistant", "content": ""}),
                chat({field: "hmm"}),
                chat({field: " ok"}),
                chat({"content": "Yes"}, "stop"),
                DONE,
            ]
        )
        assert rec.reasoning_text == "hmm ok" and rec.content_text == "Yes"
        assert rec.first_token_ns == 2 * T and rec.first_answer_ns == 4 * T and len(rec.chunk_ns) == 3
    # hits max_tokens while still reasoning: TTFT from reasoning, time to first answer absent (not zero)
    rec = parse(
        [
            chat({"role": "assistant", "content": ""}, usage=None),
            chat({"reasoning_content": "a"}, usage=None),
            chat({"reasoning_content": "b"}, "length", usage=None),
            usage_ev(3, 2),
            DONE,
        ]
    )
    assert rec.ok and rec.truncated and rec.first_token_ns == 2 * T and rec.first_answer_ns is None
    assert rec.content_text == "" and rec.output_tokens == 2


@pytest.mark.parametrize(
    "raw,norm",
    [
        ("stop_sequence", "stop"),
        ("eos_token", "stop"),
        ("abort", "abort"),
        ("repetition", "other"),
        ("something_new", "other"),
        ("length", "length"),
        ("tool_calls", "tool_calls"),
    ],
)
def test_case11_unknown_finish_reasons(raw: str, norm: str) -> None:
    rec = parse([chat({"content": "a"}, raw), DONE])
    assert rec.ok and rec.finish_reason_raw == raw and rec.finish_reason == norm
    assert normalize_finish(raw) == norm and normalize_finish(None) is None


def test_case12_named_tool_choice_finishes_with_stop() -> None:
    rec = parse(
        [
            chat({"role": "assistant", "content": ""}),
            chat(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": ""},
                        }
                    ]
                }
            ),
            chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Paris"}'}}]}),
            chat({}, "stop"),
            DONE,
        ]
    )
    assert rec.finish_reason == "stop" and rec.tool_calls  # detected from the deltas
    tc = rec.tool_calls[0]
    assert tc.name == "get_weather" and tc.arguments_valid and orjson.loads(tc.arguments) == {"city": "Paris"}
    assert rec.first_token_ns == 2 * T  # a tool-call fragment is a token


def test_case13_fragments_joined_per_index_and_invalid_json_reported() -> None:
    rec = parse(
        [
            chat(
                {
                    "tool_calls": [
                        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "f", "arguments": ""}}
                    ]
                }
            ),
            chat({"tool_calls": [{"index": 0, "function": {"arguments": '{"x": '}}]}),
            chat(
                {
                    "tool_calls": [
                        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "g", "arguments": '{"y'}}
                    ]
                }
            ),
            chat({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
            chat({"tool_calls": [{"index": 1, "function": {"arguments": '": tru'}}]}),  # never closed
            chat({}, "tool_calls"),
            DONE,
        ]
    )
    a, b = rec.tool_calls[0], rec.tool_calls[1]
    assert (a.id, a.name, a.arguments, a.arguments_valid) == ("call_a", "f", '{"x": 1}', True)
    assert (b.id, b.name, b.arguments, b.arguments_valid) == ("call_b", "g", '{"y": tru', False)
    assert rec.finish_reason == "tool_calls" and len(rec.chunk_ns) == 5


def test_case14_ollama_whole_calls_and_tgi_index_zero() -> None:
    rec = parse(
        [
            chat(
                {
                    "content": "",
                    "tool_calls": [
                        {
                            "id": "call_x",
                            "index": 0,
                            "type": "function",
                            "function": {"name": "a", "arguments": '{"k":1}'},
                        },
                        {
                            "id": "call_y",
                            "index": 1,
                            "type": "function",
                            "function": {"name": "b", "arguments": {"k": 2}},
                        },
                    ],
                },
                role_all=True,
                usage=None,
            ),
            chat({"content": ""}, "tool_calls", role_all=True, usage=None),
            DONE,
        ]
    )
    assert [(t.name, t.arguments_valid) for t in rec.tool_calls.values()] == [("a", True), ("b", True)]
    assert orjson.loads(rec.tool_calls[1].arguments) == {"k": 2}
    # TGI: one call, always index 0, arguments in fragments
    rec = parse(
        [
            chat(
                {
                    "tool_calls": [
                        {"index": 0, "id": "", "type": "function", "function": {"name": "h", "arguments": '{"q":'}}
                    ]
                },
                role_all=True,
            ),
            chat(
                {
                    "tool_calls": [
                        {"index": 0, "id": "", "type": "function", "function": {"name": None, "arguments": '"z"}'}}
                    ]
                },
                role_all=True,
            ),
            chat({"content": ""}, "eos_token", role_all=True),
            usage_ev(1, 2, cid=""),
            DONE,
        ]
    )
    assert list(rec.tool_calls) == [0] and rec.tool_calls[0].name == "h"
    assert rec.tool_calls[0].arguments == '{"q":"z"}' and rec.tool_calls[0].arguments_valid


# ------------------------------------------------------------------------------------------------
# errors


def test_case15_error_inside_a_200_stream() -> None:
    events = [
        chat({"role": "assistant", "content": ""}),
        chat({"content": "partial"}),
        ev({"error": {"message": "CUDA out of memory", "type": "InternalServerError", "param": None, "code": 500}}),
        DONE,
    ]
    rec = parse(events)
    assert rec.failure is FailureClass.STREAM_ERROR and not rec.ok
    assert rec.error.message == "CUDA out of memory" and rec.error.code == 500 and rec.error.status == 200
    rec = run(replay(sse([(0, e) for e in events])))
    assert rec.status == 200 and rec.failure is FailureClass.STREAM_ERROR
    assert rec.error.message == "CUDA out of memory"
    # TGI's flat string error inside the stream
    rec = parse(
        [
            chat({"content": "x"}, role_all=True),
            ev({"error": "Request failed during generation", "error_type": "generation"}),
            DONE,
        ]
    )
    assert rec.failure is FailureClass.STREAM_ERROR and rec.error.type == "generation"


def test_case16_done_after_error_or_not_and_cut_off() -> None:
    # llama-server: error, then close without [DONE] -> still a stream error, not a cut-off
    rec = parse(
        [
            chat({"content": "a"}, usage=None),
            ev({"error": {"code": 500, "message": "slot unavailable", "type": "server_error"}}),
        ]
    )
    assert rec.failure is FailureClass.STREAM_ERROR and not rec.saw_done and rec.error.message == "slot unavailable"
    # no error event, no [DONE], no finish: cut off
    rec = parse([chat({"role": "assistant", "content": ""}), chat({"content": "a"}), chat({"content": "b"})])
    assert rec.failure is FailureClass.CUT_OFF and rec.content_text == "ab" and rec.output_tokens_source == "chunks"
    # finish seen but no [DONE]: complete
    rec = parse([chat({"content": "a"}, "stop")])
    assert rec.ok
    # over the wire: the server closes the connection mid-body

    async def cut(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat({"content": "a"}))
        request.transport.close()  # type: ignore[union-attr]
        return resp

    rec = run(replay(cut))
    assert rec.failure is FailureClass.CUT_OFF and rec.content_text == "a" and rec.headers_ns is not None


NESTED = b'{"error":{"message":"bad temperature","type":"BadRequestError","param":null,"code":400}}'
NESTED_STR = b'{"error":{"message":"model not found","type":"invalid_request_error","code":"model_not_found"}}'
FLAT = b'{"object":"error","message":"bad temperature","type":"BadRequestError","param":null,"code":400}'
TGI = b'{"error":"Input validation error: `temperature` must be strictly positive","error_type":"validation"}'


def test_case17_three_error_shapes_normalised() -> None:
    a = error_from_body(NESTED, 400)
    assert (a.status, a.message, a.type, a.code) == (400, "bad temperature", "BadRequestError", 400)
    b = error_from_body(NESTED_STR, 404)
    assert (b.message, b.code) == ("model not found", "model_not_found")
    c = error_from_body(FLAT, 400)
    assert (c.message, c.type, c.code) == ("bad temperature", "BadRequestError", 400)
    d = error_from_body(TGI, 422)
    assert d.message.startswith("Input validation error") and d.type == "validation" and d.status == 422
    e = error_from_body(b"<html><body>502 Bad Gateway</body></html>", 502)
    assert "502 Bad Gateway" in e.message
    for body, code in ((NESTED, 400), (FLAT, 400), (TGI, 422)):
        rec = run(replay(status(code, body)))
        assert rec.failure is FailureClass.HTTP_STATUS and rec.status == code and rec.error.status == code
        assert "temperature" in rec.error.message


def test_case18_context_overflow_recognised() -> None:
    llama = (
        b'{"error":{"code":400,"message":"the request exceeds the available context size. try increasing the '
        b'context size or enable context shift","type":"exceed_context_size_error","n_prompt_tokens":1407,'
        b'"n_ctx":256}}'
    )
    vllm = (
        b'{"error":{"message":"This model\'s maximum context length is 4096 tokens. However, you requested '
        b'5000 tokens (4900 in the messages, 100 in the completion).","type":"BadRequestError","param":null,'
        b'"code":400}}'
    )
    tgi = (
        b'{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 4000 '
        b'`inputs` tokens and 200 `max_new_tokens`","error_type":"validation"}'
    )
    sglang = (
        b'{"object":"error","message":"The input (5000 tokens) is longer than the model\'s context length '
        b'(4096 tokens).","type":"BadRequestError","param":null,"code":400}'
    )
    for body, code in ((llama, 400), (vllm, 400), (tgi, 422), (sglang, 400)):
        assert is_context_overflow(error_from_body(body, code)), body
    assert not is_context_overflow(error_from_body(NESTED, 400))
    assert not is_context_overflow(error_from_body(TGI, 422))  # a 422 that is not about tokens
    # llama-server through the client: still recognisable from the record
    rec = run(replay(status(400, llama)))
    assert rec.failure is FailureClass.HTTP_STATUS and is_context_overflow(rec.error)
    # Ollama truncates silently: the returned prompt_tokens is smaller than what was sent
    rec = parse([chat({"content": "a"}, "stop", usage=None), usage_ev(2048, 1), DONE])
    rec.prompt_tokens_target = 3000
    assert rec.ok and rec.prompt_tokens == 2048 < rec.prompt_tokens_target


def test_case19_retryable_statuses_and_connection_refused() -> None:
    assert frozenset({429, 503}) == RETRYABLE_STATUS
    for code, body in (
        (503, b'{"error":{"message":"queue full","type":"ServiceUnavailableError","code":503}}'),
        (429, b'{"error":"Model is overloaded","error_type":"overloaded"}'),
    ):
        rec = run(replay(status(code, body)))
        assert rec.failure is FailureClass.HTTP_STATUS and rec.status in RETRYABLE_STATUS
    rec = run(replay(status(500, NESTED)))
    assert rec.status not in RETRYABLE_STATUS
    # connection refused: a failure before the first byte (retryable), classified as connect
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()

    async def refused() -> RequestRecord:
        async with make_session(connect_timeout_s=2) as sess:
            rec = RequestRecord(request_id=1)
            return await send(sess, f"http://127.0.0.1:{port}/v1", "m", RequestSpec(endpoint="chat", messages=[]), rec)

    rec = run(refused())
    assert rec.failure is FailureClass.CONNECT and rec.status is None and rec.first_byte_ns is None


# ------------------------------------------------------------------------------------------------
# timing and health


def test_case20_headers_held_until_first_token() -> None:
    rec = run(
        replay(
            sse(
                [
                    (0, chat({"role": "assistant", "content": ""}, usage=None) + chat({"content": "Hi"}, usage=None)),
                    (0.02, chat({}, "stop", usage=None) + DONE),
                ],
                hold_headers=True,
                head_delay_s=0.1,
            )
        )
    )
    assert rec.ok and rec.first_token_ns - rec.sent_ns >= 95e6  # TTFT includes the held-header wait
    assert 0 <= rec.first_token_ns - rec.headers_ns < 20e6  # headers came with the first token

    async def with_mock() -> tuple[RequestRecord, dict[str, Any]]:
        srv = await start_mock(MockConfig(dialect="sglang", ttft_ms=60, itl_ms=5, output_tokens=3))
        try:
            async with make_session() as s:
                rec = RequestRecord(request_id=1)
                await send(s, srv.base_url, "m", RequestSpec(endpoint="chat", messages=[]), rec)
                return rec, srv.records[0].to_dict()
        finally:
            await srv.close()

    rec, m = run(with_mock())
    assert rec.ok and m["headers_ns"] <= m["token_write_ns"][0] and m["token_write_ns"][0] - m["headers_ns"] < 2e6
    assert rec.headers_ns >= m["token_write_ns"][0]  # the client saw headers only once the token was written
    assert m["token_write_ns"][0] - m["recv_ns"] >= 59e6


def test_case21_readiness_endpoints() -> None:
    async def go() -> None:
        import aiohttp

        for d in DIALECTS:
            srv = await start_mock(MockConfig(dialect=d))
            try:
                async with aiohttp.ClientSession() as s:
                    async with s.get(srv.base_url[:-3] + "/health") as r:
                        assert r.status == 200, d
                    async with s.get(srv.base_url[:-3] + "/") as r:
                        assert r.status == 200
                        if d == "ollama":
                            assert await r.text() == "Ollama is running"
                    async with s.get(srv.base_url + "/models") as r:
                        assert r.status == 200 and (await r.json())["data"][0]["id"] == "mock"
            finally:
                await srv.close()

    run(go())
    # llama-server while loading: 503 "Loading model" on the completion endpoint
    rec = run(replay(status(503, b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}')))
    assert rec.failure is FailureClass.HTTP_STATUS and rec.error.message == "Loading model"
    assert rec.status in RETRYABLE_STATUS


def test_case22_cached_tokens_missing_is_unknown() -> None:
    rec = parse([chat({"content": "a"}, "stop"), usage_ev(10, 1), DONE])
    assert rec.cached_tokens is None
    rec = parse([chat({"content": "a"}, "stop"), usage_ev(10, 1, extra={"prompt_tokens_details": None}), DONE])
    assert rec.cached_tokens is None
    rec = parse(
        [chat({"content": "a"}, "stop"), usage_ev(10, 1, extra={"prompt_tokens_details": {"cached_tokens": 0}}), DONE]
    )
    assert rec.cached_tokens == 0
    rec = parse(
        [chat({"content": "a"}, "stop"), usage_ev(10, 1, extra={"prompt_tokens_details": {"cached_tokens": 8}}), DONE]
    )
    assert rec.cached_tokens == 8


@pytest.mark.parametrize("dialect", ["sglang", "tgi", "llamacpp"])
def test_case23_any_model_name_is_echoed(dialect: str) -> None:
    async def go() -> RequestRecord:
        srv = await start_mock(MockConfig(dialect=dialect, model="the-real-model", output_tokens=2))
        try:
            async with make_session() as s:
                rec = RequestRecord(request_id=1)
                return await send(s, srv.base_url, "no-such-model", RequestSpec(endpoint="chat", messages=[]), rec)
        finally:
            await srv.close()

    rec = run(go())
    assert rec.ok and rec.response_model == "no-such-model"  # the echo proves nothing about routing


# ------------------------------------------------------------------------------------------------
# legacy /v1/completions


def cmpl(text: str, finish: str | None = None, **extra: Any) -> bytes:
    return ev(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1764460800,
            "model": "m",
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            **extra,
        }
    )


def test_case24_completions_text_finish_and_usage_on_last_chunk() -> None:
    timings = {
        "cache_n": 0,
        "prompt_n": 4,
        "prompt_ms": 12.5,
        "predicted_n": 3,
        "predicted_ms": 30.1,
        "predicted_per_second": 99.7,
    }
    # llama-server: usage + timings on the last text chunk, which also carries the finish
    rec = parse(
        [
            cmpl(" Once", usage=None),
            cmpl(" upon", usage=None),
            cmpl(
                " a", "length", usage={"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}, timings=timings
            ),
            DONE,
        ]
    )
    assert rec.ok and rec.content_text == " Once upon a" and rec.finish_reason == "length"
    assert rec.first_token_ns == T and rec.chunk_ns == [T, 2 * T, 3 * T]
    assert rec.output_tokens == 3 and rec.prompt_tokens == 4 and rec.output_tokens_source == "usage"
    # the total on the last chunk is not that chunk's token count (it carried one of the three)
    assert rec.chunk_tokens == [0, 0, 0]
    # TGI: usage always on the last chunk, no separate usage event
    rec = parse(
        [
            cmpl(" a"),
            cmpl(" b", "eos_token", usage={"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}),
            DONE,
        ]
    )
    assert rec.ok and rec.output_tokens == 2 and rec.finish_reason == "stop" and rec.content_text == " a b"
    # vLLM continuous usage stats: per-chunk counts are real
    rec = parse(
        [
            cmpl(" a", usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}),
            cmpl(" b c", "stop", usage={"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}),
            DONE,
        ]
    )
    assert rec.chunk_tokens == [1, 2]


def test_case24_completions_through_mock_llamacpp_timings() -> None:
    async def go() -> bytes:
        import aiohttp

        srv = await start_mock(MockConfig(dialect="llamacpp", output_tokens=3))
        try:
            async with (
                aiohttp.ClientSession() as s,
                s.post(srv.base_url + "/completions", json={"model": "m", "prompt": "a b", "stream": True}) as r,
            ):
                return await r.read()
        finally:
            await srv.close()

    raw = run(go())
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    assert b'"role"' not in raw and events[-1] == DONE
    last = orjson.loads(events[-2][6:])
    assert last["choices"][0]["finish_reason"] == "stop" and last["choices"][0]["text"] == " tok2"
    assert last["usage"]["completion_tokens"] == 3 and last["timings"]["predicted_n"] == 3
    rec = parse(events)
    assert rec.ok and rec.output_tokens == 3 and rec.prompt_tokens == 2


def test_wire_error_type_is_stable() -> None:
    """The normalised error keeps int and str codes as sent (case 17)."""
    assert WireError(status=400, message="m", code="x").code == "x"
