"""Rebuild a run's ``summary.json`` from its ``requests.jsonl`` (``servelab summarize DIR``), after the
bench was killed (``kill -9``, OOM, power loss of the client) or its summary was lost.

``requests.jsonl`` is written one line per finished request (with workers, each batch of lines that
arrives), each write flushed at once,
so after a crash it holds every request that finished, and at most its last line is cut short; that
line is ignored and reported. Every other line must be intact. The summary is computed by the
bench's own code (:func:`servelab.bench.analysis.summarize.step_summary`) from the records the lines hold, in the
sweep the run's ``config.json`` describes (SLO-skipped steps included), and carries
``"rebuilt": {...}`` saying so; a step with fewer measured requests than planned is ``partial``.
Requests that were in flight at the crash never finished and are not in the file: they are missing
from the rebuilt counts (the summary says how many lines it read, not how many were sent).

A run with several load-generator workers (``--workers``, ``--ray``) is rebuilt the same way as the
bench summarised it: from all lines together, each worker's stamps aligned to its start
(:func:`servelab.bench.load.merge.summary_record`); what only the workers measured (their CPU use, the
saturation verdict, lost parts) is not in ``requests.jsonl``; neither is a workload's own block (``rag``,
``mixed_lang``, sessions, agent, trace replay, …). Every such field of a step is kept from the old summary
when it is there, and ``rebuilt.kept_from_summary`` names them; without the old summary they are absent.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from servelab.bench.analysis.slo import parse_slo
from servelab.bench.analysis.summarize import new_summary, skipped_step, step_summary, with_fields, write_summary
from servelab.bench.load.config import BenchConfig, plan_loads
from servelab.bench.load.merge import summary_record
from servelab.bench.results import Generator, Rebuilt, Summary
from servelab.wire.client import ConfigError
from servelab.wire.types import RequestRecord


@dataclass
class Lines:
    """What :func:`read_requests` found: the records with the step index each was written under,
    the number of intact lines, and whether a cut-short last line was dropped."""

    records: list[tuple[int, RequestRecord]]
    lines: int
    truncated_last_line: bool


def _json_file(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, orjson.JSONDecodeError) as e:
        raise ConfigError(
            f"{path}: cannot read it as JSON ({e}); it is written before any request, "
            f"so this is not a servelab bench run directory"
        ) from None


def read_requests(path: Path) -> Lines:
    """Read ``requests.jsonl``. Raises :class:`ConfigError` (one line, with the line number) for a
    missing file, a damaged line other than the last, or a line that is not a bench record (or was
    written by a servelab without ``step_index``)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist: pass the --out directory of a servelab bench run") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror or e}") from None
    parts = raw.split(b"\n")
    truncated = False
    out: list[tuple[int, RequestRecord]] = []
    n = 0
    for lineno, part in enumerate(parts, 1):
        if not part.strip():
            continue
        last = lineno == len(parts)  # no newline after it: the write may have been cut by the crash
        try:
            d = orjson.loads(part)
            rec = summary_record(d)  # stamps of several workers aligned as the live bench aligned them
            index = int(d["step_index"])
        except orjson.JSONDecodeError:
            if last:
                truncated = True
                continue
            raise ConfigError(
                f"{path}: line {lineno} is not valid JSON; only the last line may be cut short "
                f"by a crash, so this file was edited or damaged"
            ) from None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ConfigError(
                f"{path}: line {lineno} is not a servelab bench record (missing or bad {e}); "
                f"summarize reads files written by servelab bench 0.1.0 or later"
            ) from None
        out.append((index, rec))
        n += 1
    return Lines(out, n, truncated)


def _config(run_dir: Path) -> BenchConfig:
    data = _json_file(run_dir / "config.json")
    if not isinstance(data, dict):
        raise ConfigError(f"{run_dir}/config.json is missing: pass the --out directory of a servelab bench run")
    known = {f.name for f in dataclasses.fields(BenchConfig)}
    return BenchConfig.checked(**{k: v for k, v in data.items() if k in known})


