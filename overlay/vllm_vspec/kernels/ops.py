"""torch.ops.vspec: vspec's custom ops (schema and semantics: csrc/ops.h),
or their torch implementation when the compiled library is not there.

`load()` gives the ops vspec's proposers call every step: the compiled
library (libvspec_ops.so, loaded once per process, with each op's fake
(Meta) implementation registered) behind `CheckedOps`, or, when the library
is missing, fails to load, lacks an op (a stale build) or has no kernel for
the device the caller runs on (`device_type`), `TORCH_OPS`: the same ops.h
definitions in torch, logged once per process as a warning naming why (the
compiled library is logged once as INFO). A kernel never costs
availability (docs/ascend.md, "Custom ops"): `CheckedOps` compares each
op's first call with TORCH_OPS on the same inputs, and a compiled call that
raises or a first call that disagrees moves the whole process to TORCH_OPS
(one warning naming the op and why; that call returns the torch result).
`backend()` and `vllm-vspec doctor` say which runs. `load_compiled()` is the
strict form (raises, unchecked), for the ops' own tests.

The fakes give output shapes and dtypes without touching data; that is what
torch.compile's tracing needs. Whether an op can sit inside a captured ACL
graph is another matter (the NPU launch path, csrc/npu_ops.cpp) and is not
shown: not yet run on NPU, and vspec's call site (the drafter's commit,
after rejection sampling) runs eagerly on both hosts. The compiled kernels
are C++: the CPU reference, AscendC on the NPU (not yet run on NPU), ATen
composites on CUDA (not run on a GPU).

Where the library comes from, first found wins:
- $VSPEC_OPS_LIB, a path to the library (`none`: run the torch implementation);
- vllm_ascend/vspec/lib/ of the Ascend overlay wheel (built with CANN:
  CPU reference + AscendC kernels);
- build/csrc-cpu/lib/ of this checkout, which `make install` builds (CPU
  reference + CUDA composites).

Plain Python and torch, no vLLM import.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import torch

LIBRARY = "libvspec_ops.so"
ENV = "VSPEC_OPS_LIB"
# What builds the library in a checkout (the Makefile's `ops` target, part of `install`).
BUILD_COMMAND = "make ops"
CHECKOUT_LIBRARY = Path(__file__).resolve().parents[3] / "build" / "csrc-cpu" / "lib" / LIBRARY

# Under "vllm.": vLLM configures only its own logger tree.
logger = logging.getLogger(f"vllm.{__name__}")

_loaded: Path | None = None
_fallback: str | None = None   # why the torch implementation runs (None: it does not)
_failed: str | None = None     # why the compiled ops failed at run time (then: torch for good)
_announced = False             # the compiled library's start-up line was logged
_checked: "CheckedOps | None" = None  # the process's guard over the compiled ops


class OpsLibraryMissing(RuntimeError):
    """libvspec_ops.so is not where vspec looks for it."""


def library_candidates() -> list[Path]:
    """Where `load` looks, in order."""
    found = []
    if os.environ.get(ENV) and os.environ[ENV] != "none":
        found.append(Path(os.environ[ENV]))
    # find_spec on a top-level name does not import it (vllm_ascend's
    # __init__ would initialise the NPU platform).
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p) / "vspec" / "lib" / LIBRARY for p in spec.submodule_search_locations]
    found.append(CHECKOUT_LIBRARY)
    return found


def load_compiled() -> Any:
    """torch.ops.vspec with the library loaded and the fakes registered
    (idempotent). Raises OpsLibraryMissing naming every place it looked, or
    the loader's error (OSError: the library does not load; RuntimeError: it
    lacks an op this package has a fake for)."""
    global _loaded
    if _loaded is None:
        candidates = library_candidates()
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            looked = ", ".join(str(p) for p in candidates)
            raise OpsLibraryMissing(
                f"{LIBRARY} not found (looked in: {looked}). In a checkout run "
                f"`{BUILD_COMMAND}` (part of `make install`; needs cmake and a C++ "
                f"compiler); for the Ascend wheel build it with CANN present "
                f"(docs/ascend.md); or set {ENV} to the library's path.")
        torch.ops.load_library(str(path))
        _register_fakes()
        _loaded = path
    return torch.ops.vspec


# Device type -> the dispatch key its tensors run under.
DEVICE_KEYS = {"cpu": "CPU", "cuda": "CUDA", "npu": "PrivateUse1"}


def load(device_type: str | None = None) -> Any:
    """The ops to call: torch.ops.vspec when the compiled library loads (and,
    given `device_type`, has a kernel for that device), else TORCH_OPS, with
    one warning per process saying why. Never raises for a missing library.
    `VSPEC_OPS_LIB=none` asks for the torch implementation."""
    if os.environ.get(ENV) == "none":
        return _fall_back(f"{ENV}=none")
    if _failed is not None:
        return _fall_back(_failed)
    try:
        compiled = load_compiled()
    except (OpsLibraryMissing, OSError, RuntimeError) as exc:
        return _fall_back(f"the compiled library is unavailable: {exc}")
    key = DEVICE_KEYS.get(device_type or "cpu")
    if key is not None and not all(
            torch._C._dispatch_has_kernel_for_dispatch_key(name, key) for name in FAKES):
        return _fall_back(f"{_loaded} has no {device_type} kernel for every op "
                          f"(a build without that backend)")
    global _announced, _checked
    if not _announced:
        _announced = True
        logger.info("vspec ops: the compiled library %s", _loaded)
    if _checked is None or _checked.compiled is not compiled:
        _checked = CheckedOps(compiled)
    return _checked


def _fall_back(reason: str) -> "TorchOps":
    global _fallback
    if _fallback != reason and (_fallback is None or reason == _failed):
        logger.warning("vspec ops: running the torch implementation%s (%s)",
                       " for the rest of this process" if reason == _failed else "", reason)
    _fallback = reason
    return TORCH_OPS


def backend() -> str:
    """Which implementation `load` gave last: `compiled <path>`, `torch
    fallback: <why>`, or `not loaded` before it ran."""
    if _fallback is not None:
        return f"torch fallback: {_fallback}"
    return f"compiled {_loaded}" if _loaded is not None else "not loaded"


def loaded_from() -> Path | None:
    """The library `load` loaded, None before it ran or when it did not load."""
    return _loaded


class TorchOps:
    """csrc/ops.h's definitions in torch (tensor ops on the inputs' device,
    no host sync), with the fakes' argument checks: what `load` gives when
    the compiled library does not load. Same call surface as torch.ops.vspec."""

    name = "torch"

    def commit_accepted(self, sampled: torch.Tensor, discard: torch.Tensor,
                        backup: torch.Tensor, vocab_size: int
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        _fake_commit_accepted(sampled, discard, backup, vocab_size)
        valid = (sampled >= 0) & (sampled < vocab_size)
        run = valid.to(torch.int32).cumprod(dim=1).sum(dim=1, dtype=torch.int32)
        num_valid = torch.where(discard, torch.zeros_like(run), run)
        last = (num_valid.long() - 1).clamp(min=0).unsqueeze(1)
        chosen = sampled.gather(1, last).squeeze(1)
        next_token = torch.where(num_valid > 0, chosen, backup)
        return num_valid, next_token.to(torch.int32)

    def tree_commit(self, path: torch.Tensor, target_tokens: torch.Tensor,
                    slots: torch.Tensor, seq_lens: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        _fake_tree_commit(path, target_tokens, slots, seq_lens)
        batch, depth = path.shape
        nodes = target_tokens.shape[1]
        ok = torch.zeros_like(path, dtype=torch.bool)
        ok[:, 0] = path[:, 0] == 0
        if depth > 1:
            ok[:, 1:] = (path[:, 1:] > path[:, :-1]) & (path[:, 1:] < nodes)
        run = ok.to(torch.int32).cumprod(dim=1)
        length = run.sum(dim=1, dtype=torch.int32)
        new_seq_lens = seq_lens + length
        index = path.long().clamp(min=0, max=nodes - 1)
        last = index.gather(1, (length.long() - 1).clamp(min=0).unsqueeze(1))
        bonus = target_tokens.gather(1, last).squeeze(1)
        next_token = torch.where(length > 0, bonus, torch.full_like(bonus, -1))
        position = torch.arange(depth, device=path.device).expand(batch, depth)
        moves = run.bool() & (path.long() != position)
        src = slots.gather(1, index)
        dst = slots.gather(1, position.clamp(max=nodes - 1))
        minus = torch.full_like(src, -1)
        return (new_seq_lens.to(torch.int32), next_token.to(torch.int32),
                torch.where(moves, src, minus), torch.where(moves, dst, minus))


TORCH_OPS = TorchOps()


class CheckedOps:
    """The compiled ops as `load` gives them, with the torch implementation
    behind them. Rules, per process:
    - each op's first call also runs TORCH_OPS on the same inputs; outputs
      that differ (shape, dtype or a value) mean the compiled op is wrong:
    - a compiled call that raises where TORCH_OPS accepts the arguments (a
      launch or kernel failure, not the caller's input);
    either way that call returns TORCH_OPS's result, one warning names the op
    and why, and every later call of every op (and every later `load`) runs
    TORCH_OPS. Arguments TORCH_OPS refuses too are the caller's error: raised
    as TORCH_OPS raises them, and the compiled ops stay."""

    name = "compiled"

    def __init__(self, compiled: Any):
        self.compiled = compiled
        self.checked: set[str] = set()  # ops whose first call agreed

    def commit_accepted(self, *args: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self._call("commit_accepted", args)

    def tree_commit(self, *args: Any
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._call("tree_commit", args)

    def _call(self, op: str, args: tuple) -> Any:
        fallback = getattr(TORCH_OPS, op)
        if _failed is not None:
            return fallback(*args)
        try:
            got = getattr(self.compiled, op)(*args)
        except Exception as exc:  # noqa: BLE001 - whatever the launch raised
            want = fallback(*args)  # the caller's bad arguments raise here
            _fail(f"the compiled {op} failed at run time ({type(exc).__name__}: {exc})")
            return want
        if op in self.checked:
            return got
        want = fallback(*args)
        diff = _difference(got, want)
        if diff is not None:
            _fail(f"the compiled {op}'s first call disagreed with the torch implementation "
                  f"({diff})")
            return want
        self.checked.add(op)
        return got


def _difference(got: Any, want: Any) -> str | None:
    """Where two op results differ (None: equal)."""
    if len(got) != len(want):
        return f"{len(got)} outputs, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i}: {g.dtype} {list(g.shape)}, want {w.dtype} {list(w.shape)}"
        if not torch.equal(g, w):
            return f"output {i}: {int((g != w).sum())} of {g.numel()} values differ"
    return None


def _fail(reason: str) -> None:
    """The compiled ops failed: the torch implementation from now on."""
    global _failed
    _failed = reason
    _fall_back(reason)


# Dispatch key -> what runs there (csrc/ops.h lists the backends).
BACKENDS = {"CPU": "cpu", "CUDA": "cuda (ATen composite)",
            "PrivateUse1": "npu (AscendC)", "Meta": "meta (fake)"}


def status() -> dict[str, Any]:
    """What `vllm-vspec doctor` reports: the library this process loads (or
    why it cannot), the backend vspec's proposers then run (`backend`: the
    compiled ops, or the torch fallback and why), and for each op the
    backends it has a kernel for. A library that is found but fails to load
    (e.g. a CANN build whose NPU runtime is missing: OSError) or lacks an op
    this package has a fake for (a stale build: RuntimeError) is reported
    with that error, not raised."""
    fallback = "torch fallback: {}"
    try:
        load_compiled()
    except OpsLibraryMissing as exc:
        return {"library": None, "loaded": False, "error": str(exc), "ops": {},
                "backend": fallback.format("the compiled library is unavailable")}
    except (OSError, RuntimeError) as exc:
        found = next((p for p in library_candidates() if p.is_file()), None)
        return {"library": str(found), "loaded": False, "error": f"{exc}", "ops": {},
                "backend": fallback.format("the compiled library does not load")}
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("vspec::"))
    backend = f"compiled {_loaded}"
    npu = all(torch._C._dispatch_has_kernel_for_dispatch_key(n, "PrivateUse1") for n in FAKES)
    if not npu and importlib.util.find_spec("torch_npu") is not None:
        backend += "; on npu: torch fallback (the library has no AscendC kernels)"
    return {"library": str(_loaded), "loaded": True, "error": None, "backend": backend,
            "ops": {n.removeprefix("vspec::"): [
                label for key, label in BACKENDS.items()
                if torch._C._dispatch_has_kernel_for_dispatch_key(n, key)] for n in names}}


# ------------------------------------------------------------------ fakes
# One per op: the shapes and dtypes of csrc/ops.h, nothing computed. Each
# makes the kernels' metadata checks (cpu_ops.cpp check_*: dtype, shape and
# integer arguments, never values), so a captured graph refuses what the
# kernels would refuse.
MAX_COMMIT_WIDTH = 64   # ops.h kMaxCommitWidth
MAX_TREE_NODES = 1024   # ops.h kMaxTreeNodes
INT32_MAX = 2**31 - 1


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise RuntimeError(message)


def _check_width(width: int, what: str) -> None:
    _check(1 <= width <= MAX_COMMIT_WIDTH,
           f"{what}={width} is not allowed: an integer in [1, {MAX_COMMIT_WIDTH}]")


def _check_vector(t: torch.Tensor, name: str, batch: int, dtype: torch.dtype) -> None:
    _check(t.dim() == 1 and t.shape[0] == batch and t.dtype == dtype,
           f"{name} must be {str(dtype).removeprefix('torch.')} [B] with B={batch}, "
           f"got {t.dtype} {list(t.shape)}")


def _fake_commit_accepted(sampled, discard, backup, vocab_size):
    _check(sampled.dim() == 2 and sampled.dtype == torch.int32,
           f"sampled must be int32 [B, W], got {sampled.dtype} {list(sampled.shape)}")
    _check_width(sampled.shape[1], "sampled width W")
    batch = sampled.shape[0]
    _check_vector(discard, "discard", batch, torch.bool)
    _check_vector(backup, "backup", batch, torch.int32)
    _check(1 <= vocab_size <= INT32_MAX,
           f"vocab_size={vocab_size} is not allowed: an integer in [1, {INT32_MAX}]")
    return sampled.new_empty(batch), sampled.new_empty(batch)


def _fake_tree_commit(path, target_tokens, slots, seq_lens):
    _check(path.dim() == 2 and path.dtype == torch.int32,
           f"path must be int32 [B, D], got {path.dtype} {list(path.shape)}")
    _check_width(path.shape[1], "path depth D")
    batch = path.shape[0]
    _check(target_tokens.dim() == 2 and target_tokens.shape[0] == batch
           and 1 <= target_tokens.shape[1] <= MAX_TREE_NODES
           and target_tokens.dtype == torch.int32,
           f"target_tokens must be int32 [B, N] with B={batch} and N in "
           f"[1, {MAX_TREE_NODES}], got "
           f"{target_tokens.dtype} {list(target_tokens.shape)}")
    _check(slots.shape == target_tokens.shape and slots.dtype == torch.int64,
           f"slots must be int64 [B, N] like target_tokens, got {slots.dtype} "
           f"{list(slots.shape)}")
    _check_vector(seq_lens, "seq_lens", batch, torch.int32)
    return (seq_lens.new_empty(batch), seq_lens.new_empty(batch),
            slots.new_empty(path.shape), slots.new_empty(path.shape))


FAKES = {
    "vspec::commit_accepted": _fake_commit_accepted,
    "vspec::tree_commit": _fake_tree_commit,
}


def _register_fakes() -> None:
    for name, fake in FAKES.items():
        torch.library.register_fake(name)(fake)
