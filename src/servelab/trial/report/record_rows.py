"""The §12 record rows of the report as :class:`~servelab.trial.report.sections.Table` s: the candidates'
identities, the environment, the method, the results, the smoke and quality checks, the evidence files
(linked, marked when missing), the verdicts, and what differs between two trials (the compare page).
They restate the record field by field, where :mod:`servelab.trial.report.sections` builds the views
that argue the decision; both use its cells (:func:`~servelab.trial.report.sections.table`, badges,
code).
"""

from __future__ import annotations

import json
from pathlib import Path

from markupsafe import Markup

from servelab.trial.report.data import dump, flat, safe_rel
from servelab.trial.report.fmt import fmt, pct, size, when, with_ci
from servelab.trial.report.sections import Cell, Table, badge, code, kv, table
from servelab.trial.results import TrialRecord

__all__ = [
    "diff_table",
    "environment_table",
    "evidence_table",
    "identity_table",
    "link",
    "method_table",
    "quality_table",
    "results_table",
    "verdicts_table",
]


def identity_table(names: list[str], rec: TrialRecord) -> Table:
    rows = []
    for n in names:
        i = rec.ident(n)
        eng, model = i.engine, i.model or {}
        sha = str(model.get("sha256") or "")
        bsha = str((eng.binary_sha256 if eng is not None else None) or "")
        path = model.get("path")
        rows.append(
            (
                n,
                eng.kind if eng is not None else "—",
                (eng.version if eng is not None else None) or "—",
                bsha[:12] or "—",
                Path(str(path)).name if path else "—",
                sha[:12] or "—",
                code(json.dumps(i.settings, default=str)) if i.settings else "—",
                i.url or "launched by servelab",
            )
        )
    return table(
        ("candidate", "engine", "engine version", "binary sha256", "model", "model sha256", "settings", "URL"), rows
    )


def environment_table(rec: TrialRecord) -> Table:
    env = rec.environment
    host = env.host
    return table(
        ("field", "value"),
        [
            ("CPU", host.cpu or "—"),
            ("logical cores", host.logical_cores or "—"),
            ("RAM", size(host.ram_bytes)),
            ("OS", host.os or "—"),
            ("Python", host.python or "—"),
            ("GPU", code(json.dumps(env.gpu, default=str)) if env.gpu else "none"),
            ("instances", env.instances or "—"),
            ("parallel layout", env.parallel_layout or "—"),
        ],
    )


def method_table(rec: TrialRecord) -> Table:
    m = dump(rec.method)
    for k in ("started_unix_s", "finished_unix_s"):
        if k in m:
            m[k] = when(m[k])
    return kv(m)


def results_table(rec: TrialRecord) -> Table:
    rows = []
    for n in rec.names():
        c = rec.result(n)
        tl, eff = c.tail_latency, c.effective_throughput
        qtxt = ("passed" if c.quality.passed else "failed") if c.quality is not None else "not run"
        bad_smoke = [k for k, v in c.smoke.items() if not v.ok]
        stxt = ("failed: " + ", ".join(bad_smoke)) if bad_smoke else ("passed" if c.smoke else "not run")
        rows.append(
            (
                n,
                c.status or "—",
                c.reason or "",
                stxt,
                qtxt,
                pct(c.error_rate),
                with_ci(tl.ttft_p95_s, tl.ttft_p95_ci) if tl else "—",
                with_ci(tl.itl_p95_s, tl.itl_p95_ci) if tl else "—",
                with_ci(tl.e2e_p99_s, tl.e2e_p99_ci) if tl else "—",
                with_ci(eff.output_tokens_per_s, eff.output_tokens_per_s_ci) if eff else "—",
                fmt(eff.goodput_output_tokens_per_s if eff else None),
                (eff.at_step if eff else None) or "—",
                c.broken_at or "—",
                size(c.peak_rss_bytes),
                size(c.peak_gpu_memory_bytes),
                fmt(c.cost.per_1m_output_tokens if c.cost else None),
            )
        )
    return table(
        (
            "candidate",
            "status",
            "reason",
            "smoke",
            "quality",
            "error rate",
            "TTFT p95 (s)",
            "ITL p95 (s)",
            "E2E p99 (s)",
            "eff. throughput (out tok/s)",
            "eff. goodput (out tok/s)",
            "at step",
            "broken at",
            "peak RSS",
            "peak GPU memory",
            f"cost ({rec.goal.budget.currency or 'USD'}/1M out tok)",
        ),
        rows,
        num_cols=(5, 6, 7, 8, 9, 10, 13, 14, 15),
    )


def quality_table(rec: TrialRecord) -> Table | None:
    rows: list[tuple[Cell, ...]] = []
    ok_html, bad_html = Markup('<span class="ok">ok</span>'), Markup('<span class="bad">failed</span>')
    for n in rec.names():
        c = rec.result(n)
        for k, v in c.smoke.items():
            rows.append((n, f"smoke: {k}", ok_html if v.ok else bad_html, v.detail, "", ""))
        for ch in c.quality.checks if c.quality is not None else []:
            rows.append((n, f"quality: {ch.name}", ok_html if ch.ok else bad_html, "", fmt(ch.value), fmt(ch.limit)))
    if not rows:
        return None
    return table(("candidate", "check", "result", "detail", "value", "limit"), rows, num_cols=(4, 5))


def link(run: Path, rel: str) -> Markup:
    """A relative link to an evidence file, marked when the file is missing."""
    p = safe_rel(run, rel)
    if p is None:
        return code(rel)
    exists = Markup("") if p.exists() else Markup(' <span class="bad">(missing)</span>')
    return Markup('<a href="{}">{}</a>{}').format(Path(str(rel)).as_posix(), rel, exists)


def evidence_table(run: Path, rec: TrialRecord) -> Table:
    ev = rec.evidence
    rows: list[tuple[Cell, ...]] = []
    if ev.experiment:
        rows.append(("trial", "experiment", link(run, ev.experiment)))
    for n, fs in ev.files.items():
        for k, rel in fs.items():
            rows.append((n, k, link(run, rel)))
    return table(("candidate", "file", "path (relative to the run folder)"), rows)


def verdicts_table(rec: TrialRecord, names: list[str]) -> Table:
    return table(
        ("candidate", "verdict", "reasons"),
        [
            (n, badge(v.verdict if (v := rec.decision.verdict_of(n)) else None), "; ".join(v.reasons) if v else "")
            for n in names
        ],
    )


def diff_table(a: TrialRecord, b: TrialRecord) -> Table | None:
    """What differs between two trials' goal, environment, method and candidate identities."""
    rows = []
    for section in ("goal", "environment", "method"):
        fa, fb = flat(dump(getattr(a, section))), flat(dump(getattr(b, section)))
        for k in sorted(set(fa) | set(fb)):
            if k.endswith("_unix_s") or k == "duration_s":
                continue
            if fa.get(k) != fb.get(k):
                rows.append((f"{section}.{k}", json.dumps(fa.get(k), default=str), json.dumps(fb.get(k), default=str)))
    ia, ib = a.identity.candidates, b.identity.candidates
    for n in sorted(set(ia) | set(ib)):
        fa = flat(dump(ia[n])) if n in ia else {}
        fb = flat(dump(ib[n])) if n in ib else {}
        for k in sorted(set(fa) | set(fb)):
            if fa.get(k) != fb.get(k):
                va, vb = json.dumps(fa.get(k), default=str), json.dumps(fb.get(k), default=str)
                rows.append((f"identity.{n}.{k}", va[:120], vb[:120]))
    return table(("field", "A", "B"), rows) if rows else None
