"""Draft ACL graphs per gamma on vLLM-Ascend 0.30.0rc2, through that host's
own proposer and graph code, driven on CPU (nothing here runs on an NPU).

What is the host's own code, read from the pinned 0.30.0rc2 sdist
(hash-checked) at test time, never copied:
- compilation/updatable_graph.py and compilation/acl_graph.py, executed
  whole: ACLGraphWrapper (capture on a new batch descriptor; replay, which
  for FIA binds each captured UpdatableGraph task to the wrapper's own
  `draft_model_metadata` by layer name, then updates it), UpdatableGraph,
  register_task, update_full_graph_params;
- spec_decode/llm_base_proposer.py AscendSpecDecodeBaseProposer's
  `dummy_run` (the capture pass: K steps of metadata, `batch_size =
  num_tokens // (num_speculative_tokens + 1)` rows, the wrapped draft
  call), `_propose` (assigns `num_speculative_tokens` from its argument,
  returns `[batch, 0]` at 0, dispatches on the target's uniform flag,
  builds one step of metadata per drafted token, hands them to
  `self._runnable` through `_maybe_update_metadata`, runs the draft, then
  `_update_full_graph_params_if_needed`), `set_update_stream` and the
  small helpers those call;
- attention/attention_v1.py `AscendAttentionBackendImpl.full_graph_fia`
  (the capture side of FIA: registers each call as an update task with
  its `FIAParamProvider`) and `FIAParamProvider`; utils.py
  `use_updatable_graph`;
- vLLM 0.30's v1/cudagraph_dispatcher.py with 0.30.0rc2's
  patch_cudagraph (test_width_graphs.dispatcher_module_030): the FULL keys
  the capture sizes come from, and `_propose`'s dispatch.

What is a stand-in, written here:
- torch.npu / torch_npu graph primitives (`FakeNPU`): a graph records the
  FIA calls made while it captures, a task update rewrites one recorded
  call's arguments, a replay is queued and its calls run at the next flush,
  each only if its update event was recorded after the replay was queued
  (else the NPU would wait on it: reported as a hang);
- the rest of the host proposer (`HostLike030Proposer`): what its __init__
  sets that the host methods above read (buffers sized by K), load_model's
  wrap (llm_base_proposer.py lines 638-652), `_propose`'s input preparation
  (`set_inputs_first_pass`, `build_draft_attn_metadata`,
  `attn_update_stack_num_spec_norm`: each step's metadata carries the
  test's sequence lengths), and the merged draft loop reduced to one FIA
  call per draft step and attention layer, recording its rows and steps;
- the runner fields those read, the forward context, the attention
  metadata builder.

vspec's NativeGammaProposer (the real class, native_gamma.py) sits over the
host-like proposer, as over the host's in the wheel.
"""

from __future__ import annotations

import __future__
import contextlib
import copy
import dataclasses
import sys
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest
import torch

from test_ascend_graphs import _ExtraContext, _function, _top_level, host_dispatcher, sdist_file

PIN = "0.30.0rc2"
LAYERS = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")
K = 3
MAX_NUM_SEQS = 2
NUM_TOKENS = MAX_NUM_SEQS * (1 + K)   # the one FULL capture size: 2 requests of 1 + K
HOST_METHODS = ("dummy_run", "_propose", "_maybe_update_metadata", "set_update_stream",
                "_update_full_graph_params_if_needed", "_update_full_graph_params",
                "shallow_copy_metadata", "_build_multi_group_graph_capture_metadata",
                "_prepare_dcp_draft_dummy_metadata", "_get_attn_metadata_layer_names",
                "_adjust_tensor", "_get_primary_draft_attn_group",
                "_is_cache_only_draft_attn_group")


@pytest.fixture(scope="module")
def host_files(tmp_path_factory):
    """The 0.30.0rc2 files the tests run, and vLLM 0.30's dispatcher class."""
    from test_width_graphs import dispatcher_module_030

    members = {"acl_graph": "vllm_ascend/compilation/acl_graph.py",
               "updatable_graph": "vllm_ascend/compilation/updatable_graph.py",
               "proposer": "vllm_ascend/spec_decode/llm_base_proposer.py",
               "attention": "vllm_ascend/attention/attention_v1.py",
               "utils": "vllm_ascend/utils.py"}
    files = {name: sdist_file(PIN, member, tmp_path_factory) for name, member in members.items()}
    return SimpleNamespace(**files,
                           dispatcher=dispatcher_module_030(tmp_path_factory).CudagraphDispatcher)


# ------------------------------------------------------------ NPU stand-in
class Event:
    def __init__(self):
        self.recorded = 0

    def wait(self, stream):
        pass

    def reset(self, stream):
        pass

    def record(self, stream):
        self.recorded += 1


@dataclasses.dataclass
class Call:
    """One FIA call recorded by a graph capture."""
    graph: "Graph"
    tag: tuple        # (draft step, layer) of the captured call
    kwargs: dict
    event: Event | None = None


