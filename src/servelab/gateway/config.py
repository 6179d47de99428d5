"""The gateway's configuration file: the whole file's model, loading with one-line errors, the published JSON
Schema. Its sections are modelled by idea in :mod:`servelab.gateway.configserver` (server, admin, state,
ledger), :mod:`servelab.gateway.configmodels` (backends and the model registry),
:mod:`servelab.gateway.configtenants` (tenants, keys, degrade rules) and :mod:`servelab.gateway.configrouting`
(routing, retry, breaker, health, tracing); they are imported from here.

``load_config(path)`` reads a YAML file (example: ``examples/gateway.yaml``; sketch and meaning in
docs/gateway-design.md) and returns a validated, immutable :class:`GatewayConfig`, or raises
:class:`servelab.wire.ConfigError` with one line ``FILE: FIELD.PATH: PROBLEM; FIX`` — also for cross-field
mistakes (a target naming an unknown backend, a key of an unknown tenant, …). The server keeps the running
config when a reload fails, and shows that line (log + admin).

``gateway.schema.json`` next to this module is generated from the models for editors (YAML language
servers); ``servelab schema write`` regenerates it, ``servelab schema check`` verifies it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from servelab.gateway.configmodels import (
    Backend,
    Capabilities,
    EngineFields,
    FallbackStep,
    ModelEntry,
    ParamBound,
    SamplingPolicy,
    Shadow,
    StopBound,
    Target,
)
from servelab.gateway.confignames import DEFAULT_REDACT
from servelab.gateway.configrouting import (
    BreakerSection,
    HealthSection,
    PickerSection,
    PickerWeightsSection,
    RetrySection,
    RoutingSection,
    TracingSection,
)
from servelab.gateway.configserver import AdminSection, LedgerSection, ServerSection, StateSection
from servelab.gateway.configtenants import (
    DegradeRule,
    DegradeSection,
    DegradeWhen,
    KeyEntry,
    ScopeLimits,
    SharedLimits,
    Tenant,
)
from servelab.wire.config import FrozenModel, PublishedSchema, json_schema_of, read_yaml_file, validation_error_line
from servelab.wire.dialects import KINDS
from servelab.wire.errors import ConfigError

__all__ = [
    "BACKEND_KINDS",
    "DEFAULT_REDACT",
    "PUBLISHED_SCHEMA",
    "SCHEMA_PATH",
    "AdminSection",
    "Backend",
    "BreakerSection",
    "Capabilities",
    "DegradeRule",
    "DegradeSection",
    "DegradeWhen",
    "EngineFields",
    "FallbackStep",
    "GatewayConfig",
    "HealthSection",
    "KeyEntry",
    "LedgerSection",
    "ModelEntry",
    "ParamBound",
    "PickerSection",
    "PickerWeightsSection",
    "RetrySection",
    "RoutingSection",
    "SamplingPolicy",
    "ScopeLimits",
    "ServerSection",
    "Shadow",
    "SharedLimits",
    "StateSection",
    "StopBound",
    "Target",
    "Tenant",
    "TracingSection",
    "json_schema",
    "load_config",
    "parse_config",
]

#: Engine kinds a backend can be: the dialect table's (:mod:`servelab.wire.dialects`, docs/engine-wire.md).
BACKEND_KINDS = KINDS
#: The committed JSON Schema (regenerate with ``servelab schema write``).
SCHEMA_PATH = Path(__file__).with_name("gateway.schema.json")


class GatewayConfig(FrozenModel):
    """The whole gateway file. See each section's class for units and defaults."""

    server: ServerSection = Field(default_factory=ServerSection)
    admin: AdminSection = Field(default_factory=AdminSection)
    state: StateSection = Field(default_factory=StateSection)
    ledger: LedgerSection = Field(default_factory=LedgerSection)
    backends: list[Backend] = Field(min_length=1)
    models: dict[str, ModelEntry] = Field(min_length=1)
    tenants: dict[str, Tenant] = Field(default_factory=dict)
    keys: list[KeyEntry] = Field(default_factory=list)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    retry: RetrySection = Field(default_factory=RetrySection)
    breaker: BreakerSection = Field(default_factory=BreakerSection)
    health: HealthSection = Field(default_factory=HealthSection)
    degrade: DegradeSection = Field(default_factory=DegradeSection)
    tracing: TracingSection = Field(default_factory=TracingSection)

    @field_validator("tenants", "keys", mode="before")
    @classmethod
    def _empty_section(cls, v: Any, info: ValidationInfo) -> Any:
        # "keys:" with every entry deleted (or only comments left) is YAML null: read it as "none"
        if v is None:
            return [] if info.field_name == "keys" else {}
        return v

    @model_validator(mode="after")
    def _cross(self) -> GatewayConfig:
        backends: dict[str, Backend] = {}
        for i, b in enumerate(self.backends):
            if b.name in backends:
                raise ValueError(f"backends[{i}].name: {b.name!r} is used twice; give each backend its own name")
            backends[b.name] = b
        for name, m in self.models.items():
            for j, t in enumerate(m.targets):
                _check_target(t, backends, f"models.{name}.targets[{j}]")
            _check_pooled(m.capabilities, f"models.{name}.capabilities")
            for j, f in enumerate(m.fallback):
                if f.model not in self.models:
                    raise ValueError(
                        f"models.{name}.fallback[{j}].model: {f.model!r} is not a model; "
                        f"one of {', '.join(self.models)}"
                    )
                if f.model == name:
                    raise ValueError(f"models.{name}.fallback[{j}].model: a model cannot fall back to itself")
                mine, theirs = _route_kind(m.capabilities), _route_kind(self.models[f.model].capabilities)
                if mine != theirs:
                    raise ValueError(
                        f"models.{name}.fallback[{j}].model: {f.model!r} is {theirs} model and {name!r} "
                        f"{mine} model; a fallback must serve the same requests, so name {mine} model"
                    )
            if m.shadow is not None:
                _check_target(m.shadow.target, backends, f"models.{name}.shadow.target")
        pools = {b.pool for b in self.backends}
        for tname, ten in self.tenants.items():
            for j, mname in enumerate(ten.allowed_models):
                if mname != "*" and mname not in self.models:
                    raise ValueError(
                        f"tenants.{tname}.allowed_models[{j}]: {mname!r} is not a model; "
                        f"one of {', '.join(self.models)} or '*'"
                    )
            for j, p in enumerate(ten.pools or []):
                if p not in pools:
                    raise ValueError(
                        f"tenants.{tname}.pools[{j}]: no backend is in pool {p!r}; pools: {', '.join(sorted(pools))}"
                    )
        seen: set[str] = set()
        for i, k in enumerate(self.keys):
            if k.id in seen:
                raise ValueError(f"keys[{i}].id: {k.id!r} is used twice; key ids must be unique")
            seen.add(k.id)
            if k.tenant not in self.tenants:
                raise ValueError(
                    f"keys[{i}].tenant: {k.tenant!r} is not a tenant; "
                    f"add it under tenants: or use one of {', '.join(self.tenants) or '(none)'}"
                )
        _check_route_to_kinds(self)
        for task, mname in self.routing.tasks.items():
            if mname not in self.models:
                raise ValueError(f"routing.tasks.{task}: {mname!r} is not a model; one of {', '.join(self.models)}")
        _check_model_refs(self)
        return self

    def backend(self, name: str) -> Backend:
        """The backend called ``name``; raises :class:`KeyError` if none."""
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(name)

    def upstream_model(self, target: Target) -> str:
        """The model name to send to ``target``'s engine (``target.model`` or its backend's first model)."""
        return target.model or self.backend(target.backend).models[0]

    def tenant_may_use(self, tenant: str, model: str) -> bool:
        """True when ``tenant`` exists and lists ``model`` (or ``*``) in ``allowed_models``."""
        t = self.tenants.get(tenant)
        return t is not None and ("*" in t.allowed_models or model in t.allowed_models)


