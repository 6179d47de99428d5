"""The simulator against queueing results that hold exactly or in the long run."""

from __future__ import annotations

import numpy as np

from servelab.capacity.results import PerfParams
from servelab.capacity.simulate import arrivals, simulate


def _p(**kw: object) -> PerfParams:
    base = {
        "prefill_base_s": 0.1,
        "prefill_tokens_per_s": 1000.0,
        "decode_base_s": 0.01,
        "decode_per_running_s": 0.0,
        "slots": 1,
    }
    return PerfParams.model_validate({**base, **kw})


def test_one_client_is_prefill_plus_decode() -> None:
    prompt, out = np.array([100.0, 500.0]), np.array([11.0, 21.0])
    run = simulate(_p(), prompt, out, concurrency=1)
    assert np.allclose(run.ttft, [0.2, 0.6]) and np.allclose(run.e2e, [0.2 + 0.1, 0.6 + 0.2])


def test_batch_slows_every_token() -> None:
    prompt, out = np.full(2, 0.0), np.full(2, 101.0)
    run = simulate(_p(prefill_tokens_per_s=None, decode_per_running_s=0.005, slots=2), prompt, out, concurrency=2)
    assert np.allclose(run.tpot, 0.015)  # both decode together for all 100 gaps: 10 + 5 * (2 - 1) ms


def test_slots_queue_fifo() -> None:
    prompt, out = np.zeros(3), np.full(3, 1.0)
    run = simulate(_p(prefill_tokens_per_s=None, slots=2), prompt, out, concurrency=3)
    assert np.allclose(np.sort(run.ttft), [0.1, 0.1, 0.2])


def test_md1_mean_wait_matches_pollaczek_khinchine() -> None:
    # one slot, deterministic service S = 0.1 s (prefill only), Poisson arrivals at rho = 0.7:
    # mean wait in queue W = rho * S / (2 (1 - rho)) (Pollaczek-Khinchine for M/D/1; Kleinrock vol. 1 §5.7)
    n, s, rho = 40_000, 0.1, 0.7
    at = arrivals(rho / s, n, np.random.default_rng(1))
    run = simulate(_p(prefill_tokens_per_s=None), np.zeros(n), np.ones(n), arrival_s=at)
    wait = float(np.mean(run.ttft)) - s
    assert abs(wait - rho * s / (2 * (1 - rho))) < 0.05 * rho * s / (2 * (1 - rho))