class Graph:
    """torch.npu.NPUGraph: the base the host's UpdatableGraph extends."""

    def __init__(self):
        self.calls: list[Call] = []
        self.replays = 0
        self.gamma = None   # set by the test, for reports

    def capture_begin(self, pool=None, capture_error_mode="global"):
        FAKE.capturing = self

    def capture_end(self):
        FAKE.capturing = None

    def replay(self):
        self.replays += 1
        FAKE.queue.append((self, {id(c): c.event.recorded for c in self.calls}))


class FakeNPU:
    """torch.npu's and torch_npu's graph primitives, as the host code calls them."""

    NPUGraph = Graph
    ExternalEvent = Event
    Stream = object

    def __init__(self):
        self.capturing: Graph | None = None
        self.updating: Call | None = None
        self.tag: tuple = ()
        self.queue: list = []
        self.executed: list = []   # (graph gamma, tag, actual_seq_lengths_kv)
        self.hangs: list = []

    @contextlib.contextmanager
    def graph(self, graph, pool=None):   # torch.npu.graph: capture_begin ... capture_end
        graph.capture_begin(pool=pool)
        try:
            yield
        finally:
            graph.capture_end()

    def graph_task_group_begin(self, stream):
        pass

    def graph_task_group_end(self, stream):
        return self.capturing.calls[-1]

    def graph_task_update_begin(self, stream, handle):
        self.updating = handle

    def graph_task_update_end(self, stream):
        self.updating = None

    def stream(self, stream):
        return contextlib.nullcontext()

    def current_stream(self):
        return SimpleNamespace(synchronize=self.flush)

    def empty_cache(self):
        pass

    # torch_npu.npu_fused_infer_attention_score.out
    def fia_out(self, **kwargs):
        if self.updating is not None:
            self.updating.kwargs = kwargs
        elif self.capturing is not None:
            self.capturing.calls.append(Call(self.capturing, self.tag, kwargs))
        else:
            self.executed.append((None, self.tag, list(kwargs["actual_seq_lengths_kv"])))

    def flush(self):
        """Run the queued replays: a call runs only once its update event
        was recorded after the replay was queued (the NPU would wait otherwise)."""
        for graph, seen in self.queue:
            for call in graph.calls:
                if call.event.recorded <= seen[id(call)]:
                    self.hangs.append((graph.gamma, call.tag))
                    continue
                self.executed.append((graph.gamma, call.tag,
                                      list(call.kwargs["actual_seq_lengths_kv"])))
        self.queue.clear()


FAKE = FakeNPU()


def _torch_npu_module() -> types.ModuleType:
    module = types.ModuleType("torch_npu")
    module.npu = SimpleNamespace(current_stream=lambda: FAKE.current_stream())
    module._C = SimpleNamespace(_NPUTaskGroupHandle=Call)
    module.npu_fused_infer_attention_score = SimpleNamespace(out=lambda **kw: FAKE.fia_out(**kw))
    module._npu_fused_infer_attention_score_get_max_workspace = lambda **kw: torch.zeros(1)
    module._npu_paged_attention = object()
    return module


def _register_task_with_event(updatable_graph):
    """UpdatableGraph.register_task creates each task's ExternalEvent before
    the captured call; the stand-in call learns it from the task list."""
    register = updatable_graph.UpdatableGraph.register_task

    def register_task(self, operation, kwargs, provider):
        register(self, operation, kwargs, provider)
        self.calls[-1].event = self.tasks[-1].event
    return register_task


def _exec_module(name: str, path, monkeypatch, **globals_) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__file__, module.__package__ = str(path), name.rpartition(".")[0]
    module.__dict__.update(globals_)
    monkeypatch.setitem(sys.modules, name, module)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


class AscendAttentionBackend:
    """attention_v1.AscendAttentionBackend, the FIA backend (a class marker
    for the host's use_updatable_graph)."""

    @staticmethod
    def get_impl_cls():
        return _Impl


