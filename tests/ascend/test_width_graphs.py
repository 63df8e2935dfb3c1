"""A FULL target decode graph per verify width (vllm_ascend/vspec/width_graphs.py),
through vLLM-Ascend 0.23.0.post1's and vLLM 0.23's own code, driven on CPU
(nothing here runs on an NPU).

What is the host's own code, read from the pinned sources (hash-checked) at
test time, never copied:
- vLLM 0.23's v1/cudagraph_dispatcher.py (the pin's vLLM source wheel,
  executed as its module), with vLLM-Ascend's replacement of
  `_create_padded_batch_descriptor` (patch/worker/patch_cudagraph.py) set on
  it as the host's patch sets it: WidthDispatcher's base;
- NPUModelRunner (worker/model_runner_v1.py, taken out by name):
  `_determine_batch_execution_and_padding` (the uniform test and dispatch),
  `_pad_query_start_loc_for_fia`, `_should_build_dummy_attn_metadata`,
  `_dummy_run` (the capture pass), `capture_model`,
  `_check_and_update_cudagraph_mode` (keys, then the graph-parameter
  stores); and vLLM 0.23's
  GPUModelRunner `capture_model`, `_capture_cudagraphs`,
  `_warmup_and_capture`, `_get_cumsum_and_arange` and the encoder-graph
  manager's set-up (gpu_model_runner.py, by name): the host runner
  VSpecNPUModelRunner extends;
- compilation/acl_graph.py executed whole (GraphParams, set_graph_params) and
  AscendAttentionBackendImpl.full_graph_fia / update_graph_params
  (test_ascend_graphs' `host` fixture) for the graph-parameter store.
What is a stand-in, written here: the fields the host's constructor leaves
(`_RunnerFields`), the leaf calls those methods make into the device and the
model (the forward-context setter, the model forward, the attention-metadata
build, host-to-device copies, CUDA/NPU graph capture and memory queries, GC
freezing, LoRA), the drafter (records its dummy runs), and vLLM's config
resolution of the graph mode (returns the mode configured). The model
forward, under a FULL capture, makes one host full_graph_fia call per
attention layer into test_ascend_graphs' NPU stand-in.
The routing tests (d) use vspec's stand-in engine config (conftest).
"""

from __future__ import annotations

import contextlib
import sys
import types
import zipfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import test_ascend_graphs
from test_ascend_graphs import CACHE, _function, _top_level, host, host_tree  # noqa: F401

from conftest import TokenBuffer as _Buffer

K = 4
MAX_NUM_SEQS = 16
CAPTURE_SIZES = [5, 10, 20, 40]   # multiples of 1 + K, as vLLM rounds them for spec decode
REQUESTS = (1, 2, 4, 8)           # the request counts of 1 + K's FULL graphs
LAYERS = 32                       # the target's decoder layers: 4 MiB a graph estimated
WIDTH_MIB = 16                    # one width's estimated graphs: 4 request counts x 4 MiB
WIDTH_GRAPHS = {"ascend_verify_width_graphs": True}
RUNNER_METHODS = ("_determine_batch_execution_and_padding", "_pad_query_start_loc_for_fia",
                  "_should_build_dummy_attn_metadata", "_dummy_run", "capture_model",
                  "_check_and_update_cudagraph_mode")
VLLM_METHODS = ("capture_model", "_capture_cudagraphs", "_warmup_and_capture",
                "_get_cumsum_and_arange", "_maybe_init_encoder_cudagraph_manager",
                "_create_encoder_cudagraph_manager")


# ------------------------------------------------------------ host sources
def _vllm_source(path: str) -> str:
    from vllm_vspec.tools.ascend_build import common

    default, pins = common.load_pins()
    wheel = common.fetch_vllm_source(pins[default], CACHE)
    return zipfile.ZipFile(wheel).read(path).decode()


@pytest.fixture(scope="module")
def dispatcher_module(host_tree):
    """vLLM 0.23's cudagraph_dispatcher module with vLLM-Ascend's patch applied."""
    return patched_dispatcher_module(None, host_tree / "vllm_ascend/patch/worker/patch_cudagraph.py")


def patched_dispatcher_module(pin: str | None, patch: Path) -> types.ModuleType:
    """The pin's vLLM cudagraph_dispatcher module (None: the default pin's)
    with the host's patch_cudagraph (`_create_padded_batch_descriptor`, read
    from `patch`) applied, as the host's patch applies it."""
    from test_ascend_graphs import pinned_vllm_module
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    module = pinned_vllm_module(pin, "vllm/v1/cudagraph_dispatcher.py")
    namespace = dict(CUDAGraphMode=CUDAGraphMode, BatchDescriptor=BatchDescriptor)
    exec(compile(_top_level(patch, "_create_padded_batch_descriptor"), str(patch), "exec"),
         namespace)
    module.CudagraphDispatcher._create_padded_batch_descriptor = \
        namespace["_create_padded_batch_descriptor"]
    return module


class _BlockTable:
    def __init__(self):
        self.slot_mapping = SimpleNamespace(gpu=torch.zeros(64))

    def commit_block_table(self, num_reqs):
        pass

    def __getitem__(self, group):
        return self


class _Drafter:
    """The drafter's dummy run: records the descriptor it is called with."""

    def __init__(self):
        self.descriptors = []

    def dummy_run(self, *, batch_descriptor, aclgraph_runtime_mode, **_):
        self.descriptors.append((aclgraph_runtime_mode, batch_descriptor))

    def initialize_cudagraph_keys(self, cudagraph_mode):
        pass


