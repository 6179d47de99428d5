"""Pydantic schemas of the engine and hardware catalogs (``catalog/data/engines.yaml``,
``catalog/data/hardware.yaml``).

Every entry carries ``source`` (an http(s) URL) and ``checked`` (the date the fact was last checked
against that source); loading fails if either is missing. Unknown keys are errors. The JSON Schemas
published for editors (``catalog/data/engines.schema.json``, ``catalog/data/hardware.schema.json``) are
generated from these models: ``servelab schema write`` (``servelab schema check`` exits 1 when they
are stale).

Units: ``_gib`` GiB (2**30 bytes), ``_gbps`` GB/s (10**9 bytes per second, as datasheets state
bandwidth), TFLOPS = 10**12 floating-point operations per second (dense, i.e. without 2:4 structured
sparsity).

The stack layers, task ids and modalities follow ../shared/seeds/000 §1, §2 and §4 (checked 2026-11-04
by the seed's authors; read 2026-11-30).
"""

from __future__ import annotations

import datetime as _dt
import functools
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from servelab.wire.config import FrozenModel, PublishedSchema, json_schema_of, read_yaml_file, validation_error_line
from servelab.wire.errors import ConfigError

DATA_DIR = Path(__file__).with_name("data")

#: Stack layers of 000 §2, in order from weights to operations.
LAYERS: tuple[str, ...] = (
    "model-artifact",
    "runtime-kernel",
    "pipeline-library",
    "inference-engine",
    "serving",
    "workflow-platform",
    "deploy-ops",
)
Layer = Literal[
    "model-artifact",
    "runtime-kernel",
    "pipeline-library",
    "inference-engine",
    "serving",
    "workflow-platform",
    "deploy-ops",
]

#: Modalities; inputs and outputs are kept apart (000 §4.2: "input audio" is not "generate audio").
Modality = Literal["text", "image", "video", "audio", "embedding", "score"]

#: Task ids (000 §1 service types and §9): the advise taxonomy maps user wording onto these.
TASKS: tuple[str, ...] = (
    "chat",
    "code",
    "agent",
    "rag",
    "structured",
    "batch",
    "vlm",
    "embedding",
    "rerank",
    "asr",
    "tts",
    "realtime-voice",
    "image-gen",
    "video-gen",
    "edge",
)
Task = Literal[
    "chat",
    "code",
    "agent",
    "rag",
    "structured",
    "batch",
    "vlm",
    "embedding",
    "rerank",
    "asr",
    "tts",
    "realtime-voice",
    "image-gen",
    "video-gen",
    "edge",
]

#: Hardware platforms an engine can run on; each hardware entry names exactly one.
PLATFORMS: tuple[str, ...] = ("cuda", "rocm", "metal", "cpu-x86", "cpu-arm", "ascend", "intel-gpu", "tpu")
Platform = Literal["cuda", "rocm", "metal", "cpu-x86", "cpu-arm", "ascend", "intel-gpu", "tpu"]

#: Precisions of ``dense_tflops`` keys.
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4")
Precision = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp4"]

#: Feature flags of an engine entry (True = documented, False = documented absent / not offered,
#: None = unknown or not applicable).
FEATURES: tuple[str, ...] = (
    "continuous_batching",
    "prefix_cache",
    "structured_output",
    "tool_calling",
    "lora",
    "speculative_decoding",
    "mtp",
    "tp",
    "pp",
    "ep",
    "dp",
    "openai_api",
    "metrics_endpoint",
)


def _http_url(v: str) -> str:
    if not (v.startswith("https://") or v.startswith("http://")) or " " in v:
        raise ValueError(f"{v!r} is not an http(s) URL; every catalog fact needs the page it came from")
    return v


class Sourced(FrozenModel):
    """Mixin fields: ``source`` (URL the fact was checked against) and ``checked`` (date)."""

    source: str = Field(description="http(s) URL of the page the entry's facts were checked against")
    checked: _dt.date = Field(description="date the facts were last checked against source (YYYY-MM-DD)")

    @field_validator("source")
    @classmethod
    def _src(cls, v: str) -> str:
        return _http_url(v)


