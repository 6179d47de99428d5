"""The experiment file (servelab.trial.spec): defaults, examples, round trip, schema, and one-line errors
that name the file and the exact path of the bad field."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from servelab.trial import spec as S
from servelab.trial.candidates import LlamaCppCandidate, MockCandidate, UrlCandidate, VllmCandidate, candidate_model
from servelab.trial.spec import Experiment, default_experiment, json_schema, load_experiment
from servelab.wire.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

MINIMAL = """
goal:
  slo: "ttft_p95<=2s,error_rate<=1%"
  expected_rate_rps: 0.5
candidates:
  - {name: a, engine: mock, settings: {ttft_ms: 20, itl_ms: 5, output_tokens: 32}}
  - {name: b, engine: llamacpp, settings: {parallel: 4}}
"""


def write(tmp_path: Path, text: str, name: str = "experiment.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text), encoding="utf-8")
    return p


def error_of(tmp_path: Path, text: str, name: str = "experiment.yaml") -> str:
    p = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as ei:
        load_experiment(p)
    msg = str(ei.value)
    assert "\n" not in msg, msg
    assert msg.startswith(f"{p}: "), msg
    return msg[len(f"{p}: ") :]


def mutate(base: str, fn) -> str:
    d = yaml.safe_load(base)
    fn(d)
    return yaml.safe_dump(d, sort_keys=False)


# ---------------------------------------------------------------------------------------------------
# valid files


def test_default_experiment_is_the_documented_one() -> None:
    e = default_experiment()
    assert e.name == "llamacpp-slots"
    assert [c.name for c in e.candidates] == ["np1", "np4"]
    assert all(isinstance(c, LlamaCppCandidate) and c.model is None for c in e.candidates)
    assert (e.candidates[0].settings.parallel, e.candidates[0].settings.ctx_size) == (1, 8192)
    assert (e.candidates[1].settings.parallel, e.candidates[1].settings.ctx_size) == (4, 8192)
    assert [w.label for w in e.workloads] == ["short-qa", "structured"]
    assert e.steps.concurrency == [1, 2, 4] and e.steps.kind == "closed"
    assert [m.label for m in e.steps.load_models()] == ["c1", "c2", "c4"]
    assert (e.mix_sweep, e.repeats, e.capacity.requests, e.capacity.max_probes) == (True, 3, 8, 3)
    assert (e.requests_per_step, e.warmup, e.arrival_test.requests) == (8, 1, 12)
    assert [o.name for o in e.goal.objectives] == ["ttft_p95<=3s", "itl_p95<=0.4s", "error_rate<=1%"]
    lm = e.arrival_load()
    assert (lm.kind, lm.rate_rps, lm.arrival, lm.gamma_shape) == ("open", 0.25, "gamma", 0.5)
    assert e.goal.peak_rate_rps == 0.5
    assert e.arrival_mix == "short-qa:3,structured:1"


def test_llamacpp_slots_example_equals_default() -> None:
    assert load_experiment(EXAMPLES / "llamacpp-slots.yaml") == default_experiment()


def test_cpu_engines_example() -> None:
    e = load_experiment(EXAMPLES / "cpu-engines.yaml")
    assert [type(c) for c in e.candidates] == [LlamaCppCandidate, VllmCandidate]
    assert e.candidates[1].model is None
    assert e.steps.concurrency == [1, 2, 4, 8, 16]
    assert e.candidates[1].settings.env["VLLM_CPU_KVCACHE_SPACE"] == "2"


@pytest.mark.parametrize("exp", ["default", "llamacpp-slots.yaml", "cpu-engines.yaml", "minimal"])
def test_round_trip(tmp_path: Path, exp: str) -> None:
    if exp == "default":
        e = default_experiment()
    elif exp == "minimal":
        e = load_experiment(write(tmp_path, MINIMAL, "minimal.yaml"))
    else:
        e = load_experiment(EXAMPLES / exp)
    p = write(tmp_path, e.to_yaml(), "round.yaml")
    assert load_experiment(p) == e
    # and through JSON (what the run folder's record embeds)
    assert Experiment.model_validate(json.loads(json.dumps(e.to_dict()))) == e


def test_minimal_file_defaults(tmp_path: Path) -> None:
    e = load_experiment(write(tmp_path, MINIMAL, "my exp.yaml"))
    assert e.name == "my-exp"  # from the file name
    assert isinstance(e.candidates[0], MockCandidate)
    assert e.candidates[0].settings.to_mock_config().itl_ms == 5
    assert e.candidates[1].settings.ctx_size == 8192
    assert e.goal.error_budget == 0.01 and e.goal.quality.structured_valid_min == 0.5
    assert e.goal.quality.samples_pass_min == 0.0
    assert (e.requests_per_step, e.warmup, e.seed, e.timeout_s, e.ignore_eos) == (8, 2, 0, 120, True)
    assert e.arrival_test.requests == 16 and e.arrival_mix == "short-qa:1,structured:1"


def test_slo_as_mapping_and_rates_steps(tmp_path: Path) -> None:
    e = load_experiment(
        write(
            tmp_path,
            """
        goal: {slo: {ttft_p95: 2s, itl_p95: 300ms, error_rate: 1%}}
        candidates: [{name: r, engine: url, url: "http://127.0.0.1:8000/v1/", model_name: m, api_key_env: KEY}]
        workloads: [short-qa, {name: mix, set: {ratio: "short-qa:1,rag:1"}}]
        steps: {rates: [0.5, 1, 2], arrival: gamma, max_concurrency: 8}
        arrival_test: {enabled: false}
    """,
        )
    )
    assert [o.name for o in e.goal.objectives] == ["ttft_p95<=2s", "itl_p95<=0.3s", "error_rate<=1%"]
    c = e.candidates[0]
    assert isinstance(c, UrlCandidate) and c.url == "http://127.0.0.1:8000/v1" and not c.launched
    assert [m.label for m in e.steps.load_models(burstiness=0.25)] == ["r0.5", "r1", "r2"]
    assert e.steps.load_models(0.25)[0].gamma_shape == 0.25


def test_relative_paths_resolve_against_the_file(tmp_path: Path) -> None:
    sub = tmp_path / "exp"
    sub.mkdir()
    (sub / "m.gguf").write_bytes(b"GGUF")
    (sub / "d.jsonl").write_text('{"prompt": "hi"}\n')
    e = load_experiment(
        write(
            sub,
            """
        candidates: [{name: a, engine: llamacpp, model: m.gguf}]
        workloads: [{dataset: d.jsonl}]
        arrival_test: {enabled: false}
    """,
        )
    )
    assert e.candidates[0].model == str(sub / "m.gguf")
    assert e.workloads[0].dataset == str(sub / "d.jsonl") and e.workloads[0].label == "dataset:d.jsonl"


# ---------------------------------------------------------------------------------------------------
# bad input: one line, the exact field path, the fix


def test_unknown_engine(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1].update(engine="vlm")))
    assert msg.startswith("candidates[1].engine: 'vlm' is not one of llamacpp, vllm, url, mock"), msg
    assert "did you mean 'vllm'" in msg


def test_missing_engine(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][0].pop("engine")))
    assert msg.startswith("candidates[0].engine: required field is missing; use one of llamacpp"), msg


def test_typo_field_suggests(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1]["settings"].update(paralel=2)))
    assert msg == "candidates[1].settings.paralel: unknown field (did you mean 'parallel'?)", msg


def test_typo_top_level_and_goal(tmp_path: Path) -> None:
    assert (
        error_of(tmp_path, MINIMAL + "request_per_step: 4\n")
        == "request_per_step: unknown field (did you mean 'requests_per_step'?)"
    )
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(quality={"structured_valid_mni": 1})))
    assert msg == "goal.quality.structured_valid_mni: unknown field (did you mean 'structured_valid_min'?)"


def test_unknown_field_without_close_match_lists_valid(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path, mutate(MINIMAL, lambda d: d["goal"]["budget"] if False else d["goal"].update(budget={"zzz": 1}))
    )
    assert msg == "goal.budget.zzz: unknown field (valid: max_minutes, price_per_hour, currency)"


def test_url_candidate_rejects_settings(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path,
        """
        candidates: [{name: r, engine: url, url: "http://x:1/v1", settings: {parallel: 4}}]
        arrival_test: {enabled: false}
    """,
    )
    assert msg.startswith("candidates[0].settings.parallel: unknown field"), msg


def test_bad_slo(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(slo="ttft<=fast")))
    assert msg.startswith("goal.slo: invalid SLO 'ttft<=fast'"), msg
    assert "METRIC_STAT<=VALUE" in msg


def test_bad_slo_mapping(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(slo={"ttfb_p95": "2s"})))
    assert msg.startswith("goal.slo: invalid SLO 'ttfb_p95<=2s': unknown metric 'ttfb'"), msg


def test_unknown_workload(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "workloads: [short-qa, short_qa]\n")
    assert msg.startswith("workloads[1].name: unknown workload 'short_qa' (did you mean 'short-qa'?)"), msg


def test_bad_workload_override(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "workloads: [{name: short-qa, set: {output_tokns: 5}}]\n")
    assert msg.startswith("workloads[0]: set: unknown workload parameter(s) output_tokns"), msg


def test_missing_model_path(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1].update(model="nope/model.gguf")))
    assert msg.startswith("candidates[1].model: model path 'nope/model.gguf' does not exist"), msg
    assert str(tmp_path / "nope" / "model.gguf") in msg


def test_bad_env_name(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path,
        """
        candidates: [{name: a, engine: vllm, settings: {env: {1X: a}}}]
        arrival_test: {enabled: false}
    """,
    )
    assert msg.startswith("candidates[0].settings.env.1X: '1X' does not match"), msg


def test_missing_dataset(tmp_path: Path) -> None:
    msg = error_of(tmp_path, MINIMAL + "workloads: [{dataset: none.jsonl}]\n")
    assert msg.startswith("workloads[0].dataset: dataset 'none.jsonl' does not exist"), msg


def test_duplicate_names(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1].update(name="a")))
    assert msg.startswith("candidates[1].name: duplicate name 'a' (also candidates[0])"), msg


def test_bad_candidate_name(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][0].update(name="a b")))
    assert msg.startswith("candidates[0].name: 'a b' does not match"), msg


def test_bad_values(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1]["settings"].update(parallel=0)))
    assert msg.startswith("candidates[1].settings.parallel: input should be greater than or equal to 1, got 0"), msg
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][0]["settings"].update(dialect="vlm")))
    assert msg.startswith("candidates[0].settings.dialect: 'vlm' is not one of vllm, sglang, tgi, llamacpp, ollama")
    msg = error_of(
        tmp_path, mutate(MINIMAL, lambda d: d["candidates"][0]["settings"].update(fail_http_rate=0.6, cut_rate=0.6))
    )
    assert msg.startswith("candidates[0].settings: fail_http_rate + stream_error_rate"), msg
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][0]["settings"].update(invalid_json="maybe")))
    assert msg.startswith("candidates[0].settings.invalid_json: input should be a valid boolean"), msg


def test_url_candidate_needs_http_url(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path,
        """
        candidates: [{name: r, engine: url, url: "localhost:8000"}]
        arrival_test: {enabled: false}
    """,
    )
    assert msg.startswith("candidates[0].url: 'localhost:8000' is not an http(s) URL"), msg
    msg = error_of(
        tmp_path,
        """
        candidates: [{name: r, engine: url}]
        arrival_test: {enabled: false}
    """,
    )
    assert msg == "candidates[0].url: required field is missing; add it"


def test_steps_errors(tmp_path: Path) -> None:
    assert error_of(tmp_path, MINIMAL + "steps: {concurrency: [1, 4, 2]}\n").startswith(
        "steps: steps must be strictly increasing"
    )
    assert error_of(tmp_path, MINIMAL + "steps: {concurrency: [1], rates: [1]}\n").startswith(
        "steps: give exactly one of concurrency"
    )
    assert error_of(tmp_path, MINIMAL + "steps: {concurrency: [1, 0]}\n").startswith(
        "steps.concurrency[1]: input should be greater than or equal to 1"
    )


def test_arrival_rate_required(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].pop("expected_rate_rps")))
    assert msg.startswith("goal.expected_rate_rps: required when arrival_test.enabled is true"), msg


def test_bad_mix(tmp_path: Path) -> None:
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(mix="short-qa:3,chat:1")))
    assert msg.startswith("goal.mix: bad ratio"), msg


def test_sample_errors(tmp_path: Path) -> None:
    msg = error_of(
        tmp_path,
        mutate(MINIMAL, lambda d: d["goal"].update(quality={"samples": [{"prompt": "x", "expect_regex": "("}]})),
    )
    assert msg.startswith("goal.quality.samples[0].expect_regex: invalid regex '('"), msg
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(quality={"samples": [{"prompt": "x"}]})))
    assert msg.startswith("goal.quality.samples[0]: give a check"), msg


def test_several_errors_counted(tmp_path: Path) -> None:
    text = mutate(MINIMAL, lambda d: (d["candidates"][1]["settings"].update(paralel=2), d.update(warmup=-1)))
    msg = error_of(tmp_path, text)
    assert msg.startswith("candidates[1].settings.paralel: unknown field") and msg.endswith("(+1 more)"), msg


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such experiment file"):
        load_experiment(tmp_path / "nope.yaml")


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "goal:\n  slo: x\n candidates: [\n")
    assert msg.startswith("line 3 column "), msg
    assert "invalid YAML" in msg


@pytest.mark.parametrize(
    "text,start",
    [
        ("", "the file is empty"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("goal: 5\ncandidates: []\n", "goal: expected a mapping"),
        ("goal: {}\n", "candidates: required field is missing"),
        ("candidates: []\n", "candidates: needs at least 1 item, got 0"),
    ],
)
def test_shape_errors(tmp_path: Path, text: str, start: str) -> None:
    assert error_of(tmp_path, text).startswith(start)


def test_cli_prints_one_line(tmp_path: Path) -> None:
    p = write(tmp_path, mutate(MINIMAL, lambda d: d["candidates"][1].update(engine="vlm")))
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", "--check", str(p)], capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert "candidates[1].engine: 'vlm' is not one of" in r.stderr


def test_cli_check_prints_the_experiment_back(tmp_path: Path) -> None:
    p = write(tmp_path, MINIMAL)
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", "--check", str(p)], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.returncode == 0, r.stderr
    assert load_experiment(p) == Experiment.model_validate(yaml.safe_load(r.stdout))
    assert not (tmp_path / "runs").exists()  # nothing was started, no run folder made


# ---------------------------------------------------------------------------------------------------
# JSON Schema


def test_schema_file_is_up_to_date() -> None:
    committed = json.loads(S.SCHEMA_PATH.read_text(encoding="utf-8"))
    assert committed == json_schema(), "run: servelab schema write"


def test_schema_validates_the_examples() -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    for f in ("llamacpp-slots.yaml", "cpu-engines.yaml"):
        v.validate(yaml.safe_load((EXAMPLES / f).read_text()))
    v.validate(default_experiment().to_dict())
    bad = yaml.safe_load((EXAMPLES / "llamacpp-slots.yaml").read_text())
    bad["candidates"][0]["settings"]["paralel"] = 1
    assert not v.is_valid(bad)


def test_launch_settings_and_kwargs(tmp_path: Path) -> None:
    import dataclasses

    from servelab.engines.mock import MockConfig

    e = load_experiment(write(tmp_path, MINIMAL + "    \n"))
    mock, llama = e.candidates
    st = mock.launch_settings()
    assert "port" not in st and "crash_after_requests" not in st  # None left out: launcher defaults
    assert set(st) <= {f.name for f in dataclasses.fields(MockConfig)}
    assert mock.launch_kwargs() == {"ready_timeout_s": 60.0}  # the mock kind's own default
    assert llama.launch_settings() == {"parallel": 4, "ctx_size": 8192, "extra_args": []}
    assert llama.launch_kwargs() == {"ready_timeout_s": 300.0}
    d = yaml.safe_load(MINIMAL)
    d["candidates"][1]["settings"].update(port=18080, threads=2)
    llama = load_experiment(write(tmp_path, yaml.safe_dump(d))).candidates[1]
    assert llama.launch_kwargs()["port"] == 18080 and llama.launch_settings()["threads"] == 2


# ---------------------------------------------------------------------------------------------------
# settings a launcher would refuse are refused when the file loads (one Settings model per engine kind)

VLLM = """
goal: {expected_rate_rps: 0.5}
candidates:
  - {name: a, engine: mock}
  - {name: v, engine: vllm, settings: {max_num_seqs: 4}}
