"""Runs a benchmark: preflight, warmup, load steps (a sweep that stops raising load once an SLO
breaks), per-request JSONL written as requests finish, ``summary.json`` and identity.

The run directory (``out``) holds:

- ``config.json`` — the benchmark settings as given;
- ``identity.json`` — servelab version, host CPU/RAM, the server's identity (``/v1/models``, llama-server
  ``/props``, the engine launcher's identity when servelab started the engine);
- ``requests.jsonl`` — one line per finished request (warmup included, marked), appended and flushed as
  each ends, so Ctrl-C, SIGTERM or kill -9 keeps everything already measured (``servelab summarize
  DIR`` rebuilds the summary from it, :mod:`servelab.bench.analysis.rebuild`);
- ``summary.json`` — per workload and load step: the metrics of :mod:`servelab.bench.analysis.metrics`, counts,
  SLO verdicts (schema in docs/summary-schema.md); rewritten after every step.
"""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson

from servelab import __version__
from servelab.bench.analysis.slo import Objective
from servelab.bench.analysis.summarize import new_summary, skipped_step, step_summary, with_fields, write_summary
from servelab.bench.events import (
    BenchObserver,
    Preparing,
    PromptBuilt,
    Ready,
    RequestDone,
    RequestsDone,
    Skip,
    StepDone,
    StepStarted,
    Watcher,
)
from servelab.bench.load.config import BenchConfig, make_run_dir, plan_loads
from servelab.bench.load.lines import HOSTNAME, finish_record, record_from_json, record_to_json
from servelab.bench.load.merge import clock_note
from servelab.bench.load.saturation import CpuMeter, saturation
from servelab.bench.load.shares import RunContext, plan_step
from servelab.bench.load.step import CyclicSpecs, LoadModel, arrival_offsets_s, run_step
from servelab.bench.load.steprun import StepRun, line_id, pruned, this_process
from servelab.bench.load.worker import LineBatch
from servelab.bench.load.workers import LocalPool, Pool
from servelab.bench.results import (
    Generator,
    GeneratorWorker,
    LostPart,
    RequestLine,
    StepSummary,
    Summary,
    WorkerStep,
)
from servelab.wire.client import ConfigError, make_session
from servelab.wire.host import host_identity
from servelab.wire.preflight import preflight
from servelab.wire.types import RequestRecord, RequestSpec

if TYPE_CHECKING:
    from servelab.bench.tracing import BenchTracer

__all__ = ["Bench", "make_pool"]

_PREPARE_NOTICE_S = 1.0  # building a step's prompts for longer than this shows a progress bar


def make_pool(cfg: BenchConfig) -> Pool | None:
    """The load-generator workers ``cfg`` asks for: Ray actors (``--ray``), processes on this host
    (``--workers N`` > 1), or ``None`` (this process sends the load itself)."""
    if cfg.ray is not None:
        from servelab.bench.load.rayrun import RayPool

        return RayPool(cfg.ray, cfg.workers, cfg.workers_per_node)
    if cfg.workers > 1:
        return LocalPool(cfg.workers)
    return None


