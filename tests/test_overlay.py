"""The Ascend overlay wheel, built from the real pinned vLLM-Ascend sdist.

The sdist (and the vLLM 0.23.0 wheel the ABI check reads) are downloaded once
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
import sys
import zipfile
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
import build_overlay  # noqa: E402
from vllm_vspec import abi_check  # noqa: E402

CACHE = REPO / ".cache"


@pytest.fixture(scope="module")
def pin() -> build_overlay.Pin:
    default, pins = build_overlay.load_pins()
    return pins[default]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(wheel, patched tree) of one full build."""
    work = tmp_path_factory.mktemp("work")
    wheel = build_overlay.build(None, CACHE, work, tmp_path_factory.mktemp("dist"))
    (tree,) = work.glob("vllm-ascend-*/tree")
    return wheel, tree


@pytest.fixture(scope="module")
def members(built) -> dict[str, bytes]:
    with zipfile.ZipFile(built[0]) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def dist_info(members: dict[str, bytes], leaf: str) -> str:
    (name,) = [n for n in members if n.endswith(f".dist-info/{leaf}")]
    return members[name].decode()


def test_one_wheel_named_after_our_version_and_the_host(built, pin):
    version = build_overlay.our_project()["version"]
    assert built[0].name == f"vllm_ascend_vspec-{version}+ascend{pin.version}-py3-none-any.whl"
    assert [p.name for p in built[0].parent.iterdir()] == [built[0].name]


def test_wheel_holds_the_patched_host_and_every_overlay_file(members):
    platform = members["vllm_ascend/platform.py"].decode()
    assert "scheduler_cls_for(vllm_config)" in platform  # patch 0002
    assert "proposer_cls_for" in members["vllm_ascend/spec_decode/__init__.py"].decode()
    assert "vllm_ascend/worker/model_runner_v1.py" in members
    for src, rel in build_overlay.overlay_files():
        assert rel in members, rel
    assert members["vllm_ascend/vspec/proposers.py"] == \
        (REPO / "overlay/vllm_ascend/vspec/proposers.py").read_bytes()
    # The presets, through the package's link to configs/ (`vllm-vspec serve --preset`).
    assert members["vllm_vspec/_configs/draft.toml"] == (REPO / "configs/draft.toml").read_bytes()
    assert not [n for n in members if "__pycache__" in n or n.endswith(".pyc")]


def test_record_lists_every_file_with_its_hash(members):
    record = dist_info(members, "RECORD").splitlines()
    listed = {}
    for line in record:
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


def test_metadata_names_our_distribution_and_keeps_the_host_requirements(members, pin):
    meta = dist_info(members, "METADATA")
    assert "Name: vllm_ascend_vspec\n" in meta
    assert f"Version: {build_overlay.our_project()['version']}+ascend{pin.version}\n" in meta
    assert f"Requires-Dist: torch-npu=={pin.torch_npu}\n" in meta
    assert dist_info(members, "top_level.txt").split() == ["vllm_ascend", "vllm_vspec"]


def test_build_info_records_host_patches_and_kernels_off(members, pin):
    info = json.loads(dist_info(members, build_overlay.BUILD_INFO))
    assert info["host"] == {"name": "vllm-ascend", "version": pin.version,
                            "sdist": pin.sdist, "sha256": pin.sha256}
    series = build_overlay.read_series(pin.patch_dir)
    assert [p["name"] for p in info["patches"]] == [p.name for p in series]
    assert info["custom_kernels"]["enabled"] is False  # no CANN on CI
    assert "CANN not found" in info["custom_kernels"]["reason"]
    assert info["host_expects"]["vllm"] == pin.vllm


def test_a_rebuild_shows_each_stage_and_gives_the_same_bytes(built, tmp_path, capfd):
    again = build_overlay.build(None, CACHE, tmp_path / "work", tmp_path / "dist")
    stages = [line.split()[:2] for line in capfd.readouterr().err.splitlines()
              if line.startswith("[")]
    assert stages == [[f"[{i}/7]", s] for i, s in enumerate(build_overlay.BUILD_STAGES, 1)]
    assert again.name == built[0].name
    assert build_overlay.sha256_of(again) == build_overlay.sha256_of(built[0])


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
    failures = []
    files = sorted((tree / "vllm_ascend").rglob("*.py")) + sorted((tree / "vllm_vspec").rglob("*.py"))
    for path in files:
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as e:
            failures.append(f"{path.relative_to(tree)}:{e.lineno}: {e.msg}")
    assert failures == []
    shipped = {n for n in members if n.endswith(".py")}
    assert shipped <= {p.relative_to(tree).as_posix() for p in files}  # all of the wheel


