"""Training-time test (TTT) pieces shared by models/train_eagle3.py and
models/train_mtp.py: plain-torch twins of the decoder blocks vLLM runs for an
EAGLE-3 head and a MiMo MTP layer, and the attention pattern of multi-step
drafting, so a head is trained on the inputs it sees when it drafts.

How a hidden-state drafter runs in vLLM 0.32 (v1/spec_decode/llm_base_proposer.py):
- first pass: at each verified position t the drafter takes (token t+1,
  a feature of the target at t) at rotary position t and writes its KV there;
  from the output at the request's last position it drafts token 1;
- step k >= 1: one query per request at position t+k, input (draft token k,
  the drafter's own output hidden state of step k-1); it attends to the
  first-pass KV of positions <= t and to its own KV of steps 1..k.

`TTTAttention.attend` builds exactly that mask over a training window: step
0 is causal over every origin; step k adds, per origin t, the keys that
origin's steps 1..k wrote (one key each, "diagonal"). Inputs of step k are
the window's tokens t+1+k (teacher forcing) and the step-(k-1) outputs at
the same origin; the loss is KL to the target's distribution at t+1+k.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rotate(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding, half-split ("neox") layout as Llama/Qwen2 use.
    x: [B, H, T, d]; positions: [T] (the same for every row)."""
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
    angles = positions.float()[:, None] * inv_freq[None, :]      # [T, d/2]
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class TTTAttention(nn.Module):
    """q/k/v/o projections (grouped KV heads) with the multi-step mask."""

    def __init__(self, in_dim: int, hidden: int, heads: int, kv_heads: int,
                 qkv_bias: bool, theta: float) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.theta = theta
        self.q_proj = nn.Linear(in_dim, heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(in_dim, kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(in_dim, kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        rep = self.heads // self.kv_heads
        k = rotate(k, positions, self.theta).repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        return rotate(q, positions, self.theta), k, v

    def attend(self, q: torch.Tensor, cache: list[tuple[torch.Tensor, torch.Tensor]]
               ) -> torch.Tensor:
        """q: this step's queries [B, H, T, d]; cache[0] the first pass's
        keys/values (causal over origins), cache[1:] steps 1..k (diagonal)."""
        b, h, t, d = q.shape
        scale = 1.0 / math.sqrt(d)
        k0, v0 = cache[0]
        scores = [torch.matmul(q, k0.transpose(-1, -2)) * scale]
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        scores[0] = scores[0].masked_fill(causal, float("-inf"))
        scores += [(q * kj).sum(-1, keepdim=True) * scale for kj, _ in cache[1:]]
        probs = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs[..., :t], v0)
        for j, (_, vj) in enumerate(cache[1:]):
            out = out + probs[..., t + j: t + j + 1] * vj
        return self.o_proj(out.transpose(1, 2).reshape(b, t, h * d))


class MLP(nn.Module):
    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def shifted(x: torch.Tensor, k: int, fill: float | int = 0) -> torch.Tensor:
    """x[:, k:] padded at the end to x's length (positions past the window
    are masked out of the loss)."""
    if k == 0:
        return x
    pad = x[:, :k].clone().fill_(fill) if x.dtype != torch.bool else x[:, :k] & False
    return torch.cat((x[:, k:], pad), dim=1)


def kl_per_position(head_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """KL(teacher || head) per position: [B, T]."""
    t = F.log_softmax(teacher_logits.float(), -1)
    return (t.exp() * (t - F.log_softmax(head_logits.float(), -1))).sum(-1)


def ttt_losses(step_fn, first_hidden: torch.Tensor, embeds: torch.Tensor,
               teacher: torch.Tensor, lm_head, steps: int, weights: list[float]):
    """Unroll `steps` drafting steps over a window.

    step_fn(embeds_k, hidden_k, positions_k, cache) -> (hidden_out, logits_in):
    one drafter step over every origin; `cache` collects each step's (k, v).
    first_hidden [B, T, h]: the drafter's step-0 hidden input per origin t
    (from the target at t). embeds [B, T+1, h]: the token embeddings of the
    window (token s at index s). teacher [B, T+1, V]: the target's logits at
    each position. Returns (weighted loss, per-step mean KL, per-step
    argmax agreement), each step's over the origins whose target exists."""
    b, t_len, _ = first_hidden.shape
    positions = torch.arange(t_len)
    cache: list = []
    hidden = first_hidden
    total, kls, agrees = 0.0, [], []
    for k in range(steps):
        tok = shifted(embeds[:, 1:], k)                 # token t+1+k at origin t
        want = shifted(teacher[:, 1:], k)               # target's logits at t+1+k
        valid = (torch.arange(t_len) <= t_len - 1 - k).float()[None, :].expand(b, -1)
        hidden, normed = step_fn(tok, hidden, positions + k, cache)
        logits = lm_head(normed)
        kl = (kl_per_position(logits, want) * valid).sum() / valid.sum()
        agree = (((logits.argmax(-1) == want.argmax(-1)).float() * valid).sum() / valid.sum())
        total = total + weights[k] * kl
        kls.append(kl)
        agrees.append(agree)
    return total, kls, agrees


def capture_layer_outputs(target, windows: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Run the HF target over `windows`: the residual stream after each
    decoder layer (vLLM's aux hidden state of layer id i+1 is entry i; the
    last entry is the pre-norm final state) and the logits."""
    outs: list[torch.Tensor] = []
    hooks = [layer.register_forward_hook(
        lambda _m, _i, o: outs.append(o[0] if isinstance(o, tuple) else o))
        for layer in target.model.layers]
    try:
        with torch.no_grad():
            logits = target(input_ids=windows).logits
    finally:
        for hook in hooks:
            hook.remove()
    return outs, logits
