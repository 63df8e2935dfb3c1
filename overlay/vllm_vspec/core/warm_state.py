"""Warm start: a policy's learned state kept in a file per (host, model
pair, method, K), so that a restarted server goes on from what the last
one learned instead of re-learning it (`vspec.model_state_dir`).

What is kept: the `model` policy's `state()` (acceptance posteriors, the
batch-1 ones by last outcome included, and the pooled step-cost model).
Other policies keep nothing: for them warm start does nothing.

The file (JSON, indented, one per key):

    {"schema": "vllm-vspec/warm-state", "format": 1,
     "vllm_vspec": "0.1.0", "saved_at": "2026-12-07T05:00:00Z",
     "steps_learned": 1536,
     "key": {"policy": "model", "host": {...}, "target": ..., "drafter": ...,
             "method": ..., "k": 4},
     "state": {...}}

`steps_learned` counts the decided steps observed by every server that
went on from this file. The file name is readable (method, K, the
models' names) and ends in a hash of the whole key, so keys never share a
file; a file is used only when its schema, format and key equal the
engine's. Rules:
- Loading never stops an engine: a missing file starts cold silently; an
  unreadable, corrupt or mismatched one starts cold after one log line,
  and is overwritten by the next save.
- The policy is restored whole or not at all: the state is first restored
  into a copy, so a file that fails half-way leaves the policy cold.
- Saving writes a temporary file in the same directory and renames it
  over the old one (atomic: a reader sees the old file or the new, never
  part of one), every SAVE_EVERY_STEPS decided steps or SAVE_EVERY_S
  seconds (whichever comes first, at a step) and when the engine shuts
  down. A failed save logs one line and turns saving off for the engine.

Plain Python: no vLLM import (the host adapter builds the key).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

SCHEMA = "vllm-vspec/warm-state"
FORMAT = 1
# A save at most this many decided steps, or seconds, after the last one.
SAVE_EVERY_STEPS = 256
SAVE_EVERY_S = 30.0
# `model_state_dir` values: the default directory, and no warm start.
AUTO, OFF = "auto", "off"
# Overrides the default directory (`auto`); the test suite points it at a
# directory of its own.
DIR_ENV = "VLLM_VSPEC_STATE_DIR"

logger = logging.getLogger(f"vllm.{__name__}")  # vLLM configures only "vllm."


def default_dir() -> Path:
    """Where `auto` keeps state files: $VLLM_VSPEC_STATE_DIR, else
    $XDG_CACHE_HOME/vllm-vspec/state, else ~/.cache/vllm-vspec/state."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(cache).expanduser() / "vllm-vspec" / "state"


def state_dir(setting: str) -> Path | None:
    """The directory a `model_state_dir` setting names; None: `off`."""
    if setting == OFF:
        return None
    return default_dir() if setting == AUTO else Path(setting).expanduser()


@dataclass(frozen=True)
class WarmKey:
    """What learned state is valid for: the same host (device, parallelism,
    dtype, versions), target, drafter, method and K."""

    host: dict[str, Any]
    target: str
    drafter: str
    method: str
    k: int
    policy: str = "model"

    def as_dict(self) -> dict[str, Any]:
        """As the file holds it (JSON types: compares equal to a read one)."""
        return json.loads(json.dumps({"policy": self.policy, "host": self.host,
                                      "target": self.target, "drafter": self.drafter,
                                      "method": self.method, "k": self.k}))

    def file_name(self) -> str:
        digest = hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()
        names = "-".join(_slug(Path(m).name or m) for m in (self.target, self.drafter))
        return f"{self.policy}-{self.method}-k{self.k}-{names}-{digest[:12]}.json"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:40] or "none"


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _version() -> str:
    from vllm_vspec import __version__

    return __version__


def read(path: str | Path) -> dict[str, Any]:
    """A state file's document; ValueError (naming the file and what is
    wrong) unless it is one."""
    try:
        doc = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a vllm-vspec warm state file (schema must be {SCHEMA!r})")
    if doc.get("format") != FORMAT:
        raise ValueError(f"{path}: format {doc.get('format')!r}, this vllm-vspec reads {FORMAT}")
    for name, kind in (("key", dict), ("state", dict), ("steps_learned", int)):
        if not isinstance(doc.get(name), kind):
            raise ValueError(f"{path}: '{name}' must be a JSON {kind.__name__}")
    return doc


