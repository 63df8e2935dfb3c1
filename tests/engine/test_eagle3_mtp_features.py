"""Which vspec features apply to EAGLE-3 (`method: eagle3`, models/tiny-eagle3)
and MTP (`method: mtp`, models/tiny-mimo), each on a real engine (CPU,
float32, greedy); docs/configuration.md's method table states the same.
Exactness under a gamma changing every step (cycle policy, both workers,
prefix caching, preemption) is tests/engine/test_exactness_matrix.py.

Spec:
- Entropy stop with the diagnostics draft trace on vspec's worker (and, for
  eagle3, vspec's draft head: an active vocabulary of 25% of the tokens,
  built from the code prompts' target outputs, with an int8 w8a8 head): the
  outputs equal target-only decoding, the stop shortened drafts below the
  gamma asked for, something was accepted, and the trace has a row per step
  (eagle3: every draft from the active head, every drafted id in the
  vocabulary, which some output token lies outside of).
- A lossy rule (relaxed_topk 2 after 8 tokens) on vspec's worker: the first
  8 tokens of every output are target-only's, every later token is within
  the target's top 2, and some token was relaxed (the rule binds).
- An EAGLE-3 head with a draft vocabulary of its own (`d2t`: half the
  target's tokens, vLLM's draft_id_to_target_id) under the cycle policy on
  vspec's worker: exact, and every drafted id is one of its tokens. vspec's
  draft head refuses it, naming the key (`draft_head_for` on the loaded
  model: its rows and ids would be in the draft vocabulary's space).
- models/derived/tiny-mimo-deep (the mtp-* bench variants' target: the
  deepened target plus tiny-mimo's MTP layer) decodes exactly with mtp under
  the cycle policy, and accepts drafts.
- mtp refuses the draft-head keys at start-up: tests/unit/test_eagle3_mtp_config.py.
"""

from __future__ import annotations

import collections
import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from conftest import (MODELS, TARGET, assert_same_tokens, close_llm, counter, greedy, make_llm,
                      runner_of)
from test_eagle import AFTER, ENTROPY, check_lossy, lossy_outputs, spec_counts
from vllm_vspec.core import active_vocab
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
from vllm_vspec.tools import traces
from vllm_vspec.tools.drafters import special_ids_of

pytestmark = pytest.mark.engine

K = 4
EAGLE3 = MODELS / "tiny-eagle3"
# method -> (the engine's model: None for the bundled target, speculative config)
SPECS = {
    "eagle3": (None, {"method": "eagle3", "model": str(EAGLE3), "num_speculative_tokens": K}),
    "mtp": (MODELS / "tiny-mimo", {"method": "mtp", "num_speculative_tokens": K}),
}
CYCLE = {"policy": "cycle", "min_gamma": 0}
VOCAB = 2048


def _llm(method: str, vspec: dict, **kwargs):
    target, spec = SPECS[method]
    return make_llm(*([target] if target else []), speculative_config=spec, vspec=vspec, **kwargs)


def _greedy_and_accepted(llm, prompts) -> tuple[list[list[int]], float]:
    """Greedy outputs of `prompts` and the draft tokens vLLM accepted meanwhile;
    `llm` is closed afterwards."""
    try:
        before = counter(llm, "vllm:spec_decode_num_accepted_tokens")
        got = greedy(llm, prompts)
        return got, counter(llm, "vllm:spec_decode_num_accepted_tokens") - before
    finally:
        close_llm(llm)


@pytest.fixture(scope="module")
def vocab_file(reference, tmp_path_factory) -> tuple[str, set[int]]:
    """25% of the vocabulary, counted from the code prompts' (0-7) outputs."""
    counts = collections.Counter(t for out in reference[:8] for t in out)
    specials = special_ids_of(str(TARGET))
    ids = active_vocab.build_ids(counts, specials, VOCAB // 4)
    path = tmp_path_factory.mktemp("vocab") / "ids.json"
    active_vocab.write_ids(path, ids, specials, VOCAB, sum(counts.values()), "code outputs")
    return str(path), set(ids)


@pytest.mark.parametrize("method", list(SPECS))
def test_entropy_stop_draft_traces_and_draft_head_keep_outputs_exact(
        method, prompts, reference, vocab_file, tmp_path):
    trace = tmp_path / "draft.jsonl"
    head = ({"draft_active_vocab_ids": vocab_file[0], "draft_lm_head_quantization": "w8a8"}
            if method == "eagle3" else {})
    llm = _llm(method, {**ENTROPY, **head, "draft_trace_path": str(trace)},
               worker_cls=CPU_WORKER_CLS, disable_log_stats=False)
    try:
        got: list[list[int]] = []
        tokens, drafts, accepted = spec_counts(llm, lambda: got.extend(greedy(llm, prompts)))
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference, f"{method} + entropy stop + draft trace {sorted(head)}")
    assert accepted > 0, "no draft token was ever accepted: the stop cut everything"
    assert tokens < K * drafts, (
        f"{tokens} draft tokens in {drafts} drafts: the stop never shortened one below {K}")
    records = list(traces.read_jsonl(trace))
    assert records and all(len(r["draft"]) <= rec["gamma"]
                           for rec in records for r in rec["requests"])
    if head:
        ids = vocab_file[1]
        assert any(t not in ids for out in reference for t in out), "the vocabulary must bind"
        assert {rec["head"] for rec in records} == {"active"}
        drafted = {t for rec in records for r in rec["requests"] for t in r["draft"]}
        assert drafted and drafted <= ids, sorted(drafted - ids)[:8]


