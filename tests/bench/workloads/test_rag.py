"""RAG on real documents: the stdlib corpus, passages, retrieval through the real all-MiniLM-L6-v2
embedder on llama-server, and the prompts sent to the real Gemma llama-server."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from servelab.bench.workloads.rag import build_rag_set, chunk_documents, stdlib_documents, top_k
from servelab.modelfile.tokenizer import TokenCounter, load_tokenizer
from servelab.wire import ConfigError, RequestRecord
from servelab.wire.client import make_session, send

#: a part of the corpus, so the test embeds ~100 passages, not ~400 (CI time)
MODULES = ("argparse", "csv", "datetime", "json", "logging", "pathlib", "statistics", "textwrap", "uuid", "zipfile")


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    return load_tokenizer(None)


def test_corpus_and_passages(counter: TokenCounter) -> None:
    docs = stdlib_documents()
    assert len(docs) > 100 and docs == stdlib_documents()  # real text, stable order
    assert any(s == "json.dumps" for s, _ in docs)
    ps = chunk_documents(docs, counter, chunk_tokens=120)
    assert len(ps) > len(docs) // 2
    assert all(p.tokens == counter.count(p.text) for p in ps[:50])
    assert max(p.tokens for p in ps) <= 120 + 4  # joins may add a token or two
    with pytest.raises(ConfigError, match="at least 16"):
        chunk_documents(docs, counter, chunk_tokens=8)


def test_top_k_is_cosine_order() -> None:
    pv = np.eye(4, dtype=np.float32)
    q = np.array([0.1, 0.9, 0.3, 0.0], dtype=np.float32)
    assert top_k(q, pv, 3) == [1, 2, 0]


def test_retrieval_through_the_real_embedder(counter: TokenCounter) -> None:
    from servelab.engines.embedder import MODEL_ID, EmbeddingLauncher
    from servelab.engines.llamacpp import LlamaCppLauncher

    with EmbeddingLauncher(parallel=2).start() as emb:

        async def build():
            async with make_session() as s:
                return await build_rag_set(
                    s, emb.base_url, MODEL_ID, 12, counter, k=3, chunk_tokens=160, seed=4, modules=MODULES
                )

        rs = asyncio.run(build())
    print("\n", rs.model_dump_json())
    assert rs.passages > 60 and rs.k == 3 and len(rs.requests) == 12
    hits = 0
    for spec in rs.requests:
        text = spec.messages[0]["content"]
        assert counter.count(text) == spec.prompt_tokens_target  # exact in Gemma's tokenizer
        asked = text.rsplit("How do I use ", 1)[1].split(" in Python")[0]
        first_source = text.split("[1] (", 1)[1].split(")", 1)[0]
        hits += first_source.split(".")[0] == asked.split(".")[0]
    assert hits >= 8, hits  # the top passage comes from the asked-about module for most questions
    assert 300 <= rs.input_tokens["p50"] <= 700
    with LlamaCppLauncher(parallel=1, ctx_size=4096).start() as eng:

        async def go() -> RequestRecord:
            async with make_session() as s:
                rec = RequestRecord(request_id=0)
                spec = rs.requests[0]
                spec.max_tokens = 4
                await send(s, eng.base_url, "m", spec, rec, timeout_s=300)
                return rec

        rec = asyncio.run(go())
    assert rec.ok and rec.prompt_tokens >= rs.requests[0].prompt_tokens_target
