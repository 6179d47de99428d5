"""Task taxonomy of ``servelab advise``: the service types of ../shared/seeds/000 §1 and §9 with their
input and output modalities kept apart (000 §4.2: "understanding video and returning text" is not
"generating video"; "audio in" is not "audio out").

Each task has an id used in the engine catalog (``servelab.catalog.schema.TASKS``), words people use for
it (``aliases``), the 000 §1 row it belongs to, and what 000 §9 says to watch when choosing a model and
what serving cost is easy to miss.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

from servelab.catalog.schema import norm_name
from servelab.wire.errors import ConfigError


@dataclass(frozen=True)
class TaskSpec:
    """One service type.

    ``inputs``/``outputs``: modalities (``text``, ``image``, ``video``, ``audio``, ``embedding``,
    ``score``). ``group``: tasks of one group share engines and a trial workload (``text`` for the LLM
    text tasks). ``route_task``: the task whose 000 §1 routes apply (``edge`` uses the single-machine row;
    its engines must also serve ``chat``). ``needs``: engine features the task itself requires.
    ``local``: the task implies a single local machine (000 §1 row 6). ``row``: the 000 §1 row, quoted.
    ``focus``/``hidden_cost``: 000 §9 columns.
    """

    id: str
    title: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    group: str
    row: str
    focus: str
    hidden_cost: str
    aliases: tuple[str, ...] = ()
    engine_task: str | None = None
    needs: tuple[str, ...] = ()
    local: bool = False
    workloads: tuple[str, ...] = field(default=("short-qa",))

    @property
    def serve_task(self) -> str:
        """The task id an engine must list in ``tasks`` to serve this task."""
        return self.engine_task or self.id

    @property
    def trialable(self) -> bool:
        """Whether ``servelab trial`` can measure it (it drives OpenAI chat completions, text in/out)."""
        return self.group == "text"


_TEXT_ROW = "000 §1 row 1: text, code, reasoning and tool calling -> the model's official vLLM / SGLang recipe first"
_TEXT_FOCUS = "accuracy, language, instruction following, thinking budget (000 §9)"
_TEXT_COST = "reasoning length, time to the visible answer, prefix hits (000 §9)"

TASKS: tuple[TaskSpec, ...] = (
    TaskSpec(
        "chat",
        "chat / Q&A / reasoning",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        _TEXT_FOCUS,
        _TEXT_COST,
        aliases=("qa", "reasoning", "text", "llm", "assistant", "text-generation"),
    ),
    TaskSpec(
        "code",
        "code generation",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        "code run results, tool protocol, multi-turn success (000 §9)",
        "tool waits, context growth, accumulated failures and retries (000 §9)",
        aliases=("coding", "code-generation"),
        workloads=("short-qa", "long-gen"),
    ),
    TaskSpec(
        "agent",
        "agent / tool calling",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        "tool protocol, multi-turn success (000 §9)",
        "tool waits, context growth, retries; shared system/tool prefixes (000 §9)",
        aliases=("tools", "tool-calling", "function-calling", "agents"),
        needs=("tool_calling",),
        workloads=("shared-prefix", "structured"),
    ),
    TaskSpec(
        "rag",
        "RAG / long context",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        "accuracy on the retrieved passages, long-context recall (000 §9)",
        "prefill of long inputs, KV cache per request at the target concurrency (000 §6)",
        aliases=("long-context", "retrieval-augmented-generation", "summarisation", "summarization"),
        workloads=("rag", "short-qa"),
    ),
    TaskSpec(
        "structured",
        "structured extraction (JSON output)",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        "schema validity and field accuracy (000 §9)",
        "constrained decoding overhead, retries on invalid output",
        aliases=("extraction", "json", "structured-output", "structured-extraction"),
        needs=("structured_output",),
        workloads=("structured",),
    ),
    TaskSpec(
        "batch",
        "batch / offline generation",
        ("text",),
        ("text",),
        "text",
        _TEXT_ROW,
        "quality per job at the lowest cost per token",
        "throughput over a fixed window, failures counted (000 §10.2)",
        aliases=("offline", "batch-inference", "bulk"),
        workloads=("long-gen",),
    ),
    TaskSpec(
        "edge",
        "edge / local single machine",
        ("text",),
        ("text",),
        "text",
        "000 §1 row 6: single machine, workstation and capacity-limited -> llama.cpp / MLX-LM / "
        "model-specific native engine first; KTransformers-style heterogeneous routes next",
        "quality, capacity, interactive latency and total cost (000 §1 row 6)",
        "memory bandwidth bound decode; concurrency degrades on CPU (000 §6)",
        aliases=("local", "laptop", "on-device", "desktop", "workstation"),
        engine_task="chat",
        local=True,
    ),
    TaskSpec(
        "vlm",
        "vision-language / document understanding",
        ("text", "image"),
        ("text",),
        "vlm",
        "000 §1 row 2: image, video and document understanding -> vLLM / SGLang / vendor implementation "
        "that supports the encoder and protocol",
        "pages, charts, small text, layout, coordinates, structured fields (000 §9)",
        "preprocessing, page splitting, vision tokens and encoding (000 §9)",
        aliases=("vision", "vision-language", "ocr", "document", "image-understanding", "multimodal"),
    ),
    TaskSpec(
        "embedding",
        "embeddings",
        ("text",),
        ("embedding",),
        "embedding",
        "000 §1 row 5: embedding / reranker -> TEI, vLLM pooling or the vendor library that supports the "
        "architecture; ONNX Runtime / OpenVINO with a matching export",
        "Recall/nDCG, cross-lingual, long documents, query vs document semantics (000 §9)",
        "length distribution, index build, document throughput (000 §9)",
        aliases=("embeddings", "embed", "vectors", "retrieval"),
    ),
    TaskSpec(
        "rerank",
        "reranking",
        ("text",),
        ("score",),
        "rerank",
        "000 §1 row 5: embedding / reranker -> TEI, vLLM pooling or the vendor library",
        "nDCG on your query-document pairs (000 §9)",
        "candidates per query, cascade cost (000 §9)",
        aliases=("reranker", "reranking", "cross-encoder", "score"),
    ),
    TaskSpec(
        "asr",
        "speech recognition (ASR)",
        ("audio",),
        ("text",),
        "asr",
        "000 §1 row 4: ASR, TTS, realtime voice -> the vendor runtime or an adapted dedicated service; "
        "SGLang-Omni / vLLM-Omni when they cover the full chain; Whisper can compare dedicated implementations",
        "WER/CER, language/accent, noise, timestamps, speakers (000 §9)",
        "chunking, VAD, long audio and streaming state (000 §9)",
        aliases=("stt", "speech-to-text", "transcription", "whisper"),
    ),
    TaskSpec(
        "tts",
        "speech synthesis (TTS)",
        ("text",),
        ("audio",),
        "tts",
        "000 §1 row 4: ASR, TTS, realtime voice -> the vendor runtime or an adapted dedicated service",
        "naturalness, pronunciation, voice, turn taking and interruption (000 §9)",
        "first audio, chunking, vocoder, buffering and concurrency (000 §9)",
        aliases=("text-to-speech", "speech-synthesis", "speech"),
    ),
    TaskSpec(
        "realtime-voice",
        "realtime voice conversation",
        ("audio", "text"),
        ("audio", "text"),
        "realtime-voice",
        "000 §1 row 4: realtime voice -> vendor runtime, or ASR -> LLM -> TTS, or SGLang-Omni / vLLM-Omni "
        "when they cover the full chain",
        "turn taking, interruption, latency to first audio (000 §9)",
        "session count, duplex state, buffering (000 §9)",
        aliases=("voice", "speech-to-speech", "omni", "duplex", "voice-agent"),
    ),
    TaskSpec(
        "image-gen",
        "image generation / editing",
        ("text", "image"),
        ("image",),
        "image-gen",
        "000 §1 row 3: image, video, joint audio-video generation -> the model's SGLang Diffusion / "
        "vLLM-Omni recipe; Diffusers / vendor code for baselines, ComfyUI for creative workflows",
        "prompt following, text rendering, people/objects, edit preservation (000 §9)",
        "text encoding, VAE, reference images, resolution (000 §9)",
        aliases=("image", "text-to-image", "t2i", "image-generation", "image-edit"),
    ),
    TaskSpec(
        "video-gen",
        "video generation",
        ("text", "image"),
        ("video",),
        "video-gen",
        "000 §1 row 3: image, video, joint audio-video generation -> the model's SGLang Diffusion / "
        "vLLM-Omni recipe; Diffusers / vendor code for baselines, ComfyUI for creative workflows",
        "temporal consistency, motion, reference following, audio-video sync (000 §9)",
        "sequence length, denoising steps, codecs, transfer, queueing (000 §9)",
        aliases=("video", "text-to-video", "t2v", "i2v", "video-generation"),
    ),
)

_BY_KEY: dict[str, TaskSpec] = {}
for _t in TASKS:
    for _n in (_t.id, *_t.aliases):
        _BY_KEY[norm_name(_n)] = _t


def resolve_task(name: str) -> TaskSpec:
    """The task whose id or alias is ``name`` (case and punctuation ignored). Raises
    :class:`~servelab.wire.errors.ConfigError` naming the nearest task ids and the list of all."""
    key = norm_name(name or "")
    if key in _BY_KEY:
        return _BY_KEY[key]
    near = difflib.get_close_matches(key, list(_BY_KEY), n=3, cutoff=0.5)
    ids: list[str] = []
    for k in near:
        if _BY_KEY[k].id not in ids:
            ids.append(_BY_KEY[k].id)
    hint = f"did you mean {', '.join(ids)}? " if ids else ""
    raise ConfigError(f"--task {name!r} is not a known task; {hint}tasks: {', '.join(t.id for t in TASKS)}")


def task_groups(task_ids: list[str]) -> set[str]:
    """Groups of the given task ids (unknown ids are ignored)."""
    return {_BY_KEY[norm_name(t)].group for t in task_ids if norm_name(t) in _BY_KEY}
