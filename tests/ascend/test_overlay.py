"""The NPU-side decisions that need no NPU: the step's gamma, the routing,
entropy stop and the proposer's per-step gamma over a stand-in host.

(The wheel build, install identity and ABI checks are in
tests/ascend/test_ascend_wheel.py; re-targeting in tests/ascend/test_retarget.py.)
"""

from __future__ import annotations

import sys

import pytest
import torch


# ------------------------------------------------------------------------------
# The NPU-side decisions that need no NPU: the step's gamma and the routing.
# (vllm_ascend.vspec resolves to overlay/vllm_ascend/vspec in a checkout.)
def _engine_config(method="eagle", k=4, vspec=None, async_scheduling=False, scheduler_cls=None,
                   cudagraph_mode="NONE", capture=None, device="npu"):
    from conftest import engine_config

    config = engine_config(method, k, vspec, device=device, async_scheduling=async_scheduling,
                           scheduler_cls=scheduler_cls, cudagraph_mode=cudagraph_mode,
                           worker_cls="vllm_ascend.worker.worker.NPUWorker")
    config.compilation_config.max_cudagraph_capture_size = capture
    return config


def test_step_gamma_defaults_to_k_and_enforces_the_verify_width():
    from types import SimpleNamespace

    from vllm_ascend.vspec.gamma import step_gamma
    from vllm_vspec.config import VSpecConfigError

    assert step_gamma(SimpleNamespace(), 4) == 4  # vLLM 0.23 output without the field
    assert step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=0), 4) == 0
    with pytest.raises(VSpecConfigError, match=r"num_spec_tokens_to_schedule=5 .* \[0, 4\]"):
        step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=5), 4)
    with pytest.raises(VSpecConfigError, match=r"=16 .*1 \+ gamma <= 16"):
        step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=16), 20)


def test_vspec_is_on_by_default_for_eagle_and_draft_model_only():
    from vllm_ascend.vspec import routing

    assert routing.vspec_settings(_engine_config("eagle")) is not None
    assert routing.vspec_settings(_engine_config("draft_model")).max_gamma == 4
    assert routing.vspec_settings(_engine_config("ngram")) is None
    assert routing.vspec_settings(_engine_config(vspec={"enabled": False})) is None
    assert routing.proposer_cls_for("eagle", _engine_config(vspec={"enabled": False})) is None


def test_bad_vspec_settings_fail_at_startup_naming_the_key():
    from vllm_ascend.vspec import routing
    from vllm_vspec.config import VSpecConfigError

    with pytest.raises(VSpecConfigError, match="vspec.max_gamma=9"):
        routing.scheduler_cls_for(_engine_config(vspec={"max_gamma": 9}))


def test_scheduler_follows_async_scheduling_and_refuses_a_competing_scheduler():
    from vllm_ascend.vspec import routing

    from vllm_vspec.hosts.wiring import SCHEDULER_CLS

    # One path: VSpecScheduler builds its async subclass under async scheduling.
    assert routing.scheduler_cls_for(_engine_config()) == SCHEDULER_CLS
    assert routing.scheduler_cls_for(_engine_config(async_scheduling=True)) == SCHEDULER_CLS
    assert routing.scheduler_cls_for(_engine_config(vspec={"enabled": False})) is None
    chunk = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
    # Another Ascend scheduler: the engine runs stock (tests/ascend/test_ascend_stock_fallback.py).
    assert routing.scheduler_cls_for(_engine_config(scheduler_cls=chunk)) is None


def test_strict_acceptance_keeps_the_hosts_rejection_sampler():
    from vllm_ascend.vspec import routing

    class HostSampler:
        pass

    assert routing.rejection_sampler_factory(_engine_config(), HostSampler) is HostSampler
    off = _engine_config(vspec={"enabled": False, "acceptance": "margin"})
    assert routing.rejection_sampler_factory(off, HostSampler) is HostSampler


class _DraftModel(torch.nn.Module):
    """Stands in for a draft model: compute_logits returns what it is given."""

    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(2, 2)

    def forward(self, x):
        return x + 1

    def compute_logits(self, hidden_states):
        return hidden_states


