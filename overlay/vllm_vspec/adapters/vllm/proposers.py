"""Draft proposers with vspec's additions to vLLM's.

- The per-request entropy stop (entropy.py): each proposer records, while
  drafting, the top-k entropy of every draft distribution it takes a greedy
  token from, and after drafting turns them into per-request draft lengths
  (EntropyStop.lengths). The model runner cuts each request's draft to that
  length before the scheduler sees it, so a stop only ever shortens the
  gamma the scheduler asked for.
- The catch-up pass of a lazy gamma 0 (draft_lag.py, draft model only):
  after steps that skipped the drafter, it writes the draft KV of the
  positions those steps processed before the drafter drafts again.

PROPOSERS maps vLLM's proposer class to ours.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from vllm.forward_context import set_forward_context
from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_vspec.config import VSpecConfigError
from vllm_vspec.draft_lag import Segment, catch_up_passes
from vllm_vspec.entropy import EntropyStop


class EntropyStopMixin:
    """Adds entropy recording to a SpecDecodeBaseProposer subclass (off when
    built without an EntropyStop)."""

    # extends SpecDecodeBaseProposer.__init__: keeps the stop settings; the
    # stop reads the draft logits, so drafting must be greedy over the full vocab.
    def __init__(self, *args, entropy_stop: EntropyStop | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.entropy_stop = entropy_stop
        self._entropies: list[torch.Tensor] = []
        self._draft_lengths: torch.Tensor | None = None
        if entropy_stop is None:
            return
        spec = self.speculative_config
        if (spec.draft_sample_method != "greedy" or self.use_local_argmax_reduction
                or getattr(self, "use_heterogeneous_vocab", False)):
            raise VSpecConfigError(
                "entropy_stop", True,
                "only with greedy draft sampling over the target's vocabulary "
                "(draft_sample_method='greedy', no local argmax reduction, "
                "no heterogeneous vocab)")

    # extends SpecDecodeBaseProposer._greedy_sample: same greedy token, and
    # records the top-k entropy of the distribution it came from.
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.entropy_stop is None:
            return super()._greedy_sample(hidden_states)
        logits = self.model.compute_logits(hidden_states)
        self._entropies.append(self.entropy_stop.entropy(logits))
        return logits.argmax(dim=-1)

    # extends SpecDecodeBaseProposer.propose: turns this step's entropies into
    # per-request draft lengths, in the row order of the returned drafts.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        if self.entropy_stop is None:
            return super().propose(*args, **kwargs)
        self._entropies = []
        drafts = super().propose(*args, **kwargs)
        if drafts.shape[-1] > 0:
            # Sequential drafting records one [B] entropy per position;
            # parallel drafting one [B*K]; both reshape to the drafts' [B, K].
            entropies = torch.stack(self._entropies, dim=-1).reshape(drafts.shape)
            self._draft_lengths = self.entropy_stop.lengths(entropies)
        self._entropies = []
        return drafts

    def take_draft_lengths(self) -> torch.Tensor | None:
        """Per-request draft lengths of the last `propose`, once (None when
        nothing was drafted since the last call)."""
        lengths, self._draft_lengths = self._draft_lengths, None
        return lengths


class CatchUpMixin:
    """Adds the lazy-gamma-0 catch-up pass to a draft-model proposer."""

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
        query_start_cpu = torch.zeros(len(part) + 1, dtype=torch.int32)
        query_start_cpu[1:] = torch.cumsum(lengths_cpu, 0)
        seq_lens_cpu = torch.tensor([end for _, _, end in part], dtype=torch.int32)
        # A prefill-shaped batch: each row attends causally to [0, end).
        part_cad = dataclasses.replace(
            cad, query_start_loc=query_start_cpu.to(device),
            query_start_loc_cpu=query_start_cpu, seq_lens=seq_lens_cpu.to(device),
            num_reqs=len(part), num_actual_tokens=n, max_query_len=max(lengths),
            max_seq_len=int(seq_lens_cpu.max()), block_table_tensor=block_table,
            slot_mapping=slots, causal=True, positions=None,
            is_prefilling=(None if cad.is_prefilling is None else
                           torch.ones(len(part), dtype=torch.bool, device=device)),
            seq_lens_cpu_upper_bound=seq_lens_cpu, req_idx=None,
            logits_indices_padded=None, num_logits_indices=None, max_logits_per_req=None,
            dcp_local_seq_lens=None, dcp_local_seq_lens_cpu_upper_bound=None,
            _num_computed_tokens_cache=None, _token_to_req_indices_cache=None)
        _, per_layer = self.build_per_group_and_layer_attn_metadata(part_cad)
        mode, n_padded, n_across_dp = self._determine_batch_execution_and_padding(n)
        model_kwargs, slot_count = self.build_model_inputs_first_pass(n, n_padded, None)
        with set_forward_context(per_layer, self.vllm_config, num_tokens=n_padded,
                                 num_tokens_across_dp=n_across_dp,
                                 cudagraph_runtime_mode=mode,
                                 slot_mapping=self._get_slot_mapping(slot_count, slots)):
            self.model(**model_kwargs)


class VSpecEagleProposer(EntropyStopMixin, EagleProposer):
    """vLLM's EagleProposer with the entropy stop."""


class VSpecDraftModelProposer(CatchUpMixin, EntropyStopMixin, DraftModelProposer):
    """vLLM's DraftModelProposer with the entropy stop and the catch-up pass."""


PROPOSERS: dict[type, type] = {
    EagleProposer: VSpecEagleProposer,
    DraftModelProposer: VSpecDraftModelProposer,
}


def vspec_proposer(host_drafter, vllm_config, device, runner,
                   entropy_stop: EntropyStop | None, catch_up: bool):
    """Our counterpart of the proposer the host runner built (entropy stop
    on when given; `catch_up` needs one that has the catch-up pass)."""
    cls = PROPOSERS.get(type(host_drafter))
    drafter = type(host_drafter).__name__
    if catch_up and not (cls is not None and issubclass(cls, CatchUpMixin)):
        raise VSpecConfigError("gamma0_mode", "lazy", "only with speculative method "
                               f"draft_model (this engine drafts with {drafter})")
    if cls is None:
        raise VSpecConfigError("entropy_stop", True, "only with speculative method "
                               f"draft_model or eagle (this engine drafts with {drafter})")
    return cls(vllm_config, device, runner=runner, entropy_stop=entropy_stop)
