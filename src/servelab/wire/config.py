"""Config files every part reads (experiments, the gateway config, the catalogs): strict pydantic base
models, YAML reading with one-line errors, one-line rendering of pydantic validation errors, and the
JSON Schemas servelab publishes for editors (``servelab schema write|check``).

- :class:`StrictModel` / :class:`FrozenModel`: unknown keys are errors (a typo must not be ignored);
  :class:`FrozenModel` instances are also immutable (snapshots shared between requests or threads).
- :func:`read_yaml_file`: a user's YAML file, every problem as one :class:`ConfigError` line (nesting
  deeper than :data:`MAX_YAML_DEPTH` included: PyYAML's composer recurses per level, and a 5,000-deep
  list would otherwise end in a RecursionError traceback).
- :func:`validation_error_line`: a :class:`pydantic.ValidationError` as ``SOURCE: PATH: PROBLEM; FIX
  (+N more)``; :func:`error_problem` renders one error's ``PROBLEM`` for callers with their own head.
- :class:`PublishedSchema`: one committed JSON Schema file, generated from a model, written or checked.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from servelab.wire.errors import ConfigError

__all__ = [
    "JSON_SCHEMA_DIALECT",
    "MAX_YAML_DEPTH",
    "FrozenModel",
    "PublishedSchema",
    "StrictModel",
    "error_problem",
    "json_schema_of",
    "loc_path",
    "read_yaml_file",
    "suggest",
    "validation_error_line",
]

#: The ``$schema`` of every published schema (pydantic generates draft 2020-12).
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class StrictModel(BaseModel):
    """Base of every model read from a user's file: unknown keys are errors (a typo must not be
    silently ignored); a field with an alias accepts its Python name too."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class FrozenModel(StrictModel):
    """A :class:`StrictModel` whose instances are immutable (``frozen``): config snapshots and catalog
    entries that many requests or threads read at once."""

    model_config = ConfigDict(frozen=True)


# ---------------------------------------------------------------------------------------------------
# YAML files


#: deepest nesting of lists/mappings a config file may have (servelab's deepest schema is under 10 levels)
MAX_YAML_DEPTH = 100


class _TooDeep(yaml.composer.ComposerError):
    """A YAML document nested deeper than :data:`MAX_YAML_DEPTH`."""


class _DepthBoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader that refuses nesting deeper than :data:`MAX_YAML_DEPTH` with a marked YAML
    error (line and column of the node) before its recursive composer can exhaust Python's stack."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _TooDeep(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def read_yaml_file(path: str | os.PathLike[str], *, what: str, missing_fix: str, empty_fix: str) -> Any:
    """Read and parse the YAML file ``path`` (a user's experiment, gateway config, a catalog …).

    Returns the parsed document (never ``None``). Raises :class:`ConfigError` with one line that names
    the file and the fix: missing file (``missing_fix``), a folder, unreadable or non-UTF-8 text, a
    YAML syntax error (with line and column), nesting deeper than :data:`MAX_YAML_DEPTH`, an empty file
    (``empty_fix``). ``what`` names the kind of file in messages ("experiment", "gateway config").
    """
    src = str(path)
    p = Path(path).expanduser()
    if not p.exists():
        raise ConfigError(f"{src}: no such {what} file; {missing_fix}")
    if p.is_dir():
        raise ConfigError(f"{src}: is a folder; give the {what}'s YAML file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{src}: cannot read as UTF-8 text ({e}); give a YAML file") from None
    try:
        data = yaml.load(text, Loader=_DepthBoundedLoader)
    except _TooDeep as e:
        mark = e.problem_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(
            f"{src}: {where}{e.problem} (servelab's limit); no {what} field nests "
            "that deep: remove the extra brackets or indentation"
        ) from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark is not None else ""
        what_err = e.problem or e.context or "syntax error"
        raise ConfigError(f"{src}: {where}invalid YAML: {what_err}; fix the indentation or quoting there") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{src}: invalid YAML: {str(e).splitlines()[0]}") from None
    if data is None:
        raise ConfigError(f"{src}: the file is empty; {empty_fix}")
    return data