class _RunnerFields:
    """What NPUModelRunner.__init__ (and GPUModelRunner's) leave that the host
    methods under test read, for an eagle engine on one rank."""

    def __init__(self, vllm_config, device):
        self.vllm_config = vllm_config
        self.compilation_config = vllm_config.compilation_config
        self.scheduler_config = vllm_config.scheduler_config
        self.parallel_config = vllm_config.parallel_config
        self.speculative_config = vllm_config.speculative_config
        self.model_config = vllm_config.model_config
        self.lora_config = vllm_config.lora_config
        self.load_config = SimpleNamespace(use_tqdm_on_load=False)
        self.device = device
        self.uniform_decode_query_len = 1 + K
        self.cudagraph_dispatcher = sys.modules["vllm.v1.cudagraph_dispatcher"] \
            .CudagraphDispatcher(vllm_config)
        self.max_num_reqs = MAX_NUM_SEQS
        self.max_num_tokens = vllm_config.scheduler_config.max_num_batched_tokens
        self.use_aclgraph = True
        self.dynamic_eplb = self.use_cp = self._has_gdn = self.use_compress = False
        self.supports_mm_inputs = self.enable_prompt_embeds = self.uses_mrope = False
        self.uses_xdrope_dim = 0
        self.use_aux_hidden_state_outputs = False
        self.encoder_cudagraph_manager = None
        self.input_batch = SimpleNamespace(
            num_computed_tokens_cpu=np.full(MAX_NUM_SEQS, 100),
            num_prompt_tokens=np.full(MAX_NUM_SEQS, 10), lora_id_to_lora_request={},
            block_table=_BlockTable())
        self.kv_cache_config = SimpleNamespace(kv_cache_groups=[object()])
        self.arange_np = np.arange(self.max_num_tokens + 1)
        self.query_pos = SimpleNamespace(np=np.zeros(self.max_num_tokens + 1, dtype=np.int64))
        self.query_start_loc = _Buffer(MAX_NUM_SEQS + 2)
        self.optimistic_seq_lens_cpu = torch.zeros(MAX_NUM_SEQS, dtype=torch.int32)
        self.seq_lens = torch.zeros(MAX_NUM_SEQS, dtype=torch.int32)
        self.input_ids = _Buffer(self.max_num_tokens)
        self.positions = torch.zeros(self.max_num_tokens, dtype=torch.long)
        self.drafter = _Drafter()
        self.model = None
        self._has_sinks = False
        self.eplb_heat_collection_status = False
        self.forwards = []   # (runtime mode, descriptor, query lens) of each model forward
        self.fia = None      # the host's full_graph_fia, where a test captures FIA calls

    # Leaves: the model, the attention backends' metadata builders, LoRA, GC.
    def _model_forward(self, num_tokens, input_ids, positions, intermediate_tensors,
                       inputs_embeds):
        """The model: records the batch; under a FULL runtime mode with the
        host's full_graph_fia given (`self.fia`), captures one FIA call per
        attention layer into a stand-in NPU graph (ACL capture is a leaf)."""
        from vllm.config import CUDAGraphMode

        mode, descriptor = FORWARD_CONTEXT[-1]
        query_lens = self.query_lens.tolist()
        self.forwards.append((mode, descriptor, query_lens))
        if mode == CUDAGraphMode.FULL and self.fia is not None:
            npu = test_ascend_graphs.FAKE
            npu.capturing = test_ascend_graphs.Graph()
            for layer in test_ascend_graphs.LAYERS:
                npu.tag = (query_lens[0], num_tokens, layer)
                self.fia(test_ascend_graphs._Impl(), torch.zeros(num_tokens, 8), torch.zeros(1),
                         torch.zeros(1), _fia_metadata(num_tokens, query_lens[0], [0]),
                         torch.zeros(num_tokens * 8))
            npu.capturing = None
        return torch.zeros(num_tokens, 2)

    def _build_attention_metadata(self, **_):
        return {}, None

    def _pad_for_sequence_parallelism(self, num_tokens):
        return num_tokens

    def maybe_dummy_run_with_lora(self, *args, **kwargs):
        return contextlib.nullcontext()

    def maybe_remove_all_loras(self, lora_config):
        pass

    def _finalize_dump_data(self, dump):
        pass

    @staticmethod
    def _freeze_gc():
        return contextlib.nullcontext()


FORWARD_CONTEXT: list = []


@contextlib.contextmanager
def _set_ascend_forward_context(attn_metadata, vllm_config, *, aclgraph_runtime_mode=None,
                                batch_descriptor=None, **_):
    FORWARD_CONTEXT.append((aclgraph_runtime_mode, batch_descriptor))
    yield


class _Accelerator:
    synchronize = empty_cache = staticmethod(lambda: None)


