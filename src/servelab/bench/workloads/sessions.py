"""Multi-turn sessions: each turn sends the whole history plus a new user message, as a chat product does.

A session is K user messages (built in: :func:`make_sessions`; from a dataset: :func:`load_sessions`,
ShareGPT ``conversations`` or OpenAI-style ``messages`` lists, whose user turns are kept and whose
assistant turns are replaced by what the model under test answers). Turn k sends system prompt (if
any) + every earlier user message and the model's answer to it + user message k; between turns the
client waits a think time drawn from an exponential distribution with mean ``think_time_s`` (0 = none).
:func:`run_sessions` runs ``concurrency`` sessions at once (closed loop over sessions), or starts
sessions open-loop at ``rate_sps`` sessions/s (Poisson). A turn that fails ends its session (a user
whose answer broke does not go on).

What it measures, per turn (:class:`TurnResult`): the request record (TTFT, ITL …), the server's
``prompt_tokens`` (the history length as the engine counts it) and ``cached_tokens`` where the engine
reports them (``usage.prompt_tokens_details.cached_tokens``: the prefix-cache effect of resending the
history); per session: success. :func:`summarize_sessions` gives TTFT by turn index against the mean
history length, the cached share of prompt tokens by turn, and the session success rate.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import numpy as np
from pydantic import BaseModel

from servelab.bench.load.step import LoadModel, Traceparent, request_headers
from servelab.bench.options import MAX_THINK_TIME_S
from servelab.bench.workloads.extras import SessionsSummary, TurnStats
from servelab.wire import ConfigError, RequestRecord, RequestSpec
from servelab.wire.client import send

if TYPE_CHECKING:
    from servelab.modelfile.tokenizer import TokenCounter

__all__ = [
    "Session",
    "SessionsSummary",
    "SessionsWorkload",
    "TurnResult",
    "TurnStats",
    "load_sessions",
    "make_sessions",
    "run_sessions",
    "summarize_sessions",
]

OnDone = Callable[[RequestRecord, RequestSpec], None]  # as servelab.bench.load.driven.OnDone


class Session(BaseModel):
    """One scripted user: ``user_messages`` in order, ``max_tokens`` per turn, optional ``system``."""

    session_id: int
    user_messages: list[str]
    max_tokens: int = 64
    system: str | None = None


class TurnResult(BaseModel):
    """One turn: ``session_id``, ``turn`` (0-based), ``messages_sent`` (messages in the request),
    ``ok``, ``failure`` (class name or ``None``), ``ttft_s``, ``e2e_s``, ``prompt_tokens`` and
    ``cached_tokens`` (server-reported, ``None`` when not stated), ``output_tokens``, ``think_s`` (the
    wait before this turn)."""

    session_id: int
    turn: int
    messages_sent: int
    ok: bool
    failure: str | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    think_s: float = 0.0


def make_sessions(
    n: int,
    counter: TokenCounter | None,
    *,
    turns: int = 4,
    first_tokens: int = 128,
    turn_tokens: int = 32,
    max_tokens: int = 64,
    seed: int = 0,
    system: str | None = "You are a helpful assistant.",
) -> list[Session]:
    """``n`` built-in sessions of ``turns`` user messages: the first ``first_tokens`` long (context and a
    question), each later one ``turn_tokens`` (a follow-up), exactly in ``counter``'s tokenizer (about,
    without one). Deterministic for ``seed``. Raises :class:`ConfigError` for counts below 1."""
    from servelab.bench.workloads.text import TextMaker  # the built-in sets' exact-length text

    if n < 1 or turns < 1 or first_tokens < 1 or turn_tokens < 1 or max_tokens < 1:
        raise ConfigError(
            f"sessions need n, turns, first_tokens, turn_tokens, max_tokens >= 1 (got {n}, {turns}, "
            f"{first_tokens}, {turn_tokens}, {max_tokens})"
        )
    maker = TextMaker(counter, "en")
    out = []
    for s in range(n):
        msgs = []
        for k in range(turns):
            rng = random.Random(f"servelab:session:{seed}:{s}:{k}")
            if k == 0:
                msgs.append(maker.fit(rng, first_tokens, "Here are my notes:\n", "\nWhat do they say?"))
            else:
                msgs.append(maker.fit(rng, turn_tokens, "Follow-up: ", "?"))
        out.append(Session(session_id=s, user_messages=msgs, max_tokens=max_tokens, system=system))
    return out


def load_sessions(path: str | Path, *, max_tokens: int = 64, min_turns: int = 2) -> list[Session]:
    """Sessions from a JSON list or JSONL file of ShareGPT items (``conversations``: ``from`` human/user
    + ``value``) or OpenAI-style items (``messages``: ``role`` + ``content``). User turns are kept in
    order; a system message is kept; assistant turns are dropped (the model under test answers).
    Items with fewer than ``min_turns`` user turns are left out. Raises :class:`ConfigError` (one line)
    for a missing file, bad JSON, or no usable item."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"sessions dataset {p}: no such file")
    raw = p.read_text(encoding="utf-8")
    try:
        if raw.lstrip().startswith("["):
            items = json.loads(raw)
        else:
            items = [json.loads(x) for x in raw.splitlines() if x.strip()]
    except ValueError as e:
        raise ConfigError(f"sessions dataset {p}: not JSON or JSONL ({e})") from None
    out: list[Session] = []
    for item in items:
        if not isinstance(item, dict):
            continue
        users: list[str] = []
        system = None
        for t in item.get("conversations") or []:
            if isinstance(t, dict) and t.get("from") in ("human", "user") and isinstance(t.get("value"), str):
                users.append(t["value"])
            elif isinstance(t, dict) and t.get("from") == "system" and isinstance(t.get("value"), str):
                system = t["value"]
        for m in item.get("messages") or []:
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                users.append(m["content"])
            elif isinstance(m, dict) and m.get("role") == "system" and isinstance(m.get("content"), str):
                system = m["content"]
        users = [u for u in users if u.strip()]
        if len(users) >= min_turns:
            out.append(Session(session_id=len(out), user_messages=users, max_tokens=max_tokens, system=system))
    if not out:
        raise ConfigError(
            f"sessions dataset {p}: no conversation with at least {min_turns} user turns "
            "(ShareGPT 'conversations' or OpenAI 'messages')"
        )
    return out


