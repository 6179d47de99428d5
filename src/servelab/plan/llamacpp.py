"""llama.cpp's memory at start: KV cache (exact), output buffer (exact), compute buffer (fitted), weights.

Read from llama.cpp build 11434 (the sdist servelab builds llama-server from; files under
``llama.cpp/src`` and ``tools/server``; read 2026-11-30):

* ``tools/server/server.cpp`` + ``common/arg.cpp``: ``-np`` defaults to -1 = auto, which becomes 4 slots
  with ``kv_unified = true``; an explicit ``-np N`` keeps ``kv_unified = false`` unless ``-kvu``.
  ``-c 0`` = the trained context (``n_ctx_train``).
* ``src/llama-context.cpp`` (constructor): ``n_ctx = GGML_PAD(n_ctx, 256)``; unified: ``n_ctx_seq =
  n_ctx``; else ``n_ctx_seq = GGML_PAD(n_ctx / n_seq_max, 256)`` and ``n_ctx = n_ctx_seq * n_seq_max``
  (the "rounding down" warning; it can round *up*, e.g. -c 16384 -np 3 -> 16896).
* ``src/llama-model.cpp`` ``create_memory``: the cache is built with ``kv_size = n_ctx_seq``.
* ``src/llama-kv-cache.cpp``: ``n_stream = unified ? 1 : n_seq_max``; K and V tensors of
  ``n_embd_{k,v}_gqa x kv_size x n_stream`` per layer, row size from the ggml type
  (f16 2 B; q8_0 34 B per 32; q4_0 18 B per 32).
* ``src/llama-kv-cache-iswa.cpp``: for models with sliding-window layers, the non-SWA cache has
  ``kv_size`` cells and the SWA cache ``GGML_PAD(min(kv_size, n_swa * (unified ? n_seq_max : 1) +
  n_ubatch), 256)`` cells (``--swa-full``: ``kv_size``).
* ``src/llama-memory-recurrent.cpp``: a recurrent (Mamba) layer keeps ``max(1, n_seq_max)`` F32 states.
* ``src/llama-context.cpp`` ``output_reserve``: logits buffer ``n_vocab * n_seq_max * 4`` bytes (the
  "output buffer" line; not part of the memory-breakdown table).
* ``memory_breakdown``: "model" = weight buffers (a CPU_REPACK row holds repacked tensors, so
  model + repack = tensor bytes), "context" = the KV caches, "compute" = the scheduler's graph buffer.

The compute buffer is the graph allocator's peak for one ``n_ubatch`` micro-batch. Modeled as the
KQ masks (``n_kv x n_ubatch`` F16 per cache, n_kv = the cache's cells) + ``n_ubatch * (3*n_ff +
5*n_embd) * 4`` bytes alive at the FFN peak (gate, up, product; residual, norms and attention output
in F32). The mask term follows the source; the second term is a fit to Gemma 3 270M's reported buffers
(-ub 256 and 512, -c 2048..32768) and is an estimate for other models.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from servelab.catalog.models import ModelEntry
from servelab.plan.memory import weight_bytes_by_part
from servelab.wire.errors import ConfigError

MIB = 1024 * 1024
_PAD = 256
#: llama.cpp ggml type names accepted for -ctk/-ctv
CACHE_TYPES = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_0": 22 / 32,
    "q5_1": 24 / 32,
    "q4_0": 18 / 32,
    "q4_1": 20 / 32,
}


def _pad(x: int, n: int = _PAD) -> int:
    return (x + n - 1) // n * n


@dataclass(frozen=True)
class LlamaCppMemory:
    """What llama-server allocates at start (bytes unless named otherwise).

    ``n_ctx``/``n_ctx_seq``: as llama_context logs them; ``cells_base``/``cells_swa``: cells per stream
    of the non-SWA / SWA caches (0 when absent); ``layers_base``/``layers_swa``/``layers_recurrent``;
    ``kv_base_bytes``/``kv_swa_bytes``/``recurrent_bytes``: the caches; ``output_bytes``: logits
    buffer; ``compute_bytes``: estimated graph buffer; ``model_bytes``: weights.
    """

    n_ctx: int
    n_ctx_seq: int
    n_seq: int
    n_stream: int
    kv_unified: bool
    cells_base: int
    cells_swa: int
    layers_base: int
    layers_swa: int
    layers_recurrent: int
    kv_base_bytes: float
    kv_swa_bytes: float
    recurrent_bytes: float
    output_bytes: float
    compute_bytes: float
    model_bytes: float
    notes: list[str] = field(default_factory=list)

    @property
    def context_bytes(self) -> float:
        """The memory-breakdown "context" column: all caches."""
        return self.kv_base_bytes + self.kv_swa_bytes + self.recurrent_bytes

    @property
    def total_bytes(self) -> float:
        """model + context + compute + output buffer."""
        return self.model_bytes + self.context_bytes + self.compute_bytes + self.output_bytes

    def as_dict(self) -> dict[str, object]:
        """JSON-able view (bytes and MiB)."""
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["context_bytes"] = self.context_bytes
        d["total_bytes"] = self.total_bytes
        d["kv_base_mib"] = self.kv_base_bytes / MIB
        d["kv_swa_mib"] = self.kv_swa_bytes / MIB
        return d


def gguf_weight_bytes(model: ModelEntry) -> float | None:
    """Exact tensor bytes recorded by :func:`servelab.catalog.readers.read_gguf` (None for a catalog row)."""
    for n in model.notes:
        if n.startswith("gguf_weight_bytes="):
            return float(n.split("=", 1)[1])
    return None


def llamacpp_memory(
    model: ModelEntry,
    ctx_size: int,
    n_parallel: int = 1,
    kv_unified: bool = False,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    n_ubatch: int = 512,
    swa_full: bool = False,
    weight_precision: str = "q4_k_m",
) -> LlamaCppMemory:
    """llama-server's allocation for ``-c ctx_size -np n_parallel`` (see the module docstring).

    ``ctx_size`` 0 = the model's trained context. ``weight_precision`` is used only when the model
    was not read from a GGUF file (then the exact tensor bytes are used).
    Raises :class:`ConfigError` for n_parallel < 1, a negative context, or an unknown cache type.
    """
    if n_parallel < 1:
        raise ConfigError(f"--parallel must be >= 1 slot, got {n_parallel}")
    if ctx_size < 0:
        raise ConfigError(f"llama.cpp -c must be >= 0 tokens (0 = trained length), got {ctx_size}")
    for t in (cache_type_k, cache_type_v):
        if t not in CACHE_TYPES:
            raise ConfigError(f"unknown llama.cpp cache type {t!r}; use one of {', '.join(CACHE_TYPES)}")
    a = model.architecture
    n_ctx = _pad(ctx_size or a.max_context)
    if kv_unified:
        n_ctx_seq = n_ctx
    else:
        n_ctx_seq = _pad(n_ctx // n_parallel)
        n_ctx = n_ctx_seq * n_parallel
    n_stream = 1 if kv_unified else n_parallel
    mixers = a.layer_mixers()
    bk, bv = CACHE_TYPES[cache_type_k], CACHE_TYPES[cache_type_v]
    notes: list[str] = []
    if a.attention is not None:
        at = a.attention
        row = at.num_kv_heads * (at.head_dim * bk + at.v_dim * bv)
    elif a.mla is not None:
        row = (a.mla.kv_lora_rank + a.mla.qk_rope_head_dim) * bk
        notes.append("MLA in llama.cpp: one latent+rope K row, V read from it (estimate)")
    else:
        row = 0.0
    layers_base = mixers.count("full") + mixers.count("mla")
    layers_swa = mixers.count("sliding")
    cells_swa = 0
    if layers_swa:
        assert a.attention is not None and a.attention.sliding_window is not None
        n_swa = a.attention.sliding_window
        swa_need = n_swa * (n_parallel if kv_unified else 1) + n_ubatch
        cells_swa = n_ctx_seq if swa_full else _pad(min(n_ctx_seq, swa_need))
    kv_base = layers_base * n_ctx_seq * n_stream * row
    kv_swa = layers_swa * cells_swa * n_stream * row
    rec_layers = mixers.count("mamba2")
    recurrent = 0.0
    if rec_layers and a.ssm is not None:
        s = a.ssm
        conv = (s.d_inner + 2 * s.n_groups * s.d_state) * (s.conv_kernel - 1)
        recurrent = rec_layers * max(1, n_parallel) * (conv + s.num_heads * s.head_dim * s.d_state) * 4.0
    output = a.vocab_size * n_parallel * 4.0
    n_ff = max(a.ffn_intermediate or 0, (a.moe.expert_intermediate * a.moe.experts_per_token) if a.moe else 0)
    masks = (n_ctx_seq if layers_base else 0) * n_ubatch * 2 + cells_swa * n_ubatch * 2
    compute = masks + n_ubatch * (3 * n_ff + 5 * a.hidden_size) * 4.0
    exact = gguf_weight_bytes(model)
    weights = exact if exact is not None else sum(weight_bytes_by_part(model, weight_precision).values())
    if exact is None:
        notes.append(f"weights estimated at {weight_precision} (pass the .gguf file for exact bytes)")
    return LlamaCppMemory(
        n_ctx=n_ctx,
        n_ctx_seq=n_ctx_seq,
        n_seq=n_parallel,
        n_stream=n_stream,
        kv_unified=kv_unified,
        cells_base=n_ctx_seq if layers_base else 0,
        cells_swa=cells_swa,
        layers_base=layers_base,
        layers_swa=layers_swa,
        layers_recurrent=rec_layers,
        kv_base_bytes=kv_base,
        kv_swa_bytes=kv_swa,
        recurrent_bytes=recurrent,
        output_bytes=output,
        compute_bytes=compute,
        model_bytes=weights,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------------
# parsing llama-server's own report (-lv 4), for checks against reality

_KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers, +(\d+)/(\d+) seqs\)")
_BREAKDOWN = re.compile(r"memory_breakdown_print: \|\s+- Host\s+\|\s+(\d+) = +(\d+) \+ +(\d+) \+ +(\d+)")
_REPACK = re.compile(r"memory_breakdown_print: \|\s+- CPU_REPACK\s+\|\s+(\d+) = +(\d+)")
_CTX = re.compile(r"llama_context: n_ctx += (\d+)")
_CTX_SEQ = re.compile(r"llama_context: n_ctx_seq += (\d+)")
_COMPUTE = re.compile(r"CPU compute buffer size = +([\d.]+) MiB")
_OUTPUT = re.compile(r"CPU +output buffer size = +([\d.]+) MiB")


def parse_server_log(text: str) -> dict[str, object]:
    """Parse the ``-lv 4`` start-up lines of llama-server: ``n_ctx``, ``n_ctx_seq``, ``kv_caches``
    (list of {mib, cells, layers, seqs, streams} in log order: non-SWA first), ``host_mib`` (total,
    model, context, compute of the memory breakdown), ``repack_mib``, ``compute_mib``, ``output_mib``.
    Missing lines are absent keys."""
    out: dict[str, object] = {}
    if m := _CTX.search(text):
        out["n_ctx"] = int(m.group(1))
    if m := _CTX_SEQ.search(text):
        out["n_ctx_seq"] = int(m.group(1))
    caches = [
        {
            "mib": float(m.group(1)),
            "cells": int(m.group(2)),
            "layers": int(m.group(3)),
            "seqs": int(m.group(4)),
            "streams": int(m.group(5)),
        }
        for m in _KV_LINE.finditer(text)
    ]
    if caches:
        out["kv_caches"] = caches
    if m := _BREAKDOWN.search(text):
        out["host_mib"] = {
            "total": int(m.group(1)),
            "model": int(m.group(2)),
            "context": int(m.group(3)),
            "compute": int(m.group(4)),
        }
    if m := _REPACK.search(text):
        out["repack_mib"] = int(m.group(2))
    if m := _COMPUTE.search(text):
        out["compute_mib"] = float(m.group(1))
    if m := _OUTPUT.search(text):
        out["output_mib"] = float(m.group(1))
    return out


def default_gguf() -> Path | None:
    """Path of the embedded Gemma 3 270M GGUF if its package is installed (no download), else None."""
    try:
        from servelab.engines.llamacpp import default_model_path

        return default_model_path()
    except Exception:  # noqa: BLE001 - optional weights package
        return None