@pytest.fixture
def host(host_files, monkeypatch):
    """The host's graph modules (executed from the sdist) over the NPU
    stand-in, the host proposer methods on HostLike030Proposer, and
    vllm_ascend.vspec.native_gamma imported over them."""
    global FAKE
    import vllm.compilation.counter  # noqa: F401
    import vllm.compilation.cuda_graph  # noqa: F401
    import vllm.compilation.monitor  # noqa: F401
    import vllm.forward_context  # noqa: F401
    import vllm.model_executor.offloader.base  # noqa: F401
    import vllm.platforms  # noqa: F401
    from test_overlay import _engine_config  # noqa: F401

    FAKE = FakeNPU()
    monkeypatch.setattr(torch, "npu", FAKE, raising=False)
    context = SimpleNamespace(batch_descriptor=None, cudagraph_runtime_mode=None, capturing=False,
                              attn_metadata=None)
    extra = _ExtraContext(context)
    namespace = dict(AscendAttentionBackend=AscendAttentionBackend)
    exec(compile(_top_level(host_files.utils, "use_updatable_graph"), str(host_files.utils),
                 "exec"), namespace)
    attention_module = SimpleNamespace(AscendAttentionBackend=AscendAttentionBackend,
                                       AscendAttentionState=SimpleNamespace())
    utils = SimpleNamespace(weak_ref_tensors=lambda t: t, enable_sp=lambda config=None: False,
                            super_kernel_scope=lambda *a: contextlib.nullcontext(),
                            use_updatable_graph=namespace["use_updatable_graph"])
    stand_ins = {
        "torch_npu": _torch_npu_module(),
        "vllm_ascend.utils": utils,
        "vllm_ascend.ascend_config": SimpleNamespace(get_ascend_config=lambda: SimpleNamespace(
            ascend_compilation_config=SimpleNamespace(enable_super_kernel=False))),
        "vllm_ascend.ascend_forward_context": SimpleNamespace(_EXTRA_CTX=extra),
        "vllm_ascend.attention": types.ModuleType("vllm_ascend.attention"),
        "vllm_ascend.attention.attention_v1": attention_module,
        "vllm_ascend.compilation": types.ModuleType("vllm_ascend.compilation"),
        "vllm_ascend.spec_decode": types.ModuleType("vllm_ascend.spec_decode"),
        "vllm_ascend.spec_decode.draft_proposer":
            SimpleNamespace(AscendDraftModelProposer=HostLike030Proposer),
        "vllm_ascend.spec_decode.eagle_proposer":
            SimpleNamespace(AscendEagleProposer=HostLike030Proposer),
        "vllm_ascend.spec_decode.utils": SimpleNamespace(_maybe_eager_context=_not_called),
        "vllm_ascend.sample": types.ModuleType("vllm_ascend.sample"),
        "vllm_ascend.sample.rejection_sampler": SimpleNamespace(AscendRejectionSampler=object),
    }
    for name, module in stand_ins.items():
        monkeypatch.setitem(sys.modules, name, module)
    stand_ins["vllm_ascend.compilation"].__path__ = []

    updatable = _exec_module("vllm_ascend.compilation.updatable_graph",
                             host_files.updatable_graph, monkeypatch)
    monkeypatch.setattr(updatable.UpdatableGraph, "register_task",
                        _register_task_with_event(updatable))
    acl_graph = _exec_module("vllm_ascend.compilation.acl_graph", host_files.acl_graph,
                             monkeypatch)
    acl_graph.get_forward_context = lambda: context
    acl_graph.current_platform = SimpleNamespace(get_global_graph_pool=lambda: None)
    acl_graph.validate_cudagraph_capturing_enabled = lambda: None
    stand_ins["vllm_ascend.compilation"].acl_graph = acl_graph

    # attention_v1.py: FIA's capture side and its parameter provider.
    namespace = dict(torch=torch, torch_npu=sys.modules["torch_npu"], _EXTRA_CTX=extra,
                     dataclass=dataclasses.dataclass, Any=Any, SWA_INT_MAX=2147483647,
                     _FIA_WORKSPACE_KEY="npu_fused_infer_attention_score.workspace",
                     get_capture_resource=updatable.get_capture_resource,
                     register_task=updatable.register_task)
    for source in (_class_source(host_files.attention, "FIAParamProvider"),
                   _function(host_files.attention, "AscendAttentionBackendImpl",
                             "full_graph_fia")):
        exec(_compile(source, host_files.attention), namespace)

    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.native_gamma", raising=False)
    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.proposers", raising=False)
    import vllm_ascend.vspec.native_gamma as native

    ns = SimpleNamespace(acl_graph=acl_graph, context=context, extra=extra, native=native,
                         full_graph_fia=namespace["full_graph_fia"],
                         dispatcher=host_files.dispatcher)
    for name, function in _host_methods(host_files.proposer, ns).items():
        monkeypatch.setattr(HostLike030Proposer, name, function, raising=False)
    yield ns
    for name in ("vllm_ascend.vspec.native_gamma", "vllm_ascend.vspec.proposers"):
        sys.modules.pop(name, None)


def _not_called(*args):
    raise AssertionError("_maybe_eager_context needs flashcomm1 on")


def _compile(source: str, path) -> Any:
    """The host's source, its annotations left unevaluated (they name host types)."""
    return compile(source, str(path), "exec", flags=__future__.annotations.compiler_flag,
                   dont_inherit=True)


def _class_source(path, name: str) -> str:
    import ast

    text = path.read_text()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            return "\n".join(text.splitlines()[start - 1:node.end_lineno])
    raise LookupError(f"{name} not in {path}")