class WarmStore:
    """One engine's state file: `load` once at start-up, `observed` after
    every decided step, `save` at shutdown."""

    def __init__(self, directory: str | Path, key: WarmKey,
                 clock: Callable[[], float] = time.monotonic):
        self.directory = Path(directory)
        self.key = key
        self.clock = clock
        self.steps = 0                       # steps_learned, restored ones included
        self._saved_steps = 0
        self._saved_at = clock()
        self._failed = False

    @property
    def path(self) -> Path:
        return self.directory / self.key.file_name()

    def load(self, policy: Any) -> bool:
        """Restore `policy` from the file; False (the policy untouched)
        when there is none or it cannot be used (one log line)."""
        try:
            if not self.path.exists():
                return False
            doc = read(self.path)
            if doc["key"] != self.key.as_dict():
                raise ValueError(f"{self.path}: saved for another key "
                                 f"({_key_difference(doc['key'], self.key.as_dict())})")
            probe = copy.deepcopy(policy)
            probe.restore(doc["state"])
        except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
            logger.warning("vspec: warm start skipped, starting cold: %s", exc)
            return False
        policy.restore(doc["state"])
        self.steps = self._saved_steps = doc["steps_learned"]
        logger.info("vspec: warm start from %s (%d steps learned, saved %s)",
                    self.path, self.steps, doc.get("saved_at", "?"))
        return True

    def observed(self, policy: Any) -> None:
        """One more decided step learned; saves when one is due."""
        self.steps += 1
        if (self.steps - self._saved_steps >= SAVE_EVERY_STEPS
                or self.clock() - self._saved_at >= SAVE_EVERY_S):
            self.save(policy)

    def save(self, policy: Any) -> None:
        """Write the file atomically, if anything was learned since the last
        save (never raises: a failure logs once and stops saving)."""
        if self._failed or self.steps == self._saved_steps:
            return
        tmp = None
        try:
            doc = {"schema": SCHEMA, "format": FORMAT, "vllm_vspec": _version(),
                   "saved_at": _now_iso(), "steps_learned": self.steps,
                   "key": self.key.as_dict(), "state": policy.state()}
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=self.directory)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
                f.write("\n")
            os.replace(tmp, self.path)
        except (OSError, TypeError, ValueError, ArithmeticError) as exc:
            self._failed = True
            if tmp is not None and os.path.exists(tmp):
                os.unlink(tmp)
            logger.warning("vspec: warm state not saved (%s): %s; this engine will not try "
                           "again (set model_state_dir to a writable directory, or 'off')",
                           self.path, exc)
            return
        self._saved_steps, self._saved_at = self.steps, self.clock()


def _key_difference(saved: dict, wanted: dict) -> str:
    names = sorted(n for n in set(saved) | set(wanted) if saved.get(n) != wanted.get(n))
    return "differs in " + ", ".join(names)


# WarmKey.file_name's shape.
NAME = re.compile(r"[a-z]+-.+-k\d+-.+-[0-9a-f]{12}\.json")


def is_state_file(path: Path) -> bool:
    """A file named as state files are, or holding one (other files of a
    directory shared with other things are not ours)."""
    if NAME.fullmatch(path.name):
        return True
    try:
        read(path)
    except ValueError:
        return False
    return True


def list_states(directory: Path) -> list[dict[str, Any]]:
    """Every state file in `directory`: path, and either its key, steps
    learned, when it was saved and its age in seconds, or why it cannot be
    used (`error`)."""
    rows = []
    if not directory.is_dir():
        return rows
    for path in sorted(directory.glob("*.json")):
        if not is_state_file(path):
            continue
        row: dict[str, Any] = {"path": str(path),
                               "age_s": round(time.time() - path.stat().st_mtime)}
        try:
            doc = read(path)
        except ValueError as exc:
            row["error"] = str(exc)
        else:
            row.update(key=doc["key"], steps_learned=doc["steps_learned"],
                       saved_at=doc.get("saved_at"))
        rows.append(row)
    return rows
