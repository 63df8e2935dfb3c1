"""Draft ACL graphs per gamma, through vLLM-Ascend 0.23.0.post1's own capture
and replay code, driven on CPU (nothing here runs on an NPU).

What is the host's own code, read from the pinned sdist (hash-checked by
vllm_vspec.tools.ascend_build.common) at test time, never copied:
- compilation/acl_graph.py, executed whole: ACLGraphWrapper (capture on a
  new batch descriptor, replay after), GraphParams, set_draft_graph_params,
  get_draft_graph_params, weak_ref_workspaces;
- spec_decode/llm_base_proposer.py AscendSpecDecodeBaseProposer.dummy_run
  (the capture pass the runner calls per capture size: the per-step
  metadata, the rows the draft graph samples, the wrapped draft call, the
  update when FULL and not capturing) and shallow_copy_metadata;
- attention/attention_v1.py AscendAttentionBackendImpl.full_graph_fia (the
  capture side: appends each attention call's event, parameters and task
  handle to the draft store under its token count) and
  AscendAttentionBackendImpl.update_graph_params (the replay side: zips the
  store's entries for the token count with the step's per-draft-step
  metadata and rewrites each captured task);
the methods are taken out of their files by name and run in a namespace that
supplies their module globals; and vLLM 0.23's v1/cudagraph_dispatcher.py
(the pin's vLLM source wheel, executed as its module), whose FULL keys give
the capture sizes the draft graph memory budget prices.

What is a stand-in, written here (so these tests show the host code's
bookkeeping, not the NPU's behaviour):
- torch.npu / torch_npu graph primitives (`FakeNPU`): a graph records the
  FIA calls made while it captures as tasks, a task-update rewrites one
  task's arguments, a replay is queued and its tasks run at the next flush,
  each only if its external event was recorded after the replay was queued
  (else the NPU would wait on it: reported as a hang);
- the rest of the host proposer (`HostLikeProposer`): the buffers its
  __init__ sizes by K, load_model's wrap, a _propose in the order of the
  host's (dispatch, the draft call, then the update) without its input
  preparation, and the merged draft loop reduced to one FIA call per draft
  step and attention layer (the model's forward), recording the rows and
  steps of every call;
- the runner fields dummy_run reads, the attention metadata builder, the
  forward context (set_ascend_forward_context's fields the code reads).

vspec's StepGammaProposer (the real class) sits over the host-like
proposer, as over the host's in the wheel.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import sys
import textwrap
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import pytest
import torch

from vllm_ascend.vspec.graph_params import PerGamma

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
NUM_TOKENS = 8   # the one capture size: 8 draft tokens (batch 8)
K = 3


@pytest.fixture(scope="module")
def host_tree(tmp_path_factory) -> Path:
    """The pinned vLLM-Ascend sdist, unpacked (fetched once into .cache/, hash-checked)."""
    from vllm_vspec.tools.ascend_build import common

    default, pins = common.load_pins()
    return common.unpack(common.fetch_sdist(pins[default], CACHE),
                         tmp_path_factory.mktemp("host") / "tree")


# ------------------------------------------------------------ NPU stand-in
class Event:
    def __init__(self):
        self.recorded = 0

    def wait(self, stream):
        FAKE.pending_event = self

    def reset(self, stream):
        pass

    def record(self, stream):
        self.recorded += 1


@dataclasses.dataclass
class Task:
    graph: "Graph"
    tag: tuple        # (draft step, layer) of the captured call
    kwargs: dict
    event: Event


class Handle:
    def __init__(self, task):
        self.task = task


class Graph:
    def __init__(self):
        self.tasks: list[Task] = []
        self.replays = 0
        self.gamma = None   # set by the test, for reports

    def replay(self):
        self.replays += 1
        FAKE.queue.append((self, {id(t.event): t.event.recorded for t in self.tasks}))


class FakeNPU:
    """torch.npu's and torch_npu's graph primitives, as the host code calls them."""

    def __init__(self):
        self.capturing: Graph | None = None
        self.updating: Handle | None = None
        self.pending_event: Event | None = None
        self.tag: tuple = ()
        self.queue: list = []
        self.executed: list = []   # (graph gamma, tag, actual_seq_lengths_kv)
        self.hangs: list = []

    # torch.npu
    NPUGraph = Graph
    ExternalEvent = Event
    Stream = object

    @contextlib.contextmanager
    def graph(self, graph, pool=None):
        self.capturing = graph
        try:
            yield
        finally:
            self.capturing = None

    def graph_task_group_begin(self, stream):
        pass

    def graph_task_group_end(self, stream):
        return Handle(self.capturing.tasks[-1])

    def graph_task_update_begin(self, stream, handle):
        self.updating = handle

    def graph_task_update_end(self, stream):
        self.updating = None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self):
        return SimpleNamespace(synchronize=self.flush)

    # torch_npu.npu_fused_infer_attention_score.out
    def fia_out(self, **kwargs):
        if self.updating is not None:
            self.updating.task.kwargs = kwargs
        elif self.capturing is not None:
            self.capturing.tasks.append(Task(self.capturing, self.tag, kwargs, self.pending_event))
        else:
            self.executed.append((None, self.tag, list(kwargs["actual_seq_lengths_kv"])))

    def flush(self):
        """Run the queued replays: a task runs only once its event was
        recorded after the replay was queued (the NPU would wait otherwise)."""
        for graph, seen in self.queue:
            for task in graph.tasks:
                if task.event.recorded <= seen[id(task.event)]:
                    self.hangs.append((graph.gamma, task.tag))
                    continue
                self.executed.append((graph.gamma, task.tag,
                                      list(task.kwargs["actual_seq_lengths_kv"])))
        self.queue.clear()


FAKE = FakeNPU()


def _torch_npu_module() -> types.ModuleType:
    module = types.ModuleType("torch_npu")
    module.npu = SimpleNamespace(current_stream=lambda: FAKE.current_stream())
    module._C = SimpleNamespace(_NPUTaskGroupHandle=Handle)
    module.npu_fused_infer_attention_score = SimpleNamespace(out=lambda **kw: FAKE.fia_out(**kw))
    module._npu_fused_infer_attention_score_get_max_workspace = lambda **kw: torch.zeros(1)
    return module


def _function(path: Path, cls: str, name: str) -> str:
    """Source of method `name` of class `cls` in the host file, dedented."""
    text = path.read_text()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    lines = text.splitlines()[item.lineno - 1:item.end_lineno]
                    return textwrap.dedent("\n".join(lines))
    raise LookupError(f"{cls}.{name} not in {path}")


@pytest.fixture
def host(host_tree, monkeypatch):
    """The host's acl_graph module (executed from the sdist) and its two
    attention functions, over the NPU stand-in; vllm_ascend.vspec.proposers
    imported over them with HostLikeProposer as the host proposers."""
    global FAKE
    # What acl_graph.py imports from vLLM, imported before torch_npu's stand-in
    # exists (transformers probes for a real torch_npu on import).
    import vllm.compilation.counter  # noqa: F401
    import vllm.compilation.cuda_graph  # noqa: F401
    import vllm.compilation.monitor  # noqa: F401
    import vllm.forward_context  # noqa: F401
    import vllm.model_executor.offloader.base  # noqa: F401
    import vllm.platforms  # noqa: F401
    from test_overlay import _engine_config  # noqa: F401

    FAKE = FakeNPU()
    monkeypatch.setattr(torch, "npu", FAKE, raising=False)
    context = SimpleNamespace(batch_descriptor=None, cudagraph_runtime_mode=None, capturing=False)
    extra = _ExtraContext(context)
    stand_ins = {
        "torch_npu": _torch_npu_module(),
        "vllm_ascend.compilation": types.ModuleType("vllm_ascend.compilation"),
        "vllm_ascend.ascend_forward_context": SimpleNamespace(_EXTRA_CTX=extra),
        "vllm_ascend.utils": SimpleNamespace(weak_ref_tensors=lambda t: t,
                                             enable_sp=lambda config=None: False),
        "vllm_ascend.spec_decode": types.ModuleType("vllm_ascend.spec_decode"),
        "vllm_ascend.spec_decode.draft_proposer":
            SimpleNamespace(AscendDraftModelProposer=HostLikeProposer),
        "vllm_ascend.spec_decode.eagle_proposer":
            SimpleNamespace(AscendEagleProposer=HostLikeProposer),
        "vllm_ascend.spec_decode.llm_base_proposer":
            SimpleNamespace(_maybe_eager_context=_not_called),
    }
    for name, module in stand_ins.items():
        monkeypatch.setitem(sys.modules, name, module)
    stand_ins["vllm_ascend.compilation"].__path__ = []

    # compilation/acl_graph.py, the host's file executed as its module.
    path = host_tree / "vllm_ascend/compilation/acl_graph.py"
    acl_graph = types.ModuleType("vllm_ascend.compilation.acl_graph")
    acl_graph.__file__, acl_graph.__package__ = str(path), "vllm_ascend.compilation"
    monkeypatch.setitem(sys.modules, acl_graph.__name__, acl_graph)
    exec(compile(path.read_text(), str(path), "exec"), acl_graph.__dict__)
    acl_graph.get_forward_context = lambda: context
    acl_graph.current_platform = SimpleNamespace(get_global_graph_pool=lambda: None)
    acl_graph.validate_cudagraph_capturing_enabled = lambda: None

    # attention/attention_v1.py: the capture side and the replay update.
    attention = host_tree / "vllm_ascend/attention/attention_v1.py"
    utils_path = host_tree / "vllm_ascend/attention/utils.py"
    namespace = dict(
        torch=torch, torch_npu=sys.modules["torch_npu"], _EXTRA_CTX=extra,
        get_graph_params=acl_graph.get_graph_params,
        get_draft_graph_params=acl_graph.get_draft_graph_params,
        get_draft_graph_prefill_params=acl_graph.get_draft_graph_prefill_params,
        update_graph_params_workspaces=acl_graph.update_graph_params_workspaces,
        update_draft_graph_params_workspaces=acl_graph.update_draft_graph_params_workspaces,
        weak_ref_tensors=lambda t: t, SWA_INT_MAX=2147483647,
        needs_layer_aware_fia_graph_replay=lambda: False,
        using_paged_attention=lambda num_tokens, vllm_config: False,
        cdiv=lambda a, b: -(-a // b),
        AscendAttentionState=SimpleNamespace(DecodeOnly="DecodeOnly"))
    for source in (_function(attention, "AscendAttentionBackendImpl", "full_graph_fia"),
                   _function(attention, "AscendAttentionBackendImpl", "update_graph_params"),
                   _top_level(utils_path, "cache_graph_workspace")):
        exec(compile(source, str(attention), "exec"), namespace)
    functions = SimpleNamespace(full_graph_fia=namespace["full_graph_fia"],
                                update_graph_params=namespace["update_graph_params"])

    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.proposers", raising=False)
    import vllm_ascend.vspec.proposers as proposers

    namespace = SimpleNamespace(acl_graph=acl_graph, attention=functions, context=context,
                                extra=extra, proposers=proposers)
    # llm_base_proposer.py: the host proposer's own dummy_run.
    for name, function in _host_dummy_run(host_tree, namespace).items():
        if name in ("dummy_run", "shallow_copy_metadata"):
            monkeypatch.setattr(HostLikeProposer, name, function, raising=False)
    yield namespace
    sys.modules.pop("vllm_ascend.vspec.proposers", None)


def _not_called(*args):
    raise AssertionError("_maybe_eager_context needs flashcomm1 on")


class _ExtraContext:
    """ascend_forward_context._EXTRA_CTX: `capturing` is the forward
    context's (ascend_forward_context.py lines 370-374), which
    set_ascend_forward_context clears (line 109) and ACLGraphWrapper sets
    before a capture (acl_graph.py)."""
    is_draft_model, is_draft_model_prefill, sinks = True, False, False

    def __init__(self, context):
        self._context = context

    @property
    def capturing(self):
        return self._context.capturing


def _top_level(path: Path, name: str) -> str:
    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return "\n".join(text.splitlines()[node.lineno - 1:node.end_lineno])
    raise LookupError(f"{name} not in {path}")


# ------------------------------------------------- the host-like proposer
class _Impl:
    """What full_graph_fia reads of its AscendAttentionBackendImpl."""
    enable_hamming_sparse = enable_c8_quant = False
    sliding_window = None
    num_heads, num_kv_heads, head_size, scale = 2, 1, 4, 1.0
    _use_max_workspace_for_fia_graph = _use_layer_aware_fia_graph_replay = False

    def _get_fia_params(self, key, value, attn_metadata):
        return key, value, 128, attn_metadata.block_tables, attn_metadata.seq_lens_list


def _metadata(seq_lens: list[int], num_tokens: int = NUM_TOKENS) -> SimpleNamespace:
    return SimpleNamespace(actual_seq_lengths_q=list(range(1, num_tokens + 1)),
                           seq_lens_list=seq_lens, block_tables=torch.zeros(1),
                           attn_mask=None, causal=True, attn_state="DecodeOnly")


class _Buffer:
    """vLLM's CpuGpuBuffer: a host tensor and its device copy (both CPU here)."""

    def __init__(self, n):
        self.cpu, self.gpu = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)


