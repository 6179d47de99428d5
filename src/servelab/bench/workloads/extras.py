"""Typed figures that the production-like workloads add to their step of ``summary.json``
(:class:`servelab.bench.results.StepSummary` fields ``sessions``, ``agent``, ``replay``, ``embeddings``,
``language``, ``rag``). Each model belongs to one workload module (:mod:`servelab.bench.workloads.sessions`,
:mod:`~servelab.bench.workloads.agent`, :mod:`~servelab.bench.workloads.traces`,
:mod:`~servelab.bench.workloads.embeddings`, :mod:`~servelab.bench.workloads.mixed_lang`,
:mod:`~servelab.bench.workloads.rag`) and lives here so the summary schema
does not import the workloads. Units are in the field names: ``_s`` seconds, ``_tokens`` tokens of the
tokenizer named next to them, ``_per_s`` per second of the step window.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "AgentStepStats",
    "AgentSummary",
    "EmbeddingsSummary",
    "LanguageInfo",
    "LatencyPercentiles",
    "RagInfo",
    "ReplayInfo",
    "SessionsSummary",
    "TurnStats",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TurnStats(_Model):
    """Per turn index: ``n`` turns that ran, ``ok``, mean ``prompt_tokens`` (history, server count), TTFT
    ``p50``/``max`` in seconds over the succeeded ones (``None`` when none), ``cached_share`` (cached /
    prompt tokens over turns that state both; ``None`` when none does), ``cached_tokens_mean`` (server
    ``usage.prompt_tokens_details.cached_tokens``, mean over the turns that state it)."""

    turn: int
    n: int
    ok: int
    prompt_tokens_mean: float | None = None
    ttft_p50_s: float | None = None
    ttft_max_s: float | None = None
    cached_share: float | None = None
    cached_tokens_mean: float | None = None


class SessionsSummary(_Model):
    """``sessions`` run, ``sessions_ok`` (every turn succeeded), ``session_success`` (fraction),
    ``turns`` per index (:class:`TurnStats`: TTFT against history length), ``duration_s`` of the step,
    ``think_time_mean_s`` (mean of the exponential think time between turns; 0 = none), ``source``
    (``built-in`` or the sessions file)."""

    sessions: int
    sessions_ok: int
    session_success: float
    turns: list[TurnStats] = Field(default_factory=list)
    duration_s: float = 0.0
    think_time_mean_s: float = 0.0
    source: str = "built-in"


class AgentStepStats(_Model):
    """Step ``step`` (0-based) of the agent loops: ``n`` requests, ``valid`` (succeeded and no gate
    failure), ``tool_calls`` (answers holding a tool call), ``invalid`` by gate reason
    (``tool_args_schema_mismatch`` …, or the failure class), ``e2e_p50_s`` over the succeeded ones."""

    step: int
    n: int
    valid: int
    tool_calls: int = 0
    invalid: dict[str, int] = Field(default_factory=dict)
    e2e_p50_s: float | None = None


class AgentSummary(_Model):
    """Agent loops (:mod:`servelab.bench.workloads.agent`): ``loops`` run, ``tool_steps`` (M: tool rounds asked for
    per loop), ``loops_completed`` (every step valid and a final answer), ``completion_rate``, ``steps``
    per index (:class:`AgentStepStats`; index M is the final answer after the last tool result)."""

    loops: int
    tool_steps: int
    loops_completed: int
    completion_rate: float
    steps: list[AgentStepStats] = Field(default_factory=list)


class ReplayInfo(_Model):
    """A trace replay (:mod:`servelab.bench.workloads.traces`): ``format``, ``path``, ``speed`` factor, ``window_s``
    (``[start, end]`` trace seconds; ``end`` ``None`` = to the end), ``requests`` replayed, ``skipped`` rows
    by reason, ``duration_s`` (last send offset after the speed factor), ``rate_rps`` (mean rate of the
    replay), ``schedule_lag_p99_s`` and ``within_1ms`` (share of requests sent within 1 ms of their
    scheduled time), ``shared_prefix_tokens`` (Mooncake: prompt tokens in blocks an earlier request
    already sent, what a prefix cache can serve) and ``cached_tokens`` (what the engine reported cached,
    ``None`` when it reports nothing)."""

    format: str
    path: str
    speed: float = 1.0
    window_s: list[float | None] | None = None
    requests: int = 0
    skipped: dict[str, int] = Field(default_factory=dict)
    duration_s: float = 0.0
    rate_rps: float = 0.0
    schedule_lag_p99_s: float | None = None
    within_1ms: float | None = None
    shared_prefix_tokens: int | None = None
    cached_tokens: int | None = None


class LatencyPercentiles(_Model):
    """Latency percentiles in seconds over ``n`` requests (numpy linear interpolation); ``None`` when
    ``n`` is 0. A P99 of fewer than 100 requests is their largest value or near it: read it with ``n``."""

    n: int = 0
    p50_s: float | None = None
    p90_s: float | None = None
    p95_s: float | None = None
    p99_s: float | None = None
    max_s: float | None = None


class EmbeddingsSummary(_Model):
    """An embeddings step (:mod:`servelab.bench.workloads.embeddings`, seed 000 §10.2: vector throughput with the
    input length and the unit stated): ``batch_size`` inputs per request, ``requests`` and ``inputs``
    succeeded, ``inputs_per_s`` (vectors per second of the step window), ``tokens_per_s`` (server
    ``usage.prompt_tokens`` per second, counted by the embedder with its special tokens),
    ``input_tokens`` (per input, in ``tokenizer``: ``min``/``mean``/``p50``/``p90``/``max``),
    ``server_tokens_per_input`` (mean), ``latency`` per request (:class:`LatencyPercentiles`),
    ``dimensions`` of the vectors, ``unit`` (the sentence stating what was measured)."""

    batch_size: int
    requests: int = 0
    inputs: int = 0
    failed_requests: int = 0
    window_s: float | None = None
    inputs_per_s: float | None = None
    tokens_per_s: float | None = None
    input_tokens: dict[str, float] = Field(default_factory=dict)
    server_tokens_per_input: float | None = None
    tokenizer: str | None = None
    latency: LatencyPercentiles = Field(default_factory=LatencyPercentiles)
    dimensions: int | None = None
    unit: str = ""


class LanguageInfo(_Model):
    """The text of a language set (:mod:`servelab.bench.workloads.mixed_lang`): ``source`` (what text and where
    from), ``tokenizer``, ``characters`` and ``tokens`` of the prompts' user text, ``tokens_per_char``
    (the figure to compare tokenizers by: lower = the same text costs fewer tokens), ``han_share``
    (share of the non-space characters that are CJK ideographs)."""

    source: str
    tokenizer: str | None = None
    characters: int = 0
    tokens: int | None = None
    tokens_per_char: float | None = None
    han_share: float | None = None


class RagInfo(_Model):
    """A RAG set on real documents (:class:`servelab.bench.workloads.rag.RagSet` without its requests)."""

    corpus: str
    documents: int
    passages: int
    k: int
    embedding_model: str
    tokenizer: str | None = None
    input_tokens: dict[str, float] = Field(default_factory=dict)
