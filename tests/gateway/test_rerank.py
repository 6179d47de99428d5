"""Rerank (``POST /v1/rerank`` and ``/rerank``) through the real gateway against servelab's mock engine (its
deterministic word-overlap score), and the registry's declarations of embedding and rerank models
(``rerank``, ``embedding_dimensions``, ``max_input_tokens``) enforced before any engine sees a request.

The unit tests check the config rules, the prompt estimate and the mock's score in-process; the proc tests
start one gateway and one mock per module.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import (
    gateway_key,
    gateway_view,
    ledger_usage,
    start_gateway,
    start_mock_process,
    stop_gateway,
    stop_mock_process,
)

from servelab.engines.mock.rerank import rerank_answer, score
from servelab.gateway.capabilities import estimate_prompt_tokens
from servelab.gateway.config import parse_config

DOCS = ["the cat sat on the mat", "dogs chase cats", "a cat and a dog", "stock prices fell"]


def _cfg(caps: dict[str, Any]) -> dict[str, Any]:
    return {
        "backends": [{"name": "b", "kind": "mock", "base_url": "http://127.0.0.1:9", "models": ["m"]}],
        "models": {"r": {"targets": [{"backend": "b"}], "capabilities": caps}},
    }


@pytest.mark.parametrize(
    ("caps", "words"),
    [
        ({"rerank": True, "embeddings": True}, "not both"),
        ({"rerank": True, "tools": True}, "a rerank model cannot declare tools"),
        ({"rerank": True, "embedding_dimensions": 8}, "only an embedding model"),
        ({"max_input_tokens": 8}, "only an embedding or rerank model has one"),  # a chat model never checked it
        ({"rerank": True, "max_input_tokens": 1000, "context_tokens": 512}, "1000 is above context_tokens 512"),
    ],
)
def test_config_refuses_contradictory_declarations(caps: dict[str, Any], words: str) -> None:
    with pytest.raises(Exception, match=words):
        parse_config(_cfg(caps))


@pytest.mark.parametrize(
    ("primary", "fallback", "words"),
    [
        ({"rerank": True}, {}, "'c' is a chat model and 'p' a rerank model"),
        ({}, {"rerank": True}, "'c' is a rerank model and 'p' a chat model"),
        ({"embeddings": True}, {"rerank": True}, "'c' is a rerank model and 'p' an embedding model"),
    ],
)
def test_config_refuses_a_fallback_to_another_kind_of_model(
    primary: dict[str, Any], fallback: dict[str, Any], words: str
) -> None:
    """Admission checks the first model's kind only: a fallback of another kind would get a rerank body as a
    chat model (or a chat body as a reranker), so the config refuses it, naming the step."""
    b = [{"name": "b", "kind": "mock", "base_url": "http://127.0.0.1:9", "models": ["m"]}]
    cfg = {
        "backends": b,
        "models": {
            "p": {"targets": [{"backend": "b"}], "capabilities": primary, "fallback": [{"model": "c"}]},
            "c": {"targets": [{"backend": "b"}], "capabilities": fallback},
        },
    }
    with pytest.raises(Exception, match=f"models.p.fallback\\[0\\].model: {words}"):
        parse_config(cfg)
    cfg["models"]["c"]["capabilities"] = primary  # the same kind is fine
    parse_config(cfg)


@pytest.mark.parametrize(
    ("models", "words"),
    [
        (None, "applies to every model (models: null), including 'r', a rerank model"),
        (["r"], "lists 'r', a rerank model"),
    ],
)
def test_config_refuses_a_degrade_route_to_another_kind(models: list[str] | None, words: str) -> None:
    """A degrade rule routing rerank requests to a chat model made them 400s naming a model the client never
    asked for; the config refuses it. A rule over chat models only is fine."""
    cfg = _cfg({"rerank": True})
    cfg["models"]["cheap"] = {"targets": [{"backend": "b"}]}
    cfg["models"]["big"] = {"targets": [{"backend": "b"}]}
    rule = {"name": "r1", "priorities": ["low"], "when": {"in_flight": 1}, "route_to": "cheap", "models": models}
    cfg["degrade"] = {"rules": [rule]}
    with pytest.raises(Exception, match=f"'cheap' is a chat model but the rule {re.escape(words)}"):
        parse_config(cfg)
    rule["models"] = ["big"]
    parse_config(cfg)


def test_rerank_estimate_counts_the_query_once_per_document() -> None:
    body = {"query": "x" * 12, "documents": ["y" * 6, {"text": "z" * 18}]}
    # 12 bytes -> 2 tokens per pairing, 6 -> 1, 18 -> 3 (6 bytes per token, capabilities module doc)
    assert estimate_prompt_tokens("rerank", body) == 2 * 2 + 1 + 3


def test_mock_score_is_the_query_word_share_and_sorted() -> None:
    assert score("cat mat", "the cat sat on the mat") == 1.0
    assert score("cat dog", "a cat") == 0.5
    status, ans = rerank_answer({"query": "cat mat", "documents": DOCS, "top_n": 2}, "m")
    assert status == 200
    # "cat mat": doc 0 has both words (1.0), doc 2 "cat" only (0.5), docs 1 and 3 neither
    assert [(x["index"], x["relevance_score"]) for x in ans["results"]] == [(0, 1.0), (2, 0.5)]
    words = sum(2 + len(d.split()) for d in DOCS)
    assert ans["usage"] == {"prompt_tokens": words, "total_tokens": words}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway with ``rr`` (a rerank model, inputs up to 20 tokens), ``emb`` (an embedding model of 64
    dimensions, same backend: only admission is exercised), ``chat`` (a chat model) and key ``key``; ``tight``
    may send 30 tokens a minute; ``bench`` is the bench test's own."""
    tmp = tmp_path_factory.mktemp("rerank")
    mock = start_mock_process("--dialect", "vllm", "--output-tokens", "4")
    key, entry = gateway_key("k1", "t")
    tight, tight_entry = gateway_key("k2", "t")
    bench, bench_entry = gateway_key("k3", "t")
    cfg = {
        "backends": [{"name": "b", "kind": "mock", "base_url": mock.root, "models": ["m"]}],
        "models": {
            "rr": {"targets": [{"backend": "b"}], "capabilities": {"rerank": True, "max_input_tokens": 20}},
            "emb": {"targets": [{"backend": "b"}], "capabilities": {"embeddings": True, "embedding_dimensions": 64}},
            "chat": {"targets": [{"backend": "b"}]},
        },
        "retry": {"attempts": 0},
        "tenants": {"t": {}},
        "keys": [entry, {**tight_entry, "tpm": 30}, bench_entry],
    }
    proc = start_gateway(cfg, tmp / "gw")
    try:
        yield gateway_view(proc, key, tight=tight, bench=bench)
    finally:
        stop_gateway(proc.proc)
        stop_mock_process(mock.proc)


