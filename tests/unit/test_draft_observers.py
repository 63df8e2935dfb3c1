"""vspec's proposer on vLLM 0.32 and its observers (hosts/draft_observers.py,
hosts/vllm/proposers.VSpecProposer), over a stand-in host proposer (no
engine: the engine tests run the real ones, test_exactness_matrix,
test_draft_head_engine, test_entropy*, test_budget_engine, test_trace*).

Spec:
- Order rule: every hook goes to the proposer's observers in their list
  order, each observer once per call: per drafter step `committed`, then
  `begin`, one `sampled` per greedy draft distribution, `end` with the
  drafts; `loaded` once after load_model. `end` runs (with None) when the
  host's propose raises.
- The list: tree drafting (EAGLE), draft probabilities, the entropy
  record, the traces, each only when its setting is on.
- Observers never change a draft: the greedy tokens are the host's.
- With no head and no observer that reads logits, the host's own greedy
  path drafts (it alone handles local argmax and draft vocabularies).
- DraftProbs: each drafted token's softmax probability, [B, gamma], once.
- EntropyRecord: per-request lengths from the top-k entropies, once.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from vllm_vspec.hosts.draft_observers import DraftObserver, DraftProbs, EntropyRecord
from vllm_vspec.hosts.vllm.proposers import VSpecEagleProposer, VSpecProposer
from vllm_vspec.kernels.entropy import EntropyStop

BATCH, HIDDEN, VOCAB = 3, 8, 11
GREEDY = SimpleNamespace(all_greedy=True, max_num_logprobs=None, no_penalties=True,
                         allowed_token_ids_mask=None, bad_words_token_ids={})


class _Model:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.weight = torch.randn(HIDDEN, VOCAB)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden @ self.weight


class _Host:
    """Stands in for vLLM's SpecDecodeBaseProposer: `propose` drafts
    num_speculative_tokens greedy tokens, one `_greedy_sample` each."""

    use_local_argmax_reduction = False
    use_heterogeneous_vocab = False

    def __init__(self, vllm_config, device, runner=None) -> None:
        self.vllm_config, self.device = vllm_config, device
        self.speculative_config = SimpleNamespace(draft_sample_method="greedy")
        self.host_greedy_calls = 0
        self.fail = False
        torch.manual_seed(1)
        self.hidden = [torch.randn(BATCH, HIDDEN) for _ in range(4)]

    def load_model(self, target) -> None:
        self.model = _Model()

    def _greedy_sample(self, hidden: torch.Tensor) -> torch.Tensor:
        self.host_greedy_calls += 1
        return self.model.compute_logits(hidden).argmax(-1)

    def propose(self, num_speculative_tokens, sampling_metadata, **kwargs) -> torch.Tensor:
        if self.fail:
            raise RuntimeError("host propose failed")
        if num_speculative_tokens == 0:
            return torch.empty(BATCH, 0, dtype=torch.int64)
        return torch.stack([self._greedy_sample(h)
                            for h in self.hidden[:num_speculative_tokens]], dim=1)

    def prepare_next_token_ids_cpu(self, sampled_token_ids, *args):
        return torch.tensor([row[-1] for row in sampled_token_ids])


class Proposer(VSpecProposer, _Host):
    pass


class EagleLike(Proposer):
    """The stand-in host with tree drafting, as VSpecEagleProposer has it."""

    drafts_trees = VSpecEagleProposer.drafts_trees


CONFIG = SimpleNamespace(parallel_config=SimpleNamespace(tensor_parallel_size=1))


def proposer(cls=Proposer, **options) -> Proposer:
    p = cls(CONFIG, "cpu", runner=None, **options)
    p.load_model(None)
    return p


class Recorder(DraftObserver):
    """Appends (name, hook) to a shared log for every hook it gets."""

    def __init__(self, name: str, log: list, reads_logits: bool = True) -> None:
        self.name, self.log, self.reads_logits = name, log, reads_logits

    def loaded(self, model):
        self.log.append((self.name, "loaded"))

    def committed(self, sampled, discard):
        self.log.append((self.name, "committed"))

    def begin(self, kwargs):
        self.log.append((self.name, "begin"))

    def sampled(self, hidden, logits, ids):
        self.log.append((self.name, "sampled"))

    def end(self, drafts):
        self.log.append((self.name, "end", None if drafts is None else tuple(drafts.shape)))


def step(p: Proposer, gamma: int) -> torch.Tensor:
    """One drafter step as the runner makes it (every argument by keyword)."""
    p.prepare_next_token_ids_cpu([[1, 2]] * BATCH, {}, None, {})
    return p.propose(num_speculative_tokens=gamma, sampling_metadata=GREEDY)


def test_observers_run_in_list_order_each_once_per_call():
    log: list = []
    p = Proposer(CONFIG, "cpu", runner=None)
    p.observers = (Recorder("a", log), Recorder("b", log), Recorder("c", log))
    p.load_model(None)
    gamma = 3
    step(p, gamma)
    names = ["a", "b", "c"]
    assert log == ([(n, "loaded") for n in names] + [(n, "committed") for n in names]
                   + [(n, "begin") for n in names] + [(n, "sampled") for n in names] * gamma
                   + [(n, "end", (BATCH, gamma)) for n in names]), log


def test_end_runs_with_none_when_the_host_propose_raises():
    log: list = []
    p = proposer()
    p.observers = (Recorder("a", log),)
    p.fail = True
    with pytest.raises(RuntimeError, match="host propose failed"):
        p.propose(num_speculative_tokens=2, sampling_metadata=GREEDY)
    assert log == [("a", "begin"), ("a", "end", None)]


def test_the_list_holds_what_the_settings_turn_on_in_order(tmp_path):
    from vllm_vspec.hosts.diagnostics import DrafterTraces, TraceOptions

    assert proposer().observers == ()
    traces = TraceOptions(draft_trace_path=str(tmp_path / "d.jsonl"))
    p = proposer(record_draft_probs=True, traces=traces,
                 entropy_stop=EntropyStop(topk=4, threshold=1.0, scale=1.0))
    assert [type(o) for o in p.observers] == [DraftProbs, EntropyRecord, DrafterTraces]
    assert (p.draft_probs, p.entropy, p.traces) == p.observers
    eagle = proposer(EagleLike, record_draft_probs=True)
    assert eagle.observers == (eagle.tree, eagle.draft_probs)


def test_the_host_drafts_when_nothing_reads_logits_and_observers_change_no_draft():
    plain = proposer()
    want = step(plain, 3)
    assert plain.host_greedy_calls == 3                # the host's own greedy path
    log: list = []
    quiet = proposer()
    quiet.observers = (Recorder("q", log, reads_logits=False),)
    assert torch.equal(step(quiet, 3), want) and quiet.host_greedy_calls == 3
    assert ("q", "sampled") not in log
    scored = proposer(record_draft_probs=True,
                      entropy_stop=EntropyStop(topk=4, threshold=1.0, scale=1.0))
    assert torch.equal(step(scored, 3), want)          # the same greedy tokens
    assert scored.host_greedy_calls == 0               # from vspec's head path


def test_draft_probs_are_each_drafted_tokens_softmax_probability_once():
    p = proposer(record_draft_probs=True)
    drafts = step(p, 3)
    probs = p.draft_probs.take()
    want = torch.stack([torch.softmax(p.model.compute_logits(h), -1).max(-1).values
                        for h in p.hidden[:3]], dim=1)
    assert probs.shape == drafts.shape and torch.allclose(probs, want)
    assert p.draft_probs.take() is None                # handed over once
    step(p, 0)
    assert p.draft_probs.take() is None                # depth 0: nothing


def test_entropy_lengths_cut_at_the_first_uncertain_position_once():
    stop = EntropyStop(topk=4, threshold=1.0, scale=1.0)
    p = proposer(entropy_stop=stop)
    step(p, 3)
    entropies = torch.stack([stop.entropy(p.model.compute_logits(h)) for h in p.hidden[:3]],
                            dim=1)
    assert p.entropy.take().tolist() == stop.lengths(entropies).tolist()
    assert p.entropy.take() is None
    step(p, 0)
    assert p.entropy.take() is None


class _TorchModel(torch.nn.Module):
    """A draft model for the NPU tap: compute_logits over the stand-in head."""

    def __init__(self) -> None:
        super().__init__()
        self.head = _Model()

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head.compute_logits(hidden)


def test_the_npu_drafting_runs_its_observers_by_the_same_rule():
    """vllm_ascend/vspec/drafting.py: the tap on the draft model's
    compute_logits (the host's merged draft loop's one greedy call) and the
    drafter step around the host's _propose (no torch_npu needed)."""
    from vllm_ascend.vspec.draft_head_tap import DraftLogitsTap
    from vllm_ascend.vspec.drafting import AscendDrafting

    log: list = []
    proposer = SimpleNamespace(model=_TorchModel(), runner=None)
    drafting = AscendDrafting(proposer, None)
    drafting.observers = (Recorder("a", log), Recorder("b", log))
    drafting.tap = DraftLogitsTap(proposer.model, None, drafting.observers).install(proposer)
    torch.manual_seed(2)
    hidden = [torch.randn(BATCH, HIDDEN) for _ in range(3)]

    def host_propose():   # the merged draft loop's shape: argmax of compute_logits
        return torch.stack([proposer.model.compute_logits(h).argmax(-1) for h in hidden], 1)

    drafting.committed(torch.tensor([[1, 2]] * BATCH), None)
    drafts = drafting.propose(host_propose, {}, 2)
    names = ["a", "b"]
    assert log == ([(n, "committed") for n in names] + [(n, "begin") for n in names]
                   + [(n, "sampled") for n in names] * 3
                   + [(n, "end", (BATCH, 2)) for n in names]), log
    want = torch.stack([_Model().compute_logits(h).argmax(-1) for h in hidden], 1)
    assert torch.equal(drafts, want)                    # the host's own tokens
