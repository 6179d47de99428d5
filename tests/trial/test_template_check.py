"""The chat-template check against the real llama-server started with the right, a wrong and no
template, and against a server that cannot show its prompt (the mock)."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja2 import TemplateError

from servelab.engines.llamacpp import LlamaCppLauncher
from servelab.engines.vllm import GEMMA_CHAT_TEMPLATE
from servelab.trial.template_check import CONVERSATIONS, check_template, render_template, template_family


def test_render_follows_transformers_conventions() -> None:
    src = (
        "{% for m in messages %}{{ m.role }}:{{ m.content | tojson }}\n{% endfor %}"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    out = render_template(src, [{"role": "user", "content": "中文"}])
    assert out == 'user:"中文"\nA:'  # trim_blocks drops the newline after a block; tojson keeps non-ASCII
    with pytest.raises(TemplateError, match="no system"):
        render_template("{{ raise_exception('no system role') }}", [])


def test_gemma_reference_renders_the_turn_markers() -> None:
    out = render_template(GEMMA_CHAT_TEMPLATE, CONVERSATIONS["system_user"], bos_token="<bos>")
    assert out.startswith("<bos><start_of_turn>user\nAnswer in one word.\n\n")
    assert out.endswith("<start_of_turn>model\n")
    assert template_family(out) == "gemma" and template_family("<|im_start|>user") == "chatml"


@pytest.fixture(scope="module")
def gemma_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("tpl") / "gemma.jinja"
    p.write_text(GEMMA_CHAT_TEMPLATE, encoding="utf-8")
    return p


def _check(extra: list[str], reference: str | None) -> object:
    with LlamaCppLauncher(parallel=1, ctx_size=2048, extra_args=extra).start() as eng:
        return check_template(eng.base_url, "m", reference, bos_token="<bos>", eos_token="<eos>")


def test_right_template_is_equal(gemma_file: Path) -> None:
    got = _check(["--chat-template-file", str(gemma_file)], GEMMA_CHAT_TEMPLATE)
    assert got.verdict == "equal", got
    assert [c.verdict for c in got.comparisons] == ["equal"] * len(CONVERSATIONS)


def test_wrong_template_is_different() -> None:
    got = _check(["--chat-template", "chatml"], GEMMA_CHAT_TEMPLATE)
    assert got.verdict == "different" and got.served_family == "chatml" and got.reference_family == "gemma"
    first = got.comparisons[0]
    assert first.first_diff == 1 and first.expected.startswith("<start_of_turn>")
    assert first.served.startswith("<|im_start|>")
    assert "differs" in got.note


def test_no_template_names_the_fallback() -> None:
    """The default Gemma 3 270M GGUF is a base model without a template: llama-server falls back to ChatML."""
    got = _check([], None)
    assert got.verdict == "fallback" and got.reference is None
    assert got.served_family == "chatml" and "no chat template" in got.note and "chatml" in got.note
    assert got.server_template_source and "<|im_start|>" in got.server_template_source


def test_server_without_a_rendering_endpoint(mock_engine) -> None:
    mp = mock_engine("--dialect", "sglang")
    got = check_template(mp.base_url, "mock", GEMMA_CHAT_TEMPLATE, bos_token="<bos>")
    assert got.verdict == "unknown" and all(c.verdict == "unknown" for c in got.comparisons)
    assert "no endpoint" in got.note
