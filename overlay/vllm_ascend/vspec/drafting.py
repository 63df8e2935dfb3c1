"""vspec's drafter options on vLLM-Ascend's proposers, composed (not yet run on NPU).

The host's merged draft loop takes every greedy draft token as
`self.model.compute_logits(h).argmax(-1)`, so that call is the one hook:
`DraftLogitsTap` (draft_head_tap.py) wraps the draft model once and returns
the draft head's logits (active vocabulary, int8; else the host's), then
shows them to each observer in order (hosts/draft_observers.py, the same
protocol and order rule as vspec's vLLM proposers): the entropy stop's
buffer (entropy_tap.py), then the diagnostics traces (hosts/diagnostics.py).

`AscendDrafting` holds the tap and the observers of one proposer.
`VSpecAscendProposer` is the base of vspec's proposers on every host
revision (proposers.py on 0.23, native_gamma.py on 0.30), and the only place
the shared host methods are extended; the per-revision subclasses call
`drafting.propose` from their `_propose` and `drafting.new_pass` before
every draft pass (dummy and capture passes included).
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

import torch
from vllm.v1.sample.sampler import _SAMPLING_EPS

from vllm_ascend.vspec.draft_head_tap import DraftLogitsTap, npu_draft_head
from vllm_ascend.vspec.entropy_tap import EntropyBuffer
from vllm_ascend.vspec.routing import vspec_settings
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.drafter_keys import pure_greedy
from vllm_vspec.hosts.diagnostics import DrafterTraces, TraceOptions
from vllm_vspec.hosts.draft_observers import DraftObserver
from vllm_vspec.hosts.vllm.commit_op import commit_accepted


class AscendDrafting:
    """The draft head and the observers of one NPU proposer (module docstring)."""

    def __init__(self, proposer: Any, settings: VSpecConfig | None) -> None:
        self.proposer = proposer
        self.settings = settings
        self.tap: DraftLogitsTap | None = None
        self.entropy: EntropyBuffer | None = None
        self.traces = None if settings is None else DrafterTraces.open(
            TraceOptions.from_config(settings), proposer.runner, _SAMPLING_EPS,
            lambda: self.head_in_use)
        self.observers: tuple[DraftObserver, ...] = () if self.traces is None else (self.traces,)

    def loaded(self) -> None:
        """The draft model is loaded (EAGLE: with the target's LM head): wrap
        it in the tap when a head or an entropy stop needs one; the observers
        see the outermost model (the IO trace then sees every pass)."""
        proposer, settings = self.proposer, self.settings
        head = npu_draft_head(proposer, settings)
        self.entropy = EntropyBuffer.maybe(proposer, settings)
        self.observers = tuple(o for o in (self.entropy, self.traces) if o is not None)
        if head is not None or self.entropy is not None:
            self.tap = DraftLogitsTap(proposer.model, head, self.observers).install(proposer)
        for observer in self.observers:
            observer.loaded(proposer.model)

    @property
    def head_in_use(self) -> str:
        """`active` when this step drafts from the active vocabulary, else `full`."""
        return "full" if self.tap is None else self.tap.name

    def committed(self, sampled: Any, discard: torch.Tensor | None) -> None:
        """A drafter step starts with the target's committed tokens."""
        for observer in self.observers:
            observer.committed(sampled, discard)

    def new_pass(self) -> None:
        """A draft pass starts (a step's, a dummy run's or a capture's)."""
        if self.entropy is not None:
            self.entropy.reset()

    def propose(self, call: Callable[[], torch.Tensor], kwargs: Mapping[str, Any],
                gamma: int) -> torch.Tensor:
        """Run the host's `_propose` (`call`, given the runner's `kwargs`) as
        one drafter step: the active vocabulary drafts only a pure-greedy
        batch (its premise), the entropy stop cuts the drafts, and the
        observers begin and end around it (`end` sees the step's `gamma`
        drafted columns)."""
        if self.tap is not None and self.tap.head is not None:
            self.tap.restricted = pure_greedy(kwargs["sampling_metadata"])
        for observer in self.observers:
            observer.begin(kwargs)
        draft = None
        try:
            draft = call()
            if self.entropy is not None:
                draft = self.entropy.cut(draft)
        finally:
            for observer in self.observers:
                observer.end(None if draft is None else draft[:, :gamma])
        return draft


def by_name(host: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call of the host method `host` (bound) as keywords,
    bound by the host's own signature: NPUModelRunner passes every argument
    by keyword, vLLM-Ascend's own unit tests pass some by position. A call
    the signature refuses raises the TypeError the host would."""
    if not args:
        return kwargs
    return dict(inspect.signature(host).bind(*args, **kwargs).arguments)


def discard_mask(indices: torch.Tensor, count: int, batch: int, device: Any) -> torch.Tensor:
    """The host's discarded-request indices (the first `count` of `indices`)
    as a bool [batch] mask."""
    discard = torch.zeros(batch, dtype=torch.bool, device=device)
    discard[indices[:count].long()] = True
    return discard


class VSpecAscendProposer:
    """vspec's extensions shared by its proposers on every vLLM-Ascend
    revision, mixed in (through a per-revision subclass) before the host's
    AscendSpecDecodeBaseProposer subclass."""

    # True: prepare_next_token_ids_padded commits with vspec's op
    # (commit_op.py; `vspec_ops` loaded by the subclass) instead of the host's.
    commits_with_vspec_op = False
    # Set by __init__. vLLM-Ascend's own unit tests also build proposers with
    # `__new__` and call load_model on them (0.30.0rc2 test_eagle_proposer.py
    # test_load_model_retains_split_indexer_metadata_dependency): such a
    # proposer has no drafter options, and load_model stays the host's.
    drafting: AscendDrafting | None = None

    # Extends AscendSpecDecodeBaseProposer.__init__: the drafter options the
    # settings turn on (the host's runner names the batch's requests).
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.drafting = AscendDrafting(self, vspec_settings(self.vllm_config))

    # Extends AscendSpecDecodeBaseProposer.load_model: the drafter's LM head
    # exists only now (EAGLE: the target's, shared inside load_model).
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.drafting is not None:
            self.drafting.loaded()

    # Extends AscendSpecDecodeBaseProposer.prepare_next_token_ids_padded (the
    # first drafter call of a step): the observers see the committed tokens;
    # then the host's results, or the same two from vspec's commit op.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: dict,
                                      gpu_input_batch: Any, discard_request_indices: torch.Tensor,
                                      num_discarded_requests: int
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
        discard = None
        if self.commits_with_vspec_op or self.drafting.observers:
            discard = discard_mask(discard_request_indices, num_discarded_requests,
                                   sampled_token_ids.shape[0], sampled_token_ids.device)
            self.drafting.committed(sampled_token_ids, discard)
        if self.commits_with_vspec_op:
            return commit_accepted(self, sampled_token_ids, requests, gpu_input_batch, discard)
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                     discard_request_indices,
                                                     num_discarded_requests)

    # Extends SpecDecodeBaseProposer.prepare_next_token_ids_cpu (padded
    # drafter batch off): the observers see the committed tokens.
    def prepare_next_token_ids_cpu(self, sampled_token_ids: list[list[int]], requests: dict,
                                   gpu_input_batch: Any, num_scheduled_tokens: dict
                                   ) -> torch.Tensor:
        self.drafting.committed(sampled_token_ids, None)
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests, gpu_input_batch,
                                                  num_scheduled_tokens)
