"""Typed bench results: the models of ``summary.json`` and of one ``requests.jsonl`` line.

The bench writes these files with ``model_dump_json(by_alias=True, exclude_unset=True)`` (a key that
the bench did not set is not written, so the files hold what docs/summary-schema.md lists and nothing
more) and every reader (``servelab summarize``, the trial, its report) reads them back with
``model_validate``. Unknown keys are refused: a writer and the schema cannot drift apart silently.
The committed JSON Schema ``summary.schema.json`` beside this module is generated from
:class:`Summary` (``servelab schema write``; checked by ``servelab schema check`` and a test).

Every duration is in seconds (``_s``), every rate per second, token counts in tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from servelab.bench.workloads.extras import (
    AgentSummary,
    EmbeddingsSummary,
    LanguageInfo,
    RagInfo,
    ReplayInfo,
    SessionsSummary,
)
from servelab.wire.config import PublishedSchema, json_schema_of

__all__ = [
    "PUBLISHED_SCHEMA",
    "SUMMARY_SCHEMA_PATH",
    "SUMMARY_SCHEMA_VERSION",
    "Counts",
    "Dist",
    "Goodput",
    "LoadInfo",
    "Generator",
    "GeneratorWorker",
    "Interval",
    "LostPart",
    "Rebuilt",
    "RequestError",
    "Saturation",
    "RequestLine",
    "ServerFigure",
    "SloCheck",
    "Steady",
    "StepSummary",
    "Summary",
    "TNs",
    "Throughput",
    "TokenCheck",
    "Tokens",
    "ToolCallLine",
    "WorkerStep",
]

SUMMARY_SCHEMA_VERSION = 2
"""1: servelab 0.1; 2: percentile intervals (``Dist.p50_ci`` …) and ``StepSummary.steady``. Both read."""
#: the committed JSON Schema of ``summary.json`` (generated from :class:`Summary`)
SUMMARY_SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")


class ResultModel(BaseModel):
    """Base of the result models: unknown keys are errors, aliases and names both accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json_bytes(self, indent: int | None = None) -> bytes:
        """The JSON text as written to disk: aliases (``from``), keys never set left out."""
        return self.model_dump_json(by_alias=True, exclude_unset=True, indent=indent).encode()


class Interval(ResultModel):
    """A 95 % confidence interval (:mod:`servelab.bench.analysis.intervals`): ``lo``/``hi`` in the unit of the
    figure it belongs to, ``None`` on a side the sample cannot bound (``hi`` of a P95 from fewer than
    72 values); ``n`` the sample size; ``method`` ``order-statistics`` (percentiles, distribution-free),
    ``t-blocks`` (time blocks of one run) or ``t-repeats`` (independent repeats)."""

    lo: float | None = None
    hi: float | None = None
    level: float = 0.95
    n: int = 0
    method: str = ""


class Dist(ResultModel):
    """A distribution (:func:`servelab.bench.analysis.metrics.stats`): ``count`` values, the rest ``None``
    when ``count`` is 0. Unit: that of the field holding it (``ttft_s``: seconds). ``std``: the sample
    standard deviation (``ddof=1``; ``None`` below 2 values; absent in summaries written before it). ``p50_ci``,
    ``p95_ci``, ``p99_ci``: each percentile's 95 % :class:`Interval` (summary schema 2; absent in 1)."""

    count: int = 0
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    std: float | None = None
    p50_ci: Interval | None = None
    p95_ci: Interval | None = None
    p99_ci: Interval | None = None

    def ci(self, stat: str) -> Interval | None:
        """The interval of percentile ``stat`` (``"p95"``), ``None`` when none was computed."""
        value = getattr(self, f"{stat}_ci", None) if f"{stat}_ci" in type(self).model_fields else None
        return value if isinstance(value, Interval) else None


class Counts(ResultModel):
    """Measured requests of a step: ``submitted == succeeded + failed_total``; ``failed`` per
    :class:`servelab.wire.types.FailureClass`; ``good = succeeded - gate_failed``."""

    submitted: int = 0
    succeeded: int = 0
    failed: dict[str, int] = Field(default_factory=dict)
    failed_total: int = 0
    truncated: int = 0
    gate_failed: int = 0
    good: int = 0


class Throughput(ResultModel):
    """Per second of the step window, succeeded requests (server usage tokens)."""

    requests_per_s: float | None = None
    input_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None


class Goodput(ResultModel):
    """Like :class:`Throughput`, for requests that passed every gate; ``good_fraction`` of submitted."""

    requests_per_s: float | None = None
    output_tokens_per_s: float | None = None
    good_fraction: float | None = None


