"""vspec's model runner and its parts (hosts/vllm/model_runner.py), over a
stand-in host runner (no engine: the engine tests run the real ones,
test_exactness_matrix, test_gamma0_path, test_tree_engine,
test_budget_engine, test_eagle's entropy stop).

Spec:
- One runner subclass per host runner class: VSpecRunner, then the host
  class; VSpecRunner extends exactly the host methods listed here.
- Order rule: each host method the runner extends calls its parts in the
  order the module docstring lists, each at most once per call: a linear
  step with drafts runs the host's prepare (with its metadata), tree
  inputs; the host's sample; tree drafter inputs, tree propose, gamma-0
  skip + lag, host propose; host take, then the handover parts in list
  order. A step without drafts takes the plain path, skips the draft
  forward (lazy) and hands over nothing.
- Without the plain part (the gamma-0 benchmark's baseline) a step
  without drafts keeps the host's spec-decode metadata.
- The handover list: the entropy cut, the tree width, the draft
  probabilities, each only when its part exists.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch
from vllm.v1.outputs import DraftTokenIds
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from vllm_vspec.hosts.vllm.draft_probs import ScoredDrafts
from vllm_vspec.hosts.vllm.model_runner import (EntropyCut, PlainSampling, VSpecCPUModelRunner,
                                                VSpecGPUModelRunner, VSpecRunner,
                                                handover_parts)
from vllm_vspec.hosts.vllm.tree.verify import TreeVerify

BATCH = 2
EXTENDED = {"__init__", "initialize_metadata_builders", "_calc_spec_decode_metadata",
            "_prepare_inputs", "_sample", "propose_draft_token_ids", "take_draft_token_ids"}


def test_one_runner_per_host_class_extending_only_the_listed_host_methods():
    assert VSpecCPUModelRunner.__bases__ == (VSpecRunner, CPUModelRunner)
    assert VSpecGPUModelRunner.__bases__ == (VSpecRunner, GPUModelRunner)
    mine = {name for name, value in vars(VSpecRunner).items() if callable(value)}
    assert mine & set(dir(GPUModelRunner)) == EXTENDED
    assert VSpecCPUModelRunner.drafts_trees and not VSpecGPUModelRunner.drafts_trees


class _Host:
    """Stands in for GPUModelRunner: every method the runner extends logs
    its call; _prepare_inputs asks _calc_spec_decode_metadata, as the host's does."""

    def __init__(self, log: list, drafts: int) -> None:
        self.log, self.drafts = log, drafts
        self.input_batch = SimpleNamespace(num_reqs=BATCH)
        self.device = torch.device("cpu")
        self.rejection_sampler = None
        self._draft_token_ids = None

    def _calc_spec_decode_metadata(self, num_draft_tokens, cu_num_scheduled_tokens):
        self.log.append("host._calc_spec_decode_metadata")
        return "host metadata"

    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        self.log.append("host._prepare_inputs")
        metadata = self._calc_spec_decode_metadata(np.full(BATCH, self.drafts),
                                                   np.cumsum(num_scheduled_tokens))
        return None, metadata, 1

    def _sample(self, logits, spec_decode_metadata):
        self.log.append(("host._sample", spec_decode_metadata))

    def propose_draft_token_ids(self, *args, **kwargs):
        self.log.append("host.propose_draft_token_ids")
        return torch.zeros(BATCH, self.drafts, dtype=torch.int64)

    def take_draft_token_ids(self):
        self.log.append("host.take_draft_token_ids")
        return DraftTokenIds(["a", "b"], [[1] * self.drafts] * BATCH)


class Runner(VSpecRunner, _Host):
    pass