"""


@pytest.mark.parametrize(
    "setting, value, problem",
    [
        ("dtype", "half", "'half' is vLLM's alias of float16; write dtype: float16"),
        ("dtype", "float", "'float' is vLLM's alias of float32; write dtype: float32"),
        ("max_model_len", 8, "input should be greater than or equal to 16, got 8"),
        ("extra_args", "--seed 7", "expected a list, got str '--seed 7'"),
    ],
)
def test_vllm_settings_the_launcher_refuses_are_refused_at_validation(
    tmp_path: Path, setting: str, value: object, problem: str
) -> None:
    from servelab.engines.vllm import VllmLauncher

    msg = error_of(tmp_path, mutate(VLLM, lambda d: d["candidates"][1]["settings"].update({setting: value})))
    assert msg.startswith(f"candidates[1].settings.{setting}: {problem}"), msg
    with pytest.raises(ConfigError):  # the launcher reads the same model: it refuses the same value
        VllmLauncher(settings={setting: value})


def test_settings_models_are_the_launchers_own() -> None:
    from servelab.engines import llamacpp, url, vllm
    from servelab.engines.mock import launch as mocklaunch

    settings = {
        c: c.model_fields["settings"].annotation
        for c in (LlamaCppCandidate, VllmCandidate, UrlCandidate, MockCandidate)
    }
    assert settings[LlamaCppCandidate] is llamacpp.LlamaCppSettings and settings[VllmCandidate] is vllm.VllmSettings
    assert settings[MockCandidate] is mocklaunch.MockSettings and settings[UrlCandidate] is url.UrlSettings
    assert S.ENGINES == ("llamacpp", "vllm", "url", "mock", "command")
    for cls, kind in (
        (LlamaCppCandidate, "llamacpp"),
        (VllmCandidate, "vllm"),
        (UrlCandidate, "url"),
        (MockCandidate, "mock"),
    ):
        assert cls is candidate_model(kind)


def test_mock_settings_follow_mock_config() -> None:
    """MockConfig (the mock server's own config) is the one definition of the mock's settings."""
    import dataclasses

    from servelab.engines.mock import MockConfig

    names = {f.name for f in dataclasses.fields(MockConfig)} - {"host", "port"}
    from servelab.engines.mock.launch import MockSettings

    assert names | {"port", "ready_timeout_s"} == set(MockSettings.model_fields)
    props = json_schema()["$defs"]["MockSettings"]["properties"]
    assert props["hang_rate"]["maximum"] == 1 and props["tokens_per_chunk"]["minimum"] == 1


def test_quality_structured_requests_is_a_field(tmp_path: Path) -> None:
    e = load_experiment(
        write(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(quality={"structured_requests": 3})))
    )
    assert e.goal.quality.structured_requests == 3
    msg = error_of(tmp_path, mutate(MINIMAL, lambda d: d["goal"].update(quality={"structured_requests": 0})))
    assert msg.startswith("goal.quality.structured_requests: input should be greater than or equal to 1"), msg


def test_model_a_kind_cannot_use_is_refused_at_load(tmp_path: Path) -> None:
    """`model` for the mock (its model is named in settings) and a non-GGUF file for a url candidate
    (a copy of the served weights) are refused when the file loads, with the field path."""
    (tmp_path / "notes.txt").write_text("not weights")
    msg = error_of(
        tmp_path,
        """
        goal: {expected_rate_rps: 1}
        candidates:
          - {name: a, engine: mock, model: notes.txt}
        """,
    )
    assert msg.startswith("candidates[0].model: engine 'mock' takes no model file"), msg
    msg = error_of(
        tmp_path,
        """
        goal: {expected_rate_rps: 1}
        candidates:
          - {name: a, engine: url, url: "http://127.0.0.1:9/v1", model: notes.txt}
        """,
    )
    assert msg.startswith("candidates[0].model: 'notes.txt' is not a GGUF file"), msg
    folder = tmp_path / "hf"
    folder.mkdir()
    e = load_experiment(
        write(
            tmp_path,
            """
        goal: {expected_rate_rps: 1}
        candidates:
          - {name: a, engine: url, url: "http://127.0.0.1:9/v1", model: hf}
        """,
        )
    )
    assert e.candidates[0].model == str(folder)
