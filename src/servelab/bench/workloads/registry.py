"""Built-in benchmark workloads (the test sets of spec 003 §19) and user datasets, as deterministic
request generators.

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

import json
import math
import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from servelab.bench.options import MAX_MIX_WEIGHT, MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS, dataset_max_tokens, split_list
from servelab.bench.workloads.tools import ASKS as TOOL_ASKS
from servelab.bench.workloads.tools import TOOLS, tool_choice_for
from servelab.wire import ConfigError, RequestSpec

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter


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


#: Approximate words per token when no tokenizer is given.
WORDS_PER_TOKEN = 0.75

# A varied built-in vocabulary (common English + technical words). Varied text keeps tokenization
# and prefix-cache behaviour representative (one repeated word would compress to a few tokens).
_EN_WORDS = """
the of and to in is that for it as was with be by on not this are or from at which but have an they you
were her she there one all we their been has when who will more no if out so said what up its about into
than them can only other new some could time these two may then do first any my now such like our over
even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see work long get here
between both life being under never day same another know while last might us great old year off come
since against go came right used take three system data model server request latency memory cache token
network storage cluster region policy budget report team customer product market price cost energy
water city river mountain forest garden kitchen window window table chair paper letter music film book
library museum school student teacher doctor patient hospital medicine health weather winter summer
spring autumn morning evening history science physics chemistry biology language grammar sentence
question answer problem solution method result evidence analysis review summary chapter section figure
engine pipeline deployment version release feature bug test benchmark metric throughput queue batch
kernel thread process signal timeout error warning retry backup archive record field column index query
travel airport station ticket journey border island harbor bridge tunnel highway vehicle bicycle train
farmer harvest wheat rice coffee bread cheese apple orange lemon sugar salt pepper onion garlic recipe
contract invoice payment account balance credit loan interest tax salary office meeting agenda minute
project milestone deadline schedule calendar holiday festival ceremony election council court judge law
ancient modern quiet bright careful sudden gentle brave clever honest simple complex rapid slow heavy
light narrow broad fresh frozen hidden visible local global public private digital physical natural
build design measure compare explain describe improve reduce increase support protect prevent allow
require provide create deliver manage follow choose decide discover observe record update restore
carefully quickly rarely often usually gradually finally recently nearly almost perhaps certainly
""".split()

_ZH_WORDS = """
我们 今天 系统 服务 模型 推理 请求 延迟 吞吐 缓存 显存 用户 数据 网络 城市 河流 山区 森林 学校 学生
老师 医院 医生 天气 冬天 夏天 春天 历史 科学 语言 问题 答案 方法 结果 证据 分析 报告 章节 版本 功能
测试 指标 队列 批处理 部署 项目 会议 计划 预算 成本 价格 市场 产品 客户 团队 政策 文件 记录 更新 恢复
需要 提供 创建 管理 选择 决定 发现 观察 比较 解释 描述 改进 降低 增加 支持 保护 防止 允许 快速 缓慢
简单 复杂 公开 私有 本地 全球 清晰 稳定 安全 可靠 重要 主要 已经 正在 可能 因此 但是 而且 如果 虽然
""".split()

_TOPICS = [
    "renewable energy",
    "city planning",
    "the history of printing",
    "machine learning systems",
    "ocean currents",
    "ancient trade routes",
    "database indexing",
    "coffee farming",
    "public libraries",
    "volcanoes",
    "bridge engineering",
    "the immune system",
    "jazz music",
    "train networks",
    "climate adaptation",
    "cryptography",
    "honey bees",
    "space telescopes",
    "urban gardens",
    "supply chains",
    "language learning",
    "medieval castles",
    "electric vehicles",
    "rainforests",
]

_QUESTION_STARTS = [
    "What is the main",
    "How does the",
    "Why did the",
    "Which of the",
    "When should a",
    "Where can the",
    "Who decides the",
    "How many",
    "Can you explain the",
    "What happens if the",
]

# Small strict-mode JSON schemas (every property required, no additional properties).
SCHEMAS: list[dict[str, Any]] = [
    {
        "name": "person",
        "instruction": "the person mentioned: name, age and city",
        "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}},
            "required": ["name", "age", "city"],
            "additionalProperties": False,
        },
    },
    {
        "name": "sentiment",
        "instruction": "the overall sentiment (positive, negative or neutral) and a confidence 0-1",
        "schema": {
            "type": "object",
            "properties": {
                "sentiment": {"type": "string", "enum": ["positive", "negative", "neutral"]},
                "confidence": {"type": "number"},
            },
            "required": ["sentiment", "confidence"],
            "additionalProperties": False,
        },
    },
    {
        "name": "event",
        "instruction": "the event: title, date (YYYY-MM-DD), location and attendee names",
        "schema": {
            "type": "object",
            "properties": {
                "title": {"type": "string"},
                "date": {"type": "string"},
                "location": {"type": "string"},
                "attendees": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["title", "date", "location", "attendees"],
            "additionalProperties": False,
        },
    },
    {
        "name": "product",
        "instruction": "the product: name, price, currency and whether it is in stock",
        "schema": {
            "type": "object",
            "properties": {
                "product": {"type": "string"},
                "price": {"type": "number"},
                "currency": {"type": "string"},
                "in_stock": {"type": "boolean"},
            },
            "required": ["product", "price", "currency", "in_stock"],
            "additionalProperties": False,
        },
    },
    {
        "name": "keywords",
        "instruction": "a short summary and up to five keywords",
        "schema": {
            "type": "object",
            "properties": {
                "summary": {"type": "string"},
                "keywords": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
            },
            "required": ["summary", "keywords"],
            "additionalProperties": False,
        },
    },
]


# ---------------------------------------------------------------------------------------------------
# Length distributions


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


def _json_value(text: str, where: str, fix: str) -> Any:
    """``json.loads(text)``; a :class:`ConfigError` starting with ``where`` for invalid or too deeply
    nested JSON (the parser's recursion limit), ending with ``fix``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ConfigError(f"{where}JSON nested too deeply to read; {fix}") from None
    except ValueError:
        raise ConfigError(f"{where}invalid JSON {text[:40]!r}; {fix}") from None


def _check_sendable(obj: Any, where: str) -> None:
    """Raise :class:`ConfigError` (starting with ``where``) unless ``obj`` can be sent as a request
    body: the client serialises with orjson, which refuses nesting deeper than 254 levels ("Recursion
    limit reached") and integers beyond 64 bits (measured with orjson 3.13.0 on 2026-12-01; limits in
    https://github.com/ijl/orjson#serialize) — found here, once, instead of failing every request."""
    try:
        orjson.dumps(obj)
    except (orjson.JSONEncodeError, TypeError) as e:
        raise ConfigError(
            f"{where}cannot be sent as JSON ({e}); keep nesting under 250 levels and integers within 64 bits"
        ) from None


# ---------------------------------------------------------------------------------------------------
# Exact-length text


class _TextMaker:
    """Builds prompt text of an exact token length for one tokenizer (or approximate without one)."""

    def __init__(self, counter: TokenCounter | None, lang: str) -> None:
        if lang not in ("en", "zh", "mixed"):
            raise ConfigError(f"bad lang={lang!r}: use en, zh or mixed")
        self.counter = counter
        self.lang = lang
        self._word_tokens: dict[str, int] = {}
        self._count_cache: dict[str, int] = {}
        if counter is not None:  # per-word token counts, once, in one batch (used only to size the body)
            words = sorted({w.capitalize() for w in _EN_WORDS} | set(_EN_WORDS) | set(_ZH_WORDS))
            self._word_tokens = dict(zip(words, map(len, counter.encode_batch([" " + w for w in words])), strict=True))

    # -- raw text ---------------------------------------------------------------------------------
    def sentence(self, rng: random.Random) -> str:
        zh = self.lang == "zh" or (self.lang == "mixed" and rng.random() < 0.5)
        if zh:
            return "".join(rng.choice(_ZH_WORDS) for _ in range(rng.randint(4, 12))) + rng.choice("。。。！？")
        words = [rng.choice(_EN_WORDS) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        if len(words) > 8 and rng.random() < 0.4:
            words[rng.randint(3, len(words) - 3)] += ","
        return " ".join(words) + rng.choice("....!?")

    def words_text(self, rng: random.Random, approx_tokens: int, para_every: int = 0) -> str:
        """Sentences totalling at least ``approx_tokens`` (estimated from cached per-word counts).
        With ``para_every`` > 0, a new numbered paragraph ``[k] `` starts every ``para_every`` sentences."""
        parts: list[str] = ["[1] "] if para_every else []
        est = 0
        k = 0
        while est < approx_tokens:
            s = self.sentence(rng)
            est += self._estimate(s) + (3 if para_every and k % para_every == 0 else 0)
            if k:
                if para_every and k % para_every == 0:
                    parts.append(f"\n[{k // para_every + 1}] ")
                else:
                    parts.append(" ")
            parts.append(s)
            k += 1
        return "".join(parts)

    def _estimate(self, sentence: str) -> int:
        if self.counter is None:
            return max(1, math.ceil(len(sentence.split()) / WORDS_PER_TOKEN)) if " " in sentence else len(sentence)
        total = 0
        for w in sentence.split(" "):
            c = self._word_tokens.get(w)
            if c is None:
                c = self.counter.count(" " + w)
                self._word_tokens[w] = c
            total += c
        return total

    def count(self, text: str) -> int:
        """Token count with a small cache (fixed heads/tails repeat across requests)."""
        assert self.counter is not None
        if len(text) <= 512:
            c = self._count_cache.get(text)
            if c is None:
                c = self._count_cache[text] = self.counter.count(text)
            return c
        return self.counter.count(text)

    # -- exact fitting --------------------------------------------------------------------------------
    def fit(
        self,
        rng: random.Random,
        target: int,
        head: str = "",
        tail: str = "",
        para_every: int = 0,
        lower_first: bool = False,
    ) -> str:
        """Return ``head + body + tail`` whose token count is exactly ``target`` (``_tokens``).

        The body is generated text cut at a token boundary: tokenize, cut, decode, re-count, adjust the
        cut until exact. If ``head``/``tail`` leave no room, the tail and then the head are dropped.
        Without a tokenizer, returns about ``target`` tokens' worth of words (0.75 words per token).
        Raises RuntimeError if no exact cut exists (not seen with SentencePiece/BPE tokenizers).
        """
        if self.counter is None:
            n_words = max(1, round(target * WORDS_PER_TOKEN) - len((head + " " + tail).split()))
            body = " ".join(self.words_text(rng, n_words + 20).split(" ")[:n_words])
            return head + (body[:1].lower() + body[1:] if lower_first else body) + tail
        fixed = self.count(head) + self.count(tail) if (head or tail) else 0
        if fixed + 1 > target and tail:
            return self.fit(rng, target, head, "", para_every, lower_first)
        if fixed + 1 > target and head:
            return self.fit(rng, target, "", "", para_every, lower_first)
        body_src = self.words_text(rng, target - fixed + 16, para_every)
        if lower_first:
            body_src = body_src[:1].lower() + body_src[1:]
        ids = self.counter.encode(body_src)
        while len(ids) < target - fixed + 8:  # estimate was short (rare): extend
            body_src += " " + self.words_text(rng, target - fixed, para_every)
            ids = self.counter.encode(body_src)
        decode = self.counter.decode
        count = self.counter.count
        budget = target - fixed
        seen: dict[int, int] = {}
        for _ in range(10):
            budget = max(1, min(len(ids), budget))
            if budget in seen:
                break
            text = head + decode(ids[:budget]).rstrip("\ufffd") + tail
            c = count(text)
            seen[budget] = c
            if c == target:
                return text
            budget += target - c
        # Oscillating at a merge boundary: scan cuts near the estimate, then try a one-word nudge.
        center = budget
        for delta in range(1, 24):
            for b in (center - delta, center + delta):
                if 1 <= b <= len(ids) and b not in seen:
                    text = head + decode(ids[:b]).rstrip("\ufffd") + tail
                    c = seen[b] = count(text)
                    if c == target:
                        return text
        for filler in (".", ",", " a", " the", "\n"):
            for b in sorted(seen, key=lambda b: abs(seen[b] - target)):
                text = head + decode(ids[:b]).rstrip("\ufffd") + filler + tail
                if count(text) == target:
                    return text
        raise RuntimeError(f"could not build a prompt of exactly {target} tokens with {self.counter.name}")


# ---------------------------------------------------------------------------------------------------
# Workloads


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


def _rng(seed: int, name: str, i: int) -> random.Random:
    return random.Random(f"servelab:{seed}:{name}:{i}")


def _spec(
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
        extra = _json_value(extra, "bad extra: ", "give a JSON object")
    if not isinstance(extra, dict):
        raise ConfigError(f"bad extra={extra!r}: give a JSON object")
    _check_sendable(extra, "bad extra: ")
    maker = _TextMaker(counter, str(overrides.get("lang", "en")))
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


@dataclass
class WorkloadContext:
    """What a :class:`WorkloadKind`'s builder builds from: ``maker`` (text of a given length in the
    workload tokenizer), ``seed``, ``endpoint`` (``chat`` or ``completions``), ``ignore_eos``, the
    requests' ``extra`` fields and the ``overrides`` (``--set``). A builder may raise
    ``max_input_tokens`` (:meth:`length` does for ``input_tokens``), and set ``note`` (added to the
    description) and ``params`` (the workload's recorded parameters; default: the overrides)."""

    maker: _TextMaker
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
        return _spec(self.endpoint, text, max_tokens, workload, target, self.ignore_eos, self.extra)

    def length(self, key: str, default: Any) -> Length:
        limit = MAX_OUTPUT_TOKENS if key == "output_tokens" else MAX_PROMPT_TOKENS
        dist = parse_length(self.overrides.get(key, default), key, limit)
        if key == "input_tokens":
            self.max_input_tokens = max(self.max_input_tokens, dist.max_tokens)
        return dist

    def target(self, n: int) -> int | None:
        return n if self.maker.counter is not None else None


def _short_qa(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "normal:64,16,16,160"), ctx.length("output_tokens", "32-128")

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "short-qa", i)
        n_in, n_out = inp(rng), out(rng)
        head = f"{rng.choice(_QUESTION_STARTS)} "
        text = ctx.maker.fit(rng, n_in, head, "?\nAnswer briefly.", lower_first=True)
        return _spec(ctx.endpoint, text, n_out, "short-qa", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _rag(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "1000-3000"), ctx.length("output_tokens", "64-128")

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "rag", i)
        n_in, n_out = inp(rng), out(rng)
        topic = rng.choice(_TOPICS)
        head = (
            f"Answer the question using only the context passages below. The passages are about {topic}.\n\nContext:\n"
        )
        q = ctx.maker.sentence(rng).rstrip(".!?。！？")
        tail = f"\n\nQuestion: {rng.choice(_QUESTION_STARTS)} {q.lower()}?\nAnswer:"
        text = ctx.maker.fit(rng, n_in, head, tail, para_every=6)
        return _spec(ctx.endpoint, text, n_out, "rag", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _long_gen(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "normal:64,12,24,128"), ctx.length("output_tokens", "512-1024")

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "long-gen", i)
        n_in, n_out = inp(rng), out(rng)
        kind = rng.choice(
            [
                "a long, detailed article",
                "a multi-section report",
                "a detailed technical guide",
                "a long story",
                "an in-depth essay",
            ]
        )
        head = f"Write {kind} about {rng.choice(_TOPICS)}, using these notes: "
        text = ctx.maker.fit(rng, n_in, head)
        return _spec(ctx.endpoint, text, n_out, "long-gen", ctx.target(n_in), ctx.ignore_eos, ctx.extra)

    return make


def _structured(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    inp, out = ctx.length("input_tokens", "64-256"), ctx.length("output_tokens", "128-256")

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "structured", i)
        n_in, n_out = inp(rng), out(rng)
        sch = SCHEMAS[rng.randrange(len(SCHEMAS))]
        head = f"Read the text and extract {sch['instruction']}. Reply with one JSON object only.\n\nText:\n"
        text = ctx.maker.fit(rng, n_in, head)
        rf = {"type": "json_schema", "json_schema": {"name": sch["name"], "schema": sch["schema"], "strict": True}}
        return _spec(
            ctx.endpoint,
            text,
            n_out,
            "structured",
            ctx.target(n_in),
            ctx.ignore_eos,
            ctx.extra,
            json_schema=json.loads(json.dumps(sch["schema"])),
            response_format=rf,
        )

    return make


def _shared_prefix(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    ov = ctx.overrides
    try:
        prefix_tokens = int(ov.get("prefix_tokens", 1024))
        num_prefixes = int(ov.get("num_prefixes", 8))
        suffix_tokens = int(ov.get("suffix_tokens", 32))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be integers") from None
    if any(
        isinstance(ov.get(k), float) and not float(ov[k]).is_integer()
        for k in ("prefix_tokens", "num_prefixes", "suffix_tokens")
    ):
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be integers")
    if prefix_tokens < 1 or num_prefixes < 1 or suffix_tokens < 1:
        raise ConfigError("prefix_tokens, num_prefixes and suffix_tokens must be >= 1")
    if prefix_tokens + suffix_tokens > MAX_PROMPT_TOKENS:
        raise ConfigError(
            f"prefix_tokens + suffix_tokens = {prefix_tokens + suffix_tokens}: at most "
            f"{MAX_PROMPT_TOKENS} tokens per request (servelab's limit); use smaller values"
        )
    out = ctx.length("output_tokens", "32-64")
    ctx.max_input_tokens = max(ctx.max_input_tokens, prefix_tokens + suffix_tokens)
    prefixes: dict[int, str] = {}

    def prefix(p: int) -> str:
        if p not in prefixes:
            rng = _rng(ctx.seed, "shared-prefix/prefix", p)
            head = f"Reference document {p + 1} about {rng.choice(_TOPICS)}:\n"
            prefixes[p] = ctx.maker.fit(rng, prefix_tokens, head, para_every=6)
        return prefixes[p]

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "shared-prefix", i)
        n_out = out(rng)
        pre = prefix(i % num_prefixes)
        total = prefix_tokens + suffix_tokens
        if ctx.maker.counter is None:
            text = pre + "\n\n" + ctx.maker.fit(rng, suffix_tokens, "Question: ")
        else:
            text = _fit_suffix(ctx.maker, rng, pre + "\n\nQuestion: ", total)
        return _spec(ctx.endpoint, text, n_out, "shared-prefix", ctx.target(total), ctx.ignore_eos, ctx.extra)

    return make


def _fit_suffix(maker: _TextMaker, rng: random.Random, head: str, total: int) -> str:
    """``head`` + a fitted suffix so the whole is exactly ``total`` tokens. If ``head`` alone reaches the
    total, the "Question:" label is dropped from it."""
    if maker.count(head) + 1 > total:
        head = head[: -len("Question: ")] if head.endswith("Question: ") else head
    return maker.fit(rng, total, head)


def _tools(ctx: WorkloadContext) -> Callable[[int], RequestSpec]:
    if ctx.endpoint != "chat":
        raise ConfigError("the tools workload needs --endpoint chat (tools are a chat-completions feature)")
    inp, out = ctx.length("input_tokens", "64-256"), ctx.length("output_tokens", "128-256")

    def make(i: int) -> RequestSpec:
        rng = _rng(ctx.seed, "tools", i)
        n_in, n_out = inp(rng), out(rng)
        k = rng.randrange(len(TOOLS))
        head = "Background notes (may be irrelevant):\n"
        tail = f"\n\nUse the right tool for this request: {TOOL_ASKS[k]}"
        text = ctx.maker.fit(rng, n_in, head, tail)
        extra = {**ctx.extra, "tools": json.loads(json.dumps(TOOLS)), "tool_choice": tool_choice_for(i, k)}
        return _spec("chat", text, n_out, "tools", ctx.target(n_in), False, extra)

    return make


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
        _rng(seed, "mix-block", b).shuffle(order)
        return subs[order[k]](i)

    ctx.note = f"ratio {','.join(f'{n}:{w}' for n, w in ratio)}"
    ctx.params = {"ratio": ratio, **ctx.overrides}
    return make


for _kind in (
    WorkloadKind(
        "short-qa",
        "short question, short answer (input ~64 tokens, output 32-128): TTFT and base throughput",
        _short_qa,
        mixable=True,
    ),
    WorkloadKind(
        "rag",
        "long input, short output (context passages + question, input 1000-3000, output 64-128)",
        _rag,
        mixable=True,
    ),
    WorkloadKind(
        "long-gen",
        "short input, long output (input ~64, output 512-1024): writing, code, reports",
        _long_gen,
        mixable=True,
    ),
    WorkloadKind(
        "structured",
        "JSON-schema output (response_format json_schema, strict; input 64-256, output 128-256)",
        _structured,
        mixable=True,
    ),
    WorkloadKind(
        "mix",
        "the four sets above mixed by ratio (default short-qa:5,rag:2,long-gen:1,structured:2)",
        _mix,
        keys=frozenset({"ratio"}),
    ),
    WorkloadKind(
        "shared-prefix",
        "N shared long prefixes (1024 tokens) + short distinct suffixes: prefix-cache effects",
        _shared_prefix,
        keys=frozenset({"prefix_tokens", "num_prefixes", "suffix_tokens"}),
    ),
    WorkloadKind(
        "tools",
        "tool calling: 4 tools with nested schemas offered, tool_choice auto/required/named in "
        "turn (input 64-256, output 128-256); every call checked against its tool's schema",
        _tools,
    ),
):
    register_workload(_kind)


# ---------------------------------------------------------------------------------------------------
# User datasets


def _dataset_entries(p: Path, raw: str, json_list: bool) -> list[tuple[str, Any]]:
    """``(where, decoded entry)`` of a dataset file's text: the items of a JSON list (``json_list``), else
    one JSON value per non-blank line. Raises :class:`ConfigError` naming the line for bad JSON."""
    entries: list[tuple[str, Any]] = []
    if json_list:
        try:
            data = json.loads(raw)
        except RecursionError:
            raise ConfigError(
                f"dataset {p}: JSON nested too deeply to read; entries are prompts or messages, a few levels deep"
            ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"dataset {p}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}; "
                "fix the file or pass JSONL (one object per line)"
            ) from None
        if not isinstance(data, list):
            raise ConfigError(f"dataset {p}: expected a JSON list of entries")
        return [(f"entry {k}", obj) for k, obj in enumerate(data)]
    for lineno, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except RecursionError:
            raise ConfigError(
                f"dataset {p}: line {lineno} is JSON nested too deeply to read; each line must be "
                'one object like {"prompt": "...", "max_tokens": 128}'
            ) from None
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"dataset {p}: invalid JSON at line {lineno}: {exc.msg}; each line must be one JSON "
                'object like {"prompt": "...", "max_tokens": 128}'
            ) from None
        entries.append((f"line {lineno}", obj))
    return entries


def _plain_content(p: Path, where: str, obj: dict[str, Any]) -> Any:
    """The ``prompt`` (a non-empty string) or ``messages`` (a list of ``{role, content}``, sendable as
    a body) of a JSONL-style entry. Raises :class:`ConfigError` naming the entry otherwise."""
    prompt = obj.get("prompt")
    messages = obj.get("messages")
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(messages, list) and messages:
        for m in messages:
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m):
                raise ConfigError(f"dataset {p}: {where}: each message needs 'role' and 'content'")
        _check_sendable({"messages": messages}, f"dataset {p}: {where}: messages ")  # as in the body
        return messages
    raise ConfigError(f"dataset {p}: {where} has no prompt (need a non-empty 'prompt' string or 'messages' list)")


