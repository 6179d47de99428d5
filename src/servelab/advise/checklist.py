"""The exact-combination checklist of ../shared/seeds/000 §5 for one advise request.

000 §5: a usable configuration is "exact weights/revision × task and modality × framework version × GPU
and interconnect × precision and kernels × template/processor/parser × parallelism and load". Each of
its seven rows (查到的信息 → 仍需核对) becomes one item: what the catalogs already tell for this case,
each fact with its source URL and check date, and what is still to verify. Nothing here is a
verification: the catalogs record what projects and vendors state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from servelab.advise.select import PRECISION_QUANT_PREFIXES, AdviseRequest, Candidate


@dataclass
class Fact:
    """A fact known from a catalog, with its source URL and check date."""

    text: str
    source: str
    checked: str

    def to_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {"fact": self.text, "source": self.source, "checked": self.checked}


@dataclass
class CheckItem:
    """One 000 §5 row. ``status``: ``known`` (the catalogs settle it for this case), ``partly`` (facts
    known, something still to verify) or ``verify`` (nothing known yet)."""

    key: str
    found: str
    question: str
    known: list[Fact] = field(default_factory=list)
    verify: list[str] = field(default_factory=list)

    @property
    def status(self) -> str:
        """``known`` / ``partly`` / ``verify``."""
        if self.known and not self.verify:
            return "known"
        return "partly" if self.known else "verify"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "key": self.key,
            "found": self.found,
            "question": self.question,
            "status": self.status,
            "known": [f.to_dict() for f in self.known],
            "verify": self.verify,
        }


def _mfact(model: Any, text: str) -> Fact:
    return Fact(text, model.source, str(model.checked))


def _efact(engine: Any, text: str) -> Fact:
    return Fact(text, engine.source, str(engine.checked))


def _hfact(hw: Any, text: str) -> Fact:
    return Fact(text, hw.source, str(hw.checked))


def _arch_summary(model: Any) -> str:
    a = model.architecture
    parts = [f"{a.num_layers} layers, hidden {a.hidden_size}"]
    if a.attention is not None:
        parts.append(
            f"attention {a.attention.num_heads} heads / {a.attention.num_kv_heads} KV heads"
            + (f", sliding window {a.attention.sliding_window}" if a.attention.sliding_window else "")
        )
    if a.mla is not None:
        parts.append(f"MLA (kv_lora_rank {a.mla.kv_lora_rank})")
    if a.ssm is not None:
        parts.append("Mamba-2 state-space layers")
    if a.moe is not None:
        parts.append(f"MoE {a.moe.num_experts} experts, {a.moe.experts_per_token} active per token")
    mixers = sorted(set(a.mixer_pattern))
    if len(mixers) > 1:
        parts.append("mixed layers: " + "/".join(mixers))
    return "; ".join(parts)


def build_checklist(req: AdviseRequest, candidates: list[Candidate], plan: dict[str, Any] | None) -> list[CheckItem]:
    """The seven 000 §5 rows for ``req``, filled from the model, engine and hardware catalogs and the
    capacity plan (``plan``: :meth:`CapacityPlan.to_dict` output or ``None``). ``candidates``: ordered;
    the first two are named in engine-specific items."""
    m, hw, task = req.model, req.hardware, req.task
    top = candidates[:2]
    names = " / ".join(c.engine.display_name for c in top) or "the chosen engine"
    items: list[CheckItem] = []

    # 1. architecture class
    it = CheckItem(
        "architecture",
        "支持一个架构类 / the engine supports an architecture class",
        "新型号是否更换 attention、MoE、记忆模块或视觉编码器？ Does this checkpoint change attention, MoE, "
        "memory modules or the vision encoder?",
    )
    it.known.append(_mfact(m, f"{m.display_name}: {_arch_summary(m)}"))
    for comp in getattr(m, "components", []) or []:
        it.known.append(_mfact(m, f"extra component {comp.name} ({comp.role}, {comp.params / 1e9:.3g}B params)"))
    a = m.architecture
    if a.mla is not None or a.ssm is not None or len(set(a.mixer_pattern)) > 1:
        it.verify.append(
            "non-standard attention/state (MLA, SSM, sliding/mixed layers): check the engine has a "
            "kernel for this exact layout and that the GQA KV formula is not applied (000 §6)"
        )
    for c in top:
        srcs = [s for s in c.engine.sources if "supported" in s] or [c.engine.source]
        it.verify.append(
            f"{c.engine.display_name}: find {m.hf_repo or m.name} (not just its class) in the supported "
            f"models list of the pinned version: {srcs[0]}"
        )
    items.append(it)

    # 2. precision / format
    prec = req.weight_precision
    it = CheckItem(
        "precision",
        "支持 FP4 / FP8 / GGUF / a precision or format",
        "哪种格式、哪些组件、什么后端和 GPU？ Which format, which components, which backend and GPU?",
    )
    native = getattr(m, "native_dtype", None)
    if native:
        it.known.append(_mfact(m, f"published weights: {native}"))
    tf = hw.dense_tflops
    hw_key = {"nvfp4": "fp4", "mxfp4": "fp4", "int4": "int8"}.get(prec, prec)
    if hw_key in tf:
        it.known.append(_hfact(hw, f"{hw.name} has a {hw_key} tensor/matrix path: {tf[hw_key]:g} dense TFLOPS"))
    elif prec not in ("gguf",):
        it.known.append(
            _hfact(
                hw,
                f"{hw.name} states no {hw_key} rate: {prec} weights run through dequantising "
                "kernels (weight-only), not low-precision compute",
            )
        )
    for c in top:
        prefixes = PRECISION_QUANT_PREFIXES.get(prec, (prec,))
        ok = (not prefixes) or any(q.startswith(p) for q in c.engine.quantizations for p in prefixes)
        it.known.append(
            _efact(
                c.engine,
                f"{c.engine.display_name} lists {prec}: {'yes' if ok else 'no'} "
                f"(formats: {', '.join(c.engine.quantizations) or 'none listed'})",
            )
        )
    it.verify.append(
        f"exact {prec} scheme (per-tensor/block/group scales), which components stay in higher "
        "precision, and the kernel the engine picks on this GPU (000 §8)"
    )
    if req.kv_precision:
        it.verify.append(f"KV cache at {req.kv_precision}: a separate quality check at long context (000 §8)")
    items.append(it)

    # 3. model card names a framework
    it = CheckItem(
        "model-card",
        "模型卡列出框架 / the model card lists frameworks",
        "是否要指定 commit、nightly、额外内核或转换？ Does it need a pinned commit, nightly, extra kernels "
        "or a conversion?",
    )
    it.known.append(_mfact(m, f"publisher page: {m.source}"))
    it.verify.append(
        f"read the publisher's text and recipe for {names}; pin the version that has it — "
        "main having it does not mean your pinned image does (000 §5)"
    )
    items.append(it)

    # 4. OpenAI-compatible API
    it = CheckItem(
        "openai-api",
        "OpenAI 兼容 API / an OpenAI-compatible API",
        "工具参数、reasoning、usage、流结束、取消和错误语义？ Tool arguments, reasoning, usage, end of "
        "stream, cancellation and error semantics?",
    )
    for c in top:
        flag = c.engine.features.openai_api
        it.known.append(
            _efact(
                c.engine,
                f"{c.engine.display_name} OpenAI-compatible API: "
                f"{ {True: 'documented', False: 'not offered', None: 'not stated'}[flag] }",
            )
        )
    if task.trialable:
        it.verify.append(
            "`servelab trial` smoke tests check streaming, usage, json_schema and stop for each "
            "candidate; still verify: "
            + ", ".join(
                (["tool-call arguments (--tools)"] if (req.tools or task.id == "agent") else [])
                + ["reasoning fields", "cancellation", "error bodies under overload"]
            )
        )
    elif task.id == "embedding":
        it.verify.append(
            "`servelab trial` (goal.task_kind: embeddings, `advise --write-experiment`) gates each "
            "candidate on /v1/embeddings: a vector per input, the stated dimension, finite values and "
            "cosine similarity to reference vectors; still verify: base64 encoding, token-id inputs, "
            "inputs over the model's length (error or silent truncation), error bodies under overload"
        )
    else:
        it.verify.append(
            f"{task.title} uses a non-chat endpoint (e.g. embeddings, audio, images): check its "
            "request/response schema, streaming and error semantics per engine"
        )
    items.append(it)

    # 5. long context
    it = CheckItem(
        "context",
        "1M 上下文 / the advertised context length",
        "原生、扩展或托管能力？目标并发下能否容纳？ Native, extended or hosted-only? Does it fit at the "
        "target concurrency?",
    )
    maxc = m.architecture.max_context
    it.known.append(_mfact(m, f"trained/configured context: {maxc:,} tokens; requested {req.context_tokens:,}"))
    if req.context_tokens > maxc:
        it.verify.append(
            f"requested {req.context_tokens:,} tokens > the model's {maxc:,}: needs rope scaling "
            "(e.g. YaRN) — a quality check of its own"
        )
    if plan is not None and "fits" in plan:
        it.known.append(
            Fact(
                f"capacity plan (estimate): {'fits' if plan['fits'] else 'does NOT fit'} "
                f"{req.concurrency} x {req.context_tokens:,} tokens on {req.count} x {hw.name}",
                "servelab.plan (formulas and sources in its output)",
                "computed",
            )
        )
        it.verify.append(
            "measure: the plan is an estimate; confirm the engine's reported KV capacity at startup "
            "and run the target concurrency (000 §6, §10.3)"
        )
    else:
        it.verify.append("no capacity estimate: size KV/state memory at the target concurrency by measurement")
    items.append(it)

    # 6. multimodal
    it = CheckItem(
        "modality",
        "多模态示例 / a multimodal example",
        "理解还是生成？流式、首尾帧、参考素材或实时打断？ Understanding or generation? Streaming, "
        "first/last frames, reference material, realtime interruption?",
    )
    kind = "generation" if set(task.outputs) & {"image", "video", "audio"} else "understanding/text"
    it.known.append(
        Fact(
            f"task {task.id}: {'+'.join(task.inputs)} in -> {'+'.join(task.outputs)} out ({kind})",
            "servelab advise task taxonomy (000 §1, §4.2)",
            "2026-11-30",
        )
    )
    if set(task.inputs) | set(task.outputs) != {"text"}:
        it.verify.append(
            "streaming of the output modality, first/last frame or reference inputs, realtime "
            "interruption — per engine recipe, not by the word 'Omni' (000 §4.2)"
        )
    items.append(it)

    # 7. generated install code
    it = CheckItem(
        "install",
        "自动生成的安装代码 / generated install code",
        "是否与真正 README 的支持限制相符？ Does it match the real README's support limits?",
    )
    it.verify.append(
        "the serve commands printed by advise are templates: check each flag against the engine's "
        "README / docs for the pinned version and this model"
    )
    items.append(it)
    return items
