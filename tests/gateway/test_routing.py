"""Router: weighted split, least outstanding, prefix affinity (HRW + bounded loads), saturation, breakers,
task routing, fallback chain with degrade parameters, shadow sampling. Pure in-process, no network."""

from __future__ import annotations

import asyncio
import math
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from servelab.gateway.breaker import BreakerBoard, BreakerSettings
from servelab.gateway.errors import GatewayError
from servelab.gateway.hashing import affinity_text, hrw_order, stable_unit
from servelab.gateway.routespec import Backend, FallbackSpec, ModelRoute, ShadowSpec, TargetSpec
from servelab.gateway.routing import Router
from servelab.wire.errors import ConfigError


def replicas(n: int, model: str = "m", **kw) -> list[Backend]:
    return [Backend(f"r{i}", "mock", f"http://127.0.0.1:{9000 + i}", (model,), **kw) for i in range(n)]


def pool_router(n: int, affinity_chars: int = 64, **kw) -> Router:
    bs = replicas(n)
    return Router(
        bs, [ModelRoute("pub", tuple(TargetSpec(b.name, "m") for b in bs))], affinity_chars=affinity_chars, **kw
    )


# ------------------------------------------------------------------ weighted split
@settings(max_examples=examples(15), deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=20), min_size=2, max_size=4))
def test_weighted_split_converges_to_weights(weights: list[int]) -> None:
    bs = [Backend(f"b{i}", "mock", f"http://h:{i}", (f"m{i}",)) for i in range(len(weights))]
    r = Router(
        bs,
        [
            ModelRoute(
                "pub", tuple(TargetSpec(b.name, f"m{i}", w) for i, (b, w) in enumerate(zip(bs, weights, strict=True)))
            )
        ],
    )
    n = 4000
    counts = {b.name: 0 for b in bs}
    for i in range(n):
        counts[r.plan("pub", request_id=f"req-{i}").primary.backend] += 1
    total = sum(weights)
    for b, w in zip(bs, weights, strict=True):
        p = w / total
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(counts[b.name] / n - p) <= 5 * sigma + 0.005, (weights, counts)


def test_weighted_split_is_deterministic_per_request_id_and_across_instances() -> None:
    bs = [
        Backend("stable", "mock", "http://h:1", ("m",)),
        Backend("canary", "mock", "http://h:2", ("m",), pool="canary"),
    ]
    mk = lambda order: Router(order, [ModelRoute("pub", (TargetSpec("stable", "m", 95), TargetSpec("canary", "m", 5)))])  # noqa: E731
    a, b = mk(bs), mk(list(reversed(bs)))
    got = [a.plan("pub", request_id=f"id{i}").primary.backend for i in range(500)]
    assert got == [b.plan("pub", request_id=f"id{i}").primary.backend for i in range(500)]
    assert got == [a.plan("pub", request_id=f"id{i}").primary.backend for i in range(500)]
    assert 0 < got.count("canary") < 60  # ~5 % of 500
    # the canary is still a retry alternative of a stable-first plan
    p = a.plan("pub", request_id=f"id{got.index('stable')}")
    assert [t.backend for t in p.targets] == ["stable", "canary"] and p.targets[1].role == "retry"


# ------------------------------------------------------------------ prefix affinity
_PREFIXES = [f"system: you are agent {i}\nuser: question {i * 7919 % 1000}" for i in range(300)]


def test_affinity_same_prefix_same_replica_across_instances_and_listing_order() -> None:
    a = pool_router(5)
    bs = replicas(5)[::-1]
    b = Router(bs, [ModelRoute("pub", tuple(TargetSpec(x.name, "m") for x in bs))], affinity_chars=64)
    pa = [a.plan("pub", prompt_prefix=p).primary.backend for p in _PREFIXES]
    assert pa == [b.plan("pub", prompt_prefix=p).primary.backend for p in _PREFIXES]
    assert len(set(pa)) == 5  # the keys spread over all replicas
    # request ids do not matter for affinity
    assert pa[:20] == [
        a.plan("pub", prompt_prefix=p, request_id=f"x{i}").primary.backend for i, p in enumerate(_PREFIXES[:20])
    ]