class _Builder:
    """The draft attention group's metadata builder (the attention backend's,
    not the proposer's logic): what full_graph_fia then reads at capture."""

    def build_for_graph_capture(self, common, state):
        return _metadata([0] * NUM_TOKENS, common.num_actual_tokens)


def _runner(max_num_reqs: int, max_num_tokens: int) -> SimpleNamespace:
    """The NPUModelRunner fields the host's dummy_run reads, as its
    _dummy_run leaves them for a uniform decode capture (DP 1, no PCP)."""
    width = 1 + K
    block_table = SimpleNamespace(get_device_tensor=lambda: torch.zeros(max_num_reqs, 4),
                                  slot_mapping=SimpleNamespace(gpu=torch.zeros(max_num_tokens)))
    qsl = _Buffer(max_num_reqs + 1)
    qsl.cpu.copy_(torch.arange(max_num_reqs + 1) * width)
    return SimpleNamespace(
        _sync_metadata_across_dp=lambda n, is_draft_model=False: (n, None, None),
        pcp_manager=None, max_num_reqs=max_num_reqs, max_num_tokens=max_num_tokens,
        attn_groups=[object()], query_start_loc=qsl,
        input_batch=SimpleNamespace(num_computed_tokens_cpu_tensor=torch.zeros(max_num_reqs),
                                    block_table=[block_table]),
        optimistic_seq_lens_cpu=torch.zeros(max_num_reqs, dtype=torch.int32),
        seq_lens=torch.zeros(max_num_reqs, dtype=torch.int32),
        actual_seq_lengths_q=list(range(1, max_num_tokens + 1)),
        positions=torch.zeros(max_num_tokens, dtype=torch.long), _dsa_positions_cpu_buf=None,
        attn_state="DecodeOnly", decode_token_per_req=width, pin_memory=False)


