"""Shared fixtures (``mock_engine``: start ``servelab mock-engine`` as a subprocess on a free port), the
hypothesis profile (tests/hypothesis_profiles.py) and the test tiers.

Tiers: every test gets its tier markers here and only here (``pytest_collection_modifyitems``), from the
fixtures it uses (:data:`FIXTURE_TIERS`) and from where it is (:data:`PATH_TIERS`); the meanings are in
pyproject.toml's ``markers``. ``unit`` means in-process: no subprocess, server or timing claim; a ``unit``
test that starts a subprocess or a multiprocessing child fails, naming what it started, so the tier cannot
silently rot. A test that gets no tier fails tests/test_tiers.py. ``bash scripts/test.sh --fast`` runs
``-m unit``; select others with ``-m``, e.g. ``-m 'proc and not timing'``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis_profiles
import pytest

HYPOTHESIS_PROFILE = hypothesis_profiles.load()

_LISTEN = re.compile(rb"listening on (http://\S+/v1)")


@dataclass
class MockProcess:
    """A running mock-engine subprocess: ``base_url`` ends in ``/v1``; ``root`` is without it."""

    proc: subprocess.Popen[bytes]
    base_url: str

    @property
    def root(self) -> str:
        return self.base_url[: -len("/v1")]


def start_mock_process(*args: str, timeout_s: float = 20.0) -> MockProcess:
    """Start ``python -m servelab.engines.mock --port 0 ARGS`` and wait for its listening line.

    Raises :class:`RuntimeError` (with the process's stderr) if it exits or does not announce itself.
    """
    cmd = [sys.executable, "-m", "servelab.engines.mock", "--port", "0", *args]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    line = b""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = _LISTEN.search(line)
        if m:
            return MockProcess(proc, m.group(1).decode())
        if not line and proc.poll() is not None:
            break
    stop_mock_process(proc)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    raise RuntimeError(f"mock-engine did not start: {line!r} {err[-2000:]}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; always reaps the process and closes its pipes."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    for f in (proc.stdin, proc.stdout, proc.stderr):
        if f is not None:
            f.close()


def stop_mock_process(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL after 5 s; always reaps the process."""
    stop_process(proc, 5.0)


@pytest.fixture
def mock_engine() -> Iterator:
    """Factory: ``mock_engine("--dialect", "sglang", "--ttft-ms", "20")`` -> :class:`MockProcess`.
    Every process it started is stopped at teardown."""
    started: list[MockProcess] = []

    def factory(*args: str) -> MockProcess:
        mp = start_mock_process(*args)
        started.append(mp)
        return mp

    yield factory
    for mp in started:
        stop_mock_process(mp.proc)


@contextlib.contextmanager
def high_priority(*pids: int) -> Any:
    """Make wake-ups of this process and ``pids`` prompt while timing, where the OS allows it.

    On a busy shared 2-core box a plain process often waits 1-5 ms to run after its socket became
    readable (measured here: ~3 % of 5 ms sleeps overslept by >1 ms, even at nice -10), which is noise
    about the box, not about the client or the mock. Real-time FIFO scheduling (bounded by the kernel's
    RT throttling; both processes sleep almost all the time) is used when permitted, else nice -10, else
    nothing. Measured values and tolerances are unchanged. The old policies are restored afterwards.
    """
    undo: list[Callable[[], None]] = []
    for pid in (0, *pids):
        try:
            old_policy, old_param = os.sched_getscheduler(pid), os.sched_getparam(pid)
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(10))
            undo.append(lambda pid=pid, p=old_policy, q=old_param: os.sched_setscheduler(pid, p, q))
            continue
        except (PermissionError, OSError, AttributeError):
            pass
        try:
            old_nice = os.getpriority(os.PRIO_PROCESS, pid)
            os.setpriority(os.PRIO_PROCESS, pid, -10)
            undo.append(lambda pid=pid, n=old_nice: os.setpriority(os.PRIO_PROCESS, pid, n))
        except (PermissionError, OSError):
            pass
    try:
        yield
    finally:
        for fn in undo:
            with contextlib.suppress(OSError):
                fn()


# ------------------------------------------------------------------------------------------ test tiers

TIERS = ("unit", "proc", "engine", "services", "browser", "slow", "timing")
HEAVY = frozenset(TIERS) - {"unit"}

