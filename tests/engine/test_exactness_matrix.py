"""Exactness against target-only decoding, one matrix for every method.

Oracle: greedy float32 output token-identical to the bundled target's
target-only output (conftest's `reference`), whatever gamma the scheduler
asks for.

Matrix: method x gamma-0 mode x scenario.

- method: draft_model (models/tiny-draft), eagle (tiny-eagle), eagle3
  (tiny-eagle3), mtp (tiny-mimo: the bundled target with an MTP layer),
  ngram (no draft model);
- gamma-0 mode: `sync` on vLLM's own worker (vspec's scheduler only: a
  gamma-0 step still runs the drafter's first pass or the n-gram search) and
  `lazy` on vspec's worker (a gamma-0 step runs no drafter; it catches up
  before its next pass), where the method has it (not mtp); for eagle also
  lazy with a retained-state budget too small for some steps
  (`gamma0_retained_tokens` 24: those steps run sync);
- scenario: gamma changing every step (the `cycle` policy: 4, 0, 3, 1, 2,
  ... so every gamma from 0 to K, a new one each step), across preemptions
  (a KV cache smaller than the batch of 16 needs), on prefix-cache hits
  (prompts served again from the cache; 32-token blocks), at batch 1.

Beside the oracle, per engine: each step drafts exactly the gamma it asked
for (at most, for ngram), gamma-0 steps run the drafter only in sync mode,
each decision is the draft length verified next step; on vspec's worker a
step without drafts takes vLLM's plain sampler; lazy drafts equal sync
drafts step by step where the drafter has state to catch up (the catch-up
leaves it where it would have been); the draft model's passes start from
what the compiled commit op committed; the MiMo-style checkpoint's own
target-only run is the bundled target's (so `reference` is mtp's oracle
too).

Each engine runs one workload (batch 16, the first four prompts twice, one
prompt alone), is closed, and its tests read what it recorded: one engine
start per row. ngram engines run in their own process (vLLM's ngram
proposer imports numba, whose llvmlite proxy breaks vLLM's CPU kernel scan
of sys.modules for every later in-process engine); their per-step logs
come back through collective_rpc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import (DRAFT, EAGLE, MODELS, TARGET, assert_same_tokens, close_llm, counter,
                      greedy, make_llm, record_drafter_calls, runner_of)
from test_commit_hot_path import _Counting
from test_gamma0_path import SamplerCalls
from vllm_vspec.core.trace import read_trace

pytestmark = pytest.mark.engine

K = 4
MIMO = MODELS / "tiny-mimo"
SPECS = {
    "draft_model": {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": K},
    "eagle": {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K},
    "eagle3": {"method": "eagle3", "model": str(MODELS / "tiny-eagle3"),
               "num_speculative_tokens": K},
    "mtp": {"method": "mtp", "num_speculative_tokens": K},
    "ngram": {"method": "ngram", "num_speculative_tokens": K,
              "prompt_lookup_min": 2, "prompt_lookup_max": 4},
}
CYCLE = {"policy": "cycle", "min_gamma": 0}
# A KV cache the batch of 16 overflows (preemptions), prefix caching on with
# 32-token blocks: hits are whole blocks (the CPU default is 128), and for
# mtp vLLM drops the last one, so a prompt needs two.
ENGINE = dict(enable_prefix_caching=True, block_size=32, kv_cache_memory_bytes=5 << 20,
              max_model_len=256, disable_log_stats=False)


@dataclass(frozen=True)
class Row:
    method: str
    mode: str                       # gamma0_mode: sync (vLLM's worker) or lazy (vspec's)
    vspec: dict = field(default_factory=dict)  # further VSpecConfig keys
    label: str = ""

    @property
    def id(self) -> str:
        return f"{self.method}-{self.mode}{self.label}"


ROWS = [Row("draft_model", "sync"), Row("draft_model", "lazy"),
        Row("eagle", "sync"), Row("eagle", "lazy"),
        Row("eagle", "lazy", {"gamma0_retained_tokens": 24}, "-retained-24"),
        Row("eagle3", "sync"), Row("eagle3", "lazy"),
        Row("mtp", "sync"),
        Row("ngram", "sync"), Row("ngram", "lazy")]
SYNC = {r.method: r for r in ROWS if r.mode == "sync"}
COMMIT_ROW = ROWS[1]   # draft_model lazy: vspec's proposer, compiled ops


@dataclass
class Run:
    """What one engine's workload recorded."""
    batch: list                 # batch 16 (preempted)
    cached: list                # the first four prompts twice (prefix-cache hits)
    alone: list                 # one prompt at batch 1
    preemptions: float
    hits: float                 # prefix-cache hits while `cached` ran
    accepted: float
    steps: list                 # trace records (decision, drafted per request)
    calls: list                 # per drafter call: (gamma asked, drafts per row,
                                #   drafter forwards or n-gram searches)
    lag: tuple | None = None    # lazy eagle/eagle3: (aux, forced_sync, stored, capacity)
    sampler: tuple | None = None  # vspec's runner: (drafts per rejection-sampler call, plain calls)
    commits: tuple | None = None  # draft_model lazy: (ops backend, commit op calls, draft passes)