def _host_dummy_run(host_tree: Path, host) -> Callable:
    """AscendSpecDecodeBaseProposer.dummy_run, the host's own source from the
    pinned sdist, compiled with its module globals: the host's forward-context
    extras (_EXTRA_CTX), vLLM's CUDAGraphMode and PADDING_SLOT_ID, and
    stand-ins for the leaves it calls (the forward context setter, the
    snapshot copy to the device, the metadata record)."""
    from vllm.config import CUDAGraphMode
    from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

    @contextlib.contextmanager
    def set_ascend_forward_context(attn_metadata, vllm_config, *, batch_descriptor=None,
                                   aclgraph_runtime_mode=CUDAGraphMode.NONE,
                                   draft_attn_metadatas=None, **_):
        context = host.context
        context.batch_descriptor, context.cudagraph_runtime_mode = \
            batch_descriptor, aclgraph_runtime_mode
        context.draft_attn_metadatas = draft_attn_metadatas
        context.capturing = False   # set_ascend_forward_context, line 109
        yield

    def copy_snapshot_to_gpu(buffer):
        buffer.gpu.copy_(buffer.cpu)

    path = host_tree / "vllm_ascend/spec_decode/llm_base_proposer.py"
    namespace = dict(
        torch=torch, copy=copy, CUDAGraphMode=CUDAGraphMode, PADDING_SLOT_ID=PADDING_SLOT_ID,
        _EXTRA_CTX=host.extra, get_forward_context=lambda: host.context,
        set_ascend_forward_context=set_ascend_forward_context,
        copy_snapshot_to_gpu=copy_snapshot_to_gpu,
        AscendCommonAttentionMetadata=SimpleNamespace,
        AscendAttentionState=SimpleNamespace(SpecDecoding="SpecDecoding",
                                             ChunkedPrefill="ChunkedPrefill"))
    for name in ("dummy_run", "shallow_copy_metadata"):
        source = _function(path, "AscendSpecDecodeBaseProposer", name)
        exec(compile(source, str(path), "exec"), namespace)
    return namespace


