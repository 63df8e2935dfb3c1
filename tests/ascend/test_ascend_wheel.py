"""The Ascend overlay wheel, built from the real pinned vLLM-Ascend sdist:
its contents, its identity as an install (it replaces stock vLLM-Ascend and
rolls back), what it says about kernels without CANN, and the ABI check of
its patched tree (with a mutation test per class of host drift).

The sdist and the vLLM 0.23.0 wheel the ABI check reads are downloaded once
into .cache/ and reused. Nothing here needs an NPU: the NPU code is checked by
byte-compiling the patched tree and by the ABI check against its sources.
"""

from __future__ import annotations

import base64
import configparser
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from vllm_vspec.tools.ascend_build import build as ab  # noqa: E402
from vllm_vspec.tools.ascend_build import common  # noqa: E402
from vllm_vspec.tools import abi_check  # noqa: E402
from vllm_vspec.hosts import ascend_wheel
from vllm_vspec import cli
from vllm_vspec.commands import doctor

CACHE = REPO / ".cache"


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, patched tree) of one full build."""
    work = tmp_path_factory.mktemp("work")
    wheel = ab.build(None, CACHE, work, tmp_path_factory.mktemp("dist"))
    (tree,) = work.glob("vllm-ascend-*/tree")
    return wheel, tree


@pytest.fixture(scope="module")
def members(built) -> dict[str, bytes]:
    with zipfile.ZipFile(built[0]) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def dist_info(members: dict[str, bytes], leaf: str) -> str:
    (name,) = [n for n in members if n.endswith(f".dist-info/{leaf}")]
    return members[name].decode()


def version(pin) -> str:
    """The version of a wheel built here, without CANN (`.nocann`)."""
    return f"{pin.version}+vspec{ab.our_version()}.nocann"


def requires(meta: str) -> dict[str, str]:
    """Requires-Dist of a METADATA text: normalised name -> requirement."""
    lines = re.findall(r"(?m)^Requires-Dist: (.+)$", meta)
    return {ab.requirement_name(r): r for r in lines}


# ------------------------------------------------------------------ contents
def test_one_wheel_named_as_vllm_ascend_with_a_vspec_local_version(built, pin):
    assert built[0].name == f"vllm_ascend-{version(pin)}-py3-none-any.whl"
    assert [p.name for p in built[0].parent.iterdir()] == [built[0].name]


def test_the_local_version_says_nocann_without_cann_and_nothing_with_it(built, pin, tmp_path):
    """Built without CANN (every build here), the local label ends `.nocann`,
    in the wheel's file name and in the METADATA `pip show` prints; a wheel
    assembled as CANN builds it (custom kernels enabled) has no such segment.
    Either version still matches `vllm-ascend==<host>` (PEP 440 ignores the
    local label there)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    with zipfile.ZipFile(built[0]) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith("/METADATA"))).decode()
    assert f"+vspec{ab.our_version()}.nocann-" in built[0].name
    assert f"Version: {version(pin)}\n" in meta
    assert Version(version(pin)).local.split(".")[-1] == ascend_wheel.NO_CANN_LABEL

    (host_wheel,) = built[1].parent.glob("host-wheel/*.whl")
    info = {"custom_kernels": {"enabled": True, "reason": "test", "host_libraries": [],
                               "vspec_libraries": []}, "kernels_statement": "test"}
    with_cann = ab.assemble(host_wheel, tmp_path, [], pin, info, common.DEFAULT_EPOCH,
                            tmp_path / "dist")
    cann_version = f"{pin.version}+vspec{ab.our_version()}"
    assert with_cann.name == f"vllm_ascend-{cann_version}-py3-none-any.whl"
    assert "nocann" not in with_cann.name
    assert all(Version(v) in SpecifierSet(f"=={pin.version}")
               for v in (version(pin), cann_version))


