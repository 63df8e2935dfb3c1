"""What `vllm_vspec.register()` does inside a vLLM process.

Each entry of REGISTRATIONS is a callable run once per process; later
features (the EAGLE model class, ...) append theirs here instead of growing an
if/elif chain.
"""

from __future__ import annotations

from typing import Callable

REGISTRATIONS: list[Callable[[], None]] = []

# The Qwen2 EAGLE-1 head (vLLM 0.32 dropped Qwen2ForCausalLMEagle).
from vllm_vspec.adapters.vllm.models import register_models  # noqa: E402

REGISTRATIONS.append(register_models)

# The Ascend overlay wheel's start-up line on its kernels (nothing elsewhere).
from vllm_vspec.ascend_wheel import log_kernel_state  # noqa: E402

REGISTRATIONS.append(log_kernel_state)

_done = False


def register() -> None:
    global _done
    if _done:
        return
    _done = True
    for fn in REGISTRATIONS:
        fn()