# ---------------------------------------------------------------------------------------------------
# validation errors as one line


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``choices`` (difflib ratio >= 0.6), or ``""``."""
    m = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" (did you mean {m[0]!r}?)" if m else ""


def loc_path(loc: Iterable[Any]) -> str:
    """A pydantic error ``loc`` as ``a.b[0].c`` (pydantic's ``[key]`` marker dropped)."""
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _unwrap(t: Any) -> tuple[Any, str | None]:
    """Strip ``Annotated`` (returning its discriminator, if any) and ``X | None`` from a type.

    An ``Annotated`` metadata object with a ``resolved_type()`` method stands for the type it returns
    (a union built at run time, e.g. the experiment's candidate union of every registered engine kind)."""
    disc = None
    while True:
        origin = typing.get_origin(t)
        if origin is Annotated:
            args = typing.get_args(t)
            t = args[0]
            for meta in args[1:]:
                resolved = getattr(meta, "resolved_type", None)
                if callable(resolved):
                    t = resolved()
                d = getattr(meta, "discriminator", None)
                if isinstance(d, str):
                    disc = d
            continue
        if origin in (Union, types.UnionType):
            members = [a for a in typing.get_args(t) if a is not type(None)]
            if len(members) == 1:
                t = members[0]
                continue
        return t, disc


def _union_member(t: Any, disc: str, tag: str) -> Any:
    """The model of the discriminated union ``t`` whose ``disc`` field accepts ``tag``, or ``None``."""
    for m in typing.get_args(t):
        if (
            isinstance(m, type)
            and issubclass(m, BaseModel)
            and disc in m.model_fields
            and tag in typing.get_args(m.model_fields[disc].annotation)
        ):
            return m
    return None


def _walk(root: Any, loc: tuple[Any, ...]) -> tuple[str, Any]:
    """Render ``loc`` as ``a.b[0].c`` (dropping the tags pydantic puts in for discriminated unions) and
    return the type reached from ``root`` (a model class when the path ends on one, else ``Any``)."""
    t: Any = root
    disc: str | None = None
    path = ""
    for part in loc:
        if part == "[key]":
            continue
        t, d = _unwrap(t)
        disc = d or disc
        origin = typing.get_origin(t)
        if isinstance(part, str) and origin in (Union, types.UnionType) and disc:
            chosen = _union_member(t, disc, part)
            if chosen is not None:
                t, disc = chosen, None
                continue
        if isinstance(part, int):
            path += f"[{part}]"
            args = typing.get_args(t)
            t = args[0] if origin in (list, tuple) and args else Any
            continue
        path += f".{part}" if path else str(part)
        if isinstance(t, type) and issubclass(t, BaseModel):
            f = next((f for n, f in t.model_fields.items() if (f.alias or n) == part or n == part), None)
            t = f.annotation if f is not None else Any
        elif origin is dict:
            t = typing.get_args(t)[1]
        else:
            t = Any
        disc = None
    t, _ = _unwrap(t)
    return path, t


def _field_names(model: Any) -> list[str]:
    if isinstance(model, type) and issubclass(model, BaseModel):
        return [f.alias or n for n, f in model.model_fields.items()]
    return []


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 60 else r[:57] + "..."


def _unknown_field(loc: tuple[Any, ...], model: Any, what: str) -> str:
    _, parent = _walk(model, loc[:-1])
    names = _field_names(parent)
    hint = suggest(str(loc[-1]), names) if names else ""
    if not hint and names:
        hint = f" (valid: {', '.join(names)})"
    return f"unknown {what}{hint}"


def _union_tags(t: Any, disc: str) -> list[str]:
    """The tags the discriminated union ``t`` accepts in its field ``disc`` (in member order)."""
    out: list[str] = []
    for m in typing.get_args(t):
        if isinstance(m, type) and issubclass(m, BaseModel) and disc in m.model_fields:
            out += [str(a) for a in typing.get_args(m.model_fields[disc].annotation)]
    return out


def _union_tag(err: Mapping[str, Any], union: Any) -> tuple[str, str]:
    """(discriminator key, PROBLEM) of a ``union_tag_invalid`` / ``union_tag_not_found`` error;
    ``union``: the union type at the error's path (its tags are listed when pydantic gives none)."""
    ctx = err.get("ctx") or {}
    key = str(ctx.get("discriminator", "")).strip("'")
    tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", ""))) or _union_tags(union, key)
    if err.get("type") == "union_tag_not_found":
        return key, "required field is missing" + (f"; use one of {', '.join(tags)}" if tags else "; add it")
    tag = ctx.get("tag")
    return key, f"{tag!r} is not one of {', '.join(tags)}{suggest(str(tag), tags)}"


def _problem_by_type(err: Mapping[str, Any], pattern_hints: Mapping[str, str]) -> str | None:
    """The PROBLEM text of the error types servelab words itself; ``None`` for the rest."""
    typ = err.get("type", "")
    ctx = err.get("ctx") or {}
    inp = err.get("input")
    if typ == "missing":
        return "required field is missing; add it"
    if typ == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return f"{_short(inp)} is not one of {', '.join(choices)}{suggest(str(inp), choices)}"
    if typ in ("value_error", "assertion_error"):
        return str(ctx.get("error", err.get("msg", "")))
    if typ in ("model_type", "model_attributes_type", "dict_type"):
        return f"expected a mapping (key: value), got {type(inp).__name__} {_short(inp)}"
    if typ == "list_type":
        return f"expected a list, got {type(inp).__name__} {_short(inp)}"
    if typ == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern"))
        hint = pattern_hints.get(pattern)
        return f"{_short(inp)} does not match {pattern}" + (f"; {hint}" if hint else "")
    if typ == "too_short":
        n = ctx.get("min_length", 1)
        return f"needs at least {n} item{'s' if n != 1 else ''}, got {ctx.get('actual_length', 0)}; add one"
    return None


def error_problem(
    err: Mapping[str, Any], model: Any = None, *, pattern_hints: Mapping[str, str] | None = None, unknown: str = "field"
) -> tuple[str, str]:
    """``(PATH, PROBLEM)`` for one pydantic error (an item of ``ValidationError.errors()``).

    ``model``: the model class validated (lets an unknown key get the closest field name as a "did you
    mean", and a path through a discriminated union drop pydantic's tag segments). ``pattern_hints``:
    ``{regex: fix}`` appended when a string does not match that pattern. ``unknown``: the word for a
    key ("field", "setting"). ``PATH`` is ``""`` for a model-level check (it names its own fields)."""
    loc = tuple(err.get("loc", ()))
    path, reached = _walk(model, loc)
    typ = err.get("type", "")
    if typ == "extra_forbidden":
        return path, _unknown_field(loc, model, unknown)
    if typ in ("union_tag_invalid", "union_tag_not_found"):
        key, text = _union_tag(err, reached)
        return (f"{path}.{key}" if path else key) if key else path, text
    worded = _problem_by_type(err, pattern_hints or {})
    if worded is not None:
        return path, worded
    msg = str(err.get("msg", typ))
    msg = msg[:1].lower() + msg[1:]
    inp = err.get("input")
    return path, msg if isinstance(inp, (dict, list)) else f"{msg}, got {_short(inp)}"


def validation_error_line(
    exc: ValidationError,
    source: str | None = None,
    model: Any = None,
    *,
    pattern_hints: Mapping[str, str] | None = None,
    unknown: str = "field",
) -> str:
    """One line for ``exc``: ``SOURCE: PATH: PROBLEM`` for its first error, plus ``(+N more)`` when it has
    others. ``source`` (a file name, ``model 'x'``) is left out when ``None``; ``model``, the model class
    validated, and the other arguments as in :func:`error_problem`. Never raises."""
    errs = exc.errors(include_url=False)
    head = f"{source}: " if source else ""
    if not errs:
        return f"{head}invalid {exc.title}"
    path, text = error_problem(errs[0], model, pattern_hints=pattern_hints, unknown=unknown)
    line = f"{path}: {text}" if path else text
    return head + line + (f" (+{len(errs) - 1} more)" if len(errs) > 1 else "")


# ---------------------------------------------------------------------------------------------------
# published JSON Schemas


def json_schema_of(model: type[BaseModel], title: str | None = None) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12, ``$schema`` first) of ``model`` by alias, titled ``title`` when
    given (else pydantic's title: the class name)."""
    s = model.model_json_schema(by_alias=True)
    if title is not None:
        s["title"] = title
    return {"$schema": JSON_SCHEMA_DIALECT, **{k: v for k, v in s.items() if k != "$schema"}}


@dataclass(frozen=True)
class PublishedSchema:
    """One committed JSON Schema file: ``path`` (in the source tree, next to what it describes),
    ``build`` (returns the schema from the models), ``regenerate`` (the command that rewrites it, named
    in the stale message)."""

    path: Path
    build: Callable[[], dict[str, Any]]
    regenerate: str = "servelab schema write"

    def text(self) -> str:
        """The file's content as generated now: 2-space JSON, UTF-8 as is, one trailing newline."""
        return json.dumps(self.build(), indent=2, ensure_ascii=False) + "\n"

    def problem(self) -> str | None:
        """``None`` when the committed file equals :meth:`text`, else one line saying what is wrong and
        the command that fixes it."""
        if not self.path.is_file():
            return f"{self.path}: missing; run `{self.regenerate}`"
        try:
            current = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            return f"{self.path}: cannot read ({e}); run `{self.regenerate}`"
        if current != self.text():
            return f"{self.path}: out of date with its models; run `{self.regenerate}`"
        return None

    def write(self, folder: Path | None = None) -> Path:
        """Write :meth:`text` to ``path`` (or to ``folder / path.name``); returns the file written.
        Raises OSError when it cannot be written."""
        target = self.path if folder is None else Path(folder) / self.path.name
        target.write_text(self.text(), encoding="utf-8")
        return target
