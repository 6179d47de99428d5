"""An embedded SQLite index of past trials, and ``servelab records list|show|compare|index``.

The run folder's ``record.json`` is the evidence and stays immutable; this index only points at it and
keeps the few figures needed to list and compare trials without opening every folder.

Database: ``$SERVELAB_RECORDS_DB`` if set, else ``${SERVELAB_HOME:-~/.local/share/servelab}/records.db``
(folders created). Tables:

- ``trials(trial_id PK, run_dir, created_unix_s, name, task, decision_summary, adopt, n_candidates,
  indexed_unix_s, historical)``; ``name`` is the experiment's name (``record.name``; the trial id for
  records written before it was recorded)
- ``candidates(trial_id, name, status, verdict, engine_kind, engine_version, binary_sha256,
  model_sha256, settings_json, effective_tok_s, at_step, ttft_p95_s, historical, PK(trial_id, name))``

**Historical** (000 §12, last line: after upgrading weights, hardware, kernels or images old results are
only historical reference): a candidate row is historical when a NEWER trial (later ``created_unix_s``,
then larger ``trial_id``) has a candidate of the same name whose engine binary sha256, engine version or
model sha256 differs — each compared only when both sides recorded it. A trial is historical when it
has candidates and all of them are historical. The flags are recomputed on every :func:`index_record`
and exposed by the queries (:func:`show_record` returns them beside the record), never written into
``record.json``. Records are read as :class:`~servelab.trial.results.TrialRecord` (older schema versions
migrated); the queries return typed rows (:class:`IndexedTrial`, :class:`ShownRecord`,
:class:`RecordsComparison`).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing
from datetime import datetime
from pathlib import Path

import typer
from pydantic import Field, JsonValue

from servelab.bench.results import ResultModel
from servelab.engines.registry import EngineIdentity
from servelab.trial.decide import compare_identities, engine_facts
from servelab.trial.results import CandidateIdentity, JsonObject, TrialRecord, read_record
from servelab.wire.errors import ConfigError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS trials (
    trial_id TEXT PRIMARY KEY,
    run_dir TEXT NOT NULL,
    created_unix_s REAL,
    name TEXT,
    task TEXT,
    decision_summary TEXT,
    adopt TEXT,
    n_candidates INTEGER NOT NULL DEFAULT 0,
    indexed_unix_s REAL,
    historical INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS candidates (
    trial_id TEXT NOT NULL REFERENCES trials(trial_id) ON DELETE CASCADE,
    name TEXT NOT NULL,
    status TEXT,
    verdict TEXT,
    engine_kind TEXT,
    engine_version TEXT,
    binary_sha256 TEXT,
    model_sha256 TEXT,
    settings_json TEXT,
    effective_tok_s REAL,
    at_step TEXT,
    ttft_p95_s REAL,
    historical INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (trial_id, name)
);
CREATE INDEX IF NOT EXISTS candidates_name ON candidates(name);
"""


def default_db_path() -> Path:
    """``$SERVELAB_RECORDS_DB``, else ``${SERVELAB_HOME:-~/.local/share/servelab}/records.db``."""
    env = os.environ.get("SERVELAB_RECORDS_DB")
    if env:
        return Path(env).expanduser()
    home = os.environ.get("SERVELAB_HOME") or "~/.local/share/servelab"
    return Path(home).expanduser() / "records.db"


def _db_path(db: str | os.PathLike[str] | None) -> Path:
    return Path(db).expanduser() if db is not None else default_db_path()


def _connect(db: str | os.PathLike[str] | None) -> sqlite3.Connection:
    p = _db_path(db)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(p, timeout=30)
    except (OSError, sqlite3.Error) as e:
        raise ConfigError(
            f"cannot open the records database {p} ({e}); set SERVELAB_RECORDS_DB to a writable path"
        ) from None
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA foreign_keys = ON")
    con.executescript(_SCHEMA)
    return con


