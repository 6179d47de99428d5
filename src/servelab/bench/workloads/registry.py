"""The one registry of workload sets (:func:`register_workload`) and :func:`make_workload`, which builds a
registered set by name; the built-in sets (:mod:`servelab.bench.workloads.builtin`, the test sets of
spec 003 §19) and ``mix`` are registered here, user datasets are read by
:mod:`servelab.bench.workloads.datasets`.

Sets (``WORKLOADS``):

==================  ===========================================  ==============================
name                input (``_tokens``)                          output (``max_tokens``)
==================  ===========================================  ==============================
``short-qa``        normal(64, 16) clipped to [16, 160]          uniform 32-128
``rag``             uniform 1000-3000 (context passages + Q)     uniform 64-128
``long-gen``        normal(64, 12) clipped to [24, 128]          uniform 512-1024
``structured``      uniform 64-256 (text to extract from)        uniform 128-256, JSON schema
``mix``             the four above by ``ratio``                  (per set)
``shared-prefix``   ``prefix_tokens`` shared + ``suffix_tokens``  uniform 32-64
``tools``           uniform 64-256 + a request for one tool      uniform 128-256, tool calls gated
==================  ===========================================  ==============================

**What the input target counts.** ``RequestSpec.prompt_tokens_target`` is the number of tokens of the
*user message content* (chat) or of ``prompt`` (completions) with the given tokenizer, without BOS.
The prompt text is trimmed until ``counter.count(text) == target`` exactly. The server's
``usage.prompt_tokens`` is larger: it adds BOS (``counter.bos_tokens``) and, for chat, the chat
template's tokens. Without a tokenizer (``counter=None``) lengths are approximated with
0.75 words per token and ``prompt_tokens_target`` is ``None``.

**Overrides** (``make_workload(..., key=value)``; the CLI's ``--set key=value``). A key that applies
to some other set is accepted and ignored (one ``--set`` list serves several sets); an unknown key
raises :class:`ConfigError`.

- ``input_tokens``, ``output_tokens``: a length distribution, one of ``128`` (fixed), ``"100-200"`` or
  ``(100, 200)`` (uniform, inclusive), ``"normal:64,16"`` or ``"normal:64,16,8,200"`` (normal mean,
  std[, min, max], rounded and clipped). ``input_tokens=128, output_tokens=64`` fixes both.
  For ``shared-prefix`` ``input_tokens`` is not used (see below).
- ``ratio`` (``mix``): ``"short-qa:5,rag:2,long-gen:1,structured:2"`` (the default); sets left out get 0.
  Every block of ``sum(weights)`` consecutive requests holds exactly that many of each set, in a
  seeded random order, so the ratio is exact at every multiple of the block size.
- ``prefix_tokens`` (1024), ``num_prefixes`` (8), ``suffix_tokens`` (32) (``shared-prefix``): request ``i``
  uses prefix ``i % num_prefixes`` followed by a distinct suffix; its target is
  ``prefix_tokens + suffix_tokens`` and the prefix's tokens are identical in every request using it.
- ``lang``: ``"en"`` (default), ``"zh"`` or ``"mixed"`` (English and Chinese sentences) prompt text.
- ``extra``: a dict merged into every request's ``extra`` (e.g. ``{"temperature": 0}``).

Determinism: request ``i`` depends only on (set, seed, i, overrides, tokenizer), so ``requests(n)`` is
a prefix of ``requests(m)`` for ``n < m`` and the same seed gives identical specs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from servelab.bench.options import MAX_MIX_WEIGHT, split_list
from servelab.bench.workloads.builtin import MIXABLE_SETS, OTHER_SETS
from servelab.bench.workloads.kinds import (
    Workload,
    WorkloadContext,
    WorkloadKind,
    check_sendable,
    json_value,
    request_rng,
)
from servelab.bench.workloads.text import TextMaker
from servelab.wire import ConfigError, RequestSpec

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = [
    "DEFAULT_RATIO",
    "OPTION_WORKLOADS",
    "WORKLOADS",
    "make_workload",
    "mixable_workloads",
    "parse_ratio",
    "register_workload",
    "unregister_workload",
]


_KINDS: dict[str, WorkloadKind] = {}  # the one table of workload sets, in registration order


class _Descriptions(Mapping[str, str]):
    """The registered sets built by name (``by_name``) or from the bench command's options, name ->
    description, as registered now."""

    def __init__(self, by_name: bool) -> None:
        self.by_name = by_name

    def _names(self) -> list[str]:
        return [n for n, k in _KINDS.items() if (k.build is not None) == self.by_name]

    def __getitem__(self, name: str) -> str:
        if name not in self._names():
            raise KeyError(name)
        return _KINDS[name].description

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


#: the registered sets built by name (:func:`make_workload`), name -> description (a live view)
WORKLOADS: Mapping[str, str] = _Descriptions(by_name=True)
#: the registered sets the bench command builds from its own options, name -> description (a live view)
OPTION_WORKLOADS: Mapping[str, str] = _Descriptions(by_name=False)


def register_workload(kind: WorkloadKind) -> WorkloadKind:
    """Add ``kind`` to the registry (raises :class:`ValueError` when its name is taken); returns it."""
    if kind.name in _KINDS:
        raise ValueError(f"workload {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_workload(name: str) -> None:
    """Remove the set ``name`` from the registry (nothing when it is not there)."""
    _KINDS.pop(name, None)


def mixable_workloads() -> tuple[str, ...]:
    """The sets a mix can draw, in registration order."""
    return tuple(n for n, k in _KINDS.items() if k.mixable and k.build is not None)


DEFAULT_RATIO = "short-qa:5,rag:2,long-gen:1,structured:2"
_COMMON_KEYS = frozenset({"input_tokens", "output_tokens", "lang", "extra"})


def _keys() -> set[str]:
    return set(_COMMON_KEYS).union(*(k.keys for k in _KINDS.values()))


def parse_ratio(value: str) -> list[tuple[str, int]]:
    """Parse ``"short-qa:5,rag:2"`` into ``[("short-qa", 5), ("rag", 2)]``; raises ConfigError on unknown
    sets, non-integer or negative weights, or an all-zero ratio."""
    out: list[tuple[str, int]] = []
    for part in split_list(str(value), "--set ratio", "give e.g. ratio=short-qa:5,rag:2"):
        name, sep, w = part.partition(":")
        name = name.strip()
        if name not in mixable_workloads():
            raise ConfigError(f"bad ratio {value!r}: {name!r} is not one of {', '.join(mixable_workloads())}")
        try:
            weight = int(w) if sep else 1
        except ValueError:
            raise ConfigError(f"bad ratio {value!r}: weight of {name} must be an integer") from None
        if weight < 0 or weight > MAX_MIX_WEIGHT:
            raise ConfigError(f"bad ratio {value!r}: weight of {name} must be from 0 to {MAX_MIX_WEIGHT}")
        out.append((name, weight))
    if not out or sum(w for _, w in out) == 0:
        raise ConfigError(f"bad ratio {value!r}: give e.g. short-qa:5,rag:2")
    return [(n, w) for n, w in out if w > 0]


def make_workload(
    name: str,
    counter: TokenCounter | None,
    seed: int = 0,
    endpoint: str = "chat",
    ignore_eos: bool = False,
    **overrides: Any,
) -> Workload:
    """Build the registered workload ``name`` (a key of :data:`WORKLOADS`).

    ``counter`` fits prompts to exact token lengths (``None``: approximate, ``prompt_tokens_target``
    ``None``). ``endpoint`` is ``"chat"`` (``messages``) or ``"completions"`` (``prompt``).
    ``ignore_eos=True`` sets ``extra["ignore_eos"]=True`` on every request except ``structured`` ones
    (a JSON answer must be able to end). Overrides are documented in the module docstring.
    Raises :class:`ConfigError` for an unknown name, endpoint or override, or a bad override value.
    """
    kind = _KINDS.get(name)
    if kind is None or kind.build is None:
        raise ConfigError(f"unknown workload {name!r}: choose from {', '.join(WORKLOADS)}")
    if endpoint not in ("chat", "completions"):
        raise ConfigError(f"bad endpoint {endpoint!r}: use chat or completions")
    keys = _keys()
    unknown = sorted(set(overrides) - keys)
    if unknown:
        raise ConfigError(f"unknown workload parameter(s) {', '.join(unknown)}: valid are {', '.join(sorted(keys))}")
    extra = overrides.get("extra") or {}
    if isinstance(extra, str):
        extra = json_value(extra, "bad extra: ", "give a JSON object")
    if not isinstance(extra, dict):
        raise ConfigError(f"bad extra={extra!r}: give a JSON object")
    check_sendable(extra, "bad extra: ")
    maker = TextMaker(counter, str(overrides.get("lang", "en")))
    tok_name = counter.name if counter is not None else None
    ctx = WorkloadContext(maker, seed, endpoint, ignore_eos, extra, overrides)
    make = kind.build(ctx)
    return Workload(
        name,
        kind.description + (f"; {ctx.note}" if ctx.note else ""),
        make,
        tok_name,
        dict(overrides) if ctx.params is None else ctx.params,
        max_input_tokens=ctx.max_input_tokens,
    )


def _build(name: str, ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    build = _KINDS[name].build
    assert build is not None  # a mixable set is built by name
    return build(ctx)


def _mix(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    ratio = parse_ratio(ctx.overrides.get("ratio", DEFAULT_RATIO))
    subs = {n: _build(n, ctx) for n, _ in ratio}
    block = [n for n, w in ratio for _ in range(w)]
    seed = ctx.seed

    def make(i: int) -> RequestSpec:
        b, k = divmod(i, len(block))
        order = list(block)
        request_rng(seed, "mix-block", b).shuffle(order)
        return subs[order[k]](i)

    ctx.note = f"ratio {','.join(f'{n}:{w}' for n, w in ratio)}"
    ctx.params = {"ratio": ratio, **ctx.overrides}
    return make


for _kind in (
    *MIXABLE_SETS,
    WorkloadKind(
        "mix",
        "the four sets above mixed by ratio (default short-qa:5,rag:2,long-gen:1,structured:2)",
        _mix,
        keys=frozenset({"ratio"}),
    ),
    *OTHER_SETS,
):
    register_workload(_kind)
