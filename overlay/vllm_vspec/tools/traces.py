"""Readers of the drafter's diagnostics traces (formats: hosts/diagnostics.py):
one JSON line at a time, the target's greedy token counts (what
`vllm-vspec trace active-vocab` builds its ids from), and a summary of any trace,
the controller's own (`trace_path`, core/trace.py) included."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any, Iterable

from vllm_vspec.core import trace as decision_trace


def read_jsonl(path: str | Path) -> Iterable[dict]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None


def greedy_token_counts(path: str | Path) -> collections.Counter:
    """Token id -> how often the target committed it for a greedy request,
    from a target_argmax trace."""
    counts: collections.Counter = collections.Counter()
    for rec in read_jsonl(path):
        if rec.get("kind") != "target_argmax":
            raise ValueError(f"{path}: not a target_argmax trace (a line has kind "
                             f"{rec.get('kind')!r}); write one with target_argmax_trace_path")
        for req in rec["requests"]:
            if req["greedy"]:
                counts.update(req["tokens"])
    return counts


def summarize(path: str | Path, top: int = 10) -> dict[str, Any]:
    """A summary of any of the four traces (kind detected from the content)."""
    path = Path(path)
    if path.is_dir():
        return _summarize_dir(path)
    records = list(read_jsonl(path))
    if records and records[0].get("schema") == decision_trace.SCHEMA:
        return _summarize_decisions(path)
    kinds = {r.get("kind") for r in records}
    if kinds == {"draft"}:
        return _summarize_draft(path, records)
    if kinds == {"target_argmax"}:
        return _summarize_argmax(path, records, top)
    raise ValueError(f"{path}: not a vspec diagnostics trace nor a controller trace (record kinds {sorted(map(str, kinds))}; "
                     f"expected a {decision_trace.SCHEMA!r} header line "
                     "written by trace_path), or all 'draft' or all 'target_argmax' records "
                     "(draft_trace_path, target_argmax_trace_path)")


def _summarize_decisions(path: Path) -> dict[str, Any]:
    """The controller's own trace (`trace_path`, core/trace.py)."""
    header, records = decision_trace.read_trace(path)
    drafted = sum(sum(r["drafted"]) for r in records)
    accepted = sum(sum(r["accepted"]) for r in records)
    overhead = [r["overhead_us"] for r in records if "overhead_us" in r]
    return {
        "kind": "controller", "path": str(path), "policy": header.get("policy"),
        "gammas": [header.get("min_gamma"), header.get("max_gamma")],
        "steps": len(records),
        "committed_tokens": sum(r["committed"] for r in records),
        "steps_per_gamma": dict(sorted(collections.Counter(r["gamma"] for r in records).items())),
        "steps_per_reason": dict(collections.Counter(r.get("reason") for r in records)),
        "drafted_tokens": drafted, "accepted_tokens": accepted,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
        "overhead_us_mean": round(sum(overhead) / len(overhead), 1) if overhead else None,
    }


def _summarize_draft(path: Path, records: list[dict]) -> dict[str, Any]:
    lengths = collections.Counter(len(r["draft"]) for rec in records for r in rec["requests"])
    ms = [rec["draft_ms"] for rec in records]
    return {
        "kind": "draft", "path": str(path), "steps": len(records),
        "requests": len({r["id"] for rec in records for r in rec["requests"]}),
        "drafted_tokens": sum(k * n for k, n in lengths.items()),
        "steps_per_gamma": dict(sorted(collections.Counter(rec["gamma"] for rec in records).items())),
        "steps_per_head": dict(collections.Counter(rec["head"] for rec in records)),
        "draft_ms_mean": round(sum(ms) / len(ms), 4) if ms else None,
    }


def _summarize_argmax(path: Path, records: list[dict], top: int) -> dict[str, Any]:
    counts = greedy_token_counts(path)
    total = sum(len(r["tokens"]) for rec in records for r in rec["requests"])
    greedy_total = sum(counts.values())
    return {
        "kind": "target_argmax", "path": str(path), "steps": len(records),
        "requests": len({r["id"] for rec in records for r in rec["requests"]}),
        "tokens": total, "greedy_tokens": greedy_total, "distinct_greedy_ids": len(counts),
        "top_ids": [[tid, n] for tid, n in counts.most_common(top)],
    }


def _summarize_dir(path: Path) -> dict[str, Any]:
    from safetensors import safe_open

    files = sorted(path.glob("step-*.safetensors"))
    if not files:
        raise ValueError(f"{path}: no step-*.safetensors files (not a trace directory)")
    with safe_open(str(files[0]), "pt") as f:
        meta = f.metadata() or {}
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
    return {"kind": meta.get("format", "unknown"), "path": str(path), "steps": len(files),
            "bytes": sum(p.stat().st_size for p in files),
            "first_step": meta.get("step"), "first_step_tensors": shapes}
