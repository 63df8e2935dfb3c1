"""A FULL target decode graph per verify width on vLLM-Ascend 0.23 (built,
off by default: `ascend_verify_width_graphs`; not yet run on NPU).

Why: the host keeps one FULL decode graph per token count, for batches of
1 + K tokens a request (vLLM's CudagraphDispatcher fixes one
`uniform_decode_query_len` in its constructor; NPUModelRunner's uniform test
in `_determine_batch_execution_and_padding` compares against the runner's).
A step that verifies 1 + g < 1 + K a request fails that test and runs
PIECEWISE or eagerly, which is why the 0.23 default pads the verify width
(hosts/vllm/verify_width.py). With a graph per width 1 + g, g = 0..K,
dispatched on the step's own width, nothing needs padding
(docs/design/ascend-per-width-target-graphs.md).

How, with the host's own code doing the work:
- `WidthDispatcher` (vLLM's CudagraphDispatcher): the attributes the host's
  dispatcher code reads and assigns (`uniform_decode_query_len`,
  `cudagraph_keys`, `_bs_to_padded_graph_size`, `compilation_config`) are
  a bound width's own, swapped in while it is bound (plain attributes, so
  what the host assigns reads back); unbound, they are the host's, for
  1 + K. Each
  other width's keys come from the host's `initialize_cudagraph_keys` run
  with that width bound over that width's capture sizes: the request counts
  the host captures for 1 + K, times the width (so `num_reqs = padded // w`
  holds exactly). A width keeps only FULL keys; a batch that is not a
  uniform batch of the bound width is dispatched on 1 + K's keys, as the
  host does (PIECEWISE graphs are width-blind).
- `VSpecNPUModelRunner` (NPUModelRunner): binds the width of a step around
  the host's `_determine_batch_execution_and_padding` (every request
  schedules the same count, that count has FULL graphs, and the batch fits
  the largest of them; else nothing is bound, 1 + K as today), so its
  uniform test, its dispatch and its descriptor all see that width; the
  width the dispatcher returned a uniform FULL descriptor for is the step's
  width, which `_pad_query_start_loc_for_fia` and the graph-parameter store
  read until the next step. `capture_model` is the host's, once per width,
  largest first (1 + K's, stock's, first), with the width bound: its
  `_dummy_run` builds batches of `max_query_len` = that width.
- Graph parameters: after the host's `_check_and_update_cudagraph_mode`
  creates the target's store (acl_graph `_graph_params`, keyed by token
  count), it is replaced once by one keyed by (width, token count)
  (graph_params.keyed_params, as the draft's is keyed by gamma): two widths
  captured at the same token count (20 = 4 x 5 = 10 x 2) keep their own
  parameter lists, and a replay's update reads only its width's.
- Which widths below 1 + K get graphs: graph_budget.plan_widths within
  `ascend_width_graph_budget_mib` (routing.width_graph_plan, from the engine
  config, the plan the scheduler pads by: a step at a skipped width is
  padded to 1 + K and never reaches the runner at that width; with
  `ascend_pad_verify_width` false it does, and takes the host's path,
  PIECEWISE or eager, as a mixed step). One start-up line gives the
  estimate and names the skipped widths.
- Draft graphs pair with widths (graph_budget.py): at 1 + K's capture the
  drafter captures K and the gammas padded to 1 + K, as without per-width
  graphs; at width 1 + g's capture (g >= 1) it captures gamma g's graph at
  that width's descriptors (`proposers.StepGammaProposer.pairing_capture`;
  the drafter's dummy runs are left out of a width whose gamma has no
  graph). A dispatch the runner did not bind (the drafter's, which passes
  the target's uniform flag) at a step of width 1 + g < 1 + K is that
  width's while the drafter replays g's graph (`pairing_draft`, which the
  proposer enters when its gamma fits that graph), else it is dispatched
  as not uniform, so the draft model runs PIECEWISE or eagerly there,
  drafting exactly its gamma, as on a mixed step.

Where it applies (routing.model_runner_cls_for; the scheduler pads only the
widths the plan skips by the same rule, verify_width.VerifyWidth.of): vspec
drives the engine, the budget admits a width below 1 + K,
`ascend_verify_width_graphs` is on, FULL decode graphs with a separate
decode routine (FULL_DECODE_ONLY, FULL_AND_PIECEWISE), DP 1 (ranks at
different widths cannot agree on one descriptor), no MLA (its metadata
builder pads by the runner's `decode_token_per_req`, 1 + K), no encoder
graphs, no sequence parallelism (flashcomm1 pads token counts to multiples
of the TP size).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

from vllm_ascend.compilation import acl_graph
from vllm_ascend.vspec import graph_params, routing
from vllm_ascend.vspec.graph_budget import WidthGraphPlan
from vllm_ascend.worker.model_runner_v1 import NPUModelRunner
from vllm_vspec.config import VSpecConfig

# Under "vllm.": vLLM configures only its own logger tree.
logger = init_logger(f"vllm.{__name__}")


class _WidthSizes:
    """The engine's compilation config as one width's keys see it: that
    width's capture sizes (and no compile sizes: those are the 1 + K
    graphs' concern); every other field is the engine's."""

    def __init__(self, config: Any, sizes: list[int]):
        self._config = config
        self.cudagraph_capture_sizes = sizes
        self.max_cudagraph_capture_size = max(sizes)
        self.compile_sizes = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


# The host attributes the dispatcher's code reads and assigns that each
# verify width has its own of.
PER_WIDTH = ("uniform_decode_query_len", "compilation_config", "cudagraph_keys",
             "_bs_to_padded_graph_size")


class WidthDispatcher(CudagraphDispatcher):
    """The host's dispatcher with FULL keys per verify width (module docstring)."""

    def __init__(self, vllm_config: Any, settings: VSpecConfig):
        super().__init__(vllm_config)
        # CudagraphDispatcher.__init__ set PER_WIDTH for 1 + K.
        self.k_width: int = self.uniform_decode_query_len
        self._settings = settings
        # The widths to capture (routing.width_graph_plan), planned when the
        # keys are built: the capture sizes are final then.
        self.width_plan: WidthGraphPlan | None = None
        # The bound width (None: 1 + K's); PER_WIDTH of every width not bound.
        self._bound: int | None = None
        self._state: dict[int | None, dict[str, Any]] = {}
        # Widths with FULL keys, largest first (initialize_cudagraph_keys).
        self.widths: tuple[int, ...] = (self.k_width,)
        # The width of the last step the runner dispatched a uniform FULL batch at.
        self.step_width: int = self.k_width
        # The drafter replays the step width's own draft graph (pairing_draft).
        self._draft_pairs = False

    @property
    def bound(self) -> int | None:
        """The width bound now (a capture's or a dispatch's), None: 1 + K's."""
        return self._bound

    @property
    def narrow_width(self) -> int | None:
        """The step's width when a FULL target graph narrower than 1 + K ran
        it (only that width's own draft graph can replay after it), else None."""
        return None if self.step_width == self.k_width else self.step_width

    @contextlib.contextmanager
    def pairing_draft(self) -> Iterator[None]:
        """The drafter's dispatches at a narrow step take the step width's
        descriptors (the drafter replays the graph captured there)."""
        self._draft_pairs = True
        try:
            yield
        finally:
            self._draft_pairs = False

    @property
    def in_force(self) -> int:
        """The width the host's code should see now: the bound one, else the step's."""
        return self.step_width if self._bound is None else self._bound

    @contextlib.contextmanager
    def binding(self, width: int | None) -> Iterator[None]:
        """The host's dispatcher code sees `width`'s PER_WIDTH attributes
        (1 + K's: None or 1 + K); what it assigns meanwhile stays that width's."""
        if width == self.k_width:
            width = None
        if width == self._bound:
            yield
            return
        if width is not None and width not in self._state:
            raise ValueError(f"verify width {width} has no FULL graphs (widths: {self.widths})")
        previous = self._bound
        self._swap(previous, width)
        try:
            yield
        finally:
            self._swap(width, previous)

    def _swap(self, out: int | None, into: int | None) -> None:
        self._state[out] = {name: getattr(self, name) for name in PER_WIDTH}
        for name, value in self._state.pop(into).items():
            setattr(self, name, value)
        self._bound = into

    @contextlib.contextmanager
    def step(self, num_tokens: int, num_reqs: int, max_num_scheduled_tokens: int
             ) -> Iterator[None]:
        """Bind the width of a batch for its dispatch (a binding already
        active, a capture's, stays); the step's width is 1 + K's until a
        bound dispatch returns a uniform FULL descriptor."""
        self.step_width = self.k_width
        width = self._bound
        if width is None:
            width = self.width_of(num_tokens, num_reqs, max_num_scheduled_tokens)
        with self.binding(width):
            yield

    def width_of(self, num_tokens: int, num_reqs: int, max_num_scheduled_tokens: int
                 ) -> int | None:
        """The width of a batch whose requests all schedule the same count,
        when that count has FULL graphs and the batch fits the largest;
        else None."""
        width = max_num_scheduled_tokens
        if width == self.k_width or width not in self.widths or num_tokens != width * num_reqs:
            return None
        with self.binding(width):
            return width if num_tokens <= self.compilation_config.max_cudagraph_capture_size \
                else None

    def capture_sizes(self, width: int) -> list[int]:
        """Token counts of `width`'s FULL graphs."""
        with self.binding(width):
            return sorted({d.num_tokens for d in self.cudagraph_keys[CUDAGraphMode.FULL]})

    def initialize_cudagraph_keys(self, cudagraph_mode: CUDAGraphMode,
                                  uniform_decode_query_len: int = 1) -> None:
        # CudagraphDispatcher.initialize_cudagraph_keys: the host's keys for 1 + K, then its FULL keys once per other width.
        super().initialize_cudagraph_keys(cudagraph_mode, uniform_decode_query_len)
        self.widths = (self.k_width,)
        if not (cudagraph_mode.decode_mode() == CUDAGraphMode.FULL
                and cudagraph_mode.separate_routine()):
            return
        requests = sorted({d.num_reqs for d in self.cudagraph_keys[CUDAGraphMode.FULL]
                           if d.uniform})
        if not requests:
            return
        engine = self.compilation_config
        self.width_plan = routing.width_graph_plan(self.vllm_config, self._settings)
        for width in self.width_plan.widths:
            if width == self.k_width:
                continue
            self._state[width] = {
                "uniform_decode_query_len": width,
                "compilation_config": _WidthSizes(engine, [width * n for n in requests]),
                "cudagraph_keys": {CUDAGraphMode.PIECEWISE: set(), CUDAGraphMode.FULL: set()},
                "_bs_to_padded_graph_size": []}
            with self.binding(width):
                super().initialize_cudagraph_keys(cudagraph_mode, width)
                self.cudagraph_keys[CUDAGraphMode.PIECEWISE].clear()
        self.widths = (self.k_width, *sorted(self._state.keys() - {None}, reverse=True))

    def dispatch(self, num_tokens: int, uniform_decode: bool = False, *args: Any,
                 **kwargs: Any) -> Any:
        # CudagraphDispatcher.dispatch: a uniform batch of the bound width takes that width's keys; anything else 1 + K's.
        if self._bound is None:
            # Not the runner's (the drafter's) at a step of another width:
            # that width's descriptors while the drafter replays its graph,
            # else as a mixed batch.
            narrow = self.narrow_width
            if narrow is not None and self._draft_pairs and uniform_decode:
                with self.binding(narrow):
                    return super().dispatch(num_tokens, uniform_decode, *args, **kwargs)
            if narrow is not None:
                uniform_decode = False
            return super().dispatch(num_tokens, uniform_decode, *args, **kwargs)
        width = self._bound
        with self.binding(width if uniform_decode else None):
            mode, descriptor = super().dispatch(num_tokens, uniform_decode, *args, **kwargs)
        if mode == CUDAGraphMode.FULL and descriptor.uniform:
            self.step_width = width
        return mode, descriptor


