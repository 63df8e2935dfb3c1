"""pytest plugin of the Ascend peer suite, loaded (`-p ascend_peer_plugin`)
into the pytest process that runs one tree's tests/ut in the isolated venv,
and only there. The tests and the tree are not edited. It does three things:

1. Records the outcome of every test id (passed, failed, error, skipped,
   xfailed, xpassed) with a one-line message, to --ascend-peer-report (JSON),
   as the vLLM peer suite does (tests/peer/peer_common.py, on this
   process's path).

2. Counts vspec's routing decisions per test (overlaid tree only; the stock
   tree has no vllm_ascend.vspec): how often `proposer_cls_for`,
   `scheduler_cls_for` and `rejection_sampler_factory` of
   vllm_ascend/vspec/routing.py handed back a vspec class rather than None /
   the host's. The functions are wrapped (same arguments, same result) as the
   module is first imported, before the patched host modules bind them. This
   shows that routing was on, and which tests exercised it.

3. --ascend-route-proposers (overlaid tree only): vspec's routing in the
   test modules. The host's tests build its proposers by class
   (`AscendEagleProposer(vllm_config=..., device=..., runner=...)`), not through
   get_spec_decode_method, so the patched routing never sees them. For each
   test, the names of the host proposer classes that routing.PROPOSERS
   replaces (the host base of each vspec proposer) are rebound in the test
   modules to our subclass, as routing hands it out for that method. The host's
   modules and classes are left alone.

4. --ascend-torchvision-standin: a STAND-IN for two of torchvision's C++
   operators (see TorchvisionOpsStandIn).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from peer_common import end_after_atexit, message, outcome_entry, skip_final_collections

RUN = "vspec_ascend_peer_run"
ROUTING_MODULE = "vllm_ascend.vspec.routing"


# ------------------------------------------------------ torchvision stand-in
# STAND-IN, not torchvision: PyPI's torchvision 0.28.0 (the release paired
# with torch 2.13) is a CUDA build; its _C.so needs libtorch_cuda.so, which
# torch 2.13.0+cpu lacks, so it does not load and no torchvision::* operator
# is defined. torchvision's Python then fails at import: _meta_registrations
# registers fake kernels for torchvision::nms and ::qnms without checking
# that the operators exist (its other registrations do check). transformers
# 5.5.4's qwen2_vl image processor imports torchvision.transforms.v2, and
# vLLM 0.23's qwen3_vl model module (which vllm_ascend's patches import)
# imports that processor. The stand-in declares the two operators' schemas
# (as torchvision's C++ declares them) and no kernel: torchvision's Python
# (transforms, functional) then imports and works; calling nms or qnms raises
# "could not run ... with arguments from the 'CPU' backend". No test of
# tests/ut calls them. Both trees get the same stand-in.
TORCHVISION_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)


class TorchvisionOpsStandIn(importlib.abc.MetaPathFinder):
    """On the first `import torchvision`: if its _C.so does not load, declare
    TORCHVISION_SCHEMAS in the torchvision operator namespace; then let the
    normal finders import the real torchvision."""

    library = None  # the torch.library.Library, kept alive for the process

    def find_spec(self, name, path=None, target=None):
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        if not _torchvision_c_loads():
            import torch

            lib = torch.library.Library("torchvision", "DEF")
            for schema in TORCHVISION_SCHEMAS:
                lib.define(schema)
            TorchvisionOpsStandIn.library = lib
        return None


def _torchvision_c_loads() -> bool:
    import ctypes

    import torch  # noqa: F401  (its libraries first, as torchvision loads _C)

    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    for folder in spec.submodule_search_locations:
        lib = Path(folder) / "_C.so"
        if lib.is_file():
            try:
                ctypes.CDLL(str(lib))
                return True
            except OSError:
                return False
    return False


# ------------------------------------------------------------ routing probe
class RoutingProbe(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps routing.py's three decisions as the module is first executed."""

    def __init__(self, run: "AscendPeerRun"):
        self.run = run
        self.inner = None

    def find_spec(self, name, path=None, target=None):
        if name != ROUTING_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        self.inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        run = self.run

        def counted(name, is_vspec):
            original = getattr(module, name)

            def wrapper(*args, **kwargs):
                result = original(*args, **kwargs)
                if is_vspec(result, *args):
                    run.routed(name)
                return result

            wrapper.__wrapped__ = original
            wrapper.__name__ = original.__name__
            wrapper.__doc__ = original.__doc__
            setattr(module, name, wrapper)

        counted("proposer_cls_for", lambda r, *a: r is not None)
        counted("scheduler_cls_for", lambda r, *a: r is not None)
        counted("rejection_sampler_factory", lambda r, *a: len(a) > 1 and r is not a[1])


