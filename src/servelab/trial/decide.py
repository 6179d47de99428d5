"""The trial's decision rule (000 §10.3, §11, §12): effective step, ranking, verdicts, comparisons.

Two pure functions, no I/O:

- :func:`effective_step` reads one candidate's bench step summaries (docs/summary-schema.md) and
  finds, for its *ranked workload*, the highest load level that met every SLO and the error budget,
  the first level that broke (and which objective broke it), what the engine sustained there with its
  interval, the tail latency with intervals, the SLO verdicts by interval, each workload's own
  capacity apart, and the error rate over all steps that ran.
- :func:`decide` turns every candidate's ``results.candidates[name]`` entry (status + the figures of
  :func:`effective_step`) and its identity into the record's ``decision`` object
  (docs/record-schema.md): ranking with the difference to the next candidate and its interval (or "no
  significant difference" and the tie-break), verdicts with reasons in plain sentences with numbers,
  pairwise comparisons saying which factor differs (000 §10.3: change one factor at a time), token
  comparability, scope of validity and the conditions for re-checking.

**What the engine sustained, and nothing else.** The ranked workload is ``mix`` (the goal's mix at its
ratio, run concurrently as one load, 003 §19's fifth set) when the steps hold it, else the only
workload. Its throughput at a level is the figure of that ONE run (the steady window when the trial
added one: in-flight at its target, ramp-up and drain left out), averaged over repeats of the same
level — never a sum over workloads that ran one after another: an engine that ran short-qa at
83.9 tok/s and then structured at 49.1 tok/s never sustained 133. Candidates whose steps hold several
workloads and no mix get no throughput figure (and are not ranked), with the reason. Each workload's
own sweep is reported apart (``per_workload``).

**Levels.** Levels are ordered by load (``c1 < c2 < c4``); a level *meets* when every repeat of the
ranked workload at it met every objective on its point estimate and stayed within the error budget;
the effective level is the highest meeting level *below the first broken level* (a level that met
after a lower one broke is noise). Skipped steps never meet and never count in the error rate. Each
level and objective also carries a verdict by its 95 % interval (:func:`servelab.bench.intervals.slo_verdict`:
``met`` / ``broken`` / ``undetermined``): with 8 requests a P95 cannot be shown to be within a limit
(its upper bound needs 72), and the decision says so rather than state a bare number. The rules per
statistic (a mean by its t interval, a max by the observation), per-workload objectives (judged on
that workload's requests, also inside the mix) and the expected-rate verdict over every run of the
arrival test (broken only when broken in each run) are in :mod:`servelab.trial.verdicts`.

**Ranking** (:func:`decide`): by the ranked figure, output tok/s (requests/s when the candidates'
tokenizers differ: their token counts are not the same unit, 000 §10.2). A candidate is ranked after
the one before it only when their ratio's 95 % interval (Welch on the log block rates of every repeat,
:func:`servelab.bench.intervals.ratio_interval`) excludes 1; otherwise they are "no significant
difference" and ordered by the tie-break :data:`TIE_BREAK`.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from pydantic import JsonValue

from servelab.bench.intervals import (Bounds, SloVerdict, mean_interval, paired_ratio_interval, paired_rounds_ratio,
                                      ratio_interval)
from servelab.bench.results import Interval, SloCheck, StepSummary
from servelab.bench.slo import Objective, parse_slo
from servelab.engines.registry import EngineIdentity
from servelab.trial.results import (Break, CandidateIdentity, CandidateResult, Comparability, Comparison, Decision,
                                    Difference, EffectiveStep, EffectiveThroughput, EnvironmentRow, GoalRow, Level,
                                    MethodRow, ObjectiveVerdict, TailLatency, Verdict, WorkloadCapacity)
from servelab.trial.lifecycle import cancellation_text
from servelab.trial.verdicts import MIX, judged_on, objective_verdicts, stat_value

TIE_BREAK = ("lower TTFT P95 at the effective level, then lower E2E P99, then higher throughput, then name")
"""How candidates with no significant difference in the ranked figure are ordered."""

VOLATILE_KEYS = frozenset({
    "port", "pid", "base_url", "url", "log_path", "log_dir", "started_at", "argv", "host", "out_dir",
    "cache_dir", "started_unix_s", "finished_unix_s", "ready_timeout_s",
})
"""Leaf names ignored when comparing identities: they differ between any two launches."""

_STEP_RX = re.compile(r"^([a-z]+)([0-9]+(?:\.[0-9]+)?)$")
_ORDER = {"broken": 0, "undetermined": 1, "met": 2}


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


def _fmt_ci(ci: Interval | None, unit: str = "") -> str:
    """`` (95 % CI 80.2–89.1 tok/s)``; an unbounded side is written as such."""
    if ci is None or (ci.lo is None and ci.hi is None):
        return " (95 % CI unbounded: too few samples)"
    lo = "unbounded" if ci.lo is None else _num(ci.lo)
    hi = "unbounded" if ci.hi is None else _num(ci.hi)
    return f" (95 % CI {lo}–{hi}{unit})"


def _span(ci: Interval) -> str:
    """``0.92–unbounded``: an interval's two sides, an unbounded one written as such."""
    return f"{'unbounded' if ci.lo is None else _num(ci.lo)}–{'unbounded' if ci.hi is None else _num(ci.hi)}"