# Fixtures that start something: fixture -> tiers, for every test that uses it (directly or through another
# fixture). A fixture defined in a test module is named "path::fixture"; one from a conftest by its name.
FIXTURE_TIERS: dict[str, tuple[str, ...]] = {
    "mock_engine": ("proc",),
    "gateway": ("proc",),
    "tests/bench/test_bench_llamacpp.py::run": ("engine", "proc"),
    "tests/bench/workloads/test_production_llamacpp.py::gemma": ("engine",),
    "tests/bench/load/test_ray_bench.py::ray_cluster": ("proc",),
    "tests/engines/test_llamacpp.py::engine": ("engine",),
    "tests/engines/test_toy_kind.py::trial": ("proc",),
    "tests/engines/test_vllm.py::engine": ("slow",),
    "tests/engines/test_vllm.py::hf_dir": ("slow",),
    "tests/engines/test_vllm.py::vpython": ("slow",),
    "tests/gateway/test_openai_sdk_end_to_end.py::acc": ("engine", "proc"),
    "tests/gateway/test_hostile_connections.py::env": ("proc",),
    "tests/gateway/test_bounds_and_routing.py::llama": ("engine",),
    "tests/gateway/test_breaker.py::redis_port": ("services",),
    "tests/gateway/test_connection_flood.py::mock": ("proc",),
    "tests/gateway/test_durability.py::pg_dsn": ("services",),
    "tests/gateway/test_embedder.py::engine": ("engine",),
    "tests/gateway/test_fuzz_bodies.py::inproc": ("proc",),
    "tests/gateway/test_ledger.py::pg_dsn": ("services",),
    "tests/gateway/test_limits.py::redis_url": ("services",),
    "tests/gateway/test_limits_pool.py::redis_srv": ("services",),
    "tests/gateway/test_scopes.py::redis_url": ("services",),
    "tests/gateway/test_scrub.py::llama": ("engine",),
    "tests/gateway/test_scrub.py::setup": ("proc",),
    "tests/gateway/test_served_count.py::llama4": ("engine",),
    "tests/gateway/test_server.py::env": ("proc",),
    "tests/gateway/test_session_key_workers.py::engines": ("proc",),
    "tests/gateway/test_apis_llama.py::llama": ("engine",),
    "tests/gateway/test_shadow.py::llama": ("engine",),
    "tests/gateway/test_workers.py::mock": ("proc",),
    "tests/gateway/test_workers.py::redis_url": ("services",),
    "tests/trial/test_decisions.py::known": ("proc",),
    "tests/trial/test_every_field.py::budget_trial": ("proc",),
    "tests/trial/test_every_field.py::decisions": ("proc",),
    "tests/trial/test_every_field.py::embed_trial": ("engine", "proc"),
    "tests/trial/test_every_field.py::external": ("proc",),
    "tests/trial/test_every_field.py::gates": ("proc",),
    "tests/trial/test_every_field.py::generators": ("proc",),
    "tests/trial/test_every_field.py::lifecycle_run": ("proc",),
    "tests/trial/test_every_field.py::nomix": ("proc",),
    "tests/trial/test_every_field.py::open_loop": ("proc",),
    "tests/trial/test_every_field.py::rich": ("proc",),
    "tests/trial/test_every_field.py::scoped": ("proc",),
    "tests/trial/test_expected_rate_flow.py::record": ("proc",),
    "tests/trial/test_flow.py::trial": ("proc",),
    "tests/trial/test_flow_fields.py::run": ("proc",),
    "tests/trial/test_quality_budget.py::record": ("proc",),
    "tests/trial/test_report_server.py::run": ("proc",),
    "tests/trial/test_results.py::run": ("proc",),
    "tests/trial/test_trial_command.py::trial": ("engine", "proc", "slow"),
    "tests/trial/test_trial_llamacpp.py::trial": ("engine", "proc"),
    "tests/trial/test_trial_vllm.py::trial": ("engine", "proc", "slow"),
}