def _host_methods(path, host) -> dict[str, Callable]:
    """HOST_METHODS from 0.30.0rc2's llm_base_proposer.py, compiled with the
    module globals they read: the forward-context extras, vLLM's
    CUDAGraphMode and PADDING_SLOT_ID, the host's acl_graph functions and
    use_updatable_graph, and stand-ins for the leaves (the forward-context
    setter, the sparse-KV-offload dummy metadata, which is off)."""
    import torch.nn.functional as F
    from functools import partial
    from typing import cast

    from vllm.config import CUDAGraphMode
    from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

    @contextlib.contextmanager
    def set_ascend_forward_context(attn_metadata, vllm_config, *, batch_descriptor=None,
                                   aclgraph_runtime_mode=CUDAGraphMode.NONE,
                                   draft_attn_metadatas=None, **_):
        context = host.context
        context.batch_descriptor, context.cudagraph_runtime_mode = \
            batch_descriptor, aclgraph_runtime_mode
        context.attn_metadata, context.draft_attn_metadatas = attn_metadata, draft_attn_metadatas
        context.capturing = False   # set_ascend_forward_context clears it
        yield

    @contextlib.contextmanager
    def set_current_vllm_config(config):
        yield

    namespace = dict(
        torch=torch, copy=copy, F=F, partial=partial, cast=cast, Callable=Callable, Any=Any,
        CUDAGraphMode=CUDAGraphMode, PADDING_SLOT_ID=PADDING_SLOT_ID, _EXTRA_CTX=host.extra,
        get_forward_context=lambda: host.context,
        set_ascend_forward_context=set_ascend_forward_context,
        set_current_vllm_config=set_current_vllm_config,
        use_updatable_graph=sys.modules["vllm_ascend.utils"].use_updatable_graph,
        update_full_graph_params=host.acl_graph.update_full_graph_params,
        prepare_sparse_kv_offload_mtp_dummy_metadata=lambda *a: (None, None),
        AscendCommonAttentionMetadata=SimpleNamespace,
        AscendAttentionState=SimpleNamespace(SpecDecoding="SpecDecoding",
                                             ChunkedPrefill="ChunkedPrefill"))
    for name in HOST_METHODS:
        exec(_compile(_function(path, "AscendSpecDecodeBaseProposer", name), path), namespace)
    return {name: namespace[name] for name in HOST_METHODS}


# ------------------------------------------------- the host-like proposer
class _Impl:
    """What full_graph_fia reads of its AscendAttentionBackendImpl."""
    enable_c8_quant = False
    sliding_window = None
    num_heads, num_kv_heads, head_size, scale = 2, 1, 4, 1.0
    _use_max_workspace_for_fia_graph = False
    _layer_name = None   # the forward sets it per layer (attention_v1.py line 1295)

    def _get_fia_params(self, key, value, attn_metadata):
        return key, value, 128, attn_metadata.block_tables, attn_metadata.seq_lens_list


def _metadata(seq_lens: list[int], num_tokens: int = NUM_TOKENS) -> SimpleNamespace:
    return SimpleNamespace(actual_seq_lengths_q=list(range(1, num_tokens + 1)),
                           seq_lens_list=seq_lens, block_tables=torch.zeros(1),
                           attn_mask=None, causal=True, num_actual_tokens=num_tokens,
                           num_prefills=0)


class _Buffer:
    """vLLM's CpuGpuBuffer: a host tensor and its device copy (both CPU here)."""

    def __init__(self, n):
        self.cpu, self.gpu = torch.zeros(n, dtype=torch.int32), torch.zeros(n, dtype=torch.int32)

    def copy_to_gpu(self):
        self.gpu.copy_(self.cpu)


class _Builder:
    """The draft attention group's metadata builder (the attention backend's)."""

    def build_for_graph_capture(self, common, state, **_):
        return _metadata([0] * NUM_TOKENS, common.num_actual_tokens)


def _runner(dispatcher) -> SimpleNamespace:
    """The NPUModelRunner fields the host's dummy_run and _propose read, as
    its _dummy_run leaves them for a uniform decode capture (DP 1, no DCP)."""
    max_num_reqs, max_num_tokens = MAX_NUM_SEQS, NUM_TOKENS
    block_table = SimpleNamespace(get_device_tensor=lambda: torch.zeros(max_num_reqs, 4),
                                  slot_mapping=SimpleNamespace(gpu=torch.zeros(max_num_tokens)))
    qsl = _Buffer(max_num_reqs + 2)
    qsl.cpu[:max_num_reqs + 1].copy_(torch.arange(max_num_reqs + 1) * (1 + K))
    group = _Buffer(max_num_reqs)
    return SimpleNamespace(
        _sync_metadata_across_dp=lambda n, is_draft_model=False: (n, None, None),
        synchronize_input_prep=contextlib.nullcontext, cudagraph_dispatcher=dispatcher,
        max_num_reqs=max_num_reqs, max_num_tokens=max_num_tokens, attn_groups=[object()],
        query_start_loc=qsl, _offload_pool_slots=None, _offload_pool_active=None,
        _offload_req_ids_tensor=None,
        _offload_token_to_req=None, group_len=group, group_key_idx=group,
        group_key_cache_idx=group,
        input_batch=SimpleNamespace(num_computed_tokens_cpu_tensor=torch.zeros(max_num_reqs),
                                    block_table=[block_table], lora_id_to_lora_request={}),
        optimistic_seq_lens_cpu=torch.zeros(max_num_reqs, dtype=torch.int32),
        seq_lens=torch.zeros(max_num_reqs, dtype=torch.int32),
        actual_seq_lengths_q=list(range(1, max_num_tokens + 1)),
        positions=torch.zeros(max_num_tokens, dtype=torch.long), _dsa_positions_cpu_buf=None,
        attn_state="DecodeOnly", decode_token_per_req=1 + K, pin_memory=False,
        dynamic_eplb=False, _pad_query_start_loc_for_fia=_pad_query_start_loc_for_fia)


