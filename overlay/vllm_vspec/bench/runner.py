"""Run every (variant, workload) pair: one server per variant, workloads in
the same order on each, gamma/batch observations alongside. With repeats,
the variants are served in rounds (v1, v2, ..., v1, v2, ...), so a slow
spell of a shared machine lands on one round of every variant rather than on
every round of one.

Paired (`run_paired`, `bench --paired`): the two servers of an overhead
pair are up at once and take turns within every round, so each round gives
one ratio of two runs seconds apart; no server restarts between rounds."""

from __future__ import annotations

import asyncio
import time
from contextlib import ExitStack
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from vllm_vspec.bench import scrape
from vllm_vspec.bench.loadgen import client_for, run_phase
from vllm_vspec.bench.overhead import Pair
from vllm_vspec.bench.plot import Timeline
from vllm_vspec.bench.report import Run
from vllm_vspec.bench.server import (SERVED_MODEL_NAME, Server, ServerError, ServerSpec,
                                     free_port, serve_argv)
from vllm_vspec.bench.variants import Variant
from vllm_vspec.bench.workloads import Request, Workload
from vllm_vspec.core.trace import overhead_share

# Seconds between two servers' turns in a paired run: vLLM's engine core
# keeps busy-polling its input queue for a second after its last step
# (shm_broadcast's busy_loop_s), so without a pause the server that just
# finished would take a core from the one that starts.
PAIR_SWITCH_S = 2.0

# Requests sent before measuring, so one-off start-up costs (first forward,
# allocator growth) do not land on the first workload of a variant.
WARMUP_REQUESTS = 2


@dataclass
class Plan:
    spec: ServerSpec
    variants: list[Variant]
    workloads: list[Workload]
    requests: dict[str, list[list[Request]]]  # workload -> phases -> requests
    output_len: tuple[int, int]  # completion tokens per request: uniform in [lo, hi]
    out_dir: Path
    repeats: int = 1  # rounds: every variant is served this many times
    verbose: bool = False  # servers' output on the console too, not only in their logs
    pairs: list[Pair] = field(default_factory=list)  # what a paired run serves (run_paired)

    def file_stem(self, v: Variant, repeat: int = 0) -> str:
        """Name of a variant's trace and log files (round-numbered with repeats)."""
        return v.name if self.repeats == 1 else f"{v.name}.r{repeat + 1}"

    def trace_path(self, v: Variant, repeat: int = 0) -> Path | None:
        if not v.vspec:
            return None
        return (self.out_dir / "traces" / f"{self.file_stem(v, repeat)}.jsonl").resolve()

    def fresh_trace(self, v: Variant, repeat: int = 0) -> Path | None:
        """trace_path, its folder made and any earlier file of it removed
        (a server appends to its trace)."""
        trace = self.trace_path(v, repeat)
        if trace is not None:
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.unlink(missing_ok=True)
        return trace

    @property
    def log_dir(self) -> Path:
        """Where each server's output goes, one file a server."""
        return self.out_dir / "logs"

    def server(self, v: Variant, port: int, log_name: str, repeat: int = 0) -> Server:
        """The server of `v` (not started), logging to log_dir / log_name,
        its lines also on stdout, each after its log's name, when verbose."""
        log = self.log_dir / log_name
        echo = None
        if self.verbose:
            def echo(line: bytes) -> None:
                print(f"[{log.stem}] {line.decode(errors='replace')}", end="", flush=True)
        return Server(self.argv(v, port, repeat), port, log, echo=echo)

    def argv(self, v: Variant, port: int, repeat: int = 0) -> list[str]:
        return serve_argv(self.spec, v.serve_args(self.trace_path(v, repeat)), port)

    @property
    def requests_per_variant(self) -> int:
        return sum(len(p) for phases in self.requests.values() for p in phases)

    @property
    def total_requests(self) -> int:
        return self.requests_per_variant * len(self.variants) * self.repeats


def run_plan(plan: Plan, on_progress: Callable[[str], None],
             on_variant_done: Callable[[list[Run], dict[str, str]], None] = lambda r, f: None,
             ) -> tuple[list[Run], list[Timeline], dict[str, str]]:
    """Serve each variant in turn (in `plan.repeats` rounds) and replay every
    workload against it. A server that does not come up is reported in the
    returned {variant: error} and skipped; the others still run.
    `on_variant_done` sees the runs so far after each server (to save partial
    results). Timelines are the first round's."""
    runs: list[Run] = []
    timelines: list[Timeline] = []
    failures: dict[str, str] = {}
    for repeat in range(plan.repeats):
        for v in plan.variants:
            trace = plan.fresh_trace(v, repeat)
            port = free_port()
            try:
                with plan.server(v, port, f"{plan.file_stem(v, repeat)}.log", repeat) as srv:
                    v_runs, tl = asyncio.run(
                        _serve_workloads(plan, v, srv.base_url, trace, on_progress))
            except ServerError as e:
                failures[plan.file_stem(v, repeat)] = str(e)
            else:
                for r in v_runs:
                    r.repeat = repeat
                runs += v_runs
                if repeat == 0:
                    timelines.append(tl)
            on_variant_done(runs, failures)
    return runs, timelines, failures


