"""Parameter counts of a catalog model, part by part, from its architecture fields.

These are facts of the model (the catalog's readers check them against published totals), so they
live with the catalog; :mod:`servelab.plan` turns them into bytes and times. Counting rules follow the
published module shapes: gated FFN = 3 matrices (gate, up, down), MLA per DeepSeek-V2 (arXiv:2405.04434,
§2.1, checked 2026-11-30), Mamba-2 in_proj/conv/out_proj per Dao & Gu 2024 (arXiv:2405.21060, checked
2026-11-30). Norm weights and biases are left out (< 0.1 % of any catalog model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.catalog.models import Architecture, ModelEntry

#: Parts of the weights, as reported in a plan.
PARTS = ("embedding", "lm_head", "attention", "ssm", "dense_ffn", "moe_experts", "moe_shared", "components")


def attention_params(a: Architecture, mixer: str) -> int:
    """Parameters of one layer's token mixer of kind ``mixer`` (full/sliding/mla/mamba2/none)."""
    h = a.hidden_size
    if mixer in ("full", "sliding"):
        at = a.attention
        assert at is not None
        q = h * at.num_heads * at.head_dim
        kv = h * at.num_kv_heads * (at.head_dim + at.v_dim)
        return q + kv + at.num_heads * at.v_dim * h
    if mixer == "mla":
        m = a.mla
        assert m is not None
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        q = h * m.q_lora_rank + m.q_lora_rank * m.num_heads * qk if m.q_lora_rank else h * m.num_heads * qk
        kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * m.num_heads * (
            m.qk_nope_head_dim + m.v_head_dim
        )
        return q + kv + m.num_heads * m.v_head_dim * h
    if mixer == "mamba2":
        s = a.ssm
        assert s is not None
        gn = 2 * s.n_groups * s.d_state
        return h * (2 * s.d_inner + gn + s.num_heads) + (s.d_inner + gn) * s.conv_kernel + s.d_inner * h
    return 0


def cross_attention_params(a: Architecture) -> int:
    """Cross-attention projections per layer (Whisper decoder, DiT text conditioning): Q/K/V/O of h x h."""
    if not a.cross_attention_tokens or a.attention is None:
        return 0
    at = a.attention
    return 2 * a.hidden_size * at.num_heads * at.head_dim + 2 * a.hidden_size * at.num_kv_heads * at.head_dim


def ffn_params(a: Architecture, ffn: str) -> tuple[int, int, int]:
    """(dense, routed-experts total, shared-experts) parameters of one layer's FFN of kind ``ffn``."""
    h = a.hidden_size
    mats = 3 if a.ffn_gated else 2
    if ffn == "dense":
        assert a.ffn_intermediate is not None
        return mats * h * a.ffn_intermediate, 0, 0
    if ffn == "moe":
        m = a.moe
        assert m is not None
        routed = m.num_experts * mats * h * m.expert_intermediate + h * m.num_experts
        shared = m.shared_experts * mats * h * (m.shared_intermediate or m.expert_intermediate)
        return 0, routed, shared
    return 0, 0, 0


def layer_params(a: Architecture, index: int) -> int:
    """All parameters of layer ``index`` (mixer + cross-attention + FFN)."""
    mixer = a.layer_mixers()[index]
    d, r, s = ffn_params(a, a.layer_ffns()[index])
    return attention_params(a, mixer) + cross_attention_params(a) + d + r + s


def params_by_part(model: ModelEntry) -> dict[str, float]:
    """Parameter count of each part of :data:`PARTS` (``components`` = all extra components loaded by
    default: vision/audio/text encoders, VAE, MTP...)."""
    a = model.architecture
    out = dict.fromkeys(PARTS, 0.0)
    out["embedding"] = float(a.vocab_size * a.hidden_size + a.position_embeddings * a.hidden_size)
    untied = not a.tie_word_embeddings and model.kind in ("decoder", "encoder-decoder")
    out["lm_head"] = float(a.vocab_size * a.hidden_size) if untied else 0.0
    for mixer, ffn in zip(a.layer_mixers(), a.layer_ffns(), strict=True):
        key = "ssm" if mixer == "mamba2" else "attention"
        out[key] += attention_params(a, mixer) + cross_attention_params(a)
        d, r, s = ffn_params(a, ffn)
        out["dense_ffn"] += d
        out["moe_experts"] += r
        out["moe_shared"] += s
    out["components"] = float(sum(c.params for c in model.components if c.in_memory and c.role != "mtp"))
    return out


def total_params(model: ModelEntry, include_mtp: bool = False) -> float:
    """Total parameters (backbone + components loaded by default; MTP only with ``include_mtp``)."""
    n = sum(params_by_part(model).values())
    if include_mtp:
        n += sum(c.params for c in model.components if c.role == "mtp")
    return n


def active_params(model: ModelEntry) -> float:
    """Parameters that take part in one token's forward pass, excluding the input embedding table
    (only one row of it is read per token), i.e. attention + SSM + dense FFN + shared experts +
    ``experts_per_token/num_experts`` of the routed experts + LM head. This is how OpenAI counts
    gpt-oss's 3.6B/5.1B active; DeepSeek's 37B includes the 0.9B LM head the same way."""
    p = params_by_part(model)
    a = model.architecture
    routed = p["moe_experts"]
    if a.moe is not None:
        routed *= a.moe.experts_per_token / a.moe.num_experts
    return p["attention"] + p["ssm"] + p["dense_ffn"] + p["moe_shared"] + routed + p["lm_head"]
