"""The one wiring of vspec into vLLM (vllm_vspec.hosts.wiring): which settings an
engine runs, where it refuses to start, and the engine arguments that select
it. Unit tests on stand-in configs, plus one engine start."""

from __future__ import annotations

import json

import re

import pytest

from conftest import DRAFT, close_llm, engine_config, greedy, make_llm, scheduler_of
from vllm_vspec.hosts import wiring
from vllm_vspec.config import VSpecConfigError


# ------------------------------------------------------------------ resolve
@pytest.mark.parametrize("device", ["cpu", "cuda", "npu"])
def test_disabled_vspec_is_stock_vllm_whatever_k(device):
    # Nothing of vspec applies: not its K limit, not its static-table rule.
    assert wiring.resolve(engine_config(k=31, vspec={"enabled": False}, device=device)) is None
    assert wiring.resolve(engine_config(k=31, vspec={"enabled": False}, device=device,
                                        static_table=[[1, 8, 31]])) is None


def test_an_engine_config_is_resolved_once_into_one_frozen_object():
    config = engine_config(vspec={"min_gamma": 0}, worker_cls=wiring.WORKER_CLS["cpu"])
    cfg = wiring.resolve(config)
    assert wiring.resolve(config) is cfg and cfg.gamma0_mode == "lazy"
    with pytest.raises(AttributeError):
        cfg.gamma0_mode = "sync"
    # A value it was resolved from changes (vLLM completing the config):
    # resolved again, from the config as it is now.
    config.parallel_config.worker_cls = "vllm.v1.worker.cpu_worker.CPUWorker"
    assert wiring.resolve(config).gamma0_mode == "sync"
    config.additional_config["vspec"]["enabled"] = False
    assert wiring.resolve(config) is None


def test_disabled_vspec_still_names_an_unknown_key():
    with pytest.raises(VSpecConfigError, match="vspec.polcy="):
        wiring.resolve(engine_config(vspec={"enabled": False, "polcy": "online"}))


def test_k_is_not_capped_where_the_host_has_no_verify_width_limit():
    for device in ("cpu", "cuda"):
        cfg = wiring.resolve(engine_config(k=31, vspec={}, device=device))
        assert (cfg.min_gamma, cfg.max_gamma) == (0, 31), device


def test_ascend_caps_one_plus_k_at_its_verify_width():
    assert wiring.resolve(engine_config(k=15, vspec={}, device="npu")).max_gamma == 15
    with pytest.raises(VSpecConfigError, match=r"vspec.num_speculative_tokens=16 .*1 \+ gamma <= 16"):
        wiring.resolve(engine_config(k=16, vspec={}, device="npu"))


def test_without_speculative_decoding_settings_are_refused_unless_disabled():
    assert wiring.resolve(engine_config(method=None)) is None
    assert wiring.resolve(engine_config(method=None, vspec={"enabled": False})) is None
    with pytest.raises(VSpecConfigError, match="need speculative decoding"):
        wiring.resolve(engine_config(method=None, vspec={"policy": "online"}))


def test_settings_must_be_a_table():
    with pytest.raises(VSpecConfigError, match="a JSON object"):
        wiring.resolve(engine_config(vspec="online"))


@pytest.mark.parametrize("facts, named", [
    (dict(static_table=[[1, 8, 4]]), "num_speculative_tokens_per_batch_size=[[1, 8, 4]]"),
    (dict(data_parallel_size=2, moe=True), "data_parallel_size=2 on a MoE model"),
])
@pytest.mark.parametrize("device", ["cpu", "npu"])
def test_what_vspec_cannot_drive_runs_as_stock_with_one_warning(facts, named, device, caplog,
                                                                 monkeypatch):
    monkeypatch.setattr(wiring, "_warned", set())
    with caplog.at_level("WARNING", logger="vllm.vllm_vspec.hosts.wiring"):
        assert wiring.resolve(engine_config(vspec={}, device=device, **facts)) is None
        assert wiring.resolve(engine_config(device=device, **facts)) is None  # a second engine
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.vllm_vspec.hosts.wiring"]
    assert len(lines) == 1 and named in lines[0] and "runs as stock vLLM" in lines[0], lines


@pytest.mark.parametrize("facts, named", [
    (dict(static_table=[[1, 8, 4]]), "num_speculative_tokens_per_batch_size"),
    (dict(data_parallel_size=2, moe=True), r"data_parallel_size=2 on a MoE model"),
])
def test_asking_for_vspec_by_name_where_it_cannot_drive_fails_naming_why(facts, named):
    with pytest.raises(VSpecConfigError, match=rf"vspec.enabled=True .*{named}"):
        wiring.resolve(engine_config(vspec={"enabled": True}, **facts))


