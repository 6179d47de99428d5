"""The trial's decision rule (000 §10.3, §12): rank the candidates, give each a verdict with its reasons.

:func:`decide` turns every candidate's ``results.candidates[name]`` entry (status + the figures of
:func:`servelab.trial.decide.effective.effective_step`) and its identity into the record's ``decision``
(docs/record-schema.md): ranking with the difference to the next candidate and its interval (or "no
significant difference" and the tie-break), verdicts with reasons, pairwise identity comparisons,
token comparability, scope of validity and the conditions for re-checking. Pure: no I/O.

**Ranking**: by the ranked figure, output tok/s (completed requests/s when the candidates' tokenizers
differ: their token counts are not the same unit, 000 §10.2). A candidate is ranked after the one
before it only when their ratio's 95 % interval excludes 1
(:func:`servelab.trial.decide.compare.difference`); otherwise they are "no significant difference"
and ordered by the tie-break :data:`TIE_BREAK`.
"""

from __future__ import annotations

from collections.abc import Mapping

from servelab.trial.decide.compare import difference, figure, figure_name, tail
from servelab.trial.decide.effective import arrival_broken
from servelab.trial.decide.fmt import fmt_ci, fmt_tps, num
from servelab.trial.decide.identities import comparability, compare_identities
from servelab.trial.decide.wording import (
    at_text,
    beyond,
    budget_note,
    exclude_reason,
    extras,
    scope_text,
    tie_break_text,
)
from servelab.trial.results import (
    CandidateIdentity,
    CandidateResult,
    Decision,
    EffectiveThroughput,
    EnvironmentRow,
    GoalRow,
    MethodRow,
    Verdict,
)

TIE_BREAK = "lower TTFT P95 at the effective level, then lower E2E P99, then higher throughput, then name"
"""How candidates with no significant difference in the ranked figure are ordered."""


