"""pytest plugin of the peer suite: every one of vLLM's own scheduler tests
runs once per variant, the stock `Scheduler` and VSpecScheduler under each
vspec setting, in one process (importing the tests costs far more than
running them).

peer_suite.py loads it (`-p peer_plugin`) into the pytest process that runs
the fetched tests, and only there. The fetched files are not edited: for a
vspec variant, an autouse fixture rebinds the names `Scheduler` and
`AsyncScheduler` in the test modules (where `create_scheduler` and the tests
look them up) to VSpecScheduler subclasses that add only the variant's
settings, put where `--additional-config '{"vspec": ...}'` puts them, and a
step counter. vLLM's own classes and modules are left alone.

A variant's settings reach only a scheduler built with a speculative config
(see peer_classes): a test that builds none runs the same code under every
vspec variant. So each test runs under stock and under the process's first
vspec variant (its lead); under the process's other vspec variants it runs
again only if its lead run built a scheduler with a speculative config or
did not pass or skip. Otherwise the lead's outcome stands for them, its
message saying so (`shared_entry`), and the variant's probe counts them
("shared").

Outcomes (peer_common.outcome_entry) go to --peer-report as JSON: {test id:
{variant: {outcome, message}}} (the test id without the variant's parameter),
with what each vspec variant's schedulers did ("probes": steps, steps with
gamma below K).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import sys
import tomllib
from pathlib import Path

import pytest
from peer_common import end_after_atexit, outcome_entry, skip_final_collections

PARAM = "peer_variant"
STOCK = "stock"
# The fetched tests' package (the sdist's tests/, not this repository's).
PEER_PACKAGE = "tests."
RUN = "vspec_peer_run"


def pytest_addoption(parser) -> None:
    group = parser.getgroup("vspec peer suite")
    group.addoption("--peer-suite", required=True, help="suite.toml: variants and exclusions")
    group.addoption("--peer-variants", default="",
                    help="comma-separated subset of the suite's variants (default: all)")
    group.addoption("--peer-report", required=True, help="where to write the outcomes (JSON)")


def load_variants(suite: dict, subset: str) -> dict[str, dict | None]:
    """Variant name -> vspec settings (None: vLLM's stock Scheduler)."""
    variants: dict[str, dict | None] = {STOCK: None, **suite["variants"]}
    if not subset:
        return variants
    names = subset.split(",")
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise pytest.UsageError(f"--peer-variants: unknown {unknown}; allowed: {list(variants)}")
    return {n: variants[n] for n in names}


def variant_token(name: str) -> str:
    return f"peer={name}"


def base_id(nodeid: str, name: str) -> str:
    """The test id without the variant's parameter id (whichever position
    pytest gave it among the test's own parameters)."""
    token = variant_token(name)
    for old, new in ((f"[{token}]", ""), (f"[{token}-", "["), (f"-{token}]", "]"),
                     (f"-{token}-", "-")):
        if old in nodeid:
            return nodeid.replace(old, new, 1)
    raise ValueError(f"{nodeid} has no parameter {token}")


def excluded_reason(test_id: str, excluded: dict[str, str]) -> str | None:
    return next((why for pattern, why in excluded.items() if fnmatch.fnmatchcase(test_id, pattern)),
                None)


# Lead outcomes that stand for the process's other vspec variants when the
# lead built no scheduler with a speculative config: a failure or an error
# may have stopped the test before it built one, so those run again.
SHARED_OUTCOMES = ("passed", "skipped")


def shared_entry(lead: str, lead_entry: dict | None, lead_built_spec: bool) -> dict | None:
    """The entry a vspec variant takes from its process's lead variant for a
    test, or None when the test must run under the variant itself: the lead
    has not run it, built a scheduler with a speculative config (where the
    variant's own settings apply), or neither passed nor skipped it."""
    if lead_entry is None or lead_built_spec or lead_entry["outcome"] not in SHARED_OUTCOMES:
        return None
    return {"outcome": lead_entry["outcome"],
            "message": f"as {lead}: no scheduler with a speculative config, so no vspec "
                       f"setting applies; {lead}'s run stands for this variant"}


def peer_classes(name: str, settings: dict, probe: dict, on_spec=lambda: None):
    """VSpecScheduler and VSpecAsyncScheduler given `settings` as vspec's
    additional_config. The async one also subclasses the sync one, so that
    `isinstance(AsyncScheduler(...), Scheduler)` holds after rebinding as it
    does in vLLM. `probe` counts the steps they schedule, and among those the
    ones whose draft length is below num_speculative_tokens (K): that the
    rebinding took effect and the controller acted, read off the host's
    SchedulerOutput rather than vspec's internals. `on_spec()` is called for
    every scheduler built with a speculative config."""
    from vllm_vspec.hosts.vllm.scheduler import VSpecAsyncScheduler, VSpecScheduler

    class WithSettings:
        def __init__(self, vllm_config, *args, **kwargs):
            # vspec settings need a speculative config (the scheduler refuses
            # them otherwise, as the server does); tests without one run the
            # subclass with no settings, i.e. as an engine with no vspec keys.
            if vllm_config.speculative_config is not None:
                on_spec()
                vllm_config.additional_config = {**(vllm_config.additional_config or {}),
                                                 "vspec": dict(settings)}
            super().__init__(vllm_config, *args, **kwargs)

        def schedule(self, *args, **kwargs):
            output = super().schedule(*args, **kwargs)
            probe["steps"] += 1
            spec = self.vllm_config.speculative_config
            if (output.num_scheduled_tokens and spec is not None
                    and output.num_spec_tokens_to_schedule < spec.num_speculative_tokens):
                probe["below_k"] += 1
            return output

    sync = type(f"VSpecScheduler_{name}", (WithSettings, VSpecScheduler), {})
    return sync, type(f"VSpecAsyncScheduler_{name}", (sync, VSpecAsyncScheduler), {})


class PeerRun:
    """The plugin object of one peer run (registered in pytest_configure)."""

    def __init__(self, config) -> None:
        suite = tomllib.loads(Path(config.getoption("--peer-suite")).read_text())
        self.variants = load_variants(suite, config.getoption("--peer-variants"))
        self.excluded: dict[str, str] = suite.get("excluded", {})
        self.report_path = Path(config.getoption("--peer-report"))
        self.ids: dict[str, tuple[str, str]] = {}  # nodeid -> (test id, variant)
        self.results: dict[str, dict[str, dict]] = {}
        self.classes: dict[str, tuple] = {}
        # variant -> {"steps": scheduled, "below_k": of those, gamma below K,
        # "shared": tests whose lead run stood for the variant's}
        self.probes: dict[str, dict] = {}
        self.lead = next((n for n, s in self.variants.items() if s is not None), None)
        self.lead_spec: dict[str, bool] = {}  # test id -> its lead run built a spec scheduler
        self.spec_built = False  # the running test built a scheduler with a speculative config
        self.sharing: dict[str, dict] = {}  # node id -> the lead's entry it takes
        # The fetched test modules (imported at collection), where the
        # scheduler names are rebound.
        self.modules: tuple[int, list] | None = None

    def scheduler_classes(self, name: str) -> tuple:
        if name not in self.classes:
            self.classes[name] = peer_classes(name, self.variants[name], self.probe(name),
                                              self.built_spec)
        return self.classes[name]

    def probe(self, name: str) -> dict:
        return self.probes.setdefault(name, {"steps": 0, "below_k": 0, "shared": 0})

    def built_spec(self) -> None:
        self.spec_built = True

    def test_modules(self) -> list:
        """The fetched test modules, read again only when a module was
        imported since (collection imports nearly all of them)."""
        if self.modules is None or self.modules[0] != len(sys.modules):
            self.modules = (len(sys.modules), [
                m for m in list(sys.modules.values())
                if getattr(m, "__name__", "").startswith(PEER_PACKAGE)])
        return self.modules[1]

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item) -> None:
        """A vspec variant other than the lead takes the lead's outcome where
        `shared_entry` gives one: the test is skipped before its fixtures
        and the entry recorded in its place."""
        test_id, variant = self.ids[item.nodeid]
        self.spec_built = False
        if self.variants[variant] is None or variant == self.lead:
            return
        lead_entry = self.results.get(test_id, {}).get(self.lead)
        entry = shared_entry(self.lead, lead_entry, self.lead_spec.get(test_id, True))
        if entry is not None:
            self.sharing[item.nodeid] = entry
            self.probe(variant)["shared"] += 1
            pytest.skip(entry["message"])

    def pytest_generate_tests(self, metafunc) -> None:
        if not metafunc.module.__name__.startswith(PEER_PACKAGE):
            return
        metafunc.fixturenames.append(PARAM)
        metafunc.parametrize(PARAM, list(self.variants),
                             ids=[variant_token(n) for n in self.variants])

    def pytest_collection_modifyitems(self, config, items) -> None:
        kept, dropped = [], []
        for item in items:
            variant = item.callspec.params[PARAM]
            test_id = base_id(item.nodeid, variant)
            if excluded_reason(test_id, self.excluded) is not None:
                dropped.append(item)
                continue
            self.ids[item.nodeid] = (test_id, variant)
            kept.append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
        items[:] = kept

    def pytest_runtest_logreport(self, report) -> None:
        key = self.ids.get(report.nodeid)
        if key is None:
            return
        test_id, variant = key
        slot = self.results.setdefault(test_id, {})
        entry = self.sharing.get(report.nodeid) or outcome_entry(report)
        if entry is not None:
            slot[variant] = entry
        if variant == self.lead:
            self.lead_spec[test_id] = self.lead_spec.get(test_id, False) or self.spec_built

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self.report_path.write_text(json.dumps(
            {"variants": list(self.variants), "excluded": self.excluded,
             "probes": self.probes,
             "results": self.results}, indent=1, sort_keys=True))
        skip_final_collections(session.config, int(exitstatus))