@pytest.fixture(scope="module")
def host_runner_cls(host_tree):
    """The host's NPUModelRunner methods (and the vLLM GPUModelRunner methods
    they reach) over the constructor's fields; module globals that are device
    leaves are stand-ins."""
    from vllm.compilation.cuda_graph import CUDAGraphStat
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor
    from vllm.v1.attention.backend import AttentionCGSupport

    vllm_path = "vllm/v1/worker/gpu_model_runner.py"
    vllm_file = host_tree.parent / "gpu_model_runner.py"
    vllm_file.write_text(_vllm_source(vllm_path))
    vllm_namespace = dict(
        np=np, CUDAGraphMode=CUDAGraphMode, time=__import__("time"),
        torch=SimpleNamespace(accelerator=_Accelerator,
                              cuda=SimpleNamespace(mem_get_info=lambda: (0, 0))),
        compilation_counter=SimpleNamespace(num_gpu_runner_capture_triggers=0),
        set_cudagraph_capturing_enabled=lambda enabled: None,
        graph_capture=lambda device: contextlib.nullcontext(), lock_workspace=lambda: None,
        logger=SimpleNamespace(info_once=lambda *a, **k: None, info=lambda *a, **k: None),
        is_global_first_rank=lambda: False)
    methods = {}
    for name in VLLM_METHODS:
        exec(compile(_function(vllm_file, "GPUModelRunner", name), vllm_path, "exec"),
             vllm_namespace)
        methods[name] = vllm_namespace[name]
    gpu_model_runner = type("GPUModelRunner", (), {"capture_model": methods["capture_model"]})

    runner_path = host_tree / "vllm_ascend/worker/model_runner_v1.py"
    namespace = dict(
        np=np, torch=torch, CUDAGraphMode=CUDAGraphMode, BatchDescriptor=BatchDescriptor,
        CUDAGraphStat=CUDAGraphStat, AttentionCGSupport=AttentionCGSupport,
        enable_sp=lambda vllm_config=None: False, cdiv=lambda a, b: -(-a // b),
        is_pd_decode_recompute_scheduler_enabled=lambda vllm_config=None: False,
        AscendAttentionState=SimpleNamespace(DecodeOnly="DecodeOnly",
                                             SpecDecoding="SpecDecoding",
                                             ChunkedPrefill="ChunkedPrefill"),
        SEQ_LEN_WITH_MAX_PA_WORKSPACE=6, using_paged_attention=lambda n, config: False,
        copy_snapshot_to_gpu=lambda buffer: None, lmhead_tp_enable=lambda: False,
        get_pp_group=lambda: SimpleNamespace(is_first_rank=True),
        update_cos_sin=lambda positions: None, set_ascend_forward_context=_set_ascend_forward_context,
        GPUModelRunner=gpu_model_runner,
        _get_gpu_model_runner_module_name=lambda runner: vllm_path,
        _torch_cuda_wrapper=contextlib.nullcontext,
        _replace_gpu_model_runner_function_wrapper=lambda name: contextlib.nullcontext(),
        update_pass_config=lambda runner: contextlib.nullcontext(),
        AscendEagleProposer=_Drafter, AscendDflashProposer=_Drafter,
        AscendExtractHiddenStatesProposer=_Drafter,
        set_graph_params=lambda sizes: sys.modules[ACL_GRAPH].set_graph_params(sizes),
        set_draft_graph_params=lambda sizes: sys.modules[ACL_GRAPH].set_draft_graph_params(sizes))
    for name in RUNNER_METHODS:
        exec(compile(_function(runner_path, "NPUModelRunner", name), str(runner_path), "exec"),
             namespace)
        methods[name] = namespace[name]
    return type("NPUModelRunner", (_RunnerFields,), methods)


ACL_GRAPH = "vllm_ascend.compilation.acl_graph"


def _fia_metadata(num_tokens: int, width: int, seq_lens: list[int]) -> SimpleNamespace:
    """A decode batch's attention metadata as full_graph_fia and
    update_graph_params read it (the attention builder's output)."""
    return SimpleNamespace(actual_seq_lengths_q=list(range(width, num_tokens + 1, width)),
                           seq_lens_list=seq_lens, block_tables=torch.zeros(1),
                           attn_mask=None, causal=True, attn_state="DecodeOnly")


# ------------------------------------------------------------ the overlay
@pytest.fixture
def overlay(dispatcher_module, host_runner_cls, monkeypatch):
    """vllm_ascend.vspec.width_graphs imported over the host: vLLM 0.23's
    dispatcher module and the host runner class."""
    acl_graph = sys.modules.get(ACL_GRAPH)
    if acl_graph is None or not hasattr(acl_graph, "GraphParams"):
        # No graph-parameter store (test_ascend_graphs' `host` fixture gives the host's).
        acl_graph = SimpleNamespace(_graph_params=None, set_graph_params=lambda sizes: None,
                                    set_draft_graph_params=lambda sizes: None)
    width_graphs = _import_width_graphs(monkeypatch, dispatcher_module, host_runner_cls, acl_graph)
    FORWARD_CONTEXT.clear()
    yield width_graphs
    sys.modules.pop("vllm_ascend.vspec.width_graphs", None)


def _import_width_graphs(monkeypatch, dispatcher_module, runner_cls, acl_graph):
    """vllm_ascend.vspec.width_graphs imported afresh over this host: its
    vLLM dispatcher module, its NPUModelRunner class and an acl_graph
    module (the host's modules the overlay imports; the rest stand-ins)."""
    stand_ins = {
        "vllm.v1.cudagraph_dispatcher": dispatcher_module,
        "vllm_ascend.worker": types.ModuleType("vllm_ascend.worker"),
        "vllm_ascend.worker.model_runner_v1": SimpleNamespace(NPUModelRunner=runner_cls),
        ACL_GRAPH: acl_graph,
    }
    if not hasattr(sys.modules.get("vllm_ascend.utils"), "enable_sp"):
        stand_ins["vllm_ascend.utils"] = SimpleNamespace(enable_sp=lambda vllm_config=None: False)
    if "vllm_ascend.compilation" not in sys.modules:
        stand_ins["vllm_ascend.compilation"] = types.ModuleType("vllm_ascend.compilation")
    for name, module in stand_ins.items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.delitem(sys.modules, "vllm_ascend.vspec.width_graphs", raising=False)
    import vllm_ascend.vspec.width_graphs as width_graphs

    return width_graphs


def _config(mode: str = "FULL_AND_PIECEWISE", data_parallel_size: int = 1,
            vspec: dict | None = None):
    """The engine config the host runner's methods read, with what vspec's
    routing reads for an NPU worker (`vspec`: the vspec settings)."""
    from vllm.config import CompilationConfig, CompilationMode

    compilation = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=mode,
                                    cudagraph_capture_sizes=list(CAPTURE_SIZES),
                                    max_cudagraph_capture_size=max(CAPTURE_SIZES),
                                    cudagraph_num_of_warmups=1,
                                    splitting_ops=list(CompilationConfig._attention_ops))
    return SimpleNamespace(
        compilation_config=compilation, lora_config=None, num_speculative_tokens=K,
        speculative_config=SimpleNamespace(num_speculative_tokens=K, method="eagle",
                                           use_eagle=lambda: True,
                                           uses_extract_hidden_states=lambda: False),
        scheduler_config=SimpleNamespace(max_num_seqs=MAX_NUM_SEQS,
                                         max_num_batched_tokens=256, async_scheduling=False,
                                         scheduler_cls=None),
        parallel_config=SimpleNamespace(data_parallel_size=data_parallel_size,
                                        use_ubatching=False, tensor_parallel_size=1,
                                        pipeline_parallel_size=1,
                                        worker_cls="vllm_ascend.worker.worker.NPUWorker"),
        model_config=SimpleNamespace(is_encoder_decoder=False, is_hybrid=False,
                                     use_mla=False, enforce_eager=False, is_moe=False,
                                     get_total_num_hidden_layers=lambda: LAYERS),
        observability_config=SimpleNamespace(cudagraph_metrics=False),
        additional_config={"vspec": {**WIDTH_GRAPHS, **(vspec or {})}},
        device_config=SimpleNamespace(device_type="npu"), use_v2_model_runner=False)


class _Backend:
    """An attention backend whose builder supports FULL graphs always."""

    @staticmethod
    def get_builder_cls():
        from vllm.v1.attention.backend import AttentionCGSupport

        return SimpleNamespace(get_cudagraph_support=lambda config, spec: AttentionCGSupport.ALWAYS)


def _ready(runner, mode: str):
    """The runner after the host's _check_and_update_cudagraph_mode (the
    mode resolution of vLLM's config is a stand-in: the mode configured)."""
    from vllm.config import CUDAGraphMode

    runner.compilation_config.resolve_cudagraph_mode_and_sizes = \
        lambda *args, **kwargs: CUDAGraphMode[mode]
    runner._check_and_update_cudagraph_mode([{_Backend}], [SimpleNamespace(kv_cache_spec=None)])
    return runner


@pytest.fixture(params=["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"])
def runners(request, overlay, host_runner_cls, monkeypatch):
    """(stock host runner, VSpecNPUModelRunner), keys initialised."""
    mode = request.param
    stock = _ready(host_runner_cls(_config(mode), "cpu"), mode)
    ours = _ready(overlay.VSpecNPUModelRunner(_config(mode), "cpu"), mode)
    return stock, ours


# Fits widths 1 and 2 (gammas 0 and 1), not width 3.
TWO_WIDTHS = {"ascend_width_graph_budget_mib": 2.5 * WIDTH_MIB}


@pytest.fixture(params=["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"])
def budgeted(request, overlay, host_runner_cls):
    """(stock host runner, VSpecNPUModelRunner under TWO_WIDTHS), keys initialised."""
    mode = request.param
    stock = _ready(host_runner_cls(_config(mode), "cpu"), mode)
    ours = _ready(overlay.VSpecNPUModelRunner(_config(mode, vspec=TWO_WIDTHS), "cpu"), mode)
    return stock, ours


def _step(runner, tokens_per_request: list[int]):
    """(mode, descriptor) the host's method gives a decode step."""
    scheduled = np.array(tokens_per_request)
    mode, descriptor, *_ = runner._determine_batch_execution_and_padding(
        num_tokens=int(scheduled.sum()), num_reqs=len(scheduled),
        num_scheduled_tokens_np=scheduled, max_num_scheduled_tokens=int(scheduled.max()),
        use_cascade_attn=False)
    return mode, descriptor


def _padded_requests(n: int) -> int:
    return next(r for r in REQUESTS if r >= n)


# ------------------------------------------------------------ (a) dispatch
@pytest.mark.parametrize("width", range(1, K + 2))
@pytest.mark.parametrize("requests", [1, 2, 3, 5, 8])
def test_a_uniform_step_of_each_width_dispatches_that_widths_full_descriptor(
        runners, width, requests):
    from vllm.config import CUDAGraphMode

    _, ours = runners
    mode, descriptor = _step(ours, [width] * requests)
    padded = _padded_requests(requests)
    assert mode == CUDAGraphMode.FULL
    assert (descriptor.num_tokens, descriptor.num_reqs, descriptor.uniform) == \
        (width * padded, padded, True)
    assert descriptor.num_reqs == descriptor.num_tokens // width


