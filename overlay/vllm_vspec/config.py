"""VSpecConfig: the one source of truth for every vspec knob and its default.

The docstring under each field is its documentation: `vllm-vspec serve --help`,
the TOML preset schema and docs/configuration.md are generated from it (and a
test checks they agree). Users set these keys in vLLM's
`--additional-config '{"vspec": {...}}'` or in a preset's `[vspec]` table.

This module imports nothing from vLLM: it is the host-agnostic core.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import functools
import inspect
import textwrap
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping

# Each choice is listed once, as the Literal type of its field; the tuples the
# validation, --help and the docs read are derived from it.
Policy = Literal["auto", "model", "online", "profile", "fixed", "cycle", "budget"]
AcceptanceRuleName = Literal["strict", "relaxed_topk", "margin"]
Gamma0Mode = Literal["auto", "sync", "lazy", "sticky"]
WarmupReturn = Literal["best", "incumbent"]
LmHeadQuantization = Literal["none", "w8a16", "w8a8"]
POLICIES = typing.get_args(Policy)
ACCEPTANCE_RULES = typing.get_args(AcceptanceRuleName)
GAMMA0_MODES = typing.get_args(Gamma0Mode)
WARMUP_RETURNS = typing.get_args(WarmupReturn)
LM_HEAD_QUANTIZATIONS = typing.get_args(LmHeadQuantization)

# Seed options deliberately not offered, with the reason from_dict gives.
NOT_OFFERED = {
    "target_active_vocab_ids": (
        "not offered: restricting the target's LM head changes its argmax whenever "
        "the true argmax is outside the list, so outputs would stop being target-only "
        "outputs (lossy), and checking that the restricted argmax is the global one "
        "needs the full head anyway; use draft_active_vocab_ids (lossless)"),
}

# FIA attention on Ascend verifies at most 16 query tokens per request per step.
MAX_VERIFY_WIDTH = 16
# Widest draft tree offered: beyond it the tree's nodes crowd out depth
# within any K a host verifies in one forward (gamma * width <= K).
MAX_TREE_WIDTH = 8
# Hosts whose attention takes draft-tree masks (hosts/vllm/tree/attention.py).
TREE_PLATFORMS = ("cpu",)

# Why draft trees (tree_width > 1) cannot run, in one table: (fact, refused
# when, why, formatted with the fact's value); the first row a fact meets
# is the reason given. Each check asks tree_refusal with the facts it knows:
# the settings (VSpecConfig.validate: policy, entropy stop), the engine at
# start-up (hosts/wiring.py: method, device, scheduling) and the drafter at
# the runner's start-up (hosts/vllm/tree/proposer.py: its options). The
# reasons are docs/design/eagle-tree.md 4.4.5's, plus the vspec options that read
# linear drafts.
TREE_REFUSALS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("method", lambda m: m == "ngram",
     "only with speculative method eagle (EAGLE-1), not with method ngram (trees are built "
     "from EAGLE-1 draft beams; method ngram drafts from the request's own tokens, with no "
     "draft model)"),
    # EAGLE-3, MTP, DFlash: the state fed to the next depth is not the one
    # the LM head reads (or comes from combined target layers).
    ("method", lambda m: m != "eagle", "only with speculative method eagle (EAGLE-1), not {}"),
    ("policy", lambda p: p == "budget",
     "not with policy 'budget' (it admits prefixes of linear drafts)"),
    ("device", lambda d: d not in TREE_PLATFORMS,
     "only on the CPU host (this engine: {}); tree attention masks are not built for "
     "CUDA or Ascend attention yet"),
    ("async_scheduling", bool,
     "not with async scheduling (tree parents do not travel with the draft placeholders yet)"),
    ("entropy_stop", bool, "not with entropy_stop (the stop cuts drafts at linear positions)"),
    ("traces", bool, "not with the diagnostics traces (they record linear drafts)"),
    ("parallel_drafting", bool, "not with parallel drafting"),
    ("multimodal", bool, "not with a multimodal drafter"),
    ("mrope", bool, "not with an M-RoPE drafter"),
    ("partial_logits", bool, "not with local argmax reduction or a heterogeneous draft "
     "vocabulary (the beam ranks full draft logits)"),
)


def tree_refusal(**facts: Any) -> str | None:
    """The first TREE_REFUSALS reason the given facts (name -> value) meet,
    or None."""
    for fact, refused, why in TREE_REFUSALS:
        if fact in facts and refused(facts[fact]):
            return why.format(facts[fact])
    return None


def ranged(default: Any, lo: float, hi: float | None = None, *, lo_open: bool = False) -> Any:
    """A dataclass field whose value must lie in [lo, hi] ((lo, hi] with
    `lo_open`; no upper bound when `hi` is None; unset (None) passes).
    `check_ranges` enforces it: the range lives on the field it bounds."""
    return dataclasses.field(default=default, metadata={"range": (lo, hi, lo_open)})


def check_ranges(obj: Any) -> None:
    """Raise VSpecConfigError (key, value, allowed) for the first field of the
    dataclass `obj` outside the range declared with `ranged`."""
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if "range" not in f.metadata or value is None:
            continue
        lo, hi, lo_open = f.metadata["range"]
        if float in (hints[f.name], *typing.get_args(hints[f.name])):
            _check_float(f.name, value, lo, hi, lo_open=lo_open)
        else:
            _check_int(f.name, value, lo, hi)


class VSpecConfigError(ValueError):
    """A vspec setting is unknown or out of range. The message names the key,
    the value given and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"vspec.{key}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class VSpecConfig:
    """Settings of vSpec Adaptive (dynamic gamma) and of the acceptance rules."""

    enabled: bool = True
    """Turn dynamic gamma on. When false the engine drafts
    `num_speculative_tokens` every step, exactly as stock vLLM does. A launch
    that does not set it gets its environment's default: true, unless
    `vllm-vspec manage disable` stored false there."""

    policy: Policy = "auto"
    """How gamma is chosen each step. `auto` (the default): `model`, or
    `online` where the settings need it (`tree_width` above 1 or
    `entropy_stop`). `model`: every step the gamma that maximises
    B * E(g) / T(B, g), from per-position acceptance posteriors and one
    step-cost model fitted online on every step, exploring by Thompson
    sampling; needs no calibration; linear drafts. `online`: a UCB bandit
    over gamma arms per batch-size bucket, rewarded by measured committed
    tokens per second; needs no calibration. `profile`: goodput argmax from an offline latency profile
    (`profile_path`) and online per-position acceptance. `fixed`: always
    `fixed_gamma`. `cycle`: diagnostics, not speed: a different gamma every
    step (max_gamma, min_gamma, max_gamma-1, ...), to validate exactness and
    every verify width on a new host. `budget` (EXPERIMENTAL, synchronous
    scheduling, linear drafts): per-request verify budgets: every request
    drafts the step's depth, and the target verifies, per request, the
    prefix of its draft whose slots win a global ranking by survival
    probability (the calibrated draft probability of each drafted token,
    multiplied along the draft), as many slots as maximise expected
    committed tokens per second under a step-cost model fitted online from
    the engine's own steps (docs/design/verify-budget.md). Requests get different
    lengths in one step; outputs stay exact under strict acceptance."""

    min_gamma: int = 0
    """Smallest gamma the controller may choose. 0 (the default) lets it turn
    speculation off for a step where drafting does not pay, e.g. prompts the
    drafter cannot predict or large batches (outputs stay exact); what such a
    step costs depends on `gamma0_mode`. 1 keeps speculating every step."""

    max_gamma: int | None = None
    """Largest gamma the controller may choose. Defaults to the speculative
    config's `num_speculative_tokens`, which also sizes buffers and graphs, so
    it may not exceed that."""

    fixed_gamma: int | None = None
    """Gamma used by the `fixed` policy. Defaults to `max_gamma`."""

    control_interval: int = ranged(4, 1)
    """Dwell: the controller reconsiders gamma once every this many decode
    steps of a batch-size bucket."""

    max_gamma_step: int = ranged(4, 1)
    """Largest change of gamma in one decision (after warm-up)."""

    hysteresis: float = ranged(0.05, 0.0, 1.0)
    """Switch only when the best arm beats the current one by this fraction
    (at most 1: an arm twice as fast)."""

    reward_prefill_steps: bool = False
    """Decide and reward the steps that carry a prefill (a new or resumed
    prompt) like decode steps. Off: such a step keeps the last decided gamma
    and is not reported, so rewards are decode-step throughput. On: rewards
    are throughput over all steps, prefill work included."""

    ewma_weight: float = ranged(0.1, 0.0, 1.0, lo_open=True)
    """Weight of the newest observation in the per-position acceptance EWMA."""

    min_observations: int = ranged(4, 0)
    """`profile` policy: drafted tokens at a position before its acceptance
    estimate replaces the prior."""

    online_window: int = ranged(64, 1)
    """`online` policy: steps of history per (bucket, gamma) arm; older
    rewards slide out so the policy follows phase changes."""

    online_probe_interval: int = ranged(16, 1)
    """`online` policy: stable steps in a bucket after which the current
    arm's neighbours are re-checked: one known only from a seed, one whose
    estimate is within a tenth of the best, one not measured for two
    `online_window`s of the bucket's steps (its old samples are replaced),
    and the arm above when it could win were the one draft position the
    current gamma cannot see always accepted. Smaller notices a change sooner
    and spends more steps probing."""

    online_exploration: float = ranged(0.01, 0.0)
    """`online` policy: UCB exploration constant c in
    `R(g) + c * R_max * sqrt(2 ln(N+1) / n(g))`."""

    online_warmup_samples: int = ranged(2, 0)
    """`online` policy: stable steps spent on each arm during the warm-up
    sweep of a bucket no nearby bucket can seed (downwards from max_gamma, or
    upwards from min_gamma when the measured buckets are smaller; it stops
    past the best arm) before UCB takes over."""

    online_warmup_return: WarmupReturn = "best"
    """`online` policy: after warm-up, start from the best measured arm
    (`best`) or return to the arm used before warm-up (`incumbent`)."""

    latency_calibration: bool = True
    """`profile` policy: scale predicted step latency by an online EWMA of
    measured/predicted latency per batch-size bucket and gamma."""

    latency_ewma_weight: float = ranged(0.2, 0.0, 1.0, lo_open=True)
    """Weight of the newest sample in the latency calibration EWMA."""

    profile_path: str | None = None
    """`profile` policy: path of a latency profile JSON (see profiles/)."""

    model_memory_steps: int = ranged(64, 2)
    """`model` policy: steps a position's acceptance posterior remembers
    (each step that judges the position fades its older judgements by
    1 - 1/memory): at any batch size, about the time a batch's requests
    take to turn over; a larger batch brings more judgements a step."""

    model_cost_window: int = ranged(1024, 2)
    """`model` and `budget` policies: steps the online step-cost model's fit
    describes (older steps fade by 1 - 1/window a step)."""

    model_seed: int = ranged(0, 0)
    """`model` policy: seed of its Thompson draws (the same seed on the same
    steps repeats the same decisions)."""

    model_thompson: bool = True
    """`model` policy: draw the acceptance rates from their posteriors at
    each decision (Thompson sampling: explores exactly as far as the
    evidence is unsure; step costs are always the fit's means). Off: the
    posterior means (no exploration: a drafter that turns good while gamma
    is 0 is never noticed)."""

    model_state_dir: str = "auto"
    """`model` policy: where what it learned (acceptance posteriors and the
    step-cost model) is kept between runs, so that a restarted server
    starts warm instead of sweeping and re-learning: one JSON file per
    (host, target, drafter, method, K), read at start-up when its key
    matches (a mismatched or corrupt file is ignored with one log line),
    written while it runs and at shutdown. `auto`: the directory
    $VLLM_VSPEC_STATE_DIR names, else $XDG_CACHE_HOME/vllm-vspec/state
    (~/.cache/vllm-vspec/state). `off`: no warm start. Anything else: that
    directory. `vllm-vspec doctor` lists the files; delete one (or run
    `vllm-vspec doctor --forget`) to start cold. Other policies keep no
    state."""

    verify_budget_cold_start_steps: int = ranged(2, 1)
    """`budget` policy: steps at each draft depth (max_gamma down to
    min_gamma) of the cold-start sweep that runs once, before the pooled
    step-cost model is used, so that verified drafts and draft passes vary."""

    verify_budget_probe_interval: int = ranged(64, 1)
    """`budget` policy: steps in a row at draft depth 0 (nothing drafted, so
    nothing learned about acceptance) after which one step drafts depth 1."""

    verify_budget_request_smoothing: float = ranged(0.3, 0.0, 1.0, lo_open=True)
    """`budget` policy: weight of a step's calibrated acceptance in each
    request's smoothed acceptance, which the choice of the draft depth reads."""

    verify_budget_calibration_window: int = ranged(8192, 16)
    """`budget` policy: judged draft slots that the calibration of draft
    probabilities to acceptance probabilities describes (older ones fade out)."""

    gamma0_mode: Gamma0Mode = "auto"
    """What a gamma-0 (target-only) step does to the drafter when `min_gamma`
    is 0. `sync`: the drafter still reads the step's new tokens (drafting
    nothing), so its KV cache stays aligned; a gamma-0 step then costs about
    what a gamma-1 step does (measured on the CPU host). `lazy`: no draft
    forward at all; when speculation resumes, the drafter first catches up on
    the tokens it skipped (prefill-shaped passes within the token budget),
    then drafts exactly as it would have (synchronous scheduling). With
    method eagle or eagle3 (linear drafts) a skipped step keeps the target
    hidden states of its tokens, which the head's catch-up reads
    (`gamma0_retained_tokens` bounds them). With method ngram (no draft model, no drafter state) `lazy`
    skips the n-gram search and has nothing to catch up: a gamma-0 step is a
    target-only step. `sticky`: no draft forward and no catch-up; gamma stays 0
    until every request in flight then (and admitted meanwhile) has finished.
    `auto`: `lazy` where it applies (method draft_model, ngram, eagle or
    eagle3 with tree_width 1; synchronous scheduling; vspec's worker), else
    `sync`. `lazy` and `sticky` need the vspec worker (`worker_cls`)."""

    gamma0_retained_tokens: int = ranged(8192, 1)
    """`gamma0_mode` lazy with method eagle or eagle3: the most tokens whose
    target hidden states skipped steps keep for the head's catch-up (a pool
    of tokens x width x dtype bytes, outside vLLM's KV cache, allocated at
    the first skipped step: the width is the target's hidden size, 3x for
    eagle3; 8192 tokens of a 4096-wide bf16 target are 64 MiB). A skipped
    step whose tokens would not fit runs sync instead: the head first
    catches up on what its requests kept, which frees it (the worker logs
    the 1st, 2nd, 4th, ... such step: a sign to raise this)."""

    tree_width: int = ranged(1, 1, MAX_TREE_WIDTH)
    """EXPERIMENTAL, CPU host only: the widest EAGLE draft tree the controller
    may choose. A tree of depth gamma and width W keeps the W best draft
    candidates at every depth (a beam) and the target verifies all gamma*W
    nodes in one forward under a tree attention mask; strict greedy accepts
    the longest root path the target agrees with, so outputs stay exact.
    The controller then picks (gamma, width) per step within gamma*W <=
    `num_speculative_tokens`; width 1 is linear EAGLE. 1 (the default):
    linear drafts only. Above 1 only with method `eagle` (EAGLE-1), vspec's
    worker on the CPU host, synchronous scheduling, no entropy stop or draft
    traces; steps whose batch has a sampled request or per-position logits
    processing draft linearly (docs/design/eagle-tree.md). A lossy `acceptance`
    rule judges each tree node as the draft position of its depth."""

    min_tree_width: int = ranged(1, 1, MAX_TREE_WIDTH)
    """The narrowest tree the controller may choose on steps where trees are
    allowed (at most `tree_width`); equal to `tree_width` pins the width."""

    entropy_stop: bool = False
    """Per request, cut the current draft at the first position whose top-k
    draft entropy H satisfies `entropy_scale * H > entropy_threshold ** 2`.
    Only with the `online` policy."""

    entropy_topk: int = ranged(8, 2)
    """Entropy stop: number of top draft probabilities the entropy is taken over."""

    entropy_threshold: float = ranged(1.0, 0.0)
    """Entropy stop: threshold tau (compared as tau squared)."""

    entropy_scale: float = ranged(1.0, 0.0, lo_open=True)
    """Entropy stop: scale s applied to the entropy."""

    acceptance: AcceptanceRuleName = "strict"
    """Greedy acceptance rule. `strict`: accept a draft token iff it is the
    target's argmax (lossless). `relaxed_topk` and `margin` are LOSSY: outputs
    may differ from target-only decoding. Sampled requests (temperature > 0)
    always use vLLM's standard rejection sampling."""

    relaxed_topk: int = ranged(2, 1)
    """`relaxed_topk` rule: accept a draft token within the target's top-K."""

    relaxed_after_tokens: int = ranged(16, 0)
    """`relaxed_topk` rule: strict acceptance until a request has generated
    this many tokens (a strict prefix)."""

    margin: float = ranged(0.0, 0.0)
    """`margin` rule: accept when `max_logit - logit[draft] <= margin`."""

    margin_from_position: int = ranged(0, 0)
    """`margin` rule: relax only at draft positions >= this (0-based)."""

    margin_after_tokens: int = ranged(16, 0)
    """`margin` rule: strict acceptance until a request has generated this
    many tokens."""

    protected_token_ids: tuple[int, ...] = ()
    """Token ids never accepted by relaxation (e.g. EOS, digits); they need an
    exact match."""

    trace_path: str | None = None
    """Write one JSON line per controller decision (step, batch size, gamma,
    tokens, interval, reason) to this file."""

    draft_active_vocab_ids: str | None = None
    """Active vocabulary of the drafter: path of an ids file written by
    `vllm-vspec trace active-vocab`. The drafter's greedy LM head then scores only
    these token ids and maps its argmax back to the full id. Outputs stay
    exact under strict acceptance (the target verifies with its full head);
    the restriction only changes which tokens can be drafted. Used in steps
    whose whole batch is pure greedy (temperature 0, no logprobs, no
    penalties); other steps draft with the full head. eagle and draft_model,
    with vspec's worker or on vLLM-Ascend (there not yet run on NPU; only with
    ascend_draft_full_graph false)."""

    draft_active_vocab_size: int = 0
    """Use the first N ids of `draft_active_vocab_ids` (special tokens come
    first, then ids by falling frequency). 0: every id in the file."""

    draft_lm_head_quantization: LmHeadQuantization = "none"
    """The drafter's greedy LM head in int8: `w8a16` int8 weights with float
    activations, `w8a8` int8 weights and activations (per-token scales, int32
    accumulation). Symmetric scales per vocabulary row and per block of
    `draft_lm_head_quant_group_size` hidden channels. Changes only which
    tokens are drafted: outputs stay exact under strict acceptance. eagle
    and draft_model, with vspec's worker or on vLLM-Ascend (torch_npu's int8
    matmuls, float16/bfloat16 models; not yet run on NPU)."""

    draft_lm_head_quant_group_size: int = 0
    """Hidden channels per quantization block of the draft LM head (must
    divide the hidden size; w8a16 on NPU: a multiple of 32). 0: one block per
    row (per-channel scales)."""

    draft_trace_path: str | None = None
    """Diagnostics (costs throughput): one JSON line per drafter step with
    every request's draft tokens and the drafter's wall time
    (docs/design/draft-head.md)."""

    draft_io_trace_dir: str | None = None
    """Diagnostics (costs throughput): one safetensors file per drafter step
    with every draft forward pass's inputs and output hidden states."""

    target_hidden_trace_dir: str | None = None
    """Diagnostics (costs throughput): one safetensors file per drafter step
    with the target hidden states, token ids and positions the drafter got."""

    target_argmax_trace_path: str | None = None
    """Diagnostics (costs throughput): one JSON line per drafter step with
    the tokens the target committed per request (its argmax for greedy
    requests); `vllm-vspec trace active-vocab` builds an active vocabulary from it."""

    refill_batch: int = ranged(0, 0)
    """Refill holding: while a batch is decoding, admit new requests only once
    this many wait (or as many as there are free slots), so their prefills
    share one step instead of each slowing its own decode step. 0 (the
    default) turns it off. Preempted requests and an idle engine are never
    held."""

    refill_max_wait_steps: int = ranged(16, 1)
    """Refill holding: a waiting request is admitted after at most this many
    scheduler steps, however few others wait."""

    ascend_draft_full_graph: bool = True
    """vLLM-Ascend (not yet run on NPU): keep the draft model's full ACL
    graph under dynamic gamma, as stock vLLM-Ascend keeps its one K-step
    graph: one graph captured per gamma 1..K through the host's capture
    path, each sampling the K-wide batch descriptor's rows, and each
    gamma's replay reading its own parameters (0.23: the host's draft
    graph-parameter store keyed by (gamma, token count); 0.30: FIA's
    graphs hold their own, other backends' store keyed as on 0.23;
    docs/ascend.md, "ACL graphs"). false: the draft model runs eagerly
    while vspec drives it (the target keeps its graphs), which costs every
    draft pass its launch overhead. Not with `draft_active_vocab_ids` (set
    this false for it)."""

    ascend_draft_graph_budget_mib: float = ranged(1024.0, 0.0)
    """vLLM-Ascend with `ascend_draft_full_graph` (not yet run on NPU):
    the most device memory, in MiB, the draft graphs of gammas below K may
    take beyond the K-step graphs stock captures, as estimated at capture
    from the capture sizes and the draft's attention layers (an estimate,
    not measured: docs/ascend.md, "What the per-gamma draft graphs cost").
    Gammas are admitted from the smallest up while they fit; a skipped gamma
    gets no graph, a start-up line names it, and a step at it drafts with
    the next captured gamma's graph (at worst K's) and keeps its first
    gamma drafts. 0 captures only K's graph."""

    ascend_pad_verify_width: bool = True
    """vLLM-Ascend only (not yet run on NPU): a decode step whose batch fits
    the target's full decode ACL graph (batch x (1 + K) tokens at most
    max_cudagraph_capture_size) verifies K draft slots a request, the gamma
    drafts then invalid ones (-1) the verifier rejects, so that the target
    replays that graph: vLLM-Ascend treats a step as uniform decode only at
    1 + K tokens a request, and a step with gamma < K would otherwise run
    piecewise or eagerly (docs/ascend.md, "ACL graphs"). Outputs stay exact.
    Since such a step verifies 1 + K whatever its gamma, a step whose drafts
    will be verified padded drafts K and is not the policy's to decide (a
    smaller gamma would save only graphed draft passes); the policy decides
    the steps past the padded range. false: every step verifies its gamma
    and the policy decides every step. No effect without full decode graphs
    (cudagraph_mode FULL_DECODE_ONLY or FULL_AND_PIECEWISE)."""

    ascend_verify_width_graphs: bool = False
    """vLLM-Ascend 0.23 only (built, off by default; not yet run on NPU): the
    target keeps a FULL decode ACL graph per verify width 1 + gamma (gamma
    0..K), each captured through the host's capture path with its own graph
    parameters and replayed for a decode step whose requests all verify that
    width, so no step is padded (`ascend_pad_verify_width` then pads
    nothing) and the policy decides every step. Only with cudagraph_mode
    FULL_DECODE_ONLY or FULL_AND_PIECEWISE, data parallel size 1, a model
    without MLA, no encoder graphs and no sequence parallelism (flashcomm1);
    elsewhere the host's runner and the padding stay, with one start-up line
    naming why. Costs up to K more target decode graphs per capture size,
    admitted within `ascend_width_graph_budget_mib`. After a step verifying
    1 + g < 1 + K the draft model replays gamma g's draft graph, captured
    at that width, when the step's gamma is 1 to g; any other gamma there
    drafts PIECEWISE or eagerly. On vLLM-Ascend 0.30 the key has no effect
    (docs/design/ascend-per-width-target-graphs.md)."""

    ascend_width_graph_budget_mib: float = ranged(1024.0, 0.0)
    """vLLM-Ascend 0.23 with `ascend_verify_width_graphs` (not yet run on
    NPU): the most device memory, in MiB, the FULL target decode graphs of
    verify widths below 1 + K may take beyond the graphs stock captures, as
    estimated at start-up from the capture sizes and the target's decoder
    layers (an estimate, not measured: docs/ascend.md, "What the per-width
    target graphs cost"). Widths are admitted from width 1 (gamma 0) up
    while they fit; a decode step at a skipped width is padded with invalid
    drafts to 1 + K, whose graphs stock captures, and one start-up line
    names the skipped widths. A budget that fits no width keeps the host's
    runner and the padding, as without `ascend_verify_width_graphs`."""

    # ------------------------------------------------------------------ build
    def __post_init__(self) -> None:
        if self.policy == "auto":
            # Resolved before validation: a bad value leaves `model`, and
            # validate() then names that value.
            needs_online = (isinstance(self.tree_width, int) and self.tree_width > 1
                            or self.entropy_stop is True)
            object.__setattr__(self, "policy", "online" if needs_online else "model")

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any] | None,
                  num_speculative_tokens: int | None = None) -> "VSpecConfig":
        """Build and validate from a user mapping (additional_config["vspec"],
        a TOML table, CLI overrides). Unknown keys and bad values raise
        VSpecConfigError naming the key, the value and what is allowed."""
        raw = dict(raw or {})
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in raw.items():
            if key in NOT_OFFERED:
                raise VSpecConfigError(key, value, NOT_OFFERED[key])
            if key not in known:
                guess = difflib.get_close_matches(key, known, n=1)
                hint = f"did you mean {guess[0]!r}? " if guess else ""
                raise VSpecConfigError(key, value, f"unknown key; {hint}known keys: "
                                       + ", ".join(sorted(known)))
            kwargs[key] = _coerce(key, value, _field_types()[key])
        cfg = cls(**kwargs)
        cfg.validate(num_speculative_tokens)
        if cfg.enabled:
            cfg.check_files()
        return cfg

    def check_files(self) -> None:
        """What the engine would otherwise find only after loading the
        models: input files readable and well-formed (`profile_path`,
        `draft_active_vocab_ids`), output paths writable (`trace_path` and
        the diagnostics dumps). VSpecConfigError names the key, the value and
        the fix. `from_dict` runs it (user settings), for enabled settings."""
        if self.profile_path:
            from vllm_vspec.core.latency import ProfileError, load_profile  # numpy: lazily

            try:
                load_profile(self.profile_path)
            except OSError as exc:
                raise VSpecConfigError("profile_path", self.profile_path,
                                       f"a readable latency profile JSON ({exc.strerror}); "
                                       "write one with `vllm-vspec profile collect` or "
                                       "`vllm-vspec profile fit`, or use policy 'online'") from None
            except ProfileError as exc:
                what = (exc.allowed if exc.key == "<file>" else
                        f"{exc.key}={exc.value!r} must be {exc.allowed}")
                raise VSpecConfigError("profile_path", self.profile_path,
                                       f"a latency profile JSON file ({what}); write one with "
                                       "`vllm-vspec profile collect` or `vllm-vspec profile fit`"
                                       ) from None
        if self.draft_active_vocab_ids:
            from vllm_vspec.core.active_vocab import check_file

            check_file(self.draft_active_vocab_ids, self.draft_active_vocab_size)
        for key, is_dir in OUTPUT_PATHS:
            if getattr(self, key):
                _check_writable(key, getattr(self, key), is_dir)

    def with_max_gamma(self, num_speculative_tokens: int,
                       max_verify_width: int | None = None) -> "VSpecConfig":
        """Resolve `max_gamma` / `fixed_gamma` defaults against the host's K."""
        max_g = self.max_gamma if self.max_gamma is not None else num_speculative_tokens
        fixed = self.fixed_gamma if self.fixed_gamma is not None else max_g
        cfg = dataclasses.replace(self, max_gamma=max_g, fixed_gamma=fixed)
        cfg.validate(num_speculative_tokens, max_verify_width)
        return cfg

    def validate(self, num_speculative_tokens: int | None = None,
                 max_verify_width: int | None = None) -> None:
        """Check every field. `num_speculative_tokens` (K), when known, bounds
        the gammas; `max_verify_width` is the host's limit on 1 + K, given only
        where one is real (wiring.VERIFY_WIDTH_LIMITS: FIA on Ascend)."""
        k = num_speculative_tokens
        if k is not None:
            top = None if max_verify_width is None else max_verify_width - 1
            _check_int("num_speculative_tokens", k, 1, top,
                       why="" if top is None else
                       f"1 + gamma <= {max_verify_width}, this host's verify width")
        hi = self.max_gamma if self.max_gamma is not None else k
        _check_int("min_gamma", self.min_gamma, 0, hi)
        if self.max_gamma is not None:
            _check_int("max_gamma", self.max_gamma, max(self.min_gamma, 1), k,
                       why="at least min_gamma and 1, at most num_speculative_tokens")
        if self.fixed_gamma is not None:
            _check_int("fixed_gamma", self.fixed_gamma, 0, hi)
        _check_choice("policy", self.policy, POLICIES)
        _check_choice("acceptance", self.acceptance, ACCEPTANCE_RULES)
        _check_choice("gamma0_mode", self.gamma0_mode, GAMMA0_MODES)
        _check_choice("online_warmup_return", self.online_warmup_return, WARMUP_RETURNS)
        check_ranges(self)  # the ranges declared on the fields
        for tid in self.protected_token_ids:
            if isinstance(tid, bool) or not isinstance(tid, int) or tid < 0:
                raise VSpecConfigError("protected_token_ids", self.protected_token_ids,
                                       "a list of non-negative token ids")
        if self.policy == "profile" and not self.profile_path:
            raise VSpecConfigError("profile_path", self.profile_path,
                                   "a profile JSON path when policy='profile' "
                                   "(or use policy='online', which needs none)")
        if self.min_tree_width > self.tree_width:
            raise VSpecConfigError("min_tree_width", self.min_tree_width,
                                   f"at most tree_width ({self.tree_width})")
        if k is not None and self.tree_width > k:
            raise VSpecConfigError("tree_width", self.tree_width,
                                   f"at most num_speculative_tokens ({k}): a tree of depth 1 "
                                   "and width W drafts W nodes, and gamma * width <= "
                                   "num_speculative_tokens")
        refused = self.tree_width > 1 and tree_refusal(policy=self.policy,
                                                       entropy_stop=self.entropy_stop)
        if refused:
            raise VSpecConfigError("tree_width", self.tree_width,
                                   refused + "; turn one of them off")
        if self.policy == "budget" and self.gamma0_mode == "sticky" and self.min_gamma == 0:
            raise VSpecConfigError(
                "gamma0_mode", self.gamma0_mode,
                "'auto', 'sync' or 'lazy' with policy 'budget' ('sticky' would hold draft "
                "depth 0 until the batch drains; the budget re-measures depth 1 every "
                "verify_budget_probe_interval steps)")
        if self.entropy_stop and self.policy != "online":
            raise VSpecConfigError("entropy_stop", self.entropy_stop,
                                   "true only with policy='online'")
        _check_choice("draft_lm_head_quantization", self.draft_lm_head_quantization,
                      LM_HEAD_QUANTIZATIONS)
        _check_int("draft_lm_head_quant_group_size", self.draft_lm_head_quant_group_size, 0)
        _check_int("draft_active_vocab_size", self.draft_active_vocab_size, 0)
        if self.draft_active_vocab_size and not self.draft_active_vocab_ids:
            raise VSpecConfigError("draft_active_vocab_size", self.draft_active_vocab_size,
                                   "0 unless draft_active_vocab_ids names an ids file")

    @property
    def drafter_skips_gamma0(self) -> bool:
        """True when a gamma-0 step runs no draft pass (gamma0_mode lazy or
        sticky, as wiring.resolve resolves auto): the drafter then misses
        that step's tokens, prompts included."""
        return self.gamma0_mode in ("lazy", "sticky")

    @property
    def lossless(self) -> bool:
        """True when greedy outputs are token-identical to target-only."""
        return self.acceptance == "strict"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["protected_token_ids"] = list(self.protected_token_ids)
        return d


