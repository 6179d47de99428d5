"""The report's sections as data for its templates: the decision, the steps, cost and capacity, client
vs server figures, each a :class:`Table` or a small view the templates lay out; the §12 record rows are
in :mod:`servelab.trial.report.record_rows`.

Cell values are plain text (the templates escape them) or :class:`~markupsafe.Markup` for the few cells
that carry their own markup (a verdict badge, a link, a coloured yes/no).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from markupsafe import Markup

from servelab.bench.results import Interval, StepSummary
from servelab.trial.decide.table import verdict_table
from servelab.trial.embed_results import fact_text, ranking_basis
from servelab.trial.report.data import total_tps
from servelab.trial.report.fmt import ci_text, fmt, money, with_ci
from servelab.trial.results import CandidateResult, JsonObject, TrialRecord

VERDICT_COLOR = {"adopt": "#1a7f37", "backup": "#9a6700", "exclude": "#b42318"}

Cell = str | int | float | Markup | None


@dataclass(frozen=True)
class Table:
    """An HTML table: header texts, rows of cells, the columns right-aligned as numbers."""

    headers: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    num_cols: frozenset[int] = frozenset()


def table(headers: Sequence[str], rows: Iterable[Sequence[Cell]], num_cols: Iterable[int] = ()) -> Table:
    return Table(headers, list(rows), frozenset(num_cols))


def kv(d: JsonObject, label: str = "field", value: str = "value") -> Table:
    """A two-column table of a JSON object; nested values as compact JSON."""
    rows: list[tuple[str, Cell]] = []
    for k, v in d.items():
        if isinstance(v, (dict, list)):
            rows.append((k, Markup("<code>{}</code>").format(json.dumps(v, ensure_ascii=False, default=str))))
        else:
            rows.append((k, v))
    return table((label, value), rows)


def badge(v: str | None) -> Markup:
    """A verdict as a coloured badge."""
    v = v or "—"
    return Markup('<span class="verdict" style="background:{}">{}</span>').format(VERDICT_COLOR.get(v, "#57606a"), v)


def code(x: object) -> Markup:
    return Markup("<code>{}</code>").format(x)


# ------------------------------------------------------------------------------------------ decision


@dataclass(frozen=True)
class Card:
    """One candidate in the decision: its verdict, the figures it stands on, its reasons."""

    name: str
    badge: Markup
    facts: str
    reasons: list[str]


@dataclass(frozen=True)
class DecisionView:
    """What the decision template shows (templates/decision.html.j2)."""

    heading: str
    interrupted: tuple[str, str] | None
    ranking: list[str]
    basis: str
    verdicts: Table
    cards: list[Card]
    differences: list[str]
    significant: str
    tie_break: str | None
    comparability: str | None
    same_tokenizer: bool
    budget_note: str | None
    scope: str | None
    recheck_when: list[str]
    comparisons: Table | None
    historical: bool = False


def _facts(c: CandidateResult | None) -> str:
    facts = f"status: {c.status if c is not None else '—'}"
    if c is None:
        return facts
    eff = c.effective_throughput
    if c.embeddings is not None:
        facts += f"; {fact_text(c.embeddings)}"
    elif eff is not None:
        facts += (
            f"; effective {fmt(eff.output_tokens_per_s)} output tok/s "
            f"({ci_text(eff.output_tokens_per_s_ci)}; goodput {fmt(eff.goodput_output_tokens_per_s)}) "
            f"at {eff.at_step or ''}" + (f" on {eff.workload}" if eff.workload else "")
        )
    if c.broken_at:
        facts += f"; SLO broken at {c.broken_at}"
    return facts


def _verdict_rows(rec: TrialRecord) -> Table:
    """The short verdict table that leads the decision (:func:`servelab.trial.decide.table.verdict_table`)."""
    rows = verdict_table(rec.decision, rec.results.candidates)
    return table(
        ("candidate", "verdict", "ranked on", "95 % CI", "measured", "SLO"),
        ((r.candidate, badge(r.verdict), r.figure, r.interval, r.measured, r.slo) for r in rows),
        num_cols=(2,),
    )


def decision_view(rec: TrialRecord, names: list[str], heading: str = "h2") -> DecisionView:
    dec = rec.decision
    intr = rec.interrupted
    basis = ranking_basis(rec.goal.task_kind) or (  # an embeddings trial ranks on inputs/s (trial.embed_results)
        "what each engine sustained on the goal's mix run together, at the highest "
        "load step that met every SLO; a candidate is behind only when the difference's 95 % interval "
        "excludes 1, else the tie-break orders them"
    )
    cards = []
    for n in names:
        v = dec.verdict_of(n)
        c = rec.results.candidates.get(n)
        reasons = list(v.reasons) if v else []
        if not reasons and c is not None and c.reason:
            reasons = [c.reason]
        cards.append(Card(n, badge(v.verdict if v else None), _facts(c), reasons))
    comp = dec.comparability
    return DecisionView(
        heading=heading,
        interrupted=(intr.candidate or "", intr.note or "") if intr is not None else None,
        ranking=list(dec.ranking),
        basis=basis,
        verdicts=_verdict_rows(rec),
        cards=cards,
        differences=[d.text or "" for d in dec.differences],
        significant={True: "yes", False: "no: the ranking between them is by the tie-break"}[bool(dec.significant)],
        tie_break=dec.tie_break,
        comparability=comp.note if comp is not None and comp.note else None,
        same_tokenizer=comp.same_tokenizer if comp is not None else True,
        budget_note=dec.budget_note,
        scope=dec.scope,
        recheck_when=list(dec.recheck_when),
        comparisons=table(
            ("A", "B", "differs in", "note"),
            ((c.a, c.b, ", ".join(c.differs_in) or "—", c.note) for c in dec.comparisons),
        )
        if dec.comparisons
        else None,
        historical=bool(rec.historical),
    )


# ------------------------------------------------------------------------------------------ steps


def _slo_cell(met: bool | None, broken: list[str]) -> Cell:
    if met:
        return Markup('<span class="ok">yes</span>')
    if met is False:
        return Markup('<span class="bad">no: {}</span>').format(", ".join(broken) or "see SLO list")
    return "—"


def steps_table(cand: CandidateResult) -> Table | None:
    """Every load step of a candidate (skipped ones with their reason); ``None`` when none ran."""
    rows: list[tuple[Cell, ...]] = []
    for s in cand.steps:
        if s.skipped:
            rows.append(
                (
                    s.workload,
                    s.step,
                    Markup('<span class="muted">skipped: {}</span>').format(
                        s.skipped_reason or "an earlier step broke an SLO"
                    ),
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                )
            )
            continue
        c = s.counts
        tps, tci = total_tps(s)
        st = s.steady
        window = (
            f"ramp {fmt(st.ramp_s)} s, steady {fmt(st.steady_s)} s, drain {fmt(st.drain_s)} s"
            if st is not None and st.steady_s is not None
            else "—"
        )
        rows.append(
            (
                s.workload,
                s.step + ("" if s.repeat is None else f" r{s.repeat + 1}"),
                c.submitted,
                c.succeeded,
                c.failed_total,
                c.good,
                with_ci(s.ttft_s.p95, s.ttft_s.ci("p95")),
                with_ci(s.itl_s.p95, s.itl_s.ci("p95")),
                with_ci(s.e2e_s.p99, s.e2e_s.ci("p99")),
                with_ci(tps, tci),
                window,
                fmt(s.goodput.output_tokens_per_s),
                _slo_cell(s.slo_met, [o.objective for o in s.slo if o.met is False]),
            )
        )
    if not rows:
        return None
    return table(
        (
            "workload",
            "step",
            "submitted",
            "succeeded",
            "failed",
            "good",
            "TTFT p95 (s) [95 % CI]",
            "ITL p95 (s) [95 % CI]",
            "E2E p99 (s) [95 % CI]",
            "throughput (out tok/s) [95 % CI]",
            "window",
            "goodput (out tok/s)",
            "SLO met",
        ),
        rows,
        num_cols=range(2, 10),
    )


def arrival_table(arr: StepSummary) -> Table:
    """The arrival-rate run (stated rate, bursts and mix) as one row."""
    cnt = arr.counts
    return table(
        (
            "step",
            "submitted",
            "succeeded",
            "failed",
            "TTFT p95 (s)",
            "E2E p99 (s)",
            "throughput (out tok/s)",
            "goodput (out tok/s)",
            "SLO met",
        ),
        [
            (
                arr.step,
                cnt.submitted,
                cnt.succeeded,
                cnt.failed_total,
                with_ci(arr.ttft_s.p95, arr.ttft_s.ci("p95")),
                with_ci(arr.e2e_s.p99, arr.e2e_s.ci("p99")),
                fmt(arr.throughput.output_tokens_per_s),
                fmt(arr.goodput.output_tokens_per_s),
                {True: "yes", False: "no"}[arr.slo_met] if arr.slo_met is not None else "—",
            )
        ],
        num_cols=range(1, 8),
    )


# ------------------------------------------------------------------------------------------ cost


def _cost_range(ci: Interval | None) -> str:
    if ci is None or (ci.lo is None and ci.hi is None):
        return "—"
    lo = money(ci.lo) if ci.lo is not None else "unbounded"
    tail = " (search resolution, not a CI)" if ci.method == "bracket" else ""
    return f"{lo}–{money(ci.hi) if ci.hi is not None else 'unbounded'}{tail}"


def cost_table(rec: TrialRecord, names: list[str]) -> Table | None:
    """Cost per 10k / 1M output tokens, capacity at the SLO and replicas for the peak, with intervals;
    ``None`` when no candidate has any of them."""
    rows = []
    for n in names:
        c = rec.result(n)
        cost, cap, rep = c.cost, c.capacity, c.replicas
        if cost is None and cap is None and rep is None:
            continue
        capt = "—"
        if cap is not None:
            capt = (
                f"{cap.rate_rps:.3g} [{cap.rate_rps:.3g}, {cap.broke_at_rps:.3g})"
                if cap.rate_rps is not None and cap.broke_at_rps is not None
                else f"≥ {cap.rate_rps:.3g}"
                if cap.rate_rps is not None
                else (cap.note or "—")
            )
        rept = "—"
        if rep is not None and rep.replicas is not None:
            rept = f"{rep.replicas}" + (f" ({rep.lo}–{rep.hi})" if rep.lo is not None and rep.lo != rep.hi else "")
            rept += f" for {fmt(rep.peak_rps)} req/s at {rep.headroom:.0%} headroom"
        rows.append(
            (
                n,
                money(cost.price_per_hour) if cost else "—",
                fmt(cost.tokens_per_s) if cost else "—",
                cost.basis if cost else "—",
                money(cost.per_10k_output_tokens) if cost else "—",
                _cost_range(cost.per_10k_ci) if cost else "—",
                money(cost.per_1m_output_tokens) if cost else "—",
                _cost_range(cost.per_1m_ci) if cost else "—",
                capt,
                rept,
            )
        )
    if not rows:
        return None
    cur = rec.goal.budget.currency or "USD"
    return table(
        (
            "candidate",
            f"price ({cur}/h)",
            "out tok/s",
            "basis",
            "per 10k out tok",
            "95 % CI",
            "per 1M out tok",
            "95 % CI",
            "capacity at SLO (req/s) [held, broke): search resolution, not a CI",
            "replicas for the peak",
        ),
        rows,
        num_cols=(1, 2, 4, 6),
    )


# ------------------------------------------------------------------------------------------ client vs server

# server metric name fragments -> (client figure label, how to read it from a step summary)
_SERVER_MATCH: tuple[tuple[tuple[str, ...], str, Callable[[StepSummary], float | None]], ...] = (
    (("time_to_first_token", "ttft"), "client TTFT mean (s)", lambda s: s.ttft_s.mean),
    (
        ("predicted_tokens_seconds", "per_user", "tokens_per_second_per"),
        "client decode tok/s per request (mean)",
        lambda s: s.output_tps_per_user.mean,
    ),
    (
        ("generation_throughput", "generation_tokens_per", "output_tokens_per"),
        "client output tok/s",
        lambda s: s.throughput.output_tokens_per_s,
    ),
    (("e2e_request_latency", "request_latency"), "client E2E mean (s)", lambda s: s.e2e_s.mean),
    (("time_per_output_token", "inter_token"), "client TPOT mean (s)", lambda s: s.tpot_s.mean),
)


def _client_counterpart(metric: str, step: StepSummary) -> tuple[str, float | None]:
    m = metric.lower()
    for keys, label, get in _SERVER_MATCH:
        if any(k in m for k in keys):
            return label, get(step)
    return "server only (queue, running, KV use …)", None


@dataclass(frozen=True)
class ClientServer:
    """One candidate's engine /metrics figures beside the client's (``table`` ``None``: see ``note``)."""

    name: str
    kind: str
    table: Table | None
    note: str | None


def client_server(names: list[str], rec: TrialRecord) -> list[ClientServer]:
    out = []
    for n in names:
        c = rec.result(n)
        steps = c.ran_steps()
        engine = rec.ident(n).engine
        kind = engine.kind if engine is not None else "engine"
        if not steps:
            out.append(
                ClientServer(
                    n, kind, None, f"No load steps ran ({c.status or 'not run'}{': ' + c.reason if c.reason else ''})."
                )
            )
            continue
        rows = []
        for s in steps:
            for metric, v in sorted(s.server.items()):
                label, cv = _client_counterpart(metric, s)
                rows.append(
                    (
                        f"{s.workload}/{s.step}",
                        code(metric),
                        fmt(v.mean),
                        fmt(v.max),
                        label,
                        fmt(cv) if label[:6] == "client" else "",
                    )
                )
        if not rows:
            out.append(
                ClientServer(
                    n,
                    kind,
                    None,
                    "Server-side metrics: not offered by this engine (no /metrics "
                    "figures were recorded during the steps).",
                )
            )
            continue
        out.append(
            ClientServer(
                n,
                kind,
                table(
                    ("step", "engine /metrics name", "server mean", "server max", "client counterpart", "client value"),
                    rows,
                    num_cols=(2, 3, 5),
                ),
                None,
            )
        )
    return out
