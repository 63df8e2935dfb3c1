"""torch.ops.vspec: vspec's custom ops (schema and semantics: csrc/ops.h).

`load()` loads libvspec_ops.so once per process and registers each op's fake
(Meta) implementation, which gives output shapes and dtypes without touching
data, so the ops can sit inside a captured graph (torch.compile, ACL graphs).
The kernels themselves are C++: the CPU reference, AscendC on the NPU (not yet
run on NPU), ATen composites on CUDA (not run on a GPU).

Where the library comes from, first found wins:
- $VSPEC_OPS_LIB, a path to the library;
- vllm_ascend/vspec/lib/ of the Ascend overlay wheel (built with CANN:
  CPU reference + AscendC kernels);
- build/csrc-cpu/lib/ of this checkout, which `make install` builds (CPU
  reference + CUDA composites).
A missing library is an error that names the make command: vspec's
proposers call these ops on every step, and a silent fallback would make
that claim false.

Plain Python and torch, no vLLM import.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

LIBRARY = "libvspec_ops.so"
ENV = "VSPEC_OPS_LIB"
# What builds the library in a checkout (the Makefile's `ops` target, part of `install`).
BUILD_COMMAND = "make ops"
CHECKOUT_LIBRARY = Path(__file__).resolve().parents[3] / "build" / "csrc-cpu" / "lib" / LIBRARY

_loaded: Path | None = None


class OpsLibraryMissing(RuntimeError):
    """libvspec_ops.so is not where vspec looks for it."""


def library_candidates() -> list[Path]:
    """Where `load` looks, in order."""
    found = []
    if os.environ.get(ENV):
        found.append(Path(os.environ[ENV]))
    # find_spec on a top-level name does not import it (vllm_ascend's
    # __init__ would initialise the NPU platform).
    spec = importlib.util.find_spec("vllm_ascend")
    if spec is not None and spec.submodule_search_locations:
        found += [Path(p) / "vspec" / "lib" / LIBRARY for p in spec.submodule_search_locations]
    found.append(CHECKOUT_LIBRARY)
    return found


def load() -> Any:
    """torch.ops.vspec with the library loaded and the fakes registered
    (idempotent). Raises OpsLibraryMissing naming every place it looked."""
    global _loaded
    if _loaded is None:
        candidates = library_candidates()
        path = next((p for p in candidates if p.is_file()), None)
        if path is None:
            looked = ", ".join(str(p) for p in candidates)
            raise OpsLibraryMissing(
                f"{LIBRARY} not found (looked in: {looked}). vspec's proposers call "
                f"torch.ops.vspec.* on every step. In a checkout run `{BUILD_COMMAND}` "
                f"(part of `make install`; needs cmake and a C++ compiler); for the "
                f"Ascend wheel build it with CANN present (docs/ascend.md); or set "
                f"{ENV} to the library's path.")
        torch.ops.load_library(str(path))
        _register_fakes()
        _loaded = path
    return torch.ops.vspec


def loaded_from() -> Path | None:
    """The library `load` loaded, None before it ran."""
    return _loaded


# Dispatch key -> what runs there (csrc/ops.h lists the backends).
BACKENDS = {"CPU": "cpu", "CUDA": "cuda (ATen composite)",
            "PrivateUse1": "npu (AscendC)", "Meta": "meta (fake)"}


def status() -> dict[str, Any]:
    """What `vllm-vspec doctor` reports: the library this process loads (or
    why it cannot), and for each op the backends it has a kernel for. A
    library that is found but fails to load (e.g. a CANN build whose NPU
    runtime is missing: OSError) or lacks an op this package has a fake for
    (a stale build: RuntimeError) is reported with that error, not raised."""
    try:
        load()
    except OpsLibraryMissing as exc:
        return {"library": None, "loaded": False, "error": str(exc), "ops": {}}
    except (OSError, RuntimeError) as exc:
        found = next((p for p in library_candidates() if p.is_file()), None)
        return {"library": str(found), "loaded": False, "error": f"{exc}", "ops": {}}
    names = sorted(n for n in torch._C._dispatch_get_all_op_names() if n.startswith("vspec::"))
    return {"library": str(_loaded), "loaded": True, "error": None,
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
