"""The prefill stall coefficient (s of token gap per s of other prefill inside the gap) is reported only
as a physical value: a stream whose long gap holds another request's whole prefill gives 1 s/s (the
decode waited for it: prefill serial); one whose gap grew five times the prefill inside it gives no
figure and a note saying the gaps do not carry it. Hand-made evidence, in-process."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.bench.results import Interval, LoadInfo
from servelab.capacity.evidence import Obs, StepEvidence
from servelab.capacity.fit import STALL_SLACK, fit, stall_identified

TTFT_S, GAP_S = 0.010, 0.001


def _obs(sent: float, gaps: list[float], prefill_s: float = TTFT_S) -> Obs:
    first = sent + prefill_s
    t = np.concatenate([[first], first + np.cumsum(gaps)])
    return Obs(
        sent=sent,
        first=first,
        last=float(t[-1]),
        end=float(t[-1]) + 1e-4,
        prompt=32,
        output=len(t),
        chunks=[(float(x), 1) for x in t],
        workload="short-qa",
    )


def _steps(growth: float) -> list[StepEvidence]:
    """A closed step of lone streams (1 ms gaps), then an open one of pairs: B is sent 2.5 ms into A's
    stream and prefills for 10, 20 or 30 ms inside A's third gap, which grows by ``growth`` x that."""
    closed, t = [], 0.0
    for _ in range(8):
        o = _obs(t, [GAP_S] * 7)
        closed.append(o)
        t = o.end + GAP_S
    pairs, t = [], 0.0
    for k in range(12):
        stall = TTFT_S * (1 + k % 3)
        a = _obs(t, [GAP_S, GAP_S, GAP_S + growth * stall, GAP_S, GAP_S, GAP_S, GAP_S])
        pairs += [a, _obs(a.first + 2.5 * GAP_S, [GAP_S] * 6, prefill_s=stall)]
        t = a.end + 0.2
    return [
        StepEvidence("steps", "steps:short-qa/c1", LoadInfo(kind="closed", concurrency=1), closed),
        StepEvidence("capacity", "capacity/r2:mix/r2", LoadInfo(kind="open", rate_rps=2.0), pairs),
    ]


def test_a_gap_that_holds_another_prefill_gives_a_stall_of_one() -> None:
    rep, _ = fit(_steps(1.0), bootstrap=20)
    assert rep.params.prefill_serial
    assert rep.prefill_stall == pytest.approx(1.0, abs=0.05), rep.notes
    assert rep.prefill_stall_ci is not None and rep.prefill_stall_ci.lo is not None
    assert any(n.startswith("prefill serial: token gaps grow by 1.0") for n in rep.notes), rep.notes


def test_a_gap_grown_beyond_the_prefill_inside_it_gives_no_stall_figure() -> None:
    rep, _ = fit(_steps(5.0), bootstrap=20)
    assert rep.prefill_stall is None and rep.prefill_stall_ci is None
    note = next(n for n in rep.notes if n.startswith("prefill stall not identified"))
    assert "5 s per second" in note and "taken as serial" in note, note
    assert not any(n.startswith("prefill serial: token gaps grow") for n in rep.notes), rep.notes


@pytest.mark.parametrize(
    ("beta", "lo", "hi", "ok"),
    [
        (0.0, None, None, True),
        (1.0, None, None, True),
        (1.0 + STALL_SLACK, None, None, True),
        (1.0 + STALL_SLACK + 0.01, None, None, False),
        (-STALL_SLACK - 0.01, None, None, False),
        (3.0, 0.8, 5.0, True),  # the interval reaches back into 0-1: noise around a physical value
        (1435.0, 900.0, 2000.0, False),
        (-2.0, -3.0, -1.0, False),
    ],
)
def test_stall_identified(beta: float, lo: float | None, hi: float | None, ok: bool) -> None:
    ci = None if lo is None else Interval(lo=lo, hi=hi, n=20, method="bootstrap-percentile")
    assert stall_identified(beta, ci) is ok
