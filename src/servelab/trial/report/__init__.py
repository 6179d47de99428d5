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

Layout: :mod:`.data` reads, :mod:`.figures` draws, :mod:`.sections` builds each section's tables
(:mod:`.record_rows` the record's rows), :mod:`.pages` assembles a page and renders it with the Jinja
templates in ``templates/``.
"""

from __future__ import annotations

from pathlib import Path

from servelab.trial.report.data import load_record
from servelab.trial.report.pages import compare_body, page, report_body

__all__ = ["load_record", "render_compare", "render_report", "write_compare", "write_report"]


def render_report(run_dir: str | Path) -> str:
    """Return the report of ``run_dir`` as one HTML string (what :func:`write_report` writes).

    Raises :class:`servelab.wire.ConfigError` as :func:`load_record` does.
    """
    run = Path(run_dir)
    rec = load_record(run)
    return page(f"servelab trial {rec.trial_id or run.name}", report_body(run, rec))


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
    return page(f"servelab compare {a.trial_id or ra.name} vs {b.trial_id or rb.name}", compare_body(ra, a, rb, b))


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
