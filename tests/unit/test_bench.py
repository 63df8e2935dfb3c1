"""`vllm-vspec bench serve` machinery: workloads, report maths, dry-run output,
protocol datasets, and the load generator against a stand-in server.

The benchmark itself measures and asserts nothing; these tests only pin down
that what it measures is computed as documented.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from vllm_vspec import cli
from vllm_vspec.hosts import wiring
from vllm_vspec.bench import protocols, runner, scrape, variants, workloads
from vllm_vspec.bench.loadgen import Completion, client_for, run_phase
from vllm_vspec.bench.report import (Run, accepted_length, exact_match, format_gamma_counts,
                                     markdown_table, results_json, rows)
from vllm_vspec.bench.server import ServerSpec, serve_argv
from vllm_vspec.bench.plot import Timeline, plot_timelines
from vllm_vspec.bench.workloads import Request
from vllm_vspec.core.trace import DecisionTrace


# ---------------------------------------------------------------- workloads
def test_steady_workloads_have_one_phase_at_their_concurrency():
    ws = workloads.build_workloads(low=1, high=32, requests_low=8, requests_high=64)
    assert [p.__dict__ for p in ws["steady-c1-code"].phases] == [
        {"concurrency": 1, "family": "code", "num_requests": 8}]
    assert [p.__dict__ for p in ws["steady-c32-prose"].phases] == [
        {"concurrency": 32, "family": "prose", "num_requests": 64}]


def test_bursty_workload_alternates_low_and_high_concurrency():
    bursty = workloads.build_workloads(low=2, high=16, requests_low=4,
                                       requests_high=32)["bursty"]
    assert [p.concurrency for p in bursty.phases] == [2, 16, 2, 16]
    assert [p.num_requests for p in bursty.phases] == [2, 16, 2, 16]


def test_requests_are_deterministic_and_repeated_families_continue():
    w = workloads.Workload("w", (workloads.Phase(1, "code", 2), workloads.Phase(4, "code", 3)))
    pool = {"code": ["a", "b", "c", "d"]}
    first, again = w.requests(pool), w.requests(pool)
    assert first == again
    assert [[r.prompt for r in phase] for phase in first] == [["a", "b"], ["c", "d", "a"]]
    assert [r.key for r in first[1]] == ["1/0", "1/1", "1/2"]
    assert {r.output_len for phase in first for r in phase} == {64}


def test_output_lengths_in_a_range_are_drawn_per_request_the_same_every_time():
    w = workloads.Workload("w", (workloads.Phase(1, "code", 40), workloads.Phase(4, "code", 40)))
    pool = {"code": ["a", "b"]}
    lengths = [r.output_len for phase in w.requests(pool, (32, 96)) for r in phase]
    assert lengths == [r.output_len for phase in w.requests(pool, (32, 96)) for r in phase]
    assert min(lengths) >= 32 and max(lengths) <= 96 and len(set(lengths)) > 20


@pytest.mark.parametrize("text, expected", [("64", (64, 64)), ("32:96", (32, 96))])
def test_output_len_takes_n_or_a_range(text, expected):
    from vllm_vspec.commands.bench import _output_len
    assert _output_len(text) == expected


@pytest.mark.parametrize("text", ["0", "96:32", "x", "1:2:3", "-4"])
def test_a_bad_output_len_names_the_value_and_what_is_allowed(text):
    import argparse

    from vllm_vspec.commands.bench import _output_len
    with pytest.raises(argparse.ArgumentTypeError, match=f"'{text}' is not allowed: .*LO:HI"):
        _output_len(text)


def test_prompt_file_line_without_prompt_is_named(tmp_path):
    f = tmp_path / "code.jsonl"
    f.write_text('{"prompt": "ok"}\n{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match=r"code.jsonl:2: `prompt`"):
        workloads.load_prompts(f)


def test_a_user_workload_keeps_its_phases_in_order():
    w = workloads.parse_workload("mixed=1:csv:8,32:code:64,1:prose:4")
    assert w.name == "mixed"
    assert [(p.concurrency, p.family, p.num_requests) for p in w.phases] == [
        (1, "csv", 8), (32, "code", 64), (1, "prose", 4)]


@pytest.mark.parametrize("text, named", [
    ("mixed", "'mixed'"), ("=1:csv:8", "'=1:csv:8'"), ("m=1:csv", "'1:csv'"),
    ("m=0:csv:8", "'0:csv:8'"), ("m=1::8", "'1::8'"), ("m=1:csv:8,x", "'x'")])
def test_a_bad_user_workload_names_the_phase_and_the_form(text, named):
    with pytest.raises(ValueError, match=f"{named}.*NAME=CONC:FAMILY:N"):
        workloads.parse_workload(text)


# ------------------------------------------------------------------- report
def _run(workload, variant, family, tokens_per_request, seconds, texts=None):
    n = len(tokens_per_request)
    texts = texts or ["x"] * n
    comps = [Completion(f"0/{i}", 100.0, 100.0 + seconds, t, texts[i])
             for i, t in enumerate(tokens_per_request)]
    return Run(workload, variant, family, comps)


def test_tokens_per_second_is_total_tokens_over_first_start_to_last_end():
    comps = [Completion("0/0", 10.0, 12.0, 64, ""), Completion("0/1", 11.0, 14.0, 64, "")]
    assert Run("w", "v", "fixed", comps).tokens_per_s == pytest.approx(128 / 4.0)


def test_ratios_are_to_target_and_to_the_best_fixed_gamma_of_the_same_workload():
    runs = [_run("w", "target", "target", [100], 1.0),
            _run("w", "fixed-1", "fixed", [100], 0.5),   # 200 tok/s, best fixed
            _run("w", "fixed-2", "fixed", [100], 0.8),
            _run("w", "online", "online", [100], 0.4),   # 250 tok/s
            _run("other", "target", "target", [100], 0.1)]
    by = {(r.workload, r.variant): r for r in rows(runs)}
    online = by[("w", "online")]
    assert online.vs_target == pytest.approx(2.5)
    assert online.vs_best_fixed == pytest.approx(1.25)
    assert online.best_fixed == "fixed-1"
    assert by[("other", "target")].vs_best_fixed is None


def test_x_best_is_the_ratio_to_the_faster_of_target_only_and_the_best_fixed_gamma():
    runs = [_run("slow-drafts", "target", "target", [100], 0.5),    # 200 tok/s: the best
            _run("slow-drafts", "fixed-1", "fixed", [100], 0.8),
            _run("slow-drafts", "online", "online", [100], 0.625),  # 160 tok/s
            _run("good-drafts", "target", "target", [100], 1.0),
            _run("good-drafts", "fixed-1", "fixed", [100], 0.5),    # 200 tok/s: the best
            _run("good-drafts", "online", "online", [100], 0.625)]
    by = {(r.workload, r.variant): r for r in rows(runs)}
    assert by[("slow-drafts", "online")].vs_best_choice == pytest.approx(0.8)
    assert by[("good-drafts", "online")].vs_best_choice == pytest.approx(0.8)
    assert by[("slow-drafts", "fixed-1")].vs_best_choice == pytest.approx(0.625)
    assert "| 0.80x |" in markdown_table(rows(runs))


def test_best_fixed_is_the_fastest_fixed_choice_linear_or_tree():
    runs = [_run("w", "target", "target", [100], 1.0),
            _run("w", "eagle-fixed-2", "fixed", [100], 0.5),            # 200 tok/s
            _run("w", "eagle-tree-2x2", "tree-fixed", [100], 0.4),      # 250 tok/s: the best
            _run("w", "eagle-tree-online", "online", [100], 0.5)]
    by = {r.variant: r for r in rows(runs)}
    assert by["eagle-tree-online"].best_fixed == "eagle-tree-2x2"
    assert by["eagle-tree-online"].vs_best_fixed == pytest.approx(0.8)
    assert by["eagle-tree-2x2"].vs_best_fixed == pytest.approx(1.0)


def test_accepted_length_is_one_plus_accepted_over_drafts_pooled_over_rounds():
    a = _run("w", "eagle-tree-2x2", "tree-fixed", [100], 1.0)
    b = _run("w", "eagle-tree-2x2", "tree-fixed", [100], 1.0)
    b.repeat = 1
    # 10 + 30 drafts; accepted path lengths sum to (8 + 3) + (20 + 9) = 40
    a.draft_counts, b.draft_counts = (10, (8, 3)), (30, (20, 9))
    assert accepted_length([a, b]) == pytest.approx(1 + 40 / 40)
    assert accepted_length([_run("w", "target", "target", [100], 1.0)]) is None
    assert rows([a, b])[0].accepted_length == pytest.approx(2.0)
    assert "| 2.00 |" in markdown_table(rows([a, b]))


def test_tree_arms_are_counted_and_named_depth_x_width():
    records = [{**_step(1, 2, 1), "width": 2}, {**_step(1, 2, 1), "width": 2},
               {**_step(1, 2, 1), "width": 1}, _step(1, 3, 1)]   # no width: a linear step
    counts = scrape.gamma_counts_from_trace(records)
    assert counts == Counter({(1, (2, 2)): 2, (1, 2): 1, (1, 3): 1})
    assert format_gamma_counts(counts) == "b1: g2x2 x2, g2 x1, g3 x1"
    run = _run("w", "eagle-tree-online", "online", [100], 1.0)
    run.gamma_counts = counts
    assert results_json([run], {}, rows([run]), {})["runs"][0]["gamma_counts"] == [
        {"bucket": 1, "gamma": 2, "width": 1, "steps": 1},
        {"bucket": 1, "gamma": 2, "width": 2, "steps": 2},
        {"bucket": 1, "gamma": 3, "width": 1, "steps": 1}]


def test_acceptance_per_position_is_pooled_over_rounds_of_the_widest_fixed_gamma():
    from vllm_vspec.bench.report import acceptance_per_position, robustness_table
    runs = []
    for repeat, (drafts, per_pos) in enumerate(((10, (5, 2, 1)), (30, (15, 6, 3)))):
        wide = _run("w", "fixed-3", "fixed", [100], 1.0)
        wide.draft_counts, wide.repeat = (drafts, per_pos), repeat
        narrow = _run("w", "fixed-1", "fixed", [100], 1.0)
        narrow.draft_counts, narrow.repeat = (drafts, (drafts,)), repeat
        runs += [wide, narrow]
    online = _run("w", "online", "online", [100], 0.8)
    online.draft_counts = (40, (40, 40, 40))      # vspec mixes draft lengths: not used
    tree = _run("w", "eagle-tree-4x2", "tree-fixed", [100], 1.0)
    tree.draft_counts = (40, (30, 20, 10, 5, 0, 0, 0, 0))   # 8 nodes, not 8 positions: not used
    runs += [_run("w", "target", "target", [100], 1.25), online, tree]
    acc = acceptance_per_position(runs)
    assert acc["w"][0] == "fixed-3"
    assert acc["w"][1] == pytest.approx([0.5, 0.2, 0.1])
    table = robustness_table(rows(runs), acc)
    assert "| w | 0.50 0.20 0.10 (fixed-3) | fixed-3 | online | 1.56x | 1.25x | 1.25x |" in table
    assert len(table.splitlines()) == 3             # header, rule, the one adaptive variant


def test_repeats_take_the_median_per_variant_and_compare_outputs_round_by_round():
    def run(variant, family, seconds, repeat, text="x"):
        r = _run("w", variant, family, [100], seconds, [text])
        r.repeat = repeat
        return r
    runs = [run("target", "target", 1.0, 0, "a"), run("fixed-1", "fixed", 0.5, 0, "a"),
            run("online", "online", 0.4, 0, "a"),
            run("target", "target", 2.0, 1, "b"), run("fixed-1", "fixed", 1.0, 1, "b"),
            run("online", "online", 0.2, 1, "a"),       # differs from round 1's target
            run("target", "target", 1.0, 2, "c"), run("fixed-1", "fixed", 0.25, 2, "c"),
            run("online", "online", 0.5, 2, "c")]
    by = {r.variant: r for r in rows(runs)}
    # medians: target 100, fixed-1 200, online 250 tok/s
    assert by["online"].tokens_per_s == pytest.approx(250.0)
    assert by["online"].vs_target == pytest.approx(2.5)
    assert by["online"].vs_best_fixed == pytest.approx(1.25)
    assert sorted(by["online"].rounds_tokens_per_s) == pytest.approx([200.0, 250.0, 500.0])
    assert (by["online"].identical, by["online"].compared) == (2, 3)
    assert "250.0 (200.0-500.0)" in markdown_table(rows(runs))


def _phased(variant, family, phase_seconds, repeat=0):
    """A bursty run of one request per phase, phases back to back."""
    comps, t = [], 0.0
    for phase, seconds in enumerate(phase_seconds):
        comps.append(Completion(f"{phase}/0", t, t + seconds, 100, "x"))
        t += seconds
    return Run("bursty", variant, family, comps, repeat)


def test_phase_bound_takes_the_fastest_fixed_choice_of_each_phase():
    from vllm_vspec.bench.report import bound_lines, phase_bounds

    runs = [_phased("target", "target", [4.0, 1.0]),    # fast at high load
            _phased("fixed-2", "fixed", [2.0, 2.0]),    # fast at low load; best fixed: 50 tok/s
            _phased("online", "online", [1.0, 1.0])]    # not a fixed choice: not picked
    bound = phase_bounds(runs)["bursty"]
    assert bound["vs_best_fixed"] == pytest.approx((200 / 3.0) / 50.0)
    assert bound["best_fixed"] == "fixed-2"
    assert bound["phase_choices"] == {"0": "fixed-2", "1": "target"}
    assert bound["phase_seconds"]["online"] == [1.0, 1.0]    # reported beside the choices
    assert "| fixed-2 | **2.00** | 2.00 | 4.00 |" in bound_lines({"bursty": bound})[1]
    assert phase_bounds([_phased("fixed-2", "fixed", [2.0])]) == {}    # one phase: no bound
    # Partial results: a round that has served only target-only so far.
    assert phase_bounds(runs + [_phased("target", "target", [4.0, 1.0], 1)])["bursty"] == bound


def test_phase_bound_within_one_server_takes_fixed_0_for_target_only():
    from vllm_vspec.bench.report import bound_lines, phase_bounds

    runs = [_phased("target", "target", [4.0, 1.0]),
            _phased("fixed-2", "fixed", [2.0, 2.0]),
            _phased("fixed-0", "vspec-fixed", [4.0, 1.5])]   # gamma 0 dearer than no draft
    bound = phase_bounds(runs)["bursty"]
    assert bound["vs_best_fixed"] == pytest.approx((200 / 3.0) / 50.0)
    assert bound["in_server"]["vs_best_fixed"] == pytest.approx((200 / 3.5) / 50.0)
    assert bound["in_server"]["phase_choices"] == {"0": "fixed-2", "1": "fixed-0"}
    assert "within one speculative server" in bound_lines({"bursty": bound})[1]
    assert "in_server" not in phase_bounds(runs[:2])["bursty"]    # fixed-0 did not run


def test_phase_bound_takes_medians_over_rounds_not_the_luckiest_round():
    from vllm_vspec.bench.report import phase_bounds

    # Both variants equally fast in truth; each is lucky in one phase of one
    # round. Picking per round would find a 2.0 s + 2.0 s path every time.
    runs = [_phased("fixed-1", "fixed", [2.0, 3.0], 0), _phased("fixed-2", "fixed", [3.0, 2.0], 0),
            _phased("fixed-1", "fixed", [3.0, 3.0], 1), _phased("fixed-2", "fixed", [3.0, 3.0], 1),
            _phased("fixed-1", "fixed", [3.0, 3.0], 2), _phased("fixed-2", "fixed", [3.0, 3.0], 2)]
    assert phase_bounds(runs)["bursty"]["vs_best_fixed"] == pytest.approx(1.0)


def test_exact_match_counts_identical_outputs_and_names_the_others():
    ref = _run("w", "target", "target", [1, 1, 1], 1.0, ["a", "b", "c"])
    run = _run("w", "online", "online", [1, 1, 1], 1.0, ["a", "B", "c"])
    assert exact_match(run, ref) == (2, 3, ["0/1"])


def test_gamma_counts_format_by_bucket_then_count():
    counts = Counter({(1, 4): 120, (1, 3): 8, (32, 2): 40, (32, 1): 0})
    assert format_gamma_counts(counts) == "b1: g4 x120, g3 x8 | b32: g2 x40"
    assert format_gamma_counts(Counter({(None, 2): 5})) == "all: g2 x5"


def test_controller_time_is_the_traced_overhead_over_the_step_time_and_is_tabled():
    from vllm_vspec.core.trace import overhead_share

    steps = [{"interval_s": 0.5, "overhead_us": 1000.0}, {"interval_s": 1.5, "overhead_us": 3000.0}]
    assert overhead_share(steps) == pytest.approx(0.002)
    assert overhead_share([{"interval_s": 0.5}]) is None    # a trace from before overhead_us
    run = _run("w", "online", "online", [10], 1.0)
    run.controller_overhead = overhead_share(steps)
    assert "| 0.20% |" in markdown_table(rows([run]))


# ------------------------------------------------------------------- scrape
METRICS_PAGE = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="bench"} 7.0
# TYPE vspec:gamma gauge
vspec:gamma{engine="0"} 3.0
# TYPE vspec:steps counter
vspec:steps_total{engine="0",gamma="3"} 12.0
vspec:steps_total{engine="0",gamma="1"} 2.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 20.0
"""


