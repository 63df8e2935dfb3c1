"""Check the bundled pair for greedy repetition loops (transformers, float32).

    .venv/bin/python models/greedy_check.py [MODELS_DIR]

For the first 12 held-out prompts of each family: the target's first 64
greedy tokens, the share of distinct 4-grams among them (a looping model
scores near 0), and how often the draft's argmax equals the target's along
that greedy path (first-position agreement where speculation runs). Prints
three sample continuations per family. An undertrained target loops, and
its loops are easy to draft, which fakes high acceptance: run this before
trusting acceptance numbers (docs/models.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

PROMPTS_PER_FAMILY = 12
NEW_TOKENS = 64
SAMPLES_SHOWN = 3


def distinct_4gram_share(tokens: list[int]) -> float:
    grams = [tuple(tokens[i:i + 4]) for i in range(len(tokens) - 3)]
    return len(set(grams)) / max(1, len(grams))


@torch.no_grad()
def main(models_dir: Path) -> None:
    tok = AutoTokenizer.from_pretrained(models_dir / "tiny-target")
    target = AutoModelForCausalLM.from_pretrained(models_dir / "tiny-target",
                                                  dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(models_dir / "tiny-draft",
                                                 dtype=torch.float32).eval()
    for family in ("code", "prose"):
        lines = (models_dir / "prompts" / f"{family}.jsonl").read_text().splitlines()
        prompts = [json.loads(line)["prompt"] for line in lines[:PROMPTS_PER_FAMILY]]
        agree = total = 0
        shares = []
        for i, prompt in enumerate(prompts):
            ids = tok(prompt, return_tensors="pt").input_ids
            out = target.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False,
                                  pad_token_id=tok.eos_token_id)
            new = out[0, ids.shape[1]:].tolist()
            # Position t predicts token t+1: compare both argmaxes over the new tokens.
            span = slice(ids.shape[1] - 1, -1)
            agree += (target(out).logits[0, span].argmax(-1)
                      == draft(out).logits[0, span].argmax(-1)).sum().item()
            total += len(new)
            shares.append(distinct_4gram_share(new))
            if i < SAMPLES_SHOWN:
                print(f"{family} {i}: {tok.decode(new)!r}")
        print(f"{family}: distinct 4-gram share {sum(shares) / len(shares):.2f}, "
              f"draft/target argmax agreement on the greedy path {agree / total:.2f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent)
