"""What the per-gamma draft graphs cost, estimated, and which gammas get one
(vLLM-Ascend 0.23; not yet run on NPU).

Stock vLLM-Ascend captures one FULL draft graph (the K-step merged draft
loop) for every FULL batch descriptor of the runner's dispatcher
(NPUModelRunner._dummy_run calls the drafter's dummy_run for each capture).
vspec captures one per gamma 1..K at each of those descriptors: K - 1 extra
graphs per capture size, each captured into the platform's one graph pool
after the KV cache is allocated, so they take the headroom
`gpu_memory_utilization` leaves.

The estimate (an assumption until it is measured on an NPU, docs/ascend.md
validation step 15): a captured graph holds at least vLLM's per-graph floor
(GPUModelRunner.profile_cudagraph_memory counts at least 1 MiB per graph for
driver overhead), plus task records that grow with what it launches, taken
as LAYER_STEP_BYTES per draft attention layer and draft step. Activations
and FIA workspaces are pool blocks a later capture reuses (the wrapper keeps
only weak references to them), so the largest capture, gamma K's, which
stock captures too, bounds them and they are not counted:

    extra(g) = sum over capture sizes S of max(GRAPH_FLOOR, g x layers x LAYER_STEP_BYTES)
    extra    = sum of extra(g) over the gammas 1..K-1 that are captured

Rule: gammas are admitted from the smallest (cheapest) up while the running
total fits `ascend_draft_graph_budget_mib`; the others are skipped (no
graph, one start-up line names them). A step at a skipped gamma drafts with
the smallest captured gamma above it (at worst K, stock's graph) and keeps
its first gamma drafts (the rest become invalid drafts the verifier
rejects): its drafts are those the chosen gamma would give, its draft cost
is the larger graph's, never more than stock's (past the capture range,
where no draft graph replays, it drafts that larger gamma eagerly, as every
pass there runs). It never runs the draft
eagerly under a FULL forward context: an eager pass costs every launch,
more than the K-step graph on the bundled profile (docs/ascend.md, "What
each default costs").

With per-width target graphs (`ascend_verify_width_graphs`, width_graphs.py)
draft graphs are captured only where they pair with a width: a draft graph
replays after a target step of the width it was captured at, and a gamma
whose verify width 1 + gamma has a FULL target graph of its own is
verified at that width, not at 1 + K (which only K and the gammas padded
to 1 + K are). So such a gamma's graph is captured at its own width's
descriptors (`own_width_sizes`: the request counts of 1 + K's graphs times
1 + gamma, the target's sizes there; rows = size // (1 + gamma)) instead
of 1 + K's, priced over those sizes, admitted by the same rule. A step
after a target step of width 1 + g drafts with g's graph when its gamma is
at most g (keeping its first gamma drafts, as above), else exactly its
gamma without a graph (PIECEWISE or eagerly: width_graphs.WidthDispatcher).
Width 1 (gamma 0) pairs with no graph: its one draft pass samples a row
per token, while the host's dummy_run sizes a capture's rows by its steps
(num_tokens // (steps + 1)), and a one-step graph at width 1's sizes would
share gamma 1's store keys, (gamma, token count).

What the per-width target graphs cost (the same assumption, not yet run on
an NPU): one FULL target graph per request count of 1 + K's FULL graphs
(`decode_requests`, the host dispatcher's rule) for each width 1 + g,
g < K, each holding max(GRAPH_FLOOR, decoder layers x LAYER_STEP_BYTES):

    extra_width(g) = len(decode_requests) x max(GRAPH_FLOOR, layers x LAYER_STEP_BYTES)

Every width below 1 + K costs the same, so the order widths are admitted
in is by what a skipped width costs the steps that use it (`plan_widths`):
from width 1 (gamma 0) up while the running total fits
`ascend_width_graph_budget_mib`. A step at a skipped width is padded to
1 + K (the skipped ones are the widest, so the next captured width above
each is 1 + K's, stock's), which costs its verify K - g more tokens a
request. The policy chooses small gammas at large batches, where the
target's verify is compute-bound and padding costs in proportion to the
tokens, and large gammas at small batches, where the verify is bound by
reading the weights and a wider verify costs little more: padding the
widest widths costs least.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

from vllm_vspec.core.steps import covering_gamma

MIB = 1 << 20
# vLLM's own per-graph floor in its graph memory estimate (driver overhead).
GRAPH_FLOOR_BYTES = MIB
# Assumed task-record bytes per draft attention layer and draft step (the
# dozen or so kernels one decoder layer launches); not measured.
LAYER_STEP_BYTES = 128 * 1024


def graph_bytes(layer_passes: int) -> int:
    """Estimated bytes one captured graph that runs `layer_passes` decoder
    layers holds beyond the pool blocks the largest capture already takes."""
    return max(GRAPH_FLOOR_BYTES, max(layer_passes, 1) * LAYER_STEP_BYTES)


def draft_graph_bytes(steps: int, draft_layers: int) -> int:
    """Estimated bytes of one captured draft graph of `steps` draft steps."""
    return graph_bytes(steps * max(draft_layers, 1))


def full_capture_sizes(runner: Any) -> list[int]:
    """Token counts of the runner's FULL batch descriptors (vLLM's
    CudagraphDispatcher.cudagraph_keys, initialised before capture): the
    sizes at which the draft's FULL graphs are captured."""
    from vllm.config import CUDAGraphMode

    dispatcher = getattr(runner, "cudagraph_dispatcher", None)
    keys = getattr(dispatcher, "cudagraph_keys", None) or {}
    return sorted({desc.num_tokens for desc in keys.get(CUDAGraphMode.FULL, ())})


