"""`vllm-vspec profile`: this host's latency profile.

  collect  measure fixed-gamma latency samples on this host
           (tools/profile_collect.py) and fit a latency profile from them
           (core/latency.py)
  fit      refit a profile from samples already collected

The `profile` policy (vspec key profile_path), `vllm-vspec sim` and
`bench serve`'s profile variant read the profile.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from vllm_vspec.cli import HelpFormatter
from vllm_vspec.core.latency import fit_profile, profile_predict, save_profile, validate_samples
from vllm_vspec.tools import profile_collect


def add_parser(subparsers) -> None:
    from vllm_vspec.commands import fit_profile

    group = subparsers.add_parser(
        "profile", help="this host's latency profile (the profile policy and the simulators "
                        "read it)",
        description=__doc__, formatter_class=HelpFormatter)
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = actions.add_parser(
        "collect", help="measure latency samples on this host and fit a latency profile",
        description=profile_collect.__doc__, formatter_class=HelpFormatter)
    p.add_argument("--target", type=Path, default=Path("models/derived/tiny-target-deep"),
                   help="target model directory")
    p.add_argument("--draft", type=Path, default=Path("models/tiny-draft"),
                   help="draft model directory")
    p.add_argument("--kinds", default=",".join(profile_collect.KINDS),
                   help=f"comma-separated engine kinds to time, of {', '.join(profile_collect.KINDS)}")
    p.add_argument("--gammas", default="1,2,4", help="gammas of the `step` engines")
    p.add_argument("--batch-sizes", default="1,4,16,32",
                   help="comma-separated B: requests decoding together")
    p.add_argument("--prompt-lens", default="64,256",
                   help="comma-separated L: random prompt tokens per request")
    p.add_argument("--decode-steps", type=int, default=6,
                   help="samples per (engine, batch size, prompt length)")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=512 << 20,
                   help="KV cache of every engine")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    p.add_argument("--enforce-eager", action="store_true",
                   help="time engines without torch.compile (match a server run that way)")
    p.add_argument("--name", default="cpu-tiny-draft", help="profile name written into the file")
    p.add_argument("--device", default=None,
                   help="device text written into the profile (unset: this host's)")
    p.add_argument("--samples", type=Path, default=Path("profiles/cpu-tiny-draft.samples.json"),
                   help="where the samples are written (`vllm-vspec profile fit` refits them)")
    p.add_argument("--profile", type=Path, default=Path("profiles/cpu-tiny-draft.json"),
                   help="where the fitted profile is written")
    p.set_defaults(func=main)
    fit_profile.add_parser(actions)


def main(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in profile_collect.KINDS]
    if bad or not kinds:
        raise SystemExit(f"--kinds={args.kinds!r} is not allowed: a comma-separated subset "
                         f"of {', '.join(profile_collect.KINDS)}")
    if args.decode_steps < 1:
        raise SystemExit(f"--decode-steps={args.decode_steps} is not allowed: an integer >= 1")
    shapes = [profile_collect.Shape(b, l) for b in profile_collect.int_list("--batch-sizes", args.batch_sizes, 1)
              for l in profile_collect.int_list("--prompt-lens", args.prompt_lens, 1)]
    runs = profile_collect.engine_runs(kinds, args.target, args.draft, profile_collect.int_list("--gammas", args.gammas, 1))
    # One engine step per LLMEngine.step() call: the engine must run in this process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    device = args.device or profile_collect.host_description()
    samples: list[dict] = []
    started = time.time()
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.kind}" + (f" gamma {run.gamma}" if run.gamma else "")
              + f": {len(shapes)} shapes x {args.decode_steps} steps", flush=True)
        samples += profile_collect.collect_engine(run, shapes, args.decode_steps,
                                  args.kv_cache_memory_bytes, args.seed, args.enforce_eager)
    validate_samples(samples, where="collected samples")
    args.samples.parent.mkdir(parents=True, exist_ok=True)
    args.samples.write_text(json.dumps({
        "name": args.name, "device": device,
        "collected": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "target_model": str(args.target), "draft_model": str(args.draft),
        "enforce_eager": args.enforce_eager,
        "samples": samples}, indent=1) + "\n")
    profile = fit_profile(samples, name=args.name, device=device, note=(
        f"measured by `vllm-vspec profile collect` on "
        f"{time.strftime('%Y-%m-%d', time.gmtime(started))}"
        f" from {len(samples)} engine-step samples (target {args.target}, draft "
        f"{args.draft}, float32{', eager' if args.enforce_eager else ', torch.compile'});"
        f" re-measure for another host, dtype, model or compile mode"))
    args.profile.parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, args.profile)
    errors = sorted(abs(profile_predict(profile, s) / s["ms"] - 1) for s in samples if s["ms"] > 0)
    fitted = {m: {k: round(float(v), 6) for k, v in profile.to_dict()[m].items()}
              for m in ("target", "draft")}
    print(f"{len(samples)} samples -> {args.samples}\nprofile -> {args.profile}: "
          f"target {fitted['target']}, draft {fitted['draft']} (ms)\nrelative error "
          f"of the fit: median {errors[len(errors) // 2]:.3f}, max {errors[-1]:.3f}")
    return 0
