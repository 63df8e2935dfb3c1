"""The package's layers import only downwards (README "Layout").

Each layer's modules are imported together in a fresh interpreter (or
after the layers before it in its chain, below), which then reports what
else got loaded: a layer that pulls in torch, vLLM or a higher layer fails
here, naming the modules. `commands/` sits on top: no module outside it
imports it (checked on the source, since the CLI loads commands by module
path, never by import)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "overlay" / "vllm_vspec"
LAYERS = ("core", "kernels", "sim", "replay", "hosts", "launch", "tools", "bench", "commands")

# layer -> (third-party roots it may not load, vllm_vspec layers it may not load).
# config.py and the package root are below every layer.
RULES = {
    "core": ({"torch", "vllm"}, {"kernels", "sim", "hosts", "launch", "tools", "bench", "commands"}),
    "kernels": ({"vllm"}, {"sim", "hosts", "launch", "tools", "bench", "commands"}),
    "sim": ({"torch", "vllm"}, {"kernels", "hosts", "launch", "tools", "bench", "commands"}),
    # replay scores with sim's loop; its recorder and cost measurement load
    # vLLM, tools and bench only when they run.
    "replay": ({"torch", "vllm"}, {"kernels", "hosts", "launch", "tools", "bench", "commands"}),
    # hosts/wiring.py is read by the launcher: no torch, no vLLM (hosts/vllm/ is tested apart).
    "hosts.wiring": ({"torch", "vllm"}, {"kernels", "sim", "launch", "tools", "bench", "commands"}),
    "hosts": (set(), {"sim", "launch", "tools", "bench", "commands"}),
    # what `vllm-vspec serve --dry-run` renders: no torch, no vLLM.
    "launch": ({"torch", "vllm"}, {"kernels", "sim", "tools", "bench", "commands"}),
    "tools": (set(), {"bench", "commands"}),
    "bench": (set(), {"commands"}),
}


def modules(prefix: str) -> list[str]:
    """Every module under vllm_vspec.<prefix> (a package or one module)."""
    rel = PKG / prefix.replace(".", "/")
    files = [rel.with_suffix(".py")] if rel.with_suffix(".py").is_file() else sorted(rel.rglob("*.py"))
    out = []
    for f in files:
        parts = f.relative_to(PKG).with_suffix("").parts
        out.append(".".join(("vllm_vspec",) + (parts[:-1] if parts[-1] == "__init__" else parts)))
    return out


def loaded_after_import(names: list[str]) -> list[str]:
    return loaded_after_imports([names])[0]


def loaded_after_imports(groups: list[list[str]]) -> list[list[str]]:
    """In one fresh interpreter, import each group of modules in turn: the
    modules loaded after each group (all groups before it included)."""
    # Marked lines: vLLM logs to stdout while it is imported.
    code = ("import importlib, json, sys\n"
            f"for names in {groups!r}:\n"
            "    for n in names: importlib.import_module(n)\n"
            "    print('loaded:', json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line.removeprefix("loaded: ")) for line in out.stdout.splitlines()
            if line.startswith("loaded: ")]


def forbidden(layer: str) -> set[str]:
    roots, above = RULES[layer]
    return roots | above


# One interpreter per chain, its layers imported in this order: each layer
# forbids no less than the next, so whatever an earlier layer loaded is
# allowed to the later ones, and what a later one loads beyond them is its own
# (a layer that fails shows in the later ones too: the first is the one to fix).
# Three interpreters instead of eight: torch and vLLM load once.
CHAINS = (("core", "hosts.wiring", "launch"), ("sim", "replay"), ("kernels", "hosts", "tools", "bench"))


# Adapters to a platform this host does not have: they import that
# platform's vLLM module, which loads its compiled ops.
OTHER_DEVICE = {"vllm_vspec.hosts.vllm.platform_cuda"}


def layer_modules(layer: str) -> list[str]:
    names = modules(layer)
    if layer == "hosts":
        names = [n for n in names if n != "vllm_vspec.hosts.wiring" and n not in OTHER_DEVICE]
    assert names, f"no modules under {layer}"
    return names


@pytest.fixture(scope="module")
def loaded_by_layer() -> dict[str, list[str]]:
    out = {}
    for chain in CHAINS:
        loaded = loaded_after_imports([layer_modules(layer) for layer in chain])
        assert len(loaded) == len(chain), (chain, len(loaded))
        out.update(zip(chain, loaded))
    return out


def test_the_chains_hold_every_layer_and_nest():
    assert sorted(layer for chain in CHAINS for layer in chain) == sorted(RULES)
    for chain in CHAINS:
        for earlier, later in zip(chain, chain[1:]):
            assert forbidden(earlier) >= forbidden(later), (earlier, later)


@pytest.mark.parametrize("layer", list(RULES))
def test_a_layer_loads_nothing_above_it(layer, loaded_by_layer):
    loaded = loaded_by_layer[layer]
    roots, above = RULES[layer]
    third_party = sorted({m.split(".")[0] for m in loaded} & roots)
    ours = sorted(m for m in loaded if m.startswith("vllm_vspec.")
                  and m.split(".")[1] in above)
    assert not third_party and not ours, (
        f"importing vllm_vspec.{layer} loaded {third_party + ours}")


def test_the_config_imports_only_the_standard_library():
    loaded = loaded_after_import(["vllm_vspec.config"])
    assert sorted(m for m in loaded if m.startswith("vllm_vspec")) == ["vllm_vspec",
                                                                        "vllm_vspec.config"]
    assert not {"torch", "vllm", "numpy"} & {m.split(".")[0] for m in loaded}


def test_no_module_outside_commands_imports_a_command():
    offenders = []
    for f in PKG.rglob("*.py"):
        if f.relative_to(PKG).parts[0] == "commands":
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{f.relative_to(PKG)}:{node.lineno} {n}" for n in names
                          if n.startswith("vllm_vspec.commands")]
    assert not offenders, offenders


def test_every_layer_folder_is_listed():
    folders = sorted(p.name for p in PKG.iterdir()
                     if p.is_dir() and (p / "__init__.py").exists() and p.name != "manifests")
    assert folders == sorted(LAYERS)
