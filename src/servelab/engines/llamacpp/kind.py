"""The engine kind ``llamacpp``: its settings (the single definition), llama-server's metric names, and
the kind the registry loads (``servelab.engines.llamacpp.kind:LlamaCppKind``)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from servelab.engines.kind import EngineKind, EngineSettings, PortSetting, ServerMetrics, ready_timeout_setting
from servelab.engines.llamacpp.launch import READINESS, LlamaCppLauncher

__all__ = ["LLAMACPP_METRICS", "LlamaCppKind", "LlamaCppSettings"]

#: llama-server's Prometheus names (``--metrics``; the metrics table of docs/engine-wire.md)
LLAMACPP_METRICS = ServerMetrics(
    running="llamacpp:requests_processing",
    waiting="llamacpp:requests_deferred",
    counters=("llamacpp:tokens_predicted_total", "llamacpp:prompt_tokens_total"),
    generation_tokens=("llamacpp:tokens_predicted_total",),
)


class LlamaCppSettings(EngineSettings):
    """llama-server settings (the single definition; :class:`LlamaCppLauncher` takes the same names).

    ``parallel``: slots = concurrent sequences (``-np``, default 4); ``ctx_size``: total KV context in
    tokens shared by the slots (``-c``, default 8192; 0 = the model's trained length); ``threads``: CPU
    threads (``-t``; ``None`` = llama-server's choice); ``extra_args``: appended verbatim; ``port``:
    ``None`` = a free port; ``ready_timeout_s``: seconds to wait for ``/health`` 200.
    """

    parallel: int = Field(4, ge=1, description="slots = concurrent sequences (-np)")
    ctx_size: int = Field(8192, ge=0, description="total KV context in tokens, shared by the slots (-c); 0 = model's")
    threads: int | None = Field(None, ge=1, description="CPU threads (-t); null = llama-server's choice")
    extra_args: list[str] = Field(default_factory=list, description="extra command-line arguments, verbatim")
    port: PortSetting = None
    ready_timeout_s: float = ready_timeout_setting(300.0)


class LlamaCppKind(EngineKind[LlamaCppSettings]):
    """``engine: llamacpp``: llama-server built and cached by servelab; ``model`` a GGUF file
    (``None`` = Gemma 3 270M Q4_K_M)."""

    kind = "llamacpp"
    title = "llama.cpp"
    summary = "llama-server launched by servelab; model: a GGUF file (null = Gemma 3 270M Q4_K_M)"
    Settings = LlamaCppSettings
    metrics = LLAMACPP_METRICS
    readiness = READINESS

    def launcher(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> LlamaCppLauncher:
        """:class:`LlamaCppLauncher` with ``settings`` (:class:`LlamaCppSettings`); ``kwargs`` go to it."""
        s = self.parse(settings)
        return LlamaCppLauncher(model, log_dir=log_dir, **{**kwargs, **s.model_dump()})
