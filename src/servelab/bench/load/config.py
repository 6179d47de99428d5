"""The settings of a bench run (:class:`BenchConfig`, validated once with a one-line error per bad
value), the load steps they ask for (:func:`plan_loads`) and the run directory (:func:`make_run_dir`)."""

from __future__ import annotations

import re
from dataclasses import field
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, ValidationError, field_validator, model_validator
from pydantic.dataclasses import dataclass as pydantic_dataclass

from servelab.bench.load.saturation import DEFAULT_LAG_BOUND_S
from servelab.bench.load.step import LoadModel
from servelab.bench.options import (
    MAX_BURSTINESS,
    MAX_CONCURRENCY,
    MAX_RATE_RPS,
    MAX_REQUESTS_PER_STEP,
    MAX_STEP_S,
    MAX_WORKERS,
    MIN_BURSTINESS,
    MIN_RATE_RPS,
    ConcurrencyList,
    NameList,
    RateList,
    config_error,
    opt,
)
from servelab.wire.client import ConfigError

__all__ = ["BenchConfig", "make_run_dir", "plan_loads"]

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
    workloads: NameList = opt(
        default_factory=lambda: ["short-qa"],
        cli="--workload",
        min_length=1,
        hint="list built-in sets, e.g. -w short-qa,rag",
    )
    concurrency: ConcurrencyList = opt(
        default_factory=lambda: [1, 2, 4, 8],
        cli="--concurrency",
        min_length=1,
        hint=f"list requests in flight, 1 to {MAX_CONCURRENCY} each, e.g. --concurrency 1,2,4,8",
    )
    rates_rps: RateList | None = opt(
        None,
        cli="--rate",
        min_length=1,
        hint=f"list arrival rates from {MIN_RATE_RPS:g} to {MAX_RATE_RPS:g} requests/s, e.g. --rate 0.5,1,2",
    )
    arrival: Literal["constant", "poisson", "gamma"] = opt(
        "poisson", cli="--arrival", hint="use constant, poisson or gamma"
    )
    gamma_shape: float = opt(
        0.5,
        cli="--burstiness",
        ge=MIN_BURSTINESS,
        le=MAX_BURSTINESS,
        **_FLOAT,
        hint=f"give the gamma shape k from {MIN_BURSTINESS:g} to {MAX_BURSTINESS:g} "
        "(1 = Poisson, < 1 burstier), e.g. --burstiness 0.5",
    )
    max_concurrency: int | None = opt(
        None,
        cli="--max-concurrency",
        ge=1,
        le=MAX_CONCURRENCY,
        hint="give a cap >= 1 on requests in flight, or leave it out for none",
    )
    requests: int | None = opt(
        32,
        cli="--requests",
        ge=1,
        le=MAX_REQUESTS_PER_STEP,
        hint=f"give measured requests per step, 1 to {MAX_REQUESTS_PER_STEP}, e.g. -n 32",
    )
    duration_s: float | None = opt(
        None, cli="--duration", gt=0, le=MAX_STEP_S, **_FLOAT, hint="give seconds per step > 0, e.g. --duration 60"
    )
    warmup: int = opt(
        2,
        cli="--warmup",
        ge=0,
        le=MAX_REQUESTS_PER_STEP,
        hint="give warmup requests per step >= 0 (0 = none), e.g. --warmup 2",
    )
    seed: int = opt(0, cli="--seed", ge=0, lt=2**63, hint="give an integer >= 0, e.g. --seed 0")
    slo: str | None = opt(
        None,
        cli="--slo",
        min_length=1,
        hint="leave --slo out for none, or give e.g. --slo 'ttft_p95<=500ms,error_rate<=1%'",
    )
    stop_on_slo: bool = True
    timeout_s: float = opt(
        600.0,
        cli="--timeout",
        gt=0,
        le=7 * 86400,
        **_FLOAT,
        hint="give the per-request limit in seconds, e.g. --timeout 120",
    )
    endpoint: Literal["chat", "completions", "embeddings", "rerank", "messages", "responses"] = opt(
        "chat", cli="--endpoint", hint="use chat, completions, embeddings, rerank, messages or responses"
    )
    ignore_eos: bool = False
    dataset: str | None = None
    tokenizer: str | None = None
    workload_overrides: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None
    out: str = opt("runs/bench", cli="--out", min_length=1, hint="name a run directory, e.g. --out runs/r1")
    workers: int = opt(
        1,
        cli="--workers",
        ge=1,
        le=MAX_WORKERS,
        hint=f"give load-generator processes (or Ray actors), 1 to {MAX_WORKERS}, e.g. --workers 4",
    )
    workers_per_node: int | None = opt(
        None,
        cli="--workers-per-node",
        ge=1,
        le=MAX_WORKERS,
        hint="give Ray actors per cluster node, e.g. --workers-per-node 2 (with --ray)",
    )
    ray: str | None = opt(
        None, cli="--ray", min_length=1, hint="give the Ray cluster address, e.g. --ray auto or --ray 10.0.0.1:6379"
    )
    lag_bound_ms: float = opt(
        DEFAULT_LAG_BOUND_S * 1e3,
        cli="--lag-bound-ms",
        gt=0,
        le=3.6e6,
        **_FLOAT,
        hint="give the schedule-lag P99 (ms) above which a step is generator-bound, e.g. --lag-bound-ms 1",
    )

    otlp_endpoint: str | None = opt(
        None,
        cli="--otlp-endpoint",
        max_length=2048,
        hint="give the collector's OTLP/HTTP traces URL, e.g. --otlp-endpoint http://127.0.0.1:4318/v1/traces",
    )
    otlp_sample_ratio: float | None = opt(
        None,
        cli="--otlp-sample-ratio",
        ge=0,
        le=1,
        **_FLOAT,
        hint="give the share of requests traced, 0 to 1, e.g. --otlp-sample-ratio 0.1 (default 1)",
    )

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^https?://[^/\s]+", v.strip()):
            raise ValueError("not an http(s) URL")
        return v.strip() if v is not None else None

    @model_validator(mode="after")
    def _otlp(self) -> BenchConfig:
        if self.otlp_sample_ratio is not None and self.otlp_endpoint is None:
            raise ValueError(
                f"--otlp-sample-ratio {self.otlp_sample_ratio:g} samples the spans --otlp-endpoint exports: "
                "add --otlp-endpoint URL, or leave the ratio out"
            )
        if self.otlp_endpoint is not None and self.ray is not None:
            raise ValueError(
                "--otlp-endpoint traces requests sent from this host (here or by --workers N); it does not "
                "yet trace those of --ray workers: drop one of them"
            )
        return self

    @model_validator(mode="after")
    def _workers(self) -> BenchConfig:
        if self.workers_per_node is not None and self.ray is None:
            raise ValueError(
                "--workers-per-node places Ray actors on every node: add --ray ADDRESS "
                "(or use --workers N for processes on this host)"
            )
        if self.workers_per_node is not None and self.workers != 1:
            raise ValueError("give --workers N (in total) or --workers-per-node N (with --ray), not both")
        if self.max_concurrency is not None and self.max_concurrency < self.workers:
            raise ValueError(
                f"--max-concurrency {self.max_concurrency} is split among the workers, so it must be at "
                f"least --workers {self.workers}; raise it or lower --workers"
            )
        return self

    @model_validator(mode="after")
    def _requests_or_duration(self) -> BenchConfig:
        if self.requests is None and self.duration_s is None:
            raise ValueError("give --requests N or --duration S: each step needs an end")
        if self.rates_rps and self.duration_s and self.requests is None:
            arrivals = max(self.rates_rps) * self.duration_s
            if arrivals > MAX_REQUESTS_PER_STEP:
                raise ValueError(
                    f"--rate {max(self.rates_rps):g} for --duration {self.duration_s:g} s schedules "
                    f"{arrivals:.3g} arrivals in a step, more than {MAX_REQUESTS_PER_STEP}; lower one"
                )
        if self.rates_rps:  # the slowest step must expect its arrivals within servelab's horizon
            lo = min(self.rates_rps)
            if self.duration_s and lo * self.duration_s < 1:
                raise ValueError(
                    f"--rate {lo:g} over --duration {self.duration_s:g} s expects "
                    f"{lo * self.duration_s:.3g} arrivals, less than one per step; raise the rate "
                    "or the duration"
                )
            if self.requests is not None and (self.requests + self.warmup) / lo > MAX_STEP_S:
                raise ValueError(
                    f"--rate {lo:g} spreads {self.requests + self.warmup} requests (with warmup) over "
                    f"{(self.requests + self.warmup) / lo:.3g} s, more than {MAX_STEP_S} s (7 days) "
                    "per step; raise the rate or lower --requests"
                )
        return self

    @classmethod
    def checked(cls, **values: Any) -> BenchConfig:
        """``BenchConfig(**values)``, raising :class:`ConfigError` (one line: option, value, fix)
        instead of :class:`pydantic.ValidationError`."""
        try:
            return cls(**values)
        except ValidationError as e:
            raise config_error(e, cls.__pydantic_fields__) from None  # type: ignore[attr-defined]  # set by @pydantic_dataclass


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
        raise ConfigError(
            f"--out {out}: cannot create or write the run directory ({e.strerror or e}); pass a writable directory"
        ) from None


def plan_loads(cfg: BenchConfig) -> list[LoadModel]:
    """The load steps of a run, in sweep order: one open-loop step per rate of ``cfg.rates_rps``,
    else one closed-loop step per concurrency of ``cfg.concurrency``."""
    if cfg.rates_rps:
        return [
            LoadModel(
                kind="open",
                rate_rps=r,
                arrival=cfg.arrival,
                gamma_shape=cfg.gamma_shape,
                max_concurrency=cfg.max_concurrency,
                duration_s=cfg.duration_s,
            )
            for r in cfg.rates_rps
        ]
    return [LoadModel(kind="closed", concurrency=n, duration_s=cfg.duration_s) for n in cfg.concurrency]
