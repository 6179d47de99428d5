"""KV cache / sequence state per attention kind, against arithmetic written out from published configs."""

from __future__ import annotations

import pytest

from servelab.catalog import find_model
from servelab.plan.kv import kv_bytes_per_token, sequence_state, tokens_held
from servelab.plan.memory import weight_bytes_by_part
from servelab.plan.roofline import expected_distinct_experts

BF16 = 2


def test_gqa_llama_3_1_8b() -> None:
    m = find_model("llama-3.1-8b")
    # 2 (K and V) x 32 layers x 8 KV heads x 128 head dim x 2 bytes = 131072 bytes = 128 KiB per token
    assert kv_bytes_per_token(m) == 2 * 32 * 8 * 128 * BF16 == 131072
    assert sequence_state(m, 8192).total_bytes == 8192 * 131072 == 2**30  # 1 GiB at 8k
    # TP 8: each rank holds 8/8 = 1 KV head; TP 2: 4 heads
    assert sequence_state(m, 8192, tp=8).total_bytes == 2**30 / 8
    assert sequence_state(m, 8192, tp=2).total_bytes == 2**30 / 2
    # fp8 cache halves it
    assert sequence_state(m, 8192, kv_precision="fp8").total_bytes == 2**29
    # vLLM pages of 16 tokens: 8190 tokens occupy 512 blocks = 8192 token slots
    assert sequence_state(m, 8190, engine="vllm").total_bytes == 2**30
    # PP 2: each stage holds 16 of the 32 layers
    assert sequence_state(m, 8192, pp=2).total_bytes == 2**29


def test_kv_heads_replicated_when_tp_exceeds_them() -> None:
    m = find_model("qwen3-30b-a3b")  # 4 KV heads, 32 query heads
    one_head = 48 * 1 * 2 * 128 * BF16  # layers x heads per rank x (K+V) x dim x bytes
    assert sequence_state(m, 1, tp=4).total_bytes == one_head
    assert sequence_state(m, 1, tp=8).total_bytes == one_head  # 8 ranks, 4 heads: replicated, still 1 per rank


def test_mha_whisper_decoder_with_cross_attention() -> None:
    m = find_model("whisper-large-v3")
    # self-attention: 32 layers x 20 heads x 64 dim x 2 (K,V) x 2 bytes = 163840 bytes per token (MHA: n_kv = n_q)
    # cross-attention: the same per encoder frame, 1500 frames, constant per sequence
    st = sequence_state(m, 448, kv_precision="fp16")
    assert st.full_bytes == 448 * 32 * 20 * 64 * 2 * 2
    assert st.cross_bytes == 1500 * 32 * 20 * 64 * 2 * 2 == 245_760_000


def test_mla_deepseek_v3() -> None:
    m = find_model("deepseek-v3")
    # (kv_lora_rank 512 + qk_rope_head_dim 64) x 61 layers x 2 bytes = 70272 bytes per token
    assert kv_bytes_per_token(m) == (512 + 64) * 61 * BF16 == 70272
    # a per-head K/V cache, 128 heads x (K 128+64, V 128), would be 128*320/576 = 71.1x larger
    gqa = 61 * 128 * (192 + 128) * BF16
    assert gqa / 70272 == pytest.approx(71.1, rel=0.001)
    # the latent is not split by TP: every rank holds all of it
    assert sequence_state(m, 1000, tp=8).total_bytes == sequence_state(m, 1000).total_bytes == 1000 * 70272


def test_sliding_window_gemma_3_270m() -> None:
    m = find_model("gemma-3-270m")
    per_layer_token = 1 * (256 + 256) * BF16  # 1 KV head, K 256 + V 256, 2 bytes = 1024 bytes
    st = sequence_state(m, 8192)
    assert st.sliding_bytes == 15 * 512 * per_layer_token  # 15 local layers hold min(8192, 512) tokens
    assert st.full_bytes == 3 * 8192 * per_layer_token  # 3 global layers hold all 8192
    assert sequence_state(m, 300).sliding_bytes == 15 * 300 * per_layer_token  # below the window: all tokens
    # vLLM keeps the window rounded up to its 16-token blocks plus one block: 512 + 16
    assert tokens_held("vllm", 8192, 512) == 528
    assert sequence_state(m, 8192, engine="vllm").sliding_bytes == 15 * 528 * per_layer_token


def test_sliding_window_gpt_oss_alternating() -> None:
    m = find_model("gpt-oss-20b")
    per = 8 * (64 + 64) * BF16  # 8 KV heads x (K 64 + V 64) x 2 bytes = 2048 bytes per token and layer
    st = sequence_state(m, 32768)
    assert st.sliding_bytes == 12 * 128 * per and st.full_bytes == 12 * 32768 * per


def test_hybrid_ssm_nemotron_h() -> None:
    m = find_model("nemotron-h-8b")
    # Mamba-2 layer: d_inner = 128 heads x 64 = 8192; conv state (8192 + 2*8*128) x (4-1) x 2 bytes = 61440;
    # SSM state 128 x 64 x 128 x 2 bytes = 2097152; 24 such layers, constant in context
    ssm = 24 * ((8192 + 2 * 8 * 128) * 3 * BF16 + 128 * 64 * 128 * BF16)
    assert ssm == 51_806_208
    for ctx in (1, 8192):
        st = sequence_state(m, ctx)
        assert st.ssm_bytes == ssm
        assert st.full_bytes == 4 * ctx * 8 * (128 + 128) * BF16  # only 4 attention layers grow


def test_encoder_and_diffusion_keep_no_cache() -> None:
    assert sequence_state(find_model("all-minilm-l6-v2"), 512).total_bytes == 0
    assert sequence_state(find_model("wan2.1-t2v-14b"), 32760).total_bytes == 0


def test_moe_all_experts_in_memory_active_for_bandwidth() -> None:
    m = find_model("mixtral-8x7b")
    w = weight_bytes_by_part(m, "bf16")
    # all 8 experts of 32 layers are stored: 8 x 3 x 4096 x 14336 x 32 params (+ router) x 2 bytes
    assert w["moe_experts"] == pytest.approx((8 * 3 * 4096 * 14336 + 4096 * 8) * 32 * BF16)
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2)  # one token reads its 2 experts
    assert expected_distinct_experts(8, 2, 64) == pytest.approx(8, rel=1e-6)  # a batch of 64 touches all


def test_weight_precision_bytes() -> None:
    m = find_model("gpt-oss-20b")
    native = weight_bytes_by_part(m, "native")
    # experts: 24 layers x 32 experts x 3 x 2880 x 2880 params at MXFP4 = 4.25 bits/weight (+ router in the same part)
    assert native["moe_experts"] == pytest.approx(24 * (32 * 3 * 2880 * 2880 + 2880 * 32) * 4.25 / 8)
    assert native["attention"] == pytest.approx(24 * (2880 * 64 * 64 + 2880 * 8 * 128 + 64 * 64 * 2880) * BF16)
    ds = weight_bytes_by_part(find_model("deepseek-v3"), "native")  # FP8 + one fp32 scale per 128x128 block
    assert ds["attention"] / weight_bytes_by_part(find_model("deepseek-v3"), "bf16")["attention"] == pytest.approx(
        (1 + 4 / 16384) / 2
    )
