"""vspec over a host whose runner and proposers carry per-step K themselves
(vLLM-Ascend 0.30.0rc2), on a stand-in of that host's contract (nothing here
needs an NPU): the overlay's native_gamma.py, the per-host overlay selection
routing reads, and the behaviour the contract check guards.

The stand-in restates what vLLM-Ascend 0.30.0rc2 does (read from its sdist):
the runner passes `num_speculative_tokens=scheduler_output.
num_spec_tokens_to_schedule` to `_propose` (worker/model_runner_v1.py:
2098-2099); `_propose` assigns `self.num_speculative_tokens` from it, reads
it back, returns `[batch, 0]` for 0 without a draft pass, else drafts that
many tokens (spec_decode/llm_base_proposer.py:1046-1058); buffers are sized
by the configured K in __init__ (lines 279-295).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from test_overlay import _engine_config, _Wrapper

REPO = Path(__file__).resolve().parents[2]


class _Host030Proposer:
    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config, self.device, self.runner = vllm_config, device, runner
        self.speculative_config = vllm_config.speculative_config
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.use_cuda_graph = vllm_config.full_graphs
        self.slot_mapping_group = [None] * self.num_speculative_tokens
        self._runnable = self._run_merged_draft
        self.draft_passes = []
        self.step_logits = []  # the draft model's logits at each draft position (tests)

    def load_model(self, model):
        self.model = model

    def _propose(self, num_speculative_tokens, target_token_ids=None, common_attn_metadata=None,
                 sampling_metadata=None, scheduler_output=None):
        batch = common_attn_metadata.batch_size()
        self.num_speculative_tokens = num_speculative_tokens
        if self.num_speculative_tokens == 0:
            return torch.empty(batch, 0, dtype=torch.int64)
        assert self.num_speculative_tokens <= len(self.slot_mapping_group)  # sized by K
        return self._runnable(batch)

    def _run_merged_draft(self, batch):
        self.draft_passes.append(self.num_speculative_tokens)
        for row in self.step_logits[:self.num_speculative_tokens]:
            self.model.compute_logits(torch.tensor(row))
        return torch.arange(self.num_speculative_tokens).repeat(batch, 1)


class _HostSampler:
    """vLLM-Ascend 0.30's AscendRejectionSampler(sampler, spec_config, device)."""

    def __init__(self, sampler, spec_config=None, device=None):
        self.sampler, self.spec_config, self.device = sampler, spec_config, device


@pytest.fixture
def overlay(monkeypatch):
    """(proposers, native_gamma) imported over the stand-in 0.30 host."""
    host = {"vllm_ascend.compilation": {}, "vllm_ascend.compilation.acl_graph":
            {"ACLGraphWrapper": _Wrapper}, "vllm_ascend.spec_decode": {},
            "vllm_ascend.spec_decode.draft_proposer": {"AscendDraftModelProposer": _Host030Proposer},
            "vllm_ascend.spec_decode.eagle_proposer": {"AscendEagleProposer": _Host030Proposer},
            "vllm_ascend.sample": {},
            "vllm_ascend.sample.rejection_sampler": {"AscendRejectionSampler": _HostSampler}}
    for name, attrs in host.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    ours = ("vllm_ascend.vspec.proposers", "vllm_ascend.vspec.native_gamma",
            "vllm_ascend.vspec.sampler")
    for name in ours:
        monkeypatch.delitem(sys.modules, name, raising=False)
    import vllm_ascend.vspec.native_gamma as native
    import vllm_ascend.vspec.proposers as proposers

    yield proposers, native
    for name in ours:
        sys.modules.pop(name, None)


def _make(cls, k=4, vspec=None, model=None):
    config = _engine_config("eagle", k, vspec=vspec)
    config.full_graphs = False
    proposer = cls(config, torch.device("cpu"), SimpleNamespace(max_num_reqs=4))
    proposer.load_model(model=model)
    return proposer


def _step(gamma, batch=2):
    """What the 0.30 runner passes: the step's K as an argument, and the
    scheduler output that carries the same value."""
    return dict(num_speculative_tokens=gamma, target_token_ids=None,
                common_attn_metadata=SimpleNamespace(batch_size=lambda: batch),
                sampling_metadata=SimpleNamespace(all_greedy=True),
                scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=gamma))


