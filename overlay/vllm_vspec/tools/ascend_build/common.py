"""What building and re-targeting the Ascend overlay share: the host pins,
verified downloads from the package index, the scratch git trees the patches
apply to, and the overlay files.

Downloads never run code from what they fetch: the file is located through
the index's simple API (PEP 691 JSON), streamed to disk, and kept only when its
SHA-256 is the one expected (the pin's, or for a new revision the index's
own); only then is it unpacked. (`pip download` of an sdist would run its
setup.py to get metadata before any hash is checked.)
"""

from __future__ import annotations

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
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

# overlay/vllm_vspec/tools/ascend_build/common.py -> the repository root.
ROOT = Path(__file__).resolve().parents[4]
PINS_FILE = ROOT / "patches" / "hosts.toml"
PATCHES_DIR = ROOT / "patches" / "vllm-ascend"
OVERLAY_DIRS = ("vllm_ascend", "vllm_vspec")  # overlay/<name> -> tree/<name>
HOST_DIST = "vllm-ascend"
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
    # Run-time requirements whose pinned version the public index lacks:
    # left out of the wheel's Requires-Dist (so that pip resolves it) and
    # named in its METADATA with where they come from.
    off_index: tuple[str, ...] = ()

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
        pins[version] = Pin(version=version, **{**table, "off_index": tuple(table["off_index"])})
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


INDEX_URL = "https://pypi.org/simple"


@dataclass(frozen=True)
class IndexFile:
    """One file as the package index publishes it."""

    name: str
    url: str
    sha256: str


def index_page(project: str) -> dict:
    """The index's PEP 691 JSON page of a project (its files with the SHA-256
    the index states, its versions). Downloads no file."""
    url = f"{INDEX_URL}/{project}/"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.load(response)
    except (OSError, ValueError) as e:
        raise BuildError(f"cannot read the package index page {url}: {e}") from e


def index_files(project: str) -> dict[str, IndexFile]:
    """File name -> IndexFile for every file the index lists for a project."""
    return {f["filename"]: IndexFile(f["filename"], f["url"], f["hashes"]["sha256"])
            for f in index_page(project)["files"] if "sha256" in f.get("hashes", {})}


