"""Exact merging of several load-generator workers' requests into one step summary.

A step run by several workers (:mod:`servelab.bench.load.workers`) is summarised from *all* its request
records together, by the same :func:`servelab.bench.analysis.summarize.step_summary` as a single-process step:
percentiles of the pooled values, never an average of per-worker percentiles, and one throughput
window from the first send to the last end across all workers.

Clocks. Each worker stamps its requests with its own ``time.monotonic_ns()``. Workers on one host
share that clock (CLOCK_MONOTONIC is system-wide), so their stamps are compared directly. Workers on
different hosts do not: every worker starts the step at one agreed instant (sent by the coordinator
as a wall-clock time, converted by each worker to its own monotonic clock, and written to each line as
``t0_ns``), and :func:`summary_record` re-expresses a line's stamps as offsets from its worker's
``t0_ns``. The window then runs from the earliest send offset to the latest end offset, which is right
as far as the hosts' wall clocks agreed when the start was converted (NTP: typically well under a
millisecond on a LAN). The wall-clock offsets measured at start are reported
(``summary.generator.workers[].wall_offset_s``) and never used in a computation. A request's own
latencies (TTFT, ITL, E2E) are differences of stamps of one process and are exact either way.
"""

from __future__ import annotations

from servelab.bench.load.lines import record_from_json
from servelab.bench.results import RequestLine
from servelab.wire.types import RequestRecord

#: where aligned stamps start: a large positive instant, so that an aligned stamp is never 0 or negative
#: (a ``scheduled_ns`` of 0 means "not scheduled")
ALIGN_BASE_NS = 10**15

_STAMPS = (
    "scheduled_ns",
    "sent_ns",
    "headers_ns",
    "first_byte_ns",
    "first_event_ns",
    "first_token_ns",
    "first_answer_ns",
    "last_token_ns",
    "done_ns",
    "end_ns",
)


def aligned(rec: RequestRecord, t0_ns: int | None) -> RequestRecord:
    """``rec`` with every monotonic stamp (and chunk arrival) moved by ``ALIGN_BASE_NS - t0_ns``: offsets
    from its worker's step start (module doc). ``t0_ns`` ``None`` (a single-process line) leaves ``rec``
    as it is. Changes and returns ``rec``."""
    if t0_ns is None:
        return rec
    shift = ALIGN_BASE_NS - t0_ns
    for k in _STAMPS:
        v = getattr(rec, k)
        if v:  # None (not reached) and a scheduled_ns of 0 (not scheduled) stay as they are
            setattr(rec, k, v + shift)
    rec.chunk_ns = [t + shift for t in rec.chunk_ns]
    return rec


def summary_record(line: RequestLine | dict[str, object]) -> RequestRecord:
    """The record of one ``requests.jsonl`` line as every summary (the live bench's and ``servelab
    summarize``'s) uses it: :func:`~servelab.bench.load.lines.record_from_json`, then :func:`aligned` to its
    ``t0_ns``. Raises :class:`pydantic.ValidationError` for a line that is not a bench record."""
    d = line if isinstance(line, RequestLine) else RequestLine.model_validate(line)
    return aligned(record_from_json(d), d.t0_ns)


def clock_note(hosts: set[str]) -> str:
    """How a run's step windows were measured, for ``summary.generator.clock``."""
    if len(hosts) <= 1:
        return (
            "one host: every worker's monotonic clock is the same clock, stamps compared directly; "
            "the window runs from the first send to the last end across workers"
        )
    return (
        f"{len(hosts)} hosts: each worker's stamps are taken as offsets from the common start instant "
        "(agreed by wall clock, converted to each worker's monotonic clock); the window runs from the first "
        "send offset to the last end offset across workers; measured wall-clock offsets are reported, "
        "not used"
    )