def load_dataset(
    path: str, counter: TokenCounter | None, seed: int = 0, endpoint: str = "chat", max_tokens_default: int = 256
) -> Workload:
    """Load a user dataset as a :class:`Workload` named ``dataset:<file name>``.

    Formats (detected from the first non-blank character):

    - JSONL: one JSON object per line with ``prompt`` (str) or ``messages`` (list of ``{"role",
      "content"}``), optional ``max_tokens`` or ``output_tokens`` (int >= 1; else ``max_tokens_default``).
      Lines in ShareGPT form (``{"conversations": [...]}``) are accepted too. Blank lines are skipped.
    - JSON: a list of ShareGPT entries ``{"conversations": [{"from": "human"|"gpt", "value": str}, ...]}``
      (the first human turn is the prompt; the next gpt reply's token count, with ``counter``, or
      words / 0.75 without, is ``max_tokens``), or a list of JSONL-style objects. Entries with no
      human turn are skipped and counted in ``Workload.skipped``.

    ``requests(n)`` returns the entries in file order; past the end it starts further passes, each in
    a seeded random order. ``prompt_tokens_target`` is ``None`` (user text is not fitted).
    For the ``completions`` endpoint a ``messages`` entry is sent as its contents joined by newlines.

    Raises :class:`ConfigError` (one line naming the file and line/entry number) for a missing or
    empty file, invalid JSON, or an entry without a usable prompt. Nothing is half-loaded.
    """
    p = Path(path).expanduser()
    if endpoint not in ("chat", "completions"):
        raise ConfigError(f"bad endpoint {endpoint!r}: use chat or completions")
    if not p.is_file():
        raise ConfigError(f"dataset {p} not found (pass a JSONL or ShareGPT JSON file)")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"dataset {p}: cannot read as UTF-8 text: {exc}") from exc
    stripped = raw.lstrip()
    if not stripped:
        raise ConfigError(f"dataset {p} is empty")
    entries = _dataset_entries(p, raw, json_list=stripped[0] == "[")
    items: list[tuple[Any, int]] = []  # (prompt str or messages list, max_tokens)
    skipped = 0
    for where, obj in entries:
        if not isinstance(obj, dict):
            raise ConfigError(f"dataset {p}: {where} is not a JSON object")
        if "conversations" in obj:
            got = _sharegpt_item(p, where, obj, counter, max_tokens_default)
            if got is None:
                skipped += 1
            else:
                items.append(got)
            continue
        items.append(
            (
                _plain_content(p, where, obj),
                dataset_max_tokens(
                    obj.get("max_tokens", obj.get("output_tokens", max_tokens_default)), f"dataset {p}: {where}"
                ),
            )
        )
    if not items:
        raise ConfigError(
            f"dataset {p}: no usable entries ({skipped} ShareGPT entries without a human turn); each "
            'entry needs a {"from": "human", "value": "..."} turn in "conversations"'
        )
    name = f"dataset:{p.name}"
    n_items = len(items)

    def make(i: int) -> RequestSpec:
        rnd, k = divmod(i, n_items)
        if rnd:
            order = list(range(n_items))
            _rng(seed, name, rnd).shuffle(order)
            k = order[k]
        content, mt = items[k]
        if endpoint == "chat":
            msgs = [{"role": "user", "content": content}] if isinstance(content, str) else [dict(m) for m in content]
            return RequestSpec(endpoint="chat", max_tokens=mt, messages=msgs, workload=name)
        text = content if isinstance(content, str) else "\n".join(str(m.get("content", "")) for m in content)
        return RequestSpec(endpoint="completions", max_tokens=mt, prompt=text, workload=name)

    desc = f"user dataset {p} ({n_items} entries" + (f", {skipped} skipped without a human turn)" if skipped else ")")
    return Workload(name, desc, make, counter.name if counter is not None else None, {"path": str(p)}, skipped)


