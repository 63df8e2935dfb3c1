"""The serving variants the benchmark compares, as a small registry.

A variant is only what differs between servers: the speculative config and,
for vspec, the `vspec` additional-config table (wiring.engine_args adds the
scheduler and this host's vspec worker, as `vllm-vspec serve` does). The
model paths and server sizing are shared and live in `server.ServerSpec`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_vspec.hosts import wiring


# Upper bound of every speculative variant: buffers are sized by it and the
# online policy searches gamma in [1, MAX_GAMMA] within it.
MAX_GAMMA = 4

# vLLM's static batch-size table (`num_speculative_tokens_per_batch_size`,
# inclusive batch ranges -> K), set from what a prototype pair measured on
# this kind of CPU (docs/models.md): K=4 best at batch 1, K=2 about even at batch 16.
DEFAULT_STATIC_TABLE: list[list[int]] = [[1, 2, 4], [3, 8, 3], [9, 24, 2], [25, 1024, 1]]


@dataclass(frozen=True)
class Variant:
    name: str
    # how the report groups it: "target", "fixed" (linear, stock vLLM),
    # "tree-fixed", "static", "online", "vspec-fixed"
    family: str
    speculative_config: dict[str, Any] | None = None
    vspec: dict[str, Any] | None = None  # None: stock vLLM scheduler
    gamma: int | None = None  # the fixed gamma (a tree's depth), for "best fixed" ratios

    def serve_args(self, trace_path: Path | None = None) -> list[str]:
        """vLLM serve arguments that make this variant (on top of the shared ones)."""
        table = self.vspec
        if table is not None and trace_path is not None:
            table = {**table, "trace_path": str(trace_path)}
        return wiring.serve_argv(wiring.engine_args(self.speculative_config, table))


# The seed's --adaptive-refill-batch defaults per method (mtp: EAGLE's; the
# seed's MTP presets set none).
SEED_REFILL_BATCH = {"draft_model": 8, "eagle": 4, "eagle3": 4, "mtp": 4}

# Variant-name prefix -> vLLM speculative method. A method is offered only
# when its drafter model exists (the eagle head lands after the draft model).
# eagle3: models/tiny-eagle3 reads the target's layers 1, 2 and 4, which the
# deepened target (zero layers appended) has unchanged. mtp: the drafter is
# the MTP layers of the target checkpoint itself, so its variants exist only
# when the served target has them (models/derived/tiny-mimo-deep).
METHOD_PREFIXES = {"draft_model": "", "eagle": "eagle-", "eagle3": "eagle3-", "mtp": "mtp-"}
TARGET_DRAFTED = wiring.TARGET_DRAFTED
# A variant's --speculative-config: `method` drafting with `model`, K = k.
speculative_config = wiring.method_config


def _method_variants(method: str, model: Path, static_table: list[list[int]],
                     latency_profile: Path | None = None) -> list[Variant]:
    prefix = METHOD_PREFIXES[method]

    def spec(k: int, **extra: Any) -> dict[str, Any]:
        return speculative_config(method, model, k, **extra)

    out = [Variant(f"{prefix}fixed-{k}", "fixed", spec(k), gamma=k)
           for k in range(1, MAX_GAMMA + 1)]
    out.append(Variant(f"{prefix}static-table", "static", spec(
        MAX_GAMMA, num_speculative_tokens_per_batch_size=static_table)))
    # The defaults: gamma 0..4; gamma0_mode auto: lazy for a draft model, EAGLE, EAGLE-3.
    out.append(Variant(f"{prefix}online", "online", spec(MAX_GAMMA),
                       vspec={"policy": "online"}))
    # The model-based policy (acceptance posteriors, one online step-cost
    # model), started cold: a state file an earlier server left would make a
    # round depend on the rounds before it.
    out.append(Variant(f"{prefix}model", "online", spec(MAX_GAMMA),
                       vspec={"policy": "model", "model_state_dir": "off"}))
    # The same without exploration (decisions at the posterior means, no
    # Thompson draws, probes or rechecks): what exploring costs served.
    out.append(Variant(f"{prefix}model-mean", "online", spec(MAX_GAMMA),
                       vspec={"policy": "model", "model_state_dir": "off",
                              "model_thompson": False}))
    # Target-only steps inside a speculative vspec server: what a gamma-0
    # step costs there (lazy for a draft model, EAGLE, EAGLE-3: no drafter forward).
    out.append(Variant(f"{prefix}fixed-0", "vspec-fixed", spec(MAX_GAMMA),
                       vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0}))
    # gamma 1..4: speculating every step (min_gamma's default before gamma 0
    # became reachable by default; the runs in docs called gamma 0..4 `online-0`)
    out.append(Variant(f"{prefix}online-1", "online", spec(MAX_GAMMA),
                       vspec={"policy": "online", "min_gamma": 1}))
    out.append(Variant(f"{prefix}online-p", "online", spec(MAX_GAMMA),
                       vspec={"policy": "online", "reward_prefill_steps": True}))
    # Refill holding at the seed's group size (draft 8, EAGLE 4): measures
    # whether admitting arrivals in groups pays on this host.
    out.append(Variant(f"{prefix}online-refill", "online", spec(MAX_GAMMA),
                       vspec={"policy": "online", "refill_batch": SEED_REFILL_BATCH[method]}))
    # Per-request verify budgets (docs/design/verify-budget.md): every
    # request drafts the step's depth (0..4), the target verifies, per
    # request, the prefix the admission chose; budget-1 never drafts 0.
    out.append(Variant(f"{prefix}budget", "online", spec(MAX_GAMMA),
                       vspec={"policy": "budget", "min_gamma": 0}))
    out.append(Variant(f"{prefix}budget-1", "online", spec(MAX_GAMMA),
                       vspec={"policy": "budget", "min_gamma": 1}))
    if latency_profile is not None:
        # Goodput argmax from this host's latency profile of this drafter.
        out.append(Variant(f"{prefix}profile", "online", spec(MAX_GAMMA),
                           vspec={"policy": "profile",
                                  "profile_path": str(latency_profile.resolve())}))
    if method == "eagle":
        out += _tree_variants(model)
    return out


# EAGLE trees (docs/design/eagle-tree.md): one node budget K for every tree server,
# so the fixed trees and `eagle-tree-online` are the same server but for the
# policy (buffers, lookahead slots and the token budget are sized by K; the
# ratios then measure the controller, not the sizing). 8 holds the widest
# fixed tree below and every online arm gamma*width <= 8.
TREE_K = 8
# (depth, width) of the fixed trees: width 2 at each linear gamma 2..4 (the
# accepted length of tree vs linear at the same gamma; fixed-2..4 run beside
# them) and 2x4, the same 8 nodes as 4x2 spent on width instead of depth.
# Kept small: every variant is a server start and a full replay of the loads.
FIXED_TREES = ((2, 2), (3, 2), (4, 2), (2, 4))
# eagle-tree-online's widest tree (arms gamma 1..MAX_GAMMA x width 1..4 within K).
ONLINE_TREE_WIDTH = 4


def _tree_variants(model: Path) -> list[Variant]:
    """EAGLE tree servers (vspec's worker verifies the trees: CPU host only).
    Family "tree-fixed": the report's best fixed choice covers linear and
    tree alike, its acceptance per position only the linear drafts."""
    out = [Variant(f"eagle-tree-{g}x{w}", "tree-fixed", speculative_config("eagle", model, TREE_K),
                   vspec={"policy": "fixed", "fixed_gamma": g, "max_gamma": MAX_GAMMA,
                          "tree_width": w, "min_tree_width": w}, gamma=g)
           for g, w in FIXED_TREES]
    out.append(Variant("eagle-tree-online", "online", speculative_config("eagle", model, TREE_K),
                       vspec={"policy": "online", "max_gamma": MAX_GAMMA,
                              "tree_width": ONLINE_TREE_WIDTH}))
    return out


# n-gram drafting (`method: ngram`): no draft model, so these variants exist
# on every host. Matches of 2..4 tokens against the request's own tokens.
NGRAM_SPEC = {"method": "ngram", **wiring.NGRAM_PROMPT_LOOKUP}


def _ngram_variants() -> list[Variant]:
    spec = lambda k: {**NGRAM_SPEC, "num_speculative_tokens": k}  # noqa: E731
    out = [Variant(f"ngram-fixed-{k}", "fixed", spec(k), gamma=k)
           for k in range(1, MAX_GAMMA + 1)]
    # The defaults: gamma 0..4; on vspec's worker a gamma-0 step skips the
    # n-gram search (gamma0_mode auto -> lazy, nothing to catch up).
    out.append(Variant("ngram-online", "online", spec(MAX_GAMMA), vspec={"policy": "online"}))
    # Target-only steps inside an n-gram vspec server: what gamma 0 costs there.
    out.append(Variant("ngram-fixed-0", "vspec-fixed", spec(MAX_GAMMA),
                       vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0}))
    return out


def all_variants(drafters: dict[str, Path | None],
                 static_table: list[list[int]] = DEFAULT_STATIC_TABLE,
                 latency_profiles: dict[str, Path] | None = None) -> dict[str, Variant]:
    """Every variant the available drafters allow, by name, target-only first
    (the ngram-* variants need no drafter and are always there).
    `drafters` maps a vLLM method (a key of METHOD_PREFIXES) to its model path;
    `latency_profiles` a method to its latency profile (the `profile` policy's
    variant exists only with one)."""
    variants = [Variant("target", "target")]
    for method, model in drafters.items():
        if model is not None:
            variants += _method_variants(method, model, static_table,
                                         (latency_profiles or {}).get(method))
    variants += _ngram_variants()
    return {v.name: v for v in variants}


# What `make bench` compares when --variants is not given (online-0 and the
# eagle variants are opt-in: each variant costs a server start-up).
DEFAULT_VARIANTS = ("target", "fixed-1", "fixed-2", "fixed-3", "fixed-4",
                    "static-table", "online")


def select(available: dict[str, Variant], names: list[str]) -> list[Variant]:
    """The named variants, in the order given; unknown names fail listing the known ones."""
    unknown = [n for n in names if n not in available]
    if unknown:
        raise ValueError(f"--variants {','.join(unknown)!s} is not available: "
                         f"choose from {', '.join(available)}")
    # Ratios are to target-only measured in the same run, so it always runs first.
    return [available["target"]] + [available[n] for n in names if n != "target"]

