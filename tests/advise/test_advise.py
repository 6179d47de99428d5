"""`servelab advise`: candidate order and reasons, exclusions with reasons, the 000 §5 checklist, the
capacity plan and the trial experiment it writes — for six service cases and bad input."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servelab.advise import advise, parse_tokens, resolve_task, write_experiment
from servelab.catalog import find_engine
from servelab.trial.spec import load_experiment
from servelab.wire.errors import ConfigError


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "servelab.cli", *args], capture_output=True, text=True, timeout=180)


def names(items):
    return [x.engine.name for x in items]


def excluded(adv, name):
    return next(e for e in adv.excluded if e.engine.name == name)


# ------------------------------------------------------------------------------------ acceptance


def test_acceptance_chat_qwen3_32b_on_two_h100(tmp_path):
    out = tmp_path / "qwen.yaml"
    r = run(
        "advise",
        "--task",
        "chat",
        "--model",
        "Qwen3-32B",
        "--hardware",
        "H100-80GB:2",
        "--context",
        "32k",
        "--concurrency",
        "64",
        "--write-experiment",
        str(out),
    )
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for section in (
        "candidates, in evaluation order",
        "excluded",
        "000 §5 exact-combination checklist",
        "capacity plan",
        "experiment written",
    ):
        assert section in text, section
    assert text.index("vLLM") < text.index("TensorRT-LLM")
    # the experiment validates with the trial's own loader and lists the first candidates in order
    exp = load_experiment(out)
    assert [c.name for c in exp.candidates] == ["vllm", "sglang", "tensorrt-llm"]
    assert all(c.engine == "url" for c in exp.candidates)  # servelab's launchers are CPU builds
    assert len({c.url for c in exp.candidates}) == 3
    assert exp.steps.concurrency == [1, 2, 4, 8, 16, 32, 64]
    body = out.read_text(encoding="utf-8")
    assert "vllm serve Qwen/Qwen3-32B --tensor-parallel-size 2 --max-model-len 32768 --port 8000" in body
    assert "# - " in body  # lower-order candidates are written commented out
    assert "does NOT start" in body.splitlines()[3]  # header says url candidates need an external launch


def test_chat_qwen_meaning():
    adv = advise("chat", "Qwen3-32B", "H100-80GB:2", "32k", 64)
    order = names(adv.candidates)
    assert order[:2] == ["vllm", "sglang"]  # 000 §1 row 1 primary routes
    assert adv.candidates[0].tier == "primary" and "000 §1" in adv.candidates[0].reasons[0]
    assert order.index("tensorrt-llm") < order.index("transformers") < order.index("llama.cpp")
    # TGI: excluded for new platforms, with the lifecycle reason, date and source
    tgi = excluded(adv, "tgi")
    assert tgi.category == "lifecycle"
    assert "not for new platforms" in tgi.reasons[0] and "2026-03-21" in tgi.reasons[0]
    assert "github.com/huggingface/text-generation-inference" in tgi.reasons[0]
    assert excluded(adv, "mlx-lm").category == "platform"  # Metal only
    assert excluded(adv, "ds4").category == "model"  # built for DeepSeek V4 only
    assert excluded(adv, "faster-whisper").category == "modality"
    # the serving-platform layer is listed apart, not as candidates
    assert {n.engine.name for n in adv.platform_layer} == {"dynamo", "ray-serve", "triton-server"}
    assert not {"dynamo", "ray-serve", "triton-server"} & set(order)
    # checklist: seven 000 §5 rows, facts carry sources
    assert [i.key for i in adv.checklist] == [
        "architecture",
        "precision",
        "model-card",
        "openai-api",
        "context",
        "modality",
        "install",
    ]
    arch = adv.checklist[0]
    assert arch.known[0].source.startswith("https://huggingface.co/Qwen/")
    assert any("docs.vllm.ai" in v for v in arch.verify)
    assert adv.checklist[-1].status == "verify"
    # capacity plan (servelab.plan): 64 sequences x 32,768 tokens of Qwen3-32B KV (64 layers x 8 KV heads x
    # 128 x K+V x 2 B = 256 KiB/token -> 512 GiB) cannot sit in 2 x 80 GiB: the plan and the checklist say so
    assert adv.plan is not None and adv.plan["fits"] is False
    ctx = next(i for i in adv.checklist if i.key == "context")
    assert any("does NOT fit" in f.text for f in ctx.known)


# ------------------------------------------------------------------------------------ five more cases


def test_deepseek_moe_on_eight_h200():
    adv = advise("chat", "deepseek-v3", "H200:8", "64k", 32)
    assert names(adv.candidates)[:2] == ["vllm", "sglang"]
    assert "EP" in " ".join(adv.candidates[0].reasons)  # MoE across 8 GPUs: expert parallelism documented
    assert adv.request.weight_precision == "fp8"  # the published dtype
    prec = next(i for i in adv.checklist if i.key == "precision")
    assert any("H200 has a fp8 tensor/matrix path" in f.text for f in prec.known)
    arch = adv.checklist[0]
    assert "MLA" in arch.known[0].text and any("GQA KV formula" in v for v in arch.verify)
    assert excluded(adv, "ds4").category == "model"
    kt = next(c for c in adv.candidates if c.engine.name == "ktransformers")
    assert kt.tier == "other"  # a workstation route, not for a data-centre node


def test_deepseek_fp8_on_a100_says_no_fp8_path():
    adv = advise("chat", "deepseek-v3", "A100-80GB:8", "8k", 4, with_plan=False)
    prec = next(i for i in adv.checklist if i.key == "precision")
    assert any("states no fp8 rate" in f.text for f in prec.known)


def test_gemma_on_laptop_cpu(tmp_path):
    adv = advise("chat", "gemma-3-270m", "laptop-cpu", "8k", 4)
    order = names(adv.candidates)
    assert order[:2] == ["llama.cpp", "ollama"]  # single-machine row first (000 §1 row 6)
    assert adv.request.is_local
    assert order.index("llama.cpp") < order.index("vllm")
    for name in ("tensorrt-llm", "lmdeploy-turbomind", "ktransformers", "mlx-lm"):
        assert excluded(adv, name).category == "platform", name
    exp = load_experiment(write_experiment(adv, str(tmp_path / "gemma.yaml")))
    first = exp.candidates[0]
    assert first.engine == "llamacpp" and first.model is None  # the built-in Gemma 3 270M GGUF
    # llama-server's -c is shared by the slots: 8k per sequence x 4 slots
    assert first.settings.parallel == 4 and first.settings.ctx_size == 8192 * 4
    vllm = next(c for c in exp.candidates if c.name == "vllm")
    assert vllm.engine == "vllm" and vllm.model is None  # servelab's vLLM-CPU launcher, built-in weights
    assert adv.plan is not None and adv.plan["fits"] is True  # a 270M model in 32 GiB
    # the file runs as written on this machine: servers servelab cannot start (Ollama, SGLang ...) would
    # stop the trial at their url, so they are there commented out, with their start command
    assert [c.engine for c in exp.candidates] == ["llamacpp", "vllm"]
    body = (tmp_path / "gemma.yaml").read_text(encoding="utf-8")
    assert '  # - {"name": "ollama", "engine": "url"' in body and "then uncomment to include" in body


def test_start_commands_follow_the_engines_rules():
    # llama-server -c is the KV context shared by all -np slots: 32k per request x 64 slots
    adv = advise("chat", "Qwen3-32B", "H100-80GB:2", "32k", 64)
    llama = next(c for c in adv.candidates if c.engine.name == "llama.cpp")
    assert f"-c {32768 * 64} -np 64" in llama.serve_command
    # 6 GPUs: TP6 does not divide Qwen3-32B's 64 heads; the vLLM command uses the plan's TP2 x DP3
    adv6 = advise("chat", "Qwen3-32B", "H100-80GB:6", "8k", 8)
    vllm = next(c for c in adv6.candidates if c.engine.name == "vllm")
    assert "--tensor-parallel-size 2 " in vllm.serve_command and "--data-parallel-size 3" in vllm.serve_command
    assert adv6.plan["layout"]["tp"] == 2 and adv6.plan["layout"]["dp"] == 3


def test_gemma_4b_on_laptop_needs_external_launch(tmp_path):
    adv = advise("edge", "gemma-3-4b", "laptop", "4k", 1)
    exp = load_experiment(write_experiment(adv, str(tmp_path / "g4.yaml")))
    assert exp.candidates[0].name == "llama.cpp" and exp.candidates[0].engine == "url"  # no local GGUF given


def test_apple_local_puts_the_row_6_engines_first():
    # 000 §1 row 6: llama.cpp / MLX-LM / the model's native engine; Ollama (a wrapper, 000 §4.3) after them
    order = names(advise("chat", "qwen3-30b-a3b", "M4-Max", "8k", 2, local=True).candidates)
    assert order[:3] == ["llama.cpp", "mlx-lm", "ollama"]
    # vLLM runs on Apple silicon through the vLLM-Metal plugin (docs.vllm.ai installation page): after them
    assert order[3] == "vllm"


def test_openai_api_constraint_excludes_libraries():
    adv = advise("chat", "gemma-3-1b", "laptop-cpu", "4k", 1, openai_api=True)
    e = excluded(adv, "onnxruntime-genai")
    assert e.category == "feature" and "OpenAI-compatible API" in e.reasons[0]
    assert "onnxruntime-genai" in names(advise("chat", "gemma-3-1b", "laptop-cpu", "4k", 1).candidates)


def test_embedding_model(tmp_path):
    adv = advise("embedding", "qwen3-embedding-8b", "L40S", "8k", 32)
    assert names(adv.candidates)[:2] == ["tei", "vllm-pooling"]  # 000 §1 row 5
    assert excluded(adv, "vllm").category == "modality"  # chat vLLM returns text, not vectors
    assert excluded(adv, "tgi").category == "modality"
    # SGLang serves embedding models (--is-embedding, docs.sglang.io embedding_models): a candidate, not
    # excluded, but after the engines 000 §1 row 5 names
    sg = next(c for c in adv.candidates if c.engine.name == "sglang")
    assert sg.tier == "other" and names(adv.candidates).index("sglang") > names(adv.candidates).index("vllm-pooling")
    # an embeddings trial of the servers servelab cannot start here (a GPU): url candidates, active
    exp = load_experiment(write_experiment(adv, str(tmp_path / "emb.yaml")))
    assert exp.goal.task_kind == "embeddings" and [c.engine for c in exp.candidates] == ["url"] * 3
    assert [c.name for c in exp.candidates][:2] == ["tei", "vllm-pooling"]
    text = (tmp_path / "emb.yaml").read_text()
    assert "text-embeddings-router --model-id" in text and "--runner pooling" in text
    rr = advise("asr", "whisper-large-v3", "L4", "30k", 8)  # speech still has no trial
    with pytest.raises(ConfigError, match="servelab trial measures OpenAI chat completions"):
        write_experiment(rr, str(tmp_path / "asr.yaml"))


def test_whisper_asr_excludes_text_only_engines():
    adv = advise("asr", "whisper-large-v3", "L4", "30k", 8)
    order = names(adv.candidates)
    assert set(order[:2]) == {"faster-whisper", "whisper.cpp"}  # dedicated Whisper routes (000 §1 row 4, §4.4)
    assert order.index("sglang-omni") > 1 and order.index("vllm-omni") > 1
    from servelab.catalog import load_engines

    for eng in load_engines():
        if "audio" not in eng.input_modalities and eng.model_scope != "backend":
            e = excluded(adv, eng.name)
            assert e.category == "modality" and "audio in" in e.reasons[0], eng.name
    # faster-whisper would be excluded for a non-Whisper ASR model family (scope check)
    assert find_engine("faster-whisper").model_families == ["whisper"]


def test_video_generation():
    adv = advise("video-gen", "wan2.1-t2v-14b", "H200:1", "32k", 1)
    order = names(adv.candidates)
    assert order[:2] == ["sglang-diffusion", "vllm-omni"]  # 000 §1 row 3
    assert "fastvideo" in order and order[-1] == "diffusers"  # Wan has a FastVideo route; Diffusers = baseline
    e = excluded(adv, "vllm")
    assert e.category == "modality" and "video out" in e.reasons[0]  # understanding video != generating it
    mod = next(i for i in adv.checklist if i.key == "modality")
    assert "generation" in mod.known[0].text and mod.verify


# ------------------------------------------------------------------------------------ output forms


def test_json_output():
    r = run(
        "advise",
        "--task",
        "tools",
        "--model",
        "qwen3-8b",
        "--hardware",
        "L40S",
        "--context",
        "16k",
        "--concurrency",
        "8",
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["request"]["task"] == "agent" and "tool_calling" in d["request"]["required_features"]
    assert d["candidates"][0]["engine"] == "vllm" and d["candidates"][0]["source"].startswith("https://")
    assert any(x["engine"] == "tgi" and x["category"] == "lifecycle" for x in d["excluded"])
    assert len(d["checklist"]) == 7 and "plan" in d


# ------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--model", "Qwen3-33B", "--hardware", "H100-80GB:2"], "did you mean"),
        (["--model", "Qwen3-32B", "--hardware", "H100-80G:2"], "did you mean H100-80GB-SXM"),
        (["--model", "Qwen3-32B", "--hardware", "H100-80GB:two"], "whole number"),
        (["--model", "Qwen3-32B", "--hardware", "H100-80GB:2:1"], "NAME[:COUNT]"),
        (["--model", "Qwen3-32B", "--hardware", "H100", "--context", "32q"], "--context"),
        (["--model", "Qwen3-32B", "--hardware", "H100", "--concurrency", "0"], "--concurrency"),
        (["--model", "whisper-large-v3", "--hardware", "H100"], "not for --task chat"),
    ],
)
def test_bad_input_is_one_line(args, needle):
    r = run("advise", "--task", "chat", *args)
    assert r.returncode == 2, (r.stdout, r.stderr)
    err = r.stderr.strip()
    assert err.startswith("servelab: error:") and needle in err and "\n" not in err and "Traceback" not in err


def test_unknown_task_suggests():
    with pytest.raises(ConfigError, match="did you mean chat"):
        resolve_task("chta")


@pytest.mark.parametrize("text,n", [("32k", 32768), ("32K", 32768), ("1m", 1048576), ("4096", 4096), (512, 512)])
def test_parse_tokens(text, n):
    assert parse_tokens(text) == n


def test_gemma_cpu_plan_uses_the_gguf_servelab_launches():
    """llama.cpp is the first candidate and servelab launches the built-in Q4_K_M GGUF, so the plan counts
    that file's tensors (~235 MiB), not bf16 weights (~511 MiB)."""
    adv = advise("chat", "gemma-3-270m", "cpu-host", "2k", 4, local=True)
    llm = adv.plan["llamacpp"]
    assert llm["model_bytes"] < 300 * 2**20
    assert llm["kv_base_mib"] == 24.0 and llm["kv_swa_mib"] == 60.0  # what llama-server logs at -c 8192 -np 4
