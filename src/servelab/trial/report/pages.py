"""The report's two pages, assembled: the trial report and the side-by-side compare page.

Each page gathers its sections (:mod:`.sections`, :mod:`.record_rows`) and charts (:mod:`.figures`)
into one view and renders it with the Jinja templates in ``templates/`` (package data):
``report.html.j2`` or ``compare.html.j2`` for the body, inside ``page.html.j2``, which inlines the
stylesheet and plotly's JavaScript once so the file opens offline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from servelab.trial.report.capacity_model import ModelSection, model_fig, model_sections
from servelab.trial.report.data import dump, series, slo_limits, workloads
from servelab.trial.report.figures import (
    LATENCIES,
    PALETTE,
    Charts,
    capacity_fig,
    cold_fig,
    errors_fig,
    latency_fig,
    palette_for,
    pareto_fig,
    throughput_fig,
    ttft_cdf_fig,
)
from servelab.trial.report.fmt import pct, when
from servelab.trial.report.record_rows import (
    diff_table,
    environment_table,
    evidence_table,
    identity_table,
    method_table,
    quality_table,
    results_table,
    verdicts_table,
)
from servelab.trial.report.sections import (
    ClientServer,
    DecisionView,
    Table,
    arrival_table,
    badge,
    client_server,
    cost_table,
    decision_view,
    kv,
    steps_table,
)
from servelab.trial.report_server import server_panel_html
from servelab.trial.results import TrialRecord

TEMPLATES = Path(__file__).with_name("templates")


@cache
def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        finalize=lambda x: "" if x is None else x,
    )


def page(title: str, body: Markup) -> str:
    """A whole HTML page around ``body``: stylesheet and plotly's JavaScript inline, no external URL."""
    return _env().get_template("page.html.j2").render(title=title, body=body, plotly_js=Markup(get_plotlyjs())) + "\n"


@dataclass(frozen=True)
class CandidateSteps:
    """A candidate's part of the steps section."""

    name: str
    badge: Markup
    status: str
    reason: str | None
    steps: Table | None
    arrival: Table | None


@dataclass(frozen=True)
class ReportView:
    """Everything templates/report.html.j2 shows."""

    trial_id: str
    task: str
    slo: str
    created: str
    n_candidates: int
    decision: DecisionView
    has_series: bool
    pareto: Markup | None
    load_charts: list[Markup]
    cdf_notes: list[str]
    errors_chart: Markup | None
    no_steps: Sequence[tuple[str, str, str | None]]
    cold_chart: Markup | None
    cold_missing: list[str]
    cost: Table | None
    models: list[ModelSection]
    model_chart: Markup | None
    error_budget: str | None
    steps: list[CandidateSteps]
    client_server: list[ClientServer]
    server_panel: Markup
    goal: Table
    identity: Table
    environment: Table
    method: Table
    results: Table
    quality: Table | None
    evidence: Table
    reproduce: str | None
    run_dir: str | None
    verdicts: Table
    schema: str
    chart_count: int


