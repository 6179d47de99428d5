"""The capacity plan: memory by part per device, fit, max concurrent sequences, roofline floors.

Memory per device = weights (every component, quantization scales included; all MoE experts, since
routing can pick any of them) + KV cache / sequence state (by attention kind, as the engine pages it)
+ activations/workspace at the prefill peak + CUDA-graph and communication buffers + runtime reserve.

Budget rules per engine:

* ``vllm``: the engine takes ``gpu_memory_utilization`` (default 0.9) of each GPU's memory for weights,
  activations and KV blocks (https://docs.vllm.ai/en/latest/configuration/optimization.html, read
  2026-11-30: "Increase GPU memory utilization (default: 0.9)"). It profiles one forward pass of
  ``max_num_batched_tokens`` tokens (default 8192 in the V1 engine for online serving) to find the
  activation peak; the rest becomes KV blocks.
* ``sglang``: ``mem_fraction_static`` of the GPU for weights + KV pool; SGLang derives the default from
  GPU memory (about 0.85-0.9 on 80 GB parts); servelab uses 0.88 (an estimate; set
  ``gpu_memory_utilization`` to override).
* ``llamacpp``: allocates exactly what :mod:`servelab.plan.llamacpp` models, no utilization cap.

Activation peak (estimate, not measured): ``T * (6*h + (q+2kv)/tp + 2*f_local/tp) * 2`` bytes for a
chunk of ``T = min(max_num_batched_tokens, context)`` tokens (hidden states, QKV, FFN intermediate of
width ``f_local`` = dense FFN or ``k`` experts' width) + sampler logits ``max_num_seqs * V/tp * 4 * 2``.
CUDA graphs: 0.5 GiB per GPU (vLLM logs "Graph capturing finished ... took ~0.3-1 GiB" for default
capture sizes; estimate); NCCL buffers: 0.25 GiB per GPU with TP/EP > 1 (estimate); CUDA context:
0.5 GiB per GPU outside the engine's accounting (estimate). Each estimate is labelled in the output.

Speculative decoding (an MTP module or a draft model) adds weights and KV per sequence; warnings for
``gpu_memory_utilization`` without headroom and context x concurrency beyond the KV pool:
:mod:`servelab.plan.pitfalls` (seed 003 §20).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from servelab.catalog.models import ModelEntry
from servelab.plan.capacity_plan import GIB, CapacityPlan, DeviceMemory
from servelab.plan.kv import ENGINES, SequenceState, kv_heads_per_device, sequence_state
from servelab.plan.layouts import Layout, candidate_layouts, default_layout, validate_layout
from servelab.plan.llamacpp import LlamaCppMemory, llamacpp_memory
from servelab.plan.memory import active_params, params_by_part, weight_bytes_by_part
from servelab.plan.pitfalls import Speculative, kv_warning, mtp_note, speculative_memory, utilization_warning
from servelab.plan.roofline import roofline
from servelab.wire.errors import ConfigError

GPU_UTILIZATION = {"vllm": 0.9, "sglang": 0.88}
CUDA_GRAPH_BYTES = 0.5 * GIB
NCCL_BYTES = 0.25 * GIB
CUDA_CONTEXT_BYTES = 0.5 * GIB
MAX_NUM_BATCHED_TOKENS = 8192
MAX_NUM_SEQS = 256  # vLLM's default --max-num-seqs (engine args doc, read 2026-11-30)


def _hardware(hw: Any) -> Any:
    """A hardware entry: a catalog name (looked up with ``servelab.catalog.find_hardware``), a dict with
    the catalog fields, or an object with them (``name``, ``kind``, ``memory_gib``,
    ``memory_bandwidth_gbps``, ``dense_tflops``, optional ``max_per_node``)."""
    if isinstance(hw, str):
        from servelab.catalog import find_hardware

        return find_hardware(hw)
    if isinstance(hw, dict):
        d = {"kind": "gpu", "dense_tflops": {}, "max_per_node": 8, **hw}
        return SimpleNamespace(**d)
    return hw


def _model(m: Any) -> ModelEntry:
    if isinstance(m, ModelEntry):
        return m
    from servelab.catalog.resolve import find_model

    return find_model(str(m))


def _peak_flops(hw: Any, precision: str) -> float | None:
    """Dense FLOP/s of one device for the math a precision runs in: fp8 weights on fp8 tensor cores
    when listed, int8 likewise, 4-bit and GGUF weights are dequantized to 16-bit (bf16/fp16), fp32 as is."""
    t = dict(getattr(hw, "dense_tflops", {}) or {})
    order = {
        "fp8": ["fp8", "bf16", "fp16", "fp32"],
        "int8": ["int8", "bf16", "fp16", "fp32"],
        "fp32": ["fp32", "tf32"],
        "fp16": ["fp16", "bf16", "fp32"],
    }.get(precision, ["bf16", "fp16", "fp32"])
    for k in order:
        if t.get(k):
            return float(t[k]) * 1e12
    return None


def _stage_weights(model: ModelEntry, parts: dict[str, float], layout: Layout) -> dict[str, float]:
    """Weights on the fullest device: layer parts / (tp or ep) / stages; embedding on the first stage,
    LM head on the last (both vocab-sharded over TP); components with the first stage."""
    a = model.architecture
    stage = math.ceil(a.num_layers / layout.pp) / a.num_layers
    tp = layout.tp
    exp_div = layout.ep if layout.ep else tp
    attention = parts["attention"] / tp
    if a.attention is not None and tp > a.attention.num_kv_heads:
        # TP above the KV heads: every rank keeps whole K/V projections of one KV head (vLLM's
        # QKVParallelLinear replicates them, see servelab.plan.kv.kv_heads_per_device), so the K/V part
        # shrinks only by num_kv_heads, not by tp
        at = a.attention
        mixers = a.layer_mixers()
        attn_layers = mixers.count("full") + mixers.count("sliding")
        kv_params = attn_layers * a.hidden_size * at.num_kv_heads * (at.head_dim + at.v_dim)
        n_attn = params_by_part(model)["attention"]
        kv_bytes = parts["attention"] * kv_params / n_attn if n_attn else 0.0
        attention += kv_bytes * (kv_heads_per_device(at.num_kv_heads, tp) / at.num_kv_heads - 1 / tp)
    out = {
        "attention": attention * stage,
        "ssm": parts["ssm"] * stage / tp,
        "dense_ffn": parts["dense_ffn"] * stage / tp,
        "moe_shared": parts["moe_shared"] * stage / tp,
        "moe_experts": parts["moe_experts"] * stage / exp_div,
        "embedding": parts["embedding"] / tp,
        "lm_head": parts["lm_head"] / tp,
        "components": parts["components"] / tp,
    }
    if layout.pp > 1:  # first stage: embedding + components; last: lm_head; report the larger end stage
        first = out["embedding"] + out["components"]
        if out["lm_head"] > first:
            out["embedding"] = out["components"] = 0.0
        else:
            out["lm_head"] = 0.0
    return out


def estimate(
    model: Any,
    hardware: Any,
    count: int,
    context_tokens: int,
    concurrency: int,
    precision: str | None = "bf16",
    kv_precision: str | None = None,
    tp: int | None = None,
    pp: int = 1,
    ep: int | None = None,
    dp: int = 1,
    engine: str | None = None,
    parallel: int | None = None,
    ctx_size: int | None = None,
    kv_unified: bool = False,
    gpu_memory_utilization: float | None = None,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    find_smallest: bool = True,
    speculative: str | None = None,
    draft_model: Any = None,
) -> CapacityPlan:
    """Plan ``model`` on ``count`` devices of ``hardware`` for ``concurrency`` sequences of
    ``context_tokens`` tokens each.

    Args:
        model: a :class:`ModelEntry` or a name/alias/path for :func:`servelab.catalog.find_model`.
        hardware: a catalog name, a hardware entry, or a dict with its fields (see :func:`_hardware`).
        count: devices available (>= 1).
        precision: weight precision (``bf16``, ``fp8``, ``int8``, ``int4``, ``mxfp4``, ``nvfp4``, GGUF
            types such as ``q4_k_m``, or ``native`` = as published; None = ``bf16``).
        kv_precision: KV-cache element type; default ``f16`` for llama.cpp, else ``bf16``.
        tp, pp, ep, dp: layout; ``tp`` None = ``count // (pp * dp)``.
        engine: ``vllm`` (default), ``sglang`` or ``llamacpp``.
        parallel: llama.cpp ``-np`` slots (default ``concurrency``); ``ctx_size``: llama.cpp ``-c``
            (default ``context_tokens * parallel``); ``kv_unified``: llama.cpp ``-kvu``.
        gpu_memory_utilization: overrides the engine's budget fraction; above 0.95 the plan warns
            (:data:`servelab.plan.pitfalls.UTILIZATION_HEADROOM_LIMIT`).
        find_smallest: when it does not fit, search the smallest fitting layout (set False inside searches).
        speculative: ``mtp`` (count the catalog's MTP module: weights + its layers' KV) or ``draft``
            (count ``draft_model``); None = none. ``draft_model``: like ``model``; alone it implies ``draft``.

    Returns a :class:`CapacityPlan`. Raises :class:`ConfigError` (one line) for bad input: count,
    context or concurrency < 1, unknown engine/precision, or a layout the model cannot use
    (:func:`servelab.plan.layouts.validate_layout`), or a speculative setup the catalog cannot back
    (:func:`servelab.plan.pitfalls.speculative_memory`).
    """
    m = _model(model)
    hw = _hardware(hardware)
    precision = precision or "bf16"
    engine = (engine or "vllm").lower()
    if engine not in ENGINES:
        raise ConfigError(f"unknown --engine {engine!r}; use one of {', '.join(ENGINES)}")
    if count < 1:
        raise ConfigError(f"device count must be >= 1, got {count}")
    if context_tokens < 1 or concurrency < 1:
        raise ConfigError(f"--context and --concurrency must be >= 1 (got {context_tokens} and {concurrency})")
    layout_note = None
    if tp is None:
        auto, layout_note = default_layout(m, count, pp, dp)
        tp, dp = auto.tp, auto.dp
    layout = Layout(tp=tp, pp=pp, dp=dp, ep=ep)
    validate_layout(m, layout, count)
    kv_prec = (kv_precision or ("f16" if engine == "llamacpp" else "bf16")).lower()
    notes: list[str] = [layout_note] if layout_note else []
    reasons: list[str] = []
    warnings: list[str] = []
    spec = _speculative(m, speculative, draft_model, precision, kv_prec, layout, engine, notes)
    a = m.architecture
    if context_tokens > a.max_context and m.kind == "decoder":
        notes.append(f"context {context_tokens} exceeds the model's trained {a.max_context} tokens")
    elif context_tokens > a.max_context:
        # an encoder truncates/rejects longer input; Whisper's decoder stops at max_target_positions (448)
        what = "decoder tokens per request" if m.kind == "encoder-decoder" else "input tokens per request"
        notes.append(
            f"{m.name} takes at most {a.max_context} {what}: planned at {a.max_context}, not the {context_tokens} asked"
        )
        context_tokens = a.max_context
    capacity = float(hw.memory_gib) * GIB
    parts_b = weight_bytes_by_part(m, precision)
    dev_w = _stage_weights(m, parts_b, layout)
    per_replica_conc = math.ceil(concurrency / dp)
    est: list[str] = []
    llm: LlamaCppMemory | None = None
    if engine == "llamacpp":
        np_ = parallel or concurrency
        llm = llamacpp_memory(
            m,
            ctx_size if ctx_size is not None else context_tokens * np_,
            np_,
            kv_unified,
            kv_prec,
            kv_prec,
            weight_precision=precision,
        )
        scale = llm.model_bytes / max(1.0, sum(parts_b.values()))
        dev_w = {k: v * scale / layout.devices for k, v in parts_b.items()}
        kv_need = llm.context_bytes / layout.devices
        act = (llm.compute_bytes + llm.output_bytes) / layout.devices
        graph = comm = reserve = 0.0
        kv_pool = kv_need
        state = sequence_state(m, min(context_tokens, llm.n_ctx_seq), kv_prec, 1, 1, None)
        est.append("compute buffer (fitted), see servelab.plan.llamacpp")
        notes.extend(llm.notes)
        if llm.n_ctx_seq < context_tokens:
            reasons.append(
                f"each of the {np_} slots gets n_ctx_seq = {llm.n_ctx_seq} tokens < the {context_tokens} "
                f"requested; raise -c to {context_tokens * np_}"
            )
        if np_ < concurrency:
            reasons.append(f"{np_} slots < {concurrency} concurrent requests: the rest queue (raise --parallel)")
        max_seqs: int | None = np_ if llm.n_ctx_seq >= context_tokens else 0
        needed_dev = sum(dev_w.values()) + kv_need + act
        if needed_dev > capacity:
            reasons.append(f"needs {needed_dev / GIB:.2f} GiB per device, has {capacity / GIB:.2f} GiB")
    else:
        util = gpu_memory_utilization if gpu_memory_utilization is not None else GPU_UTILIZATION[engine]
        if not 0 < util <= 1:
            raise ConfigError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        warnings += utilization_warning(util, capacity, engine)
        is_gpu = getattr(hw, "kind", "gpu") in ("gpu", "npu")
        reserve = capacity * (1 - util) + (CUDA_CONTEXT_BYTES if is_gpu else 0.0)
        graph = CUDA_GRAPH_BYTES if is_gpu and m.kind != "diffusion" else 0.0
        comm = NCCL_BYTES if is_gpu and (layout.tp > 1 or layout.pp > 1 or (layout.ep or 1) > 1) else 0.0
        est += [
            x
            for x, on in (
                ("activations", True),
                ("cuda_graphs", graph > 0),
                ("communication", comm > 0),
                ("cuda_context", is_gpu),
            )
            if on
        ]
        act = _activation_bytes(m, layout, context_tokens, max_num_batched_tokens, per_replica_conc)
        state = sequence_state(m, context_tokens, kv_prec, layout.tp, layout.pp, engine)
        seq_bytes = _sequence_bytes(m, kv_prec, layout, engine, spec)
        dev_w.update({f"{spec.method}: {spec.name}": spec.weights_bytes} if spec else {})
        per_seq = seq_bytes(context_tokens)
        kv_need = per_seq * per_replica_conc
        kv_pool = capacity - reserve - graph - comm - act - sum(dev_w.values())
        if kv_pool < 0:
            reasons.append(
                f"weights + activations + buffers need {(capacity - kv_pool) / GIB:.2f} GiB per device, "
                f"{capacity / GIB:.2f} GiB available ({util:.0%} usable by {engine})"
            )
            max_seqs = 0
        elif per_seq == 0:
            max_seqs = None
        else:
            max_seqs = int(kv_pool // per_seq) * dp
            if max_seqs < concurrency:
                reasons.append(
                    f"KV pool {kv_pool / GIB:.2f} GiB per device holds {max_seqs} sequences of "
                    f"{context_tokens} tokens, {concurrency} requested"
                )
                warnings += kv_warning(context_tokens, concurrency, dp, max_seqs, kv_pool, seq_bytes, engine)
        if m.kind == "diffusion":
            notes.append(
                "diffusion model: no KV cache; memory is weights + the activations of the latent "
                f"sequence ({context_tokens} tokens here; see VideoSpec.latent_tokens)"
            )
        if m.kind == "encoder":
            notes.append("encoder/pooling model: no KV cache is kept between requests")
    fits = not reasons
    dev = DeviceMemory(
        weights_by_part=dev_w,
        kv_pool_bytes=max(0.0, kv_pool),
        kv_needed_bytes=kv_need,
        activation_bytes=act,
        graph_bytes=graph,
        comm_bytes=comm,
        reserve_bytes=reserve,
        capacity_bytes=capacity,
        estimates=est,
    )
    # roofline for one replica: bandwidth and FLOP/s of its TP group (PP stages run in turn)
    bw = float(hw.memory_bandwidth_gbps) * 1e9 * layout.tp
    peak1 = _peak_flops(hw, precision)
    full_state = sequence_state(m, context_tokens, kv_prec, 1, 1, engine if engine != "llamacpp" else None)
    # llama.cpp with a GGUF: the bytes read per step are the file's tensors, not the precision's estimate
    w_scale = (llm.model_bytes / max(1.0, sum(parts_b.values()))) if llm is not None else 1.0
    experts_b = parts_b["moe_experts"] * w_scale
    dense_b = (sum(parts_b.values()) - parts_b["moe_experts"] - parts_b["embedding"] - parts_b["components"]) * w_scale
    if m.architecture.tie_word_embeddings:
        # a tied LM head is the embedding matrix, read whole at every decode step (the lookup reads rows only)
        dense_b += parts_b["embedding"] * w_scale
    rl = roofline(
        m,
        dense_b + experts_b,
        dense_b,
        experts_b,
        active_params(m),
        full_state.total_bytes,
        per_replica_conc,
        context_tokens,
        bw,
        peak1 * layout.tp if peak1 else None,
    )
    plan = CapacityPlan(
        model=m,
        hardware_name=str(getattr(hw, "name", "device")),
        count=count,
        layout=layout,
        engine=engine,
        precision=(
            "as in the GGUF file"
            if llm is not None and not any(n.startswith("weights estimated") for n in llm.notes)
            else precision
        ),
        kv_precision=kv_prec,
        context_tokens=context_tokens,
        concurrency=concurrency,
        device=dev,
        state_per_sequence=_state_dict(state, spec, context_tokens),
        max_concurrent_sequences=max_seqs,
        fits=fits,
        reasons=reasons,
        roofline=rl,
        notes=notes,
        llamacpp=llm,
        warnings=warnings,
        speculative=spec,
    )
    if not fits and find_smallest and engine != "llamacpp":
        plan.smallest_layout = smallest_fitting_layout(
            m,
            hw,
            context_tokens,
            concurrency,
            precision=precision,
            kv_precision=kv_precision,
            engine=engine,
            gpu_memory_utilization=gpu_memory_utilization,
            speculative=speculative,
            draft_model=draft_model,
        )
    return plan


def _speculative(
    m: ModelEntry,
    method: str | None,
    draft_model: Any,
    precision: str,
    kv_prec: str,
    layout: Layout,
    engine: str,
    notes: list[str],
) -> Speculative | None:
    """:func:`servelab.plan.pitfalls.speculative_memory` for ``method``/``draft_model``; without one, a
    note in ``notes`` when the catalog lists an MTP module that is not counted."""
    spec = speculative_memory(
        m, method, _model(draft_model) if draft_model is not None else None, precision, kv_prec, layout, engine
    )
    note = mtp_note(m, precision, layout) if spec is None else None
    notes.extend([note] if note else [])
    return spec


def _sequence_bytes(
    m: ModelEntry, kv_prec: str, layout: Layout, engine: str, spec: Speculative | None
) -> Callable[[int], float]:
    """Bytes of KV one sequence of a given context holds on the fullest device, speculative layers included."""

    def f(ctx: int) -> float:
        own = sequence_state(m, ctx, kv_prec, layout.tp, layout.pp, engine).total_bytes
        return own + (spec.state(ctx) if spec else 0.0)

    return f


def _state_dict(state: SequenceState, spec: Speculative | None, context_tokens: int) -> dict[str, float]:
    """The plan's ``state_per_sequence``: by kind (:meth:`SequenceState.as_dict`), + ``speculative_bytes``."""
    return {**state.as_dict(), **({"speculative_bytes": spec.state(context_tokens)} if spec else {})}


