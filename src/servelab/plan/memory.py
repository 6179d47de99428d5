"""Parameter counts by part and weight bytes by precision.

Parameter formulas (matrices only; biases and norm vectors are < 0.1 % and left out), from the layer
definitions in transformers' modeling files (https://github.com/huggingface/transformers, read
2026-11-30) and the papers named per part:

* GQA/MHA attention: ``h*(n_q*d) + 2*h*(n_kv*d) + (n_q*d_v)*h`` (Q, K, V, O projections).
* MLA (DeepSeek-V2 §2.1, https://arxiv.org/abs/2405.04434): ``h*r_q + r_q*n*(d_nope+d_rope)`` (or
  ``h*n*(d_nope+d_rope)`` without ``q_lora_rank``) ``+ h*(r_kv+d_rope) + r_kv*n*(d_nope+d_v) + n*d_v*h``.
* Mamba-2 (https://arxiv.org/abs/2405.21060): ``in_proj h*(2*d_inner + 2*g*N + n_heads)``, depthwise conv
  ``(d_inner + 2*g*N)*k``, ``out_proj d_inner*h``.
* FFN: gated (SwiGLU/GeGLU) ``3*h*f``, plain ``2*h*f``; MoE layer: ``E*3*h*f_e + S*3*h*f_s + h*E`` (router).
* Embeddings ``V*h``; LM head another ``V*h`` unless tied.

The published totals in the catalog are checked against these sums by tests/catalog/test_models.py.

Bytes per weight (``BYTES_PER_WEIGHT``), with their layouts:

* ``fp32`` 4, ``bf16``/``fp16`` 2.
* ``fp8``: 1 byte + one FP32 scale per 128x128 block (DeepSeek-V3 ``weight_block_size``;
  https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json, read 2026-11-30) = 1 + 4/16384.
* ``int8``: 1 byte + per-output-channel FP16 scale (negligible, counted as 1).
* ``int4`` (AWQ/GPTQ, group 128): 0.5 byte + FP16 scale + 4-bit zero per 128 weights = 0.5 + 2.5/128.
* ``mxfp4``: 4-bit E2M1 + one 8-bit E8M0 scale per 32 = 4.25 bits (OCP Microscaling Formats v1.0,
  https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf, read 2026-11-30).
* ``nvfp4``: 4-bit E2M1 + one FP8 E4M3 scale per 16 = 4.5 bits (NVIDIA,
  https://developer.nvidia.com/blog/introducing-nvfp4-for-efficient-and-accurate-low-precision-inference/,
  read 2026-11-30).
* GGUF block types from ggml's block layouts (``gguf.GGML_QUANT_SIZES``): ``q8_0`` 34 B / 32 = 8.5 bits,
  ``q6_k`` 210 B / 256 = 6.5625, ``q5_k`` 176/256 = 5.5, ``q4_k`` 144/256 = 4.5, ``q4_0`` 18/32 = 4.5,
  ``q3_k`` 110/256 = 3.4375, ``q2_k`` 84/256 = 2.625. A GGUF *file type* mixes block types per tensor:
  ``q4_k_m`` averages 4.8944 bits/weight on Llama-3.1-8B, ``q5_k_m`` 5.7036, ``q8_0`` 8.5008
  (llama.cpp ``tools/quantize/README.md``, build 11434, read 2026-11-30); those averages are used for
  a catalog model, the exact tensor table for a real GGUF file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.catalog.params import (
    PARTS,
    active_params,
    attention_params,
    cross_attention_params,
    ffn_params,
    layer_params,
    params_by_part,
    total_params,
)
from servelab.wire.errors import ConfigError

__all__ = [
    "PARTS",
    "active_params",
    "attention_params",
    "cross_attention_params",
    "ffn_params",
    "layer_params",
    "params_by_part",
    "total_params",
    "weight_bytes_by_part",
    "weight_bytes_per_param",
    "kv_bytes_per_element",
    "mtp_bytes",
]

if TYPE_CHECKING:
    from servelab.catalog.models import ModelEntry

BYTES_PER_WEIGHT: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0 + 4.0 / (128 * 128),
    "int8": 1.0,
    "int4": 0.5 + 2.5 / 128,
    "awq": 0.5 + 2.5 / 128,
    "gptq": 0.5 + 2.5 / 128,
    "mxfp4": 4.25 / 8,
    "nvfp4": 4.5 / 8,
    "q8_0": 8.5 / 8,
    "q6_k": 6.5625 / 8,
    "q5_k": 5.5 / 8,
    "q4_k": 4.5 / 8,
    "q4_0": 4.5 / 8,
    "q3_k": 3.4375 / 8,
    "q2_k": 2.625 / 8,
    "q4_k_m": 4.8944 / 8,
    "q4_k_s": 4.6672 / 8,
    "q5_k_m": 5.7036 / 8,
    "q5_k_s": 5.5704 / 8,
    "q3_k_m": 3.9960 / 8,
    "q2_k_gguf": 3.1593 / 8,
}

#: Bytes per KV-cache element by cache dtype (``q8_0``/``q4_0`` are llama.cpp block types:
#: 34 B / 32 and 18 B / 32).
KV_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "f16": 2.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
    "q8_0": 34 / 32,
    "q5_0": 22 / 32,
    "q4_0": 18 / 32,
}


def weight_bytes_per_param(precision: str) -> float:
    """Bytes per stored weight for ``precision`` (see the module docstring). Raises ConfigError."""
    p = precision.lower()
    if p not in BYTES_PER_WEIGHT:
        raise ConfigError(f"unknown weight precision {precision!r}; use one of {', '.join(sorted(BYTES_PER_WEIGHT))}")
    return BYTES_PER_WEIGHT[p]


def kv_bytes_per_element(precision: str) -> float:
    """Bytes per KV-cache element for ``precision`` (fp16/bf16 2, fp8 1, q8_0 1.0625 ...). Raises ConfigError."""
    p = precision.lower()
    if p not in KV_BYTES:
        raise ConfigError(f"unknown KV-cache precision {precision!r}; use one of {', '.join(sorted(KV_BYTES))}")
    return KV_BYTES[p]


def weight_bytes_by_part(model: ModelEntry, precision: str) -> dict[str, float]:
    """Bytes of each part at ``precision`` (``native`` = as the publisher ships it).

    Rules: the chosen precision applies to every linear layer of the backbone (attention, SSM, FFN,
    experts); embeddings and LM head stay 16-bit except for GGUF types (llama.cpp quantizes
    ``token_embd`` too) and ``fp32`` models; components keep 16-bit (encoders/VAE are rarely
    quantized). ``native``: ``fp8`` models (DeepSeek, Kimi K2) store linear layers in block FP8 and
    embeddings in BF16; ``mxfp4-experts`` (gpt-oss) stores routed experts in MXFP4, the rest in BF16.
    Raises ConfigError for an unknown precision.
    """
    p = params_by_part(model)
    prec = precision.lower()
    if prec == "native":
        native = model.native_dtype
        lin = {"fp8": "fp8", "mxfp4-experts": "bf16"}.get(native, native)
        experts = "mxfp4" if native == "mxfp4-experts" else lin
        emb = "fp32" if native == "fp32" else "bf16"
    else:
        lin = experts = prec
        gguf = prec.startswith("q")
        emb = prec if gguf else ("fp32" if prec == "fp32" else "bf16")
    b_lin, b_exp, b_emb = (weight_bytes_per_param(x) for x in (lin, experts, emb))
    comp = "fp32" if model.native_dtype == "fp32" else "bf16"
    return {
        "embedding": p["embedding"] * b_emb,
        "lm_head": p["lm_head"] * b_emb,
        "attention": p["attention"] * b_lin,
        "ssm": p["ssm"] * b_lin,
        "dense_ffn": p["dense_ffn"] * b_lin,
        "moe_experts": p["moe_experts"] * b_exp,
        "moe_shared": p["moe_shared"] * b_lin,
        "components": p["components"] * weight_bytes_per_param(comp),
    }


def mtp_bytes(model: ModelEntry, precision: str) -> float:
    """Bytes of the MTP/draft components at ``precision`` (0 when the model has none)."""
    prec = (
        "fp8"
        if precision == "native" and model.native_dtype == "fp8"
        else ("bf16" if precision == "native" else precision)
    )
    return sum(c.params for c in model.components if c.role in ("mtp", "draft")) * weight_bytes_per_param(prec)
