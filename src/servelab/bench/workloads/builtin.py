"""The built-in workload sets built by name (the test sets of spec 003 §19): short-qa, rag, long-gen,
structured (the sets a mix draws), shared-prefix and tools, each a builder from a
:class:`~servelab.bench.workloads.kinds.WorkloadContext`. The registry
(:mod:`servelab.bench.workloads.registry`) registers them."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from servelab.bench.options import MAX_PROMPT_TOKENS
from servelab.bench.workloads.kinds import WorkloadContext, WorkloadKind, request_rng, request_spec
from servelab.bench.workloads.text import TextMaker
from servelab.bench.workloads.tools import ASKS as TOOL_ASKS
from servelab.bench.workloads.tools import TOOLS, tool_choice_for
from servelab.wire import ConfigError, RequestSpec

__all__ = ["MIXABLE_SETS", "OTHER_SETS", "SCHEMAS"]


_TOPICS = [
    "renewable energy",
    "city planning",
    "the history of printing",
    "machine learning systems",
    "ocean currents",
    "ancient trade routes",
    "database indexing",
    "coffee farming",
    "public libraries",
    "volcanoes",
    "bridge engineering",
    "the immune system",
    "jazz music",
    "train networks",
    "climate adaptation",
    "cryptography",
    "honey bees",
    "space telescopes",
    "urban gardens",
    "supply chains",
    "language learning",
    "medieval castles",
    "electric vehicles",
    "rainforests",
]

_QUESTION_STARTS = [
    "What is the main",
    "How does the",
    "Why did the",
    "Which of the",
    "When should a",
    "Where can the",
    "Who decides the",
    "How many",
    "Can you explain the",
    "What happens if the",
]

# Small strict-mode JSON schemas (every property required, no additional properties).
SCHEMAS: list[dict[str, Any]] = [
    {
        "name": "person",
        "instruction": "the person mentioned: name, age and city",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"],
            "additionalProperties": False,
        },
    },
    {
        "name": "sentiment",
        "instruction": "the overall sentiment (positive, negative or neutral) and a confidence 0-1",
        "schema": {
            "type": "object",
            "properties": {
                "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number"},
            },
            "required": ["sentiment", "confidence"],
            "additionalProperties": False,
        },
    },
    {
        "name": "event",
        "instruction": "the event: title, date (YYYY-MM-DD), location and attendee names",
        "schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "date": {"type": "string"},
                "location": {"type": "string"},
                "attendees": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["title", "date", "location", "attendees"],
            "additionalProperties": False,
        },
    },
    {
        "name": "product",
        "instruction": "the product: name, price, currency and whether it is in stock",
        "schema": {
            "type": "object",
            "properties": {
                "product": {"type": "string"},
                "price": {"type": "number"},
                "currency": {"type": "string"},
                "in_stock": {"type": "boolean"},
            },
            "required": ["product", "price", "currency", "in_stock"],
            "additionalProperties": False,
        },
    },
    {
        "name": "keywords",
        "instruction": "a short summary and up to five keywords",
        "schema": {
            "type": "object",
            "properties": {
                "summary": {"type": "string"},
                "keywords": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            },
            "required": ["summary", "keywords"],
            "additionalProperties": False,
        },
    },
]


def _short_qa(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "normal:64,16,16,160"), ctx.length("output_tokens", "32-128")

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "short-qa", i)
        n_in, n_out = inp(rng), out(rng)
        head = f"{rng.choice(_QUESTION_STARTS)} "
        text = ctx.maker.fit(rng, n_in, head, "?\nAnswer briefly.", lower_first=True)
        return request_spec(ctx.endpoint, text, n_out, "short-qa", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _rag(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "1000-3000"), ctx.length("output_tokens", "64-128")

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "rag", i)
        n_in, n_out = inp(rng), out(rng)
        topic = rng.choice(_TOPICS)
        head = (
            f"Answer the question using only the context passages below. The passages are about {topic}.\n\nContext:\n"
        )
        q = ctx.maker.sentence(rng).rstrip(".!?。！？")
        tail = f"\n\nQuestion: {rng.choice(_QUESTION_STARTS)} {q.lower()}?\nAnswer:"
        text = ctx.maker.fit(rng, n_in, head, tail, para_every=6)
        return request_spec(ctx.endpoint, text, n_out, "rag", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _long_gen(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "normal:64,12,24,128"), ctx.length("output_tokens", "512-1024")

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "long-gen", i)
        n_in, n_out = inp(rng), out(rng)
        kind = rng.choice(
            [
                "a long, detailed article",
                "a multi-section report",
                "a detailed technical guide",
                "a long story",
                "an in-depth essay",
            ]
        )
        head = f"Write {kind} about {rng.choice(_TOPICS)}, using these notes: "
        text = ctx.maker.fit(rng, n_in, head)
        return request_spec(ctx.endpoint, text, n_out, "long-gen", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _structured(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "64-256"), ctx.length("output_tokens", "128-256")

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "structured", i)
        n_in, n_out = inp(rng), out(rng)
        sch = SCHEMAS[rng.randrange(len(SCHEMAS))]
        head = f"Read the text and extract {sch['instruction']}. Reply with one JSON object only.\n\nText:\n"
        text = ctx.maker.fit(rng, n_in, head)
        rf = {"type": "json_schema", "json_schema": {"name": sch["name"], "schema": sch["schema"], "strict": True}}
        return request_spec(
            ctx.endpoint,
            text,
            n_out,
            "structured",
            ctx.target(n_in),
            ctx.ignore_eos,
            ctx.extra,
            json_schema=json.loads(json.dumps(sch["schema"])),
            response_format=rf,
        )

    return make


def _shared_prefix(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    ov = ctx.overrides
    try:
        prefix_tokens = int(ov.get("prefix_tokens", 1024))
        num_prefixes = int(ov.get("num_prefixes", 8))
        suffix_tokens = int(ov.get("suffix_tokens", 32))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be integers") from None
    if any(
        isinstance(ov.get(k), float) and not float(ov[k]).is_integer()
        for k in ("prefix_tokens", "num_prefixes", "suffix_tokens")
    ):
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be integers")
    if prefix_tokens < 1 or num_prefixes < 1 or suffix_tokens < 1:
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be >= 1")
    if prefix_tokens + suffix_tokens > MAX_PROMPT_TOKENS:
        raise ConfigError(
            f"prefix_tokens + suffix_tokens = {prefix_tokens + suffix_tokens}: at most "
            f"{MAX_PROMPT_TOKENS} tokens per request (servelab's limit); use smaller values"
        )
    out = ctx.length("output_tokens", "32-64")
    ctx.max_input_tokens = max(ctx.max_input_tokens, prefix_tokens + suffix_tokens)
    prefixes: dict[int, str] = {}

    def prefix(p: int) -> str:
        if p not in prefixes:
            rng = request_rng(ctx.seed, "shared-prefix/prefix", p)
            head = f"Reference document {p + 1} about {rng.choice(_TOPICS)}:\n"
            prefixes[p] = ctx.maker.fit(rng, prefix_tokens, head, para_every=6)
        return prefixes[p]

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "shared-prefix", i)
        n_out = out(rng)
        pre = prefix(i % num_prefixes)
        total = prefix_tokens + suffix_tokens
        if ctx.maker.counter is None:
            text = pre + "\n\n" + ctx.maker.fit(rng, suffix_tokens, "Question: ")
        else:
            text = _fit_suffix(ctx.maker, rng, pre + "\n\nQuestion: ", total)
        return request_spec(ctx.endpoint, text, n_out, "shared-prefix", ctx.target(total), ctx.ignore_eos, ctx.extra)

    return make


def _fit_suffix(maker: TextMaker, rng: random.Random, head: str, total: int) -> str:
    """``head`` + a fitted suffix so the whole is exactly ``total`` tokens. If ``head`` alone reaches the
    total, the "Question:" label is dropped from it."""
    if maker.count(head) + 1 > total:
        head = head[: -len("Question: ")] if head.endswith("Question: ") else head
    return maker.fit(rng, total, head)


def _tools(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    if ctx.endpoint != "chat":
        raise ConfigError("the tools workload needs --endpoint chat (tools are a chat-completions feature)")
    inp, out = ctx.length("input_tokens", "64-256"), ctx.length("output_tokens", "128-256")

    def make(i: int) -> RequestSpec:
        rng = request_rng(ctx.seed, "tools", i)
        n_in, n_out = inp(rng), out(rng)
        k = rng.randrange(len(TOOLS))
        head = "Background notes (may be irrelevant):\n"
        tail = f"\n\nUse the right tool for this request: {TOOL_ASKS[k]}"
        text = ctx.maker.fit(rng, n_in, head, tail)
        extra = {**ctx.extra, "tools": json.loads(json.dumps(TOOLS)), "tool_choice": tool_choice_for(i, k)}
        return request_spec("chat", text, n_out, "tools", ctx.target(n_in), False, extra)

    return make


#: the sets a mix can draw, in the order they are listed
MIXABLE_SETS = (
    WorkloadKind(
        "short-qa",
        "short question, short answer (input ~64 tokens, output 32-128): TTFT and base throughput",
        _short_qa,
        mixable=True,
    ),
    WorkloadKind(
        "rag",
        "long input, short output (context passages + question, input 1000-3000, output 64-128)",
        _rag,
        mixable=True,
    ),
    WorkloadKind(
        "long-gen",
        "short input, long output (input ~64, output 512-1024): writing, code, reports",
        _long_gen,
        mixable=True,
    ),
    WorkloadKind(
        "structured",
        "JSON-schema output (response_format json_schema, strict; input 64-256, output 128-256)",
        _structured,
        mixable=True,
    ),
)
#: the other built-in sets built by name
OTHER_SETS = (
    WorkloadKind(
        "shared-prefix",
        "N shared long prefixes (1024 tokens) + short distinct suffixes: prefix-cache effects",
        _shared_prefix,
        keys=frozenset({"prefix_tokens", "num_prefixes", "suffix_tokens"}),
    ),
    WorkloadKind(
        "tools",
        "tool calling: 4 tools with nested schemas offered, tool_choice auto/required/named in "
        "turn (input 64-256, output 128-256); every call checked against its tool's schema",
        _tools,
    ),
)
