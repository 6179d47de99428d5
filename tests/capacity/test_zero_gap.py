"""A capacity model whose decode gap is 0 s: the trial of a mock engine with ``itl_ms: 0`` and
``tokens_per_chunk: 8`` streams each response's chunks at one instant, so every measured token gap
is 0 and the fit's decode law is 0 s per token. The simulator serves such a model (every token at
the first) instead of dividing by the zero gap (``cannot convert float NaN to integer``), the fit says
why its decode law is 0, and a model or profile that is not finite is refused in words. In-process."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from servelab.bench.analysis.slo import parse_slo
from servelab.bench.results import LoadInfo
from servelab.capacity.agree import check_search
from servelab.capacity.evidence import Obs, StepEvidence
from servelab.capacity.fit import fit
from servelab.capacity.plan import _replicas
from servelab.capacity.profile import TrafficProfile
from servelab.capacity.results import PerfParams, SearchCheck
from servelab.capacity.simulate import simulate
from servelab.capacity.trialmodel import check_rate
from servelab.capacity.validate import validate

TTFT_S, TOKENS = 0.011, 16


def _obs(sent: float, prompt: int) -> Obs:
    """One request as the mock streamed it: first token TTFT_S after sending, its two chunks (8 tokens
    each, recorded as one token a chunk) at the same instant, usage TOKENS."""
    first = sent + TTFT_S
    return Obs(
        sent=sent,
        first=first,
        last=first,
        end=first + 4e-5,
        prompt=prompt,
        output=TOKENS,
        chunks=[(first, 1), (first, 1)],
        workload="short-qa",
    )


def _steps() -> list[StepEvidence]:
    closed = [_obs(k * (TTFT_S + 5e-5), 30 + k % 7) for k in range(8)]
    steps = [StepEvidence("steps", "steps:short-qa/c1", LoadInfo(kind="closed", concurrency=1), closed)]
    for rate in (4.0, 8.0):
        reqs = [_obs(k / rate, 30 + k % 5) for k in range(10)]
        steps.append(
            StepEvidence(
                "capacity", f"capacity/r{rate:.4g}:mix/r{rate:.4g}", LoadInfo(kind="open", rate_rps=rate), reqs
            )
        )
    return steps


def test_zero_decode_gap_simulates_every_token_at_the_first() -> None:
    p = PerfParams(prefill_base_s=0.01, decode_base_s=0.0, decode_per_running_s=0.0, slots=2)
    run = simulate(p, np.full(5, 10.0), np.full(5, 16.0), arrival_s=np.arange(5) * 0.1)
    assert np.allclose(run.ttft, 0.01) and np.allclose(run.e2e, run.ttft) and np.allclose(run.tpot, 0.0)
    closed = simulate(p, np.full(4, 10.0), np.full(4, 16.0), concurrency=2)
    # 2 clients: each sends its next request as the previous ends, 2 rounds of 0.01 s
    assert np.allclose(closed.ttft, 0.01) and closed.window_s == pytest.approx(0.02)


def test_fit_validation_and_search_on_tokens_that_arrive_together() -> None:
    steps = _steps()
    rep, boots = fit(steps, bootstrap=10)
    assert rep.params.decode_base_s == 0 and rep.params.decode_per_running_s == 0
    assert any("token gaps fit to 0 s" in n for n in rep.notes), rep.notes
    v = validate(steps, bootstrap=5)
    assert v.median_abs_error is not None and math.isfinite(v.median_abs_error)
    probes = [(4.0, True, "r4"), (8.0, True, "r8")]
    sc = check_search(rep.params, boots[:3], steps, probes, parse_slo("ttft_p95<=60ms"))
    assert sc is not None and math.isfinite(sc.model_capacity_rps) and sc.probes_agreeing == 2
    pick = check_rate(sc)
    assert pick is not None and math.isfinite(pick[0]) and pick[0] > 0


def test_no_token_gap_is_said() -> None:
    steps = _steps()
    for st in steps:
        for r in st.requests:
            r.chunks = r.chunks[:1]
    rep, _ = fit(steps, bootstrap=2)
    assert any("no token gap measured" in n and "one chunk" in n for n in rep.notes), rep.notes


@pytest.mark.parametrize("field", ["prefill_base_s", "decode_base_s", "decode_per_running_s"])
@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0])
def test_a_model_that_is_not_finite_is_refused_in_words(field: str, bad: float) -> None:
    p = PerfParams.model_validate(
        {"prefill_base_s": 0.01, "decode_base_s": 0.001, "decode_per_running_s": 0.0, "slots": 1, field: bad}
    )
    with pytest.raises(ValueError) as e:
        simulate(p, np.full(3, 10.0), np.full(3, 4.0), concurrency=1)
    msg = str(e.value)
    assert "performance model has no usable" in msg and "refit it" in msg and "convert" not in msg, msg


def test_non_finite_rates_never_reach_int() -> None:
    assert _replicas(math.nan, 10.0, 0.3) is None and _replicas(5.0, math.inf, 0.3) is None
    assert _replicas(5.0, math.nan, 0.3) is None and _replicas(5.0, 10.0, 0.3) == 1
    sc = SearchCheck(model_capacity_rps=math.nan, probe_requests=10, agrees=False, probes_agreeing=0)
    assert check_rate(sc) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_hourly_shape_must_be_finite(bad: float) -> None:
    with pytest.raises(ValidationError, match="finite number"):
        TrafficProfile.model_validate(
            {
                "daily_active_users": 100,
                "requests_per_user_per_day": 10,
                "input_tokens": {"mean": 100},
                "output_tokens": {"mean": 50},
                "hourly_shape": [1.0] * 23 + [bad],
            }
        )
