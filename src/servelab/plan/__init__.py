"""Capacity planning: will a model fit a machine, how many concurrent sequences, and the roofline floors.

Public API (used by ``servelab plan`` and by ``servelab advise``):

- :func:`estimate` ``(model, hardware, count, context_tokens, concurrency, precision="bf16",
  kv_precision=None, tp=None, pp=1, ep=None, dp=1, engine=None, ...) -> CapacityPlan`` with ``.fits``,
  ``.to_dict()``, ``.render()``;
- :func:`smallest_fitting_layout` ``(model, hardware, context_tokens, concurrency, precision=...,
  ...) -> Layout | None``;
- :func:`default_layout` ``(model, count, pp=1, dp=1) -> (Layout, note)`` — the TP x DP split ``plan``
  uses when no ``--tp`` is given;
- :func:`llamacpp_memory` — llama-server's exact KV allocation for ``-c``/``-np``;
- :func:`sequence_state` — KV / state bytes of one sequence by attention kind.

Modules: :mod:`.memory` (parameters and bytes by part), :mod:`.kv` (state per attention kind, engine
paging), :mod:`.llamacpp`, :mod:`.roofline`, :mod:`.layouts`, :mod:`.estimate`, :mod:`.cli`.
"""

from __future__ import annotations

from servelab.plan.capacity_plan import CapacityPlan
from servelab.plan.estimate import estimate, smallest_fitting_layout
from servelab.plan.kv import sequence_state
from servelab.plan.layouts import Layout, default_layout
from servelab.plan.llamacpp import llamacpp_memory

__all__ = [
    "CapacityPlan",
    "Layout",
    "default_layout",
    "estimate",
    "llamacpp_memory",
    "sequence_state",
    "smallest_fitting_layout",
]