def _load_record(run_dir: Path) -> TrialRecord:
    f = run_dir / "record.json"
    if not f.is_file():
        raise ConfigError(f"{f} does not exist; pass a trial run folder (it holds record.json)")
    return read_record(f)


def _decision_summary(rec: TrialRecord) -> tuple[str, str | None]:
    dec = rec.decision
    adopt = dec.adopt or next((n for n, v in dec.verdicts.items() if v.verdict == "adopt"), None)
    parts = []
    for verdict in ("adopt", "backup", "exclude"):
        names = [n for n, v in dec.verdicts.items() if v.verdict == verdict]
        if not names:
            continue
        if verdict == "adopt":
            eff = rec.result(adopt).effective_throughput if adopt else None
            tps = eff.output_tokens_per_s if eff else None
            at = eff.at_step if eff else None
            parts.append(f"adopt {adopt}" + (f" ({tps:.1f} tok/s at {at})" if tps is not None else ""))
        else:
            parts.append(f"{verdict} {', '.join(names)}")
    return ("; ".join(parts) if parts else "no decision recorded"), adopt


def _mark_historical(con: sqlite3.Connection) -> None:
    rows = con.execute(
        "SELECT c.trial_id, c.name, c.engine_version, c.binary_sha256, c.model_sha256, t.created_unix_s "
        "FROM candidates c JOIN trials t USING (trial_id)"
    ).fetchall()
    by_name: dict[str, list[sqlite3.Row]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)

    def _key(r: sqlite3.Row) -> tuple[float, str]:
        return (r["created_unix_s"] if r["created_unix_s"] is not None else 0.0, r["trial_id"])

    def _differs(a: sqlite3.Row, b: sqlite3.Row) -> bool:
        return any(
            a[k] is not None and b[k] is not None and a[k] != b[k]
            for k in ("engine_version", "binary_sha256", "model_sha256")
        )

    for r in rows:
        hist = any(_key(o) > _key(r) and _differs(r, o) for o in by_name[r["name"]])
        con.execute(
            "UPDATE candidates SET historical=? WHERE trial_id=? AND name=?", (int(hist), r["trial_id"], r["name"])
        )
    con.execute(
        "UPDATE trials SET historical = CASE WHEN n_candidates > 0 AND NOT EXISTS ("
        "SELECT 1 FROM candidates c WHERE c.trial_id = trials.trial_id AND c.historical = 0) "
        "AND EXISTS (SELECT 1 FROM candidates c WHERE c.trial_id = trials.trial_id) THEN 1 ELSE 0 END"
    )


def index_record(run_dir: str | os.PathLike[str], db: str | os.PathLike[str] | None = None) -> str:
    """Index ``run_dir/record.json`` (insert or replace its rows), recompute the historical flags and
    return the trial id (``record.trial_id``, else the folder's name). Raises :class:`ConfigError`
    when the folder holds no readable trial record."""
    rd = Path(run_dir).expanduser().resolve()
    rec = _load_record(rd)
    tid = str(rec.trial_id or rd.name)
    summary, adopt = _decision_summary(rec)
    names = list(dict.fromkeys([*rec.results.candidates, *rec.identity.candidates]))
    created = rec.created_unix_s
    if created is None:
        created = rec.method.started_unix_s or (rd / "record.json").stat().st_mtime
    with closing(_connect(db)) as con, con:
        con.execute("DELETE FROM candidates WHERE trial_id=?", (tid,))
        con.execute(
            "INSERT OR REPLACE INTO trials (trial_id, run_dir, created_unix_s, name, task, "
            "decision_summary, adopt, n_candidates, indexed_unix_s, historical) "
            "VALUES (?,?,?,?,?,?,?,?,?,0)",
            (tid, str(rd), float(created), rec.name or tid, rec.goal.task, summary, adopt, len(names), time.time()),
        )
        for n in names:
            r = rec.result(n)
            ident = rec.ident(n)
            e = engine_facts(ident.engine)
            model = ident.model or (ident.engine.model if ident.engine is not None else None) or {}
            eff = r.effective_throughput
            v = rec.decision.verdict_of(n)
            con.execute(
                "INSERT INTO candidates (trial_id, name, status, verdict, engine_kind, engine_version, "
                "binary_sha256, model_sha256, settings_json, effective_tok_s, at_step, ttft_p95_s) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    tid,
                    n,
                    r.status if n in rec.results.candidates else None,
                    v.verdict if v else None,
                    e.kind,
                    e.version,
                    e.binary_sha256,
                    model.get("sha256"),
                    json.dumps(ident.settings, sort_keys=True),
                    eff.output_tokens_per_s if eff else None,
                    (eff.at_step if eff else None) or r.max_step_meeting_slo,
                    r.tail_latency.ttft_p95_s if r.tail_latency else None,
                ),
            )
        _mark_historical(con)
    return tid


