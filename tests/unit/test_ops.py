"""torch.ops.vspec (csrc/ops.h) against plain-Python references.

Each op is run three ways over random shapes and values (hypothesis):
- "cpu": the C++ CPU twin of the AscendC kernel (what the engine calls on CPU);
- "composite": the ATen composite registered for CUDA, called on CPU tensors
  through the dispatcher (the CUDA build of it is not run on a GPU);
- "meta": the fake implementation (shapes and dtypes only, as in a captured graph).
The references below are the ops.h definitions written as per-row loops.
The AscendC kernels are not run here (no NPU); their wrappers share the
C++ checks that `test_every_backend_refuses_the_same_arguments` exercises.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import run_command
from vllm_vspec.kernels import ops

BACKENDS = ("cpu", "composite", "meta")
CUDA_KERNEL = torch._C.DispatchKeySet(torch._C.DispatchKey.CUDA)


@pytest.fixture(scope="module")
def vspec():
    return ops.load_compiled()


def run(op: str, backend: str, *args):
    """Call torch.ops.vspec.<op> on one backend; returns its outputs."""
    overload = getattr(ops.load_compiled(), op).default
    if backend == "composite":
        return overload.redispatch(CUDA_KERNEL, *args)
    if backend == "meta":
        args = tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args)
    return overload(*args)


def check(backend: str, got, want: list) -> None:
    """Outputs equal the reference (meta: same shapes and dtypes)."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (i, g, w)
        if backend != "meta":
            assert torch.equal(g, w), f"output {i}: got {g.tolist()}, want {w.tolist()}"


# ------------------------------------------------------------ references
def ref_commit_accepted(sampled, discard, backup, vocab_size):
    num_valid, next_token = [], []
    for row, skip, back in zip(sampled.tolist(), discard.tolist(), backup.tolist()):
        n = 0
        while not skip and n < len(row) and 0 <= row[n] < vocab_size:
            n += 1
        num_valid.append(n)
        next_token.append(row[n - 1] if n else back)
    return [torch.tensor(num_valid, dtype=torch.int32), torch.tensor(next_token, dtype=torch.int32)]


def ref_tree_commit(path, target_tokens, slots, seq_lens):
    nodes = target_tokens.shape[1]
    new_lens, next_token, src, dst = [], [], [], []
    for p, tok, slot, length in zip(path.tolist(), target_tokens.tolist(), slots.tolist(),
                                    seq_lens.tolist()):
        n = 0
        while n < len(p) and (p[n] == 0 if n == 0 else p[n - 1] < p[n] < nodes):
            n += 1
        new_lens.append(length + n)
        next_token.append(tok[p[n - 1]] if n else -1)
        moved = [j < n and p[j] != j for j in range(len(p))]
        src.append([slot[p[j]] if moved[j] else -1 for j in range(len(p))])
        dst.append([slot[j] if moved[j] else -1 for j in range(len(p))])
    depth = path.shape[1]
    return [torch.tensor(new_lens, dtype=torch.int32), torch.tensor(next_token, dtype=torch.int32),
            torch.tensor(src, dtype=torch.int64).reshape(-1, depth),
            torch.tensor(dst, dtype=torch.int64).reshape(-1, depth)]


# ------------------------------------------------------------ strategies
VOCAB = 50


@st.composite
def verification(draw):
    """A rejection sampler's output: per row a prefix of valid ids, then -1;
    sometimes any ids at all (out of vocab, -1 in the middle); discarded rows."""
    batch = draw(st.integers(0, 9))
    width = draw(st.sampled_from([1, 2, 3, 5, 16, 64]))
    rows = []
    for _ in range(batch):
        if draw(st.booleans()):
            n = draw(st.integers(0, width))
            row = draw(st.lists(st.integers(0, VOCAB - 1), min_size=n, max_size=n))
            row += [-1] * (width - n)
        else:
            row = draw(st.lists(st.integers(-2, VOCAB + 2), min_size=width, max_size=width))
        rows.append(row)
    sampled = torch.tensor(rows, dtype=torch.int32).reshape(batch, width)
    discard = torch.tensor(draw(st.lists(st.booleans(), min_size=batch, max_size=batch)),
                           dtype=torch.bool)
    backup = torch.tensor(draw(st.lists(st.integers(0, VOCAB), min_size=batch, max_size=batch)),
                          dtype=torch.int32)
    return sampled, discard, backup