def test_dense_data_parallel_ranks_each_run_vspec():
    # Dense models' DP ranks are independent engines; vspec off is stock vLLM.
    assert wiring.resolve(engine_config(vspec={}, data_parallel_size=2)) is not None
    assert wiring.resolve(engine_config(vspec={"enabled": False}, data_parallel_size=2,
                                        moe=True)) is None


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_full_cuda_graphs_on_the_v1_runner_are_refused(mode):
    with pytest.raises(VSpecConfigError, match=f"cudagraph_mode {mode} .*PIECEWISE"):
        wiring.resolve(engine_config(vspec={}, device="cuda", cudagraph_mode=mode))
    # Where they are fine: the V2 runner, another host, or vspec off.
    assert wiring.resolve(engine_config(vspec={}, device="cuda", cudagraph_mode=mode,
                                        v2_runner=True)) is not None
    assert wiring.resolve(engine_config(vspec={}, device="npu", cudagraph_mode=mode)) is not None
    assert wiring.resolve(engine_config(vspec={"enabled": False}, device="cuda",
                                        cudagraph_mode=mode)) is None
    assert wiring.resolve(engine_config(vspec={}, device="cuda",
                                        cudagraph_mode="PIECEWISE")) is not None


def test_runner_features_need_the_vspec_worker():
    lossy = {"acceptance": "margin", "margin": 1.0}
    with pytest.raises(VSpecConfigError, match="vspec.acceptance='margin'.*--worker-cls"):
        wiring.resolve(engine_config(vspec=lossy))
    assert wiring.resolve(engine_config(vspec=lossy, worker_cls=wiring.WORKER_CLS["cpu"]))
    # vLLM-Ascend's worker carries them on NPU, but not a draft-pass skip.
    npu = "vllm_ascend.worker.worker.NPUWorker"
    assert wiring.resolve(engine_config(vspec=lossy, device="npu", worker_cls=npu))
    with pytest.raises(VSpecConfigError, match="vspec.gamma0_mode='lazy'"):
        wiring.resolve(engine_config(vspec={"min_gamma": 0, "gamma0_mode": "lazy"},
                                     device="npu", worker_cls=npu))


@pytest.mark.parametrize("bad, refusal", [
    ({"max_gamma": 9}, "vspec.max_gamma=9"),
    ({"policy": "bandit"}, "vspec.policy='bandit'"),
    ({"min_gamma": 0, "gamma0_mode": "sticky"}, "vspec.gamma0_mode='sticky'"),
    ({"min_gamma": 0, "gamma0_mode": "lazy"}, "vspec.gamma0_mode='lazy'"),
])
def test_an_engine_with_vllms_worker_refuses_these_at_start_up(bad, refusal):
    """What tests/engine/test_adaptive_engine.py's engine-level refusal checks on a
    real engine for one key per path, for the other keys: the same
    `resolve` call the scheduler makes at start-up (stock worker, K 4)."""
    with pytest.raises(VSpecConfigError, match=re.escape(refusal)):
        wiring.resolve(engine_config(vspec=bad))


CPU_WORKER = wiring.WORKER_CLS["cpu"]


@pytest.mark.parametrize("changes, refusal", [
    ({"method": "draft_model"}, r"tree_width=2 .*method eagle \(EAGLE-1\), not draft_model"),
    ({"device": "cuda", "worker_cls": wiring.WORKER_CLS["cuda"]}, r"only on the CPU host"),
    ({"device": "npu", "worker_cls": "vllm_ascend.worker.worker.NPUWorker", "k": 8},
     r"only on the CPU host"),
    ({"async_scheduling": True}, r"not with async scheduling"),
    ({"worker_cls": "auto"}, r"draft-tree verification runs in vspec's model runner"),
    ({"k": 1}, r"at most num_speculative_tokens \(1\)"),
], ids=["draft-model", "cuda", "npu", "async", "vllm-worker", "wider-than-k"])
def test_trees_are_refused_where_the_engine_cannot_verify_them(changes, refusal):
    args = {"method": "eagle", "worker_cls": CPU_WORKER, "vspec": {"tree_width": 2}, **changes}
    with pytest.raises(VSpecConfigError, match=refusal) as err:
        wiring.resolve(engine_config(**args))
    assert err.value.key == "tree_width"


@pytest.mark.parametrize("vspec, key, allowed", [
    ({"tree_width": 0}, "tree_width", r"an integer \[1, 8\]"),
    ({"tree_width": 9}, "tree_width", r"an integer \[1, 8\]"),
    ({"tree_width": 2, "min_tree_width": 3}, "min_tree_width", r"at most tree_width \(2\)"),
    ({"tree_width": 2, "entropy_stop": True}, "tree_width", r"entropy_stop"),
])
def test_bad_tree_settings_name_the_key(vspec, key, allowed):
    with pytest.raises(VSpecConfigError, match=rf"vspec.{key}=.*{allowed}") as err:
        wiring.resolve(engine_config(method="eagle", worker_cls=CPU_WORKER, vspec=vspec))
    assert err.value.key == key


