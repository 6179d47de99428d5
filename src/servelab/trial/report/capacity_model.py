"""The report's capacity-model section (``results.candidates.NAME.capacity_model``,
:mod:`servelab.capacity.trialmodel`): per candidate the fitted law with its 95 % bootstrap intervals,
every held-out step predicted vs measured with the error, the check against the capacity search, and
one chart of predicted vs measured (TTFT P50/P95 and output tokens/s, each relative to what was
measured, so the three share one axis: 1 is a perfect prediction)."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go

from servelab.bench.results import Interval
from servelab.capacity.results import CandidateCapacity, Prediction
from servelab.trial.report.fmt import ci_text, esc
from servelab.trial.report.sections import Table, table
from servelab.trial.results import TrialRecord

__all__ = ["ModelSection", "model_fig", "model_sections"]

#: the predicted figures of a held-out step: (attribute, label, scale to display, unit)
FIGURES = (
    ("ttft_p50_s", "TTFT P50", 1e3, "ms"),
    ("ttft_p95_s", "TTFT P95", 1e3, "ms"),
    ("output_tps", "out tok/s", 1.0, ""),
)


@dataclass(frozen=True)
class ModelSection:
    """One candidate's capacity model as the template shows it."""

    name: str
    law: Table
    held_out: Table
    summary: str
    search: str | None
    check: str | None
    notes: list[str]


def _models(rec: TrialRecord, names: list[str]) -> list[tuple[str, CandidateCapacity]]:
    return [(n, m) for n in names if (m := rec.result(n).capacity_model) is not None]


def _law(m: CandidateCapacity) -> Table:
    f, p = m.fit, m.fit.params
    rate = "not identifiable" if p.prefill_tokens_per_s is None else f"{p.prefill_tokens_per_s:.4g}"
    rows = [
        ("prefill base (ms)", f"{p.prefill_base_s * 1e3:.3g}", ci_text(_scaled(f.prefill_base_ci, 1e3))),
        ("prefill rate (new prompt tok/s)", rate, ci_text(f.prefill_rate_ci) if f.prefill_rate_ci else "—"),
        ("decode gap at batch 1 (ms/token)", f"{p.decode_base_s * 1e3:.3g}", ci_text(_scaled(f.decode_base_ci, 1e3))),
        (
            "decode gap per other running request (ms/token)",
            f"{p.decode_per_running_s * 1e3:.3g}",
            ci_text(_scaled(f.decode_per_running_ci, 1e3)),
        ),
        (
            "slots",
            f"{p.slots} ({'identified' if p.slots_identified else 'lower bound'})",
            f"seen {f.seen_slots}" + ("" if f.declared_slots is None else f", declared {f.declared_slots}"),
        ),
        (
            "prefill serial (decode waits for prompts)",
            "yes" if p.prefill_serial else "no",
            "" if f.prefill_stall is None else f"stall {f.prefill_stall:.2f} s/s, {ci_text(f.prefill_stall_ci)}",
        ),
    ]
    rows += [
        (f"first-token extra: {w} (ms)", f"{x * 1e3:.3g}", "median of the law's residual")
        for w, x in p.first_token_extra_s.items()
    ]
    return table(["parameter", "fitted", "interval / basis"], rows, [1])


def _scaled(ci: Interval | None, k: float) -> Interval | None:
    if ci is None:
        return None
    return ci.model_copy(
        update={"lo": None if ci.lo is None else ci.lo * k, "hi": None if ci.hi is None else ci.hi * k}
    )


def _cell(pr: Prediction, scale: float, unit: str) -> str:
    err = "" if pr.error is None else f" ({pr.error * 100:+.0f} %)"
    sp = f" {unit}" if unit else ""
    meas = "—" if pr.measured is None else f"{pr.measured * scale:.4g}{sp}"
    return f"{pr.predicted * scale:.4g}{sp} vs {meas}{err}"


def _held_out(m: CandidateCapacity) -> Table:
    rows = []
    for c in m.validation.steps if m.validation else []:
        load = f"c{c.concurrency}" if c.concurrency else "open loop"
        rows.append([c.step, load, str(c.requests)] + [_cell(getattr(c, a), s, u) for a, _, s, u in FIGURES])
    return table(
        ["held-out step", "load", "requests"] + [f"{lab}: predicted vs measured" for _, lab, _, _ in FIGURES], rows, [2]
    )


