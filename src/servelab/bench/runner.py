"""Runs a benchmark: preflight, warmup, load steps (a sweep that stops raising load once an SLO
breaks), per-request JSONL written as requests finish, ``summary.json`` and identity.

The run directory (``out``) holds:

- ``config.json`` — the benchmark settings as given;
- ``identity.json`` — servelab version, host CPU/RAM, the server's identity (``/v1/models``, llama-server
  ``/props``, the engine launcher's identity when servelab started the engine);
- ``requests.jsonl`` — one line per finished request (warmup included, marked), appended and flushed as
  each ends, so Ctrl-C or a crash keeps everything already measured;
- ``summary.json`` — per workload and load step: the metrics of :mod:`servelab.bench.metrics`, counts,
  SLO verdicts (schema in docs/summary-schema.md); rewritten after every step.
"""

from __future__ import annotations

import asyncio
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from servelab import __version__
from servelab.bench import metrics as M
from servelab.bench.load import LoadModel, run_step
from servelab.bench.slo import Objective, apply_gates, evaluate
from servelab.wire.client import ConfigError, make_session
from servelab.wire.types import RequestRecord, RequestSpec

SUMMARY_SCHEMA_VERSION = 1


@dataclass
class BenchConfig:
    """Settings of one benchmark run (what ``servelab bench`` options map to).

    ``steps`` are concurrency levels (closed loop) or, when ``rates_rps`` is set, arrival rates in
    requests/s (open loop). ``requests`` is per step (measured requests, warmup excluded);
    ``duration_s`` instead bounds each step by time. ``warmup`` requests run before each step at the
    step's load and are excluded from its statistics.
    """

    base_url: str
    model: str | None = None
    workloads: list[str] = field(default_factory=lambda: ["short-qa"])
    concurrency: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    rates_rps: list[float] | None = None
    arrival: str = "poisson"
    gamma_shape: float = 0.5
    max_concurrency: int | None = None
    requests: int | None = 32
    duration_s: float | None = None
    warmup: int = 2
    seed: int = 0
    slo: str | None = None
    stop_on_slo: bool = True
    timeout_s: float = 600.0
    endpoint: str = "chat"
    ignore_eos: bool = False
    dataset: str | None = None
    tokenizer: str | None = None
    workload_overrides: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    out: str = "runs/bench"


class CyclicSpecs(Sequence[RequestSpec]):
    """``n`` requests drawn cyclically from a finite pool (duration-bounded steps need more requests
    than are worth generating with exact token lengths). Immutable, indexable."""

    def __init__(self, pool: list[RequestSpec], n: int) -> None:
        if not pool:
            raise ValueError("empty request pool")
        self._pool, self._n = pool, n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if not -self._n <= i < self._n:
            raise IndexError(i)
        return self._pool[i % len(self._pool)]


def host_identity() -> dict[str, Any]:
    """CPU model, logical cores, RAM bytes, OS and Python of the machine running the load."""
    import psutil

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": cpu, "logical_cores": os.cpu_count(), "ram_bytes": psutil.virtual_memory().total,
            "os": platform.platform(), "python": sys.version.split()[0]}


