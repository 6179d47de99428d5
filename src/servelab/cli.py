"""The ``servelab`` command line. Subcommands live next to the part they drive; this module only
wires them together and turns :class:`~servelab.wire.ConfigError` into one line + exit code 2."""

from __future__ import annotations

import sys

import typer

from servelab import __version__

app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                  help="servelab: choose an LLM inference engine by honest measurement.")


@app.callback()
def _root(version: bool = typer.Option(False, "--version", help="Print the version and exit.")) -> None:
    if version:
        typer.echo(__version__)
        raise typer.Exit()


def _register() -> None:
    from servelab.bench.cli import bench_command, summarize_command
    from servelab.engines.cli import engine_app
    from servelab.engines.mock import mock_engine_command

    app.command("bench")(bench_command)
    app.command("summarize")(summarize_command)
    app.command("mock-engine")(mock_engine_command)
    app.add_typer(engine_app, name="engine")
    from servelab.trial.cli import compare_command, report_command, trial_command

    app.command("trial")(trial_command)
    app.command("report")(report_command)
    app.command("compare")(compare_command)
    from servelab.trial.records import records_app

    app.add_typer(records_app, name="records")
    from servelab.gateway.cli import gateway_command
    from servelab.gateway.keys_cli import keys_app

    app.command("gateway")(gateway_command)
    app.add_typer(keys_app, name="keys")
    from servelab.gateway.embedder import embed_engine_command

    app.command("embed-engine")(embed_engine_command)
    from servelab.advise.cli import advise_command
    from servelab.catalog.cli import catalog_app

    app.add_typer(catalog_app, name="catalog")
    app.command("advise")(advise_command)
    from servelab.plan.cli import plan_command

    app.command("plan")(plan_command)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``servelab`` console script."""
    from servelab.wire.client import ConfigError

    _register()
    try:
        app(args=argv, standalone_mode=True)
    except ConfigError as e:
        print(f"servelab: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
