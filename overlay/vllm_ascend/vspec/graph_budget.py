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
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

MIB = 1 << 20
# vLLM's own per-graph floor in its graph memory estimate (driver overhead).
GRAPH_FLOOR_BYTES = MIB
# Assumed task-record bytes per draft attention layer and draft step (the
# dozen or so kernels one decoder layer launches); not measured.
LAYER_STEP_BYTES = 128 * 1024


def draft_graph_bytes(steps: int, draft_layers: int) -> int:
    """Estimated bytes one captured draft graph of `steps` draft steps holds
    beyond the pool blocks the largest capture already takes."""
    return max(GRAPH_FLOOR_BYTES, steps * max(draft_layers, 1) * LAYER_STEP_BYTES)


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
    skipped: tuple[int, ...]      # gammas < K not captured

    @property
    def captured(self) -> tuple[int, ...]:
        """Every gamma captured, K (stock's graph) included."""
        return (*self.kept, self.max_gamma)

    @property
    def kept_bytes(self) -> int:
        return sum(self.cost[g] for g in self.kept)

    def drafted(self, gamma: int) -> int:
        """The gamma whose graph a step at `gamma` (>= 1) drafts with."""
        return min(g for g in self.captured if g >= gamma)

    def line(self) -> str:
        """The start-up line."""
        head = (f"vspec: per-gamma draft graphs at {len(self.sizes)} capture sizes, "
                f"{self.draft_layers} draft attention layers: estimated "
                f"{self.kept_bytes / MIB:.0f} MiB beyond stock's K-step graphs for gammas "
                f"{_names(self.kept) or 'none'} (ascend_draft_graph_budget_mib="
                f"{self.budget_mib:g}; an estimate, not measured)")
        if not self.skipped:
            return head
        return (f"{head}; skipped gammas {_names(self.skipped)} (estimated "
                f"{sum(self.cost[g] for g in self.skipped) / MIB:.0f} MiB more): a step at a "
                f"skipped gamma drafts with the next captured gamma's graph and keeps its "
                f"first gamma drafts")


def _names(gammas: Iterable[int]) -> str:
    return ", ".join(str(g) for g in gammas)


def plan(max_gamma: int, sizes: Iterable[int], draft_layers: int,
         budget_mib: float) -> DraftGraphPlan:
    """Admit gammas 1..K-1 from the smallest up while their estimated graphs
    fit `budget_mib` (module docstring)."""
    sizes = tuple(sorted(set(sizes)))
    cost = {g: len(sizes) * draft_graph_bytes(g, draft_layers) for g in range(1, max_gamma)}
    kept: list[int] = []
    total = 0
    for g in range(1, max_gamma):
        if total + cost[g] > budget_mib * MIB:
            break
        kept.append(g)
        total += cost[g]
    skipped = tuple(g for g in range(1, max_gamma) if g not in kept)
    return DraftGraphPlan(max_gamma, sizes, draft_layers, budget_mib, cost, tuple(kept), skipped)
