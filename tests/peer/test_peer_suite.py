"""The peer suite: its own machinery (no vLLM, no network: how outcomes are
recorded and compared with stock, peer_common.py's part shared with the
Ascend peer suite included, how the variant is taken off a test id, what the
fetch refuses to unpack), then the suite itself (`make peer-test`, about 1.5 min on
this 2-core host), so that `make test` fails on any difference from vLLM's
stock scheduler that suite.toml does not list with its reason."""

from __future__ import annotations

import hashlib
import io
import sys
import tarfile
import tomllib

from types import SimpleNamespace

import peer_common
import peer_fetch
import peer_suite
import pytest
from conftest import run_command
from peer_plugin import base_id, excluded_reason, shared_entry, variant_token

VARIANTS = ["stock", "online", "cycle"]
STEPPED = {"online": {"steps": 5, "below_k": 1}, "cycle": {"steps": 5, "below_k": 4}}


def outcomes(**per_variant: str) -> dict:
    return {v: {"outcome": o, "message": f"{v}: {o}"} for v, o in per_variant.items()}


def test_same_outcome_as_stock_is_no_difference():
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="passed", cycle="passed"),
                              "t::b": outcomes(stock="skipped", online="skipped", cycle="skipped")},
                             VARIANTS, [], STEPPED)
    assert cmp.ok and not cmp.expected and not cmp.unexpected
    assert cmp.counts["online"] == {"passed": 1, "skipped": 1}


def test_unlisted_difference_fails_with_test_variant_and_message():
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="passed", cycle="failed")},
                             VARIANTS, [], STEPPED)
    assert not cmp.ok
    [diff] = cmp.unexpected
    assert (diff.test_id, diff.variant, diff.stock, diff.outcome, diff.message) == (
        "t::a", "cycle", "passed", "failed", "cycle: failed")


def test_listed_difference_carries_its_reason_and_passes():
    listed = [{"tests": ["t::a*"], "reason": "asserts stock padding"}]
    cmp = peer_suite.compare({"t::a[1]": outcomes(stock="passed", online="failed", cycle="failed")},
                             VARIANTS, listed, STEPPED)
    assert cmp.ok
    assert [(d.variant, d.reason) for d in cmp.expected] == [
        ("online", "asserts stock padding"), ("cycle", "asserts stock padding")]


def test_listed_difference_covers_only_its_variants():
    listed = [{"tests": ["t::a"], "variants": ["cycle"], "reason": "cycle only"}]
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="failed", cycle="failed")},
                             VARIANTS, listed, STEPPED)
    assert [d.variant for d in cmp.expected] == ["cycle"]
    assert [d.variant for d in cmp.unexpected] == ["online"]


def test_a_variant_without_a_result_is_a_difference():
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="passed")},
                             VARIANTS, [], STEPPED)
    assert [(d.variant, d.outcome) for d in cmp.unexpected] == [("cycle", "missing")]


def test_stock_failure_fails_the_suite_instead_of_being_compared():
    cmp = peer_suite.compare({"t::a": outcomes(stock="error", online="error", cycle="error")},
                             VARIANTS, [], STEPPED)
    assert not cmp.ok and not cmp.unexpected
    assert [(d.test_id, d.outcome) for d in cmp.stock_failures] == [("t::a", "error")]


def test_a_variant_whose_schedulers_never_stepped_fails_the_suite():
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="passed", cycle="passed")},
                             VARIANTS, [], {"online": {"steps": 3, "below_k": 0}})
    assert not cmp.ok and cmp.idle == ["cycle"]


def test_listed_difference_that_did_not_occur_is_reported_stale():
    listed = [{"tests": ["t::x", "t::a"], "reason": "used"},
              {"tests": ["t::gone"], "reason": "stale"}]
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="failed", cycle="passed")},
                             VARIANTS, listed, STEPPED)
    assert cmp.ok
    assert [e["tests"] for e in cmp.stale] == [["t::gone"]]


def test_render_names_unexpected_differences():
    cmp = peer_suite.compare({"t::a": outcomes(stock="passed", online="failed", cycle="passed")},
                             VARIANTS, [], STEPPED)
    text = peer_suite.render(cmp, VARIANTS, STEPPED)
    assert "UNEXPECTED DIFFERENCES" in text
    assert "t::a [online] stock=passed -> failed: online: failed" in text


def _report(when: str, outcome: str, longrepr=None, **extra) -> SimpleNamespace:
    """What the plugins read off a pytest TestReport / CollectReport."""
    return SimpleNamespace(when=when, outcome=outcome, passed=outcome == "passed",
                           failed=outcome == "failed", skipped=outcome == "skipped",
                           longrepr=longrepr, **extra)


