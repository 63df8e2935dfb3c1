"""What a batch costs where its finished requests are not replaced (the
`model` policy's drain objective).

A step at gamma g costs A(g) + B * C(g) ms: A once a step whatever the
batch size (each model's fixed cost a pass), C a request. Where a
finished request's slot is refilled at once (a served load), the batch
keeps its size and every committed token is worth the same: the rate
B * E(g) / T(B, g) is the objective. Where it is not (a batch started
together and run to its end: offline generation, a client's last
requests), the batch shrinks as its requests finish and runs until its
slowest one ends. Request i needs N_i steps for the r_i tokens it has
left (r_i / mu_i on average, at mu_i tokens a step), so the batch drains in

    J(g) = A(g) * E[max_i N_i] + C(g) * sum_i E[N_i]      (ms)

for its sum_i r_i tokens. Gamma 0 commits one token a request a step, so
requests with as many tokens left end together; drafting desynchronises
them (requests accept at different rates, and a step's acceptance
scatters), and the fixed cost A is paid on until the slowest one ends.

The policy prices a token at rho * (the rate's price) + (1 - rho) * J / sum r,
rho the share of freed slots that are refilled (`Refill`). Its parts:
- `Refill`: a request ended while others ran on; was a new one admitted
  before they all ended? A Beta posterior over such slots (its prior:
  PRIOR_REFILLED, PRIOR_MISSED), older slots weighing less (a request that
  ends with the whole batch says nothing: its slot could not be refilled
  while the batch ran).
- `RequestRates`: each request's first-position acceptance p_i, a Beta
  posterior around the pooled rate p whose prior spread is the spread
  between requests (tau^2, by moments over the requests that left); a
  request commits 1 + (p_i / p) * (E(g) - 1) tokens a step at gamma g (its
  chain of later acceptances as the pool's).
- `drain_steps`: E[max_i N_i] over fixed normal draws (the same for every
  gamma, so gammas are compared on the same draws), N_i normal with the
  renewal variance r_i * var_i / mu_i^3 of a step's commits and the
  uncertainty of p_i.

Plain Python/numpy, no vLLM import.
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

import numpy as np

# Freed slots the refill share remembers (each older one weighs 1 - 1/this).
REFILL_MEMORY = 64.0
# The refill share's prior, in slots refilled and missed: worth two slots,
# mostly missed. Until a slot is seen refilled, a batch is taken to drain
# (offline generation, a client's last requests, or requests that end
# together: a gamma-0 wave of equal requests is a closed batch); one slot
# refilled moves rho to 0.4, a handful to 0.8.
PRIOR_REFILLED, PRIOR_MISSED = 0.2, 1.8
# A request that left with fewer first-position outcomes than this tells
# the spread between requests too little to count.
MIN_OUTCOMES = 8
# Requests the between-request spread remembers; its prior: PRIOR_REQUESTS
# requests with no spread (requests alike until the steps show otherwise).
SPREAD_MEMORY = 64.0
PRIOR_REQUESTS = 2.0
# Draws of the batch's requests' step counts behind E[max_i N_i], over at
# most CANDIDATES requests (those likeliest to be the slowest).
DRAWS = 32
CANDIDATES = 16


class Refill:
    """The share of freed slots refilled before their batch drained
    (`rho`), from the ids of each step's requests (`step`)."""

    def __init__(self) -> None:
        self.refilled, self.missed = PRIOR_REFILLED, PRIOR_MISSED    # decayed counts
        self.open = 0                               # freed slots not yet resolved
        self.previous: frozenset = frozenset()

    def step(self, requests: Collection) -> frozenset:
        """This step's requests; returns those of the last step that are gone."""
        ids = frozenset(requests)
        gone, new = self.previous - ids, ids - self.previous
        stayed = self.previous & ids
        if not stayed and self.previous:
            # The batch drained (or was replaced whole): its open slots
            # were not refilled; what starts now is a new batch.
            self._resolve(0, self.open)
            self.open = 0
        else:
            filled = min(len(new), self.open)
            self._resolve(filled, 0)
            self.open += len(gone) - filled if stayed else 0
        self.previous = ids
        return gone

    def _resolve(self, refilled: int, missed: int) -> None:
        keep = 1.0 - 1.0 / REFILL_MEMORY
        for hit in [True] * refilled + [False] * missed:
            self.refilled, self.missed = self.refilled * keep + hit, self.missed * keep + (not hit)

    @property
    def rho(self) -> float:
        return self.refilled / (self.refilled + self.missed)