def _drafting(**vspec):
    """A stand-in NPU proposer's drafter options (drafting.AscendDrafting),
    after its draft model loaded."""
    from types import SimpleNamespace

    from vllm_ascend.vspec.drafting import AscendDrafting
    from vllm_vspec.config import VSpecConfig

    proposer = SimpleNamespace(model=_DraftModel(), max_num_speculative_tokens=3,
                               runner=SimpleNamespace(max_num_reqs=4),
                               device=torch.device("cpu"))
    drafting = AscendDrafting(proposer, VSpecConfig.from_dict(vspec, 3))
    drafting.loaded()
    return proposer, drafting


def test_the_logits_tap_is_transparent_and_installed_only_when_needed():
    proposer, drafting = _drafting(entropy_stop=True)
    tap = drafting.tap
    assert proposer.model is tap and tap.observers == drafting.observers == (drafting.entropy,)
    assert proposer.model(torch.zeros(1)).item() == 1.0  # forward reaches the draft model
    assert proposer.model.lm_head is tap.inner.lm_head  # so do its attributes
    proposer, drafting = _drafting()                      # no head, no entropy stop
    assert drafting.tap is None and isinstance(proposer.model, _DraftModel)


def test_entropy_stop_invalidates_drafts_from_the_first_uncertain_position():
    proposer, drafting = _drafting(entropy_stop=True, entropy_topk=2, entropy_threshold=0.5)
    sure, unsure = [20.0, 0.0], [0.0, 0.0]  # entropy ~0 and ln 2 > 0.5 ** 2
    drafting.new_pass()
    for row in ([sure, sure], [sure, unsure], [unsure, sure]):  # draft positions 0, 1, 2
        proposer.model.compute_logits(torch.tensor(row))
    draft = torch.tensor([[11, 12, 13], [21, 22, 23]])
    assert drafting.entropy.cut(draft).tolist() == [[11, 12, -1], [21, -1, -1]]


# ------------------------------------------------------------------------------
# The NPU proposer mixin over a stand-in host. The real AscendSpecDecodeBaseProposer
# needs torch_npu; the stand-in keeps only what the mixin relies on (checked
# against the real host by the ABI test above): K assigned in __init__ and
# sizing buffers, `_runnable` set to the merged draft loop and wrapped for full
# graphs in load_model, a loop that drafts `num_speculative_tokens` tokens.
class _Wrapper:
    def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None, *,
                 use_eagle=False, enable_enpu=False):
        self.runnable, self.runtime_mode = runnable, runtime_mode
        self.use_eagle, self.enable_enpu = use_eagle, enable_enpu
        self.replays = 0

    def __call__(self, **kwargs):
        self.replays += 1
        return self.runnable(**kwargs)


class _HostProposer:
    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config, self.device, self.runner = vllm_config, device, runner
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.use_cuda_graph = vllm_config.full_graphs
        self.slot_mapping_group = [None] * self.num_speculative_tokens
        self._runnable = self._run_merged_draft
        self.draft_passes, self.dummy_runs = [], []

    def load_model(self, model):
        from vllm.config import CUDAGraphMode

        if self.use_cuda_graph:
            self._runnable = _Wrapper(self._run_merged_draft, self.vllm_config,
                                      runtime_mode=CUDAGraphMode.FULL)

    def _run_merged_draft(self, batch_size):
        self.draft_passes.append(self.num_speculative_tokens)
        return torch.arange(self.num_speculative_tokens).repeat(batch_size, 1)

    def _propose(self, target_token_ids=None, common_attn_metadata=None, scheduler_output=None):
        return self._runnable(batch_size=common_attn_metadata.batch_size())

    def dummy_run(self, num_tokens, in_graph_capturing=False, aclgraph_runtime_mode=None,
                  is_profile=False):
        self.dummy_runs.append((self.num_speculative_tokens, self._runnable))


