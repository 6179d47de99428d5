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
    "ModelCheck",
    "PeakLoad",
    "PerfParams",
    "Prediction",
    "ProbeCheck",
    "SearchCheck",
    "StepCheck",
    "TierPlan",
    "Validation",
    "WhatIf",
]


class PerfParams(ResultModel):
    """The continuous-batching law (:mod:`servelab.capacity.fit`): first token ``prefill_base_s +
    prompt / prefill_tokens_per_s`` after service starts (``None`` rate: prompt-independent), each later
    token ``decode_base_s + decode_per_running_s * (b - 1)`` s, ``slots`` served at once.
    ``prefill_serial``: the engine runs one prefill at a time and the running batch's decode waits for
    it (llama.cpp's one batch per step), learned from the evidence; ``False``: prefills run beside the
    decode and beside each other. ``first_token_extra_s``: workload name -> seconds a request of it
    adds to its prefill beyond the law (fitted; the most common workload is the reference, 0)."""

    prefill_base_s: float
    prefill_tokens_per_s: float | None = None
    decode_base_s: float
    decode_per_running_s: float
    slots: int
    slots_identified: bool = False
    prefill_serial: bool = False
    first_token_extra_s: dict[str, float] = Field(default_factory=dict)


class FitReport(ResultModel):
    """The point fit on ``requests`` measured requests of ``steps`` (``token_gaps`` chunk gaps), the
    bootstrap intervals of each parameter, the RMS prefill residual (s) and notes on what the evidence
    could not identify. ``seen_slots``: most requests decoding at once; ``declared_slots``: the engine's.
    ``prefill_stall``: seconds a token gap grows per second of other requests' prefill inside it (1: the
    decode waits for every prefill, 0: it runs beside them), with its interval, ``None`` when the gaps do not
    identify it (capacity.fit.stall_identified; the notes say so); ``prefill_samples``:
    requests the prefill law was fitted on (streamed from their first token, no other prefill beside
    them); ``held_back_requests``: requests whose stream carried fewer tokens than their usage (tokens
    the engine held back, e.g. a JSON grammar's opening ones), kept out of the prefill and decode laws."""

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
    prefill_stall: float | None = None
    prefill_stall_ci: Interval | None = None
    prefill_samples: int = 0
    held_back_requests: int = 0
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


class ProbeCheck(ResultModel):
    """One probe of the trial's capacity search (``step``: its run folder) at ``rate_rps``: whether
    the SLO held as measured and as the model predicts for the same requests at the same send times."""

    rate_rps: float
    step: str
    measured_held: bool
    predicted_held: bool
    agrees: bool


class SearchCheck(ResultModel):
    """The model against the trial's capacity search (:mod:`servelab.capacity.agree`): every probe's
    verdict, the search's bracket ``[measured_held_rps, measured_broke_rps)`` (``None``: open), the
    model's capacity for probes of ``probe_requests`` requests like the search's (req/s, bootstrap
    interval), its sustained capacity (long run, req/s), and whether they agree (every verdict matches
    and the probe-sized interval meets the bracket)."""

    probes: list[ProbeCheck] = Field(default_factory=list)
    measured_held_rps: float | None = None
    measured_broke_rps: float | None = None
    model_capacity_rps: float | None = None
    model_capacity_ci: Interval | None = None
    probe_requests: int | None = None
    sustained_capacity_rps: float | None = None
    agrees: bool = False
    probes_agreeing: int = 0


class ModelCheck(ResultModel):
    """One extra load point the model chose, measured after the fit to check it: an open-loop probe at
    ``rate_rps`` (``reason``: why that rate), the model's prediction for the probe's own requests and
    send times (``step``: predicted vs measured, the fit made before the probe ran) and both verdicts.
    ``note`` says why it did not run (the trial budget)."""

    rate_rps: float
    reason: str = ""
    step: StepCheck | None = None
    predicted_held: bool | None = None
    measured_held: bool | None = None
    note: str | None = None


class CandidateCapacity(ResultModel):
    """One candidate's model, validation, check against its capacity search, extra checked point
    (a trial's ``capacity.model_check``) and plan."""

    fit: FitReport
    validation: Validation | None = None
    search: SearchCheck | None = None
    check: ModelCheck | None = None
    plan: CandidatePlan | None = None


class CapacityReport(ResultModel):
    """``servelab capacity --json``: the profile's peak, each candidate's model + validation + plan,
    and the tier plan when the profile routes tasks to tiers."""

    profile: str
    slo: list[str] = Field(default_factory=list)
    peak: PeakLoad
    candidates: dict[str, CandidateCapacity] = Field(default_factory=dict)
    tiers: TierPlan | None = None
