"""The decision's sentences: each reason a verdict gives, in plain words with its numbers and intervals.

One writer per kind of sentence — the ranked figure at the effective level with its SLO verdicts
(:func:`at_text`), why the climb stopped (:func:`beyond`), which tail figure ordered a tie
(:func:`tie_break_text`), why a candidate is excluded (:func:`exclude_reason`), capacity, the arrival
run, cost and replicas (:func:`extras`), the scope of validity and when to re-check
(:func:`scope_text`) and what the method and budget allowed (:func:`budget_note`). No rule is decided
here: the ranking is :mod:`servelab.trial.decide.decision`'s.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.bench.results import Interval
from servelab.trial.decide.compare import figure, tail
from servelab.trial.decide.effective import arrival_broken, level_key, weakest
from servelab.trial.decide.fmt import fmt_ci, fmt_obj_value, metric_of, num, span
from servelab.trial.decide.identities import engine_facts, identity_factors
from servelab.trial.lifecycle import cancellation_text
from servelab.trial.results import (
    CandidateIdentity,
    CandidateResult,
    EffectiveThroughput,
    EnvironmentRow,
    GoalRow,
    MethodRow,
)
from servelab.trial.verdicts import MIX


def slo_at(c: CandidateResult) -> str:
    """``ttft_p95 1.9 s ≤ 3 s (95 % CI 1.2–unbounded s: undetermined), …`` at the effective level."""
    parts = []
    for ov in c.slo_verdicts:
        m = metric_of(ov.objective)
        unit = "" if m.startswith("error_rate") else " s"
        ci = ov.ci
        if m.startswith("error_rate") and ci is not None:
            ci = Interval(
                lo=None if ci.lo is None else ci.lo * 100,
                hi=None if ci.hi is None else ci.hi * 100,
                level=ci.level,
                n=ci.n,
                method=ci.method,
            )
            unit = "%"
        lim = f" ≤ {fmt_obj_value(m, ov.limit)}" if ov.limit is not None else ""
        parts.append(f"{m} {fmt_obj_value(m, ov.value)}{lim}{fmt_ci(ci, unit)[:-1]}: {ov.verdict})")
    return ", ".join(parts)


def at_text(c: CandidateResult, metric: str) -> str:
    e = c.effective_throughput or EffectiveThroughput()
    at = e.at_step or c.max_step_meeting_slo
    unit = " tok/s" if metric == "output_tokens_per_s" else " req/s"
    ci = e.output_tokens_per_s_ci if metric == "output_tokens_per_s" else e.requests_per_s_ci
    val = figure(c, metric)
    what = f"{num(val)}{unit}{fmt_ci(ci, unit)}"
    how = [
        x
        for x in (
            f"workload {e.workload}" if e.workload else None,
            e.basis,
            f"{e.repeats} repeat(s)" if e.repeats else None,
        )
        if x
    ]
    slo = slo_at(c)
    return f"{what} at {at}" + (f" ({', '.join(how)})" if how else "") + (f"; SLO: {slo}" if slo else "")


def broke_text(c: CandidateResult) -> str:
    return "; ".join(b.text or str(b.objective) for b in c.broken_by)


def beyond(c: CandidateResult) -> str:
    at = c.max_step_meeting_slo
    if c.broken_at:
        why = broke_text(c)
        return f"load beyond {at} broke the SLO at {c.broken_at}" + (f": {why}" if why else "")
    steps = [s for s in c.ran_steps() if s.workload == (c.ranked_on or s.workload)]
    top = steps and max(steps, key=lambda s: level_key(str(s.step), s, 0)).step
    return f"no SLO broke up to {top or at}, the highest step run: its capacity at the SLO may be higher"


def tie_break_text(win: CandidateResult, lose: CandidateResult) -> str:
    """Which tail figure ordered ``win`` before ``lose``, with both point values and whether their 95 %
    intervals are apart (a significant latency difference) or not (the order is the rule's, not a measured
    difference: an interval overlapping the other, or unbounded on the side that would tell)."""
    for key, label in (("ttft_p95_s", "TTFT P95"), ("e2e_p99_s", "E2E P99")):
        a, b = tail(win, key), tail(lose, key)
        if a != b:
            ci_key = key.removesuffix("_s") + "_ci"
            ca = getattr(win.tail_latency, ci_key) if win.tail_latency is not None else None
            cb = getattr(lose.tail_latency, ci_key) if lose.tail_latency is not None else None
            if ca is None or cb is None:
                how = "no interval for both, so not a shown difference"
            elif ca.hi is not None and cb.lo is not None and ca.hi < cb.lo:
                how = f"95 % CIs apart: {span(ca)} vs {span(cb)} s"
            else:
                how = f"95 % CIs {span(ca)} vs {span(cb)} s overlap, so not a shown difference either"
            return f"lower {label}: {num(a)} s vs {num(b)} s ({how})"
    return "equal tail latency; ordered by throughput, then name"


def exclude_reason(c: CandidateResult) -> str:
    status = c.status
    reason = (c.reason or "").strip()
    if status in ("excluded", "failed"):
        if reason.lower().startswith(status):
            return reason
        return f"{status}: {reason or 'no reason recorded'}"
    if c.max_step_meeting_slo is not None and (bad := arrival_broken(c)):
        where = c.arrival_run.step if c.arrival_run is not None else "the expected rate"
        return (
            "broke the SLO at the expected rate ("
            + where
            + ", bursts and mix), by its 95 % interval: "
            + "; ".join(
                f"{v.objective} was {fmt_obj_value(metric_of(v.objective), v.value)}"
                f"{fmt_ci(v.ci)}" + (f", {v.note}" if v.note else "")
                for v in bad
            )
        )
    if c.ranked_on is None and len({s.workload for s in c.steps if s.workload != MIX}) > 1:
        why = (
            "the mix run together was skipped: "
            + next(s.skipped_reason or "skipped" for s in c.steps if s.workload == MIX)
            if any(s.workload == MIX for s in c.steps)
            else "no mix was run together (mix_sweep: false)"
        )
        return (
            "not ranked: its workloads ran one after another and never together, so no figure says "
            f"what the engine sustained (sums of separate runs are not used); {why}"
        )
    why = broke_text(c)
    at = c.broken_at
    if why:
        return f"no load step met the SLO: {why}" + (f" at {at}" if at else "")
    return "no load step met the SLO: no load step was run" if not at else f"no load step met the SLO (broke at {at})"


def scope_text(
    identities: Mapping[str, CandidateIdentity],
    goal: GoalRow | None,
    environment: EnvironmentRow | None,
    method: MethodRow | None,
) -> tuple[str, list[str]]:
    weights: dict[str, list[str]] = {}
    builds: dict[str, list[str]] = {}
    for name, ident in identities.items():
        f = identity_factors(ident)
        w = f.get("model.sha256")
        weights.setdefault(f"sha256 {str(w)[:12]}" if w else "sha256 unknown", []).append(name)
        e = engine_facts(ident.engine)
        desc = " ".join(str(x) for x in (e.kind, e.version) if x) or "unknown engine"
        desc += f" (binary sha256 {str(e.binary_sha256)[:12]})" if e.binary_sha256 else ""
        builds.setdefault(desc, []).append(name)

    def _list(d: dict[str, list[str]]) -> str:
        if len(d) == 1:
            return next(iter(d))
        return "; ".join(f"{k} [{', '.join(v)}]" for k, v in d.items())

    env = environment or EnvironmentRow()
    host = env.host
    hdesc = str(host.cpu or "unknown CPU")
    extra = []
    if host.logical_cores:
        extra.append(f"{host.logical_cores} logical cores")
    if host.ram_bytes:
        extra.append(f"{host.ram_bytes / 2**30:.1f} GiB RAM")
    if env.gpu:
        extra.append(f"GPU {env.gpu}")
    if extra:
        hdesc += f" ({', '.join(extra)})"
    g = goal or GoalRow()
    wtxt = ", ".join(method.workloads) if method is not None and method.workloads else (g.mix or "")
    stxt = ", ".join(g.slo)
    scope = (
        f"valid for: weights {_list(weights) if weights else 'unknown'}; engine builds "
        f"{_list(builds) if builds else 'unknown'}; host {hdesc}; workloads {wtxt or 'unknown'}; "
        f"SLO {stxt or 'as recorded per step'}"
    )
    recheck = [
        "the engine binary or version changes (another build, image or kernel)",
        "the weights change (another file, quantization or revision: sha256 differs)",
        f"the host changes (now {hdesc})",
        "the SLO, the workload mix or the prompt/output lengths change",
    ]
    if g.expected_rate_rps is not None:
        recheck.append(f"the request rate or its burstiness moves away from {num(float(g.expected_rate_rps))} req/s")
    return scope, recheck


def extras(c: CandidateResult, currency: str) -> list[str]:
    """Sentences on capacity in req/s, the arrival run, cost and replicas, and the cancellation
    measurement (:func:`servelab.trial.lifecycle.cancellation_text`) when it passed (a failed one is the
    exclusion's reason), when the record has them."""
    out = []
    cancel = c.lifecycle.cancellation if c.lifecycle is not None else None
    if cancel is not None and cancel.verdict == "pass":
        out.append(cancellation_text(cancel))
    cap = c.capacity
    if cap is not None:
        if cap.rate_rps is not None:
            hi = f"{num(cap.broke_at_rps)} req/s broke" if cap.broke_at_rps is not None else "no rate tried broke"
            out.append(
                f"capacity at the SLO: {num(cap.rate_rps)} req/s held (open loop, {cap.arrival or 'poisson'} "
                f"arrivals, {len(cap.probes)} probes; {hi}: the capacity lies in "
                f"[{num(cap.rate_rps)}, {num(cap.broke_at_rps) if cap.broke_at_rps else '∞'}) req/s, "
                "the resolution of the search, not a confidence interval)"
            )
        elif cap.note:
            out.append(f"capacity at the SLO: {cap.note}")
    arr = c.arrival_run
    if arr is not None and not arr.skipped and c.arrival_verdicts:
        worst = weakest([v.verdict for v in c.arrival_verdicts])
        bad = [v.objective for v in c.arrival_verdicts if v.verdict == "broken"]
        runs = 1 + sum(not r.skipped for r in c.arrival_repeats)
        out.append(
            f"at the expected rate ({arr.step}, bursts and mix, {runs} run(s)) the SLO is {worst}"
            + (f": broken {', '.join(bad)}" if bad else "")
        )
        for v in c.arrival_verdicts:
            if v.confirm or (v.rule == "each-run" and v.verdict == "undetermined" and "broken" in v.run_verdicts):
                out.append(f"{v.objective} at the expected rate: {v.note}")
    cost = c.cost
    if cost is not None and cost.per_10k_output_tokens is not None:
        ci = cost.per_10k_ci
        what = "search resolution" if ci is not None and ci.method == "bracket" else "95 % CI"
        rng = f" ({what} {ci.lo:.4g}–{ci.hi:.4g})" if ci is not None and ci.lo is not None and ci.hi is not None else ""
        out.append(
            f"cost {cost.per_10k_output_tokens:.4g} {cost.currency or currency} per 10k output tokens{rng}, "
            f"{cost.per_1m_output_tokens:.4g} per 1M, at {num(cost.tokens_per_s)} tok/s ({cost.basis}) "
            f"and {cost.price_per_hour:g} {cost.currency or currency}/h"
        )
    rep = c.replicas
    if rep is not None and rep.replicas is not None:
        what = "from the search's resolution" if cap is not None and cap.rate_rps is not None else "95 % CI"
        rr = f" ({what} {rep.lo}–{rep.hi})" if rep.lo is not None and rep.hi is not None and rep.lo != rep.hi else ""
        out.append(
            f"{rep.replicas} replica(s){rr} for the peak of {num(rep.peak_rps)} req/s at "
            f"{num(rep.headroom * 100)}% headroom ({rep.basis})"
        )
    return out


def budget_note(method: MethodRow | None) -> str | None:
    """What the trial's method and time budget allowed, in one sentence (``None`` without a method row)."""
    if method is None:
        return None
    parts = [
        f"{method.requests_per_step} requests per load step" if method.requests_per_step else None,
        (
            f"{method.repeats} interleaved round(s) of the ranked mix level"
            if method.mix_sweep
            else "no mix run together"
        )
        if method.repeats is not None
        else None,
        (
            f"a capacity search of at most {method.capacity_search.get('max_probes')} probes of "
            f"{method.capacity_search.get('requests')} requests"
            if method.capacity_search
            else "no capacity search"
        )
        if method.repeats is not None
        else None,
    ]
    b = method.budget
    if b is not None:
        parts.append(
            f"within a {b.limit_s / 60:g}-minute budget"
            + (f" (spent: not run {', '.join(b.skipped)})" if b.skipped else "")
        )
    text = ", ".join(p for p in parts if p)
    if not text:
        return None
    small = method.requests_per_step is not None and method.requests_per_step < 72
    return (
        "the trial ran "
        + text
        + (
            "; with fewer than 72 requests a P95 has no upper confidence bound, so an SLO on it can be shown "
            "broken but not met ('undetermined')"
            if small
            else ""
        )
    )
