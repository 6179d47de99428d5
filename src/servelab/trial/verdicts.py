"""SLO verdicts the decision can defend: one objective on one run, scoped to a workload when the goal
names one, and the expected-rate verdict over every run of the arrival test. Pure functions, no I/O.

**One objective on one run** (:func:`objective_verdict`): ``met`` / ``broken`` / ``undetermined``
from the statistic's 95 % interval (:func:`servelab.bench.analysis.intervals.slo_verdict`: met when the upper
bound is within the limit, broken when the lower bound is beyond it):

- a percentile (P50/P95/P99): the order-statistic interval the bench computed (exact binomial ranks,
  Hutson's fractional order statistics; :mod:`servelab.bench.analysis.intervals`); P90 has none: undetermined;
- the error rate: Clopper-Pearson on failed/submitted (Clopper & Pearson 1934,
  https://doi.org/10.1093/biomet/26.4.404);
- a **mean**: Student's t interval ``mean ± t_{0.975, n-1} · s / sqrt(n)`` (Student 1908, Biometrika
  6:1-25, https://doi.org/10.1093/biomet/6.1.1; the IUPAC Gold Book's "confidence limits (about the
  mean)", https://goldbook.iupac.org/plain/C01247-plain.html, read 2026-12-01), from
  the sample's mean, standard deviation ``s`` (``Dist.std``) and count. A latency sample is skewed to
  the right, where the t interval of a small sample covers a little less than 95 % (the central
  limit theorem is slow there); a bootstrap interval is no better at n = 8-24 (Efron & Tibshirani,
  *An Introduction to the Bootstrap*, 1993, §13.4: its percentile intervals are too narrow at small n),
  so the t interval is used and its assumption named. No standard deviation recorded (a summary
  before ``std`` existed) or fewer than 2 values: undetermined;
- a **max**: no interval can be claimed for a sample maximum (any larger sample may exceed it), so a
  max objective is judged on the observation: ``broken`` when the observed maximum exceeds the limit
  (a fact of the sample), otherwise ``met`` *in the sample* (``note`` says "met in the sample (n=…)",
  ``ci`` is empty).

**Per-workload objectives** (:class:`ScopedObjective`, the goal's ``workload_slo``): an objective
that names a workload is judged on that workload's requests only: on a step of that workload, or on
the requests of that class inside a ``mix`` step (``StepSummary.by_class``: each request record
knows its workload); it does not apply to other steps.

**The expected-rate verdict** (:func:`expected_rate_verdicts`). A run's order-statistic interval
accounts for sampling within the run only; on a shared host, runs of the same configuration move more
than that (the same 12-request arrival test of one candidate gave TTFT P95 2.82 s in one trial and
4.79 s in the next). An exclusion must survive that variation, so:

- with two runs or more (the arrival test runs again in each later repeat round, interleaved with
  the other candidates like the load steps, while some objective is broken in every run so far:
  :func:`exclusion_open`; once none is, no further run can make it ``broken``, and the budget is kept
  for the rest), the objective is ``broken`` only when it is broken in *every* run, ``met`` only when
  met in every run, else ``undetermined``. This is an intersection-union test
  (Berger 1982, "Multiparameter hypothesis testing and acceptance sampling", Technometrics
  24(4):295-300; Casella & Berger, *Statistical Inference*, 2nd ed., 2002, §8.3.3: an IUT whose
  component tests have size alpha has size at most alpha): "broken in each run's condition"
  is the intersection of the per-run claims, and rejecting each at level 5 % rejects the
  intersection at level 5 % whatever the dependence between runs and whatever shifts the host
  caused between them. The runs are not pooled into one sample: that would assume they are draws
  from one distribution, which is exactly what run-to-run variation denies, and would make the
  interval narrower the more the runs disagree;
- with one run (the budget held no more, or ``repeats: 1``), a "broken" verdict stands only when its
  margin — the lower bound's excess over the limit, ``lo / limit - 1`` — is larger than the run-to-run
  variation of the same statistic measured on that candidate's repeated load steps
  (:func:`run_to_run_variation`: the largest ``max / min - 1`` between repeats of one step), or, when
  no step of it ran twice (the budget skipped the repeats), than :data:`ASSUMED_RUN_SHIFT` (a run
  may sit 25 % above its configuration's centre: the lower bound divided by 1.25 must still be over
  the limit). With a smaller margin the verdict is ``undetermined`` and ``confirm`` is set: the
  decision says a confirmation run is needed before the candidate can be excluded on it.

A clear breach (every request of a one-slot engine queued behind the bursts: TTFT P95 5.5 s, 95 % CI
4.94 s-unbounded against 3 s) is broken in each run and still excludes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from servelab.bench.analysis.intervals import Bounds, SloVerdict, proportion_interval, slo_verdict, t_quantile
from servelab.bench.analysis.slo import Objective, parse_slo
from servelab.bench.results import Dist, Interval, StepSummary
from servelab.trial.results import ObjectiveVerdict

__all__ = [
    "MIX",
    "ScopedObjective",
    "exclusion_open",
    "expected_rate_verdicts",
    "judged_on",
    "mean_bounds",
    "objective_verdict",
    "objective_verdicts",
    "run_to_run_variation",
    "scoped_objectives",
    "stat_value",
    "t_mean_bounds",
]

MIX = "mix"
"""The workload name of the goal's mix run concurrently."""


