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
  the K-step merged draft loop in AscendSpecDecodeBaseProposer.load_model):
  one captured graph per gamma 1..K, each through the host's own capture
  path (dummy_run once per gamma, one ACLGraphWrapper per gamma), and the
  host's draft graph-parameter store keyed by (gamma, token count)
  (graph_params.py), so each gamma's replay update reads and writes only
  its own captured parameters. Gammas below K whose estimated graph memory
  does not fit `ascend_draft_graph_budget_mib` get no graph (graph_budget.py):
  a step at one drafts with the next captured gamma's graph (at worst K's)
  and keeps its first gamma drafts. With per-width target graphs
  (width_graphs.py) a gamma verified at a width of its own has its graph
  captured at that width's descriptors instead (rows = size // (1 + gamma),
  the runner's capture of that width binds it: pairing_capture), and a step
  after such a width drafts with it (WidthDispatcher.pairing_draft). Every gamma's graph samples the rows of the
  batch descriptor it is captured for, num_tokens // (1 + K): a FULL draft
  graph replays only for a uniform decode batch of 1 + K tokens a request.
  Those rows never exceed max_num_seqs (the rows of the runner's draft
  buffer): a capture that would sample more is refused with a ValueError
  naming the capture size, the gamma, the rows and max_num_seqs. `ascend_draft_full_graph = false` runs the
  draft model eagerly instead (the host's own `use_cuda_graph = False`
  switch, which it flips for GLM drafts), and then sets the host's
  flashcomm1 eager-compile workaround the way its __init__ would have
  (AscendSpecDecodeBaseProposer.__init__). The target's graphs are untouched.
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

vspec's drafter options (active vocabulary and int8 LM head, entropy stop,
diagnostics traces) come from drafting.VSpecAscendProposer, the base shared
with the 0.30 proposers (native_gamma.py), over the host-agnostic core.
"""

from __future__ import annotations

import contextlib
import functools
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import torch
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger

from vllm_ascend.compilation import acl_graph
from vllm_ascend.compilation.acl_graph import ACLGraphWrapper
from vllm_ascend.spec_decode.draft_proposer import AscendDraftModelProposer
from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer
from vllm_ascend.vspec import graph_budget, graph_params
from vllm_ascend.vspec.drafting import VSpecAscendProposer, by_name
from vllm_ascend.vspec.gamma import step_gamma
from vllm_ascend.vspec.routing import vspec_settings
from vllm_vspec.config import VSpecConfig
from vllm_vspec.kernels import ops
from vllm_vspec.hosts.vllm.verify_width import pad_drafts

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


def capture_pass(kwargs: Mapping[str, Any], use_cuda_graph: bool) -> bool:
    """Whether the host's dummy_run, called with `kwargs` (the runner passes
    every argument by keyword), captures the draft's FULL graph."""
    mode = kwargs.get("aclgraph_runtime_mode", CUDAGraphMode.NONE)
    return bool(kwargs.get("in_graph_capturing", False) and not kwargs.get("is_profile", False)
                and mode != CUDAGraphMode.NONE and use_cuda_graph)


def gamma_wrappers(host: Any, runnable_of: Callable[[int], Any], max_gamma: int,
                   vllm_config: Any) -> Mapping[int, Any]:
    """gamma -> an ACLGraphWrapper like the host's `host` (its runtime mode,
    use_eagle and enable_enpu) around `runnable_of(gamma)`, for gammas
    1..max_gamma-1; none when the host kept no graph wrapper."""
    if not isinstance(host, ACLGraphWrapper):
        return MappingProxyType({})
    return MappingProxyType({
        g: ACLGraphWrapper(runnable_of(g), vllm_config, runtime_mode=host.runtime_mode,
                           use_eagle=host.use_eagle, enable_enpu=host.enable_enpu)
        for g in range(1, max_gamma)})


def check_capture_rows(proposer: Any, gamma: int, kwargs: Mapping[str, Any]) -> None:
    """Refuse to capture gamma's draft graph if it would sample more rows
    than max_num_seqs: the runner copies a step's draft rows into a buffer
    of max_num_seqs rows (NPUModelRunner's max_num_reqs), so such a graph
    could never replay correctly. The rows are the ones the host's
    dummy_run passes its runnable (`batch_size`), at the capture size it
    passes (`num_input_tokens`)."""
    rows = kwargs.get("batch_size")
    limit = proposer.vllm_config.scheduler_config.max_num_seqs
    if rows is not None and rows > limit:
        raise ValueError(
            f"vspec: the draft graph of gamma {gamma} at capture size "
            f"{kwargs.get('num_input_tokens')} tokens would sample {rows} rows, more than "
            f"max_num_seqs={limit} (allowed: at most max_num_seqs rows, i.e. capture sizes "
            f"of at most max_num_seqs x (1 + {proposer.max_num_speculative_tokens}) tokens); "
            "lower max_cudagraph_capture_size, raise --max-num-seqs, or run the draft "
            "eagerly with --additional-config "
            "'{\"vspec\": {\"ascend_draft_full_graph\": false}}'")