def _post(gw: Any, path: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    return httpx.post(gw.root + path, json=body, headers={"Authorization": f"Bearer {key or gw.key}"}, timeout=10)


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_rerank_results_usage_and_ledger(gw: Any, path: str) -> None:
    resp = _post(gw, path, {"model": "rr", "query": "cat mat", "documents": DOCS, "top_n": 2})
    assert resp.status_code == 200, resp.text
    ans = resp.json()
    assert ans["model"] == "rr"  # the public name, never the engine's
    assert [(x["index"], x["relevance_score"]) for x in ans["results"]] == [(0, 1.0), (2, 0.5)]
    words = sum(2 + len(d.split()) for d in DOCS)  # the mock counts words as tokens
    assert ans["usage"]["prompt_tokens"] == words
    assert ledger_usage(gw.db, resp.headers["X-Request-ID"]) == (words, 0)


@pytest.mark.parametrize(
    ("model", "body", "param", "code"),
    [
        ("rr", {"documents": DOCS}, "query", "invalid_type"),
        ("rr", {"query": "q", "documents": []}, "documents", "invalid_type"),
        ("rr", {"query": "q", "documents": ["ok", 3]}, "documents[1]", "invalid_type"),
        ("rr", {"query": "q", "documents": DOCS, "top_n": -1}, "top_n", "invalid_value"),
        ("rr", {"query": "q", "documents": DOCS, "stream": True}, "stream", "invalid_value"),
        ("rr", {"query": "q", "documents": ["ok", "word " * 40]}, "documents[1]", "input_too_long"),
        ("chat", {"query": "q", "documents": DOCS}, "model", "model_not_supported"),
    ],
)
def test_rerank_bad_input_is_one_clear_400(gw: Any, model: str, body: dict[str, Any], param: str, code: str) -> None:
    resp = _post(gw, "/v1/rerank", {"model": model, **body})
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert (err["param"], err["code"]) == (param, code)
    assert "\n" not in err["message"] and "Traceback" not in err["message"]


def test_rerank_model_on_chat_and_embedding_declarations(gw: Any) -> None:
    resp = _post(gw, "/v1/chat/completions", {"model": "rr", "messages": [{"role": "user", "content": "hi"}]})
    assert resp.status_code == 400
    assert "/v1/rerank" in resp.json()["error"]["message"]
    resp = _post(gw, "/v1/embeddings", {"model": "emb", "input": "hello", "dimensions": 128})
    assert resp.status_code == 400
    assert resp.json()["error"]["param"] == "dimensions"
    assert "1 ... 64" in resp.json()["error"]["message"]


def test_rerank_wrong_key_and_token_limit(gw: Any) -> None:
    resp = _post(gw, "/v1/rerank", {"model": "rr", "query": "q", "documents": DOCS}, key="sk-sl-nobody-" + "0" * 64)
    assert resp.status_code == 401
    # tpm 30 counts input tokens: the first request is admitted on its estimate (under 30) and charged the
    # engine's usage (the mock's word count, 25 tokens); the second's estimate does not fit what is left
    body = {"model": "rr", "query": "cat mat", "documents": DOCS}
    first = _post(gw, "/v1/rerank", body, key=gw.tight)
    assert first.status_code == 200, first.text
    ledger_usage(gw.db, first.headers["X-Request-ID"])
    second = _post(gw, "/v1/rerank", body, key=gw.tight)
    assert second.status_code == 429, second.text
    assert "Retry-After" in second.headers
    # rerank has no max_tokens: the advice names its inputs (it said "a lower max_tokens reserves fewer tokens")
    msg = second.json()["error"]["message"]
    assert "max_tokens" not in msg and "fewer or shorter inputs" in msg, msg


def test_bench_endpoint_rerank_through_the_gateway(gw: Any, tmp_path: Path) -> None:
    """``servelab bench --endpoint rerank`` against the gateway's route: every request answered, the step's
    rerank figures (documents scored, per second, the server's tokens), each request's prompt tokens equal
    to its ledger row; --batch-size is documents per query."""
    import json
    import sqlite3
    import subprocess
    import sys
    import time

    n, docs = 6, 3
    out = tmp_path / "run"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "bench",
            "--url",
            gw.url,
            "--model",
            "rr",
            "--api-key",
            gw.bench,
            "--endpoint",
            "rerank",
            "--batch-size",
            str(docs),
            "--set",
            "input_tokens=4",
            "--concurrency",
            "2",
            "--requests",
            str(n),
            "--warmup",
            "0",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    (step,) = json.loads((out / "summary.json").read_text())["steps"]
    assert step["workload"] == "rerank" and step["counts"]["succeeded"] == n
    rr = step["rerank"]
    assert (rr["requests"], rr["inputs"], rr["batch_size"], rr["failed_requests"]) == (n, n * docs, docs, 0)
    assert rr["inputs_per_s"] > 0 and rr["tokens_per_s"] > 0 and rr["dimensions"] is None
    lines = [json.loads(x) for x in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == n
    deadline = time.monotonic() + 5  # rows are settled in the background
    while True:
        with sqlite3.connect(gw.db) as con:
            rows = con.execute("SELECT prompt_tokens FROM servelab_usage WHERE key_id = 'k3'").fetchall()
        if len(rows) >= n or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert all(isinstance(x["prompt_tokens"], int) and x["prompt_tokens"] > 0 for x in lines)
    assert len(rows) == n and sum(x["prompt_tokens"] for x in lines) == sum(int(r[0]) for r in rows)


def test_bench_step_where_every_request_failed_exits_1_with_one_line(gw: Any, tmp_path: Path) -> None:
    """``servelab bench --endpoint rerank --model chat`` (every request refused 400: chat is no rerank model)
    exited 0 after a table of 0/4, as did chat when every request failed; now one line and exit 1."""
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "servelab.cli",
            "bench",
            "--url",
            gw.url,
            "--model",
            "chat",
            "--api-key",
            gw.key,
            "--endpoint",
            "rerank",
            "--concurrency",
            "1",
            "--requests",
            "4",
            "--warmup",
            "0",
            "--quiet",
            "--out",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    errs = [x for x in r.stderr.splitlines() if x.startswith("servelab: error:")]
    assert len(errs) == 1 and "every request of step rerank/c1 failed (http_status: 4)" in errs[0], r.stderr
    assert "Traceback" not in r.stderr