@pytest.mark.parametrize("method", list(SPECS))
def test_a_lossy_rule_keeps_its_strict_prefix_and_its_bound(method, prompts, reference):
    target, spec = SPECS[method]
    outputs = lossy_outputs({"acceptance": "relaxed_topk", "relaxed_topk": 2,
                             "relaxed_after_tokens": AFTER}, prompts, spec, target)
    check_lossy(outputs, reference, set(), lambda rank, gap: rank <= 2,
                f"{method}, relaxed_topk 2")


def test_the_deepened_mimo_checkpoint_drafts_with_mtp_exactly(prompts, reference):
    """models/derived/tiny-mimo-deep, the mtp-* bench variants' target: its
    target-only decoding is the bundled target's (zero-output layers), and
    its MTP layer drafts on it under the cycle policy."""
    got, accepted = _greedy_and_accepted(make_llm(
        MODELS / "derived" / "tiny-mimo-deep", speculative_config=SPECS["mtp"][1], vspec=CYCLE,
        worker_cls=CPU_WORKER_CLS, disable_log_stats=False), prompts)
    assert_same_tokens(got, reference, "mtp on tiny-mimo-deep, cycle policy")
    assert accepted > 0, "nothing accepted"


# ------------------------------------------------------------ a d2t head
@pytest.fixture(scope="module")
def d2t_head(reference, tmp_path_factory):
    """models/tiny-eagle3 with a draft vocabulary of its own: the half of the
    target's tokens most used in the target-only outputs (then by id), its LM
    head those rows of the target's (tied) embedding, `d2t` the offsets
    target id - draft id. (directory, the target ids it drafts)"""
    counts = collections.Counter(t for out in reference for t in out)
    keep = sorted(sorted(range(VOCAB), key=lambda t: (-counts[t], t))[:VOCAB // 2])
    out = tmp_path_factory.mktemp("eagle3-d2t")
    for f in EAGLE3.iterdir():
        if f.is_file() and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    config = json.loads((EAGLE3 / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "draft_vocab_size": len(keep)}))
    tensors = load_file(EAGLE3 / "model.safetensors")
    embed = load_file(TARGET / "model.safetensors")["model.embed_tokens.weight"]
    ids = torch.tensor(keep)
    tensors["lm_head.weight"] = embed[ids].to(tensors["fc.weight"].dtype).contiguous()
    tensors["d2t"] = ids - torch.arange(len(keep))
    save_file(tensors, out / "model.safetensors")
    return out, set(keep)


def test_an_eagle3_head_with_its_own_vocabulary_is_exact_and_refuses_the_draft_head(
        d2t_head, prompts, reference, vocab_file, tmp_path):
    from vllm_vspec.config import VSpecConfig, VSpecConfigError
    from vllm_vspec.kernels.draft_head import draft_head_for

    head, ids = d2t_head
    trace = tmp_path / "draft.jsonl"
    llm = make_llm(speculative_config={"method": "eagle3", "model": str(head),
                                       "num_speculative_tokens": K},
                   vspec={**CYCLE, "draft_trace_path": str(trace)}, worker_cls=CPU_WORKER_CLS)
    try:
        got = greedy(llm, prompts)
        model = runner_of(llm).drafter.model
        assert model.draft_id_to_target_id is not None, "vLLM did not load the d2t head"
        for table in ({"draft_active_vocab_ids": vocab_file[0]},
                      {"draft_lm_head_quantization": "w8a16"}):
            with pytest.raises(VSpecConfigError, match="d2t") as err:
                draft_head_for(model, VSpecConfig.from_dict(table, K))
            assert err.value.key == next(iter(table))
    finally:
        close_llm(llm)
    assert_same_tokens(got, reference, "eagle3 with a d2t head, cycle policy")
    records = list(traces.read_jsonl(trace))
    drafted = {t for rec in records for r in rec["requests"] for t in r["draft"]}
    assert drafted and drafted <= ids, sorted(drafted - ids)[:8]
    assert drafted - set(range(VOCAB // 2)), "drafted ids never needed the d2t map"
