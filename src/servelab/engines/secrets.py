"""Secret environment values of a launched engine, kept out of every piece of trial evidence.

An ``engine: command`` candidate often needs credentials in its environment (``HF_TOKEN`` to download
weights, ``OPENAI_API_KEY``/``VLLM_API_KEY`` for the server's own auth). The trial's evidence — the
console, ``record.json``, the self-contained ``report.html`` made to be shared, the copied
``experiment.yaml`` and the records index — holds each such variable as its name and a fingerprint,
never its value:

- a variable is secret when its name looks secret (:func:`looks_secret`: it contains one of
  :data:`SECRET_WORDS`, e.g. ``HF_TOKEN``, ``OPENAI_API_KEY``, ``AWS_SECRET_ACCESS_KEY``,
  ``DB_PASSWORD``) or when the experiment lists it in the candidate's ``secret_env``;
- its value is written as :func:`redacted`: ``<secret sha256:1a2b3c4d5e6f>``, the first 12 hex digits
  (48 bits) of the value's SHA-256: two runs with the same token show the same fingerprint, and the
  token cannot be read back from it (the digest of a high-entropy token is not invertible; a short
  guessable password is only as safe as the password);
- a copied experiment read again (``servelab trial RUN/experiment.yaml``) refuses such a placeholder
  with one line (:func:`refuse_placeholder`) rather than start the engine with the fingerprint as the
  token: give the value again, or leave it out of ``env`` and export it (``inherit_env: true``, the
  default, passes servelab's own environment to the engine, and servelab records none of it).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

__all__ = [
    "FINGERPRINT_HEX",
    "SECRET_WORDS",
    "fingerprint",
    "is_placeholder",
    "looks_secret",
    "redact_env",
    "redacted",
    "refuse_placeholder",
]

#: name parts that make an environment variable secret (matched anywhere in the name, any case: ``APIKEY``,
#: ``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, ``PGPASSWORD``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AUTH_HEADER``)
SECRET_WORDS = (
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASS",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
    "PRIVATE",
    "SIGNATURE",
)
_SECRET_RX = re.compile("|".join(SECRET_WORDS), re.IGNORECASE)
#: hex digits of the SHA-256 kept in a fingerprint
FINGERPRINT_HEX = 12
_PLACEHOLDER_RX = re.compile(rf"^<secret sha256:[0-9a-f]{{{FINGERPRINT_HEX}}}>$")


def looks_secret(name: str) -> bool:
    """Whether the environment variable ``name`` looks like it holds a credential (one of
    :data:`SECRET_WORDS` in it, any case). Over-matching is harmless: the value is only fingerprinted."""
    return _SECRET_RX.search(name) is not None


def fingerprint(value: str) -> str:
    """``sha256:`` and the first :data:`FINGERPRINT_HEX` hex digits of ``value``'s SHA-256 (UTF-8)."""
    return "sha256:" + hashlib.sha256(value.encode("utf-8")).hexdigest()[:FINGERPRINT_HEX]


def redacted(value: str) -> str:
    """What the evidence holds instead of a secret ``value``: ``<secret sha256:…>`` (a placeholder stays as it is)."""
    return value if is_placeholder(value) else f"<secret {fingerprint(value)}>"


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is a :func:`redacted` placeholder (a copied experiment's secret)."""
    return _PLACEHOLDER_RX.match(value) is not None


def redact_env(env: Mapping[str, str], secret_names: Iterable[str] = ()) -> dict[str, str]:
    """``env`` with the value of every secret variable (:func:`looks_secret`, or named in
    ``secret_names``) replaced by :func:`redacted`; the others as they are."""
    marked = set(secret_names)
    return {k: redacted(v) if k in marked or looks_secret(k) else v for k, v in env.items()}


def refuse_placeholder(env: Mapping[str, str]) -> None:
    """Raise :class:`ValueError` (one line) when a value of ``env`` is a :func:`redacted` placeholder: the
    experiment was copied from a run folder, where secrets are kept as fingerprints only."""
    for k, v in env.items():
        if is_placeholder(v):
            raise ValueError(
                f"env {k}: {v} is the fingerprint a run folder keeps instead of the secret, not its "
                f"value; give the value, or leave {k} out of env and export it (inherit_env: true "
                "passes servelab's environment to the engine)"
            )
