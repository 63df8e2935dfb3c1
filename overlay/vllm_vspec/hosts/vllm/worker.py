"""Workers that build vspec's model runners (model_runner.py).

Select with vLLM's `worker_cls`, e.g. `--worker-cls
vllm_vspec.hosts.vllm.worker.VSpecCPUWorker` (CPU_WORKER_CLS). Needed for
a lossy acceptance rule, the entropy stop, the lazy gamma 0 and gamma-0
steps sampled without the rejection sampler; dynamic gamma itself comes from
the scheduler (scheduler.py).
"""

from __future__ import annotations

from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import Worker

from vllm_vspec.hosts.vllm.model_runner import VSpecCPUModelRunner, VSpecGPUModelRunner
from vllm_vspec.config import VSpecConfigError
from vllm_vspec.hosts.wiring import WORKER_CLS

# The paths that select these workers, spelled once (wiring.WORKER_CLS).
CPU_WORKER_CLS = WORKER_CLS["cpu"]
GPU_WORKER_CLS = WORKER_CLS["cuda"]


class VSpecCPUWorker(CPUWorker):
    """vLLM's CPU worker running VSpecCPUModelRunner (`runner_cls`)."""

    runner_cls: type = VSpecCPUModelRunner

    # extends CPUWorker.init_device: it builds the stock runner as its last
    # step, before any weights or KV cache exist; replace that runner with ours.
    def init_device(self) -> None:
        super().init_device()
        self.model_runner = self.runner_cls(self.vllm_config, self.device)


class VSpecGPUWorker(Worker):
    """vLLM's GPU worker running VSpecGPUModelRunner (`runner_cls`; V1
    runner only)."""

    runner_cls: type = VSpecGPUModelRunner

    # extends Worker._make_model_runner (the host's hook for this): our V1 runner.
    def _make_model_runner(self):
        if self.use_v2_model_runner:
            raise VSpecConfigError(
                "worker_cls", GPU_WORKER_CLS,
                "the V1 model runner: set VLLM_USE_V2_MODEL_RUNNER=0")
        return self.runner_cls(self.vllm_config, self.device)
