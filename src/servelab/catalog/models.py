"""The models catalog (``catalog/data/models.yaml``): architecture parameters that decide serving capacity.

Each entry holds what the capacity planner (:mod:`servelab.plan`) needs and nothing it does not: layer
count, hidden size, heads / KV heads / head dim, the **token mixer of every layer** (full attention,
sliding-window attention with its window, MLA with ``kv_lora_rank`` + ``qk_rope_head_dim``, a Mamba-2
state-space layer, or none), MoE (experts, active experts, shared experts, expert FFN size, which layers
are dense), vocabulary and tied embeddings, trained context, every extra component (vision/audio/text
encoder, VAE, MTP module, draft model) with its parameter count, and the published total/active
parameter counts. Every entry carries ``source`` (URL of the config.json or model card the numbers
were read against) and ``checked`` (date); ``verified`` says how the numbers were cross-checked and
``unconfirmed`` names the fields that were *not* confirmed against a primary source.

Layer pattern: ``mixer_pattern`` and ``ffn_pattern`` repeat cyclically over ``num_layers`` (Gemma 3:
``[sliding]*5 + [full]``; gpt-oss: ``[sliding, full]``), or ``hybrid_override_pattern`` gives one
character per layer in NVIDIA's Nemotron-H notation (``M`` Mamba-2, ``*`` attention, ``-`` MLP,
``E`` MoE; https://huggingface.co/nvidia/Nemotron-H-8B-Base-8K/blob/main/config.json, read 2026-11-30).

:func:`find_model` also accepts a Hugging Face ``config.json`` (or its folder) or a ``.gguf`` file; those
go through :mod:`servelab.catalog.readers`.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import sys
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from servelab.catalog.schema import DATA_DIR, Sourced, json_schema
from servelab.wire.client import ConfigError

MODELS_FILE = DATA_DIR / "models.yaml"
MODELS_SCHEMA_FILE = DATA_DIR / "models.schema.json"

Mixer = Literal["full", "sliding", "mla", "mamba2", "none"]
Ffn = Literal["dense", "moe", "none"]
_HYBRID_CHARS: dict[str, tuple[Mixer, Ffn]] = {"M": ("mamba2", "none"), "*": ("full", "none"),
                                               "-": ("none", "dense"), "E": ("none", "moe")}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Attention(_Strict):
    """Softmax attention of the full/sliding layers. ``head_dim`` is the K (and Q) head size;
    ``v_head_dim`` defaults to it. ``sliding_window``: tokens a sliding layer attends to.
    ``sinks``: learned attention-sink logits per head (gpt-oss) — parameters only, no KV."""

    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    v_head_dim: int | None = Field(None, ge=1)
    sliding_window: int | None = Field(None, ge=1)
    sinks: bool = False

    @model_validator(mode="after")
    def _gqa(self) -> Attention:
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}): "
                             "each KV head serves a whole group of query heads")
        return self

    @property
    def v_dim(self) -> int:
        """V head size (``v_head_dim`` or ``head_dim``)."""
        return self.v_head_dim or self.head_dim


class MLA(_Strict):
    """Multi-head latent attention (DeepSeek-V2 §2.1, https://arxiv.org/abs/2405.04434, read
    2026-11-30): the cache holds one compressed latent of ``kv_lora_rank`` plus a shared RoPE key of
    ``qk_rope_head_dim`` per token and layer."""

    num_heads: int = Field(ge=1)
    q_lora_rank: int | None = Field(None, ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class SSM(_Strict):
    """Mamba-2 mixer (https://arxiv.org/abs/2405.21060, read 2026-11-30). ``d_inner = num_heads *
    head_dim``. Per sequence it keeps a conv state of ``(d_inner + 2*n_groups*d_state) x (conv_kernel-1)``
    and an SSM state of ``num_heads x head_dim x d_state``, constant in context length."""

    kind: Literal["mamba2"] = "mamba2"
    num_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    d_state: int = Field(ge=1)
    n_groups: int = Field(ge=1)
    conv_kernel: int = Field(ge=2)

    @property
    def d_inner(self) -> int:
        """Inner width ``num_heads * head_dim``."""
        return self.num_heads * self.head_dim


class MoE(_Strict):
    """Mixture of experts. ``experts_per_token``: routed experts active per token; ``shared_experts``
    run for every token (``shared_intermediate`` each, default ``expert_intermediate``).
    ``first_dense_layers``: leading layers with a dense FFN (DeepSeek ``first_k_dense_replace``)."""

    num_experts: int = Field(ge=1)
    experts_per_token: int = Field(ge=1)
    expert_intermediate: int = Field(ge=1)
    shared_experts: int = Field(0, ge=0)
    shared_intermediate: int | None = Field(None, ge=1)
    first_dense_layers: int = Field(0, ge=0)

    @model_validator(mode="after")
    def _k(self) -> MoE:
        if self.experts_per_token > self.num_experts:
            raise ValueError(f"experts_per_token ({self.experts_per_token}) > num_experts ({self.num_experts})")
        return self


class Architecture(_Strict):
    """The backbone (decoder, encoder, or diffusion transformer) of a model.

    ``ffn_intermediate``: dense FFN width; ``ffn_gated``: SwiGLU/GeGLU (3 matrices) vs. plain (2).
    ``cross_attention_tokens``: encoder tokens every layer cross-attends to (Whisper: 1500 audio frames;
    a video DiT: the text tokens), which adds a per-sequence constant cache for decoders.
    ``causal``: False for encoder-only (embedding) and diffusion models: they keep no KV cache.
    """

    num_layers: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    vocab_size: int = Field(0, ge=0)
    tie_word_embeddings: bool = False
    max_context: int = Field(ge=1)
    ffn_intermediate: int | None = Field(None, ge=1)
    ffn_gated: bool = True
    attention: Attention | None = None
    mla: MLA | None = None
    ssm: SSM | None = None
    moe: MoE | None = None
    mixer_pattern: list[Mixer] = Field(default_factory=lambda: ["full"], min_length=1)
    ffn_pattern: list[Ffn] | None = None
    hybrid_override_pattern: str | None = None
    cross_attention_tokens: int = Field(0, ge=0)
    causal: bool = True
    position_embeddings: int = Field(0, ge=0, description="learned absolute position rows (BERT, Whisper)")

    @model_validator(mode="after")
    def _consistent(self) -> Architecture:
        if self.hybrid_override_pattern is not None:
            bad = sorted(set(self.hybrid_override_pattern) - set(_HYBRID_CHARS))
            if bad:
                raise ValueError(f"hybrid_override_pattern has unknown characters {bad} (allowed M * - E)")
            if len(self.hybrid_override_pattern) != self.num_layers:
                raise ValueError(f"hybrid_override_pattern has {len(self.hybrid_override_pattern)} characters "
                                 f"but num_layers is {self.num_layers}")
        mixers = set(self.layer_mixers())
        ffns = set(self.layer_ffns())
        if mixers & {"full", "sliding"} and self.attention is None:
            raise ValueError("layers use full/sliding attention but 'attention' is missing")
        if "sliding" in mixers and (self.attention is None or self.attention.sliding_window is None):
            raise ValueError("sliding layers need attention.sliding_window")
        if "mla" in mixers and self.mla is None:
            raise ValueError("MLA layers need 'mla'")
        if "mamba2" in mixers and self.ssm is None:
            raise ValueError("Mamba-2 layers need 'ssm'")
        if "moe" in ffns and self.moe is None:
            raise ValueError("MoE layers need 'moe'")
        if "dense" in ffns and self.ffn_intermediate is None:
            raise ValueError("dense FFN layers need ffn_intermediate")
        return self

    def layer_mixers(self) -> list[Mixer]:
        """Token mixer of every layer, index 0 first (length ``num_layers``)."""
        if self.hybrid_override_pattern is not None:
            return [_HYBRID_CHARS[c][0] for c in self.hybrid_override_pattern]
        p = self.mixer_pattern
        return [p[i % len(p)] for i in range(self.num_layers)]

    def layer_ffns(self) -> list[Ffn]:
        """FFN kind of every layer: ``dense``, ``moe`` (after ``moe.first_dense_layers``) or ``none``."""
        if self.hybrid_override_pattern is not None:
            return [_HYBRID_CHARS[c][1] for c in self.hybrid_override_pattern]
        if self.ffn_pattern is not None:
            p = self.ffn_pattern
            return [p[i % len(p)] for i in range(self.num_layers)]
        if self.moe is not None:
            return ["dense" if i < self.moe.first_dense_layers else "moe" for i in range(self.num_layers)]
        return ["dense"] * self.num_layers


class Component(_Strict):
    """A part of the served model besides the backbone: ``role`` vision_encoder, audio_encoder,
    text_encoder, vae, vocoder, projector, mtp (multi-token-prediction module), draft (speculative
    draft model). ``params``: parameter count; ``in_memory``: loaded by default when serving."""

    name: str
    role: Literal["vision_encoder", "audio_encoder", "text_encoder", "vae", "vocoder", "projector", "mtp", "draft"]
    params: float = Field(gt=0)
    in_memory: bool = True
    note: str | None = None


class PublishedParams(_Strict):
    """Parameter counts as the publisher states them (model card / paper)."""

    total: float = Field(gt=0)
    active: float | None = Field(None, gt=0)
    note: str | None = None


class VideoSpec(_Strict):
    """Latent geometry of a video diffusion model: the VAE compresses (t, h, w) by ``vae_stride`` into
    ``latent_channels``, the DiT patchifies by ``patch_size``. Tokens per clip = ceil((frames-1)/st + 1)
    * (H/sh/ph) * (W/sw/pw)."""

    vae_stride: tuple[int, int, int]
    patch_size: tuple[int, int, int]
    latent_channels: int = Field(ge=1)
    text_tokens: int = Field(ge=1)

    def latent_tokens(self, width: int, height: int, frames: int) -> int:
        """DiT sequence length for one clip of ``frames`` frames at ``width`` x ``height`` pixels."""
        st, sh, sw = self.vae_stride
        pt, ph, pw = self.patch_size
        t = (frames - 1) // st + 1
        return -(-t // pt) * (height // sh // ph) * (width // sw // pw)


class ModelEntry(Sourced):
    """One model of the catalog (see the module docstring). ``kind``: ``decoder`` (autoregressive LLM),
    ``encoder`` (embedding/reranker: no KV cache), ``encoder-decoder`` (Whisper), ``diffusion`` (a
    video/image DiT: no KV cache; capacity is set by latent tokens and activations).
    ``native_dtype``: how the publisher ships the weights (``fp8`` = DeepSeek 128x128 block-scaled FP8;
    ``mxfp4-experts`` = gpt-oss: MoE expert weights MXFP4, the rest BF16)."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.+-]*$")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    family: str
    kind: Literal["decoder", "encoder", "encoder-decoder", "diffusion"]
    tasks: list[str] = Field(min_length=1)
    hf_repo: str | None = None
    native_dtype: Literal["bf16", "fp16", "fp32", "fp8", "mxfp4-experts"] = "bf16"
    architecture: Architecture
    components: list[Component] = Field(default_factory=list)
    published_params: PublishedParams
    video: VideoSpec | None = None
    verified: list[str] = Field(default_factory=list, description="how the numbers were cross-checked")
    unconfirmed: list[str] = Field(default_factory=list, description="fields not confirmed against a primary source")
    notes: list[str] = Field(default_factory=list)

    @field_validator("aliases")
    @classmethod
    def _aliases(cls, v: list[str]) -> list[str]:
        return [a.strip() for a in v if a.strip()]