@st.composite
def verified_tree(draw):
    """Random trees (node i's parent < i), an accepted root path each (from
    only the root up to a whole root-to-leaf path), sometimes a malformed or
    empty path."""
    batch = draw(st.integers(0, 6))
    nodes = draw(st.integers(1, 12))
    depth = draw(st.sampled_from([1, 2, 4, 8]))
    paths = []
    for _ in range(batch):
        parent = [-1] + [draw(st.integers(0, i - 1)) for i in range(1, nodes)]
        kind = draw(st.sampled_from(["accepted", "full", "empty", "any"]))
        if kind == "any":
            paths.append(draw(st.lists(st.integers(-1, nodes + 1), min_size=depth,
                                       max_size=depth)))
            continue
        walk = [] if kind == "empty" else [0]
        while kind != "empty" and len(walk) < depth:
            children = [i for i in range(nodes) if parent[i] == walk[-1]]
            if not children or (kind == "accepted" and draw(st.booleans())):
                break
            walk.append(draw(st.sampled_from(children)))
        paths.append(walk + [-1] * (depth - len(walk)))
    path = torch.tensor(paths, dtype=torch.int32).reshape(batch, depth)
    tokens = torch.randint(0, VOCAB, (batch, nodes), dtype=torch.int32,
                           generator=torch.Generator().manual_seed(draw(st.integers(0, 99))))
    slots = torch.randperm(batch * nodes * 2)[: batch * nodes].reshape(batch, nodes)
    seq_lens = torch.tensor(draw(st.lists(st.integers(0, 500), min_size=batch, max_size=batch)),
                            dtype=torch.int32)
    return path, tokens, slots, seq_lens


# ------------------------------------------------------------ commit_accepted
ALL_REJECTED = (torch.tensor([[-1, -1, -1]], dtype=torch.int32), torch.tensor([False]),
                torch.tensor([7], dtype=torch.int32))


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None)
@given(case=verification())
@example(case=ALL_REJECTED)
@example(case=(torch.tensor([[5]], dtype=torch.int32), torch.tensor([False]),
               torch.tensor([1], dtype=torch.int32)))                      # width 1 (gamma 0)
@example(case=(torch.zeros((0, 4), dtype=torch.int32), torch.zeros(0, dtype=torch.bool),
               torch.zeros(0, dtype=torch.int32)))                         # batch 0
def test_commit_accepted_matches_the_reference(vspec, backend, case):
    check(backend, run("commit_accepted", backend, *case, VOCAB),
          ref_commit_accepted(*case, VOCAB))


def test_a_row_that_commits_nothing_continues_from_its_backup_token(vspec):
    sampled = torch.tensor([[3, 4, -1], [-1, -1, -1], [1, 2, 3], [VOCAB, 1, 2]], dtype=torch.int32)
    discard = torch.tensor([False, False, True, False])
    backup = torch.tensor([10, 11, 12, 13], dtype=torch.int32)
    num_valid, next_token = vspec.commit_accepted(sampled, discard, backup, VOCAB)
    assert num_valid.tolist() == [2, 0, 0, 0]
    assert next_token.tolist() == [4, 11, 12, 13]


# ------------------------------------------------------------ tree_commit
@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=60, deadline=None)
@given(case=verified_tree())
def test_tree_commit_matches_the_reference(vspec, backend, case):
    check(backend, run("tree_commit", backend, *case), ref_tree_commit(*case))


def test_tree_commit_moves_the_accepted_path_into_place(vspec):
    # Tree: 0 -> {1, 2}, 2 -> {3}, 1 -> {4}. Request 0 accepts 0-2-3, request 1
    # only the root (all drafts rejected), request 2 the full path 0-1-4.
    path = torch.tensor([[0, 2, 3], [0, -1, -1], [0, 1, 4]], dtype=torch.int32)
    tokens = torch.tensor([[10, 11, 12, 13, 14], [20, 21, 22, 23, 24], [30, 31, 32, 33, 34]],
                          dtype=torch.int32)
    slots = torch.arange(15).reshape(3, 5) + 100
    new_lens, next_token, src, dst = vspec.tree_commit(
        path, tokens, slots, torch.tensor([5, 6, 7], dtype=torch.int32))
    assert new_lens.tolist() == [8, 7, 10]
    assert next_token.tolist() == [13, 20, 34]
    assert src.tolist() == [[-1, 102, 103], [-1, -1, -1], [-1, -1, 114]]
    assert dst.tolist() == [[-1, 101, 102], [-1, -1, -1], [-1, -1, 112]]


