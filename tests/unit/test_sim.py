"""The simulator: it drives the engine's own controller, its baselines are
right, and the oracle bounds every fixed gamma."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_vspec.sim import simulator as sim
from vllm_vspec.cli import main as cli_main
from vllm_vspec.core.controller import GammaController
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.latency import LatencyProfile, LinearLatency, PrefillCost, load_profile
from vllm_vspec.core.policies.online import OnlinePolicy
from vllm_vspec.core.policies.profile import ProfilePolicy

REPO = Path(__file__).resolve().parents[2]
ASCEND = str(REPO / "profiles" / "ascend-910b-qwen25-14b-draft.json")
K = 4


@pytest.fixture(scope="module")
def results():
    """Phase-shifting and bursty workloads (where the best gamma moves), all
    contenders, on the Ascend-figure model."""
    workloads = [sim.phase_shift(16, tokens=24576), sim.bursty(tokens=49152)]
    return sim.compare(workloads, ASCEND, K)


def by_policy(results, workload_prefix: str) -> dict[str, float]:
    return {r.policy: r.tok_s for r in results if r.workload.startswith(workload_prefix)}


def test_fixed_online_and_profile_are_the_engine_controller():
    profile = load_profile(ASCEND)
    wl = sim.steady(4, tokens=1024)
    built = {name: factory(sim.SimClock(), [()])
             for name, factory in sim.contenders(ASCEND, profile, wl, K, None, {})}
    assert all(isinstance(built[f"fixed-{g}"], GammaController) for g in range(K + 1))
    assert isinstance(built["online"].policy, OnlinePolicy)
    assert isinstance(built["profile"].policy, ProfilePolicy)


@pytest.mark.parametrize("workload", ["phase", "bursty"])
def test_oracle_beats_every_fixed_gamma(results, workload):
    """The oracle takes each step's argmax of steady-state goodput; it does
    not plan a step's effect on the next (which verifies this step's
    drafts, for the requests it admits too), so on a load whose batch size
    jumps a fixed gamma may come out a few tenths of a percent ahead of it
    (bursty: fixed-2 0.35% ahead since a simulated prefill step drafts the
    arm in force, 2026-12-01)."""
    tok_s = by_policy(results, workload)
    fixed = {k: v for k, v in tok_s.items() if k.startswith("fixed-")}
    assert len(fixed) == K + 1
    assert all(tok_s["oracle"] >= 0.995 * v for v in fixed.values()), tok_s


@pytest.mark.parametrize("workload", ["phase", "bursty"])
def test_online_stays_within_5_percent_of_the_oracle(results, workload):
    tok_s = by_policy(results, workload)
    assert tok_s["online"] >= 0.95 * tok_s["oracle"], tok_s


def test_online_keeps_up_with_the_best_fixed_gamma_when_every_request_accepts_differently():
    # Issue 29: at concurrency 1 each request moves the acceptance; online
    # follows it with probes and estimates of single requests, and must not
    # pay more for that than a fixed gamma loses by not following (0.974x
    # here; the per-request oracle 1.011x). The CPU host's profile, lazy
    # gamma 0 as vspec's vLLM runner has it.
    wl = sim.per_request(1, tokens=8192)
    results = sim.compare([wl], str(REPO / "profiles" / "cpu-tiny-draft.json"), K,
                          gamma0_mode="lazy")
    tok_s = {r.policy: r.tok_s for r in results}
    best = max(v for k, v in tok_s.items() if k.startswith("fixed-"))
    assert tok_s["online"] >= 0.97 * best, tok_s


def test_every_contender_commits_the_whole_workload(results):
    for wl in {r.workload for r in results}:
        assert len({r.tokens for r in results if r.workload == wl}) == 1


# Draft passes that cost exactly 1 ms per token processed, or 1 ms per pass.
DRAFT_PER_TOKEN = LatencyProfile(target=LinearLatency(0.0, 0.1, 10.0),
                                 draft=LinearLatency(0.0, 1.0, 0.0))
DRAFT_PER_PASS = LatencyProfile(target=LinearLatency(0.0, 0.1, 10.0),
                                draft=LinearLatency(0.0, 0.0, 1.0))


class _Schedule:
    """Gamma 0 for the first `zeros` steps, then `gamma` (a StepPolicy)."""

    def __init__(self, zeros: int, gamma: int):
        self.zeros, self.gamma, self.steps = zeros, gamma, 0

    def decide(self, batch):
        self.steps += 1
        return sim.Decision(0 if self.steps <= self.zeros else self.gamma, 1, "test")

    def observe(self, fb):
        pass


def _seconds(policy, mode, drafter=True, profile=DRAFT_PER_TOKEN):
    wl = sim.Workload("w", 4, 16, (40, 40), sim.Cycle(((1, 4),)), sim.Cycle(((1, (0.5,)),)))
    return sim.simulate(wl, profile, policy, sim.SimClock(), name="x", max_gamma=2,
                        noise=0.0, gamma0_mode=mode, drafter=drafter).seconds


def test_a_sync_gamma_0_step_runs_one_draft_pass_and_target_only_none():
    # 4 requests x 40 tokens at gamma 0: 40 steps, each a 4-token draft pass.
    target = _seconds(_Schedule(10**6, 0), "sync", drafter=False)
    assert _seconds(_Schedule(10**6, 0), "sync") == pytest.approx(target + 40 * 4 / 1000)
    assert _seconds(_Schedule(10**6, 0), "lazy") == pytest.approx(target)


def test_a_lazy_gamma_0_stretch_is_caught_up_in_one_pass_when_drafting_resumes():
    # 10 steps at gamma 0 commit 4 x 10 tokens the draft did not see. Sync
    # runs them through the draft in 10 passes as they come, lazy in one pass
    # at the first drafting step: the same tokens, 9 passes fewer.
    def gap(profile):
        return (_seconds(_Schedule(10, 2), "sync", profile=profile)
                - _seconds(_Schedule(10, 2), "lazy", profile=profile))
    assert gap(DRAFT_PER_TOKEN) == pytest.approx(0.0)
    assert gap(DRAFT_PER_PASS) == pytest.approx(9 / 1000)


def _prefill_seconds(policy, mode, drafter=True, draft_price=0.2):
    """4 requests of 16-token prompts admitted by the first step, 40 tokens
    each, with prompt tokens priced (0.5 ms a token for the target)."""
    profile = LatencyProfile(target=DRAFT_PER_TOKEN.target, draft=DRAFT_PER_TOKEN.draft,
                             prefill=PrefillCost(0.5, draft_price))
    wl = sim.Workload("w", 4, 16, (40, 40), sim.Cycle(((1, 4),)), sim.Cycle(((1, (0.5,)),)))
    return sim.simulate(wl, profile, policy, sim.SimClock(), name="x", max_gamma=2, noise=0.0,
                        gamma0_mode=mode, drafter=drafter, prefill=True).seconds


def test_a_lazy_drafter_that_never_drafts_never_prefills_a_prompt():
    never = _Schedule(10**6, 0)
    assert _prefill_seconds(never, "lazy") == pytest.approx(
        _prefill_seconds(_Schedule(10**6, 0), "lazy", drafter=False))
    # Sync gamma 0 runs the drafter every step: its pass over each step's
    # 4 new tokens (1 ms a token) and over the 4 x 16 prompt tokens.
    assert _prefill_seconds(_Schedule(10**6, 0), "sync") - _prefill_seconds(never, "lazy") == (
        pytest.approx((40 * 4 + 64 * 0.2) / 1000))


@pytest.mark.parametrize("zeros", [0, 1, 5])
def test_the_drafter_pays_for_every_prompt_once_whether_at_admission_or_at_its_catch_up(zeros):
    # The same schedule (gamma 0 for `zeros` steps, then 2) with and without
    # a price on the drafter's prompt tokens: the prompts cost it 4 x 16 x
    # 0.2 ms, and its catch-up runs at that price over the 4 tokens each
    # gamma-0 step committed too (a catch-up is a pass of many tokens a
    # request, as a prefill is).
    gap = (_prefill_seconds(_Schedule(zeros, 2), "lazy")
           - _prefill_seconds(_Schedule(zeros, 2), "lazy", draft_price=0.0))
    assert gap == pytest.approx((64 + 4 * zeros) * 0.2 / 1000)


def test_a_controller_that_prices_steps_hears_the_prefill_steps_it_did_not_decide():
    clock = sim.SimClock()
    controller = GammaController(VSpecConfig.from_dict({"policy": "model"}, 2), 2, clock=clock)
    wl = sim.Workload("w", 12, 16, (20, 20), sim.Cycle(((1, 4),)), sim.Cycle(((1, (0.5,)),)))
    profile = LatencyProfile(target=DRAFT_PER_TOKEN.target, draft=DRAFT_PER_TOKEN.draft,
                             prefill=PrefillCost(0.5, 0.2))
    result = sim.simulate(wl, profile, controller, clock, name="model", max_gamma=2, noise=0.0,
                          gamma0_mode="lazy", prefill=True)
    cost = controller.policy.cost
    assert cost.samples + cost.skipped == result.steps
    assert controller.policy.prompt_tokens > 0


def test_static_table_follows_vllm_semantics():
    # Gaps keep the previous range's k; sizes past the last range keep its k.
    table = sim.StaticTable([[1, 1, 4], [4, 8, 2], [32, 64, 1]], max_gamma=3)
    got = {b: table.lookup(b) for b in (1, 2, 3, 4, 8, 9, 31, 32, 64, 500)}
    assert got == {1: 3, 2: 3, 3: 3, 4: 2, 8: 2, 9: 2, 31: 2, 32: 1, 64: 1, 500: 1}
    with pytest.raises(ValueError, match="must start at batch size 1"):
        sim.StaticTable([[2, 8, 2]], max_gamma=3)


def test_a_recorded_trace_replays_with_its_batch_size_and_acceptance(tmp_path):
    trace = tmp_path / "trace.jsonl"
    profile = load_profile(ASCEND)
    rates = (0.9, 0.5, 0.5, 0.5)
    clock = sim.SimClock()
    from vllm_vspec.config import VSpecConfig
    ctl = GammaController(VSpecConfig(policy="fixed", trace_path=str(trace)), K, clock=clock)
    sim.simulate(sim.steady(8, rates, tokens=8192), profile, ctl, clock, name="rec", max_gamma=K)
    ctl.close()
    replay = sim.from_trace(trace)
    assert replay.concurrency.at(100) == 8
    assert replay.rates.at(100)[0] == pytest.approx(0.9, abs=0.1)
    assert replay.rates.at(100)[2] == pytest.approx(0.5, abs=0.15)
    out = sim.simulate(replay, profile, sim.Oracle(profile, K, lambda: replay.rates.at(0)),
                       sim.SimClock(), name="oracle", max_gamma=K)
    assert out.tokens > 0


def test_sim_command_prints_a_table_and_writes_json_and_plot(tmp_path, capsys):
    code = cli_main(["sim", "--profile", ASCEND, "--workloads", "steady-b16",
                     "--scale", "0.05", "--output-dir", str(tmp_path)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "online/oracle" in printed and "controller overhead" in printed
    data = json.loads((tmp_path / "sim.json").read_text())
    assert {r["policy"] for r in data["results"]} == {
        "target", *(f"fixed-{g}" for g in range(K + 1)), "table", "online", "profile", "oracle"}
    assert data["gamma0_mode"] == "sync"
    assert (tmp_path / "sim.png").stat().st_size > 0


# ------------------------------------------------------------------ tree arms
# Width-2 trees accept clearly deeper than linear drafts (the beam keeps the
# target's token more often).
LINEAR = (0.55, 0.42, 0.32, 0.25)
TREE = {1: LINEAR, 2: (0.85, 0.8, 0.75, 0.7)}


def test_the_oracle_picks_the_tree_arm_when_it_is_better():
    profile = load_profile(ASCEND)
    batch = sim.BatchState(16, 8192, 384.0)
    better = sim.Oracle(profile, K, lambda: TREE, max_width=2).decide(batch)
    assert better.width == 2 and better.gamma * better.width <= K, better
    # A tree that accepts no deeper than the linear draft only costs more.
    same = sim.Oracle(profile, K, lambda: {1: LINEAR, 2: LINEAR}, max_width=2).decide(batch)
    assert same.width == 1, same
    assert sim.Oracle(profile, K, lambda: TREE).decide(batch).width == 1   # max_width 1


def test_with_tree_rates_the_oracle_bounds_every_fixed_arm_and_trees_help():
    wl = sim.steady(16, TREE, tokens=4096)
    results = {r.policy: r for r in sim.compare([wl], ASCEND, K, max_width=2)}
    fixed = {k: r.tok_s for k, r in results.items() if k.startswith("fixed-")}
    assert {"fixed-1x2", "fixed-2x2"} <= set(fixed) and "fixed-3x2" not in fixed   # 3*2 > K
    assert all(results["oracle"].tok_s >= v for v in fixed.values()), fixed
    assert fixed["fixed-2x2"] > fixed["fixed-2"]
    assert any("x2" in arm for arm in results["oracle"].gamma_steps)
    # Without tree rates the same comparison has no tree contenders.
    linear = {r.policy for r in sim.compare([sim.steady(16, LINEAR, tokens=1024)], ASCEND, K,
                                            max_width=2)}
    assert not {"fixed-1x2", "fixed-2x2"} & linear and "fixed-2" in linear


def test_a_trace_of_tree_steps_replays_acceptance_per_width(tmp_path):
    # The cycle policy changes arm every step, so each step verifies drafts of
    # another width than it decides: the replay must attribute them to the
    # previous step's width.
    trace = tmp_path / "trace.jsonl"
    profile = load_profile(ASCEND)
    clock = sim.SimClock()
    from vllm_vspec.config import VSpecConfig
    ctl = GammaController(VSpecConfig(policy="cycle", min_gamma=1, trace_path=str(trace)), K,
                          clock=clock, max_width=2)
    sim.simulate(sim.steady(8, TREE, tokens=8192), profile, ctl, clock, name="rec", max_gamma=K)
    ctl.close()
    rates = sim.from_trace(trace).rates.at(100)
    assert set(rates) == {1, 2}
    assert rates[1][0] == pytest.approx(TREE[1][0], abs=0.1)
    assert rates[2][0] == pytest.approx(TREE[2][0], abs=0.1)
    assert rates[2][1] == pytest.approx(TREE[2][1], abs=0.15)


def test_sim_command_compares_tree_arms(tmp_path, capsys):
    code = cli_main(["sim", "--profile", ASCEND, "--workloads", "steady-b16",
                     "--scale", "0.02", "--max-width", "2",
                     "--tree-rates", "2:0.85,0.8,0.75,0.7", "--output-dir", str(tmp_path)])
    assert code == 0
    assert "fixed-2x2" in capsys.readouterr().out
    data = json.loads((tmp_path / "sim.json").read_text())
    assert data["max_width"] == 2
    assert {"fixed-1x2", "fixed-2x2"} <= {r["policy"] for r in data["results"]}
    assert cli_main(["sim", "--profile", ASCEND, "--tree-rates", "1:0.5",
                     "--output-dir", str(tmp_path)]) == 2
    assert "W >= 2" in capsys.readouterr().err


def test_the_table_shows_a_dash_where_a_workload_has_no_tree_contender():
    from vllm_vspec.sim.report import table_text
    base = ["fixed-0", "table", "online", "profile", "oracle"]
    results = [sim.SimResult(p, wl, 100, 1.0, 10, {}, []) for wl, names in
               (("tree", base + ["fixed-1x2"]), ("linear", base)) for p in names]
    rows = {line.split()[0]: line.split()[1:] for line in table_text(results).splitlines()[2:4]}
    assert rows == {"tree": ["100.0"] * 6, "linear": ["100.0"] * 5 + ["-"]}


# ------------------------------------------------------------------ schedules
def test_a_cycle_names_where_its_value_next_changes():
    cap = sim.Cycle(((100, 8), (50, 2), (50, 2), (20, 4)))
    assert [cap.next_change(p) for p in (0, 99, 100, 199, 200, 219, 220)] == \
        [100, 100, 200, 200, 220, 220, 320]
    assert sim.Cycle(((1, 16),)).next_change(12345) is None


def test_every_segment_gets_its_tokens_whatever_a_policy_commits_per_step():
    """A step that crosses a change of batch size ends that segment: its
    tokens past the change are not taken from the next one, so each quiet
    spell of a burst-then-quiet load commits its 200 tokens (plus its own
    last step's) at batch 2 under gamma 4 (about 3 tokens a request a step)
    as under gamma 1. Before, each burst's last step ate into the quiet
    spell: gamma 4 spent fewer tokens at the expensive batch size."""
    profile = load_profile(ASCEND)
    wl = sim.Workload("burst", 64, 16, (64, 64), sim.Cycle(((600, 16), (200, 2))),
                      sim.Cycle(((1, (0.9, 0.9, 0.9, 0.9)),)))

    class Fixed:
        def __init__(self, gamma):
            self.gamma, self.spells, self.batch = gamma, [], 0

        def decide(self, batch):
            if batch.num_reqs == 2 and self.batch != 2:
                self.spells.append(0)
            self.batch = batch.num_reqs
            return sim.Decision(self.gamma, sim.bucket_of(batch.num_reqs), "test")

        def observe(self, fb):
            if self.batch == 2:
                self.spells[-1] += fb.committed

    for gamma in (1, 4):
        policy = Fixed(gamma)
        sim.simulate(wl, profile, policy, sim.SimClock(), name=str(gamma), max_gamma=K,
                     noise=0.0)
        spells = policy.spells[:-1]   # the last may be the drain
        assert len(spells) >= 3 and all(200 <= t <= 200 + 2 * (K + 1) for t in spells), \
            (gamma, policy.spells)
