"""`online` policy (default): a UCB bandit over gamma arms, per batch-size bucket.

The reward of an arm is committed tokens per second on its stable steps
(controller.py). It is estimated in two factors, because the two vary on
different time scales and with very different noise:

    R(g) = E(g) * mean over the arm's window of (B_i / interval_i)

- E(g), expected committed tokens per request at gamma g, comes from the
  per-position acceptance EWMA (acceptance_stats.py), POOLED over all arms:
  a step at gamma g measures positions < g for every arm at once, so a
  phase change of acceptance moves every arm's estimate immediately, and the
  +-30% per-step noise of realised tokens at small batch sizes stays out of
  the comparison of arms. In expectation it equals the realised reward.
- B_i / interval_i, requests completed per second, is measured per
  (bucket, arm) in a sliding window of `online_window` stable steps. It
  depends on latency only, which is smooth and slow.

UCB: score(g) = R(g) + c * R_max * sqrt(2 ln(N + 1) / n(g)), with n(g) the
window size, N the bucket's total, R_max the best estimate (c is
scale-free). An arm with no sample scores +inf. When the current arm is
settled (the best estimate, or held by hysteresis within reach of it; not a
probe) and the bucket has run `online_probe_interval` stable
steps since a neighbour's newest sample, that neighbour is probed (+inf) if
its speed here is only a seed's guess (short-lived buckets, such as the
batch sizes a burst passes through, trust the seed), its own estimate is
within NEIGHBOUR_PROBE_MARGIN of the best (its few samples may be unlucky
ones), or its samples are stale: none in the bucket's last
STALE_AFTER_WINDOWS windows of stable steps. A stale arm's samples are
replaced by the new ones, not averaged with them: they were taken under
another host load and request mix than the current arm's many recent ones,
and on a busy host a few slow samples otherwise kept an arm out of reach
for good. The arm above is also probed if it could win were the one draft
position the current gamma cannot see always accepted (a phase change may
have moved that position's acceptance). Every one of these probes waits for
the arm's own probe interval, which backs off: an arm that keeps losing
clearly (its judged gaps beyond their own spread and the noise of the two
windows) is probed at 2x, 4x, ...
online_probe_interval, until the acceptance or the bucket's batch size
moves (BACKOFF_* below: probes must pay for themselves). Read the
other way, the same evidence lets an arm that keeps winning clearly, by
less than the hysteresis, take over (AHEAD_MIN_EVIDENCE, governor.py).

Arms a bucket has not measured are estimated, not assumed to be +inf, once
two of its arms are measured: step time is close to linear in gamma (gamma
draft passes plus a verify pass that grows with gamma), so 1 / (requests/s)
is extrapolated along the least-squares line through the measured arms
(slope >= 0: a longer draft never makes a step faster). Such an estimate
counts as one sample for UCB and is checked by the neighbour probes above.

A new bucket is seeded from the nearest bucket that has samples, if that one
is at most SEED_MAX_OCTAVES away: it starts where that bucket is, without
warm-up, and takes that bucket's RELATIVE arm speeds (scaled by its own
measurement of the starting arm) for the arms it has not measured itself.
Otherwise it sweeps the feasible arms (`online_warmup_samples` stable steps
each): upwards from min gamma when the measured buckets are smaller (a
bigger batch pays more per draft token, so its best gamma is lower),
downwards from max gamma otherwise; from the SWEEP_MIN_ARMS-th arm on, the
sweep stops once an arm scores SWEEP_STOP_MARGIN below the best so far
(past the peak, the rest are extrapolated), then starts from the best (or
the incumbent).

Tree arms (arms.py `TreeArms`, when the controller is given a max width
above 1): everything above runs over (gamma, width) arms. E(gamma, width)
comes from the acceptance of that width's trees (per depth, pooled over the
width's arms); step time is extrapolated along one line in gamma per width
(gamma 0, which has no tree, lies on every width's line); the sweep takes
the narrowest width's arms first (gamma 0 with them), then each wider
width's, and stops a width's sweep past its own peak; the probed neighbours
of an arm are one depth or one width away.
"""

