"""``servelab gateway``: run the OpenAI-compatible gateway from a config file until SIGINT/SIGTERM.

Prints ``servelab gateway listening on http://HOST:PORT/v1 (admin http://HOST:PORT2)`` once both ports are
bound (tests and scripts wait for that line). SIGHUP or saving the file reloads the config atomically.
``--workers N`` runs N gateway processes on the same port under a supervisor (:mod:`servelab.gateway.workers`;
N > 1 needs ``state.redis_url``); the line then ends with ``[N workers: pids ...]``.

``servelab gateway shadow-report``: the old-vs-new report of shadow traffic from a running gateway's admin
port (``GET /admin/shadow``, :mod:`servelab.gateway.shadow`), as a table or ``--json``.

``servelab gateway explain REQUEST_ID --log ACCESS_LOG``: one request's timeline and a one-line diagnosis of
where its time went (:mod:`servelab.gateway.explain`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer

from servelab.wire.errors import ConfigError
from servelab.wire.files import install_uvloop

__all__ = [
    "alerts_command",
    "dashboard_command",
    "explain_command",
    "gateway_app",
    "gateway_command",
    "serve",
    "shadow_report_command",
]


def _cpus() -> int:
    """CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


gateway_app = typer.Typer(
    add_completion=False,
    rich_markup_mode=None,
    help="Run the OpenAI-compatible gateway (--config FILE), or report on a running one.",
)


def serve(
    config_path: str | Path,
    host: str | None = None,
    port: int | None = None,
    admin_port: int | None = -1,
    no_admin: bool = False,
    admin_host: str | None = None,
    worker: int | None = None,
) -> None:
    """Load ``config_path`` and serve until SIGINT/SIGTERM (blocking; uvloop when installed).

    ``admin_port`` -1 = from the file; ``no_admin`` runs no admin app; ``admin_host`` None = the file's
    ``server.admin_host`` (default 127.0.0.1, whatever ``host`` is). Raises :class:`ConfigError` for a
    bad config, a missing admin token or a port that cannot be bound. ``worker``: this process's index
    under a :class:`~servelab.gateway.workers.Supervisor` (None = the only process).
    """
    from servelab.gateway.config import load_config
    from servelab.gateway.server import Gateway

    cfg = load_config(config_path)
    uv = install_uvloop()
    parent = os.getppid()  # a worker's supervisor: when it changes, the supervisor has died

    async def main() -> None:
        gw = Gateway(
            cfg,
            config_path,
            host=host,
            port=port,
            admin_port=None if no_admin else admin_port,
            admin_host=admin_host,
            worker=worker,
        )
        try:
            await gw.start()
        except OSError as e:
            await gw.close()
            raise ConfigError(
                f"cannot listen on {gw.host}:{gw.port} or the admin port {gw.admin_host}:"
                f"{gw.admin_port}: {e.strerror or e}; pick a free port with --port/--admin-port "
                "and an address of this host with --host/--admin-host"
            ) from None
        except ConfigError:
            await gw.close()
            raise
        # everything loaded so far (modules, config, app) lives as long as the process: move it out of the
        # cyclic GC's generations so collections during streaming stay short (a full collection otherwise
        # walks every imported module's objects) — https://docs.python.org/3/library/gc.html#gc.freeze
        gc.collect()
        gc.freeze()
        stop = asyncio.Event()
        gw.install_signal_handlers(lambda: _on_stop(gw, stop, worker, parent))
        admin = f" (admin http://{gw.admin_host}:{gw.admin_port})" if gw.admin_port is not None else ""
        print(
            f"servelab gateway listening on http://{gw.host}:{gw.port}/v1{admin}{' [uvloop]' if uv else ''}", flush=True
        )
        try:
            await stop.wait()
        finally:
            await gw.close()

    asyncio.run(main())


def _on_stop(gw: Any, stop: asyncio.Event, worker: int | None, parent: int) -> None:
    """SIGTERM/SIGINT: the first starts the shutdown and its watchdog (``shutdown_grace_s`` + ``OVERRUN_S``,
    :mod:`servelab.gateway.shutdown`). One during the shutdown hurries it (cuts the requests in flight, exits
    within ``HURRY_S``) when no one is left to wait for: a worker whose supervisor died (the kernel's
    ``PR_SET_PDEATHSIG`` SIGTERM), or a gateway run alone (a second Ctrl-C; a third exits at once). A worker
    whose supervisor lives ignores a repeat (a Ctrl-C it got from the terminal, then the supervisor's SIGTERM)."""
    from servelab.gateway.shutdown import OVERRUN_S

    sd = gw.shutdown
    if not stop.is_set():
        stop.set()
        sd.arm(gw.config.server.shutdown_grace_s + OVERRUN_S)
    elif worker is not None and os.getppid() != parent:
        sd.hurry("the supervisor is gone")
    elif worker is None and not sd.hurried:
        sd.hurry("a second stop signal")
    elif worker is None:
        sd.exit_now(f"a third stop signal during the shutdown (step '{sd.step_name}')")