def test_wheel_holds_the_patched_host_and_every_overlay_file(members, pin):
    platform = members["vllm_ascend/platform.py"].decode()
    assert "scheduler_cls_for(vllm_config)" in platform  # patch 0002
    assert "proposer_cls_for" in members["vllm_ascend/spec_decode/__init__.py"].decode()
    assert "vllm_ascend/worker/model_runner_v1.py" in members
    for src, rel in common.overlay_files(patch_dir=pin.patch_dir):
        assert rel in members, rel
    # The host's overlay selection: 0.23 routes proposers.py's classes and
    # does not get the module for hosts with a native per-step K.
    assert members["vllm_ascend/vspec/host.toml"] == (pin.patch_dir / "overlay.toml").read_bytes()
    assert "vllm_ascend/vspec/native_gamma.py" not in members
    assert members["vllm_ascend/vspec/proposers.py"] == \
        (REPO / "overlay/vllm_ascend/vspec/proposers.py").read_bytes()
    # The presets, through the package's link to configs/ (`vllm-vspec serve --preset`).
    assert members["vllm_vspec/_configs/draft.toml"] == (REPO / "configs/draft.toml").read_bytes()
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]


def test_record_lists_every_file_with_its_hash(members):
    listed = {}
    for line in dist_info(members, "RECORD").splitlines():
        name, digest, size = line.rsplit(",", 2)
        listed[name] = (digest, size)
    assert set(listed) == set(members)
    for name, data in members.items():
        if name.endswith("/RECORD"):
            continue
        want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert listed[name] == (f"sha256={want}", str(len(data))), name


def test_entry_points_keep_the_hosts_and_add_ours(members):
    eps = configparser.ConfigParser(delimiters=("=",))
    eps.optionxform = str
    eps.read_string(dist_info(members, "entry_points.txt"))
    assert eps["vllm.platform_plugins"]["ascend"] == "vllm_ascend:register"
    general = dict(eps["vllm.general_plugins"])
    assert general["ascend_model"] == "vllm_ascend:register_model"
    assert general["ascend_kv_connector"] == "vllm_ascend:register_connector"
    assert general["vspec"] == "vllm_vspec:register"
    assert eps["console_scripts"]["vllm-vspec"] == "vllm_vspec.cli:main"


def test_metadata_is_vllm_ascend_with_its_run_time_needs_only(members, pin):
    meta = dist_info(members, "METADATA")
    assert "Name: vllm-ascend\n" in meta
    assert f"Version: {version(pin)}\n" in meta
    reqs = requires(meta)
    assert reqs["torch-npu"] == f"torch-npu=={pin.torch_npu}"
    assert reqs["torch"] == f"torch=={pin.torch}"
    assert set(reqs) & ab.BUILD_ONLY == set()  # no cmake, pybind11, setuptools-scm, wheel, ...
    assert "triton-ascend" not in reqs  # 3.2.2 is not on the public index
    assert f"`triton-ascend=={pin.triton_ascend}` from " \
        "https://mirrors.huaweicloud.com/ascend/repos/pypi" in meta
    assert dist_info(members, "top_level.txt").split() == ["vllm_ascend", "vllm_vspec"]


def test_every_requirement_resolves_on_the_public_index(members, pin):
    """What `pip install` of the wheel will ask PyPI for exists there, and
    what it leaves out for that reason (the pin's off_index) does not."""
    assert pin.off_index == ("triton-ascend",)
    assert pin.triton_ascend not in common.index_page("triton-ascend")["versions"]
    missing = []
    for name, req in sorted(requires(dist_info(members, "METADATA")).items()):
        m = re.fullmatch(r"[A-Za-z0-9._-]+\s*==\s*(\S+)", req)
        versions = common.index_page(name).get("versions", [])
        if not versions or (m and m.group(1) not in versions):
            missing.append(req)
    assert missing == []


