"""Every field documented in docs/experiment.md has an effect, and a case here that fails when the field
is ignored (issue 10).

The field list is read from the document itself (every table row under a known heading), so a newly
documented field without a case fails :func:`test_every_documented_field_has_a_case`. Each case runs the
smallest thing that shows the field's effect, with a non-default value whose behaviour differs from the
default's (so ignoring the field, i.e. behaving as the default, fails the case):

- short in-process trials on mock engines (seconds each), shared by many cases: :func:`rich` (closed
  loop, most fields), :func:`gates` (quality-gate and timeout effects), :func:`open_loop` (rates),
  :func:`external` (an ``engine: url`` candidate in front of a mock process), :func:`budget_trial`;
- a recording engine kind (registered here, launching the mock) that keeps what the flow handed it;
- for engine settings, the launcher a kind builds from its settings (``EngineKind.launcher``): its
  command line, environment, port and readiness timeout, without starting it.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from servelab.bench.results import StepSummary
from servelab.engines.mock.launch import MockLauncher, MockSettings
from servelab.engines.registry import EngineKind, register, unregister
from servelab.trial.flow import TrialRunner
from servelab.trial.results import TrialRecord
from servelab.trial.spec import Experiment

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "experiment.md"

#: heading of docs/experiment.md -> the path prefix of the fields its table documents
SECTIONS = {
    "Top level": "",
    "goal": "goal.",
    "goal.quality": "goal.quality.",
    "A sample (`goal.quality.samples[]`)": "goal.quality.samples[].",
    "goal.budget": "goal.budget.",
    "candidates": "candidates[].",
    "engine: llamacpp": "candidates[llamacpp].settings.",
    "engine: vllm": "candidates[vllm].settings.",
    "engine: url": "candidates[url].",
    "engine: mock": "candidates[mock].settings.",
    "engine: command": "candidates[command].settings.",
    "workloads": "workloads[].",
    "steps": "steps.",
    "arrival_test": "arrival_test.",
    "capacity": "capacity.",
    "lifecycle": "lifecycle.",
    "load_generator": "load_generator.",
    "embeddings": "embeddings.",
}


def documented_fields() -> list[str]:
    """Every field of a table in docs/experiment.md, as ``PREFIX + name`` (tables whose first header
    cell is ``field`` or ``settings field``). Raises AssertionError for a table under a heading that
    :data:`SECTIONS` does not know (add the heading there, and cases for its fields)."""
    out: list[str] = []
    heading, in_table = "", False
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading, in_table = line.lstrip("#").strip(), False
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] in ("field", "settings field"):
            assert heading in SECTIONS, f"docs/experiment.md: a field table under {heading!r}; add it to SECTIONS"
            in_table = True
        elif in_table and not set(cells[0]) <= {"-", ":"}:
            m = re.fullmatch(r"`([a-z_]+)`", cells[0])
            assert m, f"docs/experiment.md {heading!r}: first cell {cells[0]!r} is not a `field`"
            out.append(SECTIONS[heading] + m.group(1))
    return out


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


def _steps(rec: TrialRecord, cand: str, workload: str | None = None) -> list[StepSummary]:
    return [s for s in rec.result(cand).steps if workload is None or s.workload == workload]


# ---------------------------------------------------------------------------------------------------
# a recording engine kind: the flow's hand-over to a kind (model, settings, log folder)


class RecorderKind(EngineKind):
    """``engine: recorder``: the mock engine, keeping the arguments of every launch (in ``calls``)."""

    kind = "recorder"
    title = "recorder"
    summary = "test kind: the mock engine, recording what the trial passed to launch()"
    Settings = MockSettings
    calls: list[dict[str, Any]] = []

    def launcher(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> MockLauncher:
        self.calls.append({"settings": settings, "model": model, "log_dir": log_dir})
        return MockLauncher(self.parse(settings), log_dir=log_dir, **kwargs)


@pytest.fixture(scope="module")
def recorder() -> Iterator[RecorderKind]:
    kind = register(RecorderKind(), replace=True)
    assert isinstance(kind, RecorderKind)
    try:
        yield kind
    finally:
        unregister("recorder")


# ---------------------------------------------------------------------------------------------------
# trials (each a few seconds on mock engines)


def _run(exp: dict[str, Any], out: Path) -> TrialRecord:
    return TrialRunner(Experiment.model_validate(exp), out, progress=lambda s: None).run()


@pytest.fixture(scope="module")
def rich(tmp_path_factory: pytest.TempPathFactory, recorder: RecorderKind) -> tuple[TrialRecord, Path]:
    """Closed loop, non-default values for most fields."""
    tmp = tmp_path_factory.mktemp("rich")
    data = tmp / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"question number {i}?"}) + "\n" for i in range(3)))
    weights = tmp / "weights.bin"
    weights.write_bytes(b"not really weights")
    exp = {
        "name": "every-field",
        "goal": {
            "task": "t-every-field",
            "slo": "ttft_p95<=5s",
            "error_budget": 0.5,
            "quality": {
                "structured_valid_min": 0.25,
                "structured_requests": 3,
                "samples_pass_min": 0.5,
                "smoke": ["streaming", "usage"],
                "samples": [
                    {"name": "named-one", "prompt": "one two three", "expect_regex": "tok\\d", "max_tokens": 3},
                    {
                        "messages": [{"role": "system", "content": "a b"}, {"role": "user", "content": "c d e f"}],
                        "expect_regex": "no such answer",
                    },
                    {
                        "name": "json",
                        "prompt": "city please",
                        "expect_json_schema": {
                            "type": "object",
                            "properties": {"city": {"type": "string"}},
                            "required": ["city"],
                        },
                    },
                    {
                        "name": "json-re",
                        "prompt": "x",
                        "expect_regex": "tok0",
                        "expect_json_schema": {"type": "object"},
                    },
                ],
            },
            "expected_rate_rps": 50,
            "burstiness": 2.0,
            "mix": "structured:1",
            "budget": {"price_per_hour": 3.6, "currency": "EUR"},
        },
        "candidates": [
            {"name": "cand-a", "engine": "mock", "settings": {"ttft_ms": 2, "output_tokens": 20, "model": "served-x"}},
            {"name": "rec", "engine": "recorder", "model": str(weights), "settings": {"output_tokens": 9}},
        ],
        "workloads": [
            {"name": "short-qa", "set": {"output_tokens": 7}},
            "structured",
            {"dataset": str(data), "max_tokens_default": 5},
        ],
        "steps": {"concurrency": [1, 3]},
        "requests_per_step": 3,
        "warmup": 1,
        "seed": 5,
        "timeout_s": 20,
        "ignore_eos": False,
        "arrival_test": {"enabled": True, "requests": 5, "max_concurrency": 2, "set": {"input_tokens": 33}},
    }
    out = tmp / "run"
    return _run(exp, out), out


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    """Quality gates at 0 (informational), a short timeout, no arrival test."""
    out = tmp_path_factory.mktemp("gates") / "run"
    exp = {
        "name": "gates",
        "goal": {
            "quality": {
                "structured_valid_min": 0.0,
                "structured_requests": 2,
                "smoke": ["streaming", "usage"],
                "samples": [{"prompt": "hi", "expect_regex": "never"}],
            }
        },
        "candidates": [
            {"name": "badjson", "engine": "mock", "settings": {"invalid_json": True, "output_tokens": 4}},
            {"name": "slow", "engine": "mock", "settings": {"ttft_ms": 1500, "output_tokens": 2}},
        ],
        "workloads": ["structured"],
        "steps": {"concurrency": [1]},
        "requests_per_step": 1,
        "warmup": 0,
        "timeout_s": 0.5,
        "arrival_test": {"enabled": False},
    }
    return _run(exp, out), out


@pytest.fixture(scope="module")
def scoped(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    """A per-workload SLO no structured request can meet (E2E P95 <= 1 ms) beside a global one all meet."""
    out = tmp_path_factory.mktemp("scoped") / "run"
    exp = {
        "name": "scoped",
        "goal": {
            "slo": "ttft_p95<=5s",
            "workload_slo": {"structured": "e2e_p95<=1ms"},
            "quality": {"smoke": ["streaming", "usage"], "structured_requests": 2},
            "mix": "short-qa:1,structured:1",
        },
        "candidates": [{"name": "s", "engine": "mock", "settings": {"ttft_ms": 3, "itl_ms": 2, "output_tokens": 12}}],
        "workloads": [{"name": "short-qa", "set": {"output_tokens": 6}}, "structured"],
        "steps": {"concurrency": [1]},
        "requests_per_step": 4,
        "warmup": 0,
        "repeats": 1,
        "arrival_test": {"enabled": False},
        "capacity": {"enabled": False},
    }
    return _run(exp, out), out


@pytest.fixture(scope="module")
def open_loop(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    """Open-loop steps (gamma arrivals, capped), every step run although the SLO breaks; default seed."""
    out = tmp_path_factory.mktemp("open") / "run"
    exp = {
        "name": "open",
        "goal": {"slo": "ttft_p95<=0.1ms", "burstiness": 3.0, "error_budget": 1.0, "quality": {"smoke": ["streaming"]}},
        "candidates": [{"name": "o", "engine": "mock", "settings": {"ttft_ms": 5, "itl_ms": 5, "output_tokens": 6}}],
        "workloads": [{"name": "short-qa", "set": {"output_tokens": 7}}],
        "steps": {"rates": [20, 40], "arrival": "gamma", "max_concurrency": 1},
        "requests_per_step": 3,
        "warmup": 0,
        "stop_on_slo": False,
        "arrival_test": {"enabled": False},
    }
    return _run(exp, out), out


class BenchSpy:
    """Wraps :class:`servelab.bench.load.runner.Bench`, keeping every bench the chat flow builds."""

    def __init__(self) -> None:
        self.benches: list[Any] = []

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from servelab.bench.load.runner import Bench

        b = Bench(*args, **kwargs)
        self.benches.append(b)
        return b


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """An ``engine: url`` candidate in front of a mock process (still running afterwards, so its
    ``/mock/records`` show what arrived), an API key from the environment, spies on the bench and on
    the gate requests' headers."""
    import urllib.request

    from conftest import start_mock_process, stop_mock_process

    import servelab.trial.flows.chat.benching as benching
    import servelab.trial.flows.chat.smoke as smoke

    gguf = _default_gguf()
    mp = start_mock_process("--model", "served-x", "--output-tokens", "6")
    spy, headers = BenchSpy(), []
    real_send = smoke.send

    async def send(*a: Any, **kw: Any) -> Any:
        headers.append(kw.get("headers"))
        return await real_send(*a, **kw)

    mpatch = pytest.MonkeyPatch()
    mpatch.setattr(benching, "Bench", spy)
    mpatch.setattr(smoke, "send", send)
    mpatch.setenv("EVERY_FIELD_KEY", "sk-every-field")
    try:
        out = tmp_path_factory.mktemp("url") / "run"
        exp = {
            "name": "external",
            "goal": {"quality": {"smoke": ["streaming", "usage"]}},
            "candidates": [
                {
                    "name": "ext",
                    "engine": "url",
                    "url": mp.base_url + "/",
                    "model_name": "asked-name",
                    "api_key_env": "EVERY_FIELD_KEY",
                    "model": str(gguf),
                }
            ],
            "workloads": ["short-qa"],
            "steps": {"concurrency": [1]},
            "requests_per_step": 2,
            "warmup": 0,
            "ignore_eos": False,
            "arrival_test": {"enabled": False},
        }
        try:
            rec = _run(exp, out)
        finally:
            mpatch.undo()  # the other trials of this module run unpatched
        with urllib.request.urlopen(mp.root + "/mock/records", timeout=10) as r:
            records = json.loads(r.read())
        records = records.get("records", records) if isinstance(records, dict) else records
        yield {
            "record": rec,
            "out": out,
            "mock": mp,
            "benches": spy.benches,
            "headers": headers,
            "mock_records": records,
            "gguf": gguf,
        }
    finally:
        mpatch.undo()
        stop_mock_process(mp.proc)


