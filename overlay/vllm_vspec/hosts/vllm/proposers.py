"""vspec's draft proposers on vLLM 0.32: one subclass per host proposer class.

PROPOSERS maps vLLM's class to ours: DraftModelProposer ->
VSpecDraftModelProposer, EagleProposer (EAGLE-1, EAGLE-3, MTP) ->
VSpecEagleProposer. Both extend the host's methods through VSpecProposer,
where each extension is written once:

- `_greedy_sample`, where every greedy draft token comes from: the draft
  head (kernels/draft_head.py: an active vocabulary on pure-greedy steps
  and/or int8 weights; else the drafter's own LM head) gives the logits,
  the token is their argmax mapped to a full-vocabulary id, and then each
  observer of `observers` sees them, in list order (hosts/draft_observers.py).
  With no head and no observer that reads logits it is the host's own (which
  also covers local argmax reduction and a draft vocabulary of its own). The
  target verifies with its own full head, so strict acceptance stays exact.
- `propose`: the observers begin and end each drafter step around it; on the
  EAGLE proposer, the call tree/eagle_drafter asked for drafts a tree
  (tree/proposer.TreeDrafting, `tree`).
- `prepare_next_token_ids_padded` / `_cpu`: the first drafter calls of a
  step; the observers see the committed tokens, and the padded one commits
  through vspec's op (commit_op.py).
- `load_model`: the head is built on the loaded LM head; the observers see
  the model.

The observers, in order (those the settings turn on): the tree step's first
pass (EAGLE, `tree`), the draft probabilities for policy `budget`
(`draft_probs`), the entropy stop's record (`entropy`: per-request draft
lengths the runner cuts each draft to, so a stop only ever shortens the
gamma the scheduler asked for) and the diagnostics traces (`traces`,
hosts/diagnostics.py: per drafter step, draft tokens, draft forward
inputs/outputs, target hidden states and committed tokens).

The draft-model proposer also has the catch-up pass of a lazy gamma 0
(draft_lag.py): after steps that skipped the drafter, it writes the draft
KV of the positions those steps processed before the drafter drafts again.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.sample.sampler import _SAMPLING_EPS
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_vspec.hosts.vllm.commit_op import commit_accepted
from vllm_vspec.hosts.vllm.drafter_batch import drafter_batch, run_pass
from vllm_vspec.hosts.vllm.tree.proposer import TreeDrafting
from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.hosts.diagnostics import DrafterTraces, TraceOptions
from vllm_vspec.hosts.draft_observers import DraftObserver, DraftProbs, EntropyRecord
from vllm_vspec.core.drafter_keys import drafter_features, pure_greedy, refuse_head, wants_head
from vllm_vspec.kernels import ops
from vllm_vspec.kernels.draft_head import DraftHead, draft_head_for
from vllm_vspec.core.draft_lag import Segment, catch_up_passes
from vllm_vspec.kernels.entropy import EntropyStop


class VSpecProposer:
    """vspec's extensions of a SpecDecodeBaseProposer subclass (module
    docstring), mixed in before the host class; its subclasses below are
    the proposers the runner builds."""

    drafts_trees = False  # True: the proposer has tree drafting (`tree`, first observer)

    # extends SpecDecodeBaseProposer.__init__: loads vspec's ops (the compiled
    # library, else the torch implementation with one warning naming why:
    # kernels/ops.py load) and builds the head settings and the observers.
    def __init__(self, *args, head_config: VSpecConfig | None = None,
                 entropy_stop: EntropyStop | None = None, traces: TraceOptions | None = None,
                 record_draft_probs: bool = False, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.vspec_ops = ops.load(torch.device(self.device).type)
        # The host's own greedy variants never hold the full logits.
        partial_logits = (self.use_local_argmax_reduction
                          or getattr(self, "use_heterogeneous_vocab", False))
        self.head_config = head_config
        self.draft_head: DraftHead | None = None
        self._pure_greedy = False
        if head_config is not None:
            if partial_logits:
                refuse_head(head_config, "not with local argmax reduction or a heterogeneous "
                            "draft vocabulary")
            if self.vllm_config.parallel_config.tensor_parallel_size != 1:
                refuse_head(head_config,
                            "only with tensor_parallel_size 1 (the head is not sharded)")
        self.entropy = None if entropy_stop is None else EntropyRecord(entropy_stop)
        if self.entropy is not None and (
                self.speculative_config.draft_sample_method != "greedy" or partial_logits):
            raise VSpecConfigError(
                "entropy_stop", True,
                "only with greedy draft sampling over the target's vocabulary "
                "(draft_sample_method='greedy', no local argmax reduction, "
                "no heterogeneous vocab)")
        self.tree = TreeDrafting(self) if self.drafts_trees else None
        # With partial logits the drafts are not scored, and draft as before.
        self.draft_probs = DraftProbs() if record_draft_probs and not partial_logits else None
        self.traces = DrafterTraces.open(traces, kwargs.get("runner"), _SAMPLING_EPS,
                                         lambda: self.head_in_use)
        self.observers: tuple[DraftObserver, ...] = tuple(
            o for o in (self.tree, self.draft_probs, self.entropy, self.traces) if o is not None)

    # extends SpecDecodeBaseProposer.load_model: the drafter's LM head exists
    # only now (EAGLE: the target's, shared inside load_model).
    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if self.head_config is not None:
            self.draft_head = draft_head_for(self.model, self.head_config)
        for observer in self.observers:
            observer.loaded(self.model)

    @property
    def head_in_use(self) -> str:
        """`active` when this step drafts from the active vocabulary, else `full`."""
        return "full" if self.draft_head is None else self.draft_head.name(self._pure_greedy)

    def _draft_logits(self, hidden_states: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, ids) of the draft head: column j of logits scores token
        ids[j] (ids None: token j)."""
        head = self.draft_head
        got = None if head is None else head.logits(hidden_states, restricted=self._pure_greedy)
        return got if got is not None else (self.model.compute_logits(hidden_states), None)

    # extends SpecDecodeBaseProposer._greedy_sample, the one call every greedy
    # draft token of the host's propose comes from: the head's argmax, then
    # the observers see its logits (module docstring).
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.draft_head is None and not any(o.reads_logits for o in self.observers):
            return super()._greedy_sample(hidden_states)
        logits, ids = self._draft_logits(hidden_states)
        tokens = DraftHead.to_full_ids(logits.argmax(dim=-1), ids)
        for observer in self.observers:
            observer.sampled(hidden_states, logits, ids)
        return tokens

    # extends SpecDecodeBaseProposer.propose: one drafter step, which the
    # observers begin and end; the active vocabulary drafts only a pure-greedy
    # batch (its premise). The runner passes every argument by keyword.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        self._pure_greedy = pure_greedy(kwargs["sampling_metadata"])
        width = None if self.tree is None else self.tree.take_width()
        for observer in self.observers:
            observer.begin(kwargs)
        drafts = None
        try:
            drafts = (self.host_propose(*args, **kwargs) if width is None
                      else self.tree.propose_as_tree(width, kwargs))
        finally:
            for observer in self.observers:
                observer.end(drafts)
        return drafts

    def host_propose(self, *args, **kwargs) -> torch.Tensor:
        """The host's propose alone (a tree step's first pass)."""
        return super().propose(*args, **kwargs)

    # extends SpecDecodeBaseProposer.prepare_next_token_ids_padded (the first
    # drafter call of a step): the same two results from vspec's commit op
    # instead of the host kernel (commit_op.py); the observers see the step's
    # committed tokens first.
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        batch = sampled_token_ids.shape[0]
        for observer in self.observers:
            observer.committed(sampled_token_ids, discard_request_mask[:batch])
        return commit_accepted(self, sampled_token_ids, requests, gpu_input_batch,
                               discard_request_mask[:batch])

    # extends SpecDecodeBaseProposer.prepare_next_token_ids_cpu (the first
    # drafter call of a step without a padded batch): the observers see the
    # step's committed tokens.
    def prepare_next_token_ids_cpu(self, sampled_token_ids, requests, gpu_input_batch,
                                   num_scheduled_tokens):
        for observer in self.observers:
            observer.committed(sampled_token_ids, None)
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests,
                                                  gpu_input_batch, num_scheduled_tokens)


