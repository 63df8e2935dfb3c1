"""The installation default of `vspec.enabled`, one small JSON file per
Python environment (what `vllm-vspec manage enable|disable` writes).

An administrator who installs vspec into a serving environment decides once
whether engines there run vspec unless a launch says otherwise; a launch's
own `{"vspec": {"enabled": ...}}` always wins. The file lives inside the
environment (`<sys.prefix>/etc/vllm-vspec/state.json`), so one venv's choice
never leaks into another, and uninstalling the environment removes it.
`VLLM_VSPEC_STATE` names another file (tests, read-only prefixes).

Standard library only: the resolver reads it at engine start-up.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

STATE_ENV = "VLLM_VSPEC_STATE"


def state_path(prefix: str | Path | None = None) -> Path:
    """Where this environment's installation default lives."""
    if os.environ.get(STATE_ENV):
        return Path(os.environ[STATE_ENV])
    return Path(prefix or sys.prefix) / "etc" / "vllm-vspec" / "state.json"


def read_state(path: Path | None = None) -> dict:
    """The stored state ({} when nothing was stored). A file that is not a
    JSON object with a boolean `enabled` is an error naming the file: a
    serving host must not guess what its administrator chose."""
    path = path or state_path()
    if not path.is_file():
        return {}
    try:
        state = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e}); rewrite it with "
                         "`vllm-vspec manage enable` or `disable`") from e
    if not isinstance(state, dict) or not isinstance(state.get("enabled"), bool):
        raise ValueError(f"{path}: expected {{\"enabled\": true|false, ...}}, got {state!r}; "
                         "rewrite it with `vllm-vspec manage enable` or `disable`")
    return state


def default_enabled(path: Path | None = None) -> bool:
    """`vspec.enabled` for a launch that does not set it: the stored choice,
    else True (VSpecConfig's field default)."""
    return read_state(path).get("enabled", True)


def write_state(enabled: bool, path: Path | None = None, by: str = "vllm-vspec manage") -> Path:
    path = path or state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"enabled": enabled, "changed_at": time.strftime(
        "%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "by": by}, indent=2) + "\n")
    tmp.replace(path)  # atomic: an engine starting meanwhile reads old or new, never half
    return path