class Tokens(ResultModel):
    """Token totals of the succeeded requests; ``output_source``: requests per counting source."""

    input_total: int = 0
    output_total: int = 0
    output_source: dict[str, int] = Field(default_factory=dict)


class TokenCheck(ResultModel):
    """Client tokenizer vs server usage for output tokens (only ``tokenizer``/``compared`` when
    nothing could be compared)."""

    tokenizer: str
    compared: int = 0
    exact: int | None = None
    mean_diff_tokens: float | None = None
    max_abs_diff_tokens: int | None = None


class SloCheck(ResultModel):
    """One objective checked on a step: ``value`` (``None``: not computable, so not met) vs ``limit``
    (seconds for latencies, a fraction for ``error_rate``)."""

    objective: str
    value: float | None = None
    limit: float | None = None
    met: bool = False


class LoadInfo(ResultModel):
    """The :class:`servelab.bench.load.step.LoadModel` of a step, as written (``dataclasses.asdict``)."""

    kind: Literal["closed", "open"] = "closed"
    concurrency: int | None = None
    rate_rps: float | None = None
    arrival: str | None = None
    gamma_shape: float | None = None
    max_concurrency: int | None = None
    duration_s: float | None = None


class ServerFigure(ResultModel):
    """An engine ``/metrics`` figure over one step's samples: gauges ``mean``/``max``, counters
    ``increase`` over ``span_s`` seconds; ``rss_bytes`` has ``max`` only."""

    mean: float | None = None
    max: float | None = None
    increase: float | None = None
    span_s: float | None = None


class WorkerStep(ResultModel):
    """One load-generator worker's part of a step (:mod:`servelab.bench.load.workers`; a single-process run
    has one, worker 0). ``assigned``: requests given to it (``None`` for a closed loop bounded by
    ``--duration``, which has no fixed count); ``finished``: its lines in ``requests.jsonl``;
    ``cpu_fraction``: its process's CPU seconds (user + system, all threads) over the wall seconds from
    the step's start to its end, of one core; ``schedule_lag_p99_s``: P99 of its requests' schedule lag;
    ``dispatch_lag_p99_s`` (open loop): P99 of how late its event loop woke for an arrival (the
    generator's own lateness, without waits for a ``--max-concurrency`` slot); ``start_late_s``: how
    far past the common start instant it began (the start message came late); ``lost``: it died during
    the step (``lost_reason`` says how)."""

    worker: int
    host: str
    pid: int | None = None
    concurrency: int | None = None
    assigned: int | None = None
    finished: int = 0
    cpu_s: float | None = None
    wall_s: float | None = None
    cpu_fraction: float | None = None
    schedule_lag_p99_s: float | None = None
    dispatch_lag_p99_s: float | None = None
    start_late_s: float | None = None
    lost: bool = False
    lost_reason: str | None = None


class LostPart(ResultModel):
    """The part of a step a dead worker took with it: its ``finished`` requests are in the step's
    statistics; ``missing`` (``assigned - finished``; ``None`` when the step had no fixed count) were
    never finished: in flight when it died, or never sent. The step is ``partial``."""

    worker: int
    host: str
    pid: int | None = None
    assigned: int | None = None
    finished: int = 0
    missing: int | None = None
    reason: str = ""


class Saturation(ResultModel):
    """Was the load generator, not the server, the limit of this step? ``generator_bound`` when a
    worker's ``cpu_fraction`` reached ``cpu_bound_fraction`` or the lag figure ``lag_metric`` passed
    ``lag_bound_s`` (``servelab bench --lag-bound-ms``); ``reasons`` names each worker and figure.
    A generator-bound step's latencies and throughput describe the client: do not publish them as the
    server's."""

    generator_bound: bool = False
    reasons: list[str] = Field(default_factory=list)
    lag_metric: str | None = None
    lag_value_s: float | None = None
    lag_bound_s: float | None = None
    cpu_bound_fraction: float | None = None


class GeneratorWorker(ResultModel):
    """A load-generator worker of the run: where it ran and its clock. ``same_clock``: it shares the
    coordinator's monotonic clock (same host kernel, by boot id); ``wall_offset_s``: its wall clock
    minus the coordinator's, measured at start from the round trip with the smallest ``rtt_s``
    (reported only: nothing is computed from cross-host clock differences)."""

    worker: int
    host: str
    pid: int | None = None
    node_id: str | None = None
    same_clock: bool = True
    wall_offset_s: float | None = None
    rtt_s: float | None = None


