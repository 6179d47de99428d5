"""Incremental SSE parsing and OpenAI stream accumulation, tolerant of every dialect in docs/engine-wire.md.

This is the per-chunk hot path of every measurement: it does one ``bytes.split`` per read, one
``orjson.loads`` per event and a few dict lookups. It never indexes ``choices[0]`` unchecked, treats
``usage: null`` like a missing ``usage`` and keeps reading after the finish reason until ``[DONE]``
or the end of the body (cases 6-8).
"""

from __future__ import annotations

from typing import Any

import orjson

from servelab.wire.errors import error_from_event
from servelab.wire.types import FailureClass, RequestRecord, ToolCall, normalize_finish

_DONE = b"[DONE]"

#: the fields of a chat ``delta`` (or of a non-streamed ``message``) whose non-empty value makes an event
#: token-carrying: answer text, reasoning (``reasoning_content``: vLLM/SGLang/DeepSeek; ``reasoning``:
#: Ollama and newer vLLM) and tool-call fragments (docs/engine-wire.md cases 1, 11-14)
TOKEN_FIELDS = ("content", "reasoning_content", "reasoning", "tool_calls")


def choices_carry_token(choices: Any) -> bool:
    """True when an event's ``choices`` (a list; anything else is False) carry a token by the rule
    :func:`apply_event` stamps ``chunk_ns`` with: a choice's non-empty ``delta`` with a non-empty
    :data:`TOKEN_FIELDS` field, or, without a delta, a non-empty completions ``text`` or ``message`` field.
    For code that relays a stream without accumulating it (the gateway); one definition for both."""
    if not isinstance(choices, list):
        return False
    for ch in choices:
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if delta:
            if isinstance(delta, dict) and any(delta.get(f) for f in TOKEN_FIELDS):
                return True
            continue
        if ch.get("text"):
            return True
        msg = ch.get("message")
        if isinstance(msg, dict) and any(msg.get(f) for f in TOKEN_FIELDS):
            return True
    return False


class StreamParser:
    """Feeds raw body bytes into a :class:`RequestRecord`.

    Usage: ``feed(data, t_ns)`` for every read (``t_ns`` = ``time.monotonic_ns()`` when the read
    returned; every event completed by that read gets that arrival time), then ``close(t_ns)`` at the
    end of the body. After ``close`` the record's ``failure`` is set if the stream carried an error,
    was not valid SSE/JSON, or was cut off (no ``[DONE]`` and no finish reason, case 16).
    """

    __slots__ = ("rec", "_buf", "_data", "_prev_completion_tokens", "_bad_events")

    def __init__(self, rec: RequestRecord) -> None:
        self.rec = rec
        self._buf = b""
        self._data: list[bytes] = []
        self._prev_completion_tokens = 0
        self._bad_events = 0

    def feed(self, data: bytes, t_ns: int) -> None:
        """Consume ``data`` (any split of the body: partial lines are buffered)."""
        rec = self.rec
        if rec.first_byte_ns is None:
            rec.first_byte_ns = t_ns
        buf = self._buf + data if self._buf else data
        lines = buf.split(b"\n")
        self._buf = lines.pop()
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    payload = self._data[0] if len(self._data) == 1 else b"\n".join(self._data)
                    self._data = []
                    self._event(payload, t_ns)
                continue
            if line.startswith(b"data:"):
                d = line[5:]
                if d.startswith(b" "):
                    d = d[1:]
                self._data.append(d)
            # other fields (event:, id:, retry:) and comments (":") carry nothing we use

    def close(self, t_ns: int) -> None:
        """End of body: flush a last event without its blank line, then decide cut-off/protocol."""
        rec = self.rec
        if self._buf:
            line = self._buf.rstrip(b"\r")
            self._buf = b""
            if line.startswith(b"data:"):
                d = line[5:]
                self._data.append(d[1:] if d.startswith(b" ") else d)
        if self._data:
            payload = b"\n".join(self._data)
            self._data = []
            self._event(payload, t_ns)
        rec.end_ns = t_ns
        if rec.failure is not None:
            return
        if rec.events == 0:
            rec.failure = FailureClass.PROTOCOL if rec.first_byte_ns is not None else FailureClass.CUT_OFF
            return
        if not rec.saw_done and rec.finish_reason_raw is None:
            rec.failure = FailureClass.CUT_OFF
            return
        if self._bad_events and rec.first_token_ns is None:
            rec.failure = FailureClass.PROTOCOL

    def _event(self, payload: bytes, t_ns: int) -> None:
        rec = self.rec
        if rec.first_event_ns is None:
            rec.first_event_ns = t_ns
        if payload == _DONE:
            rec.saw_done = True
            rec.done_ns = t_ns
            return
        ev = self._decoded(payload)
        if ev is not None:
            apply_event(rec, ev, t_ns, self)

    def _decoded(self, payload: bytes) -> dict[str, Any] | None:
        """The event object of ``payload``, counted in ``rec.events``; None (counted as a bad event) when it is
        not a JSON object."""
        try:
            ev = orjson.loads(payload)
        except orjson.JSONDecodeError:
            ev = None
        if not isinstance(ev, dict):
            self._bad_events += 1
            return None
        self.rec.events += 1
        return ev


