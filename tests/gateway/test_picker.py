"""Issue 26 item 1: the endpoint picker's policies with exact expected choices (servelab.gateway.picker), and
the mock engine's prefix cache (servelab.engines.mock.cache). In-process, no network: the gateway-level
behaviour is in test_picker_gateway.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from servelab.engines.mock.cache import BLOCK_WORDS, PrefixCache
from servelab.gateway.config import load_config
from servelab.gateway.picker import PickContext, Picker, PickerSettings, PickerState, ScoreWeights, prompt_blocks
from servelab.gateway.routespec import Backend, ModelRoute, TargetSpec
from servelab.gateway.routing import Router
from servelab.wire.errors import ConfigError

NAMES = ["a", "b", "c"]


def _picker(policy: str, gauges: dict[str, dict[str, Any] | None] | None = None, **kw: Any) -> Picker:
    state = PickerState((lambda n: gauges.get(n)) if gauges is not None else None, CollectorRegistry())
    return Picker(PickerSettings(policy, **kw), state)


def _fresh(**over: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
    base: dict[str, dict[str, Any] | None] = {n: {"running": 0, "waiting": 0, "age_s": 0.1} for n in NAMES}
    for n, v in over.items():
        base[n] = {**(base[n] or {}), **v}
    return base


def _order(p: Picker, ctx: PickContext, out: dict[str, int] | None = None) -> tuple[list[str], Any]:
    return p.order(NAMES, dict.fromkeys(NAMES, 1.0), out or {}, dict.fromkeys(NAMES, 0), ctx)


def test_queue_and_kv_scores_pick_the_idle_replica_with_exact_scores() -> None:
    p = _picker(
        "engine",
        _fresh(a={"waiting": 3, "kv_usage": 0.9}, b={"waiting": 0, "kv_usage": 0.5}, c={"waiting": 1, "kv_usage": 0.1}),
        weights=ScoreWeights(prefix=0, session=0),
    )
    order, pick = _order(p, PickContext(tie="t"))
    # b: queue 1, running 1 (no load), kv 0.5 -> (2*1 + 1*1 + 1*0.5)/4 = 0.875
    # c: queue 0.5, running 1/(1+1) = 0.5 (load = waiting 1), kv 0.9 -> (1 + 0.5 + 0.9)/4 = 0.6
    # a: queue 0.25, running 0.25, kv 0.1 -> (0.5 + 0.25 + 0.1)/4 = 0.2125
    assert order == ["b", "c", "a"]
    assert (pick.chosen, pick.how) == ("b", "scored")
    assert pick.scores["b"]["total"] == 0.875 and pick.scores["c"]["total"] == 0.6
    assert pick.scores["a"]["total"] == 0.2125


def test_kv_scorer_is_skipped_unless_every_replica_reports_it() -> None:
    p = _picker("engine", _fresh(a={"kv_usage": 0.0}), weights=ScoreWeights(prefix=0, session=0))
    _, pick = _order(p, PickContext(tie="t"))
    assert all("kv" not in s for s in pick.scores.values())


def test_stale_or_missing_gauges_fall_back_to_least_outstanding_and_are_counted() -> None:
    reg = CollectorRegistry()
    gauges = _fresh(b={"age_s": 9.0})
    p = Picker(PickerSettings("engine", stale_after_s=3.0), PickerState(lambda n: gauges[n], reg))
    order, pick = _order(p, PickContext(tie="t"), {"a": 2, "b": 0, "c": 1})
    assert order == ["b", "c", "a"] and pick.how == "fallback_stale" and "b: gauges 9.0 s old" in pick.detail
    p.commit(pick, "b", PickContext())
    assert (
        reg.get_sample_value("servelab_gateway_picker_decisions_total", {"policy": "engine", "how": "fallback_stale"})
        == 1
    )
    gauges["b"], gauges["c"] = {"running": 0, "age_s": 0.1}, None  # c never scraped
    _, pick = _order(p, PickContext(tie="t"))
    assert pick.how == "fallback_stale" and pick.detail.startswith("c: no gauges (never scraped")
    assert _order(_picker("engine", None), PickContext(tie="t"))[1].how == "fallback_stale"  # health checks off


def test_prefix_follows_the_replica_that_got_the_prompt_and_a_hot_prefix_spills_past_the_load_bound() -> None:
    p = _picker(
        "engine",
        _fresh(),
        weights=ScoreWeights(queue=0, running=0, kv=0, prefix=1, session=0),
        balance_factor=1.25,
        block_chars=8,
    )
    ctx = p.context("system: you are terse\nuser: hello there", None, "t")
    first, pick = _order(p, ctx)
    p.commit(pick, first[0], ctx)
    owner = first[0]
    longer = p.context("system: you are terse\nuser: hello there, and more words", None, "u")
    again, pick2 = _order(p, longer)
    assert again[0] == owner and pick2.scores[owner]["prefix"] == round(len(ctx.blocks) / len(longer.blocks), 4)
    # the owner carries 3 requests, the others none: cap = ceil(1.25 * (3 + 1) / 3) = 2 < 3 + 1 -> spill
    spilled, pick3 = _order(p, longer, {owner: 3})
    assert spilled[0] != owner and pick3.scores[owner]["prefix"] == 0.0 and pick3.detail == "load bound 2"


def test_session_owner_is_the_rendezvous_winner_within_the_bound() -> None:
    p = _picker("engine", _fresh(), weights=ScoreWeights(queue=0, running=0, kv=0, prefix=0, session=1))
    owners = {_order(p, PickContext(session=f"s{i}", tie=str(j)))[0][0] for i in range(1) for j in range(5)}
    assert len(owners) == 1  # one session, one replica, whatever the per-request tie


def test_round_robin_rotates_and_power_of_two_takes_the_lighter_of_two() -> None:
    rr = _picker("round_robin")
    assert [_order(rr, PickContext(tie=str(i)))[0][0] for i in range(6)] == ["a", "b", "c", "a", "b", "c"]
    p2 = _picker("power_of_two", _fresh(a={"running": 5}, b={"running": 1}, c={"running": 3}))
    for i in range(20):
        _, pick = _order(p2, PickContext(tie=str(i)))
        drawn = pick.scores
        assert len(drawn) == 2 and pick.chosen == min(drawn, key=lambda n: drawn[n]["load"])


def test_prompt_blocks_chain_means_equal_hash_only_for_equal_prefixes() -> None:
    a, b = prompt_blocks("x" * 16 + "y" * 16, 16, 8), prompt_blocks("z" * 16 + "y" * 16, 16, 8)
    assert len(a) == 2 and a[1] != b[1] and prompt_blocks("x" * 20, 16, 8) == a[:1]


def _trace(sessions: int, turns: int) -> list[tuple[str, str]]:
    """(session, prompt) of a multi-turn trace: each turn's prompt extends the session's previous one."""
    out = []
    for t in range(turns):
        for s in range(sessions):
            words = " ".join(f"s{s}w{k}" for k in range((t + 1) * 2 * BLOCK_WORDS))
            out.append((f"s{s}", words))
    return out


def _cached_share(policy: str, trace: list[tuple[str, str]]) -> float:
    """Route ``trace`` through a Router with ``policy`` onto 3 mock prefix caches; cached / prompt words."""
    gauges = _fresh()
    state = PickerState(lambda n: gauges[n], CollectorRegistry())
    picker = Picker(PickerSettings(policy, block_chars=32), state)
    router = Router(
        [Backend(n, "vllm", f"http://{n}") for n in NAMES],
        [ModelRoute("m", tuple(TargetSpec(n, "m") for n in NAMES), affinity_chars=0)],
        picker=picker,
    )
    caches = {n: PrefixCache(10_000) for n in NAMES}
    for _, prompt in trace:
        body = {"messages": [{"role": "user", "content": prompt}]}
        plan = router.plan("m", body)
        caches[plan.primary.backend].lookup(prompt.split())
    return sum(c.hits for c in caches.values()) / sum(c.queries for c in caches.values())


def test_cached_share_engine_policy_matches_the_oracle_and_round_robin_matches_chance() -> None:
    sessions, turns = 6, 3
    trace = _trace(sessions, turns)
    # oracle: every turn after the first finds the whole previous prompt cached (2 blocks per turn)
    words = [(t + 1) * 2 * BLOCK_WORDS for t in range(turns)]
    oracle = sessions * sum(words[:-1]) / (sessions * sum(words))
    assert _cached_share("engine", trace) == pytest.approx(oracle, abs=0.05)
    # round robin over 3 replicas with 6 sessions in turn: session s turn t lands on (t * 6 + s) % 3 = s % 3,
    # the same replica every turn; with 7 sessions it moves every turn and never hits
    assert _cached_share("round_robin", trace) == pytest.approx(oracle)
    assert _cached_share("round_robin", _trace(7, turns)) == 0.0


def test_mock_prefix_cache_counts_leading_blocks_and_evicts_lru() -> None:
    c = PrefixCache(3)
    w = [f"w{i}" for i in range(2 * BLOCK_WORDS + 5)]
    assert c.lookup(w) == 0 and len(c) == 2
    assert c.lookup(w) == 2 * BLOCK_WORDS
    assert c.lookup([f"v{i}" for i in range(2 * BLOCK_WORDS)]) == 0  # 4 blocks now > 3: w's first evicted
    assert c.lookup(w) == 0  # its chain starts with the evicted block
    assert (c.queries, c.hits) == (3 * len(w) + 2 * BLOCK_WORDS, 2 * BLOCK_WORDS)
    with pytest.raises(ValueError, match="--prefix-cache-blocks 0 must be >= 1"):
        PrefixCache(0)


def test_bad_policy_is_one_clear_config_error(tmp_path: Path) -> None:
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(
        "backends: [{name: a, kind: vllm, base_url: 'http://x', models: [m]}]\n"
        "models: {m: {targets: [{backend: a, model: m}]}}\nrouting: {picker: {policy: fastest}}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_config(cfg)
    msg = str(e.value)
    assert "\n" not in msg and "routing.picker.policy" in msg and "round_robin" in msg
