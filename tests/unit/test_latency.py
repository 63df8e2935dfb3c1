"""Latency model: profile schema validation, NNLS, fitting, shipped profiles."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from vllm_vspec.cli import main as cli_main
from vllm_vspec.core.latency import (LatencyProfile, LinearLatency, PrefillCost, ProfileError,
                                     fit_prefill, fit_profile, load_profile, nnls,
                                     profile_from_dict, save_profile)

REPO = Path(__file__).resolve().parents[2]
TRUE = LatencyProfile(target=LinearLatency(0.0002, 0.25, 40.0),
                      draft=LinearLatency(0.00001, 0.02, 12.0), name="true")


def valid() -> dict:
    return TRUE.to_dict()


# ------------------------------------------------------------------ schema
@pytest.mark.parametrize("edit, key", [
    (lambda d: d.pop("target"), "target"),
    (lambda d: d["target"].pop("beta"), "target.beta"),
    (lambda d: d["draft"].__setitem__("delta", -1.0), "draft.delta"),
    (lambda d: d["draft"].__setitem__("alpha", "fast"), "draft.alpha"),
    (lambda d: d["target"].__setitem__("gamma", 1.0), "target.gamma"),
    (lambda d: d.__setitem__("version", 2), "version"),
    (lambda d: d.__setitem__("schema", "something-else"), "schema"),
    (lambda d: d.__setitem__("colour", "red"), "colour"),
    (lambda d: d.__setitem__("source", "guessed"), "source"),
    (lambda d: d.__setitem__("prefill", {"target": 0.1}), "prefill"),
    (lambda d: d.__setitem__("prefill", {"target": 0.1, "draft": -0.1}), "prefill.draft"),
])
def test_schema_errors_name_the_key(edit, key):
    raw = valid()
    edit(raw)
    with pytest.raises(ProfileError) as err:
        profile_from_dict(raw)
    assert err.value.key == key
    assert key in str(err.value)


def test_profile_round_trips_through_json(tmp_path):
    save_profile(TRUE, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == TRUE


def test_prompt_prices_round_trip_and_a_profile_without_them_prices_prompts_at_beta(tmp_path):
    priced = LatencyProfile(target=TRUE.target, draft=TRUE.draft, prefill=PrefillCost(0.4, 0.05))
    save_profile(priced, tmp_path / "p.json")
    assert load_profile(tmp_path / "p.json") == priced
    assert priced.prompt_ms(100, drafter=False) == pytest.approx(40.0)
    assert priced.prompt_ms(100, drafter=True) == pytest.approx(45.0)
    assert TRUE.prompt_ms(100, drafter=True) == pytest.approx(100 * (0.25 + 0.02))


def test_step_time_sums_drafts_and_verification():
    # B=2, ctx=100, gamma=2: drafts at ctx 100 and 102 with n=2, target n=6.
    want = (TRUE.draft(100, 2) + TRUE.draft(102, 2)) + TRUE.target(100, 6)
    assert TRUE.step_ms(2, 2, 100.0) == pytest.approx(want)


@pytest.mark.parametrize("name", ["ascend-910b-qwen25-14b-draft", "ascend-910b-qwen25-14b-eagle"])
def test_shipped_ascend_profiles_load_and_say_they_are_derived(name):
    profile = load_profile(REPO / "profiles" / f"{name}.json")
    assert profile.source == "derived"
    assert "calibrate on your machine" in profile.note
    # They reproduce the published target-only figure: 1573 tok/s at batch 128.
    assert 128 / (profile.step_ms(0, 128, 128 * 512.0) / 1000) == pytest.approx(1573, rel=1e-3)


# ------------------------------------------------------------------ NNLS
def brute_force_nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Reference: the best least-squares solution over every support set
    whose unconstrained solution is non-negative."""
    n = a.shape[1]
    best, best_err = np.zeros(n), np.linalg.norm(b)
    for k in range(1, n + 1):
        for support in itertools.combinations(range(n), k):
            x = np.zeros(n)
            x[list(support)] = np.linalg.lstsq(a[:, support], b, rcond=None)[0]
            if (x >= -1e-12).all() and np.linalg.norm(a @ x - b) < best_err - 1e-12:
                best, best_err = x, np.linalg.norm(a @ x - b)
    return best


@pytest.mark.parametrize("seed", range(5))
def test_nnls_matches_a_brute_force_reference(seed):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(12, 4))
    b = rng.normal(size=12)          # random targets: some coefficients clamp at 0
    np.testing.assert_allclose(nnls(a, b), brute_force_nnls(a, b), atol=1e-8)