# ------------------------------------------------------------ captured graphs
def test_the_ops_sit_inside_one_captured_graph(vspec):
    """torch.compile traces every op with fake tensors (fullgraph: no graph
    break) and the compiled function gives the eager results."""
    def step(sampled, discard, backup, seq_lens, path, tokens, slots):
        num_valid, next_token = torch.ops.vspec.commit_accepted(sampled, discard, backup, VOCAB)
        return (num_valid, next_token,
                *torch.ops.vspec.tree_commit(path, tokens, slots, seq_lens + num_valid))

    args = (torch.tensor([[3, 4, -1], [-1, -1, -1]], dtype=torch.int32),
            torch.tensor([False, False]), torch.tensor([7, 8], dtype=torch.int32),
            torch.tensor([10, 20], dtype=torch.int32),
            torch.tensor([[0, 2], [0, 1]], dtype=torch.int32),
            torch.arange(6, dtype=torch.int32).reshape(2, 3), torch.arange(6).reshape(2, 3))
    compiled = torch.compile(step, fullgraph=True, backend="eager", dynamic=True)
    for got, want in zip(compiled(*args), step(*args)):
        assert torch.equal(got, want)


# ------------------------------------------------------------ arguments
BAD_ARGUMENTS = [
    ("commit_accepted", "sampled must be int32",
     (torch.zeros((1, 3), dtype=torch.int64), torch.tensor([False]),
      torch.zeros(1, dtype=torch.int32), VOCAB)),
    ("commit_accepted", r"sampled width W=65 is not allowed: an integer in \[1, 64\]",
     (torch.zeros((1, 65), dtype=torch.int32), torch.tensor([False]),
      torch.zeros(1, dtype=torch.int32), VOCAB)),
    ("commit_accepted", "sampled width W=0",
     (torch.zeros((1, 0), dtype=torch.int32), torch.tensor([False]),
      torch.zeros(1, dtype=torch.int32), VOCAB)),
    ("commit_accepted", "discard must be bool",
     (torch.zeros((2, 3), dtype=torch.int32), torch.tensor([False]),
      torch.zeros(2, dtype=torch.int32), VOCAB)),
    ("commit_accepted", "backup must be int32",
     (torch.zeros((1, 3), dtype=torch.int32), torch.tensor([False]),
      torch.zeros(1, dtype=torch.int64), VOCAB)),
    ("commit_accepted", "vocab_size=0 is not allowed",
     (torch.zeros((1, 3), dtype=torch.int32), torch.tensor([False]),
      torch.zeros(1, dtype=torch.int32), 0)),
    ("tree_commit", "path must be int32",
     (torch.zeros((1, 2), dtype=torch.int64), torch.zeros((1, 3), dtype=torch.int32),
      torch.zeros((1, 3), dtype=torch.int64), torch.zeros(1, dtype=torch.int32))),
    ("tree_commit", "target_tokens must be int32",
     (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 0), dtype=torch.int32),
      torch.zeros((1, 0), dtype=torch.int64), torch.zeros(1, dtype=torch.int32))),
    ("tree_commit", r"target_tokens must be int32 \[B, N\] with B=1 and N in \[1, 1024\]",
     (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 1025), dtype=torch.int32),
      torch.zeros((1, 1025), dtype=torch.int64), torch.zeros(1, dtype=torch.int32))),
    ("tree_commit", "slots must be int64",
     (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 3), dtype=torch.int32),
      torch.zeros((1, 4), dtype=torch.int64), torch.zeros(1, dtype=torch.int32))),
    ("tree_commit", "seq_lens must be int32",
     (torch.zeros((1, 2), dtype=torch.int32), torch.zeros((1, 3), dtype=torch.int32),
      torch.zeros((1, 3), dtype=torch.int64), torch.zeros(2, dtype=torch.int32))),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op, message, args", BAD_ARGUMENTS,
                         ids=[m.split(" ")[0] + "-" + str(i) for i, (_, m, _) in
                              enumerate(BAD_ARGUMENTS)])
