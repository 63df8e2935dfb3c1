"""Write a recording on the real engine (`vllm-vspec replay record`).

1. Target-only greedy decoding (a stock vLLM engine without speculation)
   gives every request's output stream.
2. The acceptance run a_K at every decode position comes from the drafter
   as the served engine runs it: a stock vLLM engine with the method at K
   (prefix caching on) gets one probe request per decode position d, whose
   prompt is the prompt plus output[:d]. Its prefill step commits output[d]
   and drafts K tokens from prompt + output[:d + 1] exactly as a decode
   step does from the true prefix; its first decode step verifies them, and
   the tokens it commits minus one are a_K(d). This is the same proposer
   code for every method (draft model, EAGLE, EAGLE-3, MTP, n-gram), so no
   drafter is re-implemented here. A probe whose prefill token differs from
   the stream (a float near-tie between prefill and decode) is listed in
   the request's `disagree`.
3. The draft probabilities, where the drafter has them (PROBS_METHODS:
   the drafters vspec's proposers extend), come from the same probes: the
   probe engine runs vspec's model runner under policy `budget`, whose
   proposer records the drafter's probability of every greedy draft token
   from the logits it came from, and vLLM's own scheduler (hosts/vllm/replay_probe.py
   ProbeScheduler) keeps those of each probe's prefill draft. Its steps
   draft and verify K, as a stock engine's do.

Engines run in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), float32,
eager, one after the other.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from vllm_vspec.replay.recording import RecordedRequest, Recording, quantised

MODELS = Path(__file__).resolve().parents[3] / "models"
DERIVED = MODELS / "derived"
# Per method: (served target, drafter or None). The deep target's outputs
# and hidden states are the trained target's (its extra layers add zeros),
# and it costs what a real target's step costs: what `bench` serves.
DEFAULT_MODELS: dict[str, tuple[Path, Path | None]] = {
    "draft_model": (DERIVED / "tiny-target-deep", MODELS / "tiny-draft"),
    "eagle": (DERIVED / "tiny-target-deep", MODELS / "tiny-eagle"),
    "eagle3": (DERIVED / "tiny-target-deep", MODELS / "tiny-eagle3"),
    "mtp": (DERIVED / "tiny-mimo-deep", None),
    "ngram": (DERIVED / "tiny-target-deep", None),
}
METHODS = tuple(DEFAULT_MODELS)
# Methods whose proposer vspec extends (hosts/vllm/proposers.PROPOSERS),
# so the probes can record draft probabilities.
PROBS_METHODS = ("draft_model", "eagle", "eagle3", "mtp")
# The vspec settings of a probe engine that records them: policy `budget`
# turns the proposer's record on; the probe scheduler is vLLM's, so the
# policy decides nothing.
PROBE_VSPEC = {"policy": "budget"}


@dataclass(frozen=True)
class Prompt:
    key: str
    family: str
    text: str


def _engine(target: Path, max_model_len: int, max_num_seqs: int, kv_bytes: int, **extra):
    """An in-process engine; `extra`: the speculative engine's arguments."""
    from vllm import LLM

    return LLM(model=str(target), dtype="float32", enforce_eager=True, seed=0,
               max_model_len=max_model_len, max_num_seqs=max_num_seqs,
               max_num_batched_tokens=max(4096, max_model_len),
               gpu_memory_utilization=0.3, kv_cache_memory_bytes=kv_bytes,
               enable_prefix_caching=True, block_size=32, generation_config="vllm",
               distributed_executor_backend="uni", **extra)


def probe_engine_args(method: str, spec: dict, probs: bool) -> dict:
    """The probe engine's arguments: the method at K with vLLM's scheduler
    (hosts/vllm/replay_probe.py) and, when `probs`, vspec's model runner recording the draft
    probabilities."""
    from vllm_vspec.hosts.wiring import engine_args
    from vllm_vspec.hosts.vllm.replay_probe import PROBE_SCHEDULER_CLS

    if probs and method not in PROBS_METHODS:
        raise ValueError(f"draft probabilities of method {method!r} are not recorded: its "
                         f"drafter has none (methods with them: {', '.join(PROBS_METHODS)})")
    args = engine_args(spec, PROBE_VSPEC) if probs else engine_args(spec)
    args["scheduler_cls"] = PROBE_SCHEDULER_CLS
    return args


def _run(engine, requests: Sequence[tuple[str, list[int], int]],
         on_output: Callable[[str, list[int]], bool], progress: Callable[[int], None],
         internal_ids: dict[str, str] | None = None) -> None:
    """Add every (id, prompt token ids, max tokens) request and step the
    engine until all finish; `on_output(id, tokens so far)` after each step
    that gave a request tokens returns True to abort it early.
    `internal_ids` gets each id's id inside the engine core (vLLM adds a
    random suffix), what its scheduler knows the request by."""
    from vllm import SamplingParams, TokensPrompt

    for rid, ids, max_tokens in requests:
        internal = engine.add_request(rid, TokensPrompt(prompt_token_ids=ids),
                                      SamplingParams(temperature=0.0, max_tokens=max_tokens,
                                                     ignore_eos=True))
        if internal_ids is not None:
            internal_ids[rid] = internal
    done = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            finished = out.finished
            if not finished and on_output(out.request_id, list(out.outputs[0].token_ids)):
                engine.abort_request([out.request_id])
                finished = True
            elif finished:
                on_output(out.request_id, list(out.outputs[0].token_ids))
            if finished:
                done += 1
                progress(done)


