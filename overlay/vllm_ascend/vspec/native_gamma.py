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

So here the host carries the gamma, and 0.23's StepGammaProposer is not
used: no `num_speculative_tokens` property (on this host its setter would
turn every per-step assignment into the maximum K: the contract check in
vllm_vspec/tools/abi_check.py fails on that), no K-column padding, and the
host's own `prepare_next_token_ids_padded` instead of the vspec commit op.
Its draft-graph helpers (proposers.py module functions, graph_budget.py,
graph_params.py) are shared.

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
- one FULL draft graph per gamma 1..K, where stock captures one at the
  configured K (not yet run on NPU). The host reads `self._runnable` for
  every draft call (dummy_run line 990, _propose line 1387) and for the
  per-step attention parameters of its graph (`_maybe_update_metadata`,
  lines 659-687: `update_draft_model_metadata`, `set_attn_backend`), so
  `_runnable` answers the wrapper of the step's K (`num_speculative_tokens`,
  which the host's _propose has just assigned). load_model adds one
  ACLGraphWrapper per gamma below K beside the host's (the shared helpers
  of proposers.py, also 0.23's). Each is captured through the host's own
  dummy_run run at K: it samples `num_tokens // (1 + K)` rows (line 944)
  and builds K steps of metadata (line 888), the batch descriptor's, since
  a FULL draft graph replays only for a uniform decode batch of 1 + K
  tokens a request (the target's descriptor, `uniform_decode`, line 1093);
  only the captured merged draft loop drafts gamma steps. Captures that
  would sample more rows than max_num_seqs are refused
  (proposers.check_capture_rows). Graph parameters: for FIA
  (AscendAttentionBackend) each captured `UpdatableGraph` records its own
  update tasks and binds them at replay to its own wrapper's
  `draft_model_metadata` by layer name (compilation/updatable_graph.py
  `resolve_tasks`, acl_graph.py `_updatable_graph_replay`), so gammas
  share nothing; other backends read the token-count store
  (`update_full_graph_params`), which graph_params.py keys by
  (gamma, tokens) as on 0.23. Gammas below K whose estimated graph memory
  does not fit `ascend_draft_graph_budget_mib` get no graph
  (graph_budget.py): a step at one drafts with the next captured gamma and
  keeps its first gamma drafts. Non-capture dummy runs (profiling, warm-up,
  idle DP ranks) run at K. `ascend_draft_full_graph = false` runs the draft
  model eagerly instead (the host's own `use_cuda_graph` switch,
  llm_base_proposer.py:239-273). The target keeps its graphs.
The controller, the lossy rules (sampler.py) and the scheduler are the same
as on every host.
"""

from __future__ import annotations

import contextlib
from types import MappingProxyType
from typing import Any, Iterator, Mapping

import torch
from vllm.logger import init_logger

from vllm_ascend.compilation import acl_graph
from vllm_ascend.spec_decode.draft_proposer import AscendDraftModelProposer
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer
from vllm_ascend.vspec import graph_budget, graph_params
from vllm_ascend.vspec.drafting import VSpecAscendProposer, by_name
from vllm_ascend.vspec.gamma import valid_gamma
from vllm_ascend.vspec.proposers import (capture_pass, check_capture_rows, gamma_wrappers,
                                         plan_draft_graphs, run_draft_eagerly)
from vllm_ascend.vspec.routing import vspec_settings
from vllm_ascend.vspec.sampler import VSpecAscendRejectionSampler

# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


class NativeGammaProposer(VSpecAscendProposer):
    """What vspec adds to a host proposer that drafts the step's K itself.
    The first base of each subclass below, before the host proposer (its
    attributes shadow the host's); `max_num_speculative_tokens` (the
    configured K) is what the entropy stop's buffer is sized by."""

    _vspec_runnables: Mapping[int, Any] = MappingProxyType({})  # gamma < K -> graph wrapper
    _vspec_max_runnable: Any = None  # the host's runnable (K's graph wrapper), set via _runnable
    _vspec_graph_gamma: int | None = None  # the gamma captured while the host's dummy_run runs at K
    # The gamma whose graph parameters a pass uses (graph_params.ActiveGamma): set
    # inside _propose and a gamma's capture only; None: K's.
    _vspec_active_gamma: int | None = None
    # Which gammas below K have a draft graph (graph_budget.py); set at the first capture.
    _vspec_graph_plan: graph_budget.DraftGraphPlan | None = None

    # The host sets `_runnable` to the merged draft loop and, with full graphs,
    # to one ACLGraphWrapper around it (__init__, load_model); reads answer the
    # wrapper of the gamma being captured (as a GammaCapture), else of the
    # step's K, which the host's _propose assigns before it reads this.
    @property
    def _runnable(self) -> Any:
        gamma = self._vspec_graph_gamma
        if gamma is not None:
            return GammaCapture(self, gamma, self._vspec_runnables.get(gamma, self._vspec_max_runnable))
        return self._vspec_runnables.get(self.num_speculative_tokens, self._vspec_max_runnable)

    @_runnable.setter
    def _runnable(self, runnable: Any) -> None:
        self._vspec_max_runnable = runnable

    # Extends AscendSpecDecodeBaseProposer.__init__: records the configured K
    # (the host's __init__ sets num_speculative_tokens to it; each _propose
    # then overwrites it with the step's K) and, with
    # `ascend_draft_full_graph = false`, runs the draft model eagerly.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_num_speculative_tokens = self.num_speculative_tokens
        settings = vspec_settings(self.vllm_config)
        if self.use_cuda_graph and settings is not None and not settings.ascend_draft_full_graph:
            logger.info("vspec: ascend_draft_full_graph=false: the draft model runs eagerly "
                        "(the target keeps its ACL graphs)")
            # This host keeps the workaround in spec_decode/utils.py (its
            # __init__ sets it at llm_base_proposer.py:271-273). Imported
            # here: stand-in hosts in the tests lack it.
            from vllm_ascend.spec_decode.utils import _maybe_eager_context

            run_draft_eagerly(self, _maybe_eager_context)

    # Extends AscendSpecDecodeBaseProposer.load_model: after the host wraps the
    # merged draft loop in its FULL graph wrapper, one more per gamma below K.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self._vspec_max_runnable is not None:      # the host kept a runnable to wrap
            self._vspec_runnables = gamma_wrappers(
                self._vspec_max_runnable, lambda g: self._run_merged_draft,
                self.max_num_speculative_tokens, self.vllm_config)

    # Extends AscendSpecDecodeBaseProposer.set_update_stream: the host gives the
    # stream to its one wrapper; every gamma's wrapper replays with it
    # (acl_graph.py `_updatable_graph_replay` requires one).
    def set_update_stream(self, update_stream: Any) -> None:
        super().set_update_stream(update_stream)
        for wrapper in (self._vspec_max_runnable, *self._vspec_runnables.values()):
            if hasattr(wrapper, "set_update_stream"):
                wrapper.set_update_stream(update_stream)

    # Extends AscendSpecDecodeBaseProposer.dummy_run: every dummy run is the
    # host's at K (its rows and metadata steps); a graph capture runs it once
    # per captured gamma, each drafting that gamma's steps into its own
    # wrapper (GammaCapture). The runner passes every argument by keyword.
    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        if not capture_pass(kwargs, self.use_cuda_graph):
            with self._at_max_k(None):
                super().dummy_run(*args, **kwargs)
            return
        if self._vspec_graph_plan is None:
            self._vspec_graph_plan = plan_draft_graphs(self, {})
        graph_params.install(acl_graph, self)
        for gamma in self._vspec_graph_plan.captured:
            with self._at_max_k(gamma):
                super().dummy_run(*args, **kwargs)

    @contextlib.contextmanager
    def _at_max_k(self, graph_gamma: int | None) -> Iterator[None]:
        """The host's num_speculative_tokens at the configured K (and the
        gamma whose graph is captured) for one dummy run; the host's value
        again afterwards, even on error."""
        held = self.num_speculative_tokens
        self.num_speculative_tokens, self._vspec_graph_gamma = \
            self.max_num_speculative_tokens, graph_gamma
        self.drafting.new_pass()
        try:
            yield
        finally:
            self.num_speculative_tokens, self._vspec_graph_gamma = held, None

    # Extends AscendSpecDecodeBaseProposer._propose: the host drafts the K it
    # is passed, as one drafter step of vspec's drafter options
    # (drafting.AscendDrafting.propose); gamma 0 still runs the first draft
    # pass, and a gamma without a draft graph (graph budget) drafts the next
    # captured gamma's steps. Arguments are read by the host signature's
    # names (by_name): NPUModelRunner passes them by keyword, callers may
    # pass them by position.
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs = by_name(super()._propose, args, kwargs)
        gamma = valid_gamma(kwargs["num_speculative_tokens"], self.max_num_speculative_tokens)
        plan, steps = self._vspec_graph_plan, max(gamma, 1)
        drafted = steps if plan is None else plan.drafted(steps)
        self.drafting.new_pass()
        self._vspec_active_gamma = drafted
        try:
            draft = self.drafting.propose(
                lambda: super(NativeGammaProposer, self)._propose(
                    **{**kwargs, "num_speculative_tokens": drafted}), kwargs, gamma)
        finally:
            self._vspec_active_gamma = None
        return draft[:, :gamma]


class GammaCapture:
    """Gamma's graph wrapper as the host's dummy_run sees it while it runs at
    K for gamma's capture: a call checks the rows it would sample
    (proposers.check_capture_rows) and runs the wrapper with the host's
    num_speculative_tokens at gamma, so the captured merged draft loop drafts
    gamma steps into gamma's graph (and gamma's graph-parameter store);
    other attributes (`update_draft_model_metadata`, `set_attn_backend`)
    are the wrapper's."""

    def __init__(self, proposer: NativeGammaProposer, gamma: int, wrapper: Any):
        self._proposer, self._gamma, self._wrapper = proposer, gamma, wrapper

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        proposer = self._proposer
        check_capture_rows(proposer, self._gamma, kwargs)
        held = proposer.num_speculative_tokens
        proposer.num_speculative_tokens = proposer._vspec_active_gamma = self._gamma
        try:
            return self._wrapper(*args, **kwargs)
        finally:
            proposer.num_speculative_tokens, proposer._vspec_active_gamma = held, None


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
