"""Engines: one module per engine kind, each registered in :mod:`servelab.engines.registry` with its
settings model, launcher, identity, metric names and readiness probe; the launchers share
:mod:`servelab.engines.base`. Public entry for other parts: :func:`start_engine`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from servelab.wire.errors import ConfigError


def __getattr__(name: str) -> Any:
    if name == "ENGINE_KINDS":  # computed: kinds may be registered at run time
        from servelab.engines.registry import launched_kinds

        return launched_kinds()
    raise AttributeError(name)


def start_engine(
    kind: str,
    model: str | None = None,
    parallel: int | None = None,
    ctx_size: int | None = None,
    log_dir: str | None = None,
    settings: Mapping[str, Any] | BaseModel | None = None,
    **kwargs: Any,
) -> Any:
    """Start an engine servelab launches and return its ready :class:`~servelab.engines.running.RunningEngine`.

    ``kind``: a launched kind of the registry (:data:`ENGINE_KINDS`: ``llamacpp``, ``vllm``, ``mock`` and
    any registered one). ``settings``: the kind's ``Settings`` fields (a mapping or an instance),
    validated by that one model. ``model``: a local weights path (``None`` = the engine default).
    ``parallel``/``ctx_size``: shorthands for ``settings`` ``parallel``/``ctx_size`` of ``llamacpp`` (the
    ``servelab bench --engine`` options; a value in ``settings`` wins). ``kwargs`` go to the kind's
    launcher (``host``, ``progress``, ``binary``, ``python`` …).

    Raises :class:`ConfigError` (one line) for an unknown kind, an unknown or bad setting (named), a
    bad model file, and :class:`~servelab.engines.exits.EngineStartError` if the engine does not become ready.
    """
    from servelab.engines.registry import get, launched_kinds

    try:
        k = get(kind)
    except ConfigError:
        raise ConfigError(f"unknown engine {kind!r}: servelab can start {', '.join(launched_kinds())}") from None
    if not k.launched:
        raise ConfigError(
            f"engine kind {kind!r} is not started by servelab; servelab can start {', '.join(launched_kinds())}"
        )
    given = settings.model_dump() if isinstance(settings, BaseModel) else dict(settings or {})
    if kind == "llamacpp":
        shorthands = {"parallel": parallel, "ctx_size": ctx_size}
        given = {**{key: v for key, v in shorthands.items() if v is not None}, **given}
    return k.launch(k.parse(given), model=model, log_dir=log_dir, **kwargs)
