"""What a request was served, per choice: the tokens limits, budgets and the ledger settle to.

Engines disagree on what ``usage`` counts when a request generates several sequences (``n > 1``, or a
list of prompts on ``/v1/completions``):

- **OpenAI, vLLM, SGLang**: one ``usage`` for the whole request, summed over every choice ("charged
  based on the number of generated tokens across all of the choices",
  https://platform.openai.com/docs/api-reference/chat/create, checked 2026-11-30); streamed, it comes in
  one last chunk with ``choices: []``.
- **llama.cpp** (llama-server b11434, measured here 2026-12-01): each choice is a task of its own. A
  whole answer carries the ``usage`` of **one** choice (``n: 4, max_tokens: 16, ignore_eos`` -> four
  choices of 16 tokens, ``usage.completion_tokens`` 16, ``prompt_tokens`` of one prompt); a stream gives
  **each** choice's final chunk (``choices: [{"index": i, "finish_reason": ...}]``) its own ``usage``.

So the gateway charges what it can establish was served, never less (:class:`ServedCount`):

- ``completion_tokens`` = the largest of (a) the request-wide ``usage`` (a chunk with no choices, or a
  whole answer's), (b) the sum of per-choice ``usage`` (chunks that carry one choice and usage, when
  several sequences were asked for and no request-wide usage chunk came: with one, vLLM's
  ``continuous_usage_stats`` running totals are not summed), (c)
  the token-carrying events forwarded (one token at least each) and, for whole answers, (d) the sum over
  choices of a lower bound per choice: the forwarded bound for a choice that ended on ``length``
  (it generated exactly that many), else ``ceil(bytes / 6)`` of its text (at least 1 when it has text;
  :data:`~servelab.gateway.capabilities.BYTES_PER_TOKEN_MAX`).
- ``prompt_tokens`` = the largest of the request-wide ``usage`` and the sum over prompts of each prompt's
  per-choice ``usage`` (choice ``i`` answers prompt ``i // n``, the OpenAI order); for a request of more
  than one sequence also the gateway's prompt estimate (a lower bound over every prompt).

Pure bookkeeping, no I/O; nothing here raises on odd shapes (non-dict choices are skipped).
"""

from __future__ import annotations

from typing import Any

from servelab.gateway.capabilities import BYTES_PER_TOKEN_MAX

__all__ = ["ServedCount", "choice_lower_bound", "choices_per_prompt"]


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _text_of(ch: dict[str, Any]) -> str:
    """A choice's generated text (chat ``message.content`` + reasoning, or completions ``text``)."""
    msg = ch.get("message")
    parts: list[Any] = [ch.get("text")]
    if isinstance(msg, dict):
        parts += [msg.get("content"), msg.get("reasoning_content"), msg.get("reasoning")]
        calls = msg.get("tool_calls")
        if isinstance(calls, list):
            parts += [str(c) for c in calls]
    return "".join(p for p in parts if isinstance(p, str))


def choice_lower_bound(ch: Any, bound_tokens: int) -> int:
    """Tokens a whole answer's choice ``ch`` surely took: ``bound_tokens`` (the bound forwarded to the
    engine) when it ended on ``length``, else ``ceil(utf-8 bytes / 6)`` of its text (0 for no text)."""
    if not isinstance(ch, dict):
        return 0
    text = _text_of(ch)
    est = -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN_MAX)
    if ch.get("finish_reason") in ("length", "max_tokens") and bound_tokens > 0:
        return max(bound_tokens, est)
    return est


class ServedCount:
    """Per-request tally of usage as the engine reports it, per choice and request-wide.

    ``n_per_prompt``: choices per prompt (``n``/``n_cmpl``, >= 1); ``sequences``: all sequences of the
    request (``capabilities.output_sequences``). Feed it with :meth:`take` (every ``usage`` seen, with the
    chunk's choices) and :meth:`take_whole` (a whole answer); read :meth:`completion` /
    :meth:`prompt`, which return None until some usage was seen."""

    __slots__ = (
        "n_per_prompt",
        "sequences",
        "_agg_pt",
        "_agg_ct",
        "_choice_ct",
        "_choice_pt",
        "_whole_lb",
        "_final_chunk",
    )

    def __init__(self, n_per_prompt: int = 1, sequences: int = 1) -> None:
        self.n_per_prompt = max(1, n_per_prompt)
        self.sequences = max(1, sequences)
        self._agg_pt: int | None = None
        self._agg_ct: int | None = None
        self._choice_ct: dict[int, int] = {}
        self._choice_pt: dict[int, int] = {}
        self._whole_lb = 0
        #: a streamed request-wide usage chunk (``choices: []``) was seen: per-choice usage is then a
        #: running total of the request (vLLM ``continuous_usage_stats``), not a choice's own
        self._final_chunk = False

    def take(self, usage: dict[str, Any], choices: Any) -> None:
        """One ``usage`` object; ``choices`` = the same event's choices. With exactly one choice that has an
        integer ``index`` and several sequences asked for, it is that choice's own usage (llama-server);
        otherwise request-wide."""
        pt, ct = _int(usage.get("prompt_tokens")), _int(usage.get("completion_tokens"))
        if self.sequences > 1 and isinstance(choices, list) and len(choices) == 1 and isinstance(choices[0], dict):
            idx = _int(choices[0].get("index"))
            if idx is not None:
                if ct is not None:
                    self._choice_ct[idx] = ct
                if pt is not None:
                    self._choice_pt[idx] = pt
                return
        if isinstance(choices, list) and not choices:
            self._final_chunk = True
        if pt is not None:
            self._agg_pt = pt
        if ct is not None:
            self._agg_ct = ct

    def take_whole(self, answer: dict[str, Any], bound_tokens: int) -> None:
        """A whole (non-streamed) answer: its ``usage`` (request-wide) and the per-choice lower bounds
        (:func:`choice_lower_bound`; ``bound_tokens`` = the bound forwarded)."""
        usage = answer.get("usage")
        if isinstance(usage, dict):
            self.take(usage, None)
        choices = answer.get("choices")
        if isinstance(choices, list) and len(choices) > 1:
            self._whole_lb = sum(choice_lower_bound(ch, bound_tokens) for ch in choices)

    def completion(self, token_events: int = 0) -> int | None:
        """Completion tokens served (module doc), at least ``token_events``; None when no usage was seen."""
        if self._agg_ct is None and not self._choice_ct:
            return None
        per_choice = 0 if self._final_chunk else sum(self._choice_ct.values())
        return max(self._agg_ct or 0, per_choice, self._whole_lb, token_events)

    def prompt(self, prompt_est: int = 0) -> int | None:
        """Prompt tokens (module doc); ``prompt_est`` (the gateway's lower-bound estimate) counts when the
        request has several sequences. None when no usage was seen."""
        if self._agg_pt is None and not self._choice_pt:
            return None
        per_prompt: dict[int, int] = {}
        for idx, pt in self._choice_pt.items():
            g = idx // self.n_per_prompt
            per_prompt[g] = max(per_prompt.get(g, 0), pt)
        best = max(self._agg_pt or 0, 0 if self._final_chunk else sum(per_prompt.values()))
        return max(best, prompt_est) if self.sequences > 1 else best


def choices_per_prompt(endpoint: str, body: dict[str, Any], sequences: int) -> int:
    """Choices per prompt: ``sequences`` divided by the prompts of a ``/v1/completions`` prompt list
    (strings or token-id lists), else ``sequences``."""
    p = body.get("prompt") if endpoint == "completions" else None
    if isinstance(p, list) and p and not isinstance(p[0], int):
        return max(1, sequences // len(p))
    return max(1, sequences)
