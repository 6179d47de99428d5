"""The identity of the machine a run's load (and a trial's engines) ran on: CPU model, logical cores,
RAM, OS and Python — recorded by the bench (``identity.json``) and the trial (``environment.host``)."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

__all__ = ["host_identity"]


def host_identity() -> dict[str, Any]:
    """CPU model, logical cores, RAM bytes, OS and Python of the machine running the load."""
    import psutil

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "ram_bytes": psutil.virtual_memory().total,
        "os": platform.platform(),
        "python": sys.version.split()[0],
    }