@dataclass(frozen=True)
class ScopedObjective(Objective):
    """An :class:`~servelab.bench.analysis.slo.Objective` judged on one workload's requests only (``workload``;
    ``None`` = every request). ``name``: ``structured:ttft_p95<=5s``."""

    workload: str | None = None

    @property
    def name(self) -> str:
        """The objective as written back, prefixed by its workload: ``structured:ttft_p95<=5s``."""
        base = Objective(self.metric, self.stat, self.limit).name
        return f"{self.workload}:{base}" if self.workload else base


def scoped_objectives(workload_slo: dict[str, str] | None) -> list[ScopedObjective]:
    """The goal's ``workload_slo`` (workload name -> SLO string in :func:`servelab.bench.analysis.slo.parse_slo`
    syntax) as :class:`ScopedObjective` objects, in the order written. Raises
    :class:`~servelab.wire.ConfigError` for an SLO string that does not parse."""
    out: list[ScopedObjective] = []
    for w, text in (workload_slo or {}).items():
        out.extend(ScopedObjective(o.metric, o.stat, o.limit, workload=w) for o in parse_slo(text))
    return out


def workload_of(o: Objective) -> str | None:
    """The workload an objective is scoped to (``None`` for a plain objective)."""
    return getattr(o, "workload", None)


def judged_on(step: StepSummary, o: Objective) -> StepSummary | None:
    """The step summary objective ``o`` is judged on for ``step``: ``step`` itself for a plain
    objective or a step of ``o``'s own workload; that class's figures inside a ``mix`` step
    (``step.by_class[workload]``); ``None`` when ``o`` does not apply (another workload, or a mix
    without requests of that class)."""
    w = workload_of(o)
    if w is None or step.workload == w:
        return step
    if step.workload == MIX:
        return step.by_class.get(w)
    return None


def stat_value(step: StepSummary, o: Objective) -> float | None:
    """The point value of ``o``'s statistic on ``step`` itself (no scoping): the error rate
    failed/submitted, else ``step.<metric>_s.<stat>``; ``None`` when not computed."""
    if o.metric == "error_rate":
        c = step.counts
        return (c.failed_total / c.submitted) if c.submitted else None
    v = getattr(step.dist(o.metric), o.stat, None)
    return float(v) if isinstance(v, (int, float)) else None


def t_mean_bounds(mean: float | None, sd: float | None, n: int) -> Bounds:
    """Student's t 95 % interval of a mean (module doc): ``mean ± t_{0.975, n-1} · sd / sqrt(n)``,
    ``sd`` the sample standard deviation (ddof 1), in the unit of ``mean``. Unbounded (``None``,
    ``None``) when ``n < 2`` or ``mean``/``sd`` is unknown."""
    if mean is None or sd is None or n < 2:
        return Bounds(None, None, 0.95, n, "t")
    half = t_quantile(0.975, n - 1) * float(sd) / math.sqrt(n)
    return Bounds(mean - half, mean + half, 0.95, n, "t")


def mean_bounds(d: Dist) -> Bounds:
    """:func:`t_mean_bounds` of distribution ``d`` with ``s`` = ``d.std`` (``None`` below 2 values, or in
    a summary written before ``std`` was recorded: unbounded)."""
    return t_mean_bounds(d.mean, d.std, d.count)