def test_without_cann_metadata_and_build_info_say_host_kernels_are_missing(built, members, pin):
    meta = dist_info(members, "METADATA")
    summary = re.search(r"(?m)^Summary: (.*)$", meta).group(1)
    assert summary.endswith("; host kernels missing")
    info = json.loads(dist_info(members, ab.BUILD_INFO))
    assert info["custom_kernels"] == {
        "enabled": False, "host_libraries": [], "vspec_libraries": [],
        "reason": "CANN not found (set ASCEND_HOME_PATH): custom kernels off, Python-only wheel"}
    assert info["kernels_statement"].startswith("host kernels missing: built without CANN")
    assert info["kernels_statement"] in meta
    assert not [n for n in members if n.endswith(".so")]
    assert "Tag: py3-none-any\n" in dist_info(members, "WHEEL")


def test_doctor_prints_the_wheels_kernel_statement(built, members, monkeypatch, capsys):
    info = json.loads(dist_info(members, ab.BUILD_INFO))
    monkeypatch.setattr(ascend_wheel, "build_info", lambda: info)
    assert doctor.summary([], {})["ascend_build"] == info  # what --json prints
    cli.main(["doctor"])
    out = capsys.readouterr().out
    assert re.search(r"(?m)^  kernels +host kernels missing: built without CANN", out), out


def test_the_start_up_log_warns_that_host_kernels_are_missing(members, monkeypatch):
    """What every vLLM process logs at start-up (a vllm_vspec plugin registration)."""
    import logging

    from vllm_vspec.hosts.vllm import plugin as vllm_plugin

    assert ascend_wheel.log_kernel_state in vllm_plugin.REGISTRATIONS
    info = json.loads(dist_info(members, ab.BUILD_INFO))
    monkeypatch.setattr(ascend_wheel, "build_info", lambda: info)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("vllm.vllm_vspec.hosts.ascend_wheel")
    logger.addHandler(handler)
    try:
        ascend_wheel.log_kernel_state()
    finally:
        logger.removeHandler(handler)
    (record,) = records
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (f"vspec Ascend wheel (vllm-ascend {info['host']['version']}): "
                                   f"{info['kernels_statement']}")
    assert "host kernels missing" in record.getMessage()


def test_a_wheel_carrying_compiled_libraries_is_platform_tagged(built, pin, tmp_path):
    """The CANN path's tagging rule, on a stand-in library (no CANN here)."""
    (host_wheel,) = built[1].parent.glob("host-wheel/*.whl")
    lib = "vllm_ascend/vspec/lib/libvspec_ops.so"
    (tmp_path / lib).parent.mkdir(parents=True)
    (tmp_path / lib).write_bytes(b"\x7fELF stand-in")
    info = {"custom_kernels": {"enabled": True, "reason": "test", "host_libraries": [],
                               "vspec_libraries": [lib]}, "kernels_statement": "test"}
    wheel = ab.assemble(host_wheel, tmp_path, [], pin, info, common.DEFAULT_EPOCH, tmp_path / "d")
    assert wheel.name.endswith(f"-{ab.platform_tag()}.whl")
    with zipfile.ZipFile(wheel) as zf:
        wheel_meta = zf.read(next(n for n in zf.namelist() if n.endswith("/WHEEL"))).decode()
        assert lib in zf.namelist()
    assert "Root-Is-Purelib: false\n" in wheel_meta
    assert f"Tag: {ab.platform_tag()}\n" in wheel_meta


def test_a_rebuild_shows_each_stage_and_gives_the_same_bytes(built, tmp_path, capfd):
    again = ab.build(None, CACHE, tmp_path / "work", tmp_path / "dist")
    stages = [line.split()[:2] for line in capfd.readouterr().err.splitlines()
              if line.startswith("[")]
    assert stages == [[f"[{i}/7]", s] for i, s in enumerate(ab.BUILD_STAGES, 1)]
    assert again.name == built[0].name
    assert common.sha256_of(again) == common.sha256_of(built[0])