def test_metrics_page_gives_batch_size_gamma_and_steps_per_gamma():
    samples = scrape.parse_metrics(METRICS_PAGE)
    s = scrape.sample_of(5.0, samples)
    assert (s.running, s.gamma) == (7.0, 3.0)
    assert scrape.gamma_step_counts(samples) == Counter({(None, 3): 12.0, (None, 1): 2.0})
    assert scrape.draft_counts(samples) == (40, (20, 8))
    assert scrape.draft_counts(scrape.parse_metrics("")) == (0, ())


def _step(num_reqs, gamma, bucket):
    return {"step": 0, "num_reqs": num_reqs, "bucket": bucket, "gamma": gamma,
            "drafted": [], "accepted": [], "committed": num_reqs}


def test_trace_is_read_in_slices_and_counted_per_controller_bucket(tmp_path):
    path = tmp_path / "t.jsonl"
    trace = DecisionTrace(path, {"policy": "online"})
    for rec in (_step(1, 4, 1), _step(1, 4, 1), _step(3, 2, 4)):
        trace.write(rec)
    first, pos = scrape.trace_steps(path)
    trace.write(_step(3, 1, 4))
    trace.close()
    rest, end = scrape.trace_steps(path, pos)
    assert (len(first), pos, len(rest), end) == (3, 3, 1, 4)
    assert scrape.gamma_counts_from_trace(first) == Counter({(1, 4): 2, (4, 2): 1})


