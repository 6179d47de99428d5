"""The report's server-side panel per candidate: what the engine itself showed during
each load step — queue length (waiting), running requests, KV-cache use, the process tree's CPU % and
resident memory, GPU memory when an NVIDIA GPU was watched — and the server's output tokens per second
beside the client's with their difference; then the lifecycle figures (cold vs warm start, restart
under load, cancellation), the reliability counters, the identity facts with their sources and the
served-behaviour checks (context, chat template).

:func:`server_panel_html` returns an HTML fragment (tables only, no script) from the typed record
(:class:`~servelab.trial.results.TrialRecord`); :mod:`servelab.trial.report` places it in its
"client vs server" section.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from typing import Any

from servelab.trial.results import CandidateResult, TrialRecord
from servelab.trial.telemetry import StepTelemetry

__all__ = ["server_panel_html"]


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _n(x: Any, digits: int = 3) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return "—"
    v = float(x)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{max(digits - 1, 1)}f}".rstrip("0").rstrip(".")


def _mib(x: Any) -> str:
    return "—" if not isinstance(x, (int, float)) or isinstance(x, bool) else f"{x / 2**20:,.0f} MiB"


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], cls: str = "") -> str:
    """An HTML table; cells are already escaped."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    attr = f' class="{cls}"' if cls else ""
    return f"<table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _mean_max(f: Any, pct: bool = False) -> str:
    if f is None or f.mean is None:
        return "—"
    if pct:
        return f"{f.mean * 100:.0f} % / {(f.max or 0) * 100:.0f} %"
    return f"{_n(f.mean)} / {_n(f.max)}"


def _diff(st: StepTelemetry) -> str:
    t = st.tokens
    if t is None or t.diff_pct is None:
        return "—"
    flag = "ok" if abs(t.diff_pct) <= 2.0 else "bad"
    return f'<span class="{flag}">{t.diff_pct:+.1f} %</span>'


def _telemetry_table(c: CandidateResult) -> str:
    tel = c.telemetry
    assert tel is not None
    gpu = tel.gpu.present
    rows = []
    for label, st in tel.steps.items():
        t = st.tokens
        row = [
            f"<code>{_e(label)}</code>",
            _mean_max(st.waiting),
            _mean_max(st.running),
            _mean_max(st.kv_usage, pct=True),
            _n(st.cpu_percent),
            _mib(st.rss_max_bytes),
        ]
        if gpu:
            row.append(
                " · ".join(
                    f"{g.index}: {_mib(g.memory_used_max_bytes)}, {_n(g.utilization_mean_pct)} %, {_n(g.power_max_w)} W"
                    for g in st.gpus
                )
                or "—"
            )
        row += [
            _n(t.client_output_tokens_per_s) if t else "—",
            _n(t.server_output_tokens_per_s) if t else "—",
            f"{t.client_output_tokens} / {_n(t.server_output_tokens)}" if t else "—",
            _diff(st),
        ]
        rows.append(row)
    heads = [
        "step",
        "queue (waiting) mean / max",
        "running mean / max",
        "KV cache mean / max",
        f"CPU % of one core ({tel.cpu_cores or '?'} cores)",
        "RSS peak",
    ]
    if gpu:
        heads.append("GPU: memory peak, util. mean, power max")
    heads += ["client out tok/s", "server out tok/s", "output tokens client / server", "server − client"]
    return _table(heads, rows, cls="server-panel")


def _gpu_line(c: CandidateResult) -> str:
    tel = c.telemetry
    assert tel is not None
    g = tel.gpu
    if not g.present:
        return f'<p class="muted">GPU: not measured — {_e(g.reason or "no NVIDIA GPU")}.</p>'
    devs = ", ".join(f"{d.index}: {_e(d.name)} ({_mib(d.memory_total_bytes)})" for d in g.devices)
    return (
        f'<p class="muted">GPU (NVML, driver {_e(g.driver_version)}; {_e(g.selected_by)}): {devs}; '
        f"peak memory used {_mib(tel.peak_gpu_memory_bytes)}.</p>"
    )


