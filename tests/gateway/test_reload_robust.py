"""Break-it report on 4b30bb7, defect 6, through a real gateway process: a deeply nested YAML saved by
the operator raised RecursionError out of ``reload()`` (which caught only ConfigError/ValueError), killed
the file watcher silently, and then SIGTERM cut every stream: ``close()`` re-raised from the dead watcher,
skipped the shutdown grace and printed a 1,100-line traceback. Now a failed load is one logged line, the
watcher lives on (a valid edit is picked up) and SIGTERM still drains streams."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.request
from typing import Any

import orjson
from conftest import gateway_key
from gateway.test_server import post


def _cfg(eng_root: str, entry: dict[str, str], *models: str) -> dict[str, Any]:
    return {
        "server": {"shutdown_grace_s": 10},
        "backends": [{"name": "b", "kind": "vllm", "base_url": eng_root, "models": list(models)}],
        "models": {m: {"targets": [{"backend": "b"}]} for m in models},
        "tenants": {"t": {}},
        "keys": [entry],
    }


def test_deep_yaml_keeps_watcher_and_sigterm_drains(gateway: Any, mock_engine: Any) -> None:
    eng = mock_engine("--dialect", "vllm", "--itl-ms", "20", "--output-tokens", "60")
    key, entry = gateway_key("k1", "t")
    gw = gateway(_cfg(eng.root, entry, "a"))
    tmp = gw.config_path.with_suffix(".tmp")
    tmp.write_text("a: " + "[" * 5000 + "]" * 5000 + "\n")  # 5,000 deep: refused by the loader's depth limit
    os.replace(tmp, gw.config_path)
    time.sleep(2.5)
    st, _, raw = post(
        gw.url + "/chat/completions",
        {"model": "a", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        key,
    )
    assert st == 200, raw  # the running config stays in force
    gw.write_config(_cfg(eng.root, entry, "a", "b2"))  # a valid edit: the watcher must still be alive
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        st, _, raw = post(gw.url + "/models", None, key)
        if b'"b2"' in raw:
            break
        time.sleep(0.3)
    assert b'"b2"' in raw, (raw, gw.stderr()[-2000:])
    # SIGTERM mid-stream: the stream finishes within the grace (60 tokens x 20 ms)
    got: list[bytes] = []

    def stream() -> None:
        req = urllib.request.Request(
            gw.url + "/chat/completions",
            data=orjson.dumps(
                {"model": "a", "stream": True, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 60}
            ),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as r:
            got.append(r.read())

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.4)
    gw.proc.send_signal(signal.SIGTERM)
    t.join(30)
    assert gw.proc.wait(30) == 0
    assert got and got[0].rstrip().endswith(b"data: [DONE]") and b"upstream_cut_off" not in got[0], got
    err = gw.stderr()
    assert "Traceback" not in err, err[-3000:]
    bad = [x for x in err.splitlines() if "reload" in x and "failed" in x]
    assert len(bad) == 1 and "nested deeper than" in bad[0] and "RecursionError" not in bad[0], bad
