"""Shadow traffic judged on answers (issue 14 item 4): both answers' TTFT, E2E, tokens and text are
recorded per mirrored request, and ``GET /admin/shadow`` / ``servelab gateway shadow-report`` compare old
(primary) vs new (shadow) per model. Through the real gateway process, with the product's mock engine
(two dialects, two known timings) and the real llama-server."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

import orjson
import pytest
from conftest import ADMIN_TOKEN, gateway_key, launch_llama
from gateway.test_server import chat, events, post

from servelab.gateway.shadow import ShadowBook, ShadowSample, ShadowSide, sample_of, text_similarity


def _config(
    primary: Any, shadow: Any, entry: dict[str, Any], primary_kind: str = "mock", rate: float = 1.0
) -> dict[str, Any]:
    return {
        "backends": [
            {"name": "old", "kind": primary_kind, "base_url": primary, "models": ["m-old"], "read_timeout_s": 120},
            {"name": "new", "kind": "mock", "base_url": shadow, "models": ["m-new"]},
        ],
        "models": {
            "m": {
                "targets": [{"backend": "old", "model": "m-old"}],
                "shadow": {"target": {"backend": "new", "model": "m-new"}, "sample_rate": rate},
            }
        },
        "tenants": {"t": {}},
        "keys": [entry],
    }


def _report(gw: Any, want: int, **query: Any) -> dict[str, Any]:
    """The admin report once ``want`` samples of model m are in (shadows are recorded after both end)."""
    q = "&".join(f"{k}={v}" for k, v in query.items())
    deadline = time.monotonic() + 30
    while True:
        st, _, raw = post(gw.admin_url + "/admin/shadow?" + q, None, ADMIN_TOKEN)
        assert st == 200, raw
        rep = orjson.loads(raw)
        got = next((m for m in rep["models"] if m["model"] == "m"), None)
        if got is not None and got["samples"] >= want or time.monotonic() > deadline:
            assert got is not None and got["samples"] == want, rep
            return got


def _cli(gw: Any, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "servelab.cli", "gateway", "shadow-report", "--admin-url", gw.admin_url, *args],
        env=dict(os.environ, SERVELAB_ADMIN_TOKEN=ADMIN_TOKEN),
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_text_similarity_is_the_word_ratio() -> None:
    a = "".join(f" tok{i}" for i in range(8))
    b = "".join(f" tok{i}" for i in range(12))
    assert text_similarity(a, b) == pytest.approx(2 * 8 / 20)
    assert text_similarity(a, a) == 1.0 and text_similarity("", "") == 1.0
    assert text_similarity("x y", "") == 0.0


def test_report_deltas_are_shadow_minus_primary_over_complete_pairs() -> None:
    def side(ttft: float, e2e: float, tokens: int, complete: bool = True) -> ShadowSide:
        return ShadowSide(
            backend="b",
            upstream_model="u",
            status=200 if complete else 503,
            complete=complete,
            ttft_ms=ttft,
            e2e_ms=e2e,
            completion_tokens=tokens,
        )

    book = ShadowBook(window=3)
    for i in range(4):  # the window keeps the last 3: i = 1, 2, 3
        book.add(
            sample_of(
                side(10.0 * i, 100.0, 5),
                "a b c d",
                side(10.0 * i + 7, 130.0, 9),
                "a b c x",
                ts=0.0,
                request_id=str(i),
                model="m",
                endpoint="chat",
                stream=True,
            )
        )
    book.add(
        sample_of(
            side(1.0, 1.0, 1),
            "",
            side(0.0, 1.0, 0, complete=False),
            "",
            ts=0.0,
            request_id="e",
            model="n",
            endpoint="chat",
            stream=True,
        )
    )
    rep = book.report(agree=0.75)
    m, n = rep.models
    assert m.samples == 3 and m.compared == 3 and m.primary.ttft_ms is not None
    assert m.primary.ttft_ms.p50_ms == 20.0 and m.shadow.ttft_ms is not None and m.shadow.ttft_ms.p50_ms == 27.0
    assert m.ttft_p50_delta_ms == 7.0 and m.e2e_p50_delta_ms == 30.0 and m.completion_tokens_delta_mean == 4.0
    assert m.text_similarity_mean == 0.75 and m.text_agreement_rate == 1.0 and m.text_exact_rate == 0.0
    assert book.report(agree=0.8).models[0].text_agreement_rate == 0.0
    assert n.samples == 1 and n.compared == 0 and n.shadow.errors == 1 and n.ttft_p50_delta_ms is None
    with pytest.raises(ValueError, match="agree"):
        book.report(agree=1.5)
    assert isinstance(book.samples("m")[0], ShadowSample)


def test_mock_shadow_report_orders_known_timings(gateway: Any, mock_engine: Any) -> None:
    """Old = vLLM dialect, fast, 8 tokens; new = SGLang dialect, slower, 12 tokens. The report must say
    the new one is slower by the configured TTFT/E2E gap, writes 4 more tokens and agrees 8/20 words."""
    p_ttft, p_itl, p_tok = 20.0, 4.0, 8
    s_ttft, s_itl, s_tok = 140.0, 8.0, 12
    old = mock_engine(
        "--dialect", "vllm", "--ttft-ms", str(p_ttft), "--itl-ms", str(p_itl), "--output-tokens", str(p_tok)
    )
    new = mock_engine(
        "--dialect", "sglang", "--ttft-ms", str(s_ttft), "--itl-ms", str(s_itl), "--output-tokens", str(s_tok)
    )
    key, entry = gateway_key("k1", "t")
    gw = gateway(_config(old.root, new.root, entry))
    streamed, whole = 10, 4
    for i in range(streamed + whole):
        st, _, raw = post(gw.url + "/chat/completions", chat("m", stream=i < streamed), key)
        assert st == 200, raw
        if i == 0:  # the client gets the primary's answer only
            text = "".join(
                (orjson.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                for e in events(raw)
                if e != b"[DONE]"
            )
            assert text == "".join(f" tok{k}" for k in range(p_tok))
    m = _report(gw, streamed + whole, agree=0.9)
    assert m["compared"] == streamed + whole
    assert m["primary"]["targets"] == ["old/m-old"] and m["shadow"]["targets"] == ["new/m-new"]
    assert m["primary"]["errors"] == 0 and m["shadow"]["errors"] == 0
    assert m["completion_tokens_delta_mean"] == s_tok - p_tok
    assert m["primary"]["completion_tokens_mean"] == p_tok
    assert m["text_similarity_mean"] == pytest.approx(2 * p_tok / (p_tok + s_tok))
    assert m["text_agreement_rate"] == 0.0 and m["text_exact_rate"] == 0.0
    # latency: the shadow is slower by the configured gap (tolerance: half of it, for a busy box)
    ttft_gap = s_ttft - p_ttft
    e2e_gap = (s_ttft + (s_tok - 1) * s_itl) - (p_ttft + (p_tok - 1) * p_itl)
    assert m["primary"]["ttft_ms"]["n"] == streamed + whole
    assert m["shadow"]["ttft_ms"]["p50_ms"] > m["primary"]["ttft_ms"]["p50_ms"]
    assert abs(m["ttft_p50_delta_ms"] - ttft_gap) < ttft_gap / 2, m
    assert abs(m["e2e_p50_delta_ms"] - e2e_gap) < e2e_gap / 2, m
    assert m["primary"]["ttft_ms"]["p50_ms"] >= p_ttft and m["shadow"]["ttft_ms"]["p50_ms"] >= s_ttft
    # a lower threshold: every pair agrees
    assert _report(gw, streamed + whole, agree=0.5)["text_agreement_rate"] == 1.0
    # the CLI prints the same report
    r = _cli(gw, "--json")
    assert r.returncode == 0, r.stderr
    assert orjson.loads(r.stdout)["models"][0]["completion_tokens_delta_mean"] == s_tok - p_tok
    r = _cli(gw)
    assert r.returncode == 0, r.stderr
    assert "old/m-old" in r.stdout and "new/m-new" in r.stdout and "text agreement 0.0%" in r.stdout, r.stdout
    r = _cli(gw, "--agree", "2")
    assert r.returncode == 2 and "agree" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_failing_shadow_is_counted_and_never_reaches_the_client(gateway: Any, mock_engine: Any) -> None:
    old = mock_engine("--dialect", "vllm", "--output-tokens", "4")
    new = mock_engine(
        "--dialect",
        "tgi",
        "--fail-http-rate",
        "1",
        "--fail-http-status",
        "500",
        "--error-message",
        "CUDA error: out of memory (/opt/tgi/worker.py:12)",
    )
    key, entry = gateway_key("k1", "t")
    gw = gateway(_config(old.root, new.root, entry))
    for stream in (True, False):
        st, _, raw = post(gw.url + "/chat/completions", chat("m", stream=stream), key)
        assert st == 200 and b"CUDA" not in raw, raw
    m = _report(gw, 2)
    assert m["compared"] == 0 and m["shadow"]["errors"] == 2 and m["primary"]["errors"] == 0
    assert m["text_agreement_rate"] is None and m["ttft_p50_delta_ms"] is None
    usage = [r for r in gw.access_records() if r.get("model") == "m"]
    assert len(usage) == 2 and all(r["status"] == 200 for r in usage)


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Any:
    yield from launch_llama(tmp_path_factory, ctx_size=1024, parallel=2)


def test_llama_server_vs_mock_shadow_report(gateway: Any, mock_engine: Any, llama: Any) -> None:
    """Old = the real llama-server, new = the mock: the report's primary side is what the client got
    (usage tokens, text) and the text comparison is computed on those answers."""
    new = mock_engine("--dialect", "vllm", "--output-tokens", "6")
    key, entry = gateway_key("k1", "t")
    gw = gateway(_config(llama.base_url, new.root, entry, primary_kind="llamacpp"))
    mock_text = "".join(f" tok{k}" for k in range(6))
    tokens, sims = [], []
    n = 3
    for _ in range(n):
        body = chat("m", max_tokens=12, stream_options={"include_usage": True})
        st, _, raw = post(gw.url + "/chat/completions", body, key)
        assert st == 200, raw
        evs = [orjson.loads(e) for e in events(raw) if e != b"[DONE]"]
        text = "".join(ch.get("delta", {}).get("content") or "" for e in evs for ch in e.get("choices") or [])
        tokens.append(next(e["usage"]["completion_tokens"] for e in evs if e.get("usage")))
        sims.append(text_similarity(text, mock_text))
    m = _report(gw, n)
    assert m["compared"] == n, m
    assert m["primary"]["completion_tokens_mean"] == pytest.approx(sum(tokens) / n)
    assert m["completion_tokens_delta_mean"] == pytest.approx(6 - sum(tokens) / n)
    assert m["text_similarity_mean"] == pytest.approx(sum(sims) / n, abs=1e-3)
    assert m["primary"]["ttft_ms"]["n"] == n and m["shadow"]["ttft_ms"]["n"] == n
    r = _cli(gw)
    assert r.returncode == 0 and "old/m-old" in r.stdout, r.stderr