def pytest_configure(config) -> None:
    import atexit

    # Before the test modules import vLLM (collection comes later).
    atexit.register(end_after_atexit)
    config.pluginmanager.register(PeerRun(config), RUN)


def _forget_logged_once() -> None:
    """vLLM prints some warnings once per process (lru_cache'd printers), so
    a test asserting one would see it only under the first variant that runs
    it. Every run of a test, in every variant, starts with that memory empty."""
    import vllm.logger

    for level in ("debug", "info", "warning", "error"):
        getattr(vllm.logger, f"_print_{level}_once").cache_clear()


@pytest.fixture(autouse=True)
def _peer_scheduler(request, monkeypatch):
    """Rebind the test modules' `Scheduler`/`AsyncScheduler` to this
    variant's classes for the duration of one test (stock: nothing to do)."""
    _forget_logged_once()
    run: PeerRun = request.config.pluginmanager.get_plugin(RUN)
    variant = request.node.callspec.params[PARAM]
    if run.variants[variant] is None:
        yield
        return
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    sync, async_ = run.scheduler_classes(variant)
    for module in run.test_modules():
        for name, stock, ours in (("Scheduler", Scheduler, sync),
                                  ("AsyncScheduler", AsyncScheduler, async_)):
            if vars(module).get(name) is stock:
                monkeypatch.setattr(module, name, ours)
    yield


@pytest.fixture()
def caplog_vllm(caplog):
    """The one fixture the fetched tests take from the sdist's tests/conftest.py
    (not fetched): caplog seeing vLLM's log records, which reach the root
    logger only while the "vllm" logger propagates."""
    logger = logging.getLogger("vllm")
    propagate = logger.propagate
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO):
            yield caplog
    finally:
        logger.propagate = propagate
