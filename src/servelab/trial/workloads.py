"""The experiment's workloads by name, as the trial's bench runs build them: each listed workload (a
registered set with its ``set`` overrides, or a dataset), and ``mix``, the goal's mix of those same
workloads (:mod:`servelab.trial.mixload`) — or, when the arrival test sets mix overrides beyond the
ratio, the registered ``mix`` set with them. One tokenizer (``counter``) for every candidate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from servelab.bench.workloads import registry as W
from servelab.bench.workloads.datasets import load_dataset
from servelab.bench.workloads.kinds import Workload
from servelab.trial.mixload import experiment_mix
from servelab.trial.spec import Experiment

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["WorkloadFactory", "experiment_workloads"]

#: ``(name, seed) -> workload``, what :class:`servelab.bench.load.runner.Bench` builds each step from
WorkloadFactory = Callable[[str, int], Workload]


def experiment_workloads(
    exp: Experiment,
    counter: TokenCounter | None,
    *,
    seeded: bool = False,
    mix_overrides: Mapping[str, Any] | None = None,
) -> WorkloadFactory:
    """The factory of ``exp``'s workloads fitted with ``counter``. ``seeded``: every request carries a
    sampling seed (:meth:`~servelab.bench.workloads.kinds.Workload.with_request_seeds`; the quality gate).
    ``mix_overrides``: the arrival test's ``set`` with its ``ratio``."""
    table = {w.label: w for w in exp.workloads}

    def factory(name: str, seed: int) -> Workload:
        if name == "mix" and mix_overrides and set(mix_overrides) - {"ratio"}:  # arrival_test.set beyond the ratio
            return W.make_workload("mix", counter, seed=seed, ignore_eos=exp.ignore_eos, **mix_overrides)
        return plain(name, seed)

    def plain(name: str, seed: int) -> Workload:
        w = table.get(name)
        if name == "mix" and w is None:
            return experiment_mix(plain, exp.arrival_mix, seed)
        if w is not None and w.dataset is not None:
            return load_dataset(w.dataset, counter, seed=seed, max_tokens_default=w.max_tokens_default)
        return W.make_workload(name, counter, seed=seed, ignore_eos=exp.ignore_eos, **(w.set if w is not None else {}))

    if not seeded:
        return factory
    return lambda name, seed: factory(name, seed).with_request_seeds(seed)
