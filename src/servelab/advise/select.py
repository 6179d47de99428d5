"""Candidate ordering and exclusions of ``servelab advise``.

The order is the evaluation order of ../shared/seeds/000 §1 (which routes to try first for a task) and
§11 (match an existing recipe first; text/VLM -> vLLM/SGLang, media -> diffusion/omni services, speech and
retrieval -> dedicated paths; single machine -> native engines, 000 §1 row 6). It is an order of
*verification*, not a performance claim: the exact combination decides (000 §5, §11).

An engine is excluded, with every reason, when it cannot serve the task's input → output modalities,
is built only for other model families, does not run on the hardware's platform, is not active
(lifecycle: not for new platforms), or lacks a feature the request requires. Serving-platform layers
(Dynamo, Ray Serve, Triton: ``model_scope: backend``) are neither candidates nor excluded: they are
listed apart, to evaluate after an engine is verified (000 §1 last row, §11).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.advise.tasks import TaskSpec

#: Precision names accepted by ``--precision`` and what an engine's ``quantizations`` must contain
#: (prefix match) to load such weights natively. ``bf16``/``fp16``/``fp32`` need nothing special.
PRECISION_QUANT_PREFIXES: dict[str, tuple[str, ...]] = {
    "bf16": (),
    "fp16": (),
    "fp32": (),
    "fp8": ("fp8",),
    "nvfp4": ("nvfp4",),
    "mxfp4": ("mxfp4",),
    "int8": ("int8", "awq", "gptq"),
    "int4": ("int4", "awq", "gptq", "gguf-q4", "mlx-4bit"),
    "gguf": ("gguf",),
}

_FEATURE_WORDS = {
    "tool_calling": "tool calling",
    "structured_output": "structured (JSON-schema) output",
    "openai_api": "an OpenAI-compatible API",
}


@dataclass(frozen=True)
class AdviseRequest:
    """What ``servelab advise`` was asked. ``model``: a ``servelab.catalog.models.ModelEntry``;
    ``hardware``: a :class:`servelab.catalog.schema.HardwareEntry`; ``count``: devices; ``context_tokens``:
    tokens per request (prompt + output) to support; ``concurrency``: requests in flight; ``precision``:
    weight precision (``None`` = the model's native dtype); ``openai_api``/``tools``/``json_output``:
    required features; ``local``: one local machine, no outside network at run time."""

    task: TaskSpec
    model: Any
    model_arg: str
    hardware: Any
    count: int
    context_tokens: int
    concurrency: int
    precision: str | None = None
    kv_precision: str | None = None
    openai_api: bool = False
    tools: bool = False
    json_output: bool = False
    local: bool = False

    @property
    def is_local(self) -> bool:
        """Single-machine context (000 §1 row 6): the task says so, ``--local``, or the hardware is not a
        data-centre device (laptop, workstation, consumer card) or is a CPU."""
        hw = self.hardware
        return self.task.local or self.local or hw.segment != "datacenter" or hw.kind == "cpu"

    @property
    def required_features(self) -> list[str]:
        """Engine features the request needs: the task's own plus the constraint flags."""
        need = list(self.task.needs)
        for flag, feat in (
            (self.tools, "tool_calling"),
            (self.json_output, "structured_output"),
            (self.openai_api, "openai_api"),
        ):
            if flag and feat not in need:
                need.append(feat)
        return need

    @property
    def weight_precision(self) -> str:
        """``precision`` or the model's native dtype (``mxfp4-experts`` reads as ``mxfp4``)."""
        if self.precision:
            return self.precision
        native = str(getattr(self.model, "native_dtype", "bf16"))
        return "mxfp4" if native.startswith("mxfp4") else native


@dataclass
class Candidate:
    """An engine to evaluate, in order. ``tier``: ``primary`` / ``secondary`` (000 §1 columns),
    ``baseline`` (reference implementation), ``other`` (capable, not named for this task in 000 §1).
    ``reasons``: why it is here and at this place; ``cautions``: what to check (000 §4 boundary, precision,
    unknown features); ``serve_command``: a template to start it (check it against the README, 000 §5)."""

    engine: Any
    tier: str
    rank: int
    reasons: list[str]
    cautions: list[str] = field(default_factory=list)
    serve_command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: engine name, tier, reasons, cautions, serve command, source and date."""
        return {
            "engine": self.engine.name,
            "display_name": self.engine.display_name,
            "tier": self.tier,
            "reasons": self.reasons,
            "cautions": self.cautions,
            "serve_command": self.serve_command,
            "launch_kind": self.engine.launch,
            "source": self.engine.source,
            "checked": str(self.engine.checked),
        }


@dataclass
class Exclusion:
    """An engine left out. ``category``: the first reason's kind (``modality``, ``model``, ``platform``,
    ``lifecycle``, ``feature``); ``reasons``: every reason, each naming its source."""

    engine: Any
    category: str
    reasons: list[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "engine": self.engine.name,
            "display_name": self.engine.display_name,
            "category": self.category,
            "reasons": self.reasons,
            "source": self.engine.source,
            "checked": str(self.engine.checked),
        }


@dataclass
class LayerNote:
    """A serving-platform layer (Dynamo, Ray Serve, Triton) and whether it applies here."""

    engine: Any
    applicable: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "engine": self.engine.name,
            "display_name": self.engine.display_name,
            "applicable": self.applicable,
            "reason": self.reason,
            "source": self.engine.source,
            "checked": str(self.engine.checked),
        }


def model_in_families(model: Any, families: list[str]) -> bool:
    """Whether the model's ``family`` is one of ``families`` or its ``name`` starts with one of them
    (``deepseek-v4`` matches a model named ``deepseek-v4-flash``, not ``deepseek-v3``)."""
    fam = str(getattr(model, "family", "")).lower()
    name = str(getattr(model, "name", "")).lower()
    return any(fam == f.lower() or name.startswith(f.lower()) for f in families)


def exclusion_reasons(engine: Any, req: AdviseRequest) -> list[tuple[str, str]]:
    """Every reason ``engine`` cannot be a candidate for ``req``, as (category, text) pairs, in the order
    modality, model, platform, lifecycle, feature. Empty when it can."""
    task, hw = req.task, req.hardware
    out: list[tuple[str, str]] = []
    ins, outs = set(engine.input_modalities), set(engine.output_modalities)
    missing_in = [m for m in task.inputs if m not in ins]
    missing_out = [m for m in task.outputs if m not in outs]
    if missing_in or missing_out:
        out.append(
            (
                "modality",
                f"{task.title} needs {'+'.join(task.inputs)} in -> {'+'.join(task.outputs)} out; "
                f"{engine.display_name} takes {'+'.join(engine.input_modalities)} -> "
                f"{'+'.join(engine.output_modalities)} (tasks {', '.join(engine.tasks)}; "
                f"{engine.source}, checked {engine.checked})",
            )
        )
    elif task.serve_task not in engine.tasks:
        out.append(
            ("task", f"serves {', '.join(engine.tasks)}, not {task.title} ({engine.source}, checked {engine.checked})")
        )
    if engine.model_scope == "families" and not model_in_families(req.model, engine.model_families):
        out.append(
            (
                "model",
                f"built only for {', '.join(engine.model_families)} models; {req.model.name} "
                f"(family {req.model.family}) is not one of them (000 §4.3/§4.4; {engine.source})",
            )
        )
    if hw.platform not in engine.platforms:
        out.append(
            (
                "platform",
                f"runs on {', '.join(engine.platforms)}; {hw.name} is {hw.platform} "
                f"({engine.source}, checked {engine.checked})",
            )
        )
    lc = engine.lifecycle
    if not lc.for_new_platforms:
        since = f" since {lc.since}" if lc.since else ""
        out.append(
            ("lifecycle", f"{lc.status}{since}: not for new platforms. {lc.note} ({lc.source}, checked {lc.checked})")
        )
    feats = engine.features.model_dump()
    for need in req.required_features:
        if feats.get(need) is False:
            out.append(
                (
                    "feature",
                    f"missing feature: {_FEATURE_WORDS.get(need, need)} is not offered "
                    f"({engine.source}, checked {engine.checked})",
                )
            )
    return out


def precision_caution(engine: Any, precision: str) -> str | None:
    """A caution when the engine's catalogued quantisations do not name ``precision`` (the weights need
    a conversion or another artefact), else ``None``."""
    prefixes = PRECISION_QUANT_PREFIXES.get(precision, (precision,))
    if not prefixes:
        return None
    if any(q.startswith(p) for q in engine.quantizations for p in prefixes):
        return None
    have = ", ".join(engine.quantizations) or "none listed"
    return (
        f"{precision} weights are not among its catalogued formats ({have}): a converted artefact "
        f"(e.g. GGUF) is a different candidate with its own quality check (000 §8)"
    )


def _route_for(engine: Any, route_tasks: list[str], local: bool) -> tuple[int, Any] | None:
    for i, t in enumerate(route_tasks):
        for r in engine.routes:
            if r.task == t and (local or not r.local_only):
                return i, r
    return None


def serve_command(engine: Any, req: AdviseRequest, port: int | None = None) -> str | None:
    """The engine's ``serve_hint`` filled in for ``req``, or ``None`` when the catalog has no hint.

    Placeholders: ``{model}`` (HF repo or the ``--model`` argument), ``{tp}`` (the TP the capacity plan
    uses on ``req.count`` devices: all of them when the model's heads allow it, else the largest that
    divides, the rest as DP replicas — then a comment says how many replicas to start), ``{ctx}``
    (tokens per request), ``{parallel}`` (slots = concurrency capped at 64), ``{ctx_total}`` (llama-server
    ``-c``: the KV context shared by all ``-np`` slots, so ``ctx x parallel``; llama-server gives each slot
    ``-c / -np`` tokens unless ``--kv-unified``), ``{port}`` (``None``: the engine's default port).
    A template: check it against the engine's docs (000 §5 last row)."""
    if not engine.serve_hint:
        return None
    from servelab.plan import default_layout

    model = getattr(req.model, "hf_repo", None) or req.model_arg
    layout, _ = default_layout(req.model, req.count)
    parallel = max(1, min(req.concurrency, 64))
    cmd = engine.serve_hint.format(
        model=model,
        tp=layout.tp,
        ctx=req.context_tokens,
        port=port or engine.default_port or 8000,
        parallel=parallel,
        ctx_total=req.context_tokens * parallel,
    )
    if layout.dp > 1 and "{tp}" in engine.serve_hint:
        cmd += (
            f"   # TP{req.count} is not possible for this model: run {layout.dp} replicas of TP{layout.tp} "
            f"(vLLM: --data-parallel-size {layout.dp})"
        )
    return cmd


def order_candidates(
    engines: list[Any], req: AdviseRequest
) -> tuple[list[Candidate], list[Exclusion], list[LayerNote]]:
    """Split the catalog into ordered candidates, exclusions and serving-platform layer notes.

    Order: the routes of 000 §1 for the task — with the single-machine row (``edge``) first when the
    request is local (:attr:`AdviseRequest.is_local`) and the task is a text task — primary before
    secondary; then baseline implementations; then capable engines not named for the task. Within a
    tier the catalog's order holds (vLLM before SGLang: both are primary in 000 §1; neither is
    presumed faster, 000 §11). KTransformers is moved to ``other`` for dense models (it targets large
    MoE models, 000 §4.3)."""
    task = req.task
    local = req.is_local
    route_tasks = ["edge", task.serve_task] if (local and task.group == "text") else [task.id]
    if task.id not in route_tasks:
        route_tasks.append(task.id)
    cands: list[Candidate] = []
    excl: list[Exclusion] = []
    layers: list[LayerNote] = []
    for order, eng in enumerate(engines):
        reasons = exclusion_reasons(eng, req)
        if eng.model_scope == "backend":
            if reasons:
                layers.append(LayerNote(eng, False, "not applicable here: " + reasons[0][1]))
            else:
                multi = req.count > req.hardware.max_per_node
                scope = (
                    f"{req.count} devices > {req.hardware.max_per_node} per node: multi-node, so a routing / "
                    "scaling layer may be needed"
                    if multi
                    else "single node"
                )
                layers.append(
                    LayerNote(
                        eng,
                        True,
                        f"{scope}; evaluate only after an engine is verified and "
                        f"there is evidence of routing, scaling or prefill/decode "
                        f"resource conflict (000 §1 last row, §11). {eng.boundary}",
                    )
                )
            continue
        if reasons:
            excl.append(Exclusion(eng, reasons[0][0], [r for _, r in reasons]))
            continue
        found = _route_for(eng, route_tasks, local)
        why: list[str] = []
        cautions: list[str] = [f"{eng.boundary}"]
        if found is None:
            tier, rank = "other", 20
            if any(r.local_only for r in eng.routes):
                why.append(
                    f"000 §1 names it for single-machine deployments (row 6); {req.hardware.name} x "
                    f"{req.count} is a data-centre deployment: evaluate only if the routes above fail"
                )
            else:
                why.append(
                    f"can serve {task.title} on {req.hardware.platform}, but 000 §1 does not name it for "
                    f"this task: evaluate only if the routes above fail"
                )
        else:
            idx, route = found
            cond = route.condition or ""
            if cond.startswith("baseline"):
                tier, rank = "baseline", 10 + idx
            else:
                tier, rank = route.tier, idx * 2 + (0 if route.tier == "primary" else 1)
            row = "single-machine row" if route.task == "edge" else f"{route.task} row"
            why.append(f"000 §1 {row}: {route.tier}" + (f" — {cond}" if cond else ""))
        if eng.name == "ktransformers" and getattr(req.model.architecture, "moe", None) is None:
            tier, rank = "other", 20
            why.append(f"KTransformers targets large MoE models on GPU + host memory; {req.model.name} is dense")
        feats = eng.features.model_dump()
        for need in req.required_features:
            if feats.get(need) is True:
                why.append(f"documents {_FEATURE_WORDS.get(need, need)}")
            elif feats.get(need) is None:
                cautions.append(f"{_FEATURE_WORDS.get(need, need)}: not stated in the catalog — verify")
        if req.count > 1 and task.group == "text":
            par = [p.upper() for p in ("tp", "pp", "ep", "dp") if feats.get(p)]
            if par:
                why.append(f"multi-device: {'/'.join(par)} documented")
            else:
                cautions.append(
                    f"{req.count} devices: no TP documented; whole-layer split or separate replicas only (000 §7)"
                )
        if task.group == "text":
            pc = precision_caution(eng, req.weight_precision)
            if pc:
                cautions.append(pc)
        if req.hardware.kind == "cpu" and eng.launch:
            why.append(f"servelab can launch it on CPU (`servelab trial` candidate kind '{eng.launch}')")
        cands.append(Candidate(eng, tier, rank * 1000 + order, why, cautions, serve_command(eng, req)))
    cands.sort(key=lambda c: c.rank)
    return cands, excl, layers
