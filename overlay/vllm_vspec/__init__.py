"""vllm_vspec: speculative decoding with dynamic gamma (vSpec Adaptive) for vLLM.

Public surface: `VSpecConfig` (every knob, one source of truth) and
`register` (the `vllm.general_plugins` entry point). Everything else is found
by file name: `controller.py`, `policies/`, `acceptance.py`, `hosts/`.
"""

from vllm_vspec.config import VSpecConfig

__version__ = "0.1.0"


def register() -> None:
    """vLLM general-plugin hook: runs in every vLLM process before the engine
    is built. It registers names with vLLM's public registries (models, and
    so on). It patches one vLLM method, and only on an installed Ascend
    overlay wheel: Executor.initialize_from_config also reads the workers'
    final graph mode (vllm_ascend/vspec/worker_graphs.py)."""
    from vllm_vspec.hosts.vllm import plugin as vllm_plugin

    vllm_plugin.register()


__all__ = ["VSpecConfig", "register", "__version__"]