def test_affinity_is_stable_across_processes_with_different_hash_seeds() -> None:
    code = (
        "from servelab.gateway.hashing import hrw_order\n"
        "import sys\n"
        "names=[f'r{i}' for i in range(5)]\n"
        "print(','.join(hrw_order(f'key-{k}', names)[0] for k in range(200)))\n"
    )
    outs = []
    for seed in ("1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        outs.append(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
            ).stdout.strip()
        )
    assert outs[0] == outs[1]
    here = ",".join(hrw_order(f"key-{k}", [f"r{i}" for i in range(5)])[0] for k in range(200))
    assert here == outs[0]


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(min_value=2, max_value=8), st.data())
def test_removing_a_replica_moves_only_its_own_keys(n: int, data: st.DataObject) -> None:
    removed = data.draw(st.integers(min_value=0, max_value=n - 1))
    full = pool_router(n)
    bs = [b for i, b in enumerate(replicas(n)) if i != removed]
    less = Router(bs, [ModelRoute("pub", tuple(TargetSpec(b.name, "m") for b in bs))], affinity_chars=64)
    moved = 0
    for p in _PREFIXES[:120]:
        before = full.plan("pub", prompt_prefix=p).primary.backend
        after = less.plan("pub", prompt_prefix=p).primary.backend
        if before != f"r{removed}":
            assert after == before
        else:
            moved += 1
            assert after != before
    assert moved < 120


def test_affinity_off_for_empty_prefix_or_zero_chars_uses_least_outstanding() -> None:
    r = pool_router(3, affinity_chars=0)
    held = [r.acquire(r.plan("pub", prompt_prefix=_PREFIXES[0]).primary) for _ in range(6)]
    loads = sorted(r.load.snapshot().values())
    assert loads == [2, 2, 2]  # spread evenly, not pinned to one replica
    for lease in held:
        lease.release("success")
    assert r.load.snapshot() == {}
    assert r.plan("pub", prompt_prefix=_PREFIXES[0]).affinity is None


def test_bounded_load_spills_a_hot_prefix_and_keeps_cold_ones_home() -> None:
    r = pool_router(4, balance_factor=1.25)
    hot = _PREFIXES[3]
    home = r.plan("pub", prompt_prefix=hot).primary.backend
    leases = []
    for _ in range(40):
        lease = r.acquire(r.plan("pub", prompt_prefix=hot).primary)
        assert lease is not None
        leases.append(lease)
    loads = r.load.snapshot()
    assert loads[home] == max(loads.values())
    # Mirrokni et al.: no bin above ceil(c * m / n) (checked after each placement with m+1)
    assert max(loads.values()) <= math.ceil(1.25 * 40 / 4)
    assert len(loads) == 4
    for lease in leases:
        lease.release()
    # with no load the hot prefix is home again
    assert r.plan("pub", prompt_prefix=hot).primary.backend == home


# ------------------------------------------------------------------ least outstanding + saturation
def test_least_outstanding_picks_the_idle_replica_relative_to_capacity() -> None:
    bs = [
        Backend("small", "llamacpp", "http://h:1", ("m",), max_in_flight=4),
        Backend("big", "vllm", "http://h:2", ("m",), max_in_flight=16),
    ]
    r = Router(bs, [ModelRoute("pub", (TargetSpec("small", "m"), TargetSpec("big", "m")))])
    leases = [r.acquire(r.plan("pub", request_id=f"i{i}").primary) for i in range(10)]
    loads = r.load.snapshot()
    # relative loads stay balanced: 2/4 vs 8/16
    assert loads == {"small": 2, "big": 8}
    for lease in leases:
        lease.release()


def test_saturated_replicas_are_skipped_then_fallback_with_degrade_params() -> None:
    bs = replicas(2, max_in_flight=1) + [Backend("tiny", "llamacpp", "http://h:7", ("small",))]
    r = Router(
        bs,
        [
            ModelRoute(
                "big",
                (TargetSpec("r0", "m"), TargetSpec("r1", "m")),
                fallback=(FallbackSpec("small", max_tokens=64, params={"temperature": 0}),),
            ),
            ModelRoute("small", (TargetSpec("tiny", "small"),)),
        ],
    )
    body = {"model": "big", "max_tokens": 500, "messages": []}
    p = r.plan("big", body)
    assert [t.role for t in p.targets] == ["primary", "retry", "fallback"]
    fb = p.targets[-1]
    assert fb.public_model == "small" and fb.overrides == {"max_tokens": 64, "temperature": 0}
    assert fb.request_body(body) == {"model": "small", "max_tokens": 64, "temperature": 0, "messages": []}
    a = r.acquire(p.targets[0])
    b = r.acquire(r.plan("big", body).primary)
    assert a and b and {a.target.backend, b.target.backend} == {"r0", "r1"}
    assert r.acquire(p.targets[0]) is None  # at max_in_flight
    p2 = r.plan("big", {"max_tokens": 10})
    assert p2.degraded and [t.backend for t in p2.targets] == ["tiny"]
    assert p2.primary.overrides["max_tokens"] == 10  # a smaller request stays smaller
    assert r.plan("big", {"max_completion_tokens": 900}).primary.overrides == {
        "max_completion_tokens": 64,
        "temperature": 0,
    }
    a.release()
    assert not r.plan("big", body).degraded


