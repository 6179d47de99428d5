"""A discrete-event simulation of one continuous-batching engine replica under the fitted law
(:mod:`servelab.capacity.fit`, :class:`~servelab.capacity.results.PerfParams`).

State: a FIFO queue, ``slots`` servers; a served request first prefills (``prefill_base_s +
prompt / prefill_tokens_per_s``, independent of the others), then decodes: its next token comes
``g(b) = decode_base_s + decode_per_running_s * (b - 1)`` after the previous, ``b`` the requests
decoding when the previous token came. Between events (an arrival, a prefill ending, a request's last
token) ``b`` is constant, so every decoding request advances by whole gaps of the current ``g(b)``
and the next event time is computed, not stepped to (event scheduling: Law, *Simulation Modeling and
Analysis*, 5th ed., 2015, §1.3). Load is either a closed loop of ``concurrency`` clients (each sends
its next request when the previous ends, as ``servelab bench -c``) or open-loop arrival times.

With ``prefill_serial`` (llama.cpp: one batch per step holds the new prompts and the running
requests' next tokens) the prompts admitted together are prefilled as one batch, ``prefill_base_s +
sum(prompt) / prefill_tokens_per_s``, their first tokens all at its end; prompts admitted while a
batch runs form the next one (FIFO); every decoding request's next token waits for each batch, and a
request that finishes its prefill while the next batch is queued waits for that one too.
A request may carry ``extra_s`` seconds of its own after its prefill (a workload's first-token cost,
e.g. llama.cpp compiling a JSON schema's grammar and sampling its first tokens under it): its first
token comes that much later; with ``prefill_serial`` the engine is held for the batch's largest extra.

Figures as the bench reports them (:mod:`servelab.bench.analysis.metrics`): TTFT = first token - arrival,
E2E = last token - arrival, TPOT = (E2E - TTFT) / (output - 1), output tokens/s = output tokens /
(last end - first arrival).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from servelab.capacity.results import PerfParams

__all__ = ["SimRun", "arrivals", "simulate"]


@dataclass
class SimRun:
    """Per-request results of one simulation (seconds; arrays in request order) and its window (s)."""

    ttft: np.ndarray
    e2e: np.ndarray
    tpot: np.ndarray
    output: np.ndarray
    window_s: float

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens over the window (the bench's throughput)."""
        return float(self.output.sum() / self.window_s) if self.window_s > 0 else 0.0


def arrivals(rate_rps: float, n: int, rng: np.random.Generator, shape: float = 1.0) -> np.ndarray:
    """``n`` arrival times (s) at ``rate_rps``: gamma inter-arrival gaps of shape ``shape`` (1 =
    Poisson; < 1 burstier, coefficient of variation 1/sqrt(shape), as ``servelab bench --arrival gamma``)."""
    return np.cumsum(rng.gamma(shape, 1.0 / (rate_rps * shape), n))


def _check_params(p: PerfParams) -> None:
    """Raise ``ValueError`` (one line, in words) when a figure of ``p`` is not a finite number >= 0: the
    simulation would schedule tokens at undefined times."""
    figures = {
        "prefill base": p.prefill_base_s,
        "decode gap": p.decode_base_s,
        "decode gap per running request": p.decode_per_running_s,
    }
    if p.prefill_tokens_per_s is not None:
        figures["prefill rate"] = p.prefill_tokens_per_s
    bad = [f"{k} {v}" for k, v in figures.items() if not math.isfinite(v) or v < 0]
    if bad:
        raise ValueError(
            f"the performance model has no usable {', '.join(bad)} (each must be a finite number >= 0);"
            " refit it on a run whose requests streamed several token chunks each"
        )
    for name, v in p.first_token_extra_s.items():
        if not math.isfinite(v):
            raise ValueError(f"the performance model's first-token extra of workload {name} is {v}, not a number")


