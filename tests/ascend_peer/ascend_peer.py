"""Run vLLM-Ascend's own CPU unit tests on the stock and the overlaid tree
and compare them test by test (`make ascend-peer-test`).

For a host pin (--host; `make ascend-peer-test HOST=...`; default:
patches/hosts.toml's default) this prepares,
cached under .cache/ascend-peer (ascend_env.py): the pin's sdist unpacked as
shipped ("stock") and with our patch series and overlay files ("overlaid",
what our wheel installs; vspec's routing on, as `vllm-vspec manage enable` turns it on),
and an isolated venv with the vLLM release the pin runs on. It then runs the
sdist's tests/ut files of the directories that suite.toml names for the host
(the files vLLM-Ascend's CI runs on CPU: not under a2/, a3_*/, 310p/), once
per tree, in one pytest process per tree, and compares the outcome of every
test id.

Exit 0: every outcome is the same on both trees or the difference is listed
in suite.toml with its reason. Exit 1: an unlisted difference, or the
overlaid run never went through vspec's routing (routing off: the comparison
would mean nothing). Exit 2: the trees or the venv could not be prepared, or
pytest itself failed (usage error, crash; its log is named). Failures that
happen on both trees alike are reported (per directory) but do not fail the
command: they are the host's tests on this host (CPU, torch 2.13), not ours.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

# These folders are not packages; tests/peer holds what both peer suites share.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "peer"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import ascend_env  # noqa: E402
from peer_common import (MISSING, OUTCOMES, Listing, by_reason, file_difference,  # noqa: E402
                         read_report, table)

HERE = ascend_env.HERE
REPO = ascend_env.REPO
# peer_common.py's folder, on the plugin's path too.
COMMON = HERE.parent / "peer"
SUITE = HERE / "suite.toml"
TREES = ascend_env.TREES
# vLLM-Ascend's CI routes these to NPU runners (its test_config.yaml
# runner_mapping and conftest.py conventions); everything else in tests/ut runs
# on its CPU runner.
NPU_DIRS = re.compile(r"tests/ut/.+/(a2|a2_\d+|a3_\d+|310p)/")


@dataclass
class Difference:
    test_id: str
    stock: str
    overlaid: str
    message: str  # the overlaid tree's (or stock's when overlaid passed)
    reason: str | None = None


@dataclass
class Comparison:
    counts: dict[str, dict[str, dict[str, int]]]  # tree -> directory -> outcome -> n
    same_failures: dict[str, int] = field(default_factory=dict)  # directory -> n
    expected: list[Difference] = field(default_factory=list)
    unexpected: list[Difference] = field(default_factory=list)
    stale: list[dict] = field(default_factory=list)  # entries that matched nothing
    routed_tests: int = 0  # overlaid tests in which vspec's routing chose a vspec class
    routing_required: bool = True

    @property
    def ok(self) -> bool:
        return not self.unexpected and (self.routed_tests > 0 or not self.routing_required)


def directory_of(test_id: str) -> str:
    """`tests/ut/<dir>/...` -> <dir>; a top-level file -> its name."""
    parts = test_id.split("::")[0].split("/")
    return parts[2] if len(parts) > 3 else parts[-1]


def applies(entry: dict, host: str) -> bool:
    return host in entry.get("hosts", [host])


def compare(results: dict[str, dict[str, dict]], host: str, expected: list[dict],
            routing: dict[str, dict], routing_required: bool = True) -> Comparison:
    """`results`: tree -> test id -> {"outcome", "message"}; `routing`: the
    overlaid run's test id -> {decision: count}. A test absent from one tree
    counts as "missing" there."""
    ids = sorted(set().union(*(results.get(t, {}) for t in TREES)))
    counts: dict[str, dict[str, dict[str, int]]] = {t: {} for t in TREES}
    cmp = Comparison(counts, routing_required=routing_required)
    listing = Listing(expected)

    def on_host(entry: dict) -> bool:
        return applies(entry, host)

    for test_id in ids:
        got = {t: results.get(t, {}).get(test_id, MISSING) for t in TREES}
        d = directory_of(test_id)
        for t in TREES:
            per = counts[t].setdefault(d, {})
            per[got[t]["outcome"]] = per.get(got[t]["outcome"], 0) + 1
        stock, ours = got["stock"], got["overlaid"]
        if stock["outcome"] == ours["outcome"]:
            if stock["outcome"] in ("failed", "error"):
                cmp.same_failures[d] = cmp.same_failures.get(d, 0) + 1
            continue
        diff = Difference(test_id, stock["outcome"], ours["outcome"],
                          ours["message"] or stock["message"])
        file_difference(diff, listing.reason(test_id, on_host), cmp.expected, cmp.unexpected)
    cmp.stale = listing.stale(on_host)
    cmp.routed_tests = sum(1 for test_id, decisions in routing.items()
                           if test_id != "<collection>" and any(decisions.values()))
    return cmp


def render(cmp: Comparison, routing: dict[str, dict]) -> str:
    dirs = sorted(set().union(*(cmp.counts[t] for t in TREES)))
    shown = [o for o in OUTCOMES if any(cmp.counts[t].get(d, {}).get(o)
                                        for t in TREES for d in dirs)]
    head = ["directory", "tree", *shown, "same failure", "differ: listed", "differ: NOT listed"]
    listed = Counter(directory_of(x.test_id) for x in cmp.expected)
    unlisted = Counter(directory_of(x.test_id) for x in cmp.unexpected)
    rows = []
    for d in [*dirs, "TOTAL"]:
        for t in TREES:
            per = (cmp.counts[t].get(d, {}) if d != "TOTAL" else
                   dict(sum((Counter(v) for v in cmp.counts[t].values()), Counter())))
            extra = ([str(cmp.same_failures.get(d, 0) if d != "TOTAL" else
                          sum(cmp.same_failures.values())),
                      str(listed[d] if d != "TOTAL" else len(cmp.expected)),
                      str(unlisted[d] if d != "TOTAL" else len(cmp.unexpected))]
                     if t == "overlaid" else ["", "", ""])
            rows.append([d if t == "stock" else "", t, *(str(per.get(o, 0)) for o in shown),
                         *extra])
    lines = table(head, rows)
    decisions = Counter()
    for per in routing.values():
        decisions.update(per)
    lines.append(f"\nvspec routing in the overlaid tree: {cmp.routed_tests} test(s) chose a "
                 f"vspec class ({', '.join(f'{k} x{v}' for k, v in sorted(decisions.items())) or 'none'})")
    if cmp.expected:
        lines.append("\nlisted differences (suite.toml):")
        for reason, diffs in by_reason(cmp.expected).items():
            moves = ", ".join(f"{a}->{b} x{n}" for (a, b), n in
                              Counter((x.stock, x.overlaid) for x in diffs).items())
            lines.append(f"  {len(diffs)} test(s) ({moves}): {' '.join(reason.split())}")
    if cmp.unexpected:
        lines.append("\nUNEXPECTED DIFFERENCES (not in suite.toml):")
        lines += [f"  {x.test_id}: stock={x.stock} overlaid={x.overlaid}: {x.message}"
                  for x in cmp.unexpected]
    if cmp.routing_required and not cmp.routed_tests:
        lines.append("\nNO TEST WENT THROUGH vspec's ROUTING in the overlaid tree: routing is "
                     "off or not patched in; the comparison would mean nothing")
    if cmp.stale:
        lines.append("\nlisted differences that did not occur (stale entries?):")
        lines += [f"  {', '.join(e['tests'])}" for e in cmp.stale]
    return "\n".join(lines)


# -------------------------------------------------------------------- run
def test_files(tree: Path, directories: list[str], excluded: dict[str, str]) -> list[str]:
    """The CPU test files of `directories` (relative to the tree), as
    vLLM-Ascend's CI selects them, less `excluded` (pattern -> reason)."""
    out = []
    for d in directories:
        base = tree / "tests" / "ut" / d
        found = [base] if base.is_file() else sorted(base.rglob("test_*.py"))
        if not found:
            raise FileNotFoundError(f"{base}: no such test directory or file")
        for f in found:
            rel = f.relative_to(tree).as_posix()
            if "__pycache__" in rel or NPU_DIRS.search(rel):
                continue
            if any(fnmatch.fnmatchcase(rel, p) for p in excluded):
                continue
            out.append(rel)
    return out


