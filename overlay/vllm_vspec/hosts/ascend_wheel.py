"""What an installed Ascend overlay wheel says about itself.

The wheel (build_overlay.py) is distribution `vllm-ascend`, version
`<host>+vspec<ours>` (`<host>+vspec<ours>.nocann` when built without CANN,
so `pip show` and the wheel's file name say so), and carries
`vspec_build_info.json` in its dist-info:
host, patches, and whether the host's and vspec's kernels were compiled. A
stock vLLM-Ascend, or none, has no such file. `vllm-vspec doctor` and the
start-up log of every vLLM process (a plugin registration) print the same
`kernels_statement` the wheel's METADATA carries, so nothing claims compiled
kernels that are not there.
"""

from __future__ import annotations

import importlib.metadata as md
import json

DIST = "vllm-ascend"
BUILD_INFO = "vspec_build_info.json"
# The last segment of the local version label of a wheel built without CANN
# (PEP 440: `0.23.0.post1+vspec0.1.0.nocann`); a wheel with CANN has none.
NO_CANN_LABEL = "nocann"


def build_info() -> dict | None:
    """The installed overlay wheel's build info, or None (no overlay wheel)."""
    try:
        text = md.distribution(DIST).read_text(BUILD_INFO)
    except md.PackageNotFoundError:
        return None
    return json.loads(text) if text else None


def adopt_worker_graphs() -> None:
    """On an installed overlay wheel: the engine core adopts the graph mode
    its workers resolved, before its scheduler decides the verify padding
    (vllm_ascend/vspec/worker_graphs.py; TP > 1 gives each worker its own
    copy of the config). Nothing elsewhere."""
    if build_info() is None:
        return
    from vllm_ascend.vspec import worker_graphs

    worker_graphs.install()


def log_kernel_state() -> None:
    """At start-up: say whether the installed overlay wheel has its kernels
    (a warning when it was built without CANN)."""
    info = build_info()
    if info is None:
        return
    from vllm.logger import init_logger

    # Under "vllm.": vLLM configures only its own logger tree.
    logger = init_logger(f"vllm.{__name__}")
    log = logger.info if info["custom_kernels"]["enabled"] else logger.warning
    log("vspec Ascend wheel (vllm-ascend %s): %s", info["host"]["version"],
        info["kernels_statement"])
