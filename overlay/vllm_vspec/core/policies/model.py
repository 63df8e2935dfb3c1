"""`model` policy: the gamma that a model of acceptance and step cost says
commits the most tokens per second, every step.

    gamma = argmax_g  B * E(g) / T(B, g)

E(g) from per-position Beta posteriors of acceptance (core/posterior.py),
T(B, g) from one step-cost model fitted online on every step, pooled over
batch sizes (core/step_cost.py): a step at gamma g verifies B*g drafts
next step and runs g draft passes now. The steps the policy does not
decide (those that prefill prompts) are fitted too (`observe_cost`):
while drafting is on, the drafter prefills every new prompt, which it
skips at gamma 0, so drafting is also charged that prefill for the
prompt tokens that come with the tokens it commits (prompt tokens per
committed token, as measured); and a prefill step, whose gamma is
the one in force, runs at gamma 0 where the model would choose 0 for its
batch (`prefill_gamma`: a lazy drafter then skips its prompts, which are
paid for only if their requests draft later). A step that drafts
after a gamma-0 step pays a catch-up (a lazy drafter's pass over the
tokens it missed; nothing in sync mode, where the fit finds it free):
the model fits it per request caught up, and a decision to resume is
charged it spread over the mean length of past drafting runs (charged
whole to one step, it would hold gamma 0 wherever drafting wins only in
the steady state; not charged, short excursions from gamma 0 would each
pay it). Exploration is Thompson sampling over acceptance: each decision
draws the acceptance rates from their posteriors, so a gamma is tried as
often as the evidence leaves it possibly best, and exploration stops as
the arms separate; costs are the fit's means (a step's time scatters with
the host, which more steps average out). But a linear fit pooled over
batch sizes cannot be exact everywhere, and where two gammas differ by a
few percent its error decides; worse, refitted to the gamma it runs, the
fit can misprice a gamma it no longer runs for good. So every cell
(batch bucket, gamma) scales the fit by its own factor, with a prior
(log-normal, sd CELL_SPREAD) and a posterior from the cell's steady
decided steps (their time over the fit's predictions for them), and a
cell's price becomes what its steps measured. A host's speed drifts (a
busy spell, another process), so the factor is a random walk (a step
observed moves it CELL_DRIFT of a step's scatter): its steps' evidence
loses precision with their age, and a cell left unrun drifts back to the
fit's price, with the prior's spread. A cell whose evidence is worth less
than RECHECK_STEPS fresh steps is run again ("recheck") if it could be
the best choice (priced two sds lower, it
would be): a price measured in a slow spell is not kept for good, and a
cell never run is tried. Where the fit cannot price a
gamma at all (its standard error above PROBE_SPREAD of its prediction:
a batch size far from those that drafted, where what a draft pass costs
per request rests on the prior), that gamma is run while it could be the
best choice (two standard errors cheaper, it would be), until the fit can
price it (a gamma the model prices 2x too high would otherwise never be
run again). No bandit arms, windows, hysteresis or per-bucket seeding:
every step teaches both models whatever gamma it ran.

Where a finished request's slot is not refilled, the batch drains: its
slowest request sets how long it runs, and drafting, which desynchronises
requests that gamma 0 would end together, pays its fixed step cost until
the last one ends. A token is priced rho x its rate price + (1 - rho) x
its share of the drain's cost (core/drain.py; rho the share of freed
slots seen refilled), and a recheck in a draining batch must pay for its
steps before the batch leaves its bucket (`_horizon`).

At batch 1 the acceptance used is conditioned on the request's last
known outcome (did the step observed last accept every draft it
verified?): matches come in runs, so a full acceptance foretells a higher
rate for the drafts decided now, which are verified two steps after it.
At larger batches the pooled posterior serves (the feedback does not name
requests).

Cold start: the first decisions sweep the feasible gammas from the top,
once each, so the cost model sees every draft length before it
extrapolates (and a state saved by `state()` skips the sweep).

Linear drafts only (a tree space is refused at construction).
"""

from __future__ import annotations

import math
import random

import numpy as np

from vllm_vspec.config import VSpecConfig
from vllm_vspec.core.arms import Arm, GammaArms
from vllm_vspec.core.acceptance_stats import expected_tokens_all
from vllm_vspec.core.drain import Refill, RequestRates, commit_moments, drain_steps
from vllm_vspec.core.posterior import AcceptancePosterior
from vllm_vspec.core.step_cost import (DRAFT_PREFILL, MIN_SAMPLES, NOISE_FLOOR, PREFILL,
                                      DraftingRuns, PooledStepCost, features)
