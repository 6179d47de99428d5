"""Capacity plans: fit/no-fit, layouts, bad input, CLI, and physical floors over the whole catalog."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from servelab.catalog import find_model
from servelab.catalog.models import load_models
from servelab.cli import main
from servelab.plan import Layout, estimate, smallest_fitting_layout
from servelab.plan.cli import parse_hardware, parse_tokens
from servelab.plan.memory import weight_bytes_by_part
from servelab.wire.errors import ConfigError

GIB = 2**30
# a hardware entry given as a dict (the fields of catalog/data/hardware.yaml), so these tests do not
# depend on the hardware catalog's numbers: 80 GiB, 3350 GB/s, 989 dense BF16 TFLOPS (H100 SXM datasheet)
H100 = {
    "name": "h100-test",
    "kind": "gpu",
    "memory_gib": 80,
    "memory_bandwidth_gbps": 3350,
    "dense_tflops": {"bf16": 989.0, "fp8": 1979.0},
    "max_per_node": 8,
}


def test_llama_8b_fits_one_gpu_with_hand_computed_pool() -> None:
    p = estimate("llama-3.1-8b", H100, 1, 8192, 16)
    assert p.fits
    d = p.device
    # weights: 8.03e9 params x 2 bytes
    assert d.weights_bytes == pytest.approx(8.03e9 * 2, rel=0.001)
    # KV: 16 sequences x 8192 tokens x 128 KiB
    assert d.kv_needed_bytes == 16 * 8192 * 131072
    # pool = 80 GiB x 0.9 - 0.5 GiB CUDA context - 0.5 GiB graphs - activations - weights; 1 GiB per sequence
    pool = 80 * GIB * 0.9 - 0.5 * GIB - 0.5 * GIB - d.activation_bytes - d.weights_bytes
    assert d.kv_pool_bytes == pytest.approx(pool)
    assert p.max_concurrent_sequences == int(pool // 2**30)
    # roofline: one decode step of 16 reads the weights once (minus the embedding table) + 16 GiB of KV
    floor = (d.weights_bytes - d.weights_by_part["embedding"] + 16 * 2**30) / 3350e9
    assert p.roofline.decode_memory_floor_s == pytest.approx(floor)


def test_does_not_fit_says_so_with_the_smallest_layout() -> None:
    p = estimate("llama-3.1-70b", H100, 1, 32768, 8)
    assert not p.fits and p.max_concurrent_sequences == 0
    assert "weights + activations + buffers need" in p.reasons[0]
    assert p.smallest_layout is not None and p.smallest_layout.tp == 4  # 141 GB of weights + 80 GiB KV
    assert estimate("llama-3.1-70b", H100, 4, 32768, 8, tp=4).fits
    assert not estimate("llama-3.1-70b", H100, 2, 32768, 8, tp=2).fits
    assert smallest_fitting_layout("llama-3.1-8b", H100, 8192, 1).devices == 1


def test_smallest_layout_spreads_sequences_over_replicas() -> None:
    # Qwen3-32B, 64 x 32k on H100s: 512 GiB of KV + 61 GiB of weights need > 8 devices. TP4 x DP3 (12 GPUs,
    # 22 sequences per replica: 15.3 + 44 GiB per device) fits; TP8 x PP2 (16) is not the smallest.
    p = estimate("qwen3-32b", H100, 2, 32768, 64)
    assert not p.fits and p.max_concurrent_sequences == 9
    assert p.smallest_layout == Layout(tp=4, pp=1, dp=3)
    assert estimate("qwen3-32b", H100, 12, 32768, 64, tp=4, dp=3).fits
    assert not any(
        estimate("qwen3-32b", H100, n, 32768, 64, tp=t, dp=n // t).fits
        for n in range(2, 12)
        for t in (1, 2, 4, 8)
        if n % t == 0
    )
    # a model-parallel group stays a power of two: 405B bf16 still needs TP8 x PP2
    assert estimate("llama-3.1-405b", H100, 1, 8192, 1).smallest_layout == Layout(tp=8, pp=2, dp=1)


def test_moe_memory_counts_all_experts_and_ep_splits_them() -> None:
    m = find_model("qwen3-235b-a22b")
    p8 = estimate(m, H100, 8, 8192, 1, precision="fp8", tp=8)
    w = weight_bytes_by_part(m, "fp8")
    assert p8.device.weights_by_part["moe_experts"] == pytest.approx(w["moe_experts"] / 8)
    pe = estimate(m, H100, 8, 8192, 1, precision="fp8", tp=4, dp=2, ep=8)
    assert pe.device.weights_by_part["moe_experts"] == pytest.approx(w["moe_experts"] / 8)
    assert pe.device.weights_by_part["attention"] == pytest.approx(w["attention"] / 4)


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"tp": 3}, "TP 3 does not divide the 32 attention heads"),
        ({"tp": 8, "pp": 2}, "needs 16 devices but --hardware gives 8"),
        ({"ep": 2}, "has no MoE layers"),
        ({"engine": "tgi"}, "unknown --engine"),
        ({"precision": "fp6"}, "unknown weight precision"),
        ({"pp": 40, "tp": 1}, "more stages than the 32 layers"),
    ],
)
def test_bad_layouts_are_one_line_errors(kwargs: dict, msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        estimate("llama-3.1-8b", H100, 8, 4096, 1, **kwargs)


def test_parse_helpers() -> None:
    assert parse_tokens("32k") == 32768 and parse_tokens("5000") == 5000 and parse_tokens("1m") == 2**20
    assert parse_hardware("H200:8") == ("H200", 8) and parse_hardware("H200") == ("H200", 1)
    with pytest.raises(ConfigError):
        parse_tokens("lots")
    with pytest.raises(ConfigError):
        parse_hardware("H200:0")


def test_cli_json_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(
            [
                "plan",
                "--model",
                "qwen3-8b",
                "--hardware",
                "H100-80GB-SXM:2",
                "--context",
                "32k",
                "--concurrency",
                "4",
                "--json",
            ]
        )
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fits"] and out["layout"]["tp"] == 2 and out["context_tokens"] == 32768
    # KV: 36 layers x 8 heads x 256 x 2 bytes per token, split over TP 2, x 32768 x 4
    assert out["per_device"]["kv_needed_bytes"] == 36 * 8 * 256 * 2 // 2 * 32768 * 4
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "llama-3.1-8b", "--hardware", "H100-80GB-SXM:3", "--concurrency", "1", "--tp", "3"])
    assert e.value.code == 2
    assert "TP 3 does not divide the 32 attention heads" in capsys.readouterr().err
    # without --tp, 3 devices are not an error about a TP 3 nobody asked for: TP1 x DP3, said so
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "llama-3.1-8b", "--hardware", "H100-80GB-SXM:3", "--json"])
    assert e.value.code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layout"] == {"tp": 1, "pp": 1, "dp": 3, "ep": None, "devices": 3}
    assert "TP3 is not possible" in out["notes"][0]
    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "llama-3.1-405b", "--hardware", "H100-80GB-SXM", "--context", "8k"])
    assert e.value.code == 1
    text = capsys.readouterr().out
    assert "DOES NOT FIT" in text and "smallest layout that fits: TP8 x PP2" in text


DECODERS = [m for m in load_models() if m.kind in ("decoder", "encoder-decoder")]


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    idx=st.integers(0, len(DECODERS) - 1),
    ctx=st.integers(1, 200_000),
    conc=st.integers(1, 512),
    extra=st.integers(1, 50_000),
    prec=st.sampled_from(["bf16", "fp8", "int4", "native"]),
)
def test_no_estimate_beats_physics_and_memory_is_monotonic(
    idx: int, ctx: int, conc: int, extra: int, prec: str
) -> None:
    m = DECODERS[idx]
    p = estimate(m, H100, 1, ctx, conc, precision=prec, find_smallest=False)
    w = weight_bytes_by_part(m, prec)
    dense = sum(w.values()) - w["moe_experts"] - w["embedding"] - w["components"]
    # decode: every non-expert weight is read once per step; at least the active experts too
    assert p.roofline.decode_step_s >= dense / 3350e9
    assert p.roofline.decode_step_s * 3350e9 >= p.roofline.bytes_per_step * (1 - 1e-9)
    # decode and prefill are at least 2 FLOPs per active parameter per token at peak
    from servelab.plan.memory import active_params

    peak = 1979e12 if prec == "fp8" else 989e12  # FP8 weights may run on FP8 tensor cores
    assert p.roofline.decode_step_s >= 2 * active_params(m) * conc / peak * (1 - 1e-9)
    assert p.roofline.prefill_s >= 2 * active_params(m) * p.context_tokens / peak * (1 - 1e-9)  # as planned
    # more context or more sequences never needs less memory nor allows more sequences
    longer = estimate(m, H100, 1, ctx + extra, conc, precision=prec, find_smallest=False)
    more = estimate(m, H100, 1, ctx, conc + extra, precision=prec, find_smallest=False)
    assert longer.device.needed_bytes >= p.device.needed_bytes
    assert more.device.needed_bytes >= p.device.needed_bytes
    if p.max_concurrent_sequences is not None and longer.max_concurrent_sequences is not None:
        assert longer.max_concurrent_sequences <= p.max_concurrent_sequences
    assert (not p.fits) or p.device.needed_bytes <= p.device.capacity_bytes


def test_encoder_models_are_planned_at_their_own_length_limit() -> None:
    # Whisper's decoder stops at 448 tokens (max_target_positions): 8k of decoder KV per request is not a
    # thing any engine allocates; the plan says so and uses 448
    p = estimate("whisper-large-v3", "L4", 1, 8192, 4)
    assert p.context_tokens == 448 and "at most 448 decoder tokens" in p.notes[0]
    assert p.state_per_sequence["full_attention_bytes"] == pytest.approx(
        estimate("whisper-large-v3", "L4", 1, 448, 4).state_per_sequence["full_attention_bytes"]
    )


def test_tp_above_kv_heads_replicates_kv_heads_and_their_weights() -> None:
    # Llama-3.1-8B has 8 KV heads: TP16 is allowed (vLLM replicates KV heads), each rank keeps one KV head
    m = find_model("llama-3.1-8b")
    p8, p16 = (estimate(m, H100, n, 8192, 1, tp=n) for n in (8, 16))
    assert p16.state_per_sequence["total_bytes"] == p8.state_per_sequence["total_bytes"]  # 1 KV head per rank
    # weights: Q and O split 16 ways, the K/V projections only 8 ways (4096 x 1024 x 2 per layer, bf16)
    h, layers = 4096, 32
    q_o, kv = 2 * h * h * layers * 2, 2 * h * 1024 * layers * 2
    assert p16.device.weights_by_part["attention"] == pytest.approx(q_o / 16 + kv / 8)
    assert p8.device.weights_by_part["attention"] == pytest.approx((q_o + kv) / 8)
    with pytest.raises(ConfigError, match="TP 64 does not divide the 32 attention heads"):
        estimate(m, H100, 64, 8192, 1, tp=64)