@gateway_app.callback(invoke_without_command=True)
def gateway_command(
    ctx: typer.Context,
    config: Path | None = typer.Option(
        None, "--config", "-c", help="Gateway YAML file (example: examples/gateway.yaml); required to run the gateway."
    ),
    host: str | None = typer.Option(None, "--host", help="Address to bind [default: server.host of the file]."),
    port: int | None = typer.Option(None, "--port", help="API port; 0 = a free port [default: server.port]."),
    admin_port: int | None = typer.Option(None, "--admin-port", help="Admin API port [default: server.admin_port]."),
    admin_host: str | None = typer.Option(
        None,
        "--admin-host",
        help="Address the admin API binds [default: server.admin_host, 127.0.0.1; --host does not change it].",
    ),
    no_admin: bool = typer.Option(False, "--no-admin", help="Run without the admin API."),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error (stderr)."),
    workers: str = typer.Option(
        "1",
        "--workers",
        help="Gateway processes serving the one port (SO_REUSEPORT), "
        "each with its own event loop; 'auto' = one per CPU this process may use "
        f"({_cpus()} here) when state.redis_url is set, else 1. N > 1 needs "
        "state.redis_url (limits, budgets and breakers shared in Redis).",
    ),
    worker_index: int | None = typer.Option(
        None, "--worker-index", hidden=True, help="Set by the supervisor: this worker's index."
    ),
) -> None:
    """Run the OpenAI-compatible gateway over the engines in --config (SIGHUP or a saved file reloads it)."""
    if ctx.invoked_subcommand is not None:
        return
    if config is None:
        raise ConfigError(
            "servelab gateway needs --config FILE (example: examples/gateway.yaml); "
            "or run `servelab gateway shadow-report` against a running gateway"
        )
    level = getattr(logging, log_level.upper(), None)
    if not isinstance(level, int):
        raise ConfigError(f"--log-level {log_level!r} is not one of debug, info, warning, error")
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if worker_index is None and workers != "1":
        from servelab.gateway.config import load_config
        from servelab.gateway.workers import Supervisor, check_workers, parse_workers, shared_core_warning

        n = parse_workers(workers)
        cfg = load_config(config)
        if workers == "auto" and not cfg.state.redis_url and n > 1:
            logging.getLogger("servelab.gateway").warning(
                "--workers auto: 1 worker, not %d: limits are in memory without state.redis_url and cannot be "
                "shared; set state.redis_url to run on every core",
                n,
            )
            n = 1
        check_workers(n, cfg.state.redis_url)
        warning = shared_core_warning(n, parse_workers("auto"))
        if warning:
            logging.getLogger("servelab.gateway").warning("%s", warning)
        if n > 1:
            sup = Supervisor(
                config,
                n,
                host or cfg.server.host,
                cfg.server.port if port is None else port,
                None if no_admin else (-1 if admin_port is None else admin_port),
                admin_host,
                cfg.server.shutdown_grace_s,
                log_level,
            )
            raise typer.Exit(sup.run())
    serve(config, host, port, -1 if admin_port is None else admin_port, no_admin, admin_host, worker_index)