# ------------------------------------------------------ per-step drafter logs
def _in_process_log(llm) -> list:
    return record_drafter_calls(llm, lambda out, drafts, runner: (
        out.num_spec_tokens_to_schedule, drafts.tolist()))


def _ngram_record(wrapper) -> None:
    """In the engine process: log, per drafter call, the gamma asked, each
    request's draft, and whether the n-gram search ran."""
    runner = getattr(wrapper, "worker", wrapper).model_runner
    log = runner.matrix_log = []
    propose, search = runner.propose_draft_token_ids, runner.drafter.propose
    searched = []

    def counted_search(*args, **kwargs):
        searched.append(1)
        return search(*args, **kwargs)

    def counted_propose(scheduler_output, *args, **kwargs):
        searched.clear()
        drafts = propose(scheduler_output, *args, **kwargs)
        rows = [list(d) for d in drafts] if isinstance(drafts, list) else drafts.tolist()
        log.append((scheduler_output.num_spec_tokens_to_schedule, rows, len(searched)))
        return drafts

    runner.propose_draft_token_ids, runner.drafter.propose = counted_propose, counted_search


def _ngram_log(wrapper) -> list:
    return list(getattr(wrapper, "worker", wrapper).model_runner.matrix_log)


class _CountingOps:
    """A drafter's vspec ops with `commit_accepted` calls counted."""

    def __init__(self, ops) -> None:
        from vllm_vspec.kernels import ops as kernels

        self._ops, self.calls = ops, 0
        self.backend = "torch" if ops is kernels.TORCH_OPS else "compiled"

    def __getattr__(self, name):
        return getattr(self._ops, name)

    def commit_accepted(self, *args, **kwargs):
        self.calls += 1
        return self._ops.commit_accepted(*args, **kwargs)


def _count_commits(drafter) -> tuple:
    """Count vspec's commit op and the draft passes (instance attributes
    over the bound ones: counted, not changed)."""
    drafter.vspec_ops = ops = _CountingOps(drafter.vspec_ops)
    drafter.propose = passes = _Counting(drafter.propose)
    return ops, passes


