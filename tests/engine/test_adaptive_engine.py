"""vSpec Adaptive inside the real vLLM engine (VSpecScheduler on vLLM 0.32, CPU),
with a draft model.

Exactness under a gamma changing every step, for every method and gamma-0
mode, at batch 1 and 16, on prefix-cache hits and across preemptions, is
tests/engine/test_exactness_matrix.py. Spec here: sticky gamma 0 holds
speculation off until its cohort drains; lazy gamma 0 leaves a self-draft
(the target as its own draft) exactly where it would have been (every draft
accepted) after skipped steps, across preemptions, after a long gamma-0
stretch and for prompts cached while the drafter was skipped;
`reward_prefill_steps` reports the prefill step; shutdown logs one summary
line; default settings stop speculating with a draft that never agrees.
Bad vspec settings stop the engine at start-up with the key named.

The CPU platform disables async scheduling, so these tests run
VSpecScheduler; VSpecAsyncScheduler (same overrides over vLLM's
AsyncScheduler) only runs on GPU/NPU.
"""

from __future__ import annotations

from collections import Counter

import pytest

from conftest import (DRAFT, TARGET, assert_same_tokens, close_llm, counter, greedy,
                      make_llm, run_preempted, runner_of, scheduler_of)
from vllm_vspec.core.trace import read_trace

pytestmark = pytest.mark.engine

DRAFT_MODEL = {"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": 4}
CYCLE = {"policy": "cycle", "min_gamma": 0}


def test_sticky_gamma_0_keeps_speculation_off_until_the_cohort_drains(prompts, reference,
                                                                      tmp_path):
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    trace = tmp_path / "sticky.jsonl"
    llm = make_llm(speculative_config=DRAFT_MODEL, worker_cls=CPU_WORKER_CLS,
                   vspec={**CYCLE, "gamma0_mode": "sticky", "trace_path": str(trace)})
    try:
        got = greedy(llm, prompts)
        _, first_cohort = read_trace(trace)
        greedy(llm, prompts[:2])  # a new cohort: speculation resumes
        _, both = read_trace(trace)
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference, "sticky gamma 0")
    # cycle decides 4, then 0: from then on the whole cohort lacks draft KV,
    # so the scheduler holds gamma 0 without asking the controller again.
    assert [s["gamma"] for s in first_cohort] == [4, 0], first_cohort
    resumed = [s["gamma"] for s in both[len(first_cohort):]]
    assert resumed[:2] == [3, 1], f"speculation did not resume for a new cohort: {resumed}"


@pytest.fixture(scope="module")
def fixed_2(prompts, tmp_path_factory):
    """fixed gamma 2 with `reward_prefill_steps`, traced: one greedy run of
    `prompts`, then the engine closed. (outputs, trace steps, the messages
    vLLM's logger got from after start-up to the end of the close)."""
    import logging

    records: list[logging.LogRecord] = []
    catch = logging.Handler(logging.INFO)
    catch.emit = records.append
    vllm_logger = logging.getLogger("vllm")     # the only logger tree vLLM prints
    trace = tmp_path_factory.mktemp("trace") / "prefill.jsonl"
    llm = make_llm(speculative_config=DRAFT_MODEL,
                   vspec={"policy": "fixed", "fixed_gamma": 2, "reward_prefill_steps": True,
                          "trace_path": str(trace)})
    # Attached after start-up: building an engine re-applies vLLM's logging config.
    vllm_logger.addHandler(catch)
    try:
        got = greedy(llm, prompts)
        _, steps = read_trace(trace)
    finally:
        close_llm(llm)
        vllm_logger.removeHandler(catch)
    return got, steps, [r.getMessage() for r in records]


def test_reward_prefill_steps_decides_and_reports_the_prefill_step(fixed_2, prompts, reference):
    got, steps, _ = fixed_2
    assert_same_tokens(got, reference, "reward_prefill_steps")
    # The first step prefills every prompt: it verifies nothing and commits
    # each request's first token. (Off, the first reported step is the next
    # one, which verifies the drafts proposed after the prefill.)
    first = steps[0]
    assert (first["num_reqs"], first["drafted"], first["committed"]) == (
        len(prompts), [], len(prompts)), first


