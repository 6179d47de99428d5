"""The trial's HTML report: one self-contained file that opens offline.

:func:`write_report` turns a trial run folder (docs/record-schema.md) into ``RUN/report.html``;
:func:`write_compare` sets two run folders side by side. Both embed plotly's JavaScript once, inline, and
every chart as a ``<div>`` + inline script, so the file needs no network (no CDN, no web font). Links to
evidence files are relative to the run folder, so the folder can be moved or archived as a whole.

The report reads only ``record.json`` (as a :class:`~servelab.trial.results.TrialRecord`, records of
schema version 1 migrated on read) and the per-request JSONL files that ``record.evidence.files`` names
(as :class:`~servelab.bench.results.RequestLine`). Missing pieces (a skipped step, an excluded candidate
without steps, a lost JSONL file or a damaged line in it, an engine without ``/metrics``) are shown as
such, never raised; a ``record.json`` that is not a trial record is one :class:`ConfigError` line naming
the first bad field.
"""

from __future__ import annotations

import html
import json
import math
import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs
from plotly.subplots import make_subplots

from pydantic import BaseModel, JsonValue, ValidationError

from servelab.bench.results import RequestLine, StepSummary
from servelab.bench.slo import parse_slo
from servelab.trial.embed_results import fact_text, ranking_basis
from servelab.trial.results import CandidateResult, JsonObject, TrialRecord, Verdict, read_record
from servelab.trial.report_server import server_panel_html
from servelab.wire import ConfigError

__all__ = ["load_record", "write_report", "write_compare", "render_report", "render_compare"]

FAIL_CLASSES = ("connect", "http_status", "stream_error", "cut_off", "protocol", "timeout", "cancelled")
PCTS = (("p50", "dot"), ("p95", "solid"), ("p99", "dash"))
LATENCIES = (("ttft_s", "ttft", "TTFT"), ("itl_s", "itl", "ITL (per token)"), ("e2e_s", "e2e", "E2E"))
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
VERDICT_COLOR = {"adopt": "#1a7f37", "backup": "#9a6700", "exclude": "#b42318"}
_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;
 color:#1f2328;background:#fff;line-height:1.45}
