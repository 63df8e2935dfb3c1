"""The launcher's capture policy: which token counts get a graph under
dynamic gamma (graph_capture.py), and how the rendered command carries them."""

from __future__ import annotations

import json

import pytest

from vllm_vspec.launch import graph_capture, presets


def test_every_batch_size_times_every_verify_width_within_the_budget():
    sizes = graph_capture.capture_sizes("exact", max_num_seqs=3, min_gamma=1, max_gamma=2)
    # widths 1 (drafter passes), 2 and 3 (gamma 1 and 2) for batches 1..3
    assert sizes == sorted({b * w for b in (1, 2, 3) for w in (1, 2, 3)})
    assert max(graph_capture.capture_sizes("exact", 8, 0, 4, max_num_batched_tokens=20)) == 20


@pytest.mark.parametrize("policy,batches", [
    ("power2", [1, 2, 4, 8, 16, 24]),
    ("auto", [1, 2, 4, 8, 16, 24]),
    ("steady", [1, 2, 4, 8, 16, 24]),
    ("exact", list(range(1, 25))),
])
def test_batch_sizes_per_policy_end_at_max_num_seqs(policy, batches):
    assert graph_capture.batch_sizes(policy, 24) == batches


def test_steady_is_vllms_ladder_of_every_eighth_batch():
    assert graph_capture.batch_sizes("steady", 40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert graph_capture.batch_sizes("power2", 40) == [1, 2, 4, 8, 16, 32, 40]


def test_a_static_k_needs_only_its_own_width_and_the_drafters():
    assert graph_capture.verify_widths(1, 4, dynamic=False) == [1, 5]
    assert graph_capture.verify_widths(0, 4) == [1, 2, 3, 4, 5]


def _rendered(platform: str, **launch):
    preset = presets.load(presets.preset_path("draft"),
                          {"launch": {"platform": platform, **launch}})
    argv, _ = presets.render(preset)
    return preset, argv


@pytest.mark.parametrize("platform", ["cuda", "npu"])
def test_the_command_captures_every_width_gamma_can_run(platform):
    preset, argv = _rendered(platform, graph_mode="full-decode-only", max_num_seqs=16, gamma=3)
    config = json.loads(argv[argv.index("--compilation-config") + 1])
    widths = graph_capture.verify_widths(preset.vspec.min_gamma, 3)
    assert config["cudagraph_capture_sizes"] == sorted(
        {b * w for b in (1, 2, 4, 8, 16) for w in widths})
    assert "capture_policy auto" in presets.graph_note(preset)


def test_eager_and_cpu_render_no_capture_sizes_and_say_why():
    preset, argv = _rendered("cpu", graph_mode="full")
    assert "--compilation-config" not in argv
    assert presets.graph_note(preset).startswith("graphs: do not apply on cpu")
    preset, argv = _rendered("cuda", graph_mode="eager")
    assert "--enforce-eager" in argv and "--compilation-config" not in argv
    assert presets.graph_note(preset) == "graphs: none (graph_mode eager)"


def test_an_unknown_capture_policy_is_refused_naming_the_key():
    with pytest.raises(presets.PresetError, match="launch.capture_policy='every'"):
        presets.load(presets.preset_path("draft"), {"launch": {"capture_policy": "every"}})
