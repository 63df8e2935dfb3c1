"""Drafter store (`vllm-vspec models`) on local fixture directories: tiny
configs, tiny safetensors, tiny tokenizers. Never the network."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from vllm_vspec import cli
from vllm_vspec.tools import drafters

DRAFT, EAGLE = drafters.DRAFTERS["draft"], drafters.DRAFTERS["eagle"]
VOCAB = ["a", "b", "c", "<|im_end|>"]


def make_model(path: Path, arch: str, vocab: list[str] = VOCAB, weights: bool = True) -> Path:
    """A directory shaped like a Hugging Face checkpoint, a few bytes big."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch],
                                                  "vocab_size": len(vocab)}))
    if weights:
        save_file({"w": np.zeros((2, 2), dtype=np.float32)}, str(path / "model.safetensors"))
    (path / "tokenizer.json").write_text(json.dumps(
        {"model": {"vocab": {t: i for i, t in enumerate(vocab)}}, "added_tokens": []}))
    return path


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict[str, str]:
    """An isolated environment: every location the store looks at is under tmp."""
    values = {"HOME": str(tmp_path / "home"), "XDG_CONFIG_HOME": str(tmp_path / "config"),
              "XDG_DATA_HOME": str(tmp_path / "data"), "VSPEC_MODEL_DIR": str(tmp_path / "shared"),
              "HF_HOME": str(tmp_path / "hf")}
    for key in ("VSPEC_DRAFT_MODEL", "VSPEC_EAGLE_MODEL", "VSPEC_MODEL_REGISTRY",
                "HF_HUB_CACHE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


def shared(env, d: drafters.Drafter) -> Path:
    return Path(env["VSPEC_MODEL_DIR"]) / d.name


def run_models(capsys, *argv: str) -> tuple[int, dict]:
    rc = cli.main(["models", "--json", *argv])
    return rc, json.loads(capsys.readouterr().out)


def by_kind(out: dict) -> dict[str, dict]:
    return {r["kind"]: r for r in out["drafters"]}


def test_drafters_in_the_shared_directory_are_found_and_registered(env, capsys):
    make_model(shared(env, DRAFT), "Qwen2ForCausalLM")
    make_model(shared(env, EAGLE), "Qwen2ForCausalLMEagle")
    rc, out = run_models(capsys)
    assert rc == 0
    found = by_kind(out)
    assert {k: (r["status"], r["source"]) for k, r in found.items()} == {
        "draft": ("found", "model_dir"), "eagle": ("found", "model_dir")}
    registry = Path(env["XDG_CONFIG_HOME"]) / "vllm-vspec" / "models.json"
    assert out["registry"] == str(registry)
    entries = json.loads(registry.read_text())["drafters"]
    assert entries["draft"]["path"] == str(shared(env, DRAFT))
    assert entries["eagle"]["repo"] == EAGLE.repo


def test_the_environment_variable_wins_over_the_shared_directory(env, tmp_path, monkeypatch):
    make_model(shared(env, DRAFT), "Qwen2ForCausalLM")
    mine = make_model(tmp_path / "mine", "Qwen2ForCausalLM")
    monkeypatch.setenv("VSPEC_DRAFT_MODEL", str(mine))
    result = drafters.find(DRAFT, dict(os.environ))
    assert (result.status, result.path, result.source) == ("found", str(mine), "env VSPEC_DRAFT_MODEL")


def test_a_wrong_environment_path_fails_instead_of_falling_back(env, tmp_path, monkeypatch, capsys):
    make_model(shared(env, DRAFT), "Qwen2ForCausalLM")
    monkeypatch.setenv("VSPEC_DRAFT_MODEL", str(tmp_path / "nowhere"))
    rc, out = run_models(capsys, "--only", "draft")
    result = by_kind(out)["draft"]
    assert rc == 1 and result["status"] == "missing"
    assert "VSPEC_DRAFT_MODEL" in result["problems"][0] and "nowhere" in result["problems"][0]


def test_the_hugging_face_cache_snapshot_is_found(env):
    repo = Path(env["HF_HOME"]) / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct"
    make_model(repo / "snapshots" / "abc123", "Qwen2ForCausalLM")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    result = drafters.find(DRAFT, env)
    assert (result.status, result.source) == ("found", "hf_cache")
    assert result.path.endswith("snapshots/abc123")


def test_an_existing_registry_entry_is_used(env, tmp_path, capsys):
    elsewhere = make_model(tmp_path / "elsewhere", "EagleQwen2ForCausalLM")
    registry = tmp_path / "reg.json"
    registry.write_text(json.dumps({"schema_version": drafters.REGISTRY_SCHEMA,
                                    "drafters": {"eagle": {"path": str(elsewhere)}}}))
    rc, out = run_models(capsys, "--only", "eagle", "--registry", str(registry))
    result = by_kind(out)["eagle"]
    assert rc == 0 and (result["source"], result["path"]) == ("registry", str(elsewhere))
    assert result["architecture"] == "EagleQwen2ForCausalLM"  # the alias is accepted


@pytest.mark.parametrize("arch, weights, needle", [
    ("LlamaForCausalLM", True, "architectures=['LlamaForCausalLM']"),
    ("Qwen2ForCausalLM", False, "no non-empty weights"),
])
def test_an_invalid_copy_is_reported_with_the_reason(env, arch, weights, needle):
    make_model(shared(env, DRAFT), arch, weights=weights)
    result = drafters.find(DRAFT, env)
    assert result.status == "missing"
    assert any(needle in p for p in result.problems), result.problems


def test_empty_weight_files_are_refused(env):
    path = make_model(shared(env, EAGLE), "Qwen2ForCausalLMEagle")
    (path / "model-00002.safetensors").write_bytes(b"")
    arch, size, problems = drafters.validate(EAGLE, path)
    assert size > 0 and any("empty: model-00002.safetensors" in p for p in problems), problems


def test_shards_missing_from_the_index_are_refused(env):
    path = make_model(shared(env, EAGLE), "Qwen2ForCausalLMEagle")
    (path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"w": "model.safetensors", "v": "model-00002-of-00002.safetensors"}}))
    _, _, problems = drafters.validate(EAGLE, path)
    assert any("model-00002-of-00002.safetensors" in p for p in problems), problems


