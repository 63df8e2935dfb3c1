"""The static Extension Manager manifest of vllm-vspec (package data).

Target of the `vllm_hust.extension_bundles` entry point. Discovery must not
run the plugin, so this module imports only the standard library and reads
the one JSON file shipped next to it; it never imports vllm_vspec runtime
modules (adapters, controller) or vLLM.
"""

from __future__ import annotations

import json
from importlib import resources

MANIFEST_FILE = "vllm-hust-extension-v0.2.json"


def manifest_text() -> str:
    return resources.files(__name__).joinpath(MANIFEST_FILE).read_text(encoding="utf-8")


def load_manifest() -> dict:
    """The manifest as a dict (schema 0.2-experimental, in_process_plugin)."""
    return json.loads(manifest_text())
