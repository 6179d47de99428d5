"""Engines: launchers behind one interface (:class:`~servelab.engines.base.EngineLauncher`) and the
mock engine. Public entry for other parts: :func:`start_engine`."""

from __future__ import annotations

from typing import Any

from servelab.wire.client import ConfigError

#: Engine kinds servelab can launch itself.
ENGINE_KINDS = ("llamacpp",)


def start_engine(kind: str, model: str | None = None, parallel: int = 4, ctx_size: int = 8192,
                 log_dir: str | None = None, **kwargs: Any) -> Any:
    """Start an embedded engine and return its :class:`~servelab.engines.base.RunningEngine`
    (ready: ``/health`` answered 200). ``kind`` is one of :data:`ENGINE_KINDS`; ``model`` a model file
    (default: the engine's default weights); ``parallel`` slots; ``ctx_size`` total context tokens.

    Raises :class:`ConfigError` for an unknown kind or a bad model file, and
    :class:`~servelab.engines.base.EngineStartError` if the engine does not become ready.
    """
    if kind != "llamacpp":
        raise ConfigError(f"unknown engine {kind!r}: servelab can start {', '.join(ENGINE_KINDS)}")
    from servelab.engines.llamacpp import LlamaCppLauncher

    return LlamaCppLauncher(model, ctx_size=ctx_size, parallel=parallel, log_dir=log_dir, **kwargs).start()
