"""The extra limit scopes of one request: its application, its model and its client IP, per tenant.

``tenants.<t>.application_limits[<app>]`` (the key's ``application``, bound to the key in the config,
never a client header), ``tenants.<t>.model_limits[<public model>]`` and ``tenants.<t>.ip_limits``
(per client IP, :mod:`servelab.gateway.clientip`) each count all the tenant's requests in that scope
together, next to the per-key and per-tenant limits, in the same atomic admission
(:meth:`servelab.gateway.limits.Limiter.admit` ``extra``). Keys created through the admin API have no
application (only their key and tenant scopes, plus model and IP).
"""

from __future__ import annotations

from typing import Any

from servelab.gateway.limits import Limits

__all__ = ["application_of", "extra_scopes"]

_CACHE: dict[int, tuple[Any, dict[str, str], dict[tuple[str, str, str], Limits]]] = {}


def _tables(cfg: Any) -> tuple[dict[str, str], dict[tuple[str, str, str], Limits]]:
    hit = _CACHE.get(id(cfg))
    if hit is not None and hit[0] is cfg:
        return hit[1], hit[2]
    apps = {k.id: k.application for k in cfg.keys if k.application}
    lims: dict[tuple[str, str, str], Limits] = {}
    for tname, t in cfg.tenants.items():
        for app, sl in t.application_limits.items():
            lims[(tname, "app", app)] = Limits.from_obj(sl)
        for m, sl in t.model_limits.items():
            lims[(tname, "model", m)] = Limits.from_obj(sl)
        if t.ip_limits is not None:
            lims[(tname, "ip", "*")] = Limits.from_obj(t.ip_limits)
    _CACHE.clear()  # the config in force only
    _CACHE[id(cfg)] = (cfg, apps, lims)
    return apps, lims


def application_of(cfg: Any, key_id: str) -> str | None:
    """The application of key ``key_id`` in ``cfg`` (``keys[].application``), or None."""
    return _tables(cfg)[0].get(key_id)


def extra_scopes(cfg: Any, key_id: str, tenant: str, model: str, ip: str) -> list[tuple[str, str, Limits]]:
    """``[(kind, name, Limits)]`` for the request: ``("app", app, ...)``, ``("model", model, ...)``,
    ``("ip", ip, ...)`` where the tenant sets such limits; empty when it sets none."""
    apps, lims = _tables(cfg)
    if not lims:
        return []
    out: list[tuple[str, str, Limits]] = []
    app = apps.get(key_id)
    if app is not None and (lim := lims.get((tenant, "app", app))) is not None:
        out.append(("app", app, lim))
    if (lim := lims.get((tenant, "model", model))) is not None:
        out.append(("model", model, lim))
    if (lim := lims.get((tenant, "ip", "*"))) is not None:
        out.append(("ip", ip, lim))
    return out
