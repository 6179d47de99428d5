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
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from pydantic import JsonValue

from servelab.bench.results import SloCheck, StepSummary
from servelab.bench.slo import Objective, parse_slo
from servelab.engines.registry import EngineIdentity
from servelab.trial.results import (Break, CandidateIdentity, CandidateResult, Comparison, Decision, EffectiveStep,
                                    EffectiveThroughput, EnvironmentRow, GoalRow, Level, MethodRow, TailLatency,
                                    Verdict)

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

def _num(v: float | None) -> str:
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


def _short(v: JsonValue) -> str:
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

def _objectives(objectives: str | Iterable[Objective | str] | None) -> list[Objective] | None:
    if objectives is None:
        return None
    if isinstance(objectives, str):
        return parse_slo(objectives)
    out: list[Objective] = []
    for o in objectives:
        out.extend([o] if isinstance(o, Objective) else parse_slo(str(o)))
    return out


def _budget(error_budget: float | str | None) -> float | None:
    if error_budget is None:
        return None
    if isinstance(error_budget, str):
        s = error_budget.strip()
        v = float(s.rstrip("%"))
        return v / 100 if s.endswith("%") or v > 1 else v
    return float(error_budget)


def _evaluate(objectives: list[Objective], step: StepSummary) -> list[SloCheck]:
    """Like :func:`servelab.bench.slo.evaluate` but a missing statistic counts as not met."""
    res = []
    c = step.counts
    for o in objectives:
        if o.metric == "error_rate":
            v = (c.failed_total / c.submitted) if c.submitted else None
        else:
            v = getattr(step.dist(o.metric), o.stat, None)
        res.append(SloCheck(objective=o.name, value=v, limit=o.limit, met=v is not None and v <= o.limit))
    return res


def _level_key(label: str, step: StepSummary, first_seen: int) -> tuple[str, float, int]:
    load = step.load
    mag = load.concurrency if load.kind == "closed" else load.rate_rps
    m = _STEP_RX.match(str(label))
    if mag is None and m:
        mag = float(m.group(2))
    kind = m.group(1) if m else str(load.kind or "")
    return (kind, mag if mag is not None else math.inf, first_seen)


def _step_breaks(step: StepSummary, objs: list[Objective] | None, budget: float | None,
                 multi: bool) -> list[Break]:
    """The objectives a run (not skipped) step broke."""
    wl = step.workload
    out: list[Break] = []
    checks = _evaluate(objs, step) if objs is not None else step.slo
    for ch in checks:
        if ch.met:
            continue
        out.append(Break(objective=ch.objective, metric=_metric_of(ch.objective or "?"), value=ch.value,
                         limit=ch.limit, workload=wl))
    if objs is None and not out and step.slo_met is False:
        out.append(Break(objective="slo", metric="slo", workload=wl,
                         text="the bench marked the step as not meeting its SLO"))
    c = step.counts
    if budget is not None and c.submitted:
        rate = c.failed_total / c.submitted
        if rate > budget:
            out.append(Break(objective=f"error_budget<={_num(budget * 100)}%", metric="error_budget", value=rate,
                             limit=budget, workload=wl,
                             text=f"error rate {_num(rate * 100)}% > budget {_num(budget * 100)}% "
                                  f"({c.failed_total}/{c.submitted} failed)"))
    for b in out:
        if not b.text:
            lim = b.limit
            b.text = (f"{b.metric} {_fmt_obj_value(b.metric, b.value)} > "
                      f"{_fmt_obj_value(b.metric, lim) if lim is not None else '?'}")
        if multi and wl:
            b.text += f" ({wl})"
    return out