class HostLikeProposer:
    """The host proposer's graph paths over the NPU stand-in: dummy_run and
    shallow_copy_metadata are the host's own (set by the `host` fixture);
    __init__ sets what the host's __init__ sets that they read (buffers sized
    by K, llm_base_proposer.py lines 241-260), load_model wraps as the
    host's does (lines 495-509); _propose follows the order of the host's
    (lines 791-1037: dispatch, run_draft, then the update) without its input
    preparation; the merged draft loop is one FIA call per draft step and
    attention layer (the model's forward), recording what each call got."""

    host = None  # the `host` fixture's namespace, set by _make
    max_num_seqs = NUM_TOKENS // (1 + K)
    dummy_run: Callable
    shallow_copy_metadata: Callable

    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config, self.device = vllm_config, device
        self.num_speculative_tokens = vllm_config.speculative_config.num_speculative_tokens
        k = self.num_speculative_tokens
        self.runner = runner or _runner(self.max_num_seqs, NUM_TOKENS)
        self.use_cuda_graph = True
        self.maybe_eager_context = contextlib.nullcontext()
        self._runnable = self._run_merged_draft
        self.impl = _Impl()
        self.pcp_size = self.dcp_size = 1
        self.block_table_tensor_clone = None
        self.query_start_loc = _Buffer(self.runner.max_num_reqs + 1)
        self.draft_attn_groups = [SimpleNamespace(get_metadata_builder=_Builder,
                                                  kv_cache_spec=None)]
        lens = self.runner.max_num_tokens + 2 * self.runner.max_num_reqs
        self.slot_mapping_group = [torch.zeros(lens + (k - 1) * self.runner.max_num_reqs,
                                               dtype=torch.int32) for _ in range(k)]
        self.seq_lens_group = [torch.zeros(lens, dtype=torch.int32) for _ in range(k)]
        self.query_start_loc_group = [torch.zeros(lens, dtype=torch.int32) for _ in range(k)]
        self.use_compress = self.supports_mm_inputs = False
        self.method, self.attn_layer_names, self.kv_cache_gid = "eagle", list(LAYERS), 0
        self.token_indices_to_sample = torch.zeros(NUM_TOKENS, dtype=torch.int32)
        self.extra_slots_per_request = 1
        self.draft_calls: list[dict] = []   # one per merged-draft call (capture or eager)

    def _get_positions(self, num_tokens):   # vLLM's SpecDecodeBaseProposer
        return self.runner.positions[:num_tokens]

    def load_model(self, model):   # lines 495-509
        from vllm.config import CUDAGraphMode

        if self.use_cuda_graph:
            self._runnable = self.host.acl_graph.ACLGraphWrapper(
                self._run_merged_draft, self.vllm_config, runtime_mode=CUDAGraphMode.FULL,
                use_eagle=True, enable_enpu=False)

    def _run_merged_draft(self, num_input_tokens, batch_size, token_indices_to_sample,
                          target_positions, inputs_embeds, multi_steps_attn_metadata,
                          num_tokens, is_prefill=None):
        steps = self.num_speculative_tokens
        self.draft_calls.append(dict(batch_size=batch_size, steps=steps,
                                     sampled=token_indices_to_sample.shape[0],
                                     capturing=self.host.extra.capturing))
        for step in range(steps):
            for layer in LAYERS:
                FAKE.tag = (step, layer)
                if self.host.extra.capturing:   # attention_v1.py lines 1594-1595
                    self.host.attention.full_graph_fia(
                        self.impl, torch.zeros(num_input_tokens, 8), torch.zeros(1),
                        torch.zeros(1), multi_steps_attn_metadata[step][layer],
                        torch.zeros(num_input_tokens * 8))
                elif multi_steps_attn_metadata:   # the eager FIA call (none in an eager dummy run)
                    FAKE.fia_out(
                        actual_seq_lengths_kv=multi_steps_attn_metadata[step][layer].seq_lens_list)
        return torch.zeros(batch_size, steps, dtype=torch.long)

    def _update_full_graph_params(self, forward_context, num_tokens, draft_attn_metadatas=None):
        self.host.attention.update_graph_params(
            None, forward_context, num_tokens, self.vllm_config, None, None, draft_attn_metadatas)

    def _propose(self, seq_lens=None, scheduler_output=None, num_tokens=NUM_TOKENS,
                 num_reqs=NUM_TOKENS // (1 + K), **_):
        """A uniform decode batch of `num_tokens` and `num_reqs` (a target
        step's); the runner's dispatcher, where the runner has one, gives its
        runtime mode and descriptor (the host's `cudagraph_dispatcher.dispatch`
        with the target's uniform flag), else a FULL 1 + K batch of NUM_TOKENS."""
        from vllm.config import CUDAGraphMode

        dispatcher = getattr(self.runner, "cudagraph_dispatcher", None)
        if dispatcher is not None and self.use_cuda_graph:
            mode, descriptor = dispatcher.dispatch(num_tokens=num_tokens, uniform_decode=True)
        else:
            mode = CUDAGraphMode.FULL if self.use_cuda_graph else CUDAGraphMode.NONE
            descriptor = _descriptor(NUM_TOKENS)
        steps = [{layer: _metadata(seq_lens[step], descriptor.num_tokens) for layer in LAYERS}
                 for step in range(self.num_speculative_tokens)]
        context = self.host.context
        context.cudagraph_runtime_mode = mode
        context.batch_descriptor = descriptor
        context.capturing = False   # set_ascend_forward_context, line 109
        rows = num_reqs if descriptor.num_reqs is None else descriptor.num_reqs
        num_tokens = descriptor.num_tokens
        draft = self._runnable(
            num_input_tokens=num_tokens, batch_size=rows,
            token_indices_to_sample=self.token_indices_to_sample[:rows], target_positions=None,
            inputs_embeds=None, multi_steps_attn_metadata=steps, num_tokens=num_tokens)
        if mode == CUDAGraphMode.FULL:
            self._update_full_graph_params(context, num_tokens, steps)
        return draft


def _descriptor(num_tokens: int):
    """The runner's batch descriptor of a uniform decode batch at num_tokens."""
    from vllm.forward_context import BatchDescriptor

    return BatchDescriptor(num_tokens=num_tokens, num_reqs=num_tokens // (1 + K), uniform=True)


def _capture(proposer, num_tokens: int = NUM_TOKENS, max_num_seqs: int | None = None) -> None:
    """NPUModelRunner._dummy_run's call of the drafter for one capture size
    (model_runner_v1.py, `self.drafter.dummy_run(...)`, all by keyword); its
    uniform decode batch has min(max_num_seqs, cdiv(num_tokens, 1 + K))
    requests."""
    from vllm.config import CUDAGraphMode

    num_reqs = -(-num_tokens // (1 + K))
    if max_num_seqs is not None:
        num_reqs = min(max_num_seqs, num_reqs)
    proposer.dummy_run(num_tokens=num_tokens, with_prefill=False,
                       num_reqs=num_reqs, num_tokens_across_dp=None,
                       aclgraph_runtime_mode=CUDAGraphMode.FULL,
                       batch_descriptor=_descriptor(num_tokens),
                       dummy_compute_logits=lambda hidden_states: None,
                       in_graph_capturing=True, is_profile=False)


def _config(vspec=None, max_num_seqs: int = HostLikeProposer.max_num_seqs):
    """The engine config at K, with the scheduler's max_num_seqs (the rows of
    the runner's buffers)."""
    from test_overlay import _engine_config

    config = _engine_config("eagle", K, vspec=vspec or {})
    config.scheduler_config.max_num_seqs = max_num_seqs
    return config


def _make(host, vspec=None, dispatcher=None):
    HostLikeProposer.host = host
    proposer = host.proposers.VSpecEagleProposer(_config(vspec), torch.device("cpu"))
    if dispatcher is not None:   # the runner's, keys initialised before capture
        proposer.runner.cudagraph_dispatcher = dispatcher
    proposer.load_model(model=None)
    host.acl_graph.set_draft_graph_params([NUM_TOKENS])   # model_runner_v1.py line 5099
    _capture(proposer)
    return proposer


def _graphs(proposer) -> dict[int, Graph]:
    """gamma -> the graph its wrapper captured (one batch descriptor each)."""
    out = {}
    for gamma in range(1, K + 1):
        wrapper = proposer._vspec_runnables.get(gamma, proposer._vspec_max_runnable)
        (entry,) = wrapper.concrete_aclgraph_entries.values()
        entry.aclgraph.gamma = gamma
        out[gamma] = entry.aclgraph
    return out


def _seq_lens(call: int, gamma: int) -> list[list[int]]:
    """Distinct sequence lengths per draft step and call: 1000*call + 10*step + request."""
    return [[1000 * call + 10 * step + r for r in range(NUM_TOKENS)] for step in range(gamma)]


def _step(proposer, call, gamma):
    from types import SimpleNamespace as NS

    FAKE.executed.clear()
    proposer._propose(seq_lens=_seq_lens(call, max(gamma, 1)),
                      scheduler_output=NS(num_spec_tokens_to_schedule=gamma))
    FAKE.flush()
    return list(FAKE.executed)


# ------------------------------------------------------------------ tests
def test_each_gamma_is_captured_once_into_its_own_parameter_store(host):
    proposer = _make(host)
    graphs = _graphs(proposer)
    assert len({id(g) for g in graphs.values()}) == K
    for gamma, graph in graphs.items():
        # one task per draft step and attention layer, in the loop's order
        assert [t.tag for t in graph.tasks] == [(s, layer) for s in range(gamma) for layer in LAYERS]
    store = host.acl_graph.get_draft_graph_params()
    for gamma in range(1, K + 1):
        params = store.attn_params[(gamma, NUM_TOKENS)]
        handles = store.handles[(gamma, NUM_TOKENS)]
        assert len(params) == len(handles) == gamma * len(LAYERS)
        assert [h.task.graph for h in handles] == [graphs[gamma]] * (gamma * len(LAYERS))


def test_every_gammas_draft_graph_samples_the_batch_descriptors_rows(host):
    """The host's dummy_run sizes the rows its draft graph samples by
    num_speculative_tokens (`batch_size = num_tokens // (num_speculative_tokens
    + 1)`). A FULL draft graph is replayed only for a uniform decode batch of
    1 + K tokens a request (the dispatcher's uniform_decode), whose drafts the
    runner copies into its max_num_reqs-row buffer: every gamma's graph,
    captured through the host's own dummy_run, samples the descriptor's
    num_tokens // (1 + K) rows and drafts its own gamma steps."""
    proposer = _make(host)
    captures = [call for call in proposer.draft_calls if call["capturing"]]
    assert sorted(call["steps"] for call in captures) == list(range(1, K + 1))
    rows = _descriptor(NUM_TOKENS).num_reqs
    assert rows == NUM_TOKENS // (1 + K) <= proposer.runner.max_num_reqs
    assert [(call["steps"], call["batch_size"], call["sampled"]) for call in captures] == \
        [(call["steps"], rows, rows) for call in captures]


def test_a_capture_that_would_sample_more_rows_than_max_num_seqs_is_refused(host):
    """The runner copies a step's draft rows into a buffer of max_num_seqs
    rows, so a draft graph sampling more could never replay correctly: with
    max_num_seqs 1 the runner's capture at 8 tokens is a batch of 1 request,
    while the host's dummy_run would sample 8 // (1 + K) = 2 rows; the
    capture is refused before any graph records a task, naming the capture
    size, the gamma, the rows and max_num_seqs."""
    HostLikeProposer.host = host
    proposer = host.proposers.VSpecEagleProposer(
        _config(max_num_seqs=1), torch.device("cpu"), runner=_runner(1, NUM_TOKENS))
    proposer.load_model(model=None)
    host.acl_graph.set_draft_graph_params([NUM_TOKENS])
    with pytest.raises(ValueError) as refused:
        _capture(proposer, max_num_seqs=1)
    message = str(refused.value)
    assert "draft graph of gamma 1 at capture size 8 tokens would sample 2 rows" in message
    assert "max_num_seqs=1" in message and "ascend_draft_full_graph" in message
    assert proposer.draft_calls == []
    wrappers = [*proposer._vspec_runnables.values(), proposer._vspec_max_runnable]
    assert all(not w.concrete_aclgraph_entries for w in wrappers)
    assert proposer.num_speculative_tokens == K


def test_each_gamma_replays_its_own_graph_with_its_own_steps_parameters(host):
    proposer = _make(host)
    graphs = _graphs(proposer)
    for call, gamma in enumerate([2, 1, 3, 2, 0, 3, 1], start=1):
        before = {g: graph.replays for g, graph in graphs.items()}
        executed = _step(proposer, call, gamma)
        ran = max(gamma, 1)   # gamma 0 runs the first draft pass (gamma 1's graph)
        assert {g: graph.replays - before[g] for g, graph in graphs.items()} == \
            {g: int(g == ran) for g in graphs}
        assert FAKE.hangs == []
        want = [(ran, (s, layer), _seq_lens(call, ran)[s]) for s in range(ran) for layer in LAYERS]
        assert executed == want, (gamma, executed)


def test_the_hosts_token_count_keys_alone_give_a_gamma_another_steps_parameters(host):
    """The hazard the keyed store removes, shown with the same host code:
    every gamma's capture appends to one list per token count, and gamma 2's
    replay update then writes draft step 1's sequence lengths into its step-0
    tasks (and step 0's into step 1's)."""
    proposer = _make_unkeyed(host)
    store = host.acl_graph.get_draft_graph_params()
    assert len(store.attn_params[NUM_TOKENS]) == sum(range(1, K + 1)) * len(LAYERS)
    executed = _step(proposer, 1, 2)
    assert [gamma for gamma, _, _ in executed] == [2] * (2 * len(LAYERS))
    wrong = [(tag, lens) for gamma, tag, lens in executed if lens != _seq_lens(1, 2)[tag[0]]]
    assert {tag[0] for tag, _ in wrong} == {0, 1}, executed


def _make_unkeyed(host):
    HostLikeProposer.host = host
    proposer = host.proposers.VSpecEagleProposer(_config(), torch.device("cpu"))
    proposer.vspec_key_graph_params = False
    proposer.load_model(model=None)
    host.acl_graph.set_draft_graph_params([NUM_TOKENS])
    _capture(proposer)
    _graphs(proposer)
    return proposer


def test_the_hosts_sleep_mode_reset_clears_every_gammas_lists(host):
    """device_allocator/sleep_mem_optimized.py reset_graph_params: the host's
    loop over dataclasses.fields of the store, run on the keyed store."""
    from collections.abc import MutableMapping

    proposer = _make(host)
    store = host.acl_graph.get_draft_graph_params()
    for field in dataclasses.fields(store):   # the host's loop, lines 89-95
        attr_dict = getattr(store, field.name, None)
        assert isinstance(attr_dict, MutableMapping)
        for num_tokens, value in attr_dict.items():
            if isinstance(value, list):
                attr_dict[num_tokens] = []
    for gamma in range(1, K + 1):
        assert store.attn_params[(gamma, NUM_TOKENS)] == []
    assert proposer.num_speculative_tokens == K


def test_eager_drafts_capture_nothing_and_keep_the_hosts_flashcomm1_workaround(host, monkeypatch):
    """ascend_draft_full_graph=false: the host's own eager switch, and what the
    host's __init__ derives from it (llm_base_proposer.py lines 236-239):
    with flashcomm1 on, load_model runs under _maybe_eager_context."""
    from vllm.config import CUDAGraphMode

    from test_overlay import _engine_config

    marker = object()
    calls = []
    monkeypatch.setitem(sys.modules, "vllm_ascend.spec_decode.llm_base_proposer",
                        SimpleNamespace(_maybe_eager_context=lambda c: calls.append(c) or marker))
    sys.modules["vllm_ascend.utils"].enable_sp = lambda config=None: True
    HostLikeProposer.host = host
    config = _engine_config("eagle", K, vspec={"ascend_draft_full_graph": False})
    proposer = host.proposers.VSpecEagleProposer(config, torch.device("cpu"))
    assert proposer.use_cuda_graph is False
    assert proposer.maybe_eager_context is marker and calls == [config]
    proposer.load_model(model=None)
    assert proposer._vspec_runnables == {}
    host.acl_graph.set_draft_graph_params([NUM_TOKENS])
    _capture(proposer)
    assert not isinstance(host.acl_graph.get_draft_graph_params().attn_params, PerGamma)
    executed = _step(proposer, 1, 2)
    assert [gamma for gamma, _, _ in executed] == [None] * (2 * len(LAYERS))   # eager calls


def test_without_flashcomm1_the_eager_switch_leaves_the_hosts_context(host):
    from test_overlay import _engine_config

    HostLikeProposer.host = host
    proposer = host.proposers.VSpecEagleProposer(
        _engine_config("eagle", K, vspec={"ascend_draft_full_graph": False}), torch.device("cpu"))
    assert isinstance(proposer.maybe_eager_context, contextlib.nullcontext)


def test_the_hosts_init_sets_the_workaround_from_use_cuda_graph_after_its_last_flip(host_tree):
    """What run_draft_eagerly repeats is what the host's __init__ does: the
    maybe_eager_context assignment reads use_cuda_graph and enable_sp after
    the last host assignment of use_cuda_graph (llm_base_proposer.py 215-239)."""
    text = (host_tree / "vllm_ascend/spec_decode/llm_base_proposer.py").read_text()
    init = _function(host_tree / "vllm_ascend/spec_decode/llm_base_proposer.py",
                     "AscendSpecDecodeBaseProposer", "__init__")
    flips = [i for i, line in enumerate(init.splitlines()) if "self.use_cuda_graph =" in line]
    guard = [i for i, line in enumerate(init.splitlines())
             if line.strip() == "if not self.use_cuda_graph and enable_sp(vllm_config):"]
    assert len(guard) == 1 and flips and max(flips) < guard[0]
    assert init.splitlines()[guard[0] + 1].strip() == \
        "self.maybe_eager_context = _maybe_eager_context(vllm_config)"
    assert "def _maybe_eager_context(vllm_config):" in text


# ------------------------------------------------------- graph memory budget
def pinned_vllm_module(host: str | None, path: str) -> types.ModuleType:
    """A module of the vLLM a vLLM-Ascend pin runs on (`host`; None: the
    default pin), from the vLLM source wheel patches/hosts.toml names
    (hash-checked), executed as its module over the installed vLLM's
    config classes."""
    import zipfile

    from vllm_vspec.tools.ascend_build import common

    default, pins = common.load_pins()
    wheel = common.fetch_vllm_source(pins[host or default], CACHE)
    module = types.ModuleType(f"pinned_vllm_{path.replace('/', '_')[:-3]}")
    exec(compile(zipfile.ZipFile(wheel).read(path).decode(), path, "exec"), module.__dict__)
    return module


def sdist_file(version: str, member: str, tmp_path_factory) -> Path:
    """A file of a pin's vLLM-Ascend sdist (hash-checked), written out."""
    import tarfile

    from vllm_vspec.tools.ascend_build import common

    _, pins = common.load_pins()
    pin = pins[version]
    with tarfile.open(common.fetch_sdist(pin, CACHE)) as sdist:
        text = sdist.extractfile(f"vllm_ascend-{pin.version}/{member}").read().decode()
    path = tmp_path_factory.mktemp(f"host-{version}") / Path(member).name
    path.write_text(text)
    return path


def host_batch_padding(runner_path: Path):
    """NPUModelRunner._determine_batch_execution_and_padding from a pin's
    model_runner_v1.py, executed with its module globals: vLLM's graph types
    and numpy/torch, the sequence-parallel and PD-recompute switches off."""
    from vllm.compilation.cuda_graph import CUDAGraphStat
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    namespace = dict(np=np, torch=torch, CUDAGraphMode=CUDAGraphMode,
                     BatchDescriptor=BatchDescriptor, CUDAGraphStat=CUDAGraphStat,
                     enable_sp=lambda vllm_config=None: False,
                     is_pd_decode_recompute_scheduler_enabled=lambda vllm_config=None: False)
    exec(compile(_function(runner_path, "NPUModelRunner", "_determine_batch_execution_and_padding"),
                 str(runner_path), "exec"), namespace)
    return namespace["_determine_batch_execution_and_padding"]


@pytest.fixture(scope="module")
def host_dispatcher_cls():
    """vLLM 0.23's CudagraphDispatcher, the pin's own source."""
    return pinned_vllm_module(None, "vllm/v1/cudagraph_dispatcher.py").CudagraphDispatcher


def _dispatcher(cls, capture_sizes=(4, 8, 16)):
    """The runner's dispatcher as NPUModelRunner._check_and_update_cudagraph_mode
    leaves it: keys initialised for FULL decode graphs at width 1 + K."""
    return host_dispatcher(cls, K, HostLikeProposer.max_num_seqs, capture_sizes)


def host_dispatcher(cls, k: int, max_num_seqs: int, capture_sizes) -> object:
    """A host CudagraphDispatcher (vLLM 0.23's or 0.30's), keys initialised
    for FULL decode graphs at width 1 + k over `capture_sizes` (the vLLM
    config fields it reads: 0.23 takes K from the speculative config, 0.30
    from vllm_config.num_speculative_tokens)."""
    from vllm.config import CompilationConfig, CUDAGraphMode

    compilation = CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY",
                                    cudagraph_capture_sizes=list(capture_sizes),
                                    max_cudagraph_capture_size=max(capture_sizes))
    config = SimpleNamespace(compilation_config=compilation, lora_config=None,
                             num_speculative_tokens=k,
                             speculative_config=SimpleNamespace(num_speculative_tokens=k),
                             scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs))
    dispatcher = cls(config)
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, 1 + k)
    return dispatcher