# Where a test is: "path" (a file or folder under tests/, the longest match wins) or "path::test" (one test,
# its name without parameters; wins over the file). Add each new test file here; FIXTURE_TIERS adds to it.
PATH_TIERS: dict[str, tuple[str, ...]] = {
    "tests/advise/test_advise.py": ("unit",),
    "tests/advise/test_advise.py::test_acceptance_chat_qwen3_32b_on_two_h100": ("proc",),
    "tests/advise/test_advise.py::test_bad_input_is_one_line": ("proc",),
    "tests/advise/test_advise.py::test_json_output": ("proc",),
    "tests/advise/test_embed_experiment.py": ("engine", "proc"),
    "tests/advise/test_embed_experiment.py::test_a_gguf_embedding_model_gets_a_llamacpp_embeddings_candidate": (
        "unit",
    ),
    "tests/advise/test_embed_experiment.py::test_cli_writes_a_valid_embeddings_experiment": ("proc",),
    "tests/bench/test_bench_e2e.py": ("unit",),
    "tests/bench/test_bench_e2e.py::test_not_openai_server": ("proc",),
    "tests/bench/test_bench_llamacpp.py": ("unit",),
    "tests/bench/load/test_bench_workers.py": ("unit",),
    "tests/bench/load/test_bench_workers.py::test_bad_worker_options_one_line": ("proc",),
    "tests/bench/test_cli_startup.py": ("proc",),
    "tests/bench/test_cli_startup.py::test_every_lazy_command_loads_with_its_summary": ("unit",),
    "tests/bench/test_events.py": ("unit",),
    "tests/bench/test_bench_cli_robustness.py": ("unit",),
    "tests/bench/test_bench_tracing.py": ("proc",),
    "tests/bench/test_bench_tracing.py::test_bad_otlp_options_are_one_line": ("unit",),
    "tests/bench/test_bench_tracing.py::test_missing_opentelemetry_is_one_line_naming_the_option": ("unit",),
    "tests/bench/test_bench_tracing.py::test_a_step_larger_than_the_export_queue_loses_no_span": ("unit",),
    "tests/bench/test_bench_tracing.py::test_an_unreachable_collector_is_said_once_with_what_was_lost": ("unit",),
    "tests/bench/test_bench_tracing.py::test_otlp_options_default_off_and_accept_a_ratio": ("unit",),
    "tests/bench/test_bench_tracing.py::test_trace_ids_are_stable_per_request_and_sampled_as_the_sdk_samples": (
        "unit",
    ),
    "tests/gateway/test_bench_trace.py": ("proc",),
    "tests/bench/test_bench_cli_robustness.py::test_engine_values_checked_before_start": ("proc",),
    "tests/bench/test_bench_cli_robustness.py::test_help_documents_exit_codes": ("proc",),
    "tests/bench/test_bench_cli_robustness.py::test_prompts_longer_than_the_servers_context_are_refused": (
        "engine",
        "proc",
    ),
    "tests/bench/test_bench_cli_robustness.py::test_sigterm_stops_the_engine_it_started": ("proc",),
    "tests/bench/analysis/test_intervals.py": ("unit",),
    "tests/bench/load/test_load.py": ("unit",),
    "tests/bench/analysis/test_metrics.py": ("unit",),
    "tests/bench/workloads/test_mixed_lang.py": ("unit",),
    "tests/bench/workloads/test_production_cli.py": ("unit",),
    "tests/bench/workloads/test_production_cli.py::test_bad_input_is_one_line": ("proc",),
    "tests/bench/workloads/test_production_llamacpp.py": ("proc",),
    "tests/bench/workloads/test_production_llamacpp.py::test_embeddings": ("engine", "proc"),
    "tests/bench/workloads/test_rag.py": ("unit",),
    "tests/bench/workloads/test_rag.py::test_retrieval_through_the_real_embedder": ("engine",),
    "tests/bench/load/test_ray_bench.py": ("unit",),
    "tests/bench/workloads/test_sessions.py": ("unit",),
    "tests/bench/workloads/test_sessions.py::test_real_llama_server_serves_history_from_its_cache": ("engine",),
    "tests/bench/analysis/test_slo.py": ("unit",),
    "tests/bench/analysis/test_steady.py": ("unit",),
    "tests/bench/workloads/test_think_time_bound.py": ("proc",),
    "tests/bench/workloads/test_think_time_bound.py::test_the_bound_is_an_hour": ("unit",),
    "tests/bench/workloads/test_tools.py": ("unit",),
    "tests/bench/workloads/test_tools.py::test_real_llama_server_base_model_makes_no_tool_calls": ("engine",),
    "tests/bench/workloads/test_toy_workload.py": ("unit",),
    "tests/bench/workloads/test_toy_workload.py::test_a_trial_runs_the_new_set_and_mixes_it": ("proc",),
    "tests/bench/workloads/test_traces.py": ("unit",),
    "tests/bench/workloads/test_traces.py::test_mooncake_sharing_reaches_the_prefix_cache": ("engine",),
    "tests/bench/workloads/test_traces.py::test_replay_keeps_the_trace_times": ("timing",),
    "tests/bench/load/test_waketimer.py": ("unit",),
    "tests/bench/load/test_workers_trial.py": ("proc",),
    "tests/bench/load/test_workers_trial.py::test_load_generator_needs_ray_for_per_node": ("unit",),
    "tests/bench/workloads/test_workloads.py": ("unit",),
    "tests/capacity/test_acceptance.py": ("unit",),
    "tests/capacity/test_acceptance.py::test_capacity_command_end_to_end": ("proc",),
    "tests/capacity/test_acceptance.py::test_fit_recovers_the_mock_law_within_5_percent": ("proc",),
    "tests/capacity/test_acceptance.py::test_held_out_steps_predicted_within_10_percent": ("proc",),
    "tests/capacity/test_lengths_from.py": ("unit",),
    "tests/capacity/test_peak.py": ("unit",),
    "tests/capacity/test_profile.py": ("unit",),
    "tests/capacity/test_profile.py::test_cli_bad_profile_exit_2_one_line": ("proc",),
    "tests/capacity/test_real_record.py": ("unit",),
    "tests/capacity/test_simulate.py": ("unit",),
    "tests/capacity/test_zero_gap.py": ("unit",),
    "tests/capacity/test_stall.py": ("unit",),
    "tests/catalog/test_catalog_cli.py": ("proc",),
    "tests/catalog/test_engines.py": ("unit",),
    "tests/catalog/test_hardware.py": ("unit",),
    "tests/catalog/test_models.py": ("unit",),
    "tests/catalog/test_readers.py": ("unit",),
    "tests/engines/test_command.py": ("unit",),
    "tests/engines/test_command.py::test_first_token_readiness_and_after_ready": ("proc",),
    "tests/engines/test_command.py::test_grace_then_sigkill": ("proc",),
    "tests/engines/test_command.py::test_llama_server_by_command_line_has_the_built_in_identity": ("engine", "proc"),
    "tests/engines/test_command.py::test_port_placeholder_in_env": ("proc",),
    "tests/engines/test_command.py::test_stop_signal_reaches_the_group_and_no_process_is_left": ("proc",),
    "tests/engines/test_daemonizing_engine.py": ("proc",),
    "tests/engines/test_llamacpp.py": ("unit",),
    "tests/engines/test_llamacpp.py::test_cli_up_prints_url_and_stops_on_sigint": ("engine", "proc"),
    "tests/engines/test_llamacpp.py::test_no_orphan_when_python_exits": ("engine", "proc"),
    "tests/engines/test_llamacpp.py::test_process_exit_during_start_raises_with_log_tail": ("proc",),
    "tests/engines/test_llamacpp.py::test_stop_leaves_no_process": ("engine",),
    "tests/engines/test_llamacpp_build.py": ("engine",),
    "tests/engines/test_llamacpp_build.py::test_a_build_that_fails_its_proof_is_not_cached": ("engine", "proc"),
    "tests/engines/test_llamacpp_build.py::test_cli_build_refuses_bad_flags_in_one_line": ("proc",),
    "tests/engines/test_llamacpp_build.py::test_cli_build_replaces_a_build_made_for_another_cpu": ("engine", "proc"),
    "tests/engines/test_llamacpp_build.py::test_compiler_isa_reads_the_compilers_own_macros": ("proc",),
    "tests/engines/test_llamacpp_build.py::test_crash_by_signal_is_named_with_the_log_lines": ("proc",),
    "tests/engines/test_llamacpp_build.py::test_ensure_builds_with_cmake_and_restarts_a_tree_of_other_flags": (
        "engine",
        "proc",
    ),
    "tests/engines/test_llamacpp_build.py::test_host_cpu_and_missing_isa": ("unit",),
    "tests/engines/test_llamacpp_build.py::test_native_build_leaves_out_amx_and_keeps_native": ("unit",),
    "tests/engines/test_mock.py": ("unit",),
    "tests/engines/test_mock.py::test_cli_bad_dialect_is_one_line_exit_2": ("proc",),
    "tests/engines/test_mock.py::test_cli_help_states_units": ("proc",),
    "tests/engines/test_mock.py::test_schedule_follows_absolute_targets": ("timing",),
    "tests/engines/test_mock.py::test_timing_agrees_with_mock_records": ("timing",),
    "tests/engines/test_mock_failure_modes.py": ("unit",),
    "tests/engines/test_mock_failure_modes.py::test_cli_help_states_units_of_new_options": ("proc",),
    "tests/engines/test_mock_failure_modes.py::test_cli_negative_crash_after_is_one_line_exit_2": ("proc",),
    "tests/engines/test_mockbatch.py": ("unit",),
    "tests/engines/test_mocklaunch.py": ("unit",),
    "tests/engines/test_mocklaunch.py::test_crash_after_requests_process_is_gone": ("proc",),
    "tests/engines/test_mocklaunch.py::test_fixed_port_taken_is_a_start_error": ("proc",),
    "tests/engines/test_mocklaunch.py::test_invalid_json_content_fails_json_loads": ("proc",),
    "tests/engines/test_mocklaunch.py::test_start_stop_identity_cold_start_no_orphans": ("proc",),
    "tests/engines/test_probe.py": ("unit",),
    "tests/engines/test_probe.py::test_probe_real_llama_server": ("engine",),
    "tests/engines/test_run_logged.py": ("proc",),
    "tests/engines/test_spawn_on_port.py": ("proc",),
    "tests/engines/test_toy_kind.py": ("unit",),
    "tests/engines/test_toy_kind.py::test_a_package_adds_a_kind_through_an_entry_point": ("proc",),
    "tests/engines/test_vllm.py": ("unit",),
    "tests/engines/test_vllm.py::test_guard_wraps_the_server_command": ("proc",),
    "tests/engines/test_vllm.py::test_identity_shape_without_a_server": ("proc",),
    "tests/engines/test_vllm.py::test_secret_env_is_fingerprinted_in_identity_and_settings": ("proc",),
    "tests/gateway/test_openai_sdk_end_to_end.py": ("unit",),
    "tests/gateway/test_openai_sdk_end_to_end.py::test_chunks_out_equal_chunks_in_and_timing_within_1ms": ("timing",),
    "tests/gateway/test_admin.py": ("unit",),
    "tests/gateway/test_admin.py::test_keys_cli_against_the_admin_port": ("proc",),
    "tests/gateway/test_alerts.py": ("unit",),
    "tests/gateway/test_alerts_live.py": ("engine", "proc", "services"),
    "tests/gateway/test_alerts.py::test_promtool_checks_and_unit_tests_every_rule": ("proc",),
    "tests/gateway/test_apis.py": ("unit",),
    "tests/gateway/test_apis.py::test_messages_create_text_thinking_and_ledger_usage": ("proc",),
    "tests/gateway/test_apis.py::test_messages_errors_in_anthropic_shape": ("proc",),
    "tests/gateway/test_apis.py::test_messages_paths_unknown_or_wrong_method_answer_in_anthropic_shape": ("proc",),
    "tests/gateway/test_apis.py::test_messages_stop_sequences_and_count_tokens": ("proc",),
    "tests/gateway/test_apis.py::test_messages_stream_event_sequence_exact": ("proc",),
    "tests/gateway/test_apis.py::test_messages_tool_use_round_trip": ("proc",),
    "tests/gateway/test_apis.py::test_responses_create_and_ledger_usage": ("proc",),
    "tests/gateway/test_apis.py::test_responses_function_call_round_trip": ("proc",),
    "tests/gateway/test_apis.py::test_responses_refusals": ("proc",),
    "tests/gateway/test_apis.py::test_responses_stream_event_sequence_exact": ("proc",),
    "tests/gateway/test_hostile_connections.py": ("unit",),
    "tests/gateway/test_hostile_connections.py::test_host_all_interfaces_keeps_admin_and_metrics_private": ("proc",),
    "tests/gateway/test_hostile_connections.py::test_idle_flood_under_low_fd_limit": ("proc",),
    "tests/gateway/test_hostile_connections.py::test_public_metrics_opt_in": ("proc",),
    "tests/gateway/test_hostile_connections.py::test_slow_stream_outlives_every_timeout": ("proc",),
    "tests/gateway/test_rerank.py": ("unit",),
    "tests/gateway/test_rerank.py::test_rerank_results_usage_and_ledger": ("proc",),
    "tests/gateway/test_rerank.py::test_rerank_bad_input_is_one_clear_400": ("proc",),
    "tests/gateway/test_rerank.py::test_rerank_model_on_chat_and_embedding_declarations": ("proc",),
    "tests/gateway/test_rerank.py::test_rerank_wrong_key_and_token_limit": ("proc",),
    "tests/gateway/test_rerank.py::test_bench_endpoint_rerank_through_the_gateway": ("proc",),
    "tests/gateway/test_rerank.py::test_bench_step_where_every_request_failed_exits_1_with_one_line": ("proc",),
    "tests/gateway/test_apis_llama.py": ("proc",),
    "tests/gateway/test_native.py": ("unit",),
    "tests/gateway/test_native_mock.py": ("proc",),
    "tests/gateway/test_bench_apis.py": ("unit",),
    "tests/gateway/test_bench_apis.py::test_bench_refuses_what_the_api_cannot_carry": ("proc",),
    "tests/gateway/test_bench_apis.py::test_bench_through_gateway_tokens_equal_ledger": ("proc",),
    "tests/gateway/test_body_encoding.py": ("unit",),
    "tests/gateway/test_bounds_and_routing.py": ("unit",),
    "tests/gateway/test_breaker.py": ("unit",),
    "tests/gateway/test_capabilities.py": ("unit",),
    "tests/gateway/test_config.py": ("unit",),
    "tests/gateway/test_connection_flood.py": ("unit",),
    "tests/gateway/test_dashboard.py": ("unit",),
    "tests/gateway/test_dashboard.py::test_cli_prints_the_dashboard": ("proc",),
    "tests/gateway/test_dashboard.py::test_every_panel_query_returns_data_from_a_live_prometheus": ("proc", "services"),
    "tests/gateway/test_degrade.py": ("unit",),
    "tests/gateway/test_durability.py": ("services",),
    "tests/gateway/test_durability.py::test_kill9_mid_stream_leaves_incomplete_rows_and_budget_counts_them": ("unit",),
    "tests/gateway/test_durability.py::test_spool_path_is_configurable_and_a_bad_one_is_one_line": ("unit",),
    "tests/gateway/test_embedder.py": ("unit",),
    "tests/gateway/test_embedder.py::test_bad_converter_python_is_one_clear_error": ("proc",),
    "tests/gateway/test_engine_fields.py": ("unit",),
    "tests/gateway/test_explain.py": ("unit",),
    "tests/gateway/test_failover.py": ("unit",),
    "tests/gateway/test_failover.py::test_breaker_opened_on_one_replica_is_seen_by_the_other": ("services",),
    "tests/gateway/test_fuzz_bodies.py": ("unit",),
    "tests/gateway/test_gateway_metrics.py": ("unit",),
    "tests/gateway/test_health.py": ("unit",),
    "tests/gateway/test_keys.py": ("unit",),
    "tests/gateway/test_ledger.py": ("unit",),
    "tests/gateway/test_ledger.py::test_empty_ledger_totals": ("services",),
    "tests/gateway/test_ledger.py::test_key_records_roundtrip": ("services",),
    "tests/gateway/test_ledger.py::test_totals_exact_after_thousands_of_concurrent_records": ("services",),
    "tests/gateway/test_lengths.py": ("unit",),
    "tests/gateway/test_refused_fields_and_paths.py": ("unit",),
    "tests/gateway/test_limits.py": ("unit",),
    "tests/gateway/test_limits.py::test_four_processes_share_one_concurrency_limit": ("proc",),
    "tests/gateway/test_limits.py::test_four_processes_share_one_rpm_limit": ("proc",),
    "tests/gateway/test_limits.py::test_four_processes_sliding_window_never_exceeds_rpm": ("proc",),
    "tests/gateway/test_limits_pool.py": ("unit",),
    "tests/gateway/test_limits_pool.py::test_first_request_after_a_redis_restart_is_served": ("services",),
    "tests/gateway/test_enginegauges_bound.py": ("unit",),
    "tests/gateway/test_keepalive.py": ("proc",),
    "tests/gateway/test_pooled.py": ("unit",),
    "tests/gateway/test_picker.py": ("unit",),
    "tests/gateway/test_routing_compare.py": ("unit",),
    "tests/gateway/test_routing_compare.py::test_llamacpp_path_runs_end_to_end_and_prints_every_figure": (
        "engine",
        "proc",
    ),
    "tests/gateway/test_picker_gateway.py": ("unit",),
    "tests/gateway/test_picker_gateway.py::test_a_replica_the_engine_reports_busy_gets_no_new_request": ("proc",),
    "tests/gateway/test_picker_gateway.py::test_sessions_stay_on_their_replica_and_find_the_previous_turn_cached": (
        "proc",
    ),
    (
        "tests/gateway/test_picker_gateway.py::"
        "test_without_gauges_the_picker_falls_back_to_least_outstanding_and_counts_it"
    ): ("proc",),
    "tests/gateway/test_policy.py": ("unit",),
    "tests/gateway/test_public_health.py": ("unit",),
    "tests/gateway/test_readiness_admin.py": ("services",),
    "tests/gateway/test_readiness_admin.py::test_admin_limits_are_validated_like_the_config": ("unit",),
    "tests/gateway/test_readiness_admin.py::test_admin_usage_times_and_unknown_paths": ("unit",),
    "tests/gateway/test_reload_robust.py": ("unit",),
    "tests/gateway/test_startup_errors_and_public_names.py": ("unit",),
    (
        "tests/gateway/test_startup_errors_and_public_names.py::"
        "test_postgres_wrong_database_and_role_one_line_no_traceback"
    ): (
        "proc",
        "services",
    ),
    "tests/gateway/test_startup_errors_and_public_names.py::test_short_admin_token_is_refused_at_start": ("proc",),
    "tests/gateway/test_startup_errors_and_public_names.py::test_unreachable_postgres_is_named": ("proc",),
    "tests/gateway/test_startup_errors_and_public_names.py::test_unreachable_redis_is_refused_at_start": ("proc",),
    "tests/gateway/test_startup_errors_and_public_names.py::test_unwritable_ledger_path_is_named_not_a_port_problem": (
        "proc",
    ),
    "tests/gateway/test_routing.py": ("unit",),
    "tests/gateway/test_routing.py::test_affinity_is_stable_across_processes_with_different_hash_seeds": ("proc",),
    "tests/gateway/test_scopes.py": ("unit",),
    "tests/gateway/test_scrub.py": ("unit",),
    "tests/gateway/test_scrub.py::test_real_llama_server_context_overflow_says_how_many_tokens_to_remove": ("proc",),
    "tests/gateway/test_send_timeout.py": ("unit",),
    "tests/gateway/test_served_count.py": ("unit",),
    "tests/gateway/test_server.py": ("unit",),
    "tests/gateway/test_server.py::test_cli_bad_config_is_one_line_exit_2": ("proc",),
    "tests/gateway/test_session_key_workers.py": ("services",),
    "tests/gateway/test_shadow.py": ("unit",),
    "tests/gateway/test_tracing.py": ("unit",),
    "tests/gateway/test_tracing.py::test_failed_attempt_and_fallback_are_child_spans_with_their_error": ("proc",),
    "tests/gateway/test_tracing.py::test_gateway_imports_no_opentelemetry_while_tracing_is_off": ("proc",),
    "tests/gateway/test_tracing.py::test_new_trace_without_client_header_and_prompt_only_when_tenant_logs_prompts": (
        "proc",
    ),
    "tests/gateway/test_tracing.py::test_refused_request_has_an_admission_span_with_the_error": ("proc",),
    "tests/gateway/test_tracing.py::test_request_span_continues_the_client_trace_with_genai_attributes_and_children": (
        "proc",
    ),
    "tests/gateway/test_shutdown.py": ("unit",),
    "tests/gateway/test_shutdown.py::test_the_watchdog_ends_a_shutdown_stuck_in_a_step": ("proc",),
    "tests/gateway/test_shutdown.py::test_a_second_ctrl_c_cuts_the_drain_of_a_gateway_run_alone": ("proc",),
    "tests/gateway/test_workers.py": ("unit",),
    "tests/gateway/test_workers.py::test_no_worker_outlives_a_supervisor_stopped_like_the_tests_stop_it": ("proc",),
    "tests/gateway/test_workers.py::test_workers_of_a_killed_supervisor_stop_within_their_bound_and_keep_usage": (
        "proc",
    ),
    "tests/modelfile/test_gguf_meta.py": ("unit",),
    "tests/modelfile/test_tokenizer.py": ("unit",),
    "tests/modelfile/test_tokenizer.py::test_matches_llama_server_tokenize": ("engine",),
    "tests/plan/test_estimate.py": ("unit",),
    "tests/plan/test_kv_by_kind.py": ("unit",),
    "tests/plan/test_llamacpp_real.py": ("engine",),
    "tests/plan/test_llamacpp_real.py::test_parse_recorded_log_and_hand_arithmetic": ("unit",),
    "tests/plan/test_pitfalls.py": ("unit",),
    "tests/test_cli_usage_errors.py": ("proc",),
    "tests/test_doctor.py": ("proc",),
    "tests/test_doctor.py::test_after_setup_all_ok": ("engine", "proc"),
    "tests/test_doctor.py::test_check_lines_and_limits": ("unit",),
    "tests/test_import_graph.py": ("unit",),
    "tests/test_lint_config.py": ("proc",),
    "tests/test_lint_config.py::test_the_test_command_runs_the_static_checks": ("unit",),
    "tests/test_readme.py": ("unit",),
    "tests/test_tiers.py": ("unit",),
    "tests/test_tiers.py::test_a_unit_test_that_starts_a_subprocess_fails": ("proc",),
    "tests/trial/test_cancellation_verdict.py": ("proc",),
    "tests/trial/test_cancellation_verdict.py::test_the_default_limit_is_the_smoke_checks": ("unit",),
    "tests/trial/test_capacity.py": ("unit",),
    "tests/trial/test_capacity.py::test_capacity_search_finds_known_service_rate": ("proc",),
    "tests/trial/test_console.py": ("unit",),
    "tests/trial/test_context_check.py": ("unit",),
    "tests/trial/test_context_check.py::test_real_llama_server_per_slot_context": ("engine",),
    "tests/trial/test_decide.py": ("unit",),
    "tests/trial/test_decisions.py": ("unit",),
    "tests/trial/test_every_field.py": ("unit",),
    "tests/trial/test_every_field.py::test_field_has_its_effect": ("engine", "proc"),
    "tests/trial/test_every_field.py::test_informational_gates_are_printed_as_such": ("proc",),
    "tests/trial/test_every_field.py::test_url_candidate_model_is_its_weights_identity": ("proc",),
    "tests/trial/test_expected_rate_flow.py": ("unit",),
    "tests/trial/test_experiment_bounds.py": ("proc",),
    "tests/trial/test_experiment_bounds.py::test_hundred_levels_are_read": ("unit",),
    "tests/trial/test_flow.py": ("proc",),
    "tests/trial/test_flow.py::test_no_engine_left_running": ("unit",),
    "tests/trial/test_flow.py::test_record_rows_and_verdicts": ("unit",),
    "tests/trial/test_flow.py::test_steps_cold_start_and_evidence": ("unit",),
    "tests/trial/test_flow_fields.py": ("unit",),
    "tests/trial/test_golden_decision.py": ("unit",),
    "tests/trial/test_identity_facts.py": ("unit",),
    "tests/trial/test_lifecycle.py": ("engine",),
    "tests/trial/test_lifecycle.py::test_lifecycle_measurements_that_do_not_fit_the_budget_are_named": ("unit",),
    "tests/trial/test_quality_budget.py": ("unit",),
    "tests/trial/test_records.py": ("unit",),
    "tests/trial/test_reliability.py": ("proc",),
    "tests/trial/test_reliability.py::bad_alloc'-None-True]": ("unit",),
    "tests/trial/test_reliability.py::test_classify_exit_from_log_lines": ("unit",),
    "tests/trial/test_report.py": ("unit",),
    "tests/trial/test_report.py::test_compare_renders_in_chromium": ("browser",),
    "tests/trial/test_report.py::test_report_renders_in_chromium": ("browser",),
    "tests/trial/test_report.py::test_report_with_intervals_pareto_capacity_and_cost_renders_in_chromium": (
        "browser",
        "proc",
    ),
    "tests/trial/test_report_capacity_model.py": ("unit",),
    "tests/trial/test_report_server.py": ("unit",),
    "tests/trial/test_report_server.py::test_panel_renders_in_chromium": ("browser",),
    "tests/trial/test_results.py": ("unit",),
    "tests/trial/test_results.py::test_v1_record_renders_with_servelab_report": ("proc",),
    "tests/trial/test_significance.py": ("unit",),
    "tests/trial/test_smoke_checks.py": ("unit",),
    "tests/trial/test_smoke_checks.py::test_base_model_on_llama_server_fails_tools": ("engine",),
    "tests/trial/test_spec.py": ("unit",),
    "tests/trial/test_spec.py::test_cli_check_prints_the_experiment_back": ("proc",),
    "tests/trial/test_spec.py::test_cli_prints_one_line": ("proc",),
    "tests/trial/test_telemetry.py": ("unit",),
    "tests/trial/test_telemetry.py::test_llama_server_telemetry_and_token_agreement": ("engine",),
    "tests/trial/test_telemetry.py::test_tree_cpu_seconds_counts_children": ("proc",),
    "tests/trial/test_template_check.py": ("unit",),
    "tests/trial/test_template_check.py::test_no_template_names_the_fallback": ("engine",),
    "tests/trial/test_template_check.py::test_right_template_is_equal": ("engine",),
    "tests/trial/test_template_check.py::test_wrong_template_is_different": ("engine",),
    "tests/trial/test_trial_command.py": ("unit",),
    "tests/trial/test_trial_command.py::test_no_process_left_after_ctrl_c": ("proc",),
    "tests/trial/test_trial_embeddings.py": ("unit",),
    "tests/trial/test_trial_embeddings.py::test_trial_command_refuses_a_chat_candidate_in_one_line": ("proc",),
    "tests/trial/test_trial_embeddings.py::test_two_embedders_run_to_a_decision_on_inputs_per_s": ("engine",),
    "tests/trial/test_trial_llamacpp.py": ("unit",),
    "tests/trial/test_trial_llamacpp.py::test_report_renders_in_chromium": ("browser",),
    "tests/trial/test_trial_secrets.py": ("proc",),
    "tests/trial/test_trial_secrets.py::test_secret_names_and_marked_names": ("unit",),
    "tests/trial/test_trial_vllm.py": ("unit",),
    "tests/trial/test_verdicts.py": ("unit",),
    "tests/wire/test_api_streams.py": ("unit",),
    "tests/wire/test_config_files.py": ("unit",),
    "tests/wire/test_config_files.py::test_schema_command_writes_what_check_compares": ("proc",),
    "tests/wire/test_config_files.py::test_schema_write_into_a_missing_folder_is_one_line": ("proc",),
    "tests/wire/test_dialects.py": ("unit",),
    "tests/wire/test_engine_wire.py": ("unit",),
    "tests/wire/test_token_rule.py": ("unit",),
}

