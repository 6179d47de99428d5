"""The ``servelab`` command line. Subcommands live next to the part they drive; this module only
wires them together and turns :class:`~servelab.wire.ConfigError` into one line + exit code 2."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from servelab import __version__
from servelab.lazy_commands import LazyCommand, lazy_group

if TYPE_CHECKING:
    from servelab.wire.config import PublishedSchema

#: Every subcommand but ``schema``: imported only when it runs (:mod:`servelab.lazy_commands`, so a
#: start does not import them all). The summary is its line in ``servelab --help``.
COMMANDS: dict[str, LazyCommand] = {
    "bench": LazyCommand(
        "servelab.bench.cli", "bench_command", "Load-test an OpenAI-compatible server: latency, goodput."
    ),
    "summarize": LazyCommand(
        "servelab.bench.cli", "summarize_command", "Rebuild a bench run's summary.json from its requests.jsonl."
    ),
    "mock-engine": LazyCommand(
        "servelab.engines.mock.cli",
        "mock_engine_command",
        "Run a mock OpenAI-compatible engine (deterministic tokens).",
    ),
    "trial": LazyCommand(
        "servelab.trial.cli", "trial_command", "Run the selection experiment over the candidate engines."
    ),
    "report": LazyCommand("servelab.trial.cli", "report_command", "(Re)generate RUN/report.html from RUN/record.json."),
    "compare": LazyCommand(
        "servelab.trial.cli", "compare_command", "Set two trials side by side in one self-contained HTML page."
    ),
    "gateway": LazyCommand(
        "servelab.gateway.cli", "gateway_app", "Run the OpenAI-compatible gateway in front of engines."
    ),
    "embed-engine": LazyCommand(
        "servelab.engines.embedder",
        "embed_engine_command",
        "Serve all-MiniLM-L6-v2 as an OpenAI /v1/embeddings engine.",
    ),
    "advise": LazyCommand(
        "servelab.advise.cli", "advise_command", "Which engines to verify first for a task, model, hardware."
    ),
    "plan": LazyCommand(
        "servelab.plan.cli", "plan_command", "Plan memory per device: fit, max sequences, roofline floors."
    ),
    "engine": LazyCommand(
        "servelab.engines.cli", "engine_app", "Build, install, start and describe inference engines."
    ),
    "records": LazyCommand("servelab.trial.records", "records_app", "List, show and compare past trials."),
    "keys": LazyCommand(
        "servelab.gateway.keys_cli", "keys_app", "Create, list and revoke gateway API keys (admin port)."
    ),
    "catalog": LazyCommand(
        "servelab.catalog.cli", "catalog_app", "The engine, model and hardware catalogs to select from."
    ),
    "doctor": LazyCommand(
        "servelab.doctor_cli", "doctor_command", "Check what the trial and the tests need on this host."
    ),
    "capacity": LazyCommand(
        "servelab.capacity.cli", "capacity_command", "Traffic to peak load, replicas and cost, from evidence."
    ),
}

app = typer.Typer(
    cls=lazy_group(COMMANDS),
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="servelab: choose an LLM inference engine by honest measurement.",
)


def _print_version(value: bool) -> None:
    """``--version``: eager, so it answers before click asks for a subcommand."""
    if value:
        typer.echo(__version__)
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_print_version, help="Print the version and exit."
    ),
) -> None:
    """servelab: choose an LLM inference engine by honest measurement."""


schema_app = typer.Typer(
    no_args_is_help=True,
    rich_markup_mode=None,
    help="The JSON Schemas servelab publishes for editors (experiment, gateway config, "
    "catalogs): regenerate them from the models, or check they are current.",
)


def published_schemas() -> list[PublishedSchema]:
    """Every committed JSON Schema file (:class:`servelab.wire.config.PublishedSchema`), in a fixed order:
    the experiment, the gateway config, the engine, hardware and models catalogs, then the result files
    servelab writes (a bench run's ``summary.json``, a trial's ``record.json``), then the traffic profile
    of ``servelab capacity``."""
    from servelab.bench.results import PUBLISHED_SCHEMA as summary_schema
    from servelab.capacity.profile import PUBLISHED_SCHEMA as traffic_schema
    from servelab.catalog.models import PUBLISHED_SCHEMA as models_schema
    from servelab.catalog.schema import PUBLISHED_SCHEMAS as catalog_schemas
    from servelab.gateway.config import PUBLISHED_SCHEMA as gateway_schema
    from servelab.trial.results import PUBLISHED_SCHEMA as record_schema
    from servelab.trial.spec import PUBLISHED_SCHEMA as experiment_schema

    return [
        experiment_schema,
        gateway_schema,
        *catalog_schemas,
        models_schema,
        summary_schema,
        record_schema,
        traffic_schema,
    ]


@schema_app.command("write")
def schema_write(
    folder: str = typer.Option(
        None, "--dir", help="Write the files into this folder instead of next to their models (to review them)."
    ),
) -> None:
    """Regenerate every published JSON Schema from its pydantic models; prints each file written."""
    from servelab.wire.errors import ConfigError

    target = Path(folder) if folder else None
    if target is not None and not target.is_dir():
        raise ConfigError(f"--dir {folder}: no such folder; create it first")
    for s in published_schemas():
        try:
            print(s.write(target))
        except OSError as e:
            raise ConfigError(
                f"cannot write {s.path if target is None else target / s.path.name}: {e.strerror or e}"
            ) from None


@schema_app.command("check")
def schema_check() -> None:
    """Exit 1 (one line per stale file, with the command that fixes it) when a committed JSON Schema
    differs from what its models generate now; else print that they are current."""
    problems = [p for s in published_schemas() if (p := s.problem()) is not None]
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        raise typer.Exit(1)
    print(f"{len(published_schemas())} published JSON Schemas are current")


def _register() -> None:
    """Register the eager subcommands (``schema``); the rest are :data:`COMMANDS`, imported lazily."""
    if not any(g.name == "schema" for g in app.registered_groups):
        app.add_typer(schema_app, name="schema")


def _usage_line(e: typer.TyperException, argv: list[str]) -> str:
    """One line for a command-line usage error of click (typer's ``UsageError``: a word where a number
    is expected, an unknown option, a missing argument): ``servelab: error: servelab bench: PROBLEM;
    see 'servelab bench --help'`` (the subcommand from the error's context, else the first word of
    ``argv`` that names one)."""
    ctx = getattr(e, "ctx", None)
    words = (
        ctx.command_path.split()[1:]
        if ctx is not None and ctx.command_path
        else [a for a in argv[:1] if a in COMMANDS or a == "schema"]
    )
    where = " ".join(["servelab", *words])
    problem = " ".join(e.format_message().split()).rstrip(".")  # click's message may span lines
    problem = problem[:1].lower() + problem[1:] if problem[1:2].islower() else problem
    return f"servelab: error: {where}: {problem}; see '{where} --help'"


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``servelab`` console script. Bad input ends in one line on stderr and exit
    status 2, never a traceback or click's usage block: a :class:`~servelab.wire.ConfigError` as
    ``servelab: error: MESSAGE``, a click usage error as :func:`_usage_line`. ``--help`` and a group
    called without a subcommand print their help (exit 0 and 2, as click does)."""
    from servelab.wire.errors import ConfigError

    _register()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        rv = app(args=args, standalone_mode=False, prog_name="servelab")
    except ConfigError as e:
        print(f"servelab: error: {e}", file=sys.stderr)
        sys.exit(2)
    except typer.TyperException as e:  # click's ClickException (typer vendors click; this is its base)
        show = getattr(e, "show", None)
        if type(e).__name__ == "NoArgsIsHelpError" and callable(show):  # `servelab records`: the group's help
            show()
        elif hasattr(e, "format_message"):
            print(
                _usage_line(e, args) if hasattr(e, "ctx") else f"servelab: error: {e.format_message()}", file=sys.stderr
            )
        sys.exit(getattr(e, "exit_code", 2))
    except typer.Abort:
        print("servelab: aborted", file=sys.stderr)
        sys.exit(1)
    # standalone_mode=False returns a typer.Exit's code (``raise typer.Exit(1)``, 130 on Ctrl-C) as the value
    sys.exit(rv if isinstance(rv, int) and not isinstance(rv, bool) else 0)


if __name__ == "__main__":
    main()