def download(url: str, dest: Path, sha256: str) -> Path:
    """Stream url to dest; the file gets its name only if its SHA-256 is `sha256`.
    The side file is per process, so two processes fetching the same file (a
    background peer suite beside the session's build) never write one file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
    h = hashlib.sha256()
    try:
        with urllib.request.urlopen(url, timeout=600) as response, open(part, "wb") as f:
            for chunk in iter(lambda: response.read(1 << 20), b""):
                h.update(chunk)
                f.write(chunk)
    except OSError as e:
        part.unlink(missing_ok=True)
        raise BuildError(f"download of {url} failed: {e}") from e
    if h.hexdigest() != sha256:
        part.unlink()
        raise BuildError(f"{url}: SHA-256 {h.hexdigest()} is not the expected {sha256}; "
                         "nothing kept")
    part.replace(dest)
    return dest


def fetch_verified(cache: Path, project: str, file_name: str, sha256: str) -> Path:
    """cache/file_name if its SHA-256 is `sha256`, else downloaded from the
    index (which must state the same SHA-256) and verified before it is kept."""
    path = cache / file_name
    if not path.exists():
        listed = index_files(project).get(file_name)
        if listed is None:
            raise BuildError(f"{INDEX_URL}/{project}/ does not list {file_name}")
        if listed.sha256 != sha256:
            raise BuildError(f"the index states SHA-256 {listed.sha256} for {file_name}, "
                             f"the pin {sha256}: fix patches/hosts.toml")
        download(listed.url, path, sha256)
    actual = sha256_of(path)
    if actual != sha256:
        raise BuildError(f"{path}: SHA-256 {actual} does not match the pin's {sha256}; "
                         "delete the file to download it again, or fix patches/hosts.toml")
    return path


def release_file(project: str, version: str, pattern: str) -> IndexFile:
    """The index's file of `project` `version` whose name matches `pattern`
    (a regex; {stem} and {version} are filled in). Of several (wheels for
    other platforms), the smallest name wins: any carries the same Python."""
    stem = re.sub(r"[-_.]+", "_", project).lower()
    want = re.compile(pattern.format(stem=re.escape(stem), version=re.escape(version)))
    files = index_files(project)
    found = sorted(name for name in files if want.fullmatch(name))
    if not found:
        raise BuildError(f"{INDEX_URL}/{project}/ lists no file of version {version} "
                         f"matching {want.pattern}")
    return files[found[0]]


def fetch_sdist(pin: Pin, cache: Path) -> Path:
    return fetch_verified(cache / "sdist", HOST_DIST, pin.sdist, pin.sha256)


def fetch_vllm_source(pin: Pin, cache: Path) -> Path:
    """The vLLM wheel whose Python sources the ABI check reads for this pin."""
    project = pin.vllm_source_requirement.partition("==")[0]
    return fetch_verified(cache / "vllm-wheel", project, pin.vllm_source, pin.vllm_source_sha256)


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


def unpack(source: Path, dest: Path, track: Iterable[str] | None = None,
           only_tracked: bool = False) -> Path:
    """Unpack an sdist (or copy a source dir) to dest. With `track` (the
    paths the patches touch), commit those as the pristine host in a scratch
    git repo (re-targeting needs one for 3-way merges and to re-diff the
    patches); `only_tracked` unpacks just them and HOST_METADATA. Returns dest."""
    track = None if track is None else set(track)
    wanted = track | set(HOST_METADATA) if only_tracked and track is not None else None
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


def apply_patch(tree: Path, patch: Path) -> None:
    """Apply one patch, all hunks or none; PatchError names the first hunk
    that does not apply (the tree is left as before)."""
    run = git(tree, "apply", "--whitespace=nowarn", str(patch), check=False)
    if run.returncode:
        raise PatchError(patch, failing_hunks(tree, patch), run.stderr + run.stdout)


def apply_series(tree: Path, patches: list[Path]) -> None:
    for patch in patches:
        apply_patch(tree, patch)


# ----------------------------------------------------------------- overlay
# Per host: which overlay files it gets and which classes routing selects
# (patches/vllm-ascend/<version>/overlay.toml), shipped in the tree where
# vllm_ascend/vspec/routing.py and the contract check read it.
HOST_SELECTION = "overlay.toml"
HOST_SELECTION_IN_TREE = "vllm_ascend/vspec/host.toml"


def host_selection(patch_dir: Path | None) -> dict:
    """The host's overlay.toml ({} when it has none)."""
    path = None if patch_dir is None else patch_dir / HOST_SELECTION
    return tomllib.loads(path.read_text()) if path is not None and path.is_file() else {}


def overlay_files(overlay_root: Path = ROOT / "overlay",
                  patch_dir: Path | None = None) -> list[tuple[Path, str]]:
    """(source file, path inside the tree) for every overlay file a host
    gets, sorted: all of them, less its overlay.toml's `exclude`, plus that
    file itself as vllm_ascend/vspec/host.toml (with `patch_dir`)."""
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
    selection = host_selection(patch_dir)
    exclude = set(selection.get("exclude", []))
    unknown = exclude - {rel for _, rel in out}
    if unknown:
        raise BuildError(f"{patch_dir / HOST_SELECTION}: exclude names {sorted(unknown)}, "
                         "which are not overlay files")
    out = [(src, rel) for src, rel in out if rel not in exclude]
    if selection:
        out.append((patch_dir / HOST_SELECTION, HOST_SELECTION_IN_TREE))
    return sorted(out, key=lambda pr: pr[1])


def copy_overlay(tree: Path, patch_dir: Path | None = None) -> list[str]:
    """Copy the overlay a host gets (its patch dir's overlay.toml) into the
    tree; refuse to overwrite a host file."""
    copied = []
    for src, rel in overlay_files(patch_dir=patch_dir):
        dst = tree / rel
        if dst.exists():
            raise BuildError(f"overlay/{rel} would overwrite the host's {rel}; "
                             "change host files through a patch in patches/vllm-ascend/")
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dst)
        copied.append(rel)
    return copied


