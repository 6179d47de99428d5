"""The mock engine's self-description endpoints: per dialect, the identity endpoints of the engine it
imitates, in that engine's documented shape (sources in :mod:`servelab.engines.probe`), so identity
probing is tested against exactly what the engines publish.

Every version string names the mock (``servelab-mock-<version>``), so a mock is never mistaken for a
real engine in a record; the model path is the configured ``model``; ``context_tokens`` gives the
context fields, which are ``null`` when it is 0 (no limit: a made-up number would make clients refuse
long prompts the mock accepts).

Routes per dialect: ``vllm`` ``GET /version`` (and ``/v1/models`` carries ``owned_by: vllm``, ``root``,
``max_model_len``); ``sglang`` ``GET /get_model_info``, ``GET /get_server_info``; ``tgi`` ``GET /info``;
``llamacpp`` ``GET /props`` (``/v1/models`` ``owned_by: llamacpp`` with ``meta``); ``ollama``
``GET /api/version``, ``POST /api/show``, ``GET /api/tags``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from servelab import __version__

__all__ = ["MOCK_VERSION", "info_routes", "model_card"]

MOCK_VERSION = f"servelab-mock-{__version__}"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _ctx(context_tokens: int) -> int | None:
    """The context the mock states: ``context_tokens``, or ``None`` (not stated) when it has no limit."""
    return context_tokens or None


def model_card(dialect: str, model: str, context_tokens: int) -> dict[str, Any]:
    """The ``/v1/models`` entry for ``model`` as the engine of ``dialect`` writes it."""
    card: dict[str, Any] = {"id": model, "object": "model", "created": 0, "owned_by": "servelab-mock"}
    if dialect == "vllm":
        card.update(owned_by="vllm", root=model, parent=None, max_model_len=_ctx(context_tokens), permission=[])
    elif dialect == "llamacpp":
        card.update(
            owned_by="llamacpp",
            meta={
                "n_ctx": _ctx(context_tokens) or 0,
                "n_ctx_train": _ctx(context_tokens) or 0,
                "n_params": 0,
                "size": 0,
            },
        )
    return card


def _json(payload: dict[str, Any]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response(payload)

    return handler


def info_routes(dialect: str, model: str, context_tokens: int) -> list[tuple[str, str, Handler]]:
    """``(method, path, handler)`` for the identity endpoints of ``dialect`` (see the module doc)."""
    ctx = _ctx(context_tokens)
    if dialect == "vllm":
        return [("GET", "/version", _json({"version": MOCK_VERSION}))]
    if dialect == "sglang":
        return [
            (
                "GET",
                "/get_model_info",
                _json(
                    {
                        "model_path": model,
                        "tokenizer_path": model,
                        "is_generation": True,
                        "preferred_sampling_params": None,
                        "weight_version": "default",
                    }
                ),
            ),
            (
                "GET",
                "/get_server_info",
                _json(
                    {
                        "model_path": model,
                        "tokenizer_path": model,
                        "tp_size": 1,
                        "dp_size": 1,
                        "context_length": ctx,
                        "max_running_requests": None,
                        "version": MOCK_VERSION,
                    }
                ),
            ),
        ]
    if dialect == "tgi":
        return [
            (
                "GET",
                "/info",
                _json(
                    {
                        "model_id": model,
                        "model_sha": None,
                        "model_pipeline_tag": "text-generation",
                        "max_concurrent_requests": 128,
                        "max_best_of": 2,
                        "max_stop_sequences": 4,
                        "max_input_tokens": ctx - 1 if ctx else None,
                        "max_total_tokens": ctx,
                        "validation_workers": 2,
                        "max_client_batch_size": 4,
                        "router": "text-generation-router",
                        "version": MOCK_VERSION,
                        "sha": None,
                        "docker_label": None,
                    }
                ),
            )
        ]
    if dialect == "llamacpp":
        return [
            (
                "GET",
                "/props",
                _json(
                    {
                        "default_generation_settings": {"n_ctx": ctx or 0, "params": {}},
                        "total_slots": 1,
                        "model_path": model,
                        "model_alias": model,
                        "build_info": MOCK_VERSION,
                        "modalities": {"vision": False, "audio": False},
                    }
                ),
            )
        ]
    if dialect == "ollama":
        details = {
            "parent_model": "",
            "format": "gguf",
            "family": "mock",
            "families": ["mock"],
            "parameter_size": "0",
            "quantization_level": "F16",
        }

        async def show(request: web.Request) -> web.StreamResponse:
            try:
                name = (await request.json()).get("model")
            except ValueError:
                name = None
            if name != model:
                return web.json_response({"error": f"model '{name}' not found"}, status=404)
            return web.json_response(
                {
                    "details": details,
                    "model_info": {
                        "general.architecture": "mock",
                        "mock.context_length": ctx,
                        "general.parameter_count": 0,
                    },
                    "modelfile": "",
                    "parameters": "",
                    "template": "",
                }
            )

        return [
            ("GET", "/api/version", _json({"version": MOCK_VERSION})),
            ("POST", "/api/show", show),
            ("GET", "/api/tags", _json({"models": [{"name": model, "model": model, "details": details}]})),
        ]
    return []
