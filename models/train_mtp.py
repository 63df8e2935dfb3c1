"""Train the bundled MiMo-style MTP layer (models/tiny-mimo/) on the bundled target.

    .venv/bin/python models/train_mtp.py                      # the committed layer
    .venv/bin/python models/train_mtp.py --steps 3 --out DIR  # smoke run

MiMo is a Qwen2 model plus multi-token-prediction layers; vLLM 0.32 runs the
model as `MiMoForCausalLM` (vllm/model_executor/models/mimo.py, which skips
`model.mtp_layers.*`) and, for `method: mtp`, the same checkpoint as
`MiMoMTPModel` (mimo_mtp.py: only `model.mtp_layers.*`, `embed_tokens`,
`lm_head`). models/tiny-mimo/ is that checkpoint for the bundled target:
- `model.safetensors`: a symlink to models/tiny-target/model.safetensors
  (the target's weights unchanged, so target-only decoding of tiny-mimo is
  the bundled target's);
- `mtp.safetensors`: one MTP layer (`model.mtp_layers.0.*`): token_layernorm
  over the next token's embedding (zero at position 0, as vLLM masks it),
  hidden_layernorm over the target's pre-norm final hidden state (what
  MiMoModel returns), input_proj [256, 512] over [hidden ; token], one Qwen2
  decoder layer (q/k/v biases), final_layernorm; the target's tied embedding
  is its LM head;
- `config.json`: the target's, architecture `MiMoForCausalLM`,
  `num_nextn_predict_layers` 1; tokenizer files are symlinks too.
With num_speculative_tokens > 1 vLLM reuses the one layer, feeding back its
own (normed) output, so the layer is trained with training-time test over
TTT_STEPS drafting steps (models/ttt.py), KL to the target's distribution.
The decoder block starts from the target's last layer. Deterministic.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import time
from pathlib import Path

import train  # sibling module; importing it fixes the thread count before torch starts

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoTokenizer, Qwen2ForCausalLM  # noqa: E402

import corpus  # noqa: E402
import ttt  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
SEED = 0
BATCH = 8
STEPS = 400
WARMUP_STEPS = 40
LR = 2e-3
MIN_LR_FRACTION = 0.1
TTT_STEPS = 3
STEP_WEIGHTS = [0.8 ** k for k in range(TTT_STEPS)]
EVAL_WINDOWS = 32
PREFIX = "model.mtp_layers.0."
# Files of the target the checkpoint links to (whichever exist).
LINKED_FILES = ("model.safetensors", "tokenizer.json", "tokenizer_config.json",
                "chat_template.jinja", "generation_config.json")


class MTPLayer(nn.Module):
    """Training-time twin of vLLM's MiMoMultiTokenPredictorLayer."""

    def __init__(self, cfg) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        theta = cfg.rope_parameters["rope_theta"]
        self.token_layernorm = ttt.RMSNorm(h, eps)
        self.hidden_layernorm = ttt.RMSNorm(h, eps)
        self.input_proj = nn.Linear(2 * h, h, bias=False)
        self.input_layernorm = ttt.RMSNorm(h, eps)
        self.self_attn = ttt.TTTAttention(h, h, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, True, theta)
        self.post_attention_layernorm = ttt.RMSNorm(h, eps)
        self.mlp = ttt.MLP(h, cfg.intermediate_size)
        self.final_layernorm = ttt.RMSNorm(h, eps)

    def start_from(self, layer) -> None:
        """Copy a trained HF Qwen2 decoder layer into the decoder block."""
        with torch.no_grad():
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                mine, theirs = getattr(self.self_attn, name), getattr(layer.self_attn, name)
                mine.weight.copy_(theirs.weight)
                if mine.bias is not None:
                    mine.bias.copy_(theirs.bias)
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(self.mlp, name).weight.copy_(getattr(layer.mlp, name).weight)
            self.input_layernorm.weight.copy_(layer.input_layernorm.weight)
            self.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)

    def step(self, embeds, hidden, positions, cache):
        """One drafting step; the output (normed) is both the next step's
        hidden input and what the LM head reads."""
        embeds = torch.where((positions == 0)[None, :, None], 0.0, embeds)
        x = self.input_proj(torch.cat((self.hidden_layernorm(hidden),
                                       self.token_layernorm(embeds)), dim=-1))
        q, k, v = self.self_attn.project(self.input_layernorm(x), positions)
        cache.append((k, v))
        residual = self.self_attn.attend(q, cache) + x
        out = self.final_layernorm(self.mlp(self.post_attention_layernorm(residual)) + residual)
        return out, out

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """MiMo's file layout: `model.mtp_layers.0.*`, the decoder block's
        tensors without vLLM's `mtp_block` wrapper."""
        out = {}
        for name in ("token_layernorm", "hidden_layernorm", "input_layernorm",
                     "post_attention_layernorm", "final_layernorm"):
            out[f"{name}.weight"] = getattr(self, name).weight
        out["input_proj.weight"] = self.input_proj.weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            proj = getattr(self.self_attn, name)
            out[f"self_attn.{name}.weight"] = proj.weight
            if proj.bias is not None:
                out[f"self_attn.{name}.bias"] = proj.bias
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"mlp.{name}.weight"] = getattr(self.mlp, name).weight
        return {PREFIX + k: v.detach().to(torch.bfloat16).contiguous() for k, v in out.items()}


