"""The contract check on every supported vLLM release (hosts/vllm/releases.py).

Spec: our adapters (every class under vllm_vspec/hosts with a vLLM class in
its MRO: scheduler, workers, model runners, executor, platforms, proposers)
fit the Python sources of each release in the range, read from the
release's wheel (fetched once into .cache/vllm-wheel/, kept only with the
pinned SHA-256; `make vllm-sources` fills it ahead). The rules themselves are
specified in test_doctor.py on synthetic hosts.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_vspec.hosts.vllm import releases
from vllm_vspec.tools import abi_check
from vllm_vspec.tools.ascend_build.common import BuildError

REPO = Path(__file__).resolve().parents[2]
OURS = {"vllm_vspec": REPO / "overlay" / "vllm_vspec"}
ADAPTERS = ("vllm_vspec.hosts.vllm.scheduler.VSpecScheduler",
            "vllm_vspec.hosts.vllm.worker.VSpecCPUWorker",
            "vllm_vspec.hosts.vllm.worker.VSpecGPUWorker",
            "vllm_vspec.hosts.vllm.executor.VSpecMultiprocExecutor",
            "vllm_vspec.hosts.vllm.platform_cpu.VSpecCpuPlatform",
            "vllm_vspec.hosts.vllm.platform_cuda.VSpecCudaPlatform")


@pytest.fixture(scope="module", params=releases.RELEASES, ids=lambda r: r.version)
def release_wheel(request) -> tuple[releases.Release, Path]:
    try:
        return request.param, abi_check.fetch_release(request.param, REPO / ".cache")
    except BuildError as e:
        pytest.skip(f"vLLM {request.param.version}'s wheel is not in .cache/vllm-wheel and "
                    f"could not be fetched ({e}); run `make vllm-sources` where the index "
                    "is reachable")


def test_our_adapters_fit_the_release(release_wheel):
    release, wheel = release_wheel
    report = abi_check.check_host(f"vllm {release.version}",
                                  {"vllm": wheel, **abi_check.vllm_only_roots(OURS)})
    assert report.ok, "\n".join(f.line() for f in report.findings)
    assert set(ADAPTERS) <= set(report.classes), sorted(set(ADAPTERS) - set(report.classes))
    print(f"vLLM {release.version}: {len(report.classes)} classes, {report.checked} checks, OK")


def test_the_check_reads_the_releases_own_sources(release_wheel):
    release, wheel = release_wheel
    sources = abi_check.Sources({"vllm": wheel})
    version = sources.read("vllm._version")
    assert version is not None and release.version in version[1]


def test_a_class_chosen_at_import_resolves_to_its_first_alternative(tmp_path):
    # vLLM's `CudaPlatform = NvmlCudaPlatform if nvml_available else NonNvmlCudaPlatform`.
    host = tmp_path / "vllm"
    host.mkdir()
    (host / "__init__.py").write_text("")
    (host / "plat.py").write_text(
        "class Base:\n    def hook(self, config):\n        pass\n\n"
        "class A(Base):\n    pass\n\nclass B(Base):\n    pass\n\n"
        "Chosen = A if flag else B\n")
    ref = abi_check.resolve(abi_check.Sources({"vllm": host}), "vllm.plat.Chosen")
    assert ref is not None and ref.qualname == "vllm.plat.A"