main{max-width:1200px;margin:0 auto;padding:1rem 1.5rem 3rem}
h1{font-size:1.6rem;margin:.6rem 0}h2{font-size:1.3rem;margin-top:2rem;border-bottom:1px solid #d0d7de}
h3{font-size:1.08rem;margin-top:1.4rem}
table{border-collapse:collapse;margin:.5rem 0 1rem;font-size:.88rem}
th,td{border:1px solid #d0d7de;padding:.25rem .5rem;text-align:left;vertical-align:top}
th{background:#f6f8fa;font-weight:600}td.num{text-align:right;font-variant-numeric:tabular-nums}
.verdict{display:inline-block;padding:.05rem .5rem;border-radius:.7rem;color:#fff;font-weight:600;
 font-size:.85rem}
.muted{color:#656d76}.bad{color:#b42318}.ok{color:#1a7f37}
.cards{display:flex;flex-wrap:wrap;gap:1rem}
.card{border:1px solid #d0d7de;border-radius:6px;padding:.6rem .9rem;flex:1 1 320px}
.chart{margin:.5rem 0 1.2rem}
.cols{display:grid;grid-template-columns:1fr 1fr;gap:1.5rem}
code{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85em}
#js-errors:empty{display:none}#js-errors{color:#b42318;border:1px solid #b42318;padding:.5rem}
nav a{margin-right:.8rem}
"""

# window.onerror writes into #js-errors so a broken chart is visible (and testable via --dump-dom).
_ERR_HOOK = """<script>window.addEventListener('error',function(e){var d=document.getElementById('js-errors');
if(d){d.textContent+='Chart script error: '+(e.message||e)+'\\n';}});</script>"""


# ----------------------------------------------------------------------------------------- public API

def load_record(run_dir: str | Path) -> TrialRecord:
    """Read ``run_dir/record.json`` (docs/record-schema.md) as a :class:`TrialRecord`, records of
    older schema versions migrated (:func:`servelab.trial.results.read_record`).

    Raises :class:`servelab.wire.ConfigError` when ``run_dir`` has no ``record.json``, the file is not
    a JSON object, or it is not a trial record (one line naming the first bad field).
    """
    return read_record(Path(run_dir) / "record.json" if Path(run_dir).is_dir() else Path(run_dir))


def render_report(run_dir: str | Path) -> str:
    """Return the report of ``run_dir`` as one HTML string (what :func:`write_report` writes).

    Raises :class:`servelab.wire.ConfigError` as :func:`load_record` does.
    """
    run = Path(run_dir)
    rec = load_record(run)
    return _page(f"servelab trial {rec.trial_id or run.name}", _report_body(run, rec))


def write_report(run_dir: str | Path) -> Path:
    """Write ``run_dir/report.html`` from ``run_dir/record.json`` and return its path.

    ``run_dir`` is a trial run folder (docs/record-schema.md). The page holds, in order: the decision
    (verdict and reasons per candidate, ranking, scope, re-check conditions, the factor that differs
    between compared candidates); charts per candidate and step (TTFT/ITL/E2E P50/P95/P99 vs load with
    the SLO limits as horizontal lines, throughput and goodput vs load, TTFT CDF from the steps'
    ``requests.jsonl``, failures by class, cold start); client vs engine ``/metrics`` figures; and the
    §12 rows as tables. It is a single file with plotly's JS inline (no external URL), ~5 MB.

    Raises :class:`servelab.wire.ConfigError` when ``run_dir`` has no (readable) ``record.json``;
    ``OSError`` if the file cannot be written.
    """
    run = Path(run_dir)
    text = render_report(run)
    out = run / "report.html"
    out.write_text(text, encoding="utf-8")
    return out


def render_compare(run_a: str | Path, run_b: str | Path) -> str:
    """Return the side-by-side page of two run folders as one HTML string (see :func:`write_compare`)."""
    ra, rb = Path(run_a), Path(run_b)
    a, b = load_record(ra), load_record(rb)
    return _page(f"servelab compare {a.trial_id or ra.name} vs {b.trial_id or rb.name}",
                 _compare_body(ra, a, rb, b))


def write_compare(run_a: str | Path, run_b: str | Path, out_path: str | Path) -> Path:
    """Write a page that sets two trials side by side to ``out_path`` and return its path.

    The page shows each trial's decision (A left, B right) and, overlaid, every candidate's latency
    (TTFT P95, ITL P95, E2E P99) and throughput/goodput vs load, labelled ``A:<name>`` / ``B:<name>``,
    with a table of what differs in identity and environment. Same self-contained rules as
    :func:`write_report`. Parent folders of ``out_path`` are created.

    Raises :class:`servelab.wire.ConfigError` when either folder has no (readable) ``record.json``.
    """
    text = render_compare(run_a, run_b)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return out


# ----------------------------------------------------------------------------------------- small helpers

def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _num(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def _fmt(x: Any, digits: int = 3) -> str:
    v = _num(x)
    if v is None:
        return "—" if x is None else _e(x)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{max(digits - 1, 1)}f}".rstrip("0").rstrip(".")


def _pct(x: Any) -> str:
    v = _num(x)
    return "—" if v is None else f"{v * 100:.2g} %"


def _bytes(x: Any) -> str:
    v = _num(x)
    if v is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "—"


def _when(x: Any) -> str:
    v = _num(x)
    return "—" if v is None or v <= 0 else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v))


def _table(headers: Iterable[str], rows: Iterable[Iterable[Any]], num_cols: Iterable[int] = ()) -> str:
    """HTML table; cells are escaped unless wrapped in :class:`_Raw`."""
    nc = set(num_cols)
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = []
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            cls = ' class="num"' if i in nc else ""
            cells.append(f"<td{cls}>{c if isinstance(c, _Raw) else _e(c)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


class _Raw(str):
    """Already-escaped HTML for :func:`_table`."""


def _kv(d: JsonObject, label: str = "field", value: str = "value") -> str:
    rows: list[tuple[str, object]] = []
    for k, v in d.items():
        if isinstance(v, (dict, list)):
            rows.append((k, _Raw(f"<code>{_e(json.dumps(v, ensure_ascii=False, default=str))}</code>")))
        else:
            rows.append((k, v))
    return _table((label, value), rows)


def _verdict_badge(v: str | None) -> _Raw:
    v = v or "—"
    return _Raw(f'<span class="verdict" style="background:{VERDICT_COLOR.get(v, "#57606a")}">{_e(v)}</span>')


def _step_x(step: StepSummary) -> float | None:
    """The load value of a step: concurrency (closed loop) or rate in req/s (open loop)."""
    load = step.load
    v = _num(load.concurrency) if load.kind != "open" else _num(load.rate_rps)
    if v is None:
        m = re.fullmatch(r"[cr]([0-9.]+)", step.step)
        v = float(m.group(1)) if m else None
    return v


def _axis_title(steps: list[StepSummary]) -> str:
    kinds = {s.load.kind for s in steps}
    if kinds == {"open"}:
        return "arrival rate (req/s)"
    if kinds == {"closed"} or not kinds:
        return "concurrency (requests in flight)"
    return "concurrency or rate (req/s)"


def _slo_limits(rec: TrialRecord) -> tuple[dict[tuple[str, str], float], float | None, list[str]]:
    """``({(metric, stat): limit_s}, error_rate_limit, objective names)`` from ``goal.slo``;
    unparsable parts are skipped (the report never raises)."""
    lat: dict[tuple[str, str], float] = {}
    err = None
    names = []
    for p in rec.goal.slo:
        try:
            objs = parse_slo(p)
        except ConfigError:
            continue
        for o in objs:
            names.append(o.name)
            if o.metric == "error_rate":
                err = o.limit
            else:
                lat[(o.metric, o.stat)] = o.limit
    return lat, err, names


def _workloads(steps: list[StepSummary]) -> list[str]:
    return list(dict.fromkeys(s.workload for s in steps))


def _read_jsonl(path: Path) -> tuple[list[RequestLine], str | None]:
    """Request lines of a JSONL file and a note (missing file, bad lines) or None."""
    if not path.is_file():
        return [], f"{path.name} not found"
    rows, bad = [], 0
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    rows.append(RequestLine.model_validate_json(line))
                except ValidationError:
                    bad += 1
    except OSError as e:
        return [], f"cannot read {path.name}: {e}"
    return rows, (f"{bad} unreadable line(s) skipped" if bad else None)


def _safe_rel(run: Path, rel: str | None) -> Path | None:
    """``run/rel`` when ``rel`` is a relative path inside the run folder, else None."""
    if not rel:
        return None
    p = Path(rel)
    if p.is_absolute() or ".." in p.parts:
        return None
    return run / p


# ----------------------------------------------------------------------------------------- figures

class _Charts:
    """Collects figures; each becomes a ``<div class="chart">`` (plotly JS is embedded once per page)."""

    def __init__(self) -> None:
        self.count = 0

    def html(self, fig: go.Figure, height: int = 380) -> str:
        self.count += 1
        fig.update_layout(template="plotly_white", height=height, margin={"l": 60, "r": 20, "t": 60, "b": 50},
                          font={"family": "system-ui, -apple-system, Segoe UI, Roboto, Arial, sans-serif",
                                "size": 12},
                          legend={"orientation": "h", "yanchor": "bottom", "y": -0.35, "x": 0})
        div = fig.to_html(full_html=False, include_plotlyjs=False, config=_CONFIG,
                          div_id=f"chart-{self.count}", default_height=f"{height}px", default_width="100%")
        return f'<div class="chart">{div}</div>'


def _colors(names: list[str]) -> dict[str, str]:
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


Series = list[tuple[str, str, list[StepSummary]]]
"""Chart series: (label, colour, the steps that ran)."""


def _latency_fig(series: Series, key: str, metric: str, title: str, limits: dict[tuple[str, str], float],
                 workloads: list[str], pcts: tuple[tuple[str, str], ...] = PCTS) -> go.Figure:
    """Subplot per workload; one line per (label, percentile). ``series`` = [(label, color, steps)]."""
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), subplot_titles=workloads or [""],
                        shared_yaxes=True)
    all_steps: list[StepSummary] = []
    for label, color, steps in series:
        all_steps += steps
        for ci, wl in enumerate(workloads, start=1):
            pts = sorted(((x, s) for s in steps if s.workload == wl
                          and (x := _step_x(s)) is not None), key=lambda t: t[0])
            for p, dash in pcts:
                ys = [_num(getattr(s.dist(key), p)) for _, s in pts]
                if not any(y is not None for y in ys):
                    continue
                cis = [s.dist(key).ci(p) for _, s in pts]
                fig.add_trace(go.Scatter(
                    x=[x for x, _ in pts], y=ys, mode="lines+markers", name=f"{label} {p}",
                    legendgroup=f"{label} {p}", showlegend=ci == 1, error_y=_err(ys, cis),
                    line={"color": color, "dash": dash},
                    text=[f"{s.step}{'' if s.repeat is None else f' r{s.repeat + 1}'} ({_ci_text(c, ' s')})"
                          for (_, s), c in zip(pts, cis, strict=True)],
                    hovertemplate=f"{_e(label)} {p}<br>%{{text}}: %{{y:.3f}} s<extra>{_e(wl)}</extra>"),
                    row=1, col=ci)
    for (m, stat), lim in limits.items():
        if m == metric:
            for ci in range(1, max(len(workloads), 1) + 1):
                fig.add_hline(y=lim, line={"color": "#b42318", "dash": "dashdot", "width": 1.5}, row=1, col=ci,
                              annotation_text=f"SLO {m}_{stat} ≤ {lim:g} s", annotation_position="top left",
                              annotation_font={"color": "#b42318", "size": 11})
    fig.update_layout(title=f"{title} percentiles vs load (s)")
    fig.update_xaxes(title_text=_axis_title(all_steps), type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text=f"{title} (s)", rangemode="tozero", col=1)
    return fig


def _throughput_fig(series: Series, workloads: list[str]) -> go.Figure:
    fig = make_subplots(rows=1, cols=max(len(workloads), 1), subplot_titles=workloads or [""],
                        shared_yaxes=True)
    all_steps: list[StepSummary] = []
    for label, color, steps in series:
        all_steps += steps
        for ci, wl in enumerate(workloads, start=1):
            pts = sorted(((x, s) for s in steps if s.workload == wl
                          and (x := _step_x(s)) is not None), key=lambda t: t[0])
            for what, dash in (("throughput", "solid"), ("goodput", "dot")):
                ys = [_num((s.throughput if what == "throughput" else s.goodput).output_tokens_per_s)
                      for _, s in pts]
                if not any(y is not None for y in ys):
                    continue
                if what == "throughput":  # the steady window's figure and its interval, where the trial added one
                    ys = [_total_tps(s)[0] for _, s in pts]
                cis = [_total_tps(s)[1] if what == "throughput" else None for _, s in pts]
                fig.add_trace(go.Scatter(
                    x=[x for x, _ in pts], y=ys, mode="lines+markers", name=f"{label} {what}",
                    error_y=_err(ys, cis),
                    legendgroup=f"{label} {what}", showlegend=ci == 1, line={"color": color, "dash": dash},
                    text=[s.step for _, s in pts],
                    hovertemplate=f"{_e(label)} {what}<br>%{{text}}: %{{y:.1f}} tok/s<extra>{_e(wl)}</extra>"),
                    row=1, col=ci)
    fig.update_layout(title="Output throughput and goodput vs load (tokens/s)")
    fig.update_xaxes(title_text=_axis_title(all_steps), type="log", dtick=math.log10(2))
    fig.update_yaxes(title_text="output tokens/s", rangemode="tozero", col=1)
    return fig


def _err(ys: list[float | None], cis: list[Any]) -> dict[str, Any] | None:
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


def _ci_text(ci: Any, unit: str = "") -> str:
    if ci is None:
        return "no interval"
    lo = "unbounded" if ci.lo is None else f"{ci.lo:.3g}"
    hi = "unbounded" if ci.hi is None else f"{ci.hi:.3g}"
    return f"95 % CI {lo}–{hi}{unit}"


def _total_tps(s: StepSummary) -> tuple[float | None, Any]:
    """Total output tok/s of a step (steady window when the trial added one) and its interval."""
    st = s.steady
    if st is not None and st.output_tokens_per_s is not None:
        return st.output_tokens_per_s, st.output_tokens_per_s_ci
    return _num(s.throughput.output_tokens_per_s), None


def _pareto_steps(c: CandidateResult) -> list[StepSummary]:
    """The steps a candidate's Pareto points come from: its ranked workload (the mix), else all."""
    ran = c.ran_steps()
    ranked = c.ranked_on or (c.effective_throughput.workload if c.effective_throughput else None)
    mine = [s for s in ran if s.workload == ranked] if ranked else []
    return mine or ran


def _frontier(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The non-dominated points (higher total and higher per-user both better), by total."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(pts, key=lambda p: (-p[0], -p[1])):
        if not out or y > out[-1][1]:
            out.append((x, y))
    return sorted(out)


def _pareto_fig(rec: TrialRecord, names: list[str], colors: dict[str, str],
                limits: dict[tuple[str, str], float]) -> go.Figure | None:
    """Output tok/s per user (median, P50 of ``output_tps_per_user``) against total output tok/s, one
    point per step and repeat, per candidate; error bars are the 95 % intervals; the frontier of each
    candidate is drawn; the per-user speed the ITL/TPOT limit implies is shaded as the SLO region."""
    fig = go.Figure()
    drawn = False
    for n in names:
        steps = _pareto_steps(rec.result(n))
        xs, ys, xci, yci, text = [], [], [], [], []
        for s in steps:
            x, ci = _total_tps(s)
            d = s.output_tps_per_user
            y = _num(d.p50)
            if x is None or y is None:
                continue
            xs.append(x)
            ys.append(y)
            xci.append(ci)
            yci.append(d.ci("p50"))
            rep = "" if s.repeat is None else f" r{s.repeat + 1}"
            text.append(f"{s.workload}/{s.step}{rep}: total {x:.1f} tok/s ({_ci_text(ci)}), per user "
                        f"{y:.1f} tok/s ({_ci_text(d.ci('p50'))})")
        if not xs:
            continue
        drawn = True
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name=n, marker={"color": colors[n], "size": 9},
                                 error_x=_err(list(xs), xci), error_y=_err(list(ys), yci), text=text,
                                 hovertemplate="%{text}<extra>" + _e(n) + "</extra>"))
        fr = _frontier(list(zip(xs, ys, strict=True)))
        if len(fr) > 1:
            fig.add_trace(go.Scatter(x=[p[0] for p in fr], y=[p[1] for p in fr], mode="lines", showlegend=False,
                                     line={"color": colors[n], "dash": "dot"}, hoverinfo="skip"))
    if not drawn:
        return None
    per_token = [lim for (m, st), lim in limits.items() if m in ("itl", "tpot")]
    if per_token:
        floor = 1.0 / min(per_token)
        fig.add_hrect(y0=floor, y1=1.0, yref="y", fillcolor="#1a7f37", opacity=0.08, line_width=0,
                      layer="below")
        fig.add_hline(y=floor, line={"color": "#1a7f37", "dash": "dashdot", "width": 1.5},
                      annotation_text=f"SLO region: ≥ {floor:.3g} tok/s per user (ITL/TPOT ≤ {min(per_token):g} s)",
                      annotation_position="top left", annotation_font={"color": "#1a7f37", "size": 11})
        fig.update_yaxes(range=[0, None])
    fig.update_layout(title="Pareto: output tok/s per user (median) vs total output tok/s, one point per step")
    fig.update_xaxes(title_text="total output tokens/s (steady window)", rangemode="tozero")
    fig.update_yaxes(title_text="output tokens/s per user (P50)", rangemode="tozero")
    return fig


def _capacity_fig(rec: TrialRecord, names: list[str], colors: dict[str, str]) -> go.Figure | None:
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
            fig.add_trace(go.Scatter(
                x=[p.rate_rps for p in ps], y=[p.achieved_rps for p in ps], mode="markers",
                name=f"{n} {'held' if held else 'broke'}",
                marker={"color": colors[n], "size": 10, "symbol": "circle" if held else "x"},
                text=[f"probe {cap.probes.index(p) + 1}: {p.rate_rps:.3g} req/s "
                      + ("held" if held else "broke: " + "; ".join(p.broken_by)) for p in ps],
                hovertemplate="%{text}<extra>" + _e(n) + "</extra>"))
        if cap.rate_rps is not None:
            fig.add_vline(x=cap.rate_rps, line={"color": colors[n], "dash": "dash", "width": 1.5},
                          annotation_text=f"{n}: {cap.rate_rps:.3g} req/s", annotation_font={"color": colors[n]})
    if not drawn:
        return None
    fig.update_layout(title="Capacity search (open loop): offered vs completed requests/s per probe")
    fig.update_xaxes(title_text="offered arrival rate (req/s)", rangemode="tozero")
    fig.update_yaxes(title_text="completed requests/s", rangemode="tozero")
    return fig


def _money(x: float | None) -> str:
    return "—" if x is None else f"{x:.4g}"


def _cost_html(rec: TrialRecord, names: list[str]) -> str:
    """Cost per 10k / 1M output tokens, capacity at the SLO and replicas for the peak, with intervals."""
    rows = []
    for n in names:
        c = rec.result(n)
        cost, cap, rep = c.cost, c.capacity, c.replicas
        if cost is None and cap is None and rep is None:
            continue

        def rng(ci: Any) -> str:
            if ci is None or (ci.lo is None and ci.hi is None):
                return "—"
            lo = _money(ci.lo) if ci.lo is not None else "unbounded"
            tail = " (search resolution, not a CI)" if ci.method == "bracket" else ""
            return f"{lo}–{_money(ci.hi) if ci.hi is not None else 'unbounded'}{tail}"

        capt = "—"
        if cap is not None:
            capt = (f"{cap.rate_rps:.3g} [{cap.rate_rps:.3g}, {cap.broke_at_rps:.3g})" if cap.rate_rps is not None
                    and cap.broke_at_rps is not None else f"≥ {cap.rate_rps:.3g}" if cap.rate_rps is not None
                    else (cap.note or "—"))
        rept = "—"
        if rep is not None and rep.replicas is not None:
            rept = f"{rep.replicas}" + (f" ({rep.lo}–{rep.hi})" if rep.lo is not None and rep.lo != rep.hi else "")
            rept += f" for {_fmt(rep.peak_rps)} req/s at {rep.headroom:.0%} headroom"
        rows.append((n, _money(cost.price_per_hour) if cost else "—", _fmt(cost.tokens_per_s) if cost else "—",
                     cost.basis if cost else "—", _money(cost.per_10k_output_tokens) if cost else "—",
                     rng(cost.per_10k_ci) if cost else "—", _money(cost.per_1m_output_tokens) if cost else "—",
                     rng(cost.per_1m_ci) if cost else "—", capt, rept))
    if not rows:
        return ('<p class="muted">No cost figures: declare <code>price_per_hour</code> per candidate or in '
                "<code>goal.budget</code>; no capacity search ran.</p>")
    cur = rec.goal.budget.currency or "USD"
    return _table(("candidate", f"price ({cur}/h)", "out tok/s", "basis", "per 10k out tok", "95 % CI",
                   "per 1M out tok", "95 % CI", "capacity at SLO (req/s) [held, broke): search resolution, not a CI",
                   "replicas for the peak"),
                  rows, num_cols=(1, 2, 4, 6))


# ----------------------------------------------------------------------------------------- report body

def _decision_html(rec: TrialRecord, names: list[str], heading: str = "h2") -> str:
    dec = rec.decision
    out = [f"<{heading}>Decision</{heading}>"]
    intr = rec.interrupted
    if intr is not None:
        out.append(f'<p class="bad"><b>Partial trial</b>: interrupted while <b>{_e(intr.candidate)}</b> ran; '
                   f'{_e(intr.note)}.</p>')
    if dec.ranking:
        basis = ranking_basis(rec.goal.task_kind) or (  # an embeddings trial ranks on inputs/s (trial.embed_results)
            "what each engine sustained on the goal's mix run together, at the highest "
            "load step that met every SLO; a candidate is behind only when the difference's 95 % interval "
            "excludes 1, else the tie-break orders them")
        out.append(f"<p><b>Ranking</b> ({_e(basis)}): "
                   + " &gt; ".join(f"<b>{_e(n)}</b>" for n in dec.ranking) + "</p>")
    else:
        out.append('<p class="bad"><b>No candidate was ranked</b>: none passed the smoke, quality and error '
                   "gates.</p>")
    cards = []
    for n in names:
        v = dec.verdict_of(n)
        c = rec.results.candidates.get(n)
        reasons = list(v.reasons) if v else []
        if not reasons and c is not None and c.reason:
            reasons = [c.reason]
        eff = c.effective_throughput if c is not None else None
        facts = f'<div class="muted">status: {_e(c.status if c is not None else "—")}'
        if c is not None and c.embeddings is not None:
            facts += f"; {_e(fact_text(c.embeddings))}"
        elif eff is not None:
            facts += (f"; effective {_fmt(eff.output_tokens_per_s)} output tok/s "
                      f"({_e(_ci_text(eff.output_tokens_per_s_ci))}; goodput {_fmt(eff.goodput_output_tokens_per_s)}) "
                      f"at {_e(eff.at_step)}" + (f" on {_e(eff.workload)}" if eff.workload else ""))
        if c is not None and c.broken_at:
            facts += f"; SLO broken at {_e(c.broken_at)}"
        facts += "</div>"
        rs = "".join(f"<li>{_e(r)}</li>" for r in reasons) or '<li class="muted">no reason recorded</li>'
        cards.append(f'<div class="card"><div><b>{_e(n)}</b> {_verdict_badge(v.verdict if v else None)}</div>'
                     f"{facts}<ul>{rs}</ul></div>")
    out.append(f'<div class="cards">{"".join(cards)}</div>')
    if dec.differences:
        sig = {True: "yes", False: "no: the ranking between them is by the tie-break"}.get(bool(dec.significant))
        out.append(f"<p><b>Is the winner significantly better?</b> {_e(sig)}</p><ul>"
                   + "".join(f"<li>{_e(d.text)}</li>" for d in dec.differences) + "</ul>")
    if dec.tie_break:
        out.append(f'<p class="muted">Tie-break (no significant difference): {_e(dec.tie_break)}.</p>')
    if dec.comparability is not None and dec.comparability.note:
        cls = "muted" if dec.comparability.same_tokenizer else "bad"
        out.append(f'<p class="{cls}"><b>Token comparability:</b> {_e(dec.comparability.note)}</p>')
    if dec.budget_note:
        out.append(f'<p class="muted"><b>What the budget allowed:</b> {_e(dec.budget_note)}.</p>')
    if dec.scope:
        out.append(f"<p><b>Scope of validity:</b> {_e(dec.scope)}</p>")
    if dec.recheck_when:
        out.append("<p><b>Re-check when:</b></p><ul>" + "".join(f"<li>{_e(r)}</li>" for r in dec.recheck_when)
                   + "</ul>")
    if dec.comparisons:
        out.append("<p><b>What differs between candidates</b> (one factor at a time makes a comparison "
                   "causal):</p>")
        out.append(_table(("A", "B", "differs in", "note"),
                          ((c.a, c.b, ", ".join(c.differs_in) or "—", c.note) for c in dec.comparisons)))
    if rec.historical:
        out.append('<p class="bad"><b>Historical record:</b> a newer trial of the same candidate name has a '
                   "different engine or weights identity.</p>")
    return "\n".join(out)


def _steps_table(cand: CandidateResult) -> str:
    rows: list[tuple[object, ...]] = []
    for s in cand.steps:
        if s.skipped:
            rows.append((s.workload, s.step, _Raw(f'<span class="muted">skipped: '
                         f'{_e(s.skipped_reason or "an earlier step broke an SLO")}</span>'),
                         "", "", "", "", "", "", "", "", ""))
            continue
        c = s.counts
        met = s.slo_met
        broken = [o.objective for o in s.slo if o.met is False]
        met_cell = _Raw('<span class="ok">yes</span>') if met else (
            _Raw(f'<span class="bad">no: {_e(", ".join(broken) or "see SLO list")}</span>')
            if met is False else "—")
        tps, tci = _total_tps(s)
        st = s.steady
        window = (f"ramp {_fmt(st.ramp_s)} s, steady {_fmt(st.steady_s)} s, drain {_fmt(st.drain_s)} s"
                  if st is not None and st.steady_s is not None else "—")
        rows.append((s.workload, s.step + ("" if s.repeat is None else f" r{s.repeat + 1}"), c.submitted, c.succeeded,
                     c.failed_total, c.good, _with_ci(s.ttft_s.p95, s.ttft_s.ci("p95")),
                     _with_ci(s.itl_s.p95, s.itl_s.ci("p95")), _with_ci(s.e2e_s.p99, s.e2e_s.ci("p99")),
                     _with_ci(tps, tci), window, _fmt(s.goodput.output_tokens_per_s), met_cell))
    if not rows:
        return '<p class="muted">No load steps were run.</p>'
    return _table(("workload", "step", "submitted", "succeeded", "failed", "good", "TTFT p95 (s) [95 % CI]",
                   "ITL p95 (s) [95 % CI]", "E2E p99 (s) [95 % CI]", "throughput (out tok/s) [95 % CI]",
                   "window", "goodput (out tok/s)", "SLO met"),
                  rows, num_cols=range(2, 10))


def _with_ci(v: Any, ci: Any) -> str:
    """``1.9 [1.2–∞)``: a figure never shown bare: with its 95 % interval (``∞`` / ``0`` where the sample
    cannot bound that side), or ``1.9 [no interval]``."""
    if _num(v) is None:
        return "—"
    if ci is None:
        return f"{_fmt(v)} [no interval]"
    lo = "?" if ci.lo is None else _fmt(ci.lo)
    hi = "∞" if ci.hi is None else _fmt(ci.hi)
    return f"{_fmt(v)} [{lo}–{hi}{')' if ci.hi is None else ']'}"


def _ttft_cdf_fig(run: Path, rec: TrialRecord, names: list[str],
                  limits: dict[tuple[str, str], float]) -> tuple[go.Figure | None, list[str]]:
    notes = []
    data: dict[str, dict[str, list[float]]] = {}
    for n in names:
        if not rec.result(n).ran_steps():
            continue
        path = _safe_rel(run, rec.evidence.files.get(n, {}).get("steps"))
        if path is None:
            notes.append(f"{n}: no steps requests.jsonl in evidence.files")
            continue
        rows, note = _read_jsonl(path)
        if note:
            notes.append(f"{n}: {note}")
        per: dict[str, list[float]] = {}
        for r in rows:
            t = _num(r.ttft_s)
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
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"shape": "hv",
                          "color": PALETTE[si % len(PALETTE)]}, name=st, legendgroup=st, showlegend=ci == 1,
                          hovertemplate=f"{_e(n)} {_e(st)}<br>TTFT %{{x:.3f}} s: %{{y:.0%}}<extra></extra>"),
                          row=1, col=ci)
        for (m, stat), lim in limits.items():
            if m == "ttft":
                fig.add_vline(x=lim, line={"color": "#b42318", "dash": "dashdot", "width": 1.5}, row=1, col=ci,
                              annotation_text=f"SLO {m}_{stat} ≤ {lim:g} s", annotation_font={"color": "#b42318"})
    fig.update_layout(title="TTFT CDF per load step (succeeded, non-warmup requests; all workloads)")
    fig.update_xaxes(title_text="TTFT (s)", rangemode="tozero")
    fig.update_yaxes(title_text="fraction of requests ≤ x", range=[0, 1.02], tickformat=".0%", col=1)
    return fig, notes


def _errors_fig(names: list[str], rec: TrialRecord) -> go.Figure | None:
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
        fig.add_trace(go.Bar(x=xs, y=ok, name="succeeded", marker_color="#8fd19e", legendgroup="succeeded",
                             showlegend=ci == 1), row=1, col=ci)
        for k, cls in enumerate(classes):
            ys = [float(s.counts.failed.get(cls, 0)) or 0 for s in steps]
            fig.add_trace(go.Bar(x=xs, y=ys, name=cls, legendgroup=cls, showlegend=ci == 1,
                                 marker_color=PALETTE[(k + 1) % len(PALETTE)]), row=1, col=ci)
    fig.update_layout(barmode="stack", title="Requests per step by outcome (failures by class)")
    fig.update_yaxes(title_text="requests", col=1)
    return fig


def _cold_fig(names: list[str], rec: TrialRecord) -> tuple[go.Figure | None, list[str]]:
    parts = (("port_open_s", "port open"), ("health_s", "health OK"), ("first_token_s", "first token"))

    def cold(n: str, k: str) -> float | None:
        c = rec.result(n).cold_start
        return _num(getattr(c, k)) if c is not None else None

    have = [n for n in names if any(cold(n, k) is not None for k, _ in parts)]
    missing = [n for n in names if n not in have]
    if not have:
        return None, missing
    fig = go.Figure()
    for i, (k, label) in enumerate(parts):
        ys = [cold(n, k) for n in have]
        fig.add_trace(go.Bar(x=have, y=ys, name=label, marker_color=PALETTE[i],
                             text=[_fmt(y) for y in ys], textposition="outside",
                             hovertemplate=f"%{{x}} {label}: %{{y:.2f}} s<extra></extra>"))
    fig.update_layout(barmode="group", title="Cold start: process start → port open → health → first token (s)")
    fig.update_yaxes(title_text="seconds since process start", rangemode="tozero")
    return fig, missing


# server metric name fragments -> (client figure label, how to read it from a step summary)
_SERVER_MATCH: tuple[tuple[tuple[str, ...], str, Callable[[StepSummary], float | None]], ...] = (
    (("time_to_first_token", "ttft"), "client TTFT mean (s)", lambda s: s.ttft_s.mean),
    (("predicted_tokens_seconds", "per_user", "tokens_per_second_per"), "client decode tok/s per request (mean)",
     lambda s: s.output_tps_per_user.mean),
    (("generation_throughput", "generation_tokens_per", "output_tokens_per"), "client output tok/s",
     lambda s: s.throughput.output_tokens_per_s),
    (("e2e_request_latency", "request_latency"), "client E2E mean (s)", lambda s: s.e2e_s.mean),
    (("time_per_output_token", "inter_token"), "client TPOT mean (s)", lambda s: s.tpot_s.mean),
)


def _client_counterpart(metric: str, step: StepSummary) -> tuple[str, float | None]:
    m = metric.lower()
    for keys, label, get in _SERVER_MATCH:
        if any(k in m for k in keys):
            return label, get(step)
    return "server only (queue, running, KV use …)", None


def _client_server_html(names: list[str], rec: TrialRecord) -> str:
    out = []
    for n in names:
        c = rec.result(n)
        steps = c.ran_steps()
        engine = rec.ident(n).engine
        kind = engine.kind if engine is not None else "engine"
        out.append(f"<h3>{_e(n)} <span class='muted'>({_e(kind)})</span></h3>")
        if not steps:
            out.append(f'<p class="muted">No load steps ran ({_e(c.status or "not run")}'
                       f'{": " + _e(c.reason) if c.reason else ""}).</p>')
            continue
        rows = []
        for s in steps:
            for metric, v in sorted(s.server.items()):
                label, cv = _client_counterpart(metric, s)
                rows.append((f"{s.workload}/{s.step}", _Raw(f"<code>{_e(metric)}</code>"),
                             _fmt(v.mean), _fmt(v.max), label, _fmt(cv) if label[:6] == "client" else ""))
        if not rows:
            out.append('<p class="muted">Server-side metrics: not offered by this engine (no /metrics figures '
                       "were recorded during the steps).</p>")
            continue
        out.append(_table(("step", "engine /metrics name", "server mean", "server max", "client counterpart",
                           "client value"), rows, num_cols=(2, 3, 5)))
    return "\n".join(out)


def _identity_rows(names: list[str], rec: TrialRecord) -> str:
    rows = []
    for n in names:
        i = rec.ident(n)
        eng, model = i.engine, i.model or {}
        sha = str(model.get("sha256") or "")
        bsha = str((eng.binary_sha256 if eng is not None else None) or "")
        path = model.get("path")
        rows.append((n, eng.kind if eng is not None else "—", (eng.version if eng is not None else None) or "—",
                     bsha[:12] or "—", Path(str(path)).name if path else "—", sha[:12] or "—",
                     _Raw(f"<code>{_e(json.dumps(i.settings, default=str))}</code>") if i.settings else "—",
                     i.url or "launched by servelab"))
    return _table(("candidate", "engine", "engine version", "binary sha256", "model", "model sha256",
                   "settings", "URL"), rows)


def _results_rows(rec: TrialRecord) -> str:
    rows = []
    for n in rec.names():
        c = rec.result(n)
        tl, eff = c.tail_latency, c.effective_throughput
        qtxt = ("passed" if c.quality.passed else "failed") if c.quality is not None else "not run"
        bad_smoke = [k for k, v in c.smoke.items() if not v.ok]
        stxt = ("failed: " + ", ".join(bad_smoke)) if bad_smoke else ("passed" if c.smoke else "not run")
        rows.append((n, c.status or "—", c.reason or "", stxt, qtxt, _pct(c.error_rate),
                     _with_ci(tl.ttft_p95_s, tl.ttft_p95_ci) if tl else "—",
                     _with_ci(tl.itl_p95_s, tl.itl_p95_ci) if tl else "—",
                     _with_ci(tl.e2e_p99_s, tl.e2e_p99_ci) if tl else "—",
                     _with_ci(eff.output_tokens_per_s, eff.output_tokens_per_s_ci) if eff else "—",
                     _fmt(eff.goodput_output_tokens_per_s if eff else None), (eff.at_step if eff else None) or "—",
                     c.broken_at or "—", _bytes(c.peak_rss_bytes), _bytes(c.peak_gpu_memory_bytes),
                     _fmt(c.cost.per_1m_output_tokens if c.cost else None)))
    return _table(("candidate", "status", "reason", "smoke", "quality", "error rate", "TTFT p95 (s)",
                   "ITL p95 (s)", "E2E p99 (s)", "eff. throughput (out tok/s)", "eff. goodput (out tok/s)",
                   "at step", "broken at", "peak RSS", "peak GPU memory",
                   f"cost ({rec.goal.budget.currency or 'USD'}/1M out tok)"),
                  rows, num_cols=(5, 6, 7, 8, 9, 10, 13, 14, 15))


def _quality_html(rec: TrialRecord) -> str:
    rows = []
    ok_html, bad_html = _Raw('<span class="ok">ok</span>'), _Raw('<span class="bad">failed</span>')
    for n in rec.names():
        c = rec.result(n)
        for k, v in c.smoke.items():
            rows.append((n, f"smoke: {k}", ok_html if v.ok else bad_html, v.detail, "", ""))
        for ch in c.quality.checks if c.quality is not None else []:
            rows.append((n, f"quality: {ch.name}", ok_html if ch.ok else bad_html, "", _fmt(ch.value),
                         _fmt(ch.limit)))
    if not rows:
        return '<p class="muted">No smoke or quality results recorded.</p>'
    return _table(("candidate", "check", "result", "detail", "value", "limit"), rows, num_cols=(4, 5))


def _evidence_html(run: Path, rec: TrialRecord) -> str:
    ev = rec.evidence
    out = []
    rows = []
    if ev.experiment:
        rows.append(("trial", "experiment", _link(run, ev.experiment)))
    for n, fs in ev.files.items():
        for k, rel in fs.items():
            rows.append((n, k, _link(run, rel)))
    out.append(_table(("candidate", "file", "path (relative to the run folder)"), rows))
    if ev.reproduce:
        out.append(f"<p><b>Reproduce:</b> <code>{_e(ev.reproduce)}</code></p>")
    if ev.run_dir:
        out.append(f'<p class="muted">Recorded run folder: <code>{_e(ev.run_dir)}</code></p>')
    return "\n".join(out)


def _link(run: Path, rel: str) -> _Raw:
    p = _safe_rel(run, rel)
    if p is None:
        return _Raw(f"<code>{_e(rel)}</code>")
    exists = "" if p.exists() else ' <span class="bad">(missing)</span>'
    return _Raw(f'<a href="{_e(Path(str(rel)).as_posix())}">{_e(rel)}</a>{exists}')


def _dump(m: BaseModel) -> JsonObject:
    """A row of the record as written (keys it did not set left out)."""
    return m.model_dump(mode="json", by_alias=True, exclude_unset=True)


def _verdict(rec: TrialRecord, n: str) -> Verdict | None:
    return rec.decision.verdict_of(n)


def _series(rec: TrialRecord, label: Callable[[str], str], colors: Callable[[int, str], str]) -> Series:
    """One chart series per candidate of ``rec`` that ran load steps."""
    return [(label(n), colors(i, n), steps) for i, n in enumerate(rec.names())
            if (steps := rec.result(n).ran_steps())]


def _report_body(run: Path, rec: TrialRecord) -> str:
    names = rec.names()
    goal, env = rec.goal, rec.environment
    limits, err_limit, slo_names = _slo_limits(rec)
    colors = _colors(names)
    charts = _Charts()
    series = _series(rec, lambda n: n, lambda i, n: colors[n])
    workloads = list(dict.fromkeys(w for _, _, st in series for w in _workloads(st)))

    out = [f"<h1>servelab trial <code>{_e(rec.trial_id or run.name)}</code></h1>",
           f'<p class="muted">task: {_e(goal.task or "—")} · SLO: {_e(", ".join(slo_names) or "none")}'
           f' · created {_e(_when(rec.created_unix_s))} · {len(names)} candidate(s)</p>',
           '<nav><a href="#decision">decision</a><a href="#charts">charts</a><a href="#cost">cost</a>'
           '<a href="#steps">steps</a>'
           '<a href="#client-server">client vs server</a><a href="#record">record</a></nav>',
           '<div id="js-errors"></div>',
           f'<section id="decision">{_decision_html(rec, names)}</section>',
           '<section id="charts"><h2>Load steps</h2>']
    if series:
        out.append('<p class="muted">Each line is one candidate (colour); dotted = P50, solid = P95, dashed = '
                   "P99. The red dash-dot line is the SLO limit. Skipped steps have no point.</p>")
        pareto = _pareto_fig(rec, names, colors, limits)
        if pareto is not None:
            out.append('<p class="muted">Pareto view: each point is one load step (and repeat) of the ranked '
                       "workload; error bars are 95 % intervals (time blocks of the steady window; order "
                       "statistics of the per-user speeds); the dotted line joins each candidate's "
                       "non-dominated points.</p>")
            out.append(charts.html(pareto, height=440))
        for key, metric, title in LATENCIES:
            out.append(charts.html(_latency_fig(series, key, metric, title, limits, workloads)))
        out.append(charts.html(_throughput_fig(series, workloads)))
        capfig = _capacity_fig(rec, names, colors)
        if capfig is not None:
            out.append(charts.html(capfig, height=380))
        cdf, notes = _ttft_cdf_fig(run, rec, names, limits)
        if cdf is not None:
            out.append(charts.html(cdf, height=400))
        for note in notes:
            out.append(f'<p class="muted">TTFT CDF: {_e(note)}</p>')
        ef = _errors_fig(names, rec)
        if ef is not None:
            out.append(charts.html(ef, height=400))
    else:
        out.append('<p class="bad">No candidate ran a load step, so there are no load charts.</p>')
    for n in names:
        c = rec.result(n)
        if c.ran_steps():
            continue
        status = c.status if n in rec.results.candidates else "not run"
        out.append(f'<p class="muted"><b>{_e(n)}</b>: no load steps ({_e(status)}'
                   f'{": " + _e(c.reason) if c.reason else ""}).</p>')
    cold, missing = _cold_fig(names, rec)
    if cold is not None:
        out.append(charts.html(cold, height=360))
    for n in missing:
        out.append(f'<p class="muted">Cold start of <b>{_e(n)}</b>: not measured (not launched by servelab, '
                   "or it did not start).</p>")
    out.append("</section>")

    out.append('<section id="cost"><h2>Cost, capacity and replicas</h2>')
    out.append(_cost_html(rec, names))
    out.append("</section>")
    out.append('<section id="steps"><h2>Steps per candidate</h2>')
    if err_limit is not None:
        out.append(f'<p class="muted">Error budget: error rate ≤ {_pct(err_limit)} per step.</p>')
    for n in names:
        c = rec.result(n)
        v = _verdict(rec, n)
        out.append(f"<h3>{_e(n)} {_verdict_badge(v.verdict if v else None)}</h3>")
        if c.reason:
            out.append(f'<p class="bad">{_e(c.status)}: {_e(c.reason)}</p>')
        out.append(_steps_table(c))
        arr = c.arrival_run
        if arr is not None and not arr.skipped:
            cnt = arr.counts
            out.append("<p><b>Arrival-rate run</b> (stated rate, bursts and mix):</p>")
            out.append(_table(("step", "submitted", "succeeded", "failed", "TTFT p95 (s)", "E2E p99 (s)",
                               "throughput (out tok/s)", "goodput (out tok/s)", "SLO met"),
                              [(arr.step, cnt.submitted, cnt.succeeded, cnt.failed_total,
                                _with_ci(arr.ttft_s.p95, arr.ttft_s.ci("p95")),
                                _with_ci(arr.e2e_s.p99, arr.e2e_s.ci("p99")),
                                _fmt(arr.throughput.output_tokens_per_s), _fmt(arr.goodput.output_tokens_per_s),
                                {True: "yes", False: "no"}.get(arr.slo_met, "—") if arr.slo_met is not None
                                else "—")],
                              num_cols=range(1, 8)))
    out.append("</section>")

    out.append('<section id="client-server"><h2>Client vs server metrics</h2>'
               '<p class="muted">Client figures are measured by servelab at the socket; server figures are the '
               "engine's own /metrics, sampled during each step (mean and max over the samples). A large gap "
               "in TTFT points at queueing or network outside the engine's own timer.</p>")
    out.append(_client_server_html(names, rec))
    out.append(server_panel_html(rec, names))  # queue, KV, CPU/RSS/GPU, token rates, lifecycle, facts
    out.append("</section>")

    host = env.host
    out.append('<section id="record"><h2>Evidence record (000 §12 rows)</h2>')
    out.append("<h3>Goal</h3>" + _kv(_dump(goal)))
    out.append("<h3>Identity</h3>" + _identity_rows(names, rec))
    out.append("<h3>Environment</h3>" + _table(("field", "value"), [
        ("CPU", host.cpu or "—"), ("logical cores", host.logical_cores or "—"),
        ("RAM", _bytes(host.ram_bytes)), ("OS", host.os or "—"), ("Python", host.python or "—"),
        ("GPU", _Raw(f"<code>{_e(json.dumps(env.gpu, default=str))}</code>") if env.gpu else "none"),
        ("instances", env.instances or "—"), ("parallel layout", env.parallel_layout or "—")]))
    m = _dump(rec.method)
    for k in ("started_unix_s", "finished_unix_s"):
        if k in m:
            m[k] = _when(m[k])
    out.append("<h3>Method</h3>" + _kv(m))
    out.append("<h3>Results</h3>" + _results_rows(rec))
    out.append("<h4>Smoke and quality checks</h4>" + _quality_html(rec))
    out.append("<h3>Evidence</h3>" + _evidence_html(run, rec))
    out.append("<h3>Decision</h3>" + _table(("candidate", "verdict", "reasons"), [
        (n, _verdict_badge(v.verdict if (v := _verdict(rec, n)) else None), "; ".join(v.reasons) if v else "")
        for n in names]))
    out.append("</section>")
    version = str(rec.schema_version) if rec.read_version == rec.schema_version else \
        f"{rec.read_version}, read as {rec.schema_version}"
    out.append(f'<p class="muted">Generated by servelab from record.json (schema '
               f'{_e(version)}) with {charts.count} chart(s). Opens offline.</p>')
    return f'<main data-charts="{charts.count}">' + "\n".join(out) + "</main>"


# ----------------------------------------------------------------------------------------- compare body

def _compare_body(ra: Path, a: TrialRecord, rb: Path, b: TrialRecord) -> str:
    charts = _Charts()
    ida, idb = a.trial_id or ra.name, b.trial_id or rb.name
    la, _, sa = _slo_limits(a)
    lb, _, sb = _slo_limits(b)
    limits = dict(la)
    limits.update({k: v for k, v in lb.items() if k not in limits})
    offset = len(a.names())
    series = (_series(a, lambda n: f"A:{n}", lambda i, n: PALETTE[i % len(PALETTE)])
              + _series(b, lambda n: f"B:{n}", lambda i, n: PALETTE[(offset + i) % len(PALETTE)]))
    workloads = list(dict.fromkeys(w for _, _, st in series for w in _workloads(st)))
    out = [f"<h1>servelab compare: A <code>{_e(ida)}</code> vs B <code>{_e(idb)}</code></h1>",
           f'<p class="muted">A: {_e(ra)} · SLO {_e(", ".join(sa) or "none")}<br>B: {_e(rb)} · SLO '
           f'{_e(", ".join(sb) or "none")}</p>', '<div id="js-errors"></div>',
           '<div class="cols">',
           f"<div><h2>A: {_e(ida)}</h2>{_decision_html(a, a.names(), 'h3')}</div>",
           f"<div><h2>B: {_e(idb)}</h2>{_decision_html(b, b.names(), 'h3')}</div>", "</div>",
           "<h2>Overlaid curves</h2>"]
    if series:
        out.append('<p class="muted">Colour per A:/B: candidate; P95 solid, P99 dashed (E2E). SLO limits from '
                   "A (B where A states none) in red.</p>")
        out.append(charts.html(_latency_fig(series, "ttft_s", "ttft", "TTFT", limits, workloads,
                                            pcts=(("p95", "solid"),))))
        out.append(charts.html(_latency_fig(series, "itl_s", "itl", "ITL (per token)", limits, workloads,
                                            pcts=(("p95", "solid"),))))
        out.append(charts.html(_latency_fig(series, "e2e_s", "e2e", "E2E", limits, workloads,
                                            pcts=(("p99", "dash"),))))
        out.append(charts.html(_throughput_fig(series, workloads)))
    else:
        out.append('<p class="bad">Neither trial has a load step to plot.</p>')
    out.append("<h2>Results</h2><div class='cols'>")
    for tag, rec in (("A", a), ("B", b)):
        out.append(f"<div><h3>{tag}</h3>" + _results_rows(rec) + "</div>")
    out.append("</div>")
    out.append("<h2>What differs between A and B</h2>" + _diff_table(a, b))
    return f'<main data-charts="{charts.count}">' + "\n".join(out) + "</main>"


def _flat(x: JsonValue, prefix: str = "") -> JsonObject:
    if isinstance(x, dict):
        out: JsonObject = {}
        for k, v in x.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: x}


