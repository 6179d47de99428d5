"""``servelab gateway``: one OpenAI-compatible entrance over many engines (docs/gateway-design.md).

Modules: ``config`` (validated YAML + published JSON Schema), ``errors`` (OpenAI-shaped errors),
``capabilities`` (registry checks before a request reaches an engine), ``server`` (the aiohttp app and
its hot path), ``metrics`` (Prometheus names), ``routing``/``breaker``/``health`` (where requests go),
``keys``/``limits``/``ledger``/``admin`` (who may send what, and what it cost), ``cli``.
Import submodules directly; this package imports nothing at start so ``servelab --help`` stays fast.
"""
