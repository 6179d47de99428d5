"""How far apart two candidates' ranked figures are: the ratio and its 95 % interval.

A candidate is ranked after another only when their ratio's interval excludes 1 and the ratio is at
least :data:`MATERIAL_RATIO` away from 1 (:func:`difference`): with interleaved repeat rounds the rounds
are the replicates (a paired test), else Welch on the log time-block rates. The margin exists because a
precise measurement (mock engines, long runs) makes a sub-percent difference statistically significant,
while run-to-run drift of a real host (thermal state, neighbours, page cache) is of that order: nobody
should adopt one engine over another for it. Also the figure a candidate is ranked on and its tail latency
(:func:`figure`, :func:`tail`), which the ranking and its wording share.
"""

from __future__ import annotations

import math

from servelab.bench.analysis.intervals import paired_ratio_interval, paired_rounds_ratio, ratio_interval
from servelab.bench.results import Interval
from servelab.trial.decide.fmt import num
from servelab.trial.results import CandidateResult, Difference, EffectiveThroughput

#: The smallest ratio (either way) the decision treats as a material difference in a ranked figure: 2 %.
MATERIAL_RATIO = 1.02


def figure(c: CandidateResult, metric: str) -> float | None:
    e = c.effective_throughput
    if e is None:
        return None
    return e.output_tokens_per_s if metric == "output_tokens_per_s" else e.requests_per_s


def samples(c: CandidateResult, metric: str) -> list[float]:
    e = c.effective_throughput or EffectiveThroughput()
    if metric == "output_tokens_per_s":
        return list(e.samples or e.per_repeat)
    return list(e.request_samples)


def tail(c: CandidateResult, key: str) -> float:
    v = getattr(c.tail_latency, key) if c.tail_latency is not None else None
    return float(v) if v is not None else math.inf


def figure_name(metric: str) -> str:
    return "output tok/s" if metric == "output_tokens_per_s" else "completed requests/s"


def _by_round(c: CandidateResult) -> dict[int, list[float]]:
    e = c.effective_throughput or EffectiveThroughput()
    out: dict[int, list[float]] = {}
    for v, r in zip(e.samples, e.sample_repeats, strict=False):
        out.setdefault(r, []).append(v)
    return out


def _round_figures(c: CandidateResult) -> dict[int, float]:
    """Round -> the round's whole-run output tok/s (``per_repeat``, in the rounds' order)."""
    e = c.effective_throughput or EffectiveThroughput()
    rounds = list(dict.fromkeys(e.sample_repeats))
    if len(rounds) != len(e.per_repeat):
        return {}
    return dict(zip(rounds, e.per_repeat, strict=True))


def difference(a: str, ca: CandidateResult, b: str, cb: CandidateResult, metric: str) -> Difference:
    """:class:`Difference` of ``a`` over ``b`` on ``metric``: with 3 or more common rounds of interleaved
    repeats (output tok/s), the paired t over the rounds' whole-run figures
    (:func:`~servelab.bench.analysis.intervals.paired_rounds_ratio`); with fewer, paired by round on the time-block
    rates (:func:`~servelab.bench.analysis.intervals.paired_ratio_interval`); else Welch on all samples:
    ``"a sustains 1.9× b's output tok/s (95 % CI 1.6–2.3×)"`` when significant and material
    (:data:`MATERIAL_RATIO`), ``"no material difference …"`` when the interval excludes 1 but the ratio is
    within the margin (``significant`` False), else ``"no significant difference between a and b …"``; no
    interval when either has < 2 samples."""
    ra, rb = _by_round(ca), _by_round(cb)
    pa, pb = _round_figures(ca), _round_figures(cb)
    method = "welch-log"
    r = None
    if metric == "output_tokens_per_s" and len(pa) >= 3 and sorted(pa) == sorted(pb):
        # 3 rounds or more: the paired t over the rounds' whole-run figures (the rounds are the replicates)
        r = paired_rounds_ratio([pa[k] for k in sorted(pa)], [pb[k] for k in sorted(pb)])
        method = "paired-rounds-t"
    if r is None and metric == "output_tokens_per_s" and ra and sorted(ra) == sorted(rb):
        r = paired_ratio_interval([ra[k] for k in sorted(ra)], [rb[k] for k in sorted(rb)])
        method = "paired-rounds-log"
    if r is None:
        method = "welch-log"
        r = ratio_interval(samples(ca, metric), samples(cb, metric))
    what = figure_name(metric)
    if r is None:
        va, vb = figure(ca, metric), figure(cb, metric)
        ratio = (va / vb) if va and vb else None
        return Difference(
            a=a,
            b=b,
            metric=metric,
            ratio=ratio,
            significant=False,
            text=f"no significant difference shown between {a} and {b}: too few samples for an "
            f"interval ({what} ratio {num(ratio)}×)",
        )
    ci = Interval(lo=r.lo, hi=r.hi, level=r.level, n=len(samples(ca, metric)) + len(samples(cb, metric)), method=method)
    material = max(r.ratio, 1 / r.ratio) >= MATERIAL_RATIO
    if r.significant and material:
        text = f"{a} sustains {r.ratio:.2f}× {b}'s {what} (95 % CI {r.lo:.2f}–{r.hi:.2f}×)"
    elif r.significant:
        text = (
            f"no material difference between {a} and {b} in {what}: ratio {r.ratio:.3f}× (95 % CI "
            f"{r.lo:.3f}–{r.hi:.3f}×, excludes 1 but under the {MATERIAL_RATIO - 1:.0%} the decision treats "
            "as material)"
        )
    else:
        text = (
            f"no significant difference between {a} and {b} in {what}: ratio {r.ratio:.2f}× "
            f"(95 % CI {r.lo:.2f}–{r.hi:.2f}×, includes 1)"
        )
    return Difference(a=a, b=b, metric=metric, ratio=r.ratio, ci=ci, significant=r.significant and material, text=text)
