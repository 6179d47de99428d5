"""Write-ahead journal of usage: every admitted request is on local disk before it is forwarded, so a
gateway crash (kill -9) or a ledger database that is down loses no usage row.

Why a local journal and not a database row per admission: a synchronous PostgreSQL round trip per
request would add a network round trip (and a commit) to every request's time to first token, and
would make serving depend on the database being up. An append to a local file is one ``write(2)``
(a few microseconds, measured in docs/gateway-design.md); PostgreSQL's own asynchronous commit makes
the same trade (``synchronous_commit = off``: a commit is durable after at most 3 x
``wal_writer_delay``, https://www.postgresql.org/docs/15/wal-async-commit.html, checked 2026-12-01).

Files: one folder (``ledger.spool_path``) of segments ``seg-<time_ns>-<pid>.jsonl``, JSON lines:

- ``{"op": "a", "id": J, "row": {UsageRow}, "p": {...}?}`` at admission (outcome ``incomplete``, the
  reservation in ``reserved_tokens``), written before the request is forwarded;
- ``{"op": "p", "id": J, "p": {"prompt_tokens", "completion_tokens", "status", "backend",
  "upstream_model"}}`` served so far, every :data:`PROGRESS_INTERVAL_S` for requests still in flight;
- ``{"op": "s", "id": J, "row": {UsageRow}}`` at settle: the final row (also handed to the store).

Durability: a line is in the kernel once ``write`` returns, so it survives the death of the process
(kill -9, OOM); ``fsync`` runs every ``fsync_interval_s`` off the event loop, so a power loss or
kernel crash loses at most that much. Each process holds an exclusive ``flock`` on its own segments;
a segment nobody holds is an orphan of a process that died. Segments are sealed (a fresh one started,
requests in flight carried into it) at most every :data:`CHECKPOINT_S`, and a sealed segment is deleted
once the store confirmed every row settled in it (``flush``); while the database is down they stay, and
at close they are left for the next start.

Recovery (:meth:`DurableLedger.start`): every orphan segment is read; a request with a final row gets
it, one without gets an ``incomplete`` row with its reservation and what was known served; rows already
in the database (same ``request_id`` and ``ts``) are skipped; then the orphans are deleted. Token budgets
charge an ``incomplete`` row at ``max(reserved, served)`` (:func:`servelab.gateway.ledger._budget_sql`):
the output cap bounds what the engine could have sent after the last progress line.

A journal write that fails (disk full) is logged (at most once a minute) and counted in
``write_errors``; the request is still served (the store still gets the final row).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson

from servelab.gateway.ledger import UsageRow
from servelab.gateway.ledger_postgres import PostgresLedger
from servelab.wire import ConfigError

__all__ = ["CHECKPOINT_S", "PROGRESS_INTERVAL_S", "DurableLedger", "UsageJournal"]

log = logging.getLogger("servelab.gateway.journal")

#: How often served-so-far of requests in flight is written, seconds (~1.5 ms of event loop per 1,000
#: streams in flight, measured in docs/gateway-design.md).
PROGRESS_INTERVAL_S = 1.0
#: How often the current segment is sealed and confirmed segments deleted, seconds.
CHECKPOINT_S = 5.0
#: A segment with more lines is sealed even if nothing in it settled yet (long streams' progress).
SEGMENT_MAX_LINES = 50_000
_PROGRESS_FIELDS = ("prompt_tokens", "completion_tokens", "status", "backend", "upstream_model")

#: What :meth:`UsageJournal.admit` calls to learn what was served so far: a dict of some of
#: ``prompt_tokens``, ``completion_tokens``, ``status``, ``backend``, ``upstream_model``.
Progress = Callable[[], dict[str, Any]]


@dataclass
class _Segment:
    path: Path
    fd: int
    settles: int = 0
    lines: int = 0


@dataclass
class _Open:
    row: UsageRow
    live: Progress | None
    last: dict[str, Any] | None = None


class UsageJournal:
    """The segment files of one process (module docstring). ``folder``: created if missing.

    Call :meth:`recover` (returns the orphans' rows), then :meth:`open`; :meth:`admit` / :meth:`settle`
    are synchronous (one ``write``, no await) and safe on the event loop. Raises ``OSError`` from
    :meth:`recover`/:meth:`open` when the folder cannot be used.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.write_errors = 0
        self._cur: _Segment | None = None
        self._sealed: list[_Segment] = []
        self._kept: list[_Segment] = []
        self._open: dict[str, _Open] = {}
        self._dirty = False
        self._last_error_log = 0.0

    # -------------------------------------------------------------- recovery
    def recover(self) -> tuple[list[UsageRow], int]:
        """Rows of every orphan segment (module docstring) and how many of them are ``incomplete``.
        The orphans stay locked by this process until :meth:`drop_orphans`."""
        self.folder.mkdir(parents=True, exist_ok=True)
        finals: dict[str, UsageRow] = {}
        opened: dict[str, UsageRow] = {}
        order: dict[str, None] = {}  # request ids in order of first appearance
        for p in sorted(self.folder.iterdir()):
            if p.suffix not in (".jsonl", ".tmp") or not p.name.startswith("seg-"):
                continue
            with contextlib.suppress(OSError):  # a fresh .tmp may be a live process's segment being born
                if p.suffix == ".tmp" and time.time() - p.stat().st_mtime < 60:
                    continue
            try:
                fd = os.open(p, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # a live process owns it
                os.close(fd)
                continue
            self._kept.append(_Segment(p, fd))  # keep the lock until drop_orphans
            with open(fd, "rb", closefd=False) as f:
                data = f.read()
            for line in data.splitlines():
                try:
                    rec = orjson.loads(line)
                    jid, op = rec["id"], rec["op"]
                    if op == "s":
                        finals[jid] = UsageRow(**rec["row"])
                    elif op == "a":  # first admission, or carried into a later segment with its progress
                        opened[jid] = _apply(opened.get(jid) or UsageRow(**rec["row"]), rec.get("p"))
                    elif op == "p" and jid in opened:
                        opened[jid] = _apply(opened[jid], rec.get("p"))
                    else:
                        continue
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    continue  # a torn last line (power loss mid-write) or a foreign line
                order.setdefault(jid)
        rows = [finals.get(jid) or opened[jid] for jid in order]
        return rows, sum(1 for jid in order if jid not in finals)

    def drop_orphans(self) -> None:
        """Delete the orphan segments read by :meth:`recover` (their rows are in the store now)."""
        _delete(self._kept)

    # -------------------------------------------------------------- writing
    def open(self) -> None:
        """Start this process's first segment."""
        self._cur = self._new_segment()

    def _new_segment(self) -> _Segment:
        name = f"seg-{time.time_ns():020d}-{os.getpid()}"
        tmp = self.folder / f"{name}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_EXCL, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)  # before the name is final: nobody may take it for an orphan
        path = tmp.with_suffix(".jsonl")
        os.rename(tmp, path)
        return _Segment(path, fd)

    def _write(self, rec: dict[str, Any]) -> None:
        self._write_lines([rec])

    def _write_lines(self, recs: Sequence[dict[str, Any]]) -> None:
        """Append ``recs`` as JSON lines in one ``write(2)``."""
        seg = self._cur
        if seg is None or not recs:
            return
        line = b"".join(orjson.dumps(r) + b"\n" for r in recs)
        try:
            if os.write(seg.fd, line) != len(line):
                raise OSError("short write (disk full?)")
        except OSError as e:
            self.write_errors += 1
            now = time.monotonic()
            if now - self._last_error_log > 60:
                self._last_error_log = now
                log.error(
                    "journal: cannot write to %s (%s); usage of requests in flight is not crash-safe "
                    "until this is fixed (%d write errors so far)",
                    seg.path,
                    e,
                    self.write_errors,
                )
            return
        seg.lines += len(recs)
        self._dirty = True

    def admit(self, jid: str, row: UsageRow, live: Progress | None = None) -> None:
        """Journal an admitted request (``row``: outcome ``incomplete``, ``reserved_tokens`` set) before
        it is forwarded; ``live()`` is asked for served-so-far every :data:`PROGRESS_INTERVAL_S`."""
        self._open[jid] = _Open(row, live)
        self._write({"op": "a", "id": jid, "row": row})

    def settle(self, jid: str, row: UsageRow) -> None:
        """Journal the final ``row`` of request ``jid``."""
        self._open.pop(jid, None)
        self._write({"op": "s", "id": jid, "row": row})
        if self._cur is not None:
            self._cur.settles += 1

    def progress(self) -> None:
        """Write served-so-far of every request in flight whose figures changed since the last time."""
        recs = []
        for jid, o in self._open.items():
            if o.live is None:
                continue
            try:
                p = o.live()
            except Exception:  # noqa: BLE001 — a progress probe must never break the journal
                continue
            if p != o.last:
                o.last = p
                recs.append({"op": "p", "id": jid, "p": p})
        self._write_lines(recs)

    @property
    def in_flight(self) -> int:
        """Requests admitted and not settled (count)."""
        return len(self._open)

    async def sync(self) -> None:
        """``fsync`` the current segment if written since the last call (in a thread)."""
        if self._dirty and self._cur is not None:
            self._dirty = False
            await asyncio.get_running_loop().run_in_executor(None, os.fsync, self._cur.fd)

    def seal(self) -> bool:
        """Start a new segment, carrying the requests in flight into it, when the current one holds a
        settled row; the old one waits in ``sealed`` for :meth:`drop_sealed`. Returns whether it sealed."""
        old = self._cur
        if old is None or (old.settles == 0 and old.lines < SEGMENT_MAX_LINES):
            return False
        self._cur = self._new_segment()
        self._write_lines(
            [{"op": "a", "id": jid, "row": o.row, **({"p": o.last} if o.last else {})} for jid, o in self._open.items()]
        )
        self._sealed.append(old)
        return True

    @property
    def sealed(self) -> bool:
        """Whether sealed segments wait for the store's confirmation."""
        return bool(self._sealed)

    async def sync_sealed(self) -> None:
        """``fsync`` the sealed segments and the folder (in a thread): they survive a power loss."""
        fds = [s.fd for s in self._sealed]

        def run() -> None:
            for fd in fds:
                os.fsync(fd)
            dfd = os.open(self.folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

        await asyncio.get_running_loop().run_in_executor(None, run)

    def drop_sealed(self) -> None:
        """Delete the sealed segments: the store has committed every row settled in them."""
        _delete(self._sealed)

    def keep_sealed(self) -> None:
        """Keep the sealed segments for the next start (the store lost rows of them)."""
        self._kept += self._sealed
        self._sealed.clear()

    def close(self, keep: bool) -> list[Path]:
        """Close every segment; delete them unless ``keep`` (or a request is still in flight), else leave
        them for the next start. Returns the paths left on disk."""
        segs = [*self._kept, *self._sealed, *([self._cur] if self._cur is not None else [])]
        keep = keep or bool(self._open)
        left = []
        for seg in segs:
            with contextlib.suppress(OSError):
                if seg in self._kept or keep:
                    os.fsync(seg.fd)
                    left.append(seg.path)
                else:
                    seg.path.unlink()
            os.close(seg.fd)
        self._kept, self._sealed, self._cur = [], [], None
        return left


def _delete(segs: list[_Segment]) -> None:
    """Unlink and close ``segs`` (the lock goes with the last close), then empty the list."""
    for seg in segs:
        with contextlib.suppress(OSError):
            seg.path.unlink()
        os.close(seg.fd)
    segs.clear()


def _apply(row: UsageRow, p: dict[str, Any] | None) -> UsageRow:
    if not p:
        return row
    return replace(row, **{k: p[k] for k in _PROGRESS_FIELDS if k in p and p[k] is not None})


class DurableLedger:
    """A usage store (:class:`~servelab.gateway.ledger.SqliteLedger` or
    :class:`~servelab.gateway.ledger.PostgresLedger`) behind a :class:`UsageJournal` in ``spool_path``.

    Same interface as the store (``record``, ``totals``, ``put_key``, ``load_keys``, ``flush``,
    ``budget_spend``) plus :meth:`admit` (before forwarding) and :meth:`settle` (the final row).
    ``fsync_interval_s``: how often the journal is fsynced (a power loss loses at most that much; a
    crashed process loses nothing). :meth:`start` raises :class:`~servelab.wire.ConfigError` naming
    ``ledger.spool_path`` when the folder cannot be used, and the store's own errors otherwise.
    """

    def __init__(self, store: Any, spool_path: str | Path, fsync_interval_s: float = 0.2) -> None:
        self.store = store
        self.journal = UsageJournal(spool_path)
        self.fsync_interval_s = fsync_interval_s
        self._task: asyncio.Task[None] | None = None
        self._dropped_seen = self._dropped_base = 0
        self._n = 0

    def __getattr__(self, name: str) -> Any:  # totals, put_key, load_keys, flush, dropped_rows, ...
        if name == "store":
            raise AttributeError(name)
        return getattr(self.store, name)

    async def start(self) -> None:
        """Start the store, replay orphan segments into it (log line with the counts), open the journal."""
        await self.store.start()
        folder = self.journal.folder
        try:
            rows, incomplete = self.journal.recover()
        except OSError as e:
            raise ConfigError(
                f"ledger.spool_path: cannot use {folder} ({e.strerror or e}); give a writable folder"
            ) from None
        if rows:
            n = await self.store.insert_missing(rows)
            log.warning(
                "ledger: replayed %d usage rows from the spool %s (%d of them incomplete: the gateway "
                "stopped while they were in flight; %d were already in the ledger)",
                n,
                folder,
                incomplete,
                len(rows) - n,
            )
        self.journal.drop_orphans()
        try:
            self.journal.open()
        except OSError as e:
            raise ConfigError(
                f"ledger.spool_path: cannot write in {folder} ({e.strerror or e}); give a writable folder"
            ) from None
        self._dropped_seen = self._dropped_base = getattr(self.store, "dropped_rows", 0)
        self._task = asyncio.get_running_loop().create_task(self._maintain(), name="servelab-journal")

    def admit(self, jid: str, row: UsageRow, live: Progress | None = None) -> None:
        """See :meth:`UsageJournal.admit` (synchronous)."""
        self.journal.admit(jid, row, live)

    async def settle(self, jid: str, row: UsageRow) -> None:
        """Journal the final row, then hand it to the store."""
        self.journal.settle(jid, row)
        await self.store.record(row)

    async def record(self, row: UsageRow) -> None:
        """A row with no admission (straight to the store, journaled as settled)."""
        self._n += 1
        self.journal.settle(f"rec-{self._n}", row)
        await self.store.record(row)

    async def _maintain(self) -> None:
        last_progress = last_checkpoint = time.monotonic()
        while True:
            await asyncio.sleep(self.fsync_interval_s)
            try:
                now = time.monotonic()
                if now - last_progress >= PROGRESS_INTERVAL_S:
                    last_progress = now
                    self.journal.progress()
                if now - last_checkpoint >= CHECKPOINT_S:
                    last_checkpoint = now
                    await self._checkpoint()
                await self.journal.sync()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 — the journal must outlive a bad moment of the disk or database
                log.error("journal: maintenance failed: %s", e)

    async def _checkpoint(self) -> bool:
        """Seal, confirm through the store's flush, delete what it confirmed. True when nothing waits."""
        if not self.journal.sealed and not self.journal.seal():
            return True
        await self.journal.sync_sealed()
        try:
            await self.store.flush()
        except Exception:  # noqa: BLE001 — the store logs its own failure (PostgreSQL down): retry next time
            return False
        dropped = getattr(self.store, "dropped_rows", 0)
        if dropped != self._dropped_seen:  # the store lost rows: keep their journal for the next start
            self._dropped_seen = dropped
            self.journal.keep_sealed()
            return False
        self.journal.drop_sealed()
        return True

    async def close(self) -> None:
        """Stop the journal's task, write what the store holds; delete the journal when everything is in
        the store, else leave it for the next start and log one line saying how many rows and where."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        self._task = None
        flushed = True
        try:
            await self.store.flush()
        except Exception:  # noqa: BLE001 — any failure of the flush means not flushed
            flushed = False
        lost = getattr(self.store, "dropped_rows", 0) - self._dropped_base
        left = self.journal.close(keep=not flushed or lost > 0)
        folder = str(self.journal.folder)
        if isinstance(self.store, PostgresLedger):
            await self.store.close(spooled_in=folder if left else None)  # logs the spooled rows itself
        else:
            await self.store.close()
        if left and flushed:
            log.error(
                "ledger: %d usage rows the store could not write (or requests still in flight) are spooled "
                "in %s; they are written when the gateway next starts",
                lost,
                folder,
            )
