"""Runs a benchmark: preflight, warmup, load steps (a sweep that stops raising load once an SLO
breaks), per-request JSONL written as requests finish, ``summary.json`` and identity.

The run directory (``out``) holds:

- ``config.json`` — the benchmark settings as given;
- ``identity.json`` — servelab version, host CPU/RAM, the server's identity (``/v1/models``, llama-server
  ``/props``, the engine launcher's identity when servelab started the engine);
- ``requests.jsonl`` — one line per finished request (warmup included, marked), appended and flushed as
  each ends, so Ctrl-C, SIGTERM or kill -9 keeps everything already measured (``servelab summarize
  DIR`` rebuilds the summary from it, :mod:`servelab.bench.rebuild`);
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
from dataclasses import asdict, field
from pathlib import Path
from typing import Any, Literal

import aiohttp
import orjson
from pydantic import ConfigDict, ValidationError, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from servelab import __version__
from servelab.bench import metrics as M
from servelab.bench.load import LoadModel, run_step
from servelab.bench.results import SUMMARY_SCHEMA_VERSION, RequestLine, Summary
from servelab.bench.options import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_RATE_RPS,
    MAX_REQUESTS_PER_STEP,
    MAX_STEP_S,
    MIN_BURSTINESS,
    MIN_RATE_RPS,
    ConcurrencyList,
    NameList,
    RateList,
    config_error,
    opt,
)
from servelab.bench.slo import Objective, apply_gates, evaluate
from servelab.wire.client import ConfigError, make_session
from servelab.wire.types import FailureClass, RequestRecord, RequestSpec, ToolCall, WireError

_PREPARE_NOTICE_S = 1.0  # building a step's prompts for longer than this shows a progress bar


_FLOAT = {"allow_inf_nan": False}


@pydantic_dataclass(config=ConfigDict(extra="forbid"))
class BenchConfig:
    """Settings of one benchmark run (what ``servelab bench`` options map to), validated on creation.

    ``steps`` are concurrency levels (closed loop) or, when ``rates_rps`` is set, arrival rates in
    requests/s (open loop). ``requests`` is per step (measured requests, warmup excluded);
    ``duration_s`` instead bounds each step by time (at least one of the two is set). ``warmup``
    requests run before each step at the step's load and are excluded from its statistics.
    ``timeout_s`` is the whole-request limit, seconds. Every constraint is declared here once
    (:mod:`servelab.bench.options`); a bad value raises :class:`pydantic.ValidationError`, which
    :meth:`checked` turns into a one-line :class:`ConfigError` naming the ``servelab bench`` option.
    """

    base_url: str
    model: str | None = None
    workloads: NameList = opt(default_factory=lambda: ["short-qa"], cli="--workload", min_length=1,
                              hint="list built-in sets, e.g. -w short-qa,rag")
    concurrency: ConcurrencyList = opt(
        default_factory=lambda: [1, 2, 4, 8], cli="--concurrency", min_length=1,
        hint=f"list requests in flight, 1 to {MAX_CONCURRENCY} each, e.g. --concurrency 1,2,4,8")
    rates_rps: RateList | None = opt(
        None, cli="--rate", min_length=1,
        hint=f"list arrival rates from {MIN_RATE_RPS:g} to {MAX_RATE_RPS:g} requests/s, e.g. --rate 0.5,1,2")
    arrival: Literal["constant", "poisson", "gamma"] = opt(
        "poisson", cli="--arrival", hint="use constant, poisson or gamma")
    gamma_shape: float = opt(0.5, cli="--burstiness", ge=MIN_BURSTINESS, le=MAX_BURSTINESS, **_FLOAT,
                             hint=f"give the gamma shape k from {MIN_BURSTINESS:g} to {MAX_BURSTINESS:g} "
                                  "(1 = Poisson, < 1 burstier), e.g. --burstiness 0.5")
    max_concurrency: int | None = opt(None, cli="--max-concurrency", ge=1, le=MAX_CONCURRENCY,
                                      hint="give a cap >= 1 on requests in flight, or leave it out for none")
    requests: int | None = opt(32, cli="--requests", ge=1, le=MAX_REQUESTS_PER_STEP,
                               hint=f"give measured requests per step, 1 to {MAX_REQUESTS_PER_STEP}, e.g. -n 32")
    duration_s: float | None = opt(None, cli="--duration", gt=0, le=MAX_STEP_S, **_FLOAT,
                                   hint="give seconds per step > 0, e.g. --duration 60")
    warmup: int = opt(2, cli="--warmup", ge=0, le=MAX_REQUESTS_PER_STEP,
                      hint="give warmup requests per step >= 0 (0 = none), e.g. --warmup 2")
    seed: int = opt(0, cli="--seed", ge=0, lt=2**63, hint="give an integer >= 0, e.g. --seed 0")
    slo: str | None = opt(None, cli="--slo", min_length=1, hint="leave --slo out for none, or give e.g. "
                                                               "--slo 'ttft_p95<=500ms,error_rate<=1%'")
    stop_on_slo: bool = True
    timeout_s: float = opt(600.0, cli="--timeout", gt=0, le=7 * 86400, **_FLOAT,
                           hint="give the per-request limit in seconds, e.g. --timeout 120")
    endpoint: Literal["chat", "completions"] = opt("chat", cli="--endpoint", hint="use chat or completions")
    ignore_eos: bool = False
    dataset: str | None = None
    tokenizer: str | None = None
    workload_overrides: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    out: str = opt("runs/bench", cli="--out", min_length=1, hint="name a run directory, e.g. --out runs/r1")

    @model_validator(mode="after")
    def _requests_or_duration(self) -> BenchConfig:
        if self.requests is None and self.duration_s is None:
            raise ValueError("give --requests N or --duration S: each step needs an end")
        if self.rates_rps and self.duration_s and self.requests is None:
            arrivals = max(self.rates_rps) * self.duration_s
            if arrivals > MAX_REQUESTS_PER_STEP:
                raise ValueError(f"--rate {max(self.rates_rps):g} for --duration {self.duration_s:g} s schedules "
                                 f"{arrivals:.3g} arrivals in a step, more than {MAX_REQUESTS_PER_STEP}; lower one")
        if self.rates_rps:  # the slowest step must expect its arrivals within servelab's horizon
            lo = min(self.rates_rps)
            if self.duration_s and lo * self.duration_s < 1:
                raise ValueError(f"--rate {lo:g} over --duration {self.duration_s:g} s expects "
                                 f"{lo * self.duration_s:.3g} arrivals, less than one per step; raise the rate "
                                 "or the duration")
            if self.requests is not None and (self.requests + self.warmup) / lo > MAX_STEP_S:
                raise ValueError(f"--rate {lo:g} spreads {self.requests + self.warmup} requests (with warmup) over "
                                 f"{(self.requests + self.warmup) / lo:.3g} s, more than {MAX_STEP_S} s (7 days) "
                                 "per step; raise the rate or lower --requests")
        return self

    @classmethod
    def checked(cls, **values: Any) -> BenchConfig:
        """``BenchConfig(**values)``, raising :class:`ConfigError` (one line: option, value, fix)
        instead of :class:`pydantic.ValidationError`."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise config_error(e, cls.__pydantic_fields__) from None  # type: ignore[attr-defined]  # set by @pydantic_dataclass


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