def _fmt_obj_value(metric: str, v: float | None) -> str:
    metric = metric.rsplit(":", 1)[-1]  # a per-workload objective: structured:ttft_p95
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


def _iv(b: Bounds | None) -> Interval | None:
    return None if b is None else Interval(lo=b.lo, hi=b.hi, level=b.level, n=b.n, method=b.method)


def _rate_iv(b: Bounds) -> Interval | None:
    """A rate's interval: a rate is never below 0, so a t lower bound under 0 is cut there."""
    i = _iv(b)
    if i is not None and i.lo is not None and i.lo < 0:
        i.lo = 0.0
    return i


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
    """Like :func:`servelab.bench.slo.evaluate` but a missing statistic counts as not met, and a
    per-workload objective is judged on that workload's requests only (and skipped where it does not
    apply: :func:`servelab.trial.verdicts.judged_on`)."""
    res = []
    for o in objectives:
        sub = judged_on(step, o)
        if sub is None:
            continue
        v = stat_value(sub, o)
        res.append(SloCheck(objective=o.name, value=v, limit=o.limit, met=v is not None and v <= o.limit))
    return res


def _step_objectives(step: StepSummary, objs: list[Objective] | None) -> list[Objective]:
    """The objectives to judge ``step`` on: the given ones, else those its own SLO checks name."""
    if objs is not None:
        return objs
    out: list[Objective] = []
    for ch in step.slo:
        try:
            out.extend(parse_slo(ch.objective))
        except Exception:  # noqa: BLE001 — a check the bench wrote that this servelab cannot parse
            continue
    return out


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
        scoped = (ch.objective or "").split(":", 1)[0] if ":" in (ch.objective or "") else None
        out.append(Break(objective=ch.objective, metric=_metric_of(ch.objective or "?"), value=ch.value,
                         limit=ch.limit, workload=scoped or wl))
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


def _weakest(verdicts: Sequence[SloVerdict]) -> SloVerdict:
    """``broken`` before ``undetermined`` before ``met``."""
    out: SloVerdict = "met"
    for v in verdicts:
        if _ORDER[v] < _ORDER[out]:
            out = v
    return out


class _Sweep(NamedTuple):
    levels: list[Level]
    max_ok: str | None
    broken_at: str | None
    broken_by: list[Break]
    by_level: dict[str, list[StepSummary]]


def _sweep(steps: Sequence[StepSummary], objs: list[Objective] | None, budget: float | None,
           multi: bool) -> _Sweep:
    """Levels of ``steps`` (one workload, or several that must all meet), in load order."""
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
    levels: list[Level] = []
    max_ok: str | None = None
    stopped = False
    broken_at: str | None = None
    broken_by: list[Break] = []
    for label in sorted(by_level, key=lambda k: keys[k]):
        ran = [s for s in by_level[label] if not s.skipped]
        breaks = [b for s in ran for b in _step_breaks(s, objs, budget, multi)]
        present = {s.workload for s in ran}
        met = bool(ran) and not breaks and all(w in present for w in workloads)
        verdicts: list[SloVerdict] = [v.verdict for s in ran for v in objective_verdicts(s, _step_objectives(s, objs))]
        verdict = _weakest(verdicts) if verdicts else None
        if breaks and verdict == "met":
            verdict = "undetermined"
        levels.append(Level(step=label, ran=bool(ran), met=met, verdict=verdict if ran else None,
                            workloads=sorted(present)))
        if broken_at is None and breaks:
            broken_at, broken_by = label, breaks
        if met and not stopped:
            max_ok = label
        elif not met:
            stopped = True  # a level that broke, or ran without every workload, ends the climb
    return _Sweep(levels, max_ok, broken_at, broken_by, by_level)


def _rate(s: StepSummary) -> tuple[float | None, str]:
    """The output tok/s of one run and its window: the steady window's when the trial added one."""
    st = s.steady
    if st is not None and st.output_tokens_per_s is not None:
        return st.output_tokens_per_s, "steady"
    return s.throughput.output_tokens_per_s, "step"