def test_plot_writes_a_png_and_refuses_mixed_time_axes(tmp_path):
    a = Timeline("online", "step", [0, 1, 2], [1, 1, 8], [4, 4, 2], [("w", 0, 2)])
    b = Timeline("target", "s", [0.0, 0.5], [1, 2], [None, None], [("w", 0.0, 0.5)])
    png = plot_timelines([a], tmp_path / "p.png", "t")
    assert png.read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(ValueError, match="mix x units"):
        plot_timelines([a, b], tmp_path / "q.png", "t")


# ---------------------------------------------------------------- protocols
def test_arc_records_in_both_layouts_become_the_same_prompt(tmp_path):
    f = tmp_path / "arc.jsonl"
    column = {"question": "Q?", "choices": {"label": ["A", "B"], "text": ["x", "y"]}}
    nested = {"question": {"stem": "Q?", "choices": [{"label": "A", "text": "x"},
                                                    {"label": "B", "text": "y"}]}}
    f.write_text(json.dumps(column) + "\n" + json.dumps(nested) + "\n")
    prompts = protocols.load_dataset(f, protocols.PROTOCOLS["arc-easy"])
    assert prompts == ["Question: Q?\nA. x\nB. y\nAnswer:"] * 2


def test_materialized_prompt_is_used_as_is_and_bad_lines_are_named(tmp_path):
    f = tmp_path / "gsm.jsonl"
    f.write_text('{"prompt": "as is"}\n{"question": "2+2?"}\n{"answer": "4"}\n')
    with pytest.raises(ValueError, match=r"gsm.jsonl:3: not a gsm8k record"):
        protocols.load_dataset(f, protocols.PROTOCOLS["gsm8k"])
    f.write_text('{"prompt": "as is"}\n{"question": "2+2?"}\n')
    assert protocols.load_dataset(f, protocols.PROTOCOLS["gsm8k"]) == [
        "as is", "Question: 2+2?\nAnswer: Let's think step by step."]


