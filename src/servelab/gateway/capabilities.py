"""Request checks done before anything reaches an engine: body shape, bounds, and the model's declared
capabilities (tools, JSON schema, images/audio, context length, embeddings).

Each refusal is a :class:`~servelab.gateway.errors.GatewayError` 400 (OpenAI shape) whose message says what
the model supports, e.g. ``model 'gemma' does not accept tools; it supports: text input, JSON-schema
output, 8192-token context``, and names the request field in ``param``.

Prompt size before tokenization (:func:`estimate_prompt_tokens`) is a deliberate *under*-estimate:
UTF-8 bytes of the prompt text / :data:`BYTES_PER_TOKEN_MAX` (6), plus :data:`TOKENS_PER_MESSAGE` per chat
message. Common BPE tokenizers average ~4 characters per token on English text, ~3 on code and under 1
character (3 UTF-8 bytes) per token on CJK text (rule of thumb and tiktoken examples in
https://chipp.ai/ai/glossary/tokens and https://tonyx1998.github.io/modern-ai-engineer-guide/docs/foundations/tokens,
both checked 2026-11-30), so 6 bytes per token stays below the true count for natural text and code. The gateway
therefore only refuses prompts that cannot fit under any common tokenizer; a prompt near the limit goes to
the engine, whose own context error (docs/engine-wire.md case 18) is normalised to the same 400
``context_length_exceeded``. The same estimate is the prompt part of the token reservation that limits
admit; the reservation is settled with the engine's reported usage afterwards.
"""

from __future__ import annotations

from typing import Any

from servelab.gateway.config import Capabilities, ModelEntry
from servelab.gateway.errors import GatewayError, bad_request
from servelab.gateway.lengths import LengthRequest, read_lengths

__all__ = [
    "BYTES_PER_TOKEN_MAX",
    "TOKENS_PER_MESSAGE",
    "check_depth",
    "check_request",
    "estimate_prompt_tokens",
    "prompt_text",
    "supported_summary",
    "validate_request",
    "validate_shape",
]

#: Upper bound on UTF-8 bytes per token assumed by :func:`estimate_prompt_tokens` (see module doc).
BYTES_PER_TOKEN_MAX = 6
#: Chat-template tokens counted per message (role markers); 1 keeps the estimate a lower bound.
TOKENS_PER_MESSAGE = 1

ENDPOINTS = ("chat", "completions", "embeddings", "rerank")
#: endpoints whose answer is computed from the input alone (no generated tokens, no output bound)
POOLED = frozenset({"embeddings", "rerank"})


def rerank_documents(body: dict[str, Any]) -> list[str]:
    """The texts of a rerank request's ``documents`` (strings, or ``{"text": ...}`` objects as Cohere and
    vLLM accept); anything else is skipped (:func:`validate_request` refuses it first)."""
    docs = body.get("documents")
    out: list[str] = []
    for d in docs if isinstance(docs, list) else ():
        t = d.get("text") if isinstance(d, dict) else d
        if isinstance(t, str):
            out.append(t)
    return out


