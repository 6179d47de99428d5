"""Memory pitfalls of seed 003 §20 in the plan (issue 23 item 5): MTP / draft memory, utilization
without headroom, context x concurrency beyond the KV pool."""

from __future__ import annotations

import json

import pytest

from servelab.catalog import find_model
from servelab.cli import main
from servelab.plan import estimate
from servelab.plan.memory import weight_bytes_by_part, weight_bytes_per_param
from servelab.plan.pitfalls import UTILIZATION_HEADROOM_LIMIT, context_that_fits
from servelab.wire.errors import ConfigError

GIB = 2**30
# hardware as a dict (catalog numbers not assumed): 141 GiB, 4800 GB/s (H200 datasheet), and an 80 GiB part
H200 = {
    "name": "h200-test",
    "kind": "gpu",
    "memory_gib": 141,
    "memory_bandwidth_gbps": 4800,
    "dense_tflops": {"bf16": 989.0, "fp8": 1979.0},
    "max_per_node": 8,
}
H100 = {
    "name": "h100-test",
    "kind": "gpu",
    "memory_gib": 80,
    "memory_bandwidth_gbps": 3350,
    "dense_tflops": {"bf16": 989.0, "fp8": 1979.0},
    "max_per_node": 8,
}


def test_deepseek_v3_mtp_module_is_in_the_catalog_with_its_source() -> None:
    m = find_model("deepseek-v3")
    mtp = [c for c in m.components if c.role == "mtp"]
    assert len(mtp) == 1 and mtp[0].params == 11.5e9 and mtp[0].decoder_layers == 1
    assert any("MTP" in v for v in m.verified)  # where the 11.5B came from


def test_mtp_adds_its_weights_and_one_mla_layer_of_kv() -> None:
    base = estimate("deepseek-v3", H200, 8, 8192, 16, precision="native")
    mtp = estimate("deepseek-v3", H200, 8, 8192, 16, precision="native", speculative="mtp")
    # weights: 11.5e9 params x block-FP8 bytes / TP 8
    w = 11.5e9 * weight_bytes_per_param("fp8") / 8
    assert mtp.device.weights_bytes - base.device.weights_bytes == pytest.approx(w)
    # KV: 61 MLA layers -> 62; one layer = 8192 tokens x (512 + 64) x 2 bytes
    per_layer = 8192 * (512 + 64) * 2
    assert base.state_per_sequence["total_bytes"] == 61 * per_layer
    assert mtp.state_per_sequence["speculative_bytes"] == per_layer
    assert mtp.device.kv_needed_bytes == 16 * 62 * per_layer
    assert mtp.max_concurrent_sequences is not None and base.max_concurrent_sequences is not None
    assert mtp.max_concurrent_sequences < base.max_concurrent_sequences
    assert mtp.to_dict()["speculative"]["decoder_layers"] == 1
    # without --speculative the plan says the module exists and is not counted
    assert any("MTP module" in n and "not counted" in n for n in base.notes)
    assert not any("MTP module" in n for n in mtp.notes)


