"""The smoke checks asked for by name (trial/smoke_more.py): tools, reasoning separation and cancellation,
against the mock engine whose behaviour is known (a valid or a broken tool call, reasoning in its field,
a running-requests gauge), and the real llama-server (a base model makes no tool call: ``tools`` fails)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from servelab.engines.llamacpp import LlamaCppLauncher
from servelab.trial.flows.chat.smoke import smoke
from servelab.trial.smoke_more import reasoning_leak

CHECKS = ("tools", "reasoning", "cancellation")


def _run(base_url: str, tmp: Path, checks: tuple[str, ...] = CHECKS) -> dict:
    return asyncio.run(smoke(base_url, None, checks, None, tmp / "smoke.jsonl", 30.0))


def test_valid_tool_call_reasoning_and_cancellation_pass(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "5", "--itl-ms", "20", "--output-tokens", "64", "--reasoning-tokens", "6")
    res = _run(m.base_url, tmp_path)
    assert set(res) == set(CHECKS)
    assert res["tools"].ok, res["tools"]
    assert res["reasoning"].ok and "separated" in res["reasoning"].detail, res["reasoning"]
    assert res["cancellation"].ok and "back to 0" in res["cancellation"].detail, res["cancellation"]
    assert (tmp_path / "smoke.jsonl").read_text().count("\n") >= 4  # every request sent is kept


@pytest.mark.parametrize("bad", ["json", "schema", "name"])
def test_broken_tool_call_fails(bad, mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "8", "--bad-tool-call", bad)
    res = _run(m.base_url, tmp_path, ("tools",))
    assert not res["tools"].ok
    want = {"json": "tool_args_invalid_json", "schema": "tool_args_schema_mismatch", "name": "tool_call_unknown_name"}
    assert want[bad] in res["tools"].detail, res["tools"].detail


def test_no_reasoning_is_informational_and_inline_reasoning_is_caught(mock_engine, tmp_path):
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "8")
    res = _run(m.base_url, tmp_path, ("reasoning",))
    assert res["reasoning"].ok and res["reasoning"].detail.startswith("informational")
    assert reasoning_leak("<think>17*23 = 391</think>391") == "<think>"
    assert reasoning_leak("The answer is 391.") is None


def test_base_model_on_llama_server_fails_tools(tmp_path):
    with LlamaCppLauncher(parallel=1, ctx_size=2048).start() as eng:  # --metrics is on by default
        res = _run(eng.base_url, tmp_path, ("tools", "cancellation"))
    assert not res["tools"].ok  # base Gemma under the ChatML fallback answers in text
    assert res["cancellation"].ok, res["cancellation"]
