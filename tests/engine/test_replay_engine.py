"""Exact replay agrees with the real engine: a recording made on the real
engine predicts, step by step, what a vspec engine whose gamma changes
every step (`cycle` policy, gamma 0 included) accepts for each request.

The recording's prediction for a request at decode position d verifying
g drafts is min(g, a_K(d)) accepted, so accepted + 1 committed (fewer only
at the request's length limit). The engine's side is read per step: the
drafts the scheduler sent for verification (SchedulerOutput's
scheduled_spec_decode_tokens, read by wrapping this in-process engine's
scheduler.schedule: test instrumentation) and the tokens each request
gained. Every disagreement is printed; none is allowed (no float tie was
met with these prompts; a tie would show as a probe disagreement in the
recording, listed in the failure message).

The recording's draft probabilities agree too: a vspec engine under policy
`budget` hands its scheduler, with every draft drafted from decode position
d, the probabilities the recording holds for d (to the file's 1/255 grid).
"""

from __future__ import annotations

import pytest

from conftest import DEEP_TARGET, DRAFT, EAGLE, close_llm, make_llm, scheduler_of

pytestmark = pytest.mark.engine

K = 4
OUTPUT_LEN = 24


DRAFTERS = {"draft_model": DRAFT, "eagle": EAGLE}


@pytest.fixture(scope="module")
def recordings():
    """method -> a recording of 9 bundled prompts, made on first use."""
    from vllm_vspec.replay.record import Prompt, record
    from vllm_vspec.bench.workloads import load_prompts
    from conftest import MODELS

    prompts = [Prompt(f"{fam}/{i}", fam, text)
               for fam in ("code", "prose", "boilerplate")
               for i, text in enumerate(load_prompts(MODELS / "prompts" / "families" / f"{fam}.jsonl")[:3])]
    made = {}

    def get(method):
        if method not in made:
            made[method] = record(method, prompts, k=K, output_len=OUTPUT_LEN, target=DEEP_TARGET,
                                  drafter=DRAFTERS[method], max_num_seqs=16,
                                  kv_cache_memory_bytes=1 << 30)
        return made[method]
    return get


def run_cycling(recording, method: str, worker: dict):
    """Per step: {request id: (tokens before, drafts verified, tokens committed)}."""
    from vllm import SamplingParams, TokensPrompt

    llm = make_llm(DEEP_TARGET, speculative_config={"method": method, "model": str(DRAFTERS[method]),
                                                    "num_speculative_tokens": K},
                   vspec={"policy": "cycle", "min_gamma": 0}, max_num_seqs=4,
                   kv_cache_memory_bytes=512 << 20, **worker)
    try:
        engine = llm.llm_engine
        scheduler = scheduler_of(llm)
        schedule = scheduler.schedule
        verified: list[dict[str, int]] = []

        def recorded(*args, **kwargs):
            out = schedule(*args, **kwargs)
            # The engine's request ids carry a suffix after the caller's id.
            verified.append({rid.rsplit("-", 1)[0]: len(t)
                             for rid, t in out.scheduled_spec_decode_tokens.items()})
            return out
        scheduler.schedule = recorded
        for i, r in enumerate(recording.requests):
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=list(r.prompt)),
                               SamplingParams(temperature=0.0, max_tokens=len(r.output),
                                              ignore_eos=True))
        lengths: dict[str, int] = {}
        steps, outputs = [], {}
        while engine.has_unfinished_requests():
            outs = engine.step()
            step = {}
            for o in outs:
                n = len(o.outputs[0].token_ids)
                before = lengths.get(o.request_id, 0)
                if before:
                    step[o.request_id] = (before, verified[-1].get(o.request_id, 0), n - before)
                lengths[o.request_id] = n
                outputs[o.request_id] = list(o.outputs[0].token_ids)
            steps.append(step)
        return steps, outputs
    finally:
        close_llm(llm)


@pytest.mark.parametrize("method,gamma0", [("draft_model", "sync"), ("draft_model", "lazy"),
                                           ("eagle", "lazy")])
