"""TP > 1: the verify padding is decided on the graph mode the workers run
(vllm_ascend/vspec/worker_graphs.py; nothing here runs on an NPU).

What is real here: vLLM's own `Executor.initialize_from_config` (the CPU
host's vLLM 0.32; vLLM 0.23's, which the Ascend pin runs, also captures in
it) extended by `worker_graphs.install`, vLLM's own
`CompilationConfig.resolve_cudagraph_mode_and_sizes` doing the downgrade
(what vLLM-Ascend 0.23.0.post1's `NPUModelRunner._check_and_update_cudagraph_mode`
calls, model_runner_v1.py line 5061), vLLM's `run_method` (how an executor
runs a callable on a worker), and the scheduler's padding rule
(`VerifyWidth.of`). What is a stand-in, written here: the executor's
workers (`_Worker`: each holds its own deep copy of the engine's config,
as a multiproc or Ray worker holds an unpickled one, and on
`initialize_from_config` resolves its graph mode for an attention backend
whose graph support is given) and test_overlay's engine config (a
SimpleNamespace with vLLM's real CompilationConfig in it).
"""

from __future__ import annotations

import copy

import pytest

from test_overlay import _engine_config

K = 4
CAPTURE = 40   # 8 requests of 1 + K tokens


def _config(vspec=None, device="npu"):
    from vllm.config import CompilationConfig, CompilationMode

    config = _engine_config("eagle", K, vspec=vspec or {}, device=device)
    # What vLLM's Executor.__init__ reads and these tests do not use.
    config.cache_config = config.lora_config = config.load_config = None
    config.observability_config = None
    config.compilation_config = CompilationConfig(
        mode=CompilationMode.VLLM_COMPILE, cudagraph_mode="FULL_AND_PIECEWISE",
        cudagraph_capture_sizes=[5, 10, 20, 40], max_cudagraph_capture_size=CAPTURE)
    return config


class _Worker:
    """A worker with its own copy of the config; its KV-cache init resolves
    the graph mode for its attention backend's support, as the NPU runner's
    _check_and_update_cudagraph_mode does (that method's other work, the
    dispatcher keys and the graph-parameter stores, is left out)."""

    def __init__(self, vllm_config, support):
        self.vllm_config = vllm_config
        self.support = support

    def initialize_from_config(self, kv_cache_config):
        self.vllm_config.compilation_config.resolve_cudagraph_mode_and_sizes(
            self.support, "StandInAttentionBackend", uniform_decode_query_len=1 + K,
            max_num_reqs=64)


def _executor_cls(shared: bool = False):
    from vllm.v1.executor.abstract import Executor
    from vllm.v1.serial_utils import run_method

    class StandInExecutor(Executor):
        """vLLM's Executor with stand-in workers; `shared`: one worker holding
        the engine's own config object (the uniproc executor, TP 1)."""

        supports = ()

        def _init_executor(self):
            self.rpc_calls = []
            self.workers = [_Worker(self.vllm_config if shared else copy.deepcopy(self.vllm_config),
                                    support) for support in self.supports]

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None, non_block=False):
            self.rpc_calls.append(method)
            return [run_method(w, method, args, kwargs or {}) for w in self.workers]

        def check_health(self):
            pass

    return StandInExecutor


def _engine(supports, vspec=None, device="npu", shared=False, hook=True):
    """(engine config, executor) after the executor's initialize_from_config."""
    from vllm_ascend.vspec import worker_graphs

    cls = _executor_cls(shared)
    cls.supports = supports
    if hook:
        assert worker_graphs.install(cls)
    config = _config(vspec, device)
    executor = cls(config)
    executor.initialize_from_config([None] * len(supports))
    return config, executor


def _pad_max_reqs(config) -> int:
    from vllm_vspec.hosts.vllm.verify_width import VerifyWidth
    from vllm_vspec.hosts.wiring import resolve

    return VerifyWidth.of(config, resolve(config)).pad_max_reqs


def _support(name):
    from vllm.v1.attention.backend import AttentionCGSupport

    return AttentionCGSupport[name]