from vllm_vspec.core.steps import bucket_of

# How far a cell's (batch bucket, gamma) true step time may stand from the
# pooled fit before any of its steps ran: the prior sd of the log of their
# ratio. Its steps' scatter is the fit's relative error, at least
# step_cost.NOISE_FLOOR.
CELL_SPREAD = 0.1
# How far a cell's log ratio drifts a step observed, as a share of a
# steady step's scatter about its price (the sd of a random walk's step;
# a host whose steps scatter more drifts more): evidence `a` steps old
# weighs as if its variance grew by a * (CELL_DRIFT * scatter)**2.
CELL_DRIFT = 0.1
# A cell whose steps' aged evidence is worth less than this many fresh
# steady steps is unsure: run again while it could be the best choice
# (a cell that ran for long is unsure after 1 / (CELL_DRIFT**2 *
# RECHECK_STEPS) = 200 steps unrun, whatever the host's scatter).
RECHECK_STEPS = 0.5
# A gamma whose predicted step time has a standard error above this share
# of the prediction (or of the mean step fitted, if smaller) is run before
# the model chooses (decide's "probe").
PROBE_SPREAD = 0.5
# Prefill steps in a row that a sweep's or recheck's gamma stays in force
# through (prefill_gamma). A re-checked cell needs a steady decided step,
# whose step before ran its gamma: where arrivals come one or two between
# decided steps, they keep it, else the recheck would never get one; a
# longer run of arrivals (a wave of requests finishing together) drafts
# no deeper than the model's choice after these, and costs the recheck
# one catch-up step instead of drafting through the wave.
RECHECK_PREFILLS = 2
# Decided steps a recheck costs: one that changes gamma (it verifies the
# last gamma's drafts) and the steady one that prices the cell.
RECHECK_COST = 2.0
# Steps a cell's evidence lasts unrun before the cell is unsure again.
LASTING = 1.0 / (CELL_DRIFT ** 2 * RECHECK_STEPS)


def _expected_gain(value: float, best: float, sd: float) -> float:
    """E[max(0, value * e^X - best)], X ~ Normal(0, sd^2): what a gamma
    priced at `value` may gain a step over the `best`, its price's log
    uncertain by `sd`."""
    if sd <= 0 or value <= 0:
        return max(value - best, 0.0)
    u = math.log(best / value)
    phi = lambda x: 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))
    return value * math.exp(sd * sd / 2) * phi(sd - u / sd) - best * phi(-u / sd)


