"""The engine registry: one :class:`EngineKind` per engine kind (``llamacpp``, ``vllm``, ``mock``, ``url``,
and any kind a user adds), each declared in the module of that engine.

A kind owns, in one place:

- ``Settings``: its pydantic settings model (a subclass of :class:`EngineSettings`), the *single*
  definition of what ``candidates[i].settings`` may hold. The experiment schema's candidate union
  (:mod:`servelab.trial.spec`) and every launcher read it, so what validates is what launches.
- ``launch()``: start the engine from validated settings (through the base launcher of
  :mod:`servelab.engines.base`: process spawning, port retry, log capture, readiness, clean stop).
- ``metrics``: its Prometheus names (:class:`ServerMetrics`: which gauges mean running / waiting /
  KV use, which series are counters), read by the trial's metrics sampler.
- ``readiness``: its readiness probe (:class:`Readiness`: the path that answers 200 once it serves).
- the identity it writes: every launcher fills ``RunningEngine.identity`` from one
  :class:`EngineIdentity` (kind, version, build, binary digest, weights sha256, argv, devices).

Adding a kind = one module that subclasses :class:`EngineKind` and calls :func:`register`
(docs/adding-an-engine.md has a worked example). Listeners (:func:`subscribe`) hear of every change;
the experiment model rebuilds its candidate union on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servelab.wire.config import FrozenModel, StrictModel, error_problem
from servelab.wire.errors import ConfigError

__all__ = [
    "BUILTIN_ORDER", "ENV_NAME_PATTERN", "EngineIdentity", "EngineKind", "EngineSettings", "PortSetting",
    "Readiness", "ServerMetrics", "all_metrics", "get", "kinds", "launched_kinds", "parse_settings",
    "ready_timeout_setting", "register", "settings_error_line", "subscribe", "unregister",
]


class EngineSettings(StrictModel):
    """Base of every kind's ``Settings``: unknown keys are errors (a typo must not be ignored) and values
    are not coerced (``"4"`` is not an int, ``1`` is not a bool), the same in a YAML experiment and in a
    launcher's keyword arguments."""

    model_config = ConfigDict(strict=True)

    def fixed_port(self) -> int | None:
        """The ``port`` setting when the kind has one and it is set (``None`` = a free port is picked)."""
        port = self.model_dump().get("port")
        return int(port) if port else None


#: an environment variable's name (``api_key_env``, vLLM's ``env`` keys): letters, digits, ``_``, no leading digit
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

#: the ``port`` setting shared by launched kinds: ``None`` = a free port (retried on a bind race)
PortSetting = Annotated[int | None, Field(ge=1, le=65535, description="listen port; null = a free port")]


def ready_timeout_setting(default_s: float) -> Any:
    """The ``ready_timeout_s`` field (seconds > 0 to wait for the readiness probe) with ``default_s``."""
    return Field(default_s, gt=0, description="seconds to wait for the readiness probe to answer 200")


class ServerMetrics(FrozenModel):
    """Names in an engine's Prometheus ``/metrics`` that servelab keeps while load steps run.

    ``running`` / ``waiting`` / ``kv_usage``: the gauges that mean requests running, requests queued and
    KV-cache use (fraction 0-1); ``gauges``: other gauges kept; ``counters``: monotonic counters (the
    trial reports their increase per step). Names are metric names without labels.
    """

    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    gauges: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()

    def gauge_names(self) -> tuple[str, ...]:
        """Every gauge name (running, waiting, kv_usage, then ``gauges``), without ``None``."""
        return tuple(n for n in (self.running, self.waiting, self.kv_usage, *self.gauges) if n)

    def names(self) -> frozenset[str]:
        """Every name kept (gauges and counters)."""
        return frozenset(self.gauge_names() + self.counters)

    @classmethod
    def merged(cls, parts: Iterable[ServerMetrics]) -> ServerMetrics:
        """One table holding every gauge and counter of ``parts`` (for servers of unknown make)."""
        gauges: list[str] = []
        counters: list[str] = []
        for p in parts:
            gauges += [g for g in p.gauge_names() if g not in gauges]
            counters += [c for c in p.counters if c not in counters]
        return cls(gauges=tuple(gauges), counters=tuple(counters))


