"""Request fields that steer an engine's scheduler, transport, template or plugins: refused or dropped
unless the model's configuration allows them, and ``priority`` set by the gateway from the key's class.

Engines accept body fields beside OpenAI's that let a client act as the operator: jump the engine's
queue (``priority``), pick the KV-transfer peer of disaggregated prefill (``kv_transfer_params``,
``bootstrap_*``), replace the served chat template (``chat_template``), load server-side code
(``logits_processors``, ``custom_logit_processor``), pick a slot, data-parallel rank or LoRA adapter.
Passed on unchanged, a key of priority class ``batch`` sending ``"priority": -1000`` was served first by
a vLLM engine under priority scheduling, bypassing the gateway's own classes and degrade rules.

:data:`ENGINE_FIELDS` lists them, with what each steers and which engine reads it (read in each
engine's request models on 2026-12-02: vLLM ``vllm/entrypoints/openai/protocol.py``
``ChatCompletionRequest``/``CompletionRequest`` at 0052bed; SGLang
``python/sglang/srt/entrypoints/openai/protocol.py`` ``CompletionRequest``/``ChatCompletionRequest`` at
004c82e; TGI ``router/src/lib.rs`` ``ChatRequest``/``GenerateParameters`` at db931fc; llama.cpp
``tools/server/server-context.cpp``/``server-task.cpp`` of the llama-server servelab builds). Sampling
parameters, output bounds (:mod:`servelab.gateway.lengths`), logprobs and constrained decoding
(:mod:`servelab.gateway.capabilities`) have their own checks and are not listed here.

Per model (``models.<m>.engine_fields``, :class:`servelab.gateway.config.EngineFields`):

- ``allow``: the listed fields the client may send for this model; they are forwarded as sent;
- ``action``: what happens to any other listed field: ``refuse`` (default: 400
  ``engine_field_not_allowed`` naming the field, nothing reserved) or ``drop`` (removed; the access log's
  ``policy.engine_fields_dropped`` names them);
- ``priority``: priority class -> the engine's ``priority`` value, sent to backends whose kind has
  priority scheduling (:data:`PRIORITY_KINDS`: vLLM and SGLang, lower = served first) for keys of a
  listed class. It replaces whatever the client sent. vLLM answers 400 to a ``priority`` other than 0
  when it does not run ``--scheduling-policy priority``, so nothing is sent unless this is configured.

The check runs twice: at admission against the requested model (the refusal), and on every body sent
upstream against the model the target serves (a fallback's or the shadow's own list), so a field is
never forwarded to an engine whose model does not allow it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from servelab.gateway.errors import GatewayError
from servelab.wire.dialects import DIALECTS

__all__ = ["ENGINE_FIELDS", "PRIORITY_KINDS", "apply", "screen"]

#: field -> (what it steers, engines that read it)
ENGINE_FIELDS: Mapping[str, tuple[str, str]] = {
    # scheduler: queue order, request identity, cache sharing, placement
    "priority": ("the engine's scheduling order", "vLLM, SGLang"),
    "request_id": ("the engine's request id", "vLLM"),
    "rid": ("the engine's request id", "SGLang"),
    "cache_salt": ("prefix-cache sharing", "vLLM, SGLang"),
    "extra_key": ("prefix-cache sharing", "SGLang"),
    "routed_dp_rank": ("the data-parallel worker", "SGLang"),
    "data_parallel_rank": ("the data-parallel worker", "SGLang"),
    "disagg_prefill_dp_rank": ("the prefill worker of disaggregated serving", "SGLang"),
    "id_slot": ("the engine slot", "llama.cpp"),
    "session_id": ("engine-side sessions", "SGLang"),
    "session_params": ("engine-side sessions", "SGLang"),
    # transport: disaggregated prefill/decode
    "kv_transfer_params": ("the KV-cache transfer of disaggregated serving", "vLLM"),
    "bootstrap_host": ("the KV-cache transfer of disaggregated serving", "SGLang"),
    "bootstrap_port": ("the KV-cache transfer of disaggregated serving", "SGLang"),
    "bootstrap_room": ("the KV-cache transfer of disaggregated serving", "SGLang"),
    # template: how the prompt is built
    "chat_template": ("the chat template", "vLLM, SGLang"),
    "chat_template_kwargs": ("the chat template", "vLLM, SGLang, llama.cpp"),
    "add_generation_prompt": ("the chat template", "vLLM"),
    "continue_final_message": ("the chat template", "vLLM, SGLang"),
    "add_special_tokens": ("the prompt's special tokens", "vLLM"),
    "documents": ("the chat template", "vLLM"),
    "mm_processor_kwargs": ("the multimodal processor", "vLLM"),
    "tool_prompt": ("the tool prompt of the template", "TGI"),
    # server-side code, adapters and extensions
    "vllm_xargs": ("custom engine extensions", "vLLM"),
    "logits_processors": ("server-side logits processors", "vLLM"),
    "guided_decoding_backend": ("the structured-output backend", "vLLM"),
    "custom_logit_processor": ("server-side logits processors", "SGLang"),
    "custom_params": ("custom logits processors", "SGLang"),
    "lora_path": ("the LoRA adapter", "SGLang"),
    "lora": ("the LoRA adapters", "llama.cpp"),
    "adapter_id": ("the LoRA adapter", "TGI"),
    "return_hidden_states": ("hidden-state output (costly)", "SGLang"),
    "return_routed_experts": ("expert-routing output (costly)", "SGLang"),
}

#: fields an endpoint's own API defines that share a name with an engine field of another endpoint: never
#: screened there (rerank's ``documents`` are what is ranked, not vLLM's chat-template documents)
API_FIELDS: dict[str, frozenset[str]] = {"rerank": frozenset({"documents"})}

#: backend kinds whose engines schedule by the body's ``priority`` (lower = served first; the dialect table's)
PRIORITY_KINDS = frozenset(kind for kind, d in DIALECTS.items() if d.priority_scheduling)


def screen(body: dict[str, Any], policy: Any, model: str, endpoint: str = "chat") -> list[str]:
    """Check the client's ``body`` against the model's ``policy`` (``models.<model>.engine_fields``,
    an :class:`~servelab.gateway.config.EngineFields`) before anything is reserved. With ``action:
    refuse`` a listed field not in ``allow`` raises :class:`GatewayError` 400 ``engine_field_not_allowed``
    (the first one, by name); with ``drop`` such fields are removed from ``body`` and their names returned
    (sorted; empty when none). The ``endpoint``'s own fields (:data:`API_FIELDS`) are not screened."""
    own = API_FIELDS.get(endpoint, frozenset())
    found = sorted(f for f in body if f in ENGINE_FIELDS and f not in policy.allow and f not in own)
    if not found:
        return []
    if policy.action == "refuse":
        name = found[0]
        what, _ = ENGINE_FIELDS[name]
        raise GatewayError(
            400,
            f"'{name}' sets {what} and is not accepted for the model '{model}'; leave it out "
            f"(the operator may list it in models.{model}.engine_fields.allow)",
            code="engine_field_not_allowed",
            param=name,
        )
    for f in found:
        del body[f]
    return found


def apply(up: dict[str, Any], policy: Any, kind: str, priority_class: str, keep: Collection[str] = ()) -> None:
    """Make ``up`` (the body about to be sent to one backend of ``kind``) fit the served model's
    ``policy``: remove every listed field its ``allow`` does not name (except those in ``keep``: set by
    the operator, e.g. a fallback step's ``params``), then set ``priority`` from
    ``policy.priority[priority_class]`` when ``kind`` is in :data:`PRIORITY_KINDS` (for other kinds a
    mapped class sends no ``priority``; an unmapped class sends the client's only when ``allow`` names
    it). ``policy`` None (a model without an entry): every listed field is removed."""
    allow = policy.allow if policy is not None else ()
    for f in [f for f in up if f in ENGINE_FIELDS and f not in allow and f not in keep]:
        del up[f]
    mapping = policy.priority if policy is not None else {}
    if priority_class in mapping and "priority" not in keep:
        if kind in PRIORITY_KINDS:
            up["priority"] = mapping[priority_class]
        else:
            up.pop("priority", None)