def _crash(text: str) -> SimpleNamespace:
    return SimpleNamespace(reprcrash=SimpleNamespace(message=text))


@pytest.mark.parametrize("report, entry", [
    (_report("setup", "passed"), None),
    (_report("call", "passed"), {"outcome": "passed", "message": ""}),
    (_report("call", "failed", _crash("AssertionError: x\n\nmore")),
     {"outcome": "failed", "message": "AssertionError: x"}),
    (_report("setup", "failed", _crash("\nfixture 'gone' not found")),
     {"outcome": "error", "message": "fixture 'gone' not found"}),
    (_report("setup", "skipped", ("/t/f.py", 3, "Skipped: no NPU")),
     {"outcome": "skipped", "message": "Skipped: no NPU"}),
    (_report("call", "skipped", ("/t/f.py", 3, "reason"), wasxfail="known"),
     {"outcome": "xfailed", "message": "reason"}),
    (_report("call", "passed", wasxfail="known"), {"outcome": "xpassed", "message": ""}),
    (_report("teardown", "passed"), None),
    (_report("teardown", "failed", "RuntimeError: leak"),
     {"outcome": "error", "message": "RuntimeError: leak"}),
])
def test_both_plugins_record_one_outcome_per_report(report, entry):
    assert peer_common.outcome_entry(report) == entry


def test_a_collection_error_message_is_its_last_line():
    report = _report("collect", "failed", "Traceback ...\n  import x\nImportError: no x\n")
    assert peer_common.message(report) == "ImportError: no x"
    assert len(peer_common.message(_report("call", "failed", "x" * 400))) == 300


def test_a_plugin_process_ends_with_the_session_status_after_the_other_atexit_handlers():
    script = ("import atexit, types, peer_common\n"
              "atexit.register(peer_common.end_after_atexit)\n"
              "atexit.register(lambda: print('earlier handler ran', flush=True))\n"
              "config = types.SimpleNamespace(stash={})\n"
              "peer_common.skip_final_collections(config, 3)\n"
              "print('gc iterations', list(config.stash.values()))\n")
    run = run_command([sys.executable, "-c", script], timeout_s=60, cwd=peer_suite.HERE)
    assert run.returncode == 3, run.stderr
    assert run.stdout.splitlines() == ["gc iterations [0]", "earlier handler ran"]


def test_a_plugin_process_without_a_session_status_ends_as_python_ends_it():
    script = ("import atexit, sys, peer_common\n"
              "atexit.register(peer_common.end_after_atexit)\n"
              "sys.exit(5)\n")
    assert run_command([sys.executable, "-c", script], timeout_s=60,
                       cwd=peer_suite.HERE).returncode == 5


def test_listing_takes_the_first_covering_entry_and_reports_the_rest_stale():
    listing = peer_common.Listing([{"tests": ["t::a*"], "reason": "r0", "only": "x"},
                                   {"tests": ["t::a[[]1]"], "reason": "r1"},
                                   {"tests": ["t::b"], "reason": "r2", "only": "y"}])
    assert listing.reason("t::a[1]", lambda e: e.get("only", "x") == "x") == "r0"
    assert listing.reason("t::a[1]", lambda e: e.get("only", "y") == "y") == "r1"
    assert listing.reason("t::c") is None
    assert listing.stale() == [{"tests": ["t::b"], "reason": "r2", "only": "y"}]
    assert listing.stale(lambda e: e.get("only") != "y") == []


def test_read_report_refuses_a_crash_or_a_missing_report_naming_the_log(tmp_path):
    log, report = tmp_path / "run.log", tmp_path / "run.json"
    log.write_text("collecting ...\nINTERNALERROR> boom\n")
    with pytest.raises(RuntimeError, match=r"(?s)pytest on the x tree exited with 3 .*INTERNALERROR"):
        peer_common.read_report(3, report, log, "pytest on the x tree")
    with pytest.raises(RuntimeError, match="exited with 1"):
        peer_common.read_report(1, report, log)
    report.write_text('{"results": {}}')
    assert peer_common.read_report(1, report, log) == {"results": {}}


@pytest.mark.parametrize("nodeid, expected", [
    ("f.py::t[peer=online-0]", "f.py::t"),
    ("f.py::t[peer=online-0-False]", "f.py::t[False]"),
    ("f.py::t[False-peer=online-0]", "f.py::t[False]"),
    ("f.py::t[1-peer=online-0-x]", "f.py::t[1-x]"),
])
def test_base_id_removes_the_variant_wherever_pytest_put_it(nodeid, expected):
    assert variant_token("online-0") == "peer=online-0"
    assert base_id(nodeid, "online-0") == expected