def _sustained(group: list[StepSummary]) -> EffectiveThroughput:
    """What one level of one workload sustained over its repeats (module doc)."""
    vals, reqs, samples, good = [], [], [], []
    rounds: list[int] = []
    bases = set()
    for s in group:
        v, basis = _rate(s)
        if v is None:
            continue
        bases.add(basis)
        vals.append(v)
        st = s.steady
        r = st.requests_per_s if basis == "steady" and st is not None else s.throughput.requests_per_s
        reqs.append(r if r is not None else 0.0)
        got = st.blocks if basis == "steady" and st is not None and st.blocks else [v]
        samples.extend(got)
        rounds.extend([s.repeat or 0] * len(got))
        tp, gp = s.throughput.output_tokens_per_s, s.goodput.output_tokens_per_s
        good.append(v * (gp / tp) if tp and gp is not None else (gp or 0.0))
    eff = EffectiveThroughput(repeats=len(group))
    if not vals:
        return eff
    eff.output_tokens_per_s = sum(vals) / len(vals)
    eff.requests_per_s = sum(reqs) / len(reqs)
    eff.goodput_output_tokens_per_s = sum(good) / len(good)
    eff.per_repeat = vals
    eff.samples = samples
    eff.sample_repeats = rounds
    eff.request_samples = reqs
    eff.basis = "steady window" if bases == {"steady"} else "step window" if bases == {"step"} else "mixed windows"
    if len(vals) >= 2:
        eff.output_tokens_per_s_ci = _rate_iv(mean_interval(vals, method="t-repeats"))
        eff.goodput_output_tokens_per_s_ci = _rate_iv(mean_interval(good, method="t-repeats"))
        eff.requests_per_s_ci = _rate_iv(mean_interval(reqs, method="t-repeats"))
    elif group[0].steady is not None and group[0].steady.output_tokens_per_s_ci is not None:
        ci = eff.output_tokens_per_s_ci = group[0].steady.output_tokens_per_s_ci
        share = good[0] / vals[0] if vals[0] else 0.0
        eff.goodput_output_tokens_per_s_ci = Interval(lo=None if ci.lo is None else ci.lo * share,
                                                      hi=None if ci.hi is None else ci.hi * share,
                                                      level=ci.level, n=ci.n, method=ci.method)
    return eff


def _worst(group: list[StepSummary], metric: str, stat: str) -> tuple[float | None, Interval | None]:
    best: tuple[float | None, Interval | None] = (None, None)
    for s in group:
        d = s.dist(metric)
        v = getattr(d, stat)
        if v is not None and (best[0] is None or v > best[0]):
            best = (v, d.ci(stat))
    return best


def ranked_workload(steps: Iterable[StepSummary]) -> str | None:
    """The workload a candidate is ranked on: ``mix`` when a mix step ran, else the only other
    workload, else ``None`` (several workloads that never ran together — no mix sweep, or the budget
    skipped it: no figure of what the engine sustained)."""
    steps = list(steps)
    if any(s.workload == MIX and not s.skipped for s in steps):
        return MIX
    names = list(dict.fromkeys(s.workload for s in steps if s.workload != MIX))
    return names[0] if len(names) == 1 else None


def effective_step(steps: Sequence[StepSummary], objectives: str | Iterable[Objective | str] | None = None,
                   error_budget: float | str | None = None) -> EffectiveStep:
    """The effective load level of one candidate (module doc).

    ``steps``: bench step summaries (docs/summary-schema.md), any order, skipped ones and every
    repeat included (``StepSummary.repeat``). ``objectives``: ``None`` to use each step's own ``slo``
    checks and ``slo_met`` flag, else an SLO string, a list of SLO strings or
    :class:`~servelab.bench.slo.Objective` objects evaluated on the step statistics (a statistic that
    is missing does not meet). ``error_budget``: the largest allowed ``failed_total / submitted`` of
    any one step, as a fraction (``0.01``) or ``"1%"``; ``None`` = no budget beyond an ``error_rate``
    objective.

    Returns an :class:`~servelab.trial.results.EffectiveStep`: ``ranked_on`` (the ranked workload, or
    ``None``), ``max_step_meeting_slo``, ``broken_at``, ``broken_by`` (each a :class:`Break` whose
    ``text`` reads like ``"ttft_p95 4.1 s > 3 s"``), ``effective_throughput`` (one run's figure, mean
    over repeats, with its interval; ``None`` figures when no level met or nothing ran together),
    ``tail_latency`` (worst repeat, with intervals), ``slo_verdicts`` at the effective level,
    ``per_workload`` (each other workload's own sweep), ``error_rate`` (failed / submitted summed over
    every step that ran, ``None`` if none ran) and ``levels`` in load order.
    """
    objs = _objectives(objectives)
    budget = _budget(error_budget)
    ranked = ranked_workload(steps)
    submitted = sum(s.counts.submitted for s in steps if not s.skipped)
    failed = sum(s.counts.failed_total for s in steps if not s.skipped)
    main = [s for s in steps if s.workload == ranked or (ranked is None and s.workload != MIX)]
    sw = _sweep(main, objs, budget, multi=ranked is None and len({s.workload for s in main}) > 1)
    per_workload: dict[str, WorkloadCapacity] = {}
    for w in dict.fromkeys(s.workload for s in steps):
        if w == ranked and ranked != MIX:
            continue
        ws = _sweep([s for s in steps if s.workload == w], objs, budget, multi=False)
        cap = WorkloadCapacity(max_step_meeting_slo=ws.max_ok, broken_at=ws.broken_at)
        if ws.max_ok is not None:
            e = _sustained([s for s in ws.by_level[ws.max_ok] if not s.skipped])
            cap.output_tokens_per_s, cap.output_tokens_per_s_ci = e.output_tokens_per_s, e.output_tokens_per_s_ci
            cap.requests_per_s = e.requests_per_s
        per_workload[w] = cap
    if ranked == MIX:
        per_workload.pop(MIX, None)
    eff = EffectiveThroughput(at_step=sw.max_ok, workload=ranked)
    tail = TailLatency()
    verdicts: list[ObjectiveVerdict] = []
    if sw.max_ok is not None and ranked is not None:
        group = [s for s in sw.by_level[sw.max_ok] if not s.skipped]
        eff = _sustained(group)
        eff.at_step, eff.workload = sw.max_ok, ranked
        for key, metric, stat in (("ttft_p95", "ttft_s", "p95"), ("itl_p95", "itl_s", "p95"),
                                  ("e2e_p99", "e2e_s", "p99")):
            v, ci = _worst(group, metric, stat)
            setattr(tail, f"{key}_s", v)
            setattr(tail, f"{key}_ci", ci)
        worst: dict[str, ObjectiveVerdict] = {}
        for s in group:
            for ov in objective_verdicts(s, _step_objectives(s, objs)):
                cur = worst.get(ov.objective)
                if cur is None or _ORDER[ov.verdict] < _ORDER[cur.verdict] or (
                        ov.verdict == cur.verdict and (ov.value or 0) > (cur.value or 0)):
                    worst[ov.objective] = ov
        verdicts = list(worst.values())
    return EffectiveStep(max_step_meeting_slo=sw.max_ok, broken_at=sw.broken_at, broken_by=sw.broken_by,
                         effective_throughput=eff, tail_latency=tail,
                         error_rate=(failed / submitted) if submitted else None, levels=sw.levels,
                         ranked_on=ranked, slo_verdicts=verdicts, per_workload=per_workload)


