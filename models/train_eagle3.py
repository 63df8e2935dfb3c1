"""Train the bundled EAGLE-3 head (models/tiny-eagle3/) on the bundled target.

    .venv/bin/python models/train_eagle3.py                      # the committed head
    .venv/bin/python models/train_eagle3.py --steps 3 --out DIR  # smoke run

The head is the layout vLLM 0.32 loads as `Eagle3LlamaForCausalLM`
(vllm/model_executor/models/llama_eagle3.py; config architecture
`LlamaForCausalLMEagle3`, model_type llama):
- `fc` [256, 3 * 256] (no bias) over the target's residual stream after
  decoder layers 1, 2 and 4 (vLLM's aux hidden state ids, written in the
  config as `eagle_aux_hidden_state_layer_ids`; the 4-layer target's default
  (2, n/2, n-3) would name layer 2 twice). Layer 4 is the last one, so the
  deepened target (models/deepen.py, zero layers appended) gives the same
  three states and the head fits it too.
- one Llama decoder layer whose q/k/v take [input_layernorm(token embedding)
  ; hidden_norm(hidden)] (2 * 256 wide), the residual being the hidden input;
  a final norm; the target's embedding and LM head (not in the file: vLLM
  shares the target's when the checkpoint has none).
- drafting step k >= 1 feeds back the head's own pre-norm output.

Training as EAGLE-3 does: no feature regression, only the token
distribution (KL to the target's), with training-time test: each window is
unrolled over TTT_STEPS drafting steps in which the head reads its own
previous outputs, with the attention mask of multi-step drafting
(models/ttt.py). Same corpus, tokenizer and window sampler as models/train.py.
Deterministic (fixed seeds and thread count). Weights in bf16.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import train  # sibling module; importing it fixes the thread count before torch starts

import torch  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoTokenizer, LlamaConfig, Qwen2ForCausalLM  # noqa: E402

import corpus  # noqa: E402
import ttt  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
SEED = 0
BATCH = 8
STEPS = 400
WARMUP_STEPS = 40
LR = 2e-3
MIN_LR_FRACTION = 0.1
AUX_LAYER_IDS = (1, 2, 4)   # vLLM ids: the residual stream after that many layers
TTT_STEPS = 3               # drafting steps unrolled per window
STEP_WEIGHTS = [0.8 ** k for k in range(TTT_STEPS)]
EVAL_WINDOWS = 32
ARCHITECTURE = "LlamaForCausalLMEagle3"


class Eagle3Head(nn.Module):
    """Training-time twin of vLLM's Eagle3LlamaForCausalLM (one layer,
    norm_before_residual false, no fc norms)."""

    def __init__(self, cfg: LlamaConfig, n_aux: int) -> None:
        super().__init__()
        h, eps = cfg.hidden_size, cfg.rms_norm_eps
        theta = cfg.rope_parameters["rope_theta"]
        self.fc = nn.Linear(n_aux * h, h, bias=False)
        self.input_layernorm = ttt.RMSNorm(h, eps)
        self.hidden_norm = ttt.RMSNorm(h, eps)
        self.self_attn = ttt.TTTAttention(2 * h, h, cfg.num_attention_heads,
                                          cfg.num_key_value_heads, False, theta)
        self.post_attention_layernorm = ttt.RMSNorm(h, eps)
        self.mlp = ttt.MLP(h, cfg.intermediate_size)
        self.norm = ttt.RMSNorm(h, eps)

    def step(self, embeds, hidden, positions, cache):
        """One drafting step: (pre-norm output fed to the next step, normed
        output the LM head reads)."""
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        q, k, v = self.self_attn.project(x, positions)
        cache.append((k, v))
        residual = self.self_attn.attend(q, cache) + hidden
        pre = self.mlp(self.post_attention_layernorm(residual)) + residual
        return pre, self.norm(pre)

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The EAGLE-3 file layout vLLM reads (`layers.0.*`, `fc`, `norm`)."""
        out = {"fc.weight": self.fc.weight, "norm.weight": self.norm.weight}
        for name in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
            out[f"layers.0.{name}.weight"] = getattr(self, name).weight
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out[f"layers.0.self_attn.{name}.weight"] = getattr(self.self_attn, name).weight
        for name in ("gate_proj", "up_proj", "down_proj"):
            out[f"layers.0.mlp.{name}.weight"] = getattr(self.mlp, name).weight
        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in out.items()}