def record_to_json(r: RequestRecord, **extra: Any) -> RequestLine:
    """One ``requests.jsonl`` line (:class:`~servelab.bench.results.RequestLine`; ``extra`` sets
    ``step_index``/``step_workload``/``sample_passed``). Times: derived metrics in seconds plus raw
    monotonic-ns stamps; ``chunk_offsets_ms`` are token-chunk arrival times relative to ``sent``.
    Write it with :meth:`RequestLine.to_json_bytes` (optional fields only when present)."""
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
        "t_ns": {k: getattr(r, f"{k}_ns") for k in _T_NS},
        "chunk_offsets_ms": [(t - sent) // 1000 / 1000 for t in r.chunk_ns],  # µs resolution
        "text": r.content_text,
    }
    if any(r.chunk_tokens):
        d["chunk_tokens"] = r.chunk_tokens
    if r.reasoning:
        d["reasoning"] = r.reasoning_text
    if r.tool_calls:
        d["tool_calls"] = [asdict(t) for t in r.tool_calls.values()]
    d.update(extra)
    return RequestLine.model_validate(d)


_T_NS = ("scheduled", "sent", "headers", "first_byte", "first_event", "first_token", "first_answer", "last_token",
         "done", "end")


def record_from_json(line: RequestLine | dict[str, Any]) -> RequestRecord:
    """The :class:`RequestRecord` a ``requests.jsonl`` line (:func:`record_to_json`) was written from,
    as far as the line holds it: every stamp, count and class the summary uses; chunk arrival times
    at the microsecond resolution they were written with. A parsed dict is validated first (raises
    :class:`pydantic.ValidationError`, a ``ValueError``, on a line that is not such a record)."""
    d = line if isinstance(line, RequestLine) else RequestLine.model_validate(line)
    r = RequestRecord(request_id=d.id, workload=d.workload, step=d.step, warmup=d.warmup)
    for k in ("status", "finish_reason", "finish_reason_raw", "prompt_tokens", "prompt_tokens_target",
              "output_tokens", "output_tokens_source", "client_output_tokens", "cached_tokens", "max_tokens",
              "saw_done", "response_model", "events", "conn_retries"):
        setattr(r, k, getattr(d, k))
    r.failure = FailureClass(d.failure) if d.failure is not None else None
    r.error = WireError(**d.error.model_dump()) if d.error else None
    r.gate_failures = list(d.gate_failures)
    for k in _T_NS:
        setattr(r, f"{k}_ns", getattr(d.t_ns, k))
    r.scheduled_ns = r.scheduled_ns or 0
    sent = r.sent_ns or 0
    r.chunk_ns = [sent + round(float(ms) * 1000) * 1000 for ms in d.chunk_offsets_ms]
    r.chunk_tokens = list(d.chunk_tokens or [0] * len(r.chunk_ns))
    r.content = [d.text] if d.text else []
    r.reasoning = [d.reasoning] if d.reasoning else []
    r.tool_calls = {t.index: ToolCall(**t.model_dump()) for t in d.tool_calls or []}
    return r


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
    for m in models["data"]:  # vLLM lists each model's max_model_len (prompt + output tokens per request)
        if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
            ident["context_tokens"], ident["context_source"] = m["max_model_len"], "/v1/models max_model_len"
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
                    if isinstance(dgs["n_ctx"], int) and dgs["n_ctx"] > 0:  # per slot: -c / -np
                        ident["context_tokens"] = dgs["n_ctx"]
                        ident["context_source"] = "llama-server /props n_ctx per slot"
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return model, ident