@pytest.mark.parametrize("lead_entry, built_spec", [
    (None, False),                                          # the lead has not run it
    ({"outcome": "passed", "message": ""}, True),           # the variant's settings apply
    ({"outcome": "failed", "message": "boom"}, False),      # may have failed before building one
    ({"outcome": "error", "message": "setup"}, False),
])
def test_a_variant_runs_a_test_itself_unless_its_lead_passed_it_without_a_spec_scheduler(
        lead_entry, built_spec):
    assert shared_entry("fixed", lead_entry, built_spec) is None


@pytest.mark.parametrize("outcome", ["passed", "skipped"])
def test_a_test_without_a_spec_scheduler_takes_its_leads_outcome_naming_the_lead(outcome):
    entry = shared_entry("fixed", {"outcome": outcome, "message": "x"}, False)
    assert entry["outcome"] == outcome
    assert entry["message"].startswith("as fixed: no scheduler with a speculative config")


def test_exclusion_patterns_match_whole_test_ids():
    excluded = {"f.py::test_ec_*": "hub model"}
    assert excluded_reason("f.py::test_ec_connector[True]", excluded) == "hub model"
    assert excluded_reason("f.py::test_scheduler_ec_stats", excluded) is None


def test_suite_file_lists_known_variants_and_gives_every_entry_a_reason():
    suite = tomllib.loads(peer_suite.SUITE.read_text())
    assert "stock" not in suite["variants"]
    for entry in suite["difference"]:
        assert entry["reason"].strip() and entry["tests"], entry
        assert "\\" not in entry["reason"], "a line continuation TOML kept literally"
        assert set(entry.get("variants", [])) <= set(suite["variants"]), entry
    assert all(why.strip() for why in suite["excluded"].values())


def _archive(tmp_path, files: dict[str, bytes], top: str = "pkg-1.0"):
    path = tmp_path / f"{top}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_unpack_takes_only_the_pinned_members_without_the_top_folder(tmp_path):
    archive, sha = _archive(tmp_path, {"tests/a/x.py": b"x", "tests/a/y.py": b"y",
                                       "tests/b.py": b"b", "setup.py": b"raise SystemExit"})
    dest = tmp_path / "src"
    peer_fetch.unpack(archive, sha, ["tests/a/", "tests/b.py"], dest)
    got = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert got == ["tests/a/x.py", "tests/a/y.py", "tests/b.py"]


def test_unpack_refuses_an_archive_that_does_not_match_its_pin(tmp_path):
    archive, _ = _archive(tmp_path, {"tests/b.py": b"b"})
    with pytest.raises(peer_fetch.FetchError, match="does not match the pin"):
        peer_fetch.unpack(archive, "0" * 64, ["tests/b.py"], tmp_path / "src")
    assert not (tmp_path / "src").exists()


def test_unpack_names_a_pinned_member_the_archive_lacks(tmp_path):
    archive, sha = _archive(tmp_path, {"tests/b.py": b"b"})
    with pytest.raises(peer_fetch.FetchError, match="tests/gone.py"):
        peer_fetch.unpack(archive, sha, ["tests/b.py", "tests/gone.py"], tmp_path / "src")


def test_download_keeps_nothing_when_the_hash_differs(tmp_path):
    archive, sha = _archive(tmp_path, {"tests/b.py": b"b"})
    dest = tmp_path / "cache" / archive.name
    with pytest.raises(peer_fetch.FetchError, match="is not the expected"):
        peer_fetch.download(archive.as_uri(), dest, "0" * 64)
    assert list(dest.parent.iterdir()) == []
    assert peer_fetch.download(archive.as_uri(), dest, sha) == dest
    assert dest.read_bytes() == archive.read_bytes()


@pytest.mark.peer
def test_vllms_scheduler_tests_match_stock_or_a_listed_difference():
    """What `make peer-test` runs: vLLM 0.32.0's own scheduler tests under
    stock and every vspec variant (fetches the pinned sdist on first use).
    Exit 1: an unlisted difference, a stock failure or an idle variant;
    exit 2: the fetch, the vLLM pin or pytest itself failed."""
    run = run_command([sys.executable, str(peer_suite.HERE / "peer_suite.py")], timeout_s=2400)
    assert run.returncode == 0, (
        f"peer suite exited {run.returncode} (make peer-test reproduces it; "
        f"results/peer-suite.json has the comparison):\n{run.stdout[-12000:]}\n"
        f"{run.stderr[-4000:]}")