def test_every_step_accepts_what_the_recording_predicts(recordings, method, gamma0):
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    recording = recordings(method)
    worker = {"worker_cls": CPU_WORKER_CLS} if gamma0 == "lazy" else {}
    steps, outputs = run_cycling(recording, method, worker)
    wrong, checked, gammas = [], 0, set()
    for n, step in enumerate(steps):
        for rid, (before, g, committed) in step.items():
            r = recording.requests[int(rid)]
            d = before - 1
            want = min(min(g, r.accept[d]) + 1, len(r.output) - before)
            checked += 1
            gammas.add(g)
            if committed != want:
                wrong.append(f"step {n} request {r.key} position {d}: verified {g}, committed "
                             f"{committed}, recording predicts {want} (a_K={r.accept[d]})")
    ties = {r.key: r.disagree for r in recording.requests if r.disagree}
    assert not wrong, (f"{len(wrong)} of {checked} request-steps disagree (probe ties: {ties}):\n"
                       + "\n".join(wrong))
    assert gammas == set(range(K + 1)), f"the cycle verified only {sorted(gammas)}"
    assert checked > 100
    for i, r in enumerate(recording.requests):
        assert outputs[str(i)] == list(r.output), f"{r.key}: output differs from the recorded stream"


def budget_engine_probs(recording, method: str) -> list[tuple[int, int, list[float]]]:
    """Per draft a vspec engine under policy `budget` handed its scheduler:
    (request index, decode position it was drafted from, its draft
    probabilities). The position is read from the request when the drafts
    arrive (Scheduler.update_draft_token_ids, wrapped on this in-process
    engine's scheduler: test instrumentation): n output tokens so far, so
    drafted from prompt + output[:n], decode position n - 1."""
    from vllm import SamplingParams, TokensPrompt
    from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS

    llm = make_llm(DEEP_TARGET, speculative_config={"method": method, "model": str(DRAFTERS[method]),
                                                    "num_speculative_tokens": K},
                   vspec={"policy": "budget", "min_gamma": 0}, max_num_seqs=4,
                   kv_cache_memory_bytes=512 << 20, worker_cls=CPU_WORKER_CLS)
    try:
        engine = llm.llm_engine
        scheduler = scheduler_of(llm)
        update = scheduler.update_draft_token_ids
        seen = []

        def recorded(draft_token_ids):
            for rid, probs in zip(draft_token_ids.req_ids,
                                  getattr(draft_token_ids, "draft_probs", None) or ()):
                request = scheduler.requests.get(rid)
                if request is not None:          # not finished in this step
                    n = len(request.output_token_ids)
                    seen.append((int(rid.rsplit("-", 1)[0]), n - 1, list(probs)))
            update(draft_token_ids)
        scheduler.update_draft_token_ids = recorded
        for i, r in enumerate(recording.requests):
            engine.add_request(str(i), TokensPrompt(prompt_token_ids=list(r.prompt)),
                               SamplingParams(temperature=0.0, max_tokens=len(r.output),
                                              ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
        return seen
    finally:
        close_llm(llm)


@pytest.mark.parametrize("method", ["draft_model", "eagle"])
def test_the_recorded_draft_probabilities_are_what_a_budget_engine_ranks(recordings, method):
    # Recorded on the 1/255 grid: a probability the engine reports is within
    # half a step of it, plus float noise (the engine batches differently).
    tolerance = 0.5 / 255 + 1e-4
    recording = recordings(method)
    wrong, compared = [], 0
    for i, d, probs in budget_engine_probs(recording, method):
        r = recording.requests[i]
        if d >= r.decode_len:
            continue          # drafted past the recorded stream's end
        for j, p in enumerate(probs):
            compared += 1
            if abs(p - r.draft_probs[d][j]) > tolerance:
                wrong.append(f"request {r.key} position {d} slot {j}: engine {p:.5f}, "
                             f"recorded {r.draft_probs[d][j]:.5f}")
    assert not wrong, f"{len(wrong)} of {compared} draft probabilities differ:\n" + "\n".join(wrong)
    assert compared > 100