# ---------------------------------------------------------------------------------------------------
# hardware


class Interconnect(FrozenModel):
    """Device-to-device link of one device. ``bandwidth_gbps``: GB/s **per direction per device**
    (datasheets often quote the bidirectional total: NVLink 4 "900 GB/s" = 450 GB/s each way).
    ``kind`` ``none``: no device-to-device link (a laptop, a single socket); multi-device layouts over it
    are not meaningful."""

    kind: Literal["nvlink", "nvlink-bridge", "infinity-fabric", "pcie", "upi", "none"]
    bandwidth_gbps: float = Field(ge=0, description="GB/s per direction per device; 0 with kind none")
    note: str | None = None

    @model_validator(mode="after")
    def _none_is_zero(self) -> Interconnect:
        if self.kind == "none" and self.bandwidth_gbps != 0:
            raise ValueError("interconnect kind 'none' must have bandwidth_gbps 0")
        return self


class HardwareEntry(Sourced):
    """One device model (a GPU, an accelerator, an Apple SoC, or a CPU socket).

    Fields the capacity planner reads: ``memory_gib`` (per device; GPU datasheet "GB" of HBM/GDDR are
    binary, so 80 GB = 80 GiB raw, of which the driver shows a little less: H100 80GB reports
    81,559 MiB = 79.6 GiB), ``memory_bandwidth_gbps`` (GB/s per device, datasheet peak),
    ``dense_tflops`` (precision → dense TFLOPS; a precision absent here has no tensor/matrix path
    stated by the vendor), ``interconnect``. ``estimated`` lists the fields that are derivations or
    assumptions rather than datasheet values (the derivation is in ``notes``).
    """

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    aliases: list[str] = Field(default_factory=list)
    kind: Literal["gpu", "cpu", "apple", "npu"]
    vendor: str
    platform: Platform
    description: str
    arch: str | None = Field(None, description="architecture, e.g. hopper, cdna3, zen4")
    compute_capability: str | None = Field(None, description="NVIDIA CUDA compute capability, e.g. 9.0")
    memory_gib: float = Field(gt=0, description="memory per device, GiB")
    memory_type: str
    memory_bandwidth_gbps: float = Field(gt=0, description="peak memory bandwidth per device, GB/s")
    dense_tflops: dict[Precision, float] = Field(description="precision -> dense TFLOPS (no sparsity)")
    interconnect: Interconnect
    max_per_node: int = Field(ge=1, description="devices usually found in one machine")
    segment: Literal["datacenter", "workstation", "consumer", "laptop"] = Field(
        "datacenter", description="where the device is usually found; all but datacenter are 'local' (000 §1 row 6)"
    )
    estimated: list[str] = Field(default_factory=list, description="fields that are estimates, see notes")
    notes: list[str] = Field(default_factory=list)

    @field_validator("dense_tflops")
    @classmethod
    def _positive(cls, v: dict[str, float]) -> dict[str, float]:
        for k, x in v.items():
            if not x > 0:
                raise ValueError(f"dense_tflops.{k} must be > 0 (leave a precision out when it is unknown)")
        return v


class HardwareCatalog(FrozenModel):
    """The file ``hardware.yaml``: ``hardware`` is the list of entries."""

    hardware: list[HardwareEntry] = Field(min_length=1)


# ---------------------------------------------------------------------------------------------------
# engines


class Lifecycle(FrozenModel):
    """Maintenance state of a project. ``status``: ``active``; ``maintenance`` (fixes only, not for new
    platforms); ``archived`` (read-only repository). ``since``: date the state began (when known).
    ``source``/``checked``: where the state is stated."""

    status: Literal["active", "maintenance", "archived"]
    since: _dt.date | None = None
    note: str | None = None
    source: str | None = None
    checked: _dt.date | None = None

    @field_validator("source")
    @classmethod
    def _src(cls, v: str | None) -> str | None:
        return None if v is None else _http_url(v)

    @model_validator(mode="after")
    def _evidence(self) -> Lifecycle:
        if self.status != "active" and (self.source is None or self.checked is None or self.note is None):
            raise ValueError(f"lifecycle '{self.status}' needs note, source and checked")
        return self

    @property
    def for_new_platforms(self) -> bool:
        """Whether a new deployment may start on it (only ``active`` projects)."""
        return self.status == "active"


