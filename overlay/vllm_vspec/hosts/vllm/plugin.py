"""What `vllm_vspec.register()` does inside a vLLM process.

Each entry of REGISTRATIONS is a callable run once per process; later
features (the EAGLE model class, ...) append theirs here instead of growing an
if/elif chain.
"""

from __future__ import annotations

from typing import Callable

REGISTRATIONS: list[Callable[[], None]] = []

# The Qwen2 EAGLE-1 head (vLLM 0.32 dropped Qwen2ForCausalLMEagle).
from vllm_vspec.hosts.vllm.models import register_models  # noqa: E402

REGISTRATIONS.append(register_models)

# The Ascend overlay wheel's start-up line on its kernels (nothing elsewhere).
from vllm_vspec.hosts.ascend_wheel import log_kernel_state  # noqa: E402

REGISTRATIONS.append(log_kernel_state)

# The Ascend overlay wheel's engine core reads its workers' final graph mode
# (vllm_ascend/vspec/worker_graphs.py; nothing elsewhere).
from vllm_vspec.hosts.ascend_wheel import adopt_worker_graphs  # noqa: E402

REGISTRATIONS.append(adopt_worker_graphs)

# A requested API-server shutdown logs no traceback from the host's own
# teardown race (hosts/vllm/shutdown_log.py; a filter on vLLM's loggers).
from vllm_vspec.hosts.vllm.shutdown_log import install as quiet_shutdown_race  # noqa: E402

REGISTRATIONS.append(quiet_shutdown_race)

# The CPU attention backend with draft-tree masks (hosts/vllm/tree/attention.py).
TREE_ATTENTION_BACKEND = "vllm_vspec.hosts.vllm.tree.attention.TreeCPUAttentionBackend"


def register_tree_attention() -> None:
    """Overrides CPU_ATTN through vLLM's registry on the CPU platform (the
    only one that selects it; other hosts, vLLM-Ascend's pinned vLLM
    included, are left alone). In every CPU process, whatever the engine's
    settings: vLLM caches the backend class per process, so a per-engine
    choice would depend on which engine a process built first; without a
    tree the class runs host code only."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, TREE_ATTENTION_BACKEND)


REGISTRATIONS.append(register_tree_attention)

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    for fn in REGISTRATIONS:
        fn()
