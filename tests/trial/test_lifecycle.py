"""Lifecycle measurements (issue 11 item 5) against the real llama-server (Gemma 3 270M): restart under
load (requests failed, down time, longest gap without a success, first success after the restart) and
cancellation (half the clients disconnect mid-stream: llama.cpp's ``llamacpp:requests_processing``
gauge drops and returns to its baseline)."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from servelab.trial.lifecycle import cancellation, restart_under_load

pytestmark = pytest.mark.engine


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


def test_restart_under_load_real_llama_server(llama) -> None:
    eng = llama()
    eng.measure_first_token(timeout_s=60)
    res, last = restart_under_load(eng, lambda port: llama(port), clients=2, duration_s=14.0, restart_at_s=4.0,
                                   max_tokens=8)
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
    res = cancellation(eng, "llamacpp:requests_processing", clients=4, share=0.5, max_tokens=64,
                       settle_timeout_s=240)
    print(res.model_dump())
    assert res.baseline == 0 and res.running_at_cancel is not None and res.running_at_cancel >= 3
    assert res.drop_s is not None and res.drop_s > 0
    assert res.baseline_return_s is not None and res.baseline_return_s >= res.drop_s
    assert res.completed == 2 and res.note is None
    kids = psutil.Process(eng.pid).children(recursive=True)
    assert eng.alive and all(k.is_running() for k in kids)
