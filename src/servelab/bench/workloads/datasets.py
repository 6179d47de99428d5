"""User datasets as workloads (``servelab bench --dataset FILE``): ShareGPT ``conversations``, OpenAI-style
``messages`` lists or plain prompts, one JSON value per line or a JSON list, each entry checked once
with a one-line error naming it; requests in a seeded order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.bench.options import MAX_OUTPUT_TOKENS, dataset_max_tokens
from servelab.bench.workloads.kinds import Workload, check_sendable, request_rng
from servelab.bench.workloads.text import WORDS_PER_TOKEN
from servelab.wire import ConfigError, RequestSpec

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = ["load_dataset"]


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
        check_sendable({"messages": messages}, f"dataset {p}: {where}: messages ")  # as in the body
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
            request_rng(seed, name, rnd).shuffle(order)
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
