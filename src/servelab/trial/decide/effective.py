"""What one candidate's load steps show it sustained at the SLO (000 §10.3, §11): the effective step.

:func:`effective_step` reads one candidate's bench step summaries (docs/summary-schema.md) and finds,
for its *ranked workload*, the highest load level that met every SLO and the error budget, the first
level that broke (and which objective broke it), what the engine sustained there with its interval,
the tail latency with intervals, the SLO verdicts by interval, each workload's own capacity apart, and
the error rate over all steps that ran. Pure: no I/O.

**What the engine sustained, and nothing else.** The ranked workload is ``mix`` (the goal's mix at its
ratio, run concurrently as one load, 003 §19's fifth set) when the steps hold it, else the only
workload. Its throughput at a level is the figure of that ONE run (the steady window when the trial
added one: in-flight at its target, ramp-up and drain left out), averaged over repeats of the same
level — never a sum over workloads that ran one after another: an engine that ran one workload at
83.9 tok/s and then another at 49.1 tok/s never sustained 133. Candidates whose steps hold several
workloads and no mix get no throughput figure (and are not ranked). Each workload's own sweep is
reported apart (``per_workload``).

**Levels.** Levels are ordered by load (``c1 < c2 < c4``); a level *meets* when every repeat of the
ranked workload at it met every objective on its point estimate and stayed within the error budget;
the effective level is the highest meeting level *below the first broken level* (a level that met
after a lower one broke is noise). Skipped steps never meet and never count in the error rate. Each
level and objective also carries a verdict by its 95 % interval (:func:`servelab.bench.analysis.intervals.slo_verdict`:
``met`` / ``broken`` / ``undetermined``): with 8 requests a P95 cannot be shown to be within a limit
(its upper bound needs 72), and the decision says so rather than state a bare number. The rules per
statistic, per-workload objectives and the expected-rate verdict are in :mod:`servelab.trial.verdicts`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from servelab.bench.analysis.intervals import Bounds, SloVerdict, mean_interval
from servelab.bench.analysis.slo import Objective, parse_slo
from servelab.bench.results import Interval, SloCheck, StepSummary
from servelab.trial.decide.fmt import fmt_obj_value, metric_of, num
from servelab.trial.results import (
    Break,
    CandidateResult,
    EffectiveStep,
    EffectiveThroughput,
    Level,
    ObjectiveVerdict,
    TailLatency,
    WorkloadCapacity,
)
from servelab.trial.verdicts import MIX, judged_on, objective_verdicts, stat_value

_STEP_RX = re.compile(r"^([a-z]+)([0-9]+(?:\.[0-9]+)?)$")
VERDICT_ORDER = {"broken": 0, "undetermined": 1, "met": 2}


def _iv(b: Bounds | None) -> Interval | None:
    return None if b is None else Interval(lo=b.lo, hi=b.hi, level=b.level, n=b.n, method=b.method)


def _rate_iv(b: Bounds) -> Interval | None:
    """A rate's interval: a rate is never below 0, so a t lower bound under 0 is cut there."""
    i = _iv(b)
    if i is not None and i.lo is not None and i.lo < 0:
        i.lo = 0.0
    return i


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
    """Like :func:`servelab.bench.analysis.slo.evaluate` but a missing statistic counts as not met, and a
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


def level_key(label: str, step: StepSummary, first_seen: int) -> tuple[str, float, int]:
    load = step.load
    mag = load.concurrency if load.kind == "closed" else load.rate_rps
    m = _STEP_RX.match(str(label))
    if mag is None and m:
        mag = float(m.group(2))
    kind = m.group(1) if m else str(load.kind or "")
    return (kind, mag if mag is not None else math.inf, first_seen)


def _step_breaks(step: StepSummary, objs: list[Objective] | None, budget: float | None, multi: bool) -> list[Break]:
    """The objectives a run (not skipped) step broke."""
    wl = step.workload
    out: list[Break] = []
    checks = _evaluate(objs, step) if objs is not None else step.slo
    for ch in checks:
        if ch.met:
            continue
        scoped = (ch.objective or "").split(":", 1)[0] if ":" in (ch.objective or "") else None
        out.append(
            Break(
                objective=ch.objective,
                metric=metric_of(ch.objective or "?"),
                value=ch.value,
                limit=ch.limit,
                workload=scoped or wl,
            )
        )
    if objs is None and not out and step.slo_met is False:
        out.append(
            Break(objective="slo", metric="slo", workload=wl, text="the bench marked the step as not meeting its SLO")
        )
    c = step.counts
    if budget is not None and c.submitted:
        rate = c.failed_total / c.submitted
        if rate > budget:
            out.append(
                Break(
                    objective=f"error_budget<={num(budget * 100)}%",
                    metric="error_budget",
                    value=rate,
                    limit=budget,
                    workload=wl,
                    text=f"error rate {num(rate * 100)}% > budget {num(budget * 100)}% "
                    f"({c.failed_total}/{c.submitted} failed)",
                )
            )
    for b in out:
        if not b.text:
            lim = b.limit
            b.text = (
                f"{b.metric} {fmt_obj_value(b.metric, b.value)} > "
                f"{fmt_obj_value(b.metric, lim) if lim is not None else '?'}"
            )
        if multi and wl:
            b.text += f" ({wl})"
    return out


def weakest(verdicts: Sequence[SloVerdict]) -> SloVerdict:
    """``broken`` before ``undetermined`` before ``met``."""
    out: SloVerdict = "met"
    for v in verdicts:
        if VERDICT_ORDER[v] < VERDICT_ORDER[out]:
            out = v
    return out


class _Sweep(NamedTuple):
    levels: list[Level]
    max_ok: str | None
    broken_at: str | None
    broken_by: list[Break]
    by_level: dict[str, list[StepSummary]]


def _sweep(steps: Sequence[StepSummary], objs: list[Objective] | None, budget: float | None, multi: bool) -> _Sweep:
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
            keys[label] = level_key(label, s, i)
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
        verdict = weakest(verdicts) if verdicts else None
        if breaks and verdict == "met":
            verdict = "undetermined"
        levels.append(
            Level(step=label, ran=bool(ran), met=met, verdict=verdict if ran else None, workloads=sorted(present))
        )
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
        eff.goodput_output_tokens_per_s_ci = Interval(
            lo=None if ci.lo is None else ci.lo * share,
            hi=None if ci.hi is None else ci.hi * share,
            level=ci.level,
            n=ci.n,
            method=ci.method,
        )
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


def effective_step(
    steps: Sequence[StepSummary],
    objectives: str | Iterable[Objective | str] | None = None,
    error_budget: float | str | None = None,
) -> EffectiveStep:
    """The effective load level of one candidate (module doc).

    ``steps``: bench step summaries (docs/summary-schema.md), any order, skipped ones and every
    repeat included (``StepSummary.repeat``). ``objectives``: ``None`` to use each step's own ``slo``
    checks and ``slo_met`` flag, else an SLO string, a list of SLO strings or
    :class:`~servelab.bench.analysis.slo.Objective` objects evaluated on the step statistics (a statistic that
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
        for key, metric, stat in (
            ("ttft_p95", "ttft_s", "p95"),
            ("itl_p95", "itl_s", "p95"),
            ("e2e_p99", "e2e_s", "p99"),
        ):
            v, ci = _worst(group, metric, stat)
            setattr(tail, f"{key}_s", v)
            setattr(tail, f"{key}_ci", ci)
        worst: dict[str, ObjectiveVerdict] = {}
        for s in group:
            for ov in objective_verdicts(s, _step_objectives(s, objs)):
                cur = worst.get(ov.objective)
                if (
                    cur is None
                    or VERDICT_ORDER[ov.verdict] < VERDICT_ORDER[cur.verdict]
                    or (ov.verdict == cur.verdict and (ov.value or 0) > (cur.value or 0))
                ):
                    worst[ov.objective] = ov
        verdicts = list(worst.values())
    return EffectiveStep(
        max_step_meeting_slo=sw.max_ok,
        broken_at=sw.broken_at,
        broken_by=sw.broken_by,
        effective_throughput=eff,
        tail_latency=tail,
        error_rate=(failed / submitted) if submitted else None,
        levels=sw.levels,
        ranked_on=ranked,
        slo_verdicts=verdicts,
        per_workload=per_workload,
    )


def candidate_levels(steps: Iterable[StepSummary]) -> list[str]:
    """The load-level labels of ``steps`` in load order (``["c1", "c2", "c4"]``)."""
    seen: dict[str, tuple[str, float, int]] = {}
    for i, s in enumerate(steps):
        seen.setdefault(str(s.step), level_key(str(s.step), s, i))
    return sorted(seen, key=lambda k: seen[k])


def arrival_broken(c: CandidateResult) -> list[ObjectiveVerdict]:
    """The objectives broken at the expected rate (:func:`servelab.trial.verdicts.expected_rate_verdicts`:
    by each run's interval, in every run; one run only by a margin above the run-to-run variation)."""
    return [v for v in c.arrival_verdicts if v.verdict == "broken"]
