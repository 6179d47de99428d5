"""The ``env`` of an engine's settings: variables for the server process, with secret values kept out of
every dump (:mod:`servelab.engines.secrets`). One definition for every kind that takes ``env``
(``engine: command``, ``engine: vllm``): the field, its string coercion, ``secret_env`` and the
serializer that writes ``<secret sha256:…>`` instead of a secret value unless the dump is asked to
reveal them (``model_dump(context={"secrets": "reveal"})``, used only to build the process environment).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, FieldSerializationInfo, WithJsonSchema, field_serializer, field_validator, model_validator

from servelab.engines.kind import ENV_NAME_PATTERN, EngineSettings
from servelab.engines.secrets import redact_env, refuse_placeholder

__all__ = ["EnvSettings"]


class EnvSettings(EngineSettings):
    """Engine settings with ``env`` (name -> value; numbers become strings) and ``secret_env`` (names of
    ``env`` variables whose values are secret besides those whose names look secret). Raises a
    validation error when ``secret_env`` names a variable ``env`` does not set, or when a value is a
    fingerprint placeholder copied from a run folder."""

    env: Annotated[
        dict[Annotated[str, Field(pattern=ENV_NAME_PATTERN)], str],
        WithJsonSchema(
            {
                "type": "object",
                "propertyNames": {"pattern": ENV_NAME_PATTERN},
                "additionalProperties": {"type": ["string", "number"]},
                "description": "environment variables for the engine (numbers become strings)",
            }
        ),
    ] = Field(default_factory=dict)
    secret_env: list[Annotated[str, Field(pattern=ENV_NAME_PATTERN)]] = Field(
        default_factory=list,
        description="names of env variables whose values are secret (recorded as a sha256 "
        "fingerprint, never the value); names with TOKEN, KEY, SECRET, PASSWORD, PASS, CREDENTIAL, AUTH … are secret "
        "without being listed",
    )

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        if isinstance(v, dict):
            out = {}
            for k, val in v.items():
                if isinstance(val, bool) or not isinstance(val, (str, int, float)):
                    raise ValueError(f"value of {k!r} must be a string or number, got {val!r}")
                out[k] = str(val)
            return out
        return v

    @field_serializer("env")
    def _env_without_secrets(self, env: dict[str, str], info: FieldSerializationInfo) -> dict[str, str]:
        ctx = info.context if isinstance(info.context, dict) else {}
        return dict(env) if ctx.get("secrets") == "reveal" else redact_env(env, self.secret_env)

    @model_validator(mode="after")
    def _secrets_named(self) -> Any:
        unknown = [n for n in self.secret_env if n not in self.env]
        if unknown:
            raise ValueError(
                f"secret_env names {', '.join(unknown)}, not in env; list only variables that env sets "
                "(servelab records none of the environment it inherits)"
            )
        refuse_placeholder(self.env)
        return self

    def recorded_env(self, env: dict[str, str] | None = None) -> dict[str, str]:
        """``env`` (default: this ``env``) as evidence holds it: secret values fingerprinted."""
        return redact_env(self.env if env is None else env, self.secret_env)