def test_each_width_has_a_full_graph_at_each_request_count_stock_captures(runners):
    from vllm.config import CUDAGraphMode

    _, ours = runners
    dispatcher = ours.cudagraph_dispatcher
    assert dispatcher.widths == (5, 4, 3, 2, 1)
    for width in dispatcher.widths:
        with dispatcher.binding(width):
            keys = dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
        assert {(d.num_tokens, d.num_reqs) for d in keys} == {(width * n, n) for n in REQUESTS}


@pytest.mark.parametrize("batch", [[2, 5, 5], [1, 3], [5, 5, 1], [40], [2] * 12, [5] * 5])
def test_a_step_no_width_graph_fits_dispatches_as_the_hosts_runner(runners, batch):
    """Mixed batches, a prefill chunk, a uniform batch past its width's
    largest graph, and 1 + K's own steps: the stock runner is the oracle."""
    stock, ours = runners
    assert _step(ours, batch) == _step(stock, batch)


def test_1_plus_k_steps_keep_stocks_descriptors(runners):
    stock, ours = runners
    for requests in (1, 3, 8):
        assert _step(ours, [1 + K] * requests) == _step(stock, [1 + K] * requests)


# ------------------------------------------------------------ (b) the uniform test
@pytest.mark.parametrize("gamma", range(K))
def test_a_step_below_k_is_uniform_with_the_subclass_and_not_with_the_stock_runner(
        runners, gamma):
    """Failing before (the stock runner), passing after (VSpecNPUModelRunner)."""
    from vllm.config import CUDAGraphMode

    stock, ours = runners
    stock_mode, stock_descriptor = _step(stock, [1 + gamma] * 4)
    assert stock_mode != CUDAGraphMode.FULL and not stock_descriptor.uniform
    mode, descriptor = _step(ours, [1 + gamma] * 4)
    assert mode == CUDAGraphMode.FULL and descriptor.uniform and descriptor.num_reqs == 4


def test_the_fia_padding_of_a_width_step_pads_whole_requests_of_that_width(runners):
    """The host's _pad_query_start_loc_for_fia after a width-2 step of 3
    requests padded to 4: the padded request gets 2 tokens (the host's
    uniform branch), not 1 + K's."""
    from vllm.config import CUDAGraphMode

    _, ours = runners
    mode, descriptor = _step(ours, [2, 2, 2])
    ours.query_start_loc.np[:4] = [0, 2, 4, 6]
    padded = ours._pad_query_start_loc_for_fia(ours.query_start_loc, descriptor.num_tokens,
                                               descriptor.num_reqs, 3, mode, descriptor.num_reqs)
    assert mode == CUDAGraphMode.FULL and padded == 4
    assert ours.query_start_loc.np[:5].tolist() == [0, 2, 4, 6, 8]


def test_the_drafters_dispatch_at_a_width_step_is_not_uniform(runners):
    """The drafter dispatches on the runner's dispatcher with the target's
    uniform flag: at a width-2 step no draft graph exists for width 2's
    descriptors, so it is dispatched as a mixed batch (1 + K's keys); at a
    1 + K step it gets stock's FULL descriptor."""
    from vllm.config import CUDAGraphMode

    stock, ours = runners
    _step(ours, [2] * 4)
    mode, descriptor = ours.cudagraph_dispatcher.dispatch(num_tokens=8, uniform_decode=True)
    assert not descriptor.uniform and mode != CUDAGraphMode.FULL
    _step(ours, [1 + K] * 4)
    _step(stock, [1 + K] * 4)
    assert ours.cudagraph_dispatcher.dispatch(num_tokens=20, uniform_decode=True) == \
        stock.cudagraph_dispatcher.dispatch(num_tokens=20, uniform_decode=True)


# ------------------------------------------------------------ (c) capture
def _captures(runner):
    """(width, descriptor) of each FULL graph capture, in order: the
    forwards of the host's _dummy_run under a FULL runtime mode."""
    from vllm.config import CUDAGraphMode

    out = []
    for mode, descriptor, query_lens in runner.forwards:
        if mode == CUDAGraphMode.FULL:
            assert len(set(query_lens)) == 1, query_lens
            out.append((query_lens[0], (descriptor.num_tokens, descriptor.num_reqs)))
    return out


def test_capture_runs_the_hosts_dummy_run_once_per_width_largest_first(runners):
    stock, ours = runners
    ours.capture_model()
    captures = _captures(ours)
    widths = [w for w, _ in captures]
    assert widths == sorted(widths, reverse=True)
    for width in range(1, K + 2):
        assert sorted(d for w, d in captures if w == width) == \
            [(width * n, n) for n in REQUESTS], width
    stock.capture_model()
    assert [c for c in captures if c[0] == 1 + K] == _captures(stock)


def test_piecewise_graphs_and_draft_captures_stay_stocks(runners):
    from vllm.config import CUDAGraphMode

    stock, ours = runners
    ours.capture_model()
    stock.capture_model()
    piecewise = [(m, d) for m, d, _ in ours.forwards if m == CUDAGraphMode.PIECEWISE]
    assert piecewise == [(m, d) for m, d, _ in stock.forwards if m == CUDAGraphMode.PIECEWISE]
    assert ours.drafter.descriptors == stock.drafter.descriptors
    assert all(d.num_tokens == (1 + K) * d.num_reqs for m, d in ours.drafter.descriptors
               if m == CUDAGraphMode.FULL)


# ------------------------------------------------------------ (d) routing


def _engine(vspec=None, cudagraph_mode="FULL_AND_PIECEWISE", data_parallel_size=1,
            method="eagle", async_scheduling=False):
    """vspec's stand-in engine config (conftest) for an NPU worker, capture up to 40 tokens."""
    from conftest import engine_config

    config = engine_config(method, K, vspec, device="npu", cudagraph_mode=cudagraph_mode,
                           data_parallel_size=data_parallel_size,
                           worker_cls="vllm_ascend.worker.worker.NPUWorker",
                           async_scheduling=async_scheduling)
    config.compilation_config.max_cudagraph_capture_size = max(CAPTURE_SIZES)
    config.compilation_config.cudagraph_capture_sizes = list(CAPTURE_SIZES)
    config.scheduler_config.max_num_seqs = MAX_NUM_SEQS
    config.parallel_config.pipeline_parallel_size = 1
    config.model_config.get_total_num_hidden_layers = lambda: LAYERS
    return config


def _pad_max_reqs(config) -> int:
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    return VerifyWidth.of(config, resolve(config)).pad_max_reqs


def assert_host_runner_and_padding(config) -> None:
    """The engine keeps the host's runner, and the scheduler pads as stock's graphs need."""
    from vllm_ascend.vspec import routing

    assert routing.model_runner_cls_for(config, _HostRunner) is _HostRunner
    assert _pad_max_reqs(config) == max(CAPTURE_SIZES) // (1 + K)


def test_the_key_routes_the_width_runner_and_the_scheduler_stops_padding(overlay):
    from vllm_ascend.vspec import routing

    config = _engine(WIDTH_GRAPHS)
    assert routing.model_runner_cls_for(config, _HostRunner) is overlay.VSpecNPUModelRunner
    assert _pad_max_reqs(config) == 0


