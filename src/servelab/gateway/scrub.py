"""What an engine's error becomes for the client: one plain message per error class, nothing internal.

An engine in trouble says things an end user must never see (seed 003 §22): ``CUDA error: out of
memory``, file paths and line numbers, stack traces, batch and request ids, backend and upstream model
names, internal URLs. This module decides, for every engine error the gateway meets (a non-2xx body in
any docs/engine-wire.md case-17 shape, an error event inside a 200 stream, case 15), which **class** it is
and answers the client a fixed, actionable message for that class; the engine's own text goes to the
gateway log only, on one line with the gateway's request id, so an operator can find it.

=============  ===========================================  ==========================================
class          engine said                                  client gets
=============  ===========================================  ==========================================
``busy``       429 / 503 (overload, case 19)                503 ``model_busy`` "busy, retry in N s"
                                                            + ``Retry-After``
``too_long``   context overflow (case 18: 400/413/422)      400 ``context_length_exceeded`` with the
                                                            numbers: how many tokens to remove
``bad_request``other 4xx about the request                  400 ``upstream_rejected``; the engine's
                                                            wording only if it is about the client's
                                                            own input and carries nothing internal
``unavailable``401/403/404/405/407/408 (the gateway's own   503 ``model_unavailable`` "temporarily
               setup or a proxy in between is wrong)        unavailable, retry in 1 s"
``not_served`` 501 (llama-server without ``--reranking`` /   501 ``endpoint_not_served`` "does not
               ``--embeddings``: the engine does not        serve this endpoint; a retry will not
               implement the endpoint)                      help" + ``x-should-retry: false``; the
                                                            next target is still tried
``failed``     5xx, an error inside a 200 stream, anything  502 ``upstream_error`` "failed while
               else                                         answering; retry the request"
=============  ===========================================  ==========================================

Only ``bad_request`` ever shows engine words, and only after :func:`user_safe_text` removed URLs,
host:port, paths and hidden names and found no sign of internals (:data:`INTERNAL_SIGNS`); the
``too_long`` message is the gateway's own sentence around numbers read from the engine's error.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from servelab.gateway.errors import GatewayError, sanitize_upstream_message
from servelab.wire.errors import error_from_body, error_from_event, is_context_overflow
from servelab.wire.types import WireError

__all__ = [
    "ErrorClass",
    "INTERNAL_SIGNS",
    "classify",
    "client_error",
    "context_numbers",
    "from_body",
    "from_event",
    "redact_prompt",
    "user_safe_text",
]

log = logging.getLogger("servelab.gateway.upstream")

ErrorClass = Literal["busy", "too_long", "bad_request", "unavailable", "not_served", "failed"]

#: Words and shapes that mark a message as internal (GPU, memory, process, batch or request ids, code
#: locations); a 4xx message matching any of them is replaced by the class's fixed wording.
INTERNAL_SIGNS = re.compile(
    r"cuda|cublas|cudnn|nccl|\bhip\b|rocm|\bgpu|out of memory|\boom\b|\bmemory\b|\bvram\b|tensor|kernel|"
    r"device|\bworker|\brank\b|\bbatch|scheduler|\bengine\b|traceback|exception|errno|\bpid\b|thread|"
    r"segfault|assert|\bnode\b|\bpod\b|\bslot\b|\.py\b|\.cpp\b|\.cu\b|\.rs\b|0x[0-9a-f]+|"
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{6,}\b|"
    r"[0-9a-f]{8}-[0-9a-f]{4}-|\b(?:req|cmpl|chatcmpl|batch)[-_][\w-]+",
    re.I,
)

#: an engine message's opening that the client message already says ("the model rejected the request: ")
_SAID_ALREADY = re.compile(r"^(?:the\s+)?model\s+(?:rejected|refused)(?:\s+the\s+request)?\s*[:;,-]\s*", re.I)

#: The engine text written to the log at most (characters; the rest is cut with a marker).
LOG_CHARS = 2000

#: a quoted run in an engine message (engines echo inputs as 'value', "value" or `value`, often cut with ...)
_QUOTED = re.compile(r"'([^'\n]{4,})'|\"([^\"\n]{4,})\"|`([^`\n]{4,})`")


def redact_prompt(text: str, prompt: str | None) -> str:
    """``text`` with every quoted run that is part of ``prompt`` (after dropping a trailing ``...``, as
    pydantic and engines cut long echoed inputs) replaced by ``[PROMPT]``: an engine's validation error
    that echoes the request must not put prompt text into the gateway log."""
    if not prompt:
        return text

    def sub(m: re.Match[str]) -> str:
        inner = next(g for g in m.groups() if g is not None)
        core = inner.rstrip(".").rstrip("…").strip()
        return m.group(0).replace(inner, "[PROMPT]") if len(core) >= 4 and core in prompt else m.group(0)

    return _QUOTED.sub(sub, text)


# context-overflow wordings (docs/engine-wire.md case 18), each giving (context, prompt, output) tokens
_VLLM = re.compile(
    r"maximum context length is (\d+) tokens\. However, you requested \d+ tokens "
    r"\((\d+) in the messages, (\d+) in the completion\)",
    re.I,
)
_VLLM_NEW = re.compile(
    r"too large: (\d+)\. This model's maximum context length is (\d+) tokens and your "
    r"request has (\d+) input tokens",
    re.I,
)
_SGLANG = re.compile(
    r"maximum context length of (\d+) tokens.*?(\d+) tokens from the input messages and (\d+) "
    r"tokens for the completion",
    re.I | re.S,
)
_SGLANG_INPUT = re.compile(r"input \((\d+) tokens\) is longer than the model's context length \((\d+) tokens\)", re.I)
_TGI = re.compile(r"must be <= (\d+)\. Given: (\d+) `inputs` tokens and (\d+) `max_new_tokens`", re.I)


def context_numbers(message: str, fields: Mapping[str, Any] | None = None) -> tuple[int, int, int] | None:
    """``(context_tokens, prompt_tokens, output_tokens)`` read from a context-overflow error, or ``None``.

    ``fields`` is the engine's error object (llama-server puts ``n_ctx`` and ``n_prompt_tokens`` there
    and checks the prompt alone: output 0). The message wordings are vLLM's (classic and ≥0.10
    "too large" form), SGLang's (two forms) and TGI's validation error, as docs/engine-wire.md case 18 lists.
    """
    f = fields or {}
    if isinstance(f.get("n_ctx"), int) and isinstance(f.get("n_prompt_tokens"), int):
        return int(f["n_ctx"]), int(f["n_prompt_tokens"]), 0
    if m := _VLLM.search(message):
        return int(m[1]), int(m[2]), int(m[3])
    if m := _VLLM_NEW.search(message):
        return int(m[2]), int(m[3]), int(m[1])
    if m := _SGLANG.search(message):
        return int(m[1]), int(m[2]), int(m[3])
    if m := _SGLANG_INPUT.search(message):
        return int(m[2]), int(m[1]), 0
    if m := _TGI.search(message):
        return int(m[1]), int(m[2]), int(m[3])
    return None


def classify(err: WireError) -> ErrorClass:
    """The class of an engine error (see the module table). ``err.status`` is the HTTP status, ``200``
    or ``None`` for an error event inside a stream."""
    status = err.status
    if status in (429, 503):
        return "busy"
    if is_context_overflow(err) or "context size" in err.message.lower() or status == 413:
        return "too_long"
    if status in (401, 403, 404, 405, 407, 408):
        return "unavailable"
    if status == 501:
        return "not_served"
    if status is not None and 400 <= status < 500:
        return "bad_request"
    return "failed"


def user_safe_text(message: str, hide: Iterable[str] = (), max_chars: int = 200) -> str | None:
    """The engine's ``message`` if it may be shown to an end user (sanitised: first line, no URL,
    host:port, path or ``hide`` name; at most ``max_chars``), or ``None`` when it shows any of
    :data:`INTERNAL_SIGNS` or nothing useful is left."""
    clean = sanitize_upstream_message(message, hide, max_chars=max_chars)
    if clean is None or INTERNAL_SIGNS.search(message.splitlines()[0] if message.strip() else ""):
        return None
    return clean


def _too_long(nums: tuple[int, int, int] | None) -> GatewayError:
    if nums is None:
        text = "the prompt plus max_tokens does not fit this model's context; shorten the messages or lower max_tokens"
    else:
        ctx, prompt, out = nums
        if out:
            over = max(1, prompt + out - ctx)
            text = (
                f"the prompt is too long for this model: {prompt} prompt tokens plus {out} for the answer "
                f"(max_tokens) exceed its context of {ctx} tokens; remove at least {over} tokens from the "
                f"messages or lower max_tokens by {over}"
            )
        else:
            over = max(1, prompt - ctx + 1)
            text = (
                f"the prompt is too long for this model: {prompt} prompt tokens do not fit its context of "
                f"{ctx} tokens; remove at least {over} tokens from the messages"
            )
    return GatewayError(400, text, code="context_length_exceeded", param="messages")


def client_error(
    err: WireError,
    rid: str,
    backend: str | None = None,
    hide: Iterable[str] = (),
    retry_after_s: float | None = None,
    fields: Mapping[str, Any] | None = None,
    prompt: str | None = None,
) -> GatewayError:
    """The :class:`GatewayError` the client gets for engine error ``err`` (see the module table), after
    logging the engine's text on one line at WARNING with request id ``rid`` and ``backend``.

    ``retry_after_s`` is the engine's ``Retry-After`` (seconds) for the busy class (default 1 s);
    ``fields`` the engine's error object, for llama-server's ``n_ctx``/``n_prompt_tokens``; ``prompt``
    the request's prompt text, kept out of the log line (:func:`redact_prompt`).
    """
    cls = classify(err)
    text = redact_prompt(err.message, prompt)
    text = text if len(text) <= LOG_CHARS else text[:LOG_CHARS] + "...[cut]"
    log.warning(
        "request %s: backend %s answered %s (%s, type %s, code %s): %r",
        rid,
        backend or "-",
        err.status if err.status is not None else "an in-stream error",
        cls,
        err.type,
        err.code,
        text,
    )
    if cls == "busy":
        wait = retry_after_s if retry_after_s and retry_after_s > 0 else 1.0
        return GatewayError(
            503,
            f"the model is busy, retry in {max(1, int(-(-wait // 1)))} s",
            type="server_error",
            code="model_busy",
            retry_after_s=wait,
        )
    if cls == "too_long":
        return _too_long(context_numbers(err.message, fields))
    if cls == "bad_request":
        safe = user_safe_text(err.message, hide)
        # "model rejected: bad request" after "the model rejected the request: " says it twice
        safe = _SAID_ALREADY.sub("", safe) if safe else safe
        return GatewayError(
            400,
            f"the model rejected the request: {safe}"
            if safe
            else "the model rejected the request; check its parameters (values and types)",
            code="upstream_rejected",
        )
    if cls == "unavailable":
        return GatewayError(
            503,
            "the model is temporarily unavailable, retry in 1 s; report the request id if it persists",
            type="server_error",
            code="model_unavailable",
            retry_after_s=1.0,
        )
    if cls == "not_served":
        return GatewayError(
            501,
            "this model's engine does not serve this endpoint (it answered 501 not implemented); a retry will "
            "not help: use an endpoint the model serves, or ask the operator to enable this one on the engine",
            type="server_error",
            code="endpoint_not_served",
            retryable=False,
        )
    return GatewayError(
        502, "the model failed while answering; retry the request", type="server_error", code="upstream_error"
    )


def _fields(decoded: Any) -> Mapping[str, Any] | None:
    if isinstance(decoded, dict):
        inner = decoded.get("error")
        return inner if isinstance(inner, dict) else decoded
    return None


def from_body(
    raw: bytes,
    status: int,
    rid: str,
    backend: str | None = None,
    hide: Iterable[str] = (),
    retry_after_s: float | None = None,
    prompt: str | None = None,
) -> GatewayError:
    """:func:`client_error` for a whole non-2xx engine body ``raw`` (any case-17 shape, or not JSON)."""
    import orjson

    try:
        decoded = orjson.loads(raw)
    except orjson.JSONDecodeError:
        decoded = None
    return client_error(error_from_body(raw, status), rid, backend, hide, retry_after_s, _fields(decoded), prompt)


def from_event(event: Any, rid: str, backend: str | None = None, hide: Iterable[str] = ()) -> GatewayError | None:
    """:func:`client_error` for a decoded SSE event or 200 body carrying an error (case 15); ``None``
    when ``event`` carries no error."""
    err = error_from_event(event, None)
    if err is None:
        return None
    return client_error(err, rid, backend, hide, fields=_fields(event))