def test_draft_model_weights_and_kv_are_counted() -> None:
    base = estimate("llama-3.1-70b", H100, 4, 32768, 8)
    spec = estimate("llama-3.1-70b", H100, 4, 32768, 8, draft_model="llama-3.2-1b")
    draft = find_model("llama-3.2-1b")
    # draft KV per sequence at TP 4: 16 layers x 32768 tokens x 2 KV heads x (64 + 64) x 2 bytes
    kv = 16 * 32768 * 2 * 128 * 2
    assert spec.state_per_sequence["speculative_bytes"] == kv
    assert spec.device.kv_needed_bytes - base.device.kv_needed_bytes == 8 * kv
    assert spec.speculative is not None and spec.speculative.method == "draft"
    assert spec.speculative.weights_bytes == pytest.approx(sum(weight_bytes_by_part(draft, "bf16").values()) / 4)
    assert (spec.max_concurrent_sequences or 0) < (base.max_concurrent_sequences or 0)


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"speculative": "mtp"}, "no MTP module"),
        ({"speculative": "eagle"}, "unknown --speculative"),
        ({"speculative": "draft"}, "needs --draft-model"),
        ({"draft_model": "qwen3-0.6b"}, "vocabulary"),
        ({"speculative": "mtp", "draft_model": "llama-3.2-1b"}, "drop --draft-model"),
        ({"speculative": "draft", "draft_model": "llama-3.2-1b", "engine": "llamacpp"}, "vllm and sglang"),
    ],
)
def test_bad_speculative_input_is_one_line(kwargs: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError) as e:
        estimate("llama-3.1-70b", H100, 4, 8192, 1, **kwargs)  # type: ignore[arg-type]
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_utilization_above_the_limit_warns_with_the_gib_left() -> None:
    at = estimate("llama-3.1-8b", H100, 1, 8192, 4, gpu_memory_utilization=UTILIZATION_HEADROOM_LIMIT)
    assert at.warnings == []
    over = estimate("llama-3.1-8b", H100, 1, 8192, 4, gpu_memory_utilization=0.98)
    assert over.fits and len(over.warnings) == 1
    w = over.warnings[0]
    assert "0.98 > 0.95" in w and f"{80 * 0.02:.2f} GiB" in w
    assert over.to_dict()["warnings"] == [w]
    sg = estimate("llama-3.1-8b", H100, 1, 8192, 4, engine="sglang", gpu_memory_utilization=0.99)
    assert "mem_fraction_static" in sg.warnings[0]


def test_context_times_concurrency_beyond_the_pool_warns_with_a_context_that_fits() -> None:
    p = estimate("llama-3.1-8b", H100, 1, 131072, 8)
    assert not p.fits and p.max_concurrent_sequences is not None and 0 < p.max_concurrent_sequences < 8
    (w,) = p.warnings
    assert "131072 x concurrency 8 = 1048576 tokens" in w and "preempted" in w
    # the context it names fits 8 sequences and one more token does not (128 KiB per token, 16-token pages)
    fit = int(w.split("a context of ")[1].split()[0])
    assert estimate("llama-3.1-8b", H100, 1, fit, 8).fits
    assert not estimate("llama-3.1-8b", H100, 1, fit + 16, 8).fits
    fits = estimate("llama-3.1-8b", H100, 1, 8192, 8)
    assert fits.fits and fits.warnings == []


def test_one_sequence_beyond_the_pool_says_vllm_refuses_to_start() -> None:
    p = estimate("qwen3-32b", H100, 1, 40960, 2)
    assert p.max_concurrent_sequences == 0
    assert "vLLM refuses to start" in p.warnings[0]


def test_context_that_fits_bisects_a_monotone_state() -> None:
    assert context_that_fits(lambda t: 10.0 * t, 1000.0, 2, 10_000) == 50
    assert context_that_fits(lambda t: 10.0 * t, 5.0, 1, 10_000) == 0
    assert context_that_fits(lambda t: 1.0, 1e9, 1, 4096) == 4096


def test_cli_prints_warnings_and_json_carries_speculative(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(
            [
                "plan",
                "--model",
                "deepseek-v3",
                "--hardware",
                "H200:8",
                "--context",
                "8k",
                "--concurrency",
                "4",
                "--precision",
                "native",
                "--speculative",
                "mtp",
                "--gpu-memory-utilization",
                "0.97",
                "--json",
            ]
        )
    assert e.value.code == 0
    d = json.loads(capsys.readouterr().out)
    assert d["speculative"]["method"] == "mtp" and "0.97 > 0.95" in d["warnings"][0]
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "llama-3.1-8b", "--hardware", "H100:1", "--speculative", "mtp"])
    assert e.value.code == 2
    assert "no MTP module" in capsys.readouterr().err