_ROOT_DIR = Path(__file__).resolve().parent.parent
_UNTIERED = pytest.StashKey[list[str]]()


def _fixture_keys(item: pytest.Item) -> list[str]:
    """The FIXTURE_TIERS keys of every fixture ``item`` uses: its name, and "path::name" for one defined in a
    test module."""
    keys: list[str] = []
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return keys
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs:
            continue
        func = defs[-1].func
        keys.append(name)
        src = getattr(func, "__code__", None)
        if src is not None:
            with contextlib.suppress(ValueError):
                keys.append(f"{Path(src.co_filename).resolve().relative_to(_ROOT_DIR)}::{name}")
    return keys


def tiers_of(item: pytest.Item) -> set[str]:
    """The tiers of one collected test (see the tables above); empty when it has none."""
    path = Path(str(item.path)).resolve().relative_to(_ROOT_DIR).as_posix()
    name = getattr(item, "originalname", None) or item.name.split("[")[0]
    got: set[str] = set()
    for key in _fixture_keys(item):
        got.update(FIXTURE_TIERS.get(key, ()))
    own = PATH_TIERS.get(f"{path}::{name}")
    if own is None:
        prefixes = [p for p in PATH_TIERS if "::" not in p and (path == p or path.startswith(p.rstrip("/") + "/"))]
        own = PATH_TIERS[max(prefixes, key=len)] if prefixes else ()
    got.update(own)
    if got & HEAVY:
        got.discard("unit")
    return got