def test_all_saturated_without_fallback_is_a_503_busy() -> None:
    r = pool_router(2)
    r2 = Router(replicas(2, max_in_flight=1), [ModelRoute("pub", (TargetSpec("r0", "m"), TargetSpec("r1", "m")))])
    assert r.plan("pub").targets
    l0 = r2.acquire(r2.plan("pub").primary)
    l1 = r2.acquire(r2.plan("pub").primary)
    with pytest.raises(GatewayError) as e:
        r2.plan("pub")
    assert e.value.status == 503 and e.value.code == "model_busy" and e.value.retry_after_s >= 1
    assert "r0" not in e.value.message and "http" not in e.value.message
    l0.release(), l1.release()


# ------------------------------------------------------------------ breakers
@settings(max_examples=examples(60), deadline=None)
@given(
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.text(max_size=30),
    st.sampled_from(["pub", "alias"]),
)
def test_never_routes_to_open_breaker_saturated_or_unknown_backend(
    opened: list[bool], full: list[bool], prefix: str, model: str
) -> None:
    board = BreakerBoard(BreakerSettings(open_s=60))
    bs = replicas(4, max_in_flight=1)
    r = Router(
        bs,
        [
            ModelRoute(
                "pub",
                tuple(TargetSpec(b.name, "m", w) for b, w in zip(bs, (3, 1, 1, 0), strict=True)),
                fallback=(FallbackSpec("alias", max_tokens=8),),
            ),
            ModelRoute("alias", (TargetSpec("r3", "m"), TargetSpec("r2", "m"))),
        ],
        breakers=board,
        affinity_chars=16,
    )
    for b, o, f in zip(bs, opened, full, strict=True):
        if f:
            assert r.acquire(r._target(b.name, "m", "pub", "primary", {})) is not None
        if o:
            board.get(b.name).force_open("health")
    candidates = {"r2", "r3"} if model == "alias" else {"r0", "r1", "r2", "r3"}
    ok = {b.name for b, o, f in zip(bs, opened, full, strict=True) if not o and not f} & candidates
    try:
        p = r.plan(model, {}, prompt_prefix=prefix)
    except GatewayError as e:
        assert not ok and e.status == 503
        return
    names = [t.backend for t in p.targets]
    assert set(names) <= ok and len(names) == len(set(names))
    assert p.primary.role in ("primary", "fallback")


def test_half_open_backend_takes_only_its_probe() -> None:
    t = [0.0]
    board = BreakerBoard(BreakerSettings(open_s=5, half_open_probes=1), clock=lambda: t[0])
    r = Router(replicas(2), [ModelRoute("pub", (TargetSpec("r0", "m"), TargetSpec("r1", "m")))], breakers=board)
    board.get("r0").force_open("health")
    assert {x.backend for x in r.plan("pub").targets} == {"r1"}
    t[0] = 6.0  # half-open
    probe = r.acquire(r._target("r0", "m", "pub", "primary", {}))
    assert probe is not None
    assert {x.backend for x in r.plan("pub").targets} == {"r1"}  # probe slot taken
    probe.release("success")
    assert board.get("r0").state == "closed"
    assert {x.backend for x in r.plan("pub").targets} == {"r0", "r1"}


def test_lease_context_manager_outcomes_feed_the_breaker() -> None:
    board = BreakerBoard(BreakerSettings(consecutive_failures=2))
    r = Router(replicas(1), [ModelRoute("pub", (TargetSpec("r0", "m"),))], breakers=board)
    tgt = r.plan("pub").primary
    with pytest.raises(asyncio.CancelledError), r.acquire(tgt):
        raise asyncio.CancelledError  # client went away: neutral
    assert board.get("r0").state == "closed" and r.load.outstanding("r0") == 0
    for _ in range(2):
        with pytest.raises(ConnectionResetError), r.acquire(tgt) as lease:
            assert r.load.outstanding("r0") == 1
            raise ConnectionResetError
        assert lease.released
    assert board.get("r0").state == "open"
    assert r.acquire(tgt) is None
    with pytest.raises(GatewayError) as e:
        r.plan("pub")
    assert e.value.status == 503 and e.value.retry_after_s >= 1