def test_eagle_trees_on_the_cpu_host_resolve():
    cfg = wiring.resolve(engine_config(method="eagle", worker_cls=CPU_WORKER,
                                       vspec={"tree_width": 4, "min_tree_width": 2}))
    assert (cfg.tree_width, cfg.min_tree_width) == (4, 2)
    lossy = wiring.resolve(engine_config(method="eagle", worker_cls=CPU_WORKER,
                                         vspec={"tree_width": 4, "acceptance": "margin"}))
    assert (lossy.tree_width, lossy.acceptance) == (4, "margin")


def test_gamma0_auto_is_lazy_only_with_vspecs_worker():
    settings = {"min_gamma": 0}
    stock = engine_config(vspec=settings)
    ours = engine_config(vspec=settings, worker_cls=wiring.WORKER_CLS["cpu"])
    assert wiring.resolve(stock).gamma0_mode == "sync"
    assert wiring.resolve(ours).gamma0_mode == "lazy"


# ------------------------------------------------------- declared ranges
@pytest.mark.parametrize("raw, allowed", [
    ({"control_interval": 0}, r"an integer >= 1"),
    ({"ewma_weight": 0.0}, r"a number in \(0.0, 1.0\]"),
    ({"latency_ewma_weight": 1.5}, r"a number in \(0.0, 1.0\]"),
    ({"entropy_scale": 0.0}, r"a number > 0.0"),
    ({"margin": -0.5}, r"a number >= 0.0"),
])
def test_a_value_outside_its_fields_declared_range_is_refused_naming_it(raw, allowed):
    from vllm_vspec.config import VSpecConfig

    (key, value), = raw.items()
    with pytest.raises(VSpecConfigError, match=rf"vspec.{key}={value!r} .*{allowed}"):
        VSpecConfig.from_dict(raw)


def test_range_bounds_themselves_are_allowed():
    from vllm_vspec.config import VSpecConfig

    cfg = VSpecConfig.from_dict({"ewma_weight": 1.0, "margin": 0.0, "control_interval": 1})
    assert (cfg.ewma_weight, cfg.margin, cfg.control_interval) == (1.0, 0.0, 1)


# ------------------------------------------------------------- engine args
SPEC = {"method": "draft_model", "model": "d", "num_speculative_tokens": 4}


def test_stock_engine_args_carry_only_the_speculative_config():
    assert wiring.engine_args(SPEC, None, platform="cpu") == {"speculative_config": SPEC}
    assert wiring.engine_args(None, None, platform="cpu") == {}


def test_vspec_engine_args_name_the_scheduler_and_the_platforms_worker():
    for platform, worker in wiring.WORKER_CLS.items():
        args = wiring.engine_args(SPEC, {"protected_token_ids": (1, 2)}, platform=platform)
        assert args["scheduler_cls"] == wiring.SCHEDULER_CLS
        assert args["additional_config"] == {"vspec": {"protected_token_ids": [1, 2]}}
        assert args.get("worker_cls") == worker, platform
    assert "worker_cls" not in wiring.engine_args(SPEC, {}, platform="cpu", with_worker=False)


def test_serve_argv_renders_the_same_arguments_as_flags():
    argv = wiring.serve_argv(wiring.engine_args(SPEC, {"policy": "online"}, platform="cpu"))
    flags = dict(zip(argv[::2], argv[1::2]))
    assert json.loads(flags["--speculative-config"]) == SPEC
    assert json.loads(flags["--additional-config"]) == {"vspec": {"policy": "online"}}
    assert flags["--scheduler-cls"] == wiring.SCHEDULER_CLS
    assert flags["--worker-cls"] == wiring.WORKER_CLS["cpu"]


def test_full_graph_modes_render_piecewise_only_for_vspec_on_cuda():
    assert wiring.graph_mode("full", "cuda", vspec_on=True) == "piecewise"
    assert wiring.graph_mode("full-decode-only", "cuda", vspec_on=True) == "piecewise"
    assert wiring.graph_mode("full", "cuda", vspec_on=False) == "full"
    assert wiring.graph_mode("full-decode-only", "npu", vspec_on=True) == "full-decode-only"
    assert wiring.graph_mode("eager", "cuda", vspec_on=True) == "eager"


