"""The tools workload and its gate: each tool call checked against the tool it names (mock engine in
the fragmenting and the whole-call dialects, every kind of bad call; the real llama-server)."""

from __future__ import annotations

import asyncio
import json

import pytest

from servelab.bench.analysis.slo import apply_gates
from servelab.bench.workloads.registry import make_workload
from servelab.bench.workloads.tools import TOOLS, tool_call_failures, tool_choice_for, tool_names
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError
from servelab.wire.client import make_session, send
from servelab.wire.types import RequestRecord, RequestSpec, ToolCall

NAMES = tool_names(TOOLS)


@pytest.fixture(scope="module")
def gemma_counter() -> TokenCounter:
    return load_tokenizer(None)


WEATHER = {"location": {"city": "Lyon", "country": "FR"}, "unit": "celsius"}


def _spec(choice: object) -> RequestSpec:
    return RequestSpec(
        endpoint="chat", messages=[{"role": "user", "content": "x"}], extra={"tools": TOOLS, "tool_choice": choice}
    )


def _rec(*calls: tuple[str | None, str]) -> RequestRecord:
    rec = RequestRecord(request_id=0)
    for i, (name, args) in enumerate(calls):
        rec.tool_calls[i] = ToolCall(index=i, name=name, arguments=args)
    return rec


@pytest.mark.parametrize(
    ("choice", "calls", "reasons"),
    [
        ("auto", [], []),  # auto may answer in text
        ("required", [], ["tool_call_missing"]),
        (tool_choice_for(2, 0), [], ["tool_call_missing"]),
        ("auto", [("get_weather", json.dumps(WEATHER))], []),
        ("auto", [("get_weather", '{"location": {"city": "Lyon"')], ["tool_args_invalid_json"]),
        ("auto", [("get_weather", json.dumps({**WEATHER, "unit": "kelvin"}))], ["tool_args_schema_mismatch"]),
        (
            "auto",
            [("get_weather", json.dumps({"location": {"city": "Lyon"}, "unit": "celsius"}))],
            ["tool_args_schema_mismatch"],
        ),  # nested required field missing
        ("auto", [("delete_everything", "{}")], ["tool_call_unknown_name"]),
        (tool_choice_for(2, 1), [("get_weather", json.dumps(WEATHER))], ["tool_call_wrong_name"]),
        (
            "auto",
            [("convert_currency", '{"amount": -1, "source": "EUR", "target": "CNY"}'), ("nope", "{}")],
            ["tool_args_schema_mismatch", "tool_call_unknown_name"],
        ),
    ],
)
def test_gate_reasons(choice: object, calls: list[tuple[str, str]], reasons: list[str]) -> None:
    assert tool_call_failures(_rec(*calls), _spec(choice)) == reasons


def test_no_tools_offered_keeps_the_plain_json_check() -> None:
    spec = RequestSpec(endpoint="chat", messages=[{"role": "user", "content": "x"}])
    rec = _rec(("f", "{not json"))
    rec.tool_calls[0].arguments_valid = False
    assert tool_call_failures(rec, spec) == []
    apply_gates(rec, spec, [])
    assert rec.gate_failures == ["tool_call_invalid"]


def test_workload_offers_every_tool_and_turns_the_choice(gemma_counter: TokenCounter) -> None:
    wl = make_workload("tools", gemma_counter, seed=3)
    specs = wl.requests(9)
    assert [s.extra["tool_choice"] if isinstance(s.extra["tool_choice"], str) else "named" for s in specs] == [
        "auto",
        "required",
        "named",
    ] * 3
    for s in specs:
        assert tool_names(s.extra["tools"]) == NAMES and s.endpoint == "chat"
        assert gemma_counter.count(s.messages[0]["content"]) == s.prompt_tokens_target
        assert 64 <= s.prompt_tokens_target <= 256 and "Use the right tool" in s.messages[0]["content"]
        if isinstance(s.extra["tool_choice"], dict):
            assert s.extra["tool_choice"]["function"]["name"] in NAMES
    assert make_workload("tools", gemma_counter, seed=3).requests(9) == specs  # deterministic
    with pytest.raises(ConfigError, match="--endpoint chat"):
        make_workload("tools", None, endpoint="completions")


def _run(base_url: str, specs: list[RequestSpec]) -> list[RequestRecord]:
    async def go() -> list[RequestRecord]:
        out = []
        async with make_session() as s:
            for i, sp in enumerate(specs):
                rec = RequestRecord(request_id=i)
                await send(s, base_url, "m", sp, rec, timeout_s=120)
                apply_gates(rec, sp, [])
                out.append(rec)
        return out

    return asyncio.run(go())


@pytest.mark.parametrize("dialect", ["vllm", "ollama"])  # argument fragments vs one whole call
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ("none", None),
        ("json", "tool_args_invalid_json"),
        ("schema", "tool_args_schema_mismatch"),
        ("name", "tool_call_unknown_name"),
    ],
)
def test_mock_calls_through_the_gate(mock_engine, dialect: str, bad: str, reason: str | None) -> None:
    mp = mock_engine("--dialect", dialect, "--bad-tool-call", bad)
    specs = make_workload("tools", None, seed=0).requests(6)
    recs = _run(mp.base_url, specs)
    for rec in recs:
        assert rec.ok and rec.tool_calls, (rec.failure, rec.error)
        if reason is None:
            assert rec.gate_failures == [], rec.gate_failures
            json.loads(rec.tool_calls[0].arguments)  # fragments joined into one JSON document
        else:
            assert reason in rec.gate_failures, rec.gate_failures


def test_real_llama_server_base_model_makes_no_tool_calls(gemma_counter: TokenCounter) -> None:
    """The default Gemma 3 270M base GGUF has no chat template; llama-server falls back to ChatML, which has
    no tool format, so no request yields a tool call: the gate must fail every "required" and named one
    and pass the "auto" ones that answered in text (exact prompt lengths in Gemma's tokenizer)."""
    from servelab.engines.llamacpp import LlamaCppLauncher

    specs = make_workload("tools", gemma_counter, seed=5, output_tokens=16).requests(3)  # auto, required, named
    with LlamaCppLauncher(parallel=2, ctx_size=4096).start() as eng:
        recs = _run(eng.base_url, specs)
    for spec, rec in zip(specs, recs, strict=True):
        assert rec.ok and rec.prompt_tokens is not None, (rec.failure, rec.error)
        assert rec.prompt_tokens > spec.prompt_tokens_target  # + BOS + the ChatML turn markers
        assert not rec.tool_calls
        missing = "tool_call_missing" in rec.gate_failures
        assert missing == (spec.extra["tool_choice"] != "auto"), (spec.extra["tool_choice"], rec.gate_failures)
