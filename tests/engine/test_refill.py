"""Refill holding (refill.py, VSpecScheduler.schedule): new requests join a
decoding batch in groups; nobody waits past the bound; outputs are exact."""

from __future__ import annotations

import pytest

from conftest import DRAFT, MAX_TOKENS, assert_same_tokens, close_llm, make_llm, scheduler_of
from vllm_vspec.core.refill import RefillGate


def test_newcomers_are_held_while_a_batch_decodes_until_a_group_waits():
    gate = RefillGate(refill_batch=3, max_wait_steps=100)
    assert gate.hold(["a"], all_fresh=True, num_running=2, free_slots=14)
    assert gate.hold(["a", "b"], all_fresh=True, num_running=2, free_slots=14)
    assert not gate.hold(["a", "b", "c"], all_fresh=True, num_running=2, free_slots=14)


def test_an_idle_engine_and_preempted_requests_are_never_held():
    gate = RefillGate(refill_batch=3, max_wait_steps=100)
    assert not gate.hold(["a"], all_fresh=True, num_running=0, free_slots=16)
    assert not gate.hold(["a"], all_fresh=False, num_running=2, free_slots=14)


def test_fewer_free_slots_than_the_group_admit_what_fits():
    gate = RefillGate(refill_batch=8, max_wait_steps=100)
    assert not gate.hold(["a", "b"], all_fresh=True, num_running=14, free_slots=2)


def test_no_request_waits_past_the_bound():
    gate = RefillGate(refill_batch=4, max_wait_steps=3)
    held = [gate.hold(["a"], all_fresh=True, num_running=1, free_slots=15) for _ in range(4)]
    assert held == [True, True, True, False]
    # A later arrival does not restart the clock of the one already waiting.
    gate = RefillGate(refill_batch=4, max_wait_steps=3)
    assert gate.hold(["a"], True, 1, 15) and gate.hold(["a", "b"], True, 1, 15)
    assert gate.hold(["a", "b"], True, 1, 15) and not gate.hold(["a", "b"], True, 1, 15)


def test_off_by_default():
    from vllm_vspec.config import VSpecConfig, VSpecConfigError

    assert VSpecConfig().refill_batch == 0
    with pytest.raises(VSpecConfigError, match="vspec.refill_max_wait_steps=0"):
        VSpecConfig.from_dict({"refill_max_wait_steps": 0})


@pytest.fixture(scope="module")
def llm(reference):
    llm = make_llm(speculative_config={"method": "draft_model", "model": str(DRAFT),
                                       "num_speculative_tokens": 2},
                   vspec={"policy": "fixed", "refill_batch": 3, "refill_max_wait_steps": 50})
    yield llm
    close_llm(llm)


@pytest.mark.engine
def test_a_group_is_admitted_in_one_step_and_outputs_stay_exact(llm, prompts, reference):
    from vllm import SamplingParams

    engine, scheduler = llm.llm_engine, scheduler_of(llm)
    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True)
    finished: dict[str, list[int]] = {}

    def step() -> None:
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = list(out.outputs[0].token_ids)

    engine.add_request("r0", prompts[0], params)
    step()
    step()
    assert len(scheduler.running) == 1
    engine.add_request("r1", prompts[1], params)
    for _ in range(5):
        step()
        assert (len(scheduler.running), len(scheduler.waiting)) == (1, 1)
    engine.add_request("r2", prompts[2], params)
    engine.add_request("r3", prompts[3], params)
    step()
    assert (len(scheduler.running), len(scheduler.waiting)) == (4, 0)
    while engine.has_unfinished_requests():
        step()
    assert_same_tokens([finished[f"r{i}"] for i in range(4)], reference[:4], "refill holding")