class Bench:
    """A benchmark run (see module doc). ``run()`` returns the :class:`~servelab.bench.results.Summary`
    and leaves the run directory complete; ``observer`` (:class:`~servelab.bench.events.BenchObserver`)
    receives typed events and decides before each load step whether it runs. ``summary`` holds the
    summary as it grows (what an interrupted run leaves).

    With ``cfg.workers > 1`` or ``cfg.ray`` the load is sent by workers (:mod:`servelab.bench.load.workers`,
    :mod:`servelab.bench.load.rayrun`) and this process coordinates: it splits each step, writes every
    worker's lines to ``requests.jsonl`` as they arrive and summarises all of them together."""

    def __init__(
        self,
        cfg: BenchConfig,
        objectives: list[Objective],
        workload_factory: Callable[..., Any],
        counter: Any = None,
        engine_identity: dict[str, Any] | None = None,
        observer: BenchObserver | None = None,
        refuse_oversized: bool = False,
    ) -> None:
        self.cfg = cfg
        self.refuse_oversized = refuse_oversized
        self.objectives = objectives
        self.workload_factory = workload_factory
        self.counter = counter
        self.engine_identity = engine_identity
        self.observer: BenchObserver = observer or Watcher()
        self.out = Path(cfg.out)
        self.summary: Summary | None = None
        self._jsonl: Any = None
        self._next_id = 0
        self._step_index, self._step_workload = 0, ""
        self._pool: Pool | None = None
        #: client-side spans (``--otlp-endpoint``; :mod:`servelab.bench.tracing`), None when off
        self.tracer: BenchTracer | None = None
        #: the tracer's one line when spans could not be exported (said by the CLI), else None
        self.otlp_note: str | None = None

    def _on_done(self, rec: RequestRecord, spec: RequestSpec) -> None:
        finish_record(rec, spec, self.counter, self.objectives)
        if self.tracer is not None:
            self.tracer.add(rec, self._step_index)
        line = record_to_json(
            rec, step_index=self._step_index, step_workload=self._step_workload, worker=0, host=HOSTNAME
        )
        self._jsonl.write(line.to_json_bytes() + b"\n")  # one write + flush per line: kill -9 keeps every finished one
        self._jsonl.flush()
        self.observer.on_event(RequestDone(rec))

    def _on_lines(self, batch: LineBatch, run: StepRun) -> None:
        # one write + flush per batch, as it arrives: a worker or coordinator killed later loses nothing written
        self._jsonl.write(batch.lines + b"\n")
        self._jsonl.flush()
        run.batches.append(batch)
        self.observer.on_event(RequestsDone(batch.count, batch.failed))

    def _write_summary(self) -> None:
        assert self.summary is not None  # set before the first write
        write_summary(self.out, self.summary)

    def _n_requests(self, load: LoadModel) -> int:
        c = self.cfg
        if c.requests is not None:
            return c.requests
        assert c.duration_s is not None
        if load.kind == "open":
            assert load.rate_rps is not None  # an open loop always has its rate
            return int(load.rate_rps * c.duration_s * 1.5) + 16
        return 10**7  # closed loop by duration: the deadline ends it; specs are drawn cyclically

    async def run(self) -> Summary:
        """Run every workload's sweep; returns the summary (also written to ``summary.json``).
        Raises :class:`ConfigError` (one line) when the server or the workers cannot be used, or
        ``--otlp-endpoint`` is set without OpenTelemetry installed. With ``--otlp-endpoint`` the spans are
        exported before it returns (:meth:`servelab.bench.tracing.BenchTracer.shutdown`, bounded)."""
        c = self.cfg
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
        cfg_json = asdict(c)
        cfg_json.pop("api_key", None)
        loads = plan_loads(c)
        max_conc = max([ld.concurrency for ld in loads] + [c.max_concurrency or 0])
        if c.otlp_endpoint is not None:
            from servelab.bench.tracing import BenchTracer

            ratio = 1.0 if c.otlp_sample_ratio is None else c.otlp_sample_ratio
            self.tracer = BenchTracer(c.otlp_endpoint, ratio, c.base_url, c.endpoint)
        try:
            return await self._run(headers, cfg_json, loads, max_conc)
        finally:
            if self.tracer is not None:
                self.otlp_note = self.tracer.shutdown()

    async def _run(
        self, headers: dict[str, str] | None, cfg_json: dict[str, Any], loads: list[LoadModel], max_conc: int
    ) -> Summary:
        c = self.cfg
        async with make_session(max_connections=0) as session:
            model, server = await preflight(session, c.base_url, c.model, headers)
            if self.tracer is not None:
                self.tracer.model = model
            if self.refuse_oversized:
                self._check_fits(server)
            make_run_dir(self.out)
            (self.out / "config.json").write_bytes(orjson.dumps(cfg_json, option=orjson.OPT_INDENT_2))
            self.observer.on_event(Ready(model))
            identity = {
                "servelab_version": __version__,
                "host": host_identity(),
                "server": server,
                "engine": self.engine_identity,
                "model": model,
                "tokenizer": getattr(self.counter, "name", None),
                "token_counts": "server usage (stream_options.include_usage); client tokenizer "
                "count kept as a cross-check",
            }
            (self.out / "identity.json").write_bytes(orjson.dumps(identity, option=orjson.OPT_INDENT_2))
            summary = self.summary = new_summary(model, c.base_url, self.objectives)
            self._pool = make_pool(c)
            try:
                summary.generator = await self._start_generator(model, headers)
                self._write_summary()
                self._jsonl = open(self.out / "requests.jsonl", "ab")  # noqa: SIM115 — closed when the run ends
                try:
                    await self._sweep(session, model, headers, loads, max_conc)
                finally:
                    summary.finished_unix_s = time.time()
                    self._write_summary()
                    self._jsonl.close()
            finally:
                if self._pool is not None:
                    await self._pool.close()
        return summary

    async def _start_generator(self, model: str, headers: dict[str, str] | None) -> Generator:
        """Start the workers (when any) and describe the load generator for ``summary.generator``."""
        c = self.cfg
        if self._pool is None:
            # as each worker does (workers.WorkerCore.setup): the run's long-lived objects (imported modules,
            # the tokenizer) out of the collector's way, so a full collection mid-step stays short
            # (https://docs.python.org/3/library/gc.html#gc.freeze)
            gc.collect()
            gc.freeze()
            gen = Generator(
                mode="process",
                hosts=1,
                workers=[GeneratorWorker(worker=0, host=HOSTNAME, pid=os.getpid(), same_clock=True)],
            )
            return pruned(gen)
        ctx = RunContext(
            base_url=c.base_url,
            model=model,
            headers=headers,
            timeout_s=c.timeout_s,
            objectives=self.objectives,
            counter=self.counter,
            trace_ids=self.tracer.ids if self.tracer is not None else None,
        )
        try:
            workers = await self._pool.start(ctx)
        except RuntimeError as e:
            raise ConfigError(f"{e}; see the worker's output above") from None
        if c.max_concurrency is not None and c.max_concurrency < len(workers):
            raise ConfigError(
                f"--max-concurrency {c.max_concurrency} is split among the {len(workers)} workers, so it "
                "must be at least that many; raise it or use fewer workers"
            )
        hosts = {w.host for w in workers}
        gen = Generator(
            mode=self._pool.mode,
            workers=workers,
            ray_address=self._pool.address,
            hosts=len(hosts),
            clock=clock_note(hosts),
        )
        return pruned(gen)

    async def _sweep(
        self,
        session: aiohttp.ClientSession,
        model: str,
        headers: dict[str, str] | None,
        loads: list[LoadModel],
        max_conc: int,
    ) -> None:
        c = self.cfg
        stopped: Skip | None = None
        for wi, wname in enumerate(c.workloads):
            broken_at: str | None = None
            for si, load in enumerate(loads):
                if stopped is not None or broken_at is not None:
                    reason = stopped.reason if stopped is not None else f"SLO broken at step {broken_at}"
                    self._add_step(skipped_step(wname, load, reason))
                    continue
                self._step_index, self._step_workload = wi * len(loads) + si, wname
                step = await self._run_one(session, model, headers, wname, wi, si, load, max_conc)
                if isinstance(step, Skip):
                    stopped = step
                    self._add_step(skipped_step(wname, load, step.reason))
                    continue
                self._add_step(step)
                # a step with a lost worker is partial: its SLO verdict is unknown, not broken
                if self.objectives and not step.slo_met and c.stop_on_slo and not step.lost:
                    broken_at = load.label
        assert self.summary is not None
        if stopped is not None:
            self.summary.stopped_by = stopped.by
        self.summary.complete = stopped is None and not any(s.partial for s in self.summary.steps)

    def _add_step(self, step: StepSummary) -> None:
        """Append ``step`` to the summary, write it, and tell the observer."""
        assert self.summary is not None
        self.summary.steps.append(step)
        self._write_summary()
        if self.tracer is not None:  # the step is over: its spans are built now, off its clock
            self.tracer.flush()
        self.observer.on_event(StepDone(step))

    async def _load(
        self,
        session: aiohttp.ClientSession,
        model: str,
        headers: dict[str, str] | None,
        specs: Sequence[RequestSpec],
        n: int,
        load: LoadModel,
        label: str,
        *,
        warmup: bool,
        seed: int,
        run: StepRun,
    ) -> None:
        """Send one step (or its warmup) of ``n`` requests from ``specs`` (cycled when shorter), here or
        through the workers; fills ``run``."""
        c = self.cfg
        if self._pool is None:
            meter = CpuMeter().start()
            run.dispatch_ns = [] if load.kind == "open" else None
            seq = specs if len(specs) == n else CyclicSpecs(list(specs), n)
            recs = await run_step(
                session,
                c.base_url,
                model,
                seq,
                load,
                step=label,
                seed=seed,
                warmup=warmup,
                first_id=self._next_id,
                timeout_s=c.timeout_s,
                headers=headers,
                on_done=self._on_done,
                records=run.records,
                dispatch_lags_ns=run.dispatch_ns,
                traceparent=self.tracer.ids.header if self.tracer is not None else None,
            )
            self._next_id += len(recs)
            run.workers = [this_process(meter, load, recs, n if c.requests is not None else None, run.dispatch_ns)]
            return
        offsets = None
        if load.kind == "open":
            assert load.rate_rps is not None
            offsets = (
                (arrival_offsets_s(n, load.rate_rps, load.arrival, seed, load.gamma_shape) * 1e9)
                .astype("int64")
                .tolist()
            )
        alive = list(self._pool.alive)
        if not alive:
            raise ConfigError("every load-generator worker was lost; see the summary's lost parts")
        tasks = plan_step(
            load,
            list(specs),
            n,
            alive,
            first_id=self._next_id,
            step=label,
            step_index=self._step_index,
            step_workload=self._step_workload,
            warmup=warmup,
            offsets_ns=offsets,
            fixed_count=c.requests is not None or load.kind == "open",
        )
        first = self._next_id
        try:
            outcomes = await self._pool.run_step(tasks, lambda _k, batch: self._on_lines(batch, run))
        finally:  # ids stay unique: a closed loop ended by --duration used those up to its highest
            self._next_id = first + (
                n
                if c.requests is not None or load.kind == "open"
                else max([line_id(b) - first + 1 for b in run.lines()] + [0])
            )
        if self.tracer is not None:  # the workers' lines, on this host's monotonic clock (--ray is refused)
            for b in run.lines():
                line = RequestLine.model_validate_json(b)
                self.tracer.add(record_from_json(line), line.step_index or 0)
        for k, task in tasks.items():
            o = outcomes[k]
            if o.report is not None:
                run.workers.append(o.report)
                continue
            gen = self.summary.generator if self.summary is not None else None
            host = next((w.host for w in (gen.workers if gen is not None else []) if w.worker == k), "?")
            reason = o.lost_reason or "lost"
            run.workers.append(
                WorkerStep(worker=k, host=host, assigned=task.assigned, finished=o.lines, lost=True, lost_reason=reason)
            )
            run.lost.append(
                LostPart(
                    worker=k,
                    host=host,
                    assigned=task.assigned,
                    finished=o.lines,
                    missing=None if task.assigned is None else task.assigned - o.lines,
                    reason=reason + (" (during the warmup)" if warmup else ""),
                )
            )

    def _step(self, wname: str, load: LoadModel, run: StepRun, t_start: float, partial: bool = False) -> StepSummary:
        recs = run.finished()
        step = step_summary(
            wname, load, recs, self.objectives, self._tokenizer, t_start, partial=partial or bool(run.lost)
        )
        step.workers = [pruned(w) for w in run.workers]
        if run.lost:
            step.lost = [pruned(x) for x in run.lost]
        if run.workers:
            sat = saturation(
                [w for w in run.workers if not w.lost],
                kind=load.kind,
                capped=bool(load.max_concurrency),
                schedule_lag_p99_s=step.schedule_lag_s.p99,
                lag_bound_s=self.cfg.lag_bound_ms / 1e3,
                dispatch_lags_ns=run.dispatch_ns,
            )
            step.saturation = pruned(sat)
        return step

    def _partial_step(self, wname: str, load: LoadModel, run: StepRun, t_start: float) -> None:
        """Keep what an interrupted step finished, marked partial (written when the run ends)."""
        if self.summary is not None:
            self.summary.steps.append(self._step(wname, load, run, t_start, partial=True))

    async def _run_one(
        self,
        session: aiohttp.ClientSession,
        model: str,
        headers: dict[str, str] | None,
        wname: str,
        wi: int,
        si: int,
        load: LoadModel,
        max_conc: int,
    ) -> StepSummary | Skip:
        c = self.cfg
        step_seed = c.seed + 1000 * si + 100_000 * wi  # distinct prompts per step: no cross-step prompt-cache hits
        wl = self.workload_factory(wname, seed=step_seed)
        if getattr(wl, "drive", None) is not None:  # sends its own requests: sessions, agent, replay, embeddings
            return await self._run_driven(session, model, headers, wname, wl, load)
        n = self._n_requests(load)
        pool_n = min(n, 512) if c.duration_s else n
        label = load.label
        pool = await self._build_specs(wl, pool_n, f"{wname} {label}")
        run = StepRun()
        if c.warmup:
            wu = await self._build_specs(
                self.workload_factory(wname, seed=step_seed + 7), c.warmup, f"{wname} {label} warmup"
            )
        verdict = self.observer.before_step(wname, label)
        if isinstance(verdict, Skip):
            return verdict
        if c.warmup:
            wload = LoadModel(kind="closed", concurrency=min(len(wu), max(1, load.concurrency)))
            self.observer.on_event(StepStarted(wname, label, warmup=True, total=len(wu)))
            warm = StepRun()
            await self._load(session, model, headers, wu, len(wu), wload, label, warmup=True, seed=0, run=warm)
            run.lost += warm.lost  # a worker lost in the warmup is named in the step it did not take part in
        self.observer.on_event(
            StepStarted(
                wname,
                label,
                warmup=False,
                total=None if (c.duration_s and c.requests is None) else n,
                duration_s=c.duration_s,
            )
        )
        t_start = time.time()
        try:
            await self._load(session, model, headers, pool, n, load, label, warmup=False, seed=step_seed, run=run)
        except asyncio.CancelledError:
            # interrupted (Ctrl-C): summarise what finished, marked partial, before giving up
            if run.batches or any(r.end_ns is not None for r in run.records):
                self._partial_step(wname, load, run, t_start)
            raise
        step = self._step(wname, load, run, t_start)
        extra = getattr(wl, "summary_extra", None)  # a set's own typed figures (its text, its corpus)
        return step if extra is None else with_fields(step, extra())

    async def _run_driven(
        self,
        session: aiohttp.ClientSession,
        model: str,
        headers: dict[str, str] | None,
        wname: str,
        wl: Any,
        load: LoadModel,
    ) -> StepSummary | Skip:
        """One step of a workload that sends its own requests (:class:`servelab.bench.load.driven.DrivenWorkload`:
        multi-turn sessions, agent loops, trace replay, embeddings): ``wl.drive(...)`` under the step's load
        (or ``wl.fixed_load``, a trace's own schedule), every request ending through ``_on_done`` (its
        ``requests.jsonl`` line); the step is summarised like any other plus ``wl.step_extra(records)``, the
        workload's own typed figures. No warmup: its first requests are part of what it measures."""
        load = getattr(wl, "fixed_load", None) or load
        verdict = self.observer.before_step(wname, load.label)
        if isinstance(verdict, Skip):
            return verdict
        run = StepRun(dispatch_ns=[] if load.kind == "open" else None)
        self.observer.on_event(StepStarted(wname, load.label, warmup=False, total=getattr(wl, "total", None)))
        meter = CpuMeter().start()
        t_start = time.time()
        first = self._next_id
        try:
            await wl.drive(
                session,
                self.cfg.base_url,
                model,
                load,
                headers=headers,
                first_id=first,
                step=load.label,
                timeout_s=self.cfg.timeout_s,
                on_done=self._on_done,
                records=run.records,
                dispatch_lags_ns=run.dispatch_ns,
                traceparent=self.tracer.ids.header if self.tracer is not None else None,
            )
        except asyncio.CancelledError:
            if any(r.end_ns is not None for r in run.records):
                self._partial_step(wname, load, run, t_start)
            raise
        finally:
            self._next_id = first + len(run.records)
        recs = run.finished()
        run.workers = [this_process(meter, load, recs, None, run.dispatch_ns)]
        return with_fields(self._step(wname, load, run, t_start), wl.step_extra(recs))

    def _check_fits(self, server: dict[str, Any]) -> None:
        """Raise :class:`ConfigError` when a workload's prompts can reach the server's context per
        request (``server["context_tokens"]``, when the server reports it): those requests could
        only fail."""
        ctx = server.get("context_tokens")
        if not ctx:
            return
        for wname in self.cfg.workloads:
            need = getattr(self.workload_factory(wname, seed=self.cfg.seed), "max_input_tokens", None)
            if need and need >= ctx:
                raise ConfigError(
                    f"{wname} prompts reach {need} tokens but the server takes {ctx} tokens per "
                    f"request ({server.get('context_source')}): lower --set {wname}.input_tokens "
                    f"or give the server a larger context (--engine-ctx)"
                )

    async def _build_specs(self, wl: Any, n: int, what: str) -> list[RequestSpec]:
        """The first ``n`` request specs of workload ``wl``, built one at a time so that a stop signal
        is handled between two prompts and, when building takes over :data:`_PREPARE_NOTICE_S`
        seconds (very long prompts), progress is reported (:class:`Preparing`, then :class:`PromptBuilt`)."""
        make = getattr(wl, "request", None)
        if make is None:  # a caller's own generator with only requests(n)
            return list(wl.requests(n))
        out: list[RequestSpec] = []
        t0 = last_yield = time.monotonic()
        shown = False
        for i in range(n):
            out.append(make(i))
            now = time.monotonic()
            if shown:
                self.observer.on_event(PromptBuilt())
            elif now - t0 > _PREPARE_NOTICE_S:
                shown = True
                self.observer.on_event(Preparing(what, total=n, done=i + 1))
            if now - last_yield > 0.02:  # let the loop run signal handlers (SIGTERM) between prompts
                await asyncio.sleep(0)
                last_yield = time.monotonic()
        return out

    @property
    def _tokenizer(self) -> str | None:
        return getattr(self.counter, "name", None) if self.counter is not None else None
