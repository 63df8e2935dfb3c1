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
- The draft model keeps the host's full ACL graph (what stock captures for
  the K-step merged draft loop, host llm_base_proposer.py lines 495-509):
  one captured graph per gamma 1..K, each through the host's own capture
  path (dummy_run once per gamma, one ACLGraphWrapper per gamma), and the
  host's draft graph-parameter store keyed by (gamma, token count)
  (graph_params.py), so each gamma's replay update reads and writes only
  its own captured parameters. `ascend_draft_full_graph = false` runs the
  draft model eagerly instead (the host's own `use_cuda_graph = False`
  switch, which it flips for GLM drafts), and then sets the host's
  flashcomm1 eager-compile workaround the way its __init__ would have
  (llm_base_proposer.py lines 236-239). The target's graphs are untouched.
- What a verification step commits (valid token counts, next tokens) comes
  from vspec's commit_accepted instead of the host's chain of about ten
  torch ops: the AscendC kernel when the wheel's library has it, else the
  op's torch implementation (kernels/ops.py load, one start-up warning).
- A step returns K columns: its gamma drafts, then invalid drafts (-1), the
  layout vLLM 0.23's runner requires (vllm_vspec/hosts/vllm/
  verify_width.py); the scheduler decides how many of them the next step
  verifies (gamma, or K to keep the target's full decode ACL graph). Gamma 0
  drafts nothing after the first draft pass has kept the draft model's KV
  cache aligned.

Two more mixins carry vspec's drafter options onto the NPU (not yet run on
NPU), over the host-agnostic core: DraftHeadMixin (active vocabulary and
int8 LM head, draft_head_tap.py over vllm_vspec.kernels.draft_head) and TraceMixin
(the diagnostics traces, vllm_vspec.hosts.diagnostics.DrafterTraces).
"""

from __future__ import annotations

import contextlib
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import torch
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.sample.sampler import _SAMPLING_EPS

from vllm_ascend.compilation import acl_graph
from vllm_ascend.compilation.acl_graph import ACLGraphWrapper
from vllm_ascend.spec_decode.draft_proposer import AscendDraftModelProposer
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer
from vllm_ascend.vspec.draft_head_tap import DraftHeadTap
from vllm_ascend.vspec.entropy_tap import EntropyTap
from vllm_ascend.vspec import graph_params
from vllm_ascend.vspec.gamma import step_gamma
from vllm_ascend.vspec.routing import vspec_settings
from vllm_vspec.kernels import ops
from vllm_vspec.hosts.vllm.commit_op import backup_tokens
from vllm_vspec.hosts.vllm.verify_width import pad_drafts
from vllm_vspec.hosts.diagnostics import DrafterTraces, TraceOptions
from vllm_vspec.core.drafter_keys import pure_greedy

# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


def run_draft_eagerly(proposer: Any, maybe_eager_context: Callable[[Any], Any]) -> None:
    """The host's own eager switch, flipped after the host's __init__ read it,
    and what that __init__ derives from it: with `use_cuda_graph` off and
    flashcomm1 (enable_sp) on, the host loads the draft model under
    `maybe_eager_context(vllm_config)` (compilation mode NONE, the fx-graph
    bug workaround). `maybe_eager_context` is the host's `_maybe_eager_context`,
    whose module differs by host revision (the callers name theirs)."""
    proposer.use_cuda_graph = False
    # Imported here: stand-in hosts in the tests lack this module.
    from vllm_ascend.utils import enable_sp

    if enable_sp(proposer.vllm_config):
        proposer.maybe_eager_context = maybe_eager_context(proposer.vllm_config)


class VSpecProposerMixin:
    """Per-step gamma on top of AscendSpecDecodeBaseProposer. Mixed in before
    the host proposer so its attributes shadow the host's."""

    _vspec_active_gamma: int | None = None  # set only inside _drafting
    _vspec_runnables: Mapping[int, Any] = MappingProxyType({})  # gamma < K -> graph wrapper
    _entropy_tap: EntropyTap | None = None
    # Key the host's draft graph parameters by gamma (graph_params.py); off
    # only in the test that shows what the host's token-count keys do.
    vspec_key_graph_params: bool = True
    _vspec_checked_graphs: bool = False

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

    # Extends AscendSpecDecodeBaseProposer.__init__: loads vspec's ops (the
    # compiled library, else the torch fallback: kernels/ops.py), and keeps the
    # draft model's full ACL graph unless `ascend_draft_full_graph = false`;
    # the host reads `use_cuda_graph` in load_model, dummy_run and _propose.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vspec_ops = ops.load(torch.device(self.device).type)
        settings = vspec_settings(self.vllm_config)
        if self.use_cuda_graph and settings is not None and not settings.ascend_draft_full_graph:
            logger.info("vspec: ascend_draft_full_graph=false: the draft model runs eagerly "
                        "(the target keeps its ACL graphs)")
            # vLLM-Ascend 0.23.0.post1 keeps the workaround in
            # llm_base_proposer.py (lines 236-239; load_model enters it, line
            # 324). Imported here: stand-in hosts in the tests lack it.
            from vllm_ascend.spec_decode.llm_base_proposer import _maybe_eager_context

            run_draft_eagerly(self, _maybe_eager_context)

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
        if not self._vspec_checked_graphs:
            self._vspec_checked_graphs = True
            _warn_if_padding_keeps_no_graph(self.vllm_config)
        gamma = step_gamma(kwargs.get("scheduler_output"), self.max_num_speculative_tokens)
        # Gamma 0 still runs the first draft pass (as gamma 1), which writes the
        # draft model's KV for this step's tokens, and drops its one draft: the
        # drafter stays aligned for when speculation resumes (vLLM 0.32 does the same).
        with self._drafting(max(gamma, 1)):
            draft = super()._propose(*args, **kwargs)
        if self._entropy_tap is not None:
            draft = self._entropy_tap.cut(draft)
        return pad_drafts(draft, gamma, self.max_num_speculative_tokens)

    # Extends AscendSpecDecodeBaseProposer.prepare_next_token_ids_padded: the
    # same two results (next token ids, valid sampled token counts) from one
    # kernel; the host's discarded-request indices become a mask.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: dict,
                                      gpu_input_batch: Any, discard_request_indices: torch.Tensor,
                                      num_discarded_requests: int
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = sampled_token_ids.shape[0]
        backup = backup_tokens(self.backup_next_token_ids, requests, gpu_input_batch)
        discard = torch.zeros(batch, dtype=torch.bool, device=sampled_token_ids.device)
        discard[discard_request_indices[:num_discarded_requests].long()] = True
        num_valid, next_token = self.vspec_ops.commit_accepted(
            sampled_token_ids, discard, backup[:batch], gpu_input_batch.vocab_size)
        return next_token, num_valid

    # Extends AscendSpecDecodeBaseProposer.dummy_run: graph capture runs once
    # per gamma so every gamma has its own graph, captured into its own
    # (gamma, token count) parameter store; other dummy runs (profiling,
    # warm-up) use the maximum, which bounds memory. The runner
    # (NPUModelRunner._dummy_run) passes every argument by keyword.
    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        mode = kwargs.get("aclgraph_runtime_mode", CUDAGraphMode.NONE)
        capturing = (kwargs.get("in_graph_capturing", False) and not kwargs.get("is_profile", False)
                     and mode != CUDAGraphMode.NONE and self.use_cuda_graph)
        if capturing and self.vspec_key_graph_params:
            graph_params.install(acl_graph, self)
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