from __future__ import annotations

import math
from collections import deque

from vllm_vspec.core.acceptance_stats import expected_tokens_all
from vllm_vspec.core.arms import Arm, GammaArms, WidthAcceptance, nearest, on_line
from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.policies.governor import Governor
from vllm_vspec.core.steps import nearest_bucket


# A measured neighbour estimated within this fraction of the best arm is
# re-probed every `online_probe_interval` stable steps. The governor holds a
# probe for `control_interval` steps, so with the defaults (16, 4) each such
# neighbour takes up to 4 of every 20 steps at a <= 10% slower arm: <= 2% of
# throughput per neighbour, in exchange for not trusting one unlucky sample.
NEIGHBOUR_PROBE_MARGIN = 0.10

# Relative arm speeds carry to a bucket at most this many doublings of batch
# size away. Measured on the CPU host (bench trace, docs/log/benchmarks.md):
# at batch 2 a gamma-4 step took no longer than a gamma-1 step, at batch 32
# longer than even a gamma-3 step, and gamma 4 seeded from batch 2 held
# batch 32 at 0.75x target-only.
SEED_MAX_OCTAVES = 1

# A warm-up sweep stops at the first arm, from the SWEEP_MIN_ARMS-th on,
# scoring SWEEP_STOP_MARGIN below the best arm swept so far. Two arms are too
# few: with two samples each, one slow spell on the second arm of a downward
# sweep stopped it at max gamma, and the line through two neighbouring arms
# (slope clamped at 0) extrapolated every lower arm as no faster, so batch 1
# stayed at gamma 4 where gamma 2 was faster (docs/log/benchmarks.md, "Overshoot
# at low acceptance").
SWEEP_STOP_MARGIN = 0.10
SWEEP_MIN_ARMS = 3

# A neighbour not measured for this many windows (`online_window` stable
# steps of its bucket each) is probed again and its old samples are
# replaced: they were taken under another host load and request mix than
# the current arm's (see _Arms.stale).
STALE_AFTER_WINDOWS = 2

