"""The plan for a traffic profile from a fitted model (:mod:`servelab.capacity.fit`), by simulation
(:mod:`servelab.capacity.simulate`), 003 §21:

- **capacity per replica**: the highest arrival rate (requests/s; the profile's arrival process and
  lengths, :data:`SIM_REQUESTS` requests) at which every latency objective of the SLO holds in the
  simulation (TTFT/E2E percentiles; ITL judged by TPOT), by bisection below the saturation rate
  (closed loop at twice the slots). Its interval: the same search under each bootstrap refit
  (:func:`servelab.capacity.bootci.boot_interval`: the refits' 2.5-97.5 % range, holding the point).
- **replicas** ``ceil(λ_off / (capacity * (1 - headroom)))``, traffic spread evenly (each replica sees
  ``λ_off / N``); ``replicas_hi`` from the low end of the capacity's interval (never below ``replicas``,
  as the interval holds the capacity).
- **burst headroom**: at ``burst_factor`` x the peak each replica gets ``K λ_off / N``; above its
  capacity the queue grows at the excess rate, and a request waits ``queue / μ`` (μ the saturation
  rate), so TTFT P95 reaches its limit after ``T = slack * μ / (K λ_off / N - capacity)``, ``slack`` =
  TTFT limit - predicted TTFT P95 at the peak (fluid approximation of an overloaded queue: Newell,
  *Applications of Queueing Theory*, 2nd ed., 1982, ch. 2).
- **devices** ``N * devices_per_replica``, **hosts** ``ceil(devices / devices_per_host)``.
- **cost** per hour ``N * price_per_hour``; per 1M output tokens ``24 * cost/h / (λ_mean * 86400 *
  E[output]) * 1e6`` (replicas sized for the peak run all day; no autoscaling); per user per month
  ``30 * 24 * cost/h / DAU``.
- **what-if**: peak x2, outputs x2, long share +10 points (capacity searched again where lengths change).
- **tiers**: each tier's candidate planned for its share of the traffic and its tasks' lengths; the
  blended cost against the strong tier taking everything.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from servelab.bench.analysis.slo import Objective, parse_slo
from servelab.capacity.bootci import boot_interval
from servelab.capacity.peak import peak_load
from servelab.capacity.profile import Lengths, Task, TrafficProfile
from servelab.capacity.results import CandidatePlan, PerfParams, TierPlan, WhatIf
from servelab.capacity.simulate import SimRun, arrivals, simulate

__all__ = ["SIM_REQUESTS", "Draws", "Workload", "boot_interval", "capacity", "meets", "plan_candidate", "plan_tiers"]

#: requests per simulated run of the plan (enough for a P95 of ~20 values above it)
SIM_REQUESTS = 400


class Workload:
    """Request lengths to simulate: ``tasks`` (each its share and lengths) of ``profile``, or the
    profile's own lengths; ``out_scale`` multiplies outputs, ``long_share`` overrides the profile's."""

    def __init__(
        self,
        profile: TrafficProfile,
        tasks: list[Task] | None = None,
        out_scale: float = 1.0,
        long_share: float | None = None,
    ) -> None:
        self.p, self.tasks, self.out_scale = profile, tasks or [], out_scale
        self.long_share = profile.long_share if long_share is None else min(long_share, 1.0)

    def _one(self, inp: Lengths, out: Lengths, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        prompt = inp.sample(n, rng)
        if self.long_share > 0 and self.p.long_input_tokens is not None:
            long = rng.random(n) < self.long_share
            prompt = np.where(long, self.p.long_input_tokens.sample(n, rng), prompt)
        return prompt, np.maximum(1.0, np.round(out.sample(n, rng) * self.out_scale))

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n`` (prompt, output) token counts and first-token extras (s; none for a profile's tasks)."""
        if not self.tasks:
            return (*self._one(self.p.inputs(), self.p.outputs(), n, rng), np.zeros(n))
        shares = np.asarray([t.share for t in self.tasks])
        which = rng.choice(len(self.tasks), n, p=shares / shares.sum())
        prompt, out = np.zeros(n), np.zeros(n)
        for k, t in enumerate(self.tasks):
            a, b = self._one(t.input_tokens or self.p.inputs(), t.output_tokens or self.p.outputs(), n, rng)
            prompt = np.where(which == k, a, prompt)
            out = np.where(which == k, b, out)
        return prompt, out, np.zeros(n)

    def mean_output(self) -> float:
        """E[output tokens] of this workload."""
        if not self.tasks:
            return self.p.outputs().expected() * self.out_scale
        tot = sum(t.share for t in self.tasks)
        return (
            sum(t.share * (t.output_tokens or self.p.outputs()).expected() for t in self.tasks) / tot * self.out_scale
        )