# -------------------------------------------------------------- one engine
@pytest.mark.engine
def test_disabled_vspec_runs_a_k_above_ascends_limit_as_stock_vllm(prompts):
    """enabled false, K 17 (1 + K above 16), vspec's scheduler selected: the
    engine starts and drafts the full K every step, as stock vLLM does."""
    from vllm_vspec.tools.engine_runs import read_spec_counters

    k = 17
    llm = make_llm(speculative_config={"method": "draft_model", "model": str(DRAFT),
                                       "num_speculative_tokens": k},
                   vspec={"enabled": False}, disable_log_stats=False)
    try:
        assert scheduler_of(llm).vspec is None
        before = read_spec_counters(llm)
        greedy(llm, prompts[:2], max_tokens=24)
        spec = read_spec_counters(llm) - before
        assert spec.drafts > 0 and spec.draft_tokens == k * spec.drafts, spec
    finally:
        close_llm(llm)


# ------------------------------------------------ per-method refusals (ngram)
# One case per row of wiring.METHOD_REFUSALS, and the tree (config.TREE_REFUSALS'
# ngram row): the table a user may write, the key the refusal names. vspec's
# worker, so no worker rule refuses first.
NGRAM_REFUSED = {
    "tree_width": {"tree_width": 2},
    "entropy_stop": {"entropy_stop": True},
    "gamma0_mode": {"min_gamma": 0, "gamma0_mode": "sticky"},
    "draft_active_vocab_ids": {"draft_active_vocab_ids": "{tmp}/vocab.json"},
    "draft_lm_head_quantization": {"draft_lm_head_quantization": "w8a16"},
    "draft_trace_path": {"draft_trace_path": "{tmp}/draft.jsonl"},
    "draft_io_trace_dir": {"draft_io_trace_dir": "{tmp}/io"},
    "target_hidden_trace_dir": {"target_hidden_trace_dir": "{tmp}/hidden"},
    "target_argmax_trace_path": {"target_argmax_trace_path": "{tmp}/argmax.jsonl"},
}


def test_every_method_refusal_has_its_case():
    assert sorted(k for m, k, _, _ in wiring.METHOD_REFUSALS if m == "ngram") == \
        sorted(set(NGRAM_REFUSED) - {"tree_width"})


@pytest.mark.parametrize("key", sorted(NGRAM_REFUSED))
def test_ngram_refuses_what_needs_a_draft_model_naming_the_key(key, tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(
        {"format": "vspec-active-vocab/1", "vocab_size": 8, "ids": [0, 3, 5]}))
    table = {k: v.format(tmp=tmp_path) if isinstance(v, str) else v
             for k, v in NGRAM_REFUSED[key].items()}
    with pytest.raises(VSpecConfigError, match=rf"vspec\.{key}=.*with method ngram") as err:
        wiring.resolve(engine_config(method="ngram", worker_cls=CPU_WORKER, vspec=table))
    assert err.value.key == key
    # The same table is no refusal of the method's with a draft model
    # (it may still be refused for another reason, never this one).
    try:
        wiring.resolve(engine_config(method="draft_model", worker_cls=CPU_WORKER, vspec=table))
    except VSpecConfigError as other:
        assert "with method ngram" not in str(other)


@pytest.mark.parametrize("vspec", [
    {}, {"min_gamma": 0, "gamma0_mode": "lazy"}, {"min_gamma": 0, "gamma0_mode": "sync"},
    {"acceptance": "margin", "margin": 1.0}, {"acceptance": "relaxed_topk"},
    {"policy": "cycle", "min_gamma": 0}, {"min_gamma": 1, "gamma0_mode": "sticky"},
], ids=["default", "lazy", "sync", "margin", "relaxed", "cycle", "sticky-without-gamma-0"])
def test_ngram_takes_the_rest(vspec):
    assert wiring.resolve(engine_config(method="ngram", worker_cls=CPU_WORKER, vspec=vspec))


def test_ngram_gamma0_auto_is_lazy_on_vspecs_worker_and_sync_on_vllms():
    ours = engine_config(method="ngram", worker_cls=CPU_WORKER, vspec={})
    stock = engine_config(method="ngram", vspec={})
    assert wiring.resolve(ours).gamma0_mode == "lazy"
    assert wiring.resolve(stock).gamma0_mode == "sync"
    # Explicit lazy on vLLM's worker: the runner that skips is vspec's.
    with pytest.raises(VSpecConfigError, match=r"vspec\.gamma0_mode='lazy'.*--worker-cls"):
        wiring.resolve(engine_config(method="ngram", vspec={"gamma0_mode": "lazy"}))


def test_suffix_is_refused_with_vspec_on_and_runs_stock_with_it_off():
    # vLLM 0.32's suffix proposer asserts every step drafts K.
    for worker in ("auto", CPU_WORKER):
        with pytest.raises(VSpecConfigError, match=r"vspec\.enabled=True .*method suffix") as err:
            wiring.resolve(engine_config(method="suffix", worker_cls=worker, vspec={}))
        assert err.value.key == "enabled"
    assert wiring.resolve(engine_config(method="suffix", vspec={"enabled": False})) is None
    assert [k for m, k, _, _ in wiring.METHOD_REFUSALS if m == "suffix"] == ["enabled"]