class _HostRunner:
    """What NPUWorker.init_device passes as the host's runner class."""


@pytest.mark.parametrize("why, config", [
    ("key off (the default)", _engine()),
    ("vspec off", _engine({**WIDTH_GRAPHS, "enabled": False})),
    ("a method vspec does not drive", _engine(WIDTH_GRAPHS, method="ngram")),
    ("no speculative decoding", _engine(WIDTH_GRAPHS, method=None)),
    ("DP 2", _engine(WIDTH_GRAPHS, data_parallel_size=2)),
    ("no FULL graphs", _engine(WIDTH_GRAPHS, cudagraph_mode="PIECEWISE")),
    ("no graphs", _engine(WIDTH_GRAPHS, cudagraph_mode="NONE")),
    ("FULL for mixed batches too: no separate decode routine",
     _engine(WIDTH_GRAPHS, cudagraph_mode="FULL")),
])
def test_the_host_runner_is_kept_where_width_graphs_cannot_run(why, config):
    from vllm_ascend.vspec import routing

    assert routing.model_runner_cls_for(config, _HostRunner) is _HostRunner, why


def test_dp_2_keeps_the_host_runner_and_the_padding():
    config = _engine(WIDTH_GRAPHS, data_parallel_size=2)
    assert_host_runner_and_padding(config)
    assert _pad_max_reqs(_engine(WIDTH_GRAPHS)) == 0


def test_an_mla_model_keeps_the_host_runner_and_the_padding():
    config = _engine(WIDTH_GRAPHS)
    config.model_config.use_mla = True
    assert_host_runner_and_padding(config)


def test_a_host_without_the_runner_keeps_its_own_and_the_padding(monkeypatch):
    """vLLM-Ascend 0.30: its host.toml routes no model runner."""
    from vllm_ascend.vspec import routing

    monkeypatch.setattr(routing, "MODEL_RUNNER", None)
    config = _engine(WIDTH_GRAPHS)
    assert_host_runner_and_padding(config)


# ------------------------------------------------------------ (c) graph parameters
@pytest.fixture
def fia_runner(host, overlay, monkeypatch):
    """A VSpecNPUModelRunner over the host's acl_graph module (test_ascend_graphs'
    `host` fixture: GraphParams and set_graph_params executed from the sdist)
    whose model forward captures the host's full_graph_fia for the target."""
    monkeypatch.setattr(host.extra, "is_draft_model", False, raising=False)
    monkeypatch.setitem(host.attention.update_graph_params.__globals__, "_ATTN_KEYS_BUFFER", None)
    runner = _ready(overlay.VSpecNPUModelRunner(_config("FULL_DECODE_ONLY"), "cpu"),
                    "FULL_DECODE_ONLY")
    runner.fia = host.attention.full_graph_fia
    return runner


def _captured(host, width: int, num_tokens: int) -> list[tuple]:
    """Tags (width, tokens, layer) of the tasks a width's store holds at num_tokens."""
    params = host.acl_graph.get_graph_params()
    return [handle.task.tag for handle in params.handles[(width, num_tokens)]]


def test_widths_captured_at_one_token_count_keep_their_own_parameter_lists(host, fia_runner):
    """8 tokens are 4 requests of width 2 and 2 of width 4 (and 8 of width
    1): each width's capture appends to its own lists, through the host's
    full_graph_fia and its graph-parameter store."""
    fia_runner.capture_model()
    layers = list(test_ascend_graphs.LAYERS)
    for width in (1, 2, 4):
        assert _captured(host, width, 8) == [(width, 8, layer) for layer in layers], width
    assert _captured(host, 1 + K, 40) == [(1 + K, 40, layer) for layer in layers]


def test_a_width_steps_replay_update_rewrites_only_that_widths_tasks(host, fia_runner):
    fia_runner.capture_model()
    mode, descriptor = _step(fia_runner, [2] * 4)   # 4 requests of width 2: 8 tokens
    seq_lens = [11, 12, 13, 14]
    context = SimpleNamespace(attn_metadata={
        layer: _fia_metadata(descriptor.num_tokens, 2, seq_lens)
        for layer in test_ascend_graphs.LAYERS})
    host.attention.update_graph_params(None, context, descriptor.num_tokens,
                                       fia_runner.vllm_config)
    params = host.acl_graph.get_graph_params()
    kv_lens = {w: [h.task.kwargs["actual_seq_lengths_kv"] for h in params.handles[(w, 8)]]
               for w in (1, 2, 4)}
    assert kv_lens == {1: [[0], [0]], 2: [seq_lens, seq_lens], 4: [[0], [0]]}


def test_the_hosts_token_count_store_alone_gives_one_width_anothers_parameters(
        host, fia_runner, overlay, monkeypatch):
    """Negative control: with the host's store keyed by token count only
    (every width's sizes in it, no per-width keys), widths 1, 2 and 4
    captured at 8 tokens append to one list, and a width-2 step's update
    rewrites width 4's tasks (captured first) and leaves width 2's stale."""
    acl_graph = host.acl_graph
    acl_graph._graph_params = None
    dispatcher = fia_runner.cudagraph_dispatcher
    acl_graph.set_graph_params(sorted({n for w in dispatcher.widths
                                       for n in dispatcher.capture_sizes(w)}))
    fia_runner.capture_model()
    mode, descriptor = _step(fia_runner, [2] * 4)
    context = SimpleNamespace(attn_metadata={
        layer: _fia_metadata(8, 2, [11, 12, 13, 14]) for layer in test_ascend_graphs.LAYERS})
    host.attention.update_graph_params(None, context, 8, fia_runner.vllm_config)
    updated = [h.task.tag[0] for h in acl_graph.get_graph_params().handles[8]
               if h.task.kwargs["actual_seq_lengths_kv"] == [11, 12, 13, 14]]
    assert updated == [4, 4]


def test_encoder_graphs_keep_the_host_runner_and_the_padding():
    config = _engine(WIDTH_GRAPHS)
    config.compilation_config.cudagraph_mm_encoder = True
    assert_host_runner_and_padding(config)


def test_sequence_parallelism_keeps_the_host_runner_and_the_padding(monkeypatch):
    """flashcomm1 pads token counts to multiples of the TP size, which other
    widths' sizes are not: vLLM-Ascend's own enable_sp decides (stood in)."""
    monkeypatch.setitem(sys.modules, "vllm_ascend.utils",
                        SimpleNamespace(enable_sp=lambda vllm_config=None: True))
    config = _engine(WIDTH_GRAPHS)
    assert_host_runner_and_padding(config)


# ------------------------------------------------------------ (e) the memory budget
def test_a_widths_graphs_are_priced_per_request_count_at_the_per_graph_estimate():
    """Every width below 1 + K costs one graph per request count of 1 + K's
    FULL graphs, each max(1 MiB floor, layers x 128 KiB): 4 x 4 MiB here."""
    from vllm_ascend.vspec import graph_budget

    plan = graph_budget.plan_widths(K, REQUESTS, LAYERS, 1024)
    assert plan.cost == {g: WIDTH_MIB * graph_budget.MIB for g in range(K)}
    assert plan.widths == (5, 4, 3, 2, 1) and plan.skipped == ()
    assert graph_budget.plan_widths(K, REQUESTS, 2, 1024).cost[0] == 4 * graph_budget.MIB


