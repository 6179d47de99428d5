"""Read a model's capacity-relevant architecture from a Hugging Face ``config.json`` or a GGUF file.

Both readers return the same :class:`servelab.catalog.models.ModelEntry` the catalog holds, so
``servelab plan --model PATH`` works on a checkpoint that is not in the catalog.

``config.json`` (field names as in the transformers configuration classes,
https://github.com/huggingface/transformers/tree/main/src/transformers/models, read 2026-11-30):
Llama / Mistral / Qwen2 / Qwen3 (``num_key_value_heads``, ``head_dim``, ``sliding_window`` +
``use_sliding_window``), Qwen2/3-MoE (``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``shared_expert_intermediate_size``, ``mlp_only_layers``, ``decoder_sparse_step``), Mixtral
(``num_local_experts``), DeepSeek-V2/V3 and Kimi K2 (``kv_lora_rank``, ``q_lora_rank``,
``qk_rope_head_dim``, ``qk_nope_head_dim``, ``v_head_dim``, ``n_routed_experts``, ``n_shared_experts``,
``first_k_dense_replace``, ``num_nextn_predict_layers``), GLM-4-MoE (same MoE names), Gemma 3 (a
multimodal config nests the decoder under ``text_config``; per-layer ``layer_types`` or the older
``sliding_window_pattern``, default 6), gpt-oss (``layer_types``, ``num_local_experts``,
``experts_per_token``) and Nemotron-H (``hybrid_override_pattern``, ``mamba_num_heads``,
``mamba_head_dim``, ``ssm_state_size``, ``n_groups``, ``conv_kernel``).

GGUF (key names from llama.cpp's ``gguf-py/gguf/constants.py`` and ``src/llama-arch.cpp``, build 11434,
read 2026-11-30): ``{arch}.block_count``, ``.embedding_length``, ``.feed_forward_length``,
``.attention.head_count``, ``.attention.head_count_kv`` (a number or one per layer),
``.attention.key_length`` / ``.value_length``, ``.attention.sliding_window``, ``.context_length``,
``.expert_count``, ``.expert_used_count``, ``.expert_feed_forward_length``, ``.expert_shared_count``,
``.leading_dense_block_count``, ``.attention.kv_lora_rank``, ``.rope.dimension_count``, ``.ssm.*``.
The sliding-window layer pattern is not always stored in the file: llama.cpp hard-codes it per
architecture (``load_swa_pattern(ml, 6)`` in ``src/models/gemma3.cpp``, ``2`` in
``src/models/openai-moe.cpp``; a layer ``il`` is sliding when ``il % n < n - 1``), and so does this reader.
:func:`gguf_tensor_bytes` reads the tensor table for the exact weight bytes per ggml type.
"""

from __future__ import annotations

import datetime as _dt
import json
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from servelab.catalog.models import Architecture, ModelEntry, entry_from_dict
from servelab.catalog.params import layer_params, total_params
from servelab.modelfile.gguf_meta import check_gguf, model_summary, read_metadata
from servelab.wire.errors import ConfigError

HF_CONFIG_DOC = "https://huggingface.co/docs/transformers/main_classes/configuration"
GGUF_SPEC = "https://github.com/ggml-org/ggml/blob/master/docs/gguf.md"

#: llama.cpp's hard-coded sliding-window period per GGUF architecture (see the module docstring).
GGUF_SWA_PERIOD = {"gemma3": 6, "gpt-oss": 2, "openai-moe": 2, "gemma2": 2, "cohere2": 4}


def _today() -> str:
    return _dt.date.today().isoformat()


def _req(cfg: dict[str, Any], *keys: str, where: str) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    raise ConfigError(
        f"{where}: missing {' / '.join(keys)}; this config.json does not describe a supported "
        "decoder (supported: Llama, Mistral, Mixtral, Qwen2/3(-MoE), DeepSeek-V2/V3, Kimi K2, "
        "GLM-4-MoE, Gemma 3, gpt-oss, Nemotron-H)"
    )


