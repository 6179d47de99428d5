"""KV cache and sequence state by attention kind, and how each engine allocates it.

Per sequence of ``T`` tokens, per layer (``b`` = bytes per cache element):

* full attention, GQA/MHA: ``T * n_kv * (d_k + d_v) * b`` — K and V of every KV head (for d_k = d_v
  this is the usual ``2 * n_kv * d * b`` per token and layer; vLLM docs "Paged Attention",
  https://docs.vllm.ai/en/latest/design/paged_attention.html, read 2026-11-30).
* sliding window ``W``: ``min(T, W)`` tokens of the same size (Mistral 7B paper §2 "rolling buffer
  cache", https://arxiv.org/abs/2310.06825, read 2026-11-30). Engines keep a little more; see below.
* MLA: ``T * (kv_lora_rank + qk_rope_head_dim) * b`` — one latent + one shared RoPE key, no per-head
  K/V (DeepSeek-V2 §2.1.2, https://arxiv.org/abs/2405.04434; vLLM's MLA backend caches exactly this
  ``kv_lora_rank + qk_rope_head_dim`` wide entry, https://docs.vllm.ai/en/latest/api/vllm/attention/
  backends/mla/common.html, read 2026-11-30). A per-head K/V cache would be 71x larger for DeepSeek-V3.
* Mamba-2: constant per sequence, ``conv: (d_inner + 2*g*N) * (k-1) * b`` + ``ssm: H * P * N * b_state``
  (Mamba-2 paper §7, https://arxiv.org/abs/2405.21060; vLLM ``MambaStateShapeCalculator``,
  read 2026-11-30).
* cross-attention (Whisper decoder): ``encoder_tokens * n_kv * (d_k + d_v) * b`` per layer, constant.
* encoder-only and diffusion models keep no cache between steps: 0.

Engine allocation (what the engine reserves, which is what decides "fits"):

* ``vllm``: pages of ``block_size`` tokens (default 16 on CUDA: ``--block-size``,
  https://docs.vllm.ai/en/latest/configuration/engine_args.html, read 2026-11-30), so a sequence holds
  ``ceil(T/16)*16`` tokens per full layer; sliding layers keep ``ceil(W/16)*16 + 16`` tokens (the hybrid
  KV-cache manager frees blocks that left the window; https://docs.vllm.ai/en/latest/design/hybrid_kv_cache_manager.html,
  read 2026-11-30).
* ``sglang``: token-granular pool (``page_size`` default 1); sliding layers: ``W`` tokens (SWA pool).
* ``llamacpp``: allocated once at start from ``-c``/``-np``, whatever the requests; exact model in
  :mod:`servelab.plan.llamacpp`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.catalog.models import ModelEntry
from servelab.plan.memory import kv_bytes_per_element

ENGINES = ("vllm", "sglang", "llamacpp")


@dataclass(frozen=True)
class SequenceState:
    """Cache bytes of one sequence, by kind, on one device. ``growing_bytes`` scale with context
    (full/MLA layers, and sliding layers up to the window); ``constant_bytes`` do not (SSM state,
    cross-attention)."""

    full_bytes: float
    sliding_bytes: float
    mla_bytes: float
    ssm_bytes: float
    cross_bytes: float

    @property
    def total_bytes(self) -> float:
        """All cache bytes of the sequence."""
        return self.full_bytes + self.sliding_bytes + self.mla_bytes + self.ssm_bytes + self.cross_bytes

    def as_dict(self) -> dict[str, float]:
        """JSON-able by-kind dict (bytes)."""
        return {
            "full_attention_bytes": self.full_bytes,
            "sliding_window_bytes": self.sliding_bytes,
            "mla_bytes": self.mla_bytes,
            "ssm_state_bytes": self.ssm_bytes,
            "cross_attention_bytes": self.cross_bytes,
            "total_bytes": self.total_bytes,
        }


def kv_heads_per_device(num_kv_heads: int, tp: int) -> int:
    """KV heads one TP rank holds: ``num_kv_heads / tp``, or 1 when ``tp > num_kv_heads`` (vLLM
    replicates KV heads then: ``ModelConfig.get_num_kv_heads`` returns ``max(1, total // tp)``,
    https://docs.vllm.ai/en/latest/api/vllm/config/model.html, read 2026-11-30)."""
    return max(1, num_kv_heads // tp)


def tokens_held(engine: str | None, context_tokens: int, window: int | None) -> int:
    """Tokens of KV one layer keeps for a sequence of ``context_tokens`` under ``engine``'s paging
    (``window`` None = full attention). See the module docstring for each engine's rule."""
    if engine == "vllm":
        full = math.ceil(context_tokens / 16) * 16
        if window is None:
            return full
        return min(full, math.ceil(window / 16) * 16 + 16)
    return context_tokens if window is None else min(context_tokens, window)


def sequence_state(
    model: ModelEntry,
    context_tokens: int,
    kv_precision: str = "bf16",
    tp: int = 1,
    pp: int = 1,
    engine: str | None = None,
    state_precision: str | None = None,
) -> SequenceState:
    """Cache bytes of one sequence of ``context_tokens`` on one device of a ``tp`` x ``pp`` layout.

    TP splits KV heads (:func:`kv_heads_per_device`) and Mamba heads; an MLA latent is replicated on
    every TP rank (vLLM/SGLang without DP-attention). PP gives each stage ``ceil(L/pp)`` layers; the
    fullest stage is reported. ``state_precision`` (default = ``kv_precision``) is the SSM state dtype.
    """
    a = model.architecture
    if model.kind in ("encoder", "diffusion") or not a.causal:
        return SequenceState(0, 0, 0, 0, 0)
    b = kv_bytes_per_element(kv_precision)
    bs = kv_bytes_per_element(state_precision or kv_precision)
    mixers = a.layer_mixers()
    stage = math.ceil(len(mixers) / pp) / len(mixers)
    full = sliding = mla = ssm = cross = 0.0
    if a.attention is not None:
        at = a.attention
        per_tok = kv_heads_per_device(at.num_kv_heads, tp) * (at.head_dim + at.v_dim) * b
        n_full = mixers.count("full")
        n_sl = mixers.count("sliding")
        full = n_full * tokens_held(engine, context_tokens, None) * per_tok
        if n_sl:
            sliding = n_sl * tokens_held(engine, context_tokens, at.sliding_window) * per_tok
        if a.cross_attention_tokens:
            cross = len(mixers) * a.cross_attention_tokens * per_tok
    if a.mla is not None:
        m = a.mla
        per_token = (m.kv_lora_rank + m.qk_rope_head_dim) * b
        mla = mixers.count("mla") * tokens_held(engine, context_tokens, None) * per_token
    if a.ssm is not None:
        s = a.ssm
        heads = max(1, s.num_heads // tp)
        d_inner = heads * s.head_dim
        groups = max(1, s.n_groups // tp)
        conv = (d_inner + 2 * groups * s.d_state) * (s.conv_kernel - 1) * b
        state = heads * s.head_dim * s.d_state * bs
        ssm = mixers.count("mamba2") * (conv + state)
    return SequenceState(full * stage, sliding * stage, mla * stage, ssm * stage, cross * stage)


def kv_bytes_per_token(model: ModelEntry, kv_precision: str = "bf16") -> float:
    """Marginal cache bytes per extra token of context on one device at TP 1, counting every layer
    that grows with context (full and MLA layers; sliding layers only below their window)."""
    return sequence_state(model, 2, kv_precision).total_bytes - sequence_state(model, 1, kv_precision).total_bytes
