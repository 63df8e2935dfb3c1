"""vspec proposers for vLLM-Ascend: draft a per-step gamma (not yet run on NPU).

The host proposers draft `num_speculative_tokens` every step and read that
attribute everywhere (buffer sizes, the merged draft loop, graph capture). Our
subclasses keep the configured K as `max_num_speculative_tokens` (everything
allocated at construction is sized by it) and make `num_speculative_tokens`
mean "tokens drafted in the current step": the scheduler's gamma for the
duration of one `_propose` / capture pass, the maximum otherwise.

Invariants:
- 0 <= gamma <= max_num_speculative_tokens, and 1 + gamma <= 16 (FIA verifies
  at most 16 query tokens per request); violations raise, naming the value.
- With full ACL graphs there is one graph wrapper per gamma (a graph bucket per
  gamma): a captured merged-draft graph bakes its loop length in, so gamma g
  replays only graphs captured with g.
- gamma 0 returns a [batch, 0] draft (a target-only next step) after the
  first draft pass has kept the draft model's KV cache aligned.
"""

from __future__ import annotations

import contextlib
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import torch
from vllm.config import CUDAGraphMode

from vllm_ascend.compilation.acl_graph import ACLGraphWrapper
from vllm_ascend.spec_decode.draft_proposer import AscendDraftModelProposer
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer
from vllm_ascend.vspec.entropy_tap import EntropyTap
from vllm_ascend.vspec.gamma import step_gamma
from vllm_ascend.vspec.routing import vspec_settings


class VSpecProposerMixin:
    """Per-step gamma on top of AscendSpecDecodeBaseProposer. Mixed in before
    the host proposer so its attributes shadow the host's."""

    _vspec_active_gamma: int | None = None  # set only inside _drafting
    _vspec_runnables: Mapping[int, Any] = MappingProxyType({})  # gamma < K -> graph wrapper
    _entropy_tap: EntropyTap | None = None

    # The host assigns `self.num_speculative_tokens = K` in its __init__; the
    # setter records that K as the maximum, the getter answers the step's gamma.
    @property
    def num_speculative_tokens(self) -> int:
        active = self._vspec_active_gamma
        return self.max_num_speculative_tokens if active is None else active

    @num_speculative_tokens.setter
    def num_speculative_tokens(self, k: int) -> None:
        self.max_num_speculative_tokens = k

    # The host sets `_runnable` to the merged draft loop and, with full graphs,
    # to one ACLGraphWrapper around it; reads pick the wrapper of the step's gamma.
    @property
    def _runnable(self) -> Any:
        return self._vspec_runnables.get(self.num_speculative_tokens, self._vspec_max_runnable)

    @_runnable.setter
    def _runnable(self, runnable: Any) -> None:
        self._vspec_max_runnable = runnable

    # Extends AscendSpecDecodeBaseProposer.load_model: after the host wraps the
    # merged draft in a full graph, add one wrapper per smaller gamma.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._entropy_tap = EntropyTap.maybe_install(self, vspec_settings(self.vllm_config))
        host = self._vspec_max_runnable
        if not isinstance(host, ACLGraphWrapper):
            return
        self._vspec_runnables = {
            g: ACLGraphWrapper(self._run_merged_draft, self.vllm_config,
                               runtime_mode=host.runtime_mode,
                               use_eagle=host.use_eagle, enable_enpu=host.enable_enpu)
            for g in range(1, self.max_num_speculative_tokens)
        }

    # Extends AscendSpecDecodeBaseProposer._propose: drafts the scheduler's
    # gamma for this step instead of the configured K, then applies entropy stop.
    # NPUModelRunner.propose_draft_token_ids passes every argument by keyword.
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        gamma = step_gamma(kwargs.get("scheduler_output"), self.max_num_speculative_tokens)
        # Gamma 0 still runs the first draft pass (as gamma 1), which writes the
        # draft model's KV for this step's tokens, and drops its one draft: the
        # drafter stays aligned for when speculation resumes (vLLM 0.32 does the same).
        with self._drafting(max(gamma, 1)):
            draft = super()._propose(*args, **kwargs)
        if self._entropy_tap is not None:
            draft = self._entropy_tap.cut(draft)
        return draft[:, :gamma]

    # Extends AscendSpecDecodeBaseProposer.dummy_run: graph capture runs once
    # per gamma so every gamma has its own graph bucket; other dummy runs
    # (profiling, warm-up) use the maximum, which bounds memory. The runner
    # (NPUModelRunner._dummy_run) passes every argument by keyword.
    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        mode = kwargs.get("aclgraph_runtime_mode", CUDAGraphMode.NONE)
        capturing = (kwargs.get("in_graph_capturing", False) and not kwargs.get("is_profile", False)
                     and mode != CUDAGraphMode.NONE)
        gammas = range(1, self.max_num_speculative_tokens + 1) if capturing else [None]
        for gamma in gammas:
            with self._drafting(gamma):
                super().dummy_run(*args, **kwargs)

    @contextlib.contextmanager
    def _drafting(self, gamma: int | None) -> Iterator[None]:
        """Bind the step's gamma; the maximum again afterwards, even on error."""
        self._vspec_active_gamma = gamma
        if self._entropy_tap is not None:
            self._entropy_tap.reset()
        try:
            yield
        finally:
            self._vspec_active_gamma = None


class VSpecEagleProposer(VSpecProposerMixin, AscendEagleProposer):
    """EAGLE / EAGLE-1 drafting with per-step gamma on the NPU."""


class VSpecDraftModelProposer(VSpecProposerMixin, AscendDraftModelProposer):
    """Serial draft-model drafting with per-step gamma on the NPU."""
