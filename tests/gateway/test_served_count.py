"""Break-it report on 4b30bb7, defect 1, through a real gateway in front of the real llama-server:
llama-server's ``usage`` counts ONE choice, so ``n: 4, max_tokens: 16, ignore_eos`` (64 tokens generated)
was charged 16 completion tokens, and a list of prompts the same; limits, budget and ledger settled to
that. Now the gateway charges what was served per choice (servelab.gateway.served)."""

from __future__ import annotations

import time
from typing import Any

import orjson
import pytest
from conftest import gateway_key, launch_llama
from gateway.test_bounds_and_routing import _ledger
from gateway.test_server import events, post


@pytest.fixture(scope="module")
def llama4(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from launch_llama(tmp_path_factory, ctx_size=2048, parallel=4)


def _gw(gateway: Any, llama: Any, **tenant: Any) -> tuple[Any, str]:
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_tokens_limit": 64},
            "backends": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "base_url": llama.base_url,
                    "models": ["gemma"],
                    "read_timeout_s": 120,
                }
            ],
            "models": {"gemma": {"targets": [{"backend": "llama"}]}},
            "tenants": {"t": tenant},
            "keys": [entry],
        }
    )
    return gw, key


def test_n4_and_prompt_lists_are_charged_per_choice(gateway: Any, llama4: Any) -> None:
    gw, key = _gw(gateway, llama4)
    url = gw.url + "/completions"
    body = {"model": "gemma", "prompt": "Once upon a time", "max_tokens": 16, "n": 4, "ignore_eos": True}
    st, _, raw = post(url, body, key)
    assert st == 200, raw
    assert len(orjson.loads(raw)["choices"]) == 4
    st, _, raw = post(url, {**body, "stream": True, "stream_options": {"include_usage": True}}, key)
    assert st == 200 and raw.endswith(b"data: [DONE]\n\n"), raw[-300:]
    assert sum(1 for e in events(raw) if b'"finish_reason":"length"' in e) == 4
    # eight prompts, no max_tokens: the default cap 64 // 8 = 8 tokens each, 64 in all
    st, _, raw = post(url, {"model": "gemma", "prompt": [f"Story {i}:" for i in range(8)], "ignore_eos": True}, key)
    assert st == 200 and len(orjson.loads(raw)["choices"]) == 8, raw
    # chat n=3 (one prompt)
    st, _, raw = post(
        gw.url + "/chat/completions",
        {
            "model": "gemma",
            "n": 3,
            "max_tokens": 8,
            "ignore_eos": True,
            "messages": [{"role": "user", "content": "hi"}],
        },
        key,
    )
    assert st == 200, raw
    rows = _ledger(gw)
    assert [r["completion_tokens"] >= want for r, want in zip(rows, (64, 64, 64, 24), strict=True)] == [True] * 4, rows
    assert all(r["completion_tokens"] <= r["reserved_tokens"] for r in rows), rows
    assert rows[2]["prompt_tokens"] >= 8 * 2, rows[2]  # the estimate over eight prompts, not one prompt (~5)
    recs = [x for x in gw.access_records() if x.get("status") == 200]
    assert [x["charged_tokens"] >= 64 for x in recs[:3]] == [True] * 3, recs


def test_budget_refuses_after_what_n4_served(gateway: Any, llama4: Any) -> None:
    """Before: token_budget 300 served 12 requests / 768 completion tokens before the 429."""
    gw, key = _gw(gateway, llama4, token_budget=300)
    body = {"model": "gemma", "prompt": "Once upon a time", "max_tokens": 16, "n": 4, "ignore_eos": True}
    served = 0
    statuses = []
    for _ in range(8):
        st, _, raw = post(gw.url + "/completions", body, key)
        statuses.append(st)
        if st != 200:
            break
        served += 16 * len(orjson.loads(raw)["choices"])
        time.sleep(0.3)  # the settle lands before the next admit
    assert statuses[-1] == 429, statuses
    assert served <= 300, (served, statuses)  # each reserves ~68 and is charged >= 69: at most 4 fit


# ------------------------------------------------------------------ defect 5: log-probability counts


def test_logprobs_counts_are_capped(gateway: Any, llama4: Any) -> None:
    """Before: /v1/completions max_tokens 8, logprobs 50000 -> 39 MB from llama-server (read as n_probs);
    chat top_logprobs 5000 -> 3.5 MB. Now 400 above server.max_logprobs (5) / max_top_logprobs (20)."""
    gw, key = _gw(gateway, llama4)
    comp = {"model": "gemma", "prompt": "Once upon a time", "max_tokens": 4}
    chat = {"model": "gemma", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    for url, body, param in (
        (gw.url + "/completions", {**comp, "logprobs": 50000}, "logprobs"),
        (gw.url + "/completions", {**comp, "n_probs": 50000}, "n_probs"),
        (gw.url + "/completions", {**comp, "prompt_logprobs": 6}, "prompt_logprobs"),
        (gw.url + "/chat/completions", {**chat, "logprobs": True, "top_logprobs": 5000}, "top_logprobs"),
        (gw.url + "/chat/completions", {**chat, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        (gw.url + "/chat/completions", {**chat, "top_logprobs": -1}, "top_logprobs"),
    ):
        t0 = time.monotonic()
        st, _, raw = post(url, body, key)
        assert st == 400 and orjson.loads(raw)["error"]["param"] == param, (body, raw[:300])
        assert time.monotonic() - t0 < 2 and len(raw) < 1000
    st, _, raw = post(gw.url + "/completions", {**comp, "logprobs": 5}, key)
    assert st == 200 and len(raw) < 100_000, raw[:300]
    st, _, raw = post(gw.url + "/chat/completions", {**chat, "logprobs": True, "top_logprobs": 20}, key)
    assert st == 200 and len(raw) < 100_000, raw[:300]
    # the caps are configurable
    gw2, key2 = _gw_server(gateway, llama4, max_logprobs=0, max_top_logprobs=2)
    st, _, raw = post(gw2.url + "/completions", {**comp, "logprobs": 1}, key2)
    assert st == 400 and "server.max_logprobs" in orjson.loads(raw)["error"]["message"], raw
    st, _, raw = post(gw2.url + "/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2}, key2)
    assert st == 200, raw


def _gw_server(gateway: Any, llama: Any, **server: Any) -> tuple[Any, str]:
    key, entry = gateway_key("k1", "t")
    gw = gateway(
        {
            "server": {"max_tokens_limit": 64, **server},
            "backends": [
                {
                    "name": "llama",
                    "kind": "llamacpp",
                    "base_url": llama.base_url,
                    "models": ["gemma"],
                    "read_timeout_s": 120,
                }
            ],
            "models": {"gemma": {"targets": [{"backend": "llama"}]}},
            "tenants": {"t": {}},
            "keys": [entry],
        }
    )
    return gw, key