# ---------------------------------------------------------------------------------------------------
# identities and comparisons
# ---------------------------------------------------------------------------------------------------

#: comparable identity factors as dotted keys (``engine.version``, ``settings.parallel``) -> value
Factors = dict[str, JsonValue]


def _flatten(d: JsonValue, prefix: str) -> Factors:
    out: Factors = {}
    if isinstance(d, dict):
        for k, v in d.items():
            # a command candidate's declared argv (``{port}``/``{host}`` placeholders, not the values) is
            # its configuration: two that differ only in ``--parallel`` differ in that factor
            if str(k) in VOLATILE_KEYS and not (prefix == "settings" and k == "argv"):
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


def _figure(c: CandidateResult, metric: str) -> float | None:
    e = c.effective_throughput
    if e is None:
        return None
    return e.output_tokens_per_s if metric == "output_tokens_per_s" else e.requests_per_s


def _samples(c: CandidateResult, metric: str) -> list[float]:
    e = c.effective_throughput or EffectiveThroughput()
    if metric == "output_tokens_per_s":
        return list(e.samples or e.per_repeat)
    return list(e.request_samples)


def _tail(c: CandidateResult, key: str) -> float:
    v = getattr(c.tail_latency, key) if c.tail_latency is not None else None
    return float(v) if v is not None else math.inf


def _slo_at(c: CandidateResult) -> str:
    """``ttft_p95 1.9 s ≤ 3 s (95 % CI 1.2–unbounded s: undetermined), …`` at the effective level."""
    parts = []
    for ov in c.slo_verdicts:
        m = _metric_of(ov.objective)
        unit = "" if m.startswith("error_rate") else " s"
        ci = ov.ci
        if m.startswith("error_rate") and ci is not None:
            ci = Interval(lo=None if ci.lo is None else ci.lo * 100, hi=None if ci.hi is None else ci.hi * 100,
                          level=ci.level, n=ci.n, method=ci.method)
            unit = "%"
        lim = f" ≤ {_fmt_obj_value(m, ov.limit)}" if ov.limit is not None else ""
        parts.append(f"{m} {_fmt_obj_value(m, ov.value)}{lim}{_fmt_ci(ci, unit)[:-1]}: {ov.verdict})")
    return ", ".join(parts)


def _what(metric: str) -> str:
    return "output tok/s" if metric == "output_tokens_per_s" else "completed requests/s"


def _at(c: CandidateResult, metric: str) -> str:
    e = c.effective_throughput or EffectiveThroughput()
    at = e.at_step or c.max_step_meeting_slo
    unit = " tok/s" if metric == "output_tokens_per_s" else " req/s"
    ci = e.output_tokens_per_s_ci if metric == "output_tokens_per_s" else e.requests_per_s_ci
    val = _figure(c, metric)
    what = f"{_num(val)}{unit}{_fmt_ci(ci, unit)}"
    how = [x for x in (f"workload {e.workload}" if e.workload else None, e.basis,
                       f"{e.repeats} repeat(s)" if e.repeats else None) if x]
    slo = _slo_at(c)
    return f"{what} at {at}" + (f" ({', '.join(how)})" if how else "") + (f"; SLO: {slo}" if slo else "")


def _broke_text(c: CandidateResult) -> str:
    return "; ".join(b.text or str(b.objective) for b in c.broken_by)


