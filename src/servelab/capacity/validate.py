"""Held-out validation: the model is fitted on every step but one and predicts that one, for each
step in turn (leave-one-step-out cross-validation; Hastie, Tibshirani & Friedman, *The
Elements of Statistical Learning*, 2nd ed., 2009, §7.10). The held-out step is simulated with its own
requests (new prompt and output tokens in send order, each with its workload's first-token cost) and
its own load: its concurrency (closed loop) or its measured send times (open loop: an
arrival test or a capacity probe); TTFT P50/P95 and output
tokens/s are compared with what was measured (percentiles as ``numpy.percentile``, linear, as the
bench's summary; throughput over the step's window). The prediction interval is the 2.5-97.5 %
range over the bootstrap refits (:func:`servelab.capacity.fit.fit`), each simulated: it carries the
uncertainty of the fit, not the sampling noise of the measured percentile.
"""

from __future__ import annotations

import numpy as np

from servelab.capacity.bootci import boot_interval
from servelab.capacity.evidence import StepEvidence
from servelab.capacity.fit import fit
from servelab.capacity.results import PerfParams, Prediction, StepCheck, Validation
from servelab.capacity.simulate import simulate

__all__ = ["predict_step", "validate"]


def _figures(p: PerfParams, st: StepEvidence) -> tuple[float, float, float]:
    prompt = np.asarray([r.new_prompt for r in st.requests], dtype=float)
    out = np.asarray([r.output for r in st.requests], dtype=float)
    extra = np.asarray([p.first_token_extra_s.get(r.workload, 0.0) for r in st.requests])
    if st.concurrency:
        run = simulate(p, prompt, out, concurrency=st.concurrency, extra_s=extra)
    else:
        run = simulate(p, prompt, out, arrival_s=np.asarray([r.sent for r in st.requests]), extra_s=extra)
    p50, p95 = np.percentile(run.ttft, [50, 95])
    return float(p50), float(p95), run.output_tokens_per_s


def _pred(point: float, boots: list[float], measured: float) -> Prediction:
    iv = boot_interval(boots, point)
    return Prediction(
        predicted=point, interval=iv, measured=measured, error=(point - measured) / measured if measured else None
    )


def predict_step(p: PerfParams, boots: list[PerfParams], st: StepEvidence, fitted_on: list[str]) -> StepCheck:
    """The :class:`StepCheck` of ``st`` under ``p`` (intervals from ``boots``)."""
    point = _figures(p, st)
    bs = [_figures(b, st) for b in boots]
    ttft = np.asarray([r.ttft for r in st.requests])
    m50, m95 = np.percentile(ttft, [50, 95])
    span = max(r.end for r in st.requests) - min(r.sent for r in st.requests)
    m_tps = sum(r.output for r in st.requests) / span
    return StepCheck(
        step=st.label,
        concurrency=st.concurrency,
        requests=len(st.requests),
        fitted_on=fitted_on,
        ttft_p50_s=_pred(point[0], [b[0] for b in bs], float(m50)),
        ttft_p95_s=_pred(point[1], [b[1] for b in bs], float(m95)),
        output_tps=_pred(point[2], [b[2] for b in bs], m_tps),
    )


def validate(
    steps: list[StepEvidence], *, declared_slots: int | None = None, bootstrap: int = 30, seed: int = 0
) -> Validation:
    """Leave-one-step-out over ``steps`` (module doc); needs two steps or more (else an empty
    :class:`Validation`)."""
    checks = []
    if len(steps) >= 2:
        for k, held in enumerate(steps):
            rest = [s for j, s in enumerate(steps) if j != k]
            rep, boots = fit(rest, declared_slots=declared_slots, bootstrap=bootstrap, seed=seed)
            checks.append(predict_step(rep.params, boots, held, [s.label for s in rest]))
    errs = [
        abs(e) for c in checks for e in (c.ttft_p50_s.error, c.ttft_p95_s.error, c.output_tps.error) if e is not None
    ]
    return Validation(
        steps=checks,
        median_abs_error=float(np.median(errs)) if errs else None,
        max_abs_error=max(errs) if errs else None,
    )
