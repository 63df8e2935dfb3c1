"""Model runners that apply vspec's acceptance rule and entropy stop.

VSpecRunnerMixin adds, on top of vLLM's V1 model runner:
- a VSpecRejectionSampler when the acceptance rule is lossy, fed each step
  with every request's generated-token count (the rule's strict prefix);
- a proposer with the entropy stop (proposers.py) when `entropy_stop` is on,
  and the per-request cut of the drafts handed to the scheduler.
With the default settings (strict, no entropy stop) it changes nothing.
Workers in worker.py build these runners; select one with vLLM's
`worker_cls` (`--worker-cls`).
"""

from __future__ import annotations

import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_vspec.acceptance import AcceptanceRule
from vllm_vspec.adapters.vllm.proposers import entropy_stop_proposer
from vllm_vspec.adapters.vllm.rejection_sampler import VSpecRejectionSampler
from vllm_vspec.adapters.vllm.scheduler import vspec_config_from
from vllm_vspec.entropy import EntropyStop


class VSpecRunnerMixin:
    """Overrides shared by the CPU and GPU V1 model runners."""

    # extends GPUModelRunner.__init__: swaps in vspec's rejection sampler and
    # drafter when the settings need them (before any model is loaded).
    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        self._entropy_stop = False
        self._sticky_gamma0 = False
        cfg = vspec_config_from(vllm_config)
        if cfg is None or not hasattr(self, "drafter"):
            return  # no speculation, or not the rank that drafts
        self._sticky_gamma0 = cfg.enabled and cfg.min_gamma == 0 and cfg.gamma0_mode == "sticky"
        rule = AcceptanceRule.from_config(cfg)
        if not rule.lossless:
            self.rejection_sampler = VSpecRejectionSampler(
                self.sampler, self.speculative_config, self.device, rule)
        if cfg.entropy_stop:
            self.drafter = entropy_stop_proposer(self.drafter, self.vllm_config, self.device,
                                                 self, EntropyStop.from_config(cfg))
            self._entropy_stop = True

    # extends GPUModelRunner._sample: tells the lossy rule how many tokens each
    # request had generated before this step's drafts.
    def _sample(self, logits, spec_decode_metadata):
        if spec_decode_metadata is not None and isinstance(self.rejection_sampler,
                                                           VSpecRejectionSampler):
            batch = self.input_batch
            n = batch.num_reqs
            generated = (batch.num_tokens_no_spec_cpu_tensor[:n].long()
                         - batch.num_prompt_tokens_cpu_tensor[:n].long())
            self.rejection_sampler.generated = generated.to(self.device, non_blocking=True)
        return super()._sample(logits, spec_decode_metadata)

    # extends GPUModelRunner.propose_draft_token_ids: a sticky gamma-0 step
    # runs no draft forward at all (the scheduler then keeps gamma 0 until
    # every request whose draft KV missed such a step has finished).
    def propose_draft_token_ids(self, scheduler_output, *args, **kwargs):
        if self._sticky_gamma0 and scheduler_output.num_spec_tokens_to_schedule == 0:
            return torch.empty(self.input_batch.num_reqs, 0, dtype=torch.int64,
                               device=self.device)
        return super().propose_draft_token_ids(scheduler_output, *args, **kwargs)

    # extends GPUModelRunner.take_draft_token_ids: cuts each request's draft at
    # its entropy stop before the scheduler schedules it.
    def take_draft_token_ids(self) -> DraftTokenIds | None:
        out = super().take_draft_token_ids()
        if not self._entropy_stop:
            return out
        lengths = self.drafter.take_draft_lengths()
        if out is None or lengths is None:
            return out
        # Drafts and lengths share the row order of the batch they were
        # proposed for; the drafts are on the host already, so is this.
        keep = lengths.tolist()
        return DraftTokenIds(out.req_ids, [d[:k] for d, k in zip(out.draft_token_ids, keep)])


class VSpecCPUModelRunner(VSpecRunnerMixin, CPUModelRunner):
    """vLLM's CPU model runner with vspec's rule and entropy stop."""


class VSpecGPUModelRunner(VSpecRunnerMixin, GPUModelRunner):
    """vLLM's GPU (V1) model runner with vspec's rule and entropy stop."""
