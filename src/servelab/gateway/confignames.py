"""The patterns and defaults several sections of the gateway file share (servelab.gateway.config)."""

from __future__ import annotations

__all__ = ["DEFAULT_REDACT", "ENV", "KEY_ID", "NAME"]

#: a name in the file: backends, pools, tenants, models, priority classes
NAME = r"^[A-Za-z0-9_.:-]{1,128}$"
#: a key id; no '-': keys are sk-sl-<key_id>-<secret>
KEY_ID = r"^[A-Za-z0-9_]{1,64}$"
#: an environment variable's name
ENV = r"^[A-Za-z_][A-Za-z0-9_]*$"
#: Redaction applied to logged prompts when a tenant sets ``log_prompts`` and gives no ``redact`` list:
#: e-mail addresses, API-key-like tokens, and runs of 9+ digits (card, phone, account numbers).
DEFAULT_REDACT = (r"[\w.+-]+@[\w-]+\.[\w.-]+", r"\b(?:sk|pk|rk)-[A-Za-z0-9_-]{8,}", r"\d[\d -]{7,}\d")
