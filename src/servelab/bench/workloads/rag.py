"""RAG on real documents: the long-input set built from real text, retrieved by a real embedder.

Corpus: the docstrings of Python's standard library (:data:`STDLIB_MODULES`), read with :mod:`inspect`
from the interpreter running servelab. Why this corpus: it is real technical prose (the kind of text
RAG products retrieve), it exists on every machine servelab runs on without a download — Debian's
``/usr/share/doc`` is mostly compressed changelogs and varies with the installed packages — and it is
fixed for a given Python version, which :class:`RagSet` records, so the set is reproducible.

Pipeline (:func:`build_rag_set`): documents -> passages of ``chunk_tokens`` tokens (whole sentences
where possible) -> vectors from an OpenAI ``/v1/embeddings`` server (here all-MiniLM-L6-v2 on
llama-server: :class:`servelab.engines.embedder.EmbeddingLauncher`) -> per question (one per sampled
documented function, "How do I use json.dumps …?") the top-``k`` passages by cosine similarity ->
a chat prompt "context passages + question". Prompt lengths are counted exactly in the target model's
tokenizer and reported as a distribution (:attr:`RagSet.input_tokens`).
"""

from __future__ import annotations

import importlib
import inspect
import random
import re
import sys
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
import orjson
from pydantic import BaseModel, Field

from servelab.bench.workloads.extras import RagInfo
from servelab.wire import ConfigError, RequestSpec

if TYPE_CHECKING:
    from servelab.bench.workloads.kinds import Workload
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = [
    "STDLIB_MODULES",
    "Passage",
    "RagSet",
    "build_rag_set",
    "chunk_documents",
    "embed_texts",
    "rag_docs_workload",
    "stdlib_documents",
    "top_k",
]

#: modules whose docstrings form the corpus (pure-Python, present in every CPython build)
STDLIB_MODULES = (
    "argparse",
    "asyncio",
    "base64",
    "collections",
    "configparser",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "email",
    "fractions",
    "functools",
    "gzip",
    "hashlib",
    "heapq",
    "http.client",
    "json",
    "logging",
    "pathlib",
    "pickle",
    "random",
    "shutil",
    "sqlite3",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
)


class Passage(BaseModel):
    """One retrievable chunk: ``source`` (``module.name``), ``text``, ``tokens`` (in the target tokenizer;
    words without one)."""

    source: str
    text: str
    tokens: int


class RagSet(RagInfo):
    """A built RAG set: the summary's :class:`~servelab.bench.workloads.extras.RagInfo` (``corpus``, ``documents``,
    ``passages``, ``k``, ``embedding_model``, ``input_tokens`` min/p50/p90/max in tokens, ``tokenizer``)
    plus ``requests`` (the specs; excluded from dumps)."""

    requests: list[Any] = Field(default_factory=list, exclude=True)


def stdlib_documents(modules: tuple[str, ...] = STDLIB_MODULES) -> list[tuple[str, str]]:
    """``(source, docstring)`` for each module and each public function/class/method with a docstring of
    at least 200 characters, in a stable order. A module that does not import is skipped."""
    out: list[tuple[str, str]] = []
    for name in modules:
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        seen: set[str] = set()

        def add(source: str, obj: Any, seen: set[str] = seen) -> None:
            doc = inspect.getdoc(obj)
            if doc and len(doc) >= 200 and doc not in seen:
                seen.add(doc)
                out.append((source, doc))

        add(name, mod)
        for attr in sorted(dir(mod)):
            if attr.startswith("_"):
                continue
            obj = getattr(mod, attr, None)
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or getattr(obj, "__module__", "") != mod.__name__:
                continue
            add(f"{name}.{attr}", obj)
            if inspect.isclass(obj):
                for meth in sorted(vars(obj)):
                    if not meth.startswith("_") and inspect.isfunction(vars(obj)[meth]):
                        add(f"{name}.{attr}.{meth}", vars(obj)[meth])
    return out


