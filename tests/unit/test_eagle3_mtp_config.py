"""EAGLE-3 and MTP without an engine: the bundled checkpoints' layout (what
vLLM 0.32 loads), the start-up rules per method, the presets and the bench
variants. The engine side is tests/engine/test_exactness_matrix.py and
tests/engine/test_eagle3_mtp_features.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open

from conftest import MODELS, TARGET, engine_config
from vllm_vspec import cli
from vllm_vspec.bench import variants
from vllm_vspec.config import VSpecConfigError
from vllm_vspec.hosts import wiring
from vllm_vspec.hosts.vllm.worker import CPU_WORKER_CLS
from vllm_vspec.launch import presets

EAGLE3 = MODELS / "tiny-eagle3"
MIMO = MODELS / "tiny-mimo"


def _tensors(path: Path) -> dict[str, tuple[int, ...]]:
    with safe_open(str(path), "pt") as f:
        return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}


# ----------------------------------------------------------- checkpoints
def test_the_eagle3_head_is_vllms_eagle3_llama_layout_over_three_target_layers():
    cfg = json.loads((EAGLE3 / "config.json").read_text())
    target = json.loads((TARGET / "config.json").read_text())
    h = target["hidden_size"]
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["model_type"] == "llama"
    layers = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert layers == cfg["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4]
    # distinct ids within the target (the 4-layer default (2, 2, 1) repeats one)
    assert len(set(layers)) == 3 and max(layers) <= target["num_hidden_layers"]
    shapes = _tensors(EAGLE3 / "model.safetensors")
    assert shapes["fc.weight"] == (h, 3 * h)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (h, 2 * h)   # [embeds ; hidden]
    assert "layers.0.hidden_norm.weight" in shapes and "norm.weight" in shapes
    # the target's embedding and LM head are shared, not stored
    assert not [n for n in shapes if "embed_tokens" in n or "lm_head" in n]
    record = json.loads((EAGLE3 / "eagle3_record.json").read_text())
    assert record["aux_layer_ids"] == layers


def test_the_mimo_checkpoint_is_the_target_plus_one_mtp_layer():
    assert (MIMO / "model.safetensors").is_symlink()
    assert (MIMO / "model.safetensors").resolve() == (TARGET / "model.safetensors").resolve()
    cfg = json.loads((MIMO / "config.json").read_text())
    target = json.loads((TARGET / "config.json").read_text())
    assert cfg["architectures"] == ["MiMoForCausalLM"] and cfg["num_nextn_predict_layers"] == 1
    assert {k: v for k, v in cfg.items() if k not in ("architectures", "num_nextn_predict_layers")} \
        == {k: v for k, v in target.items() if k != "architectures"}
    shapes = _tensors(MIMO / "mtp.safetensors")
    assert all(n.startswith("model.mtp_layers.0.") for n in shapes)
    h = target["hidden_size"]
    assert shapes["model.mtp_layers.0.input_proj.weight"] == (h, 2 * h)
    # vLLM's Qwen2 attention has q/k/v biases: they must be in the file
    assert {f"model.mtp_layers.0.self_attn.{p}_proj.bias" for p in "qkv"} <= set(shapes)


# ------------------------------------------------------------ start-up
@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_gamma_0_is_lazy_for_eagle3_and_sync_for_mtp_and_refusals_name_the_key(method):
    cfg = wiring.resolve(engine_config(method=method, worker_cls=CPU_WORKER_CLS, vspec={}))
    # auto on vspec's worker, synchronous scheduling: EAGLE-3's skipped steps
    # keep the target's hidden states for a catch-up; MTP has no catch-up
    assert cfg.gamma0_mode == {"eagle3": "lazy", "mtp": "sync"}[method]
    refusals = [({"tree_width": 2}, "tree_width")]
    if method == "mtp":
        refusals.append(({"min_gamma": 0, "gamma0_mode": "lazy"}, "gamma0_mode"))
    for table, key in refusals:
        with pytest.raises(VSpecConfigError) as err:
            wiring.resolve(engine_config(method=method, worker_cls=CPU_WORKER_CLS, vspec=table))
        assert err.value.key == key


@pytest.mark.parametrize("table,key", [
    ({"draft_active_vocab_ids": "{tmp}/vocab.json"}, "draft_active_vocab_ids"),
    ({"draft_lm_head_quantization": "w8a16"}, "draft_lm_head_quantization"),
])
def test_mtp_refuses_the_draft_head_keys_naming_them(table, key, tmp_path):
    (tmp_path / "vocab.json").write_text(json.dumps(
        {"format": "vspec-active-vocab/1", "vocab_size": 8, "ids": [0, 3, 5]}))
    table = {k: v.format(tmp=tmp_path) for k, v in table.items()}
    with pytest.raises(VSpecConfigError, match="with method mtp") as err:
        wiring.resolve(engine_config(method="mtp", worker_cls=CPU_WORKER_CLS, vspec=table))
    assert err.value.key == key
    try:  # eagle3 has the draft head's lm_head + logits_processor: not this refusal
        wiring.resolve(engine_config(method="eagle3", worker_cls=CPU_WORKER_CLS, vspec=table))
    except VSpecConfigError as other:
        assert "with method mtp" not in str(other)
    assert sorted(k for m, k, _, _ in wiring.METHOD_REFUSALS if m == "mtp") == \
        sorted(["draft_active_vocab_ids", "draft_lm_head_quantization"])


# -------------------------------------------------------------- presets
def _dry_run(capsys, name: str) -> str:
    assert cli.main(["serve", "--dry-run", "--preset", name]) == 0
    return capsys.readouterr().out


def test_the_tiny_presets_render_eagle3_and_mtp(capsys):
    out = _dry_run(capsys, "tiny-eagle3")
    assert '"method": "eagle3"' in out and "tiny-eagle3" in out
    mtp = presets.load(presets.preset_path("tiny-mtp"))
    assert (mtp.launch.method, mtp.launch.draft_model) == ("mtp", "")
    argv, _ = presets.render(mtp)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "mtp", "num_speculative_tokens": mtp.launch.gamma}  # vLLM: the target's layers
    assert Path(argv[2]).resolve() == MIMO.resolve()


@pytest.mark.parametrize("name", ["qwen3-eagle3", "qwen25-eagle3"])
def test_the_seed_scale_eagle3_presets_are_eagle3(name):
    launch = presets.load(presets.preset_path(name)).launch
    assert launch.method == "eagle3" and launch.gamma == 4 and launch.dtype == "bfloat16"


# ---------------------------------------------------------------- bench
def test_bench_offers_eagle3_variants_when_the_head_exists():
    names = variants.all_variants({"eagle3": EAGLE3})
    want = {f"eagle3-fixed-{k}" for k in range(1, variants.MAX_GAMMA + 1)}
    want |= {"eagle3-online", "eagle3-fixed-0", "eagle3-static-table"}
    assert want <= set(names)
    assert names["eagle3-online"].speculative_config["method"] == "eagle3"
    assert not [n for n in names if n.startswith("eagle3-tree")]
