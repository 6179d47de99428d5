"""The production-like workloads of ``servelab bench``: their options, checked once before any
engine starts, and the workload objects the run's factory builds.

=================  ==========================================================  ==============================
workload           options                                                     what a step runs
=================  ==========================================================  ==============================
``trace``          ``--trace FILE [--trace-format F] [--trace-speed X]``       the trace at its timestamps
                   ``[--trace-window START:END] [-n N]``                       (:mod:`.traces`)
``sessions``       ``--sessions N --turns K --think-time-s MEAN``              N multi-turn sessions
                   ``[--sessions-file FILE]``, ``--set first_tokens=,``        (:mod:`.sessions`)
                   ``turn_tokens=, output_tokens=``
``agent``          ``-n LOOPS``, ``--set tool_steps=M, first_tokens=,``        agent loops with tool results
                   ``output_tokens=``                                          (:mod:`.agent`)
``rag-docs``       ``--rag-top-k K [--rag-embed-url URL]``,                    RAG on the stdlib docstrings
                   ``--set chunk_tokens=, output_tokens=``                     (:mod:`.rag`)
``mixed-lang``     ``--set input_tokens=, output_tokens=``                     Chinese/English prompts
                                                                               (:mod:`.mixed_lang`)
``embeddings``     ``--endpoint embeddings --batch-size N``,                   ``/v1/embeddings`` requests
                   ``--set input_tokens=``                                     (:mod:`.embeddings`)
``rerank``         ``--endpoint rerank --batch-size N``,                       ``/v1/rerank`` requests
                   ``--set input_tokens=``                                     (:mod:`.rerank`)
=================  ==========================================================  ==============================

Every bad value is refused with one :class:`ConfigError` line naming the option and the fix.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from rich.console import Console

from servelab.bench.options import MAX_THINK_TIME_S
from servelab.bench.workloads.kinds import WorkloadKind
from servelab.bench.workloads.registry import OPTION_WORKLOADS, register_workload
from servelab.wire.client import ConfigError

if TYPE_CHECKING:
    from servelab.bench.results import Summary

__all__ = ["PRODUCTION_WORKLOADS", "ProductionOptions", "print_extras"]

for _name, _description in (
    ("sessions", "multi-turn chat sessions: each turn resends the history (--sessions, --turns, --think-time-s)"),
    ("agent", "agent loops: tool call, synthetic tool result, next step, M steps then an answer (--set tool_steps=M)"),
    ("rag-docs", "RAG on real documents: Python stdlib docstrings retrieved by all-MiniLM-L6-v2 (--rag-top-k)"),
    ("mixed-lang", "mixed Chinese/English prompts from Debian's zh_CN message catalogs; tokens per character"),
    ("trace", "timestamped trace replay (--trace FILE: Mooncake, Azure or BurstGPT)"),
    ("embeddings", "/v1/embeddings throughput (--endpoint embeddings, --batch-size)"),
    ("rerank", "/v1/rerank throughput: documents scored per second (--endpoint rerank, --batch-size)"),
):
    register_workload(WorkloadKind(_name, _description, None))  # built by ProductionOptions.factory

#: the production-like sets, name -> description (``servelab bench -w NAME``): the registry's sets built
#: from the bench command's options
PRODUCTION_WORKLOADS = OPTION_WORKLOADS
_SESSION_KEYS = {"first_tokens", "turn_tokens", "output_tokens"}
_AGENT_KEYS = {"tool_steps", "first_tokens", "output_tokens", "extra"}
_RAG_KEYS = {"chunk_tokens", "output_tokens"}
_LANG_KEYS = {"input_tokens", "output_tokens", "extra"}
_EMBED_KEYS = {"input_tokens"}
#: the endpoints measured by whole answers to batches of inputs, each its own workload of that name
_POOLED = ("embeddings", "rerank")


def _int_key(params: dict[str, Any], key: str, default: int, name: str, lo: int = 1, hi: int = 1_048_576) -> int:
    v = params.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigError(f"--set {name}.{key}={v!r}: give an integer from {lo} to {hi}")
    return v


def _only(params: dict[str, Any], allowed: set[str], name: str) -> None:
    bad = sorted(
        set(params)
        - allowed
        - {
            "input_tokens",
            "output_tokens",
            "ratio",
            "prefix_tokens",
            "num_prefixes",
            "suffix_tokens",
            "lang",
            "extra",
            "tool_steps",
            "first_tokens",
            "turn_tokens",
            "chunk_tokens",
        }
    )
    if bad:
        raise ConfigError(f"unknown parameter(s) {', '.join(bad)} for {name}: valid are {', '.join(sorted(allowed))}")


@dataclass
class ProductionOptions:
    """The production-workload options of one ``servelab bench`` call (see the module doc for each).
    :meth:`resolve` checks them against the rest of the command line and names the workloads to run."""

    trace: str | None = None
    trace_format: str = "auto"
    trace_speed: float = 1.0
    trace_window: str | None = None
    sessions: int | None = None
    turns: int = 4
    think_time_s: float = 0.0
    sessions_file: str | None = None
    batch_size: int = 1
    rag_embed_url: str | None = None
    rag_top_k: int = 4

    def resolve(
        self,
        names: list[str],
        *,
        workload_given: bool,
        dataset: str | None,
        endpoint: str,
        rate: str | None,
        concurrency: str,
        duration: float | None,
        workers: int,
        ray: str | None,
        overrides: dict[str, Any],
        requests: int | None,
    ) -> list[str]:
        """The workload names to run, after the options that choose one (``--trace``, ``--sessions``,
        ``--sessions-file``, ``--endpoint embeddings``). Raises :class:`ConfigError` (one line) for an option
        that would be ignored, a combination that cannot run, or a bad value (a missing or unreadable
        trace, a bad window, a sessions file without conversations)."""
        if self.trace is None and (self.trace_format != "auto" or self.trace_speed != 1.0 or self.trace_window):
            raise ConfigError("--trace-format/--trace-speed/--trace-window apply to a replay: add --trace FILE")
        if self.trace is None and "trace" in names:
            raise ConfigError(
                "the trace workload replays a file: add --trace FILE (Mooncake JSONL, Azure or BurstGPT CSV)"
            )
        if (
            self.sessions is None
            and self.sessions_file is None
            and (self.turns != 4 or self.think_time_s)
            and "sessions" not in names
        ):
            raise ConfigError("--turns/--think-time-s shape multi-turn sessions: add --sessions N or -w sessions")
        if endpoint not in _POOLED and self.batch_size != 1:
            raise ConfigError(
                "--batch-size is the inputs per /v1/embeddings request (documents per /v1/rerank query): add "
                "--endpoint embeddings or --endpoint rerank"
            )
        if (self.rag_embed_url is not None or self.rag_top_k != 4) and "rag-docs" not in names:
            raise ConfigError("--rag-top-k/--rag-embed-url apply to the rag-docs workload: add -w rag-docs")
        names, special = self._choose(names, workload_given, endpoint)
        if not special:
            return names
        self._check_combination(names, special, dataset, endpoint, workers, ray, duration)
        if "trace" in names:
            self._check_trace(rate, concurrency, duration, requests)
        if "sessions" in names:
            self._check_sessions(duration)
        self._check_params(names, overrides)
        return names

    def _choose(self, names: list[str], workload_given: bool, endpoint: str) -> tuple[list[str], list[str]]:
        """The names after ``--trace``/``--sessions``/``--endpoint embeddings``, and the production ones among them."""
        special = [n for n in names if n in PRODUCTION_WORKLOADS]
        chosen: list[str] | None = None
        if self.trace is not None:
            chosen = ["trace"]
        if self.sessions is not None or self.sessions_file is not None:
            if chosen:
                raise ConfigError("give --trace or --sessions, not both: each is its own run")
            chosen = ["sessions"]
        if endpoint in _POOLED:
            if chosen:
                raise ConfigError(f"--endpoint {endpoint} measures /v1/{endpoint}: leave out --trace/--sessions")
            chosen = [endpoint]
        if chosen is None:
            return names, special
        if workload_given and names != chosen:
            raise ConfigError(
                f"{self._chooser(chosen[0])} runs the {chosen[0]} workload: leave out --workload {','.join(names)}"
            )
        return chosen, chosen

    @staticmethod
    def _check_combination(
        names: list[str],
        special: list[str],
        dataset: str | None,
        endpoint: str,
        workers: int,
        ray: str | None,
        duration: float | None,
    ) -> None:
        if dataset is not None:
            raise ConfigError(f"--dataset replaces the workload; it cannot run with {special[0]}")
        for pooled in _POOLED:
            if pooled in names and len(names) > 1:
                raise ConfigError(f"--endpoint {pooled} runs only the {pooled} workload")
        chat_only = [n for n in names if n in ("sessions", "agent", "rag-docs")]
        if endpoint == "completions" and chat_only:
            raise ConfigError(f"{chat_only[0]} sends chat messages: use --endpoint chat")
        if workers > 1 or ray is not None:
            raise ConfigError(
                f"{special[0]} runs in one process (its requests depend on earlier answers or on a "
                "schedule of its own): leave out --workers/--ray"
            )
        if any(n in ("agent", *_POOLED) for n in names) and duration is not None:
            raise ConfigError("agent loops and embeddings/rerank steps are counted in requests: use -n, not --duration")

    def _check_trace(self, rate: str | None, concurrency: str, duration: float | None, requests: int | None) -> None:
        from servelab.bench.workloads import traces as T

        if rate is not None or concurrency != "1,2,4,8" or duration is not None:
            raise ConfigError(
                "a trace replay sends at the trace's timestamps: leave out --rate/--concurrency/"
                "--duration (use --trace-speed and --trace-window)"
            )
        if not (math.isfinite(self.trace_speed) and self.trace_speed > 0):
            raise ConfigError(f"--trace-speed {self.trace_speed:g}: give a factor > 0 (2 = twice as fast)")
        if self.trace_format not in ("auto", "mooncake", "azure", "burstgpt"):
            raise ConfigError(f"--trace-format {self.trace_format!r}: use auto, mooncake, azure or burstgpt")
        start, dur = T.parse_window(self.trace_window)
        assert self.trace is not None
        self._trace = T.read_trace(
            self.trace, self._fmt(), speed=self.trace_speed, start_s=start, duration_s=dur, max_requests=requests
        )

    def _check_sessions(self, duration: float | None) -> None:
        if duration is not None:
            raise ConfigError("a sessions step ends when its sessions end: leave out --duration")
        if self.sessions is not None and not 1 <= self.sessions <= 100_000:
            raise ConfigError(f"--sessions {self.sessions}: give 1 to 100000 sessions per step")
        if not 1 <= self.turns <= 1000:
            raise ConfigError(f"--turns {self.turns}: give 1 to 1000 user turns per session")
        if not (math.isfinite(self.think_time_s) and 0 <= self.think_time_s <= MAX_THINK_TIME_S):
            raise ConfigError(
                f"--think-time-s {self.think_time_s:g}: give the mean think time in seconds, from 0 "
                f"(none) to {MAX_THINK_TIME_S:g} (servelab's limit: a user away longer starts a new "
                "session), e.g. --think-time-s 2"
            )
        if self.sessions_file is not None:
            from servelab.bench.workloads.sessions import load_sessions

            self._file_sessions = load_sessions(self.sessions_file)

    def _chooser(self, name: str) -> str:
        return {
            "trace": "--trace",
            "sessions": "--sessions",
            "embeddings": "--endpoint embeddings",
            "rerank": "--endpoint rerank",
        }[name]

    def _fmt(self) -> Literal["auto", "mooncake", "azure", "burstgpt"]:
        f = self.trace_format
        assert f in ("auto", "mooncake", "azure", "burstgpt")
        return f  # type: ignore[return-value]  # checked just above

    def _check_params(self, names: list[str], overrides: dict[str, Any]) -> None:
        from servelab.bench.options import scoped_overrides
        from servelab.bench.workloads.lengths import parse_length

        for name in names:
            p = scoped_overrides(overrides, name)
            if name == "sessions":
                _only(p, _SESSION_KEYS, name)
                for k, d in (("first_tokens", 128), ("turn_tokens", 32)):
                    _int_key(p, k, d, name)
            elif name == "agent":
                _only(p, _AGENT_KEYS, name)
                _int_key(p, "tool_steps", 2, name, 1, 64)
                _int_key(p, "first_tokens", 96, name)
            elif name == "rag-docs":
                _only(p, _RAG_KEYS, name)
                _int_key(p, "chunk_tokens", 160, name, 16, 4096)
                if not 1 <= self.rag_top_k <= 64:
                    raise ConfigError(f"--rag-top-k {self.rag_top_k}: give 1 to 64 passages per question")
            elif name in ("mixed-lang", *_POOLED):
                _only(p, _LANG_KEYS if name == "mixed-lang" else _EMBED_KEYS, name)
                if "input_tokens" in p:
                    parse_length(p["input_tokens"], "input_tokens")
                if name == "mixed-lang":
                    from servelab.bench.workloads.mixed_lang import load_corpus

                    load_corpus()  # no catalogs: one line now, not after the engine started
            if "output_tokens" in p and name not in (*_POOLED, "trace"):
                parse_length(p["output_tokens"], "output_tokens")
            if name in _POOLED and not 1 <= self.batch_size <= 2048:
                raise ConfigError(f"--batch-size {self.batch_size}: give 1 to 2048 inputs per request")

    # -- building, once the tokenizer is known ---------------------------------------------------------
    def factory(
        self,
        counter: Any,
        *,
        base_seed: int,
        endpoint: str,
        ignore_eos: bool,
        overrides: dict[str, Any],
        requests: int,
        max_concurrency: int | None,
        tokenizer_name: str | None = None,
        rag_set: Any = None,
    ) -> Callable[[str, int], Any]:
        """``(name, seed) -> workload`` for the production sets (``seed`` is the step's seed; its
        ``(seed - base_seed) // 1000`` is the step index)."""
        from servelab.bench.options import scoped_overrides

        def build(name: str, seed: int) -> Any:
            p = scoped_overrides(overrides, name)
            if name == "trace":
                from servelab.bench.workloads.traces import TraceWorkload

                return TraceWorkload(
                    self._trace,
                    counter,
                    "chat" if endpoint == "chat" else "completions",
                    max_concurrency=max_concurrency,
                )
            if name == "sessions":
                from servelab.bench.workloads.lengths import parse_length
                from servelab.bench.workloads.sessions import SessionsWorkload, make_sessions

                out = parse_length(p.get("output_tokens", 64), "output_tokens")
                if self.sessions_file is not None:
                    ss = list(self._file_sessions)
                    if self.sessions is not None:
                        ss = [ss[i % len(ss)].model_copy(update={"session_id": i}) for i in range(self.sessions)]
                    for s in ss:
                        s.max_tokens = out.max_tokens
                    return SessionsWorkload(ss, think_time_s=self.think_time_s, seed=seed, source=self.sessions_file)
                first, turn = int(p.get("first_tokens", 128)), int(p.get("turn_tokens", 32))
                ss = make_sessions(
                    self.sessions or 8,
                    counter,
                    turns=self.turns,
                    first_tokens=first,
                    turn_tokens=turn,
                    max_tokens=out.max_tokens,
                    seed=seed,
                )
                return SessionsWorkload(
                    ss,
                    think_time_s=self.think_time_s,
                    seed=seed,
                    max_input_tokens=first + (self.turns - 1) * (turn + out.max_tokens) + 16,
                )
            if name == "agent":
                from servelab.bench.workloads.agent import AgentWorkload
                from servelab.bench.workloads.lengths import parse_length

                out = parse_length(p.get("output_tokens", 192), "output_tokens")
                extra = p.get("extra") if isinstance(p.get("extra"), dict) else None
                return AgentWorkload(
                    requests,
                    counter,
                    tool_steps=int(p.get("tool_steps", 2)),
                    first_tokens=int(p.get("first_tokens", 96)),
                    max_tokens=out.max_tokens,
                    seed=seed,
                    extra=extra,
                )
            if name == "rag-docs":
                from servelab.bench.workloads.rag import rag_docs_workload

                return rag_docs_workload(rag_set, requests, max(0, (seed - base_seed) % 100_000 // 1000))
            if name == "mixed-lang":
                from servelab.bench.workloads.mixed_lang import mixed_lang_workload

                kw = {k: p[k] for k in ("input_tokens", "output_tokens") if k in p}
                return mixed_lang_workload(
                    counter,
                    seed=seed,
                    endpoint=endpoint,
                    ignore_eos=ignore_eos,
                    extra=p.get("extra") if isinstance(p.get("extra"), dict) else None,
                    **kw,
                )
            if name in _POOLED:
                from servelab.bench.workloads.embeddings import (
                    DEFAULT_INPUT_TOKENS,
                    EmbeddingsWorkload,
                    embedding_inputs,
                )
                from servelab.bench.workloads.rerank import RerankWorkload

                n_inputs = min(requests * (self.batch_size + (name == "rerank")), 4096)
                inputs = embedding_inputs(
                    n_inputs, counter, input_tokens=p.get("input_tokens", DEFAULT_INPUT_TOKENS), seed=seed
                )
                return (RerankWorkload if name == "rerank" else EmbeddingsWorkload)(
                    inputs, batch_size=self.batch_size, requests=requests, tokenizer=tokenizer_name, seed=seed
                )
            raise ConfigError(f"unknown production workload {name!r}")

        return build

    def build_rag(
        self, counter: Any, *, n: int, seed: int, overrides: dict[str, Any], log_dir: str, quiet: bool
    ) -> Any:
        """Build the ``rag-docs`` set once for the run: ``n`` questions, passages embedded by
        ``--rag-embed-url`` (its first model) or by a local all-MiniLM-L6-v2 llama-server started for the
        build and stopped after it. Raises :class:`ConfigError` (one line) when the embedder cannot be used."""
        from servelab.bench.options import scoped_overrides
        from servelab.bench.workloads.lengths import parse_length
        from servelab.bench.workloads.rag import build_rag_set
        from servelab.wire.client import make_session, normalize_base_url

        p = scoped_overrides(overrides, "rag-docs")
        chunk = int(p.get("chunk_tokens", 160))
        max_tokens = parse_length(p.get("output_tokens", 96), "output_tokens").max_tokens

        async def go(url: str, model: str) -> Any:
            async with make_session() as s:
                return await build_rag_set(
                    s, url, model, n, counter, k=self.rag_top_k, chunk_tokens=chunk, seed=seed, max_tokens=max_tokens
                )

        def build(url: str) -> Any:
            import json
            import urllib.request

            try:
                with urllib.request.urlopen(url + "/models", timeout=10) as r:
                    models = [m.get("id") for m in json.loads(r.read()).get("data", [])]
            except Exception as e:  # noqa: BLE001 — any failure is one line
                raise ConfigError(
                    f"--rag-embed-url {url}: cannot list its models ({e}); is the embeddings server "
                    "up? (servelab embed-engine)"
                ) from None
            if not models:
                raise ConfigError(f"--rag-embed-url {url} lists no model")
            try:
                return asyncio.run(go(url, str(models[0])))
            except RuntimeError as e:
                raise ConfigError(f"--rag-embed-url {url}: {e}") from None

        if self.rag_embed_url is not None:
            return build(normalize_base_url(self.rag_embed_url))
        from servelab.engines.embedder import EmbeddingLauncher

        with EmbeddingLauncher(
            parallel=2, log_dir=str(Path(log_dir) / "embedder"), progress=(lambda _m: None) if quiet else print
        ).start() as emb:
            return build(emb.base_url)


def print_extras(summary: Summary, console: Console) -> None:
    """One line per step of a production workload with its own figures (sessions, agent, replay,
    embeddings, language, RAG), under the terminal table."""
    for s in summary.steps:
        head = f"{s.workload} {s.step}:"
        if s.sessions:
            x = s.sessions
            turns = "; ".join(
                f"turn {t.turn}: {t.prompt_tokens_mean or 0:.0f} prompt tok, TTFT p50 "
                f"{(t.ttft_p50_s or 0) * 1e3:.1f} ms"
                + (f", cached {t.cached_share:.0%}" if t.cached_share is not None else "")
                for t in x.turns
            )
            console.print(f"{head} sessions {x.sessions_ok}/{x.sessions} succeeded; {turns}", soft_wrap=True)
        if s.agent:
            a = s.agent
            per = "; ".join(
                f"step {t.step}: {t.valid}/{t.n} valid"
                + (f" ({', '.join(f'{k} {v}' for k, v in t.invalid.items())})" if t.invalid else "")
                for t in a.steps
            )
            console.print(
                f"{head} agent loops {a.loops_completed}/{a.loops} completed ({a.tool_steps} tool steps each); {per}",
                soft_wrap=True,
            )
        if s.replay:
            r = s.replay
            lag = r.schedule_lag_p99_s
            console.print(
                f"{head} replayed {r.requests} requests of {r.format} trace {r.path} at speed "
                f"{r.speed:g} ({r.rate_rps:.2f} req/s); schedule lag p99 "
                f"{'-' if lag is None else f'{lag * 1e3:.3f} ms'}, within 1 ms "
                f"{(r.within_1ms or 0):.1%}",
                soft_wrap=True,
            )
        if s.embeddings:
            e = s.embeddings
            lat = e.latency
            console.print(
                f"{head} embeddings {e.inputs_per_s or 0:.1f} inputs/s, {e.tokens_per_s or 0:.0f} "
                f"tokens/s; latency p50 {(lat.p50_s or 0) * 1e3:.1f} ms, p99 "
                f"{(lat.p99_s or 0) * 1e3:.1f} ms (n={lat.n}); {e.unit}",
                soft_wrap=True,
            )
        if s.language:
            g = s.language
            tpc = g.tokens_per_char
            console.print(
                f"{head} {g.characters} characters, "
                f"{'-' if tpc is None else f'{tpc:.3f}'} tokens/character in {g.tokenizer}; "
                f"{(g.han_share or 0):.0%} Chinese characters",
                soft_wrap=True,
            )
        if s.rag:
            q = s.rag
            console.print(
                f"{head} {q.corpus}: {q.passages} passages, top-{q.k} by {q.embedding_model}; "
                f"prompt tokens p50 {q.input_tokens.get('p50', 0):.0f}, max "
                f"{q.input_tokens.get('max', 0):.0f}",
                soft_wrap=True,
            )
