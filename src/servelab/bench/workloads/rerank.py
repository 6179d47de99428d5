"""The rerank bench (``servelab bench --endpoint rerank``): documents scored per second by a rerank server.

Each request is a ``POST {API root}/rerank`` in vLLM's shape, which llama-server (``--rerank``) and
servelab's gateway also take (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html,
"Re-rank API", checked 2026-12-02): ``query`` and ``batch_size`` ``documents``. The texts are the
embeddings bench's (:func:`servelab.bench.workloads.embeddings.embedding_inputs`: built-in English text
fitted to the ``input_tokens`` distribution in the given tokenizer); request ``i`` takes the ``batch_size``
+ 1 texts after the previous request's, the first as its query. An answer is good when it has a
``results`` list of at most ``batch_size`` entries, each with an integer ``index`` below ``batch_size``
and a numeric ``relevance_score``.

The step's summary is the embeddings bench's (:class:`servelab.bench.workloads.extras.EmbeddingsSummary`)
under the key ``rerank``: ``inputs`` are documents scored, ``inputs_per_s`` documents per second,
``tokens_per_s`` the server's ``usage.prompt_tokens`` (vLLM: ``usage.total_tokens`` when that is all it
sends) per second, ``latency`` the whole answer's (a rerank answer is not streamed: there is no first
token), ``dimensions`` none.
"""

from __future__ import annotations

from typing import Any

from servelab.bench.workloads.embeddings import EmbeddingsWorkload

__all__ = ["RerankWorkload"]


class RerankWorkload(EmbeddingsWorkload):
    """The rerank step driver (module doc): ``requests`` requests of one query and ``batch_size``
    documents, closed or open loop as :class:`~servelab.bench.workloads.embeddings.EmbeddingsWorkload`."""

    name = "rerank"
    path = "/rerank"
    endpoint = "rerank"
    items = "document(s) per query"
    rate = "documents scored/s"

    def batch(self, i: int) -> list[tuple[str, int | None]]:
        """The documents of request ``i`` (its query is :meth:`query`)."""
        k = i * (self.batch_size + 1)
        return [self.inputs[(k + 1 + j) % len(self.inputs)] for j in range(self.batch_size)]

    def query(self, i: int) -> str:
        """The query of request ``i``."""
        return self.inputs[(i * (self.batch_size + 1)) % len(self.inputs)][0]

    def request_fields(self, i: int, texts: list[str]) -> dict[str, Any]:
        return {"query": self.query(i), "documents": texts}

    def answer_error(self, doc: Any, n_inputs: int) -> str | None:
        results = doc.get("results") if isinstance(doc, dict) else None
        if not isinstance(results, list) or len(results) > n_inputs:
            return f"expected a 'results' list of at most {n_inputs} entries"
        for r in results:
            ok = (
                isinstance(r, dict)
                and isinstance(r.get("index"), int)
                and 0 <= r["index"] < n_inputs
                and isinstance(r.get("relevance_score"), (int, float))
            )
            if not ok:
                return "each result needs an integer 'index' of a document and a numeric 'relevance_score'"
        usage = doc.get("usage")
        if isinstance(usage, dict) and not isinstance(usage.get("prompt_tokens"), int):
            total = usage.get("total_tokens")
            if isinstance(total, int):
                usage["prompt_tokens"] = total  # vLLM's rerank usage: total_tokens only
        return None
