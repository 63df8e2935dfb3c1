"""Step costs for replay (`vllm-vspec replay costs`): measured on this
host's in-process engines, fitted to the latency model the simulator
prices steps with (core/latency.py), residuals printed.

What is measured (tools/profile_collect.py, one engine at a time, every
decode step timed alone): a target-only engine and vspec's engine serving
the recording's method at K with gamma fixed at 0..K, at each batch size, with
prompts of the recording's mean length, each engine built several times
in interleaved rounds; each cell's fastest instance median is what is
fitted (cell_medians). The fit is
T_step(g) = sum_{i<g} T_draft(ctx + i*B, B) + T_spec(ctx, B) + T_target(ctx,
B*(g+1)) with T(ctx, n) = alpha*ctx + beta*n + delta per model and T_spec
the fixed cost of a step that drafts at all (core/latency.py),
non-negative least squares in relative error. A gamma-0 step of a lazy vspec engine costs
T_target(ctx, B); its catch-up, one draft pass (T_draft(ctx, 0)) plus the
drafter's price a prompt token over the tokens skipped (a pass of many
tokens a request, as a prefill is).

Prompt tokens are priced apart (core/latency.py `prefill`): each engine's
first step of a batch prefills its B prompts, and what it costs beyond a
decode step of B requests is the target's price per prompt token (the
target-only engine) and the drafter's (the draft model's alone, where it
runs alone; else what a drafting engine's prefill costs beyond the
target's). The simulator charges the drafter's price only while
it drafts; a lazy gamma 0 leaves the prompt to the next drafting step's
catch-up (sim/simulator.py).

The profile and its samples are written beside the recording
(`<recording>.costs.json`, `<recording>.costs.samples.json`), so a user's
own host is measured the same way and scores with its own costs.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

from vllm_vspec.core.latency import (LatencyProfile, fit_prefill, fit_profile, profile_predict,
                                     save_profile)


def costs_paths(recording_path: str | Path) -> tuple[Path, Path]:
    """(profile, samples) beside a recording file."""
    p = Path(recording_path)
    stem = p.name.removesuffix(".gz").removesuffix(".json")
    return p.with_name(f"{stem}.costs.json"), p.with_name(f"{stem}.costs.samples.json")


def measure(method: str, target: Path, drafter: Path | None, k: int, batches: Sequence[int],
            prompt_len: int, decode_steps: int = 12, instances: int = 3,
            kv_cache_memory_bytes: int = 1 << 30, log=print) -> list[dict]:
    """Samples of a target-only engine and of vspec's engine serving
    `method` at K = k with its gamma fixed at 0..k (what replay's fixed-gamma
    contenders stand for, lazy gamma 0 included), one engine at a time,
    each built `instances` times in interleaved rounds
    (forward, then backward order): on a small shared host one engine
    instance can time a third slower than the next at batch 1, so what is
    fitted is each cell's fastest instance (cell_medians). Every engine's
    prefill steps are samples too, and a draft model's alone (its prefill
    steps only). `decode_steps` 0: prefill samples only."""
    from vllm_vspec.tools import profile_collect as pc

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    runs = [pc.EngineRun("target", target)] + [
        pc.EngineRun("step", target, drafter, g, method, k=k) for g in range(k + 1)]
    # The draft model alone, for its prefill steps: what it costs a prompt
    # token, measured apart from the target's far larger price.
    alone = pc.EngineRun("draft", drafter) if method == "draft_model" else None
    if decode_steps == 0 and alone:         # prefill prices only: the two engines that tell them
        runs = runs[:1]
    shapes = [pc.Shape(b, prompt_len) for b in batches]
    samples: list[dict] = []
    for r in range(instances):
        for run in ((runs if r % 2 == 0 else runs[::-1]) + ([alone] if alone else [])):
            t0 = time.monotonic()
            got = pc.collect_engine(run, shapes, 0 if run is alone else decode_steps,
                                    kv_cache_memory_bytes, r, True, prefill=True)
            samples += [{**s, "instance": r} for s in got]
            log(f"[{r + 1}/{instances}] {run.kind}" + (f" {method} gamma {run.gamma}" if run.gamma else "")
                + f": batches {','.join(map(str, batches))} x {decode_steps} steps, "
                f"{time.monotonic() - t0:.0f} s")
    return samples


def _cell(sample: dict) -> tuple:
    """A sample's cell: (kind, gamma, batch size); a prefill sample's kind
    names its engine."""
    kind = sample["kind"] + (f"/{sample['engine']}" if "engine" in sample else "")
    return kind, sample.get("gamma", 0), sample.get("batch", sample.get("n"))


def _instance_medians(samples: Sequence[dict]) -> dict[tuple, list[dict]]:
    """Per cell, one sample per engine instance: its steps' median ms and context."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for s in samples:
        groups.setdefault(_cell(s), {}).setdefault(s.get("instance", 0), []).append(s)
    out = {}
    for key, by_instance in sorted(groups.items()):
        out[key] = [{**group[0], "ctx": statistics.median(g["ctx"] for g in group),
                     "ms": statistics.median(g["ms"] for g in group)}
                    for group in by_instance.values()]
    return out