def test_the_draft_graphs_are_priced_at_the_hosts_full_capture_sizes(host_dispatcher_cls):
    """The sizes the draft's FULL graphs are captured at are the host
    dispatcher's FULL descriptors (uniform decode at 1 + K, at most
    max_num_seqs requests: 16 tokens would be 4 requests of 4, more than 2),
    and each gamma below K is priced over all of them."""
    from vllm_ascend.vspec import graph_budget

    runner = SimpleNamespace(cudagraph_dispatcher=_dispatcher(host_dispatcher_cls))
    assert graph_budget.full_capture_sizes(runner) == [4, 8]
    plan = graph_budget.plan(K, graph_budget.full_capture_sizes(runner), 24, 1024)
    per_graph = {g: max(graph_budget.GRAPH_FLOOR_BYTES, g * 24 * graph_budget.LAYER_STEP_BYTES)
                 for g in range(1, K)}
    assert plan.cost == {g: 2 * per_graph[g] for g in range(1, K)}
    assert plan.kept == (1, 2) and plan.skipped == () and plan.captured == (1, 2, K)


def test_gammas_over_the_graph_budget_are_skipped_in_order_of_cost():
    from vllm_ascend.vspec import graph_budget

    mib = graph_budget.MIB
    # 10 sizes, 24 layers: gamma g costs 10 x g x 3 MiB.
    assert graph_budget.plan(4, range(10), 24, 0).captured == (4,)
    assert graph_budget.plan(4, range(10), 24, 30).kept == (1,)
    assert graph_budget.plan(4, range(10), 24, 89.9).skipped == (2, 3)
    assert graph_budget.plan(4, range(10), 24, 90).kept == (1, 2)
    plan = graph_budget.plan(4, range(10), 24, 90)
    assert [plan.drafted(g) for g in (1, 2, 3, 4)] == [1, 2, 4, 4]
    assert plan.kept_bytes == 90 * mib
    assert "skipped gammas 3 (estimated 90 MiB more)" in plan.line()
    assert "skipped" not in graph_budget.plan(4, range(10), 24, 180).line()