def effective_step(steps: Sequence[StepSummary], objectives: str | Iterable[Objective | str] | None = None,
                   error_budget: float | str | None = None) -> EffectiveStep:
    """The effective load level of one candidate (module doc for several workloads).

    ``steps``: bench step summaries (docs/summary-schema.md), any order, skipped ones included.
    ``objectives``: ``None`` to use each step's own ``slo`` checks and ``slo_met`` flag, else an SLO
    string, a list of SLO strings or :class:`~servelab.bench.slo.Objective` objects evaluated on the
    step statistics (a statistic that is missing does not meet). ``error_budget``: the largest allowed
    ``failed_total / submitted`` of any one step, as a fraction (``0.01``) or ``"1%"``; ``None`` = no
    budget beyond an ``error_rate`` objective.

    Returns an :class:`~servelab.trial.results.EffectiveStep`: ``max_step_meeting_slo``, ``broken_at``,
    ``broken_by`` (each a :class:`Break` whose ``text`` reads like ``"ttft_p95 4.1 s > 3 s"``; empty
    when nothing broke), ``effective_throughput`` and ``tail_latency`` at the effective level (figures
    ``None`` when no level met), ``error_rate`` (failed / submitted summed over every step that ran,
    ``None`` if none ran) and ``levels`` in load order.
    """
    objs = _objectives(objectives)
    budget = _budget(error_budget)
    workloads: list[str] = []
    by_level: dict[str, list[StepSummary]] = {}
    keys: dict[str, tuple[str, float, int]] = {}
    for i, s in enumerate(steps):
        if s.workload not in workloads:
            workloads.append(s.workload)
        label = str(s.step)
        if label not in by_level:
            by_level[label] = []
            keys[label] = _level_key(label, s, i)
        by_level[label].append(s)
    multi = len(workloads) > 1
    order = sorted(by_level, key=lambda k: keys[k])

    submitted = failed = 0
    levels: list[Level] = []
    max_ok: str | None = None
    stopped = False
    broken_at: str | None = None
    broken_by: list[Break] = []
    for label in order:
        group = by_level[label]
        ran = [s for s in group if not s.skipped]
        for s in ran:
            submitted += s.counts.submitted
            failed += s.counts.failed_total
        breaks = [b for s in ran for b in _step_breaks(s, objs, budget, multi)]
        present = {s.workload for s in ran}
        met = bool(ran) and not breaks and all(w in present for w in workloads)
        levels.append(Level(step=label, ran=bool(ran), met=met, workloads=sorted(present)))
        if broken_at is None and breaks:
            broken_at, broken_by = label, breaks
        if met and not stopped:
            max_ok = label
        elif not met:
            stopped = True  # a level that broke, or ran without every workload, ends the climb

    eff = EffectiveThroughput(at_step=max_ok)
    tail = TailLatency()
    if max_ok is not None:
        group = [s for s in by_level[max_ok] if not s.skipped]
        eff.output_tokens_per_s = sum(s.throughput.output_tokens_per_s or 0.0 for s in group)
        eff.goodput_output_tokens_per_s = sum(s.goodput.output_tokens_per_s or 0.0 for s in group)
        eff.requests_per_s = sum(s.throughput.requests_per_s or 0.0 for s in group)
        for key, metric, stat in (("ttft_p95_s", "ttft_s", "p95"), ("itl_p95_s", "itl_s", "p95"),
                                  ("e2e_p99_s", "e2e_s", "p99")):
            vals = [v for s in group if (v := getattr(s.dist(metric), stat)) is not None]
            setattr(tail, key, max(vals) if vals else None)
    return EffectiveStep(max_step_meeting_slo=max_ok, broken_at=broken_at, broken_by=broken_by,
                         effective_throughput=eff, tail_latency=tail,
                         error_rate=(failed / submitted) if submitted else None, levels=levels)


# ---------------------------------------------------------------------------------------------------
# identities and comparisons
# ---------------------------------------------------------------------------------------------------

#: comparable identity factors as dotted keys (``engine.version``, ``settings.parallel``) -> value
Factors = dict[str, JsonValue]


def _flatten(d: JsonValue, prefix: str) -> Factors:
    out: Factors = {}
    if isinstance(d, dict):
        for k, v in d.items():
            if str(k) in VOLATILE_KEYS:
                continue
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


class EngineFacts(NamedTuple):
    """The comparable facts of a launcher identity: the engine's own name (``llama.cpp``), version
    and binary (or image) sha256; ``None`` where not recorded."""

    kind: str | None
    version: str | None
    binary_sha256: str | None


def engine_facts(engine: EngineIdentity | None) -> EngineFacts:
    """:class:`EngineFacts` of a launcher identity: ``kind`` is its ``engine`` (the engine's own name,
    e.g. ``llama.cpp``, as records of schema version 1 hold it), ``version`` and ``binary_sha256`` its
    own. Older shapes are turned into an :class:`EngineIdentity` when the record is read
    (:func:`servelab.trial.results.migrate`), so there is one spelling here."""
    if engine is None:
        return EngineFacts(None, None, None)
    return EngineFacts(engine.engine, engine.version, engine.binary_sha256)