def model_sections(rec: TrialRecord, names: list[str]) -> list[ModelSection]:
    """Every candidate with a capacity model, in ``names`` order."""
    out = []
    for n, m in _models(rec, names):
        v = m.validation
        summary = f"fitted on {m.fit.requests} requests of {len(m.fit.steps)} steps; every step held out in turn: " + (
            "fewer than two steps, no validation"
            if v is None or v.median_abs_error is None
            else f"median |error| {v.median_abs_error:.0%}, max {v.max_abs_error or 0:.0%} over "
            f"{len(v.steps)} steps x 3 figures"
        )
        sc = m.search
        search = None
        if sc is not None:
            lo = "—" if sc.measured_held_rps is None else f"{sc.measured_held_rps:.3g}"
            hi = "open" if sc.measured_broke_rps is None else f"{sc.measured_broke_rps:.3g}"
            search = (
                f"capacity search held {lo} req/s, broke at {hi}; under the model probes of {sc.probe_requests} "
                f"requests hold up to {sc.model_capacity_rps or 0:.3g} req/s ({ci_text(sc.model_capacity_ci)}); "
                f"{sc.probes_agreeing}/{len(sc.probes)} probe verdicts reproduced: "
                f"{'agrees' if sc.agrees else 'disagrees'}. Sustained (long-run) capacity under the model: "
                f"{sc.sustained_capacity_rps or 0:.3g} req/s"
            )
        ck = m.check
        check = None
        if ck is not None:
            check = f"extra point at {ck.rate_rps:.3g} req/s ({ck.reason})" + (
                f": {ck.note}"
                if ck.note
                else f"; predicted {'held' if ck.predicted_held else 'broke'}, measured "
                f"{'held' if ck.measured_held else 'broke'}"
                + (
                    ""
                    if ck.step is None
                    else "; " + "; ".join(f"{lab} {_cell(getattr(ck.step, a), s, u)}" for a, lab, s, u in FIGURES)
                )
            )
        out.append(ModelSection(n, _law(m), _held_out(m), summary, search, check, list(m.fit.notes)))
    return out


def model_fig(rec: TrialRecord, names: list[str], colors: dict[str, str]) -> go.Figure | None:
    """Predicted / measured for every held-out step (x: the step; candidates by colour), one marker per
    figure, error bars from the prediction interval; ``None`` when no candidate has a validated model."""
    fig = go.Figure()
    symbols = {"ttft_p50_s": "circle", "ttft_p95_s": "diamond", "output_tps": "square"}
    drawn = False
    for n, m in _models(rec, names):
        steps = m.validation.steps if m.validation else []
        for attr, lab, _, _ in FIGURES:
            xs, ys, lo, hi = [], [], [], []
            for c in steps:
                pr: Prediction = getattr(c, attr)
                if not pr.measured:
                    continue
                r = pr.predicted / pr.measured
                xs.append(c.step)
                ys.append(r)
                iv = pr.interval
                lo.append(r - iv.lo / pr.measured if iv and iv.lo is not None else 0.0)
                hi.append(iv.hi / pr.measured - r if iv and iv.hi is not None else 0.0)
            if not xs:
                continue
            drawn = True
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers",
                    name=f"{n} {lab}",
                    marker={"color": colors[n], "size": 9, "symbol": symbols[attr]},
                    error_y={"type": "data", "array": hi, "arrayminus": lo, "visible": True, "thickness": 1},
                    hovertemplate="%{x}: predicted / measured %{y:.2f}<extra>" + esc(f"{n} {lab}") + "</extra>",
                )
            )
    if not drawn:
        return None
    fig.add_hline(y=1.0, line={"color": "#555", "dash": "dash", "width": 1}, annotation_text="prediction = measurement")
    fig.add_hrect(y0=0.9, y1=1.1, fillcolor="#888", opacity=0.12, line_width=0)
    fig.update_layout(
        title="Capacity model: every load step held out and predicted (predicted / measured; band ±10 %)",
    )
    fig.update_xaxes(title_text="held-out step", tickangle=-40)
    fig.update_yaxes(title_text="predicted / measured", rangemode="tozero")
    return fig