def _ntok(text: str) -> int:
    return -(-len(text.encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN_MAX)


def _texts(endpoint: str, body: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if endpoint == "chat":
        for m in body.get("messages") or ():
            if not isinstance(m, dict):
                continue
            c = m.get("content")
            if isinstance(c, str):
                out.append(c)
            elif isinstance(c, list):
                for part in c:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        out.append(part["text"])
        tools = body.get("tools")
        if isinstance(tools, list):  # tool schemas are part of the prompt on every engine's template
            import orjson

            out.append(orjson.dumps(tools).decode())
        return out
    if endpoint == "rerank":
        q = body.get("query")
        return ([q] if isinstance(q, str) else []) + rerank_documents(body)
    key = "prompt" if endpoint == "completions" else "input"
    p = body.get(key)
    if isinstance(p, str):
        out.append(p)
    elif isinstance(p, list):
        out.extend(x for x in p if isinstance(x, str))
    return out


#: constrained-decoding fields refused when the model's ``json_schema`` capability is false (besides
#: ``response_format`` json_schema/json_object): vLLM ``guided_json``/``guided_regex``/``guided_choice``/
#: ``guided_grammar`` and ``structured_outputs`` (https://docs.vllm.ai/en/latest/features/structured_outputs.html),
#: llama.cpp ``grammar``/``json_schema`` (tools/server/README.md), SGLang ``regex``/``ebnf``/``json_schema``
#: (docs/sampling_params.md), TGI ``grammar`` (checked 2026-12-01)
CONSTRAINED_FIELDS = (
    "json_schema",
    "grammar",
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "regex",
    "ebnf",
)


def prompt_text(endpoint: str, body: dict[str, Any]) -> str:
    """The prompt's text (chat message texts joined by newlines, or the prompt/input strings): what an
    access log may show when a tenant sets ``log_prompts``."""
    return "\n".join(_texts(endpoint, body))


def estimate_prompt_tokens(endpoint: str, body: dict[str, Any]) -> int:
    """A lower-bound estimate of the prompt's tokens (see module doc): ``ceil(bytes / 6)`` of all text
    (+1 per chat message; token-id prompts count one per id). Never raises on odd shapes."""
    if endpoint == "rerank":  # each document is scored with the query: the query counts once per document
        q = body.get("query")
        docs = rerank_documents(body)
        return (_ntok(q) if isinstance(q, str) else 0) * len(docs) + sum(_ntok(d) for d in docs)
    n = 0
    for t in _texts(endpoint, body):
        n += _ntok(t)
    if endpoint == "chat":
        msgs = body.get("messages")
        if isinstance(msgs, list):
            n += TOKENS_PER_MESSAGE * len(msgs)
    else:
        p = body.get("prompt" if endpoint == "completions" else "input")
        if isinstance(p, list) and p and isinstance(p[0], int):
            n += len(p)  # a prompt given as token ids
        elif isinstance(p, list) and p and isinstance(p[0], list):
            n += sum(len(x) for x in p if isinstance(x, list))
    return n


def supported_summary(caps: Capabilities) -> str:
    """What a model supports, in words: ``text input, tools, JSON-schema output, 8192-token context``."""
    parts = [" and ".join(caps.input_modalities) + " input"]
    if caps.embeddings:
        dim = f", {caps.embedding_dimensions} dimensions" if caps.embedding_dimensions else ""
        parts.append(f"embeddings only (/v1/embeddings{dim})")
    elif caps.rerank:
        parts.append("rerank only (/v1/rerank)")
    else:
        parts.append("tools" if caps.tools else "no tools")
        parts.append("JSON-schema output" if caps.json_schema else "no JSON-schema output")
    if caps.context_tokens:
        parts.append(f"{caps.context_tokens}-token context")
    if caps.max_input_tokens:
        parts.append(f"inputs up to {caps.max_input_tokens} tokens")
    return ", ".join(parts)


def _want(v: Any, name: str, types: type | tuple[type, ...], what: str) -> None:
    if v is not None and (
        not isinstance(v, types)
        or isinstance(v, bool)
        and bool not in (types if isinstance(types, tuple) else (types,))
    ):
        raise bad_request(f"'{name}' must be {what}, got {type(v).__name__}", param=name, code="invalid_type")


def validate_shape(
    endpoint: str, body: dict[str, Any], max_tokens_limit: int, engine_length_fields: str = "map"
) -> int | None:
    """Check the types of the fields the gateway relies on and the output bound; returns the largest
    requested output bound (:attr:`~servelab.gateway.lengths.LengthRequest.max_tokens`, None if absent).
    Same checks and errors as :func:`validate_request`."""
    return validate_request(endpoint, body, max_tokens_limit, engine_length_fields).max_tokens


def validate_request(
    endpoint: str, body: dict[str, Any], max_tokens_limit: int, engine_length_fields: str = "map"
) -> LengthRequest:
    """Check the types of the fields the gateway relies on, and read every output-length field of every
    engine dialect (:func:`servelab.gateway.lengths.read_lengths`: the bound is the LARGEST one asked for).

    Raises GatewayError 400 (``param`` = field) for: no/empty ``messages`` (chat), ``prompt`` (completions)
    or ``input`` (embeddings) of the wrong type, non-bool ``stream``, non-object ``stream_options`` /
    ``response_format``, non-list ``tools``, any length field not an integer >= 1 or above
    ``max_tokens_limit``, an engine-specific length field when ``engine_length_fields`` is ``refuse``,
    ``min_tokens`` above the bound.
    """
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise bad_request(
                "'messages' must be a non-empty list of {role, content} objects", param="messages", code="invalid_type"
            )
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise bad_request(
                    f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]", code="invalid_type"
                )
            c = m.get("content")
            if c is not None and not isinstance(c, (str, list)):
                raise bad_request(
                    f"messages[{i}].content must be a string or a list of content parts",
                    param=f"messages[{i}].content",
                    code="invalid_type",
                )
    elif endpoint == "completions":
        p = body.get("prompt")
        if not isinstance(p, (str, list)) or isinstance(p, list) and not p:
            raise bad_request("'prompt' must be a string or a non-empty list", param="prompt", code="invalid_type")
    elif endpoint == "rerank":
        _validate_rerank(body)
    else:
        p = body.get("input")
        if not isinstance(p, (str, list)) or isinstance(p, list) and not p:
            raise bad_request("'input' must be a string or a non-empty list", param="input", code="invalid_type")
        _want(body.get("dimensions"), "dimensions", int, "an integer")
    _want(body.get("stream"), "stream", bool, "true or false")
    _want(body.get("stream_options"), "stream_options", dict, "an object")
    _want(body.get("response_format"), "response_format", dict, "an object")
    _want(body.get("tools"), "tools", list, "a list")
    if endpoint in POOLED:
        return LengthRequest(None, False, None, None, ())
    return read_lengths(body, max_tokens_limit, engine_length_fields)


def _validate_rerank(body: dict[str, Any]) -> None:
    """``query`` a non-empty string, ``documents`` a non-empty list of strings or ``{"text": str}`` objects,
    ``top_n`` an integer >= 0 (0 = all, vLLM's default), ``return_documents`` a boolean; no streaming."""
    q = body.get("query")
    if not isinstance(q, str) or not q:
        raise bad_request("'query' must be a non-empty string", param="query", code="invalid_type")
    docs = body.get("documents")
    if not isinstance(docs, list) or not docs:
        raise bad_request(
            "'documents' must be a non-empty list of strings (or {\"text\": ...} objects)",
            param="documents",
            code="invalid_type",
        )
    for i, d in enumerate(docs):
        if not isinstance(d.get("text") if isinstance(d, dict) else d, str):
            raise bad_request(
                f"documents[{i}] must be a string or an object with a string 'text'",
                param=f"documents[{i}]",
                code="invalid_type",
            )
    top = body.get("top_n")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 0):
        raise bad_request(
            f"'top_n' must be an integer >= 0 (0 = every document), got {top!r}", param="top_n", code="invalid_value"
        )
    _want(body.get("return_documents"), "return_documents", bool, "true or false")
    if body.get("stream") not in (None, False):
        raise bad_request("rerank answers are not streamed; remove 'stream'", param="stream", code="invalid_value")


