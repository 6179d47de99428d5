"""Fit a continuous-batching performance model to measured requests (:mod:`servelab.capacity.evidence`).

The model (:class:`~servelab.capacity.results.PerfParams`) is the one the simulator runs
(:mod:`servelab.capacity.simulate`):

- **slots** ``S``: requests served at once (llama-server ``--parallel``, vLLM ``max_num_seqs``); later
  ones wait FIFO. Estimated as the most requests seen decoding at once (first to last token chunk,
  client clock); it is *identified* only when more requests were in flight than that (some waited),
  else it is a lower bound. A declared limit (the engine's setting) is used when given; both are reported.
- **prefill**: first token ``prefill_base_s + prompt_tokens / prefill_tokens_per_s`` after service
  starts. Service start is rebuilt from the client's timeline as an S-server FIFO queue: a request
  starts at ``max(sent, the earliest end among the S requests served before it)`` (Kleinrock,
  *Queueing Systems* vol. 1, 1975, §2.1: the G/G/m FIFO recursion). Ordinary least squares of
  (first token - service start) on prompt tokens; the slope is 1/rate. Without a spread of prompt
  lengths (coefficient of variation < 5 %) the rate is not identifiable and only the base is fitted.
- **decode**: each later token ``decode_base_s + decode_per_running_s * (b - 1)`` after the previous,
  ``b`` the requests decoding when the previous chunk arrived (this one included): OLS over every
  chunk gap divided by its tokens (linear decode step time in batch size: Vidur, Agrawal et al.,
  MLSys 2024, §4; Sarathi-Serve, Agrawal et al., OSDI 2024, Fig. 3).

Uncertainty: a nonparametric bootstrap over requests (Efron & Tibshirani, *An Introduction to the
Bootstrap*, 1993, ch. 6; requests resampled with their gaps as clusters, since the gaps of one request
share its timeline), percentile intervals at 95 %. Every figure is in seconds, tokens or tokens/s.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from servelab.bench.results import Interval
from servelab.capacity.evidence import StepEvidence
from servelab.capacity.results import FitReport, PerfParams

__all__ = ["Prepared", "fit", "observed_slots", "prepare", "refit"]

#: below this coefficient of variation of prompt lengths, the prefill rate is not fitted
MIN_PROMPT_CV = 0.05


def _batch_at(firsts: np.ndarray, lasts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Requests decoding at each time ``t`` (first <= t < last), from sorted ``firsts``/``lasts``."""
    return np.searchsorted(firsts, t, "right") - np.searchsorted(lasts, t, "right")


def observed_slots(steps: list[StepEvidence]) -> tuple[int, bool]:
    """``(most requests decoding at once, whether some request waited)`` over ``steps`` (module doc):
    waiting is seen when more requests were in flight (sent to end) at some send than the most decoding."""
    most, inflight = 0, 0
    for st in steps:
        rs = st.requests
        firsts, lasts = np.sort([r.first for r in rs]), np.sort([r.last for r in rs])
        most = max(most, int(_batch_at(firsts, lasts, np.asarray([r.first for r in rs])).max()))
        sents, ends = np.sort([r.sent for r in rs]), np.sort([r.end for r in rs])
        inflight = max(inflight, int(_batch_at(sents, ends, np.asarray([r.sent for r in rs])).max()))
    return most, inflight > most


@dataclass
class Prepared:
    """Per-request figures of the fit: ``prefill`` seconds and ``prompt`` tokens (one per request),
    and per request its token gaps (s/token) with the batch ``b`` at each."""

    prefill: np.ndarray
    prompt: np.ndarray
    gaps: list[np.ndarray]
    batch: list[np.ndarray]


def _service_starts(st: StepEvidence, slots: int) -> list[float]:
    free = [float("-inf")] * slots
    starts = []
    for r in st.requests:  # in send order
        start = max(r.sent, heapq.heappop(free))
        starts.append(start)
        heapq.heappush(free, r.end)
    return starts


