"""Embeddings trials (``goal.task_kind: embeddings``, servelab.trial.flows.embeddings): two real all-MiniLM-L6-v2
llama-server embedders (``engine: command`` running ``servelab.engines.embedder``) at different slot
counts run to a decision ranked on inputs/s with the unit stated; a chat server (the mock engine, which
has no /v1/embeddings) is excluded by the embeddings gate; bad input is one line.

The real-engine test skips when no llama-server is cached, unless ``SERVELAB_REQUIRE_ENGINE`` is set.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from servelab.engines.llamacpp import find_llama_server
from servelab.trial.flow import TrialRunner
from servelab.trial.report import render_report
from servelab.trial.spec import Experiment, load_experiment
from servelab.wire.errors import ConfigError

pytestmark = pytest.mark.timeout(600)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "tests" / "gateway" / "data" / "embedding_reference.json"
needs_engine = pytest.mark.skipif(
    find_llama_server() is None and not os.environ.get("SERVELAB_REQUIRE_ENGINE"), reason="no cached llama-server"
)


def _embedder(name: str, parallel: int) -> dict[str, Any]:
    return {
        "name": name,
        "engine": "command",
        "settings": {
            "argv": [
                sys.executable,
                "-m",
                "servelab.engines.embedder",
                "--port",
                "{port}",
                "--parallel",
                str(parallel),
                "--threads",
                "1",
            ],
            "ready_timeout_s": 180,
        },
    }


def _exp(candidates: list[dict[str, Any]], **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": "embed",
        "goal": {"task_kind": "embeddings", "slo": "e2e_p95<=20s,error_rate<=1%"},
        "candidates": candidates,
        "steps": {"concurrency": [1, 2]},
        "requests_per_step": 6,
        "repeats": 2,
        "embeddings": {"batch_size": 4, "input_tokens": "32-96", "reference": str(REFERENCE), "similarity_min": 0.99},
    }
    d.update(over)
    return d


def _write(tmp_path: Path, d: dict[str, Any]) -> Path:
    p = tmp_path / "experiment.yaml"
    p.write_text(yaml.safe_dump(d), encoding="utf-8")
    return p


@needs_engine
def test_two_embedders_run_to_a_decision_on_inputs_per_s(tmp_path: Path, mock_engine: Any) -> None:
    mock_server = mock_engine()
    exp = load_experiment(
        _write(
            tmp_path,
            _exp(
                [
                    _embedder("np1", 1),
                    _embedder("np2", 2),
                    {"name": "chat", "engine": "url", "url": mock_server.base_url},  # a chat server: no /v1/embeddings
                ]
            ),
        )
    )
    lines: list[str] = []
    rec = TrialRunner(exp, tmp_path / "run", progress=lines.append).run()
    res = rec.results.candidates
    # the chat server fails the gate (no vectors), with the reason
    assert res["chat"].status == "excluded"
    assert "vectors_returned_fraction" in (res["chat"].reason or "")
    assert rec.decision.verdicts["chat"].verdict == "exclude"
    for n in ("np1", "np2"):
        r = res[n]
        assert r.status == "ranked", r.reason
        checks = {c.name: c for c in r.quality.checks}  # type: ignore[union-attr]
        assert checks["dimension_match_fraction"].value == 1.0
        assert "384" in checks["dimension_match_fraction"].note
        assert checks["reference_cosine_min"].value > 0.99  # the served vectors match transformers' reference
        f = r.embeddings
        assert f is not None and f.inputs_per_s and f.at_step in ("c1", "c2")
        assert len(f.per_repeat) == 2 and f.inputs_per_s_ci is not None  # round 0 + one repeat
        assert f.dimensions == 384 and f.batch_size == 4
        assert 32 <= f.input_tokens["min"] <= f.input_tokens["max"] <= 96  # exact in MiniLM's tokenizer
        assert "inputs/s" in f.unit and "input length" in f.unit and "4 input(s) per" in f.unit
        assert f.not_applicable
        steps = [s for s in r.steps if s.embeddings is not None]
        assert {s.repeat for s in steps} == {0, 1}
    # ranked on inputs/s: the ranking follows the figures unless the tie-break grouped them
    d = rec.decision
    assert sorted(d.ranking) == ["np1", "np2"] and d.adopt in ("np1", "np2")
    assert d.differences and d.differences[0].metric == "inputs_per_s"
    first, second = (res[n].embeddings for n in d.ranking)
    assert first is not None and second is not None
    if d.differences[0].significant:
        assert (first.inputs_per_s or 0) > (second.inputs_per_s or 0)
    else:  # grouped: the tie-break (lower e2e P95) orders them, and the reason says which applied
        assert (first.e2e_p95_s or 0) <= (second.e2e_p95_s or 0)
    head = d.verdicts[d.adopt].reasons[0]
    assert head.startswith("highest inputs/s") == ((first.inputs_per_s or 0) >= (second.inputs_per_s or 0))
    assert "inputs/s" in d.verdicts[d.adopt].reasons[0] and "input length" in d.verdicts[d.adopt].reasons[0]
    assert d.scope and d.scope.startswith("Embeddings trial")
    assert rec.goal.task_kind == "embeddings"
    # the record read back says the same
    back = (tmp_path / "run" / "record.json").read_text()
    assert '"inputs_per_s"' in back and '"task_kind":"embeddings"' in back.replace(" ", "")
    assert any("inputs/s" in ln for ln in lines)
    # the report states the ranked figure with its unit and input length, not chat output tok/s
    html = render_report(tmp_path / "run")
    assert "inputs/s (embedding vectors per second)" in html
    assert f"effective {first.inputs_per_s:.1f} inputs/s" in html and "input(s) per request" in html
    assert "tokenizer.json" in html and "0 output tok/s" not in html


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"workloads": ["short-qa"]}, "workloads: is for chat workloads"),
        (
            {"goal": {"task_kind": "embeddings", "quality": {"samples": [{"prompt": "hi", "expect_regex": "x"}]}}},
            "goal.quality.samples: is for chat business samples",
        ),
        ({"goal": {"task_kind": "embeddings", "slo": "ttft_p95<=1s"}}, "ttft_p95<=1s times streamed tokens"),
        ({"candidates": [{"name": "c", "engine": "mock"}]}, "candidates[0].engine: 'mock' is a chat engine"),
        ({"candidates": [{"name": "c", "engine": "llamacpp"}]}, "a llamacpp candidate serves chat unless"),
        ({"embeddings": {"reference": "nope.json"}}, "cannot read reference"),
        ({"embeddings": {"batch_size": 0}}, "embeddings.batch_size"),
        (
            {"goal": {"task_kind": "embeddings", "expected_rate_rps": 5}},
            "goal.expected_rate_rps: is for the chat arrival",
        ),
    ],
)
def test_bad_embeddings_input_is_one_line(tmp_path: Path, change: dict[str, Any], message: str) -> None:
    d = _exp([_embedder("a", 1)])
    d.update(change)
    with pytest.raises(ConfigError) as e:
        load_experiment(_write(tmp_path, d))
    assert message in str(e.value) and "\n" not in str(e.value)


def test_embeddings_section_in_a_chat_trial_is_refused(tmp_path: Path) -> None:
    d = {"candidates": [{"name": "m", "engine": "mock"}], "embeddings": {"batch_size": 8}}
    with pytest.raises(ConfigError, match="embeddings: applies to an embeddings trial only"):
        load_experiment(_write(tmp_path, d))


def test_an_embeddings_experiment_writes_back_and_loads(tmp_path: Path) -> None:
    exp = load_experiment(_write(tmp_path, _exp([_embedder("a", 1)])))
    again = Experiment.model_validate(yaml.safe_load(exp.to_yaml()))
    assert again == exp and again.goal.task_kind == "embeddings" and again.embeddings.batch_size == 4


def test_trial_command_refuses_a_chat_candidate_in_one_line(tmp_path: Path) -> None:
    d = _exp([{"name": "c", "engine": "vllm"}])
    p = _write(tmp_path, d)
    r = subprocess.run(
        [str(Path(sys.executable).with_name("servelab")), "trial", str(p), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode != 0
    err = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(err) == 1 and "candidates[0].engine: 'vllm' is a chat engine" in err[0], r.stderr
    assert "Traceback" not in r.stderr


def _ranked(per_repeat: list[float], p95: float) -> Any:
    from servelab.trial.embed_results import EmbeddingsFigures
    from servelab.trial.results import CandidateResult

    f = EmbeddingsFigures(
        at_step="c2", per_repeat=per_repeat, inputs_per_s=sum(per_repeat) / len(per_repeat), e2e_p95_s=p95, unit="u"
    )
    return CandidateResult(status="ranked", max_step_meeting_slo="c2", embeddings=f)


def test_decision_ranks_on_inputs_per_s_with_the_interval_and_tie_break() -> None:
    from servelab.trial.flows.embeddings.decision import embeddings_decision
    from servelab.trial.results import CandidateResult, Decision

    fast, slow = _ranked([20.0, 20.4, 19.6], 0.9), _ranked([10.0, 10.2, 9.8], 0.1)
    gone = CandidateResult(status="excluded", reason="embeddings gate failed: x")
    d = embeddings_decision(Decision(), {"slow": slow, "fast": fast, "gone": gone})
    assert d.ranking == ["fast", "slow"] and d.adopt == "fast" and d.significant  # 2x, tight repeats
    assert d.differences[0].metric == "inputs_per_s" and d.differences[0].ci is not None
    assert d.differences[0].ci.lo > 1 and d.verdicts["fast"].reasons[0].startswith("highest inputs/s")
    assert d.verdicts["gone"].verdict == "exclude" and "gate failed" in d.verdicts["gone"].reasons[0]
    # overlapping repeats: one group, ordered by the lower e2e P95, and the head says so
    a, b = _ranked([20.0, 12.0], 0.9), _ranked([15.0, 16.0], 0.2)
    d = embeddings_decision(Decision(), {"a": a, "b": b})
    assert not d.significant and d.ranking == ["b", "a"]
    assert "by the tie-break" in d.verdicts["b"].reasons[0]