def test_the_stand_in_workers_downgrade_their_own_copies_only():
    """The hazard itself (no hook): TP 2 workers whose backend has no full
    graph for 1 + K query tokens drop FULL decode in their copies; the
    engine core's copy still says FULL_AND_PIECEWISE and the scheduler pads."""
    from vllm.config import CUDAGraphMode

    config, executor = _engine([_support("UNIFORM_SINGLE_TOKEN_DECODE")] * 2, hook=False)
    worker_modes = {w.vllm_config.compilation_config.cudagraph_mode for w in executor.workers}
    assert all(m.decode_mode() != CUDAGraphMode.FULL for m in worker_modes), worker_modes
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert _pad_max_reqs(config) == CAPTURE // (1 + K)


def test_with_the_hook_the_padding_follows_the_workers_downgrade():
    from vllm.config import CUDAGraphMode

    config, executor = _engine([_support("UNIFORM_SINGLE_TOKEN_DECODE")] * 2)
    mode = config.compilation_config.cudagraph_mode
    assert mode == executor.workers[0].vllm_config.compilation_config.cudagraph_mode
    assert mode.decode_mode() != CUDAGraphMode.FULL
    assert _pad_max_reqs(config) == 0   # no full decode graph to keep: verify gamma


def test_workers_that_keep_full_graphs_keep_the_padding():
    from vllm.config import CUDAGraphMode

    config, executor = _engine([_support("UNIFORM_BATCH")] * 2)
    assert config.compilation_config.cudagraph_mode.decode_mode() == CUDAGraphMode.FULL
    assert config.compilation_config.max_cudagraph_capture_size == \
        executor.workers[0].vllm_config.compilation_config.max_cudagraph_capture_size
    assert _pad_max_reqs(config) == \
        config.compilation_config.max_cudagraph_capture_size // (1 + K) > 0


def test_one_worker_without_full_decode_graphs_turns_the_padding_off():
    config, executor = _engine([_support("UNIFORM_BATCH"),
                                _support("UNIFORM_SINGLE_TOKEN_DECODE")])
    assert _pad_max_reqs(config) == 0


def test_tp1_shares_the_engines_config_and_changes_nothing(caplog):
    """The uniproc executor's worker holds the engine core's own object: the
    scheduler already reads the final mode; adopting it writes nothing."""
    from vllm_ascend.vspec import worker_graphs

    config, executor = _engine([_support("UNIFORM_SINGLE_TOKEN_DECODE")], shared=True)
    assert executor.rpc_calls[-1] is worker_graphs.worker_graph_state
    assert worker_graphs.adopt(config, [worker_graphs.worker_graph_state(executor.workers[0])]) \
        is False
    assert _pad_max_reqs(config) == 0


@pytest.mark.parametrize("vspec, device", [({"ascend_pad_verify_width": False}, "npu"),
                                           ({"enabled": False}, "npu"), ({}, "cpu")])
def test_nothing_is_asked_where_the_padding_decision_does_not_read_it(vspec, device):
    from vllm_ascend.vspec import worker_graphs

    _, executor = _engine([_support("UNIFORM_SINGLE_TOKEN_DECODE")] * 2, vspec, device)
    assert worker_graphs.worker_graph_state not in executor.rpc_calls


def test_the_weakest_state_is_the_first_without_full_decode_and_the_smallest_range():
    from vllm_ascend.vspec.worker_graphs import weakest

    full = {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [5, 40],
            "max_cudagraph_capture_size": 40}
    rounded = dict(full, cudagraph_capture_sizes=[5, 35], max_cudagraph_capture_size=35)
    piecewise = dict(full, cudagraph_mode="PIECEWISE")
    assert weakest([full, rounded]) == dict(full, max_cudagraph_capture_size=35)
    assert weakest([full, piecewise])["cudagraph_mode"] == "PIECEWISE"
    assert weakest([full]) == full


def test_install_extends_once_and_the_plugin_needs_the_overlay_wheel():
    from vllm.v1.executor.abstract import Executor

    from vllm_ascend.vspec import worker_graphs
    from vllm_vspec.hosts import ascend_wheel

    cls = _executor_cls()
    assert worker_graphs.install(cls) is True
    assert worker_graphs.install(cls) is False
    before = Executor.initialize_from_config
    assert ascend_wheel.build_info() is None   # a checkout: no overlay wheel installed
    ascend_wheel.adopt_worker_graphs()
    assert Executor.initialize_from_config is before
