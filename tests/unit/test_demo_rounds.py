"""`vllm-vspec demo --rounds`: rows measured in several rounds combine into
one table row per variant and batch size (no engine)."""

from __future__ import annotations

import pytest

from vllm_vspec.commands.demo import Row, combine_rounds, format_table


def row(variant, speedup, tok_s, identical=8, gamma_steps=None, acc=()):
    return Row(variant=variant, batch_size=1, requests=8, tokens=512, seconds=512 / tok_s,
               tokens_per_second=tok_s, speedup=speedup,
               mean_accepted_length=2.0 if acc else None, acceptance_per_position=list(acc),
               identical=identical, gamma_steps=gamma_steps)


def test_a_row_over_rounds_takes_the_median_speedup_of_its_rounds_and_their_range():
    rounds = [[row("target-only", 1.0, 50.0), row("vspec", 1.6, 80.0, acc=(0.7, 0.4))],
              [row("target-only", 1.0, 40.0), row("vspec", 1.9, 76.0, acc=(0.7, 0.2))],
              [row("target-only", 1.0, 52.0), row("vspec", 1.5, 78.0, acc=(0.7, 0.3))]]
    got = {r.variant: r for r in combine_rounds(rounds)}
    # Each ratio is to its own round's target-only; the median is of those
    # ratios, not a ratio of medians (78 / 50 = 1.56).
    assert got["vspec"].speedup == 1.6
    assert (got["vspec"].speedup_low, got["vspec"].speedup_high) == (1.5, 1.9)
    assert got["vspec"].tokens_per_second == 78.0
    assert got["vspec"].acceptance_per_position == pytest.approx([0.7, 0.3])
    assert got["vspec"].rounds == 3


def test_requests_identical_outputs_and_steps_per_gamma_add_up_over_rounds():
    rounds = [[row("vspec", 1.5, 70.0, identical=8, gamma_steps={2: 10, 3: 5})],
              [row("vspec", 1.4, 65.0, identical=7, gamma_steps={3: 4, 4: 1})]]
    got = combine_rounds(rounds)[0]
    assert (got.requests, got.identical) == (16, 15)
    assert got.gamma_steps == {2: 10, 3: 9, 4: 1}


def test_the_table_shows_the_range_only_when_there_were_rounds():
    one = combine_rounds([[row("vspec", 1.5, 70.0)]])
    three = combine_rounds([[row("vspec", s, 70.0)] for s in (1.4, 1.5, 1.7)])
    assert "1.40-1.70" in format_table(three)
    assert format_table(one).splitlines()[2].split()[4] == "-"
