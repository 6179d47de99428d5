"""``servelab bench --endpoint messages|responses``: the chat workloads sent in the Anthropic Messages or OpenAI
Responses shape, streamed, and measured from each API's own events (:mod:`servelab.wire.apis`).

A workload is built as for chat (the same prompts, lengths and seeds) and each of its requests is sent to
the API's route in that API's body; what it cannot express is refused before the run, in one line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from servelab.wire.apis import API_ENDPOINTS
from servelab.wire.client import build_body
from servelab.wire.errors import ConfigError

__all__ = ["CHECKED_REQUESTS", "check_api_run", "for_api", "workload_endpoint"]

#: requests of each workload turned into the API's body before the run, so a field the API lacks is refused
CHECKED_REQUESTS = 16
#: workloads that are not a list of independent chat requests (their own loops, or another API)
_NOT_TRANSLATED = ("trace", "sessions", "agent", "rag-docs", "embeddings", "tools")


def workload_endpoint(endpoint: str) -> str:
    """The endpoint a workload is built for: ``chat`` for the ``messages`` and ``responses`` endpoints (their
    requests are chat requests sent in another shape), else ``endpoint``."""
    return "chat" if endpoint in API_ENDPOINTS else endpoint


def check_api_run(endpoint: str, names: list[str], ignore_eos: bool) -> None:
    """Raise :class:`ConfigError` (one line) when ``--endpoint messages|responses`` meets a workload or option
    the API cannot carry."""
    if endpoint not in API_ENDPOINTS:
        return
    if ignore_eos:
        raise ConfigError(f"--ignore-eos is not a field of the {endpoint} API: leave it out, or use --endpoint chat")
    bad = [n for n in names if n in _NOT_TRANSLATED]
    if bad:
        raise ConfigError(
            f"--endpoint {endpoint} sends the chat workloads (short-qa, rag, long-gen, mix, "
            f"shared-prefix, structured for responses, --dataset) in that API's shape; {bad[0]} is "
            "not one: use --endpoint chat for it"
        )


def for_api(workload: Any, endpoint: str, model: str = "m") -> Any:
    """``workload`` (a :class:`~servelab.bench.workloads.kinds.Workload` built for chat) with every request sent to
    ``endpoint`` (``messages``/``responses``); the first :data:`CHECKED_REQUESTS` requests are turned into the
    API's body now (raises :class:`ConfigError` naming a field the API lacks). Other endpoints: as given."""
    if endpoint not in API_ENDPOINTS:
        return workload
    make = workload._make

    def sent_as_api(i: int) -> Any:
        return dataclasses.replace(make(i), endpoint=endpoint)

    out = dataclasses.replace(workload, _make=sent_as_api)
    for i in range(CHECKED_REQUESTS):
        try:
            spec = out.request(i)
        except IndexError:
            break
        build_body(model, spec)
    return out
