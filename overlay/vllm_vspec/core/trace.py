"""Opt-in JSONL trace of controller decisions (`vspec.trace_path`).

The first line is a header; then one line per observed step, written when
the step's output is processed, joining the decision taken when it was
scheduled with what it produced:

    {"schema": "vllm-vspec/trace", "version": 1, "policy": ..., "min_gamma": ...,
     "max_gamma": ..., "num_speculative_tokens": ..., "min_width": 1, "max_width": 1}
    {"step": 12, "num_reqs": 16, "bucket": 16, "mean_context_len": 310.0,
     "gamma": 3, "width": 1, "reason": "ucb", "drafted": [3, ...], "accepted": [2, ...],
     "committed": 41, "interval_s": 0.0123, "t_s": 5.2187, "stable": true,
     "reward": 3333.3, "overhead_us": 85.2}

`gamma` and `width` are the step's decision: trees of depth gamma and
`width` nodes per depth (gamma*width draft nodes per request; width 1 is a
linear draft). Traces written before widths existed have no `width` (nor
the header's `min_width`/`max_width`): read it as 1. `drafted`/`accepted`
are per request (drafts verified in this step, proposed one step earlier,
so with the previous step's width; for a tree: its depth and the accepted
path's length). `t_s` is when the step completed, in seconds on the
controller's clock since it was built (gaps between steps, and a paired
run's rounds, read from it; traces before it have none). `overhead_us` is the controller's cost of the step
(decide + observe + the adapter's bookkeeping, wall clock). A policy that
explains its choice (`explain`, the `model` policy) adds `predicted`: per
gamma, the committed tokens per ms it predicted. The simulator replays these files (`vllm-vspec sim
--trace FILE`), so the format is versioned and read back by `read_trace`.

The prefill steps the controller does not decide are traced too (a
policy that prices every step, `model`, also learns from them); each is a
line of its own, told apart by its key
`prefill_step` (the decided steps observed before it), which `read_trace`
leaves out and `read_prefill_steps` returns:

    {"prefill_step": 12, "num_reqs": 32, "prefill_tokens": 183, "gamma": 1,
     "committed": 47, "interval_s": 0.0912, "t_s": 1.0473}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

SCHEMA = "vllm-vspec/trace"
VERSION = 1
STEP_KEYS = ("step", "num_reqs", "gamma", "drafted", "accepted", "committed")


class TraceError(ValueError):
    """A trace file is not in this format; names the line and the key."""


class DecisionTrace:
    """Appends JSON lines to a file; line-buffered so a crash loses at most
    the line being written."""

    def __init__(self, path: str | Path, header: dict[str, Any]):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = self.path.open("w", buffering=1)
        self.write({"schema": SCHEMA, "version": VERSION, **header})

    def write(self, record: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(record, separators=(",", ":")) + "\n")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_trace(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(header, step records) of a trace file; TraceError on a foreign file."""
    header, records, _ = _read(path)
    return header, records


def read_prefill_steps(path: str | Path) -> list[dict[str, Any]]:
    """The undecided prefill steps of a trace file (checked as read_trace does)."""
    return _read(path)[2]


def _read(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, decided step records, prefill step records) of a trace file."""
    lines = Path(path).read_text().splitlines()
    if not lines:
        raise TraceError(f"{path}: empty file, expected a {SCHEMA} header line")
    header = _parse(path, 1, lines[0])
    if header.get("schema") != SCHEMA or header.get("version") != VERSION:
        raise TraceError(f"{path}:1: schema={header.get('schema')!r} "
                         f"version={header.get('version')!r}, expected {SCHEMA!r} {VERSION}")
    records, prefill = [], []
    for no, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        rec = _parse(path, no, line)
        if "prefill_step" in rec:
            prefill.append(rec)
            continue
        for key in STEP_KEYS:
            if key not in rec:
                raise TraceError(f"{path}:{no}: missing key {key!r}")
        if len(rec["drafted"]) != len(rec["accepted"]):
            raise TraceError(f"{path}:{no}: drafted has {len(rec['drafted'])} entries, "
                             f"accepted {len(rec['accepted'])}; they must pair up")
        records.append(rec)
    return header, records, prefill


def overhead_share(records: list[dict[str, Any]]) -> float | None:
    """The controller's summed `overhead_us` over the summed step time of
    these step records (None without timed steps or with an older trace)."""
    interval = sum(r.get("interval_s", 0.0) for r in records)
    if interval <= 0 or any("overhead_us" not in r for r in records):
        return None
    return sum(r["overhead_us"] for r in records) * 1e-6 / interval


def _parse(path: str | Path, no: int, line: str) -> dict[str, Any]:
    try:
        rec = json.loads(line)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path}:{no}: not JSON ({e})") from None
    if not isinstance(rec, dict):
        raise TraceError(f"{path}:{no}: expected a JSON object")
    return rec
