"""vLLM's CUDA platform with vspec's start-up hook (platform.py). Imported
only where vLLM picks the CUDA platform: vllm.platforms.cuda needs vLLM's
CUDA build."""

from __future__ import annotations

from vllm.platforms.cuda import CudaPlatform

from vllm_vspec.hosts.vllm import platform


class VSpecCudaPlatform(CudaPlatform):
    """CudaPlatform (the NVML or non-NVML class vLLM picked); a `vspec`
    table selects and checks vspec's classes."""

    # extends CudaPlatformBase.check_and_update_config: vspec's classes where
    # the user named none, and its settings checked before any model loads.
    @classmethod
    def check_and_update_config(cls, vllm_config) -> None:
        chosen = platform.before_host(vllm_config, "cuda")
        super().check_and_update_config(vllm_config)
        platform.after_host(vllm_config, "cuda", chosen)