def apply_event(rec: RequestRecord, ev: dict[str, Any], t_ns: int, state: StreamParser | None = None) -> None:
    """Apply one decoded stream event (chat chunk or completions chunk) to ``rec``.

    Errors inside a 200 stream (case 15) set ``failure=stream_error``. Token-carrying events append
    their arrival time to ``rec.chunk_ns``; when the event also carries cumulative ``usage`` (vLLM's
    continuous usage stats), the increase in ``completion_tokens`` is recorded as that chunk's token
    count so inter-token latency can be spread per token.
    """
    if "error" in ev or ev.get("object") == "error":
        err = error_from_event(ev, rec.status)
        if err is not None:
            rec.failure = FailureClass.STREAM_ERROR
            rec.error = err
            return
    if rec.response_model is None:
        m = ev.get("model")
        if m:
            rec.response_model = m
    usage = ev.get("usage")
    choices = ev.get("choices")
    carried = False
    for ch in choices or ():
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        if not delta:
            carried = _apply_whole(rec, ch, t_ns) or carried
        elif isinstance(delta, dict):
            carried = _apply_delta(rec, delta, t_ns) or carried
        # else: a delta that is not an object carries nothing (choices_carry_token agrees)
        fr = ch.get("finish_reason")
        if fr:
            rec.finish_reason_raw = fr
            rec.finish_reason = normalize_finish(fr)
    if carried:
        _count_token_chunk(rec, usage, t_ns, state)
    if usage:
        rec.usage = usage


def _apply_delta(rec: RequestRecord, delta: dict[str, Any], t_ns: int) -> bool:
    """Apply a chat chunk's ``delta`` (content, reasoning, tool-call fragments); True when it carried any."""
    return _apply_parts(rec, delta, t_ns, delta.get("content"))


def _apply_parts(rec: RequestRecord, part: dict[str, Any], t_ns: int, text: Any) -> bool:
    """Append answer ``text``, ``part``'s reasoning and its tool calls to ``rec``; True when any was there."""
    carried = False
    if text:
        rec.content.append(text)
        if rec.first_answer_ns is None:
            rec.first_answer_ns = t_ns
        carried = True
    reasoning = part.get("reasoning_content") or part.get("reasoning")
    if reasoning:
        rec.reasoning.append(reasoning)
        carried = True
    tcs = part.get("tool_calls")
    if tcs:
        _join_tool_calls(rec, tcs)
        carried = True
    return carried


def _apply_whole(rec: RequestRecord, ch: dict[str, Any], t_ns: int) -> bool:
    """Apply a completions chunk's ``text``, or the ``message`` of a non-streamed body parsed through the
    same path; True when it carried anything."""
    carried = _apply_parts(rec, {}, t_ns, ch.get("text"))
    msg = ch.get("message")
    if isinstance(msg, dict):
        carried = _apply_parts(rec, msg, t_ns, msg.get("content")) or carried
    return carried


def _count_token_chunk(rec: RequestRecord, usage: Any, t_ns: int, state: StreamParser | None) -> None:
    """Record a token-carrying event at ``t_ns``: first/last token times, the chunk's arrival, and how
    many tokens it carried when cumulative ``usage`` says so (else 0)."""
    if rec.first_token_ns is None:
        rec.first_token_ns = t_ns
    rec.last_token_ns = t_ns
    rec.chunk_ns.append(t_ns)
    k = 0
    if usage and state is not None:
        ct = usage.get("completion_tokens")
        if isinstance(ct, int):
            # only continuous usage (on every token chunk from the first) says what one chunk carried;
            # a total that first appears on the last chunk (TGI/llama-server /v1/completions, case 24)
            # covers the whole stream, not that chunk
            if state._prev_completion_tokens or len(rec.chunk_ns) == 1:
                k = ct - state._prev_completion_tokens
            state._prev_completion_tokens = ct
    rec.chunk_tokens.append(k if k > 0 else 0)


def _join_tool_calls(rec: RequestRecord, tcs: list[Any]) -> None:
    """Join tool-call fragments per ``index`` (cases 13-14): id/name come on the first fragment only;
    Ollama sends each call whole; TGI always uses index 0."""
    for tc in tcs:
        if not isinstance(tc, dict):
            continue
        idx = tc.get("index")
        if not isinstance(idx, int):
            idx = len(rec.tool_calls)
        acc = rec.tool_calls.get(idx)
        if acc is None:
            acc = rec.tool_calls[idx] = ToolCall(index=idx)
        if tc.get("id"):
            acc.id = tc["id"]
        fn = tc.get("function") or {}
        if fn.get("name"):
            acc.name = fn["name"]
        args = fn.get("arguments")
        if isinstance(args, str):
            acc.arguments += args
        elif isinstance(args, dict):  # Ollama may send arguments as an object
            acc.arguments += orjson.dumps(args).decode()


def finalize_tool_calls(rec: RequestRecord) -> None:
    """Parse each joined tool call's arguments once, at the end; invalid JSON marks the call invalid."""
    for tc in rec.tool_calls.values():
        try:
            orjson.loads(tc.arguments or "{}")
            tc.arguments_valid = True
        except orjson.JSONDecodeError:
            tc.arguments_valid = False
