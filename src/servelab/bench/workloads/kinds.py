"""What a workload is: :class:`WorkloadKind` (a registered set and its builder), the
:class:`WorkloadContext` a builder builds from, and the :class:`Workload` it produces (request ``i`` on
demand, deterministic per seed), with the helpers every set shares (per-request RNG, request specs,
checked JSON values)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from servelab.bench.options import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
from servelab.bench.workloads.lengths import Length, parse_length
from servelab.bench.workloads.text import TextMaker
from servelab.wire import ConfigError, RequestSpec

__all__ = ["Workload", "WorkloadContext", "WorkloadKind", "check_sendable", "json_value", "request_rng", "request_spec"]


@dataclass(frozen=True)
class WorkloadKind:
    """A workload set: ``build`` turns a :class:`WorkloadContext` (seed, endpoint, token counter,
    overrides) into request ``i``'s maker (``None``: a set the bench command builds from its own options —
    a trace file, a number of sessions —, :mod:`servelab.bench.workloads.production`); ``mixable``: a class the
    ``mix`` set (and a trial's goal mix) can draw; ``keys``: override keys it reads beyond the common ones.
    Adding a set is one :func:`register_workload` call; ``servelab bench -w NAME`` and, for a set built by
    name, a trial's ``workloads:`` then accept it."""

    name: str
    description: str
    build: Callable[[WorkloadContext], Callable[[int], RequestSpec]] | None
    mixable: bool = False
    keys: frozenset[str] = frozenset()


def json_value(text: str, where: str, fix: str) -> Any:
    """``json.loads(text)``; a :class:`ConfigError` starting with ``where`` for invalid or too deeply
    nested JSON (the parser's recursion limit), ending with ``fix``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{where}JSON nested too deeply to read; {fix}") from None
    except ValueError:
        raise ConfigError(f"{where}invalid JSON {text[:40]!r}; {fix}") from None


def check_sendable(obj: Any, where: str) -> None:
    """Raise :class:`ConfigError` (starting with ``where``) unless ``obj`` can be sent as a request
    body: the client serialises with orjson, which refuses nesting deeper than 254 levels ("Recursion
    limit reached") and integers beyond 64 bits (orjson's limits:
    https://github.com/ijl/orjson#serialize) — found here, once, instead of failing every request."""
    try:
        orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError) as e:
        raise ConfigError(
            f"{where}cannot be sent as JSON ({e}); keep nesting under 250 levels and integers within 64 bits"
        ) from None


@dataclass
class Workload:
    """A named, deterministic request generator.

    ``requests(n)`` returns the first ``n`` :class:`RequestSpec` (reproducible for a given seed; a
    prefix of any longer call). ``request(i)`` returns request ``i`` alone. ``tokenizer`` is the name
    of the tokenizer the prompt lengths were fitted with (``None``: approximate word counts).
    ``skipped`` counts dataset entries left out (ShareGPT entries without a human turn).
    ``max_input_tokens`` is the longest prompt target of a built-in set (``None``: unknown, datasets).
    ``summary_extra`` (optional) returns the set's own figures for its step of ``summary.json`` over the
    requests built so far (``{"language": ...}``, ``{"rag": ...}``; :mod:`servelab.bench.workloads.extras`).
    """

    name: str
    description: str
    _make: Callable[[int], RequestSpec] = field(repr=False)
    tokenizer: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    skipped: int = 0
    max_input_tokens: int | None = None
    summary_extra: Callable[[], dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    def request(self, i: int) -> RequestSpec:
        """Request number ``i`` (0-based)."""
        if i < 0:
            raise IndexError(i)
        return self._make(i)

    def requests(self, n: int) -> list[RequestSpec]:
        """The first ``n`` requests, in order."""
        return [self._make(i) for i in range(n)]

    def with_request_seeds(self, base: int) -> Workload:
        """This workload with a sampling ``seed`` of ``base + i`` in request ``i``'s ``extra``: the engine's
        own sampling settings, as served, but repeatable (the trial's quality gate)."""
        make = self._make

        def seeded(i: int) -> RequestSpec:
            spec = make(i)
            spec.extra = {**spec.extra, "seed": base + i}
            return spec

        return replace(self, _make=seeded)


def request_rng(seed: int, name: str, i: int) -> random.Random:
    return random.Random(f"servelab:{seed}:{name}:{i}")


def request_spec(
    endpoint: str,
    text: str,
    max_tokens: int,
    workload: str,
    target: int | None,
    ignore_eos: bool,
    extra: dict[str, Any],
    json_schema: dict[str, Any] | None = None,
    response_format: dict[str, Any] | None = None,
) -> RequestSpec:
    ex = dict(extra)
    if response_format is not None:
        ex["response_format"] = response_format
    forced = ignore_eos and json_schema is None
    if forced:
        ex["ignore_eos"] = True  # the output length is fixed on purpose: reaching it is no truncation
    if endpoint == "chat":
        return RequestSpec(
            endpoint="chat",
            max_tokens=max_tokens,
            messages=[{"role": "user", "content": text}],
            extra=ex,
            workload=workload,
            json_schema=json_schema,
            prompt_tokens_target=target,
            allow_truncation=forced,
        )
    return RequestSpec(
        endpoint="completions",
        max_tokens=max_tokens,
        prompt=text,
        extra=ex,
        workload=workload,
        json_schema=json_schema,
        prompt_tokens_target=target,
        allow_truncation=forced,
    )


@dataclass
class WorkloadContext:
    """What a :class:`WorkloadKind`'s builder builds from: ``maker`` (text of a given length in the
    workload tokenizer), ``seed``, ``endpoint`` (``chat`` or ``completions``), ``ignore_eos``, the
    requests' ``extra`` fields and the ``overrides`` (``--set``). A builder may raise
    ``max_input_tokens`` (:meth:`length` does for ``input_tokens``), and set ``note`` (added to the
    description) and ``params`` (the workload's recorded parameters; default: the overrides)."""

    maker: TextMaker
    seed: int
    endpoint: str
    ignore_eos: bool
    extra: dict[str, Any]
    overrides: dict[str, Any]

    max_input_tokens: int = 0  # the longest prompt any builder using this context can make
    note: str = ""
    params: dict[str, Any] | None = None

    def request(self, text: str, max_tokens: int, workload: str, target: int | None) -> RequestSpec:
        """A request of ``text`` (the user message, or the prompt) answered in up to ``max_tokens``."""
        return request_spec(self.endpoint, text, max_tokens, workload, target, self.ignore_eos, self.extra)

    def length(self, key: str, default: Any) -> Length:
        limit = MAX_OUTPUT_TOKENS if key == "output_tokens" else MAX_PROMPT_TOKENS
        dist = parse_length(self.overrides.get(key, default), key, limit)
        if key == "input_tokens":
            self.max_input_tokens = max(self.max_input_tokens, dist.max_tokens)
        return dist

    def target(self, n: int) -> int | None:
        return n if self.maker.counter is not None else None
