"""``servelab keys create|list|revoke|generate``: manage gateway API keys.

``create``/``list``/``revoke`` talk to a running gateway's admin port over HTTP (``--admin-url``, default
``$SERVELAB_ADMIN_URL`` or ``http://127.0.0.1:8081``) with the admin token from the environment variable
named by ``--token-env`` (default ``SERVELAB_ADMIN_TOKEN``). ``generate`` works offline: it prints a new
key and the ``keys:`` entry to paste into the gateway config. Every failure is one line, exit 2.
"""

from __future__ import annotations

import os
import secrets
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

import orjson
import typer

from servelab.gateway.keys import SECRET_BYTES, check_key_id, format_key, hash_secret
from servelab.wire.errors import ConfigError

__all__ = ["admin_request", "keys_app"]

keys_app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Create, list and revoke gateway API keys (through the gateway's admin port).",
)

_URL_OPT = typer.Option(
    None, "--admin-url", help="The gateway's admin URL [default: $SERVELAB_ADMIN_URL or http://127.0.0.1:8081]."
)
_TOKEN_OPT = typer.Option("SERVELAB_ADMIN_TOKEN", "--token-env", help="Environment variable holding the admin token.")
_JSON_OPT = typer.Option(False, "--json", help="Print the answer as JSON.")


def admin_request(
    method: str, path: str, admin_url: str | None, token_env: str, body: Any = None, timeout_s: float = 10.0
) -> Any:
    """One admin request; returns the decoded JSON answer or raises :class:`ConfigError` (one line)."""
    base = (admin_url or os.environ.get("SERVELAB_ADMIN_URL") or "http://127.0.0.1:8081").rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"--admin-url {base!r} is not an http(s) URL; use e.g. http://127.0.0.1:8081")
    token = os.environ.get(token_env, "").strip()
    if not token:
        raise ConfigError(
            f"environment variable {token_env} is empty; export the gateway's admin token "
            "(or name another variable with --token-env)"
        )
    data = None if body is None else orjson.dumps(body)
    req = urllib.request.Request(
        base + path,
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return orjson.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        try:
            msg = orjson.loads(e.read())["error"]["message"]
        except Exception:  # noqa: BLE001 — an error body not in our shape: show the HTTP reason
            msg = e.reason
        if e.code == 401:
            raise ConfigError(
                f"the admin port at {base} rejected the token in {token_env}; export the gateway's admin token"
            ) from None
        raise ConfigError(f"admin port answered {e.code}: {msg}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ConfigError(
            f"cannot reach the gateway's admin port at {base} ({reason}); start the gateway or pass --admin-url"
        ) from None


def _when(ts: float | None) -> str:
    return "-" if ts is None else datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _models_arg(models: list[str] | None) -> list[str] | None:
    if not models:
        return None
    return [m.strip() for item in models for m in item.split(",") if m.strip()]


@keys_app.command("create")
def create_command(
    tenant: str = typer.Option(..., "--tenant", help="Tenant (from the gateway config) the key belongs to."),
    models: list[str] = typer.Option(
        None,
        "--models",
        help="Public models the key may use (repeat or comma-separated) [default: whatever the tenant may use].",
    ),
    key_id: str = typer.Option(None, "--key-id", help="Id of the key [default: random]. Letters, digits, '_'."),
    rpm: int = typer.Option(None, "--rpm", min=0, help="Requests per minute for this key (overrides the tenant's)."),
    tpm: int = typer.Option(None, "--tpm", min=0, help="Tokens per minute for this key."),
    max_concurrency: int = typer.Option(None, "--max-concurrency", min=0, help="Requests in flight for this key."),
    token_budget: int = typer.Option(None, "--token-budget", min=0, help="Total tokens for this key."),
    admin_url: str = _URL_OPT,
    token_env: str = _TOKEN_OPT,
    as_json: bool = _JSON_OPT,
) -> None:
    """Create a key; prints it once (it cannot be shown again)."""
    if key_id is not None:
        try:
            check_key_id(key_id)
        except ValueError as e:
            raise ConfigError(f"--key-id: {e}") from None
    limits = {
        k: v
        for k, v in (("rpm", rpm), ("tpm", tpm), ("max_concurrency", max_concurrency), ("token_budget", token_budget))
        if v is not None
    }
    res = admin_request(
        "POST",
        "/admin/keys",
        admin_url,
        token_env,
        {"tenant": tenant, "allowed_models": _models_arg(models), "key_id": key_id, "limits": limits},
    )
    if as_json:
        typer.echo(orjson.dumps(res).decode())
        return
    models_txt = ",".join(res["allowed_models"]) if res.get("allowed_models") else "(tenant's)"
    typer.echo(f"key_id {res['key_id']}  tenant {res['tenant']}  models {models_txt}", err=True)
    typer.echo("store this key now; it is not shown again:", err=True)
    typer.echo(res["key"])


@keys_app.command("list")
def list_command(admin_url: str = _URL_OPT, token_env: str = _TOKEN_OPT, as_json: bool = _JSON_OPT) -> None:
    """List keys (ids, tenants, models, state; never secrets)."""
    res = admin_request("GET", "/admin/keys", admin_url, token_env)
    if as_json:
        typer.echo(orjson.dumps(res).decode())
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("key_id", "tenant", "models", "source", "created", "state", "limits")
    for k in res["keys"]:
        table.add_row(
            k["key_id"],
            k["tenant"],
            ",".join(k["allowed_models"] or ["(tenant's)"]),
            k["source"],
            _when(k.get("created_ts")),
            "revoked" if k["revoked"] else "active",
            " ".join(f"{n}={v}" for n, v in (k.get("limits") or {}).items()) or "-",
        )
    Console().print(table)


@keys_app.command("revoke")
def revoke_command(
    key_id: str = typer.Argument(..., help="Id of the key to revoke."),
    admin_url: str = _URL_OPT,
    token_env: str = _TOKEN_OPT,
) -> None:
    """Revoke a key at once (also a key from the config file: the revocation is persisted)."""
    admin_request("DELETE", f"/admin/keys/{urllib.parse.quote(key_id, safe='')}", admin_url, token_env)
    typer.echo(f"revoked {key_id}")


@keys_app.command("generate")
def generate_command(
    key_id: str = typer.Option(..., "--key-id", help="Id of the key (letters, digits, '_')."),
    tenant: str = typer.Option(..., "--tenant", help="Tenant the key belongs to."),
) -> None:
    """Offline: print a new key (stdout) and the config entry holding only its hash (stderr)."""
    try:
        check_key_id(key_id)
    except ValueError as e:
        raise ConfigError(f"--key-id: {e}") from None
    secret = secrets.token_hex(SECRET_BYTES)
    typer.echo("add to the gateway config under keys: (the key below is not stored anywhere):", err=True)
    typer.echo(f"  - {{id: {key_id}, tenant: {tenant}, sha256: {hash_secret(secret)}}}", err=True)
    typer.echo(format_key(key_id, secret))
