"""``python -m servelab.engines.mock``: the ``servelab mock-engine`` command without the servelab CLI around
it (what the launcher runs, quicker to start)."""

import typer

from servelab.engines.mock.cli import mock_engine_command

typer.run(mock_engine_command)