def test_protocol_sends_a_fixed_prompt_count_wrapping_a_small_dataset():
    reqs = protocols.fixed_count(["a", "b"], 5, 7)
    assert [r.prompt for r in reqs] == ["a", "b", "a", "b", "a"]
    assert {r.output_len for r in reqs} == {7}


def test_protocol_defaults_follow_the_seed():
    arc, gsm = protocols.PROTOCOLS["arc-easy"], protocols.PROTOCOLS["gsm8k"]
    assert (arc.num_prompts, arc.output_len, arc.concurrency) == (200, 256, 16)
    assert gsm.concurrency == 128


# ------------------------------------------------------------------ dry run
@pytest.fixture
def bench_inputs(tmp_path):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for fam in ("code", "prose"):
        (prompts / f"{fam}.jsonl").write_text(
            "".join(json.dumps({"prompt": f"{fam} {i}"}) + "\n" for i in range(3)))
    draft = tmp_path / "draft"
    draft.mkdir()
    return ["--prompts", str(prompts), "--draft", str(draft), "--target", str(tmp_path / "t"),
            "--eagle", str(tmp_path / "no-eagle"), "--eagle3", str(tmp_path / "no-eagle3"),
            "--output-dir", str(tmp_path / "out")]


def _variant_commands(out: str) -> dict[str, list[str]]:
    lines = out.splitlines()
    return {line.split()[-1]: shlex.split(lines[i + 1])
            for i, line in enumerate(lines) if line.startswith("## variant ")}


def test_dry_run_prints_one_server_command_per_variant(bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs]) == 0
    cmds = _variant_commands(capsys.readouterr().out)
    assert list(cmds) == list(variants.DEFAULT_VARIANTS)
    assert "--speculative-config" not in cmds["target"]
    spec = json.loads(cmds["fixed-3"][cmds["fixed-3"].index("--speculative-config") + 1])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("draft_model", 3)
    online = cmds["online"]
    assert online[online.index("--scheduler-cls") + 1] == wiring.SCHEDULER_CLS
    vspec = json.loads(online[online.index("--additional-config") + 1])["vspec"]
    assert vspec["policy"] == "online" and vspec["trace_path"].endswith("online.jsonl")


def test_dry_run_lists_workload_phases(bench_inputs, capsys):
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workloads", "bursty"])
    out = capsys.readouterr().out
    assert ("bursty: 4 x code @ concurrency 1, 32 x code @ concurrency 32, "
            "4 x prose @ concurrency 1, 32 x prose @ concurrency 32") in out


def test_eagle_variants_appear_only_when_the_head_exists(bench_inputs, tmp_path, capsys):
    args = [a if a != str(tmp_path / "no-eagle") else str(tmp_path / "draft")
            for a in bench_inputs]
    cli.main(["bench", "serve", "--dry-run", *args, "--variants", "eagle-fixed-2,eagle-online"])
    cmds = _variant_commands(capsys.readouterr().out)
    assert list(cmds) == ["target", "eagle-fixed-2", "eagle-online"]
    # A user error: one line on stderr, exit 2 (cli.main).
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants", "eagle-online"]) == 2
    assert "eagle-online is not available" in capsys.readouterr().err


def test_eagle_tree_variants_serve_vspec_trees_within_one_node_budget(bench_inputs, tmp_path,
                                                                     capsys):
    args = [a if a != str(tmp_path / "no-eagle") else str(tmp_path / "draft")
            for a in bench_inputs]
    names = ["eagle-tree-2x2", "eagle-tree-3x2", "eagle-tree-4x2", "eagle-tree-2x4",
             "eagle-tree-online"]
    cli.main(["bench", "serve", "--dry-run", *args, "--variants", ",".join(names)])
    cmds = _variant_commands(capsys.readouterr().out)
    assert list(cmds) == ["target", *names]
    for name in names:
        cmd = cmds[name]
        spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
        assert (spec["method"], spec["num_speculative_tokens"]) == ("eagle", 8)
        assert cmd[cmd.index("--scheduler-cls") + 1] == wiring.SCHEDULER_CLS
        worker = wiring.WORKER_CLS[wiring.resolve_platform("auto")]
        assert cmd[cmd.index("--worker-cls") + 1] == worker
        vspec = json.loads(cmd[cmd.index("--additional-config") + 1])["vspec"]
        assert vspec.pop("trace_path").endswith(f"{name}.jsonl")
        if name != "eagle-tree-online":
            g, w = map(int, name.removeprefix("eagle-tree-").split("x"))
            assert vspec == {"policy": "fixed", "fixed_gamma": g, "max_gamma": 4,
                             "tree_width": w, "min_tree_width": w}
    assert vspec == {"policy": "online", "max_gamma": 4, "tree_width": 4}
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants", "eagle-tree-2x2"]) == 2
    assert "eagle-tree-2x2 is not available" in capsys.readouterr().err


def test_eagle_tree_variants_validate_as_vspec_settings_of_their_k():
    from vllm_vspec.config import VSpecConfig
    available = variants.all_variants({"eagle": Path("head")})
    trees = {n: v for n, v in available.items() if n.startswith("eagle-tree-")}
    assert [v.family for v in trees.values()] == ["tree-fixed"] * 4 + ["online"]
    for v in trees.values():
        k = v.speculative_config["num_speculative_tokens"]
        cfg = VSpecConfig.from_dict(v.vspec, k).with_max_gamma(k)
        assert cfg.tree_width * (cfg.fixed_gamma if v.family == "tree-fixed" else 1) <= k
    assert not any(n.startswith("eagle-tree") for n in variants.all_variants(
        {"draft_model": Path("draft")}))