def test_draft_tokenizer_must_agree_with_the_target_on_shared_ids(env, tmp_path, capsys):
    make_model(shared(env, DRAFT), "Qwen2ForCausalLM")
    padded = make_model(tmp_path / "target-ok", "Qwen2ForCausalLM", VOCAB + ["<pad>"])
    rc, out = run_models(capsys, "--only", "draft", "--target", str(padded))
    assert rc == 0, out  # a larger (padded) target vocabulary is fine
    other = make_model(tmp_path / "target-bad", "Qwen2ForCausalLM", ["a", "x", "c", "<|im_end|>"])
    rc, out = run_models(capsys, "--only", "draft", "--target", str(other))
    problems = by_kind(out)["draft"]["problems"]
    assert rc == 1 and any("1 of 4 shared ids differ (1: 'b' vs 'x')" in p for p in problems), problems


def test_the_eagle_head_needs_no_tokenizer_check(env, tmp_path):
    path = make_model(shared(env, EAGLE), "Qwen2ForCausalLMEagle")
    (path / "tokenizer.json").unlink()
    assert drafters.validate(EAGLE, path, target=tmp_path)[2] == []


def test_missing_drafters_are_not_downloaded_unless_asked(env, capsys, monkeypatch):
    def no_network(**_):
        raise AssertionError("snapshot_download called without --download")
    monkeypatch.setattr("huggingface_hub.snapshot_download", no_network)
    rc = cli.main(["models"])
    out = capsys.readouterr().out
    assert rc == 1 and "--download" in out and "VSPEC_DRAFT_MODEL" in out
    assert not (Path(env["XDG_CONFIG_HOME"]) / "vllm-vspec" / "models.json").exists()


@pytest.mark.parametrize("shared_exists", [True, False])
def test_download_fetches_into_the_shared_directory_when_writable(env, capsys, monkeypatch,
                                                                  shared_exists):
    calls = []

    def fake_snapshot_download(repo_id, local_dir):
        calls.append(repo_id)
        make_model(Path(local_dir), "Qwen2ForCausalLM")
        return local_dir
    monkeypatch.setattr("huggingface_hub.snapshot_download", fake_snapshot_download)
    if shared_exists:
        Path(env["VSPEC_MODEL_DIR"]).mkdir()
    rc, out = run_models(capsys, "--only", "draft", "--download")
    result = by_kind(out)["draft"]
    root = Path(env["VSPEC_MODEL_DIR"]) if shared_exists else (
        Path(env["XDG_DATA_HOME"]) / "vllm-vspec" / "models")
    assert rc == 0 and calls == [DRAFT.repo]
    assert (result["source"], result["path"]) == ("download", str(root / DRAFT.name))


def test_download_refuses_when_the_hub_is_offline(env, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["models", "--only", "draft", "--download"]) == 2
    assert "HF_HUB_OFFLINE" in capsys.readouterr().err


def test_a_corrupt_registry_is_named(env, tmp_path, capsys):
    registry = tmp_path / "reg.json"
    registry.write_text("{not json")
    assert cli.main(["models", "--registry", str(registry)]) == 2
    assert str(registry) in capsys.readouterr().err


def test_the_launcher_uses_the_registered_local_copy(env, capsys):
    make_model(shared(env, DRAFT), "Qwen2ForCausalLM")
    assert cli.main(["models", "--only", "draft"]) == 0
    capsys.readouterr()
    assert cli.main(["serve", "--dry-run", "--preset", "draft"]) == 0
    command = capsys.readouterr().out.strip().splitlines()[-1]
    assert f'"model": "{shared(env, DRAFT)}"' in command
