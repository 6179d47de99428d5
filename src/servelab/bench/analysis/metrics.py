"""Every latency and throughput metric servelab reports, each defined exactly once, here.

Conventions: a request's clock starts at ``sent_ns`` (just before the request bytes were written),
not at the scheduled time; the gap between the two is reported separately as schedule lag (client
queueing). All durations are in seconds (``_s``), throughputs in tokens or requests per second.

Definitions follow the metric table of ../shared/seeds/000_30165fea2e674ab9.txt §10.2 (checked
2026-11-30): TTFT ends at the first *generated token*, never at HTTP headers, the first byte or an empty
role chunk; a stream chunk is not necessarily one token; aggregate throughput uses a fixed, stated
window; failed, truncated and timed-out requests are reported next to the successes.
Every distribution's P50/P95/P99 carries its 95 % confidence interval (:func:`percentile_cis`, from
:mod:`servelab.bench.analysis.intervals`: distribution-free, from order statistics; unbounded where the sample
is too small), so no percentile is reported as a bare number.
TPOT's formula is the one used by vLLM's ``benchmark_serving`` and by the NVIDIA GenAI-Perf/AIPerf
metric docs: ``(e2e - ttft) / (output_tokens - 1)`` (https://docs.nvidia.com/deeplearning/triton-inference-server/user-guide/docs/perf_analyzer/genai-perf/docs/metrics.html
, read 2026-11-30).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from servelab.bench.analysis.intervals import quantile_interval
from servelab.wire.types import FailureClass, RequestRecord

NS = 1e9

#: The statistics reported for every distribution, in this order.
STAT_KEYS = ("count", "mean", "min", "max", "p50", "p90", "p95", "p99")


def ttft_s(r: RequestRecord) -> float | None:
    """Time to first token, seconds: ``first_token_ns - sent_ns``.

    The first token is the first stream event with non-empty ``content``, reasoning text or a
    tool-call fragment (docs/engine-wire.md case 1). ``None`` if no token arrived.
    """
    if r.first_token_ns is None or r.sent_ns is None:
        return None
    return (r.first_token_ns - r.sent_ns) / NS


def ttfat_s(r: RequestRecord) -> float | None:
    """Time to first *answer* token, seconds: ``first_answer_ns - sent_ns`` (first non-empty
    ``content``). For reasoning models this is what a user sees; ``None`` (absent, not zero) when the
    request produced no answer text, e.g. it hit ``max_tokens`` while still reasoning (case 10)."""
    if r.first_answer_ns is None or r.sent_ns is None:
        return None
    return (r.first_answer_ns - r.sent_ns) / NS


def e2e_s(r: RequestRecord) -> float | None:
    """End-to-end latency, seconds: ``end_ns - sent_ns``, where ``end_ns`` is when the response body
    ended (``[DONE]`` and the close of the stream, or the failure). ``None`` if never sent."""
    if r.end_ns is None or r.sent_ns is None:
        return None
    return (r.end_ns - r.sent_ns) / NS


def tpot_s(r: RequestRecord) -> float | None:
    """Time per output token after the first, seconds: ``(e2e - ttft) / (output_tokens - 1)``.

    ``None`` when fewer than 2 output tokens or no TTFT. Output tokens are the server's
    ``usage.completion_tokens`` when it sent usage (reasoning tokens included)."""
    t, e, n = ttft_s(r), e2e_s(r), r.output_tokens
    if t is None or e is None or not n or n < 2:
        return None
    return (e - t) / (n - 1)


def schedule_lag_s(r: RequestRecord) -> float | None:
    """Client queueing, seconds: ``sent_ns - scheduled_ns`` (actual minus intended send time).

    In an open-loop run a growing lag means the load generator or its concurrency cap, not the
    server, delayed requests; it is reported so that such a run cannot pass silently."""
    if r.sent_ns is None or not r.scheduled_ns:
        return None
    return (r.sent_ns - r.scheduled_ns) / NS


def itl_chunk_s(r: RequestRecord) -> list[float]:
    """Inter-token latency per *chunk*, seconds: the gaps between consecutive token-carrying events
    (``len(chunk_ns) - 1`` values). Role-only chunks, the empty last TGI chunk and usage chunks are
    not token events and make no gap (docs/engine-wire.md case 3)."""
    c = r.chunk_ns
    return [(c[i] - c[i - 1]) / NS for i in range(1, len(c))]


def itl_token_s(r: RequestRecord) -> tuple[list[float], str]:
    """Inter-token latency per *token*, seconds, and how the tokens per chunk were known.

    A chunk carrying ``k`` tokens spreads its gap over ``k`` tokens (``k`` values of ``gap / k``).
    Method ``"usage"``: ``k`` from per-chunk usage deltas (vLLM continuous usage stats).
    Method ``"one_per_chunk"``: the output token count equals the number of token chunks.
    Method ``"uniform"``: only the total is known (``output_tokens`` > chunks); each gap is spread
    over the average ``(output_tokens - k_first) / (chunks - 1)`` tokens — an estimate, labelled so.
    Returns ``([], "none")`` when there are fewer than 2 chunks.
    """
    c, ks = r.chunk_ns, r.chunk_tokens
    n = len(c)
    if n < 2:
        return [], "none"
    if all(k > 0 for k in ks[1:]):
        out: list[float] = []
        for i in range(1, n):
            k = ks[i]
            g = (c[i] - c[i - 1]) / NS / k
            out.extend([g] * k)
        return out, "usage"
    gaps = itl_chunk_s(r)
    total = r.output_tokens
    if total is None or total == n or r.output_tokens_source != "usage":
        return gaps, "one_per_chunk"
    first_k = ks[0] if ks and ks[0] > 0 else 1
    per = max(1.0, (total - first_k) / (n - 1))
    return [g / per for g in gaps for _ in range(max(1, round(per)))], "uniform"


def output_tps_per_user(r: RequestRecord) -> float | None:
    """Per-user output speed, tokens/s, during decode: ``(output_tokens - 1) / (e2e - ttft)``
    (the reciprocal of TPOT) — what one user watching the stream experiences under load."""
    t = tpot_s(r)
    return None if not t else 1.0 / t


#: The percentiles that carry a 95 % confidence interval (``p50_ci`` …) in every distribution.
CI_KEYS = ("p50", "p95", "p99")


def percentile_cis(values: list[float] | np.ndarray, n_eff: int | None = None) -> dict[str, dict[str, Any]]:
    """``{"p50_ci": …, "p95_ci": …, "p99_ci": …}``: the 95 % interval of each percentile of ``values``
    (:func:`servelab.bench.analysis.intervals.quantile_interval`; ``lo``/``hi`` ``None`` where the sample cannot
    bound that side; ``n_eff`` for clustered values, e.g. the requests behind per-token ITL)."""
    out: dict[str, dict[str, Any]] = {}
    for k in CI_KEYS:
        b = quantile_interval(values, int(k[1:]) / 100, n_eff=n_eff)
        out[f"{k}_ci"] = {"lo": b.lo, "hi": b.hi, "level": b.level, "n": b.n, "method": b.method}
    return out


def stats(values: list[float] | np.ndarray, n_eff: int | None = None) -> dict[str, Any]:
    """count/mean/min/max/P50/P90/P95/P99 of ``values`` (seconds or whatever unit they carry), ``std``
    (the sample standard deviation, ``ddof=1``; ``None`` below 2 values), and the 95 % interval of
    P50/P95/P99 (:func:`percentile_cis`; ``n_eff``: see there).

    Percentiles use linear interpolation between closest ranks (numpy's default ``linear`` method,
    Hyndman & Fan type 7). An empty input gives ``count: 0`` and ``None`` elsewhere (no intervals).
    """
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"count": 0, **{k: None for k in STAT_KEYS[1:]}, "std": None}
    p = np.percentile(a, [50, 90, 95, 99])
    return {
        "count": int(a.size),
        "mean": float(a.mean()),
        "min": float(a.min()),
        "max": float(a.max()),
        "p50": float(p[0]),
        "p90": float(p[1]),
        "p95": float(p[2]),
        "p99": float(p[3]),
        "std": float(a.std(ddof=1)) if a.size >= 2 else None,
        **percentile_cis(a, n_eff),
    }


@dataclass
class Window:
    """The measurement window of a load step, in monotonic ns: from the first measured (non-warmup)
    request's send to the end of the last one. Throughputs are divided by its length."""

    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        """Window length, seconds (never below 1 µs, to keep divisions finite)."""
        return max(self.end_ns - self.start_ns, 1000) / NS


