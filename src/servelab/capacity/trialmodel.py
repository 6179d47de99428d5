"""The capacity model of one trial candidate, as the trial records it (``results.candidates.NAME.
capacity_model``): fitted on every load step and probe the candidate ran so far
(:func:`servelab.capacity.evidence.from_trial_candidate`), validated leave-one-step-out
(:mod:`servelab.capacity.validate`), set against the trial's capacity search
(:mod:`servelab.capacity.agree`), and, when the experiment asks (``capacity.model_check``), checked at
one extra load point of its own choosing:

- the rate: where the model predicts the SLO breaks for probes like the search's (its probe-sized
  capacity); when the search's bracket is closed and that rate falls outside it, the middle of the
  bracket instead (the point the search left most uncertain);
- the prediction is made by the fit made *before* the probe ran, for the probe's own requests at their
  own send times, so the check is held out by construction.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from servelab.bench.analysis.slo import Objective
from servelab.capacity.agree import check_search
from servelab.capacity.evidence import StepEvidence, from_folder, from_trial_candidate
from servelab.capacity.fit import fit
from servelab.capacity.plan import meets
from servelab.capacity.results import CandidateCapacity, ModelCheck, PerfParams, SearchCheck
from servelab.capacity.simulate import simulate
from servelab.capacity.validate import predict_step, validate

__all__ = ["candidate_model", "check_point", "check_rate"]


def candidate_model(
    run_dir: str | Path,
    name: str,
    *,
    slots: int | None,
    probes: list[tuple[float, bool, str]],
    slo: list[Objective],
    burstiness: float = 1.0,
    bootstrap: int = 20,
    seed: int = 0,
) -> tuple[CandidateCapacity, list[PerfParams]] | None:
    """The :class:`CandidateCapacity` of ``name`` in the run folder (fit, validation, search check)
    and its bootstrap refits; ``None`` when it has no measured request. ``probes``: the search's
    ``(rate req/s, held, step)``."""
    steps = from_trial_candidate(run_dir, name)
    if not any(st.requests for st in steps):
        return None
    rep, boots = fit(steps, declared_slots=slots, bootstrap=bootstrap, seed=seed)
    search = (
        check_search(rep.params, boots[:5], steps, probes, slo, shape=burstiness, seed=seed) if probes and slo else None
    )
    return (
        CandidateCapacity(
            fit=rep,
            validation=validate(steps, declared_slots=slots, bootstrap=min(bootstrap, 10), seed=seed),
            search=search,
        ),
        boots,
    )


def check_rate(search: SearchCheck | None) -> tuple[float, str] | None:
    """The extra load point's rate (req/s) and why (module doc); ``None`` without a search check or a
    finite model capacity > 0. A rate the search already probed (same folder name, 4 significant
    digits) is moved halfway to the next probed rate above it (x1.25 when none), so the check measures
    a new point."""
    if search is None or not search.model_capacity_rps or not math.isfinite(search.model_capacity_rps):
        return None
    rate = search.model_capacity_rps
    reason = f"where the model predicts probes of {search.probe_requests} requests stop meeting the SLO"
    lo, hi = search.measured_held_rps, search.measured_broke_rps
    if lo is not None and hi is not None and not lo <= rate < hi:
        rate, reason = (
            (lo + hi) / 2,
            (
                f"the model's break rate {rate:.3g} req/s lies outside the search's bracket "
                f"[{lo:.3g}, {hi:.3g}): the bracket's middle"
            ),
        )
    probed = sorted(p.rate_rps for p in search.probes)
    if any(f"{r:.4g}" == f"{rate:.4g}" for r in probed):
        above = [r for r in probed if r > rate * (1 + 1e-9)]
        rate = (rate + above[0]) / 2 if above else rate * 1.25
        reason += "; moved off the rate the search already probed"
    return rate, reason


def check_point(
    p: PerfParams,
    boots: list[PerfParams],
    folder: str | Path,
    rate: float,
    reason: str,
    measured_held: bool,
    slo: list[Objective],
    fitted_on: list[str],
) -> ModelCheck:
    """The :class:`ModelCheck` of the probe measured in ``folder`` at ``rate`` under the model ``p``
    (intervals from ``boots``) fitted before it ran on ``fitted_on``."""
    steps: list[StepEvidence] = from_folder(Path(folder))
    if not steps:
        return ModelCheck(rate_rps=rate, reason=reason, measured_held=measured_held, note="no measured request")
    st = steps[0]
    check = predict_step(p, boots, st, fitted_on)
    rs = st.requests
    run = simulate(
        p,
        _arr([r.new_prompt for r in rs]),
        _arr([r.output for r in rs]),
        arrival_s=_arr([r.sent for r in rs]),
        extra_s=_arr([p.first_token_extra_s.get(r.workload, 0.0) for r in rs]),
    )
    return ModelCheck(
        rate_rps=rate, reason=reason, step=check, predicted_held=meets(run, slo), measured_held=measured_held
    )


def _arr(v: list[float] | list[int]) -> np.ndarray:
    return np.asarray(v, dtype=float)