def run_paired(plan: Plan, pairs: list[Pair], on_progress: Callable[[str], None],
               on_variant_done: Callable[[list[Run], dict[str, str]], None] = lambda r, f: None,
               ) -> tuple[list[Run], list[Timeline], dict[str, str]]:
    """Serve each pair's stock and vspec servers at once for an unmeasured
    warm-up round and then `plan.repeats` rounds; in each round both answer every workload in turn, the stock
    server first in even rounds and the vspec server first in odd ones (a
    drift within a round then favours neither). Runs carry their pair and
    round, so `overhead.paired_ratios` divides runs of the same round. A
    pair whose servers do not both come up is reported in the returned
    {pair label: error}; the other pairs still run."""
    by_name = {v.name: v for v in plan.variants}
    runs: list[Run] = []
    timelines: list[Timeline] = []
    failures: dict[str, str] = {}
    for pair in pairs:
        both = (by_name[pair.stock], by_name[pair.vspec])
        with ExitStack() as stack:
            servers, traces = {}, {}
            try:
                for v in both:
                    traces[v.name] = plan.fresh_trace(v)
                    port = free_port()
                    servers[v.name] = stack.enter_context(
                        plan.server(v, port, f"{v.name}.{pair.vspec}-pair.log"))
            except ServerError as e:
                failures[pair.label] = str(e)
                on_variant_done(runs, failures)
                continue
            # An unmeasured round first: the first rounds after start-up ran
            # up to 25% slower (allocator growth, the first batch-32 shapes),
            # which the two warm-up requests of every turn do not cover.
            for v in both:
                time.sleep(PAIR_SWITCH_S)
                asyncio.run(_serve_workloads(plan, v, servers[v.name].base_url,
                                             traces[v.name], on_progress))
            for repeat in range(plan.repeats):
                for v in (both if repeat % 2 == 0 else both[::-1]):
                    time.sleep(PAIR_SWITCH_S)
                    v_runs, tl = asyncio.run(_serve_workloads(
                        plan, v, servers[v.name].base_url, traces[v.name], on_progress))
                    for r in v_runs:
                        r.repeat, r.pair = repeat, pair.label
                    runs += v_runs
                    if repeat == 0 and v is both[1]:
                        timelines.append(tl)
        on_variant_done(runs, failures)
    return runs, timelines, failures


async def _serve_workloads(plan: Plan, v: Variant, base_url: str, trace: Path | None,
                           on_progress: Callable[[str], None]) -> tuple[list[Run], Timeline]:
    high = max(p.concurrency for w in plan.workloads for p in w.phases)
    samples: list[scrape.MetricsSample] = []
    steps: list[dict] = []
    spans: list[tuple[str, float, float]] = []  # wall clock
    step_spans: list[tuple[str, float, float]] = []  # trace record index
    runs: list[Run] = []
    async with client_for(high) as client, httpx.AsyncClient() as metrics_client:
        warm = [Request(f"warmup/{i}", r.prompt, r.output_len) for i, r in
                enumerate(plan.requests[plan.workloads[0].name][0][:WARMUP_REQUESTS])]
        await run_phase(client, base_url, SERVED_MODEL_NAME, warm, len(warm))
        _, trace_pos = scrape.trace_steps(trace) if trace else ([], 0)
        for w in plan.workloads:
            page = await scrape.fetch_metrics(metrics_client, base_url)
            before, drafts_before = scrape.gamma_step_counts(page), scrape.draft_counts(page)
            stop = asyncio.Event()
            poller = asyncio.create_task(scrape.poll_metrics(metrics_client, base_url,
                                                             samples, stop))
            t_start = time.time()
            completions = []
            for phase, reqs in zip(w.phases, plan.requests[w.name]):
                completions += await run_phase(
                    client, base_url, SERVED_MODEL_NAME, reqs, phase.concurrency,
                    lambda c: on_progress(f"{v.name} / {w.name}"))
            stop.set()
            await poller
            spans.append((w.name, t_start, time.time()))
            page = await scrape.fetch_metrics(metrics_client, base_url)
            after, drafts_after = scrape.gamma_step_counts(page), scrape.draft_counts(page)
            run = Run(w.name, v.name, v.family, completions,
                      draft_counts=_delta(drafts_after, drafts_before))
            if trace is not None:
                w_steps, trace_pos = scrape.trace_steps(trace, trace_pos)
                step_spans.append((w.name, len(steps), len(steps) + len(w_steps)))
                steps += w_steps
                if w_steps:
                    run.gamma_counts = scrape.gamma_counts_from_trace(w_steps)
                    run.gamma_source = "trace"
                    run.controller_overhead = overhead_share(w_steps)
            if run.gamma_source is None and after != before:
                run.gamma_counts = Counter(after)
                run.gamma_counts.subtract(before)
                run.gamma_source = "metrics"
            runs.append(run)
    if steps:
        return runs, Timeline(v.name, "step", list(range(len(steps))),
                              [r["num_reqs"] for r in steps], [r["gamma"] for r in steps],
                              step_spans)
    t0 = spans[0][1] if spans else 0.0
    return runs, Timeline(v.name, "s", [s.t - t0 for s in samples],
                          [s.running for s in samples], [s.gamma for s in samples],
                          [(n, a - t0, b - t0) for n, a, b in spans])


def _delta(after: tuple[int, tuple[int, ...]], before: tuple[int, tuple[int, ...]]
           ) -> tuple[int, tuple[int, ...]] | None:
    """Spec-decode counts of one workload (None when nothing was drafted)."""
    drafts = after[0] - before[0]
    if drafts <= 0:
        return None
    old = before[1] + (0,) * (len(after[1]) - len(before[1]))
    return drafts, tuple(a - b for a, b in zip(after[1], old))
