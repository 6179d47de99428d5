"""The trial flow reads the typed experiment: documented fields that the old getattr layer dropped now
have their effect (each assertion fails when the field is ignored), and the run folder holds the files
docs/record-schema.md promises for them. One in-process trial on a mock candidate (fast, exact)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from servelab.trial.flow import TrialRunner
from servelab.trial.results import TrialRecord
from servelab.trial.spec import Experiment

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[TrialRecord, Path]:
    tmp = tmp_path_factory.mktemp("fields")
    data = tmp / "prompts.jsonl"  # entries without a length: they get max_tokens_default
    data.write_text("".join(json.dumps({"prompt": f"question {i}?"}) + "\n" for i in range(4)))
    exp = Experiment.model_validate(
        {
            "name": "fields",
            "goal": {
                "slo": "ttft_p95<=5s",
                "expected_rate_rps": 50,
                "burstiness": 1,
                "mix": None,  # documented: null = the experiment's mixable workloads, weight 1 each
                "quality": {
                    "structured_requests": 3,
                    "structured_valid_min": 0.5,
                    "samples_pass_min": 1.0,
                    "samples": [{"name": "tokens", "prompt": "Say something.", "expect_regex": "tok\\d"}],
                },
            },
            "candidates": [{"name": "m", "engine": "mock", "settings": {"ttft_ms": 1, "output_tokens": 50}}],
            "workloads": ["short-qa", "structured", {"dataset": str(data), "max_tokens_default": 5}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 4,
            "warmup": 0,
            "timeout_s": 20,
            "arrival_test": {"enabled": True, "requests": 10},
        }
    )
    out = tmp / "run"
    record = TrialRunner(exp, out, progress=lambda s: None).run()
    return record, out


def test_the_candidate_is_ranked(run: tuple[TrialRecord, Path]) -> None:
    record, _ = run
    assert record.result("m").status == "ranked", record.result("m")


def test_dataset_max_tokens_default_reaches_the_requests(run: tuple[TrialRecord, Path]) -> None:
    _, out = run
    rows = [r for r in _lines(out / "candidates/m/steps/requests.jsonl") if r["workload"] == "dataset:prompts.jsonl"]
    assert len(rows) == 4
    assert {r["max_tokens"] for r in rows} == {5}  # was 256 (the bench default) before the fix
    assert {r["output_tokens"] for r in rows} == {5}  # the mock caps its 50 tokens at max_tokens


def test_quality_structured_requests_sets_the_gate_sample(run: tuple[TrialRecord, Path]) -> None:
    record, out = run
    rows = [r for r in _lines(out / "candidates/m/quality/requests.jsonl") if not r["warmup"]]
    assert len(rows) == 3  # was always 8: the flow read a field the schema did not have
    files = record.evidence.files["m"]
    assert files["quality_structured"] == "candidates/m/quality/requests.jsonl"
    # docs/record-schema.md lists quality.jsonl: the business samples' requests
    assert "quality.jsonl" in (ROOT / "docs/record-schema.md").read_text()
    assert files["quality"] == "candidates/m/quality.jsonl"
    (sample,) = _lines(out / files["quality"])
    assert sample["sample_passed"] is True and sample["text"].startswith(" tok0")
    quality = record.result("m").quality
    assert quality is not None
    checks = {c.name: c for c in quality.checks}
    assert checks["samples_pass_fraction"].value == 1.0 and checks["structured_valid_fraction"].ok


def test_null_mix_is_the_experiments_mixable_workloads(run: tuple[TrialRecord, Path]) -> None:
    _, out = run
    rows = _lines(out / "candidates/m/arrival/requests.jsonl")
    assert len(rows) == 10
    # short-qa asks 32-128 tokens, structured 128-256; the bench's default mix would have sent
    # long-gen (512-1024) and rag requests too
    assert max(r["max_tokens"] for r in rows) <= 256
    assert any(r["max_tokens"] > 128 for r in rows) and any(r["max_tokens"] < 128 for r in rows)


def test_smoke_requests_are_written(run: tuple[TrialRecord, Path]) -> None:
    record, out = run
    assert "smoke.jsonl" in (ROOT / "docs/record-schema.md").read_text()
    rows = _lines(out / "candidates/m/smoke.jsonl")
    assert len(rows) >= 3 and {r["workload"] for r in rows} == {"smoke"}
    assert any("response_format" not in r and r["text"] for r in rows)
    assert record.evidence.files["m"]["smoke"] == "candidates/m/smoke.jsonl"
    smoke = record.result("m").smoke
    assert set(smoke) == {"streaming", "usage", "json_schema", "stop"} and all(v.ok for v in smoke.values())


def test_identity_is_the_typed_model(run: tuple[TrialRecord, Path]) -> None:
    from servelab.engines.registry import EngineIdentity
    from servelab.trial.decide import engine_facts

    record, _ = run
    ident = record.ident("m").engine
    assert isinstance(ident, EngineIdentity)
    assert ident.kind == "mock" and ident.engine == "servelab-mock"
    assert ident.argv[1:3] == ["-m", "servelab.engines.mock"]
    assert engine_facts(ident) == ("servelab-mock", ident.version, None)
