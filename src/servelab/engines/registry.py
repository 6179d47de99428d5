"""The engine registry: one :class:`~servelab.engines.kind.EngineKind` per engine kind (``llamacpp``,
``vllm``, ``mock``, ``url``, and any kind a user or another package adds), each declared in the module
of that engine.

A kind owns, in one place (:mod:`servelab.engines.kind` has the base classes):

- ``Settings``: its pydantic settings model (a subclass of :class:`EngineSettings`), the *single*
  definition of what ``candidates[i].settings`` may hold. The experiment schema's candidate union
  (:mod:`servelab.trial.spec`) and every launcher read it, so what validates is what launches.
- ``launcher()`` / ``launch()``: build / start the engine from validated settings (through the base
  launcher of :mod:`servelab.engines.base`: process spawning, port retry, log capture, readiness, clean stop).
- ``metrics``: its Prometheus names (:class:`ServerMetrics`: which gauges mean running / waiting /
  KV use, which series are counters), read by the trial's metrics sampler.
- ``readiness``: its readiness probe (:class:`Readiness`: the path that answers 200 once it serves).
- the identity it writes: every launcher fills ``RunningEngine.identity`` from one
  :class:`EngineIdentity` (kind, version, build, binary digest, weights sha256, argv, devices).

Where kinds come from, on first use (the kind modules never import this registry to register):

1. the built-in kinds, by module path (:data:`BUILTIN_KINDS`, loaded with :mod:`importlib`);
2. every ``servelab.engines`` entry point of the installed packages (:data:`ENTRY_POINT_GROUP`): a
   package adds a kind with ``[project.entry-points."servelab.engines"] mykind = "mypkg.engine:MyKind"``
   in its ``pyproject.toml`` (the target is an :class:`EngineKind` subclass or instance);
   :func:`discover` scans again after packages were installed at run time;
3. :func:`register` (an instance, at run time: tests, notebooks).

docs/adding-an-engine.md has a worked example. Listeners (:func:`subscribe`) hear of every change; the
experiment model rebuilds its candidate union on it.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
from collections.abc import Callable
from typing import Any

from servelab.engines.kind import (
    ENV_NAME_PATTERN,
    EngineIdentity,
    EngineKind,
    EngineSettings,
    PortSetting,
    Readiness,
    ServerMetrics,
    parse_settings,
    ready_timeout_setting,
    settings_error_line,
)
from servelab.wire.errors import ConfigError

__all__ = [
    "BUILTIN_KINDS",
    "BUILTIN_ORDER",
    "ENTRY_POINT_GROUP",
    "ENV_NAME_PATTERN",
    "EngineIdentity",
    "EngineKind",
    "EngineSettings",
    "PortSetting",
    "Readiness",
    "ServerMetrics",
    "all_metrics",
    "discover",
    "get",
    "kinds",
    "launched_kinds",
    "load_errors",
    "names",
    "parse_settings",
    "ready_timeout_setting",
    "register",
    "settings_error_line",
    "subscribe",
    "unregister",
]

#: the built-in kinds, ``kind -> "module:attribute"``, in the order the experiment's candidate union and
#: messages list them
BUILTIN_KINDS: dict[str, str] = {
    "llamacpp": "servelab.engines.llamacpp.kind:LlamaCppKind",
    "vllm": "servelab.engines.vllm.kind:VllmKind",
    "url": "servelab.engines.url:UrlKind",
    "mock": "servelab.engines.mock.launch:MockKind",
    "command": "servelab.engines.command:CommandKind",
}
BUILTIN_ORDER = tuple(BUILTIN_KINDS)
#: the entry-point group other packages declare their kinds in
ENTRY_POINT_GROUP = "servelab.engines"

_KINDS: dict[str, EngineKind[Any]] = {}
_LISTENERS: list[Callable[[], None]] = []
_LOCK = threading.RLock()
_LOADED = False
_ERRORS: dict[str, str] = {}  # entry-point name -> why it did not load
_SEEN_EPS: set[str] = set()  # entry points already loaded ("name=value")


def _instance(obj: Any, where: str) -> EngineKind[Any]:
    """``obj`` (an :class:`EngineKind` subclass or instance) as an instance; raises :class:`TypeError`."""
    if isinstance(obj, type) and issubclass(obj, EngineKind):
        obj = obj()
    if not isinstance(obj, EngineKind):
        raise TypeError(f"{where} is {type(obj).__name__}, not an EngineKind subclass or instance")
    return obj


def _load(target: str) -> EngineKind[Any]:
    """The kind at ``"module:attribute"`` (imported with :mod:`importlib`)."""
    module, _, attr = target.partition(":")
    return _instance(getattr(importlib.import_module(module), attr), target)


def _add(kind: EngineKind[Any], *, replace: bool) -> None:
    for attr in ("kind", "title", "Settings"):
        if not hasattr(kind, attr):
            raise ValueError(f"engine kind {type(kind).__name__} has no {attr!r}; set it on the class")
    if not (isinstance(kind.Settings, type) and issubclass(kind.Settings, EngineSettings)):
        raise ValueError(f"engine kind {kind.kind!r}: Settings must subclass servelab.engines.kind.EngineSettings")
    with _LOCK:
        if kind.kind in _KINDS and not replace:
            raise ValueError(f"engine kind {kind.kind!r} is registered already")
        _KINDS[kind.kind] = kind


def _scan_entry_points() -> bool:
    """Load every ``servelab.engines`` entry point not loaded yet; a broken one is kept in
    :func:`load_errors` (and named when a candidate asks for it), never raised. True if a kind was added."""
    added = False
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        key = f"{ep.name}={ep.value}"
        if key in _SEEN_EPS:
            continue
        _SEEN_EPS.add(key)
        if ep.name in BUILTIN_KINDS:
            continue  # the built-ins are loaded by module path; a package cannot replace them silently
        try:
            _add(_instance(ep.load(), f"entry point {key}"), replace=False)
            _ERRORS.pop(ep.name, None)
            added = True
        except Exception as e:  # noqa: BLE001 — another package's bug must not stop servelab
            _ERRORS[ep.name] = (
                f"entry point {key} ({ep.dist.name if ep.dist else 'unknown package'}): {type(e).__name__}: {e}"
            )
    return added


def _load_builtins() -> None:
    """Load the built-in kinds and the entry points once, on first use."""
    global _LOADED
    with _LOCK:
        if _LOADED:
            return
        _LOADED = True
        for target in BUILTIN_KINDS.values():
            _add(_load(target), replace=True)
        _scan_entry_points()


def discover() -> list[str]:
    """Scan the ``servelab.engines`` entry points again (after installing a package at run time) and
    tell the listeners when kinds were added; returns the names of every registered kind."""
    _load_builtins()
    with _LOCK:
        added = _scan_entry_points()
        listeners = list(_LISTENERS)
    if added:
        for fn in listeners:
            fn()
    return list(names())


def load_errors() -> dict[str, str]:
    """Entry points that did not load: ``name -> reason`` (the package, the exception)."""
    _load_builtins()
    return dict(_ERRORS)


def register(kind: EngineKind[Any], *, replace: bool = False) -> EngineKind[Any]:
    """Add ``kind`` to the registry and tell the listeners; returns it (usable as a decorator's tail).

    Raises :class:`ValueError` when a kind of that name is registered already (unless ``replace``),
    or when ``kind`` lacks ``kind``/``title``/``Settings``."""
    _load_builtins()
    _add(kind, replace=replace)
    with _LOCK:
        listeners = list(_LISTENERS)
    for fn in listeners:
        fn()
    return kind


def unregister(name: str) -> None:
    """Remove the kind called ``name`` (no error when absent) and tell the listeners."""
    with _LOCK:
        removed = _KINDS.pop(name, None)
        listeners = list(_LISTENERS)
    if removed is not None:
        for fn in listeners:
            fn()


def subscribe(fn: Callable[[], None]) -> None:
    """Call ``fn()`` after every :func:`register` / :func:`unregister` (and a :func:`discover` that added)."""
    with _LOCK:
        _LISTENERS.append(fn)


def kinds() -> list[EngineKind[Any]]:
    """Every registered kind, built-ins first (``llamacpp``, ``vllm``, ``url``, ``mock``), then in
    registration order."""
    _load_builtins()
    with _LOCK:
        ks = list(_KINDS.values())
    last = len(BUILTIN_ORDER)
    return sorted(ks, key=lambda k: BUILTIN_ORDER.index(k.kind) if k.kind in BUILTIN_ORDER else last)


def names() -> tuple[str, ...]:
    """Names of every registered kind, in :func:`kinds` order."""
    return tuple(k.kind for k in kinds())


def launched_kinds() -> tuple[str, ...]:
    """Names of the kinds servelab starts itself."""
    return tuple(k.kind for k in kinds() if k.launched)


def get(name: str) -> EngineKind[Any]:
    """The kind called ``name``. Raises :class:`ConfigError` naming the known kinds when there is none
    (and why, when a package's entry point of that name failed to load)."""
    _load_builtins()
    with _LOCK:
        k = _KINDS.get(name)
        broken = _ERRORS.get(name)
    if k is None:
        known = ", ".join(x.kind for x in kinds())
        if broken:
            raise ConfigError(
                f"engine kind {name!r} did not load: {broken}; fix or reinstall that package (known kinds: {known})"
            )
        raise ConfigError(f"unknown engine {name!r}: known kinds are {known}")
    return k


def all_metrics() -> ServerMetrics:
    """Every registered kind's metric names in one table (for servers whose make is not known)."""
    return ServerMetrics.merged(k.metrics for k in kinds())
