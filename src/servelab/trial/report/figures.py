"""The report's charts: plotly figures built from the record and the per-request files.

Latency percentiles and throughput against load (one subplot per workload, the SLO limits drawn),
the Pareto view of per-user against total output tok/s, the capacity search's probes, the TTFT CDF per
step, requests by outcome and the cold start. Each builder returns a figure, or ``None`` when the
record holds nothing to draw; :class:`Charts` turns a figure into the page's ``<div>`` (plotly's
JavaScript is embedded once per page by the page template).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from markupsafe import Markup
from plotly.subplots import make_subplots

from servelab.bench.results import StepSummary
from servelab.trial.report.data import Series, axis_title, pareto_steps, read_jsonl, safe_rel, step_x, total_tps
from servelab.trial.report.fmt import ci_text, esc, finite, fmt
from servelab.trial.results import TrialRecord

FAIL_CLASSES = ("connect", "http_status", "stream_error", "cut_off", "protocol", "timeout", "cancelled")
PCTS = (("p50", "dot"), ("p95", "solid"), ("p99", "dash"))
LATENCIES = (("ttft_s", "ttft", "TTFT"), ("itl_s", "itl", "ITL (per token)"), ("e2e_s", "e2e", "E2E"))
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}


class Charts:
    """Collects figures; each becomes a ``<div class="chart">`` (plotly JS is embedded once per page)."""

    def __init__(self) -> None:
        self.count = 0

    def html(self, fig: go.Figure, height: int = 380) -> Markup:
        """``fig`` as a chart ``<div>`` with the report's layout, numbered in page order."""
        self.count += 1
        fig.update_layout(
            template="plotly_white",
            height=height,
            margin={"l": 60, "r": 20, "t": 60, "b": 50},
            font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Arial, sans-serif", "size": 12},
            legend={"orientation": "h", "yanchor": "bottom", "y": -0.35, "x": 0},
        )
        div = fig.to_html(
            full_html=False,
            include_plotlyjs=False,
            config=PLOTLY_CONFIG,
            div_id=f"chart-{self.count}",
            default_height=f"{height}px",
            default_width="100%",
        )
        return Markup(f'<div class="chart">{div}</div>')


