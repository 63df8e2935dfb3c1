"""Train the bundled EAGLE-1 head (models/tiny-eagle/) on the bundled target.

    .venv/bin/python models/train_eagle.py                      # the committed head
    .venv/bin/python models/train_eagle.py --steps 3 --out DIR  # smoke run

The head is the Qwen2 EAGLE-1 layout that vllm_vspec registers as
`Qwen2ForCausalLMEagle` (overlay/vllm_vspec/hosts/vllm/models/qwen2_eagle.py):
fc over [token embedding ; target hidden state], one Qwen2 decoder layer with
no input layernorm, no final norm, the target's embedding and LM head. At
every position t of a training window it sees (embedding of token t+1, the
target's final hidden state at t) and learns, as EAGLE-1 does, to regress the
target's hidden state at t+1 (smooth L1) and to predict the target's next-token
distribution there (here: KL to the target, which is what greedy
verification rewards). Input features get small uniform noise so the head
tolerates its own (imperfect) features when it drafts several tokens.

The q/k/v biases stay zero and are not saved: the file has the same tensors
as Eagle-Qwen2.5-14B-Instruct (no q/k/v biases, no embed_tokens, no lm_head),
so loading it exercises the zero-bias path. Weights are saved in bf16.

Deterministic: fixed seeds, the corpus and windows of models/train.py (same
tokenizer, same token streams, same sampler), fixed thread count.
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
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from torch import nn  # noqa: E402
from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, Qwen2Model  # noqa: E402

import corpus  # noqa: E402

MODELS_DIR = Path(__file__).resolve().parent
SEED = 0
BATCH = 8
STEPS = 400
WARMUP_STEPS = 40
LR = 2e-3
MIN_LR_FRACTION = 0.1
CLS_WEIGHT = 1.0        # weight of the token-distribution term (regression has 1)
FEATURE_NOISE = 0.1     # half-width of the uniform noise on input features
EVAL_WINDOWS = 32       # held-out windows per family for the final report
ARCHITECTURE = "Qwen2ForCausalLMEagle"


class EagleHead(nn.Module):
    """Training-time twin of the vLLM class: same maths, HF building blocks.
    `body` is a one-layer HF Qwen2Model fed with inputs_embeds; its own
    embedding table is never used and never saved."""

    def __init__(self, config: Qwen2Config) -> None:
        super().__init__()
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.body = Qwen2Model(config)
        self.body.layers[0].input_layernorm = nn.Identity()
        self.body.norm = nn.Identity()
        attn = self.body.layers[0].self_attn
        for proj in (attn.q_proj, attn.k_proj, attn.v_proj):
            nn.init.zeros_(proj.bias)
            proj.bias.requires_grad_(False)
        self.body.embed_tokens.requires_grad_(False)

    def forward(self, token_embeds: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
        x = self.fc(torch.cat((token_embeds, features), dim=-1))
        return self.body(inputs_embeds=x).last_hidden_state

    def checkpoint(self) -> dict[str, torch.Tensor]:
        """The EAGLE-1 file layout (names without a `model.` prefix)."""
        out = {f"fc.{k}": v for k, v in self.fc.state_dict().items()}
        for name, tensor in self.body.layers.state_dict().items():
            if name.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
                continue  # zero by construction; absent as in the reference head
            out[f"layers.{name}"] = tensor
        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in out.items()}


def head_config(target_config: Qwen2Config) -> Qwen2Config:
    raw = target_config.to_dict()
    for key in ("layer_types", "architectures", "torch_dtype", "dtype", "transformers_version"):
        raw.pop(key, None)
    raw.update(num_hidden_layers=1, tie_word_embeddings=False)
    config = Qwen2Config(**raw)
    config.architectures = [ARCHITECTURE]
    return config


@torch.no_grad()
def target_pass(target: Qwen2ForCausalLM, windows: torch.Tensor):
    """The target's final (post-norm) hidden states and logits per position."""
    hidden = target.model(input_ids=windows).last_hidden_state
    return hidden, target.lm_head(hidden)