def test_abi_check_passes_against_the_patched_tree(built, pin):
    tree = built[1]
    vllm_023 = build_overlay.fetch_vllm_source(pin, CACHE)
    report = abi_check.check_host("patched", {"vllm_ascend": tree / "vllm_ascend",
                                           "vllm_ascend.vspec": tree / "vllm_ascend" / "vspec",
                                           "vllm": vllm_023, "vllm_vspec": tree / "vllm_vspec"})
    assert report.findings == [], "\n".join(f.line() for f in report.findings)
    eagle = report.classes["vllm_ascend.vspec.proposers.VSpecEagleProposer"]
    assert eagle == ["vllm_ascend.spec_decode.eagle_proposer.AscendEagleProposer",
                     "vllm.v1.spec_decode.eagle.EagleProposer",
                     "vllm_ascend.spec_decode.llm_base_proposer.AscendSpecDecodeBaseProposer",
                     "vllm.v1.spec_decode.llm_base_proposer.SpecDecodeBaseProposer"]
    assert "vllm_ascend.vspec.sampler.VSpecAscendRejectionSampler" in report.classes


@pytest.fixture(scope="module")
def pristine(pin, tmp_path_factory) -> Path:
    """The pinned sdist's patched files, unpacked, untouched."""
    sdist = build_overlay.fetch_sdist(pin, CACHE)
    track = build_overlay.touched_paths(build_overlay.read_series(pin.patch_dir))
    return build_overlay.unpack(sdist, tmp_path_factory.mktemp("pristine") / "tree", track)


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

    with pytest.raises(build_overlay.PatchError) as err:
        build_overlay.apply_series(tree, build_overlay.read_series(patches))

    message = str(err.value)
    assert message.startswith("patch 0002-select-vspec-scheduler.patch does not apply: "
                              "hunk #1 of vllm_ascend/platform.py (@@ -724,6 +724,14 @@)"), message
    assert "proposer_cls_for" in (tree / "vllm_ascend/spec_decode/__init__.py").read_text()
    assert (tree / "vllm_ascend/worker/model_runner_v1.py").read_bytes() == runner_before


def test_retarget_to_the_pinned_revision_is_a_no_op(pin, tmp_path):
    pins_file = tmp_path / "hosts.toml"
    shutil.copyfile(build_overlay.PINS_FILE, pins_file)
    before = sorted(p.name for p in build_overlay.PATCHES_DIR.iterdir())

    reports, outcome = build_overlay.retarget(pin.version, CACHE, tmp_path / "work",
                                              pins_file=pins_file)

    assert [(r.status, r.conflicts) for r in reports] == [("applied", [])] * len(reports)
    assert outcome == f"no-op: {pin.version} is already pinned and every patch applies"
    assert pins_file.read_text() == build_overlay.PINS_FILE.read_text()
    assert sorted(p.name for p in build_overlay.PATCHES_DIR.iterdir()) == before


def _cache_with_pinned_sdist(pin, tmp_path: Path) -> Path:
    """A private cache holding the pinned sdist (retarget's 3-way base), so a
    test's new revisions stay out of .cache/."""
    cache = tmp_path / "cache"
    (cache / "sdist").mkdir(parents=True)
    shutil.copyfile(build_overlay.fetch_sdist(pin, CACHE), cache / "sdist" / pin.sdist)
    return cache


def _new_revision(pristine: Path, tmp_path: Path, version: str, edit) -> Path:
    """An sdist of `version` made from the pinned files, platform.py edited."""
    top = tmp_path / "src" / f"vllm_ascend-{version}"
    shutil.copytree(pristine, top, ignore=shutil.ignore_patterns(".git"))
    info = top / "PKG-INFO"
    info.write_text(re.sub(r"(?m)^Version: .*$", f"Version: {version}", info.read_text()))
    platform = top / "vllm_ascend/platform.py"
    platform.write_text(edit(platform.read_text()))
    sdist = tmp_path / f"vllm_ascend-{version}.tar.gz"
    shutil.make_archive(str(sdist).removesuffix(".tar.gz"), "gztar", top.parent, top.name)
    return sdist


