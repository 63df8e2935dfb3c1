"""Deepen the bundled target for benchmarking: append decoder layers whose
output projections (o_proj, down_proj) are zero.

    .venv/bin/python models/deepen.py      # models/tiny-target -> models/derived/tiny-target-deep

Why: the 4-layer target is so cheap that vLLM's per-step overhead dominates
and speculation can never pay off, unlike a real 14B target next to a 0.5B
draft. A zero output projection makes a layer's contribution to the residual
stream exactly 0 (x + 0 == x, in bf16 too), so the deepened model produces
the same logits and tokens as the trained one, while every extra layer still
runs its real attention and MLP compute.

Deterministic: the extra layers' other weights come from a seeded generator,
and the output is byte-identical on every run. config.json is written last,
so its presence (the Makefile's target) means the directory is complete.

    .venv/bin/python models/deepen.py --mimo   # -> models/derived/tiny-mimo-deep

`--mimo` derives the MiMo-style MTP checkpoint of the deepened target
(the `mtp-*` bench variants' target): the deepened weights and tiny-mimo's
MTP layer, both symlinked, under tiny-mimo's architecture. The appended
layers add exactly 0 to the residual stream, so the final hidden state the
MTP layer reads is the 4-layer target's and it drafts what tiny-mimo drafts;
vLLM names an MTP layer by its index after the target's layers when it loads
it (`model.mtp_layers.0` in the file either way).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MODELS_DIR = Path(__file__).resolve().parent
EXTRA_LAYERS = 28
SEED = 0
INIT_STD = 0.02
# Files copied unchanged from the trained target (tokenizer, chat template,
# generation config); whichever of them exist.
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                "special_tokens_map.json", "generation_config.json")
# Output projections of a layer: zero, so the layer adds nothing to the residual.
ZERO_SUFFIXES = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def layer_shapes(state: dict[str, torch.Tensor]) -> dict[str, torch.Size]:
    """Parameter name (after `model.layers.0.`) -> shape, from the trained layer 0."""
    prefix = "model.layers.0."
    return {k[len(prefix):]: v.shape for k, v in state.items() if k.startswith(prefix)}


def extra_layer(shapes: dict[str, torch.Size], gen: torch.Generator,
                dtype: torch.dtype) -> dict[str, torch.Tensor]:
    layer = {}
    for name in sorted(shapes):  # sorted: the generator's draws must not depend on dict order
        shape = shapes[name]
        if name.endswith(ZERO_SUFFIXES) or name.endswith(".bias"):
            tensor = torch.zeros(shape)
        elif name.endswith("layernorm.weight"):
            tensor = torch.ones(shape)
        else:
            tensor = torch.randn(shape, generator=gen) * INIT_STD
        layer[name] = tensor.to(dtype)
    return layer


def deepen(src: Path, out: Path, extra_layers: int = EXTRA_LAYERS) -> None:
    config = json.loads((src / "config.json").read_text())
    state = load_file(src / "model.safetensors")
    shapes = layer_shapes(state)
    dtype = state["model.embed_tokens.weight"].dtype
    first = config["num_hidden_layers"]
    gen = torch.Generator().manual_seed(SEED)
    for index in range(first, first + extra_layers):
        for name, tensor in extra_layer(shapes, gen, dtype).items():
            state[f"model.layers.{index}.{name}"] = tensor

    config["num_hidden_layers"] = first + extra_layers
    if "layer_types" in config:  # per-layer list in newer configs; must match the depth
        config["layer_types"] = config["layer_types"][:1] * config["num_hidden_layers"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").unlink(missing_ok=True)
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    for name in COPIED_FILES:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


# tiny-mimo's config keys that make a checkpoint MiMo-style (the rest is the target's).
MIMO_KEYS = ("architectures", "num_nextn_predict_layers")
# Files of the MiMo checkpoint that are symlinks: the weights of both parts.
MIMO_LINKS = (("model.safetensors", "deep"), ("mtp.safetensors", "mimo"))


def derive_mimo(deep: Path, mimo: Path, out: Path) -> None:
    """out: a MiMo-style checkpoint of the deepened target `deep` with the
    MTP layer of `mimo` (symlinks, no weights written; config.json last)."""
    config = json.loads((deep / "config.json").read_text())
    config.update({k: json.loads((mimo / "config.json").read_text())[k] for k in MIMO_KEYS})
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").unlink(missing_ok=True)
    sources = {"deep": deep, "mimo": mimo}
    for name in [n for n, _ in MIMO_LINKS] + [n for n in COPIED_FILES if (deep / n).exists()]:
        src = sources[dict(MIMO_LINKS).get(name, "deep")] / name
        link = out / name
        link.unlink(missing_ok=True)
        link.symlink_to(Path(os.path.relpath(src.resolve(), out.resolve())))
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--src", type=Path, default=MODELS_DIR / "tiny-target")
    parser.add_argument("--out", type=Path, default=MODELS_DIR / "derived" / "tiny-target-deep")
    parser.add_argument("--extra-layers", type=int, default=EXTRA_LAYERS)
    parser.add_argument("--mimo", action="store_true",
                        help="derive tiny-mimo-deep beside --out instead: the deepened "
                             "target (already derived) with tiny-mimo's MTP layer")
    args = parser.parse_args()
    if args.extra_layers < 1:
        parser.error(f"--extra-layers={args.extra_layers} is not allowed: must be >= 1")
    if not args.mimo:
        deepen(args.src, args.out, args.extra_layers)
        print(f"wrote {args.out} ({args.extra_layers} zero-output layers added)")
        return
    if not (args.out / "config.json").is_file():
        parser.error(f"--mimo: {args.out} is not derived yet (run without --mimo first)")
    out = args.out.parent / "tiny-mimo-deep"
    derive_mimo(args.out, MODELS_DIR / "tiny-mimo", out)
    print(f"wrote {out} ({args.out.name} + the MTP layer of tiny-mimo, symlinked)")


if __name__ == "__main__":
    main()
