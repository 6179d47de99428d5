"""The model against the trial's own capacity search (:mod:`servelab.trial.capacity`): does the
simulated replica hold where the engine held, and break where it broke?

- **per probe**: each measured probe (an open-loop run at a rate) is simulated with its own requests
  (new prompt and output tokens, each with its workload's first-token cost) at their measured send
  times, and the SLO's latency objectives are judged on the simulated run as the trial judged the
  measured one (percentiles of the run; ITL by TPOT). ``agrees`` when both verdicts match.
- **capacity**: a probe of a handful of requests is a transient: its queue has no time to build, so
  it holds at rates a sustained load would not. The search's bracket ``[highest held, lowest broke)``
  is therefore set against what the search would find under the model (:func:`probe_sized_capacity`:
  each probe's own requests in its own send pattern, scaled in rate), with the interval of the same
  search under each bootstrap refit. It agrees when the bracket and that interval overlap. The *sustained*
  capacity (:func:`servelab.capacity.plan.capacity`, :data:`~servelab.capacity.plan.SIM_REQUESTS`
  requests: what the plan uses) is reported beside it; the gap between the two is how far the
  search's short probes overstate what the engine holds all hour.
"""

from __future__ import annotations

import numpy as np

from servelab.bench.analysis.slo import Objective
from servelab.capacity.bootci import boot_interval
from servelab.capacity.evidence import Obs, StepEvidence
from servelab.capacity.plan import capacity, meets
from servelab.capacity.results import PerfParams, ProbeCheck, SearchCheck
from servelab.capacity.simulate import simulate

__all__ = ["EvidenceDraws", "check_search"]


class EvidenceDraws:
    """Requests resampled (with replacement) from measured ones: their new prompt and output tokens
    and their workload's first-token extra under ``p`` (s)."""

    def __init__(self, requests: list[Obs], p: PerfParams) -> None:
        self.prompt = np.asarray([r.new_prompt for r in requests], dtype=float)
        self.output = np.asarray([r.output for r in requests], dtype=float)
        self.extra = np.asarray([p.first_token_extra_s.get(r.workload, 0.0) for r in requests])

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` requests drawn at random from the measured ones."""
        k = rng.integers(0, len(self.prompt), n)
        return self.prompt[k], self.output[k], self.extra[k]


def _held_at(p: PerfParams, st: StepEvidence, rate: float, probe_rate: float, slo: list[Objective]) -> bool:
    rs = st.requests
    run = simulate(
        p,
        np.asarray([r.new_prompt for r in rs], dtype=float),
        np.asarray([r.output for r in rs], dtype=float),
        arrival_s=np.asarray([r.sent for r in rs]) * (probe_rate / rate),
        extra_s=np.asarray([p.first_token_extra_s.get(r.workload, 0.0) for r in rs]),
    )
    return meets(run, slo)


def probe_sized_capacity(
    p: PerfParams, templates: list[tuple[StepEvidence, float]], slo: list[Objective], seed: int = 0
) -> float:
    """What the trial's search would find under the model: for each measured probe (its requests and
    its send times, ``(step, rate req/s)``) the highest rate at which the same requests, sent in the
    same pattern scaled to that rate, meet the SLO (doubling from the slowest probe's rate, then 10
    bisections); the median over the probes, req/s (0 when none holds at any rate)."""
    found = []
    for st, rate0 in templates:
        lo, hi = 0.0, rate0
        for _ in range(10):
            if not _held_at(p, st, hi, rate0, slo):
                break
            lo, hi = hi, hi * 2
        else:
            found.append(lo)
            continue
        for _ in range(10):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if _held_at(p, st, mid, rate0, slo) else (lo, mid)
        found.append(lo)
    return float(np.median(found)) if found else 0.0


def check_search(
    p: PerfParams,
    boots: list[PerfParams],
    steps: list[StepEvidence],
    probes: list[tuple[float, bool, str]],
    slo: list[Objective],
    *,
    shape: float = 1.0,
    seed: int = 0,
) -> SearchCheck | None:
    """The :class:`SearchCheck` of model ``p`` (intervals from ``boots``) against the measured
    ``probes`` (rate req/s, held, step folder name such as ``r0.5``) whose requests are among
    ``steps`` (labels ``capacity/<step>:...``); ``None`` when no probe's requests are there."""
    by_step = {
        st.label.split(":", 1)[0].removeprefix("capacity/"): st for st in steps if st.label.startswith("capacity/")
    }
    checks, found = [], []
    for rate, held, step in probes:
        st = by_step.get(f"r{rate:.4g}") or by_step.get(step)  # the trial's folder name, else the step label
        if st is None:
            continue
        pred = _held_at(p, st, rate, rate, slo)
        checks.append(
            ProbeCheck(rate_rps=rate, step=step, measured_held=held, predicted_held=pred, agrees=pred == held)
        )
        found.append(st)
    if not checks:
        return None
    reqs = [r for st in found for r in st.requests]
    n = max(len(st.requests) for st in found)
    templates = [(st, c.rate_rps) for st, c in zip(found, checks, strict=True)]
    sustained, _ = capacity(p, EvidenceDraws(reqs, p), slo, shape, seed)
    cap = probe_sized_capacity(p, templates, slo, seed)
    caps = [probe_sized_capacity(b, templates, slo, seed) for b in boots]
    civ = boot_interval(caps, cap)
    held_rates = [c.rate_rps for c in checks if c.measured_held]
    broke_rates = [c.rate_rps for c in checks if not c.measured_held]
    lo = max(held_rates) if held_rates else None
    hi = min(broke_rates) if broke_rates else None
    m_lo = civ.lo if civ and civ.lo is not None else cap
    m_hi = civ.hi if civ and civ.hi is not None else cap
    m_lo, m_hi = min(m_lo, cap), max(m_hi, cap)
    overlaps = (lo is None or m_hi >= lo) and (hi is None or m_lo < hi)
    return SearchCheck(
        probes=checks,
        measured_held_rps=lo,
        measured_broke_rps=hi,
        model_capacity_rps=cap,
        model_capacity_ci=civ,
        probe_requests=n,
        sustained_capacity_rps=sustained,
        agrees=overlaps and all(c.agrees for c in checks),
        probes_agreeing=sum(c.agrees for c in checks),
    )
