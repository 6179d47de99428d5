"""The measured requests a performance model is fitted on: every succeeded, measured request of a bench
run folder or of a trial run folder, with its own timeline, grouped by load step.

A group (:class:`StepEvidence`) is one ``summary.json`` step (workload x step label) of one folder: its
requests ran together on one engine and one client clock (``time.monotonic_ns()`` stamps of
``requests.jsonl``, :class:`~servelab.bench.results.TNs`), so their overlap in time is the engine's
running batch as the client saw it. Times are seconds from the group's first send. Token-chunk times
come from ``chunk_offsets_ms`` (µs resolution) and ``chunk_tokens`` (one token per chunk when absent).
Warmup and failed requests are left out (a warmup phase finishes before its step starts, bench runner).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from pydantic import ValidationError

from servelab.bench.results import LoadInfo, RequestLine, Summary
from servelab.wire.errors import ConfigError

__all__ = [
    "SLOT_SETTINGS",
    "Obs",
    "StepEvidence",
    "declared_slots",
    "from_bench",
    "from_folder",
    "read_lines",
    "from_trial_candidate",
]

#: engine settings that name a slot limit (llama-server --parallel, vLLM max_num_seqs, the mock's)
SLOT_SETTINGS = ("parallel", "max_num_seqs", "max_inflight")


def declared_slots(settings: Mapping[str, object] | None) -> int | None:
    """The slot limit a candidate's engine settings declare (:data:`SLOT_SETTINGS`), else ``None``."""
    for k in SLOT_SETTINGS:
        v = (settings or {}).get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


@dataclass
class Obs:
    """One measured request: ``sent``/``first``/``last``/``end`` seconds from its group's first send
    (first and last token chunk arrival, end of the response), ``prompt``/``output`` tokens (server
    usage), ``chunks``: arrival time (s, same origin) and token count of every token-carrying chunk,
    ``cached``: prompt tokens the engine served from its prefix cache (usage ``cached_tokens``),
    ``workload``: the workload set it was drawn from (a mix step holds several)."""

    sent: float
    first: float
    last: float
    end: float
    prompt: int
    output: int
    chunks: list[tuple[float, int]] = field(default_factory=list)
    cached: int = 0
    workload: str = ""

    @property
    def new_prompt(self) -> int:
        """Prompt tokens the engine had to prefill: the prompt less its cached prefix (server usage)."""
        return max(0, self.prompt - self.cached)

    @property
    def ttft(self) -> float:
        """Time to first token, seconds."""
        return self.first - self.sent

    @property
    def e2e(self) -> float:
        """Send to end of response, seconds."""
        return self.end - self.sent

    @property
    def held_back(self) -> int:
        """Output tokens (server usage) the stream did not carry, >= 0: tokens the engine decoded
        but did not stream as text (seen with llama.cpp's JSON-schema grammars)."""
        return max(0, self.output - sum(k for _, k in self.chunks))


@dataclass
class StepEvidence:
    """One load step's measured requests in send order. ``source``: the folder; ``label``:
    ``workload/step``; ``load``: the step's load model (closed loop: ``concurrency``)."""

    source: str
    label: str
    load: LoadInfo
    requests: list[Obs]

    @property
    def concurrency(self) -> int | None:
        """Requests kept in flight (closed loop), else ``None``."""
        return self.load.concurrency if self.load.kind == "closed" else None


def _obs(line: RequestLine) -> tuple[int, Obs] | None:
    t = line.t_ns
    if line.warmup or line.failure is not None or t.sent is None or t.first_token is None:
        return None
    end = t.end or t.done or t.last_token
    if end is None or not line.output_tokens or line.prompt_tokens is None:
        return None
    sent = t.sent
    toks = line.chunk_tokens or [1] * len(line.chunk_offsets_ms)
    chunks = [(ms / 1e3, int(k)) for ms, k in zip(line.chunk_offsets_ms, toks, strict=False) if k > 0]
    last = (t.last_token or end) - sent
    return sent, Obs(
        sent=0.0,
        first=(t.first_token - sent) / 1e9,
        last=last / 1e9,
        end=(end - sent) / 1e9,
        prompt=line.prompt_tokens,
        output=line.output_tokens,
        chunks=chunks,
        cached=line.cached_tokens or 0,
        workload=line.workload,
    )


