"""Continuous-batching timing of the mock engine: a known law a performance model can be fitted against.

With ``prefill_tokens_per_s`` > 0 or ``itl_ms_per_running`` > 0 (:class:`~servelab.engines.mock.config.MockConfig`),
a streamed answer follows this law instead of the fixed ``ttft_ms`` / ``itl_ms`` schedule:

- **first token** at ``start + ttft_ms + prompt_tokens / prefill_tokens_per_s`` (ms and s as named;
  ``start`` is the arrival, or the moment a slot freed when ``max_inflight`` queues on the llama-server
  dialect); ``prompt_tokens`` is the mock's count (whitespace words of the messages). Prefill of one
  request does not slow the others (a simplification of real engines, stated so a fit can be judged).
- **each later chunk** ``itl_ms + itl_ms_per_running * (b - 1)`` ms after the previous one's *scheduled*
  time, where ``b`` is the running batch: streamed answers that have written their first token and not
  yet their last (this one included), counted when the previous chunk was written. Scheduled times are
  absolute, so a late write on a busy host does not push the rest of the answer later.
- the **slot limit** is ``max_inflight`` with the llama-server dialect (requests beyond it wait for a slot).

This is the law ``servelab capacity`` fits (:mod:`servelab.capacity.fit`) and simulates
(:mod:`servelab.capacity.simulate`); the law itself is a linear decode-time model as in Vidur
(Agrawal et al., MLSys 2024, §4: per-iteration time linear in batch size for decode) and in the
roofline of memory-bound decode (each step reads the weights once, plus a per-sequence KV read).
"""

from __future__ import annotations

__all__ = ["DecodeBatch"]


class DecodeBatch:
    """The running batch of one mock server and the timing law above. ``decoding``: answers between
    their first and last token now (count)."""

    __slots__ = ("decoding", "_ttft_ns", "_itl_ns", "_prefill_ns_per_token", "_per_running_ns")

    def __init__(self, ttft_ms: float, itl_ms: float, prefill_tokens_per_s: float, itl_ms_per_running: float) -> None:
        self.decoding = 0
        self._ttft_ns = ttft_ms * 1e6
        self._itl_ns = itl_ms * 1e6
        self._prefill_ns_per_token = 1e9 / prefill_tokens_per_s if prefill_tokens_per_s > 0 else 0.0
        self._per_running_ns = itl_ms_per_running * 1e6

    @staticmethod
    def wanted(prefill_tokens_per_s: float, itl_ms_per_running: float) -> bool:
        """Whether a config asks for this law (either knob above 0)."""
        return prefill_tokens_per_s > 0 or itl_ms_per_running > 0

    def first_ns(self, prompt_tokens: int) -> int:
        """Nanoseconds from the start of service to the first token chunk."""
        return int(self._ttft_ns + prompt_tokens * self._prefill_ns_per_token)

    def target_ns(self, origin_ns: int, i: int, previous_ns: int, gap_ns: int, prompt_tokens: int) -> int:
        """Scheduled monotonic time (ns) of chunk ``i`` of an answer served from ``origin_ns``: the first
        at :meth:`first_ns`, each later one ``gap_ns`` (what :meth:`wrote` returned) after the
        previous scheduled time ``previous_ns``."""
        return origin_ns + self.first_ns(prompt_tokens) if i == 0 else previous_ns + gap_ns

    def wrote(self, i: int) -> int:
        """An answer wrote chunk ``i``: it joins the running batch at its first (the caller takes it
        out with ``decoding -= 1`` when the answer ends); returns :meth:`gap_ns` to its next chunk."""
        if i == 0:
            self.decoding += 1
        return self.gap_ns()

    def gap_ns(self) -> int:
        """Nanoseconds to the next chunk of an answer that just wrote one, at the batch running now."""
        return int(self._itl_ns + self._per_running_ns * (max(1, self.decoding) - 1))