def write_summary(out: Path, summary: dict[str, Any] | Summary) -> None:
    """Write ``out/summary.json`` atomically (a temporary file renamed over it): a reader, or a
    crash mid-write, never sees half a summary. ``summary`` is validated as a
    :class:`~servelab.bench.results.Summary` (raises :class:`pydantic.ValidationError` on a field the
    schema does not know) and written with ``model_dump_json``."""
    model = summary if isinstance(summary, Summary) else Summary.model_validate(summary)
    tmp = out / "summary.json.tmp"
    tmp.write_bytes(model.to_json_bytes(indent=2))
    tmp.replace(out / "summary.json")


def make_run_dir(out: Path) -> None:
    """Create the run directory ``out`` (and its parents). Raises :class:`ConfigError` (one line)
    when it names an existing file, or cannot be created or written (permissions, read-only file
    system, a file where a parent directory should be)."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is an existing file, not a directory: name a new run directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".servelab-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot create or write the run directory ({e.strerror or e}); "
                          f"pass a writable directory") from None


def plan_loads(cfg: BenchConfig) -> list[LoadModel]:
    """The load steps of a run, in sweep order: one open-loop step per rate of ``cfg.rates_rps``,
    else one closed-loop step per concurrency of ``cfg.concurrency``."""
    if cfg.rates_rps:
        return [LoadModel(kind="open", rate_rps=r, arrival=cfg.arrival, gamma_shape=cfg.gamma_shape,
                          max_concurrency=cfg.max_concurrency, duration_s=cfg.duration_s) for r in cfg.rates_rps]
    return [LoadModel(kind="closed", concurrency=n, duration_s=cfg.duration_s) for n in cfg.concurrency]


def new_summary(model: str, base_url: str, objectives: list[Objective]) -> dict[str, Any]:
    """The top of ``summary.json`` before any step ran (``complete: false``, no steps)."""
    return {"schema_version": SUMMARY_SCHEMA_VERSION, "servelab_version": __version__, "model": model,
            "base_url": base_url, "slo": [o.name for o in objectives], "steps": [],
            "started_unix_s": time.time(), "complete": False}


def skipped_step(workload: str, load: LoadModel, broken_at: str) -> dict[str, Any]:
    """The summary entry of a step not run because step ``broken_at`` broke an SLO."""
    return {"workload": workload, "step": load.label, "load": asdict(load), "skipped": True,
            "skipped_reason": f"SLO broken at step {broken_at}"}


def step_summary(workload: str, load: LoadModel, recs: list[RequestRecord], objectives: list[Objective],
                 tokenizer: str | None, started_unix_s: float | None, partial: bool = False) -> dict[str, Any]:
    """The summary entry of one run step (docs/summary-schema.md): :func:`metrics.summarize` of
    ``recs`` (warmup records are left out by it), SLO verdicts, the token cross-check against the
    client ``tokenizer`` (name; ``None``: no check). ``partial`` marks a step that did not finish
    (interrupted, or rebuilt from an incomplete ``requests.jsonl``); a partial step never meets its SLOs.
    The one code path for both ``servelab bench`` and ``servelab summarize``."""
    s = M.summarize(recs)
    verdicts = evaluate(objectives, s)
    out: dict[str, Any] = {"workload": workload, "step": load.label, "load": asdict(load),
                           "started_unix_s": started_unix_s, "skipped": False}
    if partial:
        out["partial"] = True
    out.update(s)
    out["slo"] = verdicts
    out["slo_met"] = (not partial) and all(v["met"] for v in verdicts)
    out["token_check"] = token_check(recs, tokenizer)
    return out


def token_check(recs: list[RequestRecord], tokenizer: str | None) -> dict[str, Any] | None:
    """Client tokenizer vs server usage for output tokens: the discrepancy is reported, not hidden.
    ``None`` when no client ``tokenizer`` (name) was used."""
    if tokenizer is None:
        return None
    pairs = [(r.client_output_tokens, r.output_tokens) for r in recs
             if not r.warmup and r.failure is None and r.output_tokens_source == "usage"
             and r.client_output_tokens is not None and r.output_tokens is not None]
    if not pairs:
        return {"tokenizer": tokenizer, "compared": 0}
    diffs = [a - b for a, b in pairs]
    return {"tokenizer": tokenizer, "compared": len(pairs),
            "exact": sum(1 for d in diffs if d == 0),
            "mean_diff_tokens": sum(diffs) / len(diffs),
            "max_abs_diff_tokens": max(abs(d) for d in diffs)}


class Bench:
    """A benchmark run (see module doc). ``run()`` returns the summary dict and leaves the run
    directory complete; progress is reported through ``progress(event, **info)`` callbacks."""

    def __init__(self, cfg: BenchConfig, objectives: list[Objective], workload_factory: Callable[..., Any],
                 counter: Any = None, engine_identity: dict[str, Any] | None = None,
                 progress: Callable[..., None] | None = None, refuse_oversized: bool = False) -> None:
        self.cfg = cfg
        self.refuse_oversized = refuse_oversized
        self.objectives = objectives
        self.workload_factory = workload_factory
        self.counter = counter
        self.engine_identity = engine_identity
        self.progress = progress or (lambda *a, **k: None)
        self.out = Path(cfg.out)
        self.summary: dict[str, Any] = {}
        self._jsonl: Any = None
        self._next_id = 0
        self._step_index, self._step_workload = 0, ""

    def _on_done(self, rec: RequestRecord, spec: RequestSpec) -> None:
        if rec.failure is None:
            if self.counter is not None:
                rec.client_output_tokens = self.counter.count(rec.content_text + rec.reasoning_text)
                if rec.output_tokens_source == "chunks":  # no usage came: the tokenizer is the better fallback
                    rec.output_tokens = rec.client_output_tokens
                    rec.output_tokens_source = "tokenizer"
            if not rec.warmup:
                apply_gates(rec, spec, self.objectives)
        line = record_to_json(rec, step_index=self._step_index, step_workload=self._step_workload)
        self._jsonl.write(line.to_json_bytes() + b"\n")  # one write + flush per line: kill -9 keeps every finished one
        self._jsonl.flush()
        self.progress("request", rec=rec)

    def _write_summary(self) -> None:
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

    async def run(self) -> dict[str, Any]:
        """Run every workload's sweep; returns the summary (also written to ``summary.json``)."""
        c = self.cfg
        headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else None
        cfg_json = asdict(c)
        cfg_json.pop("api_key", None)
        loads = plan_loads(c)
        max_conc = max([ld.concurrency for ld in loads] + [c.max_concurrency or 0])
        async with make_session(max_connections=0) as session:
            model, server = await preflight(session, c.base_url, c.model, headers)
            if self.refuse_oversized:
                self._check_fits(server)
            make_run_dir(self.out)
            (self.out / "config.json").write_bytes(orjson.dumps(cfg_json, option=orjson.OPT_INDENT_2))
            self.progress("ready", model=model)
            identity = {"servelab_version": __version__, "host": host_identity(), "server": server,
                        "engine": self.engine_identity, "model": model,
                        "tokenizer": getattr(self.counter, "name", None),
                        "token_counts": "server usage (stream_options.include_usage); client tokenizer "
                                        "count kept as a cross-check"}
            (self.out / "identity.json").write_bytes(orjson.dumps(identity, option=orjson.OPT_INDENT_2))
            self.summary = new_summary(model, c.base_url, self.objectives)
            self._write_summary()
            self._jsonl = open(self.out / "requests.jsonl", "ab")
            try:
                for wi, wname in enumerate(c.workloads):
                    broken_at: str | None = None
                    for si, load in enumerate(loads):
                        if broken_at is not None:
                            skipped = skipped_step(wname, load, broken_at)
                            self.summary["steps"].append(skipped)
                            self.progress("step_done", summary=skipped)
                            continue
                        self._step_index, self._step_workload = wi * len(loads) + si, wname
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
        label = load.label
        pool = await self._build_specs(wl, pool_n, f"{wname} {label}")
        specs: Sequence[RequestSpec] = pool if pool_n == n else CyclicSpecs(pool, n)
        if c.warmup:
            wu = await self._build_specs(self.workload_factory(wname, seed=step_seed + 7), c.warmup,
                                         f"{wname} {label} warmup")
            wload = LoadModel(kind="closed", concurrency=min(len(wu), max(1, load.concurrency)))
            self.progress("step", workload=wname, step=label, warmup=True, total=len(wu))
            wrecs = await run_step(session, c.base_url, model, wu, wload, step=label, warmup=True,
                                   first_id=self._next_id, timeout_s=c.timeout_s, headers=headers,
                                   on_done=self._on_done)
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
                self.summary["steps"].append(step_summary(wname, load, done, self.objectives, self._tokenizer,
                                                          t_start, partial=True))
            raise
        self._next_id += len(recs)
        return step_summary(wname, load, recs, self.objectives, self._tokenizer, t_start)

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
                raise ConfigError(f"{wname} prompts reach {need} tokens but the server takes {ctx} tokens per "
                                  f"request ({server.get('context_source')}): lower --set {wname}.input_tokens "
                                  f"or give the server a larger context (--engine-ctx)")

    async def _build_specs(self, wl: Any, n: int, what: str) -> list[RequestSpec]:
        """The first ``n`` request specs of workload ``wl``, built one at a time so that a stop signal
        is handled between two prompts and, when building takes over :data:`_PREPARE_NOTICE_S`
        seconds (very long prompts), progress is reported (``prepare`` then ``prepared`` events)."""
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
                self.progress("prepared")
            elif now - t0 > _PREPARE_NOTICE_S:
                shown = True
                self.progress("prepare", what=what, total=n, done=i + 1)
            if now - last_yield > 0.02:  # let the loop run signal handlers (SIGTERM) between prompts
                await asyncio.sleep(0)
                last_yield = time.monotonic()
        return out

    @property
    def _tokenizer(self) -> str | None:
        return getattr(self.counter, "name", None) if self.counter is not None else None
