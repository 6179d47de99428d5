"""Multi-turn sessions: the history the server sees grows exactly as specified (mock), failures end
a session, open-loop session arrivals, datasets, and the prefix cache on a real llama-server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from servelab.bench.workloads.sessions import Session, load_sessions, make_sessions, run_sessions, summarize_sessions
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError
from servelab.wire.client import make_session


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_tokenizer(None)


def _run(base_url: str, sessions: list[Session], **kw: object) -> list:
    async def go() -> list:
        async with make_session() as s:
            return await run_sessions(s, base_url, "m", sessions, **kw)

    return asyncio.run(go())


def test_built_in_sessions_have_exact_lengths(counter: TokenCounter) -> None:
    ss = make_sessions(3, counter, turns=4, first_tokens=100, turn_tokens=20, seed=2)
    assert [len(s.user_messages) for s in ss] == [4, 4, 4]
    assert all(counter.count(s.user_messages[0]) == 100 for s in ss)
    assert all(counter.count(m) == 20 for s in ss for m in s.user_messages[1:])
    assert make_sessions(3, counter, turns=4, first_tokens=100, turn_tokens=20, seed=2) == ss
    with pytest.raises(ConfigError, match="turns"):
        make_sessions(1, None, turns=0)


def test_history_grows_as_specified(mock_engine) -> None:
    """The mock counts the words of every message it is sent: turn k must carry the system prompt, all
    earlier user messages, the model's earlier answers (one word per mock token) and the new message."""
    mp = mock_engine("--output-tokens", "7")
    ss = make_sessions(4, None, turns=5, first_tokens=60, turn_tokens=12, max_tokens=7)
    results = _run(mp.base_url, ss, concurrency=2)
    assert len(results) == 20 and all(r.ok for r in results)
    for r in results:
        s = ss[r.session_id]
        words = len((s.system or "").split()) + sum(len(m.split()) for m in s.user_messages[: r.turn + 1])
        assert r.prompt_tokens == words + 7 * r.turn, (r.session_id, r.turn)
        assert r.messages_sent == 1 + 2 * r.turn + 1
    summ = summarize_sessions(ss, results)
    assert summ.session_success == 1.0 and [t.n for t in summ.turns] == [4] * 5
    means = [t.prompt_tokens_mean for t in summ.turns]
    assert means == sorted(means) and summ.turns[0].cached_share is None  # the mock states no cache


def test_a_failed_turn_ends_its_session(mock_engine) -> None:
    mp = mock_engine("--fail-http-rate", "1")
    ss = make_sessions(3, None, turns=4)
    results = _run(mp.base_url, ss, concurrency=3)
    assert len(results) == 3 and not any(r.ok for r in results) and {r.turn for r in results} == {0}
    assert summarize_sessions(ss, results).session_success == 0.0


def test_open_loop_sessions_with_think_time(mock_engine) -> None:
    mp = mock_engine()
    ss = make_sessions(6, None, turns=3, first_tokens=20, turn_tokens=5, max_tokens=4)
    results = _run(mp.base_url, ss, rate_sps=50.0, think_time_s=0.01, seed=1)
    assert len(results) == 18 and all(r.ok for r in results)
    assert all((r.think_s > 0) == (r.turn > 0) for r in results)
    with pytest.raises(ConfigError, match="think time"):
        _run(mp.base_url, ss, think_time_s=-1)


def test_datasets(tmp_path: Path) -> None:
    share = tmp_path / "sg.json"
    share.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "hi"},
                        {"from": "gpt", "value": "hello"},
                        {"from": "human", "value": "how are you"},
                    ]
                },
                {"conversations": [{"from": "human", "value": "only one turn"}]},
            ]
        )
    )
    ss = load_sessions(share)
    assert len(ss) == 1 and ss[0].user_messages == ["hi", "how are you"]
    oa = tmp_path / "oa.jsonl"
    oa.write_text(
        json.dumps(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": "b"},
                    {"role": "user", "content": "c"},
                ]
            }
        )
        + "\n"
    )
    s = load_sessions(oa)[0]
    assert s.system == "be brief" and s.user_messages == ["a", "c"]
    with pytest.raises(ConfigError, match="no conversation with at least 3"):
        load_sessions(share, min_turns=3)
    with pytest.raises(ConfigError, match="no such file"):
        load_sessions(tmp_path / "missing.json")


def test_real_llama_server_serves_history_from_its_cache(counter: TokenCounter) -> None:
    """Resent history is prefix-cached: from turn 1 on most of each prompt comes from llama-server's
    cache (Gemma 3 needs --swa-full for that, see test_traces)."""
    from servelab.engines.llamacpp import LlamaCppLauncher

    ss = make_sessions(2, counter, turns=3, first_tokens=120, turn_tokens=16, max_tokens=8)
    with LlamaCppLauncher(parallel=1, ctx_size=4096, extra_args=["--swa-full"]).start() as eng:
        results = _run(eng.base_url, ss, concurrency=1)
    summ = summarize_sessions(ss, results)
    print("\n", [(t.turn, t.prompt_tokens_mean, t.cached_share) for t in summ.turns])
    assert summ.session_success == 1.0
    assert summ.turns[0].prompt_tokens_mean < summ.turns[1].prompt_tokens_mean < summ.turns[2].prompt_tokens_mean
    assert summ.turns[1].cached_share > 0.6 and summ.turns[2].cached_share > 0.6
