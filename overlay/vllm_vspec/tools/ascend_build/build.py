"""`make wheel`: the pinned vLLM-Ascend sdist -> patched tree -> ONE wheel.

Stages (each prints one progress line):
  fetch    the pinned sdist into .cache/sdist/, SHA-256 verified (common.py)
  unpack   into build/vllm-ascend-<version>/tree
  patch    patches/vllm-ascend/<version>/series, in order; the first failure
           stops the build naming the patch file and the hunk
  overlay  overlay/vllm_ascend/ and overlay/vllm_vspec/ copied in (new files
           only: a host file changes through a patch, never by overwrite)
  kernels  with CANN: csrc/ (vspec's ops) compiled; without: said so
  host     vLLM-Ascend's setup.py builds the patched tree; with CANN it also
           compiles the host's own ops (vllm_ascend_C)
  assemble ONE wheel, dist/vllm_ascend-<host>+vspec<ours>-<tag>.whl (without
           CANN: <host>+vspec<ours>.nocann): the same
           distribution as stock vLLM-Ascend (pip replaces one with the other
           and uninstalls it cleanly), its files plus ours, our entry points,
           dist-info/vspec_build_info.json; platform-tagged when it carries
           compiled libraries. Same inputs, same bytes: sorted entries, fixed
           mtimes and modes (SOURCE_DATE_EPOCH, default 1980-01-02).
"""

from __future__ import annotations

import base64
import configparser
import email.parser
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import tomllib
import zipfile
from pathlib import Path

from vllm_vspec.hosts.ascend_wheel import NO_CANN_LABEL
from vllm_vspec.tools.ascend_build.common import (DEFAULT_EPOCH, HOST_DIST, OVERLAY_DIRS, ROOT, BuildError, Pin,
                                 Progress, apply_series, copy_overlay, fetch_sdist, host_version,
                                 load_pins, read_series, sha256_of, unpack)

BUILD_INFO = "vspec_build_info.json"
# Host requirements that only build the host (its setup.py, type stubs), not
# run it: in Requires-Dist they would make every install pull a toolchain.
BUILD_ONLY = frozenset({"cmake", "pybind11", "setuptools", "setuptools-scm", "wheel", "pip",
                        "pandas-stubs"})
# Where a run-time requirement comes from when the public index lacks the
# pinned version (the pin's `off_index`); vLLM-Ascend's own Dockerfile
# installs triton-ascend from this index.
OFF_INDEX_SOURCES = {"triton-ascend": "https://mirrors.huaweicloud.com/ascend/repos/pypi"}


# ----------------------------------------------------------------- kernels
# Where a CANN install keeps AscendC's cmake files, in the order vLLM-Ascend
# 0.23.0.post1's own CMakeLists.txt probes them (the first two
# are ascendc_kernel_cmake of the toolkit, the third CANN 9.x's devkit
# layout). The host's kernel build fails without one of them.
ASCENDC_CMAKE_DIRS = ("tools/tikcpp/ascendc_kernel_cmake",
                      "compiler/tikcpp/ascendc_kernel_cmake",
                      "ascendc_devkit/tikcpp/samples/cmake")


def ascendc_cmake_dir(home: Path) -> Path | None:
    """The AscendC cmake directory of a CANN install, as the host finds it."""
    return next((home / d for d in ASCENDC_CMAKE_DIRS if (home / d).exists()), None)


def cann_home() -> Path | None:
    """The CANN toolkit, if installed: what vLLM-Ascend's kernel build needs.
    A candidate counts when any layout the host's CMakeLists.txt accepts is
    in it (ASCENDC_CMAKE_DIRS)."""
    candidates = [os.environ.get("ASCEND_HOME_PATH"), os.environ.get("ASCEND_TOOLKIT_HOME"),
                  "/usr/local/Ascend/ascend-toolkit/latest"]
    for c in candidates:
        if c and ascendc_cmake_dir(Path(c)) is not None:
            return Path(c)
    return None


