"""The models catalog: every row sourced and dated, numbers consistent with the publisher's totals."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import yaml

from servelab.catalog import find_model
from servelab.catalog.models import MODELS_FILE, PUBLISHED_SCHEMA, load_catalog, load_models
from servelab.plan.memory import params_by_part, total_params
from servelab.wire.errors import ConfigError

MODELS = load_models()


def test_catalog_has_the_required_models() -> None:
    names = {m.name for m in MODELS}
    for need in (
        "llama-3.1-8b",
        "llama-3.1-70b",
        "llama-3.1-405b",
        "llama-3.2-1b",
        "llama-3.2-3b",
        "qwen3-0.6b",
        "qwen3-8b",
        "qwen3-32b",
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "deepseek-v3",
        "deepseek-r1",
        "gemma-3-270m",
        "gemma-3-1b",
        "gemma-3-4b",
        "gemma-3-12b",
        "gemma-3-27b",
        "gpt-oss-20b",
        "gpt-oss-120b",
        "mistral-7b",
        "mixtral-8x7b",
        "glm-4.5",
        "kimi-k2",
        "nemotron-h-8b",
        "whisper-large-v3",
        "all-minilm-l6-v2",
        "qwen3-embedding-8b",
        "wan2.1-t2v-14b",
    ):
        assert need in names


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_every_row_has_source_and_checked(m) -> None:
    assert m.source.startswith("https://")
    assert dt.date(2025, 1, 1) <= m.checked <= dt.date.today()


def test_a_row_without_source_or_checked_fails_to_load(tmp_path: Path) -> None:
    raw = yaml.safe_load(MODELS_FILE.read_text())
    row = dict(raw["models"][0])
    for missing in ("source", "checked"):
        bad = {k: v for k, v in row.items() if k != missing}
        f = tmp_path / f"no-{missing}.yaml"
        f.write_text(yaml.safe_dump({"models": [bad]}))
        with pytest.raises(ConfigError, match=rf"models\[0\]\.{missing}: required field is missing; add it"):
            load_catalog(f)
    f = tmp_path / "bad-url.yaml"
    f.write_text(yaml.safe_dump({"models": [{**row, "source": "huggingface config"}]}))
    with pytest.raises(ConfigError, match="not an http"):
        load_catalog(f)


@pytest.mark.parametrize("m", MODELS, ids=lambda m: m.name)
def test_parameter_count_from_fields_matches_published(m) -> None:
    """A wrong layer count, width or expert count moves this sum by far more than 3 %."""
    computed = total_params(m)
    if m.kind == "diffusion":  # the published 14B is the DiT alone
        computed -= params_by_part(m)["components"]
    assert computed == pytest.approx(m.published_params.total, rel=0.03), (computed, m.published_params.total)


def test_layer_patterns() -> None:
    g = find_model("gemma-3-270m").architecture
    assert g.layer_mixers().count("full") == 3 and g.layer_mixers().count("sliding") == 15
    assert [i for i, x in enumerate(g.layer_mixers()) if x == "full"] == [5, 11, 17]
    o = find_model("gpt-oss-120b").architecture
    assert o.layer_mixers()[:4] == ["sliding", "full", "sliding", "full"] and o.layer_mixers().count("full") == 18
    n = find_model("nemotron-h-8b").architecture
    assert (n.layer_mixers().count("mamba2"), n.layer_mixers().count("full"), n.layer_ffns().count("dense")) == (
        24,
        4,
        24,
    )
    d = find_model("deepseek-v3").architecture
    assert d.layer_ffns()[:4] == ["dense", "dense", "dense", "moe"] and d.layer_ffns().count("moe") == 58


def test_find_model_by_alias_and_errors() -> None:
    assert find_model("Qwen/Qwen3-30B-A3B").name == "qwen3-30b-a3b"
    assert find_model("OPENAI/GPT-OSS-20B").name == "gpt-oss-20b"
    with pytest.raises(ConfigError, match=r"unknown model 'gemma-3-2b'.*did you mean gemma-3-"):
        find_model("gemma-3-2b")


def test_invalid_architecture_is_one_line(tmp_path: Path) -> None:
    raw = yaml.safe_load(MODELS_FILE.read_text())
    row = dict(raw["models"][0])
    row["architecture"] = {**row["architecture"], "attention": {"num_heads": 32, "num_kv_heads": 6, "head_dim": 128}}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"models": [row]}))
    with pytest.raises(ConfigError, match="num_kv_heads \\(6\\) must divide num_heads \\(32\\)"):
        load_catalog(f)


def test_published_json_schema_is_current() -> None:
    assert PUBLISHED_SCHEMA.problem() is None
