"""Identity for every candidate, each fact with its source.

A candidate's record identity (``identity.candidates.<name>``) gets ``facts``: ``name -> {value,
source}`` merged from three places, in this order of trust:

1. ``launcher``: what servelab knows because it started the engine (the :class:`EngineIdentity` the
   kind wrote: version, build, binary and weights digests, devices; a ``command`` kind's own ``facts``);
2. the server's own words (:func:`servelab.engines.probe.probe`: ``GET /props``, ``GET /version``,
   ``GET /info`` …), also for a server servelab did not start (``engine: url``);
3. ``declared``: what the experiment states and nothing can probe (:class:`Declared`: image digest,
   GPU model and count, TP/PP/DP, and the candidate's ``price_per_hour``). A declared fact the server
   or launcher also stated with another value is kept under ``declared.<name>`` beside it, so the
   record shows the disagreement rather than hiding one side.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from servelab.engines.probe import Fact, ProbedIdentity, probe_sync
from servelab.wire.config import StrictModel
from servelab.wire.jsontypes import JsonObject

__all__ = ["Declared", "fill_identity", "merge_facts", "probe_candidate"]


class Declared(StrictModel):
    """``candidates[].declared``: facts about a candidate that cannot be asked of the server; the record
    keeps each with source ``declared``. ``image_digest``: the container image (``sha256:…``);
    ``gpu_model`` and ``gpu_count``; ``tp``/``pp``/``dp``: tensor, pipeline and data parallel sizes."""

    image_digest: str | None = Field(
        None,
        pattern=r"^(.+@)?sha256:[0-9a-f]{64}$",
        description="container image digest: sha256:<64 hex> or IMAGE@sha256:<64 hex>",
    )
    gpu_model: str | None = Field(None, min_length=1, description="GPU model, e.g. NVIDIA H100 80GB HBM3")
    gpu_count: int | None = Field(None, ge=0, description="GPUs the engine uses")
    tp: int | None = Field(None, ge=1, description="tensor parallel size")
    pp: int | None = Field(None, ge=1, description="pipeline parallel size")
    dp: int | None = Field(None, ge=1, description="data parallel size")


#: declared field -> the fact name it fills (the probe's names where it has one: SGLang tp_size/dp_size)
_DECLARED_NAMES = {
    "image_digest": "image_digest",
    "gpu_model": "gpu_model",
    "gpu_count": "gpu_count",
    "tp": "tp_size",
    "pp": "pp_size",
    "dp": "dp_size",
}


def merge_facts(
    engine: Mapping[str, Any] | None,
    probed: ProbedIdentity | None,
    declared: Declared | None,
    price_per_hour: float | None = None,
) -> dict[str, Fact]:
    """Facts ``name -> Fact`` from the launcher's identity dump ``engine`` (``None`` for a server servelab
    did not start), the probe and the declared block (see the module doc for the order)."""
    facts: dict[str, Fact] = {}
    if engine:
        for name, f in (engine.get("facts") or {}).items():
            facts[name] = Fact.model_validate(f)
        for name in ("version", "build", "binary_sha256", "weights_sha256"):
            v = engine.get(name)
            if v is not None and name not in facts:
                facts[name] = Fact(value=v, source="launcher")
        devices = engine.get("devices")
        if devices and "devices" not in facts:
            facts["devices"] = Fact(value=",".join(devices), source="launcher")
    if probed is not None:
        for name, f in probed.facts.items():
            facts.setdefault(name, f)
        if probed.kind and "engine_kind" not in facts:
            facts["engine_kind"] = Fact(value=probed.kind, source="probe (" + ", ".join(probed.answered) + ")")
    dec: JsonObject = declared.model_dump(mode="json", exclude_none=True) if declared is not None else {}
    if price_per_hour is not None:
        dec["price_per_hour"] = price_per_hour
    for field, value in dec.items():
        name = _DECLARED_NAMES.get(field, field)
        got = facts.get(name)
        if got is None:
            facts[name] = Fact(value=value, source="declared")
        elif got.value != value:
            facts[f"declared.{name}"] = Fact(value=value, source="declared")
    return facts


def probe_candidate(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> ProbedIdentity:
    """:func:`servelab.engines.probe.probe_sync` on ``base_url`` (from the trial's thread; never raises
    for what the server answers)."""
    return probe_sync(base_url, api_key=api_key, timeout_s=timeout_s)


def fill_identity(
    identity: Any, base_url: str, api_key: str | None, declared: Declared | None, price_per_hour: float | None
) -> None:
    """Set ``identity.probe`` (the launcher's probe when it made one, else a new one of ``base_url``) and
    ``identity.facts`` (:func:`merge_facts`) on a :class:`servelab.trial.results.CandidateIdentity`.
    Never raises: a probe that fails leaves its errors in ``identity.probe.errors``."""
    eng = identity.engine.model_dump(mode="json") if identity.engine is not None else None
    try:
        probed = (
            ProbedIdentity.model_validate(eng["probe"])
            if eng and eng.get("probe")
            else probe_candidate(base_url, api_key)
        )
    except Exception as e:  # noqa: BLE001 — identity must not fail a candidate
        probed = ProbedIdentity(errors={"probe": f"{type(e).__name__}: {e}"})
    identity.probe = probed
    identity.facts = merge_facts(eng, probed, declared, price_per_hour)
