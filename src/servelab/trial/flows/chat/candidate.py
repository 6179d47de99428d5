"""Round 0 of one chat candidate: launch and cold start (or an existing server), the gates, the
served-behaviour checks, the load steps with the engine's metrics sampled, the goal's mix, the open-loop
runs and the lifecycle checks; the engine is stopped whatever happens, and a candidate's failure is
recorded, never raised."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import typing
from collections.abc import Callable
from pathlib import Path

from servelab.bench.results import LoadInfo, StepSummary
from servelab.engines.registry import EngineIdentity
from servelab.engines.url import UrlFields
from servelab.trial.annotate import annotate
from servelab.trial.candidate_flow import CandidateRun
from servelab.trial.candidates import Candidate
from servelab.trial.console import step_line
from servelab.trial.context import TrialContext
from servelab.trial.flows.chat.benching import ChatBench
from servelab.trial.flows.chat.openloop import EngineDied, OpenLoop
from servelab.trial.flows.chat.quality import QualityGate
from servelab.trial.identity import fill_identity
from servelab.trial.lifecycle import cancellation_text, run_lifecycle
from servelab.trial.reliability import EngineWatch, current_engine, end_watch, watch_engine
from servelab.trial.results import CandidateIdentity, CandidateResult, ColdStart, EngineExit, Host, JsonObject
from servelab.trial.served_checks import run_checks
from servelab.trial.telemetry import MetricsSampler, start_sampler
from servelab.wire.errors import ConfigError

__all__ = ["ChatCandidate"]


def _judge_lifecycle(name: str, result: CandidateResult, say: Callable[[str], None]) -> None:
    """Exclude a ranked candidate whose cancellation verdict failed (judged in
    :func:`servelab.trial.lifecycle.run_lifecycle` against ``lifecycle.cancel_max_decode_s``), the reason
    :func:`servelab.trial.lifecycle.cancellation_text`."""
    cancel = result.lifecycle.cancellation if result.lifecycle is not None else None
    if cancel is not None and cancel.verdict == "fail":
        result.status, result.reason = "excluded", cancellation_text(cancel)
        say(f"[{name}] excluded: {result.reason}")


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


class ChatCandidate:
    """Runs round 0 of chat candidates (``ctx``: the trial's)."""

    def __init__(self, ctx: TrialContext, bench: ChatBench, gate: QualityGate, open_loop: OpenLoop) -> None:
        self.ctx, self.bench, self.gate, self.open = ctx, bench, gate, open_loop

    def run(self, cand: Candidate, host: Host) -> CandidateRun:
        """Round 0 of ``cand`` (module doc); its failure is recorded in the result, never raised (but
        :class:`ConfigError` of a launched kind is: the input cannot run at all)."""
        name = cand.name
        kind = cand.kind
        started = self.ctx.budget.clock()
        cdir = self.ctx.out / "candidates" / name
        cdir.mkdir(parents=True, exist_ok=True)
        settings = cand.recorded_settings()
        identity = CandidateIdentity(engine_kind=cand.engine, settings=settings)
        result = CandidateResult(
            status="failed", reason=None, cold_start=ColdStart(), smoke={}, quality=None, steps=[], peak_rss_bytes=None
        )
        files: dict[str, str] = {}
        running = None
        ext = cand if isinstance(cand, UrlFields) else None  # a server servelab does not start
        api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
        sampler: MetricsSampler | None = None
        watch: EngineWatch | None = None
        try:
            if not kind.launched:
                if ext is None:
                    raise ConfigError(
                        f"candidate {name!r}: engine kind {cand.engine!r} is not launched by servelab and has no url"
                    )
                base_url, model = ext.url.rstrip("/"), ext.model_name
                identity.url, identity.engine = base_url, None
                identity.model = {"name": model, **_local_weights(cand.model)}
                self.ctx.say(f"[{name}] using existing server {base_url}")
            else:
                self.ctx.say(f"[{name}] starting {cand.engine} {settings}")
                running = kind.launch(cand.settings, model=cand.model, log_dir=str(cdir / "engine"))
                base_url, model = running.base_url, None
                engine = EngineIdentity.model_validate(running.identity)
                identity.engine, identity.model = engine, engine.model
                result.cold_start = ColdStart.model_validate(running.cold_start)
                try:
                    running.measure_first_token(timeout_s=120)
                except Exception as e:  # noqa: BLE001 — recorded, the smoke test will say more
                    self.ctx.say(f"[{name}] first token failed: {e}")
                cold = result.cold_start = ColdStart.model_validate(running.cold_start)
                files["engine_log"] = str(Path(running.log_path).relative_to(self.ctx.out))
                self.ctx.say(
                    f"[{name}] ready: health {cold.health_s or 0:.1f} s, first token "
                    f"{cold.first_token_s if cold.first_token_s is not None else float('nan'):.1f} s "
                    "after process start"
                )
            fill_identity(identity, base_url, api_key, cand.declared, cand.price_per_hour)  # facts + sources
            self.bench.tokenizer_for(identity)
            if not self.gate.gates(name, base_url, model, api_key, result, files):
                return CandidateRun(identity, result, files)
            result.checks = run_checks(
                self.ctx.exp.checks,
                identity,
                base_url,
                model,
                api_key,  # trial.served_checks
                budget_s=self.ctx.budget.remaining_s(),
                timeout_s=self.ctx.exp.timeout_s,
            )
            sampler = start_sampler(cand, running, base_url, api_key, cdir / "server_metrics.jsonl")  # telemetry
            files["server_metrics"] = f"candidates/{name}/server_metrics.jsonl"
            if running is not None:
                watch = watch_engine(cand, running, sampler, str(cdir / "engine"))  # crashes, restart: once
            exp = self.ctx.exp
            summary = self.bench.run(
                base_url,
                model,
                cdir / "steps",
                workloads=[w.label for w in exp.workloads],
                load=exp.steps.load_models(exp.goal.burstiness),
                requests=exp.requests_per_step,
                warmup=exp.warmup,
                objectives=self.ctx.objectives,
                stop_on_slo=exp.stop_on_slo,
                seed=exp.seed,
                sampler=sampler,
                api_key=api_key,
                on_step=lambda st: self.ctx.say(step_line(name, st)),
                budget_for=(name, started),
                spread=True,
            )
            running = current_engine(watch, running)  # the restarted one when it crashed and came back
            files["steps"] = f"candidates/{name}/steps/requests.jsonl"
            annotate(summary.steps, cdir / "steps" / "requests.jsonl", self.ctx.objectives, 0)
            result.steps = summary.steps
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the load steps (exit code {running.process.poll()})")
            if exp.mix_sweep and summary.stopped_by != "budget":
                summary.steps += self.open.mix_sweep(name, base_url, model, api_key, sampler, files, 0, started)
            elif exp.mix_sweep:  # the budget ran out in the per-workload sweeps: the mix is recorded as skipped
                self.ctx.budget.skip(f"{name}/mix")
                summary.steps += [
                    StepSummary(
                        workload="mix",
                        step=m.label,
                        skipped=True,
                        load=LoadInfo.model_validate(dataclasses.asdict(m)),
                        skipped_reason="trial budget spent (goal.budget.max_minutes)",
                    )
                    for m in exp.steps.load_models(exp.goal.burstiness)
                ]
            per_step = sampler.per_step() if sampler is not None else {}
            for st in summary.steps:
                st.server = per_step.get(st.label, {})
            result.steps = summary.steps
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the mix sweep (exit code {running.process.poll()})")
            if not any(not st.skipped for st in summary.steps):
                result.status = "failed"
                result.reason = (
                    f"not run: the trial budget ({exp.goal.budget.max_minutes:g} min, "
                    "goal.budget.max_minutes) was spent before its first load step"
                )
                self.ctx.say(f"[{name}] {result.reason}")
                return CandidateRun(identity, result, files)
            self.open.open_loop(name, base_url, model, api_key, sampler, result, files, running, summary)
            running, watch = end_watch(watch, running, result), None  # deliberate restarts below are no crashes
            cs = result.cold_start.model_dump(exclude_none=True) if result.cold_start is not None else None
            result.lifecycle, running = run_lifecycle(
                exp.lifecycle, cand, running, str(cdir / "engine"), cs, self.ctx.budget.allows
            )
            result.status = "ranked"
            _judge_lifecycle(name, result, self.ctx.say)
        except EngineDied as e:
            result.status, result.reason = "failed", str(e)
            self.ctx.say(f"[{name}] failed: {e}")
        except ConfigError as e:
            if ext is None or kind.launched:
                raise
            # an external server that is down or not OpenAI-compatible fails this candidate, not the trial
            result.status, result.reason = "failed", f"external server {ext.url}: {e}"
            self.ctx.say(f"[{name}] failed: {result.reason}")
        except Exception as e:  # noqa: BLE001 — one candidate's failure must not end the trial
            result.status, result.reason = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.ctx.say(f"[{name}] failed: {result.reason}")
        finally:
            running = end_watch(watch, running, result)  # result.reliability; the engine to stop
            if sampler is not None:
                sampler.stop()
                result.peak_rss_bytes = sampler.peak_rss_bytes or None
                result.telemetry = sampler.telemetry([*result.steps, result.arrival_run])  # per-step records
                result.peak_gpu_memory_bytes = result.telemetry.peak_gpu_memory_bytes
            if running is not None:
                if result.peak_rss_bytes is None:
                    with contextlib.suppress(Exception):  # the process may be gone: no figure, no error
                        result.peak_rss_bytes = running.peak_rss_bytes() or None
                running.stop()
                result.engine_exit = EngineExit(returncode=running.returncode, alive_after_stop=running.alive)
        return CandidateRun(identity, result, files)
