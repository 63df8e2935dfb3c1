#!/usr/bin/env python3
"""Release audit of the portable package (`make release-check`).

Checks, each reported as one row (exit 1 if any fails):
  clean-tree     git sees no modified, staged or untracked file
  one-version    vllm_vspec.__version__ == manifest extension_version ==
                 the built wheel's METADATA Version == `vllm-vspec --version`
  wheel-files    the wheel holds only vllm_vspec/ and its .dist-info: no
                 tests, models, results, caches or bytecode
  entry-points   the manifest's entry points are exactly the wheel's, and
                 each resolves to an object (imported from the built wheel)
  reproducible   two builds from two copies give the same SHA-256
                 (SOURCE_DATE_EPOCH = the HEAD commit's time)

The wheels are built from copies of the sources (pyproject.toml, README.md,
configs/, overlay/vllm_vspec/), so the checkout gets no build/ or egg-info.
With --out DIR the audited wheel is kept there.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from configparser import ConfigParser
from email.parser import Parser
from pathlib import Path

REPO = Path(__file__).resolve().parent
SOURCES = ("pyproject.toml", "README.md", "configs", "overlay/vllm_vspec")
ALLOWED_TOP = ("vllm_vspec/",)
FORBIDDEN_TOP = ("tests", "models", "results")  # folders of the checkout, never shipped


def copy_sources(dest: Path, repo: Path = REPO) -> Path:
    """The files a portable wheel is built from, copied (links kept as links)."""
    for rel in SOURCES:
        if (repo / rel).is_dir():
            shutil.copytree(repo / rel, dest / rel, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(repo / rel, dest / rel)
    return dest


def build_wheel(src: Path, out: Path, epoch: str | None = None) -> Path:
    """`pip wheel` of a source copy (no deps, no build isolation: setuptools
    comes from this environment), with zip dates from SOURCE_DATE_EPOCH."""
    env = dict(os.environ)
    if epoch is not None:
        env["SOURCE_DATE_EPOCH"] = epoch
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(out), str(src)], check=True, env=env)
    (wheel,) = out.glob("vllm_vspec-*.whl")
    return wheel


def source_version(repo: Path = REPO) -> str:
    """`__version__` read from the source without importing it."""
    tree = ast.parse((repo / "overlay/vllm_vspec/__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("overlay/vllm_vspec/__init__.py defines no __version__")


def manifest(repo: Path = REPO) -> dict:
    return json.loads((repo / "overlay/vllm_vspec/manifests/vllm-hust-extension-v0.2.json")
                      .read_text())


def _dist_info(z: zipfile.ZipFile, leaf: str) -> str:
    (name,) = [n for n in z.namelist() if n.endswith(f".dist-info/{leaf}")]
    return z.read(name).decode()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ------------------------------------------------------------------ checks
def check_clean_tree(repo: Path = REPO) -> str | None:
    run = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                         text=True)
    if run.returncode != 0:
        return f"not a git checkout: {run.stderr.strip()}"
    dirty = run.stdout.splitlines()
    if dirty:
        return (f"{len(dirty)} changed or untracked path(s), e.g. {dirty[0].strip()}: "
                "commit or remove them (a release is built from a commit)")
    return None


def check_one_version(wheel: Path, repo: Path = REPO) -> str | None:
    with zipfile.ZipFile(wheel) as z:
        meta = Parser().parsestr(_dist_info(z, "METADATA"))
    cli = subprocess.run([sys.executable, "-c", "from vllm_vspec.cli import main; main(['--version'])"],
                         capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(repo / "overlay")})
    versions = {"vllm_vspec.__version__": source_version(repo),
                "manifest extension_version": manifest(repo)["extension_version"],
                "wheel METADATA": meta["Version"],
                "vllm-vspec --version": cli.stdout.strip().removeprefix("vllm-vspec ")}
    if len(set(versions.values())) != 1:
        return "versions differ: " + ", ".join(f"{k} {v!r}" for k, v in versions.items())
    return None


def check_wheel_files(wheel: Path) -> str | None:
    bad = []
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            top_ok = name.startswith(ALLOWED_TOP) or name.split("/")[0].endswith(".dist-info")
            parts = name.split("/")
            if (not top_ok or parts[1:2] and parts[1] in FORBIDDEN_TOP
                    or "__pycache__" in parts or name.endswith(".pyc")):
                bad.append(name)
    return f"{len(bad)} file(s) that do not belong: {bad[:5]}" if bad else None


def check_entry_points(wheel: Path, repo: Path = REPO) -> str | None:
    with zipfile.ZipFile(wheel) as z:
        parser = ConfigParser(delimiters=("=",))
        parser.optionxform = str  # entry point names are case-sensitive
        parser.read_string(_dist_info(z, "entry_points.txt"))
    in_wheel = {f"{g}:{k.strip()}": v.strip() for g in parser.sections()
                for k, v in parser.items(g)}
    m = manifest(repo)
    declared = {f"{g}:{k}": v for g, eps in m["entry_points"].items() for k, v in eps.items()}
    declared.update({f"console_scripts:{k}": v for k, v in m.get("console_scripts", {}).items()})
    wanted = {k: v for k, v in in_wheel.items() if not k.startswith("vllm_hust.")}
    if declared != wanted:
        return f"manifest {declared} != wheel {wanted}"
    # Resolve each from the built wheel itself (unpacked), not the checkout.
    with tempfile.TemporaryDirectory() as tmp:
        zipfile.ZipFile(wheel).extractall(tmp)
        probe = ("import importlib, json, sys\n"
                 "bad = {}\n"
                 "for key, value in json.loads(sys.argv[1]).items():\n"
                 "    mod, _, attr = value.partition(':')\n"
                 "    try:\n"
                 "        obj = importlib.import_module(mod)\n"
                 "        for part in filter(None, attr.split('.')):\n"
                 "            obj = getattr(obj, part)\n"
                 "    except Exception as e:\n"
                 "        bad[key] = f'{type(e).__name__}: {e}'\n"
                 "print(json.dumps(bad))\n")
        run = subprocess.run([sys.executable, "-c", probe, json.dumps(in_wheel)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONPATH": tmp},
                             cwd=tmp)
        bad = json.loads(run.stdout.strip().splitlines()[-1]) if run.returncode == 0 else {
            "probe": run.stderr.strip()[-500:]}
    return f"entry points that do not resolve: {bad}" if bad else None


def two_builds(repo: Path, tmp: Path, epoch: str) -> list[Path]:
    """Two wheels built from two copies of one snapshot of the sources (a
    file edited between two reads of the checkout is not the build's fault)."""
    snapshot = copy_sources(tmp / "snapshot", repo)
    copies = [shutil.copytree(snapshot, tmp / f"src{i}", symlinks=True) for i in (1, 2)]
    return [build_wheel(Path(src), tmp / f"dist{i}", epoch) for i, src in enumerate(copies, 1)]


def head_epoch(repo: Path = REPO) -> str:
    run = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=repo, capture_output=True,
                         text=True)
    return run.stdout.strip() or "315532800"  # 1980-01-01, zip's first date