def check_depth(raw: bytes, body: Any, max_depth: int) -> None:
    """Refuse a body nested deeper than ``max_depth`` levels of objects/arrays (the top-level object is
    level 1): deeper bodies cannot be forwarded (orjson serialises at most 253 levels) and no engine
    field needs them. ``raw``: the body's bytes (fast path: fewer brackets than ``max_depth`` cannot nest
    deeper, so most bodies are never walked). Raises GatewayError 400 ``json_too_deep``."""
    if raw.count(b"[") + raw.count(b"{") <= max_depth:
        return
    stack: list[tuple[Any, int]] = [(body, 1)]
    while stack:
        obj, depth = stack.pop()
        if depth > max_depth:
            raise bad_request(
                f"the body nests objects/arrays more than {max_depth} levels deep; flatten it (server.max_json_depth)",
                code="json_too_deep",
            )
        for v in obj.values() if isinstance(obj, dict) else obj:
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))


def output_sequences(endpoint: str, body: dict[str, Any]) -> int:
    """How many sequences the engine will generate for ``body``: ``n`` (default 1), for ``/v1/completions``
    at least ``best_of`` (vLLM's legacy field), the largest of ``n`` and llama-server's ``n_cmpl``
    (completions per prompt, https://github.com/ggml-org/llama.cpp/blob/master/tools/server/server-task.cpp,
    checked 2026-12-01) and times the number of prompts in a list of prompts.
    0 for embeddings. The output cap applies per sequence, so a request's output is up to
    ``sequences x max_tokens`` (OpenAI: "charged based on the number of generated tokens across all of
    the choices", https://platform.openai.com/docs/api-reference/chat/create, checked 2026-11-30).
    Raises GatewayError 400 (``param`` ``n``/``n_cmpl``/``best_of``) when they are not integers >= 1."""
    if endpoint in POOLED:
        return 0
    seqs = 1
    for name in ("n", "n_cmpl", "best_of") if endpoint == "completions" else ("n", "n_cmpl"):
        v = body.get(name)
        if v is None:
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise bad_request(f"'{name}' must be an integer >= 1, got {v!r}", param=name, code="invalid_value")
        seqs = max(seqs, v)
    p = body.get("prompt")
    if endpoint == "completions" and isinstance(p, list) and p and not isinstance(p[0], int):
        seqs *= len(p)  # a batch of prompts (strings or token-id lists), each with its own n choices
    return seqs


