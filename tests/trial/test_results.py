"""Typed results on disk: a real mock-candidate trial (``servelab trial`` CLI) writes every file
docs/record-schema.md lists, and its ``record.json``, ``summary.json`` and ``*.jsonl`` files validate
against the committed JSON Schemas and the models; records of schema version 1 are migrated on read
and still render."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from servelab.bench.results import SUMMARY_SCHEMA_PATH, RequestLine, Summary
from servelab.trial.results import (
    RECORD_SCHEMA_PATH,
    RECORD_SCHEMA_VERSION,
    MetricsSample,
    TrialRecord,
    migrate,
    read_record,
)
from servelab.wire import ConfigError

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[2]
V1 = Path(__file__).parent / "fixtures" / "run1"  # a record of schema version 1 (make_run.py)

EXPERIMENT = {
    "name": "results",
    "goal": {
        "slo": "ttft_p95<=5s,error_rate<=5%",
        "expected_rate_rps": 20,
        "burstiness": 1,
        "quality": {
            "structured_requests": 2,
            "structured_valid_min": 0.5,
            "samples": [{"name": "tokens", "prompt": "Say something.", "expect_regex": "tok\\d"}],
        },
    },
    "candidates": [
        {"name": "fast", "engine": "mock", "settings": {"ttft_ms": 1, "output_tokens": 16}},
        {"name": "slow", "engine": "mock", "settings": {"ttft_ms": 30, "output_tokens": 16}},
    ],
    "workloads": ["short-qa", "structured"],
    "steps": {"concurrency": [1, 2]},
    "requests_per_step": 3,
    "warmup": 1,
    "timeout_s": 20,
    "arrival_test": {"enabled": True, "requests": 6},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("results")
    exp = tmp / "exp.yaml"
    exp.write_text(yaml.safe_dump(EXPERIMENT))
    out = tmp / "run"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out), "--no-index"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out


def _schema(path: Path) -> jsonschema.protocols.Validator:
    schema = json.loads(path.read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _documented_files() -> tuple[list[str], list[str]]:
    """The files of the run-folder tree in docs/record-schema.md: (top level, per candidate)."""
    text = (ROOT / "docs/record-schema.md").read_text(encoding="utf-8")
    block = text.split("```", 2)[1]
    top, per = [], []
    for line in block.splitlines():
        m = re.match(r"^( +)(\S+)", line)
        if not m or m.group(2) == "candidates/<name>/":
            continue
        (top if len(m.group(1)) == 2 else per).append(m.group(2))
    return top, per


def test_every_documented_file_is_written(run: Path) -> None:
    top, per = _documented_files()
    assert "record.json" in top and "smoke.jsonl" in per and "steps/summary.json" in per  # the parse found the tree
    for name in top:
        assert (run / name).exists(), name
    rec = read_record(run)
    for cand in ("fast", "slow"):
        for name in per:
            assert (run / "candidates" / cand / name).exists(), f"{cand}: {name}"
        for rel in rec.evidence.files[cand].values():  # and the record points only at files that exist
            assert (run / rel).is_file(), rel


def test_record_validates_against_the_committed_schema_and_model(run: Path) -> None:
    raw = json.loads((run / "record.json").read_text())
    _schema(RECORD_SCHEMA_PATH).validate(raw)
    assert raw["schema_version"] == RECORD_SCHEMA_VERSION
    rec = TrialRecord.model_validate(raw)
    assert rec.to_json_bytes(indent=2) == (run / "record.json").read_bytes()  # written by the model, read back exact
    assert rec.decision.ranking == ["fast", "slow"] and rec.decision.adopt == "fast"
    fast = rec.result("fast")
    assert fast.status == "ranked" and fast.quality is not None and fast.quality.passed
    assert fast.effective_throughput is not None and fast.effective_throughput.at_step == "c2"
    assert [s.step for s in fast.steps if s.workload != "mix"] == ["c1", "c2", "c1", "c2"]
    assert fast.arrival_run is not None and fast.effective_throughput.workload == "mix"
    engine = rec.ident("fast").engine
    assert engine is not None and engine.kind == "mock"


def test_the_decision_follows_from_the_record_read_back(run: Path) -> None:
    """The record holds everything the decision used: re-deciding from the typed record read back
    gives the recorded decision, field for field."""
    from servelab.trial.decide import decide, effective_step

    rec = read_record(run)
    again = decide(
        rec.results.candidates, rec.identity.candidates, goal=rec.goal, environment=rec.environment, method=rec.method
    )
    assert again == rec.decision
    for name in rec.decision.ranking:
        res = rec.result(name)
        eff = effective_step(res.steps, rec.goal.slo, rec.goal.error_budget)
        assert eff.effective_throughput == res.effective_throughput and eff.levels == res.levels


def test_summaries_and_request_lines_validate(run: Path) -> None:
    summary = _schema(SUMMARY_SCHEMA_PATH)
    request_lines = 0
    for cand in ("fast", "slow"):
        cdir = run / "candidates" / cand
        for part in ("steps", "quality", "arrival"):
            raw = json.loads((cdir / part / "summary.json").read_text())
            summary.validate(raw)
            s = Summary.model_validate(raw)
            assert s.complete and s.steps
            assert s.to_json_bytes(indent=2) == (cdir / part / "summary.json").read_bytes()
        for f in (
            "smoke.jsonl",
            "quality.jsonl",
            "steps/requests.jsonl",
            "quality/requests.jsonl",
            "arrival/requests.jsonl",
        ):
            for line in (cdir / f).read_bytes().splitlines():
                r = RequestLine.model_validate_json(line)
                assert r.to_json_bytes() == line  # the line is exactly what the model writes
                request_lines += 1
        for x in (cdir / "server_metrics.jsonl").read_bytes().splitlines():  # 1 s samples: maybe none in a short run
            assert MetricsSample.model_validate_json(x).to_json_bytes() == x
    assert request_lines > 40


def test_the_schemas_refuse_an_unknown_field(run: Path) -> None:
    raw = json.loads((run / "record.json").read_text())
    raw["results"]["candidates"]["fast"]["effective_throughput"]["tokens_per_s"] = 1.0  # a misspelt field
    with pytest.raises(jsonschema.ValidationError, match="tokens_per_s"):
        _schema(RECORD_SCHEMA_PATH).validate(raw)
    step = json.loads((run / "candidates/fast/steps/summary.json").read_text())
    step["steps"][0]["ttft_s"]["p999"] = 1.0
    with pytest.raises(jsonschema.ValidationError, match="p999"):
        _schema(SUMMARY_SCHEMA_PATH).validate(step)


# ------------------------------------------------------------------------------------------ schema version 1


def test_v1_record_is_migrated_on_read() -> None:
    raw = json.loads((V1 / "record.json").read_text())
    assert raw["schema_version"] == 1
    rec = read_record(V1)
    assert rec.schema_version == RECORD_SCHEMA_VERSION and rec.read_version == 1
    # version 1: the launcher's own identity shape ({"kind": "llama-server", "version": ..., "binary_sha256"})
    old = raw["identity"]["candidates"]["llama-4slot"]["engine"]
    engine = rec.ident("llama-4slot").engine
    assert engine is not None and "engine" not in old
    assert (engine.engine, engine.version, engine.binary_sha256) == (old["kind"], old["version"], old["binary_sha256"])
    assert rec.result("vllm-cpu").quality is None  # version 1 wrote {} for a gate that did not run
    assert migrate(raw) is not raw and raw["schema_version"] == 1  # the caller's dict is left as read
    # a migrated record is a valid current one
    _schema(RECORD_SCHEMA_PATH).validate(json.loads(rec.to_json_bytes()))


def test_v1_record_renders_with_servelab_report(tmp_path: Path) -> None:
    run = tmp_path / "run1"
    shutil.copytree(V1, run)
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "report", str(run)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    text = (run / "report.html").read_text()
    assert ">adopt<" in text and "llama-4slot</b> &gt; <b>llama-1slot" in text
    assert "b7150 (3f1a2c9)" in text  # the version 1 engine version, read through the migration
    assert f"record.json (schema 1, read as {RECORD_SCHEMA_VERSION})" in text


def test_newer_or_broken_record_is_one_line(tmp_path: Path) -> None:
    raw = json.loads((V1 / "record.json").read_text())
    (tmp_path / "record.json").write_text(json.dumps({**raw, "schema_version": RECORD_SCHEMA_VERSION + 1}))
    with pytest.raises(
        ConfigError,
        match=rf"schema version {RECORD_SCHEMA_VERSION + 1}; this servelab reads versions "
        rf"1 to {RECORD_SCHEMA_VERSION}: upgrade servelab",
    ):
        read_record(tmp_path)
    raw["results"]["candidates"]["llama-4slot"]["status"] = "winner"
    (tmp_path / "record.json").write_text(json.dumps(raw))
    with pytest.raises(ConfigError) as e:
        read_record(tmp_path)
    assert "results.candidates.llama-4slot.status" in str(e.value) and "\n" not in str(e.value)