@dataclasses.dataclass(frozen=True)
class DraftGraphPlan:
    """Which gammas below K get a draft graph, and the estimate behind it."""

    max_gamma: int
    sizes: tuple[int, ...]
    draft_layers: int
    budget_mib: float
    cost: dict[int, int]          # gamma < K -> estimated bytes over all sizes
    kept: tuple[int, ...]         # gammas < K captured
    skipped: tuple[int, ...]      # gammas < K not captured for the budget
    at_width: tuple[int, ...] = ()  # kept gammas captured at their own width 1 + g

    @property
    def captured(self) -> tuple[int, ...]:
        """Every gamma captured at 1 + K's descriptors, K (stock's graph) included."""
        return (*(g for g in self.kept if g not in self.at_width), self.max_gamma)

    @property
    def kept_bytes(self) -> int:
        return sum(self.cost[g] for g in self.kept)

    def drafted(self, gamma: int) -> int:
        """The gamma whose graph a step at `gamma` (>= 1) after a 1 + K
        target step drafts with."""
        return covering_gamma(self.captured, gamma, self.max_gamma)

    def paired(self, gamma: int, width: int) -> int | None:
        """The gamma whose graph a step at `gamma` (>= 1) after a target
        step of `width` < 1 + K drafts with: that width's own, when captured
        and `gamma` fits it; None: no draft graph replays (its gamma, eagerly)."""
        own = width - 1
        return own if own in self.at_width and gamma <= own else None

    def line(self) -> str:
        """The start-up line."""
        head = (f"vspec: per-gamma draft graphs at {len(self.sizes)} capture sizes, "
                f"{self.draft_layers} draft attention layers: estimated "
                f"{self.kept_bytes / MIB:.0f} MiB beyond stock's K-step graphs for gammas "
                f"{_names(self.kept) or 'none'} (ascend_draft_graph_budget_mib="
                f"{self.budget_mib:g}; an estimate, not measured)")
        if self.at_width:
            head = (f"{head}; gammas {_names(self.at_width)} captured at their own verify "
                    f"widths' sizes (their target graphs' widths), not at 1 + K's")
        if not self.skipped:
            return head
        return (f"{head}; skipped gammas {_names(self.skipped)} (estimated "
                f"{sum(self.cost[g] for g in self.skipped) / MIB:.0f} MiB more): a step at a "
                f"skipped gamma drafts with the next captured gamma's graph and keeps its "
                f"first gamma drafts")


def _names(gammas: Iterable[int]) -> str:
    return ", ".join(str(g) for g in gammas)