def palette_for(names: list[str]) -> dict[str, str]:
    """One colour per candidate, in order."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def latency_fig(
    series: Series,
    key: str,
    metric: str,
    title: str,
    limits: dict[tuple[str, str], float],
    workloads: list[str],
    pcts: tuple[tuple[str, str], ...] = PCTS,
) -> go.Figure:
    """Subplot per workload; one line per (label, percentile). ``series`` = [(label, color, steps)]."""
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), subplot_titles=workloads or [""], shared_yaxes=True)
    all_steps: list[StepSummary] = []
    for label, color, steps in series:
        all_steps += steps
        for ci, wl in enumerate(workloads, start=1):
            pts = sorted(
                ((x, s) for s in steps if s.workload == wl and (x := step_x(s)) is not None), key=lambda t: t[0]
            )
            for p, dash in pcts:
                ys = [finite(getattr(s.dist(key), p)) for _, s in pts]
                if not any(y is not None for y in ys):
                    continue
                cis = [s.dist(key).ci(p) for _, s in pts]
                fig.add_trace(
                    go.Scatter(
                        x=[x for x, _ in pts],
                        y=ys,
                        mode="lines+markers",
                        name=f"{label} {p}",
                        legendgroup=f"{label} {p}",
                        showlegend=ci == 1,
                        error_y=error_bars(ys, cis),
                        line={"color": color, "dash": dash},
                        text=[
                            f"{s.step}{'' if s.repeat is None else f' r{s.repeat + 1}'} ({ci_text(c, ' s')})"
                            for (_, s), c in zip(pts, cis, strict=True)
                        ],
                        hovertemplate=f"{esc(label)} {p}<br>%{{text}}: %{{y:.3f}} s<extra>{esc(wl)}</extra>",
                    ),
                    row=1,
                    col=ci,
                )
    for (m, stat), lim in limits.items():
        if m == metric:
            for ci in range(1, max(len(workloads), 1) + 1):
                fig.add_hline(
                    y=lim,
                    line={"color": "#b42318", "dash": "dashdot", "width": 1.5},
                    row=1,
                    col=ci,
                    annotation_text=f"SLO {m}_{stat} ≤ {lim:g} s",
                    annotation_position="top left",
                    annotation_font={"color": "#b42318", "size": 11},
                )
    fig.update_layout(title=f"{title} percentiles vs load (s)")
    fig.update_xaxes(title_text=axis_title(all_steps), type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text=f"{title} (s)", rangemode="tozero", col=1)
    return fig


def throughput_fig(series: Series, workloads: list[str]) -> go.Figure:
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), subplot_titles=workloads or [""], shared_yaxes=True)
    all_steps: list[StepSummary] = []
    for label, color, steps in series:
        all_steps += steps
        for ci, wl in enumerate(workloads, start=1):
            pts = sorted(
                ((x, s) for s in steps if s.workload == wl and (x := step_x(s)) is not None), key=lambda t: t[0]
            )
            for what, dash in (("throughput", "solid"), ("goodput", "dot")):
                ys = [finite((s.throughput if what == "throughput" else s.goodput).output_tokens_per_s) for _, s in pts]
                if not any(y is not None for y in ys):
                    continue
                if what == "throughput":  # the steady window's figure and its interval, where the trial added one
                    ys = [total_tps(s)[0] for _, s in pts]
                cis = [total_tps(s)[1] if what == "throughput" else None for _, s in pts]
                fig.add_trace(
                    go.Scatter(
                        x=[x for x, _ in pts],
                        y=ys,
                        mode="lines+markers",
                        name=f"{label} {what}",
                        error_y=error_bars(ys, cis),
                        legendgroup=f"{label} {what}",
                        showlegend=ci == 1,
                        line={"color": color, "dash": dash},
                        text=[s.step for _, s in pts],
                        hovertemplate=f"{esc(label)} {what}<br>%{{text}}: %{{y:.1f}} tok/s<extra>{esc(wl)}</extra>",
                    ),
                    row=1,
                    col=ci,
                )
    fig.update_layout(title="Output throughput and goodput vs load (tokens/s)")
    fig.update_xaxes(title_text=axis_title(all_steps), type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", col=1)
    return fig


def error_bars(ys: list[float | None], cis: list[Any]) -> dict[str, Any] | None:
    """Plotly asymmetric error bars from intervals (``lo``/``hi``; an unbounded side draws no bar)."""
    up: list[float | None] = []
    down: list[float | None] = []
    any_ci = False
    for y, ci in zip(ys, cis, strict=True):
        if y is None or ci is None:
            up.append(None)
            down.append(None)
            continue
        any_ci = True
        up.append(None if ci.hi is None else max(ci.hi - y, 0.0))
        down.append(None if ci.lo is None else max(y - ci.lo, 0.0))
    if not any_ci:
        return None
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down, "thickness": 1, "width": 3}


def frontier(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (higher total and higher per-user both better), by total."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(pts, key=lambda p: (-p[0], -p[1])):
        if not out or y > out[-1][1]:
            out.append((x, y))
    return sorted(out)


def pareto_fig(
    rec: TrialRecord, names: list[str], colors: dict[str, str], limits: dict[tuple[str, str], float]
) -> go.Figure | None:
    """Output tok/s per user (median, P50 of ``output_tps_per_user``) against total output tok/s, one
    point per step and repeat, per candidate; error bars are the 95 % intervals; the frontier of each
    candidate is drawn; the per-user speed the ITL/TPOT limit implies is shaded as the SLO region."""
    fig = go.Figure()
    drawn = False
    for n in names:
        steps = pareto_steps(rec.result(n))
        xs, ys, xci, yci, text = [], [], [], [], []
        for s in steps:
            x, ci = total_tps(s)
            d = s.output_tps_per_user
            y = finite(d.p50)
            if x is None or y is None:
                continue
            xs.append(x)
            ys.append(y)
            xci.append(ci)
            yci.append(d.ci("p50"))
            rep = "" if s.repeat is None else f" r{s.repeat + 1}"
            text.append(
                f"{s.workload}/{s.step}{rep}: total {x:.1f} tok/s ({ci_text(ci)}), per user "
                f"{y:.1f} tok/s ({ci_text(d.ci('p50'))})"
            )
        if not xs:
            continue
        drawn = True
        fig.add_trace(
            go.Scatter(
                x=xs,
                y=ys,
                mode="markers",
                name=n,
                marker={"color": colors[n], "size": 9},
                error_x=error_bars(list(xs), xci),
                error_y=error_bars(list(ys), yci),
                text=text,
                hovertemplate="%{text}<extra>" + esc(n) + "</extra>",
            )
        )
        fr = frontier(list(zip(xs, ys, strict=True)))
        if len(fr) > 1:
            fig.add_trace(
                go.Scatter(
                    x=[p[0] for p in fr],
                    y=[p[1] for p in fr],
                    mode="lines",
                    showlegend=False,
                    line={"color": colors[n], "dash": "dot"},
                    hoverinfo="skip",
                )
            )
    if not drawn:
        return None
    per_token = [lim for (m, st), lim in limits.items() if m in ("itl", "tpot")]
    if per_token:
        floor = 1.0 / min(per_token)
        fig.add_hrect(y0=floor, y1=1.0, yref="y", fillcolor="#1a7f37", opacity=0.08, line_width=0, layer="below")
        fig.add_hline(
            y=floor,
            line={"color": "#1a7f37", "dash": "dashdot", "width": 1.5},
            annotation_text=f"SLO region: ≥ {floor:.3g} tok/s per user (ITL/TPOT ≤ {min(per_token):g} s)",
            annotation_position="top left",
            annotation_font={"color": "#1a7f37", "size": 11},
        )
        fig.update_yaxes(range=[0, None])
    fig.update_layout(title="Pareto: output tok/s per user (median) vs total output tok/s, one point per step")
    fig.update_xaxes(title_text="total output tokens/s (steady window)", rangemode="tozero")
    fig.update_yaxes(title_text="output tokens/s per user (P50)", rangemode="tozero")
    return fig


def capacity_fig(rec: TrialRecord, names: list[str], colors: dict[str, str]) -> go.Figure | None:
    """Each candidate's capacity probes: offered rate vs completed rate, held (circle) or broke (x)."""
    fig = go.Figure()
    drawn = False
    for n in names:
        cap = rec.result(n).capacity
        if cap is None or not cap.probes:
            continue
        drawn = True
        for held in (True, False):
            ps = [p for p in cap.probes if p.held is held]
            if not ps:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[p.rate_rps for p in ps],
                    y=[p.achieved_rps for p in ps],
                    mode="markers",
                    name=f"{n} {'held' if held else 'broke'}",
                    marker={"color": colors[n], "size": 10, "symbol": "circle" if held else "x"},
                    text=[
                        f"probe {cap.probes.index(p) + 1}: {p.rate_rps:.3g} req/s "
                        + ("held" if held else "broke: " + "; ".join(p.broken_by))
                        for p in ps
                    ],
                    hovertemplate="%{text}<extra>" + esc(n) + "</extra>",
                )
            )
        if cap.rate_rps is not None:
            fig.add_vline(
                x=cap.rate_rps,
                line={"color": colors[n], "dash": "dash", "width": 1.5},
                annotation_text=f"{n}: {cap.rate_rps:.3g} req/s",
                annotation_font={"color": colors[n]},
            )
    if not drawn:
        return None
    fig.update_layout(title="Capacity search (open loop): offered vs completed requests/s per probe")
    fig.update_xaxes(title_text="offered arrival rate (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="completed requests/s", rangemode="tozero")
    return fig


def ttft_cdf_fig(
    run: Path, rec: TrialRecord, names: list[str], limits: dict[tuple[str, str], float]
) -> tuple[go.Figure | None, list[str]]:
    notes = []
    data: dict[str, dict[str, list[float]]] = {}
    for n in names:
        if not rec.result(n).ran_steps():
            continue
        path = safe_rel(run, rec.evidence.files.get(n, {}).get("steps"))
        if path is None:
            notes.append(f"{n}: no steps requests.jsonl in evidence.files")
            continue
        rows, note = read_jsonl(path)
        if note:
            notes.append(f"{n}: {note}")
        per: dict[str, list[float]] = {}
        for r in rows:
            t = finite(r.ttft_s)
            if r.warmup or r.failure is not None or t is None:
                continue
            per.setdefault(r.step or "?", []).append(t)
        if per:
            data[n] = per
    if not data:
        return None, notes
    cols = list(data)
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=cols, shared_yaxes=True)
    for ci, n in enumerate(cols, start=1):
        steps = sorted(data[n], key=lambda k: (k[0], float(k[1:]) if re.fullmatch(r".[0-9.]+", k) else 0))
        for si, st in enumerate(steps):
            xs = sorted(data[n][st])
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="lines",
                    line={"shape": "hv", "color": PALETTE[si % len(PALETTE)]},
                    name=st,
                    legendgroup=st,
                    showlegend=ci == 1,
                    hovertemplate=f"{esc(n)} {esc(st)}<br>TTFT %{{x:.3f}} s: %{{y:.0%}}<extra></extra>",
                ),
                row=1,
                col=ci,
            )
        for (m, stat), lim in limits.items():
            if m == "ttft":
                fig.add_vline(
                    x=lim,
                    line={"color": "#b42318", "dash": "dashdot", "width": 1.5},
                    row=1,
                    col=ci,
                    annotation_text=f"SLO {m}_{stat} ≤ {lim:g} s",
                    annotation_font={"color": "#b42318"},
                )
    fig.update_layout(title="TTFT CDF per load step (succeeded, non-warmup requests; all workloads)")
    fig.update_xaxes(title_text="TTFT (s)", rangemode="tozero")
    fig.update_yaxes(title_text="fraction of requests ≤ x", range=[0, 1.02], tickformat=".0%", col=1)
    return fig, notes