def test_retarget_to_a_shifted_host_writes_its_patches_and_pin(pin, pristine, tmp_path):
    sdist = _new_revision(pristine, tmp_path, "0.23.9", lambda s: "# moved\n# down\n" + s)
    pins_file, patches_root = tmp_path / "hosts.toml", tmp_path / "patches"
    shutil.copyfile(build_overlay.PINS_FILE, pins_file)
    shutil.copytree(build_overlay.PATCHES_DIR, patches_root)

    reports, outcome = build_overlay.retarget(str(sdist), _cache_with_pinned_sdist(pin, tmp_path),
                                              tmp_path / "work", pins_file=pins_file,
                                              patches_root=patches_root)

    assert {r.status for r in reports} == {"applied"}
    assert outcome.startswith(f"wrote {patches_root / '0.23.9'}")
    new = build_overlay.read_series(patches_root / "0.23.9")
    assert [p.name for p in new] == [p.name for p in build_overlay.read_series(pin.patch_dir)]
    assert "@@ -726,6 +726,14 @@" in (patches_root / "0.23.9/0002-select-vspec-scheduler.patch").read_text()
    default, pins = build_overlay.load_pins(pins_file)
    assert default == "0.23.9"
    assert pins["0.23.9"].sha256 == build_overlay.sha256_of(sdist)
    assert pins[pin.version] == pin


def test_retarget_reports_conflicting_hunks_and_writes_nothing(pin, pristine, tmp_path):
    def rewrite_around_our_insertion(text: str) -> str:
        old = ("            import vllm_ascend.patch.platform.patch_profiling_chunk  # noqa\n\n"
               "        cp_size = ")
        assert old in text
        return text.replace(old, "            import vllm_ascend.patch.platform.chunking  # noqa\n"
                                 "        # context parallel size\n        cp_size = ")

    sdist = _new_revision(pristine, tmp_path, "0.24.0", rewrite_around_our_insertion)
    pins_file = tmp_path / "hosts.toml"
    shutil.copyfile(build_overlay.PINS_FILE, pins_file)

    reports, outcome = build_overlay.retarget(str(sdist), _cache_with_pinned_sdist(pin, tmp_path),
                                              tmp_path / "work", pins_file=pins_file)

    status = {r.patch: (r.status, r.conflicts) for r in reports}
    assert status["0002-select-vspec-scheduler.patch"] == (
        "needs rebase", ["#1 of vllm_ascend/platform.py (@@ -724,6 +724,14 @@)"])
    assert status["0001-route-spec-decode-to-vspec-proposers.patch"] == ("applied", [])
    assert outcome.startswith("nothing written")
    assert pins_file.read_text() == build_overlay.PINS_FILE.read_text()
    assert not (build_overlay.PATCHES_DIR / "0.24.0").exists()


# ------------------------------------------------------------------------------
# The NPU-side decisions that need no NPU: the step's gamma and the routing.
# (vllm_ascend.vspec resolves to overlay/vllm_ascend/vspec in a checkout.)
def _engine_config(method="eagle", k=4, vspec=None, async_scheduling=False, scheduler_cls=None):
    from conftest import engine_config

    return engine_config(method, k, vspec, device="npu", async_scheduling=async_scheduling,
                         scheduler_cls=scheduler_cls,
                         worker_cls="vllm_ascend.worker.worker.NPUWorker")


def test_step_gamma_defaults_to_k_and_enforces_the_verify_width():
    from types import SimpleNamespace

    from vllm_ascend.vspec.gamma import step_gamma
    from vllm_vspec.config import VSpecConfigError

    assert step_gamma(SimpleNamespace(), 4) == 4  # vLLM 0.23 output without the field
    assert step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=0), 4) == 0
    with pytest.raises(VSpecConfigError, match=r"num_spec_tokens_to_schedule=5 .* \[0, 4\]"):
        step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=5), 4)
    with pytest.raises(VSpecConfigError, match=r"=16 .*1 \+ gamma <= 16"):
        step_gamma(SimpleNamespace(num_spec_tokens_to_schedule=16), 20)


def test_vspec_is_on_by_default_for_eagle_and_draft_model_only():
    from vllm_ascend.vspec import routing

    assert routing.vspec_settings(_engine_config("eagle")).policy == "online"
    assert routing.vspec_settings(_engine_config("draft_model")).max_gamma == 4
    assert routing.vspec_settings(_engine_config("ngram")) is None
    assert routing.vspec_settings(_engine_config(vspec={"enabled": False})) is None
    assert routing.proposer_cls_for("eagle", _engine_config(vspec={"enabled": False})) is None


def test_bad_vspec_settings_fail_at_startup_naming_the_key():
    from vllm_ascend.vspec import routing
    from vllm_vspec.config import VSpecConfigError

    with pytest.raises(VSpecConfigError, match="vspec.max_gamma=9"):
        routing.scheduler_cls_for(_engine_config(vspec={"max_gamma": 9}))