def _admit(cost: dict[int, int], budget_mib: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(kept, skipped): the keys of `cost` in order while their running
    total fits `budget_mib`; the first that does not fit and all after it
    are skipped."""
    kept: list[int] = []
    total = 0
    for key, price in cost.items():
        if total + price > budget_mib * MIB:
            break
        kept.append(key)
        total += price
    return tuple(kept), tuple(key for key in cost if key not in kept)


def plan(max_gamma: int, sizes: Iterable[int], draft_layers: int, budget_mib: float,
         own_width_sizes: dict[int, Iterable[int]] | None = None) -> DraftGraphPlan:
    """Admit gammas 1..K-1 from the smallest up while their estimated graphs
    fit `budget_mib` (module docstring); a gamma of `own_width_sizes` is
    priced, and captured, at its own width's sizes instead of `sizes`."""
    sizes = tuple(sorted(set(sizes)))
    own = {g: tuple(v) for g, v in (own_width_sizes or {}).items() if 0 < g < max_gamma}
    cost = {g: len(own.get(g, sizes)) * draft_graph_bytes(g, draft_layers)
            for g in range(1, max_gamma)}
    kept, skipped = _admit(cost, budget_mib)
    return DraftGraphPlan(max_gamma, sizes, draft_layers, budget_mib, cost, kept, skipped,
                          tuple(g for g in kept if g in own))


def decode_requests(capture_sizes: Iterable[int], max_gamma: int,
                    max_num_seqs: int) -> tuple[int, ...]:
    """Request counts of the target's FULL decode graphs at 1 + K, from the
    engine's capture sizes: vLLM's CudagraphDispatcher.initialize_cudagraph_keys
    keys the sizes in [1 + K, (1 + K) x max_num_seqs], and vLLM-Ascend's
    _create_padded_batch_descriptor gives each min(size // (1 + K),
    max_num_seqs) requests. Every other width is captured at these counts."""
    width = 1 + max_gamma
    return tuple(sorted({min(size // width, max_num_seqs) for size in capture_sizes
                         if width <= size <= width * max_num_seqs}))


def stage_layers(vllm_config: Any) -> int:
    """Decoder layers one pipeline stage's target graph runs (the largest
    stage's: every rank plans the same widths)."""
    total = vllm_config.model_config.get_total_num_hidden_layers()
    stages = getattr(vllm_config.parallel_config, "pipeline_parallel_size", 1)
    return -(-total // stages)


@dataclasses.dataclass(frozen=True)
class WidthGraphPlan:
    """Which verify widths below 1 + K get FULL target graphs, and the
    estimate behind it (module docstring). Widths are 1 + gamma."""

    max_gamma: int
    requests: tuple[int, ...]     # request counts with a FULL graph at every captured width
    layers: int
    budget_mib: float
    cost: dict[int, int]          # gamma < K -> estimated bytes of width 1 + gamma's graphs
    kept: tuple[int, ...]         # gammas < K whose width is captured
    skipped: tuple[int, ...]      # gammas < K padded to the next captured width

    @property
    def captured(self) -> tuple[int, ...]:
        """Every gamma whose width has FULL target graphs, K's (stock's) included."""
        return (*self.kept, self.max_gamma)

    @property
    def widths(self) -> tuple[int, ...]:
        """The captured verify widths, largest (1 + K) first."""
        return tuple(1 + g for g in sorted(self.captured, reverse=True))

    @property
    def kept_bytes(self) -> int:
        return sum(self.cost[g] for g in self.kept)

    def verified(self, gamma: int) -> int:
        """The draft slots a step at `gamma` verifies: the smallest captured
        gamma at or above it (K past the largest)."""
        return covering_gamma(self.captured, gamma, self.max_gamma)

    def line(self) -> str:
        """The start-up line."""
        head = (f"vspec: FULL target decode graphs per verify width at {len(self.requests)} "
                f"request counts, {self.layers} decoder layers: estimated "
                f"{self.kept_bytes / MIB:.0f} MiB beyond stock's for widths "
                f"{_names(1 + g for g in self.kept) or 'none'} (ascend_width_graph_budget_mib="
                f"{self.budget_mib:g}; an estimate, not measured; not yet run on NPU)")
        if not self.skipped:
            return head
        return (f"{head}; skipped widths {_names(1 + g for g in self.skipped)} (estimated "
                f"{sum(self.cost[g] for g in self.skipped) / MIB:.0f} MiB more): a decode step "
                f"at a skipped width is padded to {1 + self.max_gamma} with invalid drafts")


def plan_widths(max_gamma: int, requests: Iterable[int], layers: int,
                budget_mib: float) -> WidthGraphPlan:
    """Admit widths 1 + g, g = 0..K-1, from the smallest up while their
    estimated graphs fit `budget_mib` (module docstring)."""
    requests = tuple(sorted(set(requests)))
    cost = {g: len(requests) * graph_bytes(layers) for g in range(max_gamma)}
    kept, skipped = _admit(cost, budget_mib)
    return WidthGraphPlan(max_gamma, requests, layers, budget_mib, cost, kept, skipped)


def engine_width_plan(vllm_config: Any, budget_mib: float) -> WidthGraphPlan:
    """The plan from the engine config alone (its final capture sizes), so
    the scheduler and every worker reach the same one."""
    k = vllm_config.speculative_config.num_speculative_tokens
    sizes = vllm_config.compilation_config.cudagraph_capture_sizes or ()
    return plan_widths(k, decode_requests(sizes, k, vllm_config.scheduler_config.max_num_seqs),
                       stage_layers(vllm_config), budget_mib)
