"""Identity facts with their sources (issue 11 item 2): an ``engine: url`` candidate's record identity
is filled from what the server says (the mock answering TGI's ``/info`` as TGI documents it) plus what
the experiment declares; a launched candidate keeps the launcher's facts first."""

from __future__ import annotations

from pathlib import Path

import pytest

from servelab.engines.probe import Fact, ProbedIdentity
from servelab.trial.flow import TrialRunner
from servelab.trial.identity import Declared, merge_facts
from servelab.trial.spec import Experiment
from servelab.wire import ConfigError

DIGEST = "sha256:" + "ab" * 32


def _exp(cands: list[dict]) -> Experiment:
    return Experiment.model_validate(
        {
            "goal": {
                "slo": "ttft_p95<=5s",
                "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
                "mix": "short-qa:1",
            },
            "candidates": cands,
            "workloads": [{"name": "short-qa", "set": {"output_tokens": 4}}],
            "steps": {"concurrency": [1]},
            "requests_per_step": 2,
            "warmup": 0,
            "mix_sweep": False,
            "arrival_test": {"enabled": False},
            "capacity": {"enabled": False},
        }
    )


def test_url_candidate_identity_from_the_server_and_declared(mock_engine, tmp_path: Path) -> None:
    mp = mock_engine("--dialect", "tgi", "--model", "org/Model-7B", "--context-tokens", "2048")
    exp = _exp(
        [
            {
                "name": "remote",
                "engine": "url",
                "url": mp.base_url,
                "price_per_hour": 4.5,
                "declared": {
                    "image_digest": DIGEST,
                    "gpu_model": "NVIDIA H100 80GB HBM3",
                    "gpu_count": 2,
                    "tp": 2,
                    "pp": 1,
                    "dp": 1,
                },
            }
        ]
    )
    rec = TrialRunner(exp, tmp_path / "run", progress=lambda *_: None).run()
    ident = rec.identity.candidates["remote"]
    f = ident.facts
    assert f["engine_kind"].value == "tgi" and "GET /info" in f["engine_kind"].source
    assert f["model_id"] == Fact(value="org/Model-7B", source="GET /info")
    assert f["context_tokens"] == Fact(value=2048, source="GET /info")
    assert f["version"].source == "GET /info"
    assert f["image_digest"] == Fact(value=DIGEST, source="declared")
    assert f["gpu_count"] == Fact(value=2, source="declared") and f["tp_size"] == Fact(value=2, source="declared")
    assert f["price_per_hour"] == Fact(value=4.5, source="declared")
    assert ident.probe is not None and ident.probe.kind == "tgi"
    # the record round-trips with the facts (schema'd fields, not free dicts)
    again = type(rec).model_validate_json(rec.model_dump_json())
    assert again.identity.candidates["remote"].facts == f


def test_declared_refused_with_one_line() -> None:
    with pytest.raises((ConfigError, ValueError), match="image_digest"):
        _exp([{"name": "r", "engine": "url", "url": "http://127.0.0.1:9/v1", "declared": {"image_digest": "latest"}}])
    with pytest.raises((ConfigError, ValueError), match="tp"):
        _exp([{"name": "r", "engine": "url", "url": "http://127.0.0.1:9/v1", "declared": {"tp": 0}}])


def test_launcher_facts_first_then_probe_then_declared() -> None:
    engine = {"version": "11434.0.0", "build": "11434", "binary_sha256": "b" * 64, "devices": ["cpu"]}
    probed = ProbedIdentity(
        kind="llamacpp",
        answered=["GET /props"],
        facts={
            "build": Fact(value="b0-unknown", source="GET /props"),
            "slots": Fact(value=1, source="GET /props"),
            "tp_size": Fact(value=1, source="GET /get_server_info"),
        },
    )
    f = merge_facts(engine, probed, Declared(tp=2, gpu_count=0), price_per_hour=None)
    assert f["build"] == Fact(value="11434", source="launcher")  # the launcher knows the build number
    assert f["slots"].source == "GET /props" and f["devices"].value == "cpu"
    assert f["tp_size"].value == 1 and f["declared.tp_size"] == Fact(value=2, source="declared")  # disagreement kept
    assert f["gpu_count"] == Fact(value=0, source="declared")


def test_url_candidates_at_different_addresses_differ_by_address() -> None:
    """Two ``engine: url`` candidates with the same settings are two servers: the comparison names the
    address, not "no factor differs"; the same address twice differs in nothing; a launched engine's
    address (a port picked at launch) is not a factor."""
    from servelab.trial.decide import compare_identities, identity_factors
    from servelab.trial.results import CandidateIdentity

    a = CandidateIdentity(engine_kind="url", settings={"url": "http://10.0.0.1:8000/v1"}, url="http://10.0.0.1:8000/v1")
    b = CandidateIdentity(
        engine_kind="url", settings={"url": "http://10.0.0.2:8000/v1"}, url="http://10.0.0.2:8000/v1/"
    )
    c = compare_identities(a, b, "east", "west")
    assert c.differs_in == ["server.url"]
    assert c.details["server.url"] == ["http://10.0.0.1:8000/v1", "http://10.0.0.2:8000/v1"]
    assert "different servers" in c.note and "10.0.0.2" in c.note and "no factor differs" not in c.note
    same = compare_identities(a, a.model_copy(), "east", "east-again")
    assert same.differs_in == [] and same.note.startswith("no factor differs")
    launched = CandidateIdentity.model_validate(
        {
            "engine_kind": "llamacpp",
            "settings": {"parallel": 4, "port": 8081},
            "engine": {"kind": "llamacpp", "engine": "llama.cpp"},
            "url": "http://127.0.0.1:8081/v1",
        }
    )
    assert "server.url" not in identity_factors(launched)
