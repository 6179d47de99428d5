"""The mixed Chinese/English set ``mixed-lang`` (seed 003 §19: traffic mixes Chinese and English, and
Chinese text is where tokenizers differ most).

Text: the Simplified Chinese message catalogs Debian installs with its programs
(``/usr/share/locale/zh_CN/LC_MESSAGES/*.mo``, GNU gettext binary catalogs read with :mod:`gettext`):
each entry is an English program message and its human translation, and the translations keep English
terms, options and names inside Chinese sentences ("无法更改 NIS 密码。", "传递至 pam_*_item() 的项目无效").
Why this text: it is real bilingual technical prose written by translators, it is on the machine without
a download (91 catalogs, about 45,000 usable entries here; any Debian/Ubuntu system with translations
installed has them), and it is fixed for a set of installed packages, which :class:`MixedCorpus` records
(files and a SHA-256 over their bytes). A machine without such catalogs gets a one-line error naming
what to install.

Prompts (:func:`mixed_lang_workload`): a Chinese instruction, then catalog lines ``中文译文 (English
original)`` in a seeded order, cut to exactly ``input_tokens`` tokens of the target tokenizer (the model
file's, :mod:`servelab.modelfile.tokenizer`), and a Chinese question. The step reports, in
:class:`servelab.bench.workloads.extras.LanguageInfo`, the characters and tokens of the prompts' text and
``tokens_per_char`` for that tokenizer: the figure to compare candidates' tokenizers by.
"""

from __future__ import annotations

import gettext
import hashlib
import io
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.bench.workloads.extras import LanguageInfo
from servelab.wire import ConfigError, RequestSpec

if TYPE_CHECKING:
    from servelab.bench.workloads.kinds import Workload
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["CATALOG_DIR", "MixedCorpus", "load_corpus", "mixed_lang_workload"]

#: where Debian installs the Simplified Chinese gettext catalogs
CATALOG_DIR = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
_HEAD = "下面是一些软件界面提示的中文译文，括号里是英文原文（English original）。\n\n"
_TAIL = "\n\n请用中文解释这些提示分别在什么情况下出现，保留其中的英文术语。"


@dataclass(frozen=True)
class MixedCorpus:
    """The catalog lines (``中文 (English)``), the ``files`` read and a ``sha256`` over their bytes."""

    lines: tuple[str, ...]
    files: int
    sha256: str

    @property
    def source(self) -> str:
        """One line naming the text, for the summary."""
        return (
            f"Debian zh_CN gettext catalogs ({CATALOG_DIR}/*.mo: {self.files} files, {len(self.lines)} entries, "
            f"sha256 {self.sha256[:16]}): Chinese translations with their English originals"
        )


_CACHE: dict[str, MixedCorpus] = {}


def load_corpus(directory: Path = CATALOG_DIR) -> MixedCorpus:
    """Read every ``*.mo`` of ``directory`` (sorted): the entries whose translation holds a CJK ideograph
    and whose original has at least 8 characters, as ``translation (original)`` lines with newlines made
    spaces, sorted. Cached per directory. Raises :class:`ConfigError` when there is no catalog with such
    entries."""
    key = str(directory)
    if key in _CACHE:
        return _CACHE[key]
    h = hashlib.sha256()
    lines: set[str] = set()
    files = 0
    for f in sorted(directory.glob("*.mo")) if directory.is_dir() else []:
        raw = f.read_bytes()
        try:
            cat = gettext.GNUTranslations(io.BytesIO(raw))._catalog  # type: ignore[attr-defined]  # the parsed catalog
        except (OSError, UnicodeDecodeError, ValueError):
            continue
        files += 1
        h.update(f.name.encode() + b"\0" + raw)
        for k, v in cat.items():
            if isinstance(k, str) and isinstance(v, str) and len(k) >= 8 and _HAN.search(v):
                lines.add(f"{' '.join(v.split())} ({' '.join(k.split())})")
    if not lines:
        raise ConfigError(
            f"the mixed-lang set reads Chinese/English text from {directory}/*.mo and found none: "
            "install translated packages (Debian/Ubuntu: language-pack-zh-hans or the packages' "
            "locales) or use -w short-qa --set lang=mixed (built-in words)"
        )
    corpus = MixedCorpus(tuple(sorted(lines)), files, h.hexdigest())
    _CACHE[key] = corpus
    return corpus


