"""How the chat flow runs the bench: the workload factory (the experiment's own workloads, datasets and
the goal's mix, with the first candidate's tokenizer for all), and a bench run whose every load step is
first checked against the trial budget and sampled by the engine's metrics sampler."""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servelab.bench.load import LoadModel
from servelab.bench.results import LoadInfo, StepSummary, Summary
from servelab.bench.runner import Bench, BenchConfig, write_summary
from servelab.bench.slo import Objective
from servelab.trial.benchload import bench_load
from servelab.trial.context import TrialContext
from servelab.trial.mixload import experiment_mix
from servelab.trial.results import CandidateIdentity
from servelab.trial.telemetry import MetricsSampler
from servelab.wire.errors import ConfigError
from servelab.wire.types import RequestSpec

__all__ = ["BudgetSpent", "ChatBench"]


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


class ChatBench:
    """Bench runs of the chat flow (``ctx``: the trial's; its ``counter`` is set by :meth:`tokenizer_for`)."""

    def __init__(self, ctx: TrialContext) -> None:
        self.ctx = ctx

    def factory(self, seeded: bool = False) -> Callable[..., Any]:
        """Workload factory for :class:`Bench`; ``seeded`` adds a per-request sampling ``seed`` (the
        quality gate: the engine's own sampling settings, as served, but repeatable). Greedy decoding
        was tried first and rejected: it sends small models into digit loops inside JSON numbers
        (vLLM-CPU + Gemma 270M: 1 of 6 structured answers valid greedy), which no deployment uses."""
        from servelab.bench import workloads as W

        if seeded:
            plain = self.factory()

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

        table = {w.label: w for w in self.ctx.exp.workloads}
        ignore_eos = self.ctx.exp.ignore_eos

        def factory(name: str, seed: int) -> Any:
            w = table.get(name)
            if name == "mix" and w is None:  # the goal's mix of the experiment's own workloads (trial.mixload)
                return experiment_mix(factory, self.ctx.exp.arrival_mix, seed)
            if w is not None and w.dataset is not None:
                return W.load_dataset(w.dataset, self.ctx.counter, seed=seed, max_tokens_default=w.max_tokens_default)
            return W.make_workload(name, self.ctx.counter, seed=seed, ignore_eos=ignore_eos,
                                   **(w.set if w is not None else {}))

        return factory

    def tokenizer_for(self, identity: CandidateIdentity) -> Any:
        """The workload tokenizer: the first candidate's GGUF or HF folder; the same for every candidate
        so that all see the same prompts (one factor at a time)."""
        if self.ctx.counter is not None:
            return self.ctx.counter
        from servelab.modelfile.tokenizer import load_tokenizer

        model = identity.model or {}
        path = model.get("path") or model.get("hf_dir")
        try:
            if isinstance(path, str) and path and os.path.exists(path):
                self.ctx.counter = load_tokenizer(path)
        except ConfigError:
            self.ctx.counter = None
        return self.ctx.counter

    def run(self, base_url: str, model: str | None, out: Path, *, workloads: list[str],
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
        gen = self.ctx.exp.load_generator if spread else None
        cfg = BenchConfig(base_url=base_url, model=model, workloads=workloads, concurrency=lk.concurrency or [1],
                          rates_rps=lk.rates_rps, arrival=lk.arrival,  # type: ignore[arg-type]  # a LoadModel's
                          gamma_shape=lk.gamma_shape, requests=requests,  # arrival is one BenchConfig accepts
                          max_concurrency=lk.max_concurrency,
                          warmup=warmup, seed=seed, slo=",".join(o.name for o in objectives) or None,
                          stop_on_slo=stop_on_slo, timeout_s=self.ctx.exp.timeout_s,
                          ignore_eos=self.ctx.exp.ignore_eos, api_key=api_key,
                          out=str(out), workload_overrides=dict(overrides or {}),
                          workers=gen.workers if gen else 1, workers_per_node=gen.workers_per_node if gen else None,
                          ray=gen.ray if gen else None)
        factory = self.factory(seeded=seeded)
        if overrides:
            base = factory

            def factory(name: str, seed: int) -> Any:  # noqa: F811 — mix overrides for the arrival run
                from servelab.bench import workloads as W

                if name == "mix" and set(overrides) - {"ratio"}:  # arrival_test.set: the built-in mix with them
                    return W.make_workload("mix", self.ctx.counter, seed=seed, ignore_eos=self.ctx.exp.ignore_eos,
                                           **overrides)
                return base(name, seed)

        budget = self.ctx.budget
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

        bench = Bench(cfg, objectives, factory, counter=self.ctx.counter, progress=progress)
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
        rem = self.ctx.budget.remaining_s() or 0.0
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
                    self.ctx.budget.skip(f"{cand}/{w}/{ld.label}")
                    if on_step is not None:
                        on_step(st)
                steps.append(st)
        summary.steps = steps
        summary.stopped_by = "budget"
