"""Typed results of ``servelab capacity`` (written as JSON with ``--json``): the fitted model, the
held-out validation, the peak load and the plan. Units are in the field names (``_s`` seconds,
``_rps`` requests/s, ``_tps`` tokens/s); every interval is a 95 % one (:class:`Interval`)."""

from __future__ import annotations

from pydantic import Field

from servelab.bench.results import Interval, ResultModel

__all__ = [
    "CandidatePlan",
    "CapacityReport",
    "FitReport",
    "Formula",
    "PeakLoad",
    "PerfParams",
    "Prediction",
    "StepCheck",
    "TierPlan",
    "Validation",
    "WhatIf",
]


class PerfParams(ResultModel):
    """The continuous-batching law (:mod:`servelab.capacity.fit`): first token ``prefill_base_s +
    prompt / prefill_tokens_per_s`` after service starts (``None`` rate: prompt-independent), each later
    token ``decode_base_s + decode_per_running_s * (b - 1)`` s, ``slots`` served at once."""

    prefill_base_s: float
    prefill_tokens_per_s: float | None = None
    decode_base_s: float
    decode_per_running_s: float
    slots: int
    slots_identified: bool = False


class FitReport(ResultModel):
    """The point fit on ``requests`` measured requests of ``steps`` (``token_gaps`` chunk gaps), the
    bootstrap intervals of each parameter, the RMS prefill residual (s) and notes on what the evidence
    could not identify. ``seen_slots``: most requests decoding at once; ``declared_slots``: the engine's."""

    params: PerfParams
    requests: int
    steps: list[str] = Field(default_factory=list)
    token_gaps: int = 0
    seen_slots: int = 0
    declared_slots: int | None = None
    prefill_base_ci: Interval | None = None
    prefill_rate_ci: Interval | None = None
    decode_base_ci: Interval | None = None
    decode_per_running_ci: Interval | None = None
    prefill_residual_s: float | None = None
    notes: list[str] = Field(default_factory=list)


class Prediction(ResultModel):
    """One predicted figure (``value``, from the point fit) with its prediction interval (the bootstrap
    refits simulated), the measured value and the relative error ``(predicted - measured) / measured``."""

    predicted: float
    interval: Interval | None = None
    measured: float | None = None
    error: float | None = None


class StepCheck(ResultModel):
    """A held-out step: fitted on ``fitted_on`` (the other steps), predicted for this one."""

    step: str
    concurrency: int | None = None
    requests: int = 0
    fitted_on: list[str] = Field(default_factory=list)
    ttft_p50_s: Prediction
    ttft_p95_s: Prediction
    output_tps: Prediction


class Validation(ResultModel):
    """Every held-out step, and the median absolute relative error over all their figures."""

    scheme: str = "leave-one-step-out"
    steps: list[StepCheck] = Field(default_factory=list)
    median_abs_error: float | None = None
    max_abs_error: float | None = None


class Formula(ResultModel):
    """A figure with the formula it came from (filled in) and its unit."""

    name: str
    value: float
    unit: str
    formula: str


class PeakLoad(ResultModel):
    """The traffic profile's load at its peak (:mod:`servelab.capacity.peak`)."""

    mean_rps: Formula
    peak_rps: Formula
    offered_peak_rps: Formula
    burst_rps: Formula
    concurrent_streams: Formula
    input_tps: Formula
    output_tps: Formula
    mean_input_tokens: float
    mean_output_tokens: float


class WhatIf(ResultModel):
    """One what-if row: the change, and the plan's replicas, devices and cost per hour under it."""

    change: str
    offered_peak_rps: float
    replicas: int | None = None
    devices: int | None = None
    cost_per_hour: float | None = None


class CandidatePlan(ResultModel):
    """The plan for one candidate (or tier) at the profile's peak: per-replica capacity at the SLO from
    the simulated model (interval from the bootstrap), replicas with headroom, how long a burst can last,
    devices, hosts and cost."""

    candidate: str
    rate_rps: float
    capacity_per_replica_rps: float | None = None
    capacity_ci: Interval | None = None
    saturation_rps: float | None = None
    headroom: float = 0.3
    replicas: int | None = None
    replicas_hi: int | None = None
    burst_factor: float = 1.0
    burst_holds_s: float | None = None
    burst_note: str = ""
    devices: int | None = None
    hosts: int | None = None
    cost_per_hour: float | None = None
    cost_per_1m_output: float | None = None
    cost_per_user_month: float | None = None
    currency: str = "USD"
    predicted_ttft_p95_s: float | None = None
    predicted_e2e_p50_s: float | None = None
    what_if: list[WhatIf] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


class TierPlan(ResultModel):
    """Two (or more) tiers: each tier's plan for its share of the traffic, the blended cost, and the
    cost of sending everything to ``strong``."""

    tiers: dict[str, CandidatePlan] = Field(default_factory=dict)
    blended_cost_per_hour: float | None = None
    all_strong: CandidatePlan | None = None
    saving: float | None = None


class CandidateCapacity(ResultModel):
    """One candidate's model, validation and plan."""

    fit: FitReport
    validation: Validation | None = None
    plan: CandidatePlan | None = None


class CapacityReport(ResultModel):
    """``servelab capacity --json``: the profile's peak, each candidate's model + validation + plan,
    and the tier plan when the profile routes tasks to tiers."""

    profile: str
    slo: list[str] = Field(default_factory=list)
    peak: PeakLoad
    candidates: dict[str, CandidateCapacity] = Field(default_factory=dict)
    tiers: TierPlan | None = None
