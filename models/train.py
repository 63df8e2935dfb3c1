"""Train the bundled model pair: a byte-level BPE tokenizer, a small Qwen2
target and a smaller Qwen2 draft, trained together on the offline corpus.

    .venv/bin/python models/train.py            # the committed artifacts
    .venv/bin/python models/train.py --steps 3  # smoke run into a scratch dir

Writes models/tiny-target/, models/tiny-draft/ (HF format, bf16 safetensors,
tokenizer with chat template), models/prompts/{code,prose}.jsonl (held-out
prompts) and models/train_record.json (corpus stats, losses, training time).

Deterministic: fixed seeds, sorted inputs, fixed thread count. The draft is
trained on 0.5 cross-entropy + 0.5 KL(target || draft), so it learns to agree
with the target, which is what speculative decoding accepts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path

# Fixed before torch/tokenizers start their thread pools: results depend on
# the reduction order, which depends on the thread count. Two threads, one per
# core of this machine kind: measured on an idle machine, 2.57 s per step on
# one thread, 1.56 s on two. (On a machine shared with other jobs a second
# OpenMP thread mostly spins at barriers: train on a quiet machine.)
NUM_THREADS = 2
os.environ.setdefault("RAYON_NUM_THREADS", str(NUM_THREADS))
os.environ.setdefault("OMP_NUM_THREADS", str(NUM_THREADS))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: E402
from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402

import corpus  # noqa: E402  (sibling module: python puts models/ on sys.path)

MODELS_DIR = Path(__file__).resolve().parent
SEED = 0
VOCAB_SIZE = 2048
EOS, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END]
# Qwen-style ChatML, written for this tokenizer.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)
MAX_POSITIONS = 2048

# Shapes: the target is the model being served, the draft is ~6x cheaper.
TARGET_SHAPE = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=768,
                    num_attention_heads=4, num_key_value_heads=2)
# Two draft layers, not one: copying an identifier seen earlier in the context
# (frequent in code) needs an induction circuit, which takes two attention
# layers; the second layer adds ~0.2 M parameters and little step cost.
DRAFT_SHAPE = dict(num_hidden_layers=2, hidden_size=128, intermediate_size=384,
                   num_attention_heads=4, num_key_value_heads=2)

SEQ_LEN = 256
BATCH = 16          # windows per step, half code and half prose
# The committed pair: 640 steps of 16 x 256 tokens (2.6 M tokens), about
# 17 min on an idle 2-core machine (train_record.json has the measured time).
# Fewer steps leave the pair undertrained: at 320 steps (held-out CE 4.8 nats)
# greedy continuations fell into loops that faked high acceptance.
STEPS = 640
WARMUP_STEPS = 30
LR = 4e-3
MIN_LR_FRACTION = 0.1
DRAFT_CE_WEIGHT = 0.5   # the rest of the draft loss is KL to the target
EVAL_WINDOWS = 64       # held-out windows per family for the final report


def train_tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token=EOS, pad_token=EOS,
        additional_special_tokens=[IM_START, IM_END], chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS, clean_up_tokenization_spaces=False)


def qwen2_config(shape: dict, tokenizer: PreTrainedTokenizerFast) -> Qwen2Config:
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    return Qwen2Config(
        vocab_size=VOCAB_SIZE, max_position_embeddings=MAX_POSITIONS, rope_theta=10000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=eos_id,
        eos_token_id=eos_id, pad_token_id=eos_id, **shape)


def token_stream(tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> torch.Tensor:
    """All documents of one family as one stream, each followed by EOS so the
    models learn where a document ends."""
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tokenizer.backend_tokenizer.encode_batch(texts, add_special_tokens=False):
        ids += enc.ids + [eos_id]
    return torch.tensor(ids, dtype=torch.long)


def sample_windows(stream: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - SEQ_LEN - 1, (count,), generator=gen)
    return torch.stack([stream[s:s + SEQ_LEN + 1] for s in starts.tolist()])


def lr_at(step: int, steps: int) -> float:
    if step < WARMUP_STEPS:
        return LR * (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / max(1, steps - WARMUP_STEPS)
    return LR * (MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * 0.5 * (1 + math.cos(math.pi * progress)))


def pair_losses(target, draft, batch: torch.Tensor):
    inputs, labels = batch[:, :-1], batch[:, 1:].reshape(-1)
    t_logits = target(input_ids=inputs).logits.flatten(0, 1)
    d_logits = draft(input_ids=inputs).logits.flatten(0, 1)
    t_ce = F.cross_entropy(t_logits, labels)
    d_ce = F.cross_entropy(d_logits, labels)
    # KL(target || draft); the target is a fixed teacher for this term.
    kl = F.kl_div(F.log_softmax(d_logits, -1), F.log_softmax(t_logits.detach(), -1),
                  log_target=True, reduction="batchmean")
    d_loss = DRAFT_CE_WEIGHT * d_ce + (1 - DRAFT_CE_WEIGHT) * kl
    return t_ce, d_ce, kl, d_loss, t_logits, d_logits


@torch.no_grad()
def evaluate(target, draft, windows: torch.Tensor) -> dict:
    """Teacher-forced held-out report: losses and how often the draft's argmax
    equals the target's (a proxy for first-position acceptance)."""
    target.eval(), draft.eval()
    t_ce, d_ce, kl, _, t_logits, d_logits = pair_losses(target, draft, windows)
    agree = (t_logits.argmax(-1) == d_logits.argmax(-1)).float().mean()
    target.train(), draft.train()
    return dict(target_ce=round(t_ce.item(), 4), draft_ce=round(d_ce.item(), 4),
                kl=round(kl.item(), 4), argmax_agreement=round(agree.item(), 4))