def _progress(label: str, total: int) -> Callable[[int], None]:
    start, last = time.monotonic(), [0.0]

    def show(done: int) -> None:
        now = time.monotonic()
        if done == total or now - last[0] >= 2.0:
            last[0] = now
            print(f"\r  {label}: {done}/{total} ({now - start:.0f} s)", end="\n" if done == total else "",
                  file=sys.stderr, flush=True)
    return show


def record(method: str, prompts: Sequence[Prompt], *, k: int = 4, output_len: int = 64,
           target: Path | None = None, drafter: Path | None = None,
           max_num_seqs: int = 32, kv_cache_memory_bytes: int = 2 << 30,
           prompt_set: str = "", draft_probs: bool | None = None) -> Recording:
    """Record `prompts` for `method` at K = `k` (see the module docstring).
    `draft_probs`: record the draft probabilities too (None: where the
    method's drafter has them, PROBS_METHODS)."""
    from vllm_vspec.tools.engine_runs import shutdown_llm
    from vllm_vspec.tools.profile_collect import host_description
    import vllm
    import torch
    from transformers import AutoTokenizer

    if method not in METHODS:
        raise ValueError(f"method {method!r} is not allowed: one of {', '.join(METHODS)}")
    if k < 1:
        raise ValueError(f"num_speculative_tokens={k} is not allowed: an integer >= 1")
    default_target, default_drafter = DEFAULT_MODELS[method]
    target = Path(target or default_target)
    drafter = drafter or default_drafter
    for what, path in (("target", target), ("drafter", drafter)):
        if path is not None and not (Path(path) / "config.json").is_file():
            raise ValueError(f"{what} {path}: no config.json there (run `make install` for "
                             f"the derived bundled models, or pass a model directory)")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    tok = AutoTokenizer.from_pretrained(str(target))
    ids = [tok(p.text)["input_ids"] for p in prompts]
    max_model_len = max(len(i) for i in ids) + output_len + k + 8
    started = time.time()

    streams: dict[str, list[int]] = {}
    engine = _engine(target, max_model_len, max_num_seqs, kv_cache_memory_bytes)
    try:
        _run(engine.llm_engine, [(str(i), p, output_len) for i, p in enumerate(ids)],
             lambda rid, toks: streams.__setitem__(rid, toks) and False,
             _progress("target-only streams", len(ids)))
    finally:
        shutdown_llm(engine)

    from vllm_vspec.hosts.wiring import method_config

    spec = method_config(method, drafter, k)
    with_probs = method in PROBS_METHODS if draft_probs is None else draft_probs
    accept: dict[tuple[int, int], int] = {}
    probs: dict[tuple[int, int], list[float] | None] = {}
    disagree: dict[int, list[int]] = {}
    probes = [(f"{i}:{d}", ids[i] + streams[str(i)][:d], k + 2)
              for i in range(len(ids)) for d in range(len(streams[str(i)]) - 1)]
    engine = _engine(target, max_model_len, max_num_seqs, kv_cache_memory_bytes,
                     **probe_engine_args(method, spec, with_probs))
    scheduler = engine.llm_engine.engine_core.engine_core.scheduler
    internal: dict[str, str] = {}

    def on_probe(rid: str, toks: list[int]) -> bool:
        i, d = (int(x) for x in rid.split(":"))
        if len(toks) >= 2:
            if toks[0] != streams[str(i)][d]:
                disagree.setdefault(i, []).append(d)
            accept[(i, d)] = min(k, len(toks) - 2)
            probs[(i, d)] = scheduler.take_first_draft_probs(internal.pop(rid))
            return True
        return False
    # Each request's longest probe first, alone: its prefix blocks are then
    # cached for the request's other probes (blocks computed in the same
    # step as a probe are not shared with it).
    longest = set({rid.split(":")[0]: n for n, (rid, _, _) in enumerate(probes)}.values())
    first = [p for n, p in enumerate(probes) if n in longest]
    rest = [p for n, p in enumerate(probes) if n not in longest]
    show = _progress(f"{method} K={k} probes", len(probes))
    try:
        _run(engine.llm_engine, first, on_probe, show, internal)
        _run(engine.llm_engine, rest, on_probe, lambda n: show(n + len(first)), internal)
    finally:
        shutdown_llm(engine)
    missing = [rid for rid, _, _ in probes if tuple(int(x) for x in rid.split(":")) not in accept]
    if missing:
        raise RuntimeError(f"{len(missing)} probes ended without a decode step (first: {missing[0]})")

    unscored = [key for key, row in probs.items() if row is None or len(row) != k]
    if with_probs and unscored:
        raise RuntimeError(f"{len(unscored)} probes drafted without K={k} draft probabilities "
                           f"(first: {unscored[0]}): the drafter did not record them")

    def rows(i: int):
        if not with_probs:
            return None
        return tuple(tuple(quantised(p) for p in probs[(i, d)])
                     for d in range(len(streams[str(i)]) - 1))
    requests = [RecordedRequest(p.key, p.family, tuple(ids[i]), tuple(streams[str(i)]),
                                tuple(accept[(i, d)] for d in range(len(streams[str(i)]) - 1)),
                                tuple(sorted(disagree.get(i, ()))), rows(i))
                for i, p in enumerate(prompts)]
    header = {
        "method": method, "target": str(target), "drafter": str(drafter) if drafter else None,
        "num_speculative_tokens": k, "output_len": output_len, "prompt_set": prompt_set,
        "speculative_config": spec, "dtype": "float32", "enforce_eager": True,
        **({"probe_vspec": PROBE_VSPEC} if with_probs else {}),
        "versions": {"vllm": vllm.__version__, "torch": torch.__version__,
                     "python": platform.python_version()},
        "host": host_description(),
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "seconds": round(time.time() - started, 1),
    }
    return Recording(header, requests)
