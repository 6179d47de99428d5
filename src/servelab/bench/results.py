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

from servelab.wire.config import PublishedSchema, json_schema_of

__all__ = ["PUBLISHED_SCHEMA", "SUMMARY_SCHEMA_PATH", "SUMMARY_SCHEMA_VERSION", "Counts", "Dist", "Goodput", "LoadInfo",
           "Rebuilt", "RequestError", "RequestLine", "ServerFigure", "SloCheck", "StepSummary", "Summary",
           "TNs", "Throughput", "TokenCheck", "Tokens", "ToolCallLine"]

SUMMARY_SCHEMA_VERSION = 1
#: the committed JSON Schema of ``summary.json`` (generated from :class:`Summary`)
SUMMARY_SCHEMA_PATH = Path(__file__).with_name("summary.schema.json")


class ResultModel(BaseModel):
    """Base of the result models: unknown keys are errors, aliases and names both accepted."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    def to_json_bytes(self, indent: int | None = None) -> bytes:
        """The JSON text as written to disk: aliases (``from``), keys never set left out."""
        return self.model_dump_json(by_alias=True, exclude_unset=True, indent=indent).encode()


class Dist(ResultModel):
    """A distribution (:func:`servelab.bench.metrics.stats`): ``count`` values, the rest ``None``
    when ``count`` is 0. Unit: that of the field holding it (``ttft_s``: seconds)."""

    count: int = 0
    mean: float | None = None
    min: float | None = None
    max: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None


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
    """The :class:`servelab.bench.load.LoadModel` of a step, as written (``dataclasses.asdict``)."""

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


class StepSummary(ResultModel):
    """One workload x load step of ``summary.json`` (docs/summary-schema.md). A skipped step holds
    only ``workload``, ``step``, ``load``, ``skipped`` and ``skipped_reason``. ``server`` is added by
    the trial (engine ``/metrics`` during the step, by metric name)."""

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
    :func:`servelab.bench.runner.record_to_json` writes it (docs/summary-schema.md lists the fields).
    ``step_index``/``step_workload`` are set by the bench for load-step requests; ``sample_passed``
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


PUBLISHED_SCHEMA = PublishedSchema(SUMMARY_SCHEMA_PATH, lambda: json_schema_of(Summary, "servelab bench summary.json"))
