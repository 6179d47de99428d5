"""The embeddings ranking: each candidate's inputs/s at its effective level averaged over the repeats
with a Student-t interval, candidates grouped while the Welch interval of the log ratio of their
per-repeat inputs/s includes 1, a group ordered by the lower worst-repeat e2e P95."""

from __future__ import annotations

import math

from servelab.bench.analysis.intervals import mean_interval, ratio_interval
from servelab.bench.results import Interval
from servelab.trial.embed_results import EmbeddingsFigures
from servelab.trial.results import CandidateResult, Decision, Difference, Verdict

__all__ = ["NOT_APPLICABLE", "TIE_BREAK", "embeddings_decision", "figures"]

#: chat figures an embeddings trial does not have, and why (recorded per candidate)
NOT_APPLICABLE = (
    "TTFT, ITL, TPOT and output tokens/s: an embeddings response streams no tokens",
    "steady windows and goodput in tokens: the ranked figure is inputs/s over each step window",
    "arrival test and capacity search: they run the chat mix",
    "served-behaviour checks (chat template, context) and lifecycle (restart under load, cancellation): chat only",
    "warmup: the gate's request is the only request before the first step (the bench's embeddings steps have none)",
    "cost and replicas for the peak: computed from output tokens and the capacity search in a chat trial; not here",
    "trial budget: checked before each candidate and repeat, not before each load step",
)
TIE_BREAK = "lower worst-repeat e2e P95 at the effective level, then name"


def figures(result: CandidateResult, tokenizer: str | None) -> EmbeddingsFigures:
    """:class:`EmbeddingsFigures` of a candidate whose ``max_step_meeting_slo`` is set (``effective_step``
    applied): its effective level's repeats averaged, with the unit sentence."""
    f = (result.embeddings or EmbeddingsFigures()).model_copy()
    f.at_step = result.max_step_meeting_slo
    group = [s.embeddings for s in result.steps if s.step == f.at_step and not s.skipped and s.embeddings is not None]
    vals = [e.inputs_per_s for e in group if e.inputs_per_s]
    if not group or not vals:
        f.unit = "no load level met the SLO and the error budget: no inputs/s figure"
        return f
    f.per_repeat = vals
    f.inputs_per_s = sum(vals) / len(vals)
    b = mean_interval(vals, method="t-repeats")
    f.inputs_per_s_ci = (
        Interval(lo=max(b.lo, 0.0), hi=b.hi, level=b.level, n=b.n, method=b.method)  # a rate >= 0
        if b.lo is not None
        else None
    )
    toks = [e.tokens_per_s for e in group if e.tokens_per_s]
    f.tokens_per_s = sum(toks) / len(toks) if toks else None
    windows = [e.requests / e.window_s for e in group if e.window_s]
    f.requests_per_s = sum(windows) / len(windows) if windows else None
    f.input_tokens = dict(group[0].input_tokens)
    f.server_tokens_per_input = group[0].server_tokens_per_input
    f.tokenizer = group[0].tokenizer or tokenizer
    f.dimensions = group[0].dimensions or f.dimensions
    p95 = [(e.latency.p95_s, e.latency.n) for e in group if e.latency.p95_s is not None]
    if p95:
        f.e2e_p95_s, f.latency_n = max(p95)
    it = f.input_tokens
    f.unit = (
        f"inputs/s = embedding vectors returned per second over each step window (first send to last end), "
        f"{f.batch_size} input(s) per /v1/embeddings request; input length {it.get('mean', float('nan')):.0f} "
        f"tokens mean ({it.get('min', float('nan')):.0f}-{it.get('max', float('nan')):.0f}, p90 "
        f"{it.get('p90', float('nan')):.0f}) in {f.tokenizer or 'an approximate word count'}; tokens/s = the "
        f"server's usage.prompt_tokens per second (its special tokens included); {f.dimensions} dimensions"
    )
    return f


def _fig_text(f: EmbeddingsFigures) -> str:
    ci = f.inputs_per_s_ci
    ci_text = (
        f" (95 % CI {ci.lo:.1f}–{ci.hi:.1f}, {ci.n} repeats)"
        if ci is not None and ci.lo is not None and ci.hi is not None
        else f" ({len(f.per_repeat)} repeat(s): no interval)"
    )
    return (
        f"{f.inputs_per_s or 0:.1f} inputs/s{ci_text}, {f.tokens_per_s or 0:.0f} tokens/s at {f.at_step}, "
        f"e2e p95 {(f.e2e_p95_s or 0) * 1000:.0f} ms (n {f.latency_n}); {f.unit}"
    )


