"""The type of free-form JSON: an object whose values are any JSON (what a server answers, a file such
as ``tokenizer_config.json``, a request body, a model's ``model_dump(mode="json")``)."""

from __future__ import annotations

from pydantic import JsonValue

__all__ = ["JsonObject"]

#: a JSON object: string keys, JSON values
JsonObject = dict[str, JsonValue]