class RequestRates:
    """Per request, its first-position acceptance outcomes; the spread of
    first-position acceptance between requests from those that left."""

    def __init__(self) -> None:
        self.counts: dict = {}                      # request -> [accepted, rejected]
        self.spread_sum, self.spread_weight = 0.0, PRIOR_REQUESTS   # decayed tau^2 moments

    def observe(self, requests: Sequence, drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for r, d, a in zip(requests, drafted, accepted):
            if d > 0:
                c = self.counts.setdefault(r, [0, 0])
                c[0 if a > 0 else 1] += 1

    def left(self, requests: Collection, pooled: float) -> None:
        """`requests` ended: what they showed joins the spread between
        requests (a raw rate's excess over its binomial scatter)."""
        keep = 1.0 - 1.0 / SPREAD_MEMORY
        for r in requests:
            c = self.counts.pop(r, None)
            n = 0 if c is None else c[0] + c[1]
            if n < MIN_OUTCOMES:
                continue
            d = c[0] / n - pooled
            self.spread_sum = self.spread_sum * keep + d * d - pooled * (1 - pooled) / n
            self.spread_weight = self.spread_weight * keep + 1.0

    def tau2(self) -> float:
        return max(self.spread_sum / self.spread_weight, 0.0)

    def multipliers(self, requests: Sequence, pooled: float) -> tuple[np.ndarray, np.ndarray]:
        """Per request, the mean and sd of p_i / p: the Beta posterior of
        p_i with the prior mean p and variance tau^2 (no spread: every
        request at p, exactly)."""
        p = min(max(pooled, 1e-3), 1 - 1e-3)
        tau2 = self.tau2()
        if tau2 <= 1e-9:
            ones = np.ones(len(requests))
            return ones, np.zeros(len(requests))
        kappa = max(p * (1 - p) / tau2 - 1.0, 1e-3)
        c = np.array([self.counts.get(r, (0, 0)) for r in requests], dtype=float).reshape(-1, 2)
        alpha, beta = kappa * p + c[:, 0], kappa * (1 - p) + c[:, 1]
        mean = alpha / (alpha + beta)
        var = alpha * beta / ((alpha + beta) ** 2 * (alpha + beta + 1))
        return mean / p, np.sqrt(var) / p


_draws: np.ndarray = np.random.default_rng(0).standard_normal((DRAWS, CANDIDATES))


def _normals(n: int) -> np.ndarray:
    global _draws
    if _draws.shape[1] < n:
        _draws = np.random.default_rng(0).standard_normal((DRAWS, max(n, 2 * _draws.shape[1])))
    return _draws[:, :n]


def commit_moments(rates: Sequence[float], gammas: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Per gamma, the mean and second moment of the tokens a step commits
    (1 + the accepted prefix) with per-position acceptance `rates`."""
    survive = np.concatenate(([1.0], np.cumprod(np.asarray(rates, dtype=float))))
    j = np.arange(len(survive))
    first = np.cumsum(survive)
    second = np.cumsum((2 * j + 1) * survive)
    g = np.asarray(gammas)
    return first[g], second[g]


def drain_steps(remaining: np.ndarray, m: np.ndarray, m_sd: np.ndarray,
                first: np.ndarray, second: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per gamma (rows of `first`/`second`, the pooled commit moments), the
    expected steps of the slowest request, E[max_i N_i], and the expected
    request-steps, sum_i E[N_i], of requests with `remaining` tokens and
    first-position multipliers `m` (+- `m_sd`)."""
    r = np.asarray(remaining, dtype=float)[None, :]
    extra = first[:, None] - 1.0                               # pooled E(g) - 1
    mu = 1.0 + m[None, :] * extra
    var = np.maximum(1.0 + m[None, :] * (second[:, None] - 1.0) - mu * mu, 0.0)
    n = r / mu
    sd = np.sqrt(r * var / mu ** 3 + (r * extra * m_sd[None, :] / mu ** 2) ** 2)
    total = n.sum(axis=1)
    if n.shape[1] > CANDIDATES:
        # The slowest request is one of those slowest two sds out.
        top = np.argpartition(-(n + 2.0 * sd), CANDIDATES - 1, axis=1)[:, :CANDIDATES]
        n, sd = np.take_along_axis(n, top, axis=1), np.take_along_axis(sd, top, axis=1)
    z = _normals(n.shape[1])                                   # draws x requests
    most = (n[:, None, :] + sd[:, None, :] * z[None, :, :]).max(axis=2).mean(axis=1)
    return most, total
