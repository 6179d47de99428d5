"""``servelab trial``, ``servelab report``, ``servelab compare`` (``servelab records`` lives in
:mod:`servelab.trial.records`)."""

from __future__ import annotations

import secrets
import signal
import sys
import time
from pathlib import Path

import typer

from servelab.wire.errors import ConfigError


def trial_command(
    file: str = typer.Argument(
        None,
        help="Experiment YAML (docs/experiment.md). Omit to run the built-in "
        "experiment: llama-server + Gemma 3 270M at 1 slot vs 4 slots.",
    ),
    out: str = typer.Option(None, "--out", "-o", help="Run folder (default runs/trial-YYYYmmdd-HHMMSS-xxxx)."),
    no_report: bool = typer.Option(
        False, "--no-report", help="Skip report.html (write it later with 'servelab report RUN')."
    ),
    no_index: bool = typer.Option(False, "--no-index", help="Do not add the record to the records database."),
    check: bool = typer.Option(
        False,
        "--check",
        help="Only validate the experiment and print it back as YAML (with every default filled in); start nothing.",
    ),
) -> None:
    """Run the selection experiment: launch each candidate, time its cold start, smoke-test the needed
    sub-features, gate on quality, raise load 1, 2, 4, 8 … until an SLO breaks, run the stated arrival
    rate with bursts, then rank and decide. Prints the run folder (record.json, report.html)."""
    from servelab.trial.console import decision_lines
    from servelab.trial.flow import TrialRunner
    from servelab.trial.spec import default_experiment, load_experiment

    exp = load_experiment(file) if file else default_experiment()
    if check:
        print(exp.to_yaml(), end="")
        return
    run_dir = Path(out or f"runs/trial-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}")
    if run_dir.exists() and (run_dir / "record.json").exists():
        raise ConfigError(f"--out {run_dir} already holds a trial (record.json); choose a new folder")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "experiment.yaml").write_text(exp.to_yaml(), encoding="utf-8")
    n = len(exp.candidates)
    print(f"trial {exp.name or ''}: {n} candidate{'s' if n != 1 else ''} -> {run_dir}", flush=True)
    runner = TrialRunner(exp, run_dir, progress=lambda s: print(s, flush=True))
    from servelab.trial.flow import TrialInterrupted

    terminated: list[int] = []

    def _on_sigterm(signum: int, _frame: object) -> None:
        # a service manager's stop (systemd, Kubernetes, a CI timeout) ends the trial as Ctrl-C does: engines
        # stopped, the partial record written; a second SIGTERM ends the process at once
        terminated.append(signum)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_sigterm)
    how = "interrupted"
    try:
        record = runner.run()
    except TrialInterrupted:
        how = "stopped by SIGTERM" if terminated else how
        print(
            f"{how}: partial record {run_dir / 'record.json'} (decision covers finished candidates only); "
            f"`servelab report {run_dir}` renders it",
            file=sys.stderr,
        )
        sys.exit(143 if terminated else 130)
    except KeyboardInterrupt:
        how = "stopped by SIGTERM" if terminated else how
        print(f"{how}: finished steps are kept under {run_dir}/candidates/", file=sys.stderr)
        sys.exit(143 if terminated else 130)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    print("\n".join(decision_lines(record.decision, record.results.candidates)), flush=True)
    if not no_index:
        from servelab.trial.records import index_record

        try:
            index_record(run_dir)
        except Exception as e:  # noqa: BLE001 — the record on disk is what matters
            print(f"note: could not index the record ({e})", file=sys.stderr)
    print(f"record: {run_dir / 'record.json'}")
    if not no_report:
        from servelab.trial.report import write_report

        print(f"report: {write_report(run_dir)}")
    print(f"run folder: {run_dir}")


def report_command(run: str = typer.Argument(..., help="Trial run folder (holds record.json).")) -> None:
    """(Re)generate RUN/report.html from RUN/record.json."""
    from servelab.trial.report import write_report

    print(write_report(Path(run)))


def compare_command(
    run_a: str = typer.Argument(..., help="First trial run folder."),
    run_b: str = typer.Argument(..., help="Second trial run folder."),
    out: str = typer.Option(
        None, "--out", "-o", help="HTML file (default compare-<A>-<B>.html in the current folder)."
    ),
) -> None:
    """Set two trials side by side in one self-contained HTML page."""
    from servelab.trial.report import write_compare

    a, b = Path(run_a), Path(run_b)
    target = Path(out) if out else Path(f"compare-{a.name}-{b.name}.html")
    print(write_compare(a, b, target))