class _Sink:
    """Where the turns of a run go: ``results`` (one :class:`TurnResult` each), request ids from ``ids``,
    ``records``/``on_done`` (the bench's requests.jsonl line) when given, records labelled ``step``; each turn
    is sent with ``headers`` and, when tracing, its ``traceparent``."""

    def __init__(
        self,
        ids: Iterator[int] | None = None,
        on_done: OnDone | None = None,
        records: list[RequestRecord] | None = None,
        step: str = "",
        headers: dict[str, str] | None = None,
        traceparent: Traceparent | None = None,
    ) -> None:
        self.results: list[TurnResult] = []
        self.ids, self.on_done, self.records, self.step, self.headers = ids, on_done, records, step, headers
        self.traceparent = traceparent


async def _one_session(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    sess: Session,
    think_time_s: float,
    rng: random.Random,
    timeout_s: float,
    sink: _Sink,
    arrival_ns: int | None = None,
) -> None:
    history: list[dict[str, Any]] = [{"role": "system", "content": sess.system}] if sess.system else []
    for k, text in enumerate(sess.user_messages):
        think = rng.expovariate(1.0 / think_time_s) if think_time_s > 0 and k > 0 else 0.0
        if think:
            await asyncio.sleep(think)
        history.append({"role": "user", "content": text})
        spec = RequestSpec(
            endpoint="chat",
            max_tokens=sess.max_tokens,
            messages=list(history),
            workload="sessions",
            allow_truncation=True,
        )
        rid = next(sink.ids) if sink.ids is not None else sess.session_id * 10_000 + k
        rec = RequestRecord(
            request_id=rid,
            workload="sessions",
            step=sink.step,
            scheduled_ns=arrival_ns if (k == 0 and arrival_ns is not None) else time.monotonic_ns(),
        )
        if sink.records is not None:
            sink.records.append(rec)
        try:
            hdrs = request_headers(sink.headers, sink.traceparent, rid)
            await send(http, base_url, model, spec, rec, timeout_s=timeout_s, headers=hdrs)
        finally:
            if sink.on_done is not None:
                sink.on_done(rec, spec)
        r = TurnResult(
            session_id=sess.session_id,
            turn=k,
            messages_sent=len(history),
            ok=rec.ok,
            failure=rec.failure.name if rec.failure is not None else None,
            think_s=think,
            prompt_tokens=rec.prompt_tokens,
            cached_tokens=rec.cached_tokens,
            output_tokens=rec.output_tokens,
        )
        if rec.sent_ns is not None and rec.first_token_ns is not None:
            r.ttft_s = (rec.first_token_ns - rec.sent_ns) / 1e9
        if rec.sent_ns is not None and rec.end_ns is not None:
            r.e2e_s = (rec.end_ns - rec.sent_ns) / 1e9
        sink.results.append(r)
        if not rec.ok:
            return
        history.append({"role": "assistant", "content": rec.content_text})


