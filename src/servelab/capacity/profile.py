"""The traffic profile (003 §21: daily active users, peak concurrency, mean input and output tokens,
long-request share, stream hold time, retry rate, batch-script bursts, and which tier each task goes
to): a YAML file validated by :class:`TrafficProfile`, with its JSON Schema committed beside this
module (``traffic.schema.json``; ``servelab schema write|check``). A bad value is one line naming the
field (:func:`load_profile`). Example: ``examples/traffic.yaml``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
from pydantic import ConfigDict, Field, ValidationError, model_validator

from servelab.bench.analysis.slo import parse_slo
from servelab.wire.config import PublishedSchema, StrictModel, json_schema_of, read_yaml_file, validation_error_line
from servelab.wire.errors import ConfigError

__all__ = ["PUBLISHED_SCHEMA", "Deployment", "Lengths", "LengthsFrom", "Task", "TrafficProfile", "load_profile"]

SCHEMA_PATH = Path(__file__).with_name("traffic.schema.json")
#: z of the 95th percentile of a standard normal (two lognormal moments from mean and P95)
Z95 = 1.6448536269514722


class Lengths(StrictModel):
    """A token-length distribution: ``mean`` and ``p95`` (a lognormal through both; P95 at most 3.87x
    the mean, the most a lognormal allows), or ``values`` (an empirical sample, drawn with replacement)."""

    model_config = ConfigDict(allow_inf_nan=False)  # NaN/inf refused as such, not as out of range

    mean: float | None = Field(None, gt=0, le=10_000_000, description="mean tokens")
    p95: float | None = Field(None, gt=0, le=10_000_000, description="95th percentile tokens (default: the mean)")
    values: list[int] | None = Field(None, min_length=1, description="a sample of token counts to draw from")

    @model_validator(mode="after")
    def _one(self) -> Lengths:
        if (self.mean is None) == (self.values is None):
            raise ValueError("give either mean (and p95) or values")
        if self.values is not None and any(v < 1 for v in self.values):
            raise ValueError("token counts in values must be >= 1")
        if self.mean is not None and self.p95 is not None:
            if self.p95 < self.mean:
                raise ValueError(f"p95 {self.p95:g} is below the mean {self.mean:g}")
            if math.log(self.p95 / self.mean) > Z95**2 / 2:
                raise ValueError(
                    f"p95 {self.p95:g} is more than {math.exp(Z95**2 / 2):.2f}x the mean: no "
                    "lognormal has that tail; give values instead"
                )
        return self

    def expected(self) -> float:
        """The mean, tokens."""
        return float(np.mean(self.values)) if self.values is not None else float(self.mean or 0.0)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` draws (tokens, >= 1). Lognormal from mean m and P95 q: sigma solves
        ``ln(q/m) = Z95*sigma - sigma^2/2`` (smaller root), ``mu = ln m - sigma^2/2`` (Johnson, Kotz &
        Balakrishnan, *Continuous Univariate Distributions* vol. 1, 1994, ch. 14)."""
        if self.values is not None:
            return rng.choice(np.asarray(self.values, dtype=float), n)
        m = float(self.mean or 1.0)
        q = float(self.p95 or m)
        sigma = Z95 - math.sqrt(max(Z95**2 - 2 * math.log(q / m), 0.0))
        mu = math.log(m) - sigma**2 / 2
        return np.maximum(1.0, np.round(rng.lognormal(mu, sigma, n) if sigma > 0 else np.full(n, m)))


class LengthsFrom(StrictModel):
    """Where the profile's input and output lengths come from instead of ``input_tokens`` /
    ``output_tokens`` (:mod:`servelab.capacity.lengths`): ``trace`` (a request trace file) or ``run``
    (a bench or trial run folder); a path relative to the profile's folder. A declared
    ``input_tokens`` or ``output_tokens`` still wins for its side."""

    trace: str | None = Field(None, min_length=1, description="a trace file (Mooncake JSONL, Azure or BurstGPT CSV)")
    run: str | None = Field(None, min_length=1, description="a servelab bench or trial run folder")

    @model_validator(mode="after")
    def _one(self) -> LengthsFrom:
        if (self.trace is None) == (self.run is None):
            raise ValueError("give one of trace or run")
        return self


class Task(StrictModel):
    """A task class of the mix: its ``share`` of requests, the ``tier`` it is routed to, and its own
    lengths (default: the profile's)."""

    model_config = ConfigDict(allow_inf_nan=False)  # NaN/inf refused as such, not as out of range

    name: str = Field(min_length=1)
    share: float = Field(gt=0, le=1, description="fraction of all requests")
    tier: str = Field(min_length=1, description="a key of tiers")
    input_tokens: Lengths | None = None
    output_tokens: Lengths | None = None


class Deployment(StrictModel):
    """What one replica of a candidate runs on and costs: ``devices_per_replica`` (GPUs, or 1 CPU host),
    ``devices_per_host`` and ``price_per_hour`` of one replica in ``currency``."""

    model_config = ConfigDict(allow_inf_nan=False)  # NaN/inf refused as such, not as out of range

    devices_per_replica: int = Field(1, ge=1, le=4096)
    devices_per_host: int = Field(8, ge=1, le=4096)
    price_per_hour: float | None = Field(None, ge=0, le=1e7, description="one replica's price per hour")
    device: str | None = Field(None, description="what the device is, for the plan's text (H100 80GB)")