def _warn_if_padding_keeps_no_graph(vllm_config: Any) -> None:
    """The scheduler decides the verify width from the engine core's copy of
    the compilation config (verify_width.VerifyWidth.of); the worker's copy is
    final only after NPUModelRunner._check_and_update_cudagraph_mode
    (model_runner_v1.py line 5061, resolve_cudagraph_mode_and_sizes, which
    can downgrade FULL modes). With TP 1 both are one object; with TP > 1 the
    engine core adopts the workers' final mode before it builds the scheduler
    (worker_graphs.py, installed by the vspec plugin). This line is for a
    worker whose final mode has no full decode graph: then the scheduler
    pads only if that adoption did not run (VLLM_PLUGINS without vspec), and
    its start-up line ("decode steps of up to N requests verify K draft
    slots") says so; each padded step then costs what stock vLLM-Ascend's
    verify of 1 + K costs, never more, but more than verifying gamma would."""
    settings = vspec_settings(vllm_config)
    mode = vllm_config.compilation_config.cudagraph_mode
    if settings is None or not settings.ascend_pad_verify_width:
        return
    if mode is None or mode.decode_mode() != CUDAGraphMode.FULL:
        logger.warning("vspec: this worker's final cudagraph_mode is %s (no full decode graph); "
                       "the engine core adopts it at start-up (worker_graphs.py) and then "
                       "verifies each step's gamma. If the scheduler's start-up line says it "
                       "pads decode steps to 1 + K, that adoption did not run (VLLM_PLUGINS "
                       "without vspec): padded steps keep no graph and verify what stock "
                       "vLLM-Ascend verifies, but more than their gamma; --additional-config "
                       "'{\"vspec\": {\"ascend_pad_verify_width\": false}}' verifies gamma",
                       getattr(mode, "name", mode))


