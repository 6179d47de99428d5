"""``servelab capacity PROFILE [--record RUN] [--bench [NAME=]DIR]``: the profile's peak load (with
formulas); with evidence, each candidate's fitted model, its held-out validation and the plan
(replicas, burst headroom, devices, cost, what-if), and the tier plan when the profile routes tasks.
``--json FILE`` writes the :class:`~servelab.capacity.results.CapacityReport`."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import typer

from servelab.bench.analysis.slo import parse_slo
from servelab.bench.results import Interval
from servelab.capacity.agree import check_search
from servelab.capacity.bootci import MIN_REFITS, refits_text
from servelab.capacity.evidence import StepEvidence, declared_slots, from_bench, from_trial_candidate
from servelab.capacity.fit import fit
from servelab.capacity.peak import peak_load
from servelab.capacity.plan import plan_candidate, plan_tiers
from servelab.capacity.profile import load_profile
from servelab.capacity.results import (
    CandidateCapacity,
    CandidatePlan,
    CapacityReport,
    FitReport,
    PerfParams,
    SearchCheck,
    Validation,
)
from servelab.capacity.validate import validate
from servelab.wire.errors import ConfigError

__all__ = ["Evidence", "capacity_command", "evidence_of"]


@dataclass
class Evidence:
    """One candidate's measured steps, its declared slot limit, and (from a trial) its capacity
    search's probes ``(rate req/s, held, step)`` with the goal's SLO and burstiness."""

    steps: list[StepEvidence]
    slots: int | None = None
    probes: list[tuple[float, bool, str]] = field(default_factory=list)
    slo: list[str] = field(default_factory=list)
    burstiness: float = 1.0


def evidence_of(records: list[str], benches: list[str]) -> dict[str, Evidence]:
    """Candidate name -> its :class:`Evidence` from trial run folders and bench folders (``NAME=DIR``
    or ``DIR``, named by the folder). Raises :class:`ConfigError` for a folder without evidence."""
    from servelab.trial.results import read_record

    out: dict[str, Evidence] = {}
    for r in records:
        rec = read_record(r)
        run = Path(r) if Path(r).is_dir() else Path(r).parent
        for name in rec.names():
            steps = from_trial_candidate(run, name)
            if not steps:
                continue
            if name in out:
                raise ConfigError(f"--record {r}: candidate {name!r} is also in an earlier --record; give each once")
            slots = declared_slots(rec.ident(name).settings)
            res = rec.results.candidates.get(name)
            cap = res.capacity if res is not None else None
            probes = [(pr.rate_rps, pr.held, pr.step) for pr in (cap.probes if cap else []) if pr.step]
            slo = [o for o in rec.goal.slo if ":" not in o.split("<")[0]]  # per-workload ones left out
            out[name] = Evidence(steps, slots, probes, slo, rec.goal.burstiness or 1.0)
        if not out:
            raise ConfigError(f"{r}: no candidate of this trial has measured load steps to fit a model on")
    for b in benches:
        name, _, folder = b.rpartition("=")
        name = name or Path(folder).name
        if name in out:
            raise ConfigError(
                f"--bench {b}: the candidate name {name!r} is already given (by --record or --bench); "
                "name each evidence folder differently, as NAME=DIR"
            )
        out[name] = Evidence(from_bench(folder))
    return out


def _iv(ci: object, refits: int, scale: float = 1.0, fmt: str = ".3g") -> str:
    """``ci`` (over ``refits`` bootstrap refits; its ``n`` counts requests, not refits) as report text:
    a 95 % CI from :data:`MIN_REFITS` refits up, else the range of those refits."""
    lo, hi = getattr(ci, "lo", None), getattr(ci, "hi", None)
    if lo is None or hi is None:
        return ""
    label = "95 % CI" if refits >= MIN_REFITS else f"range of {refits} refits"
    return f" ({label} {lo * scale:{fmt}}–{hi * scale:{fmt}})"


def _refits_iv(ci: Interval | None, fmt: str = ".4g") -> str:
    """An interval over simulated refits (``n`` the refits) with its number of refits (:mod:`bootci`)."""
    if ci is None or ci.lo is None or ci.hi is None:
        return ""
    return f" ({refits_text(ci, f'{ci.lo:{fmt}}', f'{ci.hi:{fmt}}')})"


def _print_fit(name: str, f: FitReport, refits: int) -> None:
    p: PerfParams = f.params
    rate = (
        "not identifiable"
        if p.prefill_tokens_per_s is None
        else f"{p.prefill_tokens_per_s:.4g} tok/s{_iv(f.prefill_rate_ci, refits)}"
    )
    print(
        f"{name}: model fitted on {f.requests} requests ({', '.join(f.steps)}), {f.token_gaps} token gaps; "
        f"intervals from {refits} bootstrap refits"
    )
    print(f"  prefill: {p.prefill_base_s * 1e3:.3g} ms{_iv(f.prefill_base_ci, refits, 1e3)} + prompt / {rate}")
    print(
        f"  decode: {p.decode_base_s * 1e3:.3g} ms/token{_iv(f.decode_base_ci, refits, 1e3)} + "
        f"{p.decode_per_running_s * 1e3:.3g} ms{_iv(f.decode_per_running_ci, refits, 1e3)} per other running request"
    )
    print(
        f"  slots: {p.slots} ({'identified' if p.slots_identified else 'lower bound'}; seen {f.seen_slots}"
        f"{'' if f.declared_slots is None else f', declared {f.declared_slots}'})"
    )
    for n in f.notes:
        print(f"  note: {n}")


def _print_validation(v: Validation, refits: int) -> None:
    for c in v.steps:
        parts = []
        for label, pr, scale, unit in (
            ("TTFT P50", c.ttft_p50_s, 1e3, "ms"),
            ("TTFT P95", c.ttft_p95_s, 1e3, "ms"),
            ("out tok/s", c.output_tps, 1.0, ""),
        ):
            parts.append(
                f"{label} {pr.predicted * scale:.4g}{unit}{_iv(pr.interval, refits, scale, '.4g')} vs "
                f"{(pr.measured or 0) * scale:.4g}{unit} ({(pr.error or 0) * 100:+.1f} %)"
            )
        print(f"  held out {c.step} (fitted on {len(c.fitted_on)} other steps): " + "; ".join(parts))
    if v.median_abs_error is not None:
        print(f"  held-out error: median |error| {v.median_abs_error * 100:.1f} %, max {v.max_abs_error or 0:.1%}")


def _print_search(sc: SearchCheck) -> None:
    held = "no probe" if sc.measured_held_rps is None else f"{sc.measured_held_rps:.4g} req/s"
    broke = "no probe broke" if sc.measured_broke_rps is None else f"broke at {sc.measured_broke_rps:.4g} req/s"
    print(
        f"  capacity search: the trial held {held}, {broke}; the model's capacity for probes of "
        f"{sc.probe_requests} requests {sc.model_capacity_rps or 0:.4g} req/s{_refits_iv(sc.model_capacity_ci)}; "
        f"{sc.probes_agreeing}/{len(sc.probes)} probe verdicts agree -> {'agrees' if sc.agrees else 'DISAGREES'}"
    )
    print(
        f"    sustained, on the trial's own requests: {sc.sustained_capacity_rps or 0:.4g} req/s; short probes "
        "hold above it because their queue has no time to build (the plan below sizes the same way, on the "
        "profile's lengths)"
    )
    for c in sc.probes:
        if not c.agrees:
            print(
                f"    probe {c.step} at {c.rate_rps:.4g} req/s: measured {'held' if c.measured_held else 'broke'}, "
                f"model {'holds' if c.predicted_held else 'breaks'}"
            )


def _print_plan(pl: CandidatePlan, indent: str = "  ") -> None:
    cap = pl.capacity_per_replica_rps or 0.0
    print(
        f"{indent}plan {pl.candidate} at {pl.rate_rps:.4g} req/s: capacity {cap:.4g} req/s per replica at the SLO"
        f"{_refits_iv(pl.capacity_ci)}, saturation {pl.saturation_rps or 0:.4g} req/s"
    )
    if pl.replicas is not None:
        hi = f" (up to {pl.replicas_hi} at the capacity's low end)" if pl.replicas_hi not in (None, pl.replicas) else ""
        print(
            f"{indent}  replicas: {pl.replicas}{hi} = ceil({pl.rate_rps:.4g} / ({cap:.4g} * (1 - "
            f"{pl.headroom:g} headroom))); predicted TTFT P95 {(pl.predicted_ttft_p95_s or 0) * 1e3:.4g} ms, "
            f"E2E P50 {pl.predicted_e2e_p50_s or 0:.3g} s"
        )
        print(f"{indent}  burst: {pl.burst_note}")
    if pl.devices is not None:
        print(f"{indent}  devices {pl.devices}, hosts {pl.hosts}")
    if pl.cost_per_hour is not None:
        print(
            f"{indent}  cost: {pl.cost_per_hour:.4g} {pl.currency}/h, {pl.cost_per_1m_output or 0:.4g} per 1M "
            f"output tokens, {pl.cost_per_user_month or 0:.4g} per user per month"
        )
    for w in pl.what_if:
        print(
            f"{indent}  what if {w.change}: {w.replicas} replicas, {w.devices} devices, "
            f"{'-' if w.cost_per_hour is None else f'{w.cost_per_hour:.4g}'} {pl.currency}/h"
        )
    for n in pl.notes:
        print(f"{indent}  note: {n}")


def capacity_command(
    profile: str = typer.Argument(..., help="Traffic profile YAML (see examples/traffic.yaml)."),
    record: list[str] = typer.Option(
        [],
        "--record",
        help="A trial run folder (or its record.json): fit each candidate on its measured steps. Repeatable.",
    ),
    bench: list[str] = typer.Option([], "--bench", help="A bench run folder, as NAME=DIR or DIR. Repeatable."),
    slots: int | None = typer.Option(
        None,
        "--slots",
        min=1,
        help="Declared slot limit for --bench evidence (count; default: what the evidence shows).",
    ),
    bootstrap: int = typer.Option(
        30, "--bootstrap", min=0, max=1000, help="Bootstrap refits for the intervals (count)."
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the bootstrap and the simulations."),
    json_out: str | None = typer.Option(None, "--json", help="Write the CapacityReport JSON to this file."),
) -> None:
    """Peak load of a traffic profile; with --record/--bench: model, held-out validation and the plan."""
    prof = load_profile(profile)
    if 0 < bootstrap < MIN_REFITS:
        print(
            f"warning: --bootstrap {bootstrap}: fewer than {MIN_REFITS} refits; each interval below is the range "
            f"of those refits, not a 95 % CI (give --bootstrap {MIN_REFITS} or more)",
            file=sys.stderr,
        )
    models: dict[str, tuple[PerfParams, list[PerfParams]]] = {}
    cands: dict[str, CandidateCapacity] = {}
    evidence = evidence_of(record, bench)
    for name, ev in evidence.items():
        declared = ev.slots or slots
        try:
            rep, boots = fit(ev.steps, declared_slots=declared, bootstrap=bootstrap, seed=seed)
            models[name] = (rep.params, boots)
            cands[name] = CandidateCapacity(
                fit=rep,
                validation=validate(ev.steps, declared_slots=declared, bootstrap=min(bootstrap, 20), seed=seed),
                search=check_search(
                    rep.params,
                    boots[:10],
                    ev.steps,
                    ev.probes,
                    parse_slo(",".join(ev.slo)),
                    shape=ev.burstiness,
                    seed=seed,
                )
                if ev.probes and ev.slo
                else None,
            )
        except ValueError as e:
            raise ConfigError(f"{name}: {e}") from None
    plans = {}
    for n, (p, b) in models.items():
        try:
            plans[n] = plan_candidate(n, p, b[:10], prof, seed=seed)
        except ValueError as e:
            raise ConfigError(f"{n}: {e}") from None
    hold_of = next(((n, pl.predicted_e2e_p50_s) for n, pl in plans.items() if pl.predicted_e2e_p50_s), None)
    peak = peak_load(prof, hold_of[1] if hold_of else None)
    if hold_of is not None and prof.stream_hold_s is None and len(plans) > 1:
        # the hold is one candidate's predicted E2E: say whose, as each candidate holds streams its own time
        f = peak.concurrent_streams
        whose = f"({hold_of[0]}'s predicted E2E P50; each plan below gives its own)"
        peak.concurrent_streams = f.model_copy(update={"formula": f.formula.replace("(predicted E2E P50)", whose)})
    print(f"traffic profile {prof.name}: SLO {', '.join(prof.slo)}")
    for f in (
        peak.mean_rps,
        peak.peak_rps,
        peak.offered_peak_rps,
        peak.burst_rps,
        peak.concurrent_streams,
        peak.input_tps,
        peak.output_tps,
    ):
        print(f"  {f.name}: {f.value:.4g} {f.unit} = {f.formula}")
    for name, cc in cands.items():
        cc.plan = plans[name]
        _print_fit(name, cc.fit, bootstrap)
        if cc.validation is not None:
            _print_validation(cc.validation, bootstrap)
        if cc.search is not None:
            _print_search(cc.search)
        _print_plan(plans[name])
    tiers = plan_tiers(prof, models, seed=seed) if models else None
    missing = sorted({c for c in prof.tiers.values() if c not in models})
    if models and prof.tasks and missing:
        print(
            f"tiers: not planned: no evidence for {', '.join(missing)} (a candidate the profile's tiers name); "
            f"give it with --record or --bench NAME=DIR"
        )
    if tiers is not None:
        print("tiers:")
        for tier, pl in tiers.tiers.items():
            print(f"  tier {tier}:")
            _print_plan(pl, "    ")
        strong = tiers.all_strong
        if strong is not None:
            print(
                f"  everything to {strong.candidate}: {strong.replicas} replicas, "
                f"{'-' if strong.cost_per_hour is None else f'{strong.cost_per_hour:.4g}'} {prof.currency}/h"
            )
        if tiers.blended_cost_per_hour is not None:
            more = "less" if (tiers.saving or 0) >= 0 else "more"
            saving = "" if tiers.saving is None else f" ({abs(tiers.saving):.0%} {more} than all to the strong tier)"
            print(f"  blended: {tiers.blended_cost_per_hour:.4g} {prof.currency}/h{saving}")
    report = CapacityReport(profile=prof.name, slo=prof.slo, peak=peak, candidates=cands, tiers=tiers)
    if json_out:
        try:
            Path(json_out).write_bytes(report.to_json_bytes(indent=2))
        except OSError as e:
            raise ConfigError(f"cannot write {json_out}: {e.strerror or e}") from None
        print(f"report: {json_out}")
