"""How the chat flow runs the bench: the workload factory (the experiment's own workloads, datasets and
the goal's mix, with the first candidate's tokenizer for all), and a bench run whose every load step is
first checked against the trial budget and sampled by the engine's metrics sampler."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from servelab.bench.analysis.slo import Objective
from servelab.bench.events import BenchEvent, Proceed, Skip, StepDone, StepStarted, StepVerdict, Watcher
from servelab.bench.load.config import BenchConfig
from servelab.bench.load.runner import Bench
from servelab.bench.load.step import LoadModel
from servelab.bench.results import StepSummary, Summary
from servelab.trial.benchload import bench_load
from servelab.trial.context import TrialContext
from servelab.trial.results import CandidateIdentity
from servelab.trial.telemetry import MetricsSampler
from servelab.trial.workloads import experiment_workloads
from servelab.wire.errors import ConfigError

__all__ = ["ChatBench"]


class _TrialWatch(Watcher):
    """A chat bench run's observer: the budget before each step (``budget_for`` = candidate name, its
    start on the budget clock), the metrics sampler's step boundaries, and ``on_step`` per step summary."""

    def __init__(
        self,
        ctx: TrialContext,
        sampler: MetricsSampler | None,
        on_step: Callable[[StepSummary], None] | None,
        budget_for: tuple[str, float] | None,
    ) -> None:
        self.ctx, self.sampler, self.on_step, self.budget_for = ctx, sampler, on_step, budget_for
        self.started = 0.0  # the running step's start on the budget clock
        self.skip_reason: str | None = None

    def before_step(self, workload: str, step: str) -> StepVerdict:
        if self.budget_for is None:
            return Proceed()
        budget = self.ctx.budget
        est = budget.step_estimate_s(self.budget_for[0], workload, step)
        if not budget.allows(est):
            left = max(budget.remaining_s() or 0.0, 0)
            self.skip_reason = (
                f"trial budget spent (goal.budget.max_minutes): {left:.0f} s left when step "
                f"{workload}/{step} was due, estimated {est:.0f} s"
            )
            return Skip(self.skip_reason, by="budget")
        self.started = budget.clock()
        return Proceed()

    def on_event(self, event: BenchEvent) -> None:
        sampler, budget = self.sampler, self.ctx.budget
        if isinstance(event, StepStarted) and sampler is not None:
            label = None if event.warmup else f"{event.workload}/{event.step}"
            if label is not None and sampler.step != label:
                sampler.boundary(label)  # the step's first sample
            else:
                sampler.step = label
        elif isinstance(event, StepDone):
            st = event.summary
            by_budget = st.skipped and self.skip_reason is not None and st.skipped_reason == self.skip_reason
            if sampler is not None and sampler.step is not None and not by_budget:
                sampler.boundary(sampler.step)  # the step's last sample
            if self.budget_for is not None and not st.skipped:
                budget.record_step(
                    self.budget_for[0], st.workload, st.step, budget.clock() - self.started, self.budget_for[1]
                )
            if by_budget and self.budget_for is not None:
                budget.skip(f"{self.budget_for[0]}/{st.workload}/{st.step}")
            if self.on_step is not None:
                self.on_step(st)


class ChatBench:
    """Bench runs of the chat flow (``ctx``: the trial's; its ``counter`` is set by :meth:`tokenizer_for`)."""

    def __init__(self, ctx: TrialContext) -> None:
        self.ctx = ctx

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

    def run(
        self,
        base_url: str,
        model: str | None,
        out: Path,
        *,
        workloads: list[str],
        load: list[LoadModel],
        requests: int,
        warmup: int,
        objectives: list[Objective],
        stop_on_slo: bool,
        seed: int,
        sampler: MetricsSampler | None = None,
        overrides: Mapping[str, Any] | None = None,
        api_key: str | None = None,
        seeded: bool = False,
        on_step: Callable[[StepSummary], None] | None = None,
        budget_for: tuple[str, float] | None = None,
        spread: bool = False,
    ) -> Summary:
        """One bench run of ``workloads`` x ``load`` into ``out``. ``budget_for`` = (candidate name, its
        start on the budget clock): each step is first checked against the trial budget; when one does not
        fit, the bench records it and every later step as skipped for budget (``summary.stopped_by``).
        ``spread``: send the load from the experiment's ``load_generator`` (workers, Ray actors)."""
        lk = bench_load(load)
        gen = self.ctx.exp.load_generator if spread else None
        cfg = BenchConfig(
            base_url=base_url,
            model=model,
            workloads=workloads,
            concurrency=lk.concurrency or [1],
            rates_rps=lk.rates_rps,
            arrival=lk.arrival,  # type: ignore[arg-type]  # a LoadModel's
            gamma_shape=lk.gamma_shape,
            requests=requests,  # arrival is one BenchConfig accepts
            max_concurrency=lk.max_concurrency,
            warmup=warmup,
            seed=seed,
            slo=",".join(o.name for o in objectives) or None,
            stop_on_slo=stop_on_slo,
            timeout_s=self.ctx.exp.timeout_s,
            ignore_eos=self.ctx.exp.ignore_eos,
            api_key=api_key,
            out=str(out),
            workload_overrides=dict(overrides or {}),
            workers=gen.workers if gen else 1,
            workers_per_node=gen.workers_per_node if gen else None,
            ray=gen.ray if gen else None,
        )
        factory = experiment_workloads(self.ctx.exp, self.ctx.counter, seeded=seeded, mix_overrides=overrides)
        bench = Bench(
            cfg,
            objectives,
            factory,
            counter=self.ctx.counter,
            observer=_TrialWatch(self.ctx, sampler, on_step, budget_for),
        )
        summary = asyncio.run(bench.run())
        if sampler is not None:
            sampler.step = None
        return summary