def window_of(recs: list[RequestRecord]) -> Window | None:
    """The window spanning ``recs`` (warmup excluded by the caller), or ``None`` if none were sent."""
    sent = [r.sent_ns for r in recs if r.sent_ns is not None]
    ends = [r.end_ns for r in recs if r.end_ns is not None]
    if not sent or not ends:
        return None
    return Window(min(sent), max(ends))


def counts(recs: list[RequestRecord]) -> dict[str, Any]:
    """Totals that always add up: ``submitted = succeeded + sum(failed.values())``.

    ``failed`` has one key per :class:`FailureClass` (zeros included). ``truncated`` counts
    succeeded requests that finished with ``length`` (a subset of succeeded, reported apart).
    ``gate_failed`` counts succeeded requests that failed a quality/SLO gate (so
    ``good = succeeded - gate_failed``)."""
    c = Counter(r.failure.value for r in recs if r.failure is not None)
    failed = {fc.value: c.get(fc.value, 0) for fc in FailureClass}
    ok = [r for r in recs if r.failure is None]
    return {
        "submitted": len(recs),
        "succeeded": len(ok),
        "failed": failed,
        "failed_total": sum(failed.values()),
        "truncated": sum(1 for r in ok if r.truncated),
        "gate_failed": sum(1 for r in ok if r.gate_failures),
        "good": sum(1 for r in ok if not r.gate_failures),
    }


