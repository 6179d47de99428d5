"""The gateway's Grafana dashboard (``servelab.json``, package data; ``servelab gateway dashboard`` prints it).

Imported into Grafana as it is (Dashboards > New > Import): the Prometheus data source is the variable
``datasource``, the model filter the variable ``model``. Every panel reads the gateway's own ``/metrics``
(one scrape target: the engines' gauges are re-exported there, servelab.gateway.enginegauges): traffic,
TTFT/ITL/E2E percentiles per model, tokens/s, engine queue/running/KV use per backend, errors by class,
stream errors, retries and fallbacks, breakers, limit and budget refusals. tests/gateway/test_dashboard.py
evaluates every panel's query against a real Prometheus scraping a real gateway.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

import orjson

__all__ = ["dashboard", "dashboard_text", "panel_queries"]


def dashboard_text() -> str:
    """The dashboard JSON as shipped."""
    return files(__package__).joinpath("servelab.json").read_text(encoding="utf-8")


def dashboard() -> dict[str, Any]:
    """The dashboard, decoded."""
    out: dict[str, Any] = orjson.loads(dashboard_text())
    return out


def panel_queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """``(panel title, PromQL expression)`` of every query of every panel (rows' nested panels included)."""
    out: list[tuple[str, str]] = []
    for p in board.get("panels", []):
        for q in [*p.get("panels", []), p]:
            for t in q.get("targets", []):
                if t.get("expr"):
                    out.append((q.get("title", "?"), t["expr"]))
    return out