def _diff_table(a: TrialRecord, b: TrialRecord) -> str:
    rows = []
    for section in ("goal", "environment", "method"):
        fa, fb = _flat(_dump(getattr(a, section))), _flat(_dump(getattr(b, section)))
        for k in sorted(set(fa) | set(fb)):
            if k.endswith("_unix_s") or k == "duration_s":
                continue
            if fa.get(k) != fb.get(k):
                rows.append((f"{section}.{k}", json.dumps(fa.get(k), default=str), json.dumps(fb.get(k), default=str)))
    ia, ib = a.identity.candidates, b.identity.candidates
    for n in sorted(set(ia) | set(ib)):
        fa = _flat(_dump(ia[n])) if n in ia else {}
        fb = _flat(_dump(ib[n])) if n in ib else {}
        for k in sorted(set(fa) | set(fb)):
            if fa.get(k) != fb.get(k):
                va, vb = json.dumps(fa.get(k), default=str), json.dumps(fb.get(k), default=str)
                rows.append((f"identity.{n}.{k}", va[:120], vb[:120]))
    if not rows:
        return '<p class="muted">Goal, environment, method and candidate identities are the same.</p>'
    return _table(("field", "A", "B"), rows)


# ----------------------------------------------------------------------------------------- page shell

def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{_e(title)}</title><style>{_CSS}</style>{_ERR_HOOK}"
            f"<script id=\"plotly-js\">{get_plotlyjs()}</script></head>\n<body>{body}</body></html>\n")