def chunk_documents(
    docs: list[tuple[str, str]], counter: TokenCounter | None, chunk_tokens: int = 160
) -> list[Passage]:
    """Split each document into passages of about ``chunk_tokens`` tokens (the sum of their sentences'
    counts; joining may add a token), on sentence/line ends; a sentence longer than that is cut by words.
    Raises :class:`ConfigError` below 16 tokens."""
    if chunk_tokens < 16:
        raise ConfigError(f"chunk_tokens {chunk_tokens}: give at least 16 tokens")

    def size(t: str) -> int:
        return counter.count(t) if counter is not None else len(t.split())

    def pieces(part: str) -> list[str]:
        words, out = part.split(), []
        while words:
            cut = len(words)
            while cut > 1 and size(" ".join(words[:cut])) > chunk_tokens:
                cut = max(1, cut * 3 // 4)
            out.append(" ".join(words[:cut]))
            words = words[cut:]
        return out

    out: list[Passage] = []
    for source, doc in docs:
        cur: list[str] = []
        cur_tokens = 0
        for part in (p for p in re.split(r"(?<=[.!?:])\s+|\n\s*\n", doc) if p.strip()):
            for piece in pieces(part):
                n = size(piece)
                if cur and cur_tokens + n > chunk_tokens:
                    text = " ".join(cur)
                    out.append(Passage(source=source, text=text, tokens=size(text)))
                    cur, cur_tokens = [], 0
                cur.append(piece)
                cur_tokens += n
        if cur:
            text = " ".join(cur)
            out.append(Passage(source=source, text=text, tokens=size(text)))
    return out


async def embed_texts(
    http: aiohttp.ClientSession, base_url: str, model: str, texts: list[str], batch: int = 32, timeout_s: float = 120.0
) -> np.ndarray:
    """Vectors of ``texts`` from the OpenAI ``POST /embeddings`` at ``base_url``, L2-normalised, shape
    ``(len(texts), dim)``. Raises :class:`RuntimeError` (one line, the server's status and message) when
    the server refuses a batch or answers without ``data``."""
    rows: list[list[float]] = []
    for i in range(0, len(texts), batch):
        body = {"model": model, "input": texts[i : i + batch]}
        async with http.post(
            base_url.rstrip("/") + "/embeddings",
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as r:
            raw = await r.read()
            if r.status != 200:
                raise RuntimeError(f"embeddings server answered {r.status}: {raw[:200].decode('utf-8', 'replace')}")
        data = orjson.loads(raw).get("data")
        if not isinstance(data, list) or len(data) != len(body["input"]):
            raise RuntimeError("embeddings server answered without one 'data' entry per input")
        rows += [d["embedding"] for d in sorted(data, key=lambda d: d.get("index", 0))]
    v = np.asarray(rows, dtype=np.float32)
    return v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12)


def top_k(query: np.ndarray, passages: np.ndarray, k: int) -> list[int]:
    """Indices of the ``k`` rows of ``passages`` (unit vectors) most similar to ``query`` by cosine,
    best first (ties by index)."""
    sims = passages @ query
    order = np.lexsort((np.arange(len(sims)), -sims))
    return [int(i) for i in order[:k]]


async def build_rag_set(
    http: aiohttp.ClientSession,
    embed_url: str,
    embed_model: str,
    n: int,
    counter: TokenCounter | None,
    *,
    k: int = 4,
    chunk_tokens: int = 160,
    seed: int = 0,
    max_tokens: int = 96,
    modules: tuple[str, ...] = STDLIB_MODULES,
) -> RagSet:
    """Build ``n`` RAG chat requests (see the module doc) retrieving ``k`` passages each through the
    embeddings server at ``embed_url``. Deterministic for a Python version, ``seed`` and embedder.
    Raises :class:`ConfigError` for ``n``/``k`` below 1 and :class:`RuntimeError` from :func:`embed_texts`."""
    if n < 1 or k < 1:
        raise ConfigError(f"a RAG set needs n >= 1 and k >= 1 (got {n}, {k})")
    docs = stdlib_documents(modules)
    passages = chunk_documents(docs, counter, chunk_tokens)
    pv = await embed_texts(http, embed_url, embed_model, [p.text for p in passages])
    named = [s for s, _ in docs if "." in s]
    rng = random.Random(f"servelab:rag:{seed}")
    picks = [rng.choice(named) for _ in range(n)]
    questions = [f"How do I use {s} in Python, and what should I watch out for?" for s in picks]
    qv = await embed_texts(http, embed_url, embed_model, questions)
    specs: list[RequestSpec] = []
    lengths: list[int] = []
    for q, vec in zip(questions, qv, strict=True):
        ctx = "\n\n".join(
            f"[{j + 1}] ({passages[i].source}) {passages[i].text}" for j, i in enumerate(top_k(vec, pv, k))
        )
        text = f"Answer from the passages below.\n\n{ctx}\n\nQuestion: {q}"
        target = counter.count(text) if counter is not None else None
        lengths.append(target if target is not None else len(text.split()))
        specs.append(
            RequestSpec(
                endpoint="chat",
                max_tokens=max_tokens,
                messages=[{"role": "user", "content": text}],
                workload="rag-docs",
                prompt_tokens_target=target,
            )
        )
    a = np.asarray(lengths, dtype=float)
    dist = {
        "min": float(a.min()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
        "max": float(a.max()),
    }
    return RagSet(
        corpus=f"Python {sys.version.split()[0]} standard library docstrings ({len(modules)} modules)",
        documents=len(docs),
        passages=len(passages),
        k=k,
        embedding_model=embed_model,
        tokenizer=counter.name if counter is not None else None,
        input_tokens=dist,
        requests=specs,
    )


def rag_docs_workload(rag: RagSet, per_step: int, step: int = 0) -> Workload:
    """The ``rag-docs`` :class:`~servelab.bench.workloads.kinds.Workload` of ``servelab bench`` over a built
    ``rag`` set: step ``step`` (0-based) sends requests ``step * per_step`` on (cycled), so the steps of a
    sweep ask different questions. Its ``summary_extra`` is ``{"rag": RagInfo}``."""
    from servelab.bench.workloads.kinds import Workload

    specs = rag.requests
    if not specs:
        raise ConfigError("the RAG set has no requests")
    first = step * per_step
    info = RagInfo(**rag.model_dump(exclude={"requests"}))

    def make(i: int) -> RequestSpec:
        return specs[(first + i) % len(specs)]

    return Workload(
        "rag-docs",
        f"RAG on real documents: {rag.corpus}, top-{rag.k} passages by {rag.embedding_model}",
        make,
        rag.tokenizer,
        {"k": rag.k},
        max_input_tokens=int(rag.input_tokens.get("max", 0)) or None,
        summary_extra=lambda: {"rag": info.model_dump()},
    )