def test_shutdown_logs_one_summary_line_through_vllms_logger(fixed_2):
    lines = [m for m in fixed_2[2] if "vspec summary" in m]
    assert len(lines) == 1, f"summary lines logged: {lines}"
    assert 'steps_per_gamma={"2":' in lines[0] and "% of step time" in lines[0], lines[0]


# The target as its own draft: with complete draft KV it drafts exactly the
# target's next tokens, so (float32) every draft is accepted. Lazy gamma 0 must
# keep that: a catch-up that is missing or misplaced shows as rejections
# (with the catch-up pass disabled, TestLazyGamma0 measured 88.5%).
SELF_DRAFT = {**DRAFT_MODEL, "model": str(TARGET)}
LAZY = {**CYCLE, "gamma0_mode": "lazy"}


def _acceptance(llm) -> tuple[float, float]:
    return (counter(llm, "vllm:spec_decode_num_accepted_tokens"),
            counter(llm, "vllm:spec_decode_num_draft_tokens"))


class TestLazyGamma0:
    """gamma0_mode lazy with the target as its own draft (SELF_DRAFT): a
    gamma-0 step runs no draft forward, and the catch-up leaves the drafter
    exactly where it would have been. Cycle policy, prefix caching on."""

    @pytest.fixture(scope="class")
    @classmethod
    def lazy(cls, reference, tmp_path_factory):
        from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

        trace = tmp_path_factory.mktemp("trace") / "lazy.jsonl"
        llm = make_llm(speculative_config=SELF_DRAFT, worker_cls=CPU_WORKER_CLS,
                       vspec={**LAZY, "trace_path": str(trace)},
                       enable_prefix_caching=True, disable_log_stats=False)
        yield llm, trace
        close_llm(llm)

    def test_gamma_0_steps_run_no_draft_forward_and_the_next_pass_catches_up(self, lazy,
                                                                              prompts):
        llm, _ = lazy
        runner = runner_of(llm)
        forwards: list[int] = []   # draft forwards so far
        steps: list[tuple[int, int]] = []  # per step: (gamma, draft forwards it ran)
        model, propose = runner.drafter.model, runner.propose_draft_token_ids

        def counted_forward(*args, **kwargs):
            forwards.append(1)
            return type(model).forward(model, *args, **kwargs)

        def counted_propose(scheduler_output, *args, **kwargs):
            before = len(forwards)
            out = propose(scheduler_output, *args, **kwargs)
            steps.append((scheduler_output.num_spec_tokens_to_schedule, len(forwards) - before))
            return out

        model.forward, runner.propose_draft_token_ids = counted_forward, counted_propose
        try:
            greedy(llm, prompts[:4])
        finally:
            del model.forward, runner.propose_draft_token_ids
        assert any(g == 0 for g, _ in steps), f"cycle never chose gamma 0: {steps}"
        assert all(n == 0 for g, n in steps if g == 0), f"a gamma-0 step ran the drafter: {steps}"
        # After a gamma-0 step every request lags: one catch-up pass, then the
        # first pass and gamma-1 more draft forwards.
        after_skip = [(g, n) for (g0, _), (g, n) in zip(steps, steps[1:]) if g0 == 0 and g > 0]
        assert after_skip and all(n == g + 1 for g, n in after_skip), steps

    def test_an_identical_draft_is_accepted_after_skipped_steps(self, lazy, prompts,
                                                                reference):
        llm, trace = lazy
        accepted_before, drafted_before = _acceptance(llm)
        hits_before = counter(llm, "vllm:prefix_cache_hits")
        # The second pass starts from prompts cached while the drafter was
        # skipped: their draft KV comes from the catch-up from token 0.
        for _ in range(2):
            assert_same_tokens(greedy(llm, prompts), reference, "lazy gamma 0, self draft")
        accepted, drafted = _acceptance(llm)
        _, steps = read_trace(trace)
        assert any(s["gamma"] == 0 for s in steps), "cycle never chose gamma 0"
        assert counter(llm, "vllm:prefix_cache_hits") > hits_before, "no prefix-cache hit happened"
        rate = (accepted - accepted_before) / (drafted - drafted_before)
        assert rate >= 0.99, f"self-draft acceptance {rate:.3f} after lazy gamma-0 steps"