def test_widths_are_admitted_from_width_1_up_and_the_rest_padded_to_1_plus_k():
    from vllm_ascend.vspec import graph_budget

    plan = graph_budget.plan_widths(K, REQUESTS, LAYERS, 2.5 * WIDTH_MIB)
    assert (plan.kept, plan.skipped, plan.widths) == ((0, 1), (2, 3), (5, 2, 1))
    assert [plan.verified(g) for g in range(K + 1)] == [0, 1, K, K, K]
    assert graph_budget.plan_widths(K, REQUESTS, LAYERS, WIDTH_MIB - 0.1).kept == ()
    line = plan.line()
    assert "estimated 32 MiB beyond stock's for widths 1, 2" in line
    assert "skipped widths 3, 4 (estimated 32 MiB more)" in line


def test_the_engine_configs_request_counts_are_the_host_dispatchers(runners):
    """The scheduler prices and pads from the engine config alone: its
    request counts are the ones the host's dispatcher keys 1 + K's FULL
    graphs at (the oracle: the host's initialize_cudagraph_keys)."""
    from vllm.config import CUDAGraphMode

    from vllm_ascend.vspec import graph_budget

    stock, _ = runners
    keys = stock.cudagraph_dispatcher.cudagraph_keys[CUDAGraphMode.FULL]
    assert graph_budget.decode_requests(CAPTURE_SIZES, K, MAX_NUM_SEQS) == \
        tuple(sorted({d.num_reqs for d in keys if d.uniform}))


def test_a_width_the_budget_skips_gets_no_full_keys(budgeted):
    from vllm.config import CUDAGraphMode

    _, ours = budgeted
    dispatcher = ours.cudagraph_dispatcher
    assert dispatcher.widths == (5, 2, 1)
    assert dispatcher.width_plan.skipped == (2, 3)
    for width in (3, 4):
        with pytest.raises(ValueError, match=f"verify width {width} has no FULL graphs"):
            with dispatcher.binding(width):
                pass
    with dispatcher.binding(2):
        assert {d.num_tokens for d in dispatcher.cudagraph_keys[CUDAGraphMode.FULL]} == \
            {2 * n for n in REQUESTS}


@pytest.mark.parametrize("width", [3, 4])
def test_a_step_at_a_skipped_width_takes_the_hosts_path(budgeted, width):
    """No graph of its own: the stock runner's dispatch (PIECEWISE or eager,
    never a FULL descriptor it has no graph for)."""
    from vllm.config import CUDAGraphMode

    stock, ours = budgeted
    mode, descriptor = _step(ours, [width] * 4)
    assert (mode, descriptor) == _step(stock, [width] * 4)
    assert mode != CUDAGraphMode.FULL and not descriptor.uniform


@pytest.mark.parametrize("width", [1, 2, 1 + K])
def test_an_admitted_width_still_dispatches_its_full_descriptor(budgeted, width):
    from vllm.config import CUDAGraphMode

    _, ours = budgeted
    mode, descriptor = _step(ours, [width] * 3)
    assert mode == CUDAGraphMode.FULL and descriptor.uniform
    assert (descriptor.num_tokens, descriptor.num_reqs) == (width * 4, 4)


def test_capture_runs_only_the_admitted_widths(budgeted):
    """Failing before the budget (every width captured), passing after."""
    _, ours = budgeted
    ours.capture_model()
    captures = _captures(ours)
    assert [w for w, _ in captures] == sorted((w for w, _ in captures), reverse=True)
    assert {w for w, _ in captures} == {1 + K, 2, 1}


def test_the_scheduler_pads_exactly_the_widths_the_runner_skips(budgeted):
    """The scheduler's rule on the same engine config: a step at gamma 0 or 1
    verifies its gamma (graphs of its own), one at gamma 2 or 3 verifies K
    (stock's graph), up to the largest graph's 8 requests; past them no
    step is padded. Every width the padding leaves has a FULL graph."""
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    _, ours = budgeted
    verify = VerifyWidth.of(ours.vllm_config, resolve(ours.vllm_config))
    assert verify.pads and not verify.pads_to_k and verify.pad_max_reqs == max(REQUESTS)
    assert [verify.verified(g, 8) for g in range(K + 1)] == [0, 1, K, K, K]
    assert [verify.verified(g, 9) for g in range(K + 1)] == list(range(K + 1))
    assert {1 + verify.verified(g, n) for g in range(K + 1) for n in range(1, 9)} == \
        set(ours.cudagraph_dispatcher.widths)


def test_every_width_admitted_pads_nothing(runners):
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    _, ours = runners
    verify = VerifyWidth.of(ours.vllm_config, resolve(ours.vllm_config))
    assert not verify.pads and verify.verified(1, 4) == 1


def test_a_budget_that_fits_no_width_keeps_the_host_runner_and_the_padding(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="vllm"):
        assert_host_runner_and_padding(
            _engine({**WIDTH_GRAPHS, "ascend_width_graph_budget_mib": WIDTH_MIB - 1}))
    assert any("fits no verify width below 1 + K" in r.getMessage() for r in caplog.records)


def test_the_start_up_line_names_the_estimate_and_the_skipped_widths(overlay, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="vllm"):
        _ready(overlay.VSpecNPUModelRunner(_config("FULL_DECODE_ONLY", vspec=TWO_WIDTHS),
                                           "cpu"), "FULL_DECODE_ONLY")
    (line,) = [r for r in caplog.records if "per verify width" in r.getMessage()]
    assert line.levelno == logging.WARNING
    assert "skipped widths 3, 4" in line.getMessage()
    assert "verify widths 5, 2, 1: 8 beyond stock's 4 for width 5" in line.getMessage()


def test_a_narrow_step_tells_the_drafter_its_width(budgeted):
    """After a target step at width 2 only width 2's own draft graph can
    replay (narrow_width 2); after a padded or 1 + K step the 1 + K ones."""
    _, ours = budgeted
    dispatcher = ours.cudagraph_dispatcher
    _step(ours, [2] * 4)
    assert dispatcher.narrow_width == 2
    _step(ours, [1 + K] * 4)
    assert dispatcher.narrow_width is None


def test_the_drafters_dispatch_pairing_a_width_takes_that_widths_descriptor(budgeted):
    """While the drafter replays the step width's own draft graph
    (pairing_draft) its dispatch, through the host's dispatcher code, is
    width 2's FULL descriptor (3 requests padded to 4); outside it, a mixed
    batch's."""
    from vllm.config import CUDAGraphMode

    stock, ours = budgeted
    dispatcher = ours.cudagraph_dispatcher
    _step(ours, [2] * 3)
    with dispatcher.pairing_draft():
        mode, descriptor = dispatcher.dispatch(num_tokens=6, uniform_decode=True)
    assert mode == CUDAGraphMode.FULL and descriptor.uniform
    assert (descriptor.num_tokens, descriptor.num_reqs) == (8, 4)
    assert dispatcher.dispatch(num_tokens=6, uniform_decode=True) == \
        stock.cudagraph_dispatcher.dispatch(num_tokens=6, uniform_decode=False)