def _beyond(c: CandidateResult) -> str:
    at = c.max_step_meeting_slo
    if c.broken_at:
        why = _broke_text(c)
        return f"load beyond {at} broke the SLO at {c.broken_at}" + (f": {why}" if why else "")
    steps = [s for s in c.ran_steps() if s.workload == (c.ranked_on or s.workload)]
    top = steps and max(steps, key=lambda s: _level_key(str(s.step), s, 0)).step
    return (f"no SLO broke up to {top or at}, the highest step run: its capacity at the SLO may be higher")


def _tie_break_text(win: CandidateResult, lose: CandidateResult) -> str:
    """Which tail figure ordered ``win`` before ``lose``, with both point values and whether their 95 %
    intervals are apart (a significant latency difference) or not (the order is the rule's, not a measured
    difference: an interval overlapping the other, or unbounded on the side that would tell)."""
    for key, label in (("ttft_p95_s", "TTFT P95"), ("e2e_p99_s", "E2E P99")):
        a, b = _tail(win, key), _tail(lose, key)
        if a != b:
            ci_key = key.removesuffix("_s") + "_ci"
            ca = getattr(win.tail_latency, ci_key) if win.tail_latency is not None else None
            cb = getattr(lose.tail_latency, ci_key) if lose.tail_latency is not None else None
            if ca is None or cb is None:
                how = "no interval for both, so not a shown difference"
            elif ca.hi is not None and cb.lo is not None and ca.hi < cb.lo:
                how = f"95 % CIs apart: {_span(ca)} vs {_span(cb)} s"
            else:
                how = f"95 % CIs {_span(ca)} vs {_span(cb)} s overlap, so not a shown difference either"
            return f"lower {label}: {_num(a)} s vs {_num(b)} s ({how})"
    return "equal tail latency; ordered by throughput, then name"


def _arrival_broken(c: CandidateResult) -> list[ObjectiveVerdict]:
    """The objectives broken at the expected rate (:func:`servelab.trial.verdicts.expected_rate_verdicts`:
    by each run's interval, in every run; one run only by a margin above the run-to-run variation)."""
    return [v for v in c.arrival_verdicts if v.verdict == "broken"]


def _exclude_reason(c: CandidateResult) -> str:
    status = c.status
    reason = (c.reason or "").strip()
    if status in ("excluded", "failed"):
        if reason.lower().startswith(status):
            return reason
        return f"{status}: {reason or 'no reason recorded'}"
    if c.max_step_meeting_slo is not None and (bad := _arrival_broken(c)):
        where = c.arrival_run.step if c.arrival_run is not None else "the expected rate"
        return ("broke the SLO at the expected rate (" + where + ", bursts and mix), by its 95 % interval: "
                + "; ".join(f"{v.objective} was {_fmt_obj_value(_metric_of(v.objective), v.value)}"
                            f"{_fmt_ci(v.ci)}" + (f", {v.note}" if v.note else "") for v in bad))
    if c.ranked_on is None and len({s.workload for s in c.steps if s.workload != MIX}) > 1:
        why = ("the mix run together was skipped: " + next(s.skipped_reason or "skipped" for s in c.steps
                                                           if s.workload == MIX)
               if any(s.workload == MIX for s in c.steps) else "no mix was run together (mix_sweep: false)")
        return ("not ranked: its workloads ran one after another and never together, so no figure says "
                f"what the engine sustained (sums of separate runs are not used); {why}")
    why = _broke_text(c)
    at = c.broken_at
    if why:
        return f"no load step met the SLO: {why}" + (f" at {at}" if at else "")
    return "no load step met the SLO: no load step was run" if not at else f"no load step met the SLO (broke at {at})"


def tokenizer_key(identity: CandidateIdentity | None) -> str | None:
    """What decides a candidate's token counts: its weights' sha256 (a GGUF embeds its tokenizer;
    a converted folder names its source GGUF), else the served model name; ``None`` when unknown."""
    f = identity_factors(identity)
    sha = f.get("model.sha256")
    if sha:
        return f"sha256 {str(sha)[:12]}"
    name = (identity.model or {}).get("name") if identity is not None else None
    return f"model {name}" if name else None


def comparability(names: Sequence[str], identities: Mapping[str, CandidateIdentity]) -> Comparability:
    """:class:`Comparability` of token counts across ``names`` (000 §10.2: tokenizers differ across
    models, so tok/s may not compare): the same when every candidate's :func:`tokenizer_key` is equal
    (unknown everywhere counts as the same, and says so)."""
    groups: dict[str, list[str]] = {}
    for n in names:
        groups.setdefault(tokenizer_key(identities.get(n)) or "not recorded", []).append(n)
    same = len(groups) <= 1
    if same:
        key = next(iter(groups), "not recorded")
        note = ("same tokenizer for every candidate (weights " + key + "): output tok/s compare directly"
                if key != "not recorded" else
                "tokenizers not recorded (no local weights): output tok/s are compared as if the same; "
                "check that every candidate serves the same model")
    else:
        note = ("tokenizers differ (" + "; ".join(f"{k}: {', '.join(v)}" for k, v in groups.items())
                + "): token/s are per-tokenizer and not compared; candidates are ranked on completed "
                  "requests/s for the same prompts, with success rate and time per request")
    return Comparability(same_tokenizer=same, groups=groups, note=note)