def build_kernels(tree: Path, cann: Path, pin: Pin, work: Path) -> list[str]:
    """Compile csrc/ (AscendC kernels + the CPU twin ops) into
    tree/vllm_ascend/vspec/lib/. Only called when CANN is present: built
    code, not yet run (no CANN where this project is tested)."""
    out = tree / "vllm_ascend" / "vspec" / "lib"
    build = work / "csrc-build"
    cmake = ["cmake", "-S", str(ROOT / "csrc"), "-B", str(build),
             f"-DASCEND_HOME_PATH={cann}", f"-DASCENDC_CMAKE_DIR={ascendc_cmake_dir(cann)}",
             f"-DSOC_VERSION={soc_version(pin)}",
             f"-DVSPEC_OUTPUT_DIR={out}", f"-DPython3_EXECUTABLE={sys.executable}"]
    for cmd in (cmake, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 1)]):
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode:
            raise BuildError(f"{' '.join(cmd[:3])} failed:\n{run.stdout[-4000:]}{run.stderr[-4000:]}")
    return sorted(p.relative_to(tree).as_posix() for p in out.glob("*.so"))


def soc_version(pin: Pin) -> str:
    return os.environ.get("SOC_VERSION", pin.soc_version)


# -------------------------------------------------------------------- host
def build_host_wheel(tree: Path, pin: Pin, cann: Path | None, epoch: int, out: Path) -> Path:
    """vLLM-Ascend's own setup.py builds the patched tree (its package list,
    package data and entry points stay the host's business); with CANN it
    compiles the host's own ops too (COMPILE_CUSTOM_KERNELS=1)."""
    shutil.rmtree(out, ignore_errors=True)
    # setuptools_scm would take a version from whatever git repository encloses
    # the tree (build/ sits inside our checkout): give it the pinned one.
    env = dict(os.environ, SOC_VERSION=soc_version(pin), SOURCE_DATE_EPOCH=str(epoch),
               COMPILE_CUSTOM_KERNELS="1" if cann else "0",
               SETUPTOOLS_SCM_PRETEND_VERSION=pin.version)
    if cann:  # the host's setup.py and CANN's cmake files read it from the environment
        env["ASCEND_HOME_PATH"] = str(cann)
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


def our_version() -> str:
    """vllm_vspec.__version__, the one version (pyproject reads it too)."""
    from release_check import source_version

    return source_version(ROOT)


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


def wheel_version(pin: Pin, cann: bool) -> str:
    """The host's version with a local label: pip sees the same distribution
    as stock vLLM-Ascend, one release later (PEP 440: 0.23.0.post1+vspec0.1.0
    sorts after 0.23.0.post1), and `vllm-ascend==0.23.0.post1` still matches.
    Built without CANN, the label ends `.nocann` (ascend_wheel.NO_CANN_LABEL)."""
    label = f"vspec{our_version()}" + ("" if cann else f".{NO_CANN_LABEL}")
    return f"{pin.version}+{label}"


