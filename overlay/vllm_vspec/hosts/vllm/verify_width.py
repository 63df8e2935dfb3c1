"""How many draft slots a decode step verifies on vLLM-Ascend: the step's
gamma, or K when padding keeps the target's full decode ACL graph (not yet
run on NPU). Elsewhere (CPU, CUDA) always the step's gamma.

Why pad, as read from vLLM-Ascend 0.23.0.post1's sources (statically; none
of this has run on an NPU): the runner replays the target's full decode
graph only for a uniform decode step, every request scheduling exactly
1 + K tokens (NPUModelRunner._determine_batch_execution_and_padding); a step with
gamma < K takes the mixed-batch path (piecewise graphs under
FULL_AND_PIECEWISE, eager under FULL_DECODE_ONLY). Padding each request's
drafts with K - gamma invalid drafts (-1, vLLM's placeholder id) keeps the
step uniform, so the target costs what stock vLLM-Ascend's fixed-K verify
costs, never more. Why outputs should stay exact: the runner gathers the
verifier's draft ids with the -1 kept (NPUModelRunner._calc_spec_decode_metadata),
feeds a -1 input to the model as token 0
(NPUModelRunner._sanitize_placeholder_input_ids_for_forward), and -1 never equals a target token, so the verifier rejects it
(and everything after it). That chain is read, not tested on the NPU path
(the CPU engine tests run vLLM 0.32, whose own scheduler pads partial drafts
the same way: vllm/v1/core/sched/scheduler.py, "Pad new decode requests to
uniform spec decoding size"). The draft model still drafts only gamma
tokens; the target verifies K - gamma more positions a request, so padding
stops where no graph is kept (a batch over the capture range).

A graph per verify width (1 + g) removes that cost: with
`ascend_verify_width_graphs` (vLLM-Ascend 0.23, off by default, not yet run
on NPU) the worker runs vllm_ascend/vspec/width_graphs.py's runner and
only the widths its memory budget skips are padded, to 1 + K; vLLM-Ascend's
routing decides where it applies and which widths have graphs
(`width_graph_gammas`), and this rule asks it, so the runner and the
padding never disagree.

Where it is decided: here, when the scheduler is built, from the engine
core's vllm_config. The worker's compilation config is final only after
NPUModelRunner._check_and_update_cudagraph_mode (which can downgrade FULL
modes). With one worker (uniproc executor, TP 1) the
worker holds the engine core's own vllm_config object
(UniProcExecutor) and the scheduler is built after the workers captured
(EngineCore.__init__ builds the executor first), so this
reads the final mode (read, not run); with TP > 1 each worker has a copy and
vLLM 0.23 returns nothing of it to the engine core. The NPU proposer warns
on its first step when its worker's final mode has no full decode graph
(vllm_ascend/vspec/proposers.py): padding then keeps no graph (it still
costs no more than stock's 1 + K).

Who pads: the scheduler (VSpecScheduler), which knows each step's gamma and
batch: under sync scheduling it keeps the first `verified` drafts of each
request's list, under async scheduling it sizes the next step's draft
placeholders by it. It reports the pads as vLLM's `num_invalid_spec_tokens`,
so neither vLLM's acceptance metrics nor the controller count them as
drafts. The NPU proposer always returns K columns (gamma drafts, then -1):
vLLM 0.23's runner copies the draft tensor into a [max_num_reqs, K] buffer
and hands the scheduler all K columns (gpu_model_runner.py
_copy_draft_token_ids_to_cpu, _get_draft_token_ids_cpu), and under async
scheduling reads the previous step's drafts with a row stride of K
(_prepare_input_ids: `start = prev_index * self.num_spec_tokens`); a
[batch, gamma] draft would fail that copy or be read at the wrong rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from vllm.config import CUDAGraphMode

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.steps import covering_gamma
from vllm_vspec.kernels.acceptance import NO_TOKEN



@dataclass(frozen=True)
class VerifyWidth:
    """The engine's padding rule, fixed at start-up."""

    k: int
    # Pad steps of at most this many requests (0: never): the most whose
    # 1 + K tokens each fit the largest captured graph.
    pad_max_reqs: int
    # The gammas whose verify width has a FULL target graph; a padded step
    # verifies the smallest of them at or above its gamma.
    graphed: tuple[int, ...] = ()

    @classmethod
    def of(cls, vllm_config: Any, settings: VSpecConfig | None) -> "VerifyWidth":
        k = vllm_config.speculative_config.num_speculative_tokens
        compilation = vllm_config.compilation_config
        capture = getattr(compilation, "max_cudagraph_capture_size", None)
        mode = compilation.cudagraph_mode
        npu = vllm_config.device_config.device_type == "npu"
        pads = (settings is not None and settings.ascend_pad_verify_width and npu
                and mode is not None and mode.decode_mode() == CUDAGraphMode.FULL
                and bool(capture))
        graphed = _graphed(vllm_config, settings) if pads else (k,)
        if graphed == tuple(range(k + 1)):
            pads = False
        return cls(k=k, pad_max_reqs=capture // (1 + k) if pads else 0, graphed=graphed)

    @property
    def pads(self) -> bool:
        """Whether any step can be padded."""
        return self.pad_max_reqs > 0

    @property
    def pads_to_k(self) -> bool:
        """Whether every padded step verifies K (no width below 1 + K has a graph)."""
        return self.pads and self.graphed == (self.k,)

    def verified(self, gamma: int, num_reqs: int) -> int:
        """Draft slots each request of a step of num_reqs requests that
        drafted gamma verifies in the next step."""
        if not 0 < num_reqs <= self.pad_max_reqs:
            return gamma
        return covering_gamma(self.graphed, gamma, self.k)


def _graphed(vllm_config: Any, settings: VSpecConfig) -> tuple[int, ...]:
    """The gammas whose verify width has a FULL NPU target graph: K's only
    unless vLLM-Ascend's routing gives the target a graph per verify width,
    by the rule its worker builds its runner by (vllm_ascend/vspec/routing.py
    width_graph_gammas)."""
    k = vllm_config.speculative_config.num_speculative_tokens
    if not settings.ascend_verify_width_graphs:
        return (k,)
    from vllm_ascend.vspec.routing import width_graph_gammas

    return width_graph_gammas(vllm_config, settings)


def pad_drafts(draft: torch.Tensor, gamma: int, columns: int) -> torch.Tensor:
    """The first gamma columns of `draft`, then NO_TOKEN up to `columns`."""
    if columns == gamma:
        return draft[:, :gamma]
    out = draft.new_full((draft.shape[0], columns), NO_TOKEN)
    out[:, :gamma] = draft[:, :gamma]
    return out
