"""The kernels stage of the Ascend wheel build, without CANN:
- CANN is found in any of the three layouts vLLM-Ascend 0.23.0.post1's own
  CMakeLists.txt probes (lines 42-50), in its order;
- with CANN the host's own kernels are always built (COMPILE_CUSTOM_KERNELS=1),
  and a vspec kernel build that fails or yields nothing leaves a wheel with
  the host's vllm_ascend_C and vspec's torch ops, saying so; a host build
  without its library is still an error.
The CANN toolkit and both compilers are stand-ins here (directories and
monkeypatched build steps); the real CANN build is not run (no CANN).
"""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest

from vllm_vspec.tools.ascend_build import build as ab
from vllm_vspec.tools.ascend_build import common



@pytest.mark.parametrize("layout", ab.ASCENDC_CMAKE_DIRS)
def test_cann_is_found_in_each_layout_the_host_probes(layout, tmp_path, monkeypatch):
    (tmp_path / layout).mkdir(parents=True)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert ab.cann_home() == tmp_path
    assert ab.ascendc_cmake_dir(tmp_path) == tmp_path / layout


def test_a_toolkit_without_any_layout_is_no_cann(tmp_path, monkeypatch):
    (tmp_path / "tools").mkdir()
    monkeypatch.setenv("ASCEND_HOME_PATH", str(tmp_path))
    monkeypatch.delenv("ASCEND_TOOLKIT_HOME", raising=False)
    assert ab.ascendc_cmake_dir(tmp_path) is None
    if not Path("/usr/local/Ascend/ascend-toolkit/latest").exists():
        assert ab.cann_home() is None


def test_the_layouts_are_the_hosts_in_its_order():
    """ASCENDC_CMAKE_DIRS against the pinned host's CMakeLists.txt (from the
    hash-checked sdist) and csrc/CMakeLists.txt's own probe."""
    import tarfile

    default, pins = common.load_pins()
    sdist = common.fetch_sdist(pins[default], Path(__file__).resolve().parents[2] / ".cache")
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/CMakeLists.txt")
                      and m.name.count("/") == 1)
        text = tar.extractfile(member).read().decode()
    host = re.findall(r"EXISTS \$\{ASCEND_HOME_PATH\}/(\S+)\)", text)
    assert tuple(host) == ab.ASCENDC_CMAKE_DIRS
    ours = (Path(__file__).resolve().parents[2] / "csrc" / "CMakeLists.txt").read_text()
    assert " ".join(ab.ASCENDC_CMAKE_DIRS[:2]) in " ".join(ours.split())
    assert ab.ASCENDC_CMAKE_DIRS[2] in ours


def _fake_host_wheel(out: Path, with_library: bool) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / "vllm_ascend-0.23.0.post1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("vllm_ascend/__init__.py", "")
        if with_library:
            zf.writestr("vllm_ascend/vllm_ascend_C.cpython-311-aarch64-linux-gnu.so", b"\0")
    return wheel


@pytest.fixture
def stage(tmp_path, monkeypatch):
    """wheel_from_tree with CANN present and both builds stood in for; returns
    a function of (vspec build outcome, host library?) -> (build info, host env)."""
    cann = tmp_path / "cann"
    (cann / ab.ASCENDC_CMAKE_DIRS[2]).mkdir(parents=True)
    monkeypatch.setenv("ASCEND_HOME_PATH", str(cann))
    default, pins = common.load_pins()
    pin = pins[default]

    def run(vspec, host_library=True):
        seen = {}

        def build_kernels(tree, cann_path, pin_, work):
            if isinstance(vspec, Exception):
                raise vspec
            return vspec

        def build_host_wheel(tree, pin_, cann_path, epoch, out):
            seen["cann"] = cann_path   # COMPILE_CUSTOM_KERNELS=1 iff this is set
            return _fake_host_wheel(out, host_library)

        monkeypatch.setattr(ab, "build_kernels", build_kernels)
        monkeypatch.setattr(ab, "build_host_wheel", build_host_wheel)
        monkeypatch.setattr(ab, "assemble", lambda host_wheel, tree, copied, pin_, info, epoch,
                            dist: seen.setdefault("info", info))
        ab.wheel_from_tree(tmp_path / "tree", pin, [], [], {}, tmp_path / "base",
                           tmp_path / "dist")
        return seen["info"], seen["cann"]

    return run


def test_a_failed_vspec_kernel_build_keeps_the_hosts_kernels(stage):
    info, host_cann = stage(ab.BuildError("cmake --build failed:\nascendc error"))
    assert host_cann is not None   # the host still builds its vllm_ascend_C
    k = info["custom_kernels"]
    assert k["enabled"] and k["host_libraries"] and k["vspec_libraries"] == []
    assert "vspec's kernels not built (cmake --build failed:)" in k["reason"]
    assert info["kernels_statement"].endswith(
        "vspec ops: not built, vspec's torch implementation runs")


def test_a_vspec_build_without_a_library_is_reported_the_same_way(stage):
    info, _ = stage([])
    assert "vspec's kernels not built (the build produced no library)" in \
        info["custom_kernels"]["reason"]


def test_both_libraries_when_both_build(stage):
    info, _ = stage(["vllm_ascend/vspec/lib/libvspec_ops.so"])
    assert info["kernels_statement"].endswith("vspec ops: vllm_ascend/vspec/lib/libvspec_ops.so")


def test_a_cann_build_without_the_hosts_library_is_an_error(stage):
    with pytest.raises(ab.BuildError, match="vllm_ascend_C"):
        stage(["vllm_ascend/vspec/lib/libvspec_ops.so"], host_library=False)