def audit(repo: Path = REPO, out: Path | None = None) -> list[tuple[str, str | None]]:
    """(check, problem or None) for every check, in the order of the docstring."""
    results: list[tuple[str, str | None]] = [("clean-tree", check_clean_tree(repo))]
    epoch = head_epoch(repo)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        wheels = two_builds(repo, tmp, epoch)
        results += [("one-version", check_one_version(wheels[0], repo)),
                    ("wheel-files", check_wheel_files(wheels[0])),
                    ("entry-points", check_entry_points(wheels[0], repo))]
        a, b = (sha256(w) for w in wheels)
        results.append(("reproducible", None if a == b else
                        f"two builds differ: {a[:16]}... vs {b[:16]}..."))
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheels[0], out / wheels[0].name)
            results.append((f"kept {out / wheels[0].name}", None))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--out", type=Path, help="keep the audited wheel in this folder")
    args = p.parse_args(argv)
    results = audit(out=args.out)
    ok = all(problem is None for _, problem in results)
    if args.json:
        print(json.dumps({"ok": ok, "checks": {k: v or "ok" for k, v in results}}, indent=2))
    else:
        width = max(len(k) for k, _ in results)
        for name, problem in results:
            print(f"{name.ljust(width)}  {'ok' if problem is None else 'FAIL: ' + problem}")
        print("release check: " + ("passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
