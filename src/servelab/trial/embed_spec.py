"""The ``embeddings:`` section of an experiment and the checks of an embeddings trial
(``goal.task_kind: embeddings``; seed 000 §10.2: vector throughput with input length and unit stated).

- :class:`EmbeddingsOptions`: what each ``POST /v1/embeddings`` request of the load steps carries
  (``batch_size`` inputs, lengths from ``input_tokens`` in the embedding model's tokenizer) and the
  embeddings gate (``dimensions``, ``reference`` vectors and ``similarity_min``).
- :func:`embeddings_conflicts`: the first field of an experiment that does not apply to an embeddings
  trial (a chat-only field that was set, a chat candidate, a token-time SLO), as one line naming the
  field and the fix, or ``None``. :mod:`servelab.trial.spec` calls it from its cross checks, so the
  message comes out of :func:`servelab.trial.spec.load_experiment` as a one-line ``ConfigError``.

This module imports no other trial module (the spec imports it).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from servelab.wire.config import StrictModel

__all__ = [
    "CHAT_ONLY_FIELDS",
    "EMBEDDING_KINDS",
    "EmbeddingsOptions",
    "ReferenceItem",
    "embeddings_conflicts",
    "load_reference",
]

#: engine kinds an embeddings trial accepts: servers the experiment names (``url``) or starts with its
#: own command line (``command``, e.g. ``servelab embed-engine --port {port}``); ``llamacpp`` only with
#: ``--embeddings`` in its extra arguments (llama-server serves /v1/embeddings only then,
#: https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md, read 2026-12-01)
EMBEDDING_KINDS = ("url", "command", "llamacpp")

#: experiment fields that only mean something for chat traffic: ``(path, what it is for)``. Set in an
#: embeddings trial they are refused (they would be silently ignored otherwise).
CHAT_ONLY_FIELDS: tuple[tuple[str, str], ...] = (
    ("workloads", "chat workloads (an embeddings trial sends embeddings: requests; set embeddings.input_tokens)"),
    ("goal.mix", "the chat arrival mix"),
    ("goal.workload_slo", "per-chat-workload SLOs"),
    ("goal.quality.samples", "chat business samples (give embeddings.reference vectors instead)"),
    ("goal.quality.structured_valid_min", "the structured-output gate"),
    ("goal.quality.structured_requests", "the structured-output gate"),
    ("goal.quality.smoke", "the chat smoke tests (the embeddings gate replaces them)"),
    ("goal.quality.samples_pass_min", "chat business samples"),
    ("ignore_eos", "output lengths of generated text"),
    ("mix_sweep", "the chat mix sweep"),
    ("checks", "the chat-template and context checks"),
    ("arrival_test", "the chat arrival test"),
    ("capacity", "the open-loop capacity search on the chat mix"),
    ("lifecycle", "restart-under-load and cancellation of streamed chats"),
    ("goal.expected_rate_rps", "the chat arrival test and replica planning, not run for embeddings"),
    ("goal.peak_rate_rps", "replica planning, not computed for embeddings"),
    ("goal.headroom", "replica planning, not computed for embeddings"),
    ("goal.budget.price_per_hour", "cost per output token, not computed for embeddings"),
)

#: SLO metrics that time tokens of a streamed answer: an embeddings response has none
_TOKEN_METRICS = ("ttft", "ttfat", "tpot", "itl")


class ReferenceItem(StrictModel):
    """One reference input: ``text`` and its expected ``embedding`` (floats)."""

    text: str = Field(min_length=1)
    embedding: list[float] = Field(min_length=1)


def load_reference(path: str) -> list[ReferenceItem]:
    """The items of a reference file: JSON ``{"items": [{"text": ..., "embedding": [...]}, ...]}`` (the
    format of ``tests/gateway/data/embedding_reference.json``; other keys are kept as provenance and
    ignored here). Raises :class:`ValueError` with one line for an unreadable or malformed file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot read reference {path}: {e}; give a JSON file {{items: [{{text, embedding}}]}}"
        ) from None
    items = doc.get("items") if isinstance(doc, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(f"reference {path} has no 'items' list; write {{items: [{{text, embedding}}]}}")
    out = []
    for i, it in enumerate(items):
        if not isinstance(it, dict) or not isinstance(it.get("text"), str) or not isinstance(it.get("embedding"), list):
            raise ValueError(f"reference {path}: items[{i}] needs 'text' (string) and 'embedding' (list of numbers)")
        out.append(ReferenceItem(text=it["text"], embedding=[float(x) for x in it["embedding"]]))
    return out


class EmbeddingsOptions(StrictModel):
    """``embeddings:`` (used when ``goal.task_kind`` is ``embeddings``; docs/experiment.md).

    ``batch_size``: inputs per ``/v1/embeddings`` request of the load steps (1-2048). ``input_tokens``:
    per-input length distribution in the embedding model's tokenizer (``128``, ``16-256``,
    ``normal:128,32``; default ``16-256``). ``dimensions``: the vector length every answer must have;
    ``None`` = the length the candidate states (servelab's embedder: its identity; otherwise the
    ``n_embd`` a llama-server lists in ``/v1/models``), else the length of the first vector, named as
    such. ``reference``: JSON file of reference vectors (:func:`load_reference`), sent as the gate's
    inputs; ``None`` = a fixed set of gate sentences without a similarity check. ``similarity_min``:
    minimum cosine similarity (-1..1) of each served vector to its reference; 0 = informational (the
    value is recorded, the gate does not fail on it).
    """

    batch_size: int = Field(1, ge=1, le=2048, description="inputs per /v1/embeddings request (1-2048)")
    input_tokens: str | int = Field(
        "16-256",
        description="per-input length distribution, tokens of the embedding model's tokenizer",
        examples=["16-256", 128],
    )
    dimensions: int | None = Field(None, ge=1, description="vector length required; null = the model's stated one")
    reference: str | None = Field(None, description="JSON file {items: [{text, embedding}]} of reference vectors")
    similarity_min: float = Field(
        0.0, ge=-1, le=1, description="min cosine similarity to the reference (0 = informational)"
    )

    @field_validator("input_tokens")
    @classmethod
    def _lengths(cls, v: str | int) -> str | int:
        from servelab.bench.options import MAX_PROMPT_TOKENS
        from servelab.bench.workloads.lengths import parse_length
        from servelab.wire.errors import ConfigError

        try:
            parse_length(v, "input_tokens", MAX_PROMPT_TOKENS)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        return v

    @field_validator("reference")
    @classmethod
    def _reference(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return None
        p = Path(v).expanduser()
        if not p.is_absolute():
            base = (info.context or {}).get("base_dir") if info.context else None
            p = Path(base or os.getcwd()) / p
        p = Path(os.path.abspath(p))
        items = load_reference(str(p))
        dims = {len(it.embedding) for it in items}
        if len(dims) != 1:
            raise ValueError(f"reference {p}: vectors of different lengths {sorted(dims)}; give one model's vectors")
        if not all(math.isfinite(x) for it in items for x in it.embedding):
            raise ValueError(f"reference {p}: a vector holds NaN or infinity")
        return str(p)


def _is_set(obj: Any, path: str) -> bool:
    """Whether the dotted ``path`` holds a value other than its default (a file written back by
    ``Experiment.to_yaml`` states every field, so "given" alone would refuse a re-run)."""
    *parents, last = path.split(".")
    for part in parents:
        obj = getattr(obj, part)
    field = type(obj).model_fields[last]
    return bool(getattr(obj, last) != field.get_default(call_default_factory=True))


def embeddings_conflicts(exp: Any) -> str | None:
    """For an experiment with ``goal.task_kind: embeddings``: the first problem as ``PATH: PROBLEM; FIX``
    (a chat-only field of :data:`CHAT_ONLY_FIELDS` that was set, an SLO on token times, a candidate
    kind outside :data:`EMBEDDING_KINDS`, a ``llamacpp`` candidate without ``--embeddings``), else
    ``None``. For a chat experiment: ``embeddings`` set is the problem."""
    if exp.goal.task_kind != "embeddings":
        if exp.embeddings != EmbeddingsOptions():
            return (
                "embeddings: applies to an embeddings trial only; set goal.task_kind: embeddings, "
                "or remove the embeddings section"
            )
        return None
    for path, what in CHAT_ONLY_FIELDS:
        if _is_set(exp, path):
            return (
                f"{path}: is for {what} and does not apply to an embeddings trial (goal.task_kind: embeddings); "
                "remove it"
            )
    for o in exp.goal.objectives:
        if o.metric in _TOKEN_METRICS:
            return (
                f"goal.slo: {o.name} times streamed tokens, which an embeddings response has none of; "
                "use e2e (request latency), e.g. e2e_p95<=500ms, and error_rate"
            )
    for i, c in enumerate(exp.candidates):
        if c.engine not in EMBEDDING_KINDS:
            return (
                f"candidates[{i}].engine: {c.engine!r} is a chat engine here; an embeddings trial compares "
                "/v1/embeddings servers: use engine: command (e.g. argv: [servelab, embed-engine, --port, "
                "'{port}']), engine: url, or llamacpp with settings.extra_args [--embeddings, ...]"
            )
        if c.engine == "llamacpp":
            extra = [str(a) for a in (getattr(c.settings, "extra_args", None) or [])]
            if not {"--embeddings", "--embedding"} & set(extra):
                return (
                    f"candidates[{i}]: a llamacpp candidate serves chat unless started with --embeddings; "
                    "add settings.extra_args: [--embeddings, --pooling, mean] and an embedding model"
                )
    return None