def test_every_backend_refuses_the_same_arguments(vspec, backend, op, message, args):
    with pytest.raises(RuntimeError, match=message):
        run(op, backend, *args)


def test_the_library_registers_exactly_the_ops_that_have_a_fake(vspec):
    """Every op the C++ library defines has a Meta implementation, and no
    fake outlives its op (an op without a serving call site is dropped with
    its fake: docs/ascend.md, "Custom ops")."""
    defined = {name for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("vspec::")}
    assert defined == set(ops.FAKES), defined ^ set(ops.FAKES)


def test_a_missing_library_names_the_make_command(monkeypatch, tmp_path):
    monkeypatch.setattr(ops, "_loaded", None)
    monkeypatch.setattr(ops, "library_candidates", lambda: [tmp_path / ops.LIBRARY])
    with pytest.raises(ops.OpsLibraryMissing, match="run `make ops`"):
        ops.load_compiled()


# ------------------------------------------------------------ torch fallback
def _hidden(monkeypatch, tmp_path):
    """No library anywhere vspec looks, and none loaded yet in this 'process'."""
    monkeypatch.setattr(ops, "_loaded", None)
    monkeypatch.setattr(ops, "_fallback", None)
    monkeypatch.setattr(ops, "library_candidates", lambda: [tmp_path / ops.LIBRARY])


def test_a_missing_library_falls_back_to_torch_with_one_warning(monkeypatch, tmp_path, caplog):
    _hidden(monkeypatch, tmp_path)
    with caplog.at_level("WARNING", logger="vllm.vllm_vspec.kernels.ops"):
        first, second = ops.load(), ops.load("npu")
    assert first is second is ops.TORCH_OPS
    warnings = [r.getMessage() for r in caplog.records if r.name == "vllm.vllm_vspec.kernels.ops"]
    assert len(warnings) == 1 and "running the torch implementation" in warnings[0]
    assert "not found" in warnings[0] and "make ops" in warnings[0]
    assert ops.backend().startswith("torch fallback: the compiled library is unavailable")


def test_an_unloadable_library_falls_back_to_torch(monkeypatch, tmp_path):
    _hidden(monkeypatch, tmp_path)
    (tmp_path / ops.LIBRARY).write_bytes(b"not an ELF file")
    assert ops.load() is ops.TORCH_OPS
    assert "torch fallback" in ops.backend() and str(tmp_path) in ops.backend()


def test_the_compiled_library_is_logged_once(vspec, monkeypatch, caplog):
    monkeypatch.setattr(ops, "_fallback", None)
    monkeypatch.setattr(ops, "_announced", False)
    with caplog.at_level("INFO", logger="vllm.vllm_vspec.kernels.ops"):
        ops.load(), ops.load()
    lines = [r.getMessage() for r in caplog.records if r.name == "vllm.vllm_vspec.kernels.ops"]
    assert lines == [f"vspec ops: the compiled library {ops.loaded_from()}"]
    assert ops.backend() == f"compiled {ops.loaded_from()}"


def test_a_library_without_the_devices_kernels_falls_back_for_that_device(vspec, monkeypatch):
    """The checkout's CPU build has no AscendC (PrivateUse1) kernels: an NPU
    caller gets the torch ops, a CPU caller the compiled ones."""
    monkeypatch.setattr(ops, "_fallback", None)
    assert ops.load("cpu").compiled is torch.ops.vspec
    assert ops.load("npu") is ops.TORCH_OPS
    assert "has no npu kernel" in ops.backend()


# ------------------------------------------------- run-time fallback (CheckedOps)
class _StandInLibrary:
    """A CPU stand-in for the compiled ops (the NPU launch path cannot run
    here): `commit_accepted` raises like a failed kernel launch, or returns
    a wrong result, as told; `tree_commit` is the real compiled op. Counts
    its calls."""

    def __init__(self, commit: str):
        self.commit, self.calls = commit, []

    def commit_accepted(self, *args):
        self.calls.append("commit_accepted")
        if self.commit == "raise":
            raise RuntimeError("aclnnVspecCommitAccepted launch failed: 507015")
        num_valid, next_token = torch.ops.vspec.commit_accepted(*args)
        return (num_valid + 1 if self.commit == "wrong" else num_valid), next_token

    def tree_commit(self, *args):
        self.calls.append("tree_commit")
        return torch.ops.vspec.tree_commit(*args)