class ModelPolicy:
    def __init__(self, config: VSpecConfig, space=None):
        self.space = GammaArms() if space is None else space
        if self.space.max_width > 1:
            raise ValueError("vspec.policy='model' is not allowed with tree_width > 1: "
                             "it chooses linear draft lengths only (use online)")
        self.config = config
        self.k = config.max_gamma
        self.acceptance = AcceptancePosterior(max(self.k, 1), config.model_memory_steps)
        self.cost = PooledStepCost(config.model_cost_window)
        self.thompson = config.model_thompson
        self.rng = random.Random(config.model_seed)
        self.observed_gamma: int | None = None      # the gamma of the step observed last
        # A drafter that skips gamma-0 steps skips their prompts too, so
        # drafting costs it the prompts it prefills.
        self.lazy = config.drafter_skips_gamma0
        # Prompt tokens and committed tokens of every observed step, decayed
        # as the cost model's sums: prompt tokens a committed token brings along.
        self.prompt_tokens, self.committed = 0.0, 0.0
        # Prompt tokens of prefill steps run at gamma 0 by a lazy drafter:
        # the next step that drafts catches them up (its draft prefill).
        self.owed_prompt = 0
        self._prompt_known: tuple | None = None    # (batch, fit) where the drafter's share was known
        self.runs = DraftingRuns()                  # decided drafting runs (a resume's catch-up)
        self.swept = 0
        self.reason = "sweep"                 # why the last decision was made (decide's reason)
        self.decided_bucket = 0               # the batch bucket of the last decision
        self.prefills = 0                     # prefill steps since the last decision
        self._priced: tuple | None = None     # (batch, gammas, fit) found priced last
        # (bucket, gamma) -> [decayed sum of the features of its steady
        # decided steps, of their ms, weight, observation count when last decayed]
        self.cells: dict[tuple[int, int], list] = {}
        self.cell_steady: dict[tuple[int, int], int] = {}   # observation count at its last steady step
        self._memo: dict = {}         # prices and cell posteriors of the current step and fit
        self.observed = 0
        # Batch 1: acceptance conditioned on whether the request's last known
        # step accepted every draft it verified (runs of matches persist),
        # and the outcomes of the last two observed steps (None: unknown).
        self.by_outcome = {o: AcceptancePosterior(max(self.k, 1), config.model_memory_steps)
                           for o in (True, False)}
        self.outcomes: list[bool | None] = []
        # Where freed slots are not refilled, a batch drains (core/drain.py).
        self.refill = Refill()
        self.request_rates = RequestRates()

    def opening(self) -> Arm:
        return self.space.arm(self.k, 1)

    def values(self, batch, arms, draw: bool, resuming: bool = False,
               shave: np.ndarray | float = 0.0, prompt_shift: float = 0.0,
               drain: bool = True) -> dict[int, float]:
        """Predicted committed tokens per millisecond of each gamma of `arms`;
        `resuming`: the step in force is gamma 0, so drafting now pays the
        catch-up; `shave`: ms taken off each gamma's predicted step time;
        `prompt_shift`: ms per 1000 prompt tokens added to the drafter's
        fitted price of a prompt; `drain` False: the rate alone, whatever
        the share of freed slots refilled."""
        b = max(batch.num_reqs, 1)
        gammas = [self.space.gamma(a) for a in arms]
        base, admit, fixed = self._prices(batch, tuple(gammas), resuming)
        post = self.acceptance
        if b == 1 and self.outcomes and self.outcomes[-1] is not None:
            post = self.by_outcome[self.outcomes[-1]]
        rates = post.sample(self.rng) if draw else post.mean()
        e = np.asarray(expected_tokens_all(rates, max(gammas)))[gammas]
        cost = np.maximum(base + (self.cost.fit()[DRAFT_PREFILL] + prompt_shift) * admit * e - shave,
                          1e-6)
        per_token = cost / (b * e)
        rho = self.refill.rho
        if drain and b > 1 and len(batch.remaining) == b and rho < 1.0:
            # A share 1 - rho of the batch drains: its tokens cost what the
            # drain costs them (core/drain.py), no prompt arriving.
            step = np.maximum(base - shave, 1e-6)
            fixed_ms = np.clip(fixed, 0.0, base) * step / np.maximum(base, 1e-6)
            most, total, left, e_mean = self._drain_steps(batch, tuple(gammas))
            # Drawn acceptance scales a request's steps as it scales its
            # tokens a step (to first order).
            scale = e_mean / e
            drained = (fixed_ms * most + (step - fixed_ms) / b * total) * scale / left
            per_token = rho * per_token + (1.0 - rho) * drained
        return {a: 1.0 / t for a, t in zip(arms, per_token.tolist())}

    def _drain_steps(self, batch, gammas: tuple) -> tuple:
        """Per gamma, E[max_i N_i] and sum_i N_i of the batch's requests at
        the acceptance means (core/drain.py), the tokens they have left, and
        E(g) at those means. Memoised until the next observed step (its
        per-request work is the policy's costliest at a large batch)."""
        key = (self.observed, gammas, batch.requests, batch.remaining)
        known = self._memo.get("drain")
        if known is not None and known[0] == key:
            return known[1]
        rates = self.acceptance.mean()
        m, m_sd = self.request_rates.multipliers(batch.requests, float(rates[0]))
        first, second = commit_moments(rates, gammas)
        most, total = drain_steps(np.maximum(np.asarray(batch.remaining, dtype=float), 1.0),
                                  m, m_sd, first, second)
        out = (most, total, max(sum(batch.remaining), 1), first)
        self._memo["drain"] = (key, out)
        return out

    def _prices(self, batch, gammas: tuple,
                resuming: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per gamma: the predicted step time in ms but the drafter's prefill
        of the prompts that come with the tokens the step commits, that
        prefill per committed token and ms of the drafter's price of 1000
        prompt tokens, and the part of the step time paid whatever the
        batch size (a step's own and its draft passes'). Memoised until the
        next observed step or refit."""
        theta = self.cost.fit()
        b = max(batch.num_reqs, 1)
        key = (b, batch.mean_context_len, gammas, resuming, self.observed, self.cost.fits)
        if self._memo.get("prices", (None,))[0] != key:
            g = np.array(gammas, dtype=float)
            x = features(b, b * g, g, b * (g > 0) * resuming / self.runs.dwell,
                         b * batch.mean_context_len)
            scale = np.array([self._cell_scale(bucket_of(b), k, theta) for k in gammas])
            # Drafting also pays the drafter's prefill of the prompts that come
            # with the tokens a step commits (steps that admit them are not
            # decided; observe_cost prices them).
            admit = (b / 1000.0 * self.prompt_tokens / max(self.committed, 1.0)
                     * (g > 0) * self.lazy)
            fixed = (features(0.0, 0.0, g, 0.0, 0.0) @ theta) * scale
            self._memo["prices"] = (key, ((x @ theta) * scale, admit, fixed))
        return self._memo["prices"][1]

    def _cell_scale(self, bucket: int, gamma: int, theta: np.ndarray) -> float:
        """The factor on the fit's price of (bucket, gamma)."""
        return math.exp(self._cell_posterior(bucket, gamma, theta)[0])

    def _cell_posterior(self, bucket: int, gamma: int, theta: np.ndarray) -> tuple[float, float]:
        """Mean and sd of the log of the cell's factor: the prior (0,
        CELL_SPREAD) updated by the log of (its steady steps' time / the
        fit's prediction of them), their evidence aged by the drift since
        the cell's last steady step. Memoised until the next observed step
        or refit."""
        key = (bucket, gamma, self.observed, self.cost.fits)
        known = self._memo.get(key)
        if known is not None:
            return known
        precision, mean = 1.0 / CELL_SPREAD ** 2, 0.0
        cell = self.cells.get((bucket, gamma))
        if cell is not None:
            xs, ms, w, _ = self._decayed(cell)
            predicted = float(xs @ theta)
            evidence = self._aged((bucket, gamma), w / self._noise())
            if predicted > 0 and ms > 0 and evidence > 0:
                mean = math.log(ms / predicted) * evidence / (precision + evidence)
                precision += evidence
        if len(self._memo) > 64:
            self._memo = {k: v for k, v in self._memo.items() if k in ("prices", "drain")}
        self._memo[key] = out = (mean, precision ** -0.5)
        return out

    def _noise(self) -> float:
        """A steady step's variance about its cell's price (log scale)."""
        return max(self.cost.relative_error(), NOISE_FLOOR) ** 2

    def _aged(self, key: tuple[int, int], evidence: float) -> float:
        """`evidence` (a precision) as it stands now: its steps' log ratio
        drifted CELL_DRIFT of a step's scatter a step observed since the
        cell's last steady step."""
        age = self.observed - self.cell_steady.get(key, self.observed)
        return evidence / (1.0 + evidence * age * CELL_DRIFT ** 2 * self._noise())

    def _unsure(self, batch, arms, resuming: bool) -> Arm | None:
        """A gamma whose cell (this batch bucket) is unsure (its steps' aged
        evidence worth less than RECHECK_STEPS fresh ones: never run, or not
        lately) and could be the best choice (it is, priced two posterior
        sds lower); the most valuable such gamma, None when there is none."""
        bucket = bucket_of(max(batch.num_reqs, 1))
        noise = self._noise()
        unsure = [a for a in arms if self._aged_weight(bucket, self.space.gamma(a), noise)
                  < RECHECK_STEPS]
        if not unsure:
            return None
        theta = self.cost.fit()
        v = self.values(batch, arms, False, resuming)
        best = max(v.values())
        top = self.space.gamma(self._best(v))
        # A cell run before is re-checked only next to the gamma priced best
        # (the value is unimodal in gamma: a better gamma further away means
        # a better one next to it).
        unsure = [a for a in unsure if abs(self.space.gamma(a) - top) == 1
                  or (bucket, self.space.gamma(a)) not in self.cells]
        horizon = self._horizon(batch)
        hopeful = []
        for a in unsure:
            sd = self._cell_posterior(bucket, self.space.gamma(a), theta)[1]
            # Priced two sds lower it would be best; and where the batch
            # leaves its bucket before the cell's evidence would lapse,
            # what it may gain over the steps left outweighs what its own
            # steps lose at the prices now.
            if v[a] * math.exp(2.0 * sd) <= best:
                continue
            if (horizon < LASTING and horizon * _expected_gain(v[a], best, sd)
                    < RECHECK_COST * (best - v[a])):
                continue
            hopeful.append(a)
        return max(hopeful, key=lambda a: v[a]) if hopeful else None

    def _horizon(self, batch) -> float:
        """Decided steps a cell of the batch's bucket serves after a
        recheck: where freed slots are refilled, LASTING (as long as its
        evidence lasts); where they are not (core/drain.py), until the batch
        leaves its bucket at one token a request a step (the tokens left to
        the request whose end takes it below the bucket), at most LASTING;
        weighed by the share of slots refilled."""
        b = batch.num_reqs
        if b <= 1 or len(batch.remaining) != b:
            return LASTING
        lowest = bucket_of(b) // 2 + 1          # the bucket's smallest batch
        left = sorted(batch.remaining, reverse=True)[lowest - 1]
        rho = self.refill.rho
        return rho * LASTING + (1.0 - rho) * min(left, LASTING)

    def _aged_weight(self, bucket: int, gamma: int, noise: float) -> float:
        """A cell's steps' evidence now, in fresh steady steps."""
        cell = self.cells.get((bucket, gamma))
        return 0.0 if cell is None else self._aged((bucket, gamma),
                                                    self._decayed(cell)[2] / noise) * noise

    def _decayed(self, cell: list) -> list:
        """A cell's sums decayed to now, as the fit's are (one `keep` a step observed)."""
        f = self.cost.keep ** (self.observed - cell[3])
        cell[:] = [cell[0] * f, cell[1] * f, cell[2] * f, self.observed]
        return cell

    def decide(self, batch, bucket: int, lo: int, hi: int,
               previous: Arm | None) -> tuple[Arm, str]:
        arm, self.reason = self._decide(batch, bucket, lo, hi, previous)
        self.decided_bucket, self.prefills = bucket, 0
        return arm, self.reason

    def _best(self, values: dict) -> Arm:
        """The arm of the highest value, ties to the smaller gamma."""
        return max(values, key=lambda a: (values[a], -self.space.gamma(a)))

    def _decide(self, batch, bucket: int, lo: int, hi: int,
                previous: Arm | None) -> tuple[Arm, str]:
        arms = list(self.space.arms(batch, lo, hi))
        if self.swept < len(arms):
            arm = arms[-1 - self.swept]
            self.swept += 1
            return arm, "sweep"
        resuming = previous is not None and self.space.gamma(previous) == 0
        if self.thompson:
            probe = self._probe(batch, arms, resuming)
            if probe is not None:
                return probe, "probe"
            recheck = self._unsure(batch, arms, resuming)
            if recheck is not None:
                return recheck, "recheck"
        v = self.values(batch, arms, self.thompson, resuming)
        return self._best(v), "model"

    def explain(self, batch, lo: int, hi: int) -> dict:
        """For the trace: per gamma, the committed tokens per ms the model
        predicts (acceptance and costs at their means), and its cell factor."""
        arms = list(self.space.arms(batch, lo, hi))
        theta = self.cost.fit()
        bucket = bucket_of(max(batch.num_reqs, 1))
        return {str(self.space.gamma(a)): [round(v, 4), round(self._cell_scale(
                    bucket, self.space.gamma(a), theta), 3)]
                for a, v in self.values(batch, arms, False).items()}

    def _probe(self, batch, arms, resuming: bool) -> Arm | None:
        """The gamma the fit cannot price (standard error above PROBE_SPREAD
        of its prediction, or of the mean step fitted if smaller: a wildly
        high extrapolation must not read as precise) that could be the best
        choice (it is, two standard errors cheaper); the smallest such gamma
        (the cheapest step to run, and a step at one gamma prices every
        draft pass), None when there is none."""
        b = max(batch.num_reqs, 1)
        self.cost.fit()
        # Nothing to probe stays so until the fit or the batch size changes.
        key = (b, len(arms), self.cost.fits)
        if key == self._priced:
            return None
        g = np.array([self.space.gamma(a) for a in arms], dtype=float)
        x = features(b, b * g, g, 0.0, b * batch.mean_context_len)
        spread = self.cost.spread(x)
        rel = spread / np.maximum(np.minimum(x @ self.cost.fit(), self.cost.mean_ms()), 1e-6)
        if rel.max() <= PROBE_SPREAD:
            self._priced = key
            return None
        if not np.isfinite(spread).all():
            return arms[int(rel.argmax())]
        best = max(self.values(batch, arms, False, resuming).values())
        hopeful = self.values(batch, arms, False, resuming, shave=2.0 * spread)
        unsure = [i for i, a in enumerate(arms) if rel[i] > PROBE_SPREAD and hopeful[a] > best]
        return arms[min(unsure, key=lambda i: self.space.gamma(arms[i]))] if unsure else None

    def _requests_seen(self, batch, fb) -> None:
        """A step's requests: freed slots refilled or not, those gone since
        the last step left (their acceptance joins the spread between
        requests), and what each verified now."""
        if batch.requests:
            gone = self.refill.step(batch.requests)
            if gone:
                self.request_rates.left(gone, self.acceptance.mean()[0])
        if fb.requests:
            self.request_rates.observe(fb.requests, fb.drafted, fb.accepted)

    def observe(self, outcome) -> None:
        fb = outcome.feedback
        self.acceptance.update(fb.drafted, fb.accepted)
        self._requests_seen(outcome.batch, fb)
        b = max(outcome.batch.num_reqs, 1)
        if b == 1 and len(fb.drafted) <= 1:
            # The drafts verified now were decided when the outcome two
            # steps back was the last one known.
            known = self.outcomes[-2] if len(self.outcomes) >= 2 else None
            if known is not None:
                self.by_outcome[known].update(fb.drafted, fb.accepted)
            verified = fb.drafted[0] if fb.drafted else 0
            full = fb.accepted[0] == verified if verified else None    # None: nothing drafted
            self.outcomes = (self.outcomes + [full])[-2:]
        else:
            self.outcomes = []
        self._tally(0, fb.committed)
        catchup = b if outcome.gamma and self.observed_gamma == 0 else 0
        owed = self._caught_up(outcome.gamma, 0)
        x = features(b, sum(fb.drafted), outcome.gamma, catchup, b * outcome.batch.mean_context_len,
                     0.0, owed)
        ms = outcome.interval_s * 1000.0
        self.observed += 1
        # A cell prices a steady step (the drafts it verifies are of its own
        # gamma): one after a change verifies another gamma's drafts.
        if self.cost.observe(x, ms) and outcome.stable and not catchup and not owed:
            key = (bucket_of(b), outcome.gamma)
            cell = self._decayed(self.cells.setdefault(key, [0.0, 0.0, 0.0, self.observed]))
            # Older steps weigh what their aged evidence is worth now.
            if cell[2] > 0:
                f = self._aged_weight(*key, self._noise()) / cell[2]
                cell[0], cell[1], cell[2] = cell[0] * f, cell[1] * f, cell[2] * f
            cell[0], cell[1], cell[2] = cell[0] + x, cell[1] + ms, cell[2] + 1.0
            self.cell_steady[key] = self.observed
        self.runs.observe(outcome.gamma > 0)
        self.observed_gamma = outcome.gamma

    def observe_cost(self, batch, fb, gamma: int, interval_s: float) -> None:
        """A step this policy did not decide (a prefill step): its time
        teaches the cost model what prompts cost, and what they cost the
        drafter while drafting is on."""
        b = max(batch.num_reqs, 1)
        prompt = batch.prefill_tokens
        self.observed += 1
        self._requests_seen(batch, fb)
        catchup = b if gamma and self.observed_gamma == 0 else 0
        # A lazy drafter prefills the prompt while drafting, else owes it.
        drafted_prompt = self._caught_up(gamma, prompt)
        self.cost.observe(features(b, sum(fb.drafted), gamma, catchup, b * batch.mean_context_len,
                                   prompt, drafted_prompt),
                          interval_s * 1000.0)
        self._tally(prompt, fb.committed)
        self.observed_gamma = gamma

    def _caught_up(self, gamma: int, prompt: int) -> int:
        """The prompt tokens a lazy drafter runs over in a step at `gamma`
        that prefills `prompt` tokens: those it owes and these, while it
        drafts; none at gamma 0 (it owes these from now on)."""
        if not self.lazy:
            return 0
        if gamma == 0:
            self.owed_prompt += prompt
            return 0
        owed, self.owed_prompt = self.owed_prompt + prompt, 0
        return owed

    def prefill_gamma(self, batch, gamma: int) -> int:
        """The gamma of a prefill step, which the policy does not decide
        (`gamma`: the one in force): 0 while what a prompt costs the drafter
        is not known from the steps (its standard error without its prior)
        and could change the choice (priced two standard errors higher, but
        not above the target's price, a smaller gamma would be best), so
        that a prompt's cost without the drafter is measured (a lazy drafter
        catches the prompt up when it next drafts; the step's requests
        verify nothing next step); 0 also where the model, at its means,
        chooses gamma 0 for the step's batch and the gamma in force is not a
        sweep's or recheck's (drafting is not what follows: a lazy drafter
        skips the prompts, and pays for them only if its requests draft
        later); no deeper than the model chooses for the step's batch where
        the gamma in force is a sweep's or recheck's and RECHECK_PREFILLS
        prefill steps ran since it was decided (a cell being re-checked
        needs a steady decided step, which a catch-up after a gamma-0
        prefill is not, but a prefill step teaches the cell nothing:
        drafting through a whole run of arrivals would pay for nothing), or
        where the step's batch is in another bucket than the last
        decision's (prompts arriving after a drain); else `gamma`."""
        self.prefills += 1
        if not (gamma and self.lazy and self.prompt_tokens and self.swept):
            return gamma
        if self.cost.samples < MIN_SAMPLES:
            return gamma
        arms = list(self.space.arms(batch, 0, self.k))
        now = self.values(batch, arms, False)
        elsewhere = self.decided_bucket != bucket_of(max(batch.num_reqs, 1))
        best = self.space.gamma(self._best(now))
        if self.reason in ("recheck", "sweep"):
            capped = self.prefills > RECHECK_PREFILLS
        else:
            capped = best == 0
        if best < gamma and (capped or elsewhere):
            return best
        b = max(batch.num_reqs, 1)
        key = (b, self.cost.fits)
        if key == self._prompt_known:
            return gamma
        theta = self.cost.fit()
        room = max(theta[PREFILL] - theta[DRAFT_PREFILL], 0.0)
        shift = min(2.0 * self.cost.data_spread(DRAFT_PREFILL), room)
        worst = self.values(batch, arms, False, prompt_shift=shift)
        if self.space.gamma(self._best(worst)) < best:
            return 0
        self._prompt_known = key
        return gamma

    def _tally(self, prompt: int, committed: int) -> None:
        keep = self.cost.keep
        self.prompt_tokens = self.prompt_tokens * keep + prompt
        self.committed = self.committed * keep + committed

    def state(self) -> dict:
        """What a restarted server needs not to re-learn (`restore`;
        core/warm_state.py keeps it in a file), JSON-able: the acceptance
        posteriors' exact counts (pooled, and batch 1's by the last outcome:
        `full` when every draft was accepted, else `partial`; each with its
        `mean` for a reader), the cost model's sums (with its fitted
        `coefficients_ms`) and each cell's sums ([bucket, gamma, features,
        ms, weight]). The last outcomes and the gamma observed last
        describe this server's requests and steps, and are not kept."""
        def counts(post: AcceptancePosterior) -> dict:
            return {"success": list(post.success), "failure": list(post.failure),
                    "mean": [round(x, 4) for x in post.mean()]}
        # Fitted before the sums are copied: the state carries the fit in use.
        coefficients = self.cost.snapshot()["coefficients_ms"]
        cells = [[bucket, gamma, xs.tolist(), ms, w]
                 for (bucket, gamma), cell in sorted(self.cells.items())
                 for xs, ms, w, _ in [self._decayed(cell)]]
        return {"acceptance": counts(self.acceptance),
                "by_outcome": {"full": counts(self.by_outcome[True]),
                               "partial": counts(self.by_outcome[False])},
                "cost": {**self.cost.state(), "coefficients_ms": coefficients},
                "cells": cells}

    def restore(self, state: dict) -> None:
        """Go on from `state()`'s output (read-only fields ignored; a state
        without `by_outcome` leaves those cold); the cold sweep is skipped."""
        self.cost.restore(state["cost"])
        self.acceptance.restore(state["acceptance"])
        outcomes = state.get("by_outcome", {})
        for name, outcome in (("full", True), ("partial", False)):
            if name in outcomes:
                self.by_outcome[outcome].restore(outcomes[name])
        self.cells = {(int(bucket), int(gamma)): [np.array(xs, dtype=float), float(ms), float(w),
                                                  self.observed]
                      for bucket, gamma, xs, ms, w in state.get("cells", [])
                      if len(xs) == len(self.cost.xy)}
        self.swept = 1 << 30
