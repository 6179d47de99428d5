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

from servelab.engines.kind import (
    EngineIdentity,
    EngineKind,
    EngineSettings,
    PortSetting,
    Readiness,
    ServerMetrics,
    ready_timeout_setting,
)
from servelab.engines.mock.launch import MockLauncher
from servelab.engines.registry import register, unregister
from servelab.engines.running import RunningEngine
from servelab.trial.results import TrialRecord

pytestmark = pytest.mark.timeout(300)

# ---------------------------------------------------------------------------------------------------
# the kind: everything a new engine needs


class ToySettings(EngineSettings):
    """Toy engine settings: ``speed`` (``fast`` = 1 ms between tokens, ``slow`` = 20 ms), ``answer_tokens``
    (tokens per answer), ``port`` and ``ready_timeout_s`` like every launched kind."""

    speed: Literal["fast", "slow"] = Field(
        "fast", description="fast: 2 ms to the first token, then 1 ms/token; slow: 20 ms and 20 ms/token"
    )
    answer_tokens: int = Field(12, ge=1, le=64, description="tokens per answer")
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(60.0)


class ToyKind(EngineKind[ToySettings]):
    """``engine: toy`` — the mock engine dressed as a new engine kind."""

    kind = "toy"
    title = "Toy engine"
    summary = "a toy engine (servelab's mock behind its own settings)"
    Settings = ToySettings
    takes_model = False
    metrics = ServerMetrics(running="vllm:num_requests_running", waiting="vllm:num_requests_waiting")
    readiness = Readiness(path="/health")

    def launch(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> RunningEngine:
        s = self.parse(settings)  # a ToySettings (EngineKind is generic over its settings model)
        eng = MockLauncher(
            {
                "itl_ms": 1.0 if s.speed == "fast" else 20.0,
                "ttft_ms": 2.0 if s.speed == "fast" else 20.0,
                "output_tokens": s.answer_tokens,
                "model": "toy-model",
            },
            port=s.port,
            ready_timeout_s=s.ready_timeout_s,
            log_dir=log_dir,
        ).start()
        eng.identity = EngineIdentity(
            kind="toy",
            engine="toy-engine",
            version="0.1",
            build="toy-build-7",
            argv=eng.argv,
            devices=[],
            settings=s.model_dump(mode="json"),
            model={"path": None, "sha256": None},
            host=eng.host,
            port=eng.port,
            base_url=eng.base_url,
            pid=eng.pid,
            log_path=str(eng.log_path),
        ).model_dump(mode="json")
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
    "candidates": [
        {"name": "quick", "engine": "toy", "settings": {"speed": "fast"}},
        {"name": "lazy", "engine": "toy", "settings": {"speed": "slow", "answer_tokens": 24}},
    ],
    "workloads": ["short-qa", "structured"],
    "steps": {"concurrency": [1, 2]},
    "requests_per_step": 3,
    "warmup": 0,
    "timeout_s": 20,
    "arrival_test": {"enabled": True, "requests": 4},
    # the interleaved rounds and the capacity search are engine-independent (tests/trial/test_decisions.py,
    # test_capacity.py): the least of each that still runs them on the new kind
    "repeats": 2,
    "capacity": {"max_probes": 2},
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
    assert record.decision.ranking[0] == "quick"  # 2 ms vs 20 ms to the first token, 1 vs 20 ms between tokens
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


def test_a_package_adds_a_kind_through_an_entry_point(tmp_path: Path) -> None:
    """Another package declares `[project.entry-points."servelab.engines"]`: the registry loads its kind
    (found by importlib.metadata in an installed distribution's entry_points.txt), the experiment
    accepts it, and a broken entry point is named when a candidate asks for it (servelab still runs).
    In a fresh interpreter: the registry of this one is left as it is."""
    import subprocess
    import sys
    import textwrap

    (tmp_path / "toyeng_ep.py").write_text(
        textwrap.dedent("""
        from servelab.engines.kind import EngineKind, EngineSettings

        class EpSettings(EngineSettings):
            pass

        class EpKind(EngineKind[EpSettings]):
            kind = "ep-toy"
            title = "entry-point toy"
            Settings = EpSettings
            launched = False
        """)
    )
    dist = tmp_path / "toyeng-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toyeng\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[servelab.engines]\nep-toy = toyeng_ep:EpKind\nbroken = toyeng_ep:NoSuchKind\n"
    )
    code = textwrap.dedent("""
        from servelab.engines import registry
        from servelab.trial.spec import Experiment
        from servelab.wire import ConfigError
        assert "ep-toy" in registry.names() and registry.names()[:len(registry.BUILTIN_ORDER)] == registry.BUILTIN_ORDER
        e = Experiment.model_validate({"candidates": [{"name": "a", "engine": "ep-toy"}],
                                       "arrival_test": {"enabled": False}})
        assert type(e.candidates[0].settings).__name__ == "EpSettings"
        assert "toyeng" in registry.load_errors()["broken"]
        try:
            registry.get("broken")
        except ConfigError as err:
            print("ERR", err)
        """)
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ERR engine kind 'broken' did not load: entry point broken=toyeng_ep:NoSuchKind (toyeng)" in r.stdout
