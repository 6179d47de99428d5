"""Subcommands of the ``servelab`` command line imported only when they run.

Importing every command module up front (the gateway, the trial, numpy, aiohttp...) cost about 1.4 s
per start, ``servelab bench --help`` included. :func:`lazy_group` makes a typer group class whose
commands are listed from a table of :class:`LazyCommand` (module, attribute, summary) and imported
the first time one is looked up; ``servelab --help`` lists them from the summaries without importing
any. It uses typer's ``Typer(cls=...)`` hook for the group class (a :class:`typer.core.TyperGroup`
subclass) and the lazy-group pattern of click, which typer is built on (click's "Complex
Applications" page, https://click.palletsprojects.com/en/stable/complex/, read 2026-12-01). Typer
0.29 vendors its own click (``typer._click``), so this module names no click type.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import typer
from typer.core import TyperGroup
from typer.models import TyperInfo


@dataclass(frozen=True)
class LazyCommand:
    """Where a subcommand lives: ``module`` (dotted name) and ``attr``, a typer command function or a
    :class:`typer.Typer` sub-app; ``summary`` is the one line ``servelab --help`` lists for it, set
    as the command's ``short_help`` once imported (the same text either way)."""

    module: str
    attr: str
    summary: str

    def load(self, name: str, parent: TyperGroup) -> Any:
        """Import the module and build the click command named ``name`` as ``app.command(name)`` or
        ``app.add_typer(sub, name=name)`` would under ``parent`` (its help markup mode). Raises
        ``ImportError``/``AttributeError`` when the table points nowhere."""
        obj = getattr(importlib.import_module(self.module), self.attr)
        cmd: Any  # a TyperGroup or a TyperCommand (typer's vendored click types)
        if isinstance(obj, typer.Typer):
            cmd = typer.main.get_group_from_info(
                TyperInfo(obj, name=name),
                pretty_exceptions_short=True,
                suggest_commands=True,
                rich_markup_mode=parent.rich_markup_mode,
            )
        else:
            single = typer.Typer(add_completion=False, rich_markup_mode=parent.rich_markup_mode)
            single.command(name)(obj)
            cmd = typer.main.get_command(single)
        cmd.short_help = self.summary
        return cmd


class _Commands(MutableMapping[str, Any]):
    """A group's ``commands``: the lazy table's names first (in its order), then commands added
    eagerly; looking a lazy one up imports and keeps it."""

    def __init__(self, eager: dict[str, Any], table: Mapping[str, LazyCommand], parent: TyperGroup):
        self.loaded = eager
        self._table, self._parent = table, parent

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded and name in self._table:
            self.loaded[name] = self._table[name].load(name, self._parent)
        return self.loaded[name]

    def __setitem__(self, name: str, cmd: Any) -> None:
        self.loaded[name] = cmd

    def __delitem__(self, name: str) -> None:
        del self.loaded[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._table
        yield from (n for n in self.loaded if n not in self._table)

    def __len__(self) -> int:
        return len(set(self._table) | set(self.loaded))


def lazy_group(table: Mapping[str, LazyCommand]) -> type[TyperGroup]:
    """A :class:`typer.core.TyperGroup` subclass for ``typer.Typer(cls=...)`` whose subcommands are
    ``table`` (name -> :class:`LazyCommand`) plus any registered the usual way."""

    class LazyGroup(TyperGroup):
        def __init__(self, **attrs: Any) -> None:
            super().__init__(**attrs)
            self.commands = _Commands(dict(self.commands), table, self)

        def list_commands(self, ctx: Any) -> list[str]:
            """Names in table order, without importing (typer's own iterates ``commands.items()``)."""
            return list(self.commands)

        def format_commands(self, ctx: Any, formatter: Any) -> None:
            """The command list of ``--help``: the table's summaries for commands not imported yet."""
            names = self.list_commands(ctx)
            if not names:
                return
            limit = formatter.width - 6 - max(len(n) for n in names)
            loaded = self.commands.loaded if isinstance(self.commands, _Commands) else self.commands
            rows = []
            for name in names:
                if name in loaded:
                    cmd = loaded[name]
                    if not cmd.hidden:
                        rows.append((name, cmd.get_short_help_str(limit)))
                else:
                    rows.append((name, table[name].summary))
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    return LazyGroup
