"""vLLM's CPU platform with vspec's start-up hook (platform.py)."""

from __future__ import annotations

from vllm.platforms.cpu import CpuPlatform

from vllm_vspec.hosts.vllm import platform


class VSpecCpuPlatform(CpuPlatform):
    """CpuPlatform; a `vspec` table selects and checks vspec's classes."""

    # extends CpuPlatform.check_and_update_config: vspec's classes where the
    # user named none, and its settings checked before any model loads.
    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        chosen = platform.before_host(vllm_config, "cpu")
        super().check_and_update_config(vllm_config)
        platform.after_host(vllm_config, "cpu", chosen)
