"""The candidates of an experiment (``candidates:``): the fields every candidate has, and one model per
registered engine kind (its ``engine`` literal and its settings model), chosen by ``engine``."""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    Discriminator,
    Field,
    GetCoreSchemaHandler,
    ValidationInfo,
    create_model,
    field_validator,
)

from servelab.engines import registry
from servelab.engines.registry import EngineKind, EngineSettings
from servelab.trial.identity import Declared
from servelab.trial.spec_fields import NAME_PATTERN, resolve_path
from servelab.wire.config import StrictModel
from servelab.wire.errors import ConfigError
from servelab.wire.jsontypes import JsonObject

__all__ = [
    "AnyCandidate",
    "Candidate",
    "LlamaCppCandidate",
    "MockCandidate",
    "UrlCandidate",
    "VllmCandidate",
    "candidate_model",
    "candidate_union",
]


class Candidate(StrictModel):
    """Common fields of a candidate (one engine kind + model + settings).

    ``name``: unique, ``[A-Za-z0-9_.-]+``. ``engine``: a kind of :mod:`servelab.engines.registry`
    (built in: ``llamacpp``, ``vllm``, ``url``, ``mock``). ``model``: a local model file or folder (must
    exist; relative to the experiment file); ``None`` = the engine default (llamacpp: Gemma 3 270M GGUF;
    vllm: the HF folder servelab converts from that GGUF; url/mock: no local weights). ``settings``:
    the kind's ``Settings`` model. ``price_per_hour``: what this candidate's hardware costs per hour
    (declared: hardware-specific; ``None`` = ``goal.budget.price_per_hour``). The concrete class of
    each kind is built from the registry by :func:`candidate_model` (:data:`LlamaCppCandidate`,
    :data:`VllmCandidate`, :data:`UrlCandidate`, :data:`MockCandidate` …).
    """

    name: str = Field(pattern=NAME_PATTERN, description="unique candidate name, [A-Za-z0-9_.-]+")
    engine: str
    model: str | None = Field(None, description="model file/folder; null = engine default")
    price_per_hour: float | None = Field(
        None, ge=0, description="hardware price per hour, in goal.budget.currency (null = goal.budget.price_per_hour)"
    )
    restart: Literal["never", "once"] = Field(
        "never",
        description="once: an engine that exits during the load steps is started again once (recovery time recorded)",
    )
    declared: Declared | None = Field(
        None, description="facts the server cannot tell (image digest, GPUs, TP/PP/DP); recorded with source 'declared'"
    )
    if typing.TYPE_CHECKING:  # the field is added per kind by candidate_model (narrowed to kind.Settings)
        settings: EngineSettings

    @field_validator("model")
    @classmethod
    def _model_exists(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        engine = info.data.get("engine")
        kind = registry.get(engine) if isinstance(engine, str) and engine in registry.names() else None
        if kind is not None and kind.launched and not kind.takes_model:
            raise ValueError(
                f"engine {engine!r} takes no model file; remove model (the {kind.title} engine "
                "names its model in settings)"
            )
        path = resolve_path(
            v,
            info,
            "model path",
            "give an existing model file or folder (relative to the experiment file), or null for the engine default",
        )
        if kind is not None and not kind.launched and Path(path).is_file():  # url: a copy of the served weights
            from servelab.modelfile.gguf_meta import check_gguf

            try:
                check_gguf(path)
            except ConfigError:
                raise ValueError(
                    f"{v!r} is not a GGUF file; give the local copy of the served weights as a GGUF "
                    "file or an HF folder, or null"
                ) from None
        return path

    @property
    def kind(self) -> EngineKind:
        """This candidate's engine kind (:class:`servelab.engines.registry.EngineKind`)."""
        return registry.get(self.engine)

    @property
    def launched(self) -> bool:
        """Whether servelab starts this engine (every kind but ``url``)."""
        return self.kind.launched

    def recorded_settings(self) -> JsonObject:
        """The settings as the record's identity holds them: every field, ``None`` values left out."""
        return self.settings.model_dump(mode="json", exclude_none=True)

    def launch_settings(self) -> JsonObject:
        """The engine settings for :func:`servelab.engines.start_engine` (``settings=``): every settings
        field except ``port`` and ``ready_timeout_s``, ``None`` values left out (launcher default)."""
        return self.settings.model_dump(mode="json", exclude_none=True, exclude={"port", "ready_timeout_s"})

    def launch_kwargs(self) -> dict[str, float]:
        """Keyword arguments for the launcher: ``port`` (when set) and ``ready_timeout_s`` (seconds,
        when the engine has one)."""
        d = self.settings.model_dump()
        return {k: d[k] for k in ("port", "ready_timeout_s") if d.get(k) is not None}


_CANDIDATE_MODELS: dict[str, tuple[EngineKind, type[Candidate]]] = {}


def candidate_model(kind: str | EngineKind) -> type[Candidate]:
    """The candidate model of an engine kind: :class:`Candidate` + the kind's ``candidate_fields`` +
    ``engine: Literal[kind]`` + ``settings: kind.Settings`` (built once per registered kind).
    Raises :class:`ConfigError` for an unknown kind name."""
    k = registry.get(kind) if isinstance(kind, str) else kind
    hit = _CANDIDATE_MODELS.get(k.kind)
    if hit is not None and hit[0] is k:
        return hit[1]
    # the kind's own fields come after name/engine/model (pydantic orders fields by reversed MRO)
    bases: tuple[type[BaseModel], ...] = (Candidate,) if k.candidate_fields is None else (k.candidate_fields, Candidate)
    name = "".join(p[:1].upper() + p[1:] for p in re.split(r"[^A-Za-z0-9]+", k.kind) if p) + "Candidate"
    engine: Any = Literal[k.kind]  # a Literal of a value known at run time
    model = typing.cast(
        "type[Candidate]",
        create_model(
            name,
            __base__=bases,
            __module__=__name__,
            __doc__=f"``engine: {k.kind}`` — {k.summary}",
            engine=(engine, Field(description=f"engine kind: {k.kind}")),
            settings=(k.Settings, Field(default_factory=k.Settings, description=f"{k.title} settings")),
        ),
    )
    _CANDIDATE_MODELS[k.kind] = (k, model)
    return model


def candidate_union() -> Any:
    """``Annotated[Union[<candidate model of every registered kind>], Discriminator("engine")]``."""
    models = tuple(candidate_model(k) for k in registry.kinds())
    return Annotated[Union[models], Discriminator("engine")]  # noqa: UP007 — a union of a runtime tuple


class _CandidateUnion:
    """Marker in ``Annotated[Candidate, _CandidateUnion()]``: validate as the registry's candidate union
    at the time the schema is built (:class:`Experiment` rebuilds when a kind is registered)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return handler.generate_schema(candidate_union())

    def resolved_type(self) -> Any:
        """The union this marker stands for now (read by :func:`servelab.wire.config.error_problem`)."""
        return candidate_union()


#: a candidate of any registered kind, chosen by ``engine``
AnyCandidate = Annotated[Candidate, _CandidateUnion()]
LlamaCppCandidate = candidate_model("llamacpp")
VllmCandidate = candidate_model("vllm")
UrlCandidate = candidate_model("url")
MockCandidate = candidate_model("mock")
