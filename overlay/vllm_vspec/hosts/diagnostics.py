"""Diagnostics traces of the drafter: the formats and their writer (read by
tools/traces.py and `vllm-vspec trace summarize`, commands/trace.py).

Four opt-in dumps (vspec keys; each off when unset), written by vspec's
proposers once per drafter step (a step in which the drafter ran; lazy and
sticky gamma-0 steps skip it and are not traced). They synchronise the
device and write to disk every step: correctness and data collection only,
never for throughput numbers (the engine logs a warning saying so).

- `draft_trace_path` (JSONL), one line per drafter step:
  `{"kind": "draft", "step": N, "gamma": G, "draft_ms": T, "head": "full"|"active",
  "requests": [{"id": REQ, "draft": [ids...]}, ...]}`; `draft_ms` is the wall
  time of the drafter's propose call (device synchronised), `head` says whether
  the active-vocabulary head drafted this step.
- `target_argmax_trace_path` (JSONL), one line per drafter step:
  `{"kind": "target_argmax", "step": N, "requests": [{"id": REQ, "greedy": bool,
  "tokens": [ids...]}, ...]}`: the tokens the target produced for each
  request this step (accepted drafts and the bonus or recovered token; none
  for a request still in prefill; the scheduler may still drop those past
  max_tokens or a stop). For a greedy
  request under strict acceptance they are the target's argmax at each
  verified position: `vllm-vspec trace active-vocab` counts those.
- `draft_io_trace_dir` (safetensors), `step-NNNNNN.safetensors` per drafter
  step: every draft forward pass `i` of the step as `pass{i}.input_ids`,
  `pass{i}.positions`, `pass{i}.hidden_states` (EAGLE: the hidden state fed in),
  `pass{i}.output` (the draft model's output hidden state), and
  `draft_token_ids` [batch, gamma]. Eager mode only (graph replays are not seen).
- `target_hidden_trace_dir` (safetensors), `step-NNNNNN.safetensors` per
  drafter step: what the target handed the drafter: `token_ids`, `positions`,
  `hidden_states` (the target's last hidden state per token), `next_token_ids`
  (one per request), `query_start_loc` (request boundaries) and, when drafts
  were rejected, `num_rejected_tokens`.

Every safetensors file carries metadata `{"format": "vspec-draft-io/1" or
"vspec-target-hidden/1", "step": "N"}`.

`DrafterTraces` records them for any host: it is an observer of the
drafter's steps (hosts/draft_observers.py) in the list of vspec's vLLM
proposers (hosts/vllm/proposers.py) and of the Ascend overlay's
(vllm_ascend/vspec/proposers.py).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from vllm_vspec.hosts.draft_observers import DraftObserver

logger = logging.getLogger(f"vllm.{__name__}")

DRAFT_IO_FORMAT = "vspec-draft-io/1"
TARGET_HIDDEN_FORMAT = "vspec-target-hidden/1"


@dataclass(frozen=True)
class TraceOptions:
    """Which traces are on (the vspec keys of the same names)."""

    draft_trace_path: str | None = None
    target_argmax_trace_path: str | None = None
    draft_io_trace_dir: str | None = None
    target_hidden_trace_dir: str | None = None

    @classmethod
    def from_config(cls, cfg: Any) -> "TraceOptions":
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


def _cpu(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu").contiguous().clone()


class Tracer:
    """Writes the traces of one drafter (module docstring). The proposer
    calls `begin_step` first in each drafter step, then the record methods."""

    def __init__(self, options: TraceOptions) -> None:
        self.options = options
        self.step = 0
        self._files: dict[str, Any] = {}
        for d in (options.draft_io_trace_dir, options.target_hidden_trace_dir):
            if d:
                Path(d).mkdir(parents=True, exist_ok=True)
        on = [f.name for f in fields(options) if getattr(options, f.name)]
        logger.warning("vspec diagnostics traces on (%s): every drafter step synchronises "
                       "the device and writes to disk, which costs throughput; do not "
                       "measure speed with them", ", ".join(on))

    def begin_step(self) -> None:
        self.step += 1

    def draft(self, req_ids: list[str], drafts: torch.Tensor, draft_ms: float,
              head: str) -> None:
        rows = drafts.tolist()
        self._line(self.options.draft_trace_path, {
            "kind": "draft", "step": self.step, "gamma": drafts.shape[-1],
            "draft_ms": round(draft_ms, 4), "head": head,
            "requests": [{"id": r, "draft": d} for r, d in zip(req_ids, rows)]})

    def target_argmax(self, req_ids: list[str], tokens: list[list[int]],
                      greedy: list[bool]) -> None:
        self._line(self.options.target_argmax_trace_path, {
            "kind": "target_argmax", "step": self.step,
            "requests": [{"id": r, "greedy": g, "tokens": t}
                         for r, t, g in zip(req_ids, tokens, greedy)]})

    def draft_io(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors(self.options.draft_io_trace_dir, tensors, DRAFT_IO_FORMAT)

    def target_hidden(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self._tensors(self.options.target_hidden_trace_dir, tensors, TARGET_HIDDEN_FORMAT)

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()

    def _line(self, path: str | None, record: dict) -> None:
        if not path:
            return
        f = self._files.get(path)
        if f is None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            f = self._files[path] = open(path, "a", encoding="utf-8")
        f.write(json.dumps(record) + "\n")
        f.flush()

    def _tensors(self, directory: str | None, tensors: Mapping[str, torch.Tensor],
                 fmt: str) -> None:
        if not directory:
            return
        from safetensors.torch import save_file

        save_file({k: _cpu(v) for k, v in tensors.items()},
                  str(Path(directory) / f"step-{self.step:06d}.safetensors"),
                  metadata={"format": fmt, "step": str(self.step)})


class DrafterTraces(DraftObserver):
    """One drafter's traces, as an observer of its steps
    (hosts/draft_observers.py; the same hooks on vLLM 0.32 and vLLM-Ascend):

    - `loaded(model)`: the IO trace hooks the draft model;
    - `committed(sampled, discard)`: starts a step with the target's tokens;
    - `begin(kwargs)` / `end(drafts)` around the propose call, whose keyword
      arguments (`target_token_ids`, `target_positions`,
      `target_hidden_states`, `next_token_ids`, `common_attn_metadata`,
      `sampling_metadata`, `num_rejected_tokens_gpu`) both hosts name alike:
      the call is timed with the device synchronised and the step's records
      are written. `drafts` are the step's drafted columns.

    `runner.input_batch.req_ids` names the batch's rows; a request is greedy
    when its temperature is below `greedy_eps` (the host sampler's); `head()`
    names the head the step drafted from (the draft trace's `head`)."""

    def __init__(self, options: TraceOptions, runner: Any, greedy_eps: float,
                 head: Callable[[], str]) -> None:
        self.tracer = Tracer(options)
        self._runner = runner
        self._greedy_eps = greedy_eps
        self._head = head
        self._sampled: list[list[int]] | None = None   # this step's committed tokens
        self._passes: list[dict[str, torch.Tensor]] | None = None  # set inside propose
        self._kwargs: Mapping[str, Any] | None = None
        self._start = 0.0

    @classmethod
    def open(cls, options: TraceOptions | None, runner: Any, greedy_eps: float,
             head: Callable[[], str]) -> "DrafterTraces | None":
        """The traces `options` turns on, or None when none is."""
        if options is None or not options.any:
            return None
        return cls(options, runner, greedy_eps, head)

    def loaded(self, model: torch.nn.Module) -> None:
        """With the IO trace on, record every forward pass of `model` made
        inside propose (eager passes only: a graph replay bypasses hooks)."""
        if self.tracer.options.draft_io_trace_dir:
            model.register_forward_hook(self._record_pass, with_kwargs=True)

    def _record_pass(self, module: Any, args: Any, kwargs: dict, output: Any) -> None:
        if self._passes is None:
            return  # a dummy or catch-up pass, not a drafting step
        i = len(self._passes)
        rec = {f"pass{i}.{k}": kwargs[k] for k in ("input_ids", "positions", "hidden_states")
               if kwargs.get(k) is not None}
        rec[f"pass{i}.output"] = output[0] if isinstance(output, tuple) else output
        self._passes.append({k: _cpu(v) for k, v in rec.items()})

    def committed(self, sampled: Any, discard: torch.Tensor | None) -> None:
        """Start a drafter step whose target committed `sampled` (one row per
        batch row; negative ids are padding), none for a `discard`ed row."""
        self.tracer.begin_step()
        rows = sampled.tolist() if torch.is_tensor(sampled) else [list(t) for t in sampled]
        flags = [False] * len(rows) if discard is None else discard[:len(rows)].tolist()
        self._sampled = [[] if d else [t for t in r if t >= 0] for r, d in zip(rows, flags)]

    def begin(self, kwargs: Mapping[str, Any]) -> None:
        tracer = self.tracer
        self._kwargs = kwargs
        self._passes = [] if tracer.options.draft_io_trace_dir else None
        if tracer.options.target_hidden_trace_dir:
            cad = kwargs["common_attn_metadata"]
            hidden = {"token_ids": kwargs["target_token_ids"],
                      "positions": kwargs["target_positions"],
                      "hidden_states": kwargs["target_hidden_states"],
                      "next_token_ids": kwargs["next_token_ids"],
                      "query_start_loc": cad.query_start_loc[:cad.num_reqs + 1]}
            if kwargs.get("num_rejected_tokens_gpu") is not None:
                hidden["num_rejected_tokens"] = kwargs["num_rejected_tokens_gpu"]
            tracer.target_hidden(hidden)
        self._start = time.perf_counter()

    def end(self, drafts: torch.Tensor | None) -> None:
        passes, self._passes = self._passes, None
        kwargs, self._kwargs = self._kwargs, None
        if drafts is None:
            return  # the call raised: no records
        if drafts.device.type != "cpu":
            torch.accelerator.synchronize()
        ms = (time.perf_counter() - self._start) * 1e3
        tracer = self.tracer
        req_ids = list(self._runner.input_batch.req_ids[:drafts.shape[0]])
        tracer.draft(req_ids, drafts, ms, self._head())
        if self._sampled is not None:
            m = kwargs["sampling_metadata"]
            temp = m.temperature
            greedy = ([True] * len(req_ids) if m.all_greedy or temp is None
                      else (temp[:len(req_ids)] < self._greedy_eps).tolist())
            tracer.target_argmax(req_ids, self._sampled[:len(req_ids)], greedy)
            self._sampled = None
        if passes is not None:
            tensors = {k: v for rec in passes for k, v in rec.items()}
            tensors["draft_token_ids"] = drafts
            tracer.draft_io(tensors)


__all__ = ["TraceOptions", "Tracer", "DrafterTraces", "DRAFT_IO_FORMAT", "TARGET_HIDDEN_FORMAT"]