def _pad_query_start_loc_for_fia(query_start_loc, num_tokens_padded, num_reqs_padded, num_reqs,
                                 mode=None, batch_desc_num_reqs=None):
    """NPUModelRunner._pad_query_start_loc_for_fia's answer for the batches
    here (whole requests, no padding to add): the descriptor's request count."""
    return num_reqs if batch_desc_num_reqs is None else batch_desc_num_reqs


class HostLike030Proposer:
    """The host proposer's graph paths over the NPU stand-in: HOST_METHODS
    are the host's own (set by the `host` fixture); __init__ sets what the
    host's __init__ sets that they read (llm_base_proposer.py lines
    180-312: K, use_cuda_graph, buffers sized by K, `_runnable`);
    load_model wraps as the host's does (lines 638-652); the input
    preparation `_propose` calls is reduced to one step of metadata per
    drafted token carrying the test's sequence lengths (`seq_lens` of the
    common metadata); the merged draft loop is one FIA call per draft step
    and attention layer (the model's forward), recording what each call got."""

    host = None  # the `host` fixture's namespace
    dummy_run: Callable
    _propose: Callable

    def __init__(self, vllm_config, device, runner=None):
        self.vllm_config, self.device = vllm_config, device
        self.speculative_config = vllm_config.speculative_config
        self.num_speculative_tokens = k = self.speculative_config.num_speculative_tokens
        self.runner = runner
        self.use_cuda_graph = True
        self.maybe_eager_context = contextlib.nullcontext()
        self.decode_threshold = 1 + k
        self.method, self.attn_layer_names, self.kv_cache_gid = "eagle", list(LAYERS), 0
        self.dcp_size, self.parallel_drafting, self.uses_mrope = 1, False, False
        self.use_compress = self.supports_mm_inputs = self.enable_enpu = False
        self.use_eagle, self.draft_window_size = True, None
        self.extra_slots_per_request = 1
        self.block_table_tensor_clone = None
        self.draft_model_config = SimpleNamespace(use_mla=False)
        self.query_start_loc = _Buffer(runner.max_num_reqs + 2)
        self.draft_attn_groups = [SimpleNamespace(
            get_metadata_builder=_Builder, backend=AscendAttentionBackend, layer_names=LAYERS)]
        lens = runner.max_num_tokens + 2 * runner.max_num_reqs
        self.slot_mapping_group = [torch.zeros(lens + (k - 1) * runner.max_num_reqs,
                                               dtype=torch.int32) for _ in range(k)]
        self.seq_lens_group = [torch.zeros(lens, dtype=torch.int32) for _ in range(k)]
        self.query_start_loc_group = [torch.zeros(lens, dtype=torch.int32) for _ in range(k)]
        self.token_indices_to_sample = torch.zeros(NUM_TOKENS, dtype=torch.int32)
        self.positions = torch.zeros(NUM_TOKENS, dtype=torch.long)
        self._runnable = self._run_merged_draft
        self.impl = _Impl()
        self.draft_calls: list[dict] = []   # one per merged-draft call (capture or eager)

    def _get_positions(self, num_tokens):   # vLLM's SpecDecodeBaseProposer
        return self.runner.positions[:num_tokens]

    def load_model(self, model):   # lines 638-652
        from vllm.config import CUDAGraphMode

        if self.vllm_config.compilation_config.cudagraph_mode.has_full_cudagraphs() \
                and self.use_cuda_graph:
            self.update_stream = None
            self._runnable = self.host.acl_graph.ACLGraphWrapper(
                self._run_merged_draft, self.vllm_config, runtime_mode=CUDAGraphMode.FULL,
                use_eagle=self.use_eagle, enable_enpu=self.enable_enpu)

    # _propose's input preparation: every step's metadata carries the step's
    # own sequence lengths (the test's), over the dispatched token count.
    def set_inputs_first_pass(self, target_token_ids, next_token_ids, target_positions,
                              target_hidden_states, token_indices_to_sample, cad, **_):
        return cad.num_actual_tokens, token_indices_to_sample, cad, None

    def _pad_draft_buffers(self, num_tokens, num_input_tokens):
        pass

    def build_draft_attn_metadata(self, cad, num_input_tokens, num_tokens):
        step = _metadata(cad.step_seq_lens[0], num_input_tokens)
        return [{layer: step for layer in LAYERS}], step

    def attn_update_stack_num_spec_norm(self, draft_index, cad, batch_size, num_input_tokens,
                                        positions, mode, **_):
        return cad, _metadata(cad.step_seq_lens[draft_index], num_input_tokens)

    def _run_merged_draft(self, num_input_tokens, batch_size, token_indices_to_sample,
                          target_positions, inputs_embeds, multi_steps_attn_metadata,
                          num_tokens, is_prefill=None, sampling_metadata=None):
        steps = self.num_speculative_tokens
        self.draft_calls.append(dict(batch_size=batch_size, steps=steps,
                                     sampled=token_indices_to_sample.shape[0],
                                     capturing=self.host.extra.capturing))
        for step in range(steps if multi_steps_attn_metadata else 0):   # none: an eager dummy run
            for layer in LAYERS:
                FAKE.tag = (step, layer)
                metadata = multi_steps_attn_metadata[step][layer]
                if self.host.extra.capturing:   # the FULL forward of a draft layer
                    self.impl._layer_name = layer
                    self.host.full_graph_fia(
                        self.impl, torch.zeros(num_input_tokens, 8), torch.zeros(1),
                        torch.zeros(1), metadata, torch.zeros(num_input_tokens, 8))
                else:   # the eager FIA call
                    FAKE.fia_out(actual_seq_lengths_kv=metadata.seq_lens_list)
        return torch.zeros(batch_size, steps, dtype=torch.long)