class _PairingDrafter(_Drafter):
    """A drafter whose graph for gamma 1 pairs with width 2 (the proposer's
    pairing_capture answers it from its plan): records the gamma each of
    its dummy runs took."""

    def __init__(self):
        super().__init__()
        self.gamma = None
        self.gammas = []

    @contextlib.contextmanager
    def pairing_capture(self, gamma):
        self.gamma = gamma
        try:
            yield gamma == 1
        finally:
            self.gamma = None

    def dummy_run(self, *, batch_descriptor, aclgraph_runtime_mode, **kwargs):
        super().dummy_run(batch_descriptor=batch_descriptor,
                          aclgraph_runtime_mode=aclgraph_runtime_mode, **kwargs)
        self.gammas.append(self.gamma)


def test_the_drafter_captures_at_a_width_only_where_its_gamma_pairs(budgeted):
    """Widths 5, 2 and 1 captured: the drafter's dummy runs at 1 + K (all of
    stock's descriptors) and at width 2 (gamma 1's graph, width 2's
    descriptors), none at width 1 (gamma 0 pairs with no graph)."""
    from vllm.config import CUDAGraphMode

    stock, ours = budgeted
    ours.drafter = _PairingDrafter()
    ours.capture_model()
    stock.capture_model()
    full = [(g, d) for (m, d), g in zip(ours.drafter.descriptors, ours.drafter.gammas)
            if m == CUDAGraphMode.FULL]
    assert [d for g, d in full if g is None] == \
        [d for m, d in stock.drafter.descriptors if m == CUDAGraphMode.FULL]
    assert sorted((d.num_tokens, d.num_reqs) for g, d in full if g == 1) == \
        [(2 * n, n) for n in REQUESTS]
    assert {g for g, _ in full} == {None, 1}


def test_the_scheduler_decides_every_step_and_pads_only_skipped_gammas():
    """VSpecScheduler's own _decide and _set_gamma under TWO_WIDTHS (async
    scheduling: the next step's draft placeholders): a step at gamma 1
    verifies its own width, one at gamma 2 is padded to K with invalid
    drafts, and the controller decides both (no 'K where padded' hold:
    only where every gamma is padded to K)."""
    from types import SimpleNamespace

    from vllm_vspec.hosts.vllm.scheduler import VSpecAsyncScheduler
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    config = _engine({**WIDTH_GRAPHS, **TWO_WIDTHS}, async_scheduling=True)
    scheduler = object.__new__(VSpecAsyncScheduler)
    scheduler.vspec = SimpleNamespace(decide_step=lambda *args: "the controller's")
    scheduler._verify = VerifyWidth.of(config, resolve(config))
    scheduler._verified, scheduler._drafted, scheduler._width = K, {}, 1
    scheduler.requests = {}
    step = SimpleNamespace(num_scheduled_tokens={f"r{i}": 1 for i in range(4)},
                           scheduled_spec_decode_tokens={}, num_invalid_spec_tokens=None,
                           finished_req_ids=set(), total_num_scheduled_tokens=4)
    assert scheduler._decide(step) == "the controller's"
    scheduler._set_gamma(step, 1)
    assert scheduler._spec_token_placeholders == [-1]
    scheduler._set_gamma(step, 2)
    assert scheduler._spec_token_placeholders == [-1] * K


# ------------------------------------------------------------ (f) draft graphs paired with widths
def _width_dispatcher(overlay, k: int, max_num_seqs: int, sizes, vspec=None):
    """A WidthDispatcher over vLLM 0.23's dispatcher code (with vLLM-Ascend's
    patch) for K = k, keys initialised as the runner's
    _check_and_update_cudagraph_mode leaves them (FULL_DECODE_ONLY)."""
    from vllm.config import CompilationConfig, CUDAGraphMode

    from vllm_vspec.config import VSpecConfig

    compilation = CompilationConfig(cudagraph_mode="FULL_DECODE_ONLY",
                                    cudagraph_capture_sizes=list(sizes),
                                    max_cudagraph_capture_size=max(sizes))
    config = SimpleNamespace(
        compilation_config=compilation, lora_config=None,
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
        model_config=SimpleNamespace(get_total_num_hidden_layers=lambda: LAYERS),
        parallel_config=SimpleNamespace(pipeline_parallel_size=1))
    dispatcher = overlay.WidthDispatcher(config, VSpecConfig.from_dict(vspec or {}, k))
    dispatcher.initialize_cudagraph_keys(CUDAGraphMode.FULL_DECODE_ONLY, 1 + k)
    return dispatcher


def _paired_proposer(host, overlay):
    """test_ascend_graphs' proposer (vspec's StepGammaProposer over the host's
    dummy_run, acl_graph and FIA capture/update; K = 3, max_num_seqs 2) on
    a runner whose dispatcher keys widths 4, 3, 2 and 1 at 1 and 2
    requests, captured as the runner's capture_model drives it: 1 + K's
    sizes first, then width 3's and width 2's under pairing_capture."""
    from vllm.config import CUDAGraphMode
    from vllm.forward_context import BatchDescriptor

    import test_ascend_graphs as graphs

    k, seqs = graphs.K, graphs.HostLikeProposer.max_num_seqs
    dispatcher = _width_dispatcher(overlay, k, seqs, (4, 8))
    assert dispatcher.widths == (4, 3, 2, 1)
    proposer = graphs._make(host, dispatcher=dispatcher)   # 1 + K's capture at 8 tokens
    for width in (3, 2):
        with proposer.pairing_capture(width - 1) as pairs:
            assert pairs
            for n in (1, 2):
                proposer.dummy_run(num_tokens=width * n, with_prefill=False, num_reqs=n,
                                   num_tokens_across_dp=None,
                                   aclgraph_runtime_mode=CUDAGraphMode.FULL,
                                   batch_descriptor=BatchDescriptor(
                                       num_tokens=width * n, num_reqs=n, uniform=True),
                                   dummy_compute_logits=lambda hidden_states: None,
                                   in_graph_capturing=True, is_profile=False)
    return proposer, dispatcher


def _width_graph(proposer, gamma: int, num_tokens: int):
    """The graph gamma's wrapper captured at num_tokens (tagged for FAKE's report)."""
    wrapper = proposer._vspec_runnables.get(gamma, proposer._vspec_max_runnable)
    (graph,) = [e.aclgraph for d, e in wrapper.concrete_aclgraph_entries.items()
                if d.num_tokens == num_tokens]
    graph.gamma = gamma
    return graph


