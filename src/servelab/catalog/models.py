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

Names and files (a Hugging Face ``config.json`` or its folder, a ``.gguf`` file) are resolved by
:func:`servelab.catalog.resolve.find_model`; files go through :mod:`servelab.catalog.readers`. This module
imports neither (the readers build :class:`ModelEntry` objects from this one).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from servelab.catalog.schema import DATA_DIR, Sourced, json_schema
from servelab.wire.config import FrozenModel, PublishedSchema, read_yaml_file, validation_error_line
from servelab.wire.errors import ConfigError

MODELS_FILE = DATA_DIR / "models.yaml"
MODELS_SCHEMA_FILE = DATA_DIR / "models.schema.json"

Mixer = Literal["full", "sliding", "mla", "mamba2", "none"]
Ffn = Literal["dense", "moe", "none"]
_ALL_FULL: tuple[Mixer, ...] = ("full",)  # the default layer pattern: full attention in every layer
_HYBRID_CHARS: dict[str, tuple[Mixer, Ffn]] = {
    "M": ("mamba2", "none"),
    "*": ("full", "none"),
    "-": ("none", "dense"),
    "E": ("none", "moe"),
}


class Attention(FrozenModel):
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
            raise ValueError(
                f"num_kv_heads ({self.num_kv_heads}) must divide num_heads ({self.num_heads}): "
                "each KV head serves a whole group of query heads"
            )
        return self

    @property
    def v_dim(self) -> int:
        """V head size (``v_head_dim`` or ``head_dim``)."""
        return self.v_head_dim or self.head_dim


class MLA(FrozenModel):
    """Multi-head latent attention (DeepSeek-V2 §2.1, https://arxiv.org/abs/2405.04434, read
    2026-11-30): the cache holds one compressed latent of ``kv_lora_rank`` plus a shared RoPE key of
    ``qk_rope_head_dim`` per token and layer."""

    num_heads: int = Field(ge=1)
    q_lora_rank: int | None = Field(None, ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class SSM(FrozenModel):
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


class MoE(FrozenModel):
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


class Architecture(FrozenModel):
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
    mixer_pattern: list[Mixer] = Field(default_factory=lambda: list(_ALL_FULL), min_length=1)
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
                raise ValueError(
                    f"hybrid_override_pattern has {len(self.hybrid_override_pattern)} characters "
                    f"but num_layers is {self.num_layers}"
                )
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


class Component(FrozenModel):
    """A part of the served model besides the backbone: ``role`` vision_encoder, audio_encoder,
    text_encoder, vae, vocoder, projector, mtp (multi-token-prediction module), draft (speculative
    draft model). ``params``: parameter count; ``in_memory``: loaded by default when serving.
    ``decoder_layers``: decoder layers of an MTP module or draft (DeepSeek-V3 ``num_nextn_predict_layers``);
    each keeps its own KV cache when it runs, so ``servelab plan --speculative mtp`` counts their KV."""

    name: str
    role: Literal["vision_encoder", "audio_encoder", "text_encoder", "vae", "vocoder", "projector", "mtp", "draft"]
    params: float = Field(gt=0)
    in_memory: bool = True
    decoder_layers: int = Field(0, ge=0, description="decoder layers with their own KV cache (MTP depth)")
    note: str | None = None


class PublishedParams(FrozenModel):
    """Parameter counts as the publisher states them (model card / paper)."""

    total: float = Field(gt=0)
    active: float | None = Field(None, gt=0)
    note: str | None = None


class VideoSpec(FrozenModel):
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


class ModelCatalog(FrozenModel):
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


def load_catalog(path: str | Path | None = None) -> ModelCatalog:
    """Read and validate a models YAML file (default: the packaged ``models.yaml``).

    Raises :class:`ConfigError` (one line with the path of the first bad field) when the file cannot be
    read, is not YAML, or fails validation (a missing ``source``/``checked`` included).
    """
    p = Path(path) if path is not None else MODELS_FILE
    raw = read_yaml_file(
        p,
        what="models catalog",
        missing_fix="give a models YAML file (the packaged one: catalog/data/models.yaml)",
        empty_fix="write a models: list (see catalog/data/models.yaml)",
    )
    try:
        return ModelCatalog.model_validate(raw)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, str(p), ModelCatalog)) from None


@functools.lru_cache(maxsize=1)
def _packaged() -> ModelCatalog:
    return load_catalog(MODELS_FILE)


def load_models() -> list[ModelEntry]:
    """All entries of the packaged models catalog, in file order (validated once, then cached)."""
    return list(_packaged().models)


def schema_text() -> str:
    """The published JSON Schema of ``models.yaml`` (draft 2020-12) as text."""
    return PUBLISHED_SCHEMA.text()


#: ``models.schema.json``, written and checked by ``servelab schema write|check``.
PUBLISHED_SCHEMA = PublishedSchema(MODELS_SCHEMA_FILE, lambda: json_schema(ModelCatalog))


def entry_from_dict(data: dict[str, Any], where: str | None = None) -> ModelEntry:
    """Validate one entry given as a dict (used by the readers). ``where``: the file it was read from,
    named in the error instead of the entry name. Raises :class:`ConfigError` (one line: the field and
    what is wrong with it)."""
    try:
        return ModelEntry.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, where or f"model {data.get('name')!r}", ModelEntry)) from None


__all__ = [
    "MLA",
    "PUBLISHED_SCHEMA",
    "SSM",
    "Architecture",
    "Attention",
    "Component",
    "ModelCatalog",
    "ModelEntry",
    "MoE",
    "PublishedParams",
    "VideoSpec",
    "entry_from_dict",
    "load_catalog",
    "load_models",
    "schema_text",
]