def _difference(a: str, fa: EmbeddingsFigures, b: str, fb: EmbeddingsFigures) -> Difference:
    r = ratio_interval(fa.per_repeat, fb.per_repeat)
    if r is None:
        ratio = (fa.inputs_per_s / fb.inputs_per_s) if fa.inputs_per_s and fb.inputs_per_s else None
        return Difference(
            a=a,
            b=b,
            metric="inputs_per_s",
            ratio=ratio,
            significant=False,
            text=f"no significant difference shown between {a} and {b}: too few repeats for an "
            f"interval (inputs/s ratio {ratio or float('nan'):.2f}×)",
        )
    ci = Interval(lo=r.lo, hi=r.hi, level=r.level, n=len(fa.per_repeat) + len(fb.per_repeat), method="welch-log")
    if r.significant:
        text = f"{a} sustains {r.ratio:.2f}× {b}'s inputs/s (95 % CI {r.lo:.2f}–{r.hi:.2f}×)"
    else:
        text = (
            f"no significant difference between {a} and {b} in inputs/s: ratio {r.ratio:.2f}× "
            f"(95 % CI {r.lo:.2f}–{r.hi:.2f}×, includes 1)"
        )
    return Difference(a=a, b=b, metric="inputs_per_s", ratio=r.ratio, ci=ci, significant=r.significant, text=text)


def embeddings_decision(base: Decision, results: dict[str, CandidateResult]) -> Decision:
    """``base`` (the chat decision of :func:`servelab.trial.decide.decide`, kept for its scope, identity
    comparisons and exclusion reasons) re-ranked on inputs/s at the SLO (module doc)."""
    figs = {
        n: r.embeddings
        for n, r in results.items()
        if r.status == "ranked" and r.embeddings is not None and r.embeddings.inputs_per_s
    }
    order = sorted(figs, key=lambda n: (-(figs[n].inputs_per_s or 0.0), n))
    groups: list[list[str]] = []
    for n in order:
        if groups and not _difference(groups[-1][0], figs[groups[-1][0]], n, figs[n]).significant:
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking = [n for g in groups for n in sorted(g, key=lambda n: (figs[n].e2e_p95_s or math.inf, n))]
    diffs = [_difference(a, figs[a], b, figs[b]) for a, b in zip(ranking, ranking[1:], strict=False)]
    verdicts: dict[str, Verdict] = {}
    for pos, n in enumerate(ranking):
        top = max((figs[m].inputs_per_s or 0.0) for m in ranking) == (figs[n].inputs_per_s or 0.0)
        head = (
            (
                (
                    "highest inputs/s at the SLO"
                    if top
                    else "first at the SLO by the tie-break, its inputs/s not significantly below the highest"
                )
                if len(ranking) > 1
                else "the only candidate that met the SLO"
            )
            if pos == 0
            else f"ranked {pos + 1} of {len(ranking)}"
        )
        reasons = [f"{head}: {_fig_text(figs[n])}"]
        if pos == 0 and diffs:
            reasons.append(
                diffs[0].text
                if diffs[0].significant
                else f"{diffs[0].text}; ranked first by the tie-break ({TIE_BREAK})"
            )
        elif pos > 0:
            reasons.append(diffs[pos - 1].text)
        reasons.append("not applicable to embeddings: " + "; ".join(NOT_APPLICABLE[:2]))
        verdicts[n] = Verdict(verdict="adopt" if pos == 0 else "backup", reasons=reasons)
    for n, r in results.items():
        if n in verdicts:
            continue
        old = base.verdicts.get(n)
        if old is not None and old.verdict == "exclude":
            verdicts[n] = old
        else:
            verdicts[n] = Verdict(
                verdict="exclude",
                reasons=[r.reason or "no load level met the SLO and the error budget: no inputs/s figure"],
            )
    scope = (
        "Embeddings trial (goal.task_kind: embeddings): candidates ranked on inputs/s (vectors/s) at the "
        "highest load step meeting the SLO, mean over repeats, Welch interval on the log ratio; " + (base.scope or "")
    )
    return base.model_copy(
        update={
            "ranking": ranking,
            "adopt": ranking[0] if ranking else None,
            "verdicts": verdicts,
            "differences": diffs,
            "significant": diffs[0].significant if diffs else None,
            "tie_break": TIE_BREAK,
            "scope": scope,
            "recheck_when": [
                *base.recheck_when,
                "the input lengths or the batch size of the real traffic differ from the ones stated in the unit",
            ],
        }
    )