# Methods whose gamma-0 step can skip the drafter (`lazy`). draft_model keeps
# draft KV, so its drafter catches up on the skipped tokens before it drafts
# again (CATCH_UP_METHODS); ngram keeps no state (each pass searches the
# request's token history), so skipping it leaves nothing behind.
# EAGLE-type heads read the target's hidden states, which a skipped step
# keeps for their catch-up (HEAD_CATCH_UP_METHODS; linear drafts only: a
# tree step's tokens are not consecutive positions).
LAZY_GAMMA0_METHODS = ("draft_model", "ngram", "eagle", "eagle3")
CATCH_UP_METHODS = ("draft_model",)
HEAD_CATCH_UP_METHODS = ("eagle", "eagle3")


def resolve_gamma0_mode(cfg: VSpecConfig, method: str, async_scheduling: bool,
                        skips_draft_pass: bool) -> str:
    """The gamma-0 mode an engine runs: `auto` resolved, `lazy` checked
    against the engine (VSpecConfigError names the fix). `skips_draft_pass`:
    the engine's model runner is vspec's, which can skip a draft forward.
    Irrelevant (returns `sync`) when gamma 0 is not allowed."""
    mode = cfg.gamma0_mode
    if cfg.min_gamma > 0:
        return "sync"
    lazy_ok = (method in LAZY_GAMMA0_METHODS and not async_scheduling
               and not (method in HEAD_CATCH_UP_METHODS and cfg.tree_width > 1))
    if mode == "auto":
        return "lazy" if lazy_ok and skips_draft_pass else "sync"
    if mode == "lazy" and not lazy_ok:
        raise VSpecConfigError(
            "gamma0_mode", mode, "'lazy' only with speculative method "
            f"{', '.join(LAZY_GAMMA0_METHODS)} (eagle and eagle3 with tree_width 1) under "
            f"synchronous scheduling (this engine: method {method}, tree_width "
            f"{cfg.tree_width}, {'async' if async_scheduling else 'sync'} scheduling); "
            "use 'sync' or 'auto'")
    return mode


