"""An embedded SQLite index of past trials, and ``servelab records list|show|compare|index``.

The run folder's ``record.json`` is the evidence and stays immutable; this index only points at it and
keeps the few figures needed to list and compare trials without opening every folder.

Database: ``$SERVELAB_RECORDS_DB`` if set, else ``${SERVELAB_HOME:-~/.local/share/servelab}/records.db``
(folders created). Tables:

- ``trials(trial_id PK, run_dir, created_unix_s, name, task, decision_summary, adopt, n_candidates,
  indexed_unix_s, historical)``
- ``candidates(trial_id, name, status, verdict, engine_kind, engine_version, binary_sha256,
  model_sha256, settings_json, effective_tok_s, at_step, ttft_p95_s, historical, PK(trial_id, name))``

**Historical** (000 §12, last line: after upgrading weights, hardware, kernels or images old results are
only historical reference): a candidate row is historical when a NEWER trial (later ``created_unix_s``,
then larger ``trial_id``) has a candidate of the same name whose engine binary sha256, engine version or
model sha256 differs — each compared only when both sides recorded it. A trial is historical when it
has candidates and all of them are historical. The flags are recomputed on every :func:`index_record`
and exposed by the queries (``show_record`` adds ``"historical"`` and ``"historical_candidates"`` to
the record it returns), never written into ``record.json``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from contextlib import closing
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

import typer

from servelab.trial.decide import compare_identities, engine_facts
from servelab.wire.client import ConfigError

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
        raise ConfigError(f"cannot open the records database {p} ({e}); set SERVELAB_RECORDS_DB to a writable path") from None
    con.row_factory = sqlite3.Row
    con.execute("PRAGMA foreign_keys = ON")
    con.executescript(_SCHEMA)
    return con


def _load_record(run_dir: Path) -> dict[str, Any]:
    f = run_dir / "record.json"
    try:
        with open(f, encoding="utf-8") as fh:
            rec = json.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{f} does not exist; pass a trial run folder (it holds record.json)") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"{f} is not a readable JSON record ({e})") from None
    if not isinstance(rec, dict):
        raise ConfigError(f"{f} is not a trial record (expected a JSON object)")
    return rec


def _decision_summary(rec: dict[str, Any]) -> tuple[str, Optional[str]]:
    dec = rec.get("decision") or {}
    verdicts = dec.get("verdicts") or {}
    results = (rec.get("results") or {}).get("candidates") or {}
    adopt = dec.get("adopt") or next((n for n, v in verdicts.items() if v.get("verdict") == "adopt"), None)
    parts = []
    for verdict in ("adopt", "backup", "exclude"):
        names = [n for n, v in verdicts.items() if v.get("verdict") == verdict]
        if not names:
            continue
        if verdict == "adopt":
            eff = (results.get(adopt) or {}).get("effective_throughput") or {}
            tps = eff.get("output_tokens_per_s")
            at = eff.get("at_step")
            parts.append(f"adopt {adopt}" + (f" ({tps:.1f} tok/s at {at})" if tps is not None else ""))
        else:
            parts.append(f"{verdict} {', '.join(names)}")
    return ("; ".join(parts) if parts else "no decision recorded"), adopt


def _mark_historical(con: sqlite3.Connection) -> None:
    rows = con.execute(
        "SELECT c.trial_id, c.name, c.engine_version, c.binary_sha256, c.model_sha256, t.created_unix_s "
        "FROM candidates c JOIN trials t USING (trial_id)").fetchall()
    by_name: dict[str, list[sqlite3.Row]] = {}
    for r in rows:
        by_name.setdefault(r["name"], []).append(r)

    def _key(r: sqlite3.Row) -> tuple:
        return (r["created_unix_s"] if r["created_unix_s"] is not None else 0.0, r["trial_id"])

    def _differs(a: sqlite3.Row, b: sqlite3.Row) -> bool:
        return any(a[k] is not None and b[k] is not None and a[k] != b[k]
                   for k in ("engine_version", "binary_sha256", "model_sha256"))

    for r in rows:
        hist = any(_key(o) > _key(r) and _differs(r, o) for o in by_name[r["name"]])
        con.execute("UPDATE candidates SET historical=? WHERE trial_id=? AND name=?",
                    (int(hist), r["trial_id"], r["name"]))
    con.execute("UPDATE trials SET historical = CASE WHEN n_candidates > 0 AND NOT EXISTS ("
                "SELECT 1 FROM candidates c WHERE c.trial_id = trials.trial_id AND c.historical = 0) "
                "AND EXISTS (SELECT 1 FROM candidates c WHERE c.trial_id = trials.trial_id) THEN 1 ELSE 0 END")


def index_record(run_dir: str | os.PathLike[str], db: str | os.PathLike[str] | None = None) -> str:
    """Index ``run_dir/record.json`` (insert or replace its rows), recompute the historical flags and
    return the trial id (``record["trial_id"]``, else the folder's name)."""
    rd = Path(run_dir).expanduser().resolve()
    rec = _load_record(rd)
    tid = str(rec.get("trial_id") or rd.name)
    goal = rec.get("goal") or {}
    results = (rec.get("results") or {}).get("candidates") or {}
    idents = (rec.get("identity") or {}).get("candidates") or {}
    verdicts = (rec.get("decision") or {}).get("verdicts") or {}
    summary, adopt = _decision_summary(rec)
    names = list(dict.fromkeys([*results, *idents]))
    created = rec.get("created_unix_s")
    if created is None:
        created = (rec.get("method") or {}).get("started_unix_s") or (rd / "record.json").stat().st_mtime
    with closing(_connect(db)) as con, con:
        con.execute("DELETE FROM candidates WHERE trial_id=?", (tid,))
        con.execute("INSERT OR REPLACE INTO trials (trial_id, run_dir, created_unix_s, name, task, "
                    "decision_summary, adopt, n_candidates, indexed_unix_s, historical) "
                    "VALUES (?,?,?,?,?,?,?,?,?,0)",
                    (tid, str(rd), float(created), rec.get("name") or goal.get("name") or tid,
                     goal.get("task"), summary, adopt, len(names), time.time()))
        for n in names:
            r = results.get(n) or {}
            ident = idents.get(n) or {}
            e = engine_facts(ident.get("engine"))
            model = ident.get("model") or (ident.get("engine") or {}).get("model") or {}
            eff = r.get("effective_throughput") or {}
            tail = r.get("tail_latency") or {}
            con.execute("INSERT INTO candidates (trial_id, name, status, verdict, engine_kind, engine_version, "
                        "binary_sha256, model_sha256, settings_json, effective_tok_s, at_step, ttft_p95_s) "
                        "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                        (tid, n, r.get("status"), (verdicts.get(n) or {}).get("verdict"),
                         None if e["kind"] is None else str(e["kind"]),
                         None if e["version"] is None else str(e["version"]), e["binary_sha256"],
                         model.get("sha256") if isinstance(model, dict) else None,
                         json.dumps(ident.get("settings") or {}, sort_keys=True),
                         eff.get("output_tokens_per_s"), eff.get("at_step") or r.get("max_step_meeting_slo"),
                         tail.get("ttft_p95_s")))
        _mark_historical(con)
    return tid


