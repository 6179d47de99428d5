"""The context check against the mock (each dialect's overflow behaviour) and the real llama-server."""

from __future__ import annotations

import pytest

from servelab.engines.llamacpp import LlamaCppLauncher
from servelab.trial.context_check import check_context

STEP = 16


@pytest.mark.parametrize("dialect", ["llamacpp", "vllm", "sglang", "tgi"])
def test_clear_error_past_the_context(mock_engine, dialect: str) -> None:
    mp = mock_engine("--dialect", dialect, "--context-tokens", "1000")
    got = check_context(mp.base_url, "mock", limit_tokens=4096, step_tokens=STEP)
    # llama-server checks the prompt alone (< n_ctx); the others prompt + max_tokens (1) <= ctx
    assert got.verdict == "clear_error", got
    assert 999 - STEP <= got.accepted_tokens <= 999 < got.first_failing_tokens <= 999 + STEP + 1
    assert got.resolution_tokens is not None and got.resolution_tokens <= STEP
    assert got.message and ("context" in got.message or "1000" in got.message)  # the engine's own refusal
    assert got.offset_tokens == 0 and len(got.probes) <= 2 + 12  # bracket + bisection


def test_silent_truncation_is_flagged(mock_engine) -> None:
    mp = mock_engine("--dialect", "ollama", "--context-tokens", "1000")
    got = check_context(mp.base_url, "mock", limit_tokens=4096, step_tokens=STEP)
    assert got.verdict == "truncates", got
    assert 1000 - STEP <= got.accepted_tokens <= 1000 and "cut without an error" in got.message


def test_no_limit_up_to_the_declared_one(mock_engine) -> None:
    mp = mock_engine("--dialect", "vllm")
    got = check_context(mp.base_url, "mock", limit_tokens=3000, step_tokens=STEP)
    assert got.verdict == "accepts_limit" and got.accepted_tokens == 3000 and len(got.probes) == 2


def test_budget_bounds_the_search(mock_engine) -> None:
    mp = mock_engine("--dialect", "vllm", "--context-tokens", "1000")
    got = check_context(mp.base_url, "mock", limit_tokens=4096, step_tokens=1, budget_s=0.0)
    assert got.verdict == "undetermined" and got.resolution_tokens is None and len(got.probes) == 2


def test_refused_first_probe_is_a_result(mock_engine) -> None:
    mp = mock_engine("--dialect", "vllm", "--context-tokens", "8")
    got = check_context(mp.base_url, "mock", limit_tokens=4096, step_tokens=STEP)
    assert got.accepted_tokens is None and got.verdict == "undetermined" and "context" in (got.message or "")


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="limit_tokens"):
        check_context("http://127.0.0.1:1/v1", "m", limit_tokens=10, start_words=10)


def test_real_llama_server_per_slot_context() -> None:
    """-c 1024 over -np 2 leaves 512 tokens per slot: the check finds it within one step. (A small context
    keeps the probes' prefill short: 22 s here against 39 s for the same check at -c 4096 -np 2.)"""
    with LlamaCppLauncher(parallel=2, ctx_size=1024).start() as eng:
        got = check_context(eng.base_url, "m", limit_tokens=1024, step_tokens=STEP)
    print(got.model_dump_json(exclude={"probes"}), [(p.sent_words, p.status, p.prompt_tokens) for p in got.probes])
    assert got.verdict == "clear_error" and got.offset_tokens == 1  # Gemma's BOS
    assert 512 - STEP - 1 <= got.accepted_tokens < 512 <= got.first_failing_tokens <= 512 + STEP