class ModelCatalog(_Strict):
    """The file ``models.yaml``: ``models`` is the list of entries (unique names and aliases)."""

    models: list[ModelEntry] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> ModelCatalog:
        seen: dict[str, str] = {}
        for m in self.models:
            for key in [m.name, *m.aliases]:
                k = key.lower()
                if k in seen and seen[k] != m.name:
                    raise ValueError(f"name/alias {key!r} used by both {seen[k]} and {m.name}")
                seen[k] = m.name
        return self


def _format_error(e: ValidationError, path: Path) -> str:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err["loc"])
    return f"{path}: {loc}: {err['msg']} ({len(e.errors())} error(s))"


def load_catalog(path: str | Path | None = None) -> ModelCatalog:
    """Read and validate a models YAML file (default: the packaged ``models.yaml``).

    Raises :class:`ConfigError` (one line with the path of the first bad field) when the file cannot be
    read, is not YAML, or fails validation (a missing ``source``/``checked`` included).
    """
    p = Path(path) if path is not None else MODELS_FILE
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read models catalog {p}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"{p} is not valid YAML: {e}") from e
    try:
        return ModelCatalog.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(_format_error(e, p)) from e


@functools.lru_cache(maxsize=1)
def _packaged() -> ModelCatalog:
    return load_catalog(MODELS_FILE)