def _resolve(con: sqlite3.Connection, key: str | os.PathLike[str], db: str | os.PathLike[str] | None
             ) -> sqlite3.Row:
    k = str(key)
    row = con.execute("SELECT * FROM trials WHERE trial_id=?", (k,)).fetchone()
    if row is None:
        p = Path(k).expanduser()
        if p.exists():
            row = con.execute("SELECT * FROM trials WHERE run_dir=?", (str(p.resolve()),)).fetchone()
    if row is None and k:
        rows = con.execute("SELECT * FROM trials WHERE trial_id LIKE ? ESCAPE '\\'",
                           (k.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%",)).fetchall()
        if len(rows) == 1:
            row = rows[0]
        elif len(rows) > 1:
            raise ConfigError(f"trial id prefix {k!r} is ambiguous in {_db_path(db)} "
                              f"({', '.join(r['trial_id'] for r in rows[:5])}…): give more of the id")
    if row is None:
        raise ConfigError(f"no trial {k!r} in {_db_path(db)}: see 'servelab records list'")
    return row


def _trial_dict(row: sqlite3.Row, cands: list[sqlite3.Row]) -> dict[str, Any]:
    return {"trial_id": row["trial_id"], "run_dir": row["run_dir"], "created_unix_s": row["created_unix_s"],
            "name": row["name"], "task": row["task"], "decision": row["decision_summary"],
            "adopt": row["adopt"], "n_candidates": row["n_candidates"], "historical": bool(row["historical"]),
            "candidates": [_cand_dict(c) for c in cands]}


def _cand_dict(c: sqlite3.Row) -> dict[str, Any]:
    return {"name": c["name"], "status": c["status"], "verdict": c["verdict"], "engine_kind": c["engine_kind"],
            "engine_version": c["engine_version"], "binary_sha256": c["binary_sha256"],
            "model_sha256": c["model_sha256"], "settings": json.loads(c["settings_json"] or "{}"),
            "effective_tok_s": c["effective_tok_s"], "at_step": c["at_step"], "ttft_p95_s": c["ttft_p95_s"],
            "historical": bool(c["historical"])}


def _cands(con: sqlite3.Connection, tid: str) -> list[sqlite3.Row]:
    return con.execute("SELECT * FROM candidates WHERE trial_id=? ORDER BY rowid", (tid,)).fetchall()


def list_records(db: str | os.PathLike[str] | None = None) -> list[dict[str, Any]]:
    """Every indexed trial, newest first: ``{"trial_id", "run_dir", "created_unix_s", "name", "task",
    "decision", "adopt", "n_candidates", "historical", "candidates": [{name, status, verdict,
    engine_kind, engine_version, binary_sha256, model_sha256, settings, effective_tok_s, at_step,
    ttft_p95_s, historical}]}``."""
    with closing(_connect(db)) as con:
        rows = con.execute("SELECT * FROM trials ORDER BY created_unix_s DESC, trial_id DESC").fetchall()
        return [_trial_dict(r, _cands(con, r["trial_id"])) for r in rows]


def show_record(trial_id_or_run_dir: str | os.PathLike[str], db: str | os.PathLike[str] | None = None
                ) -> dict[str, Any]:
    """The trial's ``record.json`` plus ``"historical"`` (bool), ``"historical_candidates"``
    (name -> bool) and ``"index"`` (its index row). Accepts a trial id, a unique id prefix, or a run
    folder (indexed first if it is not yet). Raises :class:`ConfigError` for an unknown trial or a
    run folder whose ``record.json`` is gone."""
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
    rec = _load_record(Path(row["run_dir"]))
    rec["historical"] = bool(row["historical"])
    rec["historical_candidates"] = {c["name"]: bool(c["historical"]) for c in cands}
    rec["index"] = _trial_dict(row, cands)
    return rec


def _ident_from_row(c: dict[str, Any]) -> dict[str, Any]:
    return {"engine": {"kind": c["engine_kind"], "version": c["engine_version"],
                       "binary_sha256": c["binary_sha256"]},
            "model": {"sha256": c["model_sha256"]}, "settings": c["settings"]}


def compare_records(a: str | os.PathLike[str], b: str | os.PathLike[str],
                    db: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Compare two indexed trials from the index alone (the run folders may be gone).

    Returns ``{"a": {trial_id, created_unix_s, adopt, historical}, "b": {…}, "candidates": [{"name",
    "a": {effective_tok_s, at_step, ttft_p95_s, verdict, status, historical}, "b": {…},
    "tok_s_change_pct", "differs_in", "details", "note"}], "only_in_a", "only_in_b"}`` for every
    candidate name present in both."""
    with closing(_connect(db)) as con:
        ra, rb = _resolve(con, a, db), _resolve(con, b, db)
        ca = {c["name"]: _cand_dict(c) for c in _cands(con, ra["trial_id"])}
        cb = {c["name"]: _cand_dict(c) for c in _cands(con, rb["trial_id"])}
    fields = ("effective_tok_s", "at_step", "ttft_p95_s", "verdict", "status", "historical")
    out = []
    for n in [n for n in ca if n in cb]:
        x, y = ca[n], cb[n]
        cmp = compare_identities(_ident_from_row(x), _ident_from_row(y), ra["trial_id"], rb["trial_id"])
        change = None
        if x["effective_tok_s"] and y["effective_tok_s"] is not None:
            change = (y["effective_tok_s"] / x["effective_tok_s"] - 1) * 100
        out.append({"name": n, "a": {k: x[k] for k in fields}, "b": {k: y[k] for k in fields},
                    "tok_s_change_pct": change, **cmp})

    def _head(r: sqlite3.Row) -> dict[str, Any]:
        return {"trial_id": r["trial_id"], "created_unix_s": r["created_unix_s"], "adopt": r["adopt"],
                "historical": bool(r["historical"]), "run_dir": r["run_dir"]}

    return {"a": _head(ra), "b": _head(rb), "candidates": out,
            "only_in_a": [n for n in ca if n not in cb], "only_in_b": [n for n in cb if n not in ca]}


# ---------------------------------------------------------------------------------------------------
# CLI: servelab records ...
# ---------------------------------------------------------------------------------------------------

records_app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None,
                          help="List, show and compare past trials (index: $SERVELAB_RECORDS_DB or "
                               "${SERVELAB_HOME:-~/.local/share/servelab}/records.db).")

_DB_OPT = typer.Option(None, "--db", help="Records database (path; default: $SERVELAB_RECORDS_DB, else "
                                         "${SERVELAB_HOME:-~/.local/share/servelab}/records.db).")


def _date(t: float | None) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M") if t else "?"


def _tps(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


@records_app.command("list")
def list_command(db: Optional[Path] = _DB_OPT,
                 as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")) -> None:
    """List indexed trials, newest first."""
    from rich.console import Console
    from rich.table import Table

    rows = list_records(db)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo(f"no trials in {_db_path(db)}: run 'servelab trial' (or 'servelab records index RUN')")
        return
    t = Table(title=f"trials in {_db_path(db)}")
    for col in ("id", "date", "name", "adopt", "candidates", "historical"):
        t.add_column(col)
    for r in rows:
        cands = ", ".join(f"{c['name']}:{c['verdict'] or c['status'] or '?'}" for c in r["candidates"])
        t.add_row(r["trial_id"], _date(r["created_unix_s"]), str(r["name"] or ""), str(r["adopt"] or "-"),
                  cands or "-", "yes" if r["historical"] else "no")
    Console(width=200).print(t)


@records_app.command("show")
def show_command(trial: str = typer.Argument(..., help="Trial id (or a unique prefix) or run folder."),
                 db: Optional[Path] = _DB_OPT,
                 as_json: bool = typer.Option(False, "--json", help="Print the whole record as JSON.")) -> None:
    """Show one trial: its decision, candidates and where its evidence lies."""
    rec = show_record(trial, db)
    if as_json:
        typer.echo(json.dumps(rec, indent=2, ensure_ascii=False))
        return
    idx = rec["index"]
    lines = [f"trial {idx['trial_id']}  {_date(idx['created_unix_s'])}"
             + ("  [HISTORICAL: a newer trial used another engine or weights]" if rec["historical"] else ""),
             f"run folder: {idx['run_dir']}"]
    if idx.get("task"):
        lines.append(f"task: {idx['task']}")
    slo = (rec.get("goal") or {}).get("slo")
    if slo:
        lines.append(f"SLO: {', '.join(slo) if isinstance(slo, list) else slo}")
    lines.append(f"decision: {idx['decision']}")
    dec = rec.get("decision") or {}
    for c in idx["candidates"]:
        lines.append(f"  {c['name']}: {c['verdict'] or c['status'] or '?'}, {_tps(c['effective_tok_s'])} tok/s at "
                     f"{c['at_step'] or '-'}, ttft_p95 {c['ttft_p95_s'] if c['ttft_p95_s'] is not None else '-'} s, "
                     f"{c['engine_kind'] or '?'} {c['engine_version'] or ''}, model sha256 "
                     f"{(c['model_sha256'] or '?')[:12]}" + ("  (historical)" if c["historical"] else ""))
        for reason in ((dec.get("verdicts") or {}).get(c["name"]) or {}).get("reasons") or []:
            lines.append(f"      - {reason}")
    for cmp in dec.get("comparisons") or []:
        lines.append(f"  {cmp.get('a')} vs {cmp.get('b')}: {cmp.get('note')}")
    if dec.get("scope"):
        lines.append(f"scope: {dec['scope']}")
    repro = (rec.get("evidence") or {}).get("reproduce")
    if repro:
        lines.append(f"reproduce: {repro}")
    typer.echo("\n".join(lines))


@records_app.command("compare")
def compare_command(a: str = typer.Argument(..., help="First trial id or run folder."),
                    b: str = typer.Argument(..., help="Second trial id or run folder."),
                    db: Optional[Path] = _DB_OPT,
                    as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Compare two trials candidate by candidate: throughput, TTFT P95, verdict, what differs."""
    from rich.console import Console
    from rich.table import Table

    res = compare_records(a, b, db)
    if as_json:
        typer.echo(json.dumps(res, indent=2))
        return
    ta, tb = res["a"]["trial_id"], res["b"]["trial_id"]
    t = Table(title=f"{ta} (A) vs {tb} (B)")
    for col in ("candidate", "tok/s A", "tok/s B", "change", "ttft_p95 A", "ttft_p95 B", "verdict A",
                "verdict B", "what differs"):
        t.add_column(col)
    for c in res["candidates"]:
        ch = c["tok_s_change_pct"]
        t.add_row(c["name"], _tps(c["a"]["effective_tok_s"]), _tps(c["b"]["effective_tok_s"]),
                  "-" if ch is None else f"{ch:+.1f}%",
                  "-" if c["a"]["ttft_p95_s"] is None else f"{c['a']['ttft_p95_s']:.3g} s",
                  "-" if c["b"]["ttft_p95_s"] is None else f"{c['b']['ttft_p95_s']:.3g} s",
                  str(c["a"]["verdict"] or c["a"]["status"] or "-"), str(c["b"]["verdict"] or c["b"]["status"] or "-"),
                  c["note"])
    con = Console(width=200)
    con.print(t)
    if res["only_in_a"] or res["only_in_b"]:
        con.print(f"only in A: {', '.join(res['only_in_a']) or '-'}; only in B: {', '.join(res['only_in_b']) or '-'}")


@records_app.command("index")
def index_command(run_dir: Path = typer.Argument(..., help="Trial run folder (holds record.json)."),
                  db: Optional[Path] = _DB_OPT) -> None:
    """Add (or refresh) a run folder in the index; prints its trial id."""
    typer.echo(index_record(run_dir, db))


__all__ = ["compare_records", "default_db_path", "index_record", "list_records", "records_app", "show_record"]
