"""Length distributions of workload overrides (``input_tokens``, ``output_tokens``, …): a fixed count,
a uniform range or a clipped normal, parsed once into a seeded sampler with its largest value."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from servelab.bench.options import MAX_PROMPT_TOKENS
from servelab.wire import ConfigError

__all__ = ["Length", "Sampler", "parse_length"]


Sampler = Callable[[random.Random], int]


@dataclass(frozen=True)
class Length:
    """A length distribution (``_tokens``): call it with an RNG for one length; ``max_tokens`` is
    the largest length it can return."""

    sample: Sampler
    max_tokens: int

    def __call__(self, rng: random.Random) -> int:
        return self.sample(rng)


def parse_length(value: Any, key: str, limit: int = MAX_PROMPT_TOKENS) -> Length:
    """Turn an override value into a :class:`Length` sampler ``rng -> int`` (``_tokens``, from 1 to ``limit``).

    Accepts an int (fixed), ``"N"``, ``"lo-hi"`` / ``(lo, hi)`` (uniform inclusive), ``"normal:mean,std"``
    or ``"normal:mean,std,min,max"`` (rounded, clipped; default clip [1, mean + 4 std]).
    Raises :class:`ConfigError` naming ``key`` on anything else, and when a length could exceed
    ``limit`` (servelab's bound, :data:`servelab.bench.options.MAX_PROMPT_TOKENS`: building such
    prompts would take minutes per request for a length no server accepts).
    """
    bad = ConfigError(f"bad {key}={value!r}: use N, LO-HI or normal:MEAN,STD[,MIN,MAX] (token counts >= 1)")
    too_long = ConfigError(
        f"bad {key}={value!r}: at most {limit} tokens per request (servelab's limit, "
        f"above any served context length); use a smaller value"
    )

    def bounded(sampler: Sampler, hi: float) -> Length:
        if hi > limit:
            raise too_long
        return Length(sampler, int(hi))

    if isinstance(value, bool):
        raise bad
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value) or value != int(value) or value < 1:
            raise bad
        n = int(value)
        return bounded(lambda rng: n, n)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        try:
            lo, hi = int(value[0]), int(value[1])
        except (TypeError, ValueError, OverflowError):
            raise bad from None
        return bounded(_uniform(lo, hi, bad), hi)
    if isinstance(value, str):
        s = value.strip().lower()
        if s.startswith("normal:"):
            try:
                parts = [float(x) for x in s[7:].split(",")]
            except ValueError:
                raise bad from None
            if len(parts) not in (2, 4) or not all(map(math.isfinite, parts)) or parts[1] < 0:
                raise bad
            mean, std = parts[0], parts[1]
            lo_f, hi_f = (parts[2], parts[3]) if len(parts) == 4 else (1.0, mean + 4 * std)
            if not math.isfinite(hi_f) or hi_f > limit:  # mean + 4 std can overflow to inf
                raise too_long
            return bounded(_normal(mean, std, int(lo_f), int(hi_f), bad), hi_f)
        for sep in ("-", ":", ".."):
            if sep in s:
                a, _, b = s.partition(sep)
                try:
                    lo, hi = int(a), int(b)
                except ValueError:
                    raise bad from None
                return bounded(_uniform(lo, hi, bad), hi)
        try:
            return parse_length(int(s), key, limit)
        except ValueError:
            raise bad from None
    raise bad


def _uniform(lo: int, hi: int, bad: Exception) -> Sampler:
    if lo < 1 or hi < lo:
        raise bad
    return lambda rng: rng.randint(lo, hi)


def _normal(mean: float, std: float, lo: int, hi: int, bad: Exception) -> Sampler:
    if lo < 1 or hi < lo:
        raise bad
    return lambda rng: min(hi, max(lo, int(round(rng.gauss(mean, std)))))