class DraftHeadMixin:
    """vspec's draft LM head (active vocabulary, int8) in the host's merged
    draft loop, through a DraftHeadTap around the draft model. After
    VSpecProposerMixin in the MRO, so the entropy tap (installed there) wraps
    this one and reads the logits this head produces, as on CPU."""

    _head_tap: DraftHeadTap | None = None

    # Extends AscendSpecDecodeBaseProposer.load_model: the drafter's LM head
    # exists only now (EAGLE: the target's, shared inside load_model).
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._head_tap = DraftHeadTap.maybe_install(self, vspec_settings(self.vllm_config))

    # Extends AscendSpecDecodeBaseProposer._propose: the active vocabulary
    # drafts only steps whose batch is pure greedy (its premise).
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self._head_tap is not None:
            self._head_tap.restricted = pure_greedy(kwargs["sampling_metadata"])
        return super()._propose(*args, **kwargs)

    @property
    def head_in_use(self) -> str:
        """`active` when this step drafts from the active vocabulary, else `full`."""
        return "full" if self._head_tap is None else self._head_tap.name


class TraceMixin:
    """Writes the diagnostics traces of each drafter step (DrafterTraces).
    First in the MRO: VSpecProposerMixin's prepare_next_token_ids_padded
    replaces the host's without calling on, and the trace must see it."""

    traces: DrafterTraces | None = None

    # Extends AscendSpecDecodeBaseProposer.__init__: opens the traces the
    # settings turn on (the host's runner names the batch's requests).
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        settings = vspec_settings(self.vllm_config)
        if settings is not None:
            self.traces = DrafterTraces.open(TraceOptions.from_config(settings), self.runner,
                                             _SAMPLING_EPS)

    # Extends AscendSpecDecodeBaseProposer.load_model: the IO trace hooks the
    # draft model (the outermost wrapper: it sees every pass the host makes).
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if self.traces is not None:
            self.traces.watch(self.model)

    # Extends AscendSpecDecodeBaseProposer.prepare_next_token_ids_padded (the
    # first drafter call of a step): starts the step with its committed tokens.
    def prepare_next_token_ids_padded(self, sampled_token_ids: torch.Tensor, requests: dict,
                                      gpu_input_batch: Any, discard_request_indices: torch.Tensor,
                                      num_discarded_requests: int
                                      ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.traces is not None:
            rows = sampled_token_ids.tolist()
            discard = [False] * len(rows)
            for i in discard_request_indices[:num_discarded_requests].tolist():
                discard[i] = True
            self.traces.begin_step(rows, discard)
        return super().prepare_next_token_ids_padded(sampled_token_ids, requests, gpu_input_batch,
                                                     discard_request_indices,
                                                     num_discarded_requests)

    # Extends SpecDecodeBaseProposer.prepare_next_token_ids_cpu (padded
    # drafter batch off): as above, from the host's token lists.
    def prepare_next_token_ids_cpu(self, sampled_token_ids: list[list[int]], requests: dict,
                                   gpu_input_batch: Any, num_scheduled_tokens: dict
                                   ) -> torch.Tensor:
        if self.traces is not None:
            self.traces.begin_step([list(t) for t in sampled_token_ids])
        return super().prepare_next_token_ids_cpu(sampled_token_ids, requests, gpu_input_batch,
                                                  num_scheduled_tokens)

    # Extends AscendSpecDecodeBaseProposer._propose: times the step and writes
    # its records: the step's gamma drafts, not the invalid columns
    # VSpecProposerMixin pads the result with. NPUModelRunner passes every
    # argument by keyword.
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.traces is None:
            return super()._propose(*args, **kwargs)
        gamma = step_gamma(kwargs.get("scheduler_output"), self.max_num_speculative_tokens)
        return self.traces.propose(lambda: super(TraceMixin, self)._propose(*args, **kwargs),
                                   kwargs, lambda: self.head_in_use, gamma)


class VSpecEagleProposer(TraceMixin, VSpecProposerMixin, DraftHeadMixin, AscendEagleProposer):
    """EAGLE / EAGLE-1 drafting with per-step gamma on the NPU."""


class VSpecDraftModelProposer(TraceMixin, VSpecProposerMixin, DraftHeadMixin,
                              AscendDraftModelProposer):
    """Serial draft-model drafting with per-step gamma on the NPU."""