def test_families_all_builds_the_steady_workloads_over_every_prompt_file(bench_inputs, capsys):
    prompts = Path(bench_inputs[bench_inputs.index("--prompts") + 1])
    (prompts / "csv.jsonl").write_text(json.dumps({"prompt": "a,b"}) + "\n")
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--families", "all"])
    out = capsys.readouterr().out
    for fam in ("code", "csv", "prose"):
        assert f"steady-c1-{fam}: 8 x {fam} @ concurrency 1" in out
    cli.main(["bench", "serve", "--dry-run", *bench_inputs])           # default: code and prose
    assert "csv" not in capsys.readouterr().out


def test_user_workloads_run_alone_unless_others_are_named(bench_inputs, capsys):
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workload", "mixed=1:prose:2,8:code:4"])
    out = capsys.readouterr().out
    assert "mixed: 2 x prose @ concurrency 1, 4 x code @ concurrency 8" in out
    assert "bursty" not in out
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workload", "mixed=1:prose:2",
              "--workloads", "mixed,bursty"])
    assert "bursty:" in capsys.readouterr().out
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workload", "q=1:sql:2"]) == 2
    assert re.search("families sql: no .*/<family>.jsonl.*code, prose", capsys.readouterr().err)
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workload", "q=1:sql"]) == 2
    assert "--workload: workload 'q=1:sql'" in capsys.readouterr().err


def test_unknown_workload_is_named(bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--workloads", "steady-c7"]) == 2
    assert "--workloads steady-c7 is not known" in capsys.readouterr().err


def test_every_variant_command_parses_with_vllm_serve_arguments(tmp_path):
    from vllm_vspec.commands.serve import vllm_serve_command

    parser, _ = vllm_serve_command()
    every = variants.all_variants({"draft_model": tmp_path, "eagle": tmp_path},
                                  latency_profiles={"draft_model": tmp_path / "p.json"})
    assert "profile" in every and "eagle-profile" not in every   # a profile per drafter
    assert every["profile"].vspec["profile_path"] == str((tmp_path / "p.json").resolve())
    for v in every.values():
        argv = serve_argv(ServerSpec(model=tmp_path), v.serve_args(tmp_path / "t.jsonl"), 1234)
        assert argv[1:3] == ["-m", "vllm_vspec.commands.serve"]
        args = parser.parse_args(["serve", *argv[3:]])
        assert (args.model_tag, args.port) == (str(tmp_path), 1234), v.name
        # vspec's worker runs a lazy gamma 0 (online-0); stock variants keep vLLM's
        want_worker = (wiring.WORKER_CLS[wiring.resolve_platform()] if v.vspec is not None
                       else "auto")
        assert args.worker_cls == want_worker, v.name


# ------------------------------------------------- load generator, stand-in
class _StandIn(BaseHTTPRequestHandler):
    """Answers /v1/completions like vLLM (echoing the prompt) and records how
    many requests were in flight at once."""
    in_flight = 0
    max_in_flight = 0
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.max_in_flight = max(cls.max_in_flight, cls.in_flight)
        time.sleep(0.02)
        with cls.lock:
            cls.in_flight -= 1
        self._json({"choices": [{"text": body["prompt"].upper()}],
                    "usage": {"completion_tokens": body["max_tokens"]}})

    def do_GET(self):
        if self.path == "/metrics":
            self._send(METRICS_PAGE.encode(), "text/plain")
        else:
            self._json({"data": [{"id": "stand-in"}]})

    def _json(self, obj):
        self._send(json.dumps(obj).encode(), "application/json")

    def _send(self, data, content_type):
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def stand_in():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_load_generator_keeps_concurrency_and_request_order(stand_in):
    _StandIn.max_in_flight = 0
    reqs = [Request(f"0/{i}", f"p{i}", 5 + i % 2) for i in range(12)]

    async def go():
        async with client_for(3) as client:
            return await run_phase(client, stand_in, "m", reqs, 3)

    out = asyncio.run(go())
    assert [c.text for c in out] == [f"P{i}" for i in range(12)]
    assert [c.tokens for c in out] == [5 + i % 2 for i in range(12)]    # each its own length
    assert all(c.error is None for c in out)
    assert _StandIn.max_in_flight == 3


def test_clients_drop_idle_connections_before_the_vllm_server_does():
    # Otherwise a request can go out on a connection the server is closing.
    import vllm.envs

    limits = client_for(4)._transport._pool
    assert limits._keepalive_expiry < vllm.envs.VLLM_HTTP_TIMEOUT_KEEP_ALIVE


def test_protocol_run_writes_the_seed_style_summary(stand_in):
    result = protocols.run_protocol_sync(protocols.PROTOCOLS["arc-easy"], stand_in,
                                         protocols.fixed_count(["q"], 6, 7), 7, 2)
    assert result["model"] == "stand-in"
    assert (result["completed"], result["failed"], result["total_output_tokens"]) == (6, 0, 42)
    assert result["request_rate"] == "inf" and result["temperature"] == 0.0


def test_one_variant_serves_every_workload_with_gamma_counts_from_its_trace(stand_in, tmp_path):
    ws = workloads.build_workloads(low=1, high=4, requests_low=2, requests_high=4,
                                   families=("code",))
    plan = runner.Plan(ServerSpec(model=tmp_path), [], list(ws.values()),
                       {w.name: w.requests({"code": ["a", "b", "c"]}) for w in ws.values()},
                       output_len=(3, 3), out_dir=tmp_path)
    trace = tmp_path / "trace.jsonl"
    DecisionTrace(trace, {"policy": "online"}).close()  # header only: no steps recorded
    v = variants.Variant("online", "online", vspec={"policy": "online"})
    seen = []
    runs, tl = asyncio.run(runner._serve_workloads(plan, v, stand_in, trace, seen.append))
    assert [r.workload for r in runs] == list(ws)
    assert [len(r.completions) for r in runs] == [2, 4, 1 + 2]
    assert len(seen) == sum(len(r.completions) for r in runs)
    # The stand-in's step counter never moves, and the trace has no steps:
    # nothing is invented.
    assert all(r.gamma_source is None and not r.gamma_counts for r in runs)
    assert tl.x_unit == "s" and [s[0] for s in tl.spans] == list(ws)


def test_a_variant_whose_server_dies_is_reported_and_the_rest_still_run(tmp_path, monkeypatch):
    ws = workloads.build_workloads(families=("code",))
    plan = runner.Plan(ServerSpec(model=tmp_path), [variants.Variant("target", "target")],
                       [ws["bursty"]], {"bursty": ws["bursty"].requests({"code": ["a"]})},
                       output_len=(3, 3), out_dir=tmp_path)
    monkeypatch.setattr(runner, "serve_argv", lambda spec, args, port: [
        sys.executable, "-c", "print('model not found'); raise SystemExit(3)"])
    saved = []
    runs, timelines, failures = runner.run_plan(
        plan, lambda what: None, lambda r, f: saved.append((list(r), dict(f))))
    assert (runs, timelines) == ([], [])
    assert saved == [([], failures)]  # partial results are saved after each variant
    assert "exited with 3" in failures["target"] and "model not found" in failures["target"]


# ------------------------------------------------------------ ports
def test_free_port_is_bindable_and_never_one_the_kernel_hands_to_a_bind_to_port_0():
    from vllm_vspec.bench import server

    low = server._ephemeral_low()
    for _ in range(20):
        port = server.free_port()
        assert server.FIRST_PORT <= port < low, (port, low)
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


# ------------------------------------------------------------ ngram variants
def test_ngram_variants_need_no_drafter_and_differ_only_in_k_or_policy():
    from vllm_vspec.config import VSpecConfig

    every = variants.all_variants({})
    ngram = {n: v for n, v in every.items() if n.startswith("ngram-")}
    assert list(ngram) == ["ngram-fixed-1", "ngram-fixed-2", "ngram-fixed-3", "ngram-fixed-4",
                           "ngram-online", "ngram-fixed-0"]
    for k in range(1, 5):
        v = ngram[f"ngram-fixed-{k}"]
        assert (v.family, v.gamma, v.vspec) == ("fixed", k, None)      # stock vLLM, K = k
        assert v.speculative_config == {"method": "ngram", "num_speculative_tokens": k,
                                        "prompt_lookup_min": 2, "prompt_lookup_max": 4}
        assert "model" not in v.speculative_config
    online, zero = ngram["ngram-online"], ngram["ngram-fixed-0"]
    assert (online.family, online.vspec) == ("online", {"policy": "online"})
    assert zero.family == "vspec-fixed" and zero.vspec["fixed_gamma"] == 0
    for v in (online, zero):
        assert v.speculative_config["num_speculative_tokens"] == 4
        cfg = VSpecConfig.from_dict(v.vspec, 4).with_max_gamma(4)
        assert (cfg.min_gamma, cfg.max_gamma) == (0, 4)


def test_ngram_variant_commands_parse_and_carry_vspecs_worker_only_for_vspec(tmp_path):
    from vllm_vspec.commands.serve import vllm_serve_command

    parser, _ = vllm_serve_command()
    for name in ("ngram-fixed-2", "ngram-online"):
        v = variants.all_variants({})[name]
        argv = serve_argv(ServerSpec(model=tmp_path), v.serve_args(tmp_path / "t.jsonl"), 1234)
        args = parser.parse_args(["serve", *argv[3:]])
        assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "ngram"
        want = wiring.WORKER_CLS[wiring.resolve_platform()] if v.vspec else "auto"
        assert args.worker_cls == want, name


def test_ngram_variants_are_selectable_in_a_dry_run(bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants",
                     "ngram-fixed-1,ngram-online"]) == 0
    cmds = _variant_commands(capsys.readouterr().out)
    assert list(cmds) == ["target", "ngram-fixed-1", "ngram-online"]


