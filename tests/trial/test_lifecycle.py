"""Lifecycle measurements (issue 11 item 5) against the real llama-server (Gemma 3 270M): cold vs warm
start (a second launch right after the first, both timed to the first token), restart under
load (requests failed, down time, longest gap without a success, first success after the restart) and
cancellation (half the clients disconnect mid-stream: llama.cpp's ``llamacpp:requests_processing``
gauge drops and returns to its baseline)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from servelab.trial.lifecycle import ENGINE_CACHES, cancellation, restart_under_load, warm_start


@pytest.fixture
def llama(tmp_path: Path):
    from servelab.engines.llamacpp import LlamaCppLauncher, find_llama_server

    binary = find_llama_server()
    if binary is None:
        if os.environ.get("SERVELAB_REQUIRE_ENGINE"):
            pytest.fail("llama-server is not built: run 'servelab engine build llamacpp'")
        pytest.skip("llama-server not built")

    def launch(port: int | None = None):
        return LlamaCppLauncher(ctx_size=4096, parallel=4, binary=binary, port=port, log_dir=tmp_path).start()

    started: list = []

    def factory(port: int | None = None):
        eng = launch(port)
        started.append(eng)
        return eng

    yield factory
    for e in started:
        e.stop()


def test_warm_start_real_llama_server(llama) -> None:
    eng = llama()
    eng.measure_first_token(timeout_s=60)
    cold = dict(eng.cold_start)
    res, new = warm_start(eng, lambda port: llama(port), cold, ENGINE_CACHES["llamacpp"])
    assert res.error is None and not eng.alive and new.alive and new.port == eng.port
    for t in (res.cold, res.warm):
        assert t is not None and t.port_open_s is not None and t.health_s is not None and t.first_token_s
        assert 0 < t.port_open_s <= t.health_s <= t.first_token_s < 60  # a 270M GGUF: seconds, not minutes
    assert res.cold.first_token_s == cold["first_token_s"]
    assert res.warm_minus_cold_s == pytest.approx(res.warm.first_token_s - res.cold.first_token_s, abs=1e-3)
    print(res.model_dump())


def test_restart_under_load_real_llama_server(llama) -> None:
    eng = llama()
    eng.measure_first_token(timeout_s=60)
    # Under the clients' steady requests llama-server does not exit on SIGTERM, so the default 10 s grace
    # before SIGKILL was most of the down time (down_s 11.0 s; an idle start is ~1 s). What is checked is
    # the measurement around the restart, not llama-server's shutdown: 2 s grace.
    eng.stop_grace_s = 2.0
    # The clients run 4 s before the restart and 3 s past the relaunched engine's readiness (after_s), not
    # a fixed 14 s: every check below is about the restart and the first successes after it.
    res, last = restart_under_load(
        eng, lambda port: llama(port), clients=2, duration_s=4.0, restart_at_s=4.0, after_s=3.0, max_tokens=8
    )
    assert res.restart_error is None
    assert last is not eng and last.alive and last.port == eng.port and not eng.alive
    assert res.requests_ok > 0
    assert res.down_s is not None and res.down_s > 0
    assert res.first_success_after_restart_s is not None and res.first_success_after_restart_s >= res.down_s * 0.5
    # the gap spans the down time: no request can succeed while the engine is stopped
    assert res.longest_gap_s is not None and res.longest_gap_s >= res.down_s * 0.9
    assert res.requests_failed >= 1 and set(res.failed_by_class) <= {"connect", "cut_off", "http_status"}
    print(res.model_dump())


def test_cancellation_real_llama_server(llama) -> None:
    eng = llama()
    eng.measure_first_token(timeout_s=60)
    res = cancellation(eng, "llamacpp:requests_processing", clients=4, share=0.5, max_tokens=64, settle_timeout_s=240)
    print(res.model_dump())
    assert res.baseline == 0 and res.running_at_cancel is not None and res.running_at_cancel >= 3
    assert res.drop_s is not None and res.drop_s > 0
    assert res.baseline_return_s is not None and res.baseline_return_s >= res.drop_s
    assert res.completed == 2 and res.note is None
    kids = psutil.Process(eng.pid).children(recursive=True)
    assert eng.alive and all(k.is_running() for k in kids)


def test_lifecycle_measurements_that_do_not_fit_the_budget_are_named() -> None:
    from servelab.trial.lifecycle import LifecycleOptions, run_lifecycle

    asked: list[float] = []

    def no_room(estimate_s: float) -> bool:
        asked.append(estimate_s)
        return False

    engine = object()  # never touched: nothing fits
    opts = LifecycleOptions(warm_start=True, cancellation=True, restart_under_load=True)
    res, left = run_lifecycle(opts, None, engine, "/nonexistent", {"first_token_s": 2.5}, no_room)
    assert left is engine and res is not None
    assert res.warm_start is None and res.cancellation is None and res.restart_under_load is None
    assert res.skipped == (
        "not run for the trial budget (goal.budget.max_minutes): warm start, cancellation, restart under load"
    )
    assert asked == [2.5, 30.0, 22.5]
