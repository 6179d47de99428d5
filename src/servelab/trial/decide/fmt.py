"""How the decision writes numbers, intervals and identity values in its sentences: three significant
digits, an interval's unbounded side said in words, a sha256 shortened (``4.1``, ``(95 % CI 80.2–89.1
tok/s)``, ``a5fd3b62230a…``)."""

from __future__ import annotations

import json
import math
import re

from pydantic import JsonValue

from servelab.bench.results import Interval


def num(v: float | None) -> str:
    """Compact number: 3 significant digits, no trailing zeros (4.1, 0.25, 81.2, 176)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def fmt_tps(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} tok/s"


def fmt_ci(ci: Interval | None, unit: str = "") -> str:
    """`` (95 % CI 80.2–89.1 tok/s)``; an unbounded side is written as such."""
    if ci is None or (ci.lo is None and ci.hi is None):
        return " (95 % CI unbounded: too few samples)"
    lo = "unbounded" if ci.lo is None else num(ci.lo)
    hi = "unbounded" if ci.hi is None else num(ci.hi)
    return f" (95 % CI {lo}–{hi}{unit})"


def span(ci: Interval) -> str:
    """``0.92–unbounded``: an interval's two sides, an unbounded one written as such."""
    return f"{'unbounded' if ci.lo is None else num(ci.lo)}–{'unbounded' if ci.hi is None else num(ci.hi)}"


def fmt_obj_value(metric: str, v: float | None) -> str:
    metric = metric.rsplit(":", 1)[-1]  # a per-workload objective: structured:ttft_p95
    if v is None:
        return "n/a (no successful request)"
    if metric.startswith("error_rate") or metric == "error_budget":
        return f"{num(v * 100)}%"
    return f"{num(v)} s"


def metric_of(objective: str) -> str:
    """``ttft_p95<=3s`` -> ``ttft_p95``."""
    return re.split(r"\s*<=?\s*", str(objective), maxsplit=1)[0].strip()


def short(v: JsonValue) -> str:
    """A value for a comparison note: sha256 shortened, structures compact."""
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{40,}", v):
        return v[:12] + "…"
    if isinstance(v, (dict, list)):
        s = json.dumps(v, sort_keys=True, separators=(",", ":"))
        return s if len(s) <= 40 else s[:39] + "…"
    return "none" if v is None else str(v)