def _activation_bytes(m: ModelEntry, layout: Layout, context_tokens: int, max_batched: int, seqs: int) -> float:
    """Prefill-peak activations per device (estimate; formula in the module docstring)."""
    a = m.architecture
    t = min(max_batched, max(context_tokens, 1))
    tp = layout.tp
    if a.attention is not None:
        qkv = (a.attention.num_heads * a.attention.head_dim + 2 * a.attention.num_kv_heads * a.attention.head_dim) / tp
    elif a.mla is not None:
        qkv = a.mla.num_heads * (a.mla.qk_nope_head_dim + a.mla.qk_rope_head_dim + a.mla.v_head_dim) / tp
    else:
        qkv = 0.0
    f = a.ffn_intermediate or 0
    if a.moe is not None:
        f = max(f, a.moe.experts_per_token * a.moe.expert_intermediate)
    if a.ssm is not None:
        f = max(f, 2 * a.ssm.d_inner)
    per_token = (6 * a.hidden_size + qkv + 2 * f / tp) * 2
    logits = min(seqs, MAX_NUM_SEQS) * (a.vocab_size / tp) * 4 * 2 if m.kind == "decoder" else 0.0
    return t * per_token + logits


def smallest_fitting_layout(
    model: Any,
    hardware: Any,
    context_tokens: int,
    concurrency: int,
    precision: str = "bf16",
    kv_precision: str | None = None,
    engine: str | None = None,
    gpu_memory_utilization: float | None = None,
    max_devices: int = 64,
    speculative: str | None = None,
    draft_model: Any = None,
) -> Layout | None:
    """The layout with the fewest devices on which ``model`` fits ``concurrency`` sequences of
    ``context_tokens`` (the sequences spread evenly over DP replicas); among layouts of one size, no PP
    first, then the smallest TP (order of :func:`servelab.plan.layouts.candidate_layouts`). None when
    nothing up to ``max_devices`` fits.
    Raises :class:`ConfigError` for bad input like :func:`estimate`."""
    m = _model(model)
    hw = _hardware(hardware)
    per_node = int(getattr(hw, "max_per_node", 8) or 8)
    for lay in candidate_layouts(m, max_devices, per_node):
        p = estimate(
            m,
            hw,
            lay.devices,
            context_tokens,
            concurrency,
            precision=precision,
            kv_precision=kv_precision,
            tp=lay.tp,
            pp=lay.pp,
            dp=lay.dp,
            engine=engine if engine != "llamacpp" else "vllm",
            gpu_memory_utilization=gpu_memory_utilization,
            find_smallest=False,
            speculative=speculative,
            draft_model=draft_model,
        )
        if p.fits:
            return lay
    return None
