"""What an engine kind is made of (docs/adding-an-engine.md): the base classes every kind module uses,
with no registry in them, so that a kind's module imports only this (and :mod:`servelab.engines.base`)
and :mod:`servelab.engines.registry` finds the kinds without the kinds importing it back.

- :class:`EngineSettings`: base of a kind's pydantic ``Settings`` (strict: unknown keys and coerced
  values are errors), with the shared ``port`` (:data:`PortSetting`) and ``ready_timeout_s``
  (:func:`ready_timeout_setting`) fields;
- :class:`EngineKind`: the kind itself, generic over its ``Settings`` model (``EngineKind[MySettings]``:
  :meth:`EngineKind.parse` returns ``MySettings``), with its launcher, :class:`ServerMetrics` and
  :class:`Readiness` probe;
- :class:`EngineIdentity`: what every launcher writes about the engine it started;
- :func:`parse_settings` / :func:`settings_error_line`: settings validation with one-line errors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from servelab.wire.config import FrozenModel, StrictModel, error_problem
from servelab.wire.dialects import Dialect, dialect_of
from servelab.wire.errors import ConfigError

__all__ = [
    "ENV_NAME_PATTERN",
    "EngineIdentity",
    "EngineKind",
    "EngineSettings",
    "PortSetting",
    "Readiness",
    "ServerMetrics",
    "SettingsT",
    "parse_settings",
    "ready_timeout_setting",
    "settings_error_line",
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
    trial reports their increase per step); ``generation_tokens``: the counter(s) of output tokens
    generated, which the trial sets beside the client's token count per step (the 2 % agreement check;
    one per engine, several in a merged table). Names are metric names without labels.
    """

    running: str | None = None
    waiting: str | None = None
    kv_usage: str | None = None
    gauges: tuple[str, ...] = ()
    counters: tuple[str, ...] = ()
    generation_tokens: tuple[str, ...] = ()

    def gauge_names(self) -> tuple[str, ...]:
        """Every gauge name (running, waiting, kv_usage, then ``gauges``), without ``None``."""
        return tuple(n for n in (self.running, self.waiting, self.kv_usage, *self.gauges) if n)

    def names(self) -> frozenset[str]:
        """Every name kept (gauges and counters)."""
        return frozenset(self.gauge_names() + self.counters + self.generation_tokens)

    @classmethod
    def merged(cls, parts: Iterable[ServerMetrics]) -> ServerMetrics:
        """One table holding every gauge and counter of ``parts`` (for servers of unknown make)."""
        gauges: list[str] = []
        counters: list[str] = []
        generation: list[str] = []
        for p in parts:
            gauges += [g for g in p.gauge_names() if g not in gauges]
            counters += [c for c in p.counters if c not in counters]
            generation += [c for c in p.generation_tokens if c not in generation]
        return cls(gauges=tuple(gauges), counters=tuple(counters), generation_tokens=tuple(generation))


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


#: the ``Settings`` model of an :class:`EngineKind`
SettingsT = TypeVar("SettingsT", bound=EngineSettings)


class EngineKind(Generic[SettingsT]):
    """One engine kind, generic over its settings model: ``class MyKind(EngineKind[MySettings])``.
    Subclass it in the engine's own module, set the class attributes and implement :meth:`launcher`
    (not needed when ``launched`` is False); the registry finds it by its module path (built-in kinds)
    or a ``servelab.engines`` entry point (other packages), or :func:`servelab.engines.registry.register`
    adds an instance at run time.

    Class attributes:
        kind: the name candidates use (``engine: KIND``), ``[a-z0-9_-]+``.
        title: the engine's name in messages (``"llama.cpp"``).
        summary: one line for docs and the JSON Schema.
        Settings: the :class:`EngineSettings` subclass (the single definition of the settings).
        candidate_fields: an optional pydantic model whose fields (and validators) candidates of this
            kind carry beside ``name``/``engine``/``model``/``settings`` (``url`` has ``url``, ``model_name``
            and ``api_key_env``).
        launched: whether servelab starts the engine (False for ``url``).
        takes_model: whether ``model`` (a local weights path) is meaningful to the launcher; a launched
            kind that takes none refuses ``model`` when the experiment loads.
        metrics: the :class:`ServerMetrics` of the engine.
        readiness: the :class:`Readiness` probe.

    :attr:`dialect` is the wire dialect its server speaks, from the dialect table by ``kind``.
    """

    kind: ClassVar[str]
    title: ClassVar[str]
    summary: ClassVar[str] = ""
    Settings: type[SettingsT]
    candidate_fields: ClassVar[type[BaseModel] | None] = None
    launched: ClassVar[bool] = True
    takes_model: ClassVar[bool] = True
    metrics: ClassVar[ServerMetrics] = ServerMetrics()
    readiness: ClassVar[Readiness] = Readiness()

    @property
    def dialect(self) -> Dialect | None:
        """The :class:`~servelab.wire.dialects.Dialect` of this kind's server (docs/engine-wire.md): the
        table's entry named ``kind`` (``vllm``, ``llamacpp``, ``mock`` …), or None when the kind has no one
        dialect (``url``: a server of unknown make; ``command``: whatever the command starts)."""
        return dialect_of(self.kind)

    def launcher(self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any) -> Any:
        """The :class:`~servelab.engines.base.EngineLauncher` for validated ``settings`` (an instance of
        ``Settings`` or a mapping), not started: what it would run can be inspected (its ``argv``) without
        starting anything. ``model``: a local weights path or ``None`` (engine default); ``log_dir``:
        where the engine log goes; ``kwargs``: launcher-specific (``host``, ``progress`` …).

        Raises :class:`ConfigError` (bad input, one line; also for a kind servelab does not launch)."""
        raise ConfigError(f"engine kind {self.kind!r} is not launched by servelab")

    def launch(self, settings: Any, *, model: str | None = None, log_dir: str | None = None, **kwargs: Any) -> Any:
        """Start the engine from validated ``settings`` and return its ready
        :class:`~servelab.engines.running.RunningEngine` with ``identity`` filled from an
        :class:`EngineIdentity`: ``self.launcher(...).start()`` (arguments as :meth:`launcher`).

        Raises :class:`ConfigError` (bad input, one line) and
        :class:`~servelab.engines.exits.EngineStartError` (exited or not ready in time)."""
        return self.launcher(settings, model=model, log_dir=log_dir, **kwargs).start()

    def parse(self, settings: Mapping[str, Any] | EngineSettings | None) -> SettingsT:
        """``settings`` validated into ``Settings`` (an instance is returned as it is). Raises
        :class:`ConfigError` with one line naming the setting, e.g.
        ``vllm setting 'dtype': 'half' is not one of ...``."""
        parsed: SettingsT = parse_settings(self.Settings, settings, self.kind)
        return parsed


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


def parse_settings(model: type[EngineSettings], settings: Mapping[str, Any] | EngineSettings | None, kind: str) -> Any:
    """``settings`` (a mapping, an instance of ``model`` or ``None`` = defaults) validated into ``model``.

    Raises :class:`ConfigError` with :func:`settings_error_line`'s one line."""
    if isinstance(settings, model):
        return settings
    if isinstance(settings, BaseModel):
        settings = settings.model_dump(context={"secrets": "reveal"})  # values, not the record's fingerprints
    try:
        return model.model_validate(dict(settings or {}))
    except ValidationError as e:
        raise ConfigError(settings_error_line(e, kind, model)) from None
