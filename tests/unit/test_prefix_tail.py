"""hosts/vllm/prefix_tail.keep_prefix_tail: which engines keep target-only's
prefix-cache hits (no engine; the engine test is test_gamma0_path's
test_eagle_at_gamma_0_keeps_target_onlys_prefix_cache_hits).

Spec: for method eagle and eagle3 the host's block drop is switched off
(SpeculativeConfig.disable_eagle_block_drop); left on for other methods
(MTP included), hybrid models, engines whose drafter's KV group the host
marked, and hosts without the switch; a switch already off stays off and
reports nothing done. vLLM 0.32 has the switch.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_vspec.hosts.vllm.prefix_tail import keep_prefix_tail


def _engine(method: str | None = "eagle", *, hybrid: bool = False, marked: bool = False,
            switch: bool | None = False):
    """(vllm_config, kv_cache_config) stand-ins; switch None: a host without it."""
    spec = None if method is None else SimpleNamespace(method=method)
    if spec is not None and switch is not None:
        spec.disable_eagle_block_drop = switch
    return (SimpleNamespace(speculative_config=spec, model_config=SimpleNamespace(is_hybrid=hybrid)),
            SimpleNamespace(kv_cache_groups=[SimpleNamespace(is_eagle_group=False),
                                             SimpleNamespace(is_eagle_group=marked)]))


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_eagle_heads_keep_the_last_block(method):
    config, kv = _engine(method)
    assert keep_prefix_tail(config, kv)
    assert config.speculative_config.disable_eagle_block_drop is True


@pytest.mark.parametrize("method, overrides", [
    ("mtp", {}), ("draft_model", {}), ("ngram", {}),
    ("eagle", {"hybrid": True}), ("eagle", {"marked": True}), ("eagle", {"switch": None}),
], ids=["mtp", "draft_model", "ngram", "hybrid", "marked-group", "no-switch"])
def test_other_engines_are_left_as_the_host_has_them(method, overrides):
    config, kv = _engine(method, **overrides)
    assert not keep_prefix_tail(config, kv)
    assert getattr(config.speculative_config, "disable_eagle_block_drop", False) is False


def test_no_speculation_and_a_switch_already_off_change_nothing():
    assert not keep_prefix_tail(*_engine(None))
    config, kv = _engine("eagle", switch=True)
    assert not keep_prefix_tail(config, kv)
    assert config.speculative_config.disable_eagle_block_drop is True


def test_the_installed_host_has_the_switch():
    from vllm.config import SpeculativeConfig

    assert "disable_eagle_block_drop" in SpeculativeConfig.__dataclass_fields__
