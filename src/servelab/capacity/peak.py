"""Peak load of a traffic profile (003 §21), each figure with its formula filled in:

- mean rate ``λ_mean = DAU * requests_per_user_per_day / 86400`` (requests/s; a day is 86 400 s);
- peak rate ``λ_peak = λ_mean * peak_to_mean`` (or max/mean of the 24-hour shape);
- offered at the peak ``λ_off = λ_peak * (1 + retry_rate)`` (each retry is one more request);
- burst ``λ_burst = λ_off * burst_factor`` (batch scripts, 003 §21);
- concurrent streams ``L = λ_off * W`` (Little's law, Little 1961, Operations Research 9(3):383-387,
  https://doi.org/10.1287/opre.9.3.383), ``W`` the stream hold time (declared, else the predicted E2E);
- tokens/s in and out ``λ_off * E[tokens]``, ``E[input] = (1 - long_share) * E[input] + long_share *
  E[long input]``.

They rest on the profile's declared numbers, which carry no measured uncertainty.
"""

from __future__ import annotations

from servelab.capacity.profile import TrafficProfile
from servelab.capacity.results import Formula, PeakLoad

__all__ = ["mean_input_tokens", "peak_load"]


def mean_input_tokens(p: TrafficProfile) -> float:
    """``E[input]`` with the long share mixed in, tokens."""
    long = p.long_input_tokens.expected() if p.long_input_tokens is not None else 0.0
    return (1 - p.long_share) * p.inputs().expected() + p.long_share * long


def peak_load(p: TrafficProfile, hold_s: float | None = None) -> PeakLoad:
    """The :class:`PeakLoad` of ``p``; ``hold_s``: stream hold time when the profile declares none (s)."""
    mean = p.daily_active_users * p.requests_per_user_per_day / 86400.0
    ratio = p.peak_ratio()
    peak = mean * ratio
    off = peak * (1 + p.retry_rate)
    burst = off * p.burst_factor
    w = p.stream_hold_s if p.stream_hold_s is not None else hold_s
    e_in, e_out = mean_input_tokens(p), p.outputs().expected()
    w_src = "declared" if p.stream_hold_s is not None else "predicted E2E P50"
    return PeakLoad(
        mean_rps=Formula(
            name="mean rate",
            value=mean,
            unit="req/s",
            formula=f"{p.daily_active_users} users * {p.requests_per_user_per_day:g} req/day / 86400 s",
        ),
        peak_rps=Formula(name="peak rate", value=peak, unit="req/s", formula=f"{mean:.4g} * {ratio:.3g} peak/mean"),
        offered_peak_rps=Formula(
            name="offered at peak", value=off, unit="req/s", formula=f"{peak:.4g} * (1 + {p.retry_rate:g} retries)"
        ),
        burst_rps=Formula(name="burst", value=burst, unit="req/s", formula=f"{off:.4g} * {p.burst_factor:g} burst"),
        concurrent_streams=Formula(
            name="concurrent streams",
            value=off * (w or 0.0),
            unit="streams",
            formula=f"Little: {off:.4g} req/s * {w:.3g} s hold ({w_src})"
            if w is not None
            else "unknown: declare stream_hold_s, or give evidence to predict E2E",
        ),
        input_tps=Formula(name="input tokens/s", value=off * e_in, unit="tok/s", formula=f"{off:.4g} * {e_in:.4g}"),
        output_tps=Formula(name="output tokens/s", value=off * e_out, unit="tok/s", formula=f"{off:.4g} * {e_out:.4g}"),
        mean_input_tokens=e_in,
        mean_output_tokens=e_out,
    )
