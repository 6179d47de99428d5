"""Reliability counters (issue 11 item 4): a deliberately crashing mock candidate (``crash_after_requests``)
is counted as crashed in the step it crashed in, fails without ``restart``, and with ``restart: once`` is
started again on the same port, recovers (recovery time recorded) and is ranked; exit classification
names OOMs from each engine's log lines and signals from the exit status."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.trial.flow import TrialRunner
from servelab.trial.reliability import classify_exit
from servelab.trial.spec import Experiment


def _run(tmp_path: Path, restart: str):
    exp = Experiment.model_validate(
        {
            "goal": {
                "slo": "ttft_p95<=5s",
                "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
                "mix": "short-qa:1",
            },
            "candidates": [
                {
                    "name": "crashy",
                    "engine": "mock",
                    "restart": restart,
                    "settings": {"ttft_ms": 20.0, "itl_ms": 5.0, "output_tokens": 8, "crash_after_requests": 6},
                }
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 8}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 8,
            "warmup": 0,
            "mix_sweep": False,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 10,
        }
    )
    rec = TrialRunner(exp, tmp_path / restart, progress=lambda *_: None).run()
    from servelab.trial.results import read_record

    written = read_record(tmp_path / restart / "record.json").results.candidates["crashy"]
    assert written.reliability == rec.results.candidates["crashy"].reliability  # per-step counters kept on disk
    return rec.results.candidates["crashy"]


def test_crash_counted_and_fails_without_restart(tmp_path: Path) -> None:
    r = _run(tmp_path, "never")
    assert r.status == "failed" and "exited during the load steps (exit code 3)" in (r.reason or "")
    rel = r.reliability
    assert rel is not None and rel.crash_count == 1 and rel.restart_count == 0
    c = rel.crashes[0]
    assert c.returncode == 3 and not c.restarted and not c.recovered and c.recovery_s is None
    step = rel.steps["short-qa/c1"]
    assert step.crashes == 1 and step.connect_errors + step.stream_interruptions >= 1


def test_restart_once_recovers_with_its_recovery_time(tmp_path: Path) -> None:
    r = _run(tmp_path, "once")
    assert r.status == "ranked", r.reason
    rel = r.reliability
    assert rel is not None and rel.crash_count == 1 and rel.restart_count == 1
    c = rel.crashes[0]
    assert c.restarted and c.recovered and c.recovery_s is not None and 0 < c.recovery_s < 60
    step = rel.steps["short-qa/c1"]
    assert step.crashes == 1 and step.restarts == 1
    assert step.connect_errors + step.stream_interruptions >= 1  # requests the crash broke
    assert r.engine_exit is not None and r.engine_exit.alive_after_stop is False


@pytest.mark.parametrize(
    ("line", "kind", "oom"),
    [
        ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "vllm", True),
        ("ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 4294967296", "llamacpp", True),
        ("terminate called after throwing an instance of 'std::bad_alloc'", None, True),
        ("INFO: shutting down", "vllm", False),
    ],
)
def test_classify_exit_from_log_lines(tmp_path: Path, line: str, kind: str | None, oom: bool) -> None:
    log = tmp_path / "engine.log"
    log.write_text("starting\n" + line + "\nbye\n")
    got_oom, sig, got_line = classify_exit(-9, log, kind)
    assert got_oom is oom and sig == "SIGKILL"
    assert (got_line == line) is oom