class _Replica:
    """The state of one simulated replica (module doc); times in seconds."""

    def __init__(self, p: PerfParams, prompt: np.ndarray, output: np.ndarray, extra_s: np.ndarray | None) -> None:
        n = len(prompt)
        _check_params(p)
        self.p, self.prompt, self.output = p, prompt, output
        self.extra = np.zeros(n) if extra_s is None else np.asarray(extra_s, dtype=float)
        self.slots = p.slots if p.slots and p.slots > 0 else n
        self.arr = np.full(n, np.nan)
        self.first = np.zeros(n)
        self.last = np.zeros(n)
        self.busy_until = -math.inf  # serial prefill: when the last prompt batch ends
        self.grp_start, self.grp_end = -math.inf, -math.inf  # the last prompt batch
        self.grp: list[int] = []
        self.grp_extra = 0.0  # the largest first-token extra in the last batch, s
        self.waiting: deque[int] = deque()
        self.prefilling: list[tuple[float, int]] = []
        self.dec_next: dict[int, float] = {}  # decoding request -> scheduled time of its next token
        self.dec_left: dict[int, int] = {}  # tokens left, the next one included

    def gap(self) -> float:
        """Seconds between two tokens at the batch decoding now."""
        return self.p.decode_base_s + self.p.decode_per_running_s * (max(1, len(self.dec_next)) - 1)

    def send(self, i: int, t: float) -> None:
        """Request ``i`` arrives at ``t``."""
        self.arr[i] = t
        self.waiting.append(i)

    def start_waiting(self, t: float) -> None:
        """Waiting requests take free slots at ``t`` and start their prefill (module doc)."""
        rate = self.p.prefill_tokens_per_s
        admitted: list[int] = []
        while self.waiting and len(self.prefilling) + len(self.dec_next) + len(admitted) < self.slots:
            admitted.append(self.waiting.popleft())
        if not admitted:
            return
        if not self.p.prefill_serial:
            for i in admitted:
                pf = self.p.prefill_base_s + (self.prompt[i] / rate if rate else 0.0) + self.extra[i]
                heapq.heappush(self.prefilling, (t + pf, i))
            return
        work = sum(self.prompt[i] / rate for i in admitted) if rate else 0.0
        most = max(self.extra[i] for i in admitted)
        if t < self.grp_start:  # the next batch has not started: these join it
            added = work + max(0.0, most - self.grp_extra)
            self.grp_end += work
            self.grp_extra = max(self.grp_extra, most)
            self.grp.extend(admitted)
        else:  # a new batch, after the one running
            added = self.p.prefill_base_s + work + most
            self.grp_start = max(t, self.busy_until)
            self.grp_end = self.grp_start + self.p.prefill_base_s + work
            self.grp_extra = most
            self.grp = list(admitted)
        members = set(self.grp)
        self.prefilling = [e for e in self.prefilling if e[1] not in members]
        self.prefilling += [(self.grp_end + self.extra[i], i) for i in self.grp]
        heapq.heapify(self.prefilling)
        self.busy_until = self.grp_end + self.grp_extra
        for j in self.dec_next:  # the running batch waits for the prompts
            self.dec_next[j] += added

    def next_finish(self, g: float) -> tuple[float, int]:
        """When the first decoding request emits its last token at gap ``g``, and which."""
        best, who = math.inf, -1
        for i, tn in self.dec_next.items():
            tf = tn + (self.dec_left[i] - 1) * g
            if tf < best:
                best, who = tf, i
        return best, who

    def advance(self, t: float, g: float, who: int, t_fin: float) -> list[int]:
        """Every decoding request emits its tokens due up to ``t`` (whole gaps ``g``); returns the
        requests that emitted their last one (``who`` when ``t`` is its finish ``t_fin``)."""
        for i in list(self.dec_next):
            tn = self.dec_next[i]
            if tn <= t:
                # a zero gap (tokens measured arriving together): every token left is due at once
                m = self.dec_left[i] if g <= 0 else min(self.dec_left[i], int((t - tn) / g + 1e-9) + 1)
                self.dec_next[i], self.dec_left[i] = tn + m * g, self.dec_left[i] - m
        if t == t_fin:
            self.dec_left[who], self.dec_next[who] = 0, t + g
        ended = [i for i, k in self.dec_left.items() if k <= 0]
        for i in ended:
            self.last[i] = self.dec_next.pop(i) - g
            del self.dec_left[i]
        return ended

    def first_tokens(self, t: float) -> list[int]:
        """Prefills ending by ``t`` emit their first token and join the batch; returns the requests
        whose only token that was."""
        ended, joined = [], []
        while self.prefilling and self.prefilling[0][0] <= t:
            _, i = heapq.heappop(self.prefilling)
            self.first[i] = t
            if self.output[i] <= 1:
                self.last[i] = t
                ended.append(i)
            else:
                self.dec_left[i] = int(self.output[i]) - 1
                self.dec_next[i] = math.nan
                joined.append(i)
        g = self.gap()  # the batch counts the ones that joined
        wait = max(0.0, self.busy_until - t) if self.p.prefill_serial else 0.0
        for i in joined:
            self.dec_next[i] = t + wait + g
        return ended


def simulate(
    p: PerfParams,
    prompt: np.ndarray,
    output: np.ndarray,
    *,
    concurrency: int | None = None,
    arrival_s: np.ndarray | None = None,
    extra_s: np.ndarray | None = None,
) -> SimRun:
    """Serve the requests (``prompt``/``output`` tokens, in sending order) with ``p``: a closed loop of
    ``concurrency`` clients, or open loop at ``arrival_s``; ``extra_s``: seconds each request adds to its
    prefill (default none). Raises ``ValueError`` with neither load."""
    n = len(prompt)
    if arrival_s is None and not concurrency:
        raise ValueError("simulate needs concurrency or arrival times")
    r = _Replica(p, prompt, output, extra_s)
    times = arrival_s if arrival_s is not None else np.zeros(0)
    pending = deque(range(n)) if arrival_s is not None else deque()
    sent = 0
    if arrival_s is None:
        for sent in range(min(concurrency or 0, n)):
            r.send(sent, 0.0)
        sent = min(concurrency or 0, n)
        r.start_waiting(0.0)
    done = 0
    while done < n:
        g = r.gap()
        t_fin, who = r.next_finish(g)
        t = min(times[pending[0]] if pending else math.inf, r.prefilling[0][0] if r.prefilling else math.inf, t_fin)
        if t == math.inf:  # pragma: no cover - every request has a next event
            raise RuntimeError("simulation stalled")
        ended = r.advance(t, g, who, t_fin)
        while pending and times[pending[0]] <= t:
            r.send(pending.popleft(), t)
        ended += r.first_tokens(t)
        done += len(ended)
        for i in ended:  # closed loop: each client sends its next request as one ends
            if arrival_s is None and sent < n:
                r.send(sent, float(r.last[i]))
                sent += 1
        r.start_waiting(t)
    ttft = r.first - r.arr
    e2e = r.last - r.arr
    tpot = np.where(output > 1, (e2e - ttft) / np.maximum(output - 1, 1), 0.0)
    window = float(r.last.max() - np.nanmin(r.arr))
    return SimRun(ttft=ttft, e2e=e2e, tpot=tpot, output=output.astype(float), window_s=window)