def record_to_json(r: RequestRecord) -> dict[str, Any]:
    """One ``requests.jsonl`` line. Times: derived metrics in seconds plus raw monotonic-ns stamps;
    ``chunk_offsets_ms`` are token-chunk arrival times relative to ``sent``."""
    sent = r.sent_ns or 0
    d: dict[str, Any] = {
        "id": r.request_id, "step": r.step, "workload": r.workload, "warmup": r.warmup,
        "status": r.status, "failure": r.failure.value if r.failure else None,
        "error": asdict(r.error) if r.error else None,
        "finish_reason": r.finish_reason, "finish_reason_raw": r.finish_reason_raw,
        "prompt_tokens": r.prompt_tokens, "prompt_tokens_target": r.prompt_tokens_target,
        "output_tokens": r.output_tokens, "output_tokens_source": r.output_tokens_source,
        "client_output_tokens": r.client_output_tokens, "cached_tokens": r.cached_tokens,
        "max_tokens": r.max_tokens,
        "ttft_s": M.ttft_s(r), "ttfat_s": M.ttfat_s(r), "e2e_s": M.e2e_s(r), "tpot_s": M.tpot_s(r),
        "schedule_lag_s": M.schedule_lag_s(r), "gate_failures": r.gate_failures,
        "events": r.events, "saw_done": r.saw_done, "response_model": r.response_model,
        "conn_retries": r.conn_retries,
        "t_ns": {k: getattr(r, f"{k}_ns") for k in ("scheduled", "sent", "headers", "first_byte", "first_event",
                                                     "first_token", "first_answer", "last_token", "done", "end")},
        "chunk_offsets_ms": [(t - sent) // 1000 / 1000 for t in r.chunk_ns],  # µs resolution
        "text": r.content_text,
    }
    if any(r.chunk_tokens):
        d["chunk_tokens"] = r.chunk_tokens
    if r.reasoning:
        d["reasoning"] = r.reasoning_text
    if r.tool_calls:
        d["tool_calls"] = [asdict(t) for t in r.tool_calls.values()]
    return d


async def preflight(session: aiohttp.ClientSession, base_url: str, model: str | None,
                    headers: dict[str, str] | None) -> tuple[str, dict[str, Any]]:
    """Check that ``base_url`` is an OpenAI-compatible API root before any load is sent.

    Returns ``(model, server_identity)``. Raises :class:`ConfigError` with one line that names the
    problem and the fix: connection refused/unreachable, a 404 (wrong path), a non-JSON or
    non-OpenAI answer, or no model name available.
    """
    ident: dict[str, Any] = {"base_url": base_url}
    try:
        async with session.get(base_url + "/models", headers=headers,
                               timeout=aiohttp.ClientTimeout(total=15)) as resp:
            body = await resp.read()
            ident["server_header"] = resp.headers.get("Server")
            if resp.status == 404:
                if base_url.endswith("/v1"):
                    raise ConfigError(f"{base_url}/models answered 404: this server has no OpenAI /v1/models "
                                      f"endpoint; is it an OpenAI-compatible inference server? check --url")
                raise ConfigError(f"{base_url}/models answered 404: --url must be the OpenAI API root, "
                                  f"usually ending in /v1 (e.g. http://127.0.0.1:8080/v1)")
            if resp.status in (401, 403):
                raise ConfigError(f"{base_url}/models answered {resp.status}: the server wants an API key; "
                                  f"pass --api-key or set OPENAI_API_KEY")
            if resp.status >= 400:
                raise ConfigError(f"{base_url}/models answered HTTP {resp.status}: "
                                  f"{body[:120].decode('utf-8', 'replace')!r}; is the server ready?")
            try:
                models = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise ConfigError(f"{base_url}/models did not answer JSON (got {body[:60]!r}): "
                                  f"this is not an OpenAI-compatible server, check --url") from None
            if not isinstance(models, dict) or not isinstance(models.get("data"), list):
                raise ConfigError(f"{base_url}/models answered JSON without a 'data' list: "
                                  f"this is not an OpenAI-compatible server, check --url")
    except (aiohttp.ClientConnectorError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
        raise ConfigError(f"cannot connect to {base_url} ({e.__class__.__name__}): is the server running? "
                          f"start one with 'servelab engine up llamacpp' or fix --url") from None
    except TimeoutError:
        raise ConfigError(f"{base_url}/models did not answer within 15 s: is the server up and reachable?") from None
    ident["models"] = [m.get("id") for m in models["data"] if isinstance(m, dict)]
    if model is None:
        if not ident["models"]:
            raise ConfigError(f"{base_url}/models lists no model: pass --model NAME")
        model = str(ident["models"][0])
    root = base_url[:-3] if base_url.endswith("/v1") else base_url
    try:  # llama-server describes itself at /props (build, slots, context, model path)
        async with session.get(root + "/props", headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200 and "json" in resp.headers.get("Content-Type", ""):
                props = await resp.json(loads=orjson.loads)
                ident["llamacpp_props"] = {k: props.get(k) for k in ("build_info", "model_path", "total_slots",
                                                                    "chat_template") if k in props}
                dgs = props.get("default_generation_settings") or {}
                if "n_ctx" in dgs:
                    ident["llamacpp_props"]["n_ctx"] = dgs["n_ctx"]
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return model, ident


class Bench:
    """A benchmark run (see module doc). ``run()`` returns the summary dict and leaves the run
    directory complete; progress is reported through ``progress(event, **info)`` callbacks."""

    def __init__(self, cfg: BenchConfig, objectives: list[Objective], workload_factory: Callable[..., Any],
                 counter: Any = None, engine_identity: dict[str, Any] | None = None,
                 progress: Callable[..., None] | None = None) -> None:
        self.cfg = cfg
        self.objectives = objectives
        self.workload_factory = workload_factory
        self.counter = counter
        self.engine_identity = engine_identity
        self.progress = progress or (lambda *a, **k: None)
        self.out = Path(cfg.out)
        self.summary: dict[str, Any] = {}
        self._jsonl: Any = None
        self._next_id = 0

    def _on_done(self, rec: RequestRecord, spec: RequestSpec) -> None:
        if rec.failure is None:
            if self.counter is not None:
                rec.client_output_tokens = self.counter.count(rec.content_text + rec.reasoning_text)
                if rec.output_tokens_source == "chunks":  # no usage came: the tokenizer is the better fallback
                    rec.output_tokens = rec.client_output_tokens
                    rec.output_tokens_source = "tokenizer"
            if not rec.warmup:
                apply_gates(rec, spec, self.objectives)
        self._jsonl.write(orjson.dumps(record_to_json(rec)) + b"\n")
        self._jsonl.flush()
        self.progress("request", rec=rec)

    def _write_summary(self) -> None:
        tmp = self.out / "summary.json.tmp"
        tmp.write_bytes(orjson.dumps(self.summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))
        tmp.replace(self.out / "summary.json")

    def _loads(self) -> list[LoadModel]:
        c = self.cfg
        if c.rates_rps:
            return [LoadModel(kind="open", rate_rps=r, arrival=c.arrival, gamma_shape=c.gamma_shape,
                              max_concurrency=c.max_concurrency, duration_s=c.duration_s) for r in c.rates_rps]
        return [LoadModel(kind="closed", concurrency=n, duration_s=c.duration_s) for n in c.concurrency]

    def _n_requests(self, load: LoadModel) -> int:
        c = self.cfg
        if c.requests is not None:
            return c.requests
        assert c.duration_s is not None
        if load.kind == "open":
            return int(load.rate_rps * c.duration_s * 1.5) + 16  # type: ignore[operator]
        return 10**7  # closed loop by duration: the deadline ends it; specs are drawn cyclically

    async def run(self) -> dict[str, Any]:
        """Run every workload's sweep; returns the summary (also written to ``summary.json``)."""
        c = self.cfg
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
        cfg_json = asdict(c)
        cfg_json.pop("api_key", None)
        loads = self._loads()
        max_conc = max([ld.concurrency for ld in loads] + [c.max_concurrency or 0])
        async with make_session(max_connections=0) as session:
            model, server = await preflight(session, c.base_url, c.model, headers)
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "config.json").write_bytes(orjson.dumps(cfg_json, option=orjson.OPT_INDENT_2))
            self.progress("ready", model=model)
            identity = {"servelab_version": __version__, "host": host_identity(), "server": server,
                        "engine": self.engine_identity, "model": model,
                        "tokenizer": getattr(self.counter, "name", None),
                        "token_counts": "server usage (stream_options.include_usage); client tokenizer "
                                        "count kept as a cross-check"}
            (self.out / "identity.json").write_bytes(orjson.dumps(identity, option=orjson.OPT_INDENT_2))
            self.summary = {"schema_version": SUMMARY_SCHEMA_VERSION, "servelab_version": __version__,
                            "model": model, "base_url": c.base_url,
                            "slo": [o.name for o in self.objectives], "steps": [],
                            "started_unix_s": time.time(), "complete": False}
            self._write_summary()
            self._jsonl = open(self.out / "requests.jsonl", "ab")
            try:
                for wi, wname in enumerate(c.workloads):
                    broken_at: str | None = None
                    for si, load in enumerate(loads):
                        if broken_at is not None:
                            skipped = {"workload": wname, "step": load.label, "load": asdict(load), "skipped": True,
                                       "skipped_reason": f"SLO broken at step {broken_at}"}
                            self.summary["steps"].append(skipped)
                            self.progress("step_done", summary=skipped)
                            continue
                        step = await self._run_one(session, model, headers, wname, wi, si, load, max_conc)
                        self.summary["steps"].append(step)
                        self._write_summary()
                        self.progress("step_done", summary=step)
                        if self.objectives and not step["slo_met"] and c.stop_on_slo:
                            broken_at = load.label
                self.summary["complete"] = True
            finally:
                self.summary["finished_unix_s"] = time.time()
                self._write_summary()
                self._jsonl.close()
        return self.summary

    async def _run_one(self, session: aiohttp.ClientSession, model: str, headers: dict[str, str] | None,
                       wname: str, wi: int, si: int, load: LoadModel, max_conc: int) -> dict[str, Any]:
        c = self.cfg
        step_seed = c.seed + 1000 * si + 100_000 * wi  # distinct prompts per step: no cross-step prompt-cache hits
        n = self._n_requests(load)
        wl = self.workload_factory(wname, seed=step_seed)
        pool_n = min(n, 512) if c.duration_s else n
        pool = wl.requests(pool_n)
        specs: Sequence[RequestSpec] = pool if pool_n == n else CyclicSpecs(pool, n)
        label = load.label
        if c.warmup:
            wu = self.workload_factory(wname, seed=step_seed + 7).requests(c.warmup)
            wload = LoadModel(kind="closed", concurrency=min(len(wu), max(1, load.concurrency)))
            self.progress("step", workload=wname, step=label, warmup=True, total=len(wu))
            wrecs = await run_step(session, c.base_url, model, wu, wload, step=label, warmup=True,
                                   first_id=self._next_id, timeout_s=c.timeout_s, headers=headers, on_done=self._on_done)
            self._next_id += len(wrecs)
        self.progress("step", workload=wname, step=label, warmup=False,
                      total=None if (c.duration_s and c.requests is None) else n, duration_s=c.duration_s)
        t_start = time.time()
        partial: list[RequestRecord] = []
        try:
            recs = await run_step(session, c.base_url, model, specs, load, step=label, seed=step_seed,
                                  first_id=self._next_id, timeout_s=c.timeout_s, headers=headers,
                                  on_done=self._on_done, records=partial)
        except asyncio.CancelledError:
            # interrupted (Ctrl-C): summarise what finished, marked partial, before giving up
            done = [r for r in partial if r.end_ns is not None]
            if done:
                s = M.summarize(done)
                self.summary["steps"].append({"workload": wname, "step": label, "load": asdict(load),
                                              "started_unix_s": t_start, "skipped": False, "partial": True, **s,
                                              "slo": evaluate(self.objectives, s), "slo_met": False,
                                              "token_check": self._token_check(done)})
            raise
        self._next_id += len(recs)
        s = M.summarize(recs)
        verdicts = evaluate(self.objectives, s)
        out: dict[str, Any] = {"workload": wname, "step": label, "load": {k: v for k, v in asdict(load).items()},
                               "started_unix_s": t_start, "skipped": False, **s,
                               "slo": verdicts, "slo_met": all(v["met"] for v in verdicts)}
        out["token_check"] = self._token_check(recs)
        return out

    def _token_check(self, recs: list[RequestRecord]) -> dict[str, Any] | None:
        """Client tokenizer vs server usage for output tokens: the discrepancy is reported, not hidden."""
        if self.counter is None:
            return None
        pairs = [(r.client_output_tokens, r.output_tokens) for r in recs
                 if not r.warmup and r.failure is None and r.output_tokens_source == "usage"
                 and r.client_output_tokens is not None and r.output_tokens is not None]
        if not pairs:
            return {"tokenizer": self.counter.name, "compared": 0}
        diffs = [a - b for a, b in pairs]
        return {"tokenizer": self.counter.name, "compared": len(pairs),
                "exact": sum(1 for d in diffs if d == 0),
                "mean_diff_tokens": sum(diffs) / len(diffs),
                "max_abs_diff_tokens": max(abs(d) for d in diffs)}