@pytest.fixture
def stand_in(vspec, monkeypatch):
    """ops.load() over a stand-in library, in a fresh 'process'."""
    for name, value in (("_fallback", None), ("_failed", None), ("_checked", None),
                        ("_announced", True)):
        monkeypatch.setattr(ops, name, value)

    def use(commit: str) -> _StandInLibrary:
        library = _StandInLibrary(commit)
        monkeypatch.setattr(ops, "load_compiled", lambda: library)
        return library
    return use


COMMIT_ARGS = (torch.tensor([[4, 5, 50], [-1, 2, 3]], dtype=torch.int32),
               torch.tensor([False, False]), torch.tensor([7, 8], dtype=torch.int32), 30)


def _torch_commit():
    return ops.TORCH_OPS.commit_accepted(*COMMIT_ARGS)


@pytest.mark.parametrize("commit, why", [
    ("raise", "the compiled commit_accepted failed at run time (RuntimeError: "
              "aclnnVspecCommitAccepted launch failed: 507015)"),
    ("wrong", "the compiled commit_accepted's first call disagreed with the torch "
              "implementation (output 0: 2 of 2 values differ)"),
])
def test_a_failing_compiled_op_falls_back_to_torch_for_the_rest_of_the_process(
        stand_in, caplog, commit, why):
    library = stand_in(commit)
    with caplog.at_level("WARNING", logger="vllm.vllm_vspec.kernels.ops"):
        checked = ops.load("cpu")
        got = checked.commit_accepted(*COMMIT_ARGS)
        again = checked.commit_accepted(*COMMIT_ARGS)
        later = ops.load("cpu")
    assert [t.tolist() for t in got] == [t.tolist() for t in again] ==         [t.tolist() for t in _torch_commit()]
    assert library.calls == ["commit_accepted"]   # never again, for any op
    assert later is ops.TORCH_OPS
    assert ops.backend() == f"torch fallback: {why}"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"vspec ops: running the torch implementation for the rest of this "
                     f"process ({why})"]


def test_a_compiled_op_that_agrees_on_its_first_call_keeps_running(stand_in, monkeypatch):
    library = stand_in("right")
    want = [t.tolist() for t in _torch_commit()]
    torch_calls = []
    monkeypatch.setattr(ops.TORCH_OPS, "commit_accepted",
                        lambda *a: torch_calls.append(1) or ops.TorchOps.commit_accepted(
                            ops.TORCH_OPS, *a), raising=False)
    checked = ops.load("cpu")
    for _ in range(3):
        got = checked.commit_accepted(*COMMIT_ARGS)
    assert [t.tolist() for t in got] == want
    assert library.calls == ["commit_accepted"] * 3 and torch_calls == [1]  # the first call only
    assert ops.load("cpu") is checked and ops.backend() == f"compiled {ops.loaded_from()}"


def test_arguments_the_torch_implementation_refuses_too_are_the_callers_error(stand_in):
    stand_in("raise")
    bad = (COMMIT_ARGS[0].long(), *COMMIT_ARGS[1:])   # sampled must be int32
    with pytest.raises(RuntimeError, match="sampled must be int32"):
        ops.load("cpu").commit_accepted(*bad)
    assert ops.backend() == f"compiled {ops.loaded_from()}"   # no fallback


