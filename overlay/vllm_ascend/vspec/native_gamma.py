"""vspec on vLLM-Ascend hosts that carry per-step K themselves (not yet run on NPU).

Routed in by the host's `host.toml` (patches/vllm-ascend/<version>/overlay.toml)
on vLLM-Ascend 0.30.0rc2, whose runner and proposers already draft a
different K every step:

- NPUModelRunner.propose_draft_token_ids passes
  `num_speculative_tokens=scheduler_output.num_spec_tokens_to_schedule` to
  `drafter._propose` (host worker/model_runner_v1.py:2098-2099), a field
  vLLM 0.30 declares (vllm/v1/core/sched/output.py:305) and
  VSpecScheduler writes every step;
- AscendSpecDecodeBaseProposer._propose assigns `self.num_speculative_tokens`
  from it on entry (spec_decode/llm_base_proposer.py:1046) and drafts that
  many tokens, returning a `[batch, K_step]` draft;
- the runner copies a draft of any width up to K and records the width for
  the next step (`prev_num_spec_tokens`, model_runner_v1.py:2170-2205), and
  vLLM 0.30's AsyncScheduler sizes the next step's placeholders by the step's
  K (vllm/v1/core/sched/async_scheduler.py:23-25).

So here the host carries the gamma, and none of the 0.23-era machinery of
proposers.py is used: no `num_speculative_tokens` property (on this host its
setter would turn every per-step assignment into the maximum K: the contract
check in vllm_vspec/tools/abi_check.py fails on that), no K-column padding,
no per-gamma graph wrappers or graph-parameter keys (graph_params.py), and the
host's own `prepare_next_token_ids_padded` instead of the vspec commit op.

What the host lacks, and this module adds:
- gamma 0 that keeps the drafter aligned: at K = 0 the host returns an empty
  draft without any draft pass (llm_base_proposer.py:1048-1058), so the draft
  model's KV cache would miss the step's tokens and later drafts would read
  stale positions. Here the first draft pass runs (as K = 1, which writes the
  draft KV of the step's tokens) and its draft is dropped: a `[batch, 0]`
  draft, what the host returns for K = 0 (as on 0.23 and vLLM 0.32);
- the step's gamma checked (0 <= gamma <= K, 1 + gamma <= 16), naming it;
- entropy stop, vspec's draft head and the diagnostics traces, through the
  base shared with 0.23 (drafting.VSpecAscendProposer);
- the draft model runs eagerly under vspec (the host's own `use_cuda_graph`
  switch, llm_base_proposer.py:239-273): the host captures one draft graph at
  the configured K (dummy_run's loop over `num_speculative_tokens`, line 888),
  which a step with a smaller K would replay, and vLLM 0.30 itself turns full
  graphs off under its dynamic K (vllm/config/vllm.py:972-989). The target
  keeps its graphs.
The controller, the lossy rules (sampler.py) and the scheduler are the same
as on every host.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.logger import init_logger

from vllm_ascend.spec_decode.draft_proposer import AscendDraftModelProposer
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer
from vllm_ascend.vspec.drafting import VSpecAscendProposer, by_name
from vllm_ascend.vspec.gamma import valid_gamma
from vllm_ascend.vspec.proposers import run_draft_eagerly
from vllm_ascend.vspec.routing import vspec_settings
from vllm_ascend.vspec.sampler import VSpecAscendRejectionSampler

# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


class NativeGammaProposer(VSpecAscendProposer):
    """What vspec adds to a host proposer that drafts the step's K itself.
    The first base of each subclass below, before the host proposer (its
    attributes shadow the host's); `max_num_speculative_tokens` (the
    configured K) is what the entropy stop's buffer is sized by."""

    # Extends AscendSpecDecodeBaseProposer.__init__: records the configured K
    # (the host's __init__ sets num_speculative_tokens to it; each _propose
    # then overwrites it with the step's K) and runs the draft model eagerly.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_num_speculative_tokens = self.num_speculative_tokens
        if self.use_cuda_graph and vspec_settings(self.vllm_config) is not None:
            logger.info("vspec: the draft model runs eagerly on this host (one draft graph "
                        "captured at K would be replayed by smaller steps); the target keeps "
                        "its ACL graphs")
            # This host keeps the workaround in spec_decode/utils.py (its
            # __init__ sets it at llm_base_proposer.py:271-273). Imported
            # here: stand-in hosts in the tests lack it.
            from vllm_ascend.spec_decode.utils import _maybe_eager_context

            run_draft_eagerly(self, _maybe_eager_context)

    # Extends AscendSpecDecodeBaseProposer._propose: the host drafts the K it
    # is passed, as one drafter step of vspec's drafter options
    # (drafting.AscendDrafting.propose); gamma 0 still runs the first draft
    # pass. Arguments are read by the host signature's names (by_name):
    # NPUModelRunner passes them by keyword, callers may pass them by position.
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs = by_name(super()._propose, args, kwargs)
        gamma = valid_gamma(kwargs["num_speculative_tokens"], self.max_num_speculative_tokens)
        self.drafting.new_pass()
        draft = self.drafting.propose(
            lambda: super(NativeGammaProposer, self)._propose(
                **{**kwargs, "num_speculative_tokens": max(gamma, 1)}), kwargs, gamma)
        return draft[:, :gamma]


class VSpecNativeEagleProposer(NativeGammaProposer, AscendEagleProposer):
    """EAGLE drafting at the host's per-step K, with vspec's gamma 0 and options."""


class VSpecNativeDraftModelProposer(NativeGammaProposer, AscendDraftModelProposer):
    """Draft-model drafting at the host's per-step K, with vspec's gamma 0 and options."""


class VSpecNativeRejectionSampler(VSpecAscendRejectionSampler):
    """The lossy rules (sampler.py) where the host builds its rejection sampler
    as AscendRejectionSampler(sampler, spec_config, device) (0.30
    model_runner_v1.py:765-767; patch 0003 passes the same arguments to
    routing.rejection_sampler_factory's result). Those two arguments only
    configure vLLM's synthetic rejection sampling (vllm/v1/sample/
    rejection_sampler.py:84-93), which replaces acceptance altogether, so a
    lossy rule refuses it instead of dropping it."""

    # Extends VSpecAscendRejectionSampler.__init__: takes the host's arguments too.
    def __init__(self, sampler: Any, spec_config: Any = None, device: Any = None, **vspec: Any):
        if getattr(spec_config, "rejection_sample_method", None) == "synthetic":
            raise ValueError("vspec's lossy acceptance rules (acceptance=relaxed_topk/margin) "
                             "cannot run with rejection_sample_method='synthetic', which "
                             "replaces acceptance; use one of them")
        super().__init__(sampler, **vspec)