def head_config(target_config) -> LlamaConfig:
    t = target_config
    cfg = LlamaConfig(
        vocab_size=t.vocab_size, hidden_size=t.hidden_size,
        intermediate_size=t.intermediate_size, num_hidden_layers=1,
        num_attention_heads=t.num_attention_heads, num_key_value_heads=t.num_key_value_heads,
        hidden_act="silu", max_position_embeddings=t.max_position_embeddings,
        rms_norm_eps=t.rms_norm_eps, rope_parameters=dict(t.rope_parameters),
        attention_bias=False, mlp_bias=False, tie_word_embeddings=False,
        bos_token_id=t.bos_token_id, eos_token_id=t.eos_token_id, pad_token_id=t.pad_token_id)
    cfg.architectures = [ARCHITECTURE]
    cfg.draft_vocab_size = t.vocab_size
    cfg.target_hidden_size = t.hidden_size
    cfg.eagle_aux_hidden_state_layer_ids = list(AUX_LAYER_IDS)
    cfg.eagle_config = {"eagle_aux_hidden_state_layer_ids": list(AUX_LAYER_IDS),
                        "use_aux_hidden_state": True}
    return cfg


def losses(head: Eagle3Head, target: Qwen2ForCausalLM, windows: torch.Tensor):
    layer_outs, logits = ttt.capture_layer_outputs(target, windows)
    aux = torch.cat([layer_outs[i - 1] for i in AUX_LAYER_IDS], dim=-1)[:, :-1]
    embeds = target.model.embed_tokens(windows)
    return ttt.ttt_losses(head.step, head.fc(aux), embeds, logits, target.lm_head,
                          TTT_STEPS, STEP_WEIGHTS)


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--target", type=Path, default=MODELS_DIR / "tiny-target")
    parser.add_argument("--out", type=Path, default=MODELS_DIR / "tiny-eagle3")
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

    config = head_config(target.config)
    head = Eagle3Head(config, len(AUX_LAYER_IDS))
    params = list(head.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)

    t_train, cpu_train = time.perf_counter(), time.process_time()
    log = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps)
        windows = torch.cat([train.sample_windows(streams["code"], BATCH // 2, gen),
                             train.sample_windows(streams["prose"], BATCH // 2, gen)])
        loss, kls, agrees = losses(head, target, windows)
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

    head.eval()
    eval_gen = torch.Generator().manual_seed(SEED + 1)
    report = {}
    with torch.no_grad():
        for family, stream in held.items():
            _, kls, agrees = losses(head, target, train.sample_windows(
                stream, EVAL_WINDOWS, eval_gen))
            report[family] = dict(kl_per_step=[round(float(k), 4) for k in kls],
                                  agreement_per_step=[round(float(a), 4) for a in agrees])
    print("held-out:", json.dumps(report), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(args.out)
    save_file(head.checkpoint(), str(args.out / "model.safetensors"))
    record = dict(
        command=f"python models/train_eagle3.py --steps {args.steps}",
        target=str(args.target.relative_to(MODELS_DIR.parent)
                   if args.target.is_relative_to(MODELS_DIR.parent) else args.target),
        target_sha256=hashlib.sha256(
            (args.target / "model.safetensors").read_bytes()).hexdigest(),
        torch=torch.__version__, threads=train.NUM_THREADS, seed=SEED, steps=args.steps,
        batch=BATCH, seq_len=train.SEQ_LEN, lr=LR, aux_layer_ids=list(AUX_LAYER_IDS),
        ttt_steps=TTT_STEPS, step_weights=STEP_WEIGHTS,
        head_params=sum(p.numel() for p in params),
        held_out_teacher_forced=report, log=log,
        data_seconds=round(t_data, 1), train_seconds=round(train_s, 1),
        train_cpu_seconds=round(cpu_s, 1),
        total_seconds=round(time.perf_counter() - t0, 1))
    (args.out / "eagle3_record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"training time: {train_s:.0f} s wall, {cpu_s:.0f} CPU s ({args.steps} steps)",
          flush=True)


if __name__ == "__main__":
    main()