def test_scheduler_follows_async_scheduling_and_refuses_a_competing_scheduler():
    from vllm_ascend.vspec import routing

    from vllm_vspec.wiring import SCHEDULER_CLS

    # One path: VSpecScheduler builds its async subclass under async scheduling.
    assert routing.scheduler_cls_for(_engine_config()) == SCHEDULER_CLS
    assert routing.scheduler_cls_for(_engine_config(async_scheduling=True)) == SCHEDULER_CLS
    assert routing.scheduler_cls_for(_engine_config(vspec={"enabled": False})) is None
    chunk = "vllm_ascend.core.scheduler_profiling_chunk.ProfilingChunkScheduler"
    with pytest.raises(ValueError, match=f"scheduler_cls='{chunk}' conflicts with vspec"):
        routing.scheduler_cls_for(_engine_config(scheduler_cls=chunk))


def test_strict_acceptance_keeps_the_hosts_rejection_sampler():
    from vllm_ascend.vspec import routing

    class HostSampler:
        pass

    assert routing.rejection_sampler_factory(_engine_config(), HostSampler) is HostSampler
    off = _engine_config(vspec={"enabled": False, "acceptance": "margin"})
    assert routing.rejection_sampler_factory(off, HostSampler) is HostSampler


class _DraftModel(torch.nn.Module):
    """Stands in for a draft model: compute_logits returns what it is given."""

    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(2, 2)

    def forward(self, x):
        return x + 1

    def compute_logits(self, hidden_states):
        return hidden_states


def _proposer_with_entropy_stop(**vspec):
    from types import SimpleNamespace

    from vllm_ascend.vspec.entropy_tap import EntropyTap
    from vllm_vspec.config import VSpecConfig

    proposer = SimpleNamespace(model=_DraftModel(), max_num_speculative_tokens=3,
                               runner=SimpleNamespace(max_num_reqs=4),
                               device=torch.device("cpu"))
    settings = VSpecConfig.from_dict({"entropy_stop": True, **vspec}, 3)
    return proposer, EntropyTap.maybe_install(proposer, settings)


def test_entropy_tap_is_transparent_and_installed_only_when_on():
    from vllm_ascend.vspec.entropy_tap import EntropyTap
    from vllm_vspec.config import VSpecConfig

    proposer, tap = _proposer_with_entropy_stop()
    assert proposer.model is tap
    assert proposer.model(torch.zeros(1)).item() == 1.0  # forward reaches the draft model
    assert proposer.model.lm_head is tap.inner.lm_head  # so do its attributes
    assert EntropyTap.maybe_install(proposer, VSpecConfig()) is None  # entropy_stop off


def test_entropy_tap_invalidates_drafts_from_the_first_uncertain_position():
    _, tap = _proposer_with_entropy_stop(entropy_topk=2, entropy_threshold=0.5)
    sure, unsure = [20.0, 0.0], [0.0, 0.0]  # entropy ~0 and ln 2 > 0.5 ** 2
    tap.reset()
    for row in ([sure, sure], [sure, unsure], [unsure, sure]):  # draft positions 0, 1, 2
        tap.compute_logits(torch.tensor(row))
    draft = torch.tensor([[11, 12, 13], [21, 22, 23]])
    assert tap.cut(draft).tolist() == [[11, 12, -1], [21, -1, -1]]


# ------------------------------------------------------------------------------
# The NPU proposer mixin over a stand-in host. The real AscendSpecDecodeBaseProposer
# needs torch_npu; the stand-in keeps only what the mixin relies on (checked
# against the real host by the ABI test above): K assigned in __init__ and
# sizing buffers, `_runnable` set to the merged draft loop and wrapped for full
# graphs in load_model, a loop that drafts `num_speculative_tokens` tokens.
class _Wrapper:
    def __init__(self, runnable, vllm_config, runtime_mode, cudagraph_options=None, *,
                 use_eagle=False, enable_enpu=False):
        self.runnable, self.runtime_mode = runnable, runtime_mode
        self.use_eagle, self.enable_enpu = use_eagle, enable_enpu
        self.replays = 0

    def __call__(self, **kwargs):
        self.replays += 1
        return self.runnable(**kwargs)


