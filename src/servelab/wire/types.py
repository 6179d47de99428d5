"""OpenAI-wire request and result types shared by every part of servelab.

All timestamps are integers from :func:`time.monotonic_ns` (CLOCK_MONOTONIC, nanoseconds). That clock is
system-wide on Linux, so timestamps taken in two processes on one host (the client and ``servelab
mock-engine``) are directly comparable.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class FailureClass(str, enum.Enum):  # noqa: UP042 — StrEnum would change str() of members in records
    """Why a request failed. Every submitted request is either succeeded or exactly one of these.

    - ``connect``: no HTTP response at all (refused, DNS, reset before the status line).
    - ``http_status``: a non-2xx status line.
    - ``stream_error``: a 2xx response that carried an error object (docs/engine-wire.md case 15).
    - ``cut_off``: the body ended without ``[DONE]`` and without a finish reason (case 16).
    - ``protocol``: a 2xx body that is not an OpenAI-compatible response (HTML, wrong JSON shape).
    - ``timeout``: the per-request time limit passed.
    - ``cancelled``: the run was stopped (Ctrl-C, duration limit with cancel policy) while in flight.
    """

    CONNECT = "connect"
    HTTP_STATUS = "http_status"
    STREAM_ERROR = "stream_error"
    CUT_OFF = "cut_off"
    PROTOCOL = "protocol"
    TIMEOUT = "timeout"
    CANCELLED = "cancelled"


#: Finish reasons kept as they are; everything else maps through :data:`FINISH_ALIASES` or to "other".
KNOWN_FINISH = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call", "abort"})
#: Engine-specific finish reasons (docs/engine-wire.md case 11): TGI ``stop_sequence``/``eos_token`` mean stop.
FINISH_ALIASES = {"stop_sequence": "stop", "eos_token": "stop", "eos": "stop", "max_tokens": "length"}


def normalize_finish(raw: str | None) -> str | None:
    """Map an engine's finish reason onto OpenAI's set plus ``abort`` and the catch-all ``other``.

    ``None`` stays ``None`` (no finish seen). Never raises on unknown values (docs/engine-wire.md case 11).
    """
    if raw is None:
        return None
    if raw in KNOWN_FINISH:
        return raw
    return FINISH_ALIASES.get(raw, "other")


@dataclass(slots=True)
class RequestSpec:
    """One request to send.

    ``endpoint`` is ``"chat"`` (``/chat/completions``, uses ``messages``), ``"completions"``
    (``/completions``, uses ``prompt``), or ``"messages"`` / ``"responses"`` (Anthropic ``/messages``, OpenAI
    ``/responses``: ``messages`` sent in that API's shape, :mod:`servelab.wire.apis`). ``max_tokens`` caps
    output tokens. ``extra`` is merged into the JSON body (``response_format``, ``stop``, ``ignore_eos``,
    ``temperature``...). ``json_schema`` (if
    set) is the schema the structured-output quality gate validates the answer against.
    ``prompt_tokens_target`` is the prompt length the workload generator aimed for, in the target
    model's tokens (``None`` for user datasets).
    """

    endpoint: str
    max_tokens: int | None = None
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    workload: str = "custom"
    json_schema: dict[str, Any] | None = None
    prompt_tokens_target: int | None = None
    allow_truncation: bool = False


@dataclass(slots=True)
class ToolCall:
    """A tool call joined from its stream fragments (docs/engine-wire.md cases 13-14)."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""
    arguments_valid: bool | None = None


@dataclass(slots=True)
class WireError:
    """An error normalised from any engine dialect (docs/engine-wire.md case 17).

    ``status`` is the HTTP status (200 for an error inside a stream, ``None`` when no response came);
    ``message`` is the engine's text; ``type`` and ``code`` are kept as sent (code may be int or str).
    """

    status: int | None
    message: str
    type: str | None = None
    code: Any = None


@dataclass(slots=True)
class RequestRecord:
    """Everything measured about one request. Times are ``time.monotonic_ns()`` values or ``None``.

    Timestamps (in the order they happen):
    ``scheduled_ns`` (when the load model intended to send), ``sent_ns`` (just before the request was
    written), ``headers_ns`` (status line + headers parsed), ``first_byte_ns`` (first body bytes read),
    ``first_event_ns`` (first SSE ``data:`` event), ``first_token_ns`` (first event carrying non-empty
    content, reasoning or a tool-call fragment), ``first_answer_ns`` (first non-empty ``content``),
    ``last_token_ns``, ``done_ns`` (``data: [DONE]`` read), ``end_ns`` (body finished or failure seen).

    ``chunk_ns`` holds the arrival time of every token-carrying event; ``chunk_tokens`` the number of
    tokens each carried when per-chunk usage showed it (``0`` = unknown for that chunk).
    ``conn_retries`` counts re-sends after a pooled keep-alive connection turned out to be closed by
    the server before anything was read (the request never reached it; ``sent_ns`` is the re-send).
    """

    request_id: int
    workload: str = "custom"
    step: str = ""
    warmup: bool = False
    scheduled_ns: int = 0
    sent_ns: int | None = None
    headers_ns: int | None = None
    first_byte_ns: int | None = None
    first_event_ns: int | None = None
    first_token_ns: int | None = None
    first_answer_ns: int | None = None
    last_token_ns: int | None = None
    done_ns: int | None = None
    end_ns: int | None = None
    status: int | None = None
    chunk_ns: list[int] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, ToolCall] = field(default_factory=dict)
    finish_reason_raw: str | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    saw_done: bool = False
    events: int = 0
    failure: FailureClass | None = None
    error: WireError | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    output_tokens_source: str | None = None
    client_output_tokens: int | None = None
    client_prompt_tokens: int | None = None
    prompt_tokens_target: int | None = None
    max_tokens: int | None = None
    cached_tokens: int | None = None
    gate_failures: list[str] = field(default_factory=list)
    response_model: str | None = None
    conn_retries: int = 0

    @property
    def ok(self) -> bool:
        """True when the request succeeded on the wire (it may still fail a quality gate)."""
        return self.failure is None

    @property
    def truncated(self) -> bool:
        """True when generation stopped at ``max_tokens`` (finish reason ``length``)."""
        return self.finish_reason == "length"

    @property
    def content_text(self) -> str:
        """The answer text (``content`` fragments joined)."""
        return "".join(self.content)

    @property
    def reasoning_text(self) -> str:
        """The reasoning text (``reasoning``/``reasoning_content`` fragments joined)."""
        return "".join(self.reasoning)
