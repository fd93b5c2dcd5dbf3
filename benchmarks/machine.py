"""Who measured a figure: CPU, cores, library versions and date, stored with every result."""
from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine_info(**extra: object) -> dict[str, object]:
    """A JSON-ready description of this machine and the libraries that produced a result.

    ``extra`` adds what only the measuring processes know (e.g. the MPI library's version,
    reported by rank 0, so this process never has to initialise MPI itself).
    """
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "mpi4py": _version("mpi4py"),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }
