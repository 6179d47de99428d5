"""Engine catalog: every project the seeds name, every row sourced and dated, lifecycle evidence,
modalities kept apart, routes consistent, published JSON Schemas current."""

from __future__ import annotations

import datetime as dt
import json

import jsonschema
import pytest
import yaml

from servelab.catalog import find_engine, load_engines
from servelab.catalog.engines import ENGINES_FILE
from servelab.catalog.hardware import HARDWARE_FILE
from servelab.catalog.schema import DATA_DIR, FEATURES, PLATFORMS, PUBLISHED_SCHEMAS, EngineCatalog, load_yaml_catalog
from servelab.wire.errors import ConfigError

# 000 §1-§4: every project named there
NAMED = [
    "vllm",
    "sglang",
    "sglang-diffusion",
    "sglang-omni",
    "vllm-omni",
    "tensorrt-llm",
    "lmdeploy-turbomind",
    "lmdeploy-pytorch",
    "transformers",
    "tgi",
    "llama.cpp",
    "ollama",
    "mlx-lm",
    "ds4",
    "ktransformers",
    "onnxruntime-genai",
    "openvino-genai",
    "diffusers",
    "comfyui",
    "fastvideo",
    "faster-whisper",
    "whisper.cpp",
    "tei",
    "vllm-pooling",
    "dynamo",
    "ray-serve",
    "triton-server",
]


def test_every_named_project_present():
    assert set(NAMED) <= {e.name for e in load_engines()}


def test_every_raw_row_has_source_and_checked():
    raw = yaml.safe_load(ENGINES_FILE.read_text(encoding="utf-8"))["engines"]
    assert len(raw) >= len(NAMED)
    for row in raw:
        assert str(row.get("source", "")).startswith("http"), row["name"]
        assert isinstance(row.get("checked"), dt.date), row["name"]


@pytest.mark.parametrize("field", ["source", "checked"])
def test_row_missing_source_or_checked_fails_to_load(tmp_path, field):
    raw = yaml.safe_load(ENGINES_FILE.read_text(encoding="utf-8"))
    del raw["engines"][3][field]
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"engines\[3\]\.{field}: required field is missing"):
        load_yaml_catalog(p, EngineCatalog)


def test_non_active_lifecycle_needs_evidence(tmp_path):
    raw = yaml.safe_load(ENGINES_FILE.read_text(encoding="utf-8"))
    raw["engines"][0]["lifecycle"] = {"status": "maintenance"}
    p = tmp_path / "e.yaml"
    p.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match="needs note, source and checked"):
        load_yaml_catalog(p, EngineCatalog)


def test_tgi_not_for_new_platforms_with_date_and_source():
    tgi = find_engine("text-generation-inference")
    assert tgi.name == "tgi"
    lc = tgi.lifecycle
    assert lc.status == "archived" and not lc.for_new_platforms
    assert lc.since == dt.date(2026, 3, 21)
    assert "maintenance mode" in lc.note and lc.source.startswith("https://github.com/huggingface/")
    # everything else named by the seeds is active
    assert [e.name for e in load_engines() if not e.lifecycle.for_new_platforms] == ["tgi"]


def test_modalities_kept_apart():
    # 000 §4.2: audio in is not audio out; understanding video is not generating it
    assert find_engine("faster-whisper").input_modalities == ["audio"]
    assert "audio" not in find_engine("faster-whisper").output_modalities
    vllm = find_engine("vllm")
    assert "video" in vllm.input_modalities and "video" not in vllm.output_modalities
    assert "video" in find_engine("vllm-omni").output_modalities
    assert set(find_engine("tei").output_modalities) == {"embedding", "score"}


def test_layers_and_scopes():
    for name in ("dynamo", "ray-serve", "triton-server"):
        e = find_engine(name)
        assert e.model_scope == "backend" and "workflow-platform" in e.layers
    assert find_engine("ds4").model_scope == "families" and find_engine("ds4").model_families
    assert find_engine("whisper.cpp").model_families == ["whisper"]
    assert find_engine("diffusers").layers == ["pipeline-library"]
    # TurboMind and the PyTorch engine are separate rows (000 §4.1) with different coverage
    tm, pt = find_engine("lmdeploy-turbomind"), find_engine("lmdeploy-pytorch")
    assert tm.platforms != pt.platforms or tm.quantizations != pt.quantizations


def test_catalog_consistency():
    for e in load_engines():
        assert set(e.platforms) <= set(PLATFORMS)
        assert set(e.features.model_dump()) == set(FEATURES)
        for r in e.routes:
            assert r.task in e.tasks
        if e.serve_hint:
            e.serve_hint.format(model="m", tp=1, ctx=1, port=1, parallel=1, ctx_total=1)  # every placeholder is known
    # only engines servelab really launches carry a launch kind
    assert {e.name: e.launch for e in load_engines() if e.launch} == {"vllm": "vllm", "llama.cpp": "llamacpp"}


def test_unknown_engine_suggests_nearest():
    with pytest.raises(ConfigError, match=r"did you mean vllm"):
        find_engine("vlm")


def test_published_json_schemas_are_current_and_validate_the_data():
    assert [s.problem() for s in PUBLISHED_SCHEMAS] == [None, None]
    for data, schema in ((ENGINES_FILE, "engines.schema.json"), (HARDWARE_FILE, "hardware.schema.json")):
        doc = yaml.safe_load(data.read_text(encoding="utf-8"))
        doc = json.loads(json.dumps(doc, default=str))  # dates as strings, as an editor sees them
        jsonschema.validate(doc, json.loads((DATA_DIR / schema).read_text(encoding="utf-8")))