def save_model(model: Qwen2ForCausalLM, tokenizer, out: Path) -> None:
    eos_id = tokenizer.convert_tokens_to_ids(EOS)
    im_end_id = tokenizer.convert_tokens_to_ids(IM_END)
    model.generation_config = GenerationConfig(
        bos_token_id=eos_id, eos_token_id=[eos_id, im_end_id], pad_token_id=eos_id)
    model.to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def write_prompts(docs, out_dir: Path) -> dict:
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {}
    for family in ("code", "prose"):
        prompts = corpus.held_out_prompts(docs, family)
        with open(out_dir / f"{family}.jsonl", "w") as f:
            for p in prompts:
                f.write(json.dumps({"prompt": p}) + "\n")
        counts[family] = len(prompts)
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=STEPS)
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="windows per step, half code and half prose")
    parser.add_argument("--out", type=Path, default=MODELS_DIR,
                        help="where tiny-target/, tiny-draft/, prompts/ go")
    args = parser.parse_args()

    torch.set_num_threads(NUM_THREADS)
    torch.manual_seed(SEED)
    t0 = time.perf_counter()

    docs = corpus.all_documents()
    train_docs = [d for d in docs if not d.held_out]
    held_docs = [d for d in docs if d.held_out]
    tokenizer = train_tokenizer([d.text for d in train_docs])
    streams = {f: token_stream(tokenizer, [d.text for d in train_docs if d.family == f])
               for f in ("code", "prose")}
    held_streams = {f: token_stream(tokenizer, [d.text for d in held_docs if d.family == f])
                    for f in ("code", "prose")}
    t_data = time.perf_counter() - t0
    print(f"corpus + tokenizer: {t_data:.1f} s; train tokens "
          + ", ".join(f"{f}={len(s)}" for f, s in streams.items()), flush=True)

    target = Qwen2ForCausalLM(qwen2_config(TARGET_SHAPE, tokenizer))
    draft = Qwen2ForCausalLM(qwen2_config(DRAFT_SHAPE, tokenizer))
    params = list(target.parameters()) + list(draft.parameters())
    opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), weight_decay=0.1)
    gen = torch.Generator().manual_seed(SEED)

    t_train, cpu_train = time.perf_counter(), time.process_time()
    load_start = os.getloadavg()[0]
    log = []
    for step in range(args.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args.steps)
        batch = torch.cat([sample_windows(streams["code"], args.batch // 2, gen),
                           sample_windows(streams["prose"], args.batch // 2, gen)])
        t_ce, d_ce, kl, d_loss, _, _ = pair_losses(target, draft, batch)
        opt.zero_grad(set_to_none=True)
        (t_ce + d_loss).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0 or step == args.steps - 1:
            elapsed = time.perf_counter() - t_train
            entry = dict(step=step, target_ce=round(t_ce.item(), 4),
                         draft_ce=round(d_ce.item(), 4), kl=round(kl.item(), 4),
                         elapsed_s=round(elapsed, 1),
                         cpu_s=round(time.process_time() - cpu_train, 1))
            log.append(entry)
            print(json.dumps(entry), flush=True)
    train_s = time.perf_counter() - t_train
    # CPU seconds / NUM_THREADS estimates the wall time on an otherwise idle
    # machine; the wall time above includes waiting for other processes.
    cpu_s = time.process_time() - cpu_train

    eval_gen = torch.Generator().manual_seed(SEED + 1)
    held_report = {f: evaluate(target, draft, sample_windows(s, EVAL_WINDOWS, eval_gen))
                   for f, s in held_streams.items()}
    print("held-out:", json.dumps(held_report), flush=True)

    save_model(target, tokenizer, args.out / "tiny-target")
    save_model(draft, tokenizer, args.out / "tiny-draft")
    prompt_counts = write_prompts(docs, args.out / "prompts")
    total_s = time.perf_counter() - t0
    record = dict(
        command=f"python models/train.py --steps {args.steps}",
        torch=torch.__version__, threads=NUM_THREADS, seed=SEED,
        code_root=str(corpus.code_root()),
        documents={f: dict(train=sum(d.family == f and not d.held_out for d in docs),
                           held_out=sum(d.family == f and d.held_out for d in docs))
                   for f in ("code", "prose")},
        train_tokens={f: len(s) for f, s in streams.items()},
        steps=args.steps, batch=args.batch, seq_len=SEQ_LEN, lr=LR,
        target_params=sum(p.numel() for p in target.parameters()),
        draft_params=sum(p.numel() for p in draft.parameters()),
        prompts=prompt_counts, held_out=held_report, log=log,
        data_seconds=round(t_data, 1), train_seconds=round(train_s, 1),
        train_cpu_seconds=round(cpu_s, 1),
        load_average_start_end=[round(load_start, 2), round(os.getloadavg()[0], 2)],
        total_seconds=round(total_s, 1))
    (args.out / "train_record.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"training time: {train_s:.0f} s wall, {cpu_s:.0f} CPU s on {NUM_THREADS} threads "
          f"({args.steps} steps); total {total_s:.0f} s", flush=True)


if __name__ == "__main__":
    main()