def _config(vspec=None, max_num_seqs: int = MAX_NUM_SEQS):
    from test_overlay import _engine_config

    config = _engine_config("eagle", K, vspec=vspec or {}, cudagraph_mode="FULL_DECODE_ONLY")
    config.scheduler_config.max_num_seqs = max_num_seqs
    return config


def _dispatcher(host):
    """The runner's dispatcher as 0.30.0rc2's _check_and_update_cudagraph_mode
    leaves it: FULL decode keys at width 1 + K, capture size NUM_TOKENS."""
    return host_dispatcher(host.dispatcher, K, MAX_NUM_SEQS, (NUM_TOKENS,))


def _capture(proposer, num_tokens: int = NUM_TOKENS) -> None:
    """NPUModelRunner._dummy_run's call of the drafter for one capture size
    (model_runner_v1.py lines 4291-4301, all by keyword)."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    num_reqs = num_tokens // (1 + K)
    proposer.dummy_run(num_tokens=num_tokens, with_prefill=False, num_reqs=num_reqs,
                       num_tokens_across_dp=None, aclgraph_runtime_mode=CUDAGraphMode.FULL,
                       batch_descriptor=BatchDescriptor(num_tokens=num_tokens, num_reqs=num_reqs,
                                                        uniform=True),
                       dummy_compute_logits=lambda hidden_states: None,
                       in_graph_capturing=True, is_profile=False)


def _make(host, vspec=None, capture: bool = True):
    """A native proposer as the runner builds and readies it: constructed,
    loaded, given the update stream (model_runner_v1.py line 4531), then
    captured at the one FULL size."""
    HostLike030Proposer.host = host
    proposer = host.native.VSpecNativeEagleProposer(
        _config(vspec), torch.device("cpu"), runner=_runner(_dispatcher(host)))
    proposer.load_model(model=None)
    proposer.set_update_stream(object())
    host.acl_graph.set_draft_graph_params([NUM_TOKENS])   # model_runner_v1.py line 6428
    if capture:
        _capture(proposer)
    return proposer


def _wrappers(proposer) -> dict[int, Any]:
    """gamma -> the ACLGraphWrapper that runs its draft graph."""
    runnables = getattr(proposer, "_vspec_runnables", {})
    host_wrapper = getattr(proposer, "_vspec_max_runnable", None) or proposer._runnable
    return {g: runnables.get(g, host_wrapper) for g in range(1, K + 1)}


def _graphs(proposer) -> dict[int, Graph]:
    """gamma -> the graph its wrapper captured (one batch descriptor each)."""
    out = {}
    for gamma, wrapper in _wrappers(proposer).items():
        (entry,) = wrapper.concrete_aclgraph_entries.values()
        out[gamma] = entry.aclgraph
    for gamma, graph in out.items():   # several gammas may share one: the highest names it
        graph.gamma = gamma
    return out


def _seq_lens(call: int, steps: int) -> list[list[int]]:
    """Distinct sequence lengths per draft step and call: 1000*call + 10*step + request."""
    return [[1000 * call + 10 * step + r for r in range(NUM_TOKENS)] for step in range(steps)]


def _step(proposer, call: int, gamma: int, uniform: bool = True):
    """The runner's drafter call after a target step of NUM_TOKENS tokens
    (uniform: MAX_NUM_SEQS requests of 1 + K), drafting `gamma`
    (model_runner_v1.py lines 2098-2099, by keyword). Returns the draft and
    the FIA calls that ran (graph gamma, (step, layer), sequence lengths)."""
    from vllm.forward_context import BatchDescriptor

    cad = SimpleNamespace(
        batch_size=lambda: MAX_NUM_SEQS, num_reqs=MAX_NUM_SEQS, num_actual_tokens=NUM_TOKENS,
        query_start_loc=torch.arange(MAX_NUM_SEQS + 1, dtype=torch.int32) * (1 + K),
        query_start_loc_cpu=torch.arange(MAX_NUM_SEQS + 1, dtype=torch.int32) * (1 + K),
        block_table_tensor=torch.zeros(MAX_NUM_SEQS, 4), seq_lens=torch.zeros(MAX_NUM_SEQS),
        slot_mapping=torch.zeros(NUM_TOKENS, dtype=torch.int32), num_computed_tokens_cpu=None,
        _seq_lens_cpu=None, step_seq_lens=_seq_lens(call, K))
    FAKE.executed.clear()
    draft = proposer._propose(
        num_speculative_tokens=gamma, target_token_ids=torch.zeros(NUM_TOKENS, dtype=torch.long),
        target_positions=torch.zeros(NUM_TOKENS, dtype=torch.long),
        target_hidden_states=torch.zeros(NUM_TOKENS, 8),
        next_token_ids=torch.zeros(MAX_NUM_SEQS, dtype=torch.long),
        token_indices_to_sample=torch.tensor([K, 2 * K + 1], dtype=torch.int32),
        common_attn_metadata=cad,
        target_model_batch_desc=BatchDescriptor(num_tokens=NUM_TOKENS, uniform=uniform),
        sampling_metadata=SimpleNamespace(all_greedy=True),
        scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=gamma))
    FAKE.flush()
    return draft, list(FAKE.executed)


# ------------------------------------------------------------------ tests
def test_one_draft_graph_is_captured_per_gamma_each_with_its_own_steps(host):
    """Stock 0.30 captures one FULL draft graph (K steps) per capture size;
    vspec captures one per gamma 1..K through the host's own dummy_run, each
    holding gamma steps of FIA update tasks of its own (UpdatableGraph)."""
    proposer = _make(host)
    graphs = _graphs(proposer)
    assert len({id(g) for g in graphs.values()}) == K
    for gamma, graph in graphs.items():
        assert [call.tag for call in graph.calls] == \
            [(s, layer) for s in range(gamma) for layer in LAYERS]
        assert len(graph.tasks) == gamma * len(LAYERS)
    assert proposer.num_speculative_tokens == K


def test_every_gammas_draft_graph_samples_the_k_row_count(host):
    """The host's dummy_run sizes the rows its draft graph samples by
    num_speculative_tokens (line 944, `num_tokens // (num_speculative_tokens
    + 1)`); a FULL draft graph replays only after a uniform decode batch of
    1 + K tokens a request, so every gamma's graph samples num_tokens //
    (1 + K) rows (at most max_num_seqs), not num_tokens // (1 + gamma)."""
    proposer = _make(host)
    captures = [call for call in proposer.draft_calls if call["capturing"]]
    assert sorted(call["steps"] for call in captures) == list(range(1, K + 1))
    rows = NUM_TOKENS // (1 + K)
    assert rows <= MAX_NUM_SEQS
    assert [(call["batch_size"], call["sampled"]) for call in captures] == [(rows, rows)] * K