def _iv(b: Bounds | None) -> Interval | None:
    return None if b is None else Interval(lo=b.lo, hi=b.hi, level=b.level, n=b.n, method=b.method)


def _bounds(i: Interval | None) -> Bounds | None:
    return None if i is None else Bounds(i.lo, i.hi, i.level, i.n, i.method)


def objective_verdict(step: StepSummary, o: Objective) -> ObjectiveVerdict | None:
    """``o`` on ``step`` by its interval (module doc), or ``None`` when ``o`` does not apply to
    ``step`` (:func:`judged_on`). ``workload`` is the scoped workload, else the step's."""
    sub = judged_on(step, o)
    if sub is None:
        return None
    value = stat_value(sub, o)
    wl = workload_of(o) or step.workload
    note: str | None = None
    b: Bounds | None
    if o.metric == "error_rate":
        c = sub.counts
        b = proportion_interval(c.failed_total, c.submitted) if c.submitted else None
    elif o.stat == "max":
        n = sub.dist(o.metric).count
        if value is not None and value > o.limit:
            return ObjectiveVerdict(
                objective=o.name,
                value=value,
                limit=o.limit,
                verdict="broken",
                workload=wl,
                note=f"observed maximum {value:.3g} > limit {o.limit:g}: a fact of the "
                f"sample (n={n}), no interval needed",
            )
        if value is None:
            return ObjectiveVerdict(
                objective=o.name,
                value=None,
                limit=o.limit,
                verdict="undetermined",
                workload=wl,
                note="no value: no successful request",
            )
        return ObjectiveVerdict(
            objective=o.name,
            value=value,
            limit=o.limit,
            verdict="met",
            workload=wl,
            note=f"met in the sample (n={n}): no interval is claimed for a maximum (a larger sample may exceed it)",
        )
    elif o.stat == "mean":
        d = sub.dist(o.metric)
        b = mean_bounds(d)
        if b.lo is None:
            note = (
                "no interval: fewer than 2 values"
                if d.count < 2
                else "no interval: the step records no standard deviation"
            )
    else:
        b = _bounds(sub.dist(o.metric).ci(o.stat))
        if b is None:
            note = f"no interval recorded for {o.stat}"
    return ObjectiveVerdict(
        objective=o.name, value=value, limit=o.limit, ci=_iv(b), verdict=slo_verdict(b, o.limit), workload=wl, note=note
    )


def objective_verdicts(step: StepSummary, objectives: Iterable[Objective]) -> list[ObjectiveVerdict]:
    """:func:`objective_verdict` of every objective that applies to ``step``, in order."""
    return [v for o in objectives if (v := objective_verdict(step, o)) is not None]


#: the shift of one run from its configuration's centre assumed when none was measured (no load step ran
#: twice): ±25 %, the run-to-run variation of identical runs on a shared host that servelab's own default
#: trials showed on a 2-core box (the same 12-request arrival test: TTFT P95 2.82 s in one trial, 4.79 s,
#: i.e. 3.8 s ± 26 %, in the next)
ASSUMED_RUN_SHIFT = 0.25


def run_to_run_variation(steps: Sequence[StepSummary], o: Objective) -> float | None:
    """The run-to-run variation of ``o``'s statistic on a candidate: over every load step that ran in
    two repeat rounds or more (same workload, same level, ``StepSummary.repeat`` differing), the
    largest relative spread ``max / min - 1`` of its point values (``inf`` when one is 0 and another
    is not); ``None`` when no step ran twice (no variation is known)."""
    groups: dict[tuple[str, str], dict[int, float]] = {}
    for s in steps:
        if s.skipped:
            continue
        sub = judged_on(s, o)
        v = stat_value(sub, o) if sub is not None else None
        if v is None:
            continue
        groups.setdefault((s.workload, str(s.step)), {})[s.repeat or 0] = v
    out: float | None = None
    for vals in groups.values():
        if len(vals) < 2:
            continue
        lo, hi = min(vals.values()), max(vals.values())
        spread = (hi / lo - 1.0) if lo > 0 else (0.0 if hi == 0 else math.inf)
        out = spread if out is None else max(out, spread)
    return out


def _pct(x: float) -> str:
    return "∞" if math.isinf(x) else f"{x * 100:.0f}%"