def test_a_gamma_with_its_own_width_is_captured_at_that_widths_sizes(host, overlay):
    """Gammas 1 and 2 verify widths 2 and 3, which have target graphs: their
    draft graphs are captured there, through the host's dummy_run, sampling
    size // width rows and drafting their own steps, into their own stores
    at those widths' token counts; at 1 + K's sizes only K's (stock's)."""
    import test_ascend_graphs as graphs

    proposer, _ = _paired_proposer(host, overlay)
    plan = proposer._vspec_graph_plan
    assert plan.at_width == (1, 2) and plan.captured == (graphs.K,)
    captures = [(c["steps"], c["batch_size"]) for c in proposer.draft_calls if c["capturing"]]
    assert captures == [(graphs.K, 2), (2, 1), (2, 2), (1, 1), (1, 2)]
    store = host.acl_graph.get_draft_graph_params()
    for gamma, width in ((1, 2), (2, 3)):
        entries = proposer._vspec_runnables[gamma].concrete_aclgraph_entries
        assert sorted((d.num_tokens, d.num_reqs) for d in entries) == [(width, 1), (2 * width, 2)]
        for n in (1, 2):
            assert len(store.handles[(gamma, width * n)]) == gamma * len(graphs.LAYERS)
    assert [d.num_tokens for d in proposer._vspec_max_runnable.concrete_aclgraph_entries] == \
        [graphs.NUM_TOKENS]
    assert len(store.handles[(graphs.K, graphs.NUM_TOKENS)]) == graphs.K * len(graphs.LAYERS)


def _narrow_step(dispatcher, width: int, requests: int) -> None:
    """The runner's dispatch of a target step of `requests` at `width`."""
    with dispatcher.step(width * requests, requests, width):
        dispatcher.dispatch(width * requests, True)


def _propose(proposer, call: int, gamma: int, num_tokens: int, steps: int | None = None):
    """A drafter step at `gamma` (its metadata for `steps` draft steps: the
    graph's it drafts with) after a target step of num_tokens, 2 requests."""
    import test_ascend_graphs as graphs

    fake = graphs.FAKE
    fake.executed.clear()
    draft = proposer._propose(seq_lens=graphs._seq_lens(call, steps or max(gamma, 1)),
                              scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=gamma),
                              num_tokens=num_tokens, num_reqs=2)
    fake.flush()
    return draft, list(fake.executed)


def test_a_step_after_a_width_replays_that_widths_draft_graph(host, overlay):
    """After a target step at width 2 (2 requests), a step at gamma 1
    replays gamma 1's graph captured at 4 tokens with its own parameters;
    at gamma 0 (one pass) the same graph; at gamma 2 none (2 does not fit
    it): it drafts 2 steps eagerly. After width 3, gamma 1 fits gamma 2's
    graph: it replays that and keeps its first draft."""
    import test_ascend_graphs as graphs

    proposer, dispatcher = _paired_proposer(host, overlay)
    width2, width3 = _width_graph(proposer, 1, 4), _width_graph(proposer, 2, 6)
    _narrow_step(dispatcher, 2, 2)
    for call, gamma in ((1, 1), (2, 0)):
        before = width2.replays
        draft, executed = _propose(proposer, call, gamma, 4)
        assert width2.replays == before + 1
        assert executed == [(1, (0, layer), graphs._seq_lens(call, 1)[0])
                            for layer in graphs.LAYERS]
        assert graphs.FAKE.hangs == []
    calls = len(proposer.draft_calls)
    draft, executed = _propose(proposer, 3, 2, 4)
    assert (width2.replays, width3.replays) == (2, 0)
    assert executed == [(None, (s, layer), graphs._seq_lens(3, 2)[s]) for s in range(2)
                        for layer in graphs.LAYERS]   # eager: no graph
    assert [(c["steps"], c["capturing"]) for c in proposer.draft_calls[calls:]] == [(2, False)]
    _narrow_step(dispatcher, 3, 2)
    draft, executed = _propose(proposer, 4, 1, 6, steps=2)
    assert width3.replays == 1
    assert executed == [(2, (s, layer), graphs._seq_lens(4, 2)[s]) for s in range(2)
                        for layer in graphs.LAYERS]
    assert (draft[:, :1] != -1).all() and (draft[:, 1:] == -1).all()


# ------------------------------------------------------------ (g) the 0.30.0rc2 pin, dispatch only
PIN_030 = "0.30.0rc2"


def dispatcher_module_030(tmp_path_factory):
    """vLLM 0.30's cudagraph_dispatcher module with vLLM-Ascend 0.30.0rc2's
    patch_cudagraph (`_create_padded_batch_descriptor`) applied."""
    from test_ascend_graphs import sdist_file

    return patched_dispatcher_module(
        PIN_030, sdist_file(PIN_030, "vllm_ascend/patch/worker/patch_cudagraph.py", tmp_path_factory))


@pytest.fixture(scope="module")
def host_030(tmp_path_factory):
    """vLLM 0.30's cudagraph_dispatcher module with vLLM-Ascend 0.30.0rc2's
    patch_cudagraph applied, and a runner class holding 0.30.0rc2's own
    NPUModelRunner._determine_batch_execution_and_padding over
    _RunnerFields (the rest of the runner is not ported: per-width graphs
    are not routed on this pin)."""
    from test_ascend_graphs import host_batch_padding, sdist_file

    module = dispatcher_module_030(tmp_path_factory)
    runner = sdist_file(PIN_030, "vllm_ascend/worker/model_runner_v1.py", tmp_path_factory)
    cls = type("NPUModelRunner", (_RunnerFields,), {
        "_determine_batch_execution_and_padding": host_batch_padding(runner), "use_dcp": False})
    return module, cls


@pytest.fixture
def overlay_030(host_030, monkeypatch):
    """vllm_ascend.vspec.width_graphs imported over vLLM 0.30's dispatcher and
    the 0.30.0rc2 runner class (the acl_graph store is a stand-in: on 0.30
    FIA's FULL graphs are UpdatableGraphs holding their own parameters)."""
    module, cls = host_030
    yield _import_width_graphs(monkeypatch, module, cls, SimpleNamespace(_graph_params=None)), cls
    sys.modules.pop("vllm_ascend.vspec.width_graphs", None)


@pytest.mark.parametrize("mode", ["FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"])
def test_on_0_30_the_width_dispatcher_gives_each_width_its_full_descriptor(overlay_030, mode):
    """A probe for the second pin (not routed there: no patch 0004, no
    host.toml model_runner): WidthDispatcher over vLLM 0.30's
    CudagraphDispatcher, keys built as 0.30.0rc2's
    _check_and_update_cudagraph_mode builds them, and 0.30.0rc2's own
    uniform test and dispatch: a uniform step of every width gets that
    width's FULL descriptor, 1 + K's and mixed steps the stock runner's."""
    from vllm.config import CUDAGraphMode

    width_graphs, cls = overlay_030
    stock, ours = cls(_config(mode), "cpu"), width_graphs.VSpecNPUModelRunner(_config(mode), "cpu")
    for runner in (stock, ours):
        runner.cudagraph_dispatcher.initialize_cudagraph_keys(CUDAGraphMode[mode], 1 + K)
    for width in range(1, K + 2):
        mode_, descriptor = _step(ours, [width] * 3)
        assert mode_ == CUDAGraphMode.FULL and descriptor.uniform, width
        assert (descriptor.num_tokens, descriptor.num_reqs) == (4 * width, 4)
    for batch in ([1 + K] * 3, [2, 5, 5], [40]):
        assert _step(ours, batch) == _step(stock, batch), batch
    assert _step(stock, [2] * 3)[0] != CUDAGraphMode.FULL
