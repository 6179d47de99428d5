"""The embeddings gate of a candidate (replaces the chat smoke tests and quality gate): one request with
the reference texts (``embeddings.reference``) or a fixed set of gate sentences, checked for a vector per
input, of the stated length, of finite values and, with a reference, close enough to the reference
vectors."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, JsonValue

from servelab.trial.embed_spec import load_reference
from servelab.trial.results import CandidateIdentity, Quality, QualityCheck

__all__ = ["GATE_TEXTS", "ListedModel", "gate", "list_models", "stated_dimensions"]

#: the gate's inputs without a reference file: short and long, plain and with digits/punctuation
GATE_TEXTS = (
    "hello world",
    "The cat sat on the mat.",
    "Retrieval-augmented generation looks up passages before it answers a question.",
    "Version 2.3 was released on 2026-12-01 with 17 fixes.",
    "Paris is the capital of France.",
)


async def _post_embeddings(
    base_url: str, model: str, texts: list[str], api_key: str | None, timeout_s: float
) -> tuple[int | None, Any, str]:
    hdrs = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    body = orjson.dumps({"model": model, "input": texts, "encoding_format": "float"})
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.post(
                base_url.rstrip("/") + "/embeddings",
                data=body,
                headers=hdrs,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as r,
        ):
            raw = await r.read()
            status = r.status
    except (aiohttp.ClientError, TimeoutError) as e:
        return None, None, f"{type(e).__name__}: {e}"
    try:
        return status, orjson.loads(raw), ""
    except orjson.JSONDecodeError:
        return status, None, raw[:200].decode("utf-8", "replace")


class ListedModel(BaseModel):
    """One entry of ``GET /v1/models``: its ``id`` and a llama-server's ``meta`` (``n_embd`` …), as served."""

    model_config = ConfigDict(extra="ignore")

    id: JsonValue = None
    meta: JsonValue = None


async def list_models(base_url: str, api_key: str | None) -> list[ListedModel]:
    """The models the server at ``base_url`` (API root) lists; ``[]`` when it does not answer a list."""
    hdrs = {"Authorization": f"Bearer {api_key}"} if api_key else None
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.get(base_url.rstrip("/") + "/models", headers=hdrs, timeout=aiohttp.ClientTimeout(total=10)) as r,
        ):
            doc = orjson.loads(await r.read())
    except (aiohttp.ClientError, TimeoutError, orjson.JSONDecodeError):
        return []
    data = doc.get("data") if isinstance(doc, dict) else None
    return [ListedModel.model_validate(d) for d in data if isinstance(d, dict)] if isinstance(data, list) else []


def stated_dimensions(identity: CandidateIdentity, models: list[ListedModel]) -> tuple[int | None, str]:
    """The vector length a candidate states and who states it: servelab's embedder in its launch
    identity (``embedding.dimensions``), else a llama-server's ``/v1/models`` ``meta.n_embd``
    (llama.cpp tools/server, https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md,
    read 2026-12-01); ``(None, "")`` when neither."""
    eng = identity.engine.model_dump(mode="json") if identity.engine is not None else {}
    emb = eng.get("embedding") if isinstance(eng, dict) else None
    if isinstance(emb, dict) and isinstance(emb.get("dimensions"), int):
        return emb["dimensions"], "the launcher's identity (embedding.dimensions)"
    for m in models:
        n_embd = m.meta.get("n_embd") if isinstance(m.meta, dict) else None
        if isinstance(n_embd, int):
            return n_embd, "GET /v1/models meta.n_embd"
    return None, ""


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = float(np.linalg.norm(a)), float(np.linalg.norm(b))
    return float(a @ b / (na * nb)) if na and nb else 0.0


def _check(name: str, value: float | None, limit: float, note: str = "") -> QualityCheck:
    informational = limit <= 0
    return QualityCheck(
        name=name,
        value=value,
        limit=limit,
        informational=informational,
        note=note,
        ok=informational or (value is not None and value >= limit),
    )


def gate(
    base_url: str,
    model: str,
    exp_dims: int | None,
    stated: tuple[int | None, str],
    reference: str | None,
    similarity_min: float,
    api_key: str | None,
    path: Path,
    timeout_s: float,
) -> Quality:
    """The embeddings gate (module doc) of the server at ``base_url`` (API root) serving ``model``; the
    request's per-input outcome is written to ``path`` (JSONL: ``text``, ``dimensions``, ``finite``,
    ``cosine``). Returns a :class:`Quality` whose ``checks`` are ``vectors_returned_fraction``,
    ``dimension_match_fraction``, ``finite_fraction`` (each must be 1.0) and, with a reference,
    ``reference_cosine_min`` (min ``similarity_min``; <= 0 informational). Never raises for the server's
    answer: an error status or a malformed answer fails ``vectors_returned_fraction`` with a note."""
    items = load_reference(reference) if reference else None
    texts = [it.text for it in items] if items else list(GATE_TEXTS)
    status, doc, err = asyncio.run(_post_embeddings(base_url, model, texts, api_key, timeout_s))
    data = doc.get("data") if isinstance(doc, dict) else None
    vecs: list[list[float] | None] = [None] * len(texts)
    if status == 200 and isinstance(data, list):
        for k, d in enumerate(data):
            idx = d.get("index", k) if isinstance(d, dict) else k
            emb = d.get("embedding") if isinstance(d, dict) else None
            if isinstance(idx, int) and 0 <= idx < len(texts) and isinstance(emb, list):
                vecs[idx] = emb
    got = [v for v in vecs if v is not None]
    why = (
        ""
        if got
        else (
            f"POST /embeddings answered {status}: {str(doc if doc is not None else err)[:160]}"
            if status != 200
            else f"no 'data' vectors in the answer{': ' + err if err else ''}"
        )
    )
    want, by = (exp_dims, "the experiment (embeddings.dimensions)") if exp_dims else stated
    if want is None and got:
        want, by = len(got[0]), "the first vector's length (the model states none)"
    finite = [bool(all(isinstance(x, (int, float)) and math.isfinite(x) for x in v)) for v in got]
    cos: list[float] = []
    lines = []
    for i, (t, v) in enumerate(zip(texts, vecs, strict=True)):
        c = None
        if v is not None and items is not None and len(v) == len(items[i].embedding) and finite[got.index(v)]:
            c = _cos(np.asarray(v, dtype=float), np.asarray(items[i].embedding, dtype=float))
            cos.append(c)
        lines.append(
            orjson.dumps(
                {
                    "text": t,
                    "dimensions": len(v) if v is not None else None,
                    "finite": None if v is None else finite[got.index(v)],
                    "cosine": c,
                }
            )
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(x + b"\n" for x in lines))
    n = len(texts)
    checks = [
        _check("vectors_returned_fraction", len(got) / n, 1.0, why),
        _check(
            "dimension_match_fraction",
            sum(len(v) == want for v in got) / n,
            1.0,
            f"{want} dimensions stated by {by}" if want else "no vector to measure",
        ),
        _check("finite_fraction", sum(finite) / n, 1.0),
    ]
    if items is not None:
        checks.append(
            _check(
                "reference_cosine_min",
                min(cos) if len(cos) == n else None,
                similarity_min,
                f"cosine similarity to {len(items)} reference vectors of {reference}"
                + ("" if len(cos) == n else f"; {n - len(cos)} input(s) without a comparable vector"),
            )
        )
    return Quality(passed=all(c.ok for c in checks), checks=checks)