class Part:
    """Logs (name, hook) for every hook of every runner part it stands for."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log
        self.pending: dict = {}

    def rows(self, cu_num_scheduled_tokens):                  # plain
        self.log.append((self.name, "rows"))
        return PlainSampling(torch.device("cpu")).rows(cu_num_scheduled_tokens)

    def track(self, runner, scheduler_output, skip, *args):  # lag
        self.log.append((self.name, "track", skip))
        return skip

    def drafter_hidden_states(self, runner, metadata, hidden_states):   # tree
        self.log.append((self.name, "drafter_hidden_states"))
        return hidden_states

    def propose(self, runner, host_args, kwargs):
        self.log.append((self.name, "propose"))
        return None                                           # draft linearly

    def verify_inputs(self, runner, scheduler_output, num_scheduled_tokens, metadata):
        self.log.append((self.name, "verify_inputs"))
        return metadata

    def sample(self, runner, logits, metadata):
        raise AssertionError("no tree step here")

    def handover(self, out):                                  # handover
        self.log.append((self.name, "handover"))
        return out


def runner(drafts: int) -> tuple[Runner, list]:
    """A runner with every part a logging stand-in (lazy gamma 0, trees,
    three handover parts), bypassing VSpecRunner.__init__'s settings."""
    log: list = []
    r = Runner.__new__(Runner)
    _Host.__init__(r, log, drafts)
    r.plain, r.gamma0_skip = Part("plain", log), True
    r.lag, r.tree = Part("lag", log), Part("tree", log)
    r.handover = (Part("entropy", log), r.tree, Part("probs", log))
    return r, log


def step(r: Runner, gamma: int) -> DraftTokenIds | None:
    """One step as the host makes it: inputs, sample, draft, hand over."""
    scheduler_output = SimpleNamespace(num_spec_tokens_to_schedule=gamma)
    _, metadata, _ = r._prepare_inputs(scheduler_output, np.ones(BATCH, dtype=np.int64))
    r._sample(None, metadata)
    r._draft_token_ids = r.propose_draft_token_ids(
        scheduler_output, None, None, torch.zeros(BATCH, 4), None, None, metadata, None, None)
    return r.take_draft_token_ids()


def test_a_step_with_drafts_calls_each_part_once_in_the_listed_order():
    r, log = runner(drafts=2)
    out = step(r, gamma=2)
    assert log == [
        "host._prepare_inputs", "host._calc_spec_decode_metadata",  # plain: drafts, host's
        ("tree", "verify_inputs"),
        ("host._sample", "host metadata"),
        ("tree", "drafter_hidden_states"), ("tree", "propose"),
        ("lag", "track", False), "host.propose_draft_token_ids",
        "host.take_draft_token_ids",
        ("entropy", "handover"), ("tree", "handover"), ("probs", "handover"),
    ], log
    assert out.draft_token_ids == [[1, 1]] * BATCH


def test_a_step_without_drafts_samples_plain_skips_the_drafter_and_hands_over_nothing():
    r, log = runner(drafts=0)
    assert step(r, gamma=0) is None
    assert log == [
        "host._prepare_inputs", ("plain", "rows"), ("tree", "verify_inputs"),
        ("host._sample", None),                                     # the plain sampler
        ("tree", "drafter_hidden_states"), ("tree", "propose"),
        ("lag", "track", True),                                     # no host propose
    ], log


def test_the_handover_list_holds_the_parts_that_exist_in_order():
    record = SimpleNamespace(take=lambda: None)
    tree = TreeVerify(drafter=None)
    assert handover_parts(SimpleNamespace(), None) == ()
    parts = handover_parts(SimpleNamespace(entropy=record, draft_probs=record), tree)
    assert [type(p) for p in parts] == [EntropyCut, TreeVerify, ScoredDrafts]
    assert parts[1] is tree
    assert [type(p) for p in handover_parts(SimpleNamespace(draft_probs=record), None)] == [
        ScoredDrafts]


def test_without_the_plain_part_a_step_without_drafts_keeps_the_hosts_speculative_path():
    """bench/gamma0_overhead.py's baseline runner: `samples_plain` False, so
    no `plain` part; a step without drafts then gets the host's spec-decode
    metadata and its rejection-sampler path (the runner before issue 17)."""
    from vllm_vspec.bench.gamma0_overhead import SpeculativePathCPUModelRunner

    assert SpeculativePathCPUModelRunner.__bases__ == (VSpecCPUModelRunner,)
    assert not SpeculativePathCPUModelRunner.samples_plain and VSpecRunner.samples_plain
    r, log = runner(drafts=0)
    r.plain = None
    step(r, gamma=0)
    assert log[:4] == ["host._prepare_inputs", "host._calc_spec_decode_metadata",
                       ("tree", "verify_inputs"), ("host._sample", "host metadata")], log