# -------------------------------------------------------------------- run
def pytest_addoption(parser) -> None:
    group = parser.getgroup("vspec Ascend peer suite")
    group.addoption("--ascend-peer-report", required=True, help="where to write outcomes (JSON)")
    group.addoption("--ascend-peer-tree", default="", help="the tree's name, for the report")
    group.addoption("--ascend-route-proposers", action="store_true",
                    help="rebind the host proposer classes in the test modules to vspec's")
    group.addoption("--ascend-torchvision-standin", action="store_true",
                    help="declare torchvision::nms/qnms when torchvision's _C.so does not load")


class AscendPeerRun:
    def __init__(self, report_path: str, tree: str, route_proposers: bool = False):
        self.report_path = Path(report_path)
        self.tree = tree
        self.route_proposers = route_proposers
        self._pairs: list[tuple[type, type]] | None = None
        self._read: set[str] = set()  # sys.modules keys host_bindings has read
        self._walked = 0  # len(sys.modules) at host_bindings' last walk
        self._bindings: list[tuple[object, str, type, type]] = []
        self.results: dict[str, dict] = {}
        self.routing: dict[str, Counter] = {}
        self.current = "<collection>"

    def routed(self, decision: str) -> None:
        self.routing.setdefault(self.current, Counter())[decision] += 1

    def proposer_pairs(self) -> list[tuple[type, type]]:
        """(host class, vspec class) for every method routing.PROPOSERS drives."""
        if self._pairs is None:
            import importlib

            routing = importlib.import_module(ROUTING_MODULE)
            self._pairs = []
            # One class may serve several methods (eagle, eagle3, mtp).
            for path in dict.fromkeys(routing.PROPOSERS.values()):
                module, _, name = path.partition(":")
                ours = getattr(importlib.import_module(module), name)
                hosts = [b for b in ours.__bases__
                         if not b.__module__.startswith(("vllm_ascend.vspec", "vllm_vspec"))]
                self._pairs += [(h, ours) for h in hosts]
        return self._pairs

    def host_bindings(self) -> list[tuple[object, str, type, type]]:
        """(test module, name, host class, vspec class) for every name a
        test module binds to a host proposer class that routing replaces.
        A module is read once, when first seen (its names are bound at
        import; each test's rebinding is undone after it), not every loaded
        module again at every test of the overlaid run's 1,699; and
        sys.modules is walked again only when its size changed since the
        last walk (modules are added as they are imported)."""
        pairs = self.proposer_pairs()
        if len(sys.modules) == self._walked:
            return self._bindings
        self._walked = len(sys.modules)
        for key, module in list(sys.modules.items()):
            if key in self._read:
                continue
            self._read.add(key)
            if getattr(module, "__name__", "").startswith(TEST_PACKAGE):
                self._bindings += [(module, name, host, ours)
                                   for name, value in vars(module).items()
                                   for host, ours in pairs if value is host]
        return self._bindings

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:
        self.current = item.nodeid

    def pytest_runtest_logreport(self, report) -> None:
        entry = outcome_entry(report)
        if entry is not None:
            self.results[report.nodeid] = entry

    def pytest_collectreport(self, report) -> None:
        # A module that fails to import: one "error" entry under its path.
        if report.failed:
            self.results[report.nodeid] = {"outcome": "error", "message": message(report)}

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self.report_path.write_text(json.dumps(
            {"tree": self.tree, "exitstatus": int(exitstatus), "results": self.results,
             "routing": {k: dict(v) for k, v in self.routing.items()}},
            indent=1, sort_keys=True))
        skip_final_collections(session.config, int(exitstatus))


TEST_PACKAGE = "tests.ut."


@pytest.fixture(autouse=True)
def _vspec_routed_proposers(request, monkeypatch):
    run: AscendPeerRun = request.config.pluginmanager.get_plugin(RUN)
    if run is None or not run.route_proposers:
        yield
        return
    for module, name, host, ours in run.host_bindings():
        monkeypatch.setattr(module, name, ours)
        if module.__name__ == getattr(request.module, "__name__", None):
            run.routed(f"proposer rebound: {host.__name__} -> {ours.__name__}")
    yield


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args) -> None:
    # Before tests/ut/conftest.py, which imports vllm_ascend (and through it
    # torchvision and, in the overlaid tree, routing.py).
    import atexit

    atexit.register(end_after_atexit)
    known = early_config.known_args_namespace
    run = AscendPeerRun(known.ascend_peer_report, known.ascend_peer_tree,
                        known.ascend_route_proposers)
    early_config.pluginmanager.register(run, RUN)
    if known.ascend_torchvision_standin:
        sys.meta_path.insert(0, TorchvisionOpsStandIn())
    sys.meta_path.insert(0, RoutingProbe(run))