@pytest.fixture
def proposers(monkeypatch):
    """vllm_ascend.vspec.proposers imported over the stand-in host modules."""
    import types

    host = {"vllm_ascend.compilation": {}, "vllm_ascend.compilation.acl_graph":
            {"ACLGraphWrapper": _Wrapper}, "vllm_ascend.spec_decode": {},
            "vllm_ascend.spec_decode.draft_proposer": {"AscendDraftModelProposer": _HostProposer},
            "vllm_ascend.spec_decode.eagle_proposer": {"AscendEagleProposer": _HostProposer}}
    for name, attrs in host.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.proposers", raising=False)
    import vllm_ascend.vspec.proposers as module

    yield module
    sys.modules.pop("vllm_ascend.vspec.proposers", None)


def _make(proposers, k=4, full_graphs=False, vspec=None, **config_args):
    # Full draft graphs under dynamic gamma are opt-in (ascend_draft_full_graph).
    vspec = {"ascend_draft_full_graph": True} if full_graphs and vspec is None else vspec
    config = _engine_config("eagle", k, vspec=vspec, **config_args)
    config.full_graphs = full_graphs
    proposer = proposers.VSpecEagleProposer(config, torch.device("cpu"))
    proposer.load_model(model=None)
    return proposer


def _step(gamma=None, batch=2):
    from types import SimpleNamespace

    out = SimpleNamespace() if gamma is None else SimpleNamespace(num_spec_tokens_to_schedule=gamma)
    meta = SimpleNamespace(batch_size=lambda: batch)
    return dict(target_token_ids=None, common_attn_metadata=meta, scheduler_output=out)


def test_buffers_are_sized_by_k_and_k_is_read_outside_a_step(proposers):
    proposer = _make(proposers, k=4)
    assert len(proposer.slot_mapping_group) == 4
    assert proposer.num_speculative_tokens == proposer.max_num_speculative_tokens == 4


def test_a_step_drafts_the_schedulers_gamma_then_k_is_back(proposers):
    proposer = _make(proposers, k=4)
    assert proposer._propose(**_step(gamma=2)).tolist() == [[0, 1, -1, -1]] * 2
    assert proposer._propose(**_step()).tolist() == [[0, 1, 2, 3]] * 2  # 0.23: no field
    assert proposer.draft_passes == [2, 4]
    assert proposer.num_speculative_tokens == 4


def test_a_gamma_over_k_is_refused_and_leaves_k_in_place(proposers):
    from vllm_vspec.config import VSpecConfigError

    proposer = _make(proposers, k=4)
    with pytest.raises(VSpecConfigError, match="num_spec_tokens_to_schedule=5"):
        proposer._propose(**_step(gamma=5))
    assert proposer.num_speculative_tokens == 4 and proposer.draft_passes == []


def test_full_graphs_get_one_captured_graph_per_gamma(proposers):
    from vllm.config import CUDAGraphMode

    proposer = _make(proposers, k=3, full_graphs=True)
    proposer.dummy_run(num_tokens=8, in_graph_capturing=True,
                       aclgraph_runtime_mode=CUDAGraphMode.FULL, is_profile=False)
    gammas = [g for g, _ in proposer.dummy_runs]
    # each capture calls its gamma's wrapper through the rows check
    checked = [(w.func.__name__, w.args[0]) for _, w in proposer.dummy_runs]
    assert checked == [("_check_capture_rows", g) for g in (1, 2, 3)]
    wrappers = [w.args[1] for _, w in proposer.dummy_runs]
    assert gammas == [3, 3, 3]  # the host's dummy_run at K for each gamma's graph
    assert len({id(w) for w in wrappers}) == 3 and all(isinstance(w, _Wrapper) for w in wrappers)
    proposer._propose(**_step(gamma=2))
    assert [w.replays for w in wrappers] == [0, 1, 0]  # the gamma-2 graph
    assert proposer.draft_passes == [2]


def test_profiling_dummy_runs_use_k_once(proposers):
    from vllm.config import CUDAGraphMode

    proposer = _make(proposers, k=3, full_graphs=True)
    proposer.dummy_run(num_tokens=8, in_graph_capturing=True,
                       aclgraph_runtime_mode=CUDAGraphMode.FULL, is_profile=True)
    assert [g for g, _ in proposer.dummy_runs] == [3]


