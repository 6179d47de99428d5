"""What load an experiment sends (``workloads:``, ``steps:``, ``arrival_test:``, ``capacity_search:``,
``load_generator:``): the workload items, the load steps, the open-loop arrival test, the capacity search
and who generates the load."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator
from pydantic.json_schema import JsonSchemaValue

from servelab.bench.load.step import LoadModel
from servelab.bench.options import MAX_CONCURRENCY, MAX_RATE_RPS, MAX_REQUESTS_PER_STEP
from servelab.bench.workloads.registry import WORKLOADS, make_workload
from servelab.trial.spec_fields import resolve_path
from servelab.wire.config import StrictModel, suggest
from servelab.wire.errors import ConfigError

__all__ = [
    "ArrivalTest",
    "CapacitySearch",
    "LoadGenerator",
    "Steps",
    "WorkloadItem",
    "default_steps",
    "default_workloads",
]


class WorkloadItem(StrictModel):
    """One workload: a built-in set by ``name`` (a key of :data:`servelab.bench.workloads.registry.WORKLOADS`)
    with optional ``set`` overrides (the bench's ``--set``: ``input_tokens``, ``output_tokens`` in
    tokens, ``ratio``, ``lang``, …), or a ``dataset`` (JSONL/ShareGPT file, relative to the experiment
    file) whose entries without a length get ``max_tokens_default`` tokens. In YAML a bare name
    (``short-qa``) means ``{name: short-qa}``."""

    name: Annotated[
        str | None,
        WithJsonSchema(
            {
                "anyOf": [{"type": "string", "enum": list(WORKLOADS)}, {"type": "null"}],
                "default": None,
                "description": "built-in workload set",
            }
        ),
    ] = None
    set: dict[str, Any] = Field(default_factory=dict, description="workload parameter overrides (bench --set)")
    dataset: str | None = Field(None, description="JSONL or ShareGPT JSON file instead of a built-in set")
    max_tokens_default: int = Field(256, ge=1, description="dataset: max_tokens of entries without one")

    @model_validator(mode="before")
    @classmethod
    def _bare_name(cls, v: Any) -> Any:
        return {"name": v} if isinstance(v, str) else v

    @field_validator("name")
    @classmethod
    def _known(cls, v: str | None) -> str | None:
        if v is not None and v not in WORKLOADS:
            raise ValueError(
                f"unknown workload {v!r}{suggest(v, WORKLOADS)}; choose from {', '.join(WORKLOADS)}"
                " or give {dataset: FILE}"
            )
        return v

    @field_validator("dataset")
    @classmethod
    def _dataset_exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        return resolve_path(
            v, info, "dataset", "give an existing JSONL/ShareGPT file (relative to the experiment file)"
        )

    @model_validator(mode="after")
    def _one_source(self) -> WorkloadItem:
        if (self.name is None) == (self.dataset is None):
            raise ValueError("give exactly one of name (a built-in set) or dataset (a file)")
        if self.dataset is not None and self.set:
            raise ValueError("set applies to built-in workloads only; remove it for a dataset")
        if self.name is not None:
            try:
                make_workload(self.name, None, **self.set)
            except ConfigError as e:
                raise ValueError(f"set: {e}") from None
        return self

    @property
    def label(self) -> str:
        """The workload name as the bench reports it: the set name or ``dataset:<file name>``."""
        return self.name if self.name is not None else f"dataset:{Path(self.dataset or '').name}"

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: Any, handler: Any) -> JsonSchemaValue:
        obj = handler(core_schema)
        return {"anyOf": [{"type": "string", "enum": list(WORKLOADS), "description": "a built-in set by name"}, obj]}


class Steps(StrictModel):
    """The load steps, raised in order until an SLO or the error budget breaks.

    Exactly one of ``concurrency`` (closed loop: that many requests in flight; ints >= 1) or ``rates``
    (open loop: arrivals per second, > 0), each strictly increasing. Open loop only: ``arrival``
    (``constant`` | ``poisson`` | ``gamma``, shape ``goal.burstiness``) and ``max_concurrency`` (cap on
    requests in flight; ``None`` = none)."""

    concurrency: list[Annotated[int, Field(ge=1, le=MAX_CONCURRENCY)]] | None = Field(
        None, description="closed-loop levels"
    )
    rates: list[Annotated[float, Field(gt=0, le=MAX_RATE_RPS)]] | None = Field(
        None, description="open-loop rates, requests/s"
    )
    arrival: Literal["constant", "poisson", "gamma"] = Field("poisson", description="open loop: arrival process")
    max_concurrency: int | None = Field(None, ge=1, description="open loop: cap on requests in flight")

    @model_validator(mode="after")
    def _one_kind(self) -> Steps:
        if (self.concurrency is None) == (self.rates is None):
            raise ValueError("give exactly one of concurrency: [1, 2, 4, 8] or rates: [0.5, 1, 2]")
        levels = self.levels
        if not levels:
            raise ValueError("give at least one step")
        if any(b <= a for a, b in zip(levels, levels[1:], strict=False)):
            raise ValueError(f"steps must be strictly increasing (load is raised step by step), got {levels}")
        return self

    @property
    def kind(self) -> Literal["closed", "open"]:
        """``closed`` (concurrency) or ``open`` (rates)."""
        return "closed" if self.concurrency is not None else "open"

    @property
    def levels(self) -> list[float]:
        """The concurrency levels or the rates, in order."""
        return list(self.concurrency if self.concurrency is not None else self.rates or [])

    def load_models(self, burstiness: float = 0.5) -> list[LoadModel]:
        """One :class:`servelab.bench.load.step.LoadModel` per step (labels ``c4`` / ``r0.5``);
        ``burstiness`` is the gamma shape used when ``arrival`` is ``gamma``."""
        if self.concurrency is not None:
            return [LoadModel(kind="closed", concurrency=c) for c in self.concurrency]
        return [
            LoadModel(
                kind="open",
                rate_rps=r,
                arrival=self.arrival,
                gamma_shape=burstiness,
                max_concurrency=self.max_concurrency,
            )
            for r in self.rates or []
        ]


class ArrivalTest(StrictModel):
    """The run at the stated arrival rate (``goal.expected_rate_rps``, gamma arrivals of shape
    ``goal.burstiness``, workload ``mix`` of ratio ``goal.mix``) after the load steps.

    ``enabled`` (default true); ``requests``: number of requests (default 16); ``max_concurrency``:
    cap on requests in flight (``None`` = none); ``set``: overrides for the mix workload (bench ``--set``).
    """

    enabled: bool = Field(True, description="run the arrival test")
    requests: int = Field(16, ge=1, le=MAX_REQUESTS_PER_STEP, description="requests in the arrival test")
    max_concurrency: int | None = Field(None, ge=1, description="cap on requests in flight")
    set: dict[str, Any] = Field(default_factory=dict, description="mix workload overrides (bench --set)")


class CapacitySearch(StrictModel):
    """The open-loop search for the highest arrival rate whose objectives hold
    (:mod:`servelab.trial.capacity`), on the goal's mix, after the load steps.

    ``enabled`` (default true); ``requests``: requests per probe (default 12); ``max_probes``: probes
    at most (default 4: bracketing by doubling, then bisection); ``start_rps``: the first rate
    (``None`` = ``goal.expected_rate_rps``, else the completed requests/s at the ranked level);
    ``tolerance``: stop bisecting when the bracket is this narrow, relative (default 0.05);
    ``arrival``: ``goal`` (gamma of shape ``goal.burstiness``), ``poisson`` or ``constant``;
    ``model_check``: after the search, one extra probe (budgeted like the others) at the rate where the
    candidate's capacity model predicts probes like the search's stop meeting the SLO, to check it
    (:mod:`servelab.capacity.trialmodel`; default false)."""

    enabled: bool = Field(True, description="run the capacity search")
    requests: int = Field(12, ge=2, le=MAX_REQUESTS_PER_STEP, description="requests per probe")
    max_probes: int = Field(4, ge=1, le=30, description="probes at most")
    start_rps: float | None = Field(None, gt=0, description="first rate, requests/s (null = expected rate)")
    tolerance: float = Field(0.05, gt=0, lt=1, description="relative width of the bracket to stop at")
    arrival: Literal["goal", "poisson", "constant"] = Field("goal", description="arrival process of the probes")
    model_check: bool = Field(
        False, description="after the search, one extra probe where the capacity model predicts the SLO breaks"
    )


def default_steps() -> Steps:
    return Steps(concurrency=[1, 2, 4, 8])


def default_workloads() -> list[WorkloadItem]:
    return [WorkloadItem(name="short-qa"), WorkloadItem(name="structured")]


class LoadGenerator(StrictModel):
    """Who sends the load of the load steps and the arrival test (``servelab bench --workers/--ray``,
    docs/distributed-bench.md): ``workers`` processes on this host (default 1: the trial's own process),
    or with ``ray`` (a Ray cluster address, or ``auto``) that many Ray actors in total, or
    ``workers_per_node`` actors on every node. The quality gate and the smoke tests always run in the
    trial's process (a handful of requests)."""

    workers: int = Field(1, ge=1, le=4096, description="load-generator processes (or Ray actors in total)")
    workers_per_node: int | None = Field(None, ge=1, le=4096, description="Ray actors on every node (with ray)")
    ray: str | None = Field(None, min_length=1, description="Ray cluster address (HOST:PORT or auto)")

    @model_validator(mode="after")
    def _ray_needed(self) -> LoadGenerator:
        if self.workers_per_node is not None and self.ray is None:
            raise ValueError(
                "load_generator.workers_per_node places Ray actors on every node: set "
                "load_generator.ray (a cluster address or auto)"
            )
        if self.workers_per_node is not None and self.workers != 1:
            raise ValueError("load_generator: give workers (in total) or workers_per_node, not both")
        return self