def test_entries_are_sorted_with_one_date_and_modes_from_content(built, members):
    with zipfile.ZipFile(built[0]) as zf:
        infos = zf.infolist()
    assert [i.filename for i in infos[:-1]] == sorted(i.filename for i in infos[:-1])
    assert infos[-1].filename.endswith(".dist-info/RECORD")
    assert {i.date_time for i in infos} == {(1980, 1, 2, 0, 0, 0)}
    for i in infos:  # executable exactly when it is a script
        want = 0o100755 if members[i.filename].startswith(b"#!") else 0o100644
        assert i.external_attr >> 16 == want, i.filename


def test_the_whole_patched_tree_byte_compiles(built, members):
    tree = built[1]
    assert ab.byte_compile(tree) == []
    compiled = {p.relative_to(tree).as_posix() for top in ("vllm_ascend", "vllm_vspec")
                for p in (tree / top).rglob("*.py")}
    assert {n for n in members if n.endswith(".py")} <= compiled  # all of the wheel


# ------------------------------------------------------------- install identity
def pip(python: Path, *args: str) -> str:
    run = subprocess.run([sys.executable, "-m", "pip", "--python", str(python),
                          "--disable-pip-version-check", *args], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


def installed(venv: Path) -> set[str]:
    """Top-level entries of the scratch venv's site-packages."""
    (site,) = venv.glob("lib/python*/site-packages")
    return {p.name for p in site.iterdir()} - {"__pycache__"}


def stock_wheel(pin: common.Pin) -> Path:
    """vLLM-Ascend's own Python-only wheel of the pinned sdist, unpatched;
    kept in .cache/ (keyed by the sdist's SHA-256) like the downloads."""
    out = CACHE / "stock-wheel" / pin.sha256[:16]
    found = sorted(out.glob("*.whl"))
    if found:
        return found[0]
    work = CACHE / "stock-wheel" / "work"
    tree = common.unpack(common.fetch_sdist(pin, CACHE), work / "tree")
    wheel = ab.build_host_wheel(tree, pin, None, common.DEFAULT_EPOCH, work / "whl")
    out.mkdir(parents=True, exist_ok=True)
    kept = Path(shutil.move(wheel, out / wheel.name))
    shutil.rmtree(work)
    return kept


def test_the_wheel_replaces_stock_vllm_ascend_and_rolls_back(built, pin, tmp_path):
    """Stock vLLM-Ascend (its Python-only wheel, built from the same pinned
    sdist) in a scratch venv; ours installed over it, then the stock wheel
    reinstalled (rollback), then ours uninstalled. `--no-deps`: the NPU stack
    does not install here."""
    stock = stock_wheel(pin)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    ours_dist_info = f"vllm_ascend-{version(pin)}.dist-info"

    pip(python, "install", "--no-deps", "--no-compile", "--quiet", str(stock))
    assert installed(venv) == {"vllm_ascend", f"vllm_ascend-{pin.version}.dist-info"}

    out = pip(python, "install", "--no-deps", "--no-compile", str(built[0]))
    assert f"Successfully uninstalled vllm_ascend-{pin.version}" in out  # replaced, not beside
    assert installed(venv) == {"vllm_ascend", "vllm_vspec", ours_dist_info}
    show = pip(python, "show", "vllm-ascend")
    assert f"Version: {version(pin)}\n" in show
    assert "host kernels missing" in show
    (site,) = venv.glob("lib/python*/site-packages")
    assert (site / "vllm_ascend/vspec/proposers.py").is_file()
    assert (venv / "bin" / "vllm-vspec").is_file()

    pip(python, "install", "--no-deps", "--no-compile", "--force-reinstall", "--quiet", str(stock))  # rollback
    assert installed(venv) == {"vllm_ascend", f"vllm_ascend-{pin.version}.dist-info"}
    assert not (site / "vllm_ascend/vspec").exists()
    assert not (venv / "bin" / "vllm-vspec").exists()
    assert f"Version: {pin.version}\n" in pip(python, "show", "vllm-ascend")

    pip(python, "install", "--no-deps", "--no-compile", "--quiet", str(built[0]))
    pip(python, "uninstall", "--yes", "vllm-ascend")
    assert installed(venv) == set()  # nothing of either left behind
    assert not (venv / "bin" / "vllm-vspec").exists()


# ------------------------------------------------------------------- ABI check
@pytest.fixture(scope="module")
def vllm_023(pin) -> Path:
    return common.fetch_vllm_source(pin, CACHE)


def test_abi_check_passes_against_the_patched_tree(built, vllm_023):
    report = ab.abi_report(built[1], vllm_023)
    assert report.findings == [], "\n".join(f.line() for f in report.findings)
    eagle = report.classes["vllm_ascend.vspec.proposers.VSpecEagleProposer"]
    assert eagle == ["vllm_ascend.spec_decode.eagle_proposer.AscendEagleProposer",
                     "vllm.v1.spec_decode.eagle.EagleProposer",
                     "vllm_ascend.spec_decode.llm_base_proposer.AscendSpecDecodeBaseProposer",
                     "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"]
    assert "vllm_ascend.vspec.sampler.VSpecAscendRejectionSampler" in report.classes
    # eagle3 and mtp are routed; the host's step3p5 MTP proposer is left to the host
    fn = abi_check.Sources({"vllm_ascend": built[1] / "vllm_ascend"}).module(
        "vllm_ascend.spec_decode")
    tests = abi_check.factory_tests(next(n for n in fn.tree.body if getattr(
        n, "name", "") == "get_spec_decode_method"), fn)
    assert {t for methods, t, _ in tests if methods and "mtp" in methods} == \
        {"speculative_config.use_step3p5_mtp"}


# One mutation of the real host per class of drift: (host file, text, replacement,
# the (kind, member) finding it must produce, a phrase of its problem).
MUTATIONS = {
    "constructor parameter renamed": (
        "compilation/acl_graph.py", "        runtime_mode: CUDAGraphMode,\n",
        "        mode: CUDAGraphMode,\n",
        ("constructor", "vllm_ascend.compilation.acl_graph.ACLGraphWrapper"),
        "keyword 'runtime_mode' is not a host parameter"),
    "attribute of a host object gone": (
        "compilation/acl_graph.py", "        self.use_eagle = use_eagle\n", "",
        ("host object", "host.use_eagle"),
        "ACLGraphWrapper has no attribute 'use_eagle'"),
    "overridden method's parameter renamed": (
        "sample/rejection_sampler.py", "    def apply_logits_processors(\n        self,\n        logits",
        "    def apply_logits_processors(\n        self,\n        scores",
        ("override", "apply_logits_processors"),
        "positional #1 is 'logits' here, 'scores' in the host"),
    "called host method gains a required parameter": (
        "sample/rejection_sampler.py", "    def __init__(self, sampler):",
        "    def __init__(self, sampler, mode):",
        ("call", "__init__"), "required host parameters not passed: mode"),
    "host method called on self gone": (
        "spec_decode/llm_base_proposer.py", "    def _run_merged_draft(",
        "    def _run_merged_draft_v2(",
        ("call", "_run_merged_draft"), "no host class defines it"),
    # The 0.30 break, on the 0.23 tree: the host re-assigns an attribute our
    # property answers differently, every call, and reads it back.
    "host assigns a shadowed attribute every call": (
        "spec_decode/llm_base_proposer.py",
        "        num_rejected_tokens_gpu: torch.Tensor | None = None,\n    ) -> torch.Tensor:\n"
        "        batch_size = common_attn_metadata.batch_size()\n",
        "        num_rejected_tokens_gpu: torch.Tensor | None = None,\n    ) -> torch.Tensor:\n"
        "        batch_size = common_attn_metadata.batch_size()\n"
        "        self.num_speculative_tokens = scheduler_output.num_spec_tokens_to_schedule\n"
        "        if self.num_speculative_tokens == 0:\n            return None\n",
        ("contract", "num_speculative_tokens"),
        "AscendSpecDecodeBaseProposer._propose assigns self.num_speculative_tokens on every call"),
    # A new special case in the host's proposer factory for a routed method:
    # routing would replace the proposer the host builds for it.
    "host factory tests something new for a routed method": (
        "spec_decode/__init__.py", "and speculative_config.use_step3p5_mtp():",
        "and (speculative_config.use_step3p5_mtp() or is_glm_mtp(vllm_config)):",
        ("keep_host", "eagle3"),
        "tests is_glm_mtp before it builds a proposer for method eagle3"),
    "imported base class renamed": (
        "spec_decode/eagle_proposer.py", "class AscendEagleProposer(",
        "class AscendEagleDrafter(",
        ("base", "vllm_ascend.spec_decode.eagle_proposer.AscendEagleProposer"),
        "base class not found in this host"),
}


@pytest.mark.parametrize("drift", list(MUTATIONS))
def test_abi_check_catches_each_class_of_host_drift(drift, built, vllm_023, tmp_path):
    rel, old, new, (kind, member), problem = MUTATIONS[drift]
    ascend = tmp_path / "vllm_ascend"
    shutil.copytree(built[1] / "vllm_ascend", ascend)
    text = (ascend / rel).read_text()
    assert text.count(old) == 1, f"the mutation no longer matches {rel}"
    (ascend / rel).write_text(text.replace(old, new))

    report = abi_check.check_host("mutated", {"vllm_ascend": ascend,
                                              "vllm_ascend.vspec": ascend / "vspec",
                                              "vllm": vllm_023})

    hits = [f for f in report.findings if (f.kind, f.member) == (kind, member)]
    assert hits and any(problem in f.problem for f in hits), \
        "\n".join(f.line() for f in report.findings)
    assert all(f.ours.startswith(str(ascend / "vspec")) for f in hits)


# ------------------------------------------------------------------- patches
@pytest.fixture(scope="module")
def pristine(pin, tmp_path_factory) -> Path:
    """The pinned sdist's patched files, unpacked, untouched."""
    sdist = common.fetch_sdist(pin, CACHE)
    track = common.touched_paths(common.read_series(pin.patch_dir))
    return common.unpack(sdist, tmp_path_factory.mktemp("pristine") / "tree", track,
                         only_tracked=True)


def test_a_broken_patch_stops_the_series_naming_patch_and_hunk(pin, pristine, tmp_path):
    patches = tmp_path / "patches"
    shutil.copytree(pin.patch_dir, patches)
    broken = patches / "0002-select-vspec-scheduler.patch"
    text = broken.read_text()
    context = "             import vllm_ascend.patch.platform.patch_profiling_chunk  # noqa\n"
    assert context in text
    broken.write_text(text.replace(context, context.replace("profiling_chunk", "renamed_chunk")))
    tree = tmp_path / "tree"
    shutil.copytree(pristine, tree, ignore=shutil.ignore_patterns(".git"))
    runner_before = (tree / "vllm_ascend/worker/model_runner_v1.py").read_bytes()

    with pytest.raises(common.PatchError) as err:
        common.apply_series(tree, common.read_series(patches))

    message = str(err.value)
    assert message.startswith("patch 0002-select-vspec-scheduler.patch does not apply: "
                              "hunk #1 of vllm_ascend/platform.py (@@ -724,6 +724,14 @@)"), message
    assert "proposer_cls_for" in (tree / "vllm_ascend/spec_decode/__init__.py").read_text()
    assert (tree / "vllm_ascend/worker/model_runner_v1.py").read_bytes() == runner_before


# ------------------------------------------------------- the second host pin
@pytest.fixture(scope="module")
def built_030(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, patched tree) of `make wheel HOST=0.30.0rc2`."""
    work = tmp_path_factory.mktemp("work030")
    wheel = ab.build(None, CACHE, work, tmp_path_factory.mktemp("dist030"), "0.30.0rc2")
    (tree,) = work.glob("vllm-ascend-*/tree")
    return wheel, tree


def test_make_wheel_host_builds_the_0_30_pin_with_its_own_overlay_selection(built_030):
    wheel, tree = built_030
    pin = common.load_pins()[1]["0.30.0rc2"]
    assert wheel.name == f"vllm_ascend-{version(pin)}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        host = zf.read("vllm_ascend/vspec/host.toml")
        (info_name,) = [n for n in names if n.endswith(f".dist-info/{ab.BUILD_INFO}")]
        info = json.loads(zf.read(info_name))
    assert host == (pin.patch_dir / "overlay.toml").read_bytes()
    assert "vllm_ascend/vspec/native_gamma.py" in names
    assert info["host"] == {"name": "vllm-ascend", "version": "0.30.0rc2",
                            "sdist": pin.sdist, "sha256": pin.sha256}
    assert [p["name"] for p in info["patches"]] == [p.name for p in common.read_series(pin.patch_dir)]
    assert info["host_expects"]["vllm"] == "0.30.0"
    # Its tree holds against vLLM 0.30's sources: ABI and contract check both.
    report = ab.abi_report(tree, common.fetch_vllm_source(pin, CACHE))
    assert report.findings == [], "\n".join(f.line() for f in report.findings)
    assert "vllm_ascend.vspec.native_gamma.VSpecNativeEagleProposer" in report.classes
    assert ab.byte_compile(tree) == []
    # mtp meets three host special cases there, each left to the host (keep_host)
    keep = tomllib.loads(host.decode())["routing"]["keep_host"]
    assert len(keep["mtp"]) == 3 and keep["eagle3"] == ["speculative_config.use_step3p5_mtp"]


def test_make_wheel_refuses_a_host_that_is_not_pinned(tmp_path):
    with pytest.raises(common.BuildError, match=r"HOST='0\.99\.0' is not pinned"):
        ab.build(None, CACHE, tmp_path / "work", tmp_path / "dist", "0.99.0")


def test_make_wheel_refuses_to_build_without_cann_unless_asked(tmp_path, monkeypatch, capsys):
    """Without CANN the wheel would have neither vLLM-Ascend's vllm_ascend_C
    ops nor vspec's compiled ops, and installing it still replaces stock
    vLLM-Ascend: build_overlay.py (make wheel) refuses with exit 2 naming the
    way to ask, builds when --without-cann asks (here it runs up to its first
    check, the pin), and needs no flag once CANN is found."""
    import build_overlay

    for name in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        monkeypatch.delenv(name, raising=False)
    if ab.cann_home() is not None:
        pytest.skip(f"CANN is installed here ({ab.cann_home()})")
    args = ["--cache", str(CACHE), "--work", str(tmp_path / "work"),
            "--dist", str(tmp_path / "dist"), "--host", "0.99.0"]
    assert build_overlay.main(args) == 2
    err = capsys.readouterr().err
    assert "CANN not found" in err and "vllm_ascend_C" in err
    assert "--without-cann" in err and "make wheel WITHOUT_CANN=1" in err
    assert not (tmp_path / "work").exists() and not (tmp_path / "dist").exists()

    assert build_overlay.main([*args, "--without-cann"]) == 1
    assert "HOST='0.99.0' is not pinned" in capsys.readouterr().err

    cann = tmp_path / "cann"
    (cann / ab.ASCENDC_CMAKE_DIRS[0]).mkdir(parents=True)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    assert build_overlay.main(args) == 1
    assert "is not pinned" in capsys.readouterr().err


def test_make_wheel_passes_without_cann_only_when_asked():
    dry = ["make", "-n", "-C", str(REPO), "wheel", "PROJECT_STAMP=Makefile"]
    plain = subprocess.run(dry, capture_output=True, text=True, check=True).stdout
    asked = subprocess.run([*dry, "WITHOUT_CANN=1"], capture_output=True, text=True,
                           check=True).stdout
    assert "build_overlay.py" in plain and "--without-cann" not in plain
    assert "build_overlay.py" in asked and "--without-cann" in asked