# --------------------------------------------------------------- field docs
@functools.lru_cache(maxsize=None)
def field_docs(cls: type = VSpecConfig) -> dict[str, str]:
    """The docstring under each dataclass field, whitespace-normalised."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


@functools.lru_cache(maxsize=None)
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(VSpecConfig)


# --------------------------------------------------------------- validation
def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Accept what JSON/TOML/CLI can express; reject everything else by name."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if value is None:
        if type(None) in args:
            return None
        raise VSpecConfigError(key, value, f"a value of type {_type_name(tp)}")
    if origin is Literal:
        if value not in args:
            raise VSpecConfigError(key, value, "one of " + ", ".join(map(repr, args)))
        return value
    if type(None) in args:  # Optional[X]
        inner = [a for a in args if a is not type(None)][0]
        return _coerce(key, value, inner)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        raise VSpecConfigError(key, value, "true or false")
    if tp is int:
        if isinstance(value, bool):
            raise VSpecConfigError(key, value, "an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        raise VSpecConfigError(key, value, "an integer")
    if tp is float:
        if isinstance(value, bool):
            raise VSpecConfigError(key, value, "a number")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise VSpecConfigError(key, value, "a number") from None
    if tp is str:
        if isinstance(value, str):
            return value
        raise VSpecConfigError(key, value, "a string")
    if origin is tuple:
        if isinstance(value, str):
            value = [v for v in value.replace(",", " ").split() if v]
        if not isinstance(value, (list, tuple)):
            raise VSpecConfigError(key, value, "a list of integers")
        return tuple(_coerce(key, v, int) for v in value)
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def _check_int(key: str, v: Any, lo: int, hi: int | None = None, why: str = "") -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise VSpecConfigError(key, v, f"an integer {rng}" + (f" ({why})" if why else ""))


def _check_float(key: str, v: Any, lo: float, hi: float | None, lo_open: bool = False) -> None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool)
    ok = ok and (v > lo if lo_open else v >= lo) and (hi is None or v <= hi)
    if not ok:
        left = "(" if lo_open else "["
        rng = f"in {left}{lo}, {hi}]" if hi is not None else (f"> {lo}" if lo_open else f">= {lo}")
        raise VSpecConfigError(key, v, f"a number {rng}")


# Keys naming what the engine writes: (key, a directory of files?).
OUTPUT_PATHS = (("trace_path", False), ("draft_trace_path", False),
                ("target_argmax_trace_path", False), ("draft_io_trace_dir", True),
                ("target_hidden_trace_dir", True))


def _check_writable(key: str, value: str, is_dir: bool) -> None:
    """`value` can be written as the writers write it (missing parent
    directories created): an existing path must be a writable file (or
    directory), else its nearest existing ancestor a directory a file can be
    created in (tried with a temporary file, removed at once: permission
    bits alone pass root on /proc)."""
    import os
    import tempfile
    from pathlib import Path

    path = Path(value)
    what = "directory" if is_dir else "file"
    fix = f"a writable {what} path (its missing parent directories are created)"
    if path.exists():
        if path.is_dir() != is_dir:
            raise VSpecConfigError(key, value, f"{fix}; this is a "
                                   f"{'directory' if path.is_dir() else 'file'}")
        probe_dir = path if is_dir else None
        if not is_dir:
            try:
                with open(path, "a"):
                    return
            except OSError as exc:
                raise VSpecConfigError(key, value, f"{fix} ({exc.strerror})") from None
    else:
        probe_dir = path.parent if not is_dir else path
        while not probe_dir.exists() and probe_dir != probe_dir.parent:
            probe_dir = probe_dir.parent
        if not probe_dir.is_dir():
            raise VSpecConfigError(key, value, f"{fix}; {probe_dir} is not a directory")
    try:
        fd, name = tempfile.mkstemp(prefix=".vspec-probe-", dir=probe_dir)
    except OSError as exc:
        raise VSpecConfigError(key, value, f"{fix}; cannot create files in {probe_dir} "
                               f"({exc.strerror})") from None
    os.close(fd)
    os.unlink(name)


def _check_choice(key: str, v: Any, choices: tuple[str, ...]) -> None:
    if v not in choices:
        raise VSpecConfigError(key, v, "one of " + ", ".join(map(repr, choices)))


__all__ = ["VSpecConfig", "VSpecConfigError", "field_docs",
           "POLICIES", "ACCEPTANCE_RULES", "MAX_VERIFY_WIDTH"]