def test_each_steps_gamma_replays_its_own_graph_with_its_own_steps_parameters(host):
    """After a uniform 1 + K target step, the host's _propose at the step's
    gamma replays that gamma's graph only, and its update binds each
    captured FIA task to the step's metadata for that draft step."""
    proposer = _make(host)
    graphs = _graphs(proposer)
    for call, gamma in enumerate([2, 1, 3, 2, 1], start=1):
        before = {g: graph.replays for g, graph in graphs.items()}
        draft, executed = _step(proposer, call, gamma)
        assert {g: graph.replays - before[g] for g, graph in graphs.items()} == \
            {g: int(g == gamma) for g in graphs}
        assert FAKE.hangs == []
        assert executed == [(gamma, (s, layer), _seq_lens(call, gamma)[s])
                            for s in range(gamma) for layer in LAYERS], (gamma, executed)
        assert tuple(draft.shape) == (MAX_NUM_SEQS, gamma)


def test_gamma_0_replays_gamma_1s_graph_and_drafts_nothing(host):
    """As the overlay does on 0.30 without graphs: gamma 0 runs the first
    draft pass (as K = 1, which writes the draft KV of the step's tokens)
    and returns a `[batch, 0]` draft; with graphs that pass is gamma 1's."""
    proposer = _make(host)
    graphs = _graphs(proposer)
    draft, executed = _step(proposer, 1, 0)
    assert tuple(draft.shape) == (MAX_NUM_SEQS, 0)
    assert {g: graph.replays for g, graph in graphs.items()} == {1: 1, 2: 0, 3: 0}
    assert executed == [(1, (0, layer), _seq_lens(1, 1)[0]) for layer in LAYERS]


def test_after_a_mixed_target_step_the_steps_gamma_drafts_eagerly(host):
    """The host's dispatch takes the target's uniform flag: after a step that
    is not a uniform 1 + K batch no FULL graph replays (stock's K graph
    would not either), and the draft runs the step's gamma eagerly."""
    proposer = _make(host)
    graphs = _graphs(proposer)
    draft, executed = _step(proposer, 1, 2, uniform=False)
    assert all(graph.replays == 0 for graph in graphs.values())
    assert executed == [(None, (s, layer), _seq_lens(1, 2)[s]) for s in range(2) for layer in LAYERS]
    assert tuple(draft.shape) == (MAX_NUM_SEQS, 2)


def test_eager_fallback_captures_nothing_and_drafts_each_gamma_eagerly(host):
    """ascend_draft_full_graph=false: the host's own `use_cuda_graph` switch
    is off, load_model keeps the bare merged draft loop, the runner's
    capture pass captures nothing, and every step drafts eagerly."""
    proposer = _make(host, {"ascend_draft_full_graph": False})
    assert proposer.use_cuda_graph is False
    assert not isinstance(proposer._runnable, host.acl_graph.ACLGraphWrapper)
    assert [call["capturing"] for call in proposer.draft_calls] == [False]
    draft, executed = _step(proposer, 1, 2)
    assert executed == [(None, (s, layer), _seq_lens(1, 2)[s]) for s in range(2) for layer in LAYERS]
    assert tuple(draft.shape) == (MAX_NUM_SEQS, 2)


