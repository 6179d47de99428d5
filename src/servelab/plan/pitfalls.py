"""Memory pitfalls of seed 003 §20 in the plan.

* **Speculative decoding loads more than the model.** An MTP module (DeepSeek-V3/R1, GLM-4.5: the
  catalog's ``role: mtp`` component) or a draft model is held in memory next to the target, and each of
  its decoder layers keeps its own KV cache for every running sequence. MTP: each module is one
  Transformer block with the main model's attention (DeepSeek-V3 technical report §2.2,
  https://arxiv.org/abs/2412.19437, read 2026-12-02; vLLM's ``deepseek_mtp.py`` builds it from
  ``DeepseekV2DecoderLayer``), so its KV per sequence is ``decoder_layers`` times one full layer of the
  backbone (:func:`one_layer_state_bytes`). A draft model: its own weights (same precision, sharded over
  the target's TP: vLLM runs the drafter with the target's tensor parallel size) + its own KV per
  sequence (:func:`servelab.plan.kv.sequence_state` of the draft). Both come out of the KV pool, so the
  concurrency the plan finds drops.
* **gpu_memory_utilization above** :data:`UTILIZATION_HEADROOM_LIMIT` leaves almost nothing outside the
  engine for long requests, concurrency swings and fragmentation (003 §20: "显存利用率参数也不能拉满 ...
  生产环境通常要留安全余量"): a warning with the GiB it leaves.
* **context x concurrency beyond the KV pool**: the engine does not refuse more concurrent requests, it
  runs fewer at once and queues or preempts the rest; when even one sequence of ``context`` does not fit,
  vLLM refuses to start ("To serve at least one request with the models's max seq len ..." in
  ``vllm/v1/core/kv_cache_utils.py`` ``check_enough_kv_cache_memory``). The warning gives the tokens
  asked and held, and the context that would fit at the asked concurrency (:func:`context_that_fits`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from servelab.catalog.models import ModelEntry
from servelab.plan.kv import kv_heads_per_device, sequence_state, tokens_held
from servelab.plan.layouts import Layout
from servelab.plan.memory import kv_bytes_per_element, weight_bytes_by_part, weight_bytes_per_param
from servelab.wire.errors import ConfigError

__all__ = [
    "SPECULATIVE_METHODS",
    "UTILIZATION_HEADROOM_LIMIT",
    "Speculative",
    "context_that_fits",
    "kv_warning",
    "mtp_note",
    "one_layer_state_bytes",
    "speculative_memory",
    "utilization_warning",
]

GIB = 1024**3
#: Above this ``gpu_memory_utilization`` the plan warns (after seed 003 §20).
UTILIZATION_HEADROOM_LIMIT = 0.95
SPECULATIVE_METHODS = ("mtp", "draft")


@dataclass(frozen=True)
class Speculative:
    """What speculative decoding adds on the fullest device: ``weights_bytes`` of the ``name``\\ d module
    (``params`` parameters) and, through ``state``, the KV bytes one sequence of a given context needs in
    its ``layers`` decoder layers."""

    method: Literal["mtp", "draft"]
    name: str
    params: float
    layers: int
    weights_bytes: float
    state: Callable[[int], float]

    def as_dict(self, context_tokens: int) -> dict[str, Any]:
        """JSON-able view at ``context_tokens`` (bytes per device)."""
        return {
            "method": self.method,
            "name": self.name,
            "params": self.params,
            "decoder_layers": self.layers,
            "weights_bytes": self.weights_bytes,
            "kv_bytes_per_sequence": self.state(context_tokens),
        }


def one_layer_state_bytes(
    model: ModelEntry, context_tokens: int, kv_precision: str, tp: int, engine: str | None
) -> float:
    """KV bytes of one full-attention (or MLA) layer of ``model`` for one sequence on one device of a
    ``tp`` group: MLA ``tokens * (kv_lora_rank + qk_rope_head_dim) * b``, GQA ``tokens * n_kv_local *
    (d_k + d_v) * b`` (formulas of :mod:`servelab.plan.kv`); 0 for a model with neither."""
    a = model.architecture
    b = kv_bytes_per_element(kv_precision)
    held = tokens_held(engine, context_tokens, None)
    if a.mla is not None:
        return held * (a.mla.kv_lora_rank + a.mla.qk_rope_head_dim) * b
    if a.attention is not None:
        at = a.attention
        return held * kv_heads_per_device(at.num_kv_heads, tp) * (at.head_dim + at.v_dim) * b
    return 0.0


def _mtp_precision(model: ModelEntry, precision: str) -> str:
    """The MTP module is stored like the backbone's linear layers (``native``: the model's dtype)."""
    if precision != "native":
        return precision
    return "fp8" if model.native_dtype == "fp8" else "bf16"


def speculative_memory(
    model: ModelEntry,
    method: str | None,
    draft: ModelEntry | None,
    precision: str,
    kv_precision: str,
    layout: Layout,
    engine: str,
) -> Speculative | None:
    """The :class:`Speculative` of ``method`` (``mtp``, ``draft``, or None = no speculative decoding;
    ``draft`` alone implies ``draft``). Weights are split over ``layout.tp`` (the MTP module sits with
    the last pipeline stage, which the plan reports when it is the fuller one).

    Raises :class:`ConfigError` (one line) for an unknown method, ``mtp`` on a model whose catalog entry
    lists no MTP module, ``draft`` without a draft model, a draft with a different vocabulary, or
    speculative decoding with the llamacpp engine (not planned here)."""
    if method is None and draft is None:
        return None
    method = (method or "draft").lower()
    if method not in SPECULATIVE_METHODS:
        raise ConfigError(f"unknown --speculative {method!r}; use one of {', '.join(SPECULATIVE_METHODS)}")
    if engine == "llamacpp":
        raise ConfigError(
            "--speculative/--draft-model are planned for vllm and sglang only; llama-server's -md draft is not modelled"
        )
    tp = layout.tp
    if method == "mtp":
        if draft is not None:
            raise ConfigError(
                "--speculative mtp uses the model's own MTP module; drop --draft-model (or use --speculative draft)"
            )
        mods = [c for c in model.components if c.role == "mtp"]
        if not mods:
            raise ConfigError(
                f"{model.name} has no MTP module in the catalog (`servelab catalog models` "
                "lists components); use --draft-model for a separate draft"
            )
        params = sum(c.params for c in mods)
        layers = sum(c.decoder_layers for c in mods)
        w = params * weight_bytes_per_param(_mtp_precision(model, precision)) / tp
        return Speculative(
            "mtp",
            " + ".join(c.name for c in mods),
            params,
            layers,
            w,
            lambda ctx: layers * one_layer_state_bytes(model, ctx, kv_precision, tp, engine),
        )
    if draft is None:
        raise ConfigError("--speculative draft needs --draft-model NAME (a catalog model, config.json or .gguf)")
    va, vb = model.architecture.vocab_size, draft.architecture.vocab_size
    if va and vb and va != vb:
        raise ConfigError(
            f"draft {draft.name} has a vocabulary of {vb} tokens, {model.name} {va}: "
            "a draft must share the target's tokenizer"
        )
    parts = weight_bytes_by_part(draft, precision)
    w = sum(parts.values()) / tp
    params = float(draft.published_params.total)
    return Speculative(
        "draft",
        draft.name,
        params,
        draft.architecture.num_layers,
        w,
        lambda ctx: sequence_state(draft, ctx, kv_precision, tp, 1, engine).total_bytes,
    )


def mtp_note(model: ModelEntry, precision: str, layout: Layout) -> str | None:
    """A note when the catalog lists an MTP module the plan did not count (None otherwise)."""
    mods = [c for c in model.components if c.role == "mtp"]
    if not mods:
        return None
    params = sum(c.params for c in mods)
    gib = params * weight_bytes_per_param(_mtp_precision(model, precision)) / layout.tp / GIB
    return (
        f"{model.name} ships an MTP module ({params / 1e9:.1f}B parameters, {gib:.2f} GiB per device at this "
        "layout) that is loaded only with MTP speculative decoding: not counted; add --speculative mtp if "
        "you serve with it"
    )


def utilization_warning(util: float, capacity_bytes: float, engine: str) -> list[str]:
    """The warning for ``util`` above :data:`UTILIZATION_HEADROOM_LIMIT` (none at or below it)."""
    if util <= UTILIZATION_HEADROOM_LIMIT:
        return []
    left = capacity_bytes * (1 - util) / GIB
    name = "mem_fraction_static" if engine == "sglang" else "gpu_memory_utilization"
    return [
        f"{name} {util:g} > {UTILIZATION_HEADROOM_LIMIT:g} leaves {left:.2f} GiB of {capacity_bytes / GIB:.1f} "
        "GiB per device outside the engine: no headroom for long requests, concurrency swings or fragmentation "
        f"(OOM risk, 003 §20); keep it at or below {UTILIZATION_HEADROOM_LIMIT:g} and bound the load with "
        "max input length and rate limits instead"
    ]


def context_that_fits(state: Callable[[int], float], pool_bytes: float, seqs: int, upper: int) -> int:
    """The largest context ``T <= upper`` with ``state(T) * seqs <= pool_bytes`` (0 when not even one
    token fits); ``state`` must not decrease with ``T``. Bisection over integers."""
    if pool_bytes <= 0 or state(1) * seqs > pool_bytes:
        return 0
    lo, hi = 1, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if state(mid) * seqs <= pool_bytes else (lo, mid - 1)
    return lo


def kv_warning(
    context_tokens: int,
    concurrency: int,
    dp: int,
    max_seqs: int,
    pool_bytes: float,
    state: Callable[[int], float],
    engine: str,
) -> list[str]:
    """The warning when ``concurrency`` sequences of ``context_tokens`` exceed the KV pool that holds
    ``max_seqs`` of them (over ``dp`` replicas; ``pool_bytes`` and ``state`` per device); none when they
    fit."""
    if max_seqs >= concurrency:
        return []
    per_replica = math.ceil(concurrency / dp)
    asked = context_tokens * concurrency
    fit_ctx = context_that_fits(state, pool_bytes, per_replica, context_tokens)
    one = state(context_tokens)
    if max_seqs == 0:
        start = (
            f"vLLM refuses to start (one sequence of {context_tokens} tokens needs {one / GIB:.2f} GiB of KV per "
            f"device, the pool has {pool_bytes / GIB:.2f} GiB: check_enough_kv_cache_memory)"
            if engine == "vllm"
            else f"not even one sequence of {context_tokens} tokens fits ({one / GIB:.2f} GiB of KV per device, "
            f"pool {pool_bytes / GIB:.2f} GiB)"
        )
    else:
        start = (
            f"the engine starts but runs at most {max_seqs} sequences of {context_tokens} tokens at once; "
            "the rest wait or are preempted (and recomputed), so TTFT and E2E grow"
        )
    fix = (
        f"at concurrency {concurrency} a context of {fit_ctx} tokens fits"
        if fit_ctx
        else f"no context fits {concurrency} sequences"
    )
    return [
        f"context {context_tokens} x concurrency {concurrency} = {asked} tokens of KV, the pool holds "
        f"{max_seqs * context_tokens} ({max_seqs} sequences): {start}; {fix}, or keep this context for a few "
        "long requests on their own backend (003 §20)"
    ]