class Features(FrozenModel):
    """Feature flags: True = documented by the project, False = not offered, None = unknown / n.a."""

    continuous_batching: bool | None = None
    prefix_cache: bool | None = None
    structured_output: bool | None = None
    tool_calling: bool | None = None
    lora: bool | None = None
    speculative_decoding: bool | None = None
    mtp: bool | None = None
    tp: bool | None = None
    pp: bool | None = None
    ep: bool | None = None
    dp: bool | None = None
    openai_api: bool | None = None
    metrics_endpoint: bool | None = None


class Route(FrozenModel):
    """How a task reaches an engine in the selection order of 000 §1: ``primary`` (优先评估的路线) or
    ``secondary`` (其他候选与条件), with the condition under which it applies."""

    task: Task
    tier: Literal["primary", "secondary"]
    condition: str | None = None
    local_only: bool = Field(
        False,
        description="the route applies only to single-machine deployments "
        "(laptop, workstation, consumer GPU, CPU; 000 §1 row 6)",
    )


class EngineEntry(Sourced):
    """One project of the engine catalog.

    ``layers``: stack layers of 000 §2 it covers. ``tasks``: task ids it serves; ``input_modalities`` and
    ``output_modalities`` are separate lists (000 §4.2). ``platforms``: hardware platforms it runs on.
    ``model_scope``: ``general`` (any supported architecture), ``families`` (only the model families in
    ``model_families``, e.g. ds4, faster-whisper), or ``backend`` (capability comes from a backend
    engine it drives: Dynamo, Ray Serve, Triton). ``launch``: the ``servelab trial`` candidate kind that
    servelab can start for it, if any. ``boundary``: what to check (000 §4 tables). ``routes``: the 000 §1
    selection-order rows it appears in. ``sources``: further URLs backing individual facts.
    """

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    display_name: str
    aliases: list[str] = Field(default_factory=list)
    project_url: str
    layers: list[Layer] = Field(min_length=1)
    tasks: list[Task] = Field(min_length=1)
    input_modalities: list[Modality] = Field(min_length=1)
    output_modalities: list[Modality] = Field(min_length=1)
    platforms: list[Platform] = Field(min_length=1)
    weight_formats: list[str] = Field(default_factory=list)
    quantizations: list[str] = Field(default_factory=list)
    features: Features = Field(default_factory=Features)
    model_scope: Literal["general", "families", "backend"] = "general"
    model_families: list[str] = Field(default_factory=list)
    lifecycle: Lifecycle
    value: str = Field(description="main value (000 §4 主要价值 / 场景)")
    boundary: str = Field(description="what must be checked (000 §4 应核查的边界 / 选型依据)")
    routes: list[Route] = Field(default_factory=list)
    launch: Literal["vllm", "llamacpp"] | None = Field(
        None, description="servelab trial candidate kind that servelab can start (CPU builds)"
    )
    default_port: int | None = Field(None, ge=1, le=65535, description="usual listen port of its server")
    serve_hint: str | None = Field(
        None,
        description="command template to start its server; {model}, {tp}, "
        "{ctx} (per request), {parallel} (slots), {ctx_total} "
        "(ctx x parallel), {port} are filled in by advise",
    )
    sources: list[str] = Field(default_factory=list)

    @field_validator("project_url")
    @classmethod
    def _purl(cls, v: str) -> str:
        return _http_url(v)

    @field_validator("sources")
    @classmethod
    def _srcs(cls, v: list[str]) -> list[str]:
        return [_http_url(x) for x in v]

    @model_validator(mode="after")
    def _consistent(self) -> EngineEntry:
        if self.model_scope == "families" and not self.model_families:
            raise ValueError("model_scope 'families' needs model_families")
        for r in self.routes:
            if r.task not in self.tasks:
                raise ValueError(f"route for task {r.task!r} but the task is not in tasks")
        return self


