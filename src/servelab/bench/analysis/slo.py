"""Service-level objectives and per-request gates (goodput).

An SLO is written ``METRIC_STAT<=VALUE[UNIT]``, several joined by commas, e.g.
``ttft_p95<=500ms,itl_p95<=50ms,e2e_p99<=10s,error_rate<=1%``.

- METRIC: ``ttft``, ``ttfat`` (first answer token), ``e2e``, ``tpot``, ``itl`` (per token),
  ``schedule_lag``; STAT: ``mean``, ``p50``, ``p90``, ``p95``, ``p99``, ``max``; UNIT: ``s`` or
  ``ms`` (default ``s``).
- ``error_rate<=X%`` (or a fraction ``<=0.01``): failed / submitted in the step; at most 100%.
- A latency limit is > 0 and at most :data:`MAX_LATENCY_S` (a week); anything else, or a value that is
  not a number, raises :class:`ConfigError` (one line naming the part and the fix).

A step *meets* its SLOs when every stated statistic is within its limit. Goodput counts requests that
individually pass every gate: succeeded, answer valid (JSON schema for structured sets), not truncated
unless allowed, and their own latency within each latency SLO's limit (TTFT, E2E, and TPOT for
``tpot``/``itl`` objectives) — the per-request reading of DistServe's goodput (Zhong et al., OSDI 2024,
https://arxiv.org/abs/2401.09670, read 2026-11-30).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import jsonschema

from servelab.bench.analysis import metrics as M
from servelab.bench.options import split_list
from servelab.bench.workloads.tools import tool_call_failures
from servelab.wire.client import ConfigError
from servelab.wire.types import RequestRecord, RequestSpec

LATENCY_METRICS = ("ttft", "ttfat", "e2e", "tpot", "itl", "schedule_lag")
STATS = ("mean", "p50", "p90", "p95", "p99", "max")
_RX = re.compile(r"^\s*([a-z0-9_]+?)(?:_(mean|p50|p90|p95|p99|max))?\s*(<=|<)\s*([0-9.]+)\s*(ms|s|%)?\s*$")
#: Largest latency limit accepted, seconds (a week: longer than any request timeout means "no limit").
MAX_LATENCY_S = 7 * 86400.0
_EXAMPLE = "e.g. --slo 'ttft_p95<=500ms,itl_p95<=50ms,e2e_p99<=10s,error_rate<=1%'"


@dataclass(frozen=True)
class Objective:
    """One objective: ``metric`` (see module doc), ``stat`` (``p95``…; ``rate`` for error_rate) and
    ``limit`` in seconds (latency) or as a fraction (error rate)."""

    metric: str
    stat: str
    limit: float

    @property
    def name(self) -> str:
        """The objective as written back, e.g. ``ttft_p95<=0.5s``."""
        if self.metric == "error_rate":
            return f"error_rate<={self.limit * 100:g}%"
        return f"{self.metric}_{self.stat}<={self.limit:g}s"


def parse_slo(text: str | None) -> list[Objective]:
    """Parse an SLO string (module doc); ``None`` or ``""`` means no objectives (an experiment's
    ``slo``; ``servelab bench --slo ''`` is refused by :class:`~servelab.bench.load.config.BenchConfig`).
    Raises :class:`ConfigError` naming the bad part and the fix, also for a list with an empty item
    (``','``, ``'a,,b'``: :func:`servelab.bench.options.split_list`) which would otherwise read as "no SLO"."""
    if not text:
        return []
    out = []
    for part in split_list(text, "SLO", _EXAMPLE):
        m = _RX.match(part.lower())
        if not m:
            raise ConfigError(f"invalid SLO {part.strip()!r}: write METRIC_STAT<=VALUE[ms|s|%], {_EXAMPLE}")
        metric, stat, _, value, unit = m.groups()
        try:
            v = float(value)
        except ValueError:
            raise ConfigError(f"invalid SLO {part.strip()!r}: {value!r} is not a number, {_EXAMPLE}") from None
        if metric == "error_rate":
            if unit in ("ms", "s") or stat is not None:
                raise ConfigError(f"invalid SLO {part.strip()!r}: error_rate takes a percentage, {_EXAMPLE}")
            frac = v / 100 if unit == "%" or v > 1 else v
            if frac > 1:
                raise ConfigError(f"invalid SLO {part.strip()!r}: an error rate is at most 100%, {_EXAMPLE}")
            out.append(Objective("error_rate", "rate", frac))
            continue
        if metric not in LATENCY_METRICS:
            raise ConfigError(
                f"invalid SLO {part.strip()!r}: unknown metric {metric!r} "
                f"(use one of {', '.join(LATENCY_METRICS)}, error_rate), {_EXAMPLE}"
            )
        if unit == "%":
            raise ConfigError(f"invalid SLO {part.strip()!r}: a latency needs ms or s, {_EXAMPLE}")
        limit = v / 1000 if unit == "ms" else v
        if not 0 < limit <= MAX_LATENCY_S:
            raise ConfigError(
                f"invalid SLO {part.strip()!r}: a latency limit must be > 0 and at most "
                f"{MAX_LATENCY_S:g} s (no request can meet 0), {_EXAMPLE}"
            )
        out.append(Objective(metric, stat or "p95", limit))
    return out


def load_slo_file(path: str) -> list[Objective]:
    """Read objectives from a YAML/JSON file: either ``{"slo": "ttft_p95<=500ms,…"}`` or a mapping
    ``{"ttft_p95": "500ms", "error_rate": "1%"}``. Raises :class:`ConfigError` on a missing/bad file."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except FileNotFoundError:
        raise ConfigError(f"SLO file {path} does not exist; pass an existing YAML/JSON file") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"SLO file {path} is not valid YAML/JSON ({str(e).splitlines()[0]})") from None
    except RecursionError:
        raise ConfigError(f"SLO file {path} is nested too deeply; write a mapping like {{ttft_p95: 500ms}}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(
            f"SLO file {path} cannot be read as text ({getattr(e, 'strerror', None) or e}); pass a YAML/JSON file"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("slo"), str):
        return parse_slo(data["slo"])
    if isinstance(data, dict):
        return parse_slo(",".join(f"{k}<={v}" for k, v in data.items()))
    raise ConfigError(f"SLO file {path}: expected a mapping like {{ttft_p95: 500ms}}, got {type(data).__name__}")