def _default_gguf() -> Path:
    from servelab.engines.llamacpp import default_model_path

    return default_model_path()


@pytest.fixture(scope="module")
def budget_trial(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    """A 7.2-second budget: the first candidate's slow steps (c1 ~3 s) spend it, the second does not start."""
    out = tmp_path_factory.mktemp("budget") / "run"
    exp = {
        "name": "budget",
        "goal": {"expected_rate_rps": 5, "budget": {"max_minutes": 0.12}, "quality": {"smoke": ["streaming", "usage"]}},
        "candidates": [
            {"name": "first", "engine": "mock", "settings": {"itl_ms": 20, "output_tokens": 50}},
            {"name": "second", "engine": "mock", "settings": {"itl_ms": 1, "output_tokens": 8}},
        ],
        "workloads": [{"name": "short-qa", "set": {"output_tokens": 50}}],
        "steps": {"concurrency": [1, 2, 4, 8]},
        "requests_per_step": 3,
        "warmup": 0,
        "arrival_test": {"enabled": True, "requests": 5},
    }
    return _run(exp, out), out


# ---------------------------------------------------------------------------------------------------
# the cases


Case = Callable[[pytest.FixtureRequest], None]
CASES: dict[str, Case] = {}


def case(*fields: str) -> Callable[[Case], Case]:
    def deco(fn: Case) -> Case:
        for f in fields:
            assert f not in CASES, f
            CASES[f] = fn
        return fn

    return deco


def _fx(request: pytest.FixtureRequest, name: str) -> Any:
    return request.getfixturevalue(name)


# --- top level


@case("name")
def _name(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    assert rec.name == "every-field"


@case("goal", "goal.task")
def _task(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    assert rec.goal.task == "t-every-field"


@case("candidates", "candidates[].name")
def _candidate_names(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "rich")
    assert set(rec.results.candidates) == {"cand-a", "rec"}
    assert (out / "candidates" / "cand-a" / "steps" / "requests.jsonl").is_file()
    assert rec.evidence.files["cand-a"]["steps"] == "candidates/cand-a/steps/requests.jsonl"


@case("workloads", "workloads[].name")
def _workload_names(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    # each listed workload runs its own sweep, in order (the flow may add its own runs after them)
    assert list(dict.fromkeys(s.workload for s in _steps(rec, "cand-a")))[:3] == [
        "short-qa",
        "structured",
        "dataset:prompts.jsonl",
    ]


@case("steps", "steps.concurrency")
def _concurrency(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    steps = _steps(rec, "cand-a", "short-qa")
    assert list(dict.fromkeys(s.step for s in steps)) == ["c1", "c3"]
    assert {s.load.concurrency for s in steps} == {1, 3}


@case("requests_per_step")
def _requests_per_step(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    assert {s.counts.submitted for s in _steps(rec, "cand-a")} == {3}


@case("warmup")
def _warmup(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    rows = _lines(out / "candidates/cand-a/steps/requests.jsonl")
    per_step: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["warmup"]:
            per_step[(r["workload"], r["step"])] = per_step.get((r["workload"], r["step"]), 0) + 1
    assert set(per_step.values()) == {1} and len(per_step) == 6


@case("seed")
def _seed(request: pytest.FixtureRequest) -> None:
    # the same workload and first step in two trials, seeds 5 and 0 (default): other prompts
    _, out_a = _fx(request, "rich")
    _, out_o = _fx(request, "open_loop")

    def targets(path: Path) -> list[int]:  # the mock counts prompt words
        return [
            r["prompt_tokens"]
            for r in _lines(path)
            if r["workload"] == "short-qa" and r["step"] in ("c1", "r20") and not r["warmup"]
        ]

    a = targets(out_a / "candidates/cand-a/steps/requests.jsonl")
    o = targets(out_o / "candidates/o/steps/requests.jsonl")
    assert len(a) == len(o) == 3 and a != o


@case("timeout_s")
def _timeout(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "gates")
    slow = rec.result("slow")
    assert slow.status == "excluded" and "streaming" in (slow.reason or ""), slow.reason
    rows = _lines(out / "candidates/slow/smoke.jsonl")
    assert rows and rows[0]["failure"] == "timeout", rows[0]


@case("ignore_eos")
def _ignore_eos(request: pytest.FixtureRequest) -> None:
    ext = _fx(request, "external")
    steps_bench = next(b for b in ext["benches"] if b.cfg.workloads == ["short-qa"])
    assert steps_bench.cfg.ignore_eos is False
    spec = steps_bench.workload_factory("short-qa", seed=0).requests(1)[0]
    assert "ignore_eos" not in spec.extra  # the default (true) sends ignore_eos: true
    rec, _ = _fx(request, "rich")
    assert rec.method.ignore_eos is False


@case("stop_on_slo")
def _stop_on_slo(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "open_loop")
    steps = _steps(rec, "o", "short-qa")
    assert list(dict.fromkeys(s.step for s in steps)) == ["r20", "r40"]
    assert all(s.slo_met is False for s in steps if s.step == "r20")
    assert not any(s.skipped for s in steps)  # stop_on_slo: true would skip r40


@case("arrival_test", "arrival_test.enabled")
def _arrival_enabled(request: pytest.FixtureRequest) -> None:
    rich, _ = _fx(request, "rich")
    gates, out = _fx(request, "gates")
    assert rich.result("cand-a").arrival_run is not None
    assert gates.result("badjson").arrival_run is None and not (out / "candidates/badjson/arrival").exists()


# --- goal


@case("goal.slo")
def _slo(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    st = _steps(rec, "cand-a", "short-qa")[0]
    assert [c.objective for c in st.slo][0] == "ttft_p95<=5s" and st.slo_met is True
    rec_o, _ = _fx(request, "open_loop")
    assert _steps(rec_o, "o")[0].slo_met is False  # ttft_p95<=0.1ms cannot be met


@case("goal.workload_slo")
def _workload_slo(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "scoped")
    assert rec.goal.workload_slo == {"structured": "e2e_p95<=1ms"} and "structured:e2e_p95<=0.001s" in rec.goal.slo
    res = rec.result("s")
    assert res.per_workload["short-qa"].max_step_meeting_slo == "c1"  # not judged on other workloads' requests
    assert res.per_workload["structured"].broken_at == "c1"
    assert res.max_step_meeting_slo is None and res.broken_at == "c1"  # the mix broke by its structured class
    assert [(b.objective, b.workload) for b in res.broken_by] == [("structured:e2e_p95<=0.001s", "structured")]
    v = rec.decision.verdicts["s"]
    assert v.verdict == "exclude" and "structured:e2e_p95" in v.reasons[0], v.reasons


@case("goal.error_budget")
def _error_budget(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    assert "error_rate<=50%" in rec.goal.slo
    st = _steps(rec, "cand-a", "short-qa")[0]
    assert any(c.objective == "error_rate<=50%" for c in st.slo)


@case("goal.quality", "goal.quality.structured_requests")
def _structured_requests(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    assert len(_lines(out / "candidates/cand-a/quality/requests.jsonl")) == 3


def _check(rec: TrialRecord, cand: str, name: str) -> Any:
    q = rec.result(cand).quality
    assert q is not None, rec.result(cand)
    return next(c for c in q.checks if c.name == name)


@case("goal.quality.structured_valid_min")
def _structured_valid_min(request: pytest.FixtureRequest) -> None:
    rich, _ = _fx(request, "rich")
    c = _check(rich, "cand-a", "structured_valid_fraction")
    assert (c.limit, c.informational, c.ok) == (0.25, False, True)
    gates, _ = _fx(request, "gates")  # minimum 0: invalid JSON is reported, the candidate stays in
    c = _check(gates, "badjson", "structured_valid_fraction")
    assert c.value == 0.0 and c.informational and gates.result("badjson").status == "ranked"


@case("goal.quality.samples")
def _samples(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    assert len(_lines(out / "candidates/cand-a/quality.jsonl")) == 4


@case("goal.quality.samples_pass_min")
def _samples_pass_min(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    c = _check(rec, "cand-a", "samples_pass_fraction")
    assert (c.value, c.limit, c.informational, c.ok) == (0.5, 0.5, False, True)
    gates, _ = _fx(request, "gates")
    c = _check(gates, "badjson", "samples_pass_fraction")
    assert c.value == 0.0 and c.informational and c.ok


@case("goal.quality.smoke")
def _smoke(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "rich")
    assert set(rec.result("cand-a").smoke) == {"streaming", "usage"}
    assert len(_lines(out / "candidates/cand-a/smoke.jsonl")) == 1  # no json_schema / stop requests


def _sample_rows(request: pytest.FixtureRequest) -> dict[str, dict[str, Any]]:
    _, out = _fx(request, "rich")
    return {r["workload"]: r for r in _lines(out / "candidates/cand-a/quality.jsonl")}


@case("goal.quality.samples[].name")
def _sample_name(request: pytest.FixtureRequest) -> None:
    assert set(_sample_rows(request)) == {"sample:named-one", "sample:s1", "sample:json", "sample:json-re"}


@case("goal.quality.samples[].prompt", "goal.quality.samples[].messages")
def _sample_prompt(request: pytest.FixtureRequest) -> None:
    rows = _sample_rows(request)  # the mock counts prompt words as prompt tokens
    assert rows["sample:named-one"]["prompt_tokens"] == 3 and rows["sample:s1"]["prompt_tokens"] == 6


@case("goal.quality.samples[].expect_regex")
def _sample_regex(request: pytest.FixtureRequest) -> None:
    rows = _sample_rows(request)
    assert rows["sample:named-one"]["sample_passed"] is True and rows["sample:s1"]["sample_passed"] is False
    assert rows["sample:json-re"]["sample_passed"] is False  # JSON answer: no tok0 in it


@case("goal.quality.samples[].expect_json_schema")
def _sample_schema(request: pytest.FixtureRequest) -> None:
    row = _sample_rows(request)["sample:json"]
    assert row["sample_passed"] is True and "city" in json.loads(row["text"])  # asked with response_format


@case("goal.quality.samples[].max_tokens")
def _sample_max_tokens(request: pytest.FixtureRequest) -> None:
    rows = _sample_rows(request)
    assert rows["sample:named-one"]["max_tokens"] == 3 and rows["sample:named-one"]["output_tokens"] == 3
    assert rows["sample:s1"]["max_tokens"] == 64  # the default


@case("goal.expected_rate_rps")
def _rate(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    arr = rec.result("cand-a").arrival_run
    assert arr is not None and arr.load.kind == "open" and arr.load.rate_rps == 50


@case("goal.burstiness")
def _burstiness(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    arr = rec.result("cand-a").arrival_run
    assert arr is not None and (arr.load.arrival, arr.load.gamma_shape) == ("gamma", 2.0)
    rec_o, _ = _fx(request, "open_loop")  # steps.arrival: gamma uses it too
    assert {s.load.gamma_shape for s in _steps(rec_o, "o")} == {3.0}


@case("goal.mix")
def _mix(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    rows = _lines(out / "candidates/cand-a/arrival/requests.jsonl")
    # structured:1 only; the default (the experiment's short-qa and structured) would send short-qa too
    assert rows and {r["workload"] for r in rows} == {"structured"} and {r["step"] for r in rows} == {"r50"}


@case("goal.budget", "goal.budget.price_per_hour")
def _price(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    res = rec.result("cand-a")
    assert res.cost is not None and res.cost.price_per_hour == 3.6
    assert res.cost.per_1m_output_tokens is not None and res.cost.per_1m_output_tokens > 0  # null without a price


@case("goal.budget.currency")
def _currency(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    assert rec.goal.budget.currency == "EUR"


@case("goal.budget.max_minutes")
def _max_minutes(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "budget_trial")
    use = rec.method.budget
    assert use is not None and use.limit_s == pytest.approx(7.2) and use.exhausted, use
    assert "second" in use.skipped  # not started: the first candidate spent the budget
    second = rec.result("second")
    assert second.status == "failed" and (second.reason or "").startswith("not run: the trial budget")
    for what in use.skipped:  # every skipped piece is recorded where it would have been
        parts = what.split("/")
        if len(parts) == 3:
            st = next(s for s in rec.result(parts[0]).steps if (s.workload, s.step) == (parts[1], parts[2]))
            assert st.skipped and "budget" in (st.skipped_reason or "")
        elif len(parts) == 2 and parts[1] == "arrival":
            assert rec.result(parts[0]).arrival_run is None
    first = rec.result("first")
    if first.status == "ranked":  # a step ran: the rest of the sweep, or the arrival test, did not
        assert any(w.startswith("first/") for w in use.skipped)
        summary = json.loads((out / "candidates/first/steps/summary.json").read_text())
        assert summary.get("stopped_by") == "budget" or "first/arrival" in use.skipped
    # no silent skipping: the decision says it
    assert "budget" in (rec.decision.scope or "")
    assert any("budget" in r for r in rec.decision.verdicts["second"].reasons)
    # work is not started past the budget: one step (~3 s here) at most beyond it
    assert use.spent_s is not None and use.spent_s < 7.2 + 8.0, use.spent_s


# --- candidates


@case("candidates[].engine")
def _engine(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    ident = rec.ident("rec")
    assert ident.engine_kind == "recorder" and rec.ident("cand-a").engine_kind == "mock"


@case("candidates[].model")
def _model(request: pytest.FixtureRequest) -> None:
    recorder = _fx(request, "recorder")
    rec, out = _fx(request, "rich")
    (call,) = [c for c in recorder.calls if c["log_dir"] == str(out / "candidates/rec/engine")]
    assert call["model"] == str(out.parent / "weights.bin")


@case("candidates[].settings")
def _settings(request: pytest.FixtureRequest) -> None:
    recorder = _fx(request, "recorder")
    rec, out = _fx(request, "rich")
    (call,) = [c for c in recorder.calls if c["log_dir"] == str(out / "candidates/rec/engine")]
    assert call["settings"].output_tokens == 9
    rows = _lines(out / "candidates/rec/quality.jsonl")
    assert rows[0]["output_tokens"] == 3  # max_tokens 3 < 9: the settings reached the engine
    big = [r for r in _lines(out / "candidates/rec/steps/requests.jsonl") if r["workload"] == "dataset:prompts.jsonl"]
    assert {r["output_tokens"] for r in big} == {5}


@case("candidates[url].url", "candidates[url].model_name")
def _url(request: pytest.FixtureRequest) -> None:
    ext = _fx(request, "external")
    rec: TrialRecord = ext["record"]
    assert rec.result("ext").status == "ranked", rec.result("ext")
    assert rec.ident("ext").url == ext["mock"].base_url  # trailing / dropped
    models = {r["model"] for r in ext["mock_records"]}
    assert models == {"asked-name"}  # every request asked for model_name (null = GET /v1/models: served-x)


@case("candidates[url].api_key_env")
def _api_key_env(request: pytest.FixtureRequest) -> None:
    ext = _fx(request, "external")
    assert ext["headers"] and all(h == {"Authorization": "Bearer sk-every-field"} for h in ext["headers"])
    assert {b.cfg.api_key for b in ext["benches"]} == {"sk-every-field"}


def test_url_candidate_model_is_its_weights_identity(request: pytest.FixtureRequest) -> None:
    """`model` of a url candidate (documented in its section's text): a local copy of the served
    weights, for identity hashes and exact-length prompts."""
    ext = _fx(request, "external")
    rec: TrialRecord = ext["record"]
    model = rec.ident("ext").model or {}
    assert model.get("path") == str(ext["gguf"]) and isinstance(model.get("sha256"), str)
    assert "none" not in (rec.method.token_definition or "none")  # the GGUF's tokenizer made the prompts


# --- workloads


@case("workloads[].set")
def _workload_set(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    rows = [r for r in _lines(out / "candidates/cand-a/steps/requests.jsonl") if r["workload"] == "short-qa"]
    assert rows and {r["max_tokens"] for r in rows} == {7}


@case("workloads[].dataset", "workloads[].max_tokens_default")
def _dataset(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    rows = [
        r
        for r in _lines(out / "candidates/cand-a/steps/requests.jsonl")
        if r["workload"] == "dataset:prompts.jsonl" and not r["warmup"]
    ]
    assert len(rows) == 6 and {r["max_tokens"] for r in rows} == {5}


# --- steps (open loop)


@case("steps.rates")
def _rates(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "open_loop")
    steps = _steps(rec, "o", "short-qa")
    assert list(dict.fromkeys((s.load.kind, s.load.rate_rps) for s in steps)) == [("open", 20), ("open", 40)]


@case("steps.arrival")
def _arrival(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "open_loop")
    assert {s.load.arrival for s in _steps(rec, "o")} == {"gamma"}


@case("steps.max_concurrency")
def _steps_max_concurrency(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "open_loop")
    assert {s.load.max_concurrency for s in _steps(rec, "o")} == {1}
    rows = sorted((r["t_ns"]["sent"], r["t_ns"]["end"]) for r in _lines(out / "candidates/o/steps/requests.jsonl"))
    assert all(b[0] >= a[1] for a, b in zip(rows, rows[1:], strict=False))  # never two in flight


# --- arrival test


@case("arrival_test.requests")
def _arrival_requests(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    arr = rec.result("cand-a").arrival_run
    assert arr is not None and arr.counts.submitted == 5


@case("arrival_test.max_concurrency")
def _arrival_max_concurrency(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "rich")
    arr = rec.result("cand-a").arrival_run
    assert arr is not None and arr.load.max_concurrency == 2


@case("arrival_test.set")
def _arrival_set(request: pytest.FixtureRequest) -> None:
    _, out = _fx(request, "rich")
    rows = _lines(out / "candidates/cand-a/arrival/requests.jsonl")
    # the mock counts prompt words: one fixed length, below the structured set's default 64-128 tokens
    lengths = {r["prompt_tokens"] for r in rows}
    assert rows and len(lengths) == 1 and lengths.pop() < 60, [r["prompt_tokens"] for r in rows]


# --- engine settings: the launcher each kind builds from them (not started)


def _launch_plan(kind: str, settings: dict[str, Any]) -> dict[str, Any]:
    """What the kind's launcher would run for ``settings``: argv (with fixed paths and port), env,
    port, readiness timeout."""
    from servelab.engines import registry

    k = registry.get(kind)
    if kind == "command":  # argv is required: a base command line the values below change
        settings = {"argv": ["/bin/srv", "--host", "{host}", "--port", "{port}"], **settings}
    lr = k.launcher(k.parse(settings))
    plan: dict[str, Any] = {"port": lr.port, "ready_timeout_s": lr.ready_timeout_s}
    if kind == "command":
        plan.update(lr.plan(8000), full_env_keys=sorted(lr.env()[1]))
    if kind == "llamacpp":
        plan["argv"] = lr.argv(Path("/bin/llama-server"), Path("/m.gguf"), 8000)
    elif kind == "vllm":
        plan["argv"], plan["env"] = lr.argv("/py", "/model", None, 8000), lr.env()
    elif kind == "mock":
        plan["config"] = _mock_config(lr.settings, lr.host)
    return plan


def _mock_config(settings: dict[str, Any], host: str) -> BaseModel | Any:
    """The :class:`MockConfig` the mock process would run with: its command line (``mock_argv``)
    parsed by the mock engine's own CLI (``serve`` replaced, nothing starts)."""
    import typer
    from typer.testing import CliRunner

    import servelab.engines.mock.cli as mock_cli
    from servelab.engines.mock.launch import mock_argv

    argv = mock_argv(settings, host, 8000)
    assert argv[1:3] == ["-m", "servelab.engines.mock"]
    got: list[Any] = []
    app = typer.Typer()
    app.command()(mock_cli.mock_engine_command)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mock_cli, "serve", lambda cfg, announce=True: got.append(cfg))
        res = CliRunner().invoke(app, argv[3:])
    assert res.exit_code == 0, res.output
    return got[0]


#: a non-default value per setting (the default's launch must differ from it)
SETTINGS_VALUES: dict[str, dict[str, Any]] = {
    "llamacpp": {
        "parallel": 3,
        "ctx_size": 1024,
        "threads": 2,
        "extra_args": ["--seed", "7"],
        "port": 18123,
        "ready_timeout_s": 12.5,
    },
    "vllm": {
        "max_num_seqs": 3,
        "max_model_len": 512,
        "dtype": "float32",
        "enforce_eager": False,
        "served_model_name": "named",
        "extra_args": ["--seed", "7"],
        "env": {"VLLM_CPU_KVCACHE_SPACE": 3},
        "port": 18123,
        "ready_timeout_s": 12.5,
    },
    "mock": {
        "ttft_ms": 3.0,
        "itl_ms": 4.0,
        "output_tokens": 9,
        "tokens_per_chunk": 2,
        "reasoning_tokens": 1,
        "dialect": "sglang",
        "seed": 4,
        "fail_http_rate": 0.1,
        "fail_http_status": 503,
        "stream_error_rate": 0.1,
        "cut_rate": 0.1,
        "hang_rate": 0.1,
        "hang_s": 2.0,
        "max_inflight": 3,
        "overload_status": 429,
        "invalid_json": True,
        "bad_tool_call": "schema",
        "crash_after_requests": 5,
        "model": "m2",
        "error_message": "boom",
        "context_tokens": 100,
        "port": 18123,
        "ready_timeout_s": 12.5,
        "prefill_tokens_per_s": 5000.0,
        "itl_ms_per_running": 2.0,
        "prefix_cache_blocks": 64,
    },
    "command": {
        "argv": ["/bin/other", "--port", "{port}"],
        "env": {"A": "1"},
        "inherit_env": False,
        "cwd": "/tmp",
        "host": "127.0.0.2",
        "port": 18123,
        "api_root": "/api/v1",
        "ready": "first_token",
        "ready_timeout_s": 12.5,
        "stop_signal": "SIGINT",
        "stop_grace_s": 2.0,
        "after_ready": [["ollama", "pull", "m"]],
        "after_ready_timeout_s": 60.0,
        "model_name": "m",
        "guard": True,
    },
}


def _settings_case(kind: str, field: str) -> Case:
    def run(request: pytest.FixtureRequest) -> None:
        base = _launch_plan(kind, {})
        changed = _launch_plan(kind, {field: SETTINGS_VALUES[kind][field]})
        assert changed != base, f"{kind} setting {field!r} does not change what its launcher runs"

    return run


for _kind, _values in SETTINGS_VALUES.items():
    for _field in _values:
        case(f"candidates[{_kind}].settings.{_field}")(_settings_case(_kind, _field))


#: settings with a case of their own below (what they change is the record, not the launch)
OWN_CASES = {"command": {"secret_env"}, "vllm": {"secret_env"}}


def _secret_env_case(kind: str) -> Case:
    def run(request: pytest.FixtureRequest) -> None:
        env = {"DB_URL": "postgresql://u:pw@h/db"}  # a name that does not look secret: only the list marks it
        if kind == "command":  # its launch plan is what the record shows
            extra = {"argv": ["/bin/engine", "--port", "{port}"]}
            plain = _launch_plan(kind, {**extra, "env": env})["env"]
            marked = _launch_plan(kind, {**extra, "env": env, "secret_env": ["DB_URL"]})["env"]
        else:  # vllm: the process gets the value; the settings as recorded hold the fingerprint
            from servelab.engines import registry

            k = registry.get(kind)
            assert _launch_plan(kind, {"env": env, "secret_env": ["DB_URL"]})["env"]["DB_URL"] == env["DB_URL"]
            plain = k.parse({"env": env}).model_dump(mode="json")["env"]
            marked = k.parse({"env": env, "secret_env": ["DB_URL"]}).model_dump(mode="json")["env"]
        assert plain["DB_URL"] == env["DB_URL"] and marked["DB_URL"].startswith("<secret sha256:")

    return run


for _kind in OWN_CASES:
    case(f"candidates[{_kind}].settings.secret_env")(_secret_env_case(_kind))


# ---------------------------------------------------------------------------------------------------
# the tests


# --- an embeddings trial (goal.task_kind: embeddings; servelab.trial.flows.embeddings) on the real all-MiniLM-L6-v2
# llama-server embedder, started by an engine: command candidate


def _embed_exp(tmp: Path, **embeddings: Any) -> dict[str, Any]:
    import sys

    from servelab.engines.llamacpp import find_llama_server

    if find_llama_server() is None and not os.environ.get("SERVELAB_REQUIRE_ENGINE"):
        pytest.skip("no cached llama-server for the embedder")
    return {
        "name": "embed-fields",
        "goal": {"task_kind": "embeddings", "slo": "e2e_p95<=30s"},
        "candidates": [
            {
                "name": "minilm",
                "engine": "command",
                "settings": {
                    "argv": [sys.executable, "-m", "servelab.engines.embedder", "--port", "{port}", "--parallel", "1"]
                },
            }
        ],
        "steps": {"concurrency": [1]},
        "requests_per_step": 3,
        "repeats": 1,
        "embeddings": embeddings,
    }


@pytest.fixture(scope="module")
def embed_trial(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    out = tmp_path_factory.mktemp("embed") / "run"
    ref = ROOT / "tests" / "gateway" / "data" / "embedding_reference.json"
    return _run(
        _embed_exp(out.parent, batch_size=3, input_tokens="40-50", reference=str(ref), similarity_min=0.99), out
    ), out


@case("goal.task_kind", "embeddings")
def _task_kind(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "embed_trial")
    r = rec.result("minilm")
    assert rec.goal.task_kind == "embeddings" and r.status == "ranked", r.reason
    assert r.embeddings is not None and r.embeddings.inputs_per_s and "inputs/s" in r.embeddings.unit
    assert [s.workload for s in r.steps] == ["embeddings"] and not r.smoke  # no chat smoke tests


@case("embeddings.batch_size")
def _embed_batch(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "embed_trial")
    r = rec.result("minilm")
    assert r.embeddings is not None and r.embeddings.batch_size == 3
    assert r.steps[0].embeddings is not None and r.steps[0].embeddings.inputs == 3 * 3  # 3 requests x 3 inputs


@case("embeddings.input_tokens")
def _embed_lengths(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "embed_trial")
    it = rec.result("minilm").steps[0].embeddings.input_tokens  # type: ignore[union-attr]
    assert 40 <= it["min"] <= it["max"] <= 50  # exact in MiniLM's tokenizer; the default is 16-256


@case("embeddings.reference")
def _embed_reference(request: pytest.FixtureRequest) -> None:
    rec, out = _fx(request, "embed_trial")
    ref = json.loads((ROOT / "tests" / "gateway" / "data" / "embedding_reference.json").read_text())
    sent = [d["text"] for d in _lines(out / "candidates" / "minilm" / "embeddings_gate.jsonl")]
    assert sent == [it["text"] for it in ref["items"]]
    checks = {c.name: c for c in rec.result("minilm").quality.checks}  # type: ignore[union-attr]
    assert (checks["reference_cosine_min"].value or 0) > 0.99


@case("embeddings.similarity_min")
def _embed_similarity(request: pytest.FixtureRequest) -> None:
    rec, _ = _fx(request, "embed_trial")
    c = {c.name: c for c in rec.result("minilm").quality.checks}["reference_cosine_min"]  # type: ignore[union-attr]
    assert c.limit == 0.99 and not c.informational  # the default 0 is informational


@case("embeddings.dimensions")
def _embed_dimensions(request: pytest.FixtureRequest) -> None:
    tmp = request.getfixturevalue("tmp_path")
    rec = _run(_embed_exp(tmp, dimensions=512), tmp / "run")  # MiniLM states 384: the gate must fail
    r = rec.result("minilm")
    assert r.status == "excluded" and "dimension_match_fraction" in (r.reason or "")
    assert "512 dimensions stated by the experiment" in (r.reason or "") and not r.steps


def test_every_documented_field_has_a_case() -> None:
    documented = documented_fields()
    assert len(documented) > 60, documented  # the parser found the tables
    missing = [f for f in documented if f not in CASES]
    assert not missing, f"documented in docs/experiment.md without a case here: {missing}"


# --- decisions (issue 12): the mix run together, repeats, capacity search, cost and replicas


@pytest.fixture(scope="module")
def decisions(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TrialRecord, Path, list[dict[str, Any]]]]:
    """Two mock candidates, 2 repeats, a small capacity search (its ``search`` call recorded), a peak
    rate, headroom, one candidate's own price."""
    import servelab.trial.capacity as capacity

    calls: list[dict[str, Any]] = []
    real = capacity.search

    def spy(probe: Any, start: float, **kw: Any) -> Any:
        calls.append({"start": start, **kw})
        return real(probe, start, **kw)

    mpatch = pytest.MonkeyPatch()
    mpatch.setattr(capacity, "search", spy)
    out = tmp_path_factory.mktemp("decisions") / "run"
    exp = {
        "name": "decisions",
        "goal": {
            "slo": "ttft_p95<=5s",
            "expected_rate_rps": 50,
            "peak_rate_rps": 40,
            "headroom": 0.5,
            "mix": "short-qa:2,structured:1",
            "budget": {"price_per_hour": 2.0},
            "quality": {"smoke": ["streaming", "usage"]},
        },
        "candidates": [
            {
                "name": "own-price",
                "engine": "mock",
                "price_per_hour": 7.5,
                "settings": {"ttft_ms": 2, "itl_ms": 1, "output_tokens": 8},
            },
            {"name": "budget-price", "engine": "mock", "settings": {"ttft_ms": 2, "itl_ms": 1, "output_tokens": 8}},
        ],
        "workloads": ["short-qa", "structured"],
        "steps": {"concurrency": [1, 2]},
        "requests_per_step": 4,
        "warmup": 0,
        "arrival_test": {"enabled": False},
        "repeats": 2,
        "capacity": {"requests": 5, "max_probes": 2, "start_rps": 30, "tolerance": 0.3, "arrival": "constant"},
    }
    try:
        rec = _run(exp, out)
    finally:
        mpatch.undo()
    yield rec, out, calls


@pytest.fixture(scope="module")
def nomix(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    """No mix run together, no capacity search, one round."""
    out = tmp_path_factory.mktemp("nomix") / "run"
    exp = {
        "name": "nomix",
        "goal": {"quality": {"smoke": ["streaming"]}},
        "candidates": [{"name": "m", "engine": "mock", "settings": {"output_tokens": 4}}],
        "workloads": ["short-qa", "structured"],
        "steps": {"concurrency": [1]},
        "requests_per_step": 2,
        "warmup": 0,
        "arrival_test": {"enabled": False},
        "mix_sweep": False,
        "capacity": {"enabled": False},
        "repeats": 1,
    }
    return _run(exp, out), out


@case("mix_sweep")
def _mix_sweep(request: pytest.FixtureRequest) -> None:
    rec, _, _ = _fx(request, "decisions")
    mix = [s for s in _steps(rec, "own-price", "mix") if not s.skipped]
    assert mix and rec.result("own-price").ranked_on == "mix"
    assert {c.workload for s in mix for c in s.by_class.values()} == {"short-qa", "structured"}
    rec2, _ = _fx(request, "nomix")
    assert not _steps(rec2, "m", "mix") and rec2.result("m").ranked_on is None  # two workloads, never summed
    assert rec2.decision.ranking == []


@case("repeats")
def _repeats(request: pytest.FixtureRequest) -> None:
    rec, out, _ = _fx(request, "decisions")
    mix = _steps(rec, "own-price", "mix")
    assert {s.repeat for s in mix} == {0, 1}  # the default 3 would add a round 2
    assert (out / "candidates" / "own-price" / "mix-r2" / "requests.jsonl").is_file()
    assert rec.method.repeats == 2 and rec.result("own-price").effective_throughput.repeats == 2
    rec2, _ = _fx(request, "nomix")
    assert rec2.method.repeats == 1


@case("capacity", "capacity.enabled")
def _capacity(request: pytest.FixtureRequest) -> None:
    rec, _, _ = _fx(request, "decisions")
    assert rec.result("own-price").capacity is not None and rec.result("own-price").capacity.probes
    rec2, _ = _fx(request, "nomix")
    assert rec2.result("m").capacity is None and rec2.method.capacity_search == {}


@case("capacity.model_check")
def _capacity_model_check(request: pytest.FixtureRequest) -> None:
    """Off by default: the capacity model is recorded after the search, with no extra probe (on: one
    extra probe predicted by the fit made before it, tests/trial/test_capacity.py)."""
    rec, out, _ = _fx(request, "decisions")
    cm = rec.result("own-price").capacity_model
    assert cm is not None and cm.check is None and cm.fit.requests > 0
    probes = rec.result("own-price").capacity.probes
    ran = sorted(p.name for p in (out / "candidates" / "own-price" / "capacity").iterdir())
    assert ran == sorted(f"r{p.rate_rps:.4g}" for p in probes if p.step)


@case("capacity.requests")
def _capacity_requests(request: pytest.FixtureRequest) -> None:
    rec, out, _ = _fx(request, "decisions")
    cap = rec.result("own-price").capacity
    assert cap.requests_per_probe == 5
    p = cap.probes[0]
    lines = _lines(out / "candidates" / "own-price" / "capacity" / f"r{p.rate_rps:.4g}" / "requests.jsonl")
    assert len(lines) == 5


@case("capacity.max_probes")
def _capacity_max_probes(request: pytest.FixtureRequest) -> None:
    rec, _, calls = _fx(request, "decisions")
    assert all(c["max_probes"] == 2 for c in calls) and len(rec.result("own-price").capacity.probes) <= 2


@case("capacity.start_rps")
def _capacity_start(request: pytest.FixtureRequest) -> None:
    rec, _, calls = _fx(request, "decisions")
    assert rec.result("own-price").capacity.probes[0].rate_rps == 30  # not the expected 50 req/s
    assert {c["start"] for c in calls} == {30}


@case("capacity.tolerance")
def _capacity_tolerance(request: pytest.FixtureRequest) -> None:
    rec, _, calls = _fx(request, "decisions")
    assert {c["tolerance"] for c in calls} == {0.3} and rec.method.capacity_search["tolerance"] == 0.3


@case("capacity.arrival")
def _capacity_arrival(request: pytest.FixtureRequest) -> None:
    rec, out, _ = _fx(request, "decisions")
    cap = rec.result("own-price").capacity
    assert cap.arrival == "constant"
    p = cap.probes[0]
    summ = json.loads(
        (out / "candidates" / "own-price" / "capacity" / f"r{p.rate_rps:.4g}" / "summary.json").read_text()
    )
    assert summ["steps"][0]["load"]["arrival"] == "constant"


@case("goal.peak_rate_rps")
def _peak(request: pytest.FixtureRequest) -> None:
    rec, _, _ = _fx(request, "decisions")
    rep = rec.result("own-price").replicas
    assert rep is not None and rep.peak_rps == 40  # not the expected 50


@case("goal.headroom")
def _headroom(request: pytest.FixtureRequest) -> None:
    import math

    rec, _, _ = _fx(request, "decisions")
    rep = rec.result("own-price").replicas
    assert rep.headroom == 0.5 and rep.replicas == max(1, math.ceil(40 / (rep.capacity_rps * 0.5) - 1e-9))


@pytest.fixture(scope="module")
def lifecycle_run(tmp_path_factory: pytest.TempPathFactory) -> TrialRecord:
    """A mock candidate with both lifecycle measurements on, 3 of 4 cancellation clients leaving."""
    exp = Experiment.model_validate(
        {
            "goal": {"quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]}, "mix": "short-qa:1"},
            "candidates": [
                {"name": "m", "engine": "mock", "settings": {"ttft_ms": 5.0, "itl_ms": 20.0, "output_tokens": 300}}
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 4}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 2,
            "warmup": 0,
            "mix_sweep": False,
            "repeats": 1,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 30,
            "lifecycle": {
                "restart_under_load": True,
                "cancellation": True,
                "cancel_share": 0.75,
                "cancel_max_decode_s": 7.5,
            },
        }
    )
    return TrialRunner(exp, tmp_path_factory.mktemp("lifecycle") / "run", progress=lambda *_: None).run()


@case("lifecycle")
def _lifecycle(request: pytest.FixtureRequest) -> None:
    rec = _fx(request, "lifecycle_run")
    assert rec.results.candidates["m"].lifecycle is not None
    default = Experiment.model_validate(
        {"candidates": [{"name": "m", "engine": "mock"}], "arrival_test": {"enabled": False}}
    ).lifecycle
    assert default.model_dump() == {
        "warm_start": None,
        "restart_under_load": False,
        "cancellation": False,
        "cancel_share": 0.5,
        "cancel_max_decode_s": 10.0,
    }


@case("checks")
def _checks(request: pytest.FixtureRequest) -> None:
    # default [template]: the lifecycle run's mock has no template endpoint: checked, verdict unknown
    d = _fx(request, "lifecycle_run").results.candidates["m"].checks
    assert d is not None and d.template is not None and d.context is None
    # [context] on a mock that refuses prompts past 512 tokens: the limit found, no template check
    tmp_path: Path = _fx(request, "tmp_path")
    exp = Experiment.model_validate(
        {
            "goal": {"quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]}, "mix": "short-qa:1"},
            "candidates": [
                {
                    "name": "m",
                    "engine": "mock",
                    "settings": {"ttft_ms": 2.0, "itl_ms": 1.0, "output_tokens": 4, "context_tokens": 512},
                }
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 4}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 1,
            "warmup": 0,
            "mix_sweep": False,
            "repeats": 1,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 30,
            "checks": ["context"],
            "lifecycle": {"warm_start": False},
        }
    )
    rec = TrialRunner(exp, tmp_path / "ctx", progress=lambda *_: None).run()
    c = rec.results.candidates["m"].checks
    assert c is not None and c.template is None and c.context is not None
    assert c.context.verdict == "clear_error" and c.context.accepted_tokens is not None
    assert 512 - 16 <= c.context.accepted_tokens <= 512
    fact = rec.identity.candidates["m"].facts["accepted_context_tokens"]
    assert fact.value == c.context.accepted_tokens and fact.source.startswith("context check")
    assert '"probes"' in (tmp_path / "ctx" / "record.json").read_text()  # written in full


@case("lifecycle.warm_start")
def _lifecycle_warm_start(request: pytest.FixtureRequest) -> None:
    tmp_path: Path = _fx(request, "tmp_path")
    # unset (the lifecycle run): the mock starts in well under 30 s, so its warm start ran, automatically
    w = _fx(request, "lifecycle_run").results.candidates["m"].lifecycle.warm_start
    assert w is not None and w.auto and w.error is None and w.cold.first_token_s and w.warm is not None
    assert w.warm.port_open_s is not None and w.warm.health_s is not None and w.warm.first_token_s
    assert w.warm.port_open_s <= w.warm.health_s <= w.warm.first_token_s and "mock" in w.engine_caches
    # false: no second launch (and nothing else enabled: no lifecycle result at all)
    exp = Experiment.model_validate(
        {
            "goal": {"quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]}, "mix": "short-qa:1"},
            "candidates": [
                {"name": "m", "engine": "mock", "settings": {"ttft_ms": 2.0, "itl_ms": 1.0, "output_tokens": 4}}
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 4}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 1,
            "warmup": 0,
            "mix_sweep": False,
            "repeats": 1,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
            "timeout_s": 30,
            "lifecycle": {"warm_start": False},
        }
    )
    r = TrialRunner(exp, tmp_path / "off", progress=lambda *_: None).run().results.candidates["m"]
    assert r.status == "ranked" and r.lifecycle is None
    assert not (tmp_path / "off" / "candidates" / "m" / "engine-warm").exists()


@case("lifecycle.restart_under_load")
def _lifecycle_restart(request: pytest.FixtureRequest) -> None:
    r = _fx(request, "lifecycle_run").results.candidates["m"].lifecycle.restart_under_load
    assert r is not None and r.restart_error is None and r.down_s is not None and r.down_s > 0
    assert r.requests_ok > 0 and r.first_success_after_restart_s is not None


@case("lifecycle.cancellation", "lifecycle.cancel_share")
def _lifecycle_cancel(request: pytest.FixtureRequest) -> None:
    c = _fx(request, "lifecycle_run").results.candidates["m"].lifecycle.cancellation
    assert c is not None and c.metric and c.cancelled == 3 and c.clients == 4
    assert c.baseline_return_s is not None and c.drop_s is not None and c.completed == 1


@case("lifecycle.cancel_max_decode_s")
def _lifecycle_cancel_limit(request: pytest.FixtureRequest) -> None:
    rec = _fx(request, "lifecycle_run")
    c = rec.results.candidates["m"].lifecycle.cancellation
    assert c is not None and c.max_decode_s == 7.5 and c.verdict == "pass"  # the default is 10 s
    assert c.decode_after_leave_s is not None and c.wasted_decode_s == round(c.decode_after_leave_s * 3, 3)
    assert any("within the 7.5 s limit" in x for x in rec.decision.verdicts["m"].reasons)


def _generator_run(
    tmp: Path, name: str, load_generator: dict[str, Any] | None, **more: Any
) -> tuple[dict[str, Any], list]:
    """One tiny closed-loop trial on a mock; returns its steps' summary.json and requests.jsonl lines."""
    exp: dict[str, Any] = {
        "name": name,
        "goal": {"quality": {"smoke": ["streaming"]}},
        "candidates": [{"name": "m", "engine": "mock", "settings": {"ttft_ms": 2, "itl_ms": 1, "output_tokens": 4}}],
        "workloads": ["short-qa"],
        "steps": {"concurrency": [2]},
        "requests_per_step": 6,
        "warmup": 0,
        "repeats": 1,
        "mix_sweep": False,
        "arrival_test": {"enabled": False},
        "capacity": {"enabled": False},
        **more,
    }
    if load_generator is not None:
        exp["load_generator"] = load_generator
    _run(exp, tmp / name)
    steps = tmp / name / "candidates" / "m" / "steps"
    return json.loads((steps / "summary.json").read_text()), _lines(steps / "requests.jsonl")


@pytest.fixture(scope="module")
def generators(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict[str, Any], list]]:
    """The same trial sent by the trial's own process, by 2 worker processes, and by Ray actors (one per node
    of a real two-node local cluster, tests/raycluster.py)."""
    import raycluster

    tmp = tmp_path_factory.mktemp("generators")
    runs = {
        "default": _generator_run(tmp, "default", None),
        "workers": _generator_run(
            tmp,
            "workers",
            {"workers": 2},
            workloads=["short-qa", "structured"],
            mix_sweep=True,
            goal={"quality": {"smoke": ["streaming"]}, "expected_rate_rps": 20, "mix": "short-qa:1,structured:1"},
            capacity={"requests": 4, "max_probes": 1, "start_rps": 20},
            arrival_test={"enabled": True, "requests": 4},
        ),
        "tmp": ({"tmp": str(tmp)}, []),
    }
    with raycluster.ray_cluster() as address:
        runs["ray"] = _generator_run(tmp, "ray", {"ray": address, "workers": 2})
        runs["per_node"] = _generator_run(tmp, "per-node", {"ray": address, "workers_per_node": 1})
        runs["address"] = ({"address": address}, [])
    return runs


@case("load_generator")
def _load_generator(request: pytest.FixtureRequest) -> None:
    summary, lines = _fx(request, "generators")["default"]
    assert summary["generator"]["mode"] == "process" and {x["worker"] for x in lines} == {0}


@case("load_generator.workers")
def _load_generator_workers(request: pytest.FixtureRequest) -> None:
    summary, lines = _fx(request, "generators")["workers"]
    assert summary["generator"]["mode"] == "processes" and len(summary["generator"]["workers"]) == 2
    assert len(lines) == 6 * 2 and {x["worker"] for x in lines} == {0, 1}
    # the mix run together, the arrival test and the capacity probes come from the workers too
    cand = Path(_fx(request, "generators")["tmp"][0]["tmp"]) / "workers" / "candidates" / "m"
    for part in ("mix", "arrival", *(p.name for p in (cand / "capacity").iterdir())):
        path = cand / part if part in ("mix", "arrival") else cand / "capacity" / part
        assert {x["worker"] for x in _lines(path / "requests.jsonl")} == {0, 1}, part


@case("load_generator.ray")
def _load_generator_ray(request: pytest.FixtureRequest) -> None:
    runs = _fx(request, "generators")
    summary, lines = runs["ray"]
    gen = summary["generator"]
    assert gen["mode"] == "ray" and gen["ray_address"] == runs["address"][0]["address"]
    assert len(gen["workers"]) == 2 and len(lines) == 6 and {x["worker"] for x in lines} == {0, 1}


@case("load_generator.workers_per_node")
def _load_generator_per_node(request: pytest.FixtureRequest) -> None:
    summary, lines = _fx(request, "generators")["per_node"]
    workers = summary["generator"]["workers"]
    assert len(workers) == 2 and len({w["node_id"] for w in workers}) == 2  # one actor on each of the 2 nodes
    assert len(lines) == 6


@case("candidates[].restart")
def _candidate_restart(request: pytest.FixtureRequest) -> None:
    """A mock that crashes in its load step: restart once brings it back (ranked, recovery time), never
    leaves it failed (tests/trial/test_reliability.py has the detail)."""
    tmp = request.getfixturevalue("tmp_path")
    outcomes = {}
    for restart in ("never", "once"):
        exp = Experiment.model_validate(
            {
                "goal": {"quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]}, "mix": "short-qa:1"},
                "candidates": [
                    {
                        "name": "c",
                        "engine": "mock",
                        "restart": restart,
                        "settings": {"ttft_ms": 5.0, "itl_ms": 2.0, "output_tokens": 4, "crash_after_requests": 5},
                    }
                ],
                "workloads": [{"name": "short-qa", "set": {"output_tokens": 4}}],
                "steps": {"concurrency": [1]},
                "requests_per_step": 6,
                "warmup": 0,
                "mix_sweep": False,
                "arrival_test": {"enabled": False},
                "capacity": {"enabled": False},
                "timeout_s": 10,
            }
        )
        r = TrialRunner(exp, tmp / restart, progress=lambda *_: None).run().results.candidates["c"]
        assert r.reliability is not None and r.reliability.crash_count >= 1
        outcomes[restart] = (r.status, r.reliability.restart_count)
    assert outcomes == {"never": ("failed", 0), "once": ("ranked", 1)}


@case("candidates[].declared")
def _candidate_declared(request: pytest.FixtureRequest) -> None:
    """Declared facts reach the record's identity with source 'declared' (a url candidate on the mock)."""
    mp = request.getfixturevalue("mock_engine")("--dialect", "sglang")  # stopped at teardown
    exp = Experiment.model_validate(
        {
            "goal": {"quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]}, "mix": "short-qa:1"},
            "candidates": [
                {
                    "name": "r",
                    "engine": "url",
                    "url": mp.base_url,
                    "declared": {"gpu_model": "NVIDIA H200", "gpu_count": 8, "pp": 2},
                }
            ],
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 2}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 1,
            "warmup": 0,
            "mix_sweep": False,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
        }
    )
    out = request.getfixturevalue("tmp_path") / "declared"
    rec = TrialRunner(exp, out, progress=lambda *_: None).run()
    facts = rec.identity.candidates["r"].facts
    assert facts["gpu_model"].value == "NVIDIA H200" and facts["gpu_model"].source == "declared"
    assert facts["pp_size"].value == 2 and facts["gpu_count"].value == 8
    assert facts["model_id"].source.startswith("GET ")  # beside what the server said


@case("candidates[].price_per_hour")
def _candidate_price(request: pytest.FixtureRequest) -> None:
    rec, _, _ = _fx(request, "decisions")
    own, other = rec.result("own-price").cost, rec.result("budget-price").cost
    assert own.price_per_hour == 7.5 and other.price_per_hour == 2.0
    assert own.per_10k_output_tokens == 7.5 / 3600 / own.tokens_per_s * 1e4


def test_every_settings_field_is_documented() -> None:
    """Each launched kind's Settings model and the doc's table list the same fields."""
    from servelab.engines import registry

    documented = set(documented_fields())
    for kind in ("llamacpp", "vllm", "mock", "command"):
        model_fields = set(registry.get(kind).Settings.model_fields)
        doc = {f.rsplit(".", 1)[1] for f in documented if f.startswith(f"candidates[{kind}].settings.")}
        assert doc == model_fields, (kind, sorted(doc ^ model_fields))
        assert set(SETTINGS_VALUES[kind]) | OWN_CASES.get(kind, set()) == model_fields


@pytest.mark.parametrize("field", sorted(set(documented_fields())))
def test_field_has_its_effect(field: str, request: pytest.FixtureRequest) -> None:
    if field not in CASES:
        pytest.fail(f"{field}: no case (see test_every_documented_field_has_a_case)")
    CASES[field](request)


def test_informational_gates_are_printed_as_such(tmp_path: Path) -> None:
    """A gate whose minimum is 0 cannot fail: the progress line says 'informational', never 'ok'."""
    lines: list[str] = []
    exp = Experiment.model_validate(
        {
            "goal": {
                "quality": {
                    "smoke": ["streaming"],
                    "samples_pass_min": 0.0,
                    "samples": [{"prompt": "hi", "expect_regex": "never"}],
                }
            },
            "candidates": [{"name": "m", "engine": "mock", "settings": {"output_tokens": 2}}],
            "workloads": ["short-qa"],
            "steps": {"concurrency": [1]},
            "requests_per_step": 1,
            "warmup": 0,
            "arrival_test": {"enabled": False},
        }
    )
    TrialRunner(exp, tmp_path / "run", progress=lines.append).run()
    (gate,) = [ln for ln in lines if "quality gate:" in ln]
    assert "samples_pass_fraction 0.00 (informational: no minimum)" in gate and " ok" not in gate, gate


def test_budget_estimates_with_a_fake_clock() -> None:
    """TrialBudget's rules, on a clock the test moves: unknown work starts while time is left; a step
    is estimated from this candidate's previous step of its workload, else the same step of an
    earlier candidate; a candidate from the earlier ones' time to the end of their first step."""
    from servelab.trial.budget import TrialBudget

    now = [100.0]
    b = TrialBudget(1.0, clock=lambda: now[0])  # 60 s
    assert b.allows(b.candidate_estimate_s()) and b.step_estimate_s("a", "w", "c1") == 0.0
    now[0] = 110.0  # a: launched at 100, first step c1 ran 110..120
    now[0] = 120.0
    b.record_step("a", "w", "c1", 10.0, started_at=100.0)
    now[0] = 145.0
    b.record_step("a", "w", "c2", 25.0, started_at=100.0)
    assert b.step_estimate_s("a", "w", "c4") == 25.0  # its previous step
    assert b.step_estimate_s("b", "w", "c2") == 25.0 and b.step_estimate_s("b", "w", "c1") == 10.0
    assert b.step_estimate_s("b", "other", "c1") == 0.0
    assert b.candidate_estimate_s() == 20.0  # 100 -> end of c1 at 120
    assert b.remaining_s() == 15.0 and b.allows(14.9) and not b.allows(15.0)
    b.skip("b")
    use = b.use()
    assert use is not None and use.exhausted and use.skipped == ["b"] and use.spent_s == 45.0
    assert "b" in use.note and TrialBudget(None).use() is None and TrialBudget(None).allows(1e9)