def errors_fig(names: list[str], rec: TrialRecord) -> go.Figure | None:
    cols = [n for n in names if rec.result(n).ran_steps()]
    if not cols:
        return None
    fig = make_subplots(rows=1, cols=len(cols), subplot_titles=cols, shared_yaxes=True)
    classes = list(FAIL_CLASSES)
    for n in cols:
        for s in rec.result(n).ran_steps():
            classes += [k for k in s.counts.failed if k not in classes]
    for ci, n in enumerate(cols, start=1):
        steps = rec.result(n).ran_steps()
        xs = [f"{s.workload}/{s.step}" for s in steps]
        ok = [float(s.counts.succeeded) or 0 for s in steps]
        fig.add_trace(
            go.Bar(x=xs, y=ok, name="succeeded", marker_color="#8fd19e", legendgroup="succeeded", showlegend=ci == 1),
            row=1,
            col=ci,
        )
        for k, cls in enumerate(classes):
            ys = [float(s.counts.failed.get(cls, 0)) or 0 for s in steps]
            fig.add_trace(
                go.Bar(
                    x=xs,
                    y=ys,
                    name=cls,
                    legendgroup=cls,
                    showlegend=ci == 1,
                    marker_color=PALETTE[(k + 1) % len(PALETTE)],
                ),
                row=1,
                col=ci,
            )
    fig.update_layout(barmode="stack", title="Requests per step by outcome (failures by class)")
    fig.update_yaxes(title_text="requests", col=1)
    return fig


def cold_fig(names: list[str], rec: TrialRecord) -> tuple[go.Figure | None, list[str]]:
    parts = (("port_open_s", "port open"), ("health_s", "health OK"), ("first_token_s", "first token"))

    def cold(n: str, k: str) -> float | None:
        c = rec.result(n).cold_start
        return finite(getattr(c, k)) if c is not None else None

    have = [n for n in names if any(cold(n, k) is not None for k, _ in parts)]
    missing = [n for n in names if n not in have]
    if not have:
        return None, missing
    fig = go.Figure()
    for i, (k, label) in enumerate(parts):
        ys = [cold(n, k) for n in have]
        fig.add_trace(
            go.Bar(
                x=have,
                y=ys,
                name=label,
                marker_color=PALETTE[i],
                text=[fmt(y) for y in ys],
                textposition="outside",
                hovertemplate=f"%{{x}} {label}: %{{y:.2f}} s<extra></extra>",
            )
        )
    fig.update_layout(barmode="group", title="Cold start: process start → port open → health → first token (s)")
    fig.update_yaxes(title_text="seconds since process start", rangemode="tozero")
    return fig, missing
