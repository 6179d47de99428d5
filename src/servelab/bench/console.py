"""What ``servelab bench`` shows on the terminal: progress bars while the run goes (:func:`run_with_progress`),
then the table of steps (:func:`print_summary`, latencies in ms, throughput in tok/s) and one stderr line
per generator-bound step or lost worker (:func:`report_generator`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from servelab.bench.results import Summary


__all__ = ["print_summary", "report_generator", "run_with_progress"]

_err = Console(stderr=True)


def _fmt(v: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if v is None else f"{v * scale:.{digits}f}"


def print_summary(summary: Summary, console: Console) -> None:
    """The terminal table: one row per workload × load step (latencies in ms, throughput in tok/s)."""
    t = Table(title=f"servelab bench — {summary.model} @ {summary.base_url}", show_lines=False)
    for col in (
        "workload",
        "step",
        "ok/sent",
        "failed",
        "trunc",
        "TTFT p50",
        "TTFT p95",
        "ITL p50",
        "ITL p95",
        "TPOT p50",
        "E2E p95",
        "out tok/s",
        "good tok/s",
        "req/s",
        "SLO",
    ):
        t.add_column(col, justify="right" if col not in ("workload", "step") else "left")
    for s in summary.steps:
        if s.skipped:
            t.add_row(s.workload, s.step, *["-"] * 12, "skipped")
            continue
        c = s.counts
        fails = ",".join(f"{k}:{v}" for k, v in c.failed.items() if v) or "0"
        slo = "-" if not s.slo else ("met" if s.slo_met else "BROKEN")
        t.add_row(
            s.workload,
            s.step,
            f"{c.succeeded}/{c.submitted}",
            fails,
            str(c.truncated),
            _fmt(s.ttft_s.p50, 1e3),
            _fmt(s.ttft_s.p95, 1e3),
            _fmt(s.itl_s.p50, 1e3),
            _fmt(s.itl_s.p95, 1e3),
            _fmt(s.tpot_s.p50, 1e3),
            _fmt(s.e2e_s.p95, 1e3),
            _fmt(s.throughput.output_tokens_per_s),
            _fmt(s.goodput.output_tokens_per_s),
            _fmt(s.throughput.requests_per_s, digits=2),
            slo,
        )
    console.print(t)
    console.print("latencies in ms; tok/s over each step's window (warmup excluded); tokens from server usage")


def report_generator(summary: Summary) -> bool:
    """Print one stderr line per generator-bound step and per lost worker; True when a worker was lost."""
    lost = False
    for s in summary.steps:
        sat = s.saturation
        if sat is not None and sat.generator_bound:
            _err.print(
                f"warning: {s.workload} {s.step} was generator-bound ({'; '.join(sat.reasons)}): "
                "its figures describe the load generator, not the server; add --workers",
                soft_wrap=True,
            )
        for part in s.lost:
            lost = True
            missing = "unknown" if part.missing is None else part.missing
            _err.print(
                f"error: {s.workload} {s.step}: load-generator worker {part.worker} on {part.host} "
                f"was lost ({part.reason}); its {part.finished} finished requests are counted, "
                f"{missing} missing; the step is marked partial",
                soft_wrap=True,
            )
    return lost


def run_with_progress(
    cfg: Any, objectives: Any, factory: Any, counter: Any, engine_identity: Any, quiet: bool, stop: Any
) -> Summary | None:
    """Run the bench with progress bars; the summary (partial after a stop signal), or ``None`` when
    the run was stopped before it had one."""
    from servelab.bench.bars import Bars
    from servelab.bench.load.runner import Bench

    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[info]}"),
        console=_err,
        disable=quiet,
        transient=False,
    )
    bench = Bench(
        cfg,
        objectives,
        factory,
        counter=counter,
        engine_identity=engine_identity,
        observer=Bars(progress, _err, quiet, counter is None),
        refuse_oversized=True,
    )
    runner: Callable[[Coroutine[Any, Any, Any]], Any] = asyncio.run
    try:
        import uvloop

        runner = uvloop.run  # its event loop when the `fast` extra is installed
    except ImportError:
        pass
    with progress:
        try:
            runner(stop.guard(bench.run()))
        except (KeyboardInterrupt, asyncio.CancelledError):  # SIGINT / SIGTERM (bench.stopping)
            stop.stopped()
            _err.print(
                f"stopped by {stop.name}: every finished request is in "
                f"{cfg.out}/requests.jsonl; partial summary written",
                soft_wrap=True,
            )
    if bench.otlp_note is not None:  # spans not exported: said once, the run's results stand
        _err.print(f"warning: {bench.otlp_note}", soft_wrap=True, markup=False, highlight=False)
    return bench.summary