# ------------------------------------------------------------------------------
# Verify width (vllm_vspec/hosts/vllm/verify_width.py): a decode step whose
# batch fits the target's full decode graph verifies K draft slots, its gamma
# drafts then -1, which every verifier rejects (vLLM-Ascend 0.23 replays that
# graph only for 1 + K tokens a request). Async scheduling always gets K
# columns: vLLM 0.23's runner reads the previous drafts with a row stride of K.
GRAPHS = dict(cudagraph_mode="FULL_AND_PIECEWISE", capture=40)  # K=4: up to 8 requests


@pytest.mark.parametrize("config_args, vspec, pad_max_reqs", [
    (GRAPHS, {}, 8),
    (dict(cudagraph_mode="FULL_DECODE_ONLY", capture=512), {}, 102),
    (dict(GRAPHS, cudagraph_mode="PIECEWISE"), {}, 0),       # no full decode graph
    (dict(GRAPHS, cudagraph_mode="NONE"), {}, 0),
    (dict(GRAPHS, capture=None), {}, 0),
    (dict(GRAPHS, device="cpu"), {}, 0),                      # vLLM-Ascend only
    (GRAPHS, {"ascend_pad_verify_width": False}, 0),
    (GRAPHS, {"enabled": False}, 0),
])
def test_padding_applies_only_where_a_full_decode_graph_is_kept(config_args, vspec, pad_max_reqs):
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    config = _engine_config("eagle", 4, vspec=vspec, **config_args)
    verify = VerifyWidth.of(config, resolve(config))
    assert verify.pad_max_reqs == pad_max_reqs
    assert [verify.verified(2, n) for n in (1, 8, 9)] == \
        [4 if n <= pad_max_reqs else 2 for n in (1, 8, 9)]


def test_a_step_returns_k_columns_its_gamma_drafts_then_invalid_ones(proposers):
    # vLLM 0.23's runner copies drafts into a [max_num_reqs, K] buffer and
    # reads them with a row stride of K, graphs or not, sync or async.
    for config_args in (GRAPHS, {}, dict(async_scheduling=True)):
        proposer = _make(proposers, k=4, **config_args)
        draft = proposer._propose(**_step(gamma=2, batch=3))
        assert draft.tolist() == [[0, 1, -1, -1]] * 3, config_args
        assert proposer.draft_passes == [2]  # the drafter still drafts gamma tokens


def test_a_steps_gamma_is_read_from_its_scheduler_output_passed_by_position(proposers):
    # NPUModelRunner passes _propose's arguments by keyword, vLLM-Ascend's
    # own unit tests by position: the same step either way.
    proposer = _make(proposers, k=4)
    step = _step(gamma=2, batch=3)
    assert proposer._propose(*step.values()).tolist() == [[0, 1, -1, -1]] * 3
    assert proposer.draft_passes == [2]


def test_gamma_zero_runs_the_first_draft_pass_and_returns_only_invalid_drafts(proposers):
    proposer = _make(proposers, k=4)
    assert proposer._propose(**_step(gamma=0)).tolist() == [[-1] * 4] * 2
    assert proposer.draft_passes == [1]  # the draft KV cache saw this step's tokens


def _padding_scheduler(k=4, async_scheduling=True, **config_args):
    """A VSpecScheduler with only what its padding bookkeeping reads (vLLM's
    Scheduler.__init__ needs a whole engine)."""
    from vllm_vspec.hosts.vllm.scheduler import VSpecAsyncScheduler, VSpecScheduler
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    config = _engine_config("eagle", k, async_scheduling=async_scheduling,
                            **(config_args or GRAPHS))
    scheduler = object.__new__(VSpecAsyncScheduler if async_scheduling else VSpecScheduler)
    scheduler.vspec = object()  # vspec on
    scheduler.max_model_len = 4096             # as Scheduler.__init__ sets it
    scheduler._verify = VerifyWidth.of(config, resolve(config))
    scheduler._verified, scheduler._drafted, scheduler._width = k, {}, 1
    return scheduler


def _scheduled(spec, finished=()):
    from types import SimpleNamespace

    return SimpleNamespace(num_scheduled_tokens={r: 1 + len(s) for r, s in spec.items()},
                           scheduled_spec_decode_tokens={r: s for r, s in spec.items() if s},
                           num_invalid_spec_tokens=None, finished_req_ids=set(finished))


