"""Issue 21 item 4: an ``engine: command`` candidate with ``env: {HF_TOKEN: …, OPENAI_API_KEY: …}`` had
the values printed when it started and stored verbatim in record.json, the self-contained report.html,
the copied experiment.yaml and the records index. A real trial (the mock engine started as a command,
a few seconds) now holds every secret value — names that look secret, and one the experiment marks in
``secret_env`` — as its name and a sha256 fingerprint: every file of the run folder, the records
database and the console are searched for the values."""

from __future__ import annotations

import html
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from servelab.engines.secrets import fingerprint, looks_secret, redact_env

SECRETS = {
    "HF_TOKEN": "hf_kq93JXbTr0tLwzYpQaV8",
    "OPENAI_API_KEY": "sk-7fNw2QvZr9HdLpXe4KcM",
    "MY_DB_URL": "postgresql://svc:Pw0rd9x4TqZ@db.internal/servelab",
}


def _experiment() -> dict:
    cand = {
        "name": "mockcmd",
        "engine": "command",
        "settings": {
            "argv": [
                sys.executable,
                "-m",
                "servelab.engines.mock",
                "--host",
                "{host}",
                "--port",
                "{port}",
                "--output-tokens",
                "4",
            ],
            "env": {**SECRETS, "PLAIN_SETTING": "visible-value"},
            "secret_env": ["MY_DB_URL"],
        },
    }
    return {
        "name": "secrets",
        "goal": {
            "task": "chat",
            "slo": "ttft_p95<=60s,error_rate<=5%",
            "quality": {"structured_valid_min": 0.0, "smoke": ["streaming"]},
        },
        "candidates": [cand],
        "workloads": [{"name": "short-qa", "set": {"input_tokens": 8, "output_tokens": 4}}],
        "steps": {"concurrency": [1]},
        "requests_per_step": 2,
        "warmup": 0,
        "repeats": 1,
        "mix_sweep": False,
        "arrival_test": {"enabled": False},
        "capacity": {"enabled": False},
        "lifecycle": {"warm_start": False},
        "checks": [],
    }


def test_no_secret_value_in_any_file_of_the_run(tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(_experiment()))
    out, db = tmp_path / "run", tmp_path / "records.db"
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "SERVELAB_RECORDS_DB": str(db)},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    files = [p for p in out.rglob("*") if p.is_file()] + [db]
    assert {"record.json", "report.html", "experiment.yaml"} <= {p.name for p in files}
    for where, data in [("console", (r.stdout + r.stderr).encode()), *((str(p), p.read_bytes()) for p in files)]:
        for name, value in SECRETS.items():
            assert value.encode() not in data, f"{name}'s value is in {where}"
    # ... and each is there by name, with its fingerprint, where the settings are recorded
    rec = json.loads((out / "record.json").read_text())
    engine = rec["identity"]["candidates"]["mockcmd"]["engine"]
    for name, value in SECRETS.items():
        want = f"<secret {fingerprint(value)}>"
        assert engine["settings"]["env"][name] == want and engine["launcher"]["env"][name] == want
        assert html.escape(want) in (out / "report.html").read_text() and want in r.stdout
        assert yaml.safe_load((out / "experiment.yaml").read_text())["candidates"][0]["settings"]["env"][name] == want
    assert engine["settings"]["env"]["PLAIN_SETTING"] == "visible-value"  # not a secret: kept as evidence
    # the copied experiment cannot start the engine with a fingerprint as its token: one line
    again = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(out / "experiment.yaml"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = again.stderr.strip().splitlines()
    assert again.returncode == 2 and len(lines) == 1, again.stderr
    assert "is the fingerprint a run folder keeps instead of the secret" in lines[0]


def test_secret_names_and_marked_names() -> None:
    for name in (
        "HF_TOKEN",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "PGPASSWORD",
        "hf_token",
        "AUTH_HEADER",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "VLLM_API_KEY",
    ):
        assert looks_secret(name), name
    for name in ("CUDA_VISIBLE_DEVICES", "VLLM_CPU_KVCACHE_SPACE", "OLLAMA_HOST", "PATH", "HF_HUB_OFFLINE"):
        assert not looks_secret(name), name
    got = redact_env({"A_URL": "x://u:p@h", "B": "1", "HF_TOKEN": "t"}, ["A_URL"])
    assert got == {
        "A_URL": f"<secret {fingerprint('x://u:p@h')}>",
        "B": "1",
        "HF_TOKEN": f"<secret {fingerprint('t')}>",
    }


def test_secret_env_must_name_env_variables(tmp_path: Path) -> None:
    d = _experiment()
    d["candidates"][0]["settings"]["secret_env"] = ["NOT_SET_HERE"]
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump(d))
    r = subprocess.run(
        [sys.executable, "-m", "servelab.cli", "trial", str(exp), "--check"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2 and "secret_env names NOT_SET_HERE, not in env" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
