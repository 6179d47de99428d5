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
from servelab.capacity.bootci import boot_interval
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
    waiting is seen when more requests were in flight (sent to end) at some send than the most decoding.
    At least 1 when a step holds a request: one whose tokens all came at one instant decoded for no
    measurable time but still held a slot."""
    most, inflight = 0, 0
    for st in steps:
        rs = st.requests
        firsts, lasts = np.sort([r.first for r in rs]), np.sort([r.last for r in rs])
        if rs:
            most = max(most, 1, int(_batch_at(firsts, lasts, np.asarray([r.first for r in rs])).max()))
        sents, ends = np.sort([r.sent for r in rs]), np.sort([r.end for r in rs])
        inflight = max(inflight, int(_batch_at(sents, ends, np.asarray([r.sent for r in rs])).max()))
    return most, inflight > most


@dataclass
class Prepared:
    """The figures of the fit. Prefill samples are *prompt batches*: requests whose prefills overlapped
    (service start to first token), one sample per batch: ``prefill`` seconds from its first start to
    its last first token, ``prompt`` its new prompt tokens summed, ``size`` its requests, ``kinds`` its
    requests of each workload in ``workloads`` (all but the most common one); ``batch_of`` maps each
    request to its batch. Per request: its token
    gaps (s/token) with the batch ``b`` and the other requests' prefill time inside each gap (s/token),
    empty for a request with held-back tokens."""

    prefill: np.ndarray
    prompt: np.ndarray
    size: np.ndarray
    kinds: np.ndarray
    workloads: list[str]
    batch_of: np.ndarray
    gaps: list[np.ndarray]
    batch: list[np.ndarray]
    stall: list[np.ndarray]
    held: int = 0


def _service_starts(st: StepEvidence, slots: int) -> list[float]:
    """Each request's service start (in ``st.requests`` order): requests taken in the order their first
    token came (the engine's serving order; two sent at once may be served either way round), each
    at ``max(sent, the earliest free slot)``."""
    free = [float("-inf")] * slots
    starts = [0.0] * len(st.requests)
    for k in sorted(range(len(st.requests)), key=lambda k: st.requests[k].first):
        r = st.requests[k]
        starts[k] = min(r.first, max(r.sent, heapq.heappop(free)))
        heapq.heappush(free, r.end)
    return starts


def _covered(spans: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """The union of ``spans`` as merged ``(starts, cumulative covered seconds at each end)``."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        elif b > a:
            merged.append([a, b])
    st = np.asarray([m[0] for m in merged])
    en = np.asarray([m[1] for m in merged])
    return st, en


def _cover_upto(st: np.ndarray, en: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Seconds of the union (``st``/``en``) before each time ``x``."""
    if len(st) == 0:
        return np.zeros_like(x)
    cum = np.concatenate([[0.0], np.cumsum(en - st)])
    k = np.searchsorted(st, x, "right")  # spans starting at or before x
    prev = cum[np.maximum(k - 1, 0)]
    part = np.where(k > 0, np.minimum(x, en[np.maximum(k - 1, 0)]) - st[np.maximum(k - 1, 0)], 0.0)
    return np.where(k > 0, prev + np.maximum(part, 0.0), 0.0)


def _prompt_batches(spans: list[tuple[float, float]]) -> list[list[int]]:
    """Requests (indices into ``spans``) grouped by overlapping prefill spans, in start order."""
    order = sorted(range(len(spans)), key=lambda k: spans[k])
    groups: list[list[int]] = []
    end = -np.inf
    for k in order:
        if groups and spans[k][0] < end:
            groups[-1].append(k)
            end = max(end, spans[k][1])
        else:
            groups.append([k])
            end = spans[k][1]
    return groups


def prepare(steps: list[StepEvidence], slots: int) -> Prepared:
    """The figures :func:`refit` regresses, from ``steps`` served with ``slots`` slots."""
    pf: list[float] = []
    pr: list[int] = []
    size: list[int] = []
    kinds: list[list[int]] = []
    batch_of: list[int] = []
    gaps: list[np.ndarray] = []
    batch: list[np.ndarray] = []
    stall: list[np.ndarray] = []
    counts: dict[str, int] = {}
    for st in steps:
        for r in st.requests:
            counts[r.workload] = counts.get(r.workload, 0) + 1
    names = sorted(counts, key=lambda w: (-counts[w], w))[1:]  # the most common one is the reference
    any_clean = any(r.held_back == 0 for st in steps for r in st.requests)
    held = 0
    for st in steps:
        rs = st.requests
        firsts, lasts = np.sort([r.first for r in rs]), np.sort([r.last for r in rs])
        starts = _service_starts(st, slots)
        spans = [(s0, r.first) for r, s0 in zip(rs, starts, strict=True)]
        cst, cen = _covered(spans)
        of = [0] * len(rs)
        for grp in _prompt_batches(spans):
            for k in grp:
                of[k] = len(pf)
            pf.append(max(spans[k][1] for k in grp) - min(spans[k][0] for k in grp))
            pr.append(sum(rs[k].new_prompt for k in grp))
            size.append(len(grp))
            kinds.append([sum(rs[k].workload == w for k in grp) for w in names])
        batch_of += of
        for r in rs:
            clean = r.held_back == 0 or not any_clean
            held += r.held_back > 0
            ts = np.asarray([c[0] for c in r.chunks])
            toks = np.asarray([c[1] for c in r.chunks], dtype=float)
            if len(ts) >= 2 and clean:
                gaps.append(np.diff(ts) / toks[1:])
                batch.append(_batch_at(firsts, lasts, ts[:-1]).astype(float))
                stall.append(np.diff(_cover_upto(cst, cen, ts)) / toks[1:])
            else:
                gaps.append(np.zeros(0))
                batch.append(np.zeros(0))
                stall.append(np.zeros(0))
    return Prepared(
        np.asarray(pf),
        np.asarray(pr, dtype=float),
        np.asarray(size),
        np.asarray(kinds, dtype=float).reshape(len(pf), len(names)),
        names,
        np.asarray(batch_of),
        gaps,
        batch,
        stall,
        held,
    )


def _ols(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Intercept and slope of y on x (least squares)."""
    a = np.vstack([np.ones_like(x), x]).T
    (b0, b1), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(b0), float(b1)


def _decode(g: np.ndarray, b: np.ndarray, s: np.ndarray, with_stall: bool) -> tuple[float, float, float | None]:
    """``(decode base, slope per other running request, stall coefficient)`` by least squares of the
    per-token gaps ``g`` on ``b - 1`` and (``with_stall``) the prefill seconds per token ``s`` beside them."""
    if len(g) == 0:
        return 0.0, 0.0, None
    cols = [np.ones_like(g)]
    if np.ptp(b) > 0:
        cols.append(b - 1.0)
    use_s = with_stall and np.ptp(s) > 0
    if use_s:
        cols.append(s)
    coef, *_ = np.linalg.lstsq(np.vstack(cols).T, g, rcond=None)
    d1 = float(coef[1]) if np.ptp(b) > 0 else 0.0
    return float(coef[0]), d1, float(coef[-1]) if use_s else None


def _prefill_samples(p: Prepared, idx: np.ndarray, serial: bool) -> np.ndarray:
    """The prompt batches (indices, a batch once per drawn member) of the requests ``idx``: every batch
    when prefills are serial (a batch costs its summed prompt), else the lone prefills only
    (overlapping ones ran beside each other); all batches when fewer than 3 are lone."""
    sel = p.batch_of[idx]
    ok = (p.size[sel] == 1) | serial
    return sel[ok] if ok.sum() >= 3 else sel


def _prefill(p: Prepared, sel: np.ndarray) -> tuple[float, float | None, dict[str, float]]:
    """``(base s, rate tok/s or None, extra s per workload)`` from the batches ``sel``: least squares of
    seconds on new prompt tokens over the batches of the reference workload only (all when fewer than
    3), the rate left out when the prompts hardly vary (module doc) or its slope is not positive; then
    each other workload's extra is the median, over the batches holding it and no third one, of the
    seconds left over per request of it (a median: grammar-bound first tokens vary widely)."""
    y, tok, kinds = p.prefill[sel], p.prompt[sel], p.kinds[sel]
    plain = kinds.sum(axis=1) == 0 if kinds.shape[1] else np.ones(len(y), dtype=bool)
    if plain.sum() < 3:
        plain = np.ones(len(y), dtype=bool)
    yp, tp = y[plain], tok[plain]
    rate: float | None = None
    base = float(yp.mean())
    if tp.mean() > 0 and tp.std() / tp.mean() >= MIN_PROMPT_CV:
        b0, slope = _ols(tp, yp)
        if slope > 0:
            base, rate = b0, 1.0 / slope
    left = y - base - (tok / rate if rate else 0.0)
    extra = {}
    for k, name in enumerate(p.workloads):
        only = (kinds[:, k] > 0) & (kinds.sum(axis=1) == kinds[:, k])
        if only.any():
            extra[name] = float(np.median(left[only] / kinds[only, k]))
    return base, rate, extra


#: a stall coefficient above this: the decode waits for other prefills (prefill_serial)
SERIAL_STALL = 0.5
#: how far outside its physical range 0-1 a stall coefficient without refits may lie and still be read as
#: noise around it (a token gap cannot absorb less than none or more than all of the prefill inside it)
STALL_SLACK = 0.5


def stall_identified(beta: float, ci: Interval | None) -> bool:
    """Whether the stall coefficient ``beta`` (s of token gap per s of prefill beside it) is a physical
    value: inside 0-1, or outside it by no more than its bootstrap interval ``ci`` (95 %) reaches back in,
    or, with no interval bound, by at most :data:`STALL_SLACK`. A coefficient far outside (e.g. thousands
    of s/s from token gaps of microseconds) is what the least squares made of gaps that do not carry it."""
    if 0.0 <= beta <= 1.0:
        return True
    lo, hi = (ci.lo, ci.hi) if ci is not None else (None, None)
    if lo is not None and hi is not None:
        return lo <= 1.0 and hi >= 0.0
    return -STALL_SLACK <= beta <= 1.0 + STALL_SLACK


def refit(
    p: Prepared, idx: np.ndarray, slots: int, slots_identified: bool, serial: bool | None = None
) -> tuple[PerfParams, float | None]:
    """:class:`PerfParams` from the requests ``idx`` of ``p`` (indices may repeat: a bootstrap sample),
    and the stall coefficient; ``serial`` fixes whether prefills are serial (else learned: module doc)."""
    g = np.concatenate([p.gaps[i] for i in idx])
    b = np.concatenate([p.batch[i] for i in idx])
    s = np.concatenate([p.stall[i] for i in idx])
    _, _, beta = _decode(g, b, s, True)
    is_serial = (beta or 0.0) > SERIAL_STALL if serial is None else serial
    d0, d1, _ = _decode(g, b, s, is_serial)
    base, rate, extra = _prefill(p, _prefill_samples(p, idx, is_serial))
    return PerfParams(
        prefill_base_s=max(base, 0.0),
        prefill_tokens_per_s=rate,
        decode_base_s=max(d0, 0.0),
        decode_per_running_s=max(d1, 0.0),
        slots=slots,
        slots_identified=slots_identified,
        prefill_serial=is_serial,
        first_token_extra_s=extra,
    ), beta


def _iv(vals: list[float], n: int, point: float | None) -> Interval:
    """The refits' interval (:func:`servelab.capacity.bootci.boot_interval`, holding ``point``); ``n``
    the requests fitted on; both bounds ``None`` without refits."""
    iv = boot_interval(vals, point, method="bootstrap-percentile")
    return Interval(n=n, method="bootstrap-percentile") if iv is None else iv.model_copy(update={"n": n})


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
    point, beta = refit(prep, np.arange(n), slots, identified or declared_slots is not None)
    rng = np.random.default_rng(seed)
    refits = [
        refit(prep, rng.integers(0, n, n), slots, point.slots_identified, point.prefill_serial)
        for _ in range(bootstrap)
    ]
    boots = [b for b, _ in refits]
    betas = [x for _, x in refits if x is not None]
    rates = [b.prefill_tokens_per_s for b in boots if b.prefill_tokens_per_s is not None]
    notes = []
    if declared_slots and declared_slots != seen:
        notes.append(f"declared slots {declared_slots}, most seen decoding at once {seen}")
    if not point.slots_identified:
        notes.append(f"slot limit not identified: no request waited; {seen} (the most seen at once) is a lower bound")
    if point.prefill_tokens_per_s is None:
        notes.append("prefill rate not identifiable: the prompts are of one length (the base covers them)")
    beta_ci = _iv(betas, n, beta) if betas else None
    physical = beta is None or stall_identified(beta, beta_ci)
    if not physical:
        notes.append(
            f"prefill stall not identified: the token gaps fit to {beta:.3g} s per second of other prefills"
            " beside them, outside the physical 0-1 (a gap cannot absorb more than the prefill inside it):"
            " the gaps do not carry it (too small, too few beside prefills, or grown by something else)"
            + ("; prefills taken as serial, the slower reading" if point.prefill_serial else "")
        )
    elif point.prefill_serial:
        notes.append(
            f"prefill serial: token gaps grow by {beta:.2f} s per second of other prefills beside them;"
            " the decode waits for each prefill and prefills run one at a time"
        )
    if prep.held and prep.held < n:
        notes.append(
            f"{prep.held} requests streamed fewer tokens than their usage (held back by the engine);"
            " their token gaps are kept out of the decode law"
        )
    elif prep.held:
        notes.append(
            "every request streamed fewer token chunks than its usage's tokens (several tokens a chunk, or"
            " tokens held back); the decode law takes each chunk gap as one token's"
        )
    gaps = int(sum(len(g) for g in prep.gaps))
    if gaps == 0:
        notes.append(
            "no token gap measured (every response came in one chunk): the model decodes in 0 s per token;"
            " measure with longer outputs streamed token by token to fit the decode law"
        )
    elif point.decode_base_s == 0 and point.decode_per_running_s == 0:
        notes.append(
            f"all {gaps} token gaps fit to 0 s (the tokens arrived together): the model decodes in 0 s per token"
        )
    sel = _prefill_samples(prep, np.arange(n), point.prefill_serial)
    extra = np.asarray([point.first_token_extra_s.get(w, 0.0) for w in prep.workloads])
    model = point.prefill_base_s + prep.prompt[sel] / (point.prefill_tokens_per_s or np.inf)
    resid = prep.prefill[sel] - model - (prep.kinds[sel] @ extra if len(extra) else 0.0)
    return FitReport(
        params=point,
        requests=n,
        steps=[s.label for s in steps],
        seen_slots=seen,
        declared_slots=declared_slots,
        token_gaps=gaps,
        prefill_base_ci=_iv([b.prefill_base_s for b in boots], n, point.prefill_base_s),
        prefill_rate_ci=_iv(rates, n, point.prefill_tokens_per_s) if rates else None,
        decode_base_ci=_iv([b.decode_base_s for b in boots], n, point.decode_base_s),
        decode_per_running_ci=_iv([b.decode_per_running_s for b in boots], n, point.decode_per_running_s),
        prefill_residual_s=float(np.sqrt(np.mean(resid**2))),
        prefill_stall=beta if physical else None,
        prefill_stall_ci=beta_ci if physical else None,
        prefill_samples=len(sel),
        held_back_requests=prep.held,
        notes=notes,
    ), boots
