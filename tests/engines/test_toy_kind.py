"""Adding an engine kind is one module: this test module *is* that module. It declares a toy kind (its
settings model, launcher, identity, metric names and readiness probe), registers it, and runs a whole
trial with two toy candidates — nothing outside this file changes. The toy engine is servelab's mock
engine run with the toy's settings translated to mock settings (docs/adding-an-engine.md walks
through the same example)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psutil
import pytest
from pydantic import Field

from servelab.engines.base import RunningEngine
from servelab.engines.mocklaunch import MockLauncher
from servelab.engines.registry import (EngineIdentity, EngineKind, EngineSettings, PortSetting, Readiness,
                                       ServerMetrics, ready_timeout_setting, register, unregister)
from servelab.trial.results import TrialRecord

pytestmark = pytest.mark.timeout(300)

# ---------------------------------------------------------------------------------------------------
# the kind: everything a new engine needs


class ToySettings(EngineSettings):
    """Toy engine settings: ``speed`` (``fast`` = 1 ms between tokens, ``slow`` = 20 ms), ``answer_tokens``
    (tokens per answer), ``port`` and ``ready_timeout_s`` like every launched kind."""

    speed: Literal["fast", "slow"] = Field("fast", description="fast: 1 ms/token, slow: 20 ms/token")
    answer_tokens: int = Field(12, ge=1, le=64, description="tokens per answer")
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(60.0)


class ToyKind(EngineKind):
    """``engine: toy`` — the mock engine dressed as a new engine kind."""

    kind = "toy"
    title = "Toy engine"
    summary = "a toy engine (servelab's mock behind its own settings)"
    Settings = ToySettings
    takes_model = False
    metrics = ServerMetrics(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting")
    readiness = Readiness(path="/health")

    def launch(self, settings: Any, *, model: str | None = None, log_dir: str | None = None,
               **kwargs: Any) -> RunningEngine:
        s = self.parse(settings)
        assert isinstance(s, ToySettings)
        eng = MockLauncher({"itl_ms": 1.0 if s.speed == "fast" else 20.0, "ttft_ms": 2.0,
                            "output_tokens": s.answer_tokens, "model": "toy-model"},
                           port=s.port, ready_timeout_s=s.ready_timeout_s, log_dir=log_dir).start()
        eng.identity = EngineIdentity(
            kind="toy", engine="toy-engine", version="0.1", build="toy-build-7", argv=eng.argv, devices=[],
            settings=s.model_dump(mode="json"), model={"path": None, "sha256": None}, host=eng.host, port=eng.port,
            base_url=eng.base_url, pid=eng.pid, log_path=str(eng.log_path)).model_dump(mode="json")
        return eng


# ---------------------------------------------------------------------------------------------------
# the trial


@pytest.fixture(scope="module")
def toy() -> Iterator[ToyKind]:
    kind = register(ToyKind())
    assert isinstance(kind, ToyKind)
    try:
        yield kind
    finally:
        unregister("toy")


EXPERIMENT = {
    "name": "toys",
    "goal": {"slo": "ttft_p95<=5s,itl_p95<=200ms", "expected_rate_rps": 40, "mix": "short-qa:1,structured:1"},
    "candidates": [{"name": "quick", "engine": "toy", "settings": {"speed": "fast"}},
                   {"name": "lazy", "engine": "toy", "settings": {"speed": "slow", "answer_tokens": 24}}],
    "workloads": ["short-qa", "structured"],
    "steps": {"concurrency": [1, 2]}, "requests_per_step": 3, "warmup": 0, "timeout_s": 20,
    "arrival_test": {"enabled": True, "requests": 4},
}


@pytest.fixture(scope="module")
def trial(toy: ToyKind, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import Experiment

    out = tmp_path_factory.mktemp("toy") / "run"
    record = TrialRunner(Experiment.model_validate(EXPERIMENT), out, progress=lambda s: None).run()
    return record, out


def test_the_experiment_schema_knows_the_new_kind(toy: ToyKind, tmp_path: Path) -> None:
    import yaml

    from servelab.trial import spec
    from servelab.trial.spec import json_schema, load_experiment
    from servelab.wire import ConfigError

    assert spec.ENGINES[-1] == "toy"
    assert "ToySettings" in json_schema()["$defs"]
    bad = {**EXPERIMENT, "candidates": [{"name": "q", "engine": "toy", "settings": {"sped": "fast"}}]}
    p = tmp_path / "exp.yaml"
    p.write_text(yaml.safe_dump(bad))
    with pytest.raises(ConfigError, match=r"candidates\[0\]\.settings\.sped: unknown field \(did you mean 'speed'\?\)"):
        load_experiment(p)


def test_a_trial_runs_the_new_kind(trial: tuple[TrialRecord, Path]) -> None:
    record, out = trial
    res = record.results.candidates
    assert res["quick"].status == "ranked" and res["lazy"].status == "ranked"
    assert record.decision.ranking[0] == "quick"  # 1 ms vs 20 ms between tokens
    cmp = record.decision.comparisons[0]
    assert cmp.differs_in == ["settings.answer_tokens", "settings.speed"], cmp
    for name in ("quick", "lazy"):
        ident = record.ident(name).engine
        assert isinstance(ident, EngineIdentity)
        assert ident.kind == "toy" and ident.build == "toy-build-7"
        assert not psutil.pid_exists(ident.pid or 0) or psutil.Process(ident.pid).status() == psutil.STATUS_ZOMBIE
        for f in record.evidence.files[name].values():
            assert (out / f).exists(), f


def test_the_sampler_keeps_the_kinds_own_metric_names(trial: tuple[TrialRecord, Path]) -> None:
    _, out = trial
    # the slow candidate's steps take seconds: the sampler (1 s period) sees its /metrics
    samples = [json.loads(ln) for ln in (out / "candidates/lazy/server_metrics.jsonl").read_text().splitlines()]
    names = {k.split("{")[0] for s in samples for k in s["metrics"]}
    assert names and names <= {"vllm:num_requests_running", "vllm:num_requests_waiting"}


def test_unregistering_removes_the_kind() -> None:
    from servelab.trial import spec

    kind = register(ToyKind(), replace=True)
    unregister(kind.kind)
    assert "toy" not in spec.ENGINES and "ToySettings" not in spec.json_schema()["$defs"]