def _check_model_refs(cfg: GatewayConfig) -> None:
    """Every model named by ``tenants.*.model_limits`` and ``degrade.rules`` exists (else ValueError)."""
    refs = [(f"tenants.{tname}.model_limits", m) for tname, ten in cfg.tenants.items() for m in ten.model_limits]
    refs += [
        (f"degrade.rules[{i}] ({rule.name})", m)
        for i, rule in enumerate(cfg.degrade.rules)
        for m in [*(rule.models or []), *([rule.route_to] if rule.route_to else [])]
    ]
    for where, mname in refs:
        if mname not in cfg.models:
            raise ValueError(f"{where}: {mname!r} is not a model; one of {', '.join(cfg.models)}")


def _check_route_to_kinds(cfg: GatewayConfig) -> None:
    """A degrade rule's ``route_to`` serves the requests of every model the rule applies to (its ``models``,
    null = all): a rerank request routed to a chat model was refused with a 400 naming a model the client
    never asked for."""
    for i, rule in enumerate(cfg.degrade.rules):
        to = cfg.models.get(rule.route_to) if rule.route_to else None
        if to is None:
            continue  # no route, or an unknown model (_check_model_refs names it)
        want = _route_kind(to.capabilities)
        for mname in rule.models or list(cfg.models):
            m = cfg.models.get(mname)
            if m is not None and _route_kind(m.capabilities) != want:
                listed = "lists" if rule.models else "applies to every model (models: null), including"
                raise ValueError(
                    f"degrade.rules[{i}] ({rule.name}).route_to: {rule.route_to!r} is {want} model but the rule "
                    f"{listed} {mname!r}, {_route_kind(m.capabilities)} model; list in models: only models "
                    f"of its kind"
                )


