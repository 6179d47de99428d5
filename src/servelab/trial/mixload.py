"""The goal's mix as one load: the experiment's own workloads interleaved at the goal's ratio.

003 §19's fifth set ("mix the first four at their real ratio and watch tail latency, queueing and
errors") is what the decision ranks on. The bench's built-in ``mix`` set mixes the built-in sets with
shared overrides; the trial's mix instead takes each class from the experiment's own workload (its
``set`` overrides, or its dataset), so a short-qa request in the mix is the same kind of request as
in the short-qa sweep. Order: blocks of ``sum(weights)`` requests, each block holding every class
``weight`` times, shuffled per block with a seeded RNG (as the built-in mix does), so any prefix keeps
the ratio within one block.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from servelab.bench.workloads.kinds import Workload
from servelab.bench.workloads.registry import parse_ratio
from servelab.wire.types import RequestSpec

__all__ = ["experiment_mix"]


def experiment_mix(factory: Callable[[str, int], Any], ratio: str, seed: int) -> Workload:
    """A :class:`~servelab.bench.workloads.kinds.Workload` named ``mix`` whose request ``i`` is the next
    request of class ``name`` from ``factory(name, seed)`` (the trial's workload factory), the classes
    drawn at ``ratio`` (``"short-qa:3,structured:1"``). Each request keeps its class as its
    ``workload`` (requests.jsonl lines name it). Raises :class:`~servelab.wire.ConfigError` for a bad
    ratio."""
    parts = [(n, w) for n, w in parse_ratio(ratio) if w > 0]
    subs = {n: factory(n, seed) for n, _ in parts}
    block = [n for n, w in parts for _ in range(w)]
    weight = dict(parts)

    def make(i: int) -> RequestSpec:
        b, k = divmod(i, len(block))
        order = list(block)
        random.Random(f"servelab:{seed}:trial-mix:{b}").shuffle(order)
        name = order[k]
        spec: RequestSpec = subs[name].request(b * weight[name] + order[:k].count(name))
        spec.workload = name
        return spec

    tok = next((getattr(w, "tokenizer", None) for w in subs.values()), None)
    longest = [m for w in subs.values() if (m := getattr(w, "max_input_tokens", None)) is not None]
    return Workload(
        "mix",
        f"the experiment's workloads at ratio {ratio}, run together",
        make,
        tok,
        {"ratio": parts},
        max_input_tokens=max(longest) if longest else None,
    )