async def run_sessions(
    http: aiohttp.ClientSession,
    base_url: str,
    model: str,
    sessions: list[Session],
    *,
    concurrency: int | None = 1,
    rate_sps: float | None = None,
    think_time_s: float = 0.0,
    seed: int = 0,
    timeout_s: float = 600.0,
    first_id: int | None = None,
    on_done: OnDone | None = None,
    records: list[RequestRecord] | None = None,
    step: str = "",
    headers: dict[str, str] | None = None,
    traceparent: Traceparent | None = None,
) -> list[TurnResult]:
    """Run ``sessions`` against the OpenAI API root ``base_url`` and return every turn's result in the
    order turns ended. Exactly one of ``concurrency`` (sessions at once) and ``rate_sps`` (new sessions
    per second, Poisson, seeded) applies: ``rate_sps`` wins when given. With ``first_id`` the turns'
    records get ids ``first_id, first_id + 1, …`` in send order (else ``session_id * 10000 + turn``);
    ``records`` receives each record as it starts and ``on_done(record, spec)`` is called as each ends
    (the bench writes its ``requests.jsonl`` line there); ``traceparent`` (``--otlp-endpoint``) gives each
    turn's ``traceparent`` header from its request id. Raises :class:`ConfigError` for a concurrency
    below 1, a rate not > 0, or a think time outside 0 to
    :data:`~servelab.bench.options.MAX_THINK_TIME_S` seconds."""
    if not 0 <= think_time_s <= MAX_THINK_TIME_S:
        raise ConfigError(f"think time {think_time_s:g} s: give a mean from 0 to {MAX_THINK_TIME_S:g} seconds")
    ids = itertools.count(first_id) if first_id is not None else None
    sink = _Sink(ids, on_done, records, step, headers, traceparent)
    if rate_sps is not None:
        if not rate_sps > 0:
            raise ConfigError(f"session rate {rate_sps:g}/s: give a rate > 0")
        gaps = np.random.default_rng(seed).exponential(1.0 / rate_sps, len(sessions))
        t0 = time.monotonic()
        t0_ns = time.monotonic_ns()
        at = np.cumsum(gaps) - gaps[0]

        async def start(i: int, s: Session) -> None:
            await asyncio.sleep(max(0.0, t0 + float(at[i]) - time.monotonic()))
            await _one_session(
                http,
                base_url,
                model,
                s,
                think_time_s,
                random.Random(f"{seed}:{s.session_id}"),
                timeout_s,
                sink,
                arrival_ns=t0_ns + int(float(at[i]) * 1e9),
            )

        await asyncio.gather(*(start(i, s) for i, s in enumerate(sessions)))
        return sink.results
    if concurrency is None or concurrency < 1:
        raise ConfigError(f"session concurrency {concurrency}: give at least 1")
    queue = list(sessions)

    async def worker() -> None:
        while queue:
            s = queue.pop(0)
            await _one_session(
                http, base_url, model, s, think_time_s, random.Random(f"{seed}:{s.session_id}"), timeout_s, sink
            )

    await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sessions)))))
    return sink.results