def _resolve(con: sqlite3.Connection, key: str | os.PathLike[str], db: str | os.PathLike[str] | None) -> sqlite3.Row:
    k = str(key)
    row = con.execute("SELECT * FROM trials WHERE trial_id=?", (k,)).fetchone()
    if row is None:
        p = Path(k).expanduser()
        if p.exists():
            row = con.execute("SELECT * FROM trials WHERE run_dir=?", (str(p.resolve()),)).fetchone()
    if row is None and k:
        rows = con.execute(
            "SELECT * FROM trials WHERE trial_id LIKE ? ESCAPE '\\'",
            (k.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",),
        ).fetchall()
        if len(rows) == 1:
            row = rows[0]
        elif len(rows) > 1:
            raise ConfigError(
                f"trial id prefix {k!r} is ambiguous in {_db_path(db)} "
                f"({', '.join(r['trial_id'] for r in rows[:5])}…): give more of the id"
            )
    if row is None:
        raise ConfigError(f"no trial {k!r} in {_db_path(db)}: see 'servelab records list'")
    return row


class IndexedCandidate(ResultModel):
    """One candidate row of the index (figures as the record held them)."""

    name: str
    status: str | None = None
    verdict: str | None = None
    engine_kind: str | None = None
    engine_version: str | None = None
    binary_sha256: str | None = None
    model_sha256: str | None = None
    settings: JsonObject = Field(default_factory=dict)
    effective_tok_s: float | None = None
    at_step: str | None = None
    ttft_p95_s: float | None = None
    historical: bool = False


class IndexedTrial(ResultModel):
    """One trial row of the index with its candidates; ``decision`` is a one-line summary."""

    trial_id: str
    run_dir: str
    created_unix_s: float | None = None
    name: str | None = None
    task: str | None = None
    decision: str | None = None
    adopt: str | None = None
    n_candidates: int = 0
    historical: bool = False
    candidates: list[IndexedCandidate] = Field(default_factory=list)


class ShownRecord(ResultModel):
    """:func:`show_record`: the trial's record, whether it (and each candidate) is historical, its index row."""

    record: TrialRecord
    historical: bool
    historical_candidates: dict[str, bool]
    index: IndexedTrial

    def as_json(self) -> JsonObject:
        """The record as written plus ``historical``, ``historical_candidates`` and ``index``."""
        out: JsonObject = self.record.model_dump(mode="json", by_alias=True, exclude_unset=True)
        out.update(
            {
                "historical": self.historical,
                "historical_candidates": dict(self.historical_candidates),
                "index": self.index.model_dump(mode="json"),
            }
        )
        return out


class SideFigures(ResultModel):
    """One trial's figures of a candidate in :func:`compare_records`."""

    effective_tok_s: float | None = None
    at_step: str | None = None
    ttft_p95_s: float | None = None
    verdict: str | None = None
    status: str | None = None
    historical: bool = False


class CandidateChange(ResultModel):
    """A candidate present in both compared trials: its figures in each, the throughput change (%)
    and which identity factors differ (:func:`servelab.trial.decide.compare_identities`)."""

    name: str
    a: SideFigures
    b: SideFigures
    tok_s_change_pct: float | None = None
    differs_in: list[str] = Field(default_factory=list)
    details: dict[str, list[JsonValue]] = Field(default_factory=dict)
    note: str = ""


class TrialHead(ResultModel):
    """A compared trial: id, date, adopted candidate, historical flag, run folder."""

    trial_id: str
    created_unix_s: float | None = None
    adopt: str | None = None
    historical: bool = False
    run_dir: str


class RecordsComparison(ResultModel):
    """:func:`compare_records`: the two trials, every candidate in both, and those in only one."""

    a: TrialHead
    b: TrialHead
    candidates: list[CandidateChange] = Field(default_factory=list)
    only_in_a: list[str] = Field(default_factory=list)
    only_in_b: list[str] = Field(default_factory=list)


def _trial_row(row: sqlite3.Row, cands: list[sqlite3.Row]) -> IndexedTrial:
    return IndexedTrial(
        trial_id=row["trial_id"],
        run_dir=row["run_dir"],
        created_unix_s=row["created_unix_s"],
        name=row["name"],
        task=row["task"],
        decision=row["decision_summary"],
        adopt=row["adopt"],
        n_candidates=row["n_candidates"],
        historical=bool(row["historical"]),
        candidates=[_cand_row(c) for c in cands],
    )


def _cand_row(c: sqlite3.Row) -> IndexedCandidate:
    return IndexedCandidate(
        name=c["name"],
        status=c["status"],
        verdict=c["verdict"],
        engine_kind=c["engine_kind"],
        engine_version=c["engine_version"],
        binary_sha256=c["binary_sha256"],
        model_sha256=c["model_sha256"],
        settings=json.loads(c["settings_json"] or "{}"),
        effective_tok_s=c["effective_tok_s"],
        at_step=c["at_step"],
        ttft_p95_s=c["ttft_p95_s"],
        historical=bool(c["historical"]),
    )


def _cands(con: sqlite3.Connection, tid: str) -> list[sqlite3.Row]:
    return con.execute("SELECT * FROM candidates WHERE trial_id=? ORDER BY rowid", (tid,)).fetchall()


def list_records(db: str | os.PathLike[str] | None = None) -> list[IndexedTrial]:
    """Every indexed trial (:class:`IndexedTrial`, with its candidates), newest first."""
    with closing(_connect(db)) as con:
        rows = con.execute("SELECT * FROM trials ORDER BY created_unix_s DESC, trial_id DESC").fetchall()
        return [_trial_row(r, _cands(con, r["trial_id"])) for r in rows]


def show_record(trial_id_or_run_dir: str | os.PathLike[str], db: str | os.PathLike[str] | None = None) -> ShownRecord:
    """The trial's record (:class:`ShownRecord`: the record, ``historical``, ``historical_candidates``
    name -> bool, its ``index`` row). Accepts a trial id, a unique id prefix, or a run folder (indexed
    first if it is not yet). Raises :class:`ConfigError` for an unknown trial or a run folder whose
    ``record.json`` is gone."""
    key = str(trial_id_or_run_dir)
    p = Path(key).expanduser()
    if (p / "record.json").is_file():
        with closing(_connect(db)) as con:
            known = con.execute("SELECT 1 FROM trials WHERE run_dir=?", (str(p.resolve()),)).fetchone()
        if not known:
            key = index_record(p, db)
    with closing(_connect(db)) as con:
        row = _resolve(con, key, db)
        cands = _cands(con, row["trial_id"])
    return ShownRecord(
        record=_load_record(Path(row["run_dir"])),
        historical=bool(row["historical"]),
        historical_candidates={c["name"]: bool(c["historical"]) for c in cands},
        index=_trial_row(row, cands),
    )


def _ident_from_row(c: IndexedCandidate) -> CandidateIdentity:
    engine = None
    if c.engine_kind is not None or c.engine_version is not None or c.binary_sha256 is not None:
        name = c.engine_kind or "unknown"
        engine = EngineIdentity(kind=name, engine=name, version=c.engine_version, binary_sha256=c.binary_sha256)
    return CandidateIdentity(engine=engine, model={"sha256": c.model_sha256}, settings=c.settings)


def compare_records(
    a: str | os.PathLike[str], b: str | os.PathLike[str], db: str | os.PathLike[str] | None = None
) -> RecordsComparison:
    """Compare two indexed trials from the index alone (the run folders may be gone): every candidate
    name present in both, with its figures in each trial and the identity factors that differ.
    Raises :class:`ConfigError` for an unknown trial."""
    with closing(_connect(db)) as con:
        ra, rb = _resolve(con, a, db), _resolve(con, b, db)
        ca = {c["name"]: _cand_row(c) for c in _cands(con, ra["trial_id"])}
        cb = {c["name"]: _cand_row(c) for c in _cands(con, rb["trial_id"])}
    fields = set(SideFigures.model_fields)
    out = []
    for n in [n for n in ca if n in cb]:
        x, y = ca[n], cb[n]
        cmp = compare_identities(_ident_from_row(x), _ident_from_row(y), ra["trial_id"], rb["trial_id"])
        change = None
        if x.effective_tok_s and y.effective_tok_s is not None:
            change = (y.effective_tok_s / x.effective_tok_s - 1) * 100
        out.append(
            CandidateChange(
                name=n,
                a=SideFigures(**x.model_dump(include=fields)),
                b=SideFigures(**y.model_dump(include=fields)),
                tok_s_change_pct=change,
                differs_in=cmp.differs_in,
                details=cmp.details,
                note=cmp.note,
            )
        )

    def _head(r: sqlite3.Row) -> TrialHead:
        return TrialHead(
            trial_id=r["trial_id"],
            created_unix_s=r["created_unix_s"],
            adopt=r["adopt"],
            historical=bool(r["historical"]),
            run_dir=r["run_dir"],
        )

    return RecordsComparison(
        a=_head(ra),
        b=_head(rb),
        candidates=out,
        only_in_a=[n for n in ca if n not in cb],
        only_in_b=[n for n in cb if n not in ca],
    )


# ---------------------------------------------------------------------------------------------------
# CLI: servelab records ...
# ---------------------------------------------------------------------------------------------------

records_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="List, show and compare past trials (index: $SERVELAB_RECORDS_DB or "
    "${SERVELAB_HOME:-~/.local/share/servelab}/records.db).",
)