def test_the_0_23_proposer_breaks_on_this_host_as_the_contract_check_says(overlay):
    """The regression the contract check guards: the 0.23 subclass's
    num_speculative_tokens setter records each per-step assignment as the
    maximum, so K shrinks after a step below K and the next larger gamma
    kills the engine (VSpecConfigError)."""
    from vllm_vspec.config import VSpecConfigError

    proposers, _ = overlay
    proposer = _make(proposers.VSpecEagleProposer, k=4)
    proposer._propose(**_step(2))
    assert proposer.max_num_speculative_tokens == 2  # was 4: the host's per-step value
    with pytest.raises(VSpecConfigError, match="num_spec_tokens_to_schedule"):
        proposer._propose(**_step(3))


def test_the_native_proposer_drafts_the_hosts_per_step_k(overlay):
    _, native = overlay
    for cls in (native.VSpecNativeEagleProposer, native.VSpecNativeDraftModelProposer):
        proposer = _make(cls, k=4)
        drafts = [proposer._propose(**_step(g, batch=3)).tolist() for g in (2, 4, 1, 3)]
        assert drafts == [[list(range(g))] * 3 for g in (2, 4, 1, 3)]
        assert proposer.draft_passes == [2, 4, 1, 3]  # the host drafted each step's K
        assert proposer.max_num_speculative_tokens == 4  # the configured K stays


def test_arguments_passed_by_position_are_read_by_the_hosts_names(overlay):
    # The host's _propose takes its step's K first; vLLM-Ascend's own unit
    # tests pass it by position, the runner by keyword: the same step.
    _, native = overlay
    proposer = _make(native.VSpecNativeEagleProposer, k=4)
    step = _step(2, batch=3)
    draft = proposer._propose(*step.values())
    assert draft.tolist() == [[0, 1]] * 3 and proposer.draft_passes == [2]


def test_gamma_zero_still_runs_the_first_draft_pass_and_drafts_nothing(overlay):
    """The host skips every draft pass at K = 0, which would leave the draft
    model's KV cache without the step's tokens; ours runs the first one."""
    _, native = overlay
    proposer = _make(native.VSpecNativeEagleProposer, k=4)
    draft = proposer._propose(**_step(0))
    assert tuple(draft.shape) == (2, 0)
    assert proposer.draft_passes == [1]
    assert proposer._propose(**_step(3)).shape[1] == 3


def test_a_step_k_over_the_configured_k_is_refused_naming_it(overlay):
    from vllm_vspec.config import VSpecConfigError

    _, native = overlay
    proposer = _make(native.VSpecNativeEagleProposer, k=4)
    for bad in (5, -1, True):
        with pytest.raises(VSpecConfigError, match="num_spec_tokens_to_schedule"):
            proposer._propose(**_step(bad))
    assert proposer.draft_passes == []


def test_entropy_stop_cuts_the_hosts_draft_from_the_first_uncertain_position(overlay):
    from test_overlay import _DraftModel

    _, native = overlay
    proposer = _make(native.VSpecNativeEagleProposer, k=3, model=_DraftModel(),
                     vspec={"entropy_stop": True, "entropy_topk": 2, "entropy_threshold": 0.5})
    sure, unsure = [20.0, 0.0], [0.0, 0.0]  # entropy ~0 and ln 2 > 0.5 ** 2
    proposer.step_logits = [[sure, sure], [sure, unsure], [unsure, sure]]
    assert proposer._propose(**_step(3)).tolist() == [[0, 1, -1], [0, -1, -1]]
    proposer.step_logits = [[sure, sure]] * 3  # a new step starts from a reset tap
    assert proposer._propose(**_step(2)).tolist() == [[0, 1], [0, 1]]


def test_the_native_sampler_takes_the_hosts_arguments_and_refuses_synthetic(overlay):
    from vllm_vspec.config import VSpecConfig

    _, native = overlay
    settings = VSpecConfig.from_dict({"acceptance": "margin"}, 4)
    sampler = native.VSpecNativeRejectionSampler(
        "s", SimpleNamespace(rejection_sample_method="standard"), "npu:0", settings=settings)
    assert sampler.sampler == "s" and not sampler.rule.lossless
    with pytest.raises(ValueError, match="synthetic"):
        native.VSpecNativeRejectionSampler(
            "s", SimpleNamespace(rejection_sample_method="synthetic"), None, settings=settings)


