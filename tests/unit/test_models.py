"""The committed model pair and what `make install` derives from it: fast
checks with transformers only (engine-level behaviour is tested elsewhere)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

MODELS = Path(__file__).resolve().parents[2] / "models"
TARGET, DRAFT = MODELS / "tiny-target", MODELS / "tiny-draft"
PAIR = (TARGET, DRAFT)
WEIGHT_CAP_BYTES = 25 * 1000 * 1000
SAMPLES = [
    "def add(a, b):\n    return a + b  # sum\n",
    "    if not isinstance(key, str):\n\traise TypeError(f'bad {key!r}')\n",
    "Permission is hereby granted, free of charge, to any person obtaining a copy.",
    "naïve café — ünïcode ✓ 🙂\r\n\n",
]


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(TARGET)


@pytest.mark.parametrize("text", SAMPLES)
def test_tokenizer_round_trips_text(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text


def test_tokenizer_has_2048_tokens_and_single_token_specials(tokenizer):
    assert len(tokenizer) == 2048
    for special in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer.encode(special, add_special_tokens=False) == [
            tokenizer.convert_tokens_to_ids(special)]
    assert tokenizer.eos_token == "<|endoftext|>"


def test_chat_template_renders_chatml(tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_draft_shares_the_target_tokenizer():
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (TARGET / name).read_bytes() == (DRAFT / name).read_bytes(), name


def test_configs_load_as_qwen2_and_draft_is_smaller():
    from transformers import AutoConfig

    target, draft = (AutoConfig.from_pretrained(p) for p in PAIR)
    assert target.architectures == draft.architectures == ["Qwen2ForCausalLM"]
    assert target.vocab_size == draft.vocab_size == 2048
    assert draft.hidden_size < target.hidden_size
    assert draft.num_hidden_layers < target.num_hidden_layers


def test_generation_config_stops_at_eos_and_im_end(tokenizer):
    for path in PAIR:
        eos = json.loads((path / "generation_config.json").read_text())["eos_token_id"]
        assert sorted(eos) == sorted(tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"]))


def test_weights_are_bf16_and_under_the_size_cap():
    total = 0
    for path in PAIR:
        weights = path / "model.safetensors"
        total += weights.stat().st_size
        with safe_open(weights, "pt") as f:
            dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
        assert dtypes == {"BF16"}, f"{weights}: {dtypes}"
    assert total <= WEIGHT_CAP_BYTES, f"{total} bytes of weights > cap {WEIGHT_CAP_BYTES}"


@pytest.mark.parametrize("family", ["code", "prose"])
def test_held_out_prompt_files_hold_a_few_dozen_prompts(family):
    lines = (MODELS / "prompts" / f"{family}.jsonl").read_text().splitlines()
    prompts = [json.loads(line)["prompt"] for line in lines]
    assert len(prompts) >= 24
    assert all(isinstance(p, str) and p.strip() for p in prompts)


@pytest.fixture(scope="module")
def deepened(tmp_path_factory):
    """The deepen script run twice, as `make install` runs it, into two dirs."""
    outs = [tmp_path_factory.mktemp(f"deep{i}") for i in range(2)]
    for out in outs:
        subprocess.run([sys.executable, str(MODELS / "deepen.py"), "--out", str(out)],
                       check=True, capture_output=True)
    return outs


def test_deepen_is_deterministic(deepened):
    a, b = deepened
    for name in ("model.safetensors", "config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def test_deepen_adds_28_layers_with_zero_output_projections(deepened):
    config = json.loads((deepened[0] / "config.json").read_text())
    trained = json.loads((TARGET / "config.json").read_text())["num_hidden_layers"]
    assert config["num_hidden_layers"] == trained + 28
    with safe_open(deepened[0] / "model.safetensors", "pt") as f:
        for layer in range(trained, trained + 28):
            for proj in ("self_attn.o_proj", "mlp.down_proj"):
                assert not f.get_tensor(f"model.layers.{layer}.{proj}.weight").any()
            assert f.get_tensor(f"model.layers.{layer}.self_attn.q_proj.weight").any()


def test_the_deepened_mimo_checkpoint_is_the_deepened_target_plus_tiny_mimos_mtp_layer(deepened):
    for _ in range(2):   # re-deriving over an existing one is fine
        subprocess.run([sys.executable, str(MODELS / "deepen.py"), "--out", str(deepened[0]),
                        "--mimo"], check=True, capture_output=True)
    out = deepened[0].parent / "tiny-mimo-deep"
    config = json.loads((out / "config.json").read_text())
    mimo = json.loads((MODELS / "tiny-mimo" / "config.json").read_text())
    deep = json.loads((deepened[0] / "config.json").read_text())
    assert config == {**deep, "architectures": mimo["architectures"],
                      "num_nextn_predict_layers": mimo["num_nextn_predict_layers"]}
    assert (out / "model.safetensors").resolve() == (deepened[0] / "model.safetensors").resolve()
    assert (out / "mtp.safetensors").resolve() == \
        (MODELS / "tiny-mimo" / "mtp.safetensors").resolve()
    assert (out / "tokenizer.json").read_bytes() == (TARGET / "tokenizer.json").read_bytes()


def test_deepened_target_gives_the_same_logits(deepened, tokenizer):
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([tokenizer.encode("import os\n\ndef main(argv):\n    return",
                                         add_special_tokens=False)])
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)(ids).logits
                  for p in (TARGET, deepened[0])]
    assert torch.equal(logits[0], logits[1]), (logits[0] - logits[1]).abs().max()