class TrafficProfile(StrictModel):
    """A service's expected traffic (module doc). Rates are per second, durations in seconds, shares
    in 0..1. ``tiers``: tier name -> candidate (a name in the evidence); ``tasks`` route shares of the
    traffic to tiers (empty: everything to each candidate in turn). ``strong_tier``: the tier a plan
    without routing would send everything to."""

    model_config = ConfigDict(allow_inf_nan=False)  # NaN/inf refused as such, not as out of range

    name: str = "traffic"
    daily_active_users: int = Field(ge=1, le=10_000_000_000)
    requests_per_user_per_day: float = Field(gt=0, le=1_000_000)
    peak_to_mean: float | None = Field(None, ge=1, le=1000, description="peak hour rate / daily mean rate")
    hourly_shape: list[float] | None = Field(
        None, min_length=24, max_length=24, description="relative traffic of each hour (24 values >= 0)"
    )
    burst_factor: float = Field(1.0, ge=1, le=1000, description="batch-script bursts: K x the peak rate")
    burstiness: float = Field(1.0, gt=0, le=100, description="gamma shape of arrivals (1 Poisson, < 1 burstier)")
    input_tokens: Lengths | None = None
    output_tokens: Lengths | None = None
    lengths_from: LengthsFrom | None = None
    long_share: float = Field(0.0, ge=0, le=1, description="share of long requests")
    long_input_tokens: Lengths | None = None
    stream_hold_s: float | None = Field(
        None, gt=0, le=86400, description="how long a stream is held open, s (default: the predicted E2E)"
    )
    retry_rate: float = Field(0.0, ge=0, lt=1, description="extra requests from retries, fraction")
    slo: list[str] = Field(default_factory=lambda: ["ttft_p95<=2s"])
    headroom: float = Field(0.3, ge=0, lt=1, description="fraction of each replica's capacity kept free")
    currency: str = "USD"
    deployments: dict[str, Deployment] = Field(default_factory=dict, description="candidate -> deployment")
    tiers: dict[str, str] = Field(default_factory=dict, description="tier -> candidate")
    tasks: list[Task] = Field(default_factory=list)
    strong_tier: str | None = None

    @model_validator(mode="after")
    def _check(self) -> TrafficProfile:
        if (self.input_tokens is None or self.output_tokens is None) and self.lengths_from is None:
            raise ValueError("give input_tokens and output_tokens, or lengths_from (a trace or a run folder)")
        if self.peak_to_mean is not None and self.hourly_shape is not None:
            raise ValueError("give peak_to_mean or hourly_shape, not both")
        if self.hourly_shape is not None and (
            not all(math.isfinite(v) for v in self.hourly_shape)
            or min(self.hourly_shape) < 0
            or sum(self.hourly_shape) <= 0
        ):
            raise ValueError("hourly_shape needs 24 finite numbers >= 0, not all 0")
        if self.long_share > 0 and self.long_input_tokens is None:
            raise ValueError("long_share > 0 needs long_input_tokens")
        try:
            parse_slo(",".join(self.slo))
        except ConfigError as e:
            raise ValueError(str(e)) from None
        if self.tasks:
            total = sum(t.share for t in self.tasks)
            if abs(total - 1) > 1e-6:
                raise ValueError(f"task shares add up to {total:g}, not 1")
            for t in self.tasks:
                if t.tier not in self.tiers:
                    raise ValueError(f"task {t.name!r} goes to tier {t.tier!r}, which tiers does not name")
        if self.strong_tier is not None and self.strong_tier not in self.tiers:
            raise ValueError(f"strong_tier {self.strong_tier!r} is not a key of tiers")
        return self

    def inputs(self) -> Lengths:
        """The input lengths (declared, or filled from ``lengths_from`` by :func:`load_profile`)."""
        if self.input_tokens is None:
            raise ConfigError("the profile's input lengths are not loaded: read it with load_profile")
        return self.input_tokens

    def outputs(self) -> Lengths:
        """The output lengths (declared, or filled from ``lengths_from`` by :func:`load_profile`)."""
        if self.output_tokens is None:
            raise ConfigError("the profile's output lengths are not loaded: read it with load_profile")
        return self.output_tokens

    def peak_ratio(self) -> float:
        """Peak over mean rate: ``peak_to_mean``, or max/mean of ``hourly_shape``, else 1."""
        if self.hourly_shape is not None:
            return max(self.hourly_shape) / (sum(self.hourly_shape) / 24)
        return self.peak_to_mean or 1.0


def load_profile(path: str | os.PathLike[str]) -> TrafficProfile:
    """Read and validate a traffic profile; raises :class:`ConfigError` with one line naming the file
    and the bad field."""
    data = read_yaml_file(
        path,
        what="traffic profile",
        missing_fix="give an existing YAML file (see examples/traffic.yaml)",
        empty_fix="write a profile (see examples/traffic.yaml)",
    )
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping (daily_active_users:, …)")
    try:
        prof = TrafficProfile.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, str(path), TrafficProfile)) from None
    src = prof.lengths_from
    if src is not None:
        from servelab.capacity.lengths import lengths_of_run, lengths_of_trace

        base = Path(path).parent
        where = base / (src.trace or src.run or "")
        if src.trace is not None and not where.is_file():
            raise ConfigError(
                f"{path}: lengths_from.trace {where} is not a file; give an existing trace (a relative path is "
                "read from the profile's folder)"
            )
        if src.run is not None and not where.is_dir():
            raise ConfigError(
                f"{path}: lengths_from.run {where} is not a folder; give a servelab bench or trial run folder "
                "(a relative path is read from the profile's folder)"
            )
        inp, out = lengths_of_trace(where) if src.trace is not None else lengths_of_run(where)
        prof.input_tokens = prof.input_tokens or Lengths(values=inp)
        prof.output_tokens = prof.output_tokens or Lengths(values=out)
    return prof


PUBLISHED_SCHEMA = PublishedSchema(SCHEMA_PATH, lambda: json_schema_of(TrafficProfile, "servelab traffic profile"))