_DB_OPT = typer.Option(
    None,
    "--db",
    help="Records database (path; default: $SERVELAB_RECORDS_DB, else "
    "${SERVELAB_HOME:-~/.local/share/servelab}/records.db).",
)


def _date(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "?"


def _tps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


@records_app.command("list")
def list_command(
    db: Path | None = _DB_OPT, as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")
) -> None:
    """List indexed trials, newest first."""
    from rich.console import Console
    from rich.table import Table

    rows = list_records(db)
    if as_json:
        typer.echo(json.dumps([r.model_dump(mode="json") for r in rows], indent=2))
        return
    if not rows:
        typer.echo(f"no trials in {_db_path(db)}: run 'servelab trial' (or 'servelab records index RUN')")
        return
    t = Table(title=f"trials in {_db_path(db)}")
    for col in ("id", "date", "name", "adopt", "candidates", "historical"):
        t.add_column(col)
    for r in rows:
        cands = ", ".join(f"{c.name}:{c.verdict or c.status or '?'}" for c in r.candidates)
        t.add_row(
            r.trial_id,
            _date(r.created_unix_s),
            str(r.name or ""),
            str(r.adopt or "-"),
            cands or "-",
            "yes" if r.historical else "no",
        )
    Console(width=200).print(t)


@records_app.command("show")
def show_command(
    trial: str = typer.Argument(..., help="Trial id (or a unique prefix) or run folder."),
    db: Path | None = _DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the whole record as JSON."),
) -> None:
    """Show one trial: its decision, candidates and where its evidence lies."""
    shown = show_record(trial, db)
    if as_json:
        typer.echo(json.dumps(shown.as_json(), indent=2, ensure_ascii=False))
        return
    idx, rec = shown.index, shown.record
    lines = [
        f"trial {idx.trial_id}  {_date(idx.created_unix_s)}"
        + ("  [HISTORICAL: a newer trial used another engine or weights]" if shown.historical else ""),
        f"run folder: {idx.run_dir}",
    ]
    if idx.task:
        lines.append(f"task: {idx.task}")
    if rec.goal.slo:
        lines.append(f"SLO: {', '.join(rec.goal.slo)}")
    lines.append(f"decision: {idx.decision}")
    dec = rec.decision
    for c in idx.candidates:
        lines.append(
            f"  {c.name}: {c.verdict or c.status or '?'}, {_tps(c.effective_tok_s)} tok/s at "
            f"{c.at_step or '-'}, ttft_p95 {c.ttft_p95_s if c.ttft_p95_s is not None else '-'} s, "
            f"{c.engine_kind or '?'} {c.engine_version or ''}, model sha256 "
            f"{(c.model_sha256 or '?')[:12]}" + ("  (historical)" if c.historical else "")
        )
        v = dec.verdict_of(c.name)
        for reason in v.reasons if v else []:
            lines.append(f"      - {reason}")
    for cmp in dec.comparisons:
        lines.append(f"  {cmp.a} vs {cmp.b}: {cmp.note}")
    if dec.scope:
        lines.append(f"scope: {dec.scope}")
    if rec.evidence.reproduce:
        lines.append(f"reproduce: {rec.evidence.reproduce}")
    typer.echo("\n".join(lines))


@records_app.command("compare")
def compare_command(
    a: str = typer.Argument(..., help="First trial id or run folder."),
    b: str = typer.Argument(..., help="Second trial id or run folder."),
    db: Path | None = _DB_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Compare two trials candidate by candidate: throughput, TTFT P95, verdict, what differs."""
    from rich.console import Console
    from rich.table import Table

    res = compare_records(a, b, db)
    if as_json:
        typer.echo(res.model_dump_json(indent=2))
        return
    t = Table(title=f"{res.a.trial_id} (A) vs {res.b.trial_id} (B)")
    for col in (
        "candidate",
        "tok/s A",
        "tok/s B",
        "change",
        "ttft_p95 A",
        "ttft_p95 B",
        "verdict A",
        "verdict B",
        "what differs",
    ):
        t.add_column(col)
    for c in res.candidates:
        ch = c.tok_s_change_pct
        t.add_row(
            c.name,
            _tps(c.a.effective_tok_s),
            _tps(c.b.effective_tok_s),
            "-" if ch is None else f"{ch:+.1f}%",
            "-" if c.a.ttft_p95_s is None else f"{c.a.ttft_p95_s:.3g} s",
            "-" if c.b.ttft_p95_s is None else f"{c.b.ttft_p95_s:.3g} s",
            str(c.a.verdict or c.a.status or "-"),
            str(c.b.verdict or c.b.status or "-"),
            c.note,
        )
    con = Console(width=200)
    con.print(t)
    if res.only_in_a or res.only_in_b:
        con.print(f"only in A: {', '.join(res.only_in_a) or '-'}; only in B: {', '.join(res.only_in_b) or '-'}")


@records_app.command("index")
def index_command(
    run_dir: Path = typer.Argument(..., help="Trial run folder (holds record.json)."), db: Path | None = _DB_OPT
) -> None:
    """Add (or refresh) a run folder in the index; prints its trial id."""
    typer.echo(index_record(run_dir, db))


__all__ = [
    "CandidateChange",
    "IndexedCandidate",
    "IndexedTrial",
    "RecordsComparison",
    "ShownRecord",
    "compare_records",
    "default_db_path",
    "index_record",
    "list_records",
    "records_app",
    "show_record",
]