def test_lazy_gamma_0_across_preemptions_is_exact_and_caught_up(prompts, reference):
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    llm = make_llm(speculative_config=SELF_DRAFT, worker_cls=CPU_WORKER_CLS, vspec=LAZY,
                   enable_prefix_caching=True, kv_cache_memory_bytes=5 << 20,
                   max_model_len=256, disable_log_stats=False)
    got, (accepted, drafted) = run_preempted(llm, lambda: (greedy(llm, prompts),
                                                          _acceptance(llm)))
    assert_same_tokens(got, reference, "lazy gamma 0 across preemptions")
    assert accepted / drafted >= 0.99, f"self-draft acceptance {accepted / drafted:.3f}"


def test_a_long_lazy_gamma_0_stretch_is_caught_up_in_chunks(prompts, reference):
    """Once every prompt is in, 40 decode steps at gamma 0 (no draft
    forward), then gamma 4: the drafter catches up on 16 requests x 40+
    tokens in passes cut to the token budget, and the self draft is then
    accepted as if it had never been skipped."""
    from vllm import SamplingParams

    from conftest import MAX_TOKENS
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
    from vllm_vspec.config import VSpecConfig
    from vllm_vspec.core.controller import GammaController

    budget, skipped_steps = 512, 40
    llm = make_llm(speculative_config=SELF_DRAFT, worker_cls=CPU_WORKER_CLS,
                   max_num_batched_tokens=budget, disable_log_stats=False,
                   vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0,
                          "gamma0_mode": "lazy"})
    engine, sched = llm.llm_engine, scheduler_of(llm)
    runner = runner_of(llm)
    passes: list[int] = []
    catch_up_pass = runner.drafter._catch_up_pass
    runner.drafter._catch_up_pass = lambda cad, part, ids: (
        passes.append(sum(end - first for _, first, end in part)), catch_up_pass(cad, part, ids))
    # Long enough that no request ends before gamma 4; the first MAX_TOKENS
    # tokens are compared with the reference.
    params = SamplingParams(temperature=0.0, max_tokens=2 * MAX_TOKENS, ignore_eos=True)
    try:
        for i, prompt in enumerate(prompts):
            engine.add_request(str(i), prompt, params)
        outputs, at_gamma_0 = {}, None   # decode steps since every prompt was in
        while engine.has_unfinished_requests():
            if at_gamma_0 is None and len(sched.running) == len(prompts) and all(
                    r.num_computed_tokens >= r.num_prompt_tokens for r in sched.running):
                at_gamma_0 = 0
            elif at_gamma_0 is not None:
                at_gamma_0 += 1
                if at_gamma_0 == skipped_steps:
                    sched.vspec = GammaController(VSpecConfig.from_dict(
                        {"policy": "fixed", "fixed_gamma": 4, "min_gamma": 0}, 4), 4)
            outputs.update({o.request_id: o for o in engine.step() if o.finished})
        accepted, drafted = _acceptance(llm)
    finally:
        del runner.drafter._catch_up_pass
        close_llm(llm)
    got = [list(outputs[str(i)].outputs[0].token_ids)[:MAX_TOKENS] for i in range(len(prompts))]
    assert_same_tokens(got, reference, "lazy gamma 0 for 40 steps, then gamma 4")
    assert len(passes) > 1 and max(passes) <= budget, f"catch-up pass sizes {passes}"
    assert sum(passes) >= len(prompts) * skipped_steps, f"caught up on too few tokens: {passes}"
    assert accepted / drafted >= 0.99, f"self-draft acceptance {accepted / drafted:.3f}"