def plan_draft_graphs(proposer: Any,
                      own_width_sizes: dict[int, list[int]]) -> graph_budget.DraftGraphPlan:
    """At the first capture (the runner's dispatcher keys are final): which
    gammas below K get a graph within `ascend_draft_graph_budget_mib`
    (graph_budget.py); the skipped ones lose their wrapper
    (`_vspec_runnables`), and one start-up line says so."""
    settings = vspec_settings(proposer.vllm_config)
    budget = (VSpecConfig.ascend_draft_graph_budget_mib if settings is None
              else settings.ascend_draft_graph_budget_mib)
    plan = graph_budget.plan(proposer.max_num_speculative_tokens,
                             graph_budget.full_capture_sizes(proposer.runner),
                             len(getattr(proposer, "attn_layer_names", None) or ()), budget,
                             own_width_sizes)
    proposer._vspec_runnables = MappingProxyType(
        {g: w for g, w in proposer._vspec_runnables.items() if g in plan.kept})
    (logger.warning if plan.skipped else logger.info)("%s", plan.line())
    return plan


class StepGammaProposer(VSpecAscendProposer):
    """Per-step gamma on top of AscendSpecDecodeBaseProposer (vLLM-Ascend
    0.23), with vspec's drafter options (drafting.py). The first base of
    each subclass below, before the host proposer, so its attributes
    shadow the host's."""

    _vspec_active_gamma: int | None = None  # drafted steps; set only inside _drafting
    _vspec_graph_gamma: int | None = None  # whose draft graph runs; None: the drafted steps'
    _vspec_runnables: Mapping[int, Any] = MappingProxyType({})  # gamma < K -> graph wrapper
    # Which gammas below K have a draft graph (graph_budget.py); set at the first capture.
    _vspec_graph_plan: graph_budget.DraftGraphPlan | None = None
    # The gamma whose graph the runner's capture of target width 1 + gamma takes (pairing_capture).
    _vspec_width_gamma: int | None = None
    commits_with_vspec_op = True
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
    # to one ACLGraphWrapper around it; reads pick the wrapper of the gamma
    # being captured, else of the step's gamma. During a capture the host's
    # dummy_run calls it with the rows the graph will sample, checked first
    # (_check_capture_rows).
    @property
    def _runnable(self) -> Any:
        gamma = self._vspec_graph_gamma
        if gamma is None:
            return self._vspec_runnables.get(self.num_speculative_tokens,
                                             self._vspec_max_runnable)
        return functools.partial(self._check_capture_rows, gamma,
                                 self._vspec_runnables.get(gamma, self._vspec_max_runnable))

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
            # The host keeps the workaround in llm_base_proposer.py (its
            # __init__ builds it, load_model enters it). Imported here:
            # stand-in hosts in the tests lack it.
            from vllm_ascend.spec_decode.llm_base_proposer import _maybe_eager_context

            run_draft_eagerly(self, _maybe_eager_context)

    # Extends AscendSpecDecodeBaseProposer.load_model: after the host wraps the
    # merged draft in a full graph, add one wrapper per smaller gamma.
    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        self._vspec_runnables = gamma_wrappers(
            self._vspec_max_runnable, lambda g: functools.partial(self._draft_steps, g),
            self.max_num_speculative_tokens, self.vllm_config)

    def _check_capture_rows(self, gamma: int, runnable: Any, *args: Any, **kwargs: Any) -> Any:
        """Capture gamma's draft graph through `runnable` once its rows are
        checked (check_capture_rows)."""
        check_capture_rows(self, gamma, kwargs)
        return runnable(*args, **kwargs)

    def _draft_steps(self, gamma: int, *args: Any, **kwargs: Any) -> Any:
        """The host's merged draft loop (`_run_merged_draft`) drafting `gamma`
        steps: what gamma's graph wrapper captures and runs. Its inputs (the
        rows it samples, the per-step attention metadata) are the caller's."""
        outer = self._vspec_active_gamma
        self._vspec_active_gamma = gamma
        try:
            return self._run_merged_draft(*args, **kwargs)
        finally:
            self._vspec_active_gamma = outer

    # Extends AscendSpecDecodeBaseProposer._propose: drafts the scheduler's
    # gamma for this step instead of the configured K, as one drafter step
    # of vspec's drafter options (drafting.AscendDrafting.propose).
    # Arguments are read by the host signature's names (by_name):
    # NPUModelRunner.propose_draft_token_ids passes them by keyword, callers
    # may pass them by position.
    def _propose(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        kwargs = by_name(super()._propose, args, kwargs)
        if not self._vspec_checked_graphs:
            self._vspec_checked_graphs = True
            _warn_if_padding_keeps_no_graph(self.vllm_config)
        gamma = step_gamma(kwargs.get("scheduler_output"), self.max_num_speculative_tokens)
        # Gamma 0 still runs the first draft pass (as gamma 1), which writes the
        # draft model's KV for this step's tokens, and drops its one draft: the
        # drafter stays aligned for when speculation resumes (vLLM 0.32 does the same).
        # A gamma without a draft graph (skipped for the graph memory budget)
        # drafts with the next captured gamma's graph; pad_drafts keeps gamma.
        # After a target step narrower than 1 + K (width_graphs.py) only that
        # width's own graph can replay: with it when gamma fits, else its gamma
        # without a graph.
        plan, steps = self._vspec_graph_plan, max(gamma, 1)
        dispatcher = getattr(getattr(self, "runner", None), "cudagraph_dispatcher", None)
        narrow = getattr(dispatcher, "narrow_width", None)
        drafted, pairing = steps, contextlib.nullcontext()
        if plan is not None and narrow is None:
            drafted = plan.drafted(steps)
        elif plan is not None:
            paired = plan.paired(steps, narrow)
            if paired is not None:
                drafted, pairing = paired, dispatcher.pairing_draft()
        with self._drafting(drafted), pairing:
            draft = self.drafting.propose(
                lambda: super(StepGammaProposer, self)._propose(**kwargs), kwargs, gamma)
        return pad_drafts(draft, gamma, self.max_num_speculative_tokens)

    # Extends AscendSpecDecodeBaseProposer.dummy_run: graph capture runs once
    # per gamma so every gamma has its own graph, captured into its own
    # (gamma, token count) parameter store; other dummy runs (profiling,
    # warm-up) use the maximum, which bounds memory. The runner
    # (NPUModelRunner._dummy_run) passes every argument by keyword.
    # A FULL draft graph replays only for a uniform decode batch of 1 + K
    # tokens a request (the dispatcher's uniform_decode), so every gamma's
    # capture runs the host's dummy_run at K: it samples num_tokens // (1 + K)
    # rows (the batch descriptor's, at most max_num_seqs) and builds K steps
    # of metadata; only the captured merged draft loop drafts gamma steps
    # (_draft_steps, the wrapper's runnable). The runner's capture of a target
    # width 1 + g of its own (pairing_capture) runs it at g instead, for g's
    # graph only: that width's descriptor rows, g steps.
    def dummy_run(self, *args: Any, **kwargs: Any) -> None:
        width_gamma = self._vspec_width_gamma
        if not capture_pass(kwargs, self.use_cuda_graph):
            with self._drafting(width_gamma):
                super().dummy_run(*args, **kwargs)
            return
        if self._vspec_graph_plan is None:
            self._vspec_graph_plan = self._plan_draft_graphs()
        plan = self._vspec_graph_plan
        if self.vspec_key_graph_params:
            own = self._vspec_own_width_sizes()
            graph_params.install(acl_graph, self, {g: own[g] for g in plan.at_width})
        # At a target width of its own: that width's gamma only, its rows and
        # steps (the host's dummy_run reads num_speculative_tokens for both).
        gammas = plan.captured if width_gamma is None else (width_gamma,)
        for gamma in gammas:
            with self._drafting(width_gamma, graph_gamma=gamma):
                super().dummy_run(*args, **kwargs)

    @contextlib.contextmanager
    def pairing_capture(self, gamma: int) -> Iterator[bool]:
        """The runner's capture of target width 1 + gamma: yields whether
        gamma's draft graph is captured there (the plan, made at 1 + K's
        capture, which comes first); the drafter's dummy runs meanwhile are
        that gamma's."""
        plan = self._vspec_graph_plan
        self._vspec_width_gamma = gamma
        try:
            yield plan is not None and gamma in plan.at_width
        finally:
            self._vspec_width_gamma = None

    def _vspec_own_width_sizes(self) -> dict[int, list[int]]:
        """gamma -> the token counts of target width 1 + gamma's FULL graphs,
        for each gamma < K whose width has them (width_graphs.WidthDispatcher)."""
        dispatcher = getattr(self.runner, "cudagraph_dispatcher", None)
        widths = getattr(dispatcher, "widths", ())
        return {w - 1: dispatcher.capture_sizes(w) for w in widths
                if 1 < w < self.max_num_speculative_tokens + 1}

    def _plan_draft_graphs(self) -> graph_budget.DraftGraphPlan:
        """At the first capture (the runner's dispatcher keys are final):
        which gammas below K get a graph within the memory budget; the
        skipped ones lose their wrapper, and one start-up line says so."""
        # Per-width target graphs (width_graphs.py): a gamma verified at a
        # width of its own is captured at that width's sizes.
        return plan_draft_graphs(self, self._vspec_own_width_sizes())

    @contextlib.contextmanager
    def _drafting(self, gamma: int | None, graph_gamma: int | None = None) -> Iterator[None]:
        """Bind the step's gamma (and the gamma whose draft graph runs, when it
        differs); the maximum again afterwards, even on error."""
        self._vspec_active_gamma, self._vspec_graph_gamma = gamma, graph_gamma
        self.drafting.new_pass()
        try:
            yield
        finally:
            self._vspec_active_gamma = self._vspec_graph_gamma = None


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


class VSpecEagleProposer(StepGammaProposer, AscendEagleProposer):
    """EAGLE / EAGLE-1 drafting with per-step gamma on the NPU."""


class VSpecDraftModelProposer(StepGammaProposer, AscendDraftModelProposer):
    """Serial draft-model drafting with per-step gamma on the NPU."""
