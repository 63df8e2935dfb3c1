"""Run real vLLM engines on the bundled models: build one engine per variant,
run batches of greedy requests through it, and read the spec-decode counters.

Shared by `vllm-vspec demo`, the benchmarks and the real-engine tests, so that
they all build engines and measure the same way.

A variant is data, not code: a label plus the speculative config and the
vspec table; wiring.engine_args turns them into `vllm.LLM` arguments. Adding
an adaptive variant is one more `Variant(...)` entry.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS_DIR = REPO_ROOT / "models"
DEFAULT_TARGET = MODELS_DIR / "derived" / "tiny-target-deep"
DEFAULT_DRAFT = MODELS_DIR / "tiny-draft"
DEFAULT_EAGLE = MODELS_DIR / "tiny-eagle"
DEFAULT_PROMPT_FILES = tuple(sorted((MODELS_DIR / "prompts").glob("*.jsonl")))

# Small, fixed engine footprint: several engines (other tests, other users of
# this machine) may be alive at once on a CPU host.
ENGINE_DEFAULTS: dict[str, Any] = dict(
    max_model_len=1024,
    gpu_memory_utilization=0.3,      # the CPU host refuses to start with the default 0.9
    kv_cache_memory_bytes=512 << 20,
    seed=0,
    # vLLM's CPU warm-up traces the model for torch.compile, which takes
    # minutes per engine on a busy 2-core host and, with inductor off there,
    # buys no speed; eager mode starts in seconds.
    enforce_eager=True,
    disable_log_stats=False,         # the spec-decode counters live in the stats
)

# Names of vLLM's spec-decode counters (vllm/v1/spec_decode/metrics.py).
_DRAFTS = "vllm:spec_decode_num_drafts"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True)
class Variant:
    """One engine configuration. `speculative_config=None` is target-only."""

    label: str
    speculative_config: dict[str, Any] | None = None
    vspec: dict[str, Any] | None = None  # VSpecConfig keys; None: stock vLLM

    @property
    def is_baseline(self) -> bool:
        return self.speculative_config is None


def draft_model_variant(draft: str | Path, gamma: int) -> Variant:
    """vLLM's serial draft-model speculation with a fixed gamma."""
    return Variant(f"draft K={gamma}", {"method": "draft_model", "model": str(draft),
                                        "num_speculative_tokens": gamma})


def vspec_variant(label: str, draft: str | Path, max_gamma: int, method: str = "draft_model",
                  **vspec: Any) -> Variant:
    """`method` speculation (draft_model or eagle) with gamma chosen per step
    by vSpec Adaptive in [min_gamma, max_gamma]; `vspec` holds VSpecConfig keys."""
    return Variant(label, {"method": method, "model": str(draft),
                           "num_speculative_tokens": max_gamma}, vspec)


@dataclass
class SpecCounters:
    """Spec-decode counters summed over the engine's lifetime (or a delta)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __sub__(self, other: "SpecCounters") -> "SpecCounters":
        n = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = lambda v: v + [0] * (n - len(v))  # noqa: E731
        return SpecCounters(self.drafts - other.drafts, self.draft_tokens - other.draft_tokens,
                            self.accepted - other.accepted,
                            [a - b for a, b in zip(pad(self.accepted_per_pos),
                                                   pad(other.accepted_per_pos))])

    @property
    def mean_accepted_length(self) -> float | None:
        """Tokens committed per target step: accepted drafts plus the bonus or
        corrected token (vLLM's 'mean acceptance length')."""
        return 1 + self.accepted / self.drafts if self.drafts else None

    @property
    def acceptance_per_position(self) -> list[float]:
        """Fraction of drafts whose position i was accepted (so positions
        0..i all were: acceptance is a strict prefix)."""
        return [a / self.drafts for a in self.accepted_per_pos] if self.drafts else []


def read_spec_counters(llm) -> SpecCounters:
    from vllm.v1.metrics.reader import Counter, Vector

    counters = SpecCounters()
    for metric in llm.get_metrics():
        if isinstance(metric, Counter):
            if metric.name == _DRAFTS:
                counters.drafts += metric.value
            elif metric.name == _DRAFT_TOKENS:
                counters.draft_tokens += metric.value
            elif metric.name == _ACCEPTED:
                counters.accepted += metric.value
        elif isinstance(metric, Vector) and metric.name == _ACCEPTED_PER_POS:
            counters.accepted_per_pos = [a + b for a, b in zip(
                metric.values, counters.accepted_per_pos or [0] * len(metric.values))]
    return counters


def load_prompts(files: Iterable[str | Path]) -> list[str]:
    """Prompts from JSONL files (key "prompt"), interleaved across files so
    that any prefix of the list mixes the families."""
    per_file = [[json.loads(line)["prompt"] for line in Path(f).read_text().splitlines()
                 if line.strip()] for f in files]
    longest = max((len(p) for p in per_file), default=0)
    return [p[i] for i in range(longest) for p in per_file if i < len(p)]


def build_llm(target: str | Path, variant: Variant, dtype: str, max_num_seqs: int, **overrides):
    """A vLLM engine for `variant` that can run `max_num_seqs` requests at once."""
    from vllm import LLM

    from vllm_vspec.hosts import wiring

    kwargs = dict(ENGINE_DEFAULTS, model=str(target), dtype=dtype, max_num_seqs=max_num_seqs,
                  **wiring.engine_args(variant.speculative_config, variant.vspec))
    kwargs.update(overrides)
    return LLM(**kwargs)


def shutdown_llm(llm) -> None:
    """Stop the engine core now, so the next engine does not share the CPUs
    and memory with a lingering one."""
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()


def greedy_params(max_tokens: int):
    from vllm import SamplingParams

    # ignore_eos: every request generates exactly max_tokens, so tokens/s is
    # comparable across variants and exactness covers the whole output.
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


@dataclass
class BatchRun:
    """All requests of one (variant, batch size) measurement."""

    token_ids: list[list[int]]
    seconds: float
    spec: SpecCounters

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.num_tokens / self.seconds


def run_batches(llm, prompts: Sequence[str], batch_size: int, max_tokens: int) -> BatchRun:
    """Generate for `prompts` in consecutive batches of `batch_size` requests
    (each batch starts together and runs to completion), timing only generation."""
    params = greedy_params(max_tokens)
    before = read_spec_counters(llm)
    token_ids: list[list[int]] = []
    seconds = 0.0
    for start in range(0, len(prompts), batch_size):
        chunk = list(prompts[start:start + batch_size])
        t0 = time.perf_counter()
        outputs = llm.generate(chunk, params, use_tqdm=False)
        seconds += time.perf_counter() - t0
        token_ids += [list(o.outputs[0].token_ids) for o in outputs]
    return BatchRun(token_ids, seconds, read_spec_counters(llm) - before)


def prompts_for_batch(pool: Sequence[str], batch_size: int, num_prompts: int) -> list[str]:
    """`num_prompts` prompts rounded up to whole batches (at least one), cycling
    through the pool when a batch is larger than it."""
    batches = max(1, -(-num_prompts // batch_size))
    return [pool[i % len(pool)] for i in range(batches * batch_size)]


def count_identical(runs: Sequence[list[int]], reference: Sequence[list[int]]) -> int:
    return sum(a == b for a, b in zip(runs, reference))


def first_difference(a: list[int], b: list[int]) -> str:
    """Where two token sequences first differ, for exactness failure messages."""
    i = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return f"first difference at token {i}: {a[i:i + 8]} vs {b[i:i + 8]}"
