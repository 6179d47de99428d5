"""A ranked chat candidate's economics once every round ran: the arrival-run verdicts by interval, the
cost per output tokens and the replicas for the peak rate (:mod:`servelab.trial.economics`)."""

from __future__ import annotations

from servelab.bench.results import Interval
from servelab.trial.candidates import Candidate
from servelab.trial.context import TrialContext
from servelab.trial.results import CandidateResult

__all__ = ["economics"]


def economics(ctx: TrialContext, cand: Candidate, res: CandidateResult) -> None:
    """Arrival-run verdicts by interval, cost per 10k/1M output tokens and replicas for the peak
    (:mod:`servelab.trial.economics`) of a ranked candidate, into ``res``."""
    from servelab.trial.economics import cost, replicas
    from servelab.trial.verdicts import expected_rate_verdicts

    g = ctx.exp.goal
    if res.arrival_run is not None and not res.arrival_run.skipped:  # every round's run (trial.verdicts)
        res.arrival_verdicts = expected_rate_verdicts([res.arrival_run, *res.arrival_repeats], ctx.judged, res.steps)
    cap, eff = res.capacity, res.effective_throughput
    price = cand.price_per_hour if cand.price_per_hour is not None else g.budget.price_per_hour
    if cap is not None and cap.rate_rps is not None and cap.output_tokens_per_s:
        hi = cap.output_tokens_per_s * cap.broke_at_rps / cap.rate_rps if cap.broke_at_rps else None
        ci = Interval(lo=cap.output_tokens_per_s, hi=hi, level=1.0, n=len(cap.probes), method="bracket")
        res.cost = cost(
            price,
            g.budget.currency,
            cap.output_tokens_per_s,
            ci,
            f"capacity at the SLO, {cap.rate_rps:.3g} req/s open loop",
        )
    elif eff is not None:
        res.cost = cost(
            price,
            g.budget.currency,
            eff.output_tokens_per_s,
            eff.output_tokens_per_s_ci,
            f"effective throughput at {eff.at_step} (closed loop; no capacity search)",
        )
    peak = g.peak_rate_rps or g.expected_rate_rps
    if cap is not None and cap.rate_rps is not None:
        res.replicas = replicas(
            peak, g.headroom, cap.rate_rps, cap.broke_at_rps, "capacity at the SLO (open-loop search)"
        )
    elif eff is not None and eff.requests_per_s:
        rci = eff.requests_per_s_ci
        res.replicas = replicas(
            peak,
            g.headroom,
            rci.lo if rci is not None and rci.lo else eff.requests_per_s,
            rci.hi if rci is not None else None,
            f"completed requests/s at {eff.at_step} (closed loop; no capacity search)",
        )