def test_doctor_says_which_backend_runs(monkeypatch, tmp_path):
    from vllm_vspec.commands import doctor

    _hidden(monkeypatch, tmp_path)
    result = {"summary": doctor.summary([], {}), "abi": [], "ok": True}
    assert result["summary"]["ops_library"]["backend"].startswith("torch fallback")
    (row,) = [line for line in doctor._table(result, []).splitlines()
              if line.startswith("  backend ")]
    assert "torch fallback: the compiled library is unavailable" in row


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(0, 9), width=st.integers(1, 8), vocab=st.integers(1, 40), data=st.data())
def test_the_torch_commit_accepted_equals_the_compiled_op(vspec, batch, width, vocab, data):
    sampled = torch.tensor(data.draw(st.lists(st.lists(st.integers(-1, 45), min_size=width,
                                                       max_size=width),
                                              min_size=batch, max_size=batch)),
                           dtype=torch.int32).reshape(batch, width)
    discard = torch.tensor(data.draw(st.lists(st.booleans(), min_size=batch, max_size=batch)),
                           dtype=torch.bool)
    backup = torch.randint(0, 99, (batch,), dtype=torch.int32)
    want = vspec.commit_accepted(sampled, discard, backup, vocab)
    check("cpu", ops.TORCH_OPS.commit_accepted(sampled, discard, backup, vocab), list(want))


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(0, 6), depth=st.integers(1, 6), nodes=st.integers(1, 9), data=st.data())
def test_the_torch_tree_commit_equals_the_compiled_op(vspec, batch, depth, nodes, data):
    path = torch.tensor(data.draw(st.lists(st.lists(st.integers(-1, nodes + 1), min_size=depth,
                                                    max_size=depth),
                                           min_size=batch, max_size=batch)),
                        dtype=torch.int32).reshape(batch, depth)
    if batch and data.draw(st.booleans()):   # row 0: a real root path, -1 padded
        rest = sorted(data.draw(st.sets(st.integers(1, nodes - 1), max_size=depth - 1))
                      if nodes > 1 else [])
        row = [0] + rest + [-1] * (depth - 1 - len(rest))
        path[0] = torch.tensor(row, dtype=torch.int32)
    target = torch.randint(0, 99, (batch, nodes), dtype=torch.int32)
    slots = torch.randperm(max(batch * nodes, 1))[:batch * nodes].reshape(batch, nodes)
    seq_lens = torch.randint(0, 50, (batch,), dtype=torch.int32)
    want = vspec.tree_commit(path, target, slots, seq_lens)
    check("cpu", ops.TORCH_OPS.tree_commit(path, target, slots, seq_lens), list(want))


# ------------------------------------------------------------ AscendC sources
KERNELS = sorted((Path(__file__).resolve().parents[2] / "csrc" / "kernels").glob("*.cpp"))


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_ascendc_kernel_compiles_against_the_api_stub(kernel):
    """Syntax, types and arity of our AscendC code against a declarations-only
    stand-in of kernel_operator.h (tests/ascendc_stub): not a CANN build."""
    stub = Path(__file__).resolve().parents[1] / "ascendc_stub"
    run = subprocess.run(["c++", "-std=c++17", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                          "-I", str(stub), str(kernel)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_status_reports_a_stale_library_instead_of_raising(vspec, monkeypatch):
    """A library without an op this package has a fake for (an old build)
    is reported by `vllm-vspec doctor` with the error, not raised."""
    monkeypatch.setattr(ops, "_loaded", None)
    monkeypatch.setitem(ops.FAKES, "vspec::not_in_the_library", lambda *args: None)
    status = ops.status()
    assert (status["loaded"], status["ops"]) == (False, {})
    assert status["library"] == str(next(p for p in ops.library_candidates() if p.is_file()))
    assert "vspec::not_in_the_library does not exist" in status["error"], status


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")
def test_the_npu_wrappers_compile_against_stubs_of_torch_npu_and_acl():
    """csrc/npu_ops.cpp (launches through torch_npu's OpCommand, as vLLM-Ascend's
    ops do) against the real torch headers and declarations-only stand-ins of
    the ACL, OpCommand, NPUStream and generated launch headers
    (tests/npu_stub): its syntax, types and the calls' arity, not a CANN build."""
    include = Path(torch.__file__).resolve().parent / "include"
    here = Path(__file__).resolve().parents[1]  # tests/
    run = run_command(["c++", "-std=c++20", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
                       "-I", str(here / "npu_stub"), "-I", str(here.parent / "csrc"),
                       "-isystem", str(include),
                       "-isystem", str(include / "torch" / "csrc" / "api" / "include"),
                       str(here.parent / "csrc" / "npu_ops.cpp")], timeout_s=600)
    assert run.returncode == 0, run.stderr[-4000:]