def _combine(o: Objective, runs: list[ObjectiveVerdict], variation: float | None) -> ObjectiveVerdict:
    """The expected-rate verdict of ``o`` from its verdict in each run (module doc)."""
    per: list[SloVerdict] = [r.verdict for r in runs]
    if len(runs) >= 2:
        if all(v == "broken" for v in per):
            verdict: SloVerdict = "broken"
            pick = min(runs, key=lambda r: r.ci.lo if r.ci is not None and r.ci.lo is not None else -math.inf)
        elif all(v == "met" for v in per):
            verdict = "met"
            pick = max(runs, key=lambda r: r.ci.hi if r.ci is not None and r.ci.hi is not None else math.inf)
        else:
            verdict = "undetermined"
            pick = max(runs, key=lambda r: r.value if r.value is not None else -math.inf)
        counts = ", ".join(f"{per.count(v)} {v}" for v in ("broken", "undetermined", "met") if per.count(v))
        note = (
            f"{per[0]} in each of {len(runs)} runs"
            if len(set(per)) == 1
            else f"not the same in every run ({counts} of {len(runs)}): an exclusion needs a breach in each run"
        )
        return pick.model_copy(
            update={
                "verdict": verdict,
                "run_verdicts": per,
                "rule": "each-run",
                "variation": variation,
                "note": note,
                "run_values": [r.value for r in runs],
            }
        )
    one = runs[0]
    upd: dict[str, object] = {"run_verdicts": per, "rule": "one-run", "variation": variation, "run_values": [one.value]}
    if one.verdict == "broken" and o.stat != "max":
        lo = one.ci.lo if one.ci is not None else None
        margin = math.inf if lo is None or o.limit <= 0 else lo / o.limit - 1.0
        against = variation if variation is not None else ASSUMED_RUN_SHIFT
        what = (
            f"the run-to-run variation of {_pct(against)} on its repeated load steps"
            if variation is not None
            else f"the ±{_pct(against)} run-to-run variation assumed when none is measured (no load step of it "
            "ran twice)"
        )
        if margin > against:
            upd["note"] = (
                f"broken in its one run by a margin of {_pct(margin)} (lower bound over the limit), more than {what}"
            )
        else:
            why = f"not more than {what}"
            upd.update(
                verdict="undetermined",
                confirm=True,
                note=f"broken in its one run by a margin of {_pct(margin)} (lower bound over the limit), "
                f"{why}: a confirmation run is needed before excluding on it",
            )
    return one.model_copy(update=upd)


def exclusion_open(runs: Sequence[StepSummary], objectives: Sequence[Objective]) -> list[str]:
    """The objectives broken in *every* run of ``runs`` so far (skipped ones left out): only for them can
    a further run still end in ``broken`` under the each-run rule, so the flow runs the arrival test in
    a later repeat round only while this is not empty (curtailed sequential testing: a run that cannot
    change the verdict is not spent). ``[]`` when no run ran."""
    ran = [r for r in runs if not r.skipped]
    out = []
    for o in objectives:
        per = [v.verdict for r in ran if (v := objective_verdict(r, o)) is not None]
        if per and all(v == "broken" for v in per):
            out.append(o.name)
    return out


def expected_rate_verdicts(
    runs: Sequence[StepSummary], objectives: Sequence[Objective], steps: Sequence[StepSummary] = ()
) -> list[ObjectiveVerdict]:
    """Each objective at the expected rate over every run of the arrival test (``runs``, skipped ones
    left out; module doc): ``rule`` ``each-run`` (two runs or more: broken / met only when so in every
    run) or ``one-run`` (broken only by a margin above :func:`run_to_run_variation` of ``steps``, the
    candidate's load steps; else undetermined with ``confirm``). ``run_verdicts``/``run_values`` hold
    each run's own; ``value``/``ci`` are those of the run the verdict rests on (broken: the smallest
    lower bound; met: the largest upper bound; else the largest value). ``[]`` when no run ran."""
    ran = [r for r in runs if not r.skipped]
    if not ran:
        return []
    out: list[ObjectiveVerdict] = []
    for o in objectives:
        per = [v for r in ran if (v := objective_verdict(r, o)) is not None]
        if per:
            out.append(_combine(o, per, run_to_run_variation(steps, o)))
    return out