def _by_round(c: CandidateResult) -> dict[int, list[float]]:
    e = c.effective_throughput or EffectiveThroughput()
    out: dict[int, list[float]] = {}
    for v, r in zip(e.samples, e.sample_repeats, strict=False):
        out.setdefault(r, []).append(v)
    return out


def _round_figures(c: CandidateResult) -> dict[int, float]:
    """Round -> the round's whole-run output tok/s (``per_repeat``, in the rounds' order)."""
    e = c.effective_throughput or EffectiveThroughput()
    rounds = list(dict.fromkeys(e.sample_repeats))
    if len(rounds) != len(e.per_repeat):
        return {}
    return dict(zip(rounds, e.per_repeat, strict=True))


def difference(a: str, ca: CandidateResult, b: str, cb: CandidateResult, metric: str) -> Difference:
    """:class:`Difference` of ``a`` over ``b`` on ``metric``: with 3 or more common rounds of interleaved
    repeats (output tok/s), the paired t over the rounds' whole-run figures
    (:func:`~servelab.bench.intervals.paired_rounds_ratio`); with fewer, paired by round on the time-block
    rates (:func:`~servelab.bench.intervals.paired_ratio_interval`); else Welch on all samples:
    ``"a sustains 1.9× b's output tok/s (95 % CI 1.6–2.3×)"`` when significant, else ``"no significant
    difference between a and b …"``; no interval when either has < 2 samples."""
    ra, rb = _by_round(ca), _by_round(cb)
    pa, pb = _round_figures(ca), _round_figures(cb)
    method = "welch-log"
    r = None
    if metric == "output_tokens_per_s" and len(pa) >= 3 and sorted(pa) == sorted(pb):
        # 3 rounds or more: the paired t over the rounds' whole-run figures (the rounds are the replicates)
        r = paired_rounds_ratio([pa[k] for k in sorted(pa)], [pb[k] for k in sorted(pb)])
        method = "paired-rounds-t"
    if r is None and metric == "output_tokens_per_s" and ra and sorted(ra) == sorted(rb):
        r = paired_ratio_interval([ra[k] for k in sorted(ra)], [rb[k] for k in sorted(rb)])
        method = "paired-rounds-log"
    if r is None:
        method = "welch-log"
        r = ratio_interval(_samples(ca, metric), _samples(cb, metric))
    what = _what(metric)
    if r is None:
        va, vb = _figure(ca, metric), _figure(cb, metric)
        ratio = (va / vb) if va and vb else None
        return Difference(a=a, b=b, metric=metric, ratio=ratio, significant=False,
                          text=f"no significant difference shown between {a} and {b}: too few samples for an "
                               f"interval ({what} ratio {_num(ratio)}×)")
    ci = Interval(lo=r.lo, hi=r.hi, level=r.level, n=len(_samples(ca, metric)) + len(_samples(cb, metric)),
                  method=method)
    if r.significant:
        text = f"{a} sustains {r.ratio:.2f}× {b}'s {what} (95 % CI {r.lo:.2f}–{r.hi:.2f}×)"
    else:
        text = (f"no significant difference between {a} and {b} in {what}: ratio {r.ratio:.2f}× "
                f"(95 % CI {r.lo:.2f}–{r.hi:.2f}×, includes 1)")
    return Difference(a=a, b=b, metric=metric, ratio=r.ratio, ci=ci, significant=r.significant, text=text)


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