def summarize(recs: list[RequestRecord]) -> dict[str, Any]:
    """The summary of one load step's measured (non-warmup) requests.

    Shape: ``{"counts": …, "window_s": float|None, "ttft_s": stats, "ttfat_s": stats, "e2e_s": stats,
    "tpot_s": stats, "itl_s": stats (per token), "itl_chunk_s": stats, "itl_token_method": {method: n},
    "schedule_lag_s": stats, "output_tps_per_user": stats, "throughput": {…}, "goodput": {…},
    "tokens": {…}}``. Latency distributions use succeeded requests only (a failed request has no
    complete latency); failures are in ``counts``. Throughput = tokens (server usage) of succeeded
    requests / window; goodput = the same restricted to requests that passed every gate.
    """
    measured = [r for r in recs if not r.warmup]
    ok = [r for r in measured if r.failure is None]
    good = [r for r in ok if not r.gate_failures]
    win = window_of(measured)
    itl_tok: list[float] = []
    itl_chunk: list[float] = []
    methods: Counter[str] = Counter()
    for r in ok:
        vals, how = itl_token_s(r)
        itl_tok.extend(vals)
        methods[how] += 1
        itl_chunk.extend(itl_chunk_s(r))

    def col(fn: Any, rs: list[RequestRecord]) -> list[float]:
        return [v for v in (fn(r) for r in rs) if v is not None]

    dur = win.duration_s if win else None
    in_tok = sum(r.prompt_tokens or 0 for r in ok)
    out_tok = sum(r.output_tokens or 0 for r in ok)
    good_out = sum(r.output_tokens or 0 for r in good)
    sources = Counter(r.output_tokens_source or "none" for r in ok)

    def per_s(x: float) -> float | None:
        return None if not dur else x / dur

    return {
        "counts": counts(measured),
        "window_s": dur,
        "ttft_s": stats(col(ttft_s, ok)),
        "ttfat_s": stats(col(ttfat_s, ok)),
        "e2e_s": stats(col(e2e_s, ok)),
        "tpot_s": stats(col(tpot_s, ok)),
        "itl_s": stats(itl_tok, n_eff=len([r for r in ok if len(r.chunk_ns) > 1])),  # gaps cluster by request
        "itl_chunk_s": stats(itl_chunk, n_eff=len([r for r in ok if len(r.chunk_ns) > 1])),
        "itl_token_method": dict(methods),
        "schedule_lag_s": stats(col(schedule_lag_s, measured)),
        "output_tps_per_user": stats(col(output_tps_per_user, ok)),
        "throughput": {
            "requests_per_s": per_s(len(ok)),
            "input_tokens_per_s": per_s(in_tok),
            "output_tokens_per_s": per_s(out_tok),
        },
        "goodput": {
            "requests_per_s": per_s(len(good)),
            "output_tokens_per_s": per_s(good_out),
            "good_fraction": (len(good) / len(measured)) if measured else None,
        },
        "tokens": {
            "input_total": in_tok,
            "output_total": out_tok,
            "output_source": dict(sources),
        },
    }