def summarize_sessions(sessions: list[Session], results: list[TurnResult], duration_s: float = 0.0) -> SessionsSummary:
    """Per-turn statistics and session success of one :func:`run_sessions` run (see the classes)."""
    by_session: dict[int, list[TurnResult]] = {}
    for r in results:
        by_session.setdefault(r.session_id, []).append(r)
    ok_sessions = sum(
        1
        for s in sessions
        if len(by_session.get(s.session_id, [])) == len(s.user_messages) and all(r.ok for r in by_session[s.session_id])
    )
    stats = []
    for k in range(max((len(s.user_messages) for s in sessions), default=0)):
        rs = [r for r in results if r.turn == k]
        if not rs:
            continue
        good = [r for r in rs if r.ok]
        ttft = [r.ttft_s for r in good if r.ttft_s is not None]
        pts = [r.prompt_tokens for r in rs if r.prompt_tokens is not None]
        both = [(r.cached_tokens, r.prompt_tokens) for r in good if r.cached_tokens is not None and r.prompt_tokens]
        cached = [r.cached_tokens for r in good if r.cached_tokens is not None]
        stats.append(
            TurnStats(
                turn=k,
                n=len(rs),
                ok=len(good),
                prompt_tokens_mean=float(np.mean(pts)) if pts else None,
                ttft_p50_s=float(np.median(ttft)) if ttft else None,
                ttft_max_s=max(ttft) if ttft else None,
                cached_share=sum(c for c, _ in both) / sum(p for _, p in both) if both else None,
                cached_tokens_mean=float(np.mean(cached)) if cached else None,
            )
        )
    n = len(sessions)
    return SessionsSummary(
        sessions=n,
        sessions_ok=ok_sessions,
        session_success=ok_sessions / n if n else 0.0,
        turns=stats,
        duration_s=duration_s,
    )


class SessionsWorkload:
    """The ``sessions`` workload of ``servelab bench`` (a :class:`servelab.bench.load.driven.DrivenWorkload`):
    each step runs every one of ``sessions`` (fresh per step), ``load.concurrency`` at once (closed loop)
    or starting at ``load.rate_rps`` sessions/s (open loop, Poisson), with ``think_time_s`` mean
    exponential think time; its ``step_extra`` is the :class:`SessionsSummary` under ``sessions``."""

    name = "sessions"

    def __init__(
        self,
        sessions: list[Session],
        *,
        think_time_s: float = 0.0,
        seed: int = 0,
        source: str = "built-in",
        max_input_tokens: int | None = None,
    ) -> None:
        if not sessions:
            raise ConfigError("a sessions workload needs at least one session")
        self.sessions, self.think_time_s, self.seed, self.source = sessions, think_time_s, seed, source
        self.max_input_tokens = max_input_tokens
        self.total = sum(len(s.user_messages) for s in sessions)
        self._results: list[TurnResult] = []
        self._t0 = 0.0

    async def drive(
        self,
        http: aiohttp.ClientSession,
        base_url: str,
        model: str,
        load: LoadModel,
        *,
        headers: dict[str, str] | None,
        first_id: int,
        step: str,
        timeout_s: float,
        on_done: OnDone,
        records: list[RequestRecord],
        dispatch_lags_ns: list[int] | None = None,
        traceparent: Traceparent | None = None,
    ) -> None:
        """Run the step (see the class doc); every turn's record goes to ``records`` and ``on_done``."""
        self._t0 = time.monotonic()
        self._results = await run_sessions(
            http,
            base_url,
            model,
            self.sessions,
            concurrency=load.concurrency if load.kind == "closed" else None,
            rate_sps=load.rate_rps if load.kind == "open" else None,
            think_time_s=self.think_time_s,
            seed=self.seed,
            timeout_s=timeout_s,
            first_id=first_id,
            on_done=on_done,
            records=records,
            step=step,
            headers=headers,
            traceparent=traceparent,
        )

    def step_extra(self, records: list[RequestRecord]) -> dict[str, Any]:
        """``{"sessions": SessionsSummary}`` of the step just driven (as a JSON-ready dict)."""
        summ = summarize_sessions(self.sessions, self._results, time.monotonic() - self._t0)
        summ.think_time_mean_s, summ.source = self.think_time_s, self.source
        return {"sessions": summ.model_dump()}
