"""`vllm-vspec profile collect`: which engine steps become samples, and that the
samples it writes fit (vllm_vspec.core.latency) into a profile that loads back."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from conftest import run_command
from vllm_vspec.core.latency import LatencyProfile, LinearLatency, fit_profile, load_profile, \
    profile_predict, save_profile, validate_samples
from vllm_vspec.tools.profile_collect import EngineRun, Shape, decode_samples, engine_runs

REPO = Path(__file__).resolve().parents[2]


def _fake_steps(outputs):
    """step_fn replaying per-step {request: output tokens so far}."""
    it = iter(outputs)
    return lambda: next(it)


def test_prefill_and_first_decode_step_are_not_samples():
    run = EngineRun("target", Path("t"))
    steps = [{"a": 1, "b": 1},            # prefill
             {"a": 2, "b": 2},            # first decode: warm-up
             {"a": 3, "b": 3}, {"a": 4, "b": 4}]
    got = list(decode_samples(run, _fake_steps(steps), Shape(batch=2, prompt_len=10), 2))
    # ctx at the start of a step: prompt + tokens so far, summed over the batch.
    assert [(s["kind"], s["n"], s["ctx"]) for s in got] == [("target", 2, 24), ("target", 2, 26)]


def test_with_prefill_a_batchs_first_step_is_a_prefill_sample_of_its_prompt_tokens():
    run = EngineRun("step", Path("t"), Path("d"), gamma=1, k=4)
    steps = [{"a": 1, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 3}]
    got = list(decode_samples(run, _fake_steps(steps), Shape(batch=2, prompt_len=10), 1,
                              prefill=True))
    assert [(s["kind"], s.get("engine"), s["gamma"], s.get("tokens")) for s in got] == [
        ("prefill", "step", 1, 20), ("step", None, 1, None)]


def test_a_step_that_did_not_advance_the_whole_batch_is_skipped():
    run = EngineRun("step", Path("t"), Path("d"), gamma=2)
    steps = [{"a": 1, "b": 1}, {"a": 3, "b": 2}, {"a": 6}, {"a": 9, "b": 5}]
    got = list(decode_samples(run, _fake_steps(steps), Shape(batch=2, prompt_len=4), 1))
    assert got == [{"kind": "step", "gamma": 2, "batch": 2, "ctx": 4 + 6 + 4 + 2,
                    "ms": got[0]["ms"]}]


def test_step_engines_are_one_per_gamma():
    runs = engine_runs(["target", "step"], Path("t"), Path("d"), [1, 3])
    assert [(r.kind, r.gamma, r.draft) for r in runs] == [
        ("target", 0, None), ("step", 1, Path("d")), ("step", 3, Path("d"))]


def test_samples_of_every_kind_fit_back_to_the_profile_that_made_them(tmp_path):
    truth = LatencyProfile(target=LinearLatency(0.002, 0.3, 9.0),
                           draft=LinearLatency(0.0005, 0.05, 1.5))
    runs = engine_runs(["target", "draft", "step"], Path("t"), Path("d"), [1, 2, 4])
    samples = []
    for run in runs:
        for batch in (1, 4, 16):
            for ctx in (64 * batch, 300 * batch):
                s = run.sample(batch, ctx, 0.0)
                s["ms"] = profile_predict(truth, s)
                samples.append(s)
    validate_samples(samples)
    path = tmp_path / "p.json"
    save_profile(fit_profile(samples, name="round-trip"), path)
    fitted = load_profile(path)
    for s in samples:
        assert profile_predict(fitted, s) == pytest.approx(s["ms"], rel=1e-6), s


@pytest.mark.engine
def test_collection_on_the_bundled_models_writes_samples_and_a_loadable_profile(tmp_path):
    samples, profile = tmp_path / "s.json", tmp_path / "p.json"
    proc = run_command(
        [sys.executable, "-m", "vllm_vspec.cli", "profile", "collect",
         "--target", str(REPO / "models/tiny-target"), "--draft", str(REPO / "models/tiny-draft"),
         "--kinds", "target,step", "--gammas", "2", "--batch-sizes", "1,3",
         "--prompt-lens", "16", "--decode-steps", "3", "--kv-cache-memory-bytes", str(64 << 20),
         "--samples", str(samples), "--profile", str(profile),
         # Eager: the engines run stock vLLM (torch.compile is its own part);
         # what is ours is that the flag reaches the samples and the profile.
         "--enforce-eager"],
        timeout_s=900, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    raw = json.loads(samples.read_text())
    kinds = [(s["kind"], s.get("gamma"), s.get("batch", s.get("n"))) for s in
             validate_samples(raw)]
    # 2 engines x 2 batch sizes x 3 decode steps, in collection order.
    assert kinds == [("target", None, 1)] * 3 + [("target", None, 3)] * 3 + \
        [("step", 2, 1)] * 3 + [("step", 2, 3)] * 3
    assert raw["enforce_eager"] is True
    fitted = load_profile(profile)
    assert fitted.source == "measured" and "tiny-target" in fitted.note
    assert "float32, eager" in fitted.note, fitted.note
    assert all(profile_predict(fitted, s) > 0 for s in raw["samples"])