# ------------------------------------------------------------ overhead set (issue 29)
def _spec_of(cmd: list[str]) -> dict:
    return json.loads(cmd[cmd.index("--speculative-config") + 1])


def _vspec_of(cmd: list[str]) -> dict:
    vspec = json.loads(cmd[cmd.index("--additional-config") + 1])["vspec"]
    vspec.pop("trace_path", None)
    return vspec


def test_overhead_set_pairs_every_vspec_server_with_the_stock_one_it_stands_in_for(
        bench_inputs, tmp_path, capsys):
    from vllm_vspec.bench import overhead
    for head in ("eagle", "eagle3"):
        (tmp_path / head).mkdir()
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--eagle", str(tmp_path / "eagle"),
              "--eagle3", str(tmp_path / "eagle3"), "--variants", "overhead"])
    out = capsys.readouterr().out
    cmds = _variant_commands(out)
    assert list(cmds) == ["target", "fixed-0", "fixed-1", "vspec-fixed-1", "fixed-2",
                          "vspec-fixed-2", "fixed-3", "vspec-fixed-3", "eagle-fixed-0",
                          "eagle-fixed-1", "eagle-vspec-fixed-1", "eagle-fixed-2",
                          "eagle-vspec-fixed-2", "eagle-fixed-3", "eagle-vspec-fixed-3",
                          "eagle3-fixed-0", "eagle3-fixed-1", "eagle3-vspec-fixed-1",
                          "eagle3-fixed-2", "eagle3-vspec-fixed-2", "eagle3-fixed-3",
                          "eagle3-vspec-fixed-3"]
    for g in (1, 2, 3):
        for prefix, method in (("", "draft_model"), ("eagle-", "eagle"), ("eagle3-", "eagle3")):
            stock = _spec_of(cmds[f"{prefix}fixed-{g}"])
            vspec = _spec_of(cmds[f"{prefix}vspec-fixed-{g}"])
            assert stock["method"] == vspec["method"] == method
            assert stock["num_speculative_tokens"] == g
            # The defaults' vspec server (K = MAX_GAMMA) held at gamma g.
            assert vspec["num_speculative_tokens"] == 4
            assert _vspec_of(cmds[f"{prefix}vspec-fixed-{g}"]) == {
                "policy": "fixed", "fixed_gamma": g, "min_gamma": 0}
            assert "--scheduler-cls" not in cmds[f"{prefix}fixed-{g}"]
    # Its workloads default to the steady loads at concurrency 1 and 32.
    workloads = out.split("## workloads")[1]
    assert "steady-c1-code" in workloads and "steady-c32-prose" in workloads
    assert "bursty" not in workloads
    assert [p.label for p in overhead.pairs(cmds)][:2] == ["fixed-0 / target",
                                                           "vspec-fixed-1 / fixed-1"]


def _mtp_target(tmp_path) -> Path:
    """A target directory whose config names one MTP layer (a MiMo-style checkpoint)."""
    target = tmp_path / "mimo"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({"architectures": ["MiMoForCausalLM"],
                                                    "num_nextn_predict_layers": 1}))
    return target