class Generator(ResultModel):
    """How the load was generated: ``mode`` ``process`` (one process), ``processes`` (``--workers N`` on
    this host) or ``ray`` (``--ray ADDRESS``: Ray actors); ``hosts``: distinct hosts of the workers;
    ``clock``: how the step windows were measured across workers."""

    mode: Literal["process", "processes", "ray"] = "process"
    workers: list[GeneratorWorker] = Field(default_factory=list)
    ray_address: str | None = None
    hosts: int = 1
    clock: str | None = None


class Steady(ResultModel):
    """The steady window of a step (:func:`servelab.bench.analysis.steady.steady_window`): the time the load
    was at its target — closed loop: all ``target_inflight`` requests in flight, from the moment the
    last of the first ``target_inflight`` was sent to the first end after the last send; open loop: from
    the first to the last arrival. ``ramp_s`` before it and ``drain_s`` after it (to the last end) are
    reported apart and not in its throughput. ``output_tokens_per_s``: output tokens generated (by
    their chunk arrival times) inside the window / its length; ``output_tokens_per_s_ci``: t interval
    over ``blocks`` equal time blocks of the window (batch means); ``None`` with fewer than 2 blocks.
    ``requests_per_s``: requests completed in the window / its length. ``start_ns``/``stop_ns``: the
    window on the load generator's monotonic clock (``time.monotonic_ns()``, as ``requests.jsonl``)."""

    target_inflight: int | None = None
    start_ns: int | None = None
    stop_ns: int | None = None
    start_offset_s: float | None = None
    steady_s: float | None = None
    ramp_s: float | None = None
    drain_s: float | None = None
    output_tokens: float | None = None
    output_tokens_per_s: float | None = None
    output_tokens_per_s_ci: Interval | None = None
    requests_per_s: float | None = None
    blocks: list[float] = Field(default_factory=list)
    note: str | None = None


class StepSummary(ResultModel):
    """One workload x load step of ``summary.json`` (docs/summary-schema.md). A skipped step holds
    only ``workload``, ``step``, ``load``, ``skipped`` and ``skipped_reason``. ``server`` is added by
    the trial (engine ``/metrics`` during the step, by metric name), as are ``steady`` (the steady
    window, :class:`Steady`), ``repeat`` (the 0-based repeat round it ran in) and, for a ``mix`` step,
    ``by_class``: the same figures for the requests of each set in the mix (``short-qa``,
    ``structured``), measured while they ran together. The production-like workloads add their own
    figures (:mod:`servelab.bench.workloads.extras`): ``sessions`` (per-turn TTFT against history length, session
    success, cached prompt tokens), ``agent`` (per-step tool-call validity), ``replay`` (trace replay and
    its schedule lag), ``embeddings`` (vectors/s, tokens/s, batch size, input lengths), ``rerank`` (the same
    figures for ``--endpoint rerank``: documents scored per second, :mod:`servelab.bench.workloads.rerank`),
    ``language`` (tokens per character), ``rag`` (the real-document corpus and its prompt lengths)."""

    workload: str
    step: str
    load: LoadInfo = Field(default_factory=LoadInfo)
    started_unix_s: float | None = None
    skipped: bool = False
    skipped_reason: str | None = None
    partial: bool = False
    counts: Counts = Field(default_factory=Counts)
    window_s: float | None = None
    ttft_s: Dist = Field(default_factory=Dist)
    ttfat_s: Dist = Field(default_factory=Dist)
    e2e_s: Dist = Field(default_factory=Dist)
    tpot_s: Dist = Field(default_factory=Dist)
    itl_s: Dist = Field(default_factory=Dist)
    itl_chunk_s: Dist = Field(default_factory=Dist)
    itl_token_method: dict[str, int] = Field(default_factory=dict)
    schedule_lag_s: Dist = Field(default_factory=Dist)
    output_tps_per_user: Dist = Field(default_factory=Dist)
    throughput: Throughput = Field(default_factory=Throughput)
    goodput: Goodput = Field(default_factory=Goodput)
    tokens: Tokens = Field(default_factory=Tokens)
    token_check: TokenCheck | None = None
    slo: list[SloCheck] = Field(default_factory=list)
    slo_met: bool | None = None
    server: dict[str, ServerFigure] = Field(default_factory=dict)
    workers: list[WorkerStep] = Field(default_factory=list)
    lost: list[LostPart] = Field(default_factory=list)
    saturation: Saturation | None = None
    steady: Steady | None = None
    by_class: dict[str, StepSummary] = Field(default_factory=dict)
    repeat: int | None = None
    sessions: SessionsSummary | None = None
    agent: AgentSummary | None = None
    replay: ReplayInfo | None = None
    embeddings: EmbeddingsSummary | None = None
    rerank: EmbeddingsSummary | None = None
    language: LanguageInfo | None = None
    rag: RagInfo | None = None

    def dist(self, metric: str) -> Dist:
        """The distribution named ``metric`` (``"ttft"`` or ``"ttft_s"``); an empty one when unknown."""
        name = metric if metric.endswith("_s") else f"{metric}_s"
        value = getattr(self, name, None) if name in type(self).model_fields else None
        return value if isinstance(value, Dist) else Dist()

    @property
    def label(self) -> str:
        """``workload/step``, as server metric samples name the step."""
        return f"{self.workload}/{self.step}"