@pytest.hookimpl(tryfirst=True)  # before -m deselects by these markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    untiered: list[str] = []
    for item in items:
        tiers = tiers_of(item)
        if not tiers:
            untiered.append(item.nodeid)
        for tier in sorted(tiers):
            item.add_marker(tier)
    config.stash[_UNTIERED] = untiered


def untiered_tests(config: pytest.Config) -> list[str]:
    """Node ids of the collected tests that got no tier (tests/test_tiers.py asserts there are none)."""
    return config.stash.get(_UNTIERED, [])


# A unit test runs in-process: one that starts a subprocess or a multiprocessing child fails, naming it.
_UNIT_RUNNING: list[str] = []


# the standard library's own probes (platform.processor() runs `uname -p`, ctypes.util.find_library runs
# `ldconfig -p`): a library detail, not a process the test depends on
_LIBRARY_PROBES = ("uname", "/sbin/ldconfig", "ldconfig")


def _refuse_in_unit(what: str, argv0: str = "") -> None:
    if _UNIT_RUNNING and argv0 not in _LIBRARY_PROBES:
        pytest.fail(
            f"{_UNIT_RUNNING[-1]} is in the unit tier (in-process) but started {what[:200]}; "
            "give it its tier in tests/conftest.py (PATH_TIERS or FIXTURE_TIERS)",
            pytrace=False,
        )