# Probe back-off: probes must pay for themselves. Each probe of
# an arm is judged at the next control point by its gap to the current arm,
# (R(cur) - R(arm)) / R(cur), and the evidence is the arm's last
# BACKOFF_EVIDENCE judged gaps against that current arm: when their mean
# exceeds BACKOFF_Z standard errors of that mean, it counts as a loss. The
# standard error is that of a mean of the judged gaps, from their spread
# (what the step-time samples cannot show: the noise of the pooled
# acceptance estimate, which at batch 1 moves a 3% gap by +-2.5% from one
# probe to the next and decorrelates between probes) and the standard
# errors of the two windows at this judgement: the probed arm's averages
# with the gaps (its samples are mostly new at each probe), the current
# arm's does not (its window spans every judgement). A loss
# needs no minimum size: an arm clearly behind is a probe that does not pay,
# however small the gap, and an arm a few percent behind is the costliest
# one to keep probing (it stays close enough to be re-probed every
# interval). After BACKOFF_FREE_LOSSES losses in a row, each further one
# doubles the arm's probe interval (at most 2**BACKOFF_MAX_DOUBLINGS times
# online_probe_interval); when the mean gap comes out at or below zero (the
# arm at least as good as the current one, on the evidence) it goes back to
# online_probe_interval; in between (not clearly either: the noise) its
# count is left. The evidence starts afresh when the current arm changes.
# (Free losses: a probe's few samples may be unlucky ones, and a bucket
# that lives only for a phase of a burst keeps today's probing.) Every probe
# rule (unmeasured, stale, close neighbour, the arm above) waits for that
# interval, so an arm that keeps losing clearly is probed less and less
# often: with the defaults a neighbour 10% slower is probed after 16, 32,
# ... 1024 stable steps, and after warm-up its probes (a control_interval
# hold and the switch steps around it) stay under 2% of steps. When the
# acceptance (E at the current arm's depth, at least 1, pooled over arms)
# moves by more than ACCEPTANCE_MOVE of its drafted part (E - 1; at least
# ACCEPTANCE_MOVE_TOKENS tokens), or the bucket's batch size (an EWMA of its
# stable steps) by more than BATCH_MOVE, since an arm's evidence started or
# it last lost, the arm's back-off and evidence are dropped: what made it
# lose may be gone, so it is probed again after online_probe_interval. A
# move must also exceed ACCEPTANCE_NOISE_Z times the spread E shows at the
# bucket's own control points (an EWMA of its variance, weight
# ACCEPTANCE_NOISE_WEIGHT): at batch 1 the acceptance of single requests
# moves E by tenths of a token from step to step, and that is noise, not
# news. (The drafted part, not E: from drafts useless (E = 1) a small rise
# is the whole news; E is an EWMA still converging after a phase change, so
# an arm judged on a half-converged E is re-judged soon.) Older judgements
# than the last BACKOFF_EVIDENCE slide out, so a slow drift of the arms'
# speeds (one that moves neither the acceptance nor the batch size) still
# reaches the verdict.
BACKOFF_EVIDENCE = 8
BACKOFF_Z = 2.0
# The same evidence read the other way (governor.py): an arm whose judged
# gaps against the current arm have a mean below -BACKOFF_Z standard errors,
# from at least AHEAD_MIN_EVIDENCE judgements (with two, a t-ratio of 2
# happens by chance about one time in seven), is clearly ahead: it moves the
# governor when it scores best, however small its lead, where the
# hysteresis alone would hold the current arm for good.
AHEAD_MIN_EVIDENCE = 4
BACKOFF_FREE_LOSSES = 2
BACKOFF_MAX_DOUBLINGS = 6
ACCEPTANCE_MOVE = 0.15
ACCEPTANCE_MOVE_TOKENS = 0.03
ACCEPTANCE_NOISE_WEIGHT = 0.05
ACCEPTANCE_NOISE_Z = 4.0
BATCH_MOVE = 0.25