def _lifecycle_html(c: CandidateResult) -> str:
    lc = c.lifecycle
    if lc is None:
        return ""
    out = []
    w = lc.warm_start
    if w is not None:
        rows = [
            [name, _n(s.port_open_s), _n(s.health_s), _n(s.first_token_s), _n(s.first_request_ttft_s)]
            for name, s in (("cold (first launch)", w.cold), ("warm (second launch)", w.warm))
            if s is not None
        ]
        out.append(
            "<p><b>Cold vs warm start</b> (seconds from process start"
            f"{'; run because the cold start was short' if w.auto else ''}):</p>"
        )
        out.append(_table(("launch", "port open", "ready", "first token", "first request TTFT"), rows))
        out.append(
            f'<p class="muted">Engine caches between starts: {_e(w.engine_caches)}'
            f"{'. Second launch failed: ' + _e(w.error) if w.error else ''}.</p>"
        )
    r = lc.restart_under_load
    if r is not None:
        out.append(
            "<p><b>Restart under load</b>:</p>"
            + _table(
                ("clients", "ok", "failed", "down (s)", "longest gap (s)", "first success after restart (s)"),
                [
                    [
                        str(r.clients),
                        str(r.requests_ok),
                        str(r.requests_failed),
                        _n(r.down_s),
                        _n(r.longest_gap_s),
                        _n(r.first_success_after_restart_s),
                    ]
                ],
            )
        )
    k = lc.cancellation
    if k is not None:
        out.append(
            "<p><b>Cancellation</b> (<code>"
            + _e(k.metric)
            + "</code>):</p>"
            + _table(
                (
                    "clients",
                    "cancelled",
                    "gauge before",
                    "at cancel",
                    "drop (s)",
                    "back to baseline (s)",
                    "kept decoding (s)",
                    "wasted decode (s)",
                    "limit (s)",
                    "verdict",
                    "note",
                ),
                [
                    [
                        str(k.clients),
                        str(k.cancelled),
                        _n(k.baseline),
                        _n(k.running_at_cancel),
                        _n(k.drop_s),
                        _n(k.baseline_return_s),
                        _n(k.decode_after_leave_s),
                        _n(k.wasted_decode_s),
                        _n(k.max_decode_s),
                        _e(k.verdict or ""),
                        _e(k.note or ""),
                    ]
                ],
            )
        )
    if lc.skipped:
        out.append(f'<p class="muted">{_e(lc.skipped)}</p>')
    return "\n".join(out)


def _reliability_html(c: CandidateResult) -> str:
    rel = c.reliability
    if rel is None:
        return ""
    rows = [
        [
            f"<code>{_e(k)}</code>",
            str(v.timeouts),
            str(v.stream_interruptions),
            str(v.connect_errors),
            str(v.http_errors),
            str(v.crashes),
            str(v.ooms),
            str(v.restarts),
        ]
        for k, v in rel.steps.items()
    ]
    head = (
        f"<p><b>Reliability</b> (restart: {_e(rel.restart)}; crashes {rel.crash_count}, OOMs "
        f"{rel.oom_count}, restarts {rel.restart_count}"
        + "".join(f"; recovered in {_n(cr.recovery_s)} s" for cr in rel.crashes if cr.recovered)
        + "):</p>"
    )
    return head + (
        _table(
            (
                "step",
                "timeouts",
                "stream interruptions",
                "connect errors",
                "HTTP errors",
                "crashes",
                "OOMs",
                "restarts",
            ),
            rows,
        )
        if rows
        else ""
    )


def _facts_html(rec: TrialRecord, name: str) -> str:
    facts = rec.ident(name).facts
    if not facts:
        return ""
    rows = [
        [
            f"<code>{_e(k)}</code>",
            _e(f.value if isinstance(f.value, (str, int, float)) else json.dumps(f.value, default=str)),
            _e(f.source),
        ]
        for k, f in sorted(facts.items())
    ]
    return "<p><b>Identity facts</b> (each with how it was learned):</p>" + _table(("fact", "value", "source"), rows)


def _checks_html(c: CandidateResult) -> str:
    ch = c.checks
    if ch is None:
        return ""
    items = []
    if ch.context is not None:
        x = ch.context
        items.append(
            f"context: {_e(x.verdict)}, longest prompt served whole {_n(x.accepted_tokens)} of "
            f"{x.limit_tokens} tokens" + (f" (past it: {_e(x.message)})" if x.message else "")
        )
    if ch.template is not None:
        items.append(f"chat template: {_e(ch.template.verdict)} — {_e(ch.template.note)}")
    items += [f"{_e(k)}: not run — {_e(v)}" for k, v in ch.skipped.items()]
    return "<p><b>Served-behaviour checks</b>:</p><ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>"


def server_panel_html(rec: TrialRecord, names: list[str]) -> str:
    """The server-side panel of every candidate in ``names`` (see the module doc) as one HTML fragment."""
    out = [
        '<div id="server-panel"><h3>Server-side panel</h3>'
        '<p class="muted">Sampled every second and at each step\'s start and end. Queue and running are the '
        "engine's own gauges; CPU % is the launched process tree's CPU seconds over the step (100 = one core "
        "busy); output tokens: the engine's generation counter increase over the step vs the client's "
        "usage.completion_tokens of the succeeded requests (a gap over 2 % is marked).</p>"
    ]
    for n in names:
        c = rec.result(n)
        out.append(f"<h4>{_e(n)}</h4>")
        if c.telemetry is None or not c.telemetry.steps:
            out.append(
                '<p class="muted">No server-side telemetry: the engine was not launched by servelab or no '
                "load step ran.</p>"
            )
        else:
            out.append(_telemetry_table(c))
            out.append(_gpu_line(c))
        out += [x for x in (_lifecycle_html(c), _reliability_html(c), _facts_html(rec, n), _checks_html(c)) if x]
    out.append("</div>")
    return "\n".join(out)
