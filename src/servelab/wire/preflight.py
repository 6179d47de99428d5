"""The check every client of an OpenAI-compatible server makes before it sends load: is the URL an API
root that answers ``/models`` (and which model, which context), with one line naming the fix when not."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from servelab.wire.errors import ConfigError

__all__ = ["preflight"]


async def preflight(
    session: aiohttp.ClientSession, base_url: str, model: str | None, headers: dict[str, str] | None
) -> tuple[str, dict[str, Any]]:
    """Check that ``base_url`` is an OpenAI-compatible API root before any load is sent.

    Returns ``(model, server_identity)``. Raises :class:`ConfigError` with one line that names the
    problem and the fix: connection refused/unreachable, a 404 (wrong path), a non-JSON or
    non-OpenAI answer, or no model name available.
    """
    ident: dict[str, Any] = {"base_url": base_url}
    try:
        async with session.get(base_url + "/models", headers=headers, timeout=aiohttp.ClientTimeout(total=15)) as resp:
            body = await resp.read()
            ident["server_header"] = resp.headers.get("Server")
            if resp.status == 404:
                if base_url.endswith("/v1"):
                    raise ConfigError(
                        f"{base_url}/models answered 404: this server has no OpenAI /v1/models "
                        f"endpoint; is it an OpenAI-compatible inference server? check --url"
                    )
                raise ConfigError(
                    f"{base_url}/models answered 404: --url must be the OpenAI API root, "
                    f"usually ending in /v1 (e.g. http://127.0.0.1:8080/v1)"
                )
            if resp.status in (401, 403):
                raise ConfigError(
                    f"{base_url}/models answered {resp.status}: the server wants an API key; "
                    f"pass --api-key or set OPENAI_API_KEY"
                )
            if resp.status >= 400:
                raise ConfigError(
                    f"{base_url}/models answered HTTP {resp.status}: "
                    f"{body[:120].decode('utf-8', 'replace')!r}; is the server ready?"
                )
            try:
                models = orjson.loads(body)
            except orjson.JSONDecodeError:
                raise ConfigError(
                    f"{base_url}/models did not answer JSON (got {body[:60]!r}): "
                    f"this is not an OpenAI-compatible server, check --url"
                ) from None
            if not isinstance(models, dict) or not isinstance(models.get("data"), list):
                raise ConfigError(
                    f"{base_url}/models answered JSON without a 'data' list: "
                    f"this is not an OpenAI-compatible server, check --url"
                )
    except (aiohttp.ClientConnectorError, aiohttp.ClientOSError, aiohttp.ServerDisconnectedError) as e:
        raise ConfigError(
            f"cannot connect to {base_url} ({e.__class__.__name__}): is the server running? "
            f"start one with 'servelab engine up llamacpp' or fix --url"
        ) from None
    except TimeoutError:
        raise ConfigError(f"{base_url}/models did not answer within 15 s: is the server up and reachable?") from None
    ident["models"] = [m.get("id") for m in models["data"] if isinstance(m, dict)]
    if model is None:
        if not ident["models"]:
            raise ConfigError(f"{base_url}/models lists no model: pass --model NAME")
        model = str(ident["models"][0])
    for m in models["data"]:  # vLLM lists each model's max_model_len (prompt + output tokens per request)
        if isinstance(m, dict) and m.get("id") == model and isinstance(m.get("max_model_len"), int):
            ident["context_tokens"], ident["context_source"] = m["max_model_len"], "/v1/models max_model_len"
    root = base_url[:-3] if base_url.endswith("/v1") else base_url
    try:  # llama-server describes itself at /props (build, slots, context, model path)
        async with session.get(root + "/props", headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            if resp.status == 200 and "json" in resp.headers.get("Content-Type", ""):
                props = await resp.json(loads=orjson.loads)
                ident["llamacpp_props"] = {
                    k: props.get(k) for k in ("build_info", "model_path", "total_slots", "chat_template") if k in props
                }
                dgs = props.get("default_generation_settings") or {}
                if "n_ctx" in dgs:
                    ident["llamacpp_props"]["n_ctx"] = dgs["n_ctx"]
                    if isinstance(dgs["n_ctx"], int) and dgs["n_ctx"] > 0:  # per slot: -c / -np
                        ident["context_tokens"] = dgs["n_ctx"]
                        ident["context_source"] = "llama-server /props n_ctx per slot"
    except (aiohttp.ClientError, TimeoutError, ValueError):
        pass
    return model, ident