# ------------------------------------------------------------------ task routing, shadow, errors, helpers
def test_task_tag_picks_the_model_when_none_is_named_and_unknown_tags_are_ignored() -> None:
    bs = [Backend("a", "mock", "http://h:1", ("big",)), Backend("b", "mock", "http://h:2", ("small",))]
    r = Router(
        bs,
        [ModelRoute("chat", (TargetSpec("a", "big"),)), ModelRoute("cheap", (TargetSpec("b", "small"),))],
        tasks={"summarize": "cheap"},
    )
    for named in ("auto", None, ""):
        p = r.plan(named, {}, task_tag="summarize")
        assert p.public_model == "cheap" and p.task == "summarize" and p.primary.upstream_model == "small"
    p = r.plan("chat", {}, task_tag="summarize")  # an explicit model wins (permissions were checked on it)
    assert p.public_model == "chat" and p.task is None
    p = r.plan("chat", {}, task_tag="poetry")
    assert p.public_model == "chat" and p.task is None
    assert r.resolve_model("auto", "summarize") == "cheap" and r.resolve_model("chat", "summarize") == "chat"
    with pytest.raises(GatewayError):
        r.plan("auto", {}, task_tag="poetry")
    with pytest.raises(GatewayError) as e:
        r.plan("nope")
    assert e.value.status == 404 and e.value.code == "model_not_found"


def test_shadow_sampled_at_its_rate_and_stable_per_request_id() -> None:
    bs = [Backend("live", "tgi", "http://h:1", ("m",)), Backend("new", "vllm", "http://h:2", ("m2",))]
    r = Router(bs, [ModelRoute("pub", (TargetSpec("live", "m"),), shadow=ShadowSpec("new", "m2", 0.1))])
    shadows = [r.plan("pub", request_id=f"q{i}").shadow for i in range(3000)]
    hits = [s for s in shadows if s is not None]
    assert 0.08 < len(hits) / 3000 < 0.12
    assert all(s.role == "shadow" and s.backend == "new" and s.upstream_model == "m2" for s in hits)
    assert [r.plan("pub", request_id=f"q{i}").shadow is not None for i in range(200)] == [
        s is not None for s in shadows[:200]
    ]
    r.breakers.get("new").force_open("health")
    assert all(r.plan("pub", request_id=f"q{i}").shadow is None for i in range(200))


@pytest.mark.parametrize(
    "kwargs, msg",
    [
        (dict(backends=replicas(1) * 2), "appears twice"),
        (dict(models=[ModelRoute("pub", (TargetSpec("ghost", "m"),))]), "unknown backend 'ghost'"),
        (dict(models=[ModelRoute("pub", (TargetSpec("r0", "other"),))]), "does not list model 'other'"),
        (dict(models=[ModelRoute("pub", (TargetSpec("r0", "m", 0),))]), "all weights are 0"),
        (dict(models=[ModelRoute("pub", (TargetSpec("r0", "m", -1),))]), "must be >= 0"),
        (
            dict(models=[ModelRoute("pub", (TargetSpec("r0", "m"),), fallback=(FallbackSpec("nope"),))]),
            "unknown model 'nope'",
        ),
        (dict(tasks={"t": "nope"}), "routing.tasks.t"),
        (dict(balance_factor=0.5), "balance_factor"),
    ],
)
def test_bad_tables_raise_config_error_naming_the_entry(kwargs: dict, msg: str) -> None:
    args = dict(backends=replicas(1), models=[ModelRoute("pub", (TargetSpec("r0", "m"),))])
    args.update(kwargs)
    with pytest.raises(ConfigError, match=msg):
        Router(args.pop("backends"), args.pop("models"), **args)


def test_fallback_cycles_terminate() -> None:
    bs = [Backend("a", "mock", "http://h:1"), Backend("b", "mock", "http://h:2")]
    r = Router(
        bs,
        [
            ModelRoute("x", (TargetSpec("a", "m"),), fallback=(FallbackSpec("y", max_tokens=100),)),
            ModelRoute("y", (TargetSpec("b", "m"),), fallback=(FallbackSpec("x", max_tokens=50),)),
        ],
    )
    p = r.plan("x", {"max_tokens": 1000})
    assert [(t.backend, t.role) for t in p.targets] == [("a", "primary"), ("b", "fallback")]


def test_affinity_text_and_stable_unit() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "image_url"}]},
        ]
    }
    assert affinity_text(body, 100) == "system: be brief\nuser: hi\n"
    assert affinity_text(body, 5) == "syste"
    assert affinity_text({"prompt": ["abc", "d"]}, 10) == "abc"
    assert affinity_text({}, 10) == "" and affinity_text(body, 0) == ""
    assert stable_unit("a") == stable_unit("a") != stable_unit("a", "salt")
    assert 0 <= stable_unit("zzz") < 1
