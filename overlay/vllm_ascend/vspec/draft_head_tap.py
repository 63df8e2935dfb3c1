"""The one tap on the NPU draft model's logits, and the head options it
serves (not yet run on NPU).

vLLM-Ascend's merged draft loop (`_run_merged_draft`) takes every greedy
draft token as `self.model.compute_logits(h).argmax(-1)`, so that call is
where vspec drafts from: `DraftLogitsTap`, a ModelTap (model_tap.py) around
the draft model, whose `compute_logits` runs the draft head and then shows
the logits it returns to each observer of the proposer's list, in order
(hosts/draft_observers.py: the entropy stop's buffer, entropy_tap.py; the
diagnostics traces). The head (vllm_vspec.kernels.draft_head.DraftHead, the
host-agnostic core; `npu_draft_head` builds it) gives

- with an active vocabulary (on a pure-greedy step): the active rows' logits
  written into their columns of a full-width row that is -inf everywhere
  else. The buffer is kept between calls and only active columns are ever
  written, so the rest stays -inf; the host's argmax over it is the active
  argmax's full token id (ties: the smaller id, as DraftHead's sorted ids
  give on CPU). The head's matmul covers only the active rows; the extra
  work is a copy of rows x active-ids values.
- with an int8 head: DraftHead's Int8Linear, whose matmul on "npu" is
  NpuInt8Matmul below (registered in draft_head.INT8_MATMULS at import):
  torch_npu.npu_weight_quant_batchmatmul (w8a16) and
  torch_npu.npu_dynamic_quant + torch_npu.npu_quant_matmul (w8a8), the ops
  vLLM-Ascend's own W8A16 / W8A8-dynamic linear methods call. Where
  torch_npu lacks one, or the shapes or dtype are outside what it takes,
  the engine stops at start-up naming the key and the reason.
- otherwise (no head: only observers) the host's own compute_logits.

The target verifies with its own full head, so strict acceptance stays
exact. A full ACL graph of the draft loop (`ascend_draft_full_graph`, the default) would
bake one head into the graph, so an active vocabulary (chosen per step) is
refused with it; an int8 head has no per-step choice and is allowed.
"""

from __future__ import annotations

from typing import Any

import torch

from vllm_ascend.vspec.model_tap import ModelTap
from vllm_vspec.hosts.draft_observers import DraftObserver
from vllm_vspec.kernels import draft_head
from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.core.drafter_keys import refuse_head, wants_head
from vllm_vspec.kernels.draft_head import DraftHead, draft_head_for

# Model dtypes torch_npu's int8 matmuls take as activations.
NPU_INT8_DTYPES = (torch.float16, torch.bfloat16)
# torch_npu.npu_weight_quant_batchmatmul's per-group scales: groups of a
# multiple of 32 input channels, fewer than the input width (else one group).
NPU_W8A16_GROUP_MULTIPLE = 32