def rebuild_summary(run_dir: str | Path) -> tuple[Summary, Lines]:
    """The summary of the run in ``run_dir``, computed from ``requests.jsonl`` (module doc), and what
    was read. Does not write anything. Raises :class:`ConfigError` (one line) when ``run_dir`` is not
    a bench run directory or ``requests.jsonl`` is damaged before its last line."""
    d = Path(run_dir)
    if not d.is_dir():
        raise ConfigError(f"{d} is not a directory: pass the --out directory of a servelab bench run")
    cfg = _config(d)
    found = read_requests(d / "requests.jsonl")
    old = _json_file(d / "summary.json")
    old = old if isinstance(old, dict) else {}
    identity = _json_file(d / "identity.json")
    identity = identity if isinstance(identity, dict) else {}
    # the summary lists the objectives of --slo and --slo-file as parseable names; config.json only --slo
    names = old.get("slo")
    objectives = parse_slo(",".join(names) if isinstance(names, list) and names else cfg.slo)
    model = identity.get("model") or old.get("model") or cfg.model or "?"
    tokenizer = identity.get("tokenizer")
    old_steps = {(s.get("workload"), s.get("step")): s for s in old.get("steps") or [] if isinstance(s, dict)}

    groups: dict[int, list[RequestRecord]] = {}
    for index, rec in found.records:
        groups.setdefault(index, []).append(rec)
    last_index = max(groups, default=-1)
    loads = plan_loads(cfg)
    summary = new_summary(str(model), cfg.base_url, objectives)
    if isinstance(old.get("started_unix_s"), (int, float)):
        summary.started_unix_s = old["started_unix_s"]
    complete = True
    kept: set[str] = set()
    for wi, wname in enumerate(cfg.workloads):
        broken_at: str | None = None
        for si, load in enumerate(loads):
            k = wi * len(loads) + si
            if broken_at is not None:
                summary.steps.append(skipped_step(wname, load, f"SLO broken at step {broken_at}"))
                continue
            if k > last_index:
                complete = False  # never reached
                break
            recs = sorted(groups.get(k, []), key=lambda r: r.request_id)
            measured = sum(1 for r in recs if not r.warmup)
            partial = (
                (measured < cfg.requests)
                if cfg.requests is not None
                else (k == last_index and old.get("complete") is not True)
            )
            started = old_steps.get((wname, load.label), {}).get("started_unix_s")
            old_step = old_steps.get((wname, load.label), {})
            partial = partial or bool(old_step.get("lost"))
            step = step_summary(wname, load, recs, objectives, tokenizer, started, partial=partial)
            # what the bench added beyond the records (the workers' CPU and lost parts, the saturation
            # verdict, a workload's own block: rag, mixed_lang, sessions, …) is not in requests.jsonl
            added = {k: v for k, v in old_step.items() if k not in step.model_fields_set and v}
            if added:
                step = with_fields(step, added)
                kept.update(added)
            summary.steps.append(step)
            complete = complete and not partial
            if objectives and not step.slo_met and cfg.stop_on_slo and not partial:
                broken_at = load.label
        else:
            continue
        break
    summary.complete = complete
    if isinstance(old.get("finished_unix_s"), (int, float)):
        summary.finished_unix_s = old["finished_unix_s"]
    if isinstance(old.get("generator"), dict):
        summary.generator = Generator.model_validate(old["generator"])
    summary.rebuilt = Rebuilt(
        from_="requests.jsonl",
        lines=found.lines,
        truncated_last_line=found.truncated_last_line,
        partial=not complete,
        rebuilt_unix_s=time.time(),
        kept_from_summary=sorted(kept),
    )
    return summary, found


def rebuild(run_dir: str | Path) -> tuple[Summary, Lines]:
    """:func:`rebuild_summary`, then write it to ``run_dir/summary.json`` (atomically)."""
    summary, found = rebuild_summary(run_dir)
    write_summary(Path(run_dir), summary)
    return summary, found
