"""One rule for "this event carries a token": the gateway's relay asks :func:`choices_carry_token`, the
measurements stamp ``chunk_ns`` in :func:`apply_event`; for any event the two agree."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from servelab.wire.stream import TOKEN_FIELDS, apply_event, choices_carry_token
from servelab.wire.types import RequestRecord

_text = st.sampled_from([None, "", "hi", " "])
_tool_calls = st.sampled_from(
    [None, [], [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{"}}]]
)


@st.composite
def _part(draw: Any) -> dict[str, Any]:
    """A delta or message: any subset of the token fields and a role, each possibly empty or null."""
    part: dict[str, Any] = {}
    if draw(st.booleans()):
        part["role"] = draw(st.sampled_from([None, "", "assistant"]))
    for f in TOKEN_FIELDS:
        if draw(st.booleans()):
            part[f] = draw(_tool_calls if f == "tool_calls" else _text)
    return part


@st.composite
def _choice(draw: Any) -> Any:
    if draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from([None, "x", 3]))  # not an object: skipped by both
    ch: dict[str, Any] = {"index": 0}
    shape = draw(st.sampled_from(["delta", "text", "message", "none", "bad-delta"]))
    if shape == "delta":
        ch["delta"] = draw(_part())
    elif shape == "text":
        ch["text"] = draw(_text)
    elif shape == "message":
        ch["message"] = draw(_part())
    elif shape == "bad-delta":
        ch["delta"] = draw(st.sampled_from(["x", [1], 7]))
        if draw(st.booleans()):
            ch["text"] = draw(_text)
    if draw(st.booleans()):
        ch["finish_reason"] = draw(st.sampled_from([None, "stop", "length"]))
    return ch


@settings(max_examples=examples(400), deadline=None)
@given(st.one_of(st.none(), st.just("x"), st.lists(_choice(), max_size=3)))
def test_relay_rule_equals_the_measured_rule(choices: Any) -> None:
    ev: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk"}
    if choices is not None:
        ev["choices"] = choices
    rec = RequestRecord(request_id=0)
    apply_event(rec, ev, 123)
    assert choices_carry_token(choices) is (len(rec.chunk_ns) == 1), (choices, rec.chunk_ns)


def test_examples_from_engine_wire() -> None:
    """The plain cases: role-only and empty chunks carry nothing; content, reasoning, tool-call fragments
    and completions text do (ENGINE_WIRE.md cases 1, 3, 10, 13)."""
    assert not choices_carry_token([{"delta": {"role": "assistant", "content": ""}}])
    assert not choices_carry_token([{"delta": {}, "finish_reason": "stop"}])
    assert not choices_carry_token([])
    assert choices_carry_token([{"delta": {"content": "a"}}])
    assert choices_carry_token([{"delta": {"reasoning_content": "think"}}])
    assert choices_carry_token([{"delta": {"reasoning": "think"}}])
    assert choices_carry_token([{"delta": {"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}}])
    assert choices_carry_token([{"text": "a", "index": 0}])