def test_async_placeholders_are_padded_to_k_while_the_graph_is_kept():
    scheduler = _padding_scheduler()
    scheduler._set_gamma(_scheduled({f"r{i}": [] for i in range(8)}), 1)
    assert scheduler._spec_token_placeholders == [-1] * 4
    scheduler._set_gamma(_scheduled({f"r{i}": [] for i in range(9)}), 1)
    assert scheduler._spec_token_placeholders == [-1]
    # The (gamma, width) call every decided step makes (width 1: async has no trees).
    scheduler._set_gamma(_scheduled({f"r{i}": [] for i in range(9)}), 2, 1)
    assert scheduler._spec_token_placeholders == [-1, -1]


def test_sync_scheduling_keeps_a_trees_gamma_times_width_drafts(monkeypatch):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    seen = []
    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: seen.append(d))
    scheduler = _padding_scheduler(async_scheduling=False, cudagraph_mode="PIECEWISE",
                                   capture=40)
    scheduler._set_gamma(_scheduled({"r": []}), 2, 3)   # a depth-2, width-3 tree: 6 nodes
    tree = [11, 12, 13, 21, 22, 23]
    scheduler.update_draft_token_ids(DraftTokenIds(["r"], [tree]))
    assert seen[0].draft_token_ids == [tree]


@pytest.mark.parametrize("num_reqs, config_args, kept", [
    (8, GRAPHS, [5, -1, -1, -1]),                             # padded: the graph is kept
    (9, GRAPHS, [5]),                                         # past the capture range
    (8, dict(cudagraph_mode="PIECEWISE", capture=40), [5]),   # no full decode graph
])
def test_sync_scheduling_keeps_the_drafts_the_next_step_verifies(monkeypatch, num_reqs,
                                                                   config_args, kept):
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import DraftTokenIds

    seen = []
    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: seen.append(d))
    scheduler = _padding_scheduler(async_scheduling=False, **config_args)
    ids = [f"r{i}" for i in range(num_reqs)]
    scheduler._set_gamma(_scheduled({r: [] for r in ids}), 1)
    scheduler.update_draft_token_ids(DraftTokenIds(ids, [[5, -1, -1, -1]] * num_reqs))
    assert seen[0].req_ids == ids and seen[0].draft_token_ids == [kept] * num_reqs


def test_pads_are_reported_as_invalid_drafts_so_nobody_counts_them():
    from types import SimpleNamespace

    from vllm_vspec.hosts.vllm.scheduler import _feedback

    scheduler = _padding_scheduler(async_scheduling=False)
    scheduler._set_gamma(_scheduled({"a": [], "b": [], "gone": []}), 1)  # drafts 1 each
    step = _scheduled({"a": [5, -1, -1, -1], "b": [], "new": [7, 8]}, finished={"gone"})
    scheduler._report_padding(step)
    assert step.num_invalid_spec_tokens == {"a": 3}  # "new": drafted before we knew it
    assert "gone" not in scheduler._drafted
    out = SimpleNamespace(sampled_token_ids=[[5, 9], [4], [7, 1]],
                          req_id_to_index={"a": 0, "b": 1, "new": 2})
    fb = _feedback(step, out)
    assert (fb.drafted, fb.accepted) == ((1, 2), (1, 1))