def identity_factors(identity: CandidateIdentity | None) -> Factors:
    """The comparable factors of one candidate identity as dotted keys: ``engine.kind``,
    ``engine.version``, ``engine.binary_sha256``, ``model.sha256`` (``model.format`` when known) and
    every ``settings.*`` leaf, volatile keys (:data:`VOLATILE_KEYS`) left out."""
    ident = identity or CandidateIdentity()
    out: Factors = {f"engine.{k}": v for k, v in engine_facts(ident.engine)._asdict().items()}
    model = ident.model or {}
    if not model and ident.engine is not None and isinstance(ident.engine.model, dict):
        model = ident.engine.model
    # a converted model (vLLM's HF folder from the same GGUF) names its source weights; the format
    # (quantized GGUF vs dequantized safetensors) is a factor of its own
    out["model.sha256"] = model.get("sha256") or model.get("source_gguf_sha256")
    meta = model.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    fmt = model.get("format") or (f"gguf {meta['file_type_name']}" if meta.get("file_type_name") else None)
    if fmt is not None:
        out["model.format"] = fmt
    out.update(_flatten(ident.settings, "settings"))
    return out


def compare_identities(a: CandidateIdentity | None, b: CandidateIdentity | None,
                       a_name: str = "a", b_name: str = "b") -> Comparison:
    """Which factors differ between two identities: a :class:`Comparison` with ``a``/``b`` the names,
    ``details`` mapping every differing key to ``[a_value, b_value]`` and ``differs_in`` the
    *factors*: a different engine kind subsumes its version and binary, a different version subsumes
    the binary sha256, so one engine upgrade counts as one factor."""
    if not a or not b:
        missing = ", ".join(n for n, i in ((a_name, a), (b_name, b)) if not i)
        return Comparison(a=a_name, b=b_name, note=f"cannot compare: no identity recorded for {missing}")
    fa, fb = identity_factors(a), identity_factors(b)
    details: dict[str, list[JsonValue]] = {k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb))
                                           if fa.get(k) != fb.get(k)}
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
    return Comparison(a=a_name, b=b_name, differs_in=factors, details=details, note=note)


# ---------------------------------------------------------------------------------------------------
# decision
# ---------------------------------------------------------------------------------------------------

def _tps(c: CandidateResult) -> float | None:
    return c.effective_throughput.output_tokens_per_s if c.effective_throughput is not None else None


def _tail(c: CandidateResult, key: str) -> float:
    v = getattr(c.tail_latency, key) if c.tail_latency is not None else None
    return float(v) if v is not None else math.inf


def _slo_at(c: CandidateResult, at_step: str | None) -> str:
    """``ttft_p95 1.9 s ≤ 3 s, error_rate 0% ≤ 1%`` at a level: the worst value of each objective over
    the workloads, from the step summaries; else the tail latency figures."""
    worst: dict[str, SloCheck] = {}
    for s in c.steps:
        if str(s.step) != str(at_step) or s.skipped:
            continue
        for ch in s.slo:
            if ch.value is None:
                continue
            if ch.objective not in worst or ch.value > (worst[ch.objective].value or 0.0):
                worst[ch.objective] = ch
    if worst:
        parts = []
        for name, ch in worst.items():
            m = _metric_of(name)
            parts.append(f"{m} {_fmt_obj_value(m, ch.value)}"
                         + (f" ≤ {_fmt_obj_value(m, ch.limit)}" if ch.limit is not None else ""))
        return ", ".join(parts)
    t = c.tail_latency or TailLatency()
    parts = [f"{k[:-2]} {_num(v)} s" for k in ("ttft_p95_s", "itl_p95_s", "e2e_p99_s")
             if (v := getattr(t, k)) is not None]
    return ", ".join(parts)


def _at(c: CandidateResult) -> str:
    at = (c.effective_throughput.at_step if c.effective_throughput else None) or c.max_step_meeting_slo
    slo = _slo_at(c, at)
    return f"{_fmt_tps(_tps(c))} at {at}" + (f" ({slo})" if slo else "")