def cell_medians(samples: Sequence[dict]) -> list[dict]:
    """One sample per (kind, gamma, batch) cell, what the fit uses: the
    median of each engine instance's steps, then the fastest instance's
    (a busy host only ever slows a step down, so the fastest instance is
    the one least disturbed; the median drops a few slow steps within it)."""
    return [min(rows, key=lambda r: r["ms"]) for rows in _instance_medians(samples).values()]


def fit(samples: Sequence[dict], name: str, device: str, note: str) -> LatencyProfile:
    """The decode steps' latency model, then the prompt tokens' prices on
    top of it (when the samples have prefill steps)."""
    cells = cell_medians(samples)
    decode = [c for c in cells if c["kind"] != "prefill"]
    profile = fit_profile(decode, speculate=True, name=name, device=device, note=note)
    if len(decode) == len(cells):
        return profile
    return replace(profile, prefill=fit_prefill(cells, profile))


def predict(profile: LatencyProfile, sample: dict) -> float:
    """What the profile says a decode or prefill sample cost (ms)."""
    if sample["kind"] != "prefill":
        return profile_predict(profile, sample)
    g, b, t = int(sample["gamma"]), int(sample["batch"]), float(sample["tokens"])
    if sample.get("engine") == "draft":                 # the draft model alone
        return profile.draft(t, b) + profile.draft_prompt_ms(t)
    return profile.split_step_ms(b, g, b, t) + profile.prompt_ms(t, drafter=g > 0)


def residuals(profile: LatencyProfile, samples: Sequence[dict]) -> list[dict]:
    """Per (kind, gamma, batch) cell: the fitted measurement (cell_medians),
    the model's prediction and the relative error, with the cell's samples
    and its instances' medians."""
    counts: dict[tuple, int] = {}
    for s in samples:
        counts[_cell(s)] = counts.get(_cell(s), 0) + 1
    rows = []
    for key, instances in _instance_medians(samples).items():
        cell = min(instances, key=lambda r: r["ms"])
        pred = predict(profile, cell)
        rows.append({"kind": key[0], "gamma": key[1], "batch": key[2], "samples": counts[key],
                     "measured_ms": round(cell["ms"], 3), "predicted_ms": round(pred, 3),
                     "error": round(pred / cell["ms"] - 1, 4) if cell["ms"] else 0.0,
                     "instances_ms": sorted(round(r["ms"], 2) for r in instances)})
    return rows


def residual_text(rows: Sequence[dict]) -> str:
    lines = [f"{'engine':<15}{'gamma':>6}{'batch':>6}{'n':>4}{'measured ms':>13}"
             f"{'fitted ms':>11}{'error':>8}   instances (median ms)"]
    for r in rows:
        lines.append(f"{r['kind']:<15}{r['gamma']:>6}{r['batch']:>6}{r['samples']:>4}"
                     f"{r['measured_ms']:>13.2f}{r['predicted_ms']:>11.2f}{r['error']:>+8.1%}   "
                     + " ".join(f"{x:.1f}" for x in r.get("instances_ms", [])))
    errors = sorted(abs(r["error"]) for r in rows)
    lines.append(f"fit error over {len(rows)} cells: median {errors[len(errors) // 2]:.1%}, "
                 f"max {errors[-1]:.1%}")
    return "\n".join(lines)


def save(profile: LatencyProfile, samples: Sequence[dict], rows: Sequence[dict],
         recording_path: str | Path, meta: dict) -> tuple[Path, Path]:
    prof_path, samples_path = costs_paths(recording_path)
    save_profile(profile, prof_path)
    samples_path.write_text(json.dumps({**meta, "samples": list(samples),
                                        "residuals": list(rows)}, indent=1) + "\n")
    return prof_path, samples_path
