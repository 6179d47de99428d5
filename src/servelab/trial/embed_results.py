"""``results.candidates[name].embeddings`` of an embeddings trial (``goal.task_kind: embeddings``;
:mod:`servelab.trial.flows.embeddings`): the figure the candidates are ranked on, with its unit stated
(seed 000 §10.2: vector throughput with the input length and the unit).

This module imports only the bench's result models (:mod:`servelab.trial.results` imports it).
"""

from __future__ import annotations

from pydantic import Field

from servelab.bench.results import Interval, ResultModel

__all__ = ["EmbeddingsFigures", "fact_text", "ranking_basis"]


class EmbeddingsFigures(ResultModel):
    """What one embeddings candidate sustained at its effective level (the highest load step whose every
    repeat met the SLO and the error budget).

    ``at_step``: that level (``c4``); ``batch_size``: inputs per request; ``inputs_per_s``: vectors per
    second, mean over the repeats of that level (``per_repeat``: one figure per repeat round, each over
    its step window, first send to last end), ``inputs_per_s_ci``: Student-t interval over the repeats
    (``None`` below 2 repeats); ``tokens_per_s``: the server's ``usage.prompt_tokens`` per second (its
    special tokens included), mean over the repeats; ``requests_per_s``: requests per second;
    ``input_tokens``: the per-input length distribution (``min``/``mean``/``p50``/``p90``/``max``, tokens
    of ``tokenizer``); ``server_tokens_per_input``; ``dimensions``: vector length served; ``e2e_p95_s``:
    the worst repeat's request-latency P95 at that level, seconds, with ``latency_n`` requests;
    ``unit``: the sentence stating the unit and the input length; ``not_applicable``: the chat figures
    this trial does not have and why.
    """

    at_step: str | None = None
    batch_size: int = 1
    inputs_per_s: float | None = None
    inputs_per_s_ci: Interval | None = None
    per_repeat: list[float] = Field(default_factory=list)
    tokens_per_s: float | None = None
    requests_per_s: float | None = None
    input_tokens: dict[str, float] = Field(default_factory=dict)
    server_tokens_per_input: float | None = None
    tokenizer: str | None = None
    dimensions: int | None = None
    e2e_p95_s: float | None = None
    latency_n: int = 0
    unit: str = ""
    not_applicable: list[str] = Field(default_factory=list)


def ranking_basis(task_kind: str) -> str | None:
    """The report's sentence on what an embeddings trial ranks on (``None`` for a chat trial)."""
    if task_kind != "embeddings":
        return None
    return (
        "inputs/s (embedding vectors per second) each server sustained at the highest load step that met "
        "every SLO, mean over repeats; a candidate is behind only when the 95 % interval of the ratio "
        "excludes 1, else the tie-break orders them"
    )


def fact_text(f: EmbeddingsFigures) -> str:
    """One line of a candidate's embeddings figure with its unit and input length, for the report:
    ``effective 12.3 inputs/s (95 % CI 0–25.0), 852 tokens/s at c2; 4 input(s) per request, input
    length 68 tokens mean (32-94)``."""
    if f.inputs_per_s is None:
        return "no inputs/s figure (no load level met the SLO)"
    ci = f.inputs_per_s_ci
    ci_text = (
        f" (95 % CI {ci.lo:.1f}–{ci.hi:.1f})" if ci is not None and ci.lo is not None and ci.hi is not None else ""
    )
    it = f.input_tokens
    length = (
        f"input length {it['mean']:.0f} tokens mean ({it['min']:.0f}-{it['max']:.0f}) in "
        f"{f.tokenizer or 'approximate words'}"
        if it
        else "input length unknown"
    )
    return (
        f"effective {f.inputs_per_s:.1f} inputs/s{ci_text}, {f.tokens_per_s or 0:.0f} tokens/s at {f.at_step}; "
        f"{f.batch_size} input(s) per request, {length}; {f.dimensions} dimensions"
    )