def read_lines(path: Path) -> list[RequestLine]:
    """The request lines of a ``requests.jsonl`` (a last line cut by a kill is skipped); raises
    :class:`ConfigError` (one line) for an unreadable file or a line that is not a request line."""
    out = []
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    for i, text in enumerate(raw.splitlines(), 1):
        if not text.strip():
            continue
        try:
            out.append(RequestLine.model_validate(orjson.loads(text)))
        except (orjson.JSONDecodeError, ValidationError):
            if i == len(raw.splitlines()):
                continue  # a last line cut by a kill (bench writes line by line)
            raise ConfigError(
                f"{path}: line {i} is not a servelab request line; give a bench or trial run folder"
            ) from None
    return out


def from_folder(folder: Path) -> list[StepEvidence]:
    """The steps of one folder holding ``summary.json`` and ``requests.jsonl`` (a bench run, or a trial
    candidate's ``steps``/``mix``/``arrival``/``capacity/r*``), in the summary's order; steps without a
    measured request are left out. Raises :class:`ConfigError` (one line) when either file is missing or
    unreadable."""
    sfile, rfile = folder / "summary.json", folder / "requests.jsonl"
    if not sfile.is_file() or not rfile.is_file():
        raise ConfigError(f"{folder}: no summary.json and requests.jsonl; give a `servelab bench` run folder")
    try:
        summary = Summary.model_validate_json(sfile.read_bytes())
    except (OSError, ValidationError) as e:
        raise ConfigError(f"{sfile}: not a servelab bench summary ({str(e).splitlines()[0]})") from None
    groups: dict[tuple[str, str], list[tuple[int, Obs]]] = {}
    for line in read_lines(rfile):
        got_obs = _obs(line)
        if got_obs is not None:
            groups.setdefault((line.step_workload or line.workload, line.step), []).append(got_obs)
    out = []
    for st in summary.steps:
        got = sorted(groups.get((st.workload, st.step), []), key=lambda x: x[0])
        if st.skipped or not got:
            continue
        t0 = got[0][0]
        reqs = []
        for sent, o in got:
            off = (sent - t0) / 1e9
            reqs.append(
                Obs(
                    sent=off,
                    first=o.first + off,
                    last=o.last + off,
                    end=o.end + off,
                    prompt=o.prompt,
                    output=o.output,
                    chunks=[(t + off, k) for t, k in o.chunks],
                    cached=o.cached,
                    workload=o.workload,
                )
            )
        out.append(StepEvidence(source=str(folder), label=st.label, load=st.load, requests=reqs))
    return out


def from_bench(folder: str | Path) -> list[StepEvidence]:
    """The steps of a ``servelab bench`` run folder (:func:`from_folder`)."""
    return from_folder(Path(folder))


def from_trial_candidate(run_dir: str | Path, name: str) -> list[StepEvidence]:
    """The steps of candidate ``name`` in a trial run folder: every ``candidates/NAME/*/`` and
    ``candidates/NAME/capacity/*/`` folder that holds a bench summary (docs/record-schema.md); each
    step's label is prefixed with its folder (``mix-r2:mix/c4``), repeats keep their own."""
    base = Path(run_dir) / "candidates" / name
    folders = sorted(p.parent for p in base.glob("*/summary.json")) + sorted(
        p.parent for p in base.glob("capacity/*/summary.json")
    )
    out: list[StepEvidence] = []
    for f in folders:
        if (f / "requests.jsonl").is_file():
            for st in from_folder(f):
                st.label = f"{f.relative_to(base).as_posix()}:{st.label}"
                out.append(st)
    return out