def test_prompts_cached_while_the_drafter_was_skipped_are_caught_up_on_a_hit(prompts,
                                                                            reference):
    """Half the prompts are prefilled while the other half decode at lazy
    gamma 0, so their cached blocks have no draft KV. Served again at gamma
    4 from the prefix cache, the drafter catches up on those blocks first:
    exact, and the self draft fully accepted."""
    from vllm import SamplingParams

    from conftest import MAX_TOKENS
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
    from vllm_vspec.config import VSpecConfig
    from vllm_vspec.core.controller import GammaController

    llm = make_llm(speculative_config=SELF_DRAFT, worker_cls=CPU_WORKER_CLS,
                   enable_prefix_caching=True, disable_log_stats=False,
                   vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0,
                          "gamma0_mode": "lazy"})
    engine, sched = llm.llm_engine, scheduler_of(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    first, second = prompts[:8], prompts[8:]
    try:
        for i, prompt in enumerate(first):
            engine.add_request(f"a{i}", prompt, params)
        for _ in range(8):          # prefilled, then decoding at gamma 0
            engine.step()
        for i, prompt in enumerate(second):  # prefilled while gamma is 0
            engine.add_request(f"b{i}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
        sched.vspec = GammaController(VSpecConfig.from_dict(
            {"policy": "fixed", "fixed_gamma": 4, "min_gamma": 0}, 4), 4)
        hits, (accepted, drafted) = counter(llm, "vllm:prefix_cache_hits"), _acceptance(llm)
        got = greedy(llm, second)
        hits = counter(llm, "vllm:prefix_cache_hits") - hits
        accepted, drafted = [x - y for x, y in zip(_acceptance(llm), (accepted, drafted))]
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference[8:], "prompts cached at lazy gamma 0, served at gamma 4")
    assert hits > 0, "no prefix-cache hit happened"
    assert accepted / drafted >= 0.99, f"self-draft acceptance {accepted / drafted:.3f}"


def test_default_settings_stop_speculating_with_a_draft_that_never_agrees(
        prompts, reference, random_draft, tmp_path):
    # Default vspec settings (the table names only a trace file) and vspec's
    # worker, as `vllm-vspec serve` runs them: gamma 0 is in the default
    # range, so the server ends up not speculating. The prompts run five
    # times at batch 16 (about 240 steps): a warm-up sweep whose few samples
    # a busy host may distort (a run on a loaded host held gamma 2 for 80
    # steps), the re-measuring of arms left for two windows (128 steps),
    # then the steady state, checked on the last run.
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    spec = {**DRAFT_MODEL, "model": str(random_draft)}
    trace = tmp_path / "trace.jsonl"
    llm = make_llm(speculative_config=spec, vspec={"trace_path": str(trace)},
                   worker_cls=CPU_WORKER_CLS)
    try:
        runs = [greedy(llm, prompts) for _ in range(5)]
        scheduler_of(llm).vspec.close()
    finally:
        close_llm(llm)
    for i, got in enumerate(runs):
        assert_same_tokens(got, reference, f"default settings, random draft, run {i + 1}")
    _, steps = read_trace(trace)
    last = Counter(s["gamma"] for s in steps[4 * len(steps) // 5:])
    # Most, not all: at gamma 0 no acceptance is measured, so the policy
    # probes gamma 1 now and then (up to 4 of every 20 steps by default).
    assert last[0] > 0.5 * sum(last.values()), \
        f"steps per gamma in the last run with a random draft: {dict(last)} (all steps: " \
        f"{dict(Counter(s['gamma'] for s in steps))})"


# One engine-level refusal per kind of check: a setting's own and one a rule
# needs (vspec's model runner, which the stock worker does not build). Both
# are refused while vLLM builds the engine config (vspec's platform hook,
# hosts/vllm/platform.py). Every other key and range is refused the same way
# and is tested without an engine (test_wiring.py, test_config*).
@pytest.mark.parametrize("bad, key", [
    ({"polcy": "online"}, "polcy"),
    ({"acceptance": "margin", "margin": 1.0}, "acceptance"),
])
def test_bad_vspec_settings_fail_at_startup_naming_the_key(bad, key):
    from vllm_vspec.hosts.vllm.platform import VSpecStartupError

    with pytest.raises(VSpecStartupError, match=key):
        make_llm(speculative_config=DRAFT_MODEL, vspec=bad)
