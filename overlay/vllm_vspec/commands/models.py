"""`vllm-vspec models`: find, validate and register the default drafters (the
store is tools/drafters.py)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vllm_vspec.tools import drafters


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "models", help="find, validate and register the default drafters",
        description=drafters.__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(drafters.DRAFTERS), action="append",
                   help="check only this drafter (repeatable; default: all)")
    p.add_argument("--target", type=Path, metavar="DIR",
                   help="target model directory: check the draft tokenizer against it")
    p.add_argument("--model-dir", type=Path, metavar="DIR",
                   help="shared models directory (overrides VSPEC_MODEL_DIR)")
    p.add_argument("--registry", type=Path, metavar="FILE",
                   help="registry JSON to read and write (overrides VSPEC_MODEL_REGISTRY)")
    p.add_argument("--download", action=argparse.BooleanOptionalAction, default=False,
                   help="fetch missing drafters from the Hugging Face Hub "
                        "(default --no-download, for offline sites: find and validate only)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    environ = dict(os.environ)
    if args.model_dir:
        environ["VSPEC_MODEL_DIR"] = str(args.model_dir)
    if args.registry:
        environ["VSPEC_MODEL_REGISTRY"] = str(args.registry)
    try:
        results = []
        for kind in args.only or sorted(drafters.DRAFTERS):
            result = drafters.find(drafters.DRAFTERS[kind], environ, args.target)
            if result.status != "found" and args.download:
                result = drafters.download(drafters.DRAFTERS[kind], environ, args.target)
            results.append(result)
        if any(r.status == "found" for r in results):
            drafters.write_registry(drafters.registry_path(environ), results)
    except drafters.DrafterError as exc:
        print(f"vllm-vspec models: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"registry": str(drafters.registry_path(environ)),
                          "drafters": [vars(r) for r in results]}, indent=2))
    else:
        for r in results:
            where = f"{r.path} ({r.source})" if r.path else "-"
            print(f"{r.kind:6s} {r.repo:42s} {r.status:8s} {where}")
            for problem in r.problems:
                print(f"       {problem}")
        print(f"registry: {drafters.registry_path(environ)}")
        if any(r.status != "found" for r in results) and not args.download:
            print("missing drafters: place them under the model directory, set "
                  + " / ".join(drafters.DRAFTERS[r.kind].env for r in results if r.status != "found")
                  + ", or rerun with --download")
    return 0 if all(r.status == "found" for r in results) else 1
