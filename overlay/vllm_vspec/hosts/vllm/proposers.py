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
- The draft LM head options (draft_head.py): greedy draft tokens from an
  active vocabulary and/or int8 weights. The target verifies with its own
  full head, so strict acceptance stays exact.
- The diagnostics traces (diagnostics.py): per drafter step, draft tokens,
  draft forward inputs/outputs, target hidden states and committed tokens.
- Tree drafting for EAGLE (tree/proposer.py, `propose_tree`).
- The drafter's probability of each drafted token, for policy `budget`
  (draft_probs.py: recorded from the logits the greedy token came from).

PROPOSERS maps vLLM's proposer class to ours.
"""

from __future__ import annotations

import numpy as np
import torch

from vllm.v1.attention.backend import CommonAttentionMetadata
from vllm.v1.sample.sampler import _SAMPLING_EPS
from vllm.v1.spec_decode.draft_model import DraftModelProposer
from vllm.v1.spec_decode.eagle import EagleProposer

from vllm_vspec.hosts.vllm.commit_op import CommitOpMixin
from vllm_vspec.hosts.vllm.draft_probs import DraftProbsMixin
from vllm_vspec.hosts.vllm.drafter_batch import drafter_batch, run_pass
from vllm_vspec.hosts.vllm.tree.proposer import TreeDraftMixin
from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.hosts.diagnostics import DrafterTraces, TraceOptions
from vllm_vspec.core.drafter_keys import drafter_features, pure_greedy, refuse_head, wants_head
from vllm_vspec.kernels.draft_head import DraftHead, draft_head_for
from vllm_vspec.core.draft_lag import Segment, catch_up_passes
from vllm_vspec.kernels.entropy import EntropyStop


class DraftHeadMixin:
    """Greedy draft tokens from vspec's DraftHead (active vocabulary, int8
    weights) when configured; `_draft_logits` is where every greedy draft
    distribution of our proposers comes from."""

    # extends SpecDecodeBaseProposer.__init__: keeps the head settings; the
    # head replaces the greedy path, so vLLM's other greedy variants are excluded.
    def __init__(self, *args, head_config: VSpecConfig | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_config = head_config
        self.draft_head: DraftHead | None = None
        self._pure_greedy = False
        if head_config is None:
            return
        if self.use_local_argmax_reduction or getattr(self, "use_heterogeneous_vocab", False):
            refuse_head(head_config, "not with local argmax reduction or a heterogeneous "
                        "draft vocabulary")
        if self.vllm_config.parallel_config.tensor_parallel_size != 1:
            refuse_head(head_config, "only with tensor_parallel_size 1 (the head is not sharded)")

    # extends SpecDecodeBaseProposer.load_model: the drafter's LM head exists
    # only now (EAGLE: the target's, shared inside load_model).
    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if self.head_config is not None:
            self.draft_head = draft_head_for(self.model, self.head_config)

    # extends SpecDecodeBaseProposer.propose: notes whether this step's batch
    # is pure greedy (the active vocabulary is used only then). The runner
    # passes every argument by keyword.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        self._pure_greedy = pure_greedy(kwargs["sampling_metadata"])
        return super().propose(*args, **kwargs)

    @property
    def head_in_use(self) -> str:
        """`active` when this step drafts from the active vocabulary, else `full`."""
        return "full" if self.draft_head is None else self.draft_head.name(self._pure_greedy)

    def _draft_logits(self, hidden_states: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits, ids): column j of logits scores token ids[j] (ids None:
        token j)."""
        head = self.draft_head
        got = None if head is None else head.logits(hidden_states, restricted=self._pure_greedy)
        return got if got is not None else (self.model.compute_logits(hidden_states), None)

    # extends SpecDecodeBaseProposer._greedy_sample: argmax over our head,
    # mapped back to full-vocabulary ids.
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.draft_head is None:
            return super()._greedy_sample(hidden_states)
        logits, ids = self._draft_logits(hidden_states)
        return DraftHead.to_full_ids(logits.argmax(dim=-1), ids)


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

    # extends SpecDecodeBaseProposer._greedy_sample: same greedy token (from
    # DraftHeadMixin's logits), and records the top-k entropy of its distribution.
    def _greedy_sample(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.entropy_stop is None:
            return super()._greedy_sample(hidden_states)
        # With an active vocabulary the entropy is over the active ids.
        logits, ids = self._draft_logits(hidden_states)
        self._entropies.append(self.entropy_stop.entropy(logits))
        return DraftHead.to_full_ids(logits.argmax(dim=-1), ids)

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
        seq_lens_cpu = torch.tensor([end for _, _, end in part], dtype=torch.int32)
        # A prefill-shaped batch: each row attends causally to [0, end).
        part_cad = drafter_batch(cad, query_lens=lengths_cpu, seq_lens=seq_lens_cpu,
                                 block_table=block_table, slots=slots, prefilling=True)
        run_pass(self, part_cad, n, slots)


class TraceMixin:
    """Writes the diagnostics traces of each drafter step (diagnostics.DrafterTraces)."""

    # extends SpecDecodeBaseProposer.__init__: opens the traces (the runner
    # names the batch's requests).
    def __init__(self, *args, traces: TraceOptions | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.traces = DrafterTraces.open(traces, kwargs.get("runner"), _SAMPLING_EPS)

    # extends SpecDecodeBaseProposer.load_model: the IO trace hooks the draft model.
    def load_model(self, *args, **kwargs) -> None:
        super().load_model(*args, **kwargs)
        if self.traces is not None:
            self.traces.watch(self.model)

    # extends SpecDecodeBaseProposer.prepare_next_token_ids_padded (the
    # first drafter call of a step): starts the step with its committed tokens.
    def prepare_next_token_ids_padded(self, sampled_token_ids, requests, gpu_input_batch,
                                      discard_request_mask):
        if self.traces is not None:
            rows = sampled_token_ids.tolist()
            self.traces.begin_step(rows, discard_request_mask[:len(rows)].tolist())
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests,
                                                     gpu_input_batch, discard_request_mask)

    # extends SpecDecodeBaseProposer.prepare_next_token_ids_cpu: as above,
    # without a padded batch.
    def prepare_next_token_ids_cpu(self, sampled_token_ids, requests, gpu_input_batch,
                                   num_scheduled_tokens):
        if self.traces is not None:
            self.traces.begin_step([list(t) for t in sampled_token_ids])
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests,
                                                  gpu_input_batch, num_scheduled_tokens)

    # extends SpecDecodeBaseProposer.propose: times the call and writes the
    # step's records. The runner passes every argument by keyword.
    def propose(self, *args, **kwargs) -> torch.Tensor:
        if self.traces is None:
            return super().propose(*args, **kwargs)
        return self.traces.propose(lambda: super(TraceMixin, self).propose(*args, **kwargs),
                                   kwargs, lambda: self.head_in_use)


# TraceMixin comes first: CommitOpMixin's prepare_next_token_ids_padded
# replaces the host's without calling on, and the trace must see it.
class VSpecEagleProposer(TraceMixin, CommitOpMixin, EntropyStopMixin, TreeDraftMixin,
                         DraftProbsMixin, DraftHeadMixin, EagleProposer):
    """vLLM's EagleProposer with the entropy stop, tree drafting
    (`propose_tree`), the draft head options and the diagnostics traces."""


class VSpecDraftModelProposer(TraceMixin, CommitOpMixin, CatchUpMixin, EntropyStopMixin,
                              DraftProbsMixin, DraftHeadMixin, DraftModelProposer):
    """vLLM's DraftModelProposer with the entropy stop, the catch-up pass, the
    draft head options and the diagnostics traces."""


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
    if catch_up and not (cls is not None and issubclass(cls, CatchUpMixin)):
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