def _pattern_from_layer_types(types: list[str], where: str) -> list[str]:
    out = []
    for t in types:
        if t in ("full_attention", "attention", "global"):
            out.append("full")
        elif t in ("sliding_attention", "sliding", "local"):
            out.append("sliding")
        elif t in ("mamba", "mamba2", "linear_attention"):
            out.append("mamba2")
        else:
            raise ConfigError(f"{where}: unknown layer_types entry {t!r}")
    return out


def _mtp_params(arch: dict[str, Any]) -> float:
    """Parameters of one MTP module = one MoE decoder layer (+ the 2h->h projection); shared embedding
    and head are not counted again (DeepSeek-V3 README_WEIGHTS.md)."""
    a = Architecture.model_validate(arch)
    return layer_params(a, a.num_layers - 1) + 2 * a.hidden_size * a.hidden_size


def architecture_from_hf(
    cfg: dict[str, Any], where: str = "config.json"
) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """Map a transformers ``config.json`` dict to ``(architecture dict, components, notes)``.

    Raises :class:`ConfigError` (one line naming the missing field) when it is not a supported decoder.
    """
    notes: list[str] = []
    components: list[dict[str, Any]] = []
    mtype = str(cfg.get("model_type", ""))
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    if text is not None:
        notes.append(f"decoder read from text_config (model_type {mtype})")
        if isinstance(cfg.get("vision_config"), dict):
            components.append(
                {
                    "name": "vision encoder (from vision_config, size not in config.json)",
                    "role": "vision_encoder",
                    "params": 4.2e8,
                    "note": "assumed ~0.42B (SigLIP-So400m); not stated in config.json",
                }
            )
            notes.append("vision encoder size assumed 0.42B (SigLIP-So400m class), not read from the file")
        cfg = {**text, "model_type": text.get("model_type", mtype)}
        mtype = str(cfg.get("model_type", mtype))
    L = int(_req(cfg, "num_hidden_layers", "n_layer", "num_layers", where=where))
    hidden = int(_req(cfg, "hidden_size", "d_model", "n_embd", where=where))
    heads = int(_req(cfg, "num_attention_heads", "n_head", where=where))
    for key, value in (("num_hidden_layers", L), ("hidden_size", hidden), ("num_attention_heads", heads)):
        if value < 1:
            raise ConfigError(f"{where}: {key} is {value}; it must be a positive integer")
    arch: dict[str, Any] = {
        "num_layers": L,
        "hidden_size": hidden,
        "vocab_size": int(cfg.get("vocab_size") or 0),
        "tie_word_embeddings": bool(cfg.get("tie_word_embeddings", mtype.startswith("gemma"))),
        "max_context": int(cfg.get("max_position_embeddings") or cfg.get("seq_length") or 4096),
    }
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    window = cfg.get("sliding_window")
    # --- MLA (DeepSeek-V2/V3, Kimi K2)
    if cfg.get("kv_lora_rank"):
        arch["mla"] = {
            "num_heads": heads,
            "q_lora_rank": cfg.get("q_lora_rank"),
            "kv_lora_rank": int(cfg["kv_lora_rank"]),
            "qk_nope_head_dim": int(_req(cfg, "qk_nope_head_dim", where=where)),
            "qk_rope_head_dim": int(_req(cfg, "qk_rope_head_dim", where=where)),
            "v_head_dim": int(_req(cfg, "v_head_dim", where=where)),
        }
        arch["mixer_pattern"] = ["mla"]
    else:
        arch["attention"] = {
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": head_dim,
            "sinks": mtype == "gpt_oss",
        }
    # --- layer pattern
    if cfg.get("hybrid_override_pattern"):
        arch["hybrid_override_pattern"] = str(cfg["hybrid_override_pattern"])
        arch["ssm"] = {
            "num_heads": int(_req(cfg, "mamba_num_heads", where=where)),
            "head_dim": int(_req(cfg, "mamba_head_dim", where=where)),
            "d_state": int(_req(cfg, "ssm_state_size", where=where)),
            "n_groups": int(cfg.get("n_groups") or 1),
            "conv_kernel": int(cfg.get("conv_kernel") or 4),
        }
        if cfg.get("attention_head_dim"):
            arch["attention"]["head_dim"] = int(cfg["attention_head_dim"])
        arch["ffn_gated"] = False  # Nemotron-H MLP layers: squared-ReLU up/down (2 matrices)
    elif isinstance(cfg.get("layer_types"), list) and "attention" in arch:
        arch["mixer_pattern"] = _pattern_from_layer_types(cfg["layer_types"], where)
        if len(arch["mixer_pattern"]) != L:
            raise ConfigError(
                f"{where}: layer_types has {len(arch['mixer_pattern'])} entries, num_hidden_layers is {L}"
            )
    elif mtype.startswith("gemma3") and window:
        period = int(cfg.get("sliding_window_pattern") or 6)
        arch["mixer_pattern"] = ["sliding"] * (period - 1) + ["full"]
        notes.append(f"Gemma 3 layer pattern from sliding_window_pattern={period}")
    elif window and cfg.get("use_sliding_window", mtype not in ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")):
        arch["mixer_pattern"] = ["sliding"]
    if "attention" in arch and ("sliding" in arch.get("mixer_pattern", [])):
        if not window:
            raise ConfigError(
                f"{where}: layer_types has sliding_attention layers but no sliding_window is set; "
                "add sliding_window (tokens) to the config.json"
            )
        arch["attention"]["sliding_window"] = int(window)
    # --- FFN / MoE
    n_exp = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    if n_exp and int(n_exp) > 1:
        k = int(_req(cfg, "num_experts_per_tok", "experts_per_token", where=where))
        exp_ffn = int(cfg.get("moe_intermediate_size") or _req(cfg, "intermediate_size", where=where))
        shared = int(cfg.get("n_shared_experts") or (1 if cfg.get("shared_expert_intermediate_size") else 0))
        moe: dict[str, Any] = {
            "num_experts": int(n_exp),
            "experts_per_token": k,
            "expert_intermediate": exp_ffn,
            "shared_experts": shared,
            "first_dense_layers": int(cfg.get("first_k_dense_replace") or 0),
        }
        if cfg.get("shared_expert_intermediate_size"):
            moe["shared_intermediate"] = int(cfg["shared_expert_intermediate_size"])
        arch["moe"] = moe
        dense_ffn = cfg.get("intermediate_size") if cfg.get("moe_intermediate_size") else None
        if dense_ffn:
            arch["ffn_intermediate"] = int(dense_ffn)
        mlp_only = set(cfg.get("mlp_only_layers") or [])
        step = int(cfg.get("decoder_sparse_step") or 1)
        if mlp_only or step > 1:
            arch["ffn_intermediate"] = int(_req(cfg, "intermediate_size", where=where))
            arch["ffn_pattern"] = ["dense" if (i in mlp_only or (i + 1) % step) else "moe" for i in range(L)]
    else:
        arch["ffn_intermediate"] = int(_req(cfg, "intermediate_size", "n_inner", "ffn_dim", where=where))
    nextn = int(cfg.get("num_nextn_predict_layers") or 0)
    if nextn:
        components.append(
            {
                "name": f"MTP module x{nextn} (num_nextn_predict_layers)",
                "role": "mtp",
                "params": nextn * _mtp_params(arch),
                "decoder_layers": nextn,
                "note": "computed as one decoder layer + projection each",
            }
        )
    return arch, components, notes


def read_hf_config(path: str | Path) -> ModelEntry:
    """Read a Hugging Face ``config.json`` (or a folder holding one) into a :class:`ModelEntry`.

    ``published_params.total`` is computed from the architecture (marked so in ``notes``).
    Raises :class:`ConfigError` when the file is missing, not JSON, or not a supported decoder.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read {p}: {e.strerror or e}") from e
    except ValueError as e:
        raise ConfigError(f"{p} is not JSON ({e}); pass a Hugging Face config.json") from e
    if not isinstance(cfg, dict):
        raise ConfigError(f"{p} is not a JSON object; pass a Hugging Face config.json")
    try:
        arch, components, notes = architecture_from_hf(cfg, where=str(p))
    except ConfigError:
        raise
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as e:
        # a field of the wrong type or an impossible value (e.g. "head_dim": "x", 0 heads)
        raise ConfigError(
            f"{p}: a field has an unusable value ({e}); fix the config.json (numbers must be "
            "positive integers) or pass the checkpoint's original config.json"
        ) from None
    name = str(cfg.get("_name_or_path") or p.parent.name or "model").lower()
    return _entry(
        name=name,
        family=str(cfg.get("model_type", "unknown")),
        arch=arch,
        components=components,
        notes=[f"read from {p}", *notes],
        source=HF_CONFIG_DOC,
        native=(
            "fp8"
            if (cfg.get("quantization_config") or {}).get("quant_method") == "fp8"
            else "mxfp4-experts"
            if (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4"
            else "bf16"
        ),
    )


def _entry(
    name: str,
    family: str,
    arch: dict[str, Any],
    components: list[dict[str, Any]],
    notes: list[str],
    source: str,
    native: str,
) -> ModelEntry:
    safe = re.sub(r"[^a-z0-9_.+-]+", "-", name.lower()).strip("-.") or "model"
    data = {
        "name": safe,
        "display_name": name,
        "family": family,
        "kind": "decoder",
        "tasks": ["chat"],
        "native_dtype": native,
        "architecture": arch,
        "components": components,
        "published_params": {"total": 1.0},
        "source": source,
        "checked": _today(),
        "verified": [],
        "unconfirmed": ["published_params"],
        "notes": notes,
    }
    entry = entry_from_dict(data, where=notes[0].removeprefix("read from ") if notes else None)
    total = total_params(entry)
    return entry.model_copy(
        update={
            "published_params": entry.published_params.model_copy(
                update={"total": total, "note": "computed from the architecture, not published"}
            )
        }
    )


# ---------------------------------------------------------------------------------------------------
# GGUF


def _arch_key(meta: dict[str, Any], arch: str, key: str) -> Any:
    return meta.get(f"{arch}.{key}")


def read_gguf(path: str | Path) -> ModelEntry:
    """Read a GGUF file's header into a :class:`ModelEntry` (no tensor data is read).

    Raises :class:`ConfigError` when the file is not a GGUF or lacks the keys of a decoder.
    """
    p = check_gguf(path)
    meta = read_metadata(p)
    arch = str(meta.get("general.architecture") or "")
    where = f"{p} (GGUF arch {arch!r})"

    def need(key: str) -> Any:
        v = _arch_key(meta, arch, key)
        if v is None:
            raise ConfigError(f"{where}: missing {arch}.{key}; not a decoder servelab can plan for")
        return v

    L = int(need("block_count"))
    hidden = int(need("embedding_length"))
    heads = need("attention.head_count")
    heads = int(max(heads)) if isinstance(heads, list) else int(heads)
    kv = _arch_key(meta, arch, "attention.head_count_kv")
    kv_list = kv if isinstance(kv, list) else None
    kv_heads = int(max(kv_list)) if kv_list else int(kv or heads)
    key_len = int(_arch_key(meta, arch, "attention.key_length") or hidden // heads)
    val_len = int(_arch_key(meta, arch, "attention.value_length") or key_len)
    vocab = _arch_key(meta, arch, "vocab_size") or model_summary(p).get("vocab_size") or 0
    tensors = gguf_tensor_bytes(p)
    a: dict[str, Any] = {
        "num_layers": L,
        "hidden_size": hidden,
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensors.names,
        "max_context": int(_arch_key(meta, arch, "context_length") or 4096),
    }
    notes = [
        f"read from {p}",
        f"GGUF file type {model_summary(p).get('file_type_name')}",
        f"tensor data {tensors.total_bytes} bytes ({tensors.bits_per_weight:.2f} bits/weight over "
        f"{tensors.total_elements} weights)",
    ]
    kv_lora = _arch_key(meta, arch, "attention.kv_lora_rank")
    if kv_lora:
        rope = int(_arch_key(meta, arch, "rope.dimension_count") or 64)
        a["mla"] = {
            "num_heads": heads,
            "q_lora_rank": _arch_key(meta, arch, "attention.q_lora_rank") or None,
            "kv_lora_rank": int(kv_lora),
            "qk_nope_head_dim": max(1, key_len - rope),
            "qk_rope_head_dim": rope,
            "v_head_dim": val_len,
        }
        a["mixer_pattern"] = ["mla"]
    else:
        a["attention"] = {
            "num_heads": heads,
            "num_kv_heads": kv_heads,
            "head_dim": key_len,
            "v_head_dim": val_len if val_len != key_len else None,
        }
        window = _arch_key(meta, arch, "attention.sliding_window")
        if window:
            a["attention"]["sliding_window"] = int(window)
            pattern = _arch_key(meta, arch, "attention.sliding_window_pattern")
            if isinstance(pattern, list):
                a["mixer_pattern"] = ["sliding" if x else "full" for x in pattern]
            else:
                n = int(pattern or GGUF_SWA_PERIOD.get(arch, 1))
                a["mixer_pattern"] = ["sliding"] * (n - 1) + ["full"] if n > 1 else ["sliding"]
        if kv_list and any(x == 0 for x in kv_list):  # hybrid: layers without KV heads are recurrent (Mamba)
            a["mixer_pattern"] = ["full" if x else "mamba2" for x in kv_list]
    ssm_state = _arch_key(meta, arch, "ssm.state_size")
    if ssm_state:
        inner = int(need("ssm.inner_size"))
        n_heads = int(_arch_key(meta, arch, "ssm.time_step_rank") or inner // 64)
        a["ssm"] = {
            "num_heads": n_heads,
            "head_dim": inner // n_heads,
            "d_state": int(ssm_state),
            "n_groups": int(_arch_key(meta, arch, "ssm.group_count") or 1),
            "conv_kernel": int(_arch_key(meta, arch, "ssm.conv_kernel") or 4),
        }
        if "mixer_pattern" not in a or a["mixer_pattern"] == ["full"]:
            a["mixer_pattern"] = ["mamba2"]
    n_exp = _arch_key(meta, arch, "expert_count")
    if n_exp:
        exp_ffn = _arch_key(meta, arch, "expert_feed_forward_length") or need("feed_forward_length")
        a["moe"] = {
            "num_experts": int(n_exp),
            "experts_per_token": int(need("expert_used_count")),
            "expert_intermediate": int(exp_ffn),
            "shared_experts": int(_arch_key(meta, arch, "expert_shared_count") or 0),
            "first_dense_layers": int(_arch_key(meta, arch, "leading_dense_block_count") or 0),
        }
        if a["moe"]["first_dense_layers"] or a["moe"]["shared_experts"]:
            a["ffn_intermediate"] = int(need("feed_forward_length"))
    else:
        ffn = need("feed_forward_length")
        a["ffn_intermediate"] = int(max(ffn)) if isinstance(ffn, list) else int(ffn)
    name = str(meta.get("general.name") or p.stem)
    entry = _entry(name=name, family=arch, arch=a, components=[], notes=notes, source=GGUF_SPEC, native="bf16")
    return entry.model_copy(update={"notes": [*entry.notes, f"gguf_weight_bytes={tensors.total_bytes}"]})


@dataclass(frozen=True)
class GGUFTensors:
    """Tensor table summary of a GGUF file. ``by_type``: ggml type name -> (tensors, elements, bytes).
    ``names``: every tensor name. ``total_bytes``: sum of tensor data sizes (what llama.cpp reports as
    ``file size`` in ``print_info`` and loads as the model buffers)."""

    by_type: dict[str, tuple[int, int, int]]
    names: frozenset[str]
    total_bytes: int
    total_elements: int

    @property
    def bits_per_weight(self) -> float:
        """Average stored bits per weight over all tensors."""
        return 8 * self.total_bytes / max(1, self.total_elements)


def _skip_value(buf: mmap.mmap, pos: int, vtype: int) -> int:
    """Offset just past one GGUF metadata value of type ``vtype`` starting at ``pos``."""
    fixed = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    if vtype in fixed:
        return pos + fixed[vtype]
    if vtype == 8:  # string
        (n,) = struct.unpack_from("<Q", buf, pos)
        return pos + 8 + n
    if vtype == 9:  # array
        etype, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if etype in fixed:
            return pos + fixed[etype] * count
        for _ in range(count):
            pos = _skip_value(buf, pos, etype)
        return pos
    raise ConfigError(f"unknown GGUF value type {vtype}")


def gguf_tensor_bytes(path: str | Path) -> GGUFTensors:
    """Read the tensor-info table of a GGUF file (name, dims, ggml type per tensor; layout in
    https://github.com/ggml-org/ggml/blob/master/docs/gguf.md, read 2026-11-30) and sum the stored bytes
    per ggml type with the block sizes of the ``gguf`` package (``GGML_QUANT_SIZES``: e.g. Q4_K = 256
    weights in 144 bytes = 4.5 bits/weight, Q8_0 = 32 in 34 = 8.5, Q6_K = 256 in 210 = 6.5625).

    Raises :class:`ConfigError` for a non-GGUF or truncated file.
    """
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    p = check_gguf(path)
    by_type: dict[str, list[int]] = {}
    names: set[str] = set()
    total_b = total_e = 0
    with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            _, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
            pos = 24
            for _ in range(n_kv):
                (klen,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + klen
                (vtype,) = struct.unpack_from("<I", buf, pos)
                pos = _skip_value(buf, pos + 4, vtype)
            for _ in range(n_tensors):
                (nlen,) = struct.unpack_from("<Q", buf, pos)
                name = buf[pos + 8 : pos + 8 + nlen].decode("utf-8", "replace")
                pos += 8 + nlen
                (ndim,) = struct.unpack_from("<I", buf, pos)
                dims = struct.unpack_from(f"<{ndim}Q", buf, pos + 4)
                pos += 4 + 8 * ndim
                ttype, _offset = struct.unpack_from("<IQ", buf, pos)
                pos += 12
                n = 1
                for d in dims:
                    n *= d
                qt = GGMLQuantizationType(ttype)
                block, size = GGML_QUANT_SIZES[qt]
                nbytes = n // block * size
                rec = by_type.setdefault(qt.name, [0, 0, 0])
                rec[0] += 1
                rec[1] += n
                rec[2] += nbytes
                names.add(name)
                total_b += nbytes
                total_e += n
        except (struct.error, ValueError, KeyError) as e:
            raise ConfigError(f"{p}: cannot read the GGUF tensor table ({e}); the file may be truncated") from e
    return GGUFTensors({k: (v[0], v[1], v[2]) for k, v in by_type.items()}, frozenset(names), total_b, total_e)


def read_model_file(path: str | Path) -> ModelEntry:
    """Dispatch on the file: a GGUF (by magic), a ``config.json``, or a folder with a ``config.json``.
    Raises :class:`ConfigError` for anything else."""
    p = Path(path).expanduser()
    if p.is_file():
        with open(p, "rb") as fh:
            head = fh.read(4)
        if head == b"GGUF":
            return read_gguf(p)
        if p.suffix.lower() == ".gguf":
            check_gguf(p)  # raises: names the first bytes and what the file looks like instead
        if head[:1] not in (b"{", b" ", b"\n", b"\r", b"\t"):
            raise ConfigError(
                f"{p} is neither a GGUF file (no 'GGUF' magic; first bytes {head!r}) nor a "
                "config.json; pass a .gguf file, a Hugging Face config.json or its folder"
            )
        return read_hf_config(p)
    if p.is_dir() and (p / "config.json").is_file():
        return read_hf_config(p)
    raise ConfigError(f"{p}: neither a .gguf file, a config.json, nor a folder with a config.json")
