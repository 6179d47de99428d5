"""``servelab doctor`` as a typer command (the checks live in :mod:`servelab.doctor`, which imports only
the standard library so that ``scripts/doctor.sh`` runs it before the venv exists)."""

from __future__ import annotations

import typer

from servelab.doctor import main as doctor_main

__all__ = ["doctor_command"]


def doctor_command(
    purpose: str = typer.Option(
        "main",
        "--for",
        help="main: exit 1 when the trial cannot run; tests: also when "
        "the test suite cannot (Chromium, Redis, PostgreSQL 15, the embedding model).",
    ),
    no_run: bool = typer.Option(False, "--no-run", help="Do not start llama-server for one streamed token."),
) -> None:
    """Check what the trial and the tests need on this host: one line per item (ok / MISSING + the fix)."""
    if purpose not in ("main", "tests"):
        raise typer.BadParameter(f"--for {purpose!r}: use main or tests")
    raise typer.Exit(doctor_main(["--for", purpose] + (["--no-run"] if no_run else [])))