class _Arms:
    """Per-arm windows of requests/s samples in one bucket, plus an optional
    seed: the relative speed of each arm in the bucket it was seeded from."""

    def __init__(self, window: int, probe_interval: int, incumbent: Arm | None, space=None):
        self.space = GammaArms() if space is None else space
        self.window = window
        self.probe_interval = probe_interval
        self.rate: dict[int, deque[float]] = {}
        self.last_seen: dict[int, int] = {}  # arm -> bucket step of its newest sample
        self.steps = 0                        # stable steps observed in this bucket
        self.warmup: list[int] | None = []    # arms still to sweep; None once done
        self.swept: list[int] = []            # arms swept so far, in sweep order
        self.incumbent = incumbent            # gamma in use anywhere when the bucket opened
        self.seed_ref: int | None = None      # arm the seed speeds are relative to
        self.seed: dict[int, tuple[float, int]] = {}   # arm -> (speed / speed of ref, samples)
        # Probe back-off: arm -> losses in a row (BACKOFF_*); arm ->
        # last_seen step of the newest sample judged; arm -> (the current
        # arm it was judged against, its last judged relative gaps); arm ->
        # (acceptance, batch size) when its evidence started or it last lost.
        self.backoff: dict[Arm, int] = {}
        self.judged: dict[Arm, int] = {}
        self.evidence: dict[Arm, tuple[Arm, deque[float]]] = {}
        self.context: dict[Arm, tuple[float, float]] = {}
        self.ahead: dict[Arm, Arm] = {}      # arm -> the current arm it is clearly ahead of
        self.against: Arm | None = None       # the current arm at the last judgement
        self.batch = 0.0                      # EWMA of the batch size of its stable steps
        self.acc_mean: float | None = None    # EWMA of E at its control points
        self.acc_cur: Arm | None = None       # the current arm E was taken at
        self.acc_var = 0.0                    # and of its variance

    def add(self, gamma: int, requests_per_s: float, num_reqs: int = 0) -> None:
        if num_reqs:
            self.batch = num_reqs if not self.batch else 0.9 * self.batch + 0.1 * num_reqs
        samples = self.rate.setdefault(gamma, deque(maxlen=self.window))
        if self.stale(gamma):
            # Replaced, not nudged: the host's load and the request mix of
            # the old samples are gone, and the arms in use were measured
            # under the new ones.
            samples.clear()
        self.steps += 1
        samples.append(requests_per_s)
        self.last_seen[gamma] = self.steps

    def stale(self, gamma: int) -> bool:
        """Measured, but not in the bucket's last STALE_AFTER_WINDOWS windows
        of stable steps."""
        return (gamma in self.last_seen
                and self.steps - self.last_seen[gamma] >= STALE_AFTER_WINDOWS * self.window)

    def own_means(self) -> dict[int, float]:
        return {g: sum(r) / len(r) for g, r in self.rate.items() if r}

    def means(self, lo: int, hi: int, arms=None) -> dict[Arm, float]:
        """Requests/s per arm of `arms` (default the gammas lo..hi): measured
        here, else the seed's relative speed scaled by this bucket's own
        measurement of the reference arm (a bigger batch runs every arm
        faster; the ranking is what carries), else extrapolated along its
        width's line (module docstring)."""
        space = self.space
        arms = range(lo, hi + 1) if arms is None else arms
        own = self.own_means()
        out = dict(own)
        if self.seed_ref in own:
            for g, (relative, _n) in self.seed.items():
                out.setdefault(g, own[self.seed_ref] * relative)
        lines: dict[int, object] = {}    # arm group (width) -> seconds per step along gamma
        for a in arms:
            if a in out:
                continue
            group = space.group(a)
            if group not in lines:
                points = {x: r for x, r in own.items() if on_line(space, x, group)}
                lines[group] = (_line({space.gamma(x): 1.0 / r for x, r in points.items()
                                       if r > 0}) if len(points) >= 2 else None)
            seconds = lines[group]
            if seconds is not None and seconds(space.gamma(a)) > 0:
                out[a] = 1.0 / seconds(space.gamma(a))
        return {a: r for a, r in out.items() if a in arms}

    def count(self, gamma: Arm) -> int:
        """Samples behind an arm's estimate: its own, else the seed's, else 1
        (extrapolated) when two arms of its line are measured, else 0
        (unknown)."""
        n = len(self.rate.get(gamma, ()))
        if n:
            return n
        if gamma in self.seed:
            return self.seed[gamma][1]
        group = self.space.group(gamma)
        # A window, once made, is never empty.
        return 1 if sum(on_line(self.space, x, group) for x in self.rate) >= 2 else 0

    def expired(self, gamma: int) -> bool:
        """Due for a probe: no sample of `gamma` in the last probe_interval
        steps, doubled per loss of the arm beyond the free ones (BACKOFF_*)."""
        # The first losses do not back off: only repeated ones do.
        interval = self.probe_interval << max(0, self.backoff.get(gamma, 0) - BACKOFF_FREE_LOSSES)
        return self.steps - self.last_seen.get(gamma, 0) > interval

    def standard_error(self, gamma: Arm) -> float | None:
        """Standard error of the mean of an arm's window (None below 2 samples)."""
        r = self.rate.get(gamma)
        if not r or len(r) < 2:
            return None
        mean = sum(r) / len(r)
        var = sum((x - mean) ** 2 for x in r) / (len(r) - 1)
        return math.sqrt(var / len(r))

    def judge(self, cur: Arm, means: dict[Arm, float], e: dict[Arm, float],
              acceptance: float, acc_var: dict[Arm, float] | None = None) -> None:
        """Back-off bookkeeping at a control point (BACKOFF_*, ACCEPTANCE_MOVE, BATCH_MOVE):
        judge every arm with a sample newer than its last judgement against
        the current arm `cur`, on its evidence (its judged gaps against
        `cur`); drop the back-off and the evidence of arms whose context
        moved. `means` are R estimates, `e` the E(arm) factors, `acc_var`
        the variance each arm's gap owes to the acceptance estimates' own
        errors (OnlinePolicy.gap_acceptance_variance; default none)."""
        batch = self.batch
        # The acceptance signal's own spread at this bucket's control points
        # (an EWMA of its variance): at batch 1 E moves by tenths of a token
        # from step to step, at batch 32 by hundredths.
        noise_e = ACCEPTANCE_NOISE_Z * math.sqrt(self.acc_var)
        if self.acc_mean is None or cur != self.acc_cur:
            # E is taken at the current arm's depth: another arm, another level.
            self.acc_mean, self.acc_cur = acceptance, cur
        else:
            d = acceptance - self.acc_mean
            # Every move is folded into the spread, capped at the bound of
            # the moment, while a bucket whose E keeps moving by more
            # learns that spread within tens of control points. (Folding
            # only the moves within the bound would not learn it: the bound
            # starts at 0 and grows only by what it admits, so a bucket
            # whose E moves by more than the bound at nearly every control
            # point, as batch 1's does, would drop nearly every judgement's
            # evidence.) A move beyond the bound also re-centres the mean at
            # once: a level shift is folded once, as one bounded step, and
            # does not hide the next one. (Left to the slow mean, a jump
            # would stay beyond the bound for tens of control points and
            # grow it at each, and no later move would be news.)
            cap = max(noise_e, ACCEPTANCE_MOVE_TOKENS)
            clipped = max(-cap, min(cap, d))
            self.acc_mean = acceptance if abs(d) > cap else self.acc_mean + ACCEPTANCE_NOISE_WEIGHT * d
            self.acc_var = (1 - ACCEPTANCE_NOISE_WEIGHT) * (
                self.acc_var + ACCEPTANCE_NOISE_WEIGHT * clipped * clipped)
        for g, ctx in list(self.context.items()):
            a0, b0 = ctx
            if (abs(acceptance - a0) > max(ACCEPTANCE_MOVE_TOKENS, ACCEPTANCE_MOVE * (a0 - 1.0),
                                           noise_e)
                    or abs(batch - b0) > BATCH_MOVE * max(b0, 1e-9)):
                self.backoff.pop(g, None)
                self.evidence.pop(g, None)
                self.ahead.pop(g, None)
                del self.context[g]
        if cur != self.against:
            # Every loss was judged against the arm current then; against
            # another it says nothing. Kept, it stretched the probes of the
            # one arm that could tell that the acceptance had come back: a
            # simulated batch 1 that moved from gamma 2 to gamma 0 (which
            # measures no acceptance) stayed there 1,028 steps, gamma 1
            # backed off to 1,024-step probes by its losses against gamma 2.
            # (Keeping the losses of arms the move went away from changes
            # nothing: only the current arm's neighbours are probed.)
            self.backoff.clear()
            self.against = cur
        if cur not in means or means[cur] <= 0:
            return
        for g, seen in self.last_seen.items():
            if g == cur or self.judged.get(g) == seen or g not in means:
                continue
            self.judged[g] = seen
            against, gaps, gap_acc_var = self.evidence.get(g, (None, deque(), deque()))
            if against != cur:
                gaps = deque(maxlen=BACKOFF_EVIDENCE)
                gap_acc_var = deque(maxlen=BACKOFF_EVIDENCE)
                self.evidence[g] = (cur, gaps, gap_acc_var)
                self.context[g] = (acceptance, batch)
            gaps.append((means[cur] - means[g]) / means[cur])
            gap_acc_var.append((acc_var or {}).get(g, 0.0))
            n = len(gaps)
            mean = sum(gaps) / n
            spread = sum((x - mean) ** 2 for x in gaps) / (n - 1) if n > 1 else 0.0
            se_cur, se_g = self.standard_error(cur), self.standard_error(g)
            # The current arm's window spans every judgement (its error is
            # common to all of them); the probed arm's samples are mostly new
            # at each probe, so its error averages out with the gaps', and
            # so does the acceptance estimates' (a probe re-measures the
            # positions the two arms differ in). Without the latter, a
            # position measured on one batch-1 probe (one drafted token: an
            # estimate of 0 or 1) would make verdicts: an estimate stale
            # near 0 backs the arm above off and holds the bucket at a low
            # gamma for as long as it stays stale.
            var = ((spread + (e.get(g, 1.0) * se_g / means[cur]) ** 2 + sum(gap_acc_var) / n) / n
                   + (e.get(cur, 1.0) * se_cur / means[cur]) ** 2
                   if se_cur is not None and se_g is not None else math.inf)
            if mean > BACKOFF_Z * math.sqrt(var):
                self.backoff[g] = min(self.backoff.get(g, 0) + 1,
                                      BACKOFF_FREE_LOSSES + BACKOFF_MAX_DOUBLINGS)
                self.context[g] = (acceptance, batch)
            elif mean <= 0.0:
                # At least as good as the current arm, on the evidence:
                # probe it at the normal rate.
                self.backoff.pop(g, None)
            if n >= AHEAD_MIN_EVIDENCE and mean < -BACKOFF_Z * math.sqrt(var):
                self.ahead[g] = cur
            else:
                self.ahead.pop(g, None)

    def seed_from(self, other: "_Arms", gamma: Arm) -> Arm:
        """Take the relative arm speeds of `other` (its own measurements and
        what it was seeded with), referenced to its arm nearest to `gamma`;
        returns that arm (where this bucket starts)."""
        means = other.means(0, 0, self.space.span(list(other.rate.keys() | other.seed.keys())))
        ref = nearest(self.space, gamma, list(means))
        self.seed_ref = ref
        self.seed = {g: (m / means[ref], other.count(g)) for g, m in means.items()}
        self.warmup = None
        return ref