def test_nnls_never_returns_negative_coefficients():
    a = np.eye(3)
    assert (nnls(a, np.array([1.0, -2.0, 3.0])) == np.array([1.0, 0.0, 3.0])).all()


# ------------------------------------------------------------------ fitting
def step_samples(profile: LatencyProfile, noise: float = 0.0, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    out = []
    for gamma, batch, ctx_per_req in itertools.product(range(5), (1, 4, 16, 64), (64, 512)):
        ms = profile.step_ms(gamma, batch, batch * ctx_per_req)
        out.append({"kind": "step", "gamma": gamma, "batch": batch,
                    "ctx": batch * ctx_per_req, "ms": ms * (1 + noise * rng.standard_normal())})
    return out


def coeffs(p: LatencyProfile) -> np.ndarray:
    return np.array([p.target.alpha, p.target.beta, p.target.delta,
                     p.draft.alpha, p.draft.beta, p.draft.delta])


def test_fit_recovers_known_coefficients_from_step_samples():
    fitted = fit_profile(step_samples(TRUE))
    np.testing.assert_allclose(coeffs(fitted), coeffs(TRUE), rtol=1e-6)


def test_fit_recovers_known_coefficients_from_forward_samples():
    samples = [{"kind": kind, "ctx": ctx, "n": n, "ms": getattr(TRUE, kind)(ctx, n)}
               for kind in ("target", "draft") for ctx in (100, 5000, 40000) for n in (1, 8, 64)]
    np.testing.assert_allclose(coeffs(fit_profile(samples)), coeffs(TRUE), rtol=1e-6)


def test_prompt_prices_are_recovered_from_prefill_steps_on_top_of_the_decode_model():
    true = LatencyProfile(target=TRUE.target, draft=TRUE.draft, prefill=PrefillCost(0.4, 0.05))
    samples = [{"kind": "prefill", "engine": "step" if g else "target", "gamma": g, "batch": b,
                "tokens": b * 180,
                "ms": true.split_step_ms(b, g, b, b * 180) + true.prompt_ms(b * 180, g > 0)}
               for g in (0, 1, 3) for b in (1, 8, 32)]
    got = fit_prefill(samples, TRUE)
    assert (got.target, got.draft) == pytest.approx((0.4, 0.05))


def test_the_drafters_prompt_price_comes_from_the_draft_model_alone_where_it_ran_alone():
    samples = [{"kind": "prefill", "engine": engine, "gamma": 0, "batch": b, "tokens": b * 180,
                "ms": getattr(TRUE, engine)(b * 180, b) + fixed + price * b * 180}
               for engine, fixed, price in (("target", 20.0, 0.4), ("draft", 3.0, 0.02))
               for b in (1, 8, 32)]
    got = fit_prefill(samples, TRUE)
    assert (got.target, got.draft) == pytest.approx((0.4, 0.02))


def test_prompt_prices_need_prefill_steps_with_and_without_a_drafter():
    target_only = [{"kind": "prefill", "engine": "target", "gamma": 0, "batch": 1,
                    "tokens": 180, "ms": 90.0}]
    with pytest.raises(ProfileError, match="drafter alone"):
        fit_prefill(target_only, TRUE)


def test_fit_with_noisy_samples_predicts_step_times_closely():
    fitted = fit_profile(step_samples(TRUE, noise=0.02))
    for gamma, batch in ((0, 1), (2, 16), (4, 64)):
        assert fitted.step_ms(gamma, batch, batch * 300.0) == pytest.approx(
            TRUE.step_ms(gamma, batch, batch * 300.0), rel=0.05)


def test_fit_profile_command_writes_a_loadable_profile(tmp_path, capsys):
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps({"name": "t", "device": "cpu", "samples": step_samples(TRUE)}))
    out = tmp_path / "profile.json"
    assert cli_main(["profile", "fit", str(samples), str(out)]) == 0
    profile = load_profile(out)
    assert profile.source == "measured" and profile.device == "cpu"
    np.testing.assert_allclose(coeffs(profile), coeffs(TRUE), rtol=1e-6)
    assert "relative error" in capsys.readouterr().out


def test_fit_profile_rejects_a_bad_sample_naming_it(tmp_path, capsys):
    samples = tmp_path / "samples.json"
    samples.write_text(json.dumps([{"kind": "step", "gamma": 1, "batch": 2, "ctx": 10}]))
    # A user error: one line on stderr, exit 2 (cli.main).
    assert cli_main(["profile", "fit", str(samples), str(tmp_path / "p.json")]) == 2
    assert "samples[0].ms=None" in capsys.readouterr().err