class ActiveWidth:
    """The target graph-parameter store's key: `active()` is the bound width
    while a capture or a dispatch binds one (None outside); calling it gives
    the store to use: the bound width, else the step's."""

    def __init__(self, dispatcher: WidthDispatcher):
        self._dispatcher = dispatcher

    def active(self) -> int | None:
        return self._dispatcher.bound

    def __call__(self) -> int:
        return self._dispatcher.in_force


def install_params(dispatcher: WidthDispatcher) -> Any:
    """Key the host's target graph parameters by (width, token count) once
    (a store already keyed, or none, is left as it is). Returns the store."""
    current = getattr(acl_graph, "_graph_params", None)
    if current is None or isinstance(current.attn_params, graph_params.PerGamma):
        return current
    # 1 + K's store holds the host's token counts; every other width its own.
    counts = {w: None if w == dispatcher.k_width else dispatcher.capture_sizes(w)
              for w in dispatcher.widths}
    keyed = graph_params.keyed_params(acl_graph, current, ActiveWidth(dispatcher), counts)
    acl_graph._graph_params = keyed
    return keyed


class VSpecNPUModelRunner(NPUModelRunner):
    """NPUModelRunner with a FULL decode graph per verify width (module docstring)."""

    def __init__(self, vllm_config: Any, device: Any):
        super().__init__(vllm_config, device)
        settings = routing.vspec_settings(self.vllm_config) or VSpecConfig()
        # GPUModelRunner.__init__ built the host's dispatcher: ours keys each verify width the budget admits.
        self.cudagraph_dispatcher = WidthDispatcher(self.vllm_config, settings)

    @property
    def uniform_decode_query_len(self) -> int:
        # GPUModelRunner.__init__ assigns 1 + K: the uniform test, _dummy_run and the FIA padding read the bound width.
        dispatcher = getattr(self, "cudagraph_dispatcher", None)
        if isinstance(dispatcher, WidthDispatcher):
            return dispatcher.uniform_decode_query_len
        return self._vspec_k_width

    @uniform_decode_query_len.setter
    def uniform_decode_query_len(self, value: int) -> None:
        self._vspec_k_width = value

    def _determine_batch_execution_and_padding(self, num_tokens: int, num_reqs: int,
                                               num_scheduled_tokens_np: Any,
                                               max_num_scheduled_tokens: int, *args: Any,
                                               **kwargs: Any) -> Any:
        # NPUModelRunner._determine_batch_execution_and_padding: its uniform test and dispatch at the step's width.
        with self.cudagraph_dispatcher.step(num_tokens, num_reqs, max_num_scheduled_tokens):
            return super()._determine_batch_execution_and_padding(
                num_tokens, num_reqs, num_scheduled_tokens_np, max_num_scheduled_tokens,
                *args, **kwargs)

    def _pad_query_start_loc_for_fia(self, *args: Any, **kwargs: Any) -> Any:
        # NPUModelRunner._pad_query_start_loc_for_fia: a uniform batch's padded requests at the step's width.
        dispatcher = self.cudagraph_dispatcher
        with dispatcher.binding(dispatcher.in_force):
            return super()._pad_query_start_loc_for_fia(*args, **kwargs)

    def _check_and_update_cudagraph_mode(self, attention_backends: Any,
                                         kv_cache_groups: Any) -> None:
        # NPUModelRunner._check_and_update_cudagraph_mode: once the host created the target's graph-parameter store, key it by width.
        super()._check_and_update_cudagraph_mode(attention_backends, kv_cache_groups)
        dispatcher = self.cudagraph_dispatcher
        install_params(dispatcher)
        if dispatcher.width_plan is None:
            return
        extra = {w: len(dispatcher.capture_sizes(w)) for w in dispatcher.widths[1:]}
        (logger.warning if dispatcher.width_plan.skipped else logger.info)(
            "%s; FULL target decode graphs for verify widths %s: %d beyond stock's %d for "
            "width %d", dispatcher.width_plan.line(), ", ".join(map(str, dispatcher.widths)),
            sum(extra.values()), len(dispatcher.capture_sizes(dispatcher.k_width)),
            dispatcher.k_width)

    def capture_model(self) -> int:
        # NPUModelRunner.capture_model: the host's capture once per width, largest first, with that width bound.
        dispatcher = self.cudagraph_dispatcher
        total = 0
        try:
            for width in dispatcher.widths:
                with dispatcher.binding(width), self._drafter_at(width):
                    total += super().capture_model()
        finally:
            dispatcher.step_width = dispatcher.k_width
        return total

    @contextlib.contextmanager
    def _drafter_at(self, width: int) -> Iterator[None]:
        """The drafter's dummy runs (its graph captures): all of them at
        1 + K; at another width only the ones of the gamma whose draft graph
        pairs with it (the proposer's pairing_capture), else none."""
        drafter = self.drafter
        pairing = getattr(drafter, "pairing_capture", None)
        if width == self.cudagraph_dispatcher.k_width:
            yield
            return
        with contextlib.nullcontext(False) if pairing is None else pairing(width - 1) as pairs:
            if not pairs:
                self.drafter = None
            try:
                yield
            finally:
                self.drafter = drafter