def head_losses(head: EagleHead, target: Qwen2ForCausalLM, windows: torch.Tensor,
                noise_gen: torch.Generator | None):
    """Regression + KL losses and first-position argmax agreement. Position t
    pairs token t+1 with the target feature at t; targets are at t+1."""
    hidden, logits = target_pass(target, windows)
    features = hidden[:, :-1]
    if noise_gen is not None:
        noise = torch.rand(features.shape, generator=noise_gen) * 2 - 1
        features = features + FEATURE_NOISE * noise
    embeds = target.model.embed_tokens(windows[:, 1:])
    out = head(embeds, features)
    reg = F.smooth_l1_loss(out, hidden[:, 1:])
    head_logits = target.lm_head(out).flatten(0, 1)
    teacher = logits[:, 1:].flatten(0, 1)
    kl = F.kl_div(F.log_softmax(head_logits, -1), F.log_softmax(teacher, -1),
                  log_target=True, reduction="batchmean")
    agree = (head_logits.argmax(-1) == teacher.argmax(-1)).float().mean()
    return reg, kl, agree


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--target", type=Path, default=MODELS_DIR / "tiny-target")
    parser.add_argument("--out", type=Path, default=MODELS_DIR / "tiny-eagle")
    args = parser.parse_args()

    torch.set_num_threads(train.NUM_THREADS)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(args.target)
    target = Qwen2ForCausalLM.from_pretrained(args.target, torch_dtype=torch.float32).eval()
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
    head = EagleHead(config)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(SEED)
    noise_gen = torch.Generator().manual_seed(SEED + 2)

    t_train, cpu_train = time.perf_counter(), time.process_time()
    log = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps)
        windows = torch.cat([train.sample_windows(streams["code"], BATCH // 2, gen),
                             train.sample_windows(streams["prose"], BATCH // 2, gen)])
        reg, kl, agree = head_losses(head, target, windows, noise_gen)
        opt.zero_grad(set_to_none=True)
        (reg + CLS_WEIGHT * kl).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            entry = dict(step=step, reg=round(reg.item(), 4), kl=round(kl.item(), 4),
                         agree=round(agree.item(), 4),
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
            reg, kl, agree = head_losses(head, target, train.sample_windows(
                stream, EVAL_WINDOWS, eval_gen), None)
            report[family] = dict(reg=round(reg.item(), 4), kl=round(kl.item(), 4),
                                  first_position_agreement=round(agree.item(), 4))
    print("held-out:", json.dumps(report), flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(args.out)
    save_file(head.checkpoint(), str(args.out / "model.safetensors"))
    record = dict(
        command=f"python models/train_eagle.py --steps {args.steps}",
        target=str(args.target.relative_to(MODELS_DIR.parent)
                   if args.target.is_relative_to(MODELS_DIR.parent) else args.target),
        # The head only fits the exact target it was trained on.
        target_sha256=hashlib.sha256(
            (args.target / "model.safetensors").read_bytes()).hexdigest(),
        torch=torch.__version__, threads=train.NUM_THREADS, seed=SEED, steps=args.steps,
        batch=BATCH, seq_len=train.SEQ_LEN, lr=LR, cls_weight=CLS_WEIGHT,
        feature_noise=FEATURE_NOISE,
        head_params=sum(p.numel() for p in params), held_out=report, log=log,
        data_seconds=round(t_data, 1), train_seconds=round(train_s, 1),
        train_cpu_seconds=round(cpu_s, 1),
        total_seconds=round(time.perf_counter() - t0, 1))
    (args.out / "eagle_record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"training time: {train_s:.0f} s wall, {cpu_s:.0f} CPU s ({args.steps} steps)",
          flush=True)


if __name__ == "__main__":
    main()