_HUMAN = {"human", "user"}
_GPT = {"gpt", "assistant", "chatgpt", "bard", "bing", "model"}


def _sharegpt_item(
    p: Path, where: str, obj: dict[str, Any], counter: TokenCounter | None, max_tokens_default: int
) -> tuple[str, int] | None:
    conv = obj.get("conversations")
    if not isinstance(conv, list):
        raise ConfigError(f"dataset {p}: {where}: 'conversations' must be a list")
    for j, turn in enumerate(conv):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise ConfigError(f"dataset {p}: {where}: turn {j} needs 'from' and a string 'value'")
        if turn.get("from") in _HUMAN and turn["value"].strip():
            reply = next(
                (
                    t["value"]
                    for t in conv[j + 1 :]
                    if isinstance(t, dict) and t.get("from") in _GPT and isinstance(t.get("value"), str)
                ),
                None,
            )
            if reply is None or not reply.strip():
                mt = max_tokens_default
            elif counter is not None:  # an estimate from the reply: capped at servelab's limit, not refused
                mt = min(MAX_OUTPUT_TOKENS, max(1, counter.count(reply)))
            else:
                mt = min(MAX_OUTPUT_TOKENS, max(1, round(len(reply.split()) / WORDS_PER_TOKEN)))
            return turn["value"], mt
    return None
