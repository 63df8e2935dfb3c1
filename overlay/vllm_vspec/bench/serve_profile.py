"""Where a served step's time goes: py-spy each process of one bench server
while it answers a load, then compare two servers.

    python -m vllm_vspec.bench.serve_profile run target fixed-0 --concurrency 1 \\
        --requests 16 --out results/serve-prof
    python -m vllm_vspec.bench.serve_profile compare \\
        results/serve-prof/target.EngineCore.txt results/serve-prof/fixed-0.EngineCore.txt

`run` starts each named bench variant's server in turn (`vllm-vspec bench serve`
names: target, fixed-G, vspec-fixed-G, eagle-fixed-0, ...; the bench's
server settings, --enforce-eager), warms it up, then samples its API
server, engine-core and worker processes with `py-spy record --nonblocking
--format raw` (collapsed stacks) while it answers `--requests` requests of
64 tokens at `--concurrency`, and writes one file per process:
`<out>/<variant>.<process>.txt`. py-spy must be installed (`pip install
py-spy`); it samples from outside the processes without stopping them.

`compare A B` sums each function's samples over every stack it is on
(inclusive), and lists the functions whose share differs most between the
two profiles. On vLLM-CPU the engine core busy-polls while its worker
computes, so waiting shows up as samples too: the engine core's
`take_draft_token_ids` under `post_step`, or a worker waiting longer in
`MessageQueue.dequeue`, is time the step spends on something other than the
forward (docs/log/benchmarks.md, "Where a vspec step's time goes").
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# Sampling rate (Hz): low enough that py-spy's own CPU stays small on 2 cores.
RATE = 100


def _processes(pid: int) -> dict[int, str]:
    """The server's process tree: pid -> a short name (APIServer, EngineCore,
    Worker)."""
    names = {}

    def walk(p: int, depth: int) -> None:
        # vLLM names its processes VLLM::EngineCore, VLLM::Worker...; the
        # kernel keeps 15 characters of a name ("VLLM::EngineCor").
        comm = Path(f"/proc/{p}/comm").read_text().strip()
        name = comm.split("::")[-1] if comm.startswith("VLLM::") else None
        if name is not None and "EngineCore".startswith(name):
            name = "EngineCore"
        names[p] = "APIServer" if depth == 0 else name
        for child in Path(f"/proc/{p}/task/{p}/children").read_text().split():
            walk(int(child), depth + 1)

    walk(pid, 0)
    return {p: n for p, n in names.items() if n}


def run(args: argparse.Namespace) -> int:
    from vllm_vspec.bench import overhead, variants
    from vllm_vspec.bench.loadgen import client_for, run_phase
    from vllm_vspec.bench.server import SERVED_MODEL_NAME, Server, ServerSpec, free_port, serve_argv
    from vllm_vspec.bench.workloads import Request, load_prompts
    from vllm_vspec.tools.engine_runs import (DEFAULT_DRAFT, DEFAULT_EAGLE, DEFAULT_PROMPT_FILES,
                                              DEFAULT_TARGET)

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy")
    drafters = {"draft_model": DEFAULT_DRAFT if DEFAULT_DRAFT.exists() else None,
                "eagle": DEFAULT_EAGLE if DEFAULT_EAGLE.exists() else None}
    available = variants.all_variants(drafters)
    available.update({v.name: v for v in overhead.vspec_fixed_variants(drafters)})
    unknown = [n for n in args.variants if n not in available]
    if unknown:
        raise SystemExit(f"variants {', '.join(unknown)} are not known: choose from "
                         f"{', '.join(available)}")
    prompts = [p for f in DEFAULT_PROMPT_FILES for p in load_prompts(f)]
    reqs = [Request(f"r{i}", prompts[i % len(prompts)], 64) for i in range(args.requests)]
    spec = ServerSpec(model=DEFAULT_TARGET, enforce_eager=True)
    args.out.mkdir(parents=True, exist_ok=True)

    async def load(base_url: str, batch: list[Request]) -> tuple[float, int]:
        async with client_for(args.concurrency) as client:
            start = time.time()
            done = await run_phase(client, base_url, SERVED_MODEL_NAME, batch, args.concurrency)
            return time.time() - start, sum(c.tokens for c in done)

    for name in args.variants:
        port = free_port()
        argv = serve_argv(spec, available[name].serve_args(None), port)
        with Server(argv, port, args.out / f"{name}.server.log") as server:
            asyncio.run(load(server.base_url, reqs[:max(2, args.concurrency)]))   # warm-up
            time.sleep(1.5)   # the engine core's busy-poll after the warm-up ends
            spies = [subprocess.Popen([spy, "record", "--nonblocking", "-r", str(RATE),
                                       "-f", "raw", "-o", str(args.out / f"{name}.{proc}.txt"),
                                       "-p", str(pid)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                     for pid, proc in _processes(server.proc.pid).items()]
            time.sleep(1.0)   # py-spy attached
            wall, tokens = asyncio.run(load(server.base_url, reqs))
            for s in spies:
                s.send_signal(2)   # SIGINT: py-spy writes its file and exits
            for s in spies:
                s.wait(60)
        print(f"{name}: {tokens} tokens in {wall:.2f} s ({tokens / wall:.1f} tok/s while "
              f"profiled) -> {args.out}/{name}.<process>.txt", flush=True)
    return 0


def inclusive_samples(path: Path) -> tuple[Counter, int]:
    """(function -> samples of the stacks it is on, total samples) of one
    py-spy raw file (`frame;frame;... count` lines). A function is named
    `name (file)`, the file cut after site-packages/ or overlay/."""
    counts: Counter = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        total += int(n)
        names = {re.sub(r" \((.*?):\d+\)$", lambda m: " (" + m.group(1).split(
            "site-packages/")[-1].split("overlay/")[-1] + ")", f) for f in stack.split(";")}
        for name in names:
            counts[name] += int(n)
    return counts, total


def compare(a: Path, b: Path, limit: int = 40) -> list[str]:
    """Lines for the functions whose inclusive samples differ most (B - A)."""
    ca, ta = inclusive_samples(a)
    cb, tb = inclusive_samples(b)
    rows = sorted(ca.keys() | cb.keys(), key=lambda k: -abs(cb[k] - ca[k]))
    out = [f"samples: {ta} ({a.name}) -> {tb} ({b.name}), at {RATE} Hz"]
    out += [f"{ca[k]:7d} {cb[k]:7d} {cb[k] - ca[k]:+7d}  {k}" for k in rows[:limit]
            if cb[k] != ca[k]]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m vllm_vspec.bench.serve_profile",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="py-spy one server after another under a load")
    r.add_argument("variants", nargs="+", help="bench variant names, e.g. target fixed-0")
    r.add_argument("--concurrency", type=int, default=1)
    r.add_argument("--requests", type=int, default=16)
    r.add_argument("--out", type=Path, default=Path("results/serve-prof"))
    c = sub.add_parser("compare", help="inclusive-sample differences of two py-spy files")
    c.add_argument("a", type=Path)
    c.add_argument("b", type=Path)
    c.add_argument("--limit", type=int, default=40)
    args = p.parse_args(argv)
    if args.cmd == "run":
        return run(args)
    print("\n".join(compare(args.a, args.b, args.limit)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
