#!/usr/bin/env python3
"""Build the Ascend overlay wheel, or re-target the overlay to a new host.

    python build_overlay.py                    # make wheel: the default pin
    python build_overlay.py --host 0.30.0rc2   # make wheel HOST=0.30.0rc2: another pin
    python build_overlay.py --host-src DIR     # ... from a local vLLM-Ascend checkout
    python build_overlay.py --retarget HOST    # make overlay HOST=<version | sdist | dir>
    python build_overlay.py --without-cann     # make wheel WITHOUT_CANN=1: Python only

Without CANN the wheel would hold neither vLLM-Ascend's vllm_ascend_C ops
nor vspec's compiled ops, and installing it replaces stock vLLM-Ascend's:
the build refuses (exit 2) unless --without-cann asks for that wheel, whose
version then ends `.nocann` (<host>+vspec<ours>.nocann).

The work is in overlay/vllm_vspec/tools/ascend_build/: build.py (the wheel: fetch, unpack, patch,
overlay, kernels, host build, assemble), retarget.py (a new host revision:
verified fetch, patches with 3-way merges, ABI check, byte-compile, wheel
build, then the new pin), common.py (pins, verified downloads, patch trees).
Each stage prints one progress line on stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from vllm_vspec.tools.ascend_build.build import build, cann_home
from vllm_vspec.tools.ascend_build.common import ROOT, BuildError
from vllm_vspec.tools.ascend_build.retarget import retarget


NO_CANN = ("build_overlay: CANN not found (ASCEND_HOME_PATH, ASCEND_TOOLKIT_HOME or "
           "/usr/local/Ascend/ascend-toolkit/latest with AscendC's cmake files): the wheel "
           "would have neither vLLM-Ascend's vllm_ascend_C ops nor vspec's compiled ops, and "
           "installing it replaces stock vLLM-Ascend. Set ASCEND_HOME_PATH, or ask for a "
           "Python-only wheel with --without-cann (make wheel WITHOUT_CANN=1)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--host-src", type=Path, help="build from this vLLM-Ascend source tree "
                    "(an unpacked sdist of the pinned version) instead of downloading")
    ap.add_argument("--host", metavar="VERSION", help="build this pinned vLLM-Ascend "
                    "version (patches/hosts.toml) instead of the default pin")
    ap.add_argument("--retarget", metavar="HOST", help="re-target the patches to another "
                    "vLLM-Ascend: a version (fetched from the index, hash-checked), an sdist "
                    "file or a source directory; exit 1 unless every patch applies and the "
                    "ABI check, byte-compile and wheel build pass")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache",
                    help="downloads, kept across runs (default: %(default)s)")
    ap.add_argument("--work", type=Path, default=ROOT / "build",
                    help="scratch trees (default: %(default)s)")
    ap.add_argument("--dist", type=Path, default=ROOT / "dist",
                    help="where the wheel goes (default: %(default)s)")
    ap.add_argument("--without-cann", action="store_true", help="build the wheel although "
                    "CANN is not found: Python only, without vLLM-Ascend's vllm_ascend_C ops "
                    "and vspec's compiled ops (it still replaces stock vLLM-Ascend when "
                    "installed); without this flag such a build is refused")
    ap.add_argument("--json", action="store_true", help="print the result as JSON: the "
                    "re-target report (patches, checks, outcome), or {\"wheel\": path}")
    args = ap.parse_args(argv)
    try:
        if args.retarget is not None:
            report = retarget(args.retarget, args.cache, args.work)
            print(json.dumps({**dataclasses.asdict(report), "ok": report.ok}, indent=2,
                             default=str) if args.json else "\n".join(report.lines()))
            return 0 if report.ok else 1
        if not args.without_cann and cann_home() is None:
            print(NO_CANN, file=sys.stderr)
            return 2
        wheel = build(args.host_src, args.cache, args.work, args.dist, args.host)
        print(json.dumps({"wheel": str(wheel)}) if args.json else wheel)
        return 0
    except BuildError as e:
        print(f"build_overlay: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
