"""The drafter's greedy LM head: restricted to an active vocabulary, int8, or both.

Plain torch, no vLLM import. The proposers (hosts/vllm/proposers.py, and the
Ascend overlay's) build one DraftHead from the drafter's own LM head weight
after it is loaded, and take greedy draft tokens from it.

- Active vocabulary: logits are computed only for `active_ids` (a row
  subset of the head), and the argmax row maps back to its full token id
  through `active_ids`. The target still verifies with its full head, so
  strict acceptance stays lossless: the restriction only changes which
  tokens the drafter can propose.
- Int8 weights (`w8a16`, `w8a8`): symmetric int8 per output row and per block
  of `group_size` input channels (0: one block, i.e. per channel), scale =
  max|w| / 127 of the block. `w8a16` keeps activations in their float dtype;
  `w8a8` also quantizes activations per token and block the same way and
  multiplies in int8 with int32 accumulation. The matmul comes from
  INT8_MATMULS by device type: CPU uses torch.ops.aten._weight_int8pack_mm /
  torch._int_mm (one call per block), the Ascend overlay registers
  torch_npu's kernels for "npu" (vllm_ascend/vspec/draft_head_tap.py), and
  other devices compute the same formulas with a dequantized float matmul
  (DequantizedInt8Matmul; not run on a GPU).

Invariants: the ids returned are always full-vocabulary ids; the active ids
are kept sorted, so among equal logits the smaller id wins on every host
(as an argmax over the full vocabulary would choose); a head built with
quantization `none` and no active ids is never used (the host's own
compute_logits is).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from vllm_vspec.core.drafter_keys import refuse_head

QUANT_MODES = ("none", "w8a16", "w8a8")
INT8_MAX = 127


def quantize_int8(t: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of a [N, K] tensor per row and per block of
    `group_size` columns (0: one block): returns (q [N, K] int8, scales
    [N, K // group_size] float32) with t ~= q * scales per block and
    |t - q * s| <= s / 2 elementwise. An all-zero block gets scale 1."""
    n, k = t.shape
    g = group_size or k
    if k % g:
        raise ValueError(f"group_size {g} does not divide the {k} input channels")
    blocks = t.float().reshape(n, k // g, g)
    amax = blocks.abs().amax(dim=-1)
    scales = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
    q = torch.round(blocks / scales.unsqueeze(-1)).clamp_(-INT8_MAX, INT8_MAX)
    return q.to(torch.int8).reshape(n, k), scales


def dequantize_int8(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """Float32 values of quantize_int8's output."""
    n, k = q.shape
    nb = scales.shape[1]
    return (q.float().reshape(n, nb, k // nb) * scales.unsqueeze(-1)).reshape(n, k)


class DequantizedInt8Matmul:
    """x @ W.T for W stored as blockwise int8 `q` [N, K] with `scales`
    [N, K // group] (quantize_int8), by the module docstring's formulas, one
    block of input channels at a time; each block's product is a float
    matmul of the dequantized values here. The reference the device kernels
    are tested against, and what a device without a registered kernel runs
    (not run on a GPU). The weight stays int8 in memory."""

    def __init__(self, q: torch.Tensor, scales: torch.Tensor, mode: str,
                 dtype: torch.dtype) -> None:
        self.mode = mode
        self.group = q.shape[1] // scales.shape[1]
        # Each block's weight and scales contiguous (CPU's
        # _weight_int8pack_mm does not check the scales: strided ones give wrong sums).
        self.blocks = [q[:, b * self.group:(b + 1) * self.group].contiguous()
                       for b in range(scales.shape[1])]
        self.block_scales = [scales[:, b].contiguous() for b in range(len(self.blocks))]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        g = self.group
        out = torch.zeros(x.shape[0], self.blocks[0].shape[0], dtype=torch.float32,
                          device=x.device)
        if self.mode == "w8a16":
            for b, (w, s) in enumerate(zip(self.blocks, self.block_scales)):
                out += self.w8a16_block(x[:, b * g:(b + 1) * g].contiguous(), w, s).float()
        else:
            xq, xs = quantize_int8(x, g)
            for b, (w, s) in enumerate(zip(self.blocks, self.block_scales)):
                acc = self.int8_block(xq[:, b * g:(b + 1) * g].contiguous(), w)
                out += acc * xs[:, b:b + 1] * s.unsqueeze(0)
        return out.to(x.dtype)

    def w8a16_block(self, xb: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """xb [M, g] float @ (w [N, g] int8 * s [N]).T"""
        return xb.float() @ (w.float() * s.unsqueeze(1)).T

    def int8_block(self, xb: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """xb [M, g] int8 @ w [N, g].T int8, summed exactly, as float32."""
        return xb.float() @ w.float().T   # exact: |sum| < 2^24 for g <= 1040


class CpuInt8Matmul(DequantizedInt8Matmul):
    """The same formulas with torch's own CPU int8 kernels."""

    def w8a16_block(self, xb: torch.Tensor, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(xb, w, s.to(xb.dtype))

    def int8_block(self, xb: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch._int_mm(xb, w.t()).float()


# Device type -> the int8 matmul class of that device: called as
# cls(q, scales, mode, model_dtype), it returns x -> x @ W.T in x's dtype and
# may raise VSpecConfigError naming the key when the device cannot run the
# mode. Host overlays register theirs at import (the Ascend overlay: "npu").
INT8_MATMULS: dict[str, Callable[..., Callable[[torch.Tensor], torch.Tensor]]] = {
    "cpu": CpuInt8Matmul}


class Int8Linear:
    """y = x @ W.T + b with W stored as blockwise int8 (module docstring)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                 group_size: int, matmul: Callable[..., Any] | None = None) -> None:
        if mode not in ("w8a16", "w8a8"):
            raise ValueError(f"quantization {mode!r}: one of 'w8a16', 'w8a8'")
        self.mode = mode
        self.q, self.scales = quantize_int8(weight, group_size)
        cls = matmul or INT8_MATMULS.get(weight.device.type, DequantizedInt8Matmul)
        self.matmul = cls(self.q, self.scales, mode, weight.dtype)
        self.bias = None if bias is None else bias.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = self.matmul(x)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out


def _linear(weight: torch.Tensor, bias: torch.Tensor | None, mode: str, group_size: int):
    if mode == "none":
        return lambda x: torch.nn.functional.linear(x, weight.to(x.dtype),
                                                    None if bias is None else bias.to(x.dtype))
    return Int8Linear(weight, bias, mode, group_size)


class DraftHead:
    """Greedy draft logits from the drafter's LM head `weight` [V, H] (the
    host's rows beyond the vocabulary already cut off)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                 active_ids: torch.Tensor | None = None, quantization: str = "none",
                 group_size: int = 0) -> None:
        if quantization not in QUANT_MODES:
            raise ValueError(f"quantization {quantization!r}: one of {QUANT_MODES}")
        self.vocab_size = weight.shape[0]
        self.quantization = quantization
        # The full head is only needed when it differs from the host's.
        self._full = None if quantization == "none" else _linear(
            weight, bias, quantization, group_size)
        self.active_ids = None
        self._active = None
        if active_ids is not None:
            # Sorted (module docstring: ties go to the smaller id).
            ids = torch.unique(active_ids.to(device=weight.device, dtype=torch.long))
            if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size:
                raise ValueError(f"active ids must be non-empty and in [0, {self.vocab_size})")
            self.active_ids = ids
            self._active = _linear(weight[ids].contiguous(),
                                   None if bias is None else bias[ids].contiguous(),
                                   quantization, group_size)

    def logits(self, hidden: torch.Tensor, restricted: bool
               ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(logits, ids) where logits column j scores token ids[j] (ids None:
        column j is token j), or None when this head adds nothing (no
        quantization and `restricted` false or no active ids): use the host's."""
        if restricted and self._active is not None:
            return self._active(hidden), self.active_ids
        if self._full is None:
            return None
        return self._full(hidden), None

    def name(self, restricted: bool) -> str:
        """Which head a step with this `restricted` drafts from: `active` or
        `full` (the diagnostics trace's `head`)."""
        return "active" if restricted and self._active is not None else "full"

    @staticmethod
    def to_full_ids(columns: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """Full-vocabulary token ids of logits columns."""
        return columns if ids is None else ids[columns]


def draft_head_for(model: torch.nn.Module, cfg) -> DraftHead:
    """The DraftHead of a loaded vLLM draft model (its `lm_head`, and the
    vocabulary its `logits_processor` keeps) for the vspec settings `cfg`.
    Raises VSpecConfigError naming the key that cannot apply."""
    from vllm_vspec.core.active_vocab import load_ids
    from vllm_vspec.config import VSpecConfigError

    head, proc = model.lm_head, model.logits_processor
    # An EAGLE-3 head with its own smaller vocabulary scores draft ids and maps
    # them to target ids in compute_logits (`d2t`, vLLM's draft_id_to_target_id):
    # this head's rows, ids and active-vocabulary file would all be in the wrong space.
    d2t = getattr(model, "draft_id_to_target_id", None)
    if d2t is not None:
        refuse_head(cfg, f"a drafter with the target's vocabulary (this head drafts over "
                         f"{d2t.shape[0]} tokens of its own, mapped to target ids by a d2t table)")
    # The host scales (and may soft-cap) logits; greedy drafting would not
    # care, but the entropy stop reads the logits, so only plain heads are taken.
    if getattr(proc, "scale", 1.0) != 1.0 or getattr(proc, "soft_cap", None):
        refuse_head(cfg, "a draft LM head without logit scaling or soft cap (this model has them)")
    vocab = proc.org_vocab_size
    weight = head.weight[:vocab]   # the host pads the head's rows
    bias = getattr(head, "bias", None)
    hidden = weight.shape[1]
    group = cfg.draft_lm_head_quant_group_size
    if group and hidden % group:
        raise VSpecConfigError("draft_lm_head_quant_group_size", group,
                               f"0 or a divisor of the draft hidden size {hidden}")
    ids = None
    if cfg.draft_active_vocab_ids:
        ids = torch.tensor(load_ids(cfg.draft_active_vocab_ids, cfg.draft_active_vocab_size,
                                    vocab), dtype=torch.long)
    return DraftHead(weight.detach(), None if bias is None else bias[:vocab].detach(),
                     active_ids=ids, quantization=cfg.draft_lm_head_quantization,
                     group_size=group)


__all__ = ["DraftHead", "Int8Linear", "DequantizedInt8Matmul", "CpuInt8Matmul", "INT8_MATMULS",
           "draft_head_for", "QUANT_MODES", "quantize_int8", "dequantize_int8"]