def _routing_with(tmp_path, host_toml: Path | None):
    """vllm_ascend/vspec/routing.py loaded as the built tree holds it: beside
    the host's overlay.toml copied as host.toml (or without one)."""
    folder = tmp_path / "vspec"
    folder.mkdir()
    shutil.copyfile(REPO / "overlay/vllm_ascend/vspec/routing.py", folder / "routing.py")
    if host_toml is not None:
        shutil.copyfile(host_toml, folder / "host.toml")
    spec = importlib.util.spec_from_file_location("routing_copy", folder / "routing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("version, module", [("0.23.0.post1", "proposers"),
                                             ("0.30.0rc2", "native_gamma")])
def test_routing_selects_each_hosts_classes_from_its_overlay_selection(tmp_path, version, module):
    routing = _routing_with(tmp_path, REPO / "patches/vllm-ascend" / version / "overlay.toml")
    assert {m: p.partition(":")[0] for m, p in routing.PROPOSERS.items()} == \
        {m: f"vllm_ascend.vspec.{module}" for m in ("eagle", "eagle3", "mtp", "draft_model")}
    # the host builds one proposer class for eagle, eagle3 and mtp: so does routing
    assert routing.PROPOSERS["eagle"] == routing.PROPOSERS["eagle3"] == routing.PROPOSERS["mtp"]
    sampler = "sampler" if version.startswith("0.23") else "native_gamma"
    assert routing.SAMPLER.startswith(f"vllm_ascend.vspec.{sampler}:")


def test_without_a_host_selection_routing_is_the_default_pins(tmp_path, pin):
    bare = _routing_with(tmp_path, None)
    import tomllib

    default = tomllib.loads((pin.patch_dir / "overlay.toml").read_text())["routing"]
    assert bare.PROPOSERS == default["proposers"] and bare.SAMPLER == default["sampler"]
    assert bare.KEEP_HOST == default["keep_host"]


def _mtp_engine(**draft):
    """An Ascend engine config of method mtp whose speculative config answers
    vLLM's model-family tests (use_gemma4_mtp, use_step3p5_mtp) as `draft`
    says, and names the draft's model type for the host's multi-KV test."""
    # vspec asked for by name: 0.30.0rc2's overlay turns it off by default
    # (tests/ascend/test_ascend_stock_fallback.py); the host's own proposers are what is tested here.
    config = _engine_config("mtp", vspec={"enabled": True})
    for test in ("use_gemma4_mtp", "use_step3p5_mtp"):
        setattr(config.speculative_config, test, lambda v=draft.get(test, False): v)
    config.speculative_config.draft_model_config = SimpleNamespace(
        hf_config=SimpleNamespace(model_type=draft.get("model_type", "mimo")))
    return config


@pytest.mark.parametrize("version", ["0.23.0.post1", "0.30.0rc2"])
def test_engines_the_host_drafts_with_a_proposer_of_its_own_keep_it_with_vspec_off(
        tmp_path, monkeypatch, version):
    # Stand-in of 0.30's module-level test (multi_kv_cache_group_proposer.py
    # is_multi_kv_cache_group_mtp: the draft's model type in an allowlist).
    multi_kv = types.ModuleType("vllm_ascend.spec_decode.multi_kv_cache_group_proposer")
    multi_kv.is_multi_kv_cache_group_mtp = lambda cfg: (
        cfg.speculative_config.draft_model_config.hf_config.model_type == "glm5_next_mtp")
    monkeypatch.setitem(sys.modules, multi_kv.__name__, multi_kv)
    routing = _routing_with(tmp_path, REPO / "patches/vllm-ascend" / version / "overlay.toml")
    assert routing.vspec_settings(_mtp_engine()) is not None     # routed: vspec on
    assert routing.vspec_settings(_engine_config("eagle3", vspec={"enabled": True})) is not None
    kept = {"step3p5": _mtp_engine(use_step3p5_mtp=True)}
    if version == "0.30.0rc2":
        kept |= {"gemma4": _mtp_engine(use_gemma4_mtp=True),
                 "multi-KV": _mtp_engine(model_type="glm5_next_mtp")}
    else:   # 0.23 builds AscendEagleProposer for those: routed
        assert routing.vspec_settings(_mtp_engine(use_gemma4_mtp=True)) is not None
        assert routing.vspec_settings(_mtp_engine(model_type="glm5_next_mtp")) is not None
    for case, config in kept.items():
        assert routing.vspec_settings(config) is None, case
        assert routing.proposer_cls_for("mtp", config) is None, case
        assert routing.scheduler_cls_for(config) is None, case   # nor vspec's scheduler