def _broke_text(c: CandidateResult) -> str:
    return "; ".join(b.text or str(b.objective) for b in c.broken_by)


def _beyond(c: CandidateResult) -> str:
    at = c.max_step_meeting_slo
    if c.broken_at:
        why = _broke_text(c)
        return f"load beyond {at} broke the SLO at {c.broken_at}" + (f": {why}" if why else "")
    steps = c.ran_steps()
    top = steps and max(steps, key=lambda s: _level_key(str(s.step), s, 0)).step
    return (f"no SLO broke up to {top or at}, the highest step run: its capacity at the SLO may be higher")


def _tie_break_text(win: CandidateResult, lose: CandidateResult) -> str:
    for key, label in (("ttft_p95_s", "TTFT P95"), ("e2e_p99_s", "E2E P99")):
        a, b = _tail(win, key), _tail(lose, key)
        if a != b:
            return f"lower {label}: {_num(a)} s vs {_num(b)} s"
    return "equal tail latency; ordered by throughput, then name"


def _exclude_reason(c: CandidateResult) -> str:
    status = c.status
    reason = (c.reason or "").strip()
    if status in ("excluded", "failed"):
        if reason.lower().startswith(status):
            return reason
        return f"{status}: {reason or 'no reason recorded'}"
    why = _broke_text(c)
    at = c.broken_at
    if why:
        return f"no load step met the SLO: {why}" + (f" at {at}" if at else "")
    return "no load step met the SLO: no load step was run" if not at else f"no load step met the SLO (broke at {at})"


def _scope(identities: Mapping[str, CandidateIdentity], goal: GoalRow | None,
           environment: EnvironmentRow | None, method: MethodRow | None) -> tuple[str, list[str]]:
    weights: dict[str, list[str]] = {}
    builds: dict[str, list[str]] = {}
    for name, ident in identities.items():
        f = identity_factors(ident)
        w = f.get("model.sha256")
        weights.setdefault(f"sha256 {str(w)[:12]}" if w else "sha256 unknown", []).append(name)
        e = engine_facts(ident.engine)
        desc = " ".join(str(x) for x in (e.kind, e.version) if x) or "unknown engine"
        desc += f" (binary sha256 {str(e.binary_sha256)[:12]})" if e.binary_sha256 else ""
        builds.setdefault(desc, []).append(name)

    def _list(d: dict[str, list[str]]) -> str:
        if len(d) == 1:
            return next(iter(d))
        return "; ".join(f"{k} [{', '.join(v)}]" for k, v in d.items())

    env = environment or EnvironmentRow()
    host = env.host
    hdesc = str(host.cpu or "unknown CPU")
    extra = []
    if host.logical_cores:
        extra.append(f"{host.logical_cores} logical cores")
    if host.ram_bytes:
        extra.append(f"{host.ram_bytes / 2**30:.1f} GiB RAM")
    if env.gpu:
        extra.append(f"GPU {env.gpu}")
    if extra:
        hdesc += f" ({', '.join(extra)})"
    g = goal or GoalRow()
    wtxt = ", ".join(method.workloads) if method is not None and method.workloads else (g.mix or "")
    stxt = ", ".join(g.slo)
    scope = (f"valid for: weights {_list(weights) if weights else 'unknown'}; engine builds "
             f"{_list(builds) if builds else 'unknown'}; host {hdesc}; workloads {wtxt or 'unknown'}; "
             f"SLO {stxt or 'as recorded per step'}")
    recheck = [
        "the engine binary or version changes (another build, image or kernel)",
        "the weights change (another file, quantization or revision: sha256 differs)",
        f"the host changes (now {hdesc})",
        "the SLO, the workload mix or the prompt/output lengths change",
    ]
    if g.expected_rate_rps is not None:
        recheck.append(f"the request rate or its burstiness moves away from {_num(float(g.expected_rate_rps))} req/s")
    return scope, recheck