def _extras(c: CandidateResult, currency: str) -> list[str]:
    """Sentences on capacity in req/s, the arrival run, cost and replicas, and the cancellation
    measurement (:func:`servelab.trial.lifecycle.cancellation_text`) when it passed (a failed one is the
    exclusion's reason), when the record has them."""
    out = []
    cancel = c.lifecycle.cancellation if c.lifecycle is not None else None
    if cancel is not None and cancel.verdict == "pass":
        out.append(cancellation_text(cancel))
    cap = c.capacity
    if cap is not None:
        if cap.rate_rps is not None:
            hi = f"{_num(cap.broke_at_rps)} req/s broke" if cap.broke_at_rps is not None else "no rate tried broke"
            out.append(f"capacity at the SLO: {_num(cap.rate_rps)} req/s held (open loop, {cap.arrival or 'poisson'} "
                       f"arrivals, {len(cap.probes)} probes; {hi}: the capacity lies in "
                       f"[{_num(cap.rate_rps)}, {_num(cap.broke_at_rps) if cap.broke_at_rps else '∞'}) req/s, "
                       "the resolution of the search, not a confidence interval)")
        elif cap.note:
            out.append(f"capacity at the SLO: {cap.note}")
    arr = c.arrival_run
    if arr is not None and not arr.skipped and c.arrival_verdicts:
        worst = _weakest([v.verdict for v in c.arrival_verdicts])
        bad = [v.objective for v in c.arrival_verdicts if v.verdict == "broken"]
        runs = 1 + sum(not r.skipped for r in c.arrival_repeats)
        out.append(f"at the expected rate ({arr.step}, bursts and mix, {runs} run(s)) the SLO is {worst}"
                   + (f": broken {', '.join(bad)}" if bad else ""))
        for v in c.arrival_verdicts:
            if v.confirm or (v.rule == "each-run" and v.verdict == "undetermined" and "broken" in v.run_verdicts):
                out.append(f"{v.objective} at the expected rate: {v.note}")
    cost = c.cost
    if cost is not None and cost.per_10k_output_tokens is not None:
        ci = cost.per_10k_ci
        what = "search resolution" if ci is not None and ci.method == "bracket" else "95 % CI"
        rng = (f" ({what} {ci.lo:.4g}–{ci.hi:.4g})" if ci is not None and ci.lo is not None and ci.hi is not None
               else "")
        out.append(f"cost {cost.per_10k_output_tokens:.4g} {cost.currency or currency} per 10k output tokens{rng}, "
                   f"{cost.per_1m_output_tokens:.4g} per 1M, at {_num(cost.tokens_per_s)} tok/s ({cost.basis}) "
                   f"and {cost.price_per_hour:g} {cost.currency or currency}/h")
    rep = c.replicas
    if rep is not None and rep.replicas is not None:
        what = "from the search's resolution" if cap is not None and cap.rate_rps is not None else "95 % CI"
        rr = f" ({what} {rep.lo}–{rep.hi})" if rep.lo is not None and rep.hi is not None and rep.lo != rep.hi else ""
        out.append(f"{rep.replicas} replica(s){rr} for the peak of {_num(rep.peak_rps)} req/s at "
                   f"{_num(rep.headroom * 100)}% headroom ({rep.basis})")
    return out


def budget_note(method: MethodRow | None) -> str | None:
    """What the trial's method and time budget allowed, in one sentence (``None`` without a method row)."""
    if method is None:
        return None
    parts = [f"{method.requests_per_step} requests per load step" if method.requests_per_step else None,
             (f"{method.repeats} interleaved round(s) of the ranked mix level" if method.mix_sweep
              else "no mix run together") if method.repeats is not None else None,
             (f"a capacity search of at most {method.capacity_search.get('max_probes')} probes of "
              f"{method.capacity_search.get('requests')} requests" if method.capacity_search else "no capacity search")
             if method.repeats is not None else None]
    b = method.budget
    if b is not None:
        parts.append(f"within a {b.limit_s / 60:g}-minute budget"
                     + (f" (spent: not run {', '.join(b.skipped)})" if b.skipped else ""))
    text = ", ".join(p for p in parts if p)
    if not text:
        return None
    small = method.requests_per_step is not None and method.requests_per_step < 72
    return ("the trial ran " + text + (
        "; with fewer than 72 requests a P95 has no upper confidence bound, so an SLO on it can be shown "
        "broken but not met ('undetermined')" if small else ""))