def _parts(body: dict[str, Any]) -> set[str]:
    kinds: set[str] = set()
    for m in body.get("messages") or ():
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            for part in m["content"]:
                if isinstance(part, dict) and isinstance(part.get("type"), str):
                    kinds.add(part["type"])
    return kinds


def check_request(
    entry: ModelEntry,
    endpoint: str,
    body: dict[str, Any],
    prompt_tokens_est: int,
    model_name: str = "this model",
    max_tokens: int | None = None,
) -> None:
    """Refuse, before any engine sees it, a request the model's declared capabilities cannot serve.

    ``endpoint``: ``chat``, ``completions`` or ``embeddings``. ``prompt_tokens_est``: from
    :func:`estimate_prompt_tokens`. ``max_tokens``: the output cap that will be sent (default: the body's).
    Raises GatewayError 400 with ``code`` ``model_not_supported`` (wrong endpoint for the model),
    ``tools_not_supported``, ``json_schema_not_supported``, ``modality_not_supported`` or
    ``context_length_exceeded``; the message names what the model supports.
    """
    caps = entry.capabilities
    sup = f"it supports: {supported_summary(caps)}"
    name = f"model '{model_name}'" if model_name != "this model" else model_name
    _check_route(caps, endpoint, name, sup)
    if endpoint in POOLED:
        _check_inputs(caps, endpoint, body, name, sup)
    if endpoint == "chat":
        tools = body.get("tools")
        tc = body.get("tool_choice")
        if not caps.tools and (tools or body.get("functions") or (tc is not None and tc != "none")):
            raise bad_request(
                f"{name} does not accept tools; remove 'tools' or pick a model with tools ({sup})",
                param="tools",
                code="tools_not_supported",
            )
        kinds = _parts(body)
        sends_image = "image_url" in kinds or "input_image" in kinds or "image" in kinds
        if sends_image and "image" not in caps.input_modalities:
            raise bad_request(
                f"{name} does not accept images; send text only or pick a vision model ({sup})",
                param="messages",
                code="modality_not_supported",
            )
        if ("input_audio" in kinds or "audio_url" in kinds) and "audio" not in caps.input_modalities:
            raise bad_request(f"{name} does not accept audio ({sup})", param="messages", code="modality_not_supported")
    if endpoint in ("chat", "completions"):
        rf = body.get("response_format")
        field = (
            "response_format"
            if isinstance(rf, dict) and rf.get("type") in ("json_schema", "json_object")
            else next((k for k in CONSTRAINED_FIELDS if body.get(k) not in (None, "", False)), None)
        )
        if field is not None and not caps.json_schema:
            raise bad_request(
                f"{name} does not support constrained (JSON-schema/grammar) output; remove '{field}' "
                f"or pick a model with json_schema ({sup})",
                param=field,
                code="json_schema_not_supported",
            )
        if body.get("reasoning_effort") is not None and not caps.reasoning:
            raise bad_request(
                f"{name} is not a reasoning model; remove 'reasoning_effort' ({sup})",
                param="reasoning_effort",
                code="reasoning_not_supported",
            )
    ctx = caps.context_tokens
    if ctx:
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        out = max_tokens if max_tokens is not None else asked
        out = out if endpoint not in POOLED and isinstance(out, int) else 0
        if prompt_tokens_est + out > ctx:
            raise GatewayError(
                400,
                f"this request needs at least {prompt_tokens_est + out} tokens (prompt at least "
                f"{prompt_tokens_est} + max_tokens {out}) but {name} has a {ctx}-token context; "
                "shorten the prompt or lower max_tokens",
                code="context_length_exceeded",
                param={"chat": "messages", "completions": "prompt", "rerank": "documents"}.get(endpoint, "input"),
            )


