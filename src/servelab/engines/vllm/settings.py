"""The settings of the engine kind ``vllm``: the single definition, validated for an experiment's
``engine: vllm`` candidate and for :class:`~servelab.engines.vllm.launch.VllmLauncher` alike."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from servelab.engines.envsettings import EnvSettings
from servelab.engines.kind import PortSetting, ready_timeout_setting

__all__ = ["VllmSettings"]

#: ``--dtype`` names servelab passes on; vLLM's aliases are refused with the name to write instead
_DTYPE_ALIASES = {"half": "float16", "float": "float32"}


class VllmSettings(EnvSettings):
    """vLLM (CPU build) settings: the single definition (the experiment's ``settings`` of an
    ``engine: vllm`` candidate and :class:`VllmLauncher`'s ``settings`` are validated by it).

    ``max_num_seqs``: max sequences per batch (``--max-num-seqs``, default 16); ``max_model_len``:
    context length in tokens (``--max-model-len``, >= 16, default 2048); ``dtype``: ``--dtype``, one of
    ``auto``, ``bfloat16`` (default), ``float16``, ``float32`` (vLLM's aliases ``half``/``float`` are
    refused, naming the spelling to use, so that one dtype has one name in records); ``enforce_eager``:
    no graph compilation (start ~50 s instead of 110-190 s, default true); ``served_model_name``: the id
    it serves (``None`` = ``gemma-3-270m`` for the default weights, else the model's file/folder name);
    ``extra_args``: appended verbatim; ``env``: extra environment variables (numbers become strings,
    e.g. ``VLLM_CPU_KVCACHE_SPACE: 2``, GiB; secret values, by name or listed in ``secret_env``, are
    recorded as fingerprints, :class:`~servelab.engines.envsettings.EnvSettings`); ``port``: ``None`` = a
    free port; ``ready_timeout_s``:
    seconds to wait for ``/health`` 200 (default 600: a first start converts nothing but loads torch).
    """

    max_num_seqs: int = Field(16, ge=1, description="--max-num-seqs: concurrent sequences")
    max_model_len: int = Field(2048, ge=16, description="--max-model-len, tokens (>= 16)")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("bfloat16", description="--dtype")
    enforce_eager: bool = Field(True, description="--enforce-eager: no compilation, faster start")
    served_model_name: str | None = Field(None, min_length=1, description="served model id; null = launcher default")
    extra_args: list[str] = Field(default_factory=list, description="extra command-line arguments, verbatim")
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(600.0)

    @field_validator("dtype", mode="before")
    @classmethod
    def _dtype_alias(cls, v: Any) -> Any:
        if isinstance(v, str) and v in _DTYPE_ALIASES:
            raise ValueError(
                f"{v!r} is vLLM's alias of {_DTYPE_ALIASES[v]}; write dtype: {_DTYPE_ALIASES[v]} "
                "(servelab accepts auto, bfloat16, float16, float32)"
            )
        return v