def _route_kind(c: Capabilities) -> str:
    """What requests a model with capabilities ``c`` serves, in words: 'a rerank', 'an embedding' or 'a chat'
    (completions included); a fallback must be of its model's kind, as admission checked the first model only."""
    return "a rerank" if c.rerank else "an embedding" if c.embeddings else "a chat"


def _check_pooled(c: Capabilities, where: str) -> None:
    """An embedding or rerank model serves only its own route: it cannot be both, declare chat features,
    or (rerank) an embedding dimension; ``max_input_tokens`` is theirs only, and within ``context_tokens``."""
    if c.embeddings and c.rerank:
        raise ValueError(f"{where}: a model is an embedding model or a rerank model, not both")
    kind = "an embedding" if c.embeddings else ("a rerank" if c.rerank else None)
    if kind is not None and (c.tools or c.json_schema):
        raise ValueError(f"{where}: {kind} model cannot declare tools or json_schema")
    if c.embedding_dimensions is not None and not c.embeddings:
        raise ValueError(f"{where}.embedding_dimensions: only an embedding model (embeddings: true) has one")
    if c.max_input_tokens is not None and kind is None:
        raise ValueError(
            f"{where}.max_input_tokens: only an embedding or rerank model has one (a chat model's prompt is "
            "bounded by context_tokens)"
        )
    if c.max_input_tokens is not None and c.context_tokens is not None and c.max_input_tokens > c.context_tokens:
        raise ValueError(
            f"{where}.max_input_tokens: {c.max_input_tokens} is above context_tokens {c.context_tokens}; "
            "lower it to the context or below"
        )


def _check_target(t: Target, backends: dict[str, Backend], where: str) -> None:
    b = backends.get(t.backend)
    if b is None:
        raise ValueError(f"{where}.backend: {t.backend!r} is not a backend; one of {', '.join(backends)}")
    if t.model is not None and t.model not in b.models:
        raise ValueError(
            f"{where}.model: backend {t.backend!r} does not serve {t.model!r}; "
            f"it serves {', '.join(b.models)} (add it to its models: list)"
        )


# ---------------------------------------------------------------------------------------------------
# loading


def parse_config(data: Any, source: str = "<config>", base_dir: str | Path | None = None) -> GatewayConfig:
    """Validate a decoded config (a dict). Relative ``ledger.sqlite_path``/``spool_path`` and ``server.access_log``
    are resolved against ``base_dir`` when given. Raises :class:`ConfigError` ``SOURCE: PATH: PROBLEM``."""
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping (server:, backends:, models:, …), got {type(data).__name__}"
        )
    try:
        cfg = GatewayConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, source, GatewayConfig)) from None
    if base_dir is not None:
        base = Path(base_dir)
        led = cfg.ledger
        if led.sqlite_path and led.sqlite_path != ":memory:" and not Path(led.sqlite_path).is_absolute():
            cfg = cfg.model_copy(
                update={"ledger": led.model_copy(update={"sqlite_path": str((base / led.sqlite_path).absolute())})}
            )
        led = cfg.ledger
        if led.spool_path and not Path(led.spool_path).is_absolute():
            cfg = cfg.model_copy(
                update={"ledger": led.model_copy(update={"spool_path": str((base / led.spool_path).absolute())})}
            )
        al = cfg.server.access_log
        if al not in (None, "-") and not Path(al).is_absolute():
            cfg = cfg.model_copy(
                update={"server": cfg.server.model_copy(update={"access_log": str((base / al).absolute())})}
            )
    return cfg


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate a gateway YAML file. Raises :class:`ConfigError` with one line naming the file,
    the field path and the fix: missing file, YAML syntax error (line/column), bad or unknown field,
    unknown backend/model/tenant reference."""
    src = str(path)
    p = Path(path).expanduser()
    data = read_yaml_file(
        path,
        what="gateway config",
        missing_fix="give a YAML file (example: examples/gateway.yaml)",
        empty_fix="write a gateway config (example: examples/gateway.yaml)",
    )
    return parse_config(data, src, p.parent)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the gateway file (what ``gateway.schema.json`` holds)."""
    return json_schema_of(GatewayConfig, "servelab gateway config")


#: ``gateway.schema.json``, written and checked by ``servelab schema write|check``.
PUBLISHED_SCHEMA = PublishedSchema(SCHEMA_PATH, json_schema)
