"""The peer suite: its own machinery (no vLLM, no network: how outcomes are
compared with stock, how the variant is taken off a test id, what the fetch
refuses to unpack), then the suite itself (`make peer-test`, about 1.5 min on
this 2-core host), so that `make test` fails on any difference from vLLM's
stock scheduler that suite.toml does not list with its reason."""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tomllib

import peer_fetch
import peer_suite
import pytest
from peer_plugin import base_id, excluded_reason, variant_token

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


@pytest.mark.parametrize("nodeid, expected", [
    ("f.py::t[peer=online-0]", "f.py::t"),
    ("f.py::t[peer=online-0-False]", "f.py::t[False]"),
    ("f.py::t[False-peer=online-0]", "f.py::t[False]"),
    ("f.py::t[1-peer=online-0-x]", "f.py::t[1-x]"),
])
def test_base_id_removes_the_variant_wherever_pytest_put_it(nodeid, expected):
    assert variant_token("online-0") == "peer=online-0"
    assert base_id(nodeid, "online-0") == expected


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
    with pytest.raises(peer_fetch.FetchError, match="does not match the pin"):
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
    # The inner pytest must not inherit this run's options (-k, -x, ...).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, str(peer_suite.HERE / "peer_suite.py")],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (
        f"peer suite exited {proc.returncode} (make peer-test reproduces it; "
        f"results/peer-suite.json has the comparison):\n"
        f"{proc.stdout[-12000:]}\n{proc.stderr[-4000:]}")