def decide(candidates: Mapping[str, CandidateResult], identities: Mapping[str, CandidateIdentity], *,
           goal: GoalRow | None = None, environment: EnvironmentRow | None = None,
           method: MethodRow | None = None) -> Decision:
    """The record's :class:`~servelab.trial.results.Decision` from ``results.candidates`` and
    ``identity.candidates``.

    Only candidates with ``status == "ranked"``, a level that met the SLO and a ranked figure are
    ranked (module doc): by output tok/s of the ranked workload (requests/s when tokenizers differ,
    :func:`comparability`), a candidate joining the group of the one above it when their ratio is not
    significant (:func:`difference`); a group is ordered by :data:`TIE_BREAK`. The first is ``adopt``,
    other ranked ones ``backup``, the rest ``exclude`` with the reason. ``differences`` holds each
    ranked candidate against the next; ``significant`` whether the adopted one is significantly ahead
    of the second. ``goal``/``environment``/``method`` (the record's rows) feed ``scope`` and
    ``recheck_when``, and ``method`` the ``budget_note`` (:func:`budget_note`).
    """
    names_all = list(dict.fromkeys([*candidates, *identities]))
    comp = comparability([n for n, c in candidates.items() if c.status == "ranked"], identities)
    metric = "output_tokens_per_s" if comp.same_tokenizer else "requests_per_s"
    eligible = [n for n, c in candidates.items()
                if c.status == "ranked" and c.max_step_meeting_slo is not None and _figure(c, metric) is not None
                and not _arrival_broken(c)]
    by_fig = sorted(eligible, key=lambda n: (-(_figure(candidates[n], metric) or 0.0), n))
    by_fig_all = [n for n, c in candidates.items()  # every candidate with a ranked figure, eligible or not
                  if c.status == "ranked" and _figure(c, metric) is not None]
    groups: list[list[str]] = []
    for n in by_fig:
        if groups and not difference(groups[-1][0], candidates[groups[-1][0]], n, candidates[n], metric).significant:
            groups[-1].append(n)
        else:
            groups.append([n])
    ranking: list[str] = []
    for g in groups:
        ranking.extend(sorted(g, key=lambda n: (_tail(candidates[n], "ttft_p95_s"),
                                                _tail(candidates[n], "e2e_p99_s"),
                                                -(_figure(candidates[n], metric) or 0.0), n)))
    group_of = {n: i for i, g in enumerate(groups) for n in g}
    diffs = [difference(a, candidates[a], b, candidates[b], metric) for a, b in zip(ranking, ranking[1:], strict=False)]
    currency = (goal.budget.currency if goal is not None else None) or "USD"

    verdicts: dict[str, Verdict] = {}
    best = ranking[0] if ranking else None
    for pos, n in enumerate(ranking):
        c = candidates[n]
        reasons: list[str] = []
        if pos == 0:
            top = (_figure(c, metric) or 0.0) >= max((_figure(candidates[m], metric) or 0.0) for m in ranking)
            head = ((f"highest {_what(metric)} at the SLO" if top else f"first at the SLO by the tie-break, its "
                     f"{_what(metric)} not significantly below the highest") if len(ranking) > 1
                    else "the only candidate that met the SLO")
            reasons.append(f"{head}: {_at(c, metric)}")
            if diffs:
                d = diffs[0]
                if d.significant:
                    reasons.append(f"significantly better than {d.b}: {d.text}")
                else:
                    reasons.append(f"{d.text}; ranked first by the tie-break ({TIE_BREAK}): "
                                   f"{_tie_break_text(c, candidates[d.b])}")
            # the others were excluded (e.g. at the expected rate): say how far ahead it is of each that has the
            # ranked figure too, significant or not, so "the winner" is never a bare claim
            for other in by_fig_all:
                if other != n and other not in eligible:
                    d = difference(n, c, other, candidates[other], metric)
                    reasons.append(f"against {other} (excluded): "
                                   + (f"significantly better: {d.text}" if d.significant else d.text))
        else:
            prev = ranking[pos - 1]
            d = diffs[pos - 1]
            rel = d.text if d.significant else (
                f"{d.text}; ranked after {prev} by the tie-break: {_tie_break_text(candidates[prev], c)}"
                if group_of[n] == group_of[prev] else d.text)
            reasons.append(f"ranked {pos + 1} of {len(ranking)}: {_at(c, metric)}; {rel}")
        eff = c.effective_throughput or EffectiveThroughput()
        bits = []
        if eff.goodput_output_tokens_per_s is not None:
            bits.append(f"goodput {_fmt_tps(eff.goodput_output_tokens_per_s)}"
                        f"{_fmt_ci(eff.goodput_output_tokens_per_s_ci, ' tok/s')} at "
                        f"{eff.at_step or c.max_step_meeting_slo}")
        if c.error_rate is not None:
            bits.append(f"error rate {_num(c.error_rate * 100)}% over all load steps")
        if bits:
            reasons.append("; ".join(bits))
        for w, cap in c.per_workload.items():
            reasons.append(f"{w} alone (reported apart, not added): up to {cap.max_step_meeting_slo or 'no level'}"
                           + (f", {_fmt_tps(cap.output_tokens_per_s)}{_fmt_ci(cap.output_tokens_per_s_ci)}"
                              if cap.output_tokens_per_s is not None else "")
                           + (f", broke at {cap.broken_at}" if cap.broken_at else ""))
        reasons.extend(_extras(c, currency))
        reasons.append(_beyond(c))
        verdicts[n] = Verdict(verdict="adopt" if pos == 0 else "backup", reasons=reasons)
    for n, c in candidates.items():
        if n not in verdicts:
            verdicts[n] = Verdict(verdict="exclude", reasons=[_exclude_reason(c), *_extras(c, currency)])

    comparisons = [compare_identities(identities.get(a), identities.get(b), a, b)
                   for i, a in enumerate(names_all) for b in names_all[i + 1:]]
    scope, recheck = _scope({n: identities.get(n) or CandidateIdentity() for n in names_all}, goal, environment,
                            method)
    if best is not None:
        at = candidates[best].max_step_meeting_slo
        recheck.append(f"the load needed exceeds {at}, the highest step at which {best} met the SLO")
    return Decision(ranking=ranking, adopt=best, verdicts={n: verdicts[n] for n in candidates},
                    comparisons=comparisons, scope=scope, recheck_when=recheck, differences=diffs,
                    significant=diffs[0].significant if diffs else None, tie_break=TIE_BREAK,
                    comparability=comp, budget_note=budget_note(method))


def candidate_levels(steps: Iterable[StepSummary]) -> list[str]:
    """The load-level labels of ``steps`` in load order (``["c1", "c2", "c4"]``)."""
    seen: dict[str, tuple[str, float, int]] = {}
    for i, s in enumerate(steps):
        seen.setdefault(str(s.step), _level_key(str(s.step), s, i))
    return sorted(seen, key=lambda k: seen[k])


__all__: Sequence[str] = ("MIX", "TIE_BREAK", "VOLATILE_KEYS", "EngineFacts", "candidate_levels", "comparability",
                          "budget_note", "compare_identities", "decide", "difference", "effective_step", "engine_facts",
                          "identity_factors", "objective_verdicts", "ranked_workload", "tokenizer_key")