class _HostProposer:
    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config, self.device, self.runner = vllm_config, device, runner
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        self.slot_mapping_group = [None] * self.num_speculative_tokens
        self._runnable = self._run_merged_draft
        self.draft_passes, self.dummy_runs = [], []

    def load_model(self, model):
        from vllm.config import CUDAGraphMode

        if self.vllm_config.full_graphs:
            self._runnable = _Wrapper(self._run_merged_draft, self.vllm_config,
                                      runtime_mode=CUDAGraphMode.FULL)

    def _run_merged_draft(self, batch_size):
        self.draft_passes.append(self.num_speculative_tokens)
        return torch.arange(self.num_speculative_tokens).repeat(batch_size, 1)

    def _propose(self, target_token_ids=None, common_attn_metadata=None, scheduler_output=None):
        return self._runnable(batch_size=common_attn_metadata.batch_size())

    def dummy_run(self, num_tokens, in_graph_capturing=False, aclgraph_runtime_mode=None,
                  is_profile=False):
        self.dummy_runs.append((self.num_speculative_tokens, self._runnable))


@pytest.fixture
def proposers(monkeypatch):
    """vllm_ascend.vspec.proposers imported over the stand-in host modules."""
    import types

    host = {"vllm_ascend.compilation": {}, "vllm_ascend.compilation.acl_graph":
            {"ACLGraphWrapper": _Wrapper}, "vllm_ascend.spec_decode": {},
            "vllm_ascend.spec_decode.draft_proposer": {"AscendDraftModelProposer": _HostProposer},
            "vllm_ascend.spec_decode.eagle_proposer": {"AscendEagleProposer": _HostProposer}}
    for name, attrs in host.items():
        module = types.ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.proposers", raising=False)
    import vllm_ascend.vspec.proposers as module

    yield module
    sys.modules.pop("vllm_ascend.vspec.proposers", None)


def _make(proposers, k=4, full_graphs=False):
    config = _engine_config("eagle", k)
    config.full_graphs = full_graphs
    proposer = proposers.VSpecEagleProposer(config, torch.device("cpu"))
    proposer.load_model(model=None)
    return proposer


def _step(gamma=None, batch=2):
    from types import SimpleNamespace

    out = SimpleNamespace() if gamma is None else SimpleNamespace(num_spec_tokens_to_schedule=gamma)
    meta = SimpleNamespace(batch_size=lambda: batch)
    return dict(target_token_ids=None, common_attn_metadata=meta, scheduler_output=out)


def test_buffers_are_sized_by_k_and_k_is_read_outside_a_step(proposers):
    proposer = _make(proposers, k=4)
    assert len(proposer.slot_mapping_group) == 4
    assert proposer.num_speculative_tokens == proposer.max_num_speculative_tokens == 4


def test_a_step_drafts_the_schedulers_gamma_then_k_is_back(proposers):
    proposer = _make(proposers, k=4)
    assert proposer._propose(**_step(gamma=2)).shape == (2, 2)
    assert proposer._propose(**_step()).shape == (2, 4)  # vLLM 0.23 output: no field
    assert proposer.draft_passes == [2, 4]
    assert proposer.num_speculative_tokens == 4


def test_gamma_zero_runs_the_first_draft_pass_and_returns_no_drafts(proposers):
    proposer = _make(proposers, k=4)
    assert proposer._propose(**_step(gamma=0)).shape == (2, 0)
    assert proposer.draft_passes == [1]  # the draft KV cache saw this step's tokens


def test_a_gamma_over_k_is_refused_and_leaves_k_in_place(proposers):
    from vllm_vspec.config import VSpecConfigError

    proposer = _make(proposers, k=4)
    with pytest.raises(VSpecConfigError, match="num_spec_tokens_to_schedule=5"):
        proposer._propose(**_step(gamma=5))
    assert proposer.num_speculative_tokens == 4 and proposer.draft_passes == []


def test_full_graphs_get_one_captured_graph_per_gamma(proposers):
    from vllm.config import CUDAGraphMode

    proposer = _make(proposers, k=3, full_graphs=True)
    proposer.dummy_run(num_tokens=8, in_graph_capturing=True,
                       aclgraph_runtime_mode=CUDAGraphMode.FULL, is_profile=False)
    gammas = [g for g, _ in proposer.dummy_runs]
    wrappers = [w for _, w in proposer.dummy_runs]
    assert gammas == [1, 2, 3]
    assert len({id(w) for w in wrappers}) == 3 and all(isinstance(w, _Wrapper) for w in wrappers)
    proposer._propose(**_step(gamma=2))
    assert [w.replays for w in wrappers] == [0, 1, 0]  # the gamma-2 graph
    assert proposer.draft_passes == [2]


def test_profiling_dummy_runs_use_k_once(proposers):
    from vllm.config import CUDAGraphMode

    proposer = _make(proposers, k=3, full_graphs=True)
    proposer.dummy_run(num_tokens=8, in_graph_capturing=True,
                       aclgraph_runtime_mode=CUDAGraphMode.FULL, is_profile=True)
    assert [g for g, _ in proposer.dummy_runs] == [3]