def prepare(steps: list[StepEvidence], slots: int) -> Prepared:
    """The figures :func:`refit` regresses, from ``steps`` served with ``slots`` slots."""
    prefill, prompt, gaps, batch = [], [], [], []
    for st in steps:
        rs = st.requests
        firsts, lasts = np.sort([r.first for r in rs]), np.sort([r.last for r in rs])
        for r, start in zip(rs, _service_starts(st, slots), strict=True):
            prefill.append(r.first - start)
            prompt.append(r.prompt)
            ts = np.asarray([c[0] for c in r.chunks])
            toks = np.asarray([c[1] for c in r.chunks], dtype=float)
            if len(ts) >= 2:
                gaps.append(np.diff(ts) / toks[1:])
                batch.append(_batch_at(firsts, lasts, ts[:-1]).astype(float))
            else:
                gaps.append(np.zeros(0))
                batch.append(np.zeros(0))
    return Prepared(np.asarray(prefill), np.asarray(prompt, dtype=float), gaps, batch)


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of y on x (least squares)."""
    a = np.vstack([np.ones_like(x), x]).T
    (b0, b1), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(b0), float(b1)


def refit(p: Prepared, idx: np.ndarray, slots: int, slots_identified: bool) -> PerfParams:
    """:class:`PerfParams` from the requests ``idx`` of ``p`` (indices may repeat: a bootstrap sample)."""
    pf, pr = p.prefill[idx], p.prompt[idx]
    rate: float | None = None
    if pr.mean() > 0 and pr.std() / pr.mean() >= MIN_PROMPT_CV:
        base, slope = _ols(pr, pf)
        rate = 1.0 / slope if slope > 0 else None
        if rate is None:
            base = float(pf.mean())
    else:
        base = float(pf.mean())
    g = np.concatenate([p.gaps[i] for i in idx])
    b = np.concatenate([p.batch[i] for i in idx])
    if len(g) == 0:
        d0, d1 = 0.0, 0.0
    elif np.ptp(b) > 0:
        d0, d1 = _ols(b - 1.0, g)
    else:  # one batch size seen: the base at it, no slope
        d0, d1 = float(g.mean()), 0.0
    return PerfParams(
        prefill_base_s=max(base, 0.0),
        prefill_tokens_per_s=rate,
        decode_base_s=max(d0, 0.0),
        decode_per_running_s=max(d1, 0.0),
        slots=slots,
        slots_identified=slots_identified,
    )


def _iv(vals: list[float], n: int) -> Interval:
    lo, hi = np.percentile(vals, [2.5, 97.5]) if vals else (None, None)
    return Interval(
        lo=None if lo is None else float(lo), hi=None if hi is None else float(hi), n=n, method="bootstrap-percentile"
    )


def fit(
    steps: list[StepEvidence], *, declared_slots: int | None = None, bootstrap: int = 200, seed: int = 0
) -> tuple[FitReport, list[PerfParams]]:
    """Fit :class:`PerfParams` on ``steps`` (module doc); returns the report (point fit, 95 % bootstrap
    intervals) and the ``bootstrap`` refits the simulator carries into its prediction intervals.
    Raises ``ValueError`` when ``steps`` hold no request."""
    n = sum(len(s.requests) for s in steps)
    if n == 0:
        raise ValueError("no measured request to fit a performance model on")
    seen, identified = observed_slots(steps)
    slots = declared_slots if declared_slots else seen
    prep = prepare(steps, slots)
    point = refit(prep, np.arange(n), slots, identified or declared_slots is not None)
    rng = np.random.default_rng(seed)
    boots = [refit(prep, rng.integers(0, n, n), slots, point.slots_identified) for _ in range(bootstrap)]
    rates = [b.prefill_tokens_per_s for b in boots if b.prefill_tokens_per_s is not None]
    notes = []
    if declared_slots and declared_slots != seen:
        notes.append(f"declared slots {declared_slots}, most seen decoding at once {seen}")
    if not point.slots_identified:
        notes.append(f"slot limit not identified: no request waited; {seen} (the most seen at once) is a lower bound")
    if point.prefill_tokens_per_s is None:
        notes.append("prefill rate not identifiable: the prompts are of one length (the base covers them)")
    resid = prep.prefill - (point.prefill_base_s + prep.prompt / (point.prefill_tokens_per_s or np.inf))
    return FitReport(
        params=point,
        requests=n,
        steps=[s.label for s in steps],
        seen_slots=seen,
        declared_slots=declared_slots,
        token_gaps=int(sum(len(g) for g in prep.gaps)),
        prefill_base_ci=_iv([b.prefill_base_s for b in boots], n),
        prefill_rate_ci=_iv(rates, n) if rates else None,
        decode_base_ci=_iv([b.decode_base_s for b in boots], n),
        decode_per_running_ci=_iv([b.decode_per_running_s for b in boots], n),
        prefill_residual_s=float(np.sqrt(np.mean(resid**2))),
        notes=notes,
    ), boots