def _check_route(caps: Capabilities, endpoint: str, name: str, sup: str) -> None:
    """An embedding model serves /v1/embeddings only, a rerank model /v1/rerank only, the others neither."""
    own = "embeddings" if caps.embeddings else ("rerank" if caps.rerank else None)
    if endpoint == own or (own is None and endpoint not in POOLED):
        return
    if own is not None:
        what = "an embedding" if own == "embeddings" else "a rerank"
        raise bad_request(f"{name} is {what} model; send it to /v1/{own}", param="model", code="model_not_supported")
    what = "an embedding" if endpoint == "embeddings" else "a rerank"
    raise bad_request(
        f"{name} is not {what} model; send it to /v1/chat/completions ({sup})",
        param="model",
        code="model_not_supported",
    )


def _check_inputs(caps: Capabilities, endpoint: str, body: dict[str, Any], name: str, sup: str) -> None:
    """The declared ``embedding_dimensions`` against a request's ``dimensions`` and ``max_input_tokens``
    against each input's estimated tokens (an embedding input; a rerank query + one document): the
    estimate is a lower bound (module doc), so only inputs that cannot fit under any tokenizer are refused."""
    dims = body.get("dimensions")
    top = caps.embedding_dimensions
    if endpoint == "embeddings" and isinstance(dims, int) and top is not None and not 1 <= dims <= top:
        raise bad_request(
            f"'dimensions' must be 1 ... {top} for {name} ({sup})", param="dimensions", code="invalid_value"
        )
    limit = caps.max_input_tokens
    if not limit:
        return
    if endpoint == "rerank":
        q = body.get("query")
        qt = _ntok(q) if isinstance(q, str) else 0
        sizes = [(f"documents[{i}]", qt + _ntok(d)) for i, d in enumerate(rerank_documents(body))]
    else:
        p = body.get("input")
        items = [p] if isinstance(p, str) or (isinstance(p, list) and p and isinstance(p[0], int)) else p
        sizes = [
            ("input" if isinstance(p, str) else f"input[{i}]", _ntok(x) if isinstance(x, str) else len(x))
            for i, x in enumerate(items if isinstance(items, list) else ())
            if isinstance(x, (str, list))
        ]
    for where, n in sizes:
        if n > limit:
            what = "the query and this document" if endpoint == "rerank" else "this input"
            raise GatewayError(
                400,
                f"{where}: {what} need at least {n} tokens but {name} takes at most {limit} per input; "
                f"shorten or split it ({sup})",
                code="input_too_long",
                param=where,
            )