def run_trees(env: ascend_env.HostEnv, files: list[str], keyword: str | None,
              host_cfg: dict, workdir: Path, jobs: int) -> dict[str, dict]:
    """One pytest process per tree (`jobs` at a time); tree -> its report."""
    base_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("VLLM_VSPEC", "PYTEST_", "VIRTUAL_ENV"))}
    # As vLLM-Ascend's CI runs its CPU unit tests.
    base_env.update(TORCH_DEVICE_BACKEND_AUTOLOAD="0", VLLM_WORKER_MULTIPROC_METHOD="spawn",
                    HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    # vspec's proposers call torch.ops.vspec.* (vllm_vspec.kernels.ops). Our
    # wheel carries that library only when built with CANN; here it is the CPU
    # build of csrc/ that `make install` leaves in build/ (same torch, 2.13).
    ops_lib = REPO / "build" / "csrc-cpu" / "lib" / "libvspec_ops.so"
    if ops_lib.is_file():
        base_env["VSPEC_OPS_LIB"] = str(ops_lib)
    # vspec on in the overlaid tree, as the environment default (what
    # `vllm-vspec manage enable` stores): a pin whose overlay turns it off by
    # default (0.30.0rc2's overlay.toml [defaults]) would otherwise route nothing.
    from vllm_vspec.core import install_state

    state = install_state.write_state(True, workdir / "vspec-state.json", by="ascend peer suite")
    procs, reports = [], {}
    pending = list(TREES)
    while pending or procs:
        while pending and len(procs) < max(1, jobs):
            tree = pending.pop(0)
            src = env.trees[tree]
            report, log = workdir / f"ascend-peer-{tree}.json", workdir / f"ascend-peer-{tree}.log"
            report.unlink(missing_ok=True)
            # --tb=line: the report keeps a failure's crash line only
            # (peer_common.message); a traceback with source lines makes
            # pytest parse the source file of every frame, a large part of
            # a tree's run when some 50 tests fail in both trees.
            cmd = [str(env.python), "-m", "pytest", "-p", "ascend_peer_plugin",
                   "-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(src),
                   "-q", "--tb=line", "-o", "console_output_style=classic",
                   "--continue-on-collection-errors",
                   "--ascend-peer-report", str(report), "--ascend-peer-tree", tree,
                   *(["--ascend-torchvision-standin"] if host_cfg.get("torchvision_standin") else []),
                   *(["--ascend-route-proposers"] if tree == "overlaid" else []),
                   *(["-k", keyword] if keyword else []), *files]
            penv = dict(base_env, PYTHONPATH=os.pathsep.join([str(HERE), str(COMMON), str(src)]),
                        VLLM_CACHE_ROOT=str(workdir / f"vllm-cache-{tree}"))
            if tree == "overlaid":
                penv[install_state.STATE_ENV] = str(state)
            out = log.open("w")
            procs.append((tree, subprocess.Popen(cmd, cwd=src, env=penv, stdout=out,
                                                 stderr=subprocess.STDOUT), report, log, out))
        tree, proc, report, log, out = procs.pop(0)
        rc = proc.wait()
        out.close()
        reports[tree] = read_report(rc, report, log, f"pytest on the {tree} tree")
    return reports


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/ascend_peer/ascend_peer.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", help="vLLM-Ascend pin, a table of suite.toml "
                        "(default: patches/hosts.toml's default; make: HOST=...)")
    parser.add_argument("--suite", type=Path, default=SUITE, help="default: %(default)s")
    parser.add_argument("--dirs", default="", help="comma-separated tests/ut directories "
                        "(default: the host's list in suite.toml)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (a subset)")
    parser.add_argument("--jobs", type=int, default=2, help="trees run at once (default: 2)")
    parser.add_argument("--json", type=Path, default=REPO / "results" / "ascend-peer.json",
                        help="where to write the comparison (default: %(default)s)")
    parser.add_argument("--prepare-only", action="store_true",
                        help="prepare the trees and the venv, print where, and stop")
    args = parser.parse_args(argv)

    started = time.monotonic()
    suite = tomllib.loads(args.suite.read_text())
    from vllm_vspec.tools.ascend_build import common

    host = args.host or common.load_pins()[0]
    if host not in suite.get("host", {}):
        print(f"ascend peer: {args.suite} has no [host.{host!r}] table (has "
              f"{sorted(suite.get('host', {}))}); add one for this pin", file=sys.stderr)
        return 2
    host_cfg = suite["host"][host]
    try:
        env = ascend_env.prepare(host, host_cfg)
    except (common.BuildError, OSError) as exc:
        print(f"ascend peer: {exc}", file=sys.stderr)
        return 2
    prepared_s = time.monotonic() - started
    if args.prepare_only:
        print(json.dumps({"python": str(env.python),
                          **{t: str(p) for t, p in env.trees.items()}}, indent=1))
        return 0
    directories = args.dirs.split(",") if args.dirs else host_cfg["directories"]
    excluded = {p: r for p, r in suite.get("excluded", {}).items()}
    files = test_files(env.trees["stock"], directories, excluded)
    if not args.dirs:
        files += [f for f in host_cfg.get("npu_files_run", []) if f not in files]
    args.json.parent.mkdir(parents=True, exist_ok=True)
    print(f"ascend peer: vLLM-Ascend {host} tests/ut {{{','.join(directories)}}}: "
          f"{len(files)} files x 2 trees (stock, overlaid); logs next to {args.json}",
          flush=True)
    try:
        reports = run_trees(env, files, args.keyword, host_cfg, args.json.parent, args.jobs)
    except RuntimeError as exc:
        print(f"ascend peer: {exc}", file=sys.stderr)
        return 2
    routing = reports["overlaid"].get("routing", {})
    cmp = compare({t: reports[t]["results"] for t in TREES}, host,
                  suite.get("difference", []), routing,
                  routing_required="spec_decode" in directories and not args.keyword)
    if args.keyword or args.dirs:
        cmp.stale = []  # a subset leaves most entries unexercised, not stale
    wall_s = time.monotonic() - started
    print(render(cmp, routing))
    n = len(set().union(*(reports[t]["results"] for t in TREES)))
    print(f"\n{n} test ids x 2 trees in {wall_s:.0f} s (prepare {prepared_s:.0f} s); "
          f"{'OK' if cmp.ok else 'FAILED'}; written {args.json}")
    args.json.write_text(json.dumps({
        "host": host, "directories": directories, "files": files, "excluded": excluded,
        "keyword": args.keyword, "wall_s": round(wall_s, 1), "ok": cmp.ok, **asdict(cmp),
        "routing": routing, "results": {t: reports[t]["results"] for t in TREES}}, indent=1))
    return 0 if cmp.ok else 1


if __name__ == "__main__":
    sys.exit(main())