def losses(layer: MTPLayer, target: Qwen2ForCausalLM, windows: torch.Tensor):
    layer_outs, logits = ttt.capture_layer_outputs(target, windows)
    hidden = layer_outs[-1][:, :-1]          # pre-norm final state at each origin
    embeds = target.model.embed_tokens(windows)
    return ttt.ttt_losses(layer.step, hidden, embeds, logits, target.lm_head,
                          TTT_STEPS, STEP_WEIGHTS)


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def write_checkpoint(layer: MTPLayer, target_dir: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for name in LINKED_FILES:
        src, dst = target_dir / name, out / name
        if src.exists():
            if dst.is_symlink() or dst.exists():
                dst.unlink()
            dst.symlink_to(os.path.relpath(src.resolve(), out.resolve()))
    save_file(layer.checkpoint(), str(out / "mtp.safetensors"))
    config = json.loads((target_dir / "config.json").read_text())
    config.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=1)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--target", type=Path, default=MODELS_DIR / "tiny-target")
    parser.add_argument("--out", type=Path, default=MODELS_DIR / "tiny-mimo")
    args = parser.parse_args()

    torch.set_num_threads(train.NUM_THREADS)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = Qwen2ForCausalLM.from_pretrained(args.target, dtype=torch.float32).eval()
    target.requires_grad_(False)
    docs = corpus.all_documents()
    streams = {f: train.token_stream(tokenizer, [d.text for d in docs
                                                 if d.family == f and not d.held_out])
               for f in ("code", "prose")}
    held = {f: train.token_stream(tokenizer, [d.text for d in docs
                                              if d.family == f and d.held_out])
            for f in ("code", "prose")}
    t_data = time.perf_counter() - t0
    print(f"data: {t_data:.1f} s", flush=True)

    layer = MTPLayer(target.config)
    layer.start_from(target.model.layers[-1])
    params = list(layer.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)

    t_train, cpu_train = time.perf_counter(), time.process_time()
    log = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps)
        windows = torch.cat([train.sample_windows(streams["code"], BATCH // 2, gen),
                             train.sample_windows(streams["prose"], BATCH // 2, gen)])
        loss, kls, agrees = losses(layer, target, windows)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            entry = dict(step=step, loss=round(float(loss), 4),
                         kl=[round(float(k), 4) for k in kls],
                         agree=[round(float(a), 4) for a in agrees],
                         elapsed_s=round(time.perf_counter() - t_train, 1))
            log.append(entry)
            print(json.dumps(entry), flush=True)
    train_s = time.perf_counter() - t_train
    cpu_s = time.process_time() - cpu_train

    layer.eval()
    eval_gen = torch.Generator().manual_seed(SEED + 1)
    report = {}
    with torch.no_grad():
        for family, stream in held.items():
            _, kls, agrees = losses(layer, target, train.sample_windows(
                stream, EVAL_WINDOWS, eval_gen))
            report[family] = dict(kl_per_step=[round(float(k), 4) for k in kls],
                                  agreement_per_step=[round(float(a), 4) for a in agrees])
    print("held-out:", json.dumps(report), flush=True)

    write_checkpoint(layer, args.target, args.out)
    record = dict(
        command=f"python models/train_mtp.py --steps {args.steps}",
        target=str(args.target.relative_to(MODELS_DIR.parent)
                   if args.target.is_relative_to(MODELS_DIR.parent) else args.target),
        target_sha256=hashlib.sha256(
            (args.target / "model.safetensors").read_bytes()).hexdigest(),
        torch=torch.__version__, threads=train.NUM_THREADS, seed=SEED, steps=args.steps,
        batch=BATCH, seq_len=train.SEQ_LEN, lr=LR, ttt_steps=TTT_STEPS,
        step_weights=STEP_WEIGHTS, mtp_params=sum(p.numel() for p in params),
        held_out_teacher_forced=report, log=log,
        data_seconds=round(t_data, 1), train_seconds=round(train_s, 1),
        train_cpu_seconds=round(cpu_s, 1),
        total_seconds=round(time.perf_counter() - t0, 1))
    (args.out / "mtp_record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"training time: {train_s:.0f} s wall, {cpu_s:.0f} CPU s ({args.steps} steps)",
          flush=True)


if __name__ == "__main__":
    main()