def report_body(run: Path, rec: TrialRecord) -> Markup:
    """The trial report's ``<main>`` for the run folder ``run`` and its record."""
    names = rec.names()
    limits, err_limit, slo_names = slo_limits(rec)
    colors = palette_for(names)
    charts = Charts()
    ser = series(rec, lambda n: n, lambda i, n: colors[n])
    wls = list(dict.fromkeys(w for _, _, st in ser for w in workloads(st)))
    load: list[Markup] = []
    pareto_html: Markup | None = None
    notes: list[str] = []
    errors_html: Markup | None = None
    model_chart: Markup | None = None
    if ser:
        pfig = pareto_fig(rec, names, colors, limits)
        if pfig is not None:
            pareto_html = charts.html(pfig, height=440)
        for key, metric, title in LATENCIES:
            load.append(charts.html(latency_fig(ser, key, metric, title, limits, wls)))
        load.append(charts.html(throughput_fig(ser, wls)))
        capfig = capacity_fig(rec, names, colors)
        if capfig is not None:
            load.append(charts.html(capfig, height=380))
        mfig = model_fig(rec, names, colors)
        if mfig is not None:
            model_chart = charts.html(mfig, height=560)
        cdf, notes = ttft_cdf_fig(run, rec, names, limits)
        if cdf is not None:
            load.append(charts.html(cdf, height=400))
        ef = errors_fig(names, rec)
        if ef is not None:
            errors_html = charts.html(ef, height=400)
    no_steps = [
        (n, rec.result(n).status if n in rec.results.candidates else "not run", rec.result(n).reason)
        for n in names
        if not rec.result(n).ran_steps()
    ]
    cold, missing = cold_fig(names, rec)
    cold_html = charts.html(cold, height=360) if cold is not None else None
    steps = []
    for n in names:
        c = rec.result(n)
        v = rec.decision.verdict_of(n)
        arr = c.arrival_run
        steps.append(
            CandidateSteps(
                n,
                badge(v.verdict if v else None),
                c.status,
                c.reason,
                steps_table(c),
                arrival_table(arr) if arr is not None and not arr.skipped else None,
            )
        )
    version = (
        str(rec.schema_version)
        if rec.read_version == rec.schema_version
        else f"{rec.read_version}, read as {rec.schema_version}"
    )
    view = ReportView(
        trial_id=rec.trial_id or run.name,
        task=rec.goal.task or "—",
        slo=", ".join(slo_names) or "none",
        created=when(rec.created_unix_s),
        n_candidates=len(names),
        decision=decision_view(rec, names),
        has_series=bool(ser),
        pareto=pareto_html,
        load_charts=load,
        cdf_notes=notes,
        errors_chart=errors_html,
        no_steps=no_steps,
        cold_chart=cold_html,
        cold_missing=missing,
        cost=cost_table(rec, names),
        models=model_sections(rec, names),
        model_chart=model_chart,
        error_budget=pct(err_limit) if err_limit is not None else None,
        steps=steps,
        client_server=client_server(names, rec),
        server_panel=Markup(server_panel_html(rec, names)),
        goal=kv(dump(rec.goal)),
        identity=identity_table(names, rec),
        environment=environment_table(rec),
        method=method_table(rec),
        results=results_table(rec),
        quality=quality_table(rec),
        evidence=evidence_table(run, rec),
        reproduce=rec.evidence.reproduce,
        run_dir=rec.evidence.run_dir,
        verdicts=verdicts_table(rec, names),
        schema=version,
        chart_count=charts.count,
    )
    return Markup(_env().get_template("report.html.j2").render(p=view))


@dataclass(frozen=True)
class CompareView:
    """Everything templates/compare.html.j2 shows."""

    id_a: str
    id_b: str
    dir_a: str
    dir_b: str
    slo_a: str
    slo_b: str
    decision_a: DecisionView
    decision_b: DecisionView
    charts: list[Markup]
    results_a: Table
    results_b: Table
    diff: Table | None
    chart_count: int


def compare_body(ra: Path, a: TrialRecord, rb: Path, b: TrialRecord) -> Markup:
    """The compare page's ``<main>``: trial A (``a`` read from ``ra``) beside trial B."""
    charts = Charts()
    la, _, sa = slo_limits(a)
    lb, _, sb = slo_limits(b)
    limits = dict(la)
    limits.update({k: v for k, v in lb.items() if k not in limits})
    offset = len(a.names())
    ser = series(a, lambda n: f"A:{n}", lambda i, n: PALETTE[i % len(PALETTE)]) + series(
        b, lambda n: f"B:{n}", lambda i, n: PALETTE[(offset + i) % len(PALETTE)]
    )
    wls = list(dict.fromkeys(w for _, _, st in ser for w in workloads(st)))
    figs: list[Markup] = []
    if ser:
        figs = [
            charts.html(latency_fig(ser, "ttft_s", "ttft", "TTFT", limits, wls, pcts=(("p95", "solid"),))),
            charts.html(latency_fig(ser, "itl_s", "itl", "ITL (per token)", limits, wls, pcts=(("p95", "solid"),))),
            charts.html(latency_fig(ser, "e2e_s", "e2e", "E2E", limits, wls, pcts=(("p99", "dash"),))),
            charts.html(throughput_fig(ser, wls)),
        ]
    view = CompareView(
        id_a=a.trial_id or ra.name,
        id_b=b.trial_id or rb.name,
        dir_a=str(ra),
        dir_b=str(rb),
        slo_a=", ".join(sa) or "none",
        slo_b=", ".join(sb) or "none",
        decision_a=decision_view(a, a.names(), "h3"),
        decision_b=decision_view(b, b.names(), "h3"),
        charts=figs,
        results_a=results_table(a),
        results_b=results_table(b),
        diff=diff_table(a, b),
        chart_count=charts.count,
    )
    return Markup(_env().get_template("compare.html.j2").render(p=view))