class Readiness(FrozenModel):
    """The readiness probe: ``GET path`` answers 200 once the engine serves. Connection refused and
    other statuses (llama-server: 503 ``Loading model``) while it starts are waited out."""

    path: str = "/health"


class EngineIdentity(BaseModel):
    """What runs, written the same way by every launcher (``RunningEngine.identity`` is its JSON dump).

    Comparable facts: ``kind`` (registry kind), ``engine`` (the engine's own name, e.g. ``llama.cpp``),
    ``version``, ``build`` (build number or commit), ``binary_sha256`` (sha256 of the executable, or the
    container image digest), ``weights_sha256`` (the served weights), ``argv`` (the full command line,
    flags included), ``devices`` (``["cpu"]``, ``["cuda:0"]`` …; ``[]`` = none), ``settings`` (as
    used), ``model`` (weights identity: path, sha256, metadata). Per launch (left out of comparisons):
    ``host``, ``port``, ``base_url``, ``pid``, ``log_path``, ``started_at``. A launcher may add its own
    details as extra keys (llama.cpp: ``binary``, ``props``; vLLM: ``install``, ``env``)."""

    model_config = ConfigDict(extra="allow")

    kind: str
    engine: str
    version: str | None = None
    build: str | None = None
    binary_sha256: str | None = None
    weights_sha256: str | None = None
    argv: list[str] = Field(default_factory=list)
    devices: list[str] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)
    model: dict[str, Any] | None = None
    host: str | None = None
    port: int | None = None
    base_url: str | None = None
    pid: int | None = None
    log_path: str | None = None
    started_at: str | None = None


class EngineKind:
    """One engine kind. Subclass it in the engine's own module, set the class attributes and implement
    :meth:`launch` (not needed when ``launched`` is False), then :func:`register` an instance.

    Class attributes:
        kind: the name candidates use (``engine: KIND``), ``[a-z0-9_-]+``.
        title: the engine's name in messages (``"llama.cpp"``).
        summary: one line for docs and the JSON Schema.
        Settings: the :class:`EngineSettings` subclass (the single definition of the settings).
        candidate_fields: an optional pydantic model whose fields (and validators) candidates of this
            kind carry beside ``name``/``engine``/``model``/``settings`` (``url`` has ``url``, ``model_name``
            and ``api_key_env``).
        launched: whether servelab starts the engine (False for ``url``).
        takes_model: whether ``model`` (a local weights path) is meaningful to the launcher.
        metrics: the :class:`ServerMetrics` of the engine.
        readiness: the :class:`Readiness` probe.
    """

    kind: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str] = ""
    Settings: ClassVar[type[EngineSettings]]
    candidate_fields: ClassVar[type[BaseModel] | None] = None
    launched: ClassVar[bool] = True
    takes_model: ClassVar[bool] = True
    metrics: ClassVar[ServerMetrics] = ServerMetrics()
    readiness: ClassVar[Readiness] = Readiness()

    def launch(self, settings: Any, *, model: str | None = None, log_dir: str | None = None,
               **kwargs: Any) -> Any:
        """Start the engine from validated ``settings`` (an instance of ``Settings``) and return its
        ready :class:`~servelab.engines.base.RunningEngine` with ``identity`` filled from an
        :class:`EngineIdentity`. ``model``: a local weights path or ``None`` (engine default);
        ``log_dir``: where the engine log goes; ``kwargs``: launcher-specific (``host``, ``progress`` …).

        Raises :class:`ConfigError` (bad input, one line) and
        :class:`~servelab.engines.base.EngineStartError` (exited or not ready in time)."""
        raise ConfigError(f"engine kind {self.kind!r} is not launched by servelab")

    def parse(self, settings: Mapping[str, Any] | EngineSettings | None) -> EngineSettings:
        """``settings`` validated into ``Settings`` (an instance is returned as it is). Raises
        :class:`ConfigError` with one line naming the setting, e.g.
        ``vllm setting 'dtype': 'half' is not one of ...``."""
        return parse_settings(self.Settings, settings, self.kind)


#: the built-in kinds, in the order the experiment's candidate union and messages list them
BUILTIN_ORDER = ("llamacpp", "vllm", "url", "mock")
_KINDS: dict[str, EngineKind] = {}
_LISTENERS: list[Callable[[], None]] = []
_LOCK = threading.RLock()
_BUILTINS_LOADED = False


