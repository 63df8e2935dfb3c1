"""`vllm-vspec profile fit`: fit a latency profile JSON from latency samples
(the model, the schemas and the fitter are core/latency.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Mapping

import numpy as np

from vllm_vspec.core import latency


def add_parser(actions: argparse._SubParsersAction) -> None:
    """`profile`'s action `fit`."""
    from vllm_vspec.cli import HelpFormatter

    p = actions.add_parser(
        "fit", help="fit a latency profile JSON from latency samples (refit what collect wrote)",
        formatter_class=HelpFormatter,
        description="Fit T(ctx, n) = alpha*ctx + beta*n + delta for target and draft by\n"
                    "non-negative least squares; see vllm_vspec/core/latency.py for formats.")
    p.add_argument("samples", help="samples JSON (list, or {'samples': [...]})")
    p.add_argument("profile", help="profile JSON to write")
    p.add_argument("--name", default=None, help="profile name (default: from samples file)")
    p.add_argument("--device", default=None, help="device description (default: from samples file)")
    p.set_defaults(func=_fit_main)


def _fit_main(args: argparse.Namespace) -> int:
    try:
        raw = json.loads(Path(args.samples).read_text())
    except OSError as exc:
        raise SystemExit(f"samples={args.samples!r} is not allowed: a readable samples "
                         f"JSON file ({exc.strerror})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SystemExit(f"samples={args.samples!r} is not allowed: a samples JSON file "
                         f"(not JSON: {exc}); `vllm-vspec profile collect` writes one") from None
    samples = latency.validate_samples(raw, where=args.samples)
    out_dir = Path(args.profile).resolve().parent
    if not out_dir.is_dir():
        raise SystemExit(f"profile={args.profile!r} is not allowed: a file in an existing "
                         f"directory ({out_dir} is not one)")
    info = raw if isinstance(raw, Mapping) else {}
    profile = latency.fit_profile(samples, name=args.name or info.get("name", Path(args.profile).stem),
                          device=args.device or info.get("device", ""),
                          note=f"fitted by vllm-vspec profile fit from {len(samples)} samples")
    latency.save_profile(profile, args.profile)
    errors = [abs(latency.profile_predict(profile, s) / float(s["ms"]) - 1) for s in samples
              if float(s["ms"]) > 0]
    print(f"wrote {args.profile}: target {latency.coefficients(profile.target)}, draft {latency.coefficients(profile.draft)}")
    print(f"relative error over {len(errors)} samples: mean {np.mean(errors):.3f}, "
          f"max {np.max(errors):.3f}")
    return 0
