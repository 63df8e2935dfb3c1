"""What the server tells us about gamma and batch size while a workload runs.

Two sources: vLLM's Prometheus `/metrics` (polled; batch size for every
variant, vspec's gamma gauge and per-(gamma, bucket) step counters when the
vspec scheduler runs), and the vspec JSONL decision trace (`vspec.trace_path`:
one line per decision, hence complete; preferred when present).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from vllm_vspec.core.trace import read_trace

RUNNING = "vllm:num_requests_running"
GAMMA = "vspec:gamma"  # gauge: gamma verified in the last step
STEPS = "vspec:steps_total"  # counter: steps per verified gamma
DRAFTS = "vllm:spec_decode_num_drafts_total"  # counter: requests' drafts verified
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"  # label `position`


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Flat (sample name, labels, value) triples of a Prometheus text page."""
    return [(s.name, dict(s.labels), float(s.value))
            for fam in text_string_to_metric_families(text) for s in fam.samples]


# ------------------------------------------------------------------ metrics
@dataclass(frozen=True)
class MetricsSample:
    t: float
    running: float
    gamma: float | None  # vspec's current-gamma gauge; None without vspec


def sample_of(t: float, samples: list[tuple[str, dict[str, str], float]]) -> MetricsSample:
    running = sum(v for n, _, v in samples if n == RUNNING)
    gammas = [v for n, _, v in samples if n == GAMMA]
    return MetricsSample(t, running, gammas[0] if gammas else None)


def gamma_step_counts(samples: list[tuple[str, dict[str, str], float]]) -> Counter:
    """(bucket, gamma) -> steps from vspec's step counter. The counter is
    labelled by gamma only (the API process does not see the controller's
    buckets), so bucket is None: all batch sizes together."""
    counts: Counter = Counter()
    for name, labels, value in samples:
        if name == STEPS and "gamma" in labels:
            bucket = int(labels["bucket"]) if "bucket" in labels else None
            counts[(bucket, int(labels["gamma"]))] += value
    return counts


def draft_counts(samples: list[tuple[str, dict[str, str], float]]) -> tuple[int, tuple[int, ...]]:
    """(drafts verified, accepted tokens per draft position) from vLLM's
    spec-decode counters; (0, ()) for a server that does not speculate."""
    drafts = int(sum(v for n, _, v in samples if n == DRAFTS))
    per_pos: dict[int, float] = {}
    for name, labels, value in samples:
        if name == ACCEPTED_PER_POS and "position" in labels:
            pos = int(labels["position"])
            per_pos[pos] = per_pos.get(pos, 0.0) + value
    return drafts, tuple(int(per_pos.get(i, 0)) for i in range(max(per_pos, default=-1) + 1))


async def fetch_metrics(client: httpx.AsyncClient, base_url: str
                        ) -> list[tuple[str, dict[str, str], float]]:
    resp = await client.get(f"{base_url}/metrics", timeout=10.0)
    resp.raise_for_status()
    return parse_metrics(resp.text)


async def poll_metrics(client: httpx.AsyncClient, base_url: str, out: list[MetricsSample],
                       stop: asyncio.Event, interval_s: float = 0.5) -> None:
    """Append a MetricsSample every `interval_s` until `stop` is set."""
    while not stop.is_set():
        try:
            out.append(sample_of(time.time(), await fetch_metrics(client, base_url)))
        except httpx.HTTPError:
            pass  # a missed sample only thins the plot
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
        except asyncio.TimeoutError:
            pass


# -------------------------------------------------------------------- trace
def trace_steps(path: Path, start: int = 0) -> tuple[list[dict], int]:
    """Step records of a vspec trace (vllm_vspec.core.trace format) from record
    `start` on, and the total record count (where the next slice starts).
    Read between workloads: the engine writes a step's line before its
    outputs reach the client, so an idle server's trace is complete."""
    if not path.exists():
        return [], start
    _, records = read_trace(path)
    return records[start:], len(records)


def gamma_counts_from_trace(records: list[dict]) -> Counter:
    """(bucket, arm) -> steps, with the controller's own buckets; an arm is
    the step's gamma, or (gamma, width) for a tree (a record without `width`
    predates trees: width 1)."""
    return Counter((int(r["bucket"]), _arm(int(r["gamma"]), int(r.get("width", 1))))
                   for r in records)


def _arm(gamma: int, width: int) -> int | tuple[int, int]:
    return gamma if width == 1 else (gamma, width)
