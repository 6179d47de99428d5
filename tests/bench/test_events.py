"""The bench's typed contract: ``Bench.run()`` returns the :class:`Summary` it wrote, the observer gets
typed events, and its answer before a step (``Proceed`` / ``Skip``) decides whether the step runs — a
``Skip`` records that step and every later one as skipped with the reason, no exception involved. A
seeded workload sends its per-request seeds."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

from servelab.bench.events import BenchEvent, Proceed, Ready, Skip, StepDone, StepStarted, StepVerdict, Watcher
from servelab.bench.load.config import BenchConfig
from servelab.bench.load.runner import Bench
from servelab.bench.results import Summary
from servelab.bench.workloads.registry import make_workload


class Recorder(Watcher):
    """Keeps every event; skips every step from ``skip_from`` on."""

    def __init__(self, skip_from: str | None = None) -> None:
        self.events: list[BenchEvent] = []
        self.asked: list[str] = []
        self.skip_from = skip_from

    def on_event(self, event: BenchEvent) -> None:
        self.events.append(event)

    def before_step(self, workload: str, step: str) -> StepVerdict:
        self.asked.append(f"{workload}/{step}")
        return Skip("no time left", by="budget") if step == self.skip_from else Proceed()


def _bench(base_url: str, out: Path, observer: Recorder, factory=None, **cfg) -> tuple[Bench, Summary]:
    config = BenchConfig(
        base_url=base_url,
        workloads=cfg.pop("workloads", ["short-qa", "long-gen"]),
        concurrency=[1, 2, 4],
        requests=2,
        warmup=1,
        out=str(out),
        **cfg,
    )
    bench = Bench(config, [], factory or (lambda name, seed: make_workload(name, None, seed=seed)), observer=observer)
    return bench, asyncio.run(bench.run())


def test_a_skip_stops_the_sweep_and_records_the_rest(mock_engine, tmp_path: Path) -> None:
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "4")
    obs = Recorder(skip_from="c2")
    _, summary = _bench(m.base_url, tmp_path / "run", obs)
    assert isinstance(summary, Summary)
    assert [(s.workload, s.step, s.skipped) for s in summary.steps] == [
        ("short-qa", "c1", False),
        ("short-qa", "c2", True),
        ("short-qa", "c4", True),
        ("long-gen", "c1", True),
        ("long-gen", "c2", True),
        ("long-gen", "c4", True),
    ]
    assert {s.skipped_reason for s in summary.steps if s.skipped} == {"no time left"}
    assert summary.stopped_by == "budget" and not summary.complete
    assert obs.asked == ["short-qa/c1", "short-qa/c2"]  # asked once per step, never after a Skip
    assert Summary.model_validate_json((tmp_path / "run" / "summary.json").read_bytes()) == summary
    kinds = [type(e).__name__ for e in obs.events]
    assert kinds[0] == "Ready" and isinstance(obs.events[0], Ready)
    started = [e for e in obs.events if isinstance(e, StepStarted)]
    assert [(e.step, e.warmup) for e in started] == [("c1", True), ("c1", False)]
    done = [e.summary for e in obs.events if isinstance(e, StepDone)]
    assert done == summary.steps  # one StepDone per step, skipped ones included, typed as written
    assert kinds.count("RequestDone") == 3  # the warmup request and the two measured ones


def test_no_skip_runs_every_step(mock_engine, tmp_path: Path) -> None:
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "4")
    _, summary = _bench(m.base_url, tmp_path / "run", Recorder(), workloads=["short-qa"])
    assert [s.step for s in summary.steps if not s.skipped] == ["c1", "c2", "c4"]
    assert summary.complete and summary.stopped_by is None


def test_request_seeds_are_set_by_the_factory_and_sent(mock_engine, tmp_path: Path) -> None:
    wl = make_workload("structured", None, seed=3)
    seeded = wl.with_request_seeds(100)
    assert [s.extra["seed"] for s in seeded.requests(3)] == [100, 101, 102]
    assert seeded.request(2).extra["seed"] == 102 and "seed" not in wl.request(2).extra  # a new workload
    m = mock_engine("--ttft-ms", "1", "--itl-ms", "1", "--output-tokens", "4")
    config = BenchConfig(
        base_url=m.base_url, workloads=["structured"], concurrency=[1], requests=3, warmup=0, out=str(tmp_path / "run")
    )
    asyncio.run(Bench(config, [], lambda name, seed: make_workload(name, None, seed=seed).with_request_seeds(7)).run())
    with urllib.request.urlopen(m.root + "/mock/records", timeout=10) as r:
        records = json.loads(r.read())
    assert sorted(x["sampling"]["seed"] for x in records if x["endpoint"] == "chat") == [7, 8, 9]