class Rebuilt(ResultModel):
    """Set by ``servelab summarize DIR``: the summary was rebuilt from ``requests.jsonl``."""

    from_: str = Field("requests.jsonl", alias="from")
    lines: int = 0
    truncated_last_line: bool = False
    partial: bool = False
    rebuilt_unix_s: float | None = None
    #: step fields not computable from requests.jsonl, kept from the summary that was there before
    kept_from_summary: list[str] = Field(default_factory=list)


class Summary(ResultModel):
    """``summary.json`` of a bench run (docs/summary-schema.md), rewritten after every step."""

    schema_version: int = SUMMARY_SCHEMA_VERSION
    servelab_version: str | None = None
    model: str | None = None
    base_url: str | None = None
    slo: list[str] = Field(default_factory=list)
    complete: bool = False
    stopped_by: str | None = None
    rebuilt: Rebuilt | None = None
    started_unix_s: float | None = None
    finished_unix_s: float | None = None
    generator: Generator | None = None
    steps: list[StepSummary] = Field(default_factory=list)


class RequestError(ResultModel):
    """The error of a failed request (:class:`servelab.wire.types.WireError`)."""

    status: int | None = None
    message: str = ""
    type: str | None = None
    code: JsonValue = None


class TNs(ResultModel):
    """Raw ``time.monotonic_ns()`` stamps of one request (``None``: not reached)."""

    scheduled: int | None = None
    sent: int | None = None
    headers: int | None = None
    first_byte: int | None = None
    first_event: int | None = None
    first_token: int | None = None
    first_answer: int | None = None
    last_token: int | None = None
    done: int | None = None
    end: int | None = None


class ToolCallLine(ResultModel):
    """A streamed tool call (:class:`servelab.wire.types.ToolCall`)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    arguments_valid: bool | None = None


class RequestLine(ResultModel):
    """One line of ``requests.jsonl`` (also ``smoke.jsonl`` / ``quality.jsonl`` in a trial), as
    :func:`servelab.bench.load.lines.record_to_json` writes it (docs/summary-schema.md lists the fields).
    ``step_index``/``step_workload`` are set by the bench for load-step requests; ``worker``/``host`` name the
    load-generator worker that sent it and its machine, and ``t0_ns`` is that worker's start instant
    of the step on its own monotonic clock (several workers only: stamps of two hosts are compared only
    as offsets from their ``t0_ns``, :mod:`servelab.bench.load.merge`); ``sample_passed``
    by the trial's quality samples."""

    id: int
    step: str = ""
    workload: str = ""
    warmup: bool = False
    status: int | None = None
    failure: str | None = None
    error: RequestError | None = None
    finish_reason: str | None = None
    finish_reason_raw: str | None = None
    prompt_tokens: int | None = None
    prompt_tokens_target: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    client_output_tokens: int | None = None
    cached_tokens: int | None = None
    max_tokens: int | None = None
    ttft_s: float | None = None
    ttfat_s: float | None = None
    e2e_s: float | None = None
    tpot_s: float | None = None
    schedule_lag_s: float | None = None
    gate_failures: list[str] = Field(default_factory=list)
    events: int = 0
    saw_done: bool = False
    response_model: str | None = None
    conn_retries: int = 0
    t_ns: TNs = Field(default_factory=TNs)
    chunk_offsets_ms: list[float] = Field(default_factory=list)
    chunk_tokens: list[int] | None = None
    text: str = ""
    reasoning: str | None = None
    tool_calls: list[ToolCallLine] | None = None
    step_index: int | None = None
    step_workload: str | None = None
    sample_passed: bool | None = None
    worker: int | None = None
    host: str | None = None
    t0_ns: int | None = None


PUBLISHED_SCHEMA = PublishedSchema(SUMMARY_SCHEMA_PATH, lambda: json_schema_of(Summary, "servelab bench summary.json"))