def test_mtp_variants_exist_for_a_target_with_mtp_layers_and_draft_from_it(
        bench_inputs, tmp_path, capsys):
    from vllm_vspec.bench import overhead
    args = bench_inputs + ["--target", str(_mtp_target(tmp_path))]
    cli.main(["bench", "serve", "--dry-run", *args, "--variants", "mtp-fixed-2,mtp-online,overhead",
              "--workloads", "steady-c1-code"])
    cmds = _variant_commands(capsys.readouterr().out)
    assert {"mtp-fixed-2", "mtp-online", "mtp-fixed-0", "mtp-vspec-fixed-1"} <= set(cmds)
    # vLLM reads the MTP layers from the target: no draft model in the config
    assert _spec_of(cmds["mtp-fixed-2"]) == {"method": "mtp", "num_speculative_tokens": 2}
    assert _spec_of(cmds["mtp-online"]) == {"method": "mtp", "num_speculative_tokens": 4}
    assert cmds["mtp-online"][3] == str(tmp_path / "mimo") == cmds["target"][3]
    assert "mtp-fixed-0 / target" in [p.label for p in overhead.pairs(cmds)]


def test_mtp_variants_without_mtp_layers_in_the_target_say_which_target_to_pass(
        bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants", "mtp-online"]) == 2
    err = capsys.readouterr().err
    assert "mtp-online is not available" in err
    assert "--target models/derived/tiny-mimo-deep" in err


def test_overhead_set_without_an_eagle_head_pairs_the_draft_model_only(bench_inputs, capsys):
    cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants", "overhead",
              "--workloads", "steady-c32-code"])
    cmds = _variant_commands(capsys.readouterr().out)
    assert not any(n.startswith("eagle-") for n in cmds)
    assert len(cmds) == 8


def test_overhead_ratios_are_vspec_over_stock_medians_per_workload_and_pair():
    from vllm_vspec.bench import overhead, report
    runs = []
    for repeat, (t, f0, s1, v1) in enumerate([(100, 99, 120, 118), (110, 100, 110, 111),
                                              (90, 95, 130, 131)]):
        runs += [_run("w", "target", "target", [10], 10 / t),
                 _run("w", "fixed-0", "vspec-fixed", [10], 10 / f0),
                 _run("w", "fixed-1", "fixed", [10], 10 / s1),
                 _run("w", "vspec-fixed-1", "vspec-fixed", [10], 10 / v1)]
        for r in runs[-4:]:
            r.repeat = repeat
    got = {(r["vspec"], r["stock"]): r for r in overhead.ratios(report.rows(runs))}
    # Medians over the three rounds: target 100, fixed-0 99, fixed-1 120, vspec-fixed-1 118.
    assert got[("fixed-0", "target")]["ratio"] == pytest.approx(0.99)
    assert got[("fixed-0", "target")]["meets_target"]
    assert got[("vspec-fixed-1", "fixed-1")]["ratio"] == pytest.approx(118 / 120)
    assert not got[("vspec-fixed-1", "fixed-1")]["meets_target"]
    assert got[("fixed-0", "target")]["rounds"] == 3
    text = overhead.ratio_table(report.rows(runs))
    assert "| w | fixed-0 / target | 100.0 | 99.0 | 0.990x | 0.99x | yes |" in text
    assert "| w | vspec-fixed-1 / fixed-1 | 120.0 | 118.0 | 0.983x | 0.99x | NO |" in text
    assert overhead.ratio_table(report.rows(runs[:1])) == ""     # no pair: nothing printed


def test_paired_ratios_divide_runs_of_the_same_round_and_pair():
    from vllm_vspec.bench import overhead
    runs = []
    # target runs in two pairs; each pair's ratio uses its own target runs.
    for repeat, (t_a, f0, t_b, e0) in enumerate([(100, 99, 200, 150), (110, 110, 100, 90),
                                                 (90, 99, 100, 80)]):
        for pair, variant, speed in (("fixed-0 / target", "target", t_a),
                                     ("fixed-0 / target", "fixed-0", f0),
                                     ("eagle-fixed-0 / target", "target", t_b),
                                     ("eagle-fixed-0 / target", "eagle-fixed-0", e0)):
            r = _run("w", variant, "target" if variant == "target" else "vspec-fixed", [10],
                     10 / speed)
            r.repeat, r.pair = repeat, pair
            runs.append(r)
    got = {r["vspec"]: r for r in overhead.paired_ratios(runs)}
    assert got["fixed-0"]["round_ratios"] == pytest.approx([0.99, 1.0, 1.1])
    assert got["fixed-0"]["ratio"] == pytest.approx(1.0)
    assert (got["fixed-0"]["low"], got["fixed-0"]["high"]) == pytest.approx((0.99, 1.1))
    assert got["fixed-0"]["meets_target"]
    assert got["eagle-fixed-0"]["round_ratios"] == pytest.approx([0.75, 0.9, 0.8])
    assert not got["eagle-fixed-0"]["meets_target"]
    text = overhead.paired_ratio_table(runs)
    assert "| w | fixed-0 / target | 3 | 1.000x | 0.990x | 1.100x | 0.99x | yes |" in text
    assert "| w | eagle-fixed-0 / target | 3 | 0.800x | 0.750x | 0.900x | 0.99x | NO |" in text
    assert overhead.paired_ratio_table(runs[:1]) == ""   # a pair's one side: nothing printed


def test_paired_rounds_keep_both_servers_up_and_swap_who_goes_first(monkeypatch, tmp_path):
    from vllm_vspec.bench import overhead
    events = []

    class FakeServer:
        def __init__(self, argv, port, log, echo=None):
            self.name = next(v for v in ("fixed-0", "target") if v in str(log).split(".")[0])
            self.base_url = self.name

        def __enter__(self):
            events.append(("up", self.name))
            return self

        def __exit__(self, *exc):
            events.append(("down", self.name))

    async def fake_serve(plan, v, base_url, trace, on_progress):
        events.append(("turn", base_url))
        return [Run("w", v.name, v.family, [Completion("k", 0.0, 1.0, 10, "t")])], None

    monkeypatch.setattr(runner, "Server", FakeServer)
    monkeypatch.setattr(runner, "_serve_workloads", fake_serve)
    monkeypatch.setattr(runner, "PAIR_SWITCH_S", 0.0)
    chosen = [variants.Variant("target", "target"), variants.Variant("fixed-0", "vspec-fixed")]
    plan = runner.Plan(ServerSpec(model=tmp_path), chosen, [], {}, (1, 1), tmp_path, repeats=3)
    runs, _, failures = runner.run_paired(plan, overhead.pairs(["target", "fixed-0"]),
                                          lambda what: None)
    assert not failures
    assert events == [("up", "target"), ("up", "fixed-0"),
                      ("turn", "target"), ("turn", "fixed-0"),      # warm-up, not measured
                      ("turn", "target"), ("turn", "fixed-0"),      # round 0: stock first
                      ("turn", "fixed-0"), ("turn", "target"),      # round 1: vspec first
                      ("turn", "target"), ("turn", "fixed-0"),
                      ("down", "fixed-0"), ("down", "target")]
    assert [(r.variant, r.repeat, r.pair) for r in runs][:2] == [
        ("target", 0, "fixed-0 / target"), ("fixed-0", 0, "fixed-0 / target")]
    assert len(runs) == 6                                          # the warm-up is not kept