def _line(points: dict[int, float]):
    """Least-squares line y(g) through {g: y} with slope clamped at >= 0
    (None without two distinct g)."""
    if len(points) < 2:
        return None
    n = len(points)
    mg = sum(points) / n
    my = sum(points.values()) / n
    var = sum((g - mg) ** 2 for g in points)
    slope = max(0.0, sum((g - mg) * (y - my) for g, y in points.items()) / var)
    return lambda g: my + slope * (g - mg)


class OnlinePolicy:
    def __init__(self, config: VSpecConfig, space=None):
        self.config = config
        self.space = GammaArms() if space is None else space
        self.governor = Governor(config, self.space)
        self.acceptance = WidthAcceptance(config.max_gamma, config.ewma_weight,
                                          config.min_observations)
        self.buckets: dict[int, _Arms] = {}

    # ------------------------------------------------------------ decide
    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: Arm | None) -> tuple[Arm, str]:
        feasible = self.space.arms(batch, lo, hi)
        arms = self.buckets.get(bucket)
        if arms is None:
            gamma, reason = self._open(bucket, lo, hi, feasible, previous)
        elif arms.warmup is not None:
            gamma, reason = self._warmup(bucket, arms, lo, hi, feasible)
        else:
            gamma, reason = self.governor.step(
                bucket, lo, hi, lambda: self.scores(bucket, lo, hi, feasible), "ucb", feasible,
                clearly_ahead=lambda a: arms.ahead.get(a) == self.governor.gamma[bucket])
        return gamma, reason

    def _open(self, bucket: int, lo: int, hi: int, feasible,
              previous: Arm | None) -> tuple[Arm, str]:
        arms = _Arms(self.config.online_window, self.config.online_probe_interval,
                     incumbent=previous, space=self.space)
        self.buckets[bucket] = arms
        source = self._nearest_measured(bucket)
        if source is not None and abs(math.log2(source / bucket)) <= SEED_MAX_OCTAVES:
            start = arms.seed_from(self.buckets[source], self.governor.gamma[source])
            start = nearest(self.space, start, feasible)
            self.governor.start(bucket, start)
            return start, "seed"
        upwards = source is not None and source < bucket
        order = self.space.sweep(feasible, upwards)
        arms.warmup = order if self.config.online_warmup_samples else []
        arms.swept = []
        return self._warmup(bucket, arms, lo, hi, feasible)

    def _nearest_measured(self, bucket: int) -> int | None:
        return nearest_bucket((b for b, a in self.buckets.items()
                               if b != bucket and a.warmup is None and a.rate), bucket)

    def _warmup(self, bucket: int, arms: _Arms, lo: int, hi: int,
                feasible) -> tuple[Arm, str]:
        space = self.space
        need = self.config.online_warmup_samples
        while arms.warmup and (arms.warmup[0] not in feasible
                               or len(arms.rate.get(arms.warmup[0], ())) >= need):
            g = arms.warmup.pop(0)
            if g in feasible:
                arms.swept.append(g)
                if self._past_peak(bucket, arms.swept, lo, hi, feasible):
                    # This width's sweep is done (at width 1: the whole sweep).
                    arms.warmup = [a for a in arms.warmup if space.group(a) != space.group(g)]
        if arms.warmup:
            gamma = arms.warmup[0]
            self.governor.start(bucket, gamma)
            return gamma, "warmup"
        arms.warmup = None
        means = self.estimates(bucket, lo, hi, feasible)
        if self.config.online_warmup_return == "incumbent" and arms.incumbent is not None:
            gamma = nearest(space, arms.incumbent, feasible)
        elif means:
            gamma = max(means, key=lambda a: (means[a], [-c for c in space.cost(a)]))
        else:
            gamma = feasible[-1]
        self.governor.start(bucket, gamma)
        return gamma, "warmup"

    def _past_peak(self, bucket: int, swept: list[Arm], lo: int, hi: int, feasible) -> bool:
        """The newest swept arm, from the SWEEP_MIN_ARMS-th of its width on,
        scores SWEEP_STOP_MARGIN below the best swept of its width."""
        group = self.space.group(swept[-1])
        mine = [a for a in swept if self.space.group(a) == group]
        if len(mine) < SWEEP_MIN_ARMS:
            return False
        est = self.estimates(bucket, lo, hi, feasible)
        best = max(est.get(a, 0.0) for a in mine)
        return est.get(swept[-1], 0.0) < best * (1.0 - SWEEP_STOP_MARGIN)

    def estimates(self, bucket: int, lo: int, hi: int, arms=None) -> dict[Arm, float]:
        """R(arm), committed tokens per second, for the arms of `arms`
        (default the gammas lo..hi) this bucket can estimate (measured,
        seeded or extrapolated: _Arms.means)."""
        space = self.space
        arms = range(lo, hi + 1) if arms is None else arms
        depth = max(space.gamma(a) for a in arms)
        e = {w: self.acceptance.expected(w, depth) for w in {space.width(a) for a in arms}}
        return {a: e[space.width(a)][space.gamma(a)] * m
                for a, m in self.buckets[bucket].means(lo, hi, arms).items()}

    def scores(self, bucket: int, lo: int, hi: int, arms=None) -> dict[Arm, float]:
        """UCB score of every arm of `arms` (default the gammas lo..hi; see
        the module docstring)."""
        space = self.space
        feasible = range(lo, hi + 1) if arms is None else arms
        arms = self.buckets[bucket]
        means = self.estimates(bucket, lo, hi, feasible)
        r_max = max(means.values(), default=0.0)
        total = sum(arms.count(g) for g in means)
        c = self.config.online_exploration
        out = {}
        for g in feasible:
            out[g] = (means[g] + c * r_max * math.sqrt(2 * math.log(total + 1) / arms.count(g))
                      if g in means else math.inf)
        cur = self.governor.gamma[bucket]
        # Probe only from a settled arm, so probes never chain: one the
        # governor keeps (not an exploring move) and will keep at this
        # control point (the best estimate, or within hysteresis of it). The
        # second half matters: an arm held by hysteresis below the best
        # estimate, with no probes, would never be re-measured, and at gamma 0
        # the acceptance that drives every other estimate is not measured
        # either: a frozen tie that held batch 1 at gamma 0 for 300 steps in
        # a bench run (docs/log/benchmarks-log.md, "A frozen tie at gamma 0").
        if not self.governor.exploring(bucket):
            depth = max(space.gamma(a) for a in feasible)
            e_all = {w: self.acceptance.expected(w, depth)
                     for w in {space.width(a) for a in means}}
            # The acceptance context: E at the current arm's depth (at least
            # 1), the positions every one of its steps observes (deeper ones
            # move only when a probe drafts them).
            e_cur = self.acceptance.expected(space.width(cur), max(1, space.gamma(cur)))[-1]
            arms.judge(cur, means, {a: e_all[space.width(a)][space.gamma(a)] for a in means},
                       e_cur, self.gap_acceptance_variance(cur, means, e_all, depth))
        if (self.governor.exploring(bucket)
                or means.get(cur, 0.0) * (1.0 + self.config.hysteresis) < r_max):
            return out
        for g in space.neighbours(cur):
            # A long-lived bucket checks the seed's guess, and re-measures a
            # close neighbour: its few samples may be unlucky ones, and the
            # current arm's many samples keep UCB's bonus for it tiny.
            if g in means and arms.expired(g) and (
                    not arms.rate.get(g) or arms.stale(g)
                    or means[g] >= r_max * (1.0 - NEIGHBOUR_PROBE_MARGIN)):
                out[g] = math.inf
        above = space.above(cur)
        if out.get(above, 0.0) < math.inf and above in means and arms.expired(above):
            depth = space.gamma(above)
            e = self.acceptance.expected(space.width(above), depth)
            # E(above) if position depth-1 were always accepted.
            e_best = e[depth - 1] + (e[depth - 1] - e[depth - 2] if depth >= 2 else 1.0)
            if e_best / e[depth] * means[above] > r_max * (1.0 + self.config.hysteresis):
                out[above] = math.inf
        return out

    def gap_acceptance_variance(self, cur: Arm, means: dict[Arm, float],
                                e: dict[int, list[float]], depth: int) -> dict[Arm, float]:
        """Per arm, the variance of its relative gap to `cur`, 1 - R(arm) /
        R(cur), that the errors of the acceptance estimates make
        (PositionAcceptance.errors; delta method). E is linear in each
        position's rate, so raising one rate by 1 gives its exact
        derivative. `means` are R estimates, `e` E per width up to `depth`."""
        space = self.space
        w_cur, g_cur = space.width(cur), space.gamma(cur)
        out = {a: 0.0 for a in means if a != cur}
        if cur not in means or means[cur] <= 0:
            return out
        for w in e:
            rates, errors = self.acceptance.rates(w), self.acceptance.errors(w)
            for i in range(depth):
                bumped = list(rates)
                bumped[i] += 1.0
                slope = [x - y for x, y in zip(expected_tokens_all(bumped, depth), e[w])]
                d_cur = slope[g_cur] / e[w][g_cur] if w == w_cur else 0.0
                for a in out:
                    g = space.gamma(a)
                    d_a = slope[g] / e[w][g] if space.width(a) == w else 0.0
                    out[a] += (means[a] / means[cur] * (d_a - d_cur) * errors[i]) ** 2
        return out

    # ------------------------------------------------------------ observe
    def observe(self, outcome) -> None:
        fb = outcome.feedback
        self.acceptance.update(fb.drafted, fb.accepted, outcome.verified_width)
        arms = self.buckets.get(outcome.bucket)
        if outcome.stable and arms is not None:
            arms.add(self.space.arm(outcome.gamma, outcome.width),
                     outcome.batch.num_reqs / outcome.interval_s, outcome.batch.num_reqs)