def test_a_gamma_over_the_budget_gets_no_graph_and_drafts_with_the_next_one(
        host, host_dispatcher_cls, caplog):
    """A budget that fits gamma 1's graphs only (two FULL sizes at the 1 MiB
    per-graph floor: 2 MiB a gamma): the host's dummy_run captures gammas 1
    and K, one start-up line names gamma 2, and a step at gamma 2 replays
    K's graph with K's own parameters and returns its 2 drafts then -1."""
    import logging

    with caplog.at_level(logging.INFO, logger="vllm"):
        proposer = _make(host, {"ascend_draft_graph_budget_mib": 3},
                         dispatcher=_dispatcher(host_dispatcher_cls))
    captures = [call["steps"] for call in proposer.draft_calls if call["capturing"]]
    assert captures == [1, K]
    assert set(proposer._vspec_runnables) == {1}
    lines = [r for r in caplog.records if "per-gamma draft graphs" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "for gammas 1 " in lines[0].getMessage()
    assert "skipped gammas 2 (estimated 2 MiB more)" in lines[0].getMessage()

    graphs = {g: _graphs(proposer)[g] for g in (1, K)}
    before = {g: graph.replays for g, graph in graphs.items()}
    FAKE.executed.clear()
    draft = proposer._propose(seq_lens=_seq_lens(1, K),
                              scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=2))
    FAKE.flush()
    assert {g: graph.replays - before[g] for g, graph in graphs.items()} == {1: 0, K: 1}
    assert FAKE.hangs == []
    assert FAKE.executed == [(K, (s, layer), _seq_lens(1, K)[s])
                             for s in range(K) for layer in LAYERS]
    assert draft.shape[1] == K
    assert (draft[:, :2] != -1).all() and (draft[:, 2:] == -1).all()
    assert proposer.num_speculative_tokens == K