def load_models() -> list[ModelEntry]:
    """All entries of the packaged models catalog, in file order (validated once, then cached)."""
    return list(_packaged().models)


def _index() -> dict[str, ModelEntry]:
    out: dict[str, ModelEntry] = {}
    for m in load_models():
        for key in [m.name, *m.aliases]:
            out[key.lower()] = m
    return out


def find_model(name_or_path: str | Path) -> ModelEntry:
    """Resolve a catalog name/alias (case-insensitive), a path to a Hugging Face ``config.json`` or a
    folder holding one, or a ``.gguf`` file, to a :class:`ModelEntry`.

    Files are read by :func:`servelab.catalog.readers.read_model_file`; the entry it returns has
    ``source`` = ``file://...`` semantics recorded in ``notes`` (its ``source`` stays an http URL of the
    format's spec). Raises :class:`ConfigError` naming the closest catalog names (difflib) when the name
    is unknown and no such file exists, or when a file cannot be read.
    """
    key = str(name_or_path).strip()
    hit = _index().get(key.lower())
    if hit is not None:
        return hit
    p = Path(key).expanduser()
    if p.exists():
        from servelab.catalog.readers import read_model_file

        return read_model_file(p)
    if "/" in key or "\\" in key or p.suffix.lower() in (".gguf", ".json"):
        raise ConfigError(f"model file {key!r} not found; check the path, or pass a catalog name "
                          "(`servelab catalog models` lists them)")
    names = sorted({m.name for m in load_models()} | {a for m in load_models() for a in m.aliases})
    near = difflib.get_close_matches(key, names, n=3, cutoff=0.4)
    if not near:
        near = difflib.get_close_matches(key.lower(), [n.lower() for n in names], n=3, cutoff=0.3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise ConfigError(f"unknown model {key!r}: not in the models catalog and not a config.json/GGUF path{hint} "
                      "(list them with `servelab catalog models`, or pass a config.json or .gguf path)")


def schema_text() -> str:
    """The published JSON Schema of ``models.yaml`` (draft 2020-12) as text."""
    return json.dumps(json_schema(ModelCatalog), indent=2, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    """``python -m servelab.catalog.models --write-schema | --check-schema``: regenerate or check
    ``catalog/data/models.schema.json``. Returns the exit code (1 = stale)."""
    ap = argparse.ArgumentParser(prog="python -m servelab.catalog.models", description=main.__doc__)
    ap.add_argument("--write-schema", action="store_true")
    ap.add_argument("--check-schema", action="store_true")
    a = ap.parse_args(argv)
    if a.write_schema:
        MODELS_SCHEMA_FILE.write_text(schema_text(), encoding="utf-8")
        print(MODELS_SCHEMA_FILE)
        return 0
    if a.check_schema:
        ok = MODELS_SCHEMA_FILE.exists() and MODELS_SCHEMA_FILE.read_text(encoding="utf-8") == schema_text()
        if not ok:
            print(f"{MODELS_SCHEMA_FILE} is out of date; run python -m servelab.catalog.models --write-schema",
                  file=sys.stderr)
        return 0 if ok else 1
    ap.print_help()
    return 0


def entry_from_dict(data: dict[str, Any], where: str | None = None) -> ModelEntry:
    """Validate one entry given as a dict (used by the readers). ``where``: the file it was read from,
    named in the error instead of the entry name. Raises :class:`ConfigError` (one line: the field and
    what is wrong with it)."""
    try:
        return ModelEntry.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        msg = str(err["msg"]).removeprefix("Value error, ")
        label = where or f"model {data.get('name')!r}"
        raise ConfigError(f"{label}: {'.'.join(str(x) for x in err['loc'])}: {msg}") from None


__all__ = ["MLA", "SSM", "Architecture", "Attention", "Component", "ModelCatalog", "ModelEntry", "MoE",
           "PublishedParams", "VideoSpec", "entry_from_dict", "find_model", "load_catalog", "load_models",
           "schema_text"]

if __name__ == "__main__":
    sys.exit(main())
