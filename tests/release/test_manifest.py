"""Extension Manager manifest: one static file whose identity, version and
entry points agree with the distribution, readable without runtime code."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

import vllm_vspec
from vllm_vspec import manifests

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
BUNDLE_GROUP = "vllm_hust.extension_bundles"


def test_exactly_one_manifest_file_ships_in_the_package():
    files = [p.name for p in resources.files(manifests).iterdir() if p.name.endswith(".json")]
    assert files == [manifests.MANIFEST_FILE]


def test_manifest_declares_the_extension_identity():
    m = manifests.load_manifest()
    assert (m["schema_version"], m["kind"], m["extension_id"]) == (
        "0.2-experimental", "in_process_plugin", "org.vllm-hust.vspec")
    assert m["distribution"] == PYPROJECT["project"]["name"]


def test_manifest_version_matches_package_pyproject_and_installed_metadata():
    versions = {"manifest": manifests.load_manifest()["extension_version"],
                "vllm_vspec.__version__": vllm_vspec.__version__,
                "pyproject (dynamic, from __version__)": PYPROJECT["tool"]["setuptools"]["dynamic"][
                    "version"]["attr"] == "vllm_vspec.__version__" and vllm_vspec.__version__,
                "installed": importlib.metadata.version("vllm-vspec")}
    assert len(set(versions.values())) == 1, versions


def test_manifest_entry_points_are_exactly_the_runtime_entry_points_of_pyproject():
    declared = {group: eps for group, eps in PYPROJECT["project"]["entry-points"].items()
                if group != BUNDLE_GROUP}
    m = manifests.load_manifest()
    assert m["entry_points"] == declared
    assert m["entry_points"]["vllm.general_plugins"] == {"vspec": "vllm_vspec:register"}
    assert m["console_scripts"] == PYPROJECT["project"]["scripts"]


def test_installed_metadata_carries_the_bundle_and_the_runtime_entry_points():
    m = manifests.load_manifest()
    for group, eps in {**m["entry_points"], BUNDLE_GROUP: {
            m["extension_id"]: "vllm_vspec.manifests:load_manifest"}}.items():
        installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)
                     if ep.dist and ep.dist.name == "vllm-vspec"}
        assert installed == eps, (group, installed)


def test_the_manifest_is_package_data():
    assert "manifests/*.json" in PYPROJECT["tool"]["setuptools"]["package-data"]["vllm_vspec"]


def test_the_manifests_module_imports_only_the_standard_library():
    tree = ast.parse(Path(manifests.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}, imported


def test_loading_the_bundle_entry_point_runs_no_runtime_code():
    # A fresh interpreter, as the Extension Manager would use. vllm_vspec's
    # own __init__ imports config (standard library only); nothing else may load.
    probe = (
        "import importlib.metadata, json, sys\n"
        f"ep, = [e for e in importlib.metadata.entry_points(group={BUNDLE_GROUP!r})"
        " if e.name == 'org.vllm-hust.vspec']\n"
        "manifest = ep.load()()\n"
        "mods = sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('vllm', 'vllm_vspec', 'torch', 'vllm_ascend'))\n"
        "print(json.dumps({'id': manifest['extension_id'], 'modules': mods}))\n")
    out = json.loads(subprocess.run([sys.executable, "-c", probe], check=True,
                                    capture_output=True, text=True).stdout)
    assert out["id"] == "org.vllm-hust.vspec"
    assert out["modules"] == ["vllm_vspec", "vllm_vspec.config", "vllm_vspec.manifests"]
