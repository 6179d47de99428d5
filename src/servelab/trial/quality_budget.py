"""The quality gate within the trial budget: estimate each gate request from the first one measured,
and skip what does not fit (the skip is recorded like every other ``method.budget`` skip).

On a slow host the gate alone can outlast the budget (at ~1 tok/s, eight structured answers of 128
tokens take over 17 minutes). Before each gate request after the first, its wall time is estimated as

    ``estimate_s = ttft_s + max_tokens * tpot_s``

from the first gate request that produced tokens (a business sample; else the smoke test's story
request, which the gate follows on the same engine): ``ttft_s`` its time to first token, ``tpot_s``
its time per output token after the first (:func:`servelab.bench.analysis.metrics.tpot_s`; with a single
output token, its E2E per token). That is the definition of TPOT inverted (``tpot = (e2e - ttft) /
(output_tokens - 1)``), taken at the request's own cap ``max_tokens``, so the estimate is an upper one
for answers that stop early; the gate runs one request at a time, as the first one did.

The structured part of the gate (``goal.quality.structured_requests`` requests, one bench step) is
started only when all of it fits. What is skipped makes its check **undetermined**: the candidate's
gate did not finish, so it has not passed — it is excluded with that reason, never ranked on a gate
it did not complete.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from servelab.bench.analysis import metrics as M
from servelab.wire.types import RequestRecord

__all__ = ["GateTiming", "first_timing"]


@dataclass(frozen=True)
class GateTiming:
    """The first measured gate request: ``ttft_s`` (seconds to its first token) and ``tpot_s``
    (seconds per output token after the first)."""

    ttft_s: float
    tpot_s: float

    @classmethod
    def of(cls, rec: RequestRecord) -> GateTiming | None:
        """The timing of one request, or ``None`` when it failed or produced no token."""
        t, e = M.ttft_s(rec), M.e2e_s(rec)
        if rec.failure is not None or t is None or e is None:
            return None
        per = M.tpot_s(rec)
        if per is None:
            per = e / max(rec.output_tokens or 1, 1)
        return cls(ttft_s=t, tpot_s=per)

    def request_s(self, max_tokens: int | None) -> float:
        """Estimated seconds of one gate request capped at ``max_tokens`` output tokens (``None``:
        the engine's default; counted as 256)."""
        return self.ttft_s + (max_tokens if max_tokens is not None else 256) * self.tpot_s


def first_timing(jsonl: Path) -> GateTiming | None:
    """:class:`GateTiming` of the first request in a requests.jsonl-format file (the smoke tests')
    that produced tokens; ``None`` when there is none or the file is missing."""
    from servelab.bench.load.lines import record_from_json
    from servelab.bench.results import RequestLine

    if not jsonl.is_file():
        return None
    with jsonl.open("rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            try:
                line = RequestLine.model_validate_json(raw)
            except ValueError:  # a line cut by a crash
                continue
            t = GateTiming.of(record_from_json(line))
            if t is not None:
                return t
    return None
