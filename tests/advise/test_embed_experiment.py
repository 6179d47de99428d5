"""``servelab advise --task embedding --write-experiment``: the written embeddings experiment loads,
validates and, shrunk to a few requests, runs on the real all-MiniLM-L6-v2 llama-server embedder to a
decision on inputs/s (skips without a cached llama-server unless ``SERVELAB_REQUIRE_ENGINE`` is set)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servelab.advise import advise, write_experiment
from servelab.engines.llamacpp import find_llama_server
from servelab.trial.flow import TrialRunner
from servelab.trial.spec import load_experiment

pytestmark = pytest.mark.timeout(600)


def test_minilm_on_cpu_writes_two_launchable_embedders(tmp_path: Path) -> None:
    adv = advise("embedding", "all-minilm-l6-v2", "laptop-cpu", "8k", 4)
    path = write_experiment(adv, str(tmp_path / "emb.yaml"))
    exp = load_experiment(path)
    assert exp.goal.task_kind == "embeddings" and exp.embeddings.batch_size == 8
    assert [c.name for c in exp.candidates] == ["embedder-np1", "embedder-np4"]  # slots: 1 vs the concurrency
    assert all(c.engine == "command" for c in exp.candidates)
    assert [o.metric for o in exp.goal.objectives] == ["e2e", "error_rate"]  # no token-time SLO
    text = Path(path).read_text()
    # servers servelab does not start are written commented out, with their start commands
    assert '# - {"name": "tei", "engine": "url"' in text and "text-embeddings-router" in text
    if not (find_llama_server() is not None or os.environ.get("SERVELAB_REQUIRE_ENGINE")):
        pytest.skip("no cached llama-server for the embedder")
    # a few requests, and an SLO this shared 2-core box meets (the written one is a placeholder)
    small = exp.model_copy(
        update={
            "steps": exp.steps.model_copy(update={"concurrency": [1, 2]}),
            "requests_per_step": 4,
            "repeats": 2,
            "goal": exp.goal.model_copy(update={"slo": "e2e_p95<=60s"}),
        }
    )
    rec = TrialRunner(small, tmp_path / "run", progress=lambda s: None).run()
    assert all(rec.result(n).status == "ranked" for n in ("embedder-np1", "embedder-np4")), rec.results
    assert rec.decision.adopt in ("embedder-np1", "embedder-np4")
    assert rec.decision.differences[0].metric == "inputs_per_s"


def test_a_gguf_embedding_model_gets_a_llamacpp_embeddings_candidate(tmp_path: Path) -> None:
    gguf = tmp_path / "my-embedder.gguf"
    gguf.write_bytes(b"GGUF")  # advise only needs the path; the model is read from the catalog name below
    adv = advise("embedding", "all-minilm-l6-v2", "laptop-cpu", "8k", 4)
    adv = dataclasses.replace(adv, request=dataclasses.replace(adv.request, model_arg=str(gguf)))
    exp = load_experiment(write_experiment(adv, str(tmp_path / "g.yaml")))
    c = exp.candidates[0]
    assert c.engine == "llamacpp" and c.model == str(gguf)
    assert c.settings.extra_args == ["--embeddings", "--pooling", "mean"]  # type: ignore[attr-defined]


def test_cli_writes_a_valid_embeddings_experiment(tmp_path: Path) -> None:
    out = tmp_path / "cli.yaml"
    r = subprocess.run(
        [
            str(Path(sys.executable).with_name("servelab")),
            "advise",
            "--task",
            "embedding",
            "--model",
            "all-minilm-l6-v2",
            "--hardware",
            "laptop-cpu",
            "--write-experiment",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert "experiment written" in r.stdout + r.stderr
    assert load_experiment(out).goal.task_kind == "embeddings"
