"""Exact values of every metric on hand-built records (nanosecond timestamps chosen by the test)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servelab.bench.analysis import metrics as M
from servelab.wire.types import FailureClass, RequestRecord

MS = 1_000_000


def rec(sent=0, first=100 * MS, chunks=None, end=None, out=None, source="usage", **kw) -> RequestRecord:
    chunks = chunks if chunks is not None else [100 * MS, 110 * MS, 120 * MS, 130 * MS]
    r = RequestRecord(
        request_id=kw.pop("rid", 0),
        scheduled_ns=kw.pop("scheduled", sent) or 1,
        sent_ns=sent,
        first_token_ns=first,
        chunk_ns=list(chunks),
        chunk_tokens=kw.pop("ktok", [0] * len(chunks)),
        end_ns=end if end is not None else chunks[-1] + 2 * MS,
        output_tokens=out if out is not None else len(chunks),
        output_tokens_source=source,
        **kw,
    )
    return r


def test_ttft_e2e_tpot_exact():
    r = rec(sent=10 * MS, first=110 * MS, chunks=[110 * MS, 120 * MS, 130 * MS, 140 * MS], end=142 * MS)
    assert M.ttft_s(r) == pytest.approx(0.100)
    assert M.e2e_s(r) == pytest.approx(0.132)
    # (E2E - TTFT) / (N - 1) = (0.132 - 0.100) / 3
    assert M.tpot_s(r) == pytest.approx(0.032 / 3)
    assert M.output_tps_per_user(r) == pytest.approx(3 / 0.032)


def test_ttfat_absent_not_zero_for_reasoning_only():
    r = rec()
    assert r.first_answer_ns is None
    assert M.ttfat_s(r) is None
    r.first_answer_ns = 150 * MS
    assert M.ttfat_s(r) == pytest.approx(0.150)


def test_tpot_needs_two_tokens():
    assert M.tpot_s(rec(chunks=[100 * MS], out=1)) is None


def test_itl_per_chunk_and_per_token_from_usage_deltas():
    # chunk 2 carried 3 tokens (usage delta), chunk 3 carried 1
    r = rec(chunks=[100 * MS, 130 * MS, 140 * MS], ktok=[1, 3, 1], out=5)
    assert M.itl_chunk_s(r) == pytest.approx([0.030, 0.010])
    vals, how = M.itl_token_s(r)
    assert how == "usage"
    assert vals == pytest.approx([0.010, 0.010, 0.010, 0.010])


def test_itl_one_token_per_chunk_when_counts_agree():
    vals, how = M.itl_token_s(rec())
    assert how == "one_per_chunk" and vals == pytest.approx([0.01, 0.01, 0.01])


def test_itl_uniform_spread_when_only_total_known():
    # 3 chunks but usage says 5 tokens: 4 decode tokens over 2 gaps -> 2 tokens per gap
    r = rec(chunks=[100 * MS, 120 * MS, 140 * MS], out=5)
    vals, how = M.itl_token_s(r)
    assert how == "uniform"
    assert vals == pytest.approx([0.010] * 4)


def test_schedule_lag():
    r = rec(sent=25 * MS, scheduled=20 * MS)
    assert M.schedule_lag_s(r) == pytest.approx(0.005)


def test_stats_percentiles_linear():
    s = M.stats([float(i) for i in range(1, 101)])
    assert s["count"] == 100 and s["min"] == 1 and s["max"] == 100
    assert s["p50"] == pytest.approx(50.5) and s["p99"] == pytest.approx(99.01)
    assert M.stats([])["p50"] is None


def test_summary_counts_add_up_and_window_excludes_warmup():
    ok = [
        rec(
            rid=i,
            sent=1000 * MS + i * MS,
            first=1100 * MS,
            chunks=[1100 * MS, 1110 * MS],
            end=1200 * MS,
            out=2,
            prompt_tokens=10,
        )
        for i in range(4)
    ]
    warm = rec(rid=9, sent=0, first=5 * MS, chunks=[5 * MS], end=10 * MS, warmup=True)
    bad = [
        RequestRecord(request_id=10 + i, sent_ns=1000 * MS, end_ns=1050 * MS, failure=fc)
        for i, fc in enumerate([FailureClass.CONNECT, FailureClass.CUT_OFF, FailureClass.CUT_OFF])
    ]
    trunc = rec(
        rid=20,
        sent=1000 * MS,
        first=1100 * MS,
        chunks=[1100 * MS, 1110 * MS],
        end=1200 * MS,
        out=2,
        finish_reason="length",
        prompt_tokens=10,
    )
    trunc.gate_failures.append("truncated")
    s = M.summarize(ok + [warm, trunc] + bad)
    c = s["counts"]
    assert c["submitted"] == 8 and c["succeeded"] == 5 and c["failed_total"] == 3
    assert c["failed"]["cut_off"] == 2 and c["failed"]["connect"] == 1 and c["failed"]["timeout"] == 0
    assert c["submitted"] == c["succeeded"] + sum(c["failed"].values())
    assert c["truncated"] == 1 and c["good"] == 4
    assert s["window_s"] == pytest.approx(0.2)  # 1000 ms .. 1200 ms; the warmup at t=0 is outside
    assert s["throughput"]["output_tokens_per_s"] == pytest.approx(10 / 0.2)
    assert s["goodput"]["output_tokens_per_s"] == pytest.approx(8 / 0.2)
    assert s["throughput"]["input_tokens_per_s"] == pytest.approx(50 / 0.2)


@given(st.lists(st.sampled_from([None, *FailureClass]), max_size=60))
def test_totals_always_add_up(outcomes):
    recs = [RequestRecord(request_id=i, sent_ns=1, end_ns=2, failure=o) for i, o in enumerate(outcomes)]
    c = M.counts(recs)
    assert c["submitted"] == len(outcomes) == c["succeeded"] + sum(c["failed"].values())


@given(st.lists(st.integers(min_value=1, max_value=10**9), min_size=2, max_size=50))
def test_itl_per_token_sums_to_decode_time(gaps):
    t, chunks = 0, []
    for g in gaps:
        t += g
        chunks.append(t)
    r = rec(sent=0, first=chunks[0], chunks=chunks, end=chunks[-1])
    vals, _ = M.itl_token_s(r)
    assert math.isclose(sum(vals), (chunks[-1] - chunks[0]) / 1e9, rel_tol=1e-9)
