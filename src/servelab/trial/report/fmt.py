"""How the report writes a value: numbers to three significant figures, shares, sizes, times, a figure
with its 95 % interval, money; ``—`` for what is missing. Plain text: the templates escape it."""

from __future__ import annotations

import html
import math
import time
from typing import Any

from servelab.bench.results import Interval


def esc(x: Any) -> str:
    """``x`` escaped for HTML (for text that goes into a chart's hover template)."""
    return html.escape("" if x is None else str(x), quote=True)


def finite(x: Any) -> float | None:
    """``x`` as a float when it is a finite number (not a bool), else ``None``."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
        return None
    return float(x)


def fmt(x: Any, digits: int = 3) -> str:
    """``81.2``, ``0.25``, ``1,234``; ``—`` for ``None``; other values as text."""
    v = finite(x)
    if v is None:
        return "—" if x is None else str(x)
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}" if abs(v) < 1 else f"{v:.{max(digits - 1, 1)}f}".rstrip("0").rstrip(".")


def pct(x: Any) -> str:
    """A fraction as a percentage: ``0.25`` -> ``25 %``."""
    v = finite(x)
    return "—" if v is None else f"{v * 100:.2g} %"


def size(x: Any) -> str:
    """Bytes in binary units: ``1.5 GiB``."""
    v = finite(x)
    if v is None:
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if v < 1024 or unit == "TiB":
            return f"{v:.0f} {unit}" if unit == "B" else f"{v:.1f} {unit}"
        v /= 1024
    return "—"


def when(x: Any) -> str:
    """A Unix time as ``2026-12-02 09:27:19 UTC``."""
    v = finite(x)
    return "—" if v is None or v <= 0 else time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(v))


def with_ci(v: Any, ci: Interval | None) -> str:
    """``1.9 [1.2–∞)``: a figure never shown bare: with its 95 % interval (``∞`` / ``?`` where the sample
    cannot bound that side), or ``1.9 [no interval]``."""
    if finite(v) is None:
        return "—"
    if ci is None:
        return f"{fmt(v)} [no interval]"
    lo = "?" if ci.lo is None else fmt(ci.lo)
    hi = "∞" if ci.hi is None else fmt(ci.hi)
    return f"{fmt(v)} [{lo}–{hi}{')' if ci.hi is None else ']'}"


def ci_text(ci: Interval | None, unit: str = "") -> str:
    """``95 % CI 1.2–unbounded s``, or ``no interval``."""
    if ci is None:
        return "no interval"
    lo = "unbounded" if ci.lo is None else f"{ci.lo:.3g}"
    hi = "unbounded" if ci.hi is None else f"{ci.hi:.3g}"
    return f"95 % CI {lo}–{hi}{unit}"


def money(x: float | None) -> str:
    """A price or cost to four significant figures."""
    return "—" if x is None else f"{x:.4g}"