def requirement_name(req: str) -> str:
    """The normalised project name of a requirement line (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1)).lower()


def runtime_requirements(host_requires: list[str], pin: Pin) -> tuple[list[str], list[str]]:
    """(Requires-Dist of ours, requirements left to the user): the host's
    list without its build tools, and without what the public index lacks."""
    kept, external = [], []
    for req in host_requires:
        name = requirement_name(req)
        if name in pin.off_index:
            external.append(req)
        elif name not in BUILD_ONLY:
            kept.append(req)
    return kept, external


def kernels_statement(info: dict) -> str:
    """One sentence on the compiled ops: the wheel's METADATA, `vllm-vspec
    doctor` and the server's start-up log all print this (vllm_vspec.hosts.ascend_wheel)."""
    k = info["custom_kernels"]
    if k["enabled"]:
        vspec = (", ".join(k["vspec_libraries"]) if k["vspec_libraries"] else
                 "not built, vspec's torch implementation runs")
        return (f"host kernels compiled with CANN: {', '.join(k['host_libraries'])}; "
                f"vspec ops: {vspec}")
    return ("host kernels missing: built without CANN, so this wheel has neither "
            "vLLM-Ascend's vllm_ascend_C ops nor vspec's compiled ops (Python only; vspec "
            "runs its torch implementation); rebuild with ASCEND_HOME_PATH set for them")


def metadata(host_meta: str, pin: Pin, version: str, info: dict) -> str:
    """Our METADATA: the host's name, our version, the host's run-time needs."""
    msg = email.parser.Parser().parsestr(host_meta)
    kept, external = runtime_requirements(msg.get_all("Requires-Dist") or [], pin)
    kernels = kernels_statement(info)
    lines = ["Metadata-Version: 2.1", f"Name: {HOST_DIST}", f"Version: {version}",
             f"Summary: vLLM-Ascend {pin.version} with vSpec Adaptive (dynamic-gamma "
             f"speculative decoding) overlaid; {kernels.split(':')[0]}",
             "License: Apache-2.0", f"Requires-Python: {msg['Requires-Python'] or '>=3.10'}"]
    lines += [f"Requires-Dist: {r}" for r in kept]
    body = [f"vLLM-Ascend {pin.version} (patched: patches/vllm-ascend/{pin.version}) with "
            "`vllm_vspec`. It replaces a stock `vllm-ascend` install (same distribution); "
            f"`pip install --force-reinstall vllm-ascend=={pin.version}` rolls back.", "",
            kernels + "."]
    if external:
        body += ["", "Install these yourself; the public index lacks the pinned version:"]
        body += [f"- `{r}` from {OFF_INDEX_SOURCES.get(requirement_name(r), 'the Ascend index')}"
                 for r in external]
    return ("\n".join(lines) + "\nDescription-Content-Type: text/markdown\n\n"
            + "\n".join(body) + "\n")


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


def platform_tag() -> str:
    """This interpreter and machine, for a wheel carrying compiled libraries."""
    py = f"cp{sys.version_info.major}{sys.version_info.minor}"
    return f"{py}-{py}-{re.sub(r'[-.]', '_', sysconfig.get_platform())}"


def assemble(host_wheel: Path, tree: Path, overlay: list[str], pin: Pin, build_info: dict,
             epoch: int, dist: Path) -> Path:
    """Repack the host wheel as ours: host files minus its dist-info, the
    overlay files as they are in the tree, our dist-info."""
    dist_name = HOST_DIST.replace("-", "_")
    version = wheel_version(pin, build_info["custom_kernels"]["enabled"])
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
                    files[f"{dist_name}-{version}.dist-info/{leaf}"] = zf.read(name)
            elif not name.endswith("/"):
                files[name] = zf.read(name)
    for rel in overlay:
        files[rel] = (tree / rel).read_bytes()
    for rel in build_info["custom_kernels"]["vspec_libraries"]:
        files[rel] = (tree / rel).read_bytes()
    file_tag = host_wheel.name[:-len(".whl")].split("-", 2)[2]
    if any(n.endswith(".so") for n in files) and tags == ["py3-none-any"]:
        # Compiled code (vspec's ops on a host built without its own) is never py3-none-any.
        file_tag, purelib = platform_tag(), "false"
        tags = [file_tag]
    di = f"{dist_name}-{version}.dist-info"
    files[f"{di}/METADATA"] = metadata(host_meta, pin, version, build_info).encode()
    files[f"{di}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: build_overlay.py\n"
                            f"Root-Is-Purelib: {purelib}\n"
                            + "".join(f"Tag: {t}\n" for t in tags)).encode()
    files[f"{di}/entry_points.txt"] = merge_entry_points(host_eps, our_entry_points()).encode()
    files[f"{di}/top_level.txt"] = "".join(f"{t}\n" for t in OVERLAY_DIRS).encode()
    files[f"{di}/{BUILD_INFO}"] = (json.dumps(build_info, indent=2, sort_keys=True) + "\n").encode()
    out = dist / f"{dist_name}-{version}-{file_tag}.whl"
    write_wheel(out, files, epoch)
    return out


# ------------------------------------------------------------------- build
BUILD_STAGES = ("fetch", "unpack", "patch", "overlay", "kernels", "host", "assemble")


def build(host_src: Path | None, cache: Path, work: Path, dist: Path,
          version: str | None = None) -> Path:
    """The whole build of a pin (`version`; default: the default pin); returns
    the wheel path."""
    progress = Progress(BUILD_STAGES)
    cache, work, dist = cache.resolve(), work.resolve(), dist.resolve()
    default, pins = load_pins()
    if version is not None and version not in pins:
        raise BuildError(f"HOST={version!r} is not pinned in patches/hosts.toml (pinned: "
                         f"{', '.join(sorted(pins))}); `make overlay HOST={version}` pins it")
    pin = pins[version or default]
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
    copied = copy_overlay(tree, pin.patch_dir)
    progress("overlay", f"{len(copied)} files from overlay/{{{','.join(OVERLAY_DIRS)}}}")
    wheel = wheel_from_tree(tree, pin, patches, copied, origin, base, dist, progress)
    progress("assemble", f"{wheel} sha256 {sha256_of(wheel)[:16]}...")
    return wheel


def wheel_from_tree(tree: Path, pin: Pin, patches: list[Path], copied: list[str], origin: dict,
                    base: Path, dist: Path, progress=lambda stage, detail: None) -> Path:
    """Stages kernels, host and assemble, on a patched tree with the overlay in."""
    epoch = int(os.environ.get("SOURCE_DATE_EPOCH", DEFAULT_EPOCH))
    cann = cann_home()
    libs, vspec_failure = [], None
    if cann:
        # vspec's kernels are optional: a failed build leaves the torch
        # implementation (kernels/ops.py) and never touches the host's own
        # kernel build below, which runs with COMPILE_CUSTOM_KERNELS=1 either way.
        try:
            libs = build_kernels(tree, cann, pin, base)
        except BuildError as exc:
            vspec_failure = str(exc).splitlines()[0]
        if not libs and vspec_failure is None:
            vspec_failure = "the build produced no library"
    reason = (f"compiled with CANN ({cann})" if cann else
              "CANN not found (set ASCEND_HOME_PATH): custom kernels off, Python-only wheel")
    if vspec_failure:
        reason += f"; vspec's kernels not built ({vspec_failure}): its torch ops run"
    progress("kernels", reason)
    host_wheel = build_host_wheel(tree, pin, cann, epoch, base / "host-wheel")
    with zipfile.ZipFile(host_wheel) as zf:
        host_libs = sorted(n for n in zf.namelist() if n.endswith(".so"))
    if cann and not host_libs:
        raise BuildError(f"CANN is at {cann} but vLLM-Ascend's build yielded no library "
                         "(vllm_ascend_C); a wheel built with CANN must hold the host's kernels")
    progress("host", host_wheel.name)
    build_info = {
        "vspec_version": our_version(),
        "host": {"name": HOST_DIST, "version": pin.version, **origin},
        "host_expects": {k: getattr(pin, k) for k in ("vllm", "torch", "torch_npu",
                                                     "triton_ascend", "cann")},
        "soc_version": soc_version(pin),
        "patches": [{"name": p.name, "sha256": sha256_of(p)} for p in patches],
        "custom_kernels": {"enabled": bool(cann), "reason": reason,
                           "host_libraries": host_libs, "vspec_libraries": libs},
        "source_date_epoch": epoch,
    }
    build_info["kernels_statement"] = kernels_statement(build_info)
    return assemble(host_wheel, tree, copied, pin, build_info, epoch, dist)


# ---------------------------------------------------------- tree checks
def byte_compile(tree: Path) -> list[str]:
    """`file:line: message` for every .py of the packages the wheel ships
    that does not compile (empty: all do). Compiles in memory; writes nothing."""
    failures = []
    for top in OVERLAY_DIRS:
        for path in sorted((tree / top).rglob("*.py")):
            try:
                compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
            except SyntaxError as e:
                failures.append(f"{path.relative_to(tree)}:{e.lineno}: {e.msg}")
    return failures


def abi_report(tree: Path, vllm_source: Path):
    """The ABI check (vllm_vspec.tools.abi_check) of a patched tree with the overlay
    in, against the vLLM sources (a wheel or directory) its pin runs on."""
    from vllm_vspec.tools.abi_check import check_host

    ascend = tree / "vllm_ascend"
    return check_host(f"vllm-ascend ({tree}) on {vllm_source.name}",
                      {"vllm_ascend": ascend, "vllm_ascend.vspec": ascend / "vspec",
                       "vllm": vllm_source, "vllm_vspec": tree / "vllm_vspec"})
