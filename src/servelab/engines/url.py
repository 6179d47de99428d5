"""The engine kind ``url``: an already running OpenAI-compatible server that servelab neither starts nor
stops (no cold start, no process memory). Its candidates carry ``url``, ``model_name`` and
``api_key_env`` (:class:`UrlFields`) and no settings.

Its server metrics are every known engine's names (the make of the server is not known), including
SGLang's and TGI's, which servelab does not launch (names from the metrics table of docs/engine-wire.md).
"""

from __future__ import annotations

from typing import ClassVar
from urllib.parse import urlparse

from pydantic import BaseModel, Field, field_validator

from servelab.engines.kind import ENV_NAME_PATTERN, EngineKind, EngineSettings, ServerMetrics
from servelab.wire.config import StrictModel

__all__ = ["SGLANG_METRICS", "TGI_METRICS", "UrlFields", "UrlKind", "UrlSettings", "any_server_metrics"]

#: SGLang's Prometheus names (served at /metrics with --enable-metrics)
SGLANG_METRICS = ServerMetrics(
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    generation_tokens=("sglang:generation_tokens_total",),
)
#: Text Generation Inference's Prometheus names
TGI_METRICS = ServerMetrics(running="tgi_batch_current_size", waiting="tgi_queue_size")

_ENV_NAME = ENV_NAME_PATTERN


class UrlSettings(EngineSettings):
    """A ``url`` candidate is not launched by servelab, so it has no settings (any key is an error)."""


class UrlFields(StrictModel):
    """The candidate fields of ``engine: url``: ``url`` (the OpenAI API root, http(s), e.g.
    ``http://127.0.0.1:8000/v1``; a trailing ``/`` is dropped), ``model_name`` (the served model id;
    ``None`` = the first id of ``GET /v1/models``), ``api_key_env`` (name of an environment variable
    holding the API key, never the key itself)."""

    url: str = Field(description="OpenAI API root, http(s)://HOST:PORT/v1")
    model_name: str | None = Field(None, description="served model id; null = first of GET /v1/models")
    api_key_env: str | None = Field(None, pattern=_ENV_NAME, description="environment variable with the API key")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        u = urlparse(v.strip())
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"{v!r} is not an http(s) URL; give the API root, e.g. http://127.0.0.1:8000/v1")
        return v.strip().rstrip("/")


class UrlKind(EngineKind[UrlSettings]):
    """``engine: url``: an existing OpenAI-compatible server at ``url``."""

    kind = "url"
    title = "external server"
    summary = "an already running OpenAI-compatible server at url (not started or stopped by servelab)"
    Settings = UrlSettings
    candidate_fields: ClassVar[type[BaseModel] | None] = UrlFields
    launched = False
    takes_model = False

    @property
    def metrics(self) -> ServerMetrics:  # type: ignore[override]  # computed per call: kinds register at run time
        """:func:`any_server_metrics`: the make of the server is not known."""
        return any_server_metrics()


def any_server_metrics() -> ServerMetrics:
    """Every launched kind's metric names plus SGLang's and TGI's, for a server of unknown make (``url``)
    or one that speaks several engines' dialects (``mock``)."""
    from servelab.engines.registry import kinds  # at call time: the registry loads this module

    return ServerMetrics.merged(
        [*(k.metrics for k in kinds() if k.launched and k.kind != "mock"), SGLANG_METRICS, TGI_METRICS]
    )