@gateway_app.command("shadow-report")
def shadow_report_command(
    admin_url: str | None = typer.Option(
        None, "--admin-url", help="The gateway's admin URL [default: $SERVELAB_ADMIN_URL or http://127.0.0.1:8081]."
    ),
    token_env: str = typer.Option(
        "SERVELAB_ADMIN_TOKEN", "--token-env", help="Environment variable holding the admin token."
    ),
    model: str | None = typer.Option(None, "--model", help="Only this public model."),
    agree: float = typer.Option(0.9, "--agree", help="Text similarity (0-1) that counts as the same answer."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Old (primary) vs new (shadow) per model: TTFT/E2E percentiles, token and text differences."""
    import urllib.parse

    import orjson

    from servelab.gateway.keys_cli import admin_request
    from servelab.gateway.shadow import ShadowReport

    q = urllib.parse.urlencode({"agree": agree, **({"model": model} if model else {})})
    rep = ShadowReport.model_validate(admin_request("GET", f"/admin/shadow?{q}", admin_url, token_env))
    if as_json:
        print(orjson.dumps(rep.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode())
        return
    print(format_shadow_report(rep))


def format_shadow_report(rep: Any) -> str:
    """``rep`` (:class:`~servelab.gateway.shadow.ShadowReport`) as a plain-text table: per model one row
    per side (targets, n, TTFT and E2E P50/P99 in ms, mean completion tokens, errors) and a line of
    deltas (shadow - primary) with the text agreement rate."""
    from rich.console import Console
    from rich.table import Table

    if not rep.models:
        return (
            "no shadow samples yet: set models.<name>.shadow (target, sample_rate > 0) and send traffic; "
            "each replica reports the requests it mirrored"
        )
    console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115 - rendered to text
    for m in rep.models:
        t = Table(title=f"{m.model}: {m.samples} mirrored, {m.compared} compared (both complete)")
        for col in (
            "side",
            "targets",
            "n",
            "TTFT P50 ms",
            "TTFT P99 ms",
            "E2E P50 ms",
            "E2E P99 ms",
            "tokens mean",
            "errors",
        ):
            t.add_column(col)
        for name, side in (("primary (old)", m.primary), ("shadow (new)", m.shadow)):
            t.add_row(
                name,
                ", ".join(side.targets),
                str(side.e2e_ms.n if side.e2e_ms else 0),
                _ms(side.ttft_ms, "p50_ms"),
                _ms(side.ttft_ms, "p99_ms"),
                _ms(side.e2e_ms, "p50_ms"),
                _ms(side.e2e_ms, "p99_ms"),
                _num(side.completion_tokens_mean),
                str(side.errors),
            )
        console.print(t)
        console.print(
            f"shadow - primary: TTFT P50 {_delta(m.ttft_p50_delta_ms)} ms, P99 "
            f"{_delta(m.ttft_p99_delta_ms)} ms; E2E P50 {_delta(m.e2e_p50_delta_ms)} ms, P99 "
            f"{_delta(m.e2e_p99_delta_ms)} ms; completion tokens {_delta(m.completion_tokens_delta_mean)} "
            f"per request; text agreement "
            f"{_pct(m.text_agreement_rate)} (similarity >= {rep.agree_threshold}), identical "
            f"{_pct(m.text_exact_rate)}, mean similarity {_num(m.text_similarity_mean)}"
        )
    return console.export_text()


def _ms(s: Any, attr: str) -> str:
    return "-" if s is None else f"{getattr(s, attr):.1f}"


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}" if abs(v) >= 1 else f"{v:.3f}"


def _delta(v: float | None) -> str:
    return "-" if v is None else f"{v:+.1f}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.1f}%"


@gateway_app.command("explain")
def explain_command(
    request_id: str = typer.Argument(..., help="The X-Request-ID the gateway answered with (or the client's own)."),
    log: Path | None = typer.Option(None, "--log", help="The access log (server.access_log) to read."),
    config: Path | None = typer.Option(
        None, "--config", "-c", help="The gateway's config: its server.access_log is read (when --log is not given)."
    ),
    ttft_slo_s: float | None = typer.Option(
        None, "--ttft-slo-s", help="TTFT objective (seconds) to quote in the diagnosis."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the access-log line, rows and diagnosis as JSON."),
) -> None:
    """Where one request's time went: its timeline from the access log and a one-line diagnosis."""
    import orjson

    from servelab.gateway.explain import explain, find_record, format_explanation

    if ttft_slo_s is not None and not ttft_slo_s > 0:
        raise ConfigError(f"--ttft-slo-s must be > 0 seconds, got {ttft_slo_s}")
    if log is None:
        if config is None:
            raise ConfigError(
                "servelab gateway explain needs --log ACCESS_LOG or --config FILE (whose server.access_log is read)"
            )
        from servelab.gateway.config import load_config

        where = load_config(config).server.access_log
        if not where or where == "-":
            raise ConfigError(
                f"{config}: server.access_log is {where or 'off'!r}, not a file; nothing to read "
                "(pass the file with --log)"
            )
        log = Path(where)
    rec = find_record(log, request_id)
    exp = explain(rec, ttft_slo_s)
    if as_json:
        print(
            orjson.dumps(
                {
                    "record": rec,
                    "rows": exp.rows,
                    "diagnosis": exp.diagnosis,
                    "cause": exp.cause,
                    "parts_ms": exp.parts_ms,
                },
                option=orjson.OPT_INDENT_2,
            ).decode()
        )
        return
    print(format_explanation(rec, exp))


@gateway_app.command("alerts")
def alerts_command() -> None:
    """Print the gateway's Prometheus alert rules (a rule file; docs/alerts.md: each rule's runbook line)."""
    from servelab.gateway.alerts import rules_text

    print(rules_text(), end="")


@gateway_app.command("dashboard")
def dashboard_command() -> None:
    """Print the gateway's Grafana dashboard JSON (import it as is; the Prometheus data source is a variable)."""
    from servelab.gateway.dashboards import dashboard_text

    print(dashboard_text(), end="")
