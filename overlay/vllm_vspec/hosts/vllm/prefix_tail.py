"""Prefix-cache hits of a vspec engine with an EAGLE head: target-only's.

vLLM 0.32 shortens every prefix-cache hit of an EAGLE-type engine by one
block: SpeculativeConfig.use_eagle_block_drop goes to the scheduler's KV
cache manager (Scheduler.__init__), whose coordinator drops the last matched
block of every KV cache group when no group is marked as the drafter's
(KVCacheCoordinator.__init__). The reason it gives there: the head's KV at
the last position of the hit was written from the writer's next token,
which the new request need not share. That is one position of the head's KV, and it can change
drafts only (strict verification keeps outputs exact), yet the target
recomputes a whole block for it: 128 tokens on vLLM-CPU (its default block
size, CpuPlatform.check_and_update_config). A workload that resends its
prompts then gets no prefix-cache hit at all on an EAGLE engine where
target-only gets them (measured: docs/log/benchmarks.md).

So for method eagle and eagle3 vspec sets the host's own switch,
SpeculativeConfig.disable_eagle_block_drop,
before the host scheduler reads it. The cost moves to the drafts: a hit
whose next token differs from its writer's drafts from one stale head-KV
position until the context moves on. A lazy gamma 0 (head_lag.py) relies
on the dropped block no more than on the blocks before it: cached
positions whose target states nobody kept hold whatever head KV their
block has (HeadLag.uncovered).

Left as the host has it: MTP and any engine whose drafter's KV group the
host marked (kv_cache_utils._annotate_eagle_groups marks it when the KV
cache is set up, before the scheduler exists: the drop there does not
follow the switch), hybrid models (their Mamba prefill checkpoints read
the switch in the worker's process, MambaPrefillCheckpointBuilder.build,
whose copy of the config predates the scheduler),
and hosts without the switch.
"""

from __future__ import annotations

from typing import Any

# Methods whose head reads one token past a cached prefix (vLLM's
# VllmConfig.num_prefill_lookahead_tokens is 1 for them).
KEEP_TAIL_METHODS = ("eagle", "eagle3")


def keep_prefix_tail(vllm_config: Any, kv_cache_config: Any) -> bool:
    """Turn the host's EAGLE block drop off where that is all it changes
    (module docstring); call before the host scheduler's __init__.
    Returns whether it did."""
    spec = vllm_config.speculative_config
    if (spec is None or spec.method not in KEEP_TAIL_METHODS
            or not hasattr(spec, "disable_eagle_block_drop") or spec.disable_eagle_block_drop
            or vllm_config.model_config.is_hybrid
            or any(getattr(g, "is_eagle_group", False) for g in kv_cache_config.kv_cache_groups)):
        return False
    spec.disable_eagle_block_drop = True
    return True