# ------------------------------------------------------------ the workload
def _workload(row: Row, prompts: list[str], trace: Path) -> Run:
    import vllm.envs

    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    worker = {"worker_cls": CPU_WORKER_CLS} if row.mode == "lazy" else {}
    target = MIMO if row.method == "mtp" else TARGET
    with pytest.MonkeyPatch.context() as mp:
        if row.method == "ngram":
            vllm.envs.disable_envs_cache()
            mp.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
            mp.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # the callables above
        llm = make_llm(target, speculative_config=SPECS[row.method], **worker, **ENGINE,
                       vspec={**CYCLE, "gamma0_mode": row.mode, "trace_path": str(trace),
                              **row.vspec})
        try:
            if row.method == "ngram":
                llm.collective_rpc(_ngram_record)
            else:
                calls = _in_process_log(llm)
            sampled = SamplerCalls(runner_of(llm)) if row.mode == "lazy" and \
                row.method != "ngram" else None
            counted = _count_commits(runner_of(llm).drafter) if row == COMMIT_ROW else None
            preempted = counter(llm, "vllm:num_preemptions")
            accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens")
            batch = greedy(llm, prompts)
            preempted = counter(llm, "vllm:num_preemptions") - preempted
            hits = counter(llm, "vllm:prefix_cache_hits")
            cached = greedy(llm, prompts[:4]) + greedy(llm, prompts[:4])
            hits = counter(llm, "vllm:prefix_cache_hits") - hits
            alone = greedy(llm, [prompts[4]])
            accepted = counter(llm, "vllm:spec_decode_num_accepted_tokens") - accepted
            if row.method == "ngram":
                calls = llm.collective_rpc(_ngram_log)[0]
            sampler = None
            if sampled is not None:
                sampled.remove()
                sampler = (sampled.rejection_drafts, sampled.plain_calls)
            commits = None
            if counted is not None:
                commits = (counted[0].backend, counted[0].calls, counted[1].calls)
            lag = None
            if row.mode == "lazy" and row.method in ("eagle", "eagle3"):
                head_lag = runner_of(llm).lag
                lag = (head_lag.aux, head_lag.forced_sync, len(head_lag.store),
                       head_lag.store.capacity)
        finally:
            close_llm(llm)
    _, steps = read_trace(trace)
    return Run(batch, cached, alone, preempted, hits, accepted, steps, calls, lag, sampler,
               commits)


@pytest.fixture(scope="module")
def runs(prompts, reference, tmp_path_factory):
    """Row -> Run, each row's engine started once, on first use (after the
    session's target-only reference engine has closed)."""
    done: dict = {}

    def run(row: Row) -> Run:
        if row.id not in done:
            trace = tmp_path_factory.mktemp("trace") / f"{row.id}.jsonl"
            done[row.id] = _workload(row, prompts, trace)
        return done[row.id]
    return run


@pytest.fixture(scope="module", params=ROWS, ids=[r.id for r in ROWS])
def row_run(request, runs):
    return request.param, runs(request.param)


# ----------------------------------------------------------------- oracle
def test_exact_with_gamma_changing_every_step_across_preemptions(row_run, reference):
    row, run = row_run
    assert_same_tokens(run.batch, reference, f"{row.id}, batch 16")
    assert run.preemptions > 0, "the tiny KV cache caused no preemption"
    assert run.accepted > 0, "no draft token was ever accepted"
    gammas = [s["gamma"] for s in run.steps]
    assert set(gammas) == set(range(K + 1)), f"cycle gammas {sorted(set(gammas))}"
    assert all(a != b for a, b in zip(gammas, gammas[1:])), f"gamma repeated: {gammas[:20]}"


def test_exact_on_prefix_cache_hits(row_run, reference):
    row, run = row_run
    assert_same_tokens(run.cached, reference[:4] * 2, f"{row.id}, prefix-cached prompts")
    assert run.hits > 0, "no prefix-cache hit happened"


def test_exact_at_batch_1(row_run, reference):
    row, run = row_run
    assert_same_tokens(run.alone, reference[4:5], f"{row.id}, batch 1")


# ------------------------------------------------------- what each step ran
def test_each_decision_is_the_draft_length_verified_next_step(row_run):
    row, run = row_run
    full = 0
    for prev, cur in zip(run.steps, run.steps[1:]):
        for drafted in cur["drafted"]:
            # Fewer only near a request's length limit (or, for ngram, no match).
            assert drafted <= prev["gamma"], (prev, cur)
            full += drafted == prev["gamma"] > 0
        if prev["gamma"] == 0:
            assert cur["drafted"] == [], f"a gamma-0 step still drafted: {prev} -> {cur}"
    assert full > 0, "no request ever drafted the full gamma decided"


