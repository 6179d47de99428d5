"""The mock engine's rerank endpoint (``POST /v1/rerank``, ``/rerank``): a deterministic score, so a
gateway's rerank route can be tested without a reranker model.

Request and answer follow vLLM's rerank API (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html,
"Re-rank API", checked 2026-12-02), which llama-server's ``--reranking`` endpoint also answers
(tools/server/README.md ``POST /reranking``): ``query``, ``documents`` (strings or ``{"text": ...}``),
``top_n`` (0 or absent = all) -> ``{"id", "model", "usage": {"prompt_tokens", "total_tokens"}, "results":
[{"index", "document": {"text"}, "relevance_score"}]}``, results by score, highest first (ties by index).

The score of a document is the share of the query's distinct lower-cased words that occur in it
(0 ... 1): a fact of the two texts, the same on every run. Tokens are whitespace-separated words, as
everywhere in the mock: each document is scored together with the query, so usage is
``sum(words(query) + words(document))`` over the documents.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson
from aiohttp import web

__all__ = ["rerank_answer", "rerank_handler", "score"]

_ids = itertools.count()


def score(query: str, document: str) -> float:
    """The share (0 ... 1) of the distinct lower-cased words of ``query`` found in ``document``."""
    q = set(query.lower().split())
    return len(q & set(document.lower().split())) / len(q) if q else 0.0


def rerank_answer(body: dict[str, Any], model: str) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON answer) for a rerank request ``body`` (module doc); 400 with an OpenAI-shaped
    error when ``query`` or ``documents`` are missing or of the wrong type."""
    query, docs, top = body.get("query"), body.get("documents"), body.get("top_n")
    raw = [d.get("text") if isinstance(d, dict) else d for d in docs] if isinstance(docs, list) else []
    texts = [t for t in raw if isinstance(t, str)]
    if not isinstance(query, str) or not texts or len(texts) != len(raw):
        msg = "rerank needs 'query' (a string) and 'documents' (a non-empty list of strings)"
        return 400, {"error": {"message": msg, "type": "BadRequestError", "code": 400}}
    order = sorted(range(len(texts)), key=lambda i: (-score(query, texts[i]), i))
    if isinstance(top, int) and not isinstance(top, bool) and top > 0:
        order = order[:top]
    words = len(query.split())
    tokens = sum(words + len(t.split()) for t in texts)
    return 200, {
        "id": f"rerank-mock-{next(_ids)}",
        "model": body.get("model") or model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [
            {"index": i, "document": {"text": texts[i]}, "relevance_score": score(query, texts[i])} for i in order
        ],
    }


def rerank_handler(model: str) -> Any:
    """The aiohttp handler answering rerank requests for ``model`` (the mock's configured model name)."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            body = None
        status, answer = rerank_answer(body if isinstance(body, dict) else {}, model)
        return web.Response(status=status, body=orjson.dumps(answer), content_type="application/json")

    return handle