class EngineCatalog(FrozenModel):
    """The file ``engines.yaml``: ``engines`` is the list of entries."""

    engines: list[EngineEntry] = Field(min_length=1)


# ---------------------------------------------------------------------------------------------------
# loading and lookup (shared by the engine and hardware catalogs)


def norm_name(name: str) -> str:
    """Lookup key of a name: case-folded, every character but letters, digits and ``+`` dropped
    (``H100 80GB``, ``h100-80gb`` and ``H100_80GB`` are one key)."""
    return "".join(ch for ch in name.casefold() if ch.isalnum() or ch == "+")


def load_yaml_catalog(path: Path, model: type[BaseModel]) -> BaseModel:
    """Read one catalog YAML file and validate it with ``model``. Raises
    :class:`servelab.wire.errors.ConfigError` (one line naming the file and the first bad field) when the
    file is unreadable or invalid, and when two entries share a name or alias."""
    data = read_yaml_file(
        path,
        what="catalog",
        missing_fix="reinstall servelab (the catalogs ship with it)",
        empty_fix="restore the catalog from the servelab source",
    )
    try:
        cat = model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(validation_error_line(e, str(path), model)) from None
    seen: dict[str, str] = {}
    for entries in cat.model_dump(include=set(model.model_fields)).values():
        for entry in entries:
            for n in [entry["name"], *entry.get("aliases", [])]:
                key = norm_name(n)
                if key in seen and seen[key] != entry["name"]:
                    raise ConfigError(
                        f"{path}: name or alias {n!r} of {entry['name']!r} is also "
                        f"{seen[key]!r}; names and aliases must be unique"
                    )
                seen[key] = entry["name"]
    return cat


@functools.cache
def catalog_entries(path: Path, model: type[BaseModel]) -> tuple[Any, ...]:
    """The entries of one catalog file (its model's single list field), validated once per process
    (frozen). Raises :class:`~servelab.wire.errors.ConfigError` as :func:`load_yaml_catalog`."""
    cat = load_yaml_catalog(path, model)
    (field_name,) = model.model_fields
    return tuple(getattr(cat, field_name))


def lookup(entries: Any, name: str, what: str, list_cmd: str) -> Any:
    """The entry of ``entries`` (objects with ``name`` and ``aliases``) whose name or alias matches
    ``name`` (see :func:`norm_name`). Raises :class:`~servelab.wire.errors.ConfigError` naming up to three
    nearest names (difflib) and the command that lists them all."""
    import difflib

    key = norm_name(name)
    by_key: dict[str, Any] = {}
    for e in entries:
        for n in [e.name, *e.aliases]:
            by_key.setdefault(norm_name(n), e)
    if key in by_key:
        return by_key[key]
    shown = {norm_name(n): n for e in entries for n in [e.name, *e.aliases]}
    near = difflib.get_close_matches(key, list(shown), n=6, cutoff=0.5)
    names: list[str] = []
    for k in near:
        canonical = by_key[k].name
        if canonical not in names:
            names.append(canonical)
    hint = f"; did you mean {', '.join(names[:3])}?" if names else ""
    raise ConfigError(f"unknown {what} {name!r}{hint} (`{list_cmd}` lists them all)")


# ---------------------------------------------------------------------------------------------------
# JSON Schemas for editors


SCHEMA_FILES: dict[str, type[BaseModel]] = {
    "engines.schema.json": EngineCatalog,
    "hardware.schema.json": HardwareCatalog,
}


def json_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one catalog file, from its pydantic model."""
    return json_schema_of(model)


#: ``engines.schema.json`` and ``hardware.schema.json``, written and checked by ``servelab schema write|check``.
PUBLISHED_SCHEMAS = tuple(
    PublishedSchema(DATA_DIR / fname, functools.partial(json_schema, model)) for fname, model in SCHEMA_FILES.items()
)