def test_a_capture_that_would_sample_more_rows_than_max_num_seqs_is_refused(host):
    """The runner copies a step's draft rows into a buffer of max_num_seqs
    rows: with max_num_seqs 1 the host's dummy_run at 8 tokens would sample
    8 // (1 + K) = 2 rows, so the capture is refused before any graph
    records a task, naming the capture size, the gamma, the rows and
    max_num_seqs."""
    HostLike030Proposer.host = host
    proposer = host.native.VSpecNativeEagleProposer(
        _config(max_num_seqs=1), torch.device("cpu"), runner=_runner(_dispatcher(host)))
    proposer.load_model(model=None)
    with pytest.raises(ValueError) as refused:
        _capture(proposer)
    message = str(refused.value)
    assert "draft graph of gamma 1 at capture size 8 tokens would sample 2 rows" in message
    assert "max_num_seqs=1" in message and "ascend_draft_full_graph" in message
    assert proposer.draft_calls == []
    assert all(not w.concrete_aclgraph_entries for w in _wrappers(proposer).values())
    assert proposer.num_speculative_tokens == K


def test_a_dummy_run_after_a_small_step_runs_the_hosts_dummy_run_at_k(host):
    """The host's _propose leaves num_speculative_tokens at the last step's
    K; a later dummy run (warm-up, an idle DP rank) still runs at the
    configured K (its rows and steps), and the step's value comes back."""
    from vllm.config import CUDAGraphMode

    proposer = _make(host)
    _step(proposer, 1, 1)
    proposer.draft_calls.clear()
    proposer.dummy_run(num_tokens=NUM_TOKENS, num_reqs=MAX_NUM_SEQS,
                       aclgraph_runtime_mode=CUDAGraphMode.NONE)
    assert [(c["steps"], c["batch_size"]) for c in proposer.draft_calls] == \
        [(K, NUM_TOKENS // (1 + K))]
    assert proposer.num_speculative_tokens == 1


def test_a_gamma_over_the_graph_budget_drafts_with_the_next_captured_gamma(host, caplog):
    """ascend_draft_graph_budget_mib 0: only K's graph (stock's) is captured;
    a step at gamma 2 replays it, K steps, and keeps its first 2 drafts."""
    import logging

    with caplog.at_level(logging.INFO, logger="vllm"):
        proposer = _make(host, {"ascend_draft_graph_budget_mib": 0})
    assert [c["steps"] for c in proposer.draft_calls if c["capturing"]] == [K]
    assert any("per-gamma draft graphs" in r.getMessage() for r in caplog.records)
    (graph,) = set(_graphs(proposer).values())
    draft, executed = _step(proposer, 1, 2)
    assert graph.replays == 1 and FAKE.hangs == []
    assert [tag for _, tag, _ in executed] == [(s, layer) for s in range(K) for layer in LAYERS]
    assert tuple(draft.shape) == (MAX_NUM_SEQS, 2)


def test_the_hosts_token_count_store_is_keyed_by_gamma(host):
    """The runner creates the draft's token-count parameter store before
    capture (model_runner_v1.py line 6428). FIA's graphs do not read it
    (UpdatableGraph); other backends' update_graph_params do, so it is
    keyed by gamma as on 0.23 (graph_params.py), each gamma over the host's
    token counts, and the host's weak_ref_workspaces, which every capture
    runs (acl_graph.py), walks it inside and outside a drafting pass."""
    from vllm_ascend.vspec.graph_params import PerGamma

    _make(host)
    store = host.acl_graph.get_draft_graph_params()
    assert isinstance(store.attn_params, PerGamma)
    assert {g: list(v) for g, v in store.attn_params.stores.items()} == \
        {g: [NUM_TOKENS] for g in range(1, K + 1)}
    host.acl_graph.weak_ref_workspaces(store)
    assert sorted(store.workspaces) == [(g, NUM_TOKENS) for g in range(1, K + 1)]


def test_the_hosts_one_k_step_graph_cannot_replay_a_smaller_step_k(host):
    """Why a step below K needs a graph of its own (or drafts the next
    captured gamma's steps): the host's _propose at K = 2 over its one
    K-step graph (a budget of 0 leaves only that one) hands the graph 2
    steps of metadata, and the host's UpdatableGraph.resolve_tasks refuses
    it (each layer's provider recorded K tasks)."""
    proposer = _make(host, {"ascend_draft_graph_budget_mib": 0})
    (graph,) = set(_graphs(proposer).values())
    host_propose = HostLike030Proposer._propose
    proposer._propose = lambda **kwargs: host_propose(proposer, **kwargs)   # the host's alone
    with pytest.raises(AssertionError) as refused:
        _step(proposer, 1, 2)
    assert (Path(str(refused.traceback[-1].path)).name, refused.traceback[-1].name) == \
        ("updatable_graph.py", "resolve_tasks")
    assert graph.replays == 0