def _stat(run: SimRun, o: Objective) -> float | None:
    vals = {"ttft": run.ttft, "e2e": run.e2e, "tpot": run.tpot, "itl": run.tpot}.get(o.metric)
    if vals is None:
        return None
    q = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "max": 100, "mean": None}.get(o.stat, 95)
    return float(np.mean(vals)) if q is None else float(np.percentile(vals, q))


def _meets(run: SimRun, slo: list[Objective]) -> bool:
    return all((v := _stat(run, o)) is None or v <= o.limit for o in slo)


class Draws(Protocol):
    """Request lengths to simulate: ``draw(n, rng)`` -> (prompt tokens, output tokens, extra s)."""

    def draw(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


def _run(p: PerfParams, wl: Draws, rate: float, seed: int, shape: float) -> SimRun:
    rng = np.random.default_rng(seed)
    prompt, out, extra = wl.draw(SIM_REQUESTS, rng)
    return simulate(p, prompt, out, arrival_s=arrivals(rate, SIM_REQUESTS, rng, shape), extra_s=extra)


def meets(run: SimRun, slo: list[Objective]) -> bool:
    """Whether every latency objective of ``slo`` holds on ``run`` (ITL judged by TPOT)."""
    return _meets(run, slo)


def saturation_rps(p: PerfParams, wl: Draws, seed: int = 0) -> float:
    """Requests/s the replica completes with every slot busy (closed loop at twice the slots)."""
    rng = np.random.default_rng(seed)
    prompt, out, extra = wl.draw(SIM_REQUESTS // 2, rng)
    run = simulate(p, prompt, out, concurrency=max(2, 2 * p.slots), extra_s=extra)
    if run.window_s <= 0:
        raise ValueError(
            "the performance model serves requests in no time (prefill and decode both fitted to 0 s),"
            " so it has no saturation rate; fit it on requests whose first token and later tokens took measurable time"
        )
    return len(prompt) / run.window_s


def capacity(
    p: PerfParams, wl: Draws, slo: list[Objective], shape: float = 1.0, seed: int = 0, iterations: int = 10
) -> tuple[float, float]:
    """``(capacity at the SLO, saturation)`` of one replica, requests/s (module doc); 0 when even a
    light load breaks the SLO."""
    mu = saturation_rps(p, wl, seed)
    lo, hi = 0.0, mu
    if _meets(_run(p, wl, mu, seed, shape), slo):
        return mu, mu
    for _ in range(iterations):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _meets(_run(p, wl, mid, seed, shape), slo) else (lo, mid)
    return lo, mu


def _replicas(rate: float, cap: float, headroom: float) -> int | None:
    """Replicas for ``rate`` req/s at ``cap`` req/s each (module doc); ``None`` when either is not a
    finite number > 0 (``rate`` 0: one replica)."""
    if not (math.isfinite(rate) and math.isfinite(cap)) or cap <= 0 or rate < 0:
        return None
    return max(1, math.ceil(rate / (cap * (1 - headroom)) - 1e-9))


def plan_candidate(
    name: str,
    p: PerfParams,
    boots: list[PerfParams],
    profile: TrafficProfile,
    *,
    rate_rps: float | None = None,
    tasks: list[Task] | None = None,
    seed: int = 0,
    what_if: bool = True,
) -> CandidatePlan:
    """The :class:`CandidatePlan` of ``name`` with model ``p`` (intervals from ``boots``) at ``rate_rps``
    (default: the profile's offered peak) with ``tasks``' lengths (module doc)."""
    slo = parse_slo(",".join(profile.slo))
    shape = profile.burstiness
    wl = Workload(profile, tasks)
    peak = peak_load(profile)
    rate = peak.offered_peak_rps.value if rate_rps is None else rate_rps
    share = rate / peak.offered_peak_rps.value if peak.offered_peak_rps.value else 1.0
    cap, mu = capacity(p, wl, slo, shape, seed)
    caps = [capacity(b, wl, slo, shape, seed)[0] for b in boots]
    civ = boot_interval(caps, cap)
    dep = profile.deployments.get(name)
    out = CandidatePlan(
        candidate=name,
        rate_rps=rate,
        capacity_per_replica_rps=cap,
        capacity_ci=civ,
        saturation_rps=mu,
        headroom=profile.headroom,
        burst_factor=profile.burst_factor,
        currency=profile.currency,
    )
    n = _replicas(rate, cap, profile.headroom)
    if n is None:
        out.notes.append("no arrival rate meets the SLO in the simulation: the SLO is out of this candidate's reach")
        return out
    out.replicas = n
    out.replicas_hi = _replicas(rate, civ.lo, profile.headroom) if civ and civ.lo else None
    at_peak = _run(p, wl, rate / n, seed, shape)
    out.predicted_ttft_p95_s = float(np.percentile(at_peak.ttft, 95))
    out.predicted_e2e_p50_s = float(np.percentile(at_peak.e2e, 50))
    _burst(out, slo, rate / n)
    per = dep or None
    if per is not None:
        out.devices = n * per.devices_per_replica
        out.hosts = math.ceil(out.devices / per.devices_per_host)
        if per.price_per_hour is not None:
            out.cost_per_hour = n * per.price_per_hour
            daily_out = peak.mean_rps.value * share * 86400 * wl.mean_output()
            out.cost_per_1m_output = 24 * out.cost_per_hour / daily_out * 1e6 if daily_out else None
            out.cost_per_user_month = 30 * 24 * out.cost_per_hour / profile.daily_active_users
    else:
        out.notes.append(f"no deployments.{name} in the profile: devices, hosts and cost left out")
    if what_if:
        out.what_if = _what_ifs(name, p, profile, tasks, rate, cap, seed)
    return out


def _burst(out: CandidatePlan, slo: list[Objective], per_replica: float) -> None:
    cap, mu, k = out.capacity_per_replica_rps or 0.0, out.saturation_rps or 0.0, out.burst_factor
    ttft = next((o for o in slo if o.metric == "ttft"), None)
    load = k * per_replica
    if load <= cap:
        out.burst_note = f"a {k:g}x burst ({load:.3g} req/s per replica) stays within capacity: it can last"
        return
    if ttft is None or out.predicted_ttft_p95_s is None:
        out.burst_note = f"a {k:g}x burst exceeds capacity; no TTFT objective to time it against"
        return
    slack = max(0.0, ttft.limit - out.predicted_ttft_p95_s)
    out.burst_holds_s = slack * mu / (load - cap)
    out.burst_note = (
        f"a {k:g}x burst ({load:.3g} req/s per replica > capacity {cap:.3g}) breaks TTFT "
        f"{ttft.stat} after ~{out.burst_holds_s:.3g} s = {slack:.3g} s slack * {mu:.3g} req/s / "
        f"{load - cap:.3g} req/s excess"
    )


def _what_ifs(
    name: str, p: PerfParams, profile: TrafficProfile, tasks: list[Task] | None, rate: float, cap: float, seed: int
) -> list[WhatIf]:
    dep = profile.deployments.get(name)
    slo = parse_slo(",".join(profile.slo))
    k = profile.burstiness
    rows = [
        ("peak x2", rate * 2, cap),
        ("outputs x2", rate, capacity(p, Workload(profile, tasks, out_scale=2.0), slo, k, seed)[0]),
        (
            "long share +10 points",
            rate,
            capacity(p, Workload(profile, tasks, long_share=profile.long_share + 0.1), slo, profile.burstiness, seed)[0]
            if profile.long_input_tokens is not None
            else cap,
        ),
    ]
    out = []
    for change, r, c in rows:
        n = _replicas(r, c, profile.headroom)
        out.append(
            WhatIf(
                change=change,
                offered_peak_rps=r,
                replicas=n,
                devices=n * dep.devices_per_replica if n and dep else None,
                cost_per_hour=n * dep.price_per_hour if n and dep and dep.price_per_hour is not None else None,
            )
        )
    return out


def plan_tiers(
    profile: TrafficProfile, models: dict[str, tuple[PerfParams, list[PerfParams]]], seed: int = 0
) -> TierPlan | None:
    """The :class:`TierPlan` of a profile that routes tasks to tiers (``None`` without tasks, or when a
    tier's candidate has no model in ``models``)."""
    if not profile.tasks or any(c not in models for c in profile.tiers.values()):
        return None
    off = peak_load(profile).offered_peak_rps.value
    tp = TierPlan(tiers={})  # set, so the JSON report (exclude_unset) keeps the tiers filled in below
    for tier, cand in profile.tiers.items():
        tasks = [t for t in profile.tasks if t.tier == tier]
        if not tasks:
            continue
        p, boots = models[cand]
        tp.tiers[tier] = plan_candidate(
            cand, p, boots, profile, rate_rps=off * sum(t.share for t in tasks), tasks=tasks, seed=seed, what_if=False
        )
    costs = [t.cost_per_hour for t in tp.tiers.values()]
    tp.blended_cost_per_hour = sum(c for c in costs if c is not None) if all(c is not None for c in costs) else None
    strong = profile.strong_tier or list(profile.tiers)[-1]
    cand = profile.tiers[strong]
    p, boots = models[cand]
    everything = [t.model_copy(update={"tier": strong}) for t in profile.tasks]
    tp.all_strong = plan_candidate(cand, p, boots, profile, tasks=everything, seed=seed, what_if=False)
    if tp.blended_cost_per_hour is not None and tp.all_strong.cost_per_hour:
        tp.saving = 1 - tp.blended_cost_per_hour / tp.all_strong.cost_per_hour
    return tp
