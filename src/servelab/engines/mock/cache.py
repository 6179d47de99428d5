"""A prefix cache for the mock engine (``--prefix-cache-blocks``), so routing policies' effect on cache reuse
is exact and testable without a GPU.

The prompt (the mock's words: whitespace-separated words of the messages' texts, or of the prompt) is cut
into blocks of :data:`BLOCK_WORDS` words; block k is keyed by a hash of blocks 1..k (a chain, as vLLM's
automatic prefix caching keys a KV block by its tokens and every token before it:
https://docs.vllm.ai/en/latest/design/prefix_caching.html, read 2026-12-01). A request's cached words are
the leading full blocks already in the cache; its blocks are then inserted (most recent last) and the cache
keeps at most ``capacity`` blocks, evicting the least recently used. A partial last block is never cached.

The mock then (:mod:`servelab.engines.mock.admission`, :mod:`~servelab.engines.mock.respond`,
:mod:`~servelab.engines.mock.server`): prefills only the uncached words (the first token comes
``ttft_ms + (prompt - cached) / prefill_tokens_per_s`` after service starts), reports ``cached_tokens`` in
``usage.prompt_tokens_details`` (vLLM's and OpenAI's field) and ``timings.cache_n`` (llama-server), and
serves the counters ``vllm:prefix_cache_queries_total`` / ``vllm:prefix_cache_hits_total`` (prompt words
looked up / found, the vLLM names, in every dialect) and KV use ``vllm:kv_cache_usage_perc`` (vllm
dialect) or ``sglang:token_usage`` (sglang dialect): words of running requests' prompts and answers over
``capacity * BLOCK_WORDS``, capped at 1.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

__all__ = ["BLOCK_WORDS", "PrefixCache", "prompt_words"]

#: Words per cache block (vLLM's default block size is 16 tokens).
BLOCK_WORDS = 16


def prompt_words(body: dict[str, object]) -> list[str]:
    """The words the mock counts as the prompt, in order (messages' text parts, else the prompt(s))."""
    out: list[str] = []
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            if not isinstance(m, dict):
                continue
            c = m.get("content")
            if isinstance(c, str):
                out += c.split()
            elif isinstance(c, list):
                for part in c:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        out += part["text"].split()
        return out
    p = body.get("prompt")
    if isinstance(p, str):
        return p.split()
    if isinstance(p, list):
        return [w for x in p if isinstance(x, str) for w in x.split()]
    return out


class PrefixCache:
    """LRU cache of ``capacity`` prefix blocks (module doc). ``queries`` / ``hits``: prompt words looked up /
    found since start (counters)."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"--prefix-cache-blocks {capacity} must be >= 1 (0 = no cache)")
        self.capacity = capacity
        self._blocks: OrderedDict[bytes, None] = OrderedDict()
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, words: list[str]) -> int:
        """Cached words of a prompt of ``words`` (leading full blocks found), then store its blocks."""
        keys: list[bytes] = []
        prev = b""
        for k in range(len(words) // BLOCK_WORDS):
            prev = hashlib.blake2b(
                prev + " ".join(words[k * BLOCK_WORDS : (k + 1) * BLOCK_WORDS]).encode(), digest_size=16
            ).digest()
            keys.append(prev)
        hit = 0
        for key in keys:
            if key not in self._blocks:
                break
            hit += 1
        for key in keys:
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)
        cached = hit * BLOCK_WORDS
        self.queries += len(words)
        self.hits += cached
        return cached