def decide(
    candidates: Mapping[str, CandidateResult],
    identities: Mapping[str, CandidateIdentity],
    *,
    goal: GoalRow | None = None,
    environment: EnvironmentRow | None = None,
    method: MethodRow | None = None,
) -> Decision:
    """The record's :class:`~servelab.trial.results.Decision` from ``results.candidates`` and
    ``identity.candidates``.

    Only candidates with ``status == "ranked"``, a level that met the SLO and a ranked figure are
    ranked (module doc): by output tok/s of the ranked workload (requests/s when tokenizers differ,
    :func:`comparability`), a candidate joining the group of the one above it when their ratio is not
    significant (:func:`difference`); a group is ordered by :data:`TIE_BREAK`. The first is ``adopt``,
    other ranked ones ``backup``, the rest ``exclude`` with the reason. ``differences`` holds each
    ranked candidate against the next; ``significant`` whether the adopted one is significantly ahead
    of the second. ``goal``/``environment``/``method`` (the record's rows) feed ``scope`` and
    ``recheck_when``, and ``method`` the ``budget_note`` (:func:`budget_note`).
    """
    names_all = list(dict.fromkeys([*candidates, *identities]))
    comp = comparability([n for n, c in candidates.items() if c.status == "ranked"], identities)
    metric = "output_tokens_per_s" if comp.same_tokenizer else "requests_per_s"
    eligible = [
        n
        for n, c in candidates.items()
        if c.status == "ranked"
        and c.max_step_meeting_slo is not None
        and figure(c, metric) is not None
        and not arrival_broken(c)
    ]
    by_fig = sorted(eligible, key=lambda n: (-(figure(candidates[n], metric) or 0.0), n))
    by_fig_all = [
        n
        for n, c in candidates.items()  # every candidate with a ranked figure, eligible or not
        if c.status == "ranked" and figure(c, metric) is not None
    ]
    groups: list[list[str]] = []
    for n in by_fig:
        if groups and not difference(groups[-1][0], candidates[groups[-1][0]], n, candidates[n], metric).significant:
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking: list[str] = []
    for g in groups:
        ranking.extend(
            sorted(
                g,
                key=lambda n: (
                    tail(candidates[n], "ttft_p95_s"),
                    tail(candidates[n], "e2e_p99_s"),
                    -(figure(candidates[n], metric) or 0.0),
                    n,
                ),
            )
        )
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    diffs = [difference(a, candidates[a], b, candidates[b], metric) for a, b in zip(ranking, ranking[1:], strict=False)]
    currency = (goal.budget.currency if goal is not None else None) or "USD"

    verdicts: dict[str, Verdict] = {}
    best = ranking[0] if ranking else None
    for pos, n in enumerate(ranking):
        c = candidates[n]
        reasons: list[str] = []
        if pos == 0:
            top = (figure(c, metric) or 0.0) >= max((figure(candidates[m], metric) or 0.0) for m in ranking)
            head = (
                (
                    f"highest {figure_name(metric)} at the SLO"
                    if top
                    else f"first at the SLO by the tie-break, its "
                    f"{figure_name(metric)} not significantly below the highest"
                )
                if len(ranking) > 1
                else "the only candidate that met the SLO"
            )
            reasons.append(f"{head}: {at_text(c, metric)}")
            if diffs:
                d = diffs[0]
                if d.significant:
                    reasons.append(f"significantly better than {d.b}: {d.text}")
                else:
                    reasons.append(
                        f"{d.text}; ranked first by the tie-break ({TIE_BREAK}): {tie_break_text(c, candidates[d.b])}"
                    )
            # the others were excluded (e.g. at the expected rate): say how far ahead it is of each that has the
            # ranked figure too, significant or not, so "the winner" is never a bare claim
            for other in by_fig_all:
                if other != n and other not in eligible:
                    d = difference(n, c, other, candidates[other], metric)
                    reasons.append(
                        f"against {other} (excluded): "
                        + (f"significantly better: {d.text}" if d.significant else d.text)
                    )
        else:
            prev = ranking[pos - 1]
            d = diffs[pos - 1]
            rel = (
                d.text
                if d.significant
                else (
                    f"{d.text}; ranked after {prev} by the tie-break: {tie_break_text(candidates[prev], c)}"
                    if group_of[n] == group_of[prev]
                    else d.text
                )
            )
            reasons.append(f"ranked {pos + 1} of {len(ranking)}: {at_text(c, metric)}; {rel}")
        eff = c.effective_throughput or EffectiveThroughput()
        bits = []
        if eff.goodput_output_tokens_per_s is not None:
            bits.append(
                f"goodput {fmt_tps(eff.goodput_output_tokens_per_s)}"
                f"{fmt_ci(eff.goodput_output_tokens_per_s_ci, ' tok/s')} at "
                f"{eff.at_step or c.max_step_meeting_slo}"
            )
        if c.error_rate is not None:
            bits.append(f"error rate {num(c.error_rate * 100)}% over all load steps")
        if bits:
            reasons.append("; ".join(bits))
        for w, cap in c.per_workload.items():
            reasons.append(
                f"{w} alone (reported apart, not added): up to {cap.max_step_meeting_slo or 'no level'}"
                + (
                    f", {fmt_tps(cap.output_tokens_per_s)}{fmt_ci(cap.output_tokens_per_s_ci)}"
                    if cap.output_tokens_per_s is not None
                    else ""
                )
                + (f", broke at {cap.broken_at}" if cap.broken_at else "")
            )
        reasons.extend(extras(c, currency))
        reasons.append(beyond(c))
        verdicts[n] = Verdict(verdict="adopt" if pos == 0 else "backup", reasons=reasons)
    for n, c in candidates.items():
        if n not in verdicts:
            verdicts[n] = Verdict(verdict="exclude", reasons=[exclude_reason(c), *extras(c, currency)])

    comparisons = [
        compare_identities(identities.get(a), identities.get(b), a, b)
        for i, a in enumerate(names_all)
        for b in names_all[i + 1 :]
    ]
    scope, recheck = scope_text(
        {n: identities.get(n) or CandidateIdentity() for n in names_all}, goal, environment, method
    )
    if best is not None:
        at = candidates[best].max_step_meeting_slo
        recheck.append(f"the load needed exceeds {at}, the highest step at which {best} met the SLO")
    return Decision(
        ranking=ranking,
        adopt=best,
        verdicts={n: verdicts[n] for n in candidates},
        comparisons=comparisons,
        scope=scope,
        recheck_when=recheck,
        differences=diffs,
        significant=diffs[0].significant if diffs else None,
        tie_break=TIE_BREAK,
        comparability=comp,
        budget_note=budget_note(method),
    )
