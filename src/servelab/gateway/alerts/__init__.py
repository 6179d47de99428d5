"""The gateway's Prometheus alert rules (``rules.yaml``, package data; ``servelab gateway alerts`` prints
it; docs/alerts.md lists each rule with its runbook line)."""

from __future__ import annotations

from importlib.resources import files

__all__ = ["rules_text"]


def rules_text() -> str:
    """The rule file as shipped (Prometheus rule-file YAML)."""
    return files(__package__).joinpath("rules.yaml").read_text(encoding="utf-8")
