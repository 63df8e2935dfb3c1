"""Steps without drafts take vLLM's plain sampling path (vspec's runner).

Spec: with vspec's worker, a step in which no request has draft tokens (every
gamma-0 step, and the all-prefill first step) is sampled by vLLM's plain
sampler, never by the rejection sampler with zero drafts; steps with drafts
still go through the rejection sampler; and greedy outputs stay
token-identical to target-only decoding with gamma changing every step,
gamma 0 included (cycle policy), for a draft model and EAGLE in sync gamma-0
mode (the drafter still runs over a gamma-0 step's tokens; lazy mode, where
it skips them and catches up: tests/engine/test_exactness_matrix.py).

The CPU platform turns async scheduling off, so the async runner path is not
run here (it shares the plain-sampling part).
"""

from __future__ import annotations

import pytest

from conftest import (DRAFT, EAGLE, assert_same_tokens, close_llm, counter, greedy, make_llm,
                      runner_of)
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
from vllm_vspec.core.trace import read_trace

pytestmark = pytest.mark.engine

K = 4
CASES = {
    "draft-sync": ({"method": "draft_model", "model": str(DRAFT), "num_speculative_tokens": K},
                   "sync"),
    "eagle-sync": ({"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K}, "sync"),
}


class SamplerCalls:
    """Counts the runner's sampler calls through nn.Module hooks: the draft
    total of every rejection-sampler call, and every call of the plain
    sampler (which the rejection sampler also calls for its bonus tokens)."""

    def __init__(self, runner) -> None:
        self.rejection_drafts: list[int] = []
        self.sampler_calls = 0
        self._handles = [
            runner.rejection_sampler.register_forward_pre_hook(
                lambda _m, args: self.rejection_drafts.append(sum(args[0].num_draft_tokens))),
            runner.sampler.register_forward_pre_hook(lambda _m, _args: self._count()),
        ]

    def _count(self) -> None:
        self.sampler_calls += 1

    @property
    def plain_calls(self) -> int:
        return self.sampler_calls - len(self.rejection_drafts)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@pytest.fixture(scope="module", params=list(CASES))
def cycling(request, reference, prompts, tmp_path_factory):
    """One greedy run of `prompts` on a vspec engine on vspec's worker whose
    gamma changes every step (4, 0, 3, 1, 2, ...), with the runner's sampler
    calls counted: (case, outputs, SamplerCalls, trace steps). Starts after
    `reference`: one engine at a time."""
    spec, mode = CASES[request.param]
    trace = tmp_path_factory.mktemp("trace") / f"{request.param}.jsonl"
    llm = make_llm(speculative_config=spec, worker_cls=CPU_WORKER_CLS,
                   vspec={"policy": "cycle", "min_gamma": 0, "gamma0_mode": mode,
                          "trace_path": str(trace)})
    try:
        calls = SamplerCalls(runner_of(llm))
        outputs = greedy(llm, prompts)
        calls.remove()
        _, steps = read_trace(trace)  # line-buffered: complete after generate()
    finally:
        close_llm(llm)
    return request.param, outputs, calls, steps


def test_outputs_are_token_identical_to_target_only(cycling, reference):
    name, outputs, _, _ = cycling
    assert_same_tokens(outputs, reference, f"{name}, cycle gamma with gamma 0")


def test_steps_without_drafts_skip_the_rejection_sampler(cycling):
    name, _, calls, steps = cycling
    without_drafts = sum(1 for s in steps if sum(s["drafted"]) == 0)
    assert without_drafts > 0, f"{name}: no decode step without drafts (cycle gamma 0 missing)"
    assert calls.rejection_drafts, f"{name}: the rejection sampler never ran: nothing was drafted"
    assert min(calls.rejection_drafts) > 0, (
        f"{name}: the rejection sampler sampled steps with zero drafts: "
        f"{calls.rejection_drafts}")
    # Decode steps without drafts, plus the prefill step the trace leaves out.
    assert calls.plain_calls >= without_drafts + 1, (
        f"{name}: {calls.plain_calls} plain sampler calls for {without_drafts} decode "
        f"steps without drafts and a prefill step")


class ForwardCalls:
    """Counts forward calls of the target model (and the tokens each one
    processed), the draft model, and both samplers of a runner."""

    def __init__(self, runner) -> None:
        self.target_tokens: list[int] = []
        self.draft_calls = 0
        self.rejection_calls = 0
        self.sampler_calls = 0

        def target(_m, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.target_tokens.append(int(ids.shape[0]))

        def bump(name):
            return lambda *_: setattr(self, name, getattr(self, name) + 1)

        self._handles = [
            runner.model.register_forward_pre_hook(target, with_kwargs=True),
            runner.sampler.register_forward_pre_hook(bump("sampler_calls")),
        ]
        if hasattr(runner, "drafter"):  # a target-only runner has no drafter
            self._handles += [
                runner.drafter.model.register_forward_pre_hook(bump("draft_calls")),
                runner.rejection_sampler.register_forward_pre_hook(bump("rejection_calls")),
            ]

    def remove(self) -> None:
        for h in self._handles:
            h.remove()


@pytest.mark.parametrize("method, drafter", [("draft_model", DRAFT), ("eagle", EAGLE)])
def test_fixed_gamma_0_runs_the_forward_passes_of_target_only(method, drafter, reference,
                                                              prompts):
    """Issue 29: a vspec server held at gamma 0 does what a target-only
    server does: no drafter forward (draft model or EAGLE head: lazy, what
    auto picks on vspec's worker), no rejection sampler, and the target
    forwards process exactly target-only's tokens (each prompt once, then
    one token per request per step: the first decode step after the
    prefill verifies no drafts, which it did when the prefill step drafted
    max_gamma); outputs exact."""
    spec = {"method": method, "model": str(drafter), "num_speculative_tokens": K}
    llm = make_llm(speculative_config=spec, worker_cls=CPU_WORKER_CLS,
                   vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0},
                   disable_log_stats=False)    # the prompt-token counters
    try:
        runner = runner_of(llm)
        assert runner.vspec_config.gamma0_mode == "lazy" and runner.gamma0_skip
        before = {n: counter(llm, n) for n in ("vllm:prompt_tokens",
                                               "vllm:prefix_cache_hits")}
        calls = ForwardCalls(runner)
        outputs = greedy(llm, prompts)
        calls.remove()
        prompt_tokens = counter(llm, "vllm:prompt_tokens") - before["vllm:prompt_tokens"]
        cached = counter(llm, "vllm:prefix_cache_hits") - before["vllm:prefix_cache_hits"]
    finally:
        close_llm(llm)
    assert_same_tokens(outputs, reference, f"fixed gamma 0 with {method}")
    assert calls.draft_calls == 0, f"{calls.draft_calls} {method} drafter forwards at gamma 0"
    assert calls.rejection_calls == 0, f"{calls.rejection_calls} rejection-sampler calls"
    assert calls.sampler_calls == len(calls.target_tokens), "one plain sample per forward"
    # Target-only's tokens: every uncached prompt token once, then each
    # request's remaining max_tokens - 1 tokens one per step.
    want = prompt_tokens - cached + sum(len(o) - 1 for o in outputs)
    assert sum(calls.target_tokens) == want, (
        f"target forwards processed {sum(calls.target_tokens)} tokens, target-only "
        f"processes {want} (prompt {prompt_tokens}, cached {cached}); per forward: "
        f"{calls.target_tokens[:8]}...")


def test_eagle_at_gamma_0_keeps_target_onlys_prefix_cache_hits(prompts, reference):
    """Issue 29: vLLM shortens every prefix-cache hit of an EAGLE engine by
    one block (hosts/vllm/prefix_tail.py); a vspec EAGLE engine held at
    gamma 0 hits as target-only does. The prompts twice, the second time
    from the prefix cache (32-token blocks): the second run's hits and
    target tokens are target-only's, no head forward runs, outputs exact."""
    def resend(**engine):
        llm = make_llm(enable_prefix_caching=True, block_size=32, disable_log_stats=False,
                       **engine)
        try:
            first = greedy(llm, prompts)
            hits = counter(llm, "vllm:prefix_cache_hits")
            calls = ForwardCalls(runner_of(llm))
            second = greedy(llm, prompts)
            calls.remove()
            return first, second, counter(llm, "vllm:prefix_cache_hits") - hits, calls
        finally:
            close_llm(llm)

    *_, want_hits, want = resend()
    spec = {"method": "eagle", "model": str(EAGLE), "num_speculative_tokens": K}
    first, second, hits, got = resend(
        speculative_config=spec, worker_cls=CPU_WORKER_CLS,
        vspec={"policy": "fixed", "fixed_gamma": 0, "min_gamma": 0})
    assert_same_tokens(first, reference, "EAGLE at gamma 0")
    assert_same_tokens(second, reference, "EAGLE at gamma 0, prompts from the prefix cache")
    assert want_hits > 0, "target-only hit no cached block: the prompts are too short"
    assert hits == want_hits, f"prefix-cache hits {hits:.0f}, target-only {want_hits:.0f}"
    assert sum(got.target_tokens) == sum(want.target_tokens), (
        f"target forwards processed {sum(got.target_tokens)} tokens, target-only "
        f"{sum(want.target_tokens)}; per forward: {got.target_tokens[:4]}... against "
        f"{want.target_tokens[:4]}...")
    assert got.draft_calls == 0, f"{got.draft_calls} head forwards at gamma 0"