class NpuInt8Matmul:
    """x @ W.T for blockwise int8 W (draft_head.quantize_int8's q [N, K] and
    scales [N, K // g]) with torch_npu's kernels. Both take the weight as
    [K, N] int8, as vLLM-Ascend's linear methods store it after loading.

    - w8a16: one npu_weight_quant_batchmatmul(x, W [K, N], antiquant_scale)
      with per-channel scales [N] (one block) or per-group scales [K/g, N]
      and antiquant_group_size g.
    - w8a8: per block b, npu_dynamic_quant(x_b) gives int8 x_b and its
      per-token scales; npu_quant_matmul(x_b, W_b [g, N], scale_b [N],
      pertoken_scale) gives the block's rescaled product; blocks are summed
      in float32."""

    OPS = {"w8a16": ("npu_weight_quant_batchmatmul",),
           "w8a8": ("npu_dynamic_quant", "npu_quant_matmul")}

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, mode: str,
                 dtype: torch.dtype) -> None:
        import torch_npu

        missing = [op for op in self.OPS[mode] if not hasattr(torch_npu, op)]
        if missing:
            raise VSpecConfigError(
                "draft_lm_head_quantization", mode,
                f"'none' here: this torch_npu ({getattr(torch_npu, '__version__', '?')}) has no "
                f"torch_npu.{', torch_npu.'.join(missing)}, which the {mode} head needs")
        if dtype not in NPU_INT8_DTYPES:
            raise VSpecConfigError(
                "draft_lm_head_quantization", mode,
                f"'none' with a {dtype} draft model: torch_npu's int8 matmuls take float16 "
                "or bfloat16 activations")
        n, k = q.shape
        blocks = scales.shape[1]
        group = k // blocks
        self.mode, self.group = mode, group
        self._ops = torch_npu
        weight_kn = q.t().contiguous()
        if mode == "w8a16":
            if blocks > 1 and group % NPU_W8A16_GROUP_MULTIPLE:
                raise VSpecConfigError(
                    "draft_lm_head_quant_group_size", group,
                    f"0 or a multiple of {NPU_W8A16_GROUP_MULTIPLE} for w8a16 on NPU "
                    "(torch_npu.npu_weight_quant_batchmatmul's antiquant_group_size)")
            self.weight = weight_kn
            # One block: per-channel scales [N] and group size 0.
            self.scale = (scales[:, 0] if blocks == 1 else scales.t()).contiguous().to(dtype)
            self.group_size = 0 if blocks == 1 else group
        else:
            self.blocks = [weight_kn[b * group:(b + 1) * group].contiguous()
                           for b in range(blocks)]
            self.block_scales = [scales[:, b].contiguous().to(dtype) for b in range(blocks)]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ops = self._ops
        if self.mode == "w8a16":
            return ops.npu_weight_quant_batchmatmul(
                x, self.weight, antiquant_scale=self.scale,
                antiquant_group_size=self.group_size)
        g = self.group
        out = None
        for b, (w, s) in enumerate(zip(self.blocks, self.block_scales)):
            xq, xs = ops.npu_dynamic_quant(x[:, b * g:(b + 1) * g].contiguous())
            yb = ops.npu_quant_matmul(xq, w, s, pertoken_scale=xs,
                                      output_dtype=x.dtype).float()
            out = yb if out is None else out + yb
        return out.to(x.dtype)


draft_head.INT8_MATMULS["npu"] = NpuInt8Matmul


def npu_draft_head(proposer: Any, settings: VSpecConfig | None) -> DraftHead | None:
    """The draft head of `proposer` (its loaded draft model's LM head) when
    the settings ask for one; None otherwise. Raises VSpecConfigError naming
    the key when this drafter cannot take it."""
    if settings is None or not wants_head(settings):
        return None
    # Imported here: only a head needs it, and stand-in hosts lack it.
    from vllm_ascend.utils import lmhead_tp_enable

    if proposer.vllm_config.parallel_config.tensor_parallel_size != 1 or lmhead_tp_enable():
        refuse_head(settings, "only with tensor_parallel_size 1 and no LM-head tensor "
                    "parallelism (the head is not sharded)")
    if settings.draft_active_vocab_ids and proposer.use_cuda_graph:
        refuse_head(settings, "only with ascend_draft_full_graph false (the default keeps "
                    "the draft model's ACL graphs): a captured draft graph would fix "
                    "one head, and the active vocabulary is chosen per step "
                    "(pure-greedy steps only)")
    return draft_head_for(proposer.model, settings)


class DraftLogitsTap(ModelTap):
    """Wraps the draft model (ModelTap): `compute_logits` is the head's, then
    the observers see it (module docstring). `restricted` is set per step by
    the proposer (the active vocabulary drafts pure-greedy steps only)."""

    def __init__(self, model: torch.nn.Module, head: DraftHead | None,
                 observers: tuple[DraftObserver, ...]):
        super().__init__(model)
        self.head = head
        self.observers = observers
        self.restricted = False
        self._full_width: torch.Tensor | None = None  # [rows, V], -inf off the active ids

    @property
    def name(self) -> str:
        """The head this step drafts from (the draft trace's `head`)."""
        return "full" if self.head is None else self.head.name(self.restricted)

    def compute_logits(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any
                       ) -> torch.Tensor:
        got = None if self.head is None else self.head.logits(hidden_states,
                                                              restricted=self.restricted)
        if got is None:
            logits = self.inner.compute_logits(hidden_states, *args, **kwargs)
        else:
            logits, ids = got
            logits = logits if ids is None else self._spread(logits, ids)
        for observer in self.observers:
            observer.sampled(hidden_states, logits, None)
        return logits

    def _spread(self, logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Active logits [rows, n] in their full-vocabulary columns."""
        rows = logits.shape[0]
        buf = self._full_width
        if buf is None or buf.shape[0] < rows or buf.dtype != logits.dtype:
            buf = torch.full((rows, self.head.vocab_size), float("-inf"),
                             dtype=logits.dtype, device=logits.device)
            self._full_width = buf
        out = buf[:rows]
        out.index_copy_(1, ids, logits)
        return out
