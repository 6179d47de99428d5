"""The goal of an experiment (``goal:`` in the experiment file, docs/experiment.md): the task, SLOs, error
budget, quality gate with its business samples, the expected arrival rate and mix, and the budget."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from servelab.bench.analysis.slo import Objective, parse_slo
from servelab.bench.options import MAX_OUTPUT_TOKENS, MAX_REQUESTS_PER_STEP
from servelab.bench.workloads.registry import mixable_workloads, parse_ratio
from servelab.trial.spec_fields import ALL_SMOKE, NAME_PATTERN, SmokeCheck
from servelab.wire.config import StrictModel
from servelab.wire.errors import ConfigError
from servelab.wire.jsontypes import JsonObject

__all__ = ["Budget", "Goal", "Quality", "Sample"]


class Sample(StrictModel):
    """One business sample of the quality gate: a request and a check on its answer.

    Give exactly one of ``prompt`` (a user message) or ``messages`` (a chat, ``[{role, content}]``), and
    at least one check: ``expect_regex`` (Python regex searched in the answer text) and/or
    ``expect_json_schema`` (the answer must be JSON valid against it; the request then asks for
    ``response_format: json_schema``). ``max_tokens`` caps the answer (tokens, default 64).
    Raises (at validation) a one-line error for a bad regex, a bad schema or a missing check.
    """

    name: str | None = Field(None, pattern=NAME_PATTERN, description="label in the report; default s<index>")
    prompt: str | None = Field(None, min_length=1, description="user message text")
    messages: list[dict[str, Any]] | None = Field(
        None, min_length=1, description="chat messages [{role, content}] instead of prompt"
    )
    expect_regex: str | None = Field(None, description="Python regex that must be found in the answer text")
    expect_json_schema: dict[str, Any] | None = Field(None, description="JSON Schema the answer must satisfy")
    max_tokens: int = Field(64, ge=1, le=MAX_OUTPUT_TOKENS, description="answer length cap, tokens")

    @field_validator("expect_regex")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"invalid regex {v!r} ({e}); write a Python regular expression") from None
        return v

    @field_validator("expect_json_schema")
    @classmethod
    def _schema(cls, v: JsonObject | None) -> JsonObject | None:
        if v is not None:
            import jsonschema

            try:
                jsonschema.validators.validator_for(v).check_schema(v)
            except jsonschema.SchemaError as e:
                raise ValueError(f"not a valid JSON Schema ({e.message}); fix the schema") from None
        return v

    @field_validator("messages")
    @classmethod
    def _messages(cls, v: list[JsonObject] | None) -> list[JsonObject] | None:
        for m in v or ():
            if not isinstance(m.get("role"), str) or "content" not in m:
                raise ValueError("each message needs 'role' and 'content', e.g. {role: user, content: 'Hi'}")
        return v

    @model_validator(mode="after")
    def _one_request_one_check(self) -> Sample:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt or messages")
        if self.expect_regex is None and self.expect_json_schema is None:
            raise ValueError("give a check: expect_regex and/or expect_json_schema")
        return self


class Quality(StrictModel):
    """Quality gates. A candidate that fails one is excluded from the ranking, with the reason.

    ``structured_valid_min``: minimum fraction (0-1) of schema-valid answers among the
    ``structured_requests`` (default 8) requests of the ``structured`` workload that the gate sends
    when the experiment lists that workload (default 0.5). ``samples``: business samples (:class:`Sample`);
    ``samples_pass_min``: minimum fraction (0-1) of them that must pass (default 0.0 = informational).
    ``smoke``: required sub-features checked before the load steps — ``streaming`` (tokens arrive as
    SSE chunks), ``usage`` (token usage reported), ``json_schema`` (``response_format`` json_schema
    honoured), ``stop`` (stop sequences honoured); default all four.
    """

    structured_valid_min: float = Field(0.5, ge=0, le=1, description="min fraction of schema-valid structured answers")
    structured_requests: int = Field(
        8, ge=1, le=MAX_REQUESTS_PER_STEP, description="requests of the structured set sent by the quality gate"
    )
    samples: list[Sample] = Field(default_factory=list, description="business samples: request + check")
    samples_pass_min: float = Field(0.0, ge=0, le=1, description="min fraction of samples passing (0 = informational)")
    smoke: list[SmokeCheck] = Field(
        default_factory=lambda: list(ALL_SMOKE),
        description="sub-features the smoke test requires (a failure excludes the candidate)",
    )


class Budget(StrictModel):
    """Budget of the trial. ``max_minutes``: wall-clock limit in minutes (``None`` = none);
    ``price_per_hour``: cost of the machine per hour in ``currency`` (``None`` = no cost figures)."""

    max_minutes: float | None = Field(None, gt=0, description="wall-clock limit of the trial, minutes")
    price_per_hour: float | None = Field(None, ge=0, description="machine price per hour, in currency")
    currency: str = Field("USD", min_length=1, description="currency of price_per_hour")


_SLO_SCHEMA = WithJsonSchema(
    {
        "anyOf": [
            {
                "type": "string",
                "description": "METRIC_STAT<=VALUE[ms|s|%], comma-separated",
                "examples": ["ttft_p95<=2s,itl_p95<=300ms,error_rate<=1%"],
            },
            {
                "type": "object",
                "additionalProperties": {"type": ["string", "number"]},
                "description": "mapping METRIC_STAT -> limit",
                "examples": [{"ttft_p95": "2s", "error_rate": "1%"}],
            },
            {"type": "null"},
        ],
        "default": None,
        "description": "SLOs (servelab.bench.analysis.slo syntax); null = no SLO (the error budget still applies)",
    }
)


class Goal(StrictModel):
    """What the chosen engine must achieve.

    - ``task``: free text (shown in the record and report).
    - ``task_kind``: ``chat`` (default) or ``embeddings``: candidates serve ``/v1/embeddings``, the
      embeddings gate replaces the smoke tests and quality gate, the load steps send the experiment's
      ``embeddings:`` requests and candidates are ranked on inputs/s at the SLO
      (:mod:`servelab.trial.flows.embeddings`; chat-only fields are refused, :mod:`servelab.trial.embed_spec`).
    - ``slo``: objectives in :func:`servelab.bench.analysis.slo.parse_slo` syntax, as a string
      (``"ttft_p95<=2s,itl_p95<=300ms,error_rate<=1%"``) or a mapping (``{ttft_p95: 2s, error_rate: 1%}``,
      stored as the equivalent string); ``None`` = none. Latencies in s/ms, error rate in % or a fraction.
    - ``workload_slo``: per-workload SLOs, workload name -> objectives in the same syntax
      (``{structured: "ttft_p95<=5s"}``): judged on that workload's requests only — its own sweep and its
      class inside the mix (:mod:`servelab.trial.verdicts`), in addition to ``slo``; each key must be
      one of the experiment's workloads.
    - ``error_budget``: max failed/submitted per load step (fraction, default 0.01); a step above it
      breaks the sweep like an SLO.
    - ``quality``: :class:`Quality` gates.
    - ``expected_rate_rps``: the stated arrival rate (requests/s) for the arrival test; required when
      ``arrival_test.enabled``.
    - ``burstiness``: gamma shape k of inter-arrival times (1 = Poisson, < 1 burstier; CV = 1/sqrt(k)).
    - ``mix``: workload ratio of the arrival test, ``"short-qa:3,structured:1"`` (sets short-qa, rag,
      long-gen, structured); ``None`` = the experiment's mixable workloads, weight 1 each.
    - ``budget``: :class:`Budget`.
    - ``peak_rate_rps``: the peak arrival rate (requests/s) the replicas are planned for (003 §21);
      ``None`` = ``expected_rate_rps``. ``headroom``: fraction of a replica's capacity at the SLO left
      free at that peak (default 0.3: plan each replica to 70 % of its capacity).
    """

    task: str | None = Field(None, description="what the service does (free text)")
    task_kind: Literal["chat", "embeddings"] = Field(
        "chat",
        description="chat (the chat flow) or embeddings (/v1/embeddings servers: embeddings gate, "
        "inputs/s at the SLO; servelab.trial.flows.embeddings)",
    )
    slo: Annotated[str | None, _SLO_SCHEMA] = None
    workload_slo: dict[str, str] = Field(
        default_factory=dict,
        description="per-workload SLOs: workload name -> METRIC_STAT<=VALUE[ms|s|%],… judged "
        "on that workload's requests (its sweep and its class in the mix)",
        examples=[{"structured": "ttft_p95<=5s"}],
    )
    error_budget: float = Field(0.01, ge=0, le=1, description="max failed/submitted per load step (fraction)")
    quality: Quality = Field(default_factory=Quality)
    expected_rate_rps: float | None = Field(None, gt=0, description="stated arrival rate, requests/s")
    burstiness: float = Field(0.5, gt=0, description="gamma shape k of arrivals (1 = Poisson, <1 = bursty)")
    mix: str | None = Field(
        None, description="arrival-test ratio, e.g. short-qa:3,structured:1", examples=["short-qa:3,structured:1"]
    )
    budget: Budget = Field(default_factory=Budget)
    peak_rate_rps: float | None = Field(
        None, gt=0, description="peak arrival rate to plan replicas for, requests/s (null = expected_rate_rps)"
    )
    headroom: float = Field(0.3, ge=0, lt=1, description="fraction of each replica's capacity kept free at the peak")

    @field_validator("slo", mode="before")
    @classmethod
    def _slo(cls, v: Any) -> Any:
        if v is None:
            return None
        if isinstance(v, dict):
            parts = []
            for k, lim in v.items():
                if isinstance(lim, bool) or not isinstance(lim, (str, int, float)):
                    raise ValueError(f"limit of {k!r} must be a value like 2s, 300ms or 1%, got {lim!r}")
                parts.append(f"{k}<={str(lim).strip().lstrip('<=').strip()}")
            v = ",".join(parts)
        if not isinstance(v, str):
            raise ValueError("give a string like 'ttft_p95<=2s,error_rate<=1%' or a mapping {ttft_p95: 2s}")
        try:
            parse_slo(v)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("workload_slo", mode="before")
    @classmethod
    def _workload_slo(cls, v: Any) -> Any:
        if v is None:
            return {}
        if not isinstance(v, dict):
            raise ValueError("give a mapping workload -> SLO, e.g. {structured: 'ttft_p95<=5s'}")
        out = {}
        for k, text in v.items():
            out[k] = cls._slo(text)
            if not out[k]:
                raise ValueError(f"{k}: give the workload's SLO, e.g. 'ttft_p95<=5s', or leave the key out")
        return out

    @field_validator("mix")
    @classmethod
    def _mix(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                parse_ratio(v)
            except ConfigError as e:
                raise ValueError(f"{e}; sets: {', '.join(mixable_workloads())}") from None
        return v

    @property
    def objectives(self) -> list[Objective]:
        """The parsed SLOs (:class:`servelab.bench.analysis.slo.Objective`; limits in seconds or a fraction)."""
        return parse_slo(self.slo)