def test_each_step_drafts_the_asked_gamma_and_gamma_0_runs_the_drafter_only_when_sync(row_run):
    row, run = row_run
    assert run.calls, "the drafter log is empty"
    for asked, drafts, ran in run.calls:
        if row.method == "ngram":   # a draft only where the history matches
            assert all(len(d) <= asked for d in drafts), f"asked {asked}, drafted {drafts}"
        else:
            assert all(len(d) == asked for d in drafts), f"asked {asked}, drafted {drafts}"
    zero = [ran for asked, _, ran in run.calls if asked == 0]
    assert zero, "no gamma-0 step reached the drafter"
    forced = run.lag[1] if run.lag else 0
    if row.mode == "sync":   # the drafter's first pass (or the search) runs every step
        assert all(zero), f"{row.id}: a sync gamma-0 step skipped the drafter"
    else:                    # none, unless the step's positions did not fit the budget
        assert sum(map(bool, zero)) == forced, f"{row.id}: gamma-0 drafter runs {zero}"


# Drafters with state to catch up (KV or hidden states); an n-gram draft is a
# function of the token history alone.
CATCH_UP = [r for r in ROWS if r.mode == "lazy" and r.method != "ngram"]


@pytest.mark.parametrize("lazy", CATCH_UP, ids=[r.id for r in CATCH_UP])
def test_lazy_drafts_equal_sync_drafts_step_by_step(lazy, runs):
    got, want = runs(lazy).calls, runs(SYNC[lazy.method]).calls
    assert len(got) == len(want), f"{lazy.id}: {len(got)} drafter calls, sync {len(want)}"
    for step, ((g, a, _), (g_sync, b, _)) in enumerate(zip(got, want)):
        assert g == g_sync, f"{lazy.id}: step {step} asked gamma {g}, sync {g_sync}"
        rows = [f"  row {r}: lazy {x} sync {y}" for r, (x, y) in enumerate(zip(a, b)) if x != y]
        assert a == b, f"{lazy.id}: step {step} (gamma {g}) drafts differ\n" + "\n".join(rows)


@pytest.mark.parametrize("row", CATCH_UP, ids=[r.id for r in CATCH_UP])
def test_steps_without_drafts_take_the_plain_sampler(row, runs):
    """vspec's runner samples a step without drafts (a gamma-0 step, an
    all-prefill step) with vLLM's plain sampler, never with the rejection
    sampler over zero drafts."""
    run = runs(row)
    rejection_drafts, plain_calls = run.sampler
    without_drafts = sum(1 for s in run.steps if sum(s["drafted"]) == 0)
    assert without_drafts > 0, "no decode step without drafts"
    assert rejection_drafts and min(rejection_drafts) > 0, rejection_drafts
    # Decode steps without drafts, plus at least one prefill step the trace leaves out.
    assert plain_calls >= without_drafts + 1, (plain_calls, without_drafts)


def test_every_draft_pass_starts_from_what_the_compiled_commit_op_committed(runs):
    """vspec's proposer commits each verification step with vspec's op
    (torch.ops.vspec.commit_accepted, the compiled CPU twin of the AscendC
    kernel) before the next draft pass; a lazy gamma-0 step runs neither.
    (The torch fallback: tests/engine/test_commit_hot_path.py.)"""
    backend, commits, passes = runs(COMMIT_ROW).commits
    assert backend == "compiled"
    assert commits == passes > 10, (commits, passes)


HEAD_LAZY = [r for r in ROWS if r.mode == "lazy" and r.method in ("eagle", "eagle3")]


@pytest.mark.parametrize("row", HEAD_LAZY, ids=[r.id for r in HEAD_LAZY])
def test_a_lazy_head_keeps_its_hidden_states_within_the_budget(row, runs):
    aux, forced_sync, stored, capacity = runs(row).lag
    assert aux == (row.method == "eagle3"), "EAGLE-3 keeps the raw auxiliary states"
    assert (forced_sync > 0) == ("gamma0_retained_tokens" in row.vspec), forced_sync
    assert stored <= capacity


def test_the_mimo_checkpoint_decodes_as_the_bundled_target(prompts, reference):
    """tiny-mimo's model.safetensors is the bundled target's (vLLM runs it
    as MiMoForCausalLM): its target-only output is mtp's oracle too."""
    llm = make_llm(MIMO, max_model_len=256)
    try:
        got = greedy(llm, prompts)
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference, "tiny-mimo target-only")