def _fit(counter: TokenCounter, head: str, body: str, tail: str, target: int) -> str:
    """``head + body[:cut] + tail`` of exactly ``target`` tokens, the body cut at the end of a token (its
    character offset in ``body``) and recounted until exact (the tail, then the head, dropped when they leave
    no room). Raises :class:`RuntimeError` when no cut gives the count."""
    if tail and counter.count(head + tail) + 1 > target:
        return _fit(counter, head, body, "", target)
    if head and counter.count(head) + 1 > target:
        return _fit(counter, "", body, "", target)
    fixed = counter.count(head + tail) if head or tail else 0
    # cut the original text at token ends (offsets), not a decode of the ids: a lossy tokenizer (lower-casing,
    # [UNK] for unseen characters, as BERT's WordPiece) would otherwise put its own spelling into the prompt
    ends = [end for _, end in counter.tokenizer.encode(body, add_special_tokens=False).offsets]
    if len(ends) < target:
        raise RuntimeError(f"corpus text shorter than {target} tokens")

    def cut(b: int) -> str:
        return body[: ends[b - 1]]

    budget, seen = target - fixed, set()
    while budget not in seen and 1 <= budget <= len(ends):
        seen.add(budget)
        text = head + cut(budget) + tail
        c = counter.count(text)
        if c == target:
            return text
        budget += target - c
    for filler in ("", " ", "。", ".", "\n"):  # a merge across the cut: scan nearby cuts, then nudge by a character
        for b in range(max(1, target - fixed - 24), min(len(ends), target - fixed + 24) + 1):
            text = head + cut(b) + filler + tail
            if counter.count(text) == target:
                return text
    raise RuntimeError(f"could not build a mixed-language prompt of exactly {target} tokens with {counter.name}")


def mixed_lang_workload(
    counter: TokenCounter | None,
    *,
    seed: int = 0,
    endpoint: str = "chat",
    ignore_eos: bool = False,
    input_tokens: Any = "128-1024",
    output_tokens: Any = "32-128",
    extra: dict[str, Any] | None = None,
    corpus_dir: Path = CATALOG_DIR,
) -> Workload:
    """The ``mixed-lang`` :class:`~servelab.bench.workloads.kinds.Workload` (module doc): prompt lengths from
    ``input_tokens`` exact in ``counter``'s tokenizer (about ``n`` characters without one; then
    ``prompt_tokens_target`` is ``None``), ``max_tokens`` from ``output_tokens``. Its ``summary_extra``
    gives ``{"language": LanguageInfo}`` over the requests built so far. Raises :class:`ConfigError` for
    a bad length, an unknown endpoint or no catalogs."""
    from servelab.bench.options import MAX_OUTPUT_TOKENS, MAX_PROMPT_TOKENS
    from servelab.bench.workloads.kinds import Workload, request_spec
    from servelab.bench.workloads.lengths import parse_length

    if endpoint not in ("chat", "completions"):
        raise ConfigError(f"bad endpoint {endpoint!r}: use chat or completions")
    inp = parse_length(input_tokens, "input_tokens", MAX_PROMPT_TOKENS)
    out = parse_length(output_tokens, "output_tokens", MAX_OUTPUT_TOKENS)
    corpus = load_corpus(corpus_dir)
    totals = {"chars": 0, "tokens": 0, "han": 0, "nonspace": 0}

    def make(i: int) -> RequestSpec:
        rng = random.Random(f"servelab:{seed}:mixed-lang:{i}")
        n_in, n_out = inp(rng), out(rng)
        for attempt in range(8):  # no exact cut in these lines (rare): draw other lines
            picked: list[str] = []
            size = 0
            while size < 3 * n_in + 64:  # characters: at least one per token, with room to cut
                line = corpus.lines[rng.randrange(len(corpus.lines))]
                picked.append(line)
                size += len(line) + 1
            body = "\n".join(picked)
            if counter is None:
                text = (_HEAD + body)[: max(1, n_in)] + _TAIL
                break
            try:
                text = _fit(counter, _HEAD, body, _TAIL, n_in)
                break
            except RuntimeError:
                if attempt == 7:
                    raise
        if counter is not None:
            totals["tokens"] += n_in
        totals["chars"] += len(text)
        totals["han"] += len(_HAN.findall(text))
        totals["nonspace"] += sum(1 for ch in text if not ch.isspace())
        return request_spec(
            endpoint, text, n_out, "mixed-lang", n_in if counter is not None else None, ignore_eos, dict(extra or {})
        )

    def summary_extra() -> dict[str, Any]:
        info = LanguageInfo(
            source=corpus.source,
            tokenizer=counter.name if counter is not None else None,
            characters=totals["chars"],
            tokens=totals["tokens"] if counter is not None else None,
            tokens_per_char=totals["tokens"] / totals["chars"] if counter is not None and totals["chars"] else None,
            han_share=totals["han"] / totals["nonspace"] if totals["nonspace"] else None,
        )
        return {"language": info.model_dump()}

    desc = "mixed Chinese/English prompts from Debian's zh_CN message catalogs (translation + English original)"
    return Workload(
        "mixed-lang",
        desc,
        make,
        counter.name if counter is not None else None,
        {"input_tokens": input_tokens, "output_tokens": output_tokens, "corpus": corpus.source},
        max_input_tokens=inp.max_tokens,
        summary_extra=summary_extra,
    )