def test_a_named_pair_is_measured_against_its_comparator_with_its_own_target():
    from vllm_vspec.bench import overhead
    pair = overhead.parse_pair("model/fixed-2", ["target", "fixed-2", "model"])
    assert (pair.vspec, pair.stock, pair.label) == ("model", "fixed-2", "model / fixed-2")
    runs = []
    for repeat, (comparator, measured) in enumerate([(100, 97), (100, 99), (100, 98.5)]):
        for variant, speed in (("fixed-2", comparator), ("model", measured)):
            r = _run("w", variant, "fixed" if variant == "fixed-2" else "online", [10],
                     10 / speed)
            r.repeat, r.pair = repeat, pair.label
            runs.append(r)
    got = overhead.paired_ratios(runs, [pair])[0]
    assert got["ratio"] == pytest.approx(0.985)
    assert got["target"] == overhead.PAIR_TARGET_RATIO
    assert got["meets_target"]                 # 0.985 >= 0.98, though below the 0.99 of twins
    assert not overhead.paired_ratios(runs)[0]["meets_target"]   # unnamed: the twins' 0.99


@pytest.mark.parametrize("text, says", [
    ("model", "expected MEASURED/COMPARATOR"),
    ("model/", "expected MEASURED/COMPARATOR"),
    ("model/fixed-9", "no variant fixed-9 here; choose from"),
    ("model/model", "cannot be its own comparator"),
])
def test_a_bad_pair_is_refused_naming_the_value(text, says):
    from vllm_vspec.bench import overhead
    with pytest.raises(ValueError, match=says):
        overhead.parse_pair(text, ["target", "fixed-2", "model"])


def test_pair_serves_only_its_two_variants_paired(bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--pair", "model/fixed-2"]) == 0
    out = capsys.readouterr().out
    assert "1 pairs" in out and "model / fixed-2" in out
    assert _variant_commands(out).keys() == {"fixed-2", "model"}


def test_without_target_only_outputs_are_checked_against_the_first_variant():
    from vllm_vspec.bench import report
    runs = [_run("w", "fixed-2", "fixed", [10, 10], 1.0, texts=["a", "b"]),
            _run("w", "model", "online", [10, 10], 1.0, texts=["a", "c"])]
    got = {r.variant: (r.identical, r.compared) for r in report.rows(runs)}
    assert got == {"fixed-2": (2, 2), "model": (1, 2)}


def test_paired_needs_an_overhead_pair_among_the_variants(bench_inputs, capsys):
    assert cli.main(["bench", "serve", "--dry-run", *bench_inputs, "--variants", "fixed-1",
                     "--paired"]) == 2
    assert "--paired: --variants fixed-1 has no overhead pair" in capsys.readouterr().err


def test_step_profile_compare_lists_functions_whose_call_counts_differ(tmp_path):
    import cProfile

    from vllm_vspec.bench import step_profile

    def extra():
        return 1

    def step(n_extra):
        return sum(extra() for _ in range(n_extra))

    paths = []
    for n in (0, 3):
        prof = cProfile.Profile()
        prof.enable()
        step(n)
        prof.disable()
        paths.append(tmp_path / f"{n}.prof")
        prof.dump_stats(str(paths[-1]))
    lines = step_profile.compare(*paths)
    assert any(":extra  calls 0 -> 3 " in line for line in lines), lines
    assert not any(":step  calls" in line for line in lines), lines    # called once in both


def test_serve_profile_compare_sums_samples_over_every_stack_a_function_is_on(tmp_path):
    from vllm_vspec.bench import serve_profile
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    site = "/v/lib/python3.11/site-packages/vllm/v1/engine/core.py"
    a.write_text(f"main (x.py:1);step ({site}:10);forward (m.py:5) 90\n"
                 f"main (x.py:1);step ({site}:10) 10\n")
    # B spends 20 more samples in a round trip under step; a recursive frame counts once.
    b.write_text(f"main (x.py:1);step ({site}:10);forward (m.py:5) 90\n"
                 f"main (x.py:1);step ({site}:10);post_step ({site}:20);wait (q.py:3) 20\n"
                 f"main (x.py:1);step ({site}:10);step ({site}:11) 10\n")
    counts, total = serve_profile.inclusive_samples(b)
    assert total == 120 and counts["main (x.py)"] == 120
    assert counts["step (vllm/v1/engine/core.py)"] == 120          # not 130: once per stack
    lines = serve_profile.compare(a, b)
    assert lines[0].startswith("samples: 100 (a.txt) -> 120 (b.txt)")
    assert any(line.split()[:3] == ["0", "20", "+20"] and "post_step" in line for line in lines)
    assert not any("forward" in line for line in lines)             # unchanged: not listed


def test_step_profile_steps_compares_decode_steps_without_the_prefill_and_the_tail():
    from vllm_vspec.bench import step_profile

    # Three prefill/ramp steps and two tail steps per round are left out: only
    # the 2 ms (resp. 3 ms) decode steps are compared.
    def round_of(decode_ms):
        return [0.5, 0.1, 0.1, *[decode_ms / 1e3] * 5, 0.9, 0.9]

    rows = step_profile.summarize_steps({"target": [round_of(2.0)] * 3,
                                         "eagle-vspec-0": [round_of(3.0)] * 3})
    assert [r["engine"] for r in rows] == ["target", "eagle-vspec-0"]
    assert rows[0]["decode_step_ms"] == pytest.approx(2.0)
    assert rows[1]["decode_step_ratio"] == pytest.approx(1.5)
    assert rows[1]["round_ratio"] == pytest.approx((2.5 + 0.015) / (2.5 + 0.010))
    table = step_profile.format_steps(rows)
    assert table[0].startswith("| engine |") and "| eagle-vspec-0 | 3 | 10 | 3.000 | 1.5000 |" in table[3]