def decide(candidates: Mapping[str, CandidateResult], identities: Mapping[str, CandidateIdentity], *,
           goal: GoalRow | None = None, environment: EnvironmentRow | None = None,
           method: MethodRow | None = None) -> Decision:
    """The record's :class:`~servelab.trial.results.Decision` from ``results.candidates`` and
    ``identity.candidates``.

    Only candidates with ``status == "ranked"`` and a level that met the SLO are ranked, by effective
    output tok/s at the SLO; throughputs within :data:`TIE_TOLERANCE` (2%) of the best of their group
    are a tie, ordered by TTFT P95, then E2E P99 (lower first). The first is ``adopt``, other ranked
    ones ``backup``, the rest ``exclude`` (a ranked candidate with no meeting level is excluded with
    the objective that broke at the lowest step). ``goal``/``environment``/``method`` (the record's
    rows) only feed ``scope`` and ``recheck_when``.
    """
    eligible = [n for n, c in candidates.items()
                if c.status == "ranked" and c.max_step_meeting_slo is not None and _tps(c) is not None]
    by_tps = sorted(eligible, key=lambda n: (-(_tps(candidates[n]) or 0.0), n))
    # tie groups: each member within 2% of the group's best
    groups: list[list[str]] = []
    for n in by_tps:
        if groups and (_tps(candidates[n]) or 0.0) >= (_tps(candidates[groups[-1][0]]) or 0.0) * (1 - TIE_TOLERANCE):
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking: list[str] = []
    for g in groups:
        ranking.extend(sorted(g, key=lambda n: (_tail(candidates[n], "ttft_p95_s"),
                                                _tail(candidates[n], "e2e_p99_s"),
                                                -(_tps(candidates[n]) or 0.0), n)))
    group_of = {n: i for i, g in enumerate(groups) for n in g}

    verdicts: dict[str, Verdict] = {}
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
            assert best is not None
            bt = _tps(candidates[best]) or 0.0
            t = _tps(c) or 0.0
            if group_of[n] == group_of[best]:
                rel = (f"within {TIE_TOLERANCE:.0%} of {best} ({_fmt_tps(bt)}) but ranked after it for "
                       f"{_tie_break_text(candidates[best], c)}")
            else:
                pct = (1 - t / bt) * 100 if bt else 0.0
                rel = f"{_num(pct)}% below {best} ({_fmt_tps(bt)})"
            reasons.append(f"ranked {pos + 1} of {len(ranking)}: {_at(c)}, {rel}")
        eff = c.effective_throughput or EffectiveThroughput()
        bits = []
        if eff.goodput_output_tokens_per_s is not None:
            bits.append(f"goodput {_fmt_tps(eff.goodput_output_tokens_per_s)} at "
                        f"{eff.at_step or c.max_step_meeting_slo}")
        if c.error_rate is not None:
            bits.append(f"error rate {_num(c.error_rate * 100)}% over all load steps")
        if bits:
            reasons.append("; ".join(bits))
        reasons.append(_beyond(c))
        verdicts[n] = Verdict(verdict="adopt" if pos == 0 else "backup", reasons=reasons)
    for n, c in candidates.items():
        if n not in verdicts:
            verdicts[n] = Verdict(verdict="exclude", reasons=[_exclude_reason(c)])

    names = list(dict.fromkeys([*candidates, *identities]))
    comparisons = [compare_identities(identities.get(a), identities.get(b), a, b)
                   for i, a in enumerate(names) for b in names[i + 1:]]
    scope, recheck = _scope({n: identities.get(n) or CandidateIdentity() for n in names}, goal, environment,
                            method)
    if best is not None:
        at = candidates[best].max_step_meeting_slo
        recheck.append(f"the load needed exceeds {at}, the highest step at which {best} met the SLO")
    return Decision(ranking=ranking, adopt=best, verdicts={n: verdicts[n] for n in candidates},
                    comparisons=comparisons, scope=scope, recheck_when=recheck)


def candidate_levels(steps: Iterable[StepSummary]) -> list[str]:
    """The load-level labels of ``steps`` in load order (``["c1", "c2", "c4"]``)."""
    seen: dict[str, tuple[str, float, int]] = {}
    for i, s in enumerate(steps):
        seen.setdefault(str(s.step), _level_key(str(s.step), s, i))
    return sorted(seen, key=lambda k: seen[k])


__all__: Sequence[str] = ("TIE_TOLERANCE", "VOLATILE_KEYS", "EngineFacts", "candidate_levels", "compare_identities",
                          "decide", "effective_step", "engine_facts", "identity_factors")
