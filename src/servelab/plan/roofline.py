"""Roofline floors: no engine can beat these on the given hardware.

* Decode step (one token for each of ``B`` sequences) reads every weight it uses once for the whole
  batch and each sequence's cache once, so ``t_step >= bytes_read / (bandwidth * tp)`` and, doing
  ``2 * active_params * B`` FLOPs, ``t_step >= 2*N_active*B / (peak * tp)`` (Williams, Waterman &
  Patterson, "Roofline", CACM 2009, https://doi.org/10.1145/1498765.1498785; applied to LLM decode in
  Pope et al., "Efficiently Scaling Transformer Inference", https://arxiv.org/abs/2211.05102 §2;
  read 2026-11-30). Pipeline stages run one after the other for a token, so PP adds no bandwidth.
* MoE weights read per step: dense parts + the distinct experts the batch touches. With uniform
  routing a layer's expert is untouched by one token with probability ``1 - k/E``, so the expected
  distinct experts for ``B`` tokens is ``E * (1 - (1 - k/E)^B)`` (all E soon after B ~ E/k).
* Prefill of ``T`` tokens: ``2 * N_active * T`` FLOPs for the matrices (Kaplan et al. 2020,
  https://arxiv.org/abs/2001.08361 §2.1) + attention scores and values: causal full attention
  ``2 * n_q * (d_k + d_v) * T^2 / 2``; sliding ``2 * n_q * (d_k + d_v) * T * min(T, W)`` at most;
  MLA ``n * (d_nope + d_rope + d_v) * T^2``; over ``peak * tp`` FLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.catalog.models import ModelEntry


@dataclass(frozen=True)
class Roofline:
    """Floors for one replica. ``decode_step_s``: time of one decode step of ``batch`` sequences
    (max of the memory and compute floors); ``per_sequence_tokens_per_s``: 1/decode_step_s;
    ``aggregate_tokens_per_s``: batch/decode_step_s; ``prefill_s``: one sequence's prompt of
    ``prompt_tokens`` alone (None when the peak FLOP/s is unknown)."""

    batch: int
    bytes_per_step: float
    flops_per_step: float
    decode_memory_floor_s: float
    decode_compute_floor_s: float | None
    prefill_flops: float
    prefill_s: float | None

    @property
    def decode_step_s(self) -> float:
        """The binding decode floor (seconds per step)."""
        return max(self.decode_memory_floor_s, self.decode_compute_floor_s or 0.0)

    @property
    def per_sequence_tokens_per_s(self) -> float:
        """Upper bound of tokens/s one sequence sees (TPOT floor inverted)."""
        return 1.0 / self.decode_step_s if self.decode_step_s > 0 else float("inf")

    @property
    def aggregate_tokens_per_s(self) -> float:
        """Upper bound of output tokens/s over the batch."""
        return self.batch * self.per_sequence_tokens_per_s

    def as_dict(self) -> dict[str, float | int | None]:
        """JSON-able view."""
        return {
            "batch": self.batch,
            "bytes_per_step": self.bytes_per_step,
            "flops_per_step": self.flops_per_step,
            "decode_memory_floor_s": self.decode_memory_floor_s,
            "decode_compute_floor_s": self.decode_compute_floor_s,
            "decode_step_s": self.decode_step_s,
            "tpot_floor_ms": self.decode_step_s * 1e3,
            "per_sequence_tokens_per_s": self.per_sequence_tokens_per_s,
            "aggregate_tokens_per_s": self.aggregate_tokens_per_s,
            "prefill_flops": self.prefill_flops,
            "prefill_s": self.prefill_s,
        }


def expected_distinct_experts(num_experts: int, k: int, batch: int) -> float:
    """Expected distinct experts one MoE layer runs for ``batch`` tokens routed to ``k`` of
    ``num_experts`` uniformly (see the module docstring)."""
    return num_experts * (1.0 - (1.0 - k / num_experts) ** batch)


def attention_flops(model: ModelEntry, tokens: int) -> float:
    """Attention score + value FLOPs of a causal prefill of ``tokens`` (module docstring)."""
    a = model.architecture
    total = 0.0
    for mixer in a.layer_mixers():
        if mixer in ("full", "sliding") and a.attention is not None:
            at = a.attention
            if not a.causal:
                span = float(tokens)
            elif mixer == "full":
                span = tokens / 2
            else:
                span = min(tokens / 2, float(at.sliding_window or tokens))
            total += 2 * at.num_heads * (at.head_dim + at.v_dim) * tokens * span
        elif mixer == "mla" and a.mla is not None:
            m = a.mla
            total += m.num_heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) * tokens * tokens
    return total


def roofline(
    model: ModelEntry,
    weight_bytes_read_b1: float,
    dense_weight_bytes: float,
    expert_bytes_total: float,
    active_params: float,
    state_bytes_per_seq: float,
    batch: int,
    prompt_tokens: int,
    bandwidth_bytes_s: float,
    peak_flops: float | None,
) -> Roofline:
    """Compute the floors for one replica.

    ``dense_weight_bytes``: bytes read every step whatever the routing (everything but routed experts
    and the input embedding table); ``expert_bytes_total``: all routed-expert bytes; ``state_bytes_per_seq``:
    cache bytes one sequence reads per step; ``bandwidth_bytes_s`` and ``peak_flops`` already summed
    over the TP group. ``weight_bytes_read_b1`` is kept for reporting single-stream bytes.
    """
    a = model.architecture
    if a.moe is not None and expert_bytes_total > 0:
        frac = expected_distinct_experts(a.moe.num_experts, a.moe.experts_per_token, batch) / a.moe.num_experts
        weights = dense_weight_bytes + expert_bytes_total * frac
    else:
        weights = dense_weight_bytes + expert_bytes_total
    bytes_step = weights + batch * state_bytes_per_seq
    flops_step = 2.0 * active_params * batch
    prefill = 2.0 * active_params * prompt_tokens + attention_flops(model, prompt_tokens)
    return Roofline(
        batch=batch,
        bytes_per_step=bytes_step,
        flops_per_step=flops_step,
        decode_memory_floor_s=bytes_step / bandwidth_bytes_s,
        decode_compute_floor_s=(flops_step / peak_flops) if peak_flops else None,
        prefill_flops=prefill,
        prefill_s=(prefill / peak_flops) if peak_flops else None,
    )
