"""Step-latency model, its profile JSON schema, and the non-negative fitter.

One forward pass of a model costs

    T(ctx, n) = alpha * ctx + beta * n + delta        (milliseconds)

where ctx is the context (KV) tokens of the whole batch and n the query
tokens of the pass. One decode step at gamma k with B requests drafts k
times, then verifies B*(k+1) tokens with the target:

    T_step(k) = sum_{i<k} T_draft(ctx + i*B, B) + T_target(ctx, B*(k+1))

A step that drafts at all also pays a fixed speculation cost (the
rejection sampler, the drafter's per-step set-up), whatever its gamma:
    T_spec(ctx, B) = alpha*ctx + beta*B + delta      (only when k > 0)
Without it the fit would put that cost into the draft's delta, paid per
drafted position, and overprice long drafts exactly where they pay
(batch 1). Other fixed per-step host costs are folded into the target's
delta (paid once per step) and the draft's (once per drafted position).

Prompt tokens are priced apart (`prefill`, ms per prompt token for each
model), on top of the step they join: a decode step's query tokens (a few
per request) cost the same whatever their number on a small host (beta
fits 0), but a step that prefills thousands of prompt tokens does not.
A drafter prefills a prompt only while it drafts (a lazy gamma 0 skips
it, and catches it up when it next drafts for that request). A profile
without `prefill` prices prompt tokens at each model's beta.

Profile file (JSON), schema "vllm-vspec/latency-profile", version 1:

    {"schema": "vllm-vspec/latency-profile", "version": 1,
     "name": str, "device": str, "source": "measured" | "derived",
     "note": str,                          # free text, shown by the sim
     "target": {"alpha": >=0, "beta": >=0, "delta": >=0},
     "draft":  {"alpha": >=0, "beta": >=0, "delta": >=0},
     "speculate": {"alpha": >=0, "beta": >=0, "delta": >=0},   # optional: zeros
     "prefill": {"target": >=0, "draft": >=0},   # optional: ms per prompt token
     "derivation": [str, ...]}             # optional: how the numbers came about

Samples file (JSON), what `vllm-vspec profile fit` (commands/fit_profile.py) reads: a list, or
{"samples": [...]} with optional "name"/"device", of
    {"kind": "step", "gamma": k, "batch": B, "ctx": tokens, "ms": t}
    {"kind": "target" | "draft", "ctx": tokens, "n": tokens, "ms": t}
(`vllm-vspec replay costs` adds {"kind": "prefill", ...} samples, fitted
apart by `fit_prefill`.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

SCHEMA = "vllm-vspec/latency-profile"
VERSION = 1
SOURCES = ("measured", "derived")
COEFFS = ("alpha", "beta", "delta")
MODELS = ("target", "draft")
SAMPLE_KINDS = ("step",) + MODELS


class ProfileError(ValueError):
    """A profile or samples file breaks the schema; names the key, the value
    and what is allowed."""

    def __init__(self, key: str, value: Any, allowed: str, where: str = "profile"):
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(f"{where}: {key}={value!r} is not allowed: {allowed}")


@dataclass(frozen=True)
class LinearLatency:
    """T(ctx, n) = alpha*ctx + beta*n + delta, in milliseconds."""

    alpha: float
    beta: float
    delta: float

    def __call__(self, ctx: float, n: float) -> float:
        return self.alpha * ctx + self.beta * n + self.delta


@dataclass(frozen=True)
class PrefillCost:
    """Milliseconds per prompt token of the target's pass and the drafter's."""

    target: float
    draft: float


@dataclass(frozen=True)
class LatencyProfile:
    target: LinearLatency
    draft: LinearLatency
    name: str = ""
    device: str = ""
    source: str = "measured"
    note: str = ""
    derivation: tuple[str, ...] = field(default=())
    speculate: LinearLatency = LinearLatency(0.0, 0.0, 0.0)
    prefill: PrefillCost | None = None      # None: prompt tokens at each model's beta

    def prompt_ms(self, tokens: float, drafter: bool) -> float:
        """What `tokens` prompt tokens add to the step that prefills them:
        the target's pass over them, and the drafter's when `drafter`
        (it drafts for them)."""
        target = self.target.beta if self.prefill is None else self.prefill.target
        return tokens * target + (self.draft_prompt_ms(tokens) if drafter else 0.0)

    def draft_prompt_ms(self, tokens: float) -> float:
        """The drafter's pass over `tokens` prompt tokens (a catch-up's)."""
        return tokens * (self.draft.beta if self.prefill is None else self.prefill.draft)

    def step_ms(self, gamma: int, batch: int, ctx: float, width: int = 1) -> float:
        """Predicted step time at gamma with `batch` requests and `ctx` batch
        context tokens, drafting and verifying the same gamma (trees of
        `width`: gamma*width draft nodes per request)."""
        return self.split_step_ms(batch * (gamma * width + 1), gamma, batch, ctx, width)

    def split_step_ms(self, target_tokens: int, draft: int, batch: int, ctx: float,
                      width: int = 1) -> float:
        """Step time when the target runs `target_tokens` query tokens (each
        request's token plus the drafts proposed one step earlier) and the
        draft proposes `draft` new tokens per request, or a tree `draft`
        deep and `width` wide: its first pass runs `batch` queries (each
        request's root) and each further depth `batch * width` (the
        frontier), over a context grown by every pass before
        (docs/design/eagle-tree.md 4.4). Width 1 is the linear drafter."""
        drafting = sum(self.draft(ctx + i * batch + max(i - 1, 0) * batch * (width - 1),
                                  batch * width if i else batch)
                       for i in range(draft))
        fixed = self.speculate(ctx, batch) if draft > 0 else 0.0
        return drafting + fixed + self.target(ctx, target_tokens)

    def to_dict(self) -> dict:
        d = {"schema": SCHEMA, "version": VERSION, "name": self.name,
             "device": self.device, "source": self.source, "note": self.note,
             "target": coefficients(self.target), "draft": coefficients(self.draft)}
        if any(coefficients(self.speculate).values()):
            d["speculate"] = coefficients(self.speculate)
        if self.prefill is not None:
            d["prefill"] = {"target": self.prefill.target, "draft": self.prefill.draft}
        if self.derivation:
            d["derivation"] = list(self.derivation)
        return d


def coefficients(m: LinearLatency) -> dict:
    return {"alpha": m.alpha, "beta": m.beta, "delta": m.delta}


# ------------------------------------------------------------------ schema
_TOP_KEYS = {"schema", "version", "name", "device", "source", "note",
             "target", "draft", "speculate", "prefill", "derivation"}


def profile_from_dict(raw: Any, where: str = "profile") -> LatencyProfile:
    """Validate a parsed profile JSON; ProfileError names the offending key."""
    if not isinstance(raw, Mapping):
        raise ProfileError("<root>", raw, "a JSON object", where)
    for key in raw:
        if key not in _TOP_KEYS:
            raise ProfileError(key, raw[key], "unknown key; known keys: "
                               + ", ".join(sorted(_TOP_KEYS)), where)
    if raw.get("schema") != SCHEMA:
        raise ProfileError("schema", raw.get("schema"), repr(SCHEMA), where)
    if raw.get("version") != VERSION:
        raise ProfileError("version", raw.get("version"),
                           f"{VERSION} (the only version this vllm-vspec reads)", where)
    for key in ("name", "device", "note"):
        if not isinstance(raw.get(key, ""), str):
            raise ProfileError(key, raw[key], "a string", where)
    source = raw.get("source", "measured")
    if source not in SOURCES:
        raise ProfileError("source", source, "one of " + ", ".join(map(repr, SOURCES)), where)
    derivation = raw.get("derivation", [])
    if not isinstance(derivation, list) or not all(isinstance(s, str) for s in derivation):
        raise ProfileError("derivation", derivation, "a list of strings", where)
    models = {m: _linear_from(raw.get(m), m, where) for m in MODELS}
    speculate = (_linear_from(raw["speculate"], "speculate", where) if "speculate" in raw
                 else LinearLatency(0.0, 0.0, 0.0))
    prefill = _prefill_from(raw["prefill"], where) if "prefill" in raw else None
    return LatencyProfile(target=models["target"], draft=models["draft"], speculate=speculate,
                          prefill=prefill, name=raw.get("name", ""), device=raw.get("device", ""),
                          source=source, note=raw.get("note", ""),
                          derivation=tuple(derivation))


def _linear_from(raw: Any, model: str, where: str) -> LinearLatency:
    if not isinstance(raw, Mapping):
        raise ProfileError(model, raw, "an object with alpha, beta, delta (ms)", where)
    for key in raw:
        if key not in COEFFS:
            raise ProfileError(f"{model}.{key}", raw[key], "unknown key; known keys: "
                               + ", ".join(COEFFS), where)
    return LinearLatency(*(_nonnegative(raw.get(key), f"{model}.{key}", "milliseconds", where)
                           for key in COEFFS))


def _nonnegative(v: Any, key: str, unit: str, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ProfileError(key, v, f"a finite number >= 0 ({unit})", where)
    return float(v)


def _prefill_from(raw: Any, where: str) -> PrefillCost:
    if not isinstance(raw, Mapping) or set(raw) != set(MODELS):
        raise ProfileError("prefill", raw, "an object with target and draft (ms per prompt "
                           "token)", where)
    return PrefillCost(*(_nonnegative(raw[key], f"prefill.{key}", "ms per prompt token", where)
                         for key in MODELS))


def load_profile(path: str | Path) -> LatencyProfile:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ProfileError("<file>", str(path), f"valid JSON ({e})", str(path)) from None
    return profile_from_dict(raw, where=str(path))


def save_profile(profile: LatencyProfile, path: str | Path) -> None:
    Path(path).write_text(json.dumps(profile.to_dict(), indent=2) + "\n")


# ------------------------------------------------------------------ fitting
def nnls(a: np.ndarray, b: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - b|| subject to x >= 0 (Lawson-Hanson active set).

    Invariant: `passive` holds the indices allowed to be positive; the
    unconstrained least-squares solution restricted to them is kept strictly
    positive by stepping back towards the previous feasible x.
    """
    a = np.asarray(a, dtype=float)
    b = np.asarray(b, dtype=float)
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(np.abs(a).max(initial=0.0), 1.0)
    for _ in range(max_iter or 3 * n + 10):
        gradient = a.T @ (b - a @ x)
        free = ~passive & (gradient > tol)
        if not free.any():
            break
        passive[np.argmax(np.where(free, gradient, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > tol).all():
                x = z
                break
            # Step from x towards z until the first passive coefficient hits 0.
            blocked = passive & (z <= tol)
            step = np.min(x[blocked] / (x[blocked] - z[blocked]))
            x = x + step * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
    return x


def design_row(sample: Mapping[str, Any], speculate: bool = False) -> list[float]:
    """The sample's coefficients on [target alpha, beta, delta, draft alpha,
    beta, delta] (+ [speculate alpha, beta, delta] with `speculate`): every
    sample kind is linear in the same unknowns."""
    kind = sample["kind"]
    ctx = float(sample["ctx"])
    if kind == "target":
        row = [ctx, float(sample["n"]), 1.0, 0.0, 0.0, 0.0]
        spec = [0.0, 0.0, 0.0]
    elif kind == "draft":
        row = [0.0, 0.0, 0.0, ctx, float(sample["n"]), 1.0]
        spec = [0.0, 0.0, 0.0]
    else:
        k, b = int(sample["gamma"]), int(sample["batch"])
        # sum_{i<k} (alpha*(ctx + i*b) + beta*b + delta) and T_target(ctx, b*(k+1)).
        row = [ctx, b * (k + 1), 1.0, k * ctx + b * k * (k - 1) / 2, k * b, k]
        spec = [ctx, b, 1.0] if k > 0 else [0.0, 0.0, 0.0]
    return row + spec if speculate else row


def validate_samples(raw: Any, where: str = "samples") -> list[dict]:
    samples = raw.get("samples") if isinstance(raw, Mapping) else raw
    if not isinstance(samples, list) or not samples:
        raise ProfileError("samples", samples, "a non-empty list of sample objects", where)
    need = {"step": ("gamma", "batch", "ctx", "ms"),
            "target": ("ctx", "n", "ms"), "draft": ("ctx", "n", "ms")}
    for i, s in enumerate(samples):
        kind = s.get("kind") if isinstance(s, Mapping) else None
        if kind not in need:
            raise ProfileError(f"samples[{i}].kind", kind,
                               "one of " + ", ".join(map(repr, SAMPLE_KINDS)), where)
        for key in need[kind]:
            v = s.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                raise ProfileError(f"samples[{i}].{key}", v, "a number >= 0", where)
    return samples


def fit_profile(samples: Iterable[Mapping[str, Any]], speculate: bool = False,
                **meta: Any) -> LatencyProfile:
    """Non-negative least-squares fit of both models to latency samples.

    Rows are weighted by 1/ms so that the fit minimises relative error (a
    batch-1 step matters as much as a batch-128 one); columns are scaled to
    unit norm so that ctx (~1e5) and the constant (1) are equally conditioned.
    `speculate`: fit the fixed cost of a drafting step too (needs target-only
    samples beside the step samples to be told apart from the target's).
    """
    samples = list(samples)
    a = np.array([design_row(s, speculate) for s in samples])
    b = np.array([float(s["ms"]) for s in samples])
    w = 1.0 / np.maximum(b, 1e-9)
    aw = a * w[:, None]
    scale = np.linalg.norm(aw, axis=0)
    scale[scale == 0] = 1.0
    x = nnls(aw / scale, b * w) / scale
    return LatencyProfile(target=LinearLatency(*x[:3]), draft=LinearLatency(*x[3:6]),
                          speculate=LinearLatency(*x[6:]) if speculate else LinearLatency(0, 0, 0),
                          source="measured", **meta)


def profile_predict(profile: LatencyProfile, sample: Mapping[str, Any]) -> float:
    """What the profile says a sample should have cost (ms)."""
    coeffs: Sequence[float] = [*coefficients(profile.target).values(), *coefficients(profile.draft).values(),
                               *coefficients(profile.speculate).values()]
    return float(np.dot(design_row(sample, speculate=True), coeffs))


def fit_prefill(samples: Iterable[Mapping[str, Any]], profile: LatencyProfile) -> PrefillCost:
    """Per-prompt-token prices from prefill samples ({"kind": "prefill",
    "engine": "target" | "draft" | "step", "gamma": g, "batch": B,
    "tokens": prompt tokens, "ms": t}: a step that prefilled B prompts),
    each the slope of a straight line through what its engine's steps cost
    beyond what `profile` charges them as decode steps of B requests over a
    context of the prompts (the intercept takes the engine's fixed cost a
    step). The target's price from a target-only engine (beyond its pass);
    the drafter's from the draft model alone where it ran alone ("draft",
    beyond its pass), else from what a drafting engine ("step", gamma g)
    costs beyond the target's price, its pass and the g draft passes.
    Each price at least 0."""
    rows = [s for s in samples if s.get("kind") == "prefill"]
    by = {e: [s for s in rows if s.get("engine") == e] for e in ("target", "draft")}
    by["step"] = [s for s in rows if s.get("engine") == "step" and int(s["gamma"]) > 0]
    if not by["target"] or not (by["draft"] or by["step"]):
        raise ProfileError("samples", len(rows), "prefill samples of a target-only engine and "
                           "of the drafter alone or a drafting engine", "prefill fit")

    def slope(points: list[tuple[float, float]]) -> float:
        t = np.array([p[0] for p in points])
        y = np.array([p[1] for p in points])
        if np.ptp(t) == 0:
            return max(float(y.mean() / t.mean()), 0.0)
        return max(float(np.polyfit(t, y, 1)[0]), 0.0)

    def tokens(s: Mapping[str, Any]) -> float:
        return float(s["tokens"])

    target = slope([(tokens(s), float(s["ms"]) - profile.target(tokens(s), int(s["batch"])))
                    for s in by["target"]])
    if by["draft"]:
        return PrefillCost(target, slope([(tokens(s), float(s["ms"])
                                           - profile.draft(tokens(s), int(s["batch"])))
                                          for s in by["draft"]]))

    def beyond(s: Mapping[str, Any]) -> float:
        g, b = int(s["gamma"]), int(s["batch"])
        return float(s["ms"]) - profile.split_step_ms(b, g, b, tokens(s)) - target * tokens(s)
    return PrefillCost(target, slope([(tokens(s), beyond(s)) for s in by["step"]]))