def _install_unit_guard() -> None:
    import multiprocessing.process
    import subprocess as sp

    if getattr(sp.Popen.__init__, "_servelab_unit_guard", False):
        return  # tests/gateway/conftest.py loads this file a second time under another name
    popen_init = sp.Popen.__init__
    process_start = multiprocessing.process.BaseProcess.start

    def guarded_init(self: Any, args: Any, *a: Any, **k: Any) -> None:
        first = args[0] if isinstance(args, (list, tuple)) and args else args
        _refuse_in_unit(f"the subprocess {args!r}", str(first))
        popen_init(self, args, *a, **k)

    def guarded_start(self: Any) -> None:
        _refuse_in_unit(f"the multiprocessing child {self!r}")
        process_start(self)

    guarded_init._servelab_unit_guard = True  # type: ignore[attr-defined]
    sp.Popen.__init__ = guarded_init  # type: ignore[method-assign]
    multiprocessing.process.BaseProcess.start = guarded_start  # type: ignore[method-assign]


_install_unit_guard()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Any:
    with _unit_guard(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Any:
    with _unit_guard(item):
        return (yield)


@contextlib.contextmanager
def _unit_guard(item: pytest.Item) -> Iterator[None]:
    unit = item.get_closest_marker("unit") is not None
    if unit:
        _UNIT_RUNNING.append(item.nodeid)
    try:
        yield
    finally:
        if unit:
            _UNIT_RUNNING.pop()