@pytest.mark.parametrize("drafted_width, depth", [(3, 2), (1, 6)])
def test_the_controller_is_told_a_trees_depth_not_its_node_count(monkeypatch, drafted_width,
                                                                  depth):
    # Per-position acceptance is per depth: a width-3 tree of 6 nodes
    # verified in a step is 2 drafted positions, its accepted path 1 of them.
    # The width is the one the runner reports it drafted with: 6 linear
    # drafts (a tree drafter that declined) are 6 positions.
    from types import SimpleNamespace

    from vllm.v1.core.sched.scheduler import Scheduler

    from vllm_vspec.hosts.vllm.scheduler import _feedback
    from vllm_vspec.hosts.vllm.tree.verify import TreeDraftTokenIds

    monkeypatch.setattr(Scheduler, "update_draft_token_ids", lambda self, d: None)
    scheduler = _padding_scheduler(async_scheduling=False, cudagraph_mode="PIECEWISE",
                                   capture=40)
    drafting = _scheduled({"r": []})
    scheduler._set_gamma(drafting, 2, 3)          # asks for a (2, 3) tree after this step
    nodes = [11, 12, 13, 21, 22, 23]
    scheduler.update_draft_token_ids(TreeDraftTokenIds(["r"], [nodes], drafted_width))
    verifying = _scheduled({"r": nodes})
    scheduler._set_gamma(verifying, 1, 1)
    assert (drafting.vspec_verified_width, verifying.vspec_verified_width) == \
        (1, drafted_width)
    fb = _feedback(verifying, SimpleNamespace(sampled_token_ids=[[12, 7]],
                                              req_id_to_index={"r": 0}))
    assert (fb.drafted, fb.accepted, fb.committed, fb.width) == \
        ((depth,), (1,), 2, drafted_width)


@pytest.mark.parametrize("drafted_width, depth", [(3, 2), (1, 6)])
def test_the_host_stats_count_a_trees_depth_so_vspec_gamma_is_its_depth(drafted_width, depth):
    # vspec:gamma (metrics.py) reads vLLM's per-position draft counts in the
    # API-server process; vspec's scheduler makes them count a verified tree
    # by its depth, from the width the runner reported (update_from_output
    # notes the processed step's vspec_verified_width as _stats_width).
    from types import SimpleNamespace

    from vllm_vspec.hosts.vllm.metrics import verified_gamma

    scheduler = _padding_scheduler(async_scheduling=False, cudagraph_mode="PIECEWISE",
                                   capture=40)
    scheduler.log_stats, scheduler.num_spec_tokens = True, 6
    scheduler._stats_width = drafted_width
    stats = scheduler.make_spec_decoding_stats(None, num_draft_tokens=6, num_accepted_tokens=1,
                                               num_invalid_spec_tokens=None, request_id="r")
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (1, depth, 1)
    assert verified_gamma(SimpleNamespace(spec_decoding_stats=stats)) == depth
    # Grammar-invalidated entries are not verified: a width-3 tree of 6 with 2
    # invalid is 4 entries, depth 2 (linear: 4 positions).
    stats = scheduler.make_spec_decoding_stats(None, num_draft_tokens=6, num_accepted_tokens=0,
                                               num_invalid_spec_tokens={"r": 2}, request_id="r")
    assert stats.num_draft_tokens == (2 if drafted_width == 3 else 4)


def test_no_bookkeeping_where_nothing_is_padded():
    scheduler = _padding_scheduler(async_scheduling=False, cudagraph_mode="PIECEWISE", capture=40)
    scheduler._set_gamma(_scheduled({"a": []}), 2)
    assert not scheduler._verify.pads and scheduler._drafted == {}


@pytest.mark.parametrize("num_reqs, config_args, padded", [
    (8, GRAPHS, True),                                        # the next step verifies 1 + K
    (9, GRAPHS, False),                                       # past the capture range
    (8, dict(cudagraph_mode="PIECEWISE", capture=40), False),  # no full decode graph kept
])
def test_a_step_whose_drafts_are_verified_padded_drafts_k_without_asking_the_controller(
        num_reqs, config_args, padded):
    # Padded, a smaller gamma would save only graphed draft passes: the step
    # drafts K, and the controller neither decides it nor is told of it.
    from types import SimpleNamespace

    asked = []

    def decide_step(scheduled, live, prefill, batch):
        asked.append(len(scheduled))
        return SimpleNamespace(gamma=1, width=1, decided=True)

    scheduler = _padding_scheduler(async_scheduling=False, **config_args)
    scheduler.vspec = SimpleNamespace(decide_step=decide_step)
    scheduler.requests = {}
    step = _scheduled({f"r{i}": [] for i in range(num_reqs)})
    step.total_num_scheduled_tokens = num_reqs
    decision = scheduler._decide(step)
    if padded:
        assert (decision.gamma, decision.reason, decision.decided) == (4, "padded", False)
        assert asked == []
    else:
        assert decision.gamma == 1 and asked == [num_reqs]
