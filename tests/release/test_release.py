"""Release audit (release_check.py) and lifecycle (`vllm-vspec manage`) of
the portable package, on wheels built from copies of this checkout and a
scratch virtual environment (it sees vLLM through a .pth line to this venv's
site-packages, but none of this checkout's vllm_vspec)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
import release_check  # noqa: E402  (top-level script, like build_overlay)

from vllm_vspec import __version__  # noqa: E402


def _bump(version: str) -> str:
    major, minor, patch = (int(x) for x in version.split(".")[:3])
    return f"{major}.{minor}.{patch + 1}"


NEXT = _bump(__version__)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    """This checkout's wheel (built twice: "twin"), and one of the next
    version (its __version__ and manifest bumped in a copy)."""
    tmp = tmp_path_factory.mktemp("wheels")
    now, twin = release_check.two_builds(REPO, tmp, release_check.head_epoch())
    src = release_check.copy_sources(tmp / "src-next")
    for rel in ("overlay/vllm_vspec/__init__.py",
                "overlay/vllm_vspec/manifests/vllm-hust-extension-v0.2.json"):
        f = src / rel
        f.write_text(f.read_text().replace(f'"{__version__}"', f'"{NEXT}"'))
    nxt = release_check.build_wheel(src, tmp / "next")
    return {__version__: now, NEXT: nxt, "twin": twin}


# ----------------------------------------------------------- release audit
def test_the_wheel_of_this_checkout_passes_the_file_version_and_entry_point_checks(wheels):
    wheel = wheels[__version__]
    assert release_check.check_wheel_files(wheel) is None
    assert release_check.check_one_version(wheel) is None
    assert release_check.check_entry_points(wheel) is None


def test_a_wheel_carrying_tests_or_bytecode_fails_the_file_check(wheels, tmp_path):
    bad = tmp_path / wheels[__version__].name
    shutil.copy(wheels[__version__], bad)
    with zipfile.ZipFile(bad, "a") as z:
        z.writestr("tests/test_x.py", "")
        z.writestr("vllm_vspec/__pycache__/x.cpython-311.pyc", b"")
    problem = release_check.check_wheel_files(bad)
    assert problem and "tests/test_x.py" in problem and "x.cpython-311.pyc" in problem


def test_a_manifest_version_other_than_the_packages_fails_the_version_check(wheels, tmp_path):
    repo = release_check.copy_sources(tmp_path / "src")
    m = repo / "overlay/vllm_vspec/manifests/vllm-hust-extension-v0.2.json"
    m.write_text(m.read_text().replace(f'"{__version__}"', '"9.9.9"'))
    problem = release_check.check_one_version(wheels[__version__], repo)
    assert problem and "manifest extension_version '9.9.9'" in problem


def test_an_untracked_file_fails_the_clean_tree_check(tmp_path):
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "a").write_text("a")
    subprocess.run(git + ["-C", str(tmp_path), "add", "a"], check=True)
    subprocess.run(git + ["-C", str(tmp_path), "commit", "-qm", "a"], check=True)
    assert release_check.check_clean_tree(tmp_path) is None
    (tmp_path / "b").write_text("b")
    assert "untracked" in release_check.check_clean_tree(tmp_path) or \
        "?? b" in release_check.check_clean_tree(tmp_path)


def test_two_builds_of_one_commit_are_byte_identical(wheels):
    assert release_check.sha256(wheels[__version__]) == release_check.sha256(wheels["twin"])


# --------------------------------------------------------------- lifecycle
@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    """A new venv (with pip) that sees this venv's packages (vLLM, torch)
    through a .pth line; this checkout's vllm_vspec stays invisible (its
    editable .pth is not processed from there)."""
    root = tmp_path_factory.mktemp("scratch")
    venv.EnvBuilder(with_pip=True).create(root)
    python = root / "bin" / "python"
    # This venv's packages less our own editable install (its dist-info would
    # make vllm-vspec look installed there), as a folder of links.
    host = root / "host-packages"
    host.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if not entry.name.startswith(("vllm_vspec", "__editable__")):
            (host / entry.name).symlink_to(entry)
    (_site(python) / "host-packages.pth").write_text(f"{host}\n")
    return python


def _site(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def manage(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vllm_vspec.cli", "manage", *args,
                           "--python", str(python)], capture_output=True, text=True)


def pip_freeze(python: Path) -> set[str]:
    out = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"],
                         capture_output=True, text=True, check=True).stdout
    return {line for line in out.splitlines() if not line.lower().startswith("vllm-vspec==")}


def test_nothing_installed_is_reported_and_changes_are_refused(scratch):
    status = manage(scratch, "status", "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["identity"] is None
    refused = manage(scratch, "disable")
    assert refused.returncode == 2 and "not installed" in refused.stderr


def test_an_installed_wheel_is_valid_and_enabled_by_default(scratch, wheels):
    subprocess.run([str(scratch), "-m", "pip", "install", "--no-deps", "--quiet",
                    str(wheels[__version__])], check=True)
    s = json.loads(manage(scratch, "status", "--json").stdout)
    assert (s["identity"], s["version"], s["enabled_by_default"]) == ("portable", __version__, True)
    valid = manage(scratch, "validate", "--json")
    assert valid.returncode == 0 and json.loads(valid.stdout) == {"valid": True, "problems": []}


def test_disable_dry_run_changes_nothing_and_disable_sets_the_default(scratch):
    dry = manage(scratch, "disable", "--dry-run")
    assert dry.returncode == 0 and '{"enabled": false}' in dry.stdout
    assert json.loads(manage(scratch, "status", "--json").stdout)["enabled_by_default"] is True
    assert manage(scratch, "disable").returncode == 0
    read = subprocess.run([str(scratch), "-c", "from vllm_vspec.core.install_state import "
                           "default_enabled; print(default_enabled())"],
                          capture_output=True, text=True, check=True)
    assert read.stdout.strip() == "False"
    assert manage(scratch, "enable").returncode == 0
    assert json.loads(manage(scratch, "status", "--json").stdout)["enabled_by_default"] is True


def test_upgrade_and_rollback_refuse_the_wrong_direction(scratch, wheels):
    same = manage(scratch, "upgrade", "--wheel", str(wheels[__version__]))
    assert same.returncode == 2 and "already installed" in same.stderr
    back = manage(scratch, "rollback", "--wheel", str(wheels[NEXT]))
    assert back.returncode == 2 and "newer" in back.stderr and "upgrade --wheel" in back.stderr


def test_a_wheel_that_is_not_ours_is_refused(scratch, tmp_path):
    other = tmp_path / "other-1.0-py3-none-any.whl"
    with zipfile.ZipFile(other, "w") as z:
        z.writestr("other-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: other\nVersion: 1.0\n")
    refused = manage(scratch, "upgrade", "--wheel", str(other))
    assert refused.returncode == 2 and "other 1.0" in refused.stderr


def test_upgrade_then_rollback_change_only_our_distribution(scratch, wheels):
    before = pip_freeze(scratch)
    dry = manage(scratch, "upgrade", "--wheel", str(wheels[NEXT]), "--dry-run")
    assert re.search(r"-m pip install --no-deps --no-cache-dir --force-reinstall \S+"
                     + re.escape(wheels[NEXT].name), dry.stdout), dry.stdout
    assert json.loads(manage(scratch, "status", "--json").stdout)["version"] == __version__
    up = manage(scratch, "upgrade", "--wheel", str(wheels[NEXT]))
    assert up.returncode == 0, up.stderr
    assert json.loads(manage(scratch, "status", "--json").stdout)["version"] == NEXT
    down = manage(scratch, "rollback", "--wheel", str(wheels[__version__]))
    assert down.returncode == 0, down.stderr
    assert json.loads(manage(scratch, "status", "--json").stdout)["version"] == __version__
    assert pip_freeze(scratch) == before


def test_uninstall_removes_our_package_and_state_only(scratch):
    manage(scratch, "disable")
    before = pip_freeze(scratch)
    state = Path(json.loads(manage(scratch, "status", "--json").stdout)["state_path"])
    assert state.is_file()
    gone = manage(scratch, "uninstall")
    assert gone.returncode == 0, gone.stderr
    assert json.loads(manage(scratch, "status", "--json").stdout)["identity"] is None
    assert not state.exists() and pip_freeze(scratch) == before


def test_uninstall_reports_a_copy_still_visible_from_a_parent_environment(scratch, wheels, tmp_path):
    parent = tmp_path / "parent-site"
    zipfile.ZipFile(wheels[__version__]).extractall(parent)
    site = _site(scratch)
    (site / "parent.pth").write_text(f"{parent}\n")
    try:
        subprocess.run([str(scratch), "-m", "pip", "install", "--no-deps", "--quiet",
                        "--force-reinstall", str(wheels[__version__])], check=True)
        out = manage(scratch, "uninstall")
        assert out.returncode == 1 and "parent environment" in out.stderr, out.stderr
    finally:
        (site / "parent.pth").unlink()


# ------------------------------------------- the installation default, read
def test_a_disabled_environment_runs_stock_unless_the_launch_enables_vspec(tmp_path, monkeypatch):
    from conftest import engine_config
    from vllm_vspec.core import install_state
    from vllm_vspec.hosts import wiring

    monkeypatch.setenv(install_state.STATE_ENV, str(tmp_path / "state.json"))
    assert wiring.resolve(engine_config(vspec={})) is not None
    install_state.write_state(False)
    assert wiring.resolve(engine_config(vspec={})) is None
    assert wiring.resolve(engine_config(vspec={"enabled": True})) is not None


def test_a_state_file_that_is_not_a_choice_stops_start_up_naming_the_file(tmp_path, monkeypatch):
    from vllm_vspec.core import install_state

    bad = tmp_path / "state.json"
    bad.write_text('{"enabled": "maybe"}')
    monkeypatch.setenv(install_state.STATE_ENV, str(bad))
    with pytest.raises(ValueError, match="state.json.*manage enable"):
        install_state.default_enabled()