def _load_builtins() -> None:
    """Import the built-in kind modules (each registers itself) once, on first use."""
    global _BUILTINS_LOADED
    with _LOCK:
        if _BUILTINS_LOADED:
            return
        _BUILTINS_LOADED = True
        # each module registers its kind on import; this order is the order of the experiment's union
        import servelab.engines.llamacpp  # noqa: F401
        import servelab.engines.vllm  # noqa: F401
        import servelab.engines.url  # noqa: F401
        import servelab.engines.mocklaunch  # noqa: F401


def register(kind: EngineKind, *, replace: bool = False) -> EngineKind:
    """Add ``kind`` to the registry and tell the listeners; returns it (usable as a decorator's tail).

    Raises :class:`ValueError` when a kind of that name is registered already (unless ``replace``),
    or when ``kind`` lacks ``kind``/``title``/``Settings``."""
    _load_builtins()
    for attr in ("kind", "title", "Settings"):
        if not hasattr(kind, attr):
            raise ValueError(f"engine kind {type(kind).__name__} has no {attr!r}; set it on the class")
    if not (isinstance(kind.Settings, type) and issubclass(kind.Settings, EngineSettings)):
        raise ValueError(f"engine kind {kind.kind!r}: Settings must subclass "
                         "servelab.engines.registry.EngineSettings")
    with _LOCK:
        if kind.kind in _KINDS and not replace:
            raise ValueError(f"engine kind {kind.kind!r} is registered already")
        _KINDS[kind.kind] = kind
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
    """Call ``fn()`` after every :func:`register` / :func:`unregister`."""
    with _LOCK:
        _LISTENERS.append(fn)


def kinds() -> list[EngineKind]:
    """Every registered kind, built-ins first (``llamacpp``, ``vllm``, ``url``, ``mock``), then in
    registration order."""
    _load_builtins()
    with _LOCK:
        ks = list(_KINDS.values())
    last = len(BUILTIN_ORDER)
    return sorted(ks, key=lambda k: BUILTIN_ORDER.index(k.kind) if k.kind in BUILTIN_ORDER else last)


def launched_kinds() -> tuple[str, ...]:
    """Names of the kinds servelab starts itself."""
    return tuple(k.kind for k in kinds() if k.launched)


def get(name: str) -> EngineKind:
    """The kind called ``name``. Raises :class:`ConfigError` naming the known kinds when there is none."""
    _load_builtins()
    with _LOCK:
        k = _KINDS.get(name)
    known = ", ".join(x.kind for x in kinds())
    if k is None:
        raise ConfigError(f"unknown engine {name!r}: known kinds are {known}")
    return k


def all_metrics() -> ServerMetrics:
    """Every registered kind's metric names in one table (for servers whose make is not known)."""
    return ServerMetrics.merged(k.metrics for k in kinds())


def settings_error_line(exc: ValidationError, kind: str, model: Any = None) -> str:
    """One line for the first error of a ``Settings`` validation: ``KIND setting 'KEY': PROBLEM``
    (``(+N more)`` when there are others); ``model`` (the ``Settings`` class) gives an unknown key the
    closest setting as a "did you mean", else the list of settings (see
    :func:`servelab.wire.config.error_problem`, which words every PROBLEM)."""
    errs = exc.errors(include_url=False)
    if not errs:
        return f"{kind} settings: invalid"
    loc, text = error_problem(errs[0], model, unknown="setting")
    head = f"{kind} setting {loc!r}: " if loc else f"{kind} settings: "
    more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
    return head + text + more


def parse_settings(model: type[EngineSettings], settings: Mapping[str, Any] | EngineSettings | None,
                   kind: str) -> Any:
    """``settings`` (a mapping, an instance of ``model`` or ``None`` = defaults) validated into ``model``.

    Raises :class:`ConfigError` with :func:`settings_error_line`'s one line."""
    if isinstance(settings, model):
        return settings
    if isinstance(settings, BaseModel):
        settings = settings.model_dump()
    try:
        return model.model_validate(dict(settings or {}))
    except ValidationError as e:
        raise ConfigError(settings_error_line(e, kind, model)) from None