def evaluate(objectives: list[Objective], summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Check a step summary (:func:`servelab.bench.analysis.metrics.summarize`) against ``objectives``.

    Returns one dict per objective: ``{"objective", "value", "limit", "met"}``. A latency statistic
    that could not be computed (no successful request) does not meet its objective."""
    res = []
    c = summary["counts"]
    for o in objectives:
        if o.metric == "error_rate":
            v = (c["failed_total"] / c["submitted"]) if c["submitted"] else None
        else:
            v = summary[f"{o.metric}_s"][o.stat]
        res.append({"objective": o.name, "value": v, "limit": o.limit, "met": v is not None and v <= o.limit})
    return res


def apply_gates(rec: RequestRecord, spec: RequestSpec, objectives: list[Objective]) -> None:
    """Set ``rec.gate_failures`` (list of short reasons) for a succeeded request: schema-valid JSON
    for structured specs, no truncation unless ``spec.allow_truncation``, tool calls checked against the
    offered tools (:func:`servelab.bench.workloads.tools.tool_call_failures`; without offered tools, arguments that
    are not JSON), and per-request latency limits (module doc). Failed requests are left alone."""
    if rec.failure is not None:
        return
    fails = rec.gate_failures
    if rec.truncated and not spec.allow_truncation:
        fails.append("truncated")
    if spec.json_schema is not None:
        text = rec.content_text
        try:
            # the stdlib parser, not orjson: RFC 8259 sets no range on numbers, and orjson rejects
            # valid JSON such as 1e4407 that a real engine's grammar-constrained output produced
            doc = json.loads(text)
        except ValueError:
            fails.append("json_invalid")
        else:
            try:
                jsonschema.validate(doc, spec.json_schema)
            except jsonschema.ValidationError:
                fails.append("json_schema_mismatch")
    tool_fails = tool_call_failures(rec, spec)  # offered tools: names, JSON, each tool's schema
    if tool_fails:
        fails.extend(tool_fails)
    elif not spec.extra.get("tools") and any(tc.arguments_valid is False for tc in rec.tool_calls.values()):
        fails.append("tool_call_invalid")
    for o in objectives:
        if o.metric in ("ttft", "ttfat", "e2e", "schedule_lag"):
            v = getattr(M, f"{o.metric}_s")(rec)
        elif o.metric in ("tpot", "itl"):
            v = M.tpot_s(rec)
        else:
            continue
        if v is not None and v > o.limit:
            fails.append(f"{o.metric}>{o.limit:g}s")
