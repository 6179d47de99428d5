"""Readers: Hugging Face config.json fixtures (fixtures/configs/README.md cites each) and the real GGUF."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servelab.catalog import find_model
from servelab.catalog.readers import gguf_tensor_bytes, read_gguf, read_hf_config, read_model_file
from servelab.plan.kv import sequence_state
from servelab.plan.memory import total_params
from servelab.wire.errors import ConfigError

FIX = Path(__file__).parent / "fixtures" / "configs"


@pytest.mark.parametrize(
    "folder",
    [
        "llama-3.1-8b",
        "gemma-3-4b",
        "gemma-3-270m",
        "gpt-oss-20b",
        "deepseek-v3",
        "qwen3-30b-a3b",
        "mixtral-8x7b",
        "nemotron-h-8b",
    ],
)
def test_config_json_reads_to_the_catalog_architecture(folder: str) -> None:
    got = read_hf_config(FIX / folder)
    want = find_model(folder)
    ga, wa = got.architecture, want.architecture
    assert ga.layer_mixers() == wa.layer_mixers()
    assert ga.layer_ffns() == wa.layer_ffns()
    assert (ga.num_layers, ga.hidden_size, ga.vocab_size) == (wa.num_layers, wa.hidden_size, wa.vocab_size)
    assert ga.attention == wa.attention or ga.attention.model_dump(exclude={"sinks"}) == wa.attention.model_dump(
        exclude={"sinks"}
    )
    assert ga.mla == wa.mla and ga.ssm == wa.ssm and ga.moe == wa.moe
    for ctx in (1000, 40000):  # the KV a plan uses is the same whichever way the model came in
        assert sequence_state(got, ctx).total_bytes == sequence_state(want, ctx).total_bytes
    assert total_params(got) == pytest.approx(total_params(want), rel=0.01)


def test_config_details() -> None:
    ds = read_hf_config(FIX / "deepseek-v3" / "config.json")
    assert ds.native_dtype == "fp8"
    mtp = [c for c in ds.components if c.role == "mtp"]
    assert len(mtp) == 1 and 11e9 < mtp[0].params < 12.5e9  # published: 11.5B unique MTP parameters
    oss = read_hf_config(FIX / "gpt-oss-20b")
    assert oss.native_dtype == "mxfp4-experts" and oss.architecture.attention.sinks
    g4 = read_hf_config(FIX / "gemma-3-4b")
    assert any(c.role == "vision_encoder" for c in g4.components)
    assert any("text_config" in n for n in g4.notes)


def test_bad_config_files(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="is not JSON"):
        read_hf_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 8}))
    with pytest.raises(ConfigError, match="missing num_hidden_layers"):
        read_hf_config(tmp_path)
    with pytest.raises(ConfigError, match="neither a .gguf file"):
        read_model_file(tmp_path / "nope")


@pytest.fixture(scope="module")
def gemma_gguf() -> Path:
    from servelab.engines.llamacpp import default_model_path

    return default_model_path()


def test_real_gguf_reads_to_the_catalog_row(gemma_gguf: Path) -> None:
    got = read_gguf(gemma_gguf)
    want = find_model("gemma-3-270m")
    ga, wa = got.architecture, want.architecture
    assert ga.layer_mixers() == wa.layer_mixers()  # gemma3: llama.cpp's hard-coded period 6
    assert ga.attention.sliding_window == 512 and ga.attention.num_kv_heads == 1 and ga.attention.head_dim == 256
    assert (ga.num_layers, ga.hidden_size, ga.vocab_size, ga.ffn_intermediate, ga.max_context) == (
        18,
        640,
        262144,
        2048,
        32768,
    )
    assert ga.tie_word_embeddings  # no output.weight tensor
    assert find_model(str(gemma_gguf)).architecture == ga


def test_gguf_tensor_table(gemma_gguf: Path) -> None:
    t = gguf_tensor_bytes(gemma_gguf)
    # llama-server prints "file size = 235.16 MiB (7.36 BPW)" and "model params = 268.10 M" for this file
    assert t.total_bytes / 2**20 == pytest.approx(235.16, abs=0.005)
    assert t.total_elements / 1e6 == pytest.approx(268.10, abs=0.005)
    assert round(t.bits_per_weight, 2) == 7.36
    # and "type q4_K: 27 tensors, q6_K: 9, q5_0: 81, q8_0: 10, f32: 109"
    assert {k: v[0] for k, v in t.by_type.items()} == {"Q4_K": 27, "Q6_K": 9, "Q5_0": 81, "Q8_0": 10, "F32": 109}


_LLAMA = {
    "model_type": "llama",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
}


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"head_dim": "x"}, r"config\.json: a field has an unusable value .*'x'"),
        ({"num_attention_heads": 0}, "num_attention_heads is 0; it must be a positive integer"),
        (
            {"num_key_value_heads": 5},
            r"config\.json: architecture\.attention: num_kv_heads \(5\) must divide num_heads",
        ),
        ({"intermediate_size": None}, "missing intermediate_size"),
    ],
)
def test_unusable_config_values_are_one_line_errors(tmp_path: Path, patch: dict, match: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**_LLAMA, **patch}))
    with pytest.raises(ConfigError, match=match) as e:
        find_model(str(tmp_path))
    assert "Value error" not in str(e.value) and "\n" not in str(e.value)


def test_files_that_are_not_models(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"\xec\xfc\xcd\xab" * 8)
    with pytest.raises(ConfigError, match=r"is not a GGUF file \(first bytes"):
        find_model(str(fake))
    blob = tmp_path / "weights.bin"
    blob.write_bytes(b"\x00\x01\x02\x03" * 8)
    with pytest.raises(ConfigError, match="neither a GGUF file .* nor a config.json"):
        find_model(str(blob))
    with pytest.raises(ConfigError, match="model file .* not found; check the path"):
        find_model(str(tmp_path / "missing" / "x.gguf"))
