"""Token lengths for a traffic profile taken from evidence instead of declared (``lengths_from:`` in
the profile, :class:`~servelab.capacity.profile.LengthsFrom`): a request trace (the formats
``servelab bench --trace`` reads: Mooncake JSONL, Azure LLM inference CSV, BurstGPT CSV; its input
and output token columns) or a run folder (a ``servelab bench`` run or a ``servelab trial`` run: the
server-reported prompt and output tokens of every succeeded, measured request in every
``requests.jsonl`` under it). The lengths become the profile's empirical ``values``, drawn with
replacement; at most :data:`MAX_VALUES` are kept (a seeded uniform subsample, so a long trace does not
make the profile's sample unbounded)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from servelab.capacity.evidence import read_lines
from servelab.wire.errors import ConfigError

__all__ = ["MAX_VALUES", "lengths_of_run", "lengths_of_trace"]

#: most token counts kept per side (a seeded subsample beyond it)
MAX_VALUES = 20_000


def _cap(inp: list[int], out: list[int], seed: int = 0) -> tuple[list[int], list[int]]:
    if len(inp) <= MAX_VALUES:
        return inp, out
    k = np.random.default_rng(seed).choice(len(inp), MAX_VALUES, replace=False)
    return [inp[i] for i in sorted(k)], [out[i] for i in sorted(k)]


def lengths_of_trace(path: Path) -> tuple[list[int], list[int]]:
    """``(input tokens, output tokens)`` of every request of the trace at ``path`` (format told by its
    first line). Raises :class:`ConfigError` for an unreadable trace or one without a request."""
    from servelab.bench.workloads.traces import read_trace

    tr = read_trace(path)
    pairs = [(e.input_tokens, e.output_tokens) for e in tr.entries if e.input_tokens > 0 and e.output_tokens > 0]
    if not pairs:
        raise ConfigError(f"{path}: the trace has no request with input and output tokens; give another trace")
    return _cap([a for a, _ in pairs], [b for _, b in pairs])


def lengths_of_run(folder: Path) -> tuple[list[int], list[int]]:
    """``(prompt tokens, output tokens)`` (server usage) of every succeeded, measured request in the
    ``requests.jsonl`` files under ``folder``. Raises :class:`ConfigError` when there is none."""
    if not folder.is_dir():
        raise ConfigError(f"{folder}: not a folder; give a servelab bench or trial run folder")
    inp: list[int] = []
    out: list[int] = []
    for f in sorted(folder.rglob("requests.jsonl")):
        for line in read_lines(f):
            if line.warmup or line.failure is not None or not line.prompt_tokens or not line.output_tokens:
                continue
            inp.append(line.prompt_tokens)
            out.append(line.output_tokens)
    if not inp:
        raise ConfigError(
            f"{folder}: no measured request with token usage under it; give a servelab bench or trial run folder"
        )
    return _cap(inp, out)
