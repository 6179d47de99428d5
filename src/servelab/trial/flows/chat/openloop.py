"""The chat flow after the load steps: the goal's mix at every load step, the arrival test at the
expected rate (with bursts) and the capacity search, each checked against the trial budget first."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from servelab.bench.load.step import LoadModel
from servelab.bench.results import Interval, StepSummary, Summary
from servelab.trial.annotate import annotate
from servelab.trial.console import step_line
from servelab.trial.context import TrialContext
from servelab.trial.flows.chat.benching import ChatBench
from servelab.trial.results import CandidateResult, Capacity, Probe
from servelab.trial.telemetry import MetricsSampler
from servelab.wire.errors import ConfigError

__all__ = ["EngineDied", "OpenLoop"]


class EngineDied(RuntimeError):
    """The candidate's engine process exited while it was being measured."""


class OpenLoop:
    """The mix, arrival and capacity runs of one candidate after another (``ctx``: the trial's)."""

    def __init__(self, ctx: TrialContext, bench: ChatBench) -> None:
        self.ctx, self.bench = ctx, bench

    def open_loop(
        self,
        name: str,
        base_url: str,
        model: str | None,
        api_key: str | None,
        sampler: MetricsSampler | None,
        result: CandidateResult,
        files: dict[str, str],
        running: Any,
        summary: Summary,
    ) -> None:
        """After the load steps: the arrival test, then the capacity search, each when enabled (and the
        budget allows); raises :class:`EngineDied` when the engine exited meanwhile."""
        exp = self.ctx.exp
        for what, enabled, run in (
            ("the arrival test", exp.arrival_test.enabled and self.arrival_fits(name, summary), self.arrival),
            ("the capacity search", exp.capacity.enabled, self.capacity),
        ):
            if not enabled:
                continue
            run(name, base_url, model, api_key, sampler, result, files)
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during {what} (exit code {running.process.poll()})")

    def mix_sweep(
        self,
        name: str,
        base_url: str,
        model: str | None,
        api_key: str | None,
        sampler: MetricsSampler | None,
        files: dict[str, str],
        repeat: int,
        started: float,
        levels: list[LoadModel] | None = None,
    ) -> list[StepSummary]:
        """The goal's mix run concurrently at every load step (:mod:`servelab.trial.mixload`; ``levels``:
        only those), repeat round ``repeat`` (0-based; the same prompts every round), annotated with its
        steady windows and per-class figures; its requests into ``files`` (``mix``, ``mix_r2`` …)."""
        exp = self.ctx.exp
        sub = "mix" if repeat == 0 else f"mix-r{repeat + 1}"
        out = self.ctx.out / "candidates" / name / sub
        tag = "" if exp.repeats == 1 else f" (repeat {repeat + 1}/{exp.repeats})"
        summary = self.bench.run(
            base_url,
            model,
            out,
            workloads=["mix"],
            load=levels if levels is not None else exp.steps.load_models(exp.goal.burstiness),
            requests=exp.requests_per_step,
            warmup=exp.warmup,
            objectives=self.ctx.objectives,
            stop_on_slo=exp.stop_on_slo,
            seed=exp.seed + 31337,
            sampler=sampler,
            api_key=api_key,
            on_step=lambda st: self.ctx.say(step_line(name, st) + tag),
            budget_for=(name, started),
            spread=True,
        )
        annotate(summary.steps, out / "requests.jsonl", self.ctx.objectives, repeat)
        files[sub.replace("-", "_")] = f"candidates/{name}/{sub}/requests.jsonl"
        return summary.steps

    def capacity(
        self,
        name: str,
        base_url: str,
        model: str | None,
        api_key: str | None,
        sampler: MetricsSampler | None,
        result: CandidateResult,
        files: dict[str, str],
    ) -> None:
        """The capacity search (:mod:`servelab.trial.capacity`) on the goal's mix into
        ``result.capacity``; each probe's requests under ``candidates/NAME/capacity/``. Probes stop
        when the trial budget cannot hold the next one (said in ``capacity.note``)."""
        from servelab.trial.capacity import search
        from servelab.trial.decide import effective_step

        exp, cap = self.ctx.exp, self.ctx.exp.capacity
        mix = [s for s in result.steps if s.workload == "mix" and not s.skipped]
        start = (
            cap.start_rps
            or exp.goal.expected_rate_rps
            or max((s.throughput.requests_per_s or 0.0 for s in mix), default=0.0)
            or 1.0
        )
        k = exp.goal.burstiness
        arrival = {"goal": "poisson" if k == 1 else "gamma", "poisson": "poisson", "constant": "constant"}[cap.arrival]
        tail = max((s.e2e_s.max or 0.0 for s in mix), default=0.0)
        cdir = self.ctx.out / "candidates" / name / "capacity"
        out_of_budget: list[float] = []

        def probe(rate: float) -> Probe:
            est = cap.requests / rate + tail
            if out_of_budget or not self.ctx.budget.allows(est):
                out_of_budget.append(rate)
                return Probe(rate_rps=rate, held=False, broken_by=["not run: trial budget"])
            load = LoadModel(kind="open", rate_rps=rate, arrival=arrival, gamma_shape=k)
            pdir = cdir / f"r{rate:.4g}"
            summ = self.bench.run(
                base_url,
                model,
                pdir,
                workloads=["mix"],
                load=[load],
                requests=cap.requests,
                warmup=0,
                objectives=self.ctx.objectives,
                stop_on_slo=False,
                seed=exp.seed + 4242,
                sampler=sampler,
                api_key=api_key,
                spread=True,
            )
            st = summ.steps[0]
            annotate([st], pdir / "requests.jsonl", self.ctx.objectives)
            eff = effective_step([st], self.ctx.judged, exp.goal.error_budget)
            held = eff.max_step_meeting_slo is not None
            files[f"capacity_r{rate:.4g}"] = f"candidates/{name}/capacity/r{rate:.4g}/requests.jsonl"
            tps = st.steady.output_tokens_per_s if st.steady is not None else None
            p = Probe(
                rate_rps=rate,
                held=held,
                achieved_rps=st.throughput.requests_per_s,
                output_tokens_per_s=tps if tps is not None else st.throughput.output_tokens_per_s,
                broken_by=[b.text for b in eff.broken_by],
                step=st.step,
            )
            verdict = "held" if held else "broke: " + "; ".join(p.broken_by)
            self.ctx.say(f"[{name}] capacity probe {rate:.3g} req/s: {verdict}")
            return p

        if not self.ctx.budget.allows(cap.requests / start + tail):
            self.ctx.budget.skip(f"{name}/capacity")
            result.capacity = Capacity(
                arrival=arrival,
                requests_per_probe=cap.requests,
                note="not run: the trial budget was spent (goal.budget.max_minutes)",
            )
            self.ctx.say(f"[{name}] capacity search not run: trial budget spent")
            return
        self.ctx.say(
            f"[{name}] capacity search from {start:.3g} req/s ({arrival} arrivals, {cap.requests} "
            f"requests per probe, at most {cap.max_probes} probes)"
        )
        found = search(probe, start, max_probes=cap.max_probes, tolerance=cap.tolerance)
        found.arrival, found.requests_per_probe = arrival, cap.requests
        if out_of_budget:  # only the probes that ran count: the held/broke bracket from them alone
            self.ctx.budget.skip(f"{name}/capacity")
            kept = [p for p in found.probes if p.rate_rps not in out_of_budget]
            held = max((p.rate_rps for p in kept if p.held), default=None)
            broke = min((p.rate_rps for p in kept if not p.held and (held is None or p.rate_rps > held)), default=None)
            best = max((p for p in kept if p.held), key=lambda p: p.rate_rps, default=None)
            found = Capacity(
                rate_rps=held,
                broke_at_rps=broke,
                arrival=arrival,
                requests_per_probe=cap.requests,
                interval_note=found.interval_note if held is not None else None,
                interval=None
                if held is None
                else Interval(lo=held, hi=broke, level=1.0, n=len(kept), method="bracket"),
                output_tokens_per_s=best.output_tokens_per_s if best else None,
                probes=kept,
                note=f"search cut short by the trial budget after {len(kept)} probe(s)"
                + ("" if held is not None else "; none held"),
            )
        result.capacity = found
        self.capacity_model(name, result, found, probe if cap.model_check else None)

    def capacity_model(
        self, name: str, result: CandidateResult, found: Capacity, probe: Callable[[float], Probe] | None = None
    ) -> None:
        """The candidate's performance model (:mod:`servelab.capacity.trialmodel`: fitted on its
        steps and probes so far, validated on held-out steps, set against the capacity search) into
        ``result.capacity_model``; with ``probe`` (``capacity.model_check``) one extra probe at the rate
        the model chose, checked against the model's prediction. A fit that cannot be made is said,
        not raised."""
        from servelab.capacity.evidence import declared_slots
        from servelab.capacity.results import ModelCheck
        from servelab.capacity.trialmodel import candidate_model, check_point, check_rate

        spec = next((c for c in self.ctx.exp.candidates if c.name == name), None)
        settings = getattr(spec, "settings", None)
        raw = settings.model_dump() if settings is not None and hasattr(settings, "model_dump") else settings
        probes = [(p.rate_rps, p.held, p.step) for p in found.probes if p.step]
        try:
            got = candidate_model(
                self.ctx.out,
                name,
                slots=declared_slots(raw if isinstance(raw, dict) else None),
                probes=probes,
                slo=self.ctx.objectives,
                burstiness=self.ctx.exp.goal.burstiness,
                seed=self.ctx.exp.seed,
            )
        except (ValueError, ConfigError) as e:
            self.ctx.say(f"[{name}] capacity model not fitted: {e}")
            return
        if got is None:
            return
        cc, boots = got
        result.capacity_model = cc
        v, sc = cc.validation, cc.search
        err = "" if v is None or v.median_abs_error is None else f", held-out median |error| {v.median_abs_error:.0%}"
        agree = "" if sc is None else f", {'agrees' if sc.agrees else 'disagrees'} with the capacity search"
        self.ctx.say(f"[{name}] capacity model fitted on {cc.fit.requests} requests{err}{agree}")
        pick = check_rate(sc) if probe is not None else None
        if probe is None or pick is None:
            return
        rate, reason = pick
        pr = probe(rate)
        if not pr.step:  # not run: the trial budget
            cc.check = ModelCheck(rate_rps=rate, reason=reason, note="; ".join(pr.broken_by) or "not run")
            return
        folder = self.ctx.out / "candidates" / name / "capacity" / f"r{rate:.4g}"
        cc.check = check_point(
            cc.fit.params, boots[:10], folder, rate, reason, pr.held, self.ctx.objectives, cc.fit.steps
        )
        said = (
            ""
            if cc.check.predicted_held is None
            else f"; the model predicted it would {'hold' if cc.check.predicted_held else 'break'}"
        )
        self.ctx.say(f"[{name}] model check at {rate:.3g} req/s ({reason}){said}")

    def arrival(
        self,
        name: str,
        base_url: str,
        model: str | None,
        api_key: str | None,
        sampler: MetricsSampler | None,
        result: CandidateResult,
        files: dict[str, str],
        repeat: int = 0,
    ) -> None:
        """The arrival test of ``name`` in repeat round ``repeat`` (0-based; the same arrivals and
        prompts every round) into ``result.arrival_run`` (round 0) or ``result.arrival_repeats``,
        annotated with its per-class figures (per-workload SLOs); its requests into ``files``
        (``arrival``, ``arrival_r2`` …)."""
        exp, at = self.ctx.exp, self.ctx.exp.arrival_test
        load = exp.arrival_load()
        sub = "arrival" if repeat == 0 else f"arrival-r{repeat + 1}"
        self.ctx.say(
            f"[{name}] arrival test{'' if repeat == 0 else f' (repeat {repeat + 1}/{exp.repeats})'}: "
            f"{load.rate_rps:g} req/s, gamma burstiness {exp.goal.burstiness}, mix {exp.arrival_mix}"
        )
        arr = self.bench.run(
            base_url,
            model,
            self.ctx.out / "candidates" / name / sub,
            workloads=["mix"],
            load=[load],
            requests=at.requests,
            warmup=0,
            objectives=self.ctx.objectives,
            stop_on_slo=False,
            seed=exp.seed + 7777,
            sampler=sampler,
            overrides={**at.set, "ratio": exp.arrival_mix},
            api_key=api_key,
            spread=True,
        )
        annotate(arr.steps, self.ctx.out / "candidates" / name / sub / "requests.jsonl", self.ctx.objectives, repeat)
        run = arr.steps[0] if arr.steps else None
        if repeat == 0:
            result.arrival_run = run
        elif run is not None:
            result.arrival_repeats = [*result.arrival_repeats, run]  # assigned: a set field is written
        files[sub.replace("-", "_")] = f"candidates/{name}/{sub}/requests.jsonl"
        if run is not None:
            self.ctx.say(step_line(name, run))

    def arrival_repeat_needed(self, name: str, result: CandidateResult, repeat: int) -> bool:
        """Whether the arrival test runs again in repeat round ``repeat``: only while some objective is
        broken in every run of it so far (:func:`servelab.trial.verdicts.exclusion_open`: otherwise no
        further run can exclude the candidate at the expected rate)."""
        from servelab.trial.verdicts import exclusion_open

        if not self.ctx.exp.arrival_test.enabled or result.arrival_run is None:
            return False
        open_ = exclusion_open([result.arrival_run, *result.arrival_repeats], self.ctx.judged)
        if open_:
            self.ctx.say(
                f"[{name}] arrival test again in round {repeat + 1}: {', '.join(open_)} broken in every run "
                "so far; an exclusion needs it broken in each run"
            )
        return bool(open_)

    def arrival_repeat_fits(self, name: str, result: CandidateResult, repeat: int) -> bool:
        """Whether the budget allows ``name``'s arrival test in repeat round ``repeat``: ``requests /
        expected_rate_rps`` plus the slowest E2E of its first run; when not, it is recorded as skipped
        for budget (``CANDIDATE/arrival/repeatN``) and ``False`` returned."""
        exp, first = self.ctx.exp, result.arrival_run
        tail = (first.e2e_s.max or 0.0) if first is not None else 0.0
        est = exp.arrival_test.requests / (exp.goal.expected_rate_rps or 1.0) + tail
        if self.ctx.budget.allows(est):
            return True
        self.ctx.budget.skip(f"{name}/arrival/repeat{repeat + 1}")
        self.ctx.say(f"[{name}] arrival test repeat {repeat + 1} not run: trial budget (estimated {est:.0f} s)")
        return False

    def arrival_fits(self, name: str, summary: Summary) -> bool:
        """Whether the budget allows ``name``'s arrival test (see :class:`TrialBudget`); when not, it
        is recorded as skipped for budget and ``False`` returned."""
        exp = self.ctx.exp
        ran = [s for s in summary.steps if not s.skipped]
        tail = ran[-1].e2e_s.max or 0.0 if ran else 0.0
        est = exp.arrival_test.requests / (exp.goal.expected_rate_rps or 1.0) + tail
        if summary.stopped_by != "budget" and self.ctx.budget.allows(est):
            return True
        self.ctx.budget.skip(f"{name}/arrival")
        self.ctx.say(
            f"[{name}] arrival test not run: trial budget spent (estimated {est:.0f} s, "
            f"{max(self.ctx.budget.remaining_s() or 0.0, 0):.0f} s left)"
        )
        return False