class VSpecEagleProposer(VSpecProposer, EagleProposer):
    """vLLM's EagleProposer (EAGLE-1, EAGLE-3, MTP) with vspec's head,
    observers and tree drafting (`tree`, EAGLE-1: tree/proposer.py)."""

    drafts_trees = True

    # extends SpecDecodeBaseProposer.set_inputs_first_pass: a tree step keeps
    # the position of each request's sampled row and the step's metadata.
    def set_inputs_first_pass(self, *args, **kwargs):
        num_tokens, rows, cad = super().set_inputs_first_pass(*args, **kwargs)
        self.tree.first_pass_inputs(rows, cad)
        return num_tokens, rows, cad


class VSpecDraftModelProposer(VSpecProposer, DraftModelProposer):
    """vLLM's DraftModelProposer with vspec's head and observers, and the
    lazy-gamma-0 catch-up pass (`catch_up`)."""

    def catch_up(self, cad: CommonAttentionMetadata, segments: list[Segment],
                 token_ids: np.ndarray) -> None:
        """Run the draft model over positions [first, end) of each segment's
        batch row, writing their draft KV (nothing is sampled). `cad` is the
        step's attention metadata (its block table rows are the batch rows);
        `token_ids[row, position]` is the batch's token table. Passes are cut
        to the drafter's token budget, earlier positions first."""
        for part in catch_up_passes(segments, self.max_num_tokens):
            self._catch_up_pass(cad, part, token_ids)

    def _catch_up_pass(self, cad: CommonAttentionMetadata, part: list[Segment],
                       token_ids: np.ndarray) -> None:
        device = self.device
        lengths = [end - first for _, first, end in part]
        lengths_cpu = torch.tensor(lengths, dtype=torch.int32)
        n = sum(lengths)
        positions = np.concatenate([np.arange(first, end) for _, first, end in part])
        tokens = np.concatenate([token_ids[row, first:end] for row, first, end in part])
        ids = torch.from_numpy(tokens.astype(np.int32)).to(device)
        # A draft with its own vocabulary (vLLM 0.32's vocab_mapping; absent
        # on 0.23): map as the host's first pass does.
        mapping = getattr(self, "vocab_mapping", None)
        if mapping is not None:
            ids = mapping.map_target_to_draft_ids(ids)
        self.input_ids[:n] = ids
        self.positions[:n] = torch.from_numpy(positions).to(device)
        rows = torch.tensor([row for row, _, _ in part], dtype=torch.long, device=device)
        block_table = cad.block_table_tensor[rows]
        # Each token's slot in the shared block table, as the target wrote it.
        local_row = torch.repeat_interleave(
            torch.arange(len(part), device=device), lengths_cpu.to(device))
        pos = self.positions[:n]
        slots = (block_table[local_row, pos // self.block_size].long() * self.block_size
                 + pos % self.block_size)
        seq_lens_cpu = torch.tensor([end for _, _, end in part], dtype=torch.int32)
        # A prefill-shaped batch: each row attends causally to [0, end).
        part_cad = drafter_batch(cad, query_lens=lengths_cpu, seq_lens=seq_lens_cpu,
                                 block_table=block_table, slots=slots, prefilling=True)
        run_pass(self, part_cad, n, slots)



PROPOSERS: dict[type, type] = {
    EagleProposer: VSpecEagleProposer,
    DraftModelProposer: VSpecDraftModelProposer,
}


def proposer_features(cfg: VSpecConfig) -> list[str]:
    """The vspec keys set in `cfg` that need vspec's proposer."""
    return ["entropy_stop"] * cfg.entropy_stop + drafter_features(cfg)


def vspec_proposer(host_drafter, vllm_config, device, runner, cfg: VSpecConfig,
                   catch_up: bool):
    """Our counterpart of the proposer the host runner built, with the
    features `cfg` turns on (`catch_up` needs one that has the catch-up pass)."""
    cls = PROPOSERS.get(type(host_drafter))
    drafter = type(host_drafter).__name__
    if catch_up and not (cls is not None and hasattr(cls, "catch_up")):
        raise VSpecConfigError("gamma0_mode", "lazy", "only with speculative method "
                               f"draft_model (this engine drafts with {drafter})")
    if cls is None:
        key = (proposer_features(cfg) or ["entropy_stop"])[0]
        raise VSpecConfigError(key, getattr(cfg, key), "only with speculative method "
                               f"draft_model or eagle (this engine drafts with {drafter})")
    head = wants_head(cfg)
    return cls(vllm_config, device, runner=runner,
               entropy_stop=EntropyStop.from_config(cfg) if cfg.entropy_stop else None,
               head_config=cfg if head else None, traces=TraceOptions.from_config(cfg),
               record_draft_probs=cfg.policy == "budget")
