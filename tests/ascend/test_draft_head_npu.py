"""The drafter's LM head options and diagnostics traces on the NPU path, on
its CPU twin (vLLM-Ascend needs torch_npu; nothing here runs on an NPU).

Spec:
- DraftLogitsTap (vllm_ascend/vspec/draft_head_tap.py) with the head
  npu_draft_head builds is what vLLM-Ascend's merged draft loop reads
  logits from: with an active vocabulary, the argmax
  of what it returns is the token the CPU path drafts (DraftHead's sorted
  ids, ties to the smaller id), every other column is -inf, across calls of
  changing row counts; without a restriction or int8 it is the host's own
  compute_logits.
- NpuInt8Matmul lays the int8 head out as torch_npu's kernels take it
  (weight [K, N], per-channel [N] or per-group [K/g, N] scales, per-token
  activation scales per block) and gives the dequantized reference's
  result, checked against a stand-in torch_npu that implements each op's
  documented contract and asserts its argument shapes and dtypes. Missing
  ops, float32 models and w8a16 groups that are not multiples of 32 stop
  start-up naming the key.
- The NPU proposers over a stand-in host whose merged draft loop drafts
  each position as `model.compute_logits(h).argmax(-1)`: a pure-greedy step
  drafts from the active vocabulary and a step with a sampled request from
  the full head; the entropy stop observes the head's logits (one tap); the
  four traces record
  a step as on CPU (the step's gamma and its drafts, without the invalid
  columns the NPU proposer pads its result with, the head, committed tokens
  with discarded rows empty, one IO record per draft pass, the target's
  hidden states). An active vocabulary with full draft graphs, tensor parallelism
  or LM-head TP is refused naming the key.
- wiring: the draft head and trace keys are accepted with vLLM-Ascend's
  worker and still refused with vLLM's stock worker.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from conftest import TokenBuffer as _Buffer
from test_overlay import _engine_config, _HostProposer, proposers  # noqa: F401 (fixture)
from vllm_vspec.core import active_vocab
from vllm_vspec.kernels import draft_head
from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.kernels.draft_head import DequantizedInt8Matmul, DraftHead, quantize_int8

VOCAB, HIDDEN = 32, 64
ACTIVE = [21, 5, 3, 0, 8, 13, 30]   # file order; the head sorts them


@pytest.fixture
def npu_host(monkeypatch):
    """vllm_ascend.utils as vLLM-Ascend 0.23 has it (only lmhead_tp_enable is read)."""
    utils = types.ModuleType("vllm_ascend.utils")
    utils.lmhead_tp = False
    utils.lmhead_tp_enable = lambda: utils.lmhead_tp
    monkeypatch.setitem(sys.modules, "vllm_ascend.utils", utils)
    return utils


@pytest.fixture
def tap_module(npu_host):
    import vllm_ascend.vspec.draft_head_tap as module

    return module


class _TinyDraft(torch.nn.Module):
    """A vLLM draft model's surface: forward(input_ids, positions,
    hidden_states), lm_head, logits_processor, compute_logits."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.lm_head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        self.lm_head.weight.data.copy_(weight)
        self.logits_processor = SimpleNamespace(org_vocab_size=VOCAB, scale=1.0, soft_cap=None)
        self.host_logits_calls = 0

    def forward(self, input_ids=None, positions=None, hidden_states=None):
        return torch.tanh(hidden_states.flip(-1) + 0.1 * input_ids.unsqueeze(-1))

    def compute_logits(self, hidden_states):
        self.host_logits_calls += 1
        return self.lm_head(hidden_states)


@pytest.fixture
def weight() -> torch.Tensor:
    torch.manual_seed(0)
    w = torch.randn(VOCAB, HIDDEN)
    # Ids 3 and 5 share an integer row: their logits are exactly equal (a
    # visible tie) and, for a hidden state along that row, the largest.
    w[3] = w[5] = torch.randint(-3, 4, (HIDDEN,)).float()
    return w


def _ids_file(tmp_path, ids=ACTIVE) -> str:
    path = tmp_path / "ids.json"
    active_vocab.write_ids(path, list(ids), [0], VOCAB, 100, "test")
    return str(path)


def _settings(**vspec) -> VSpecConfig:
    return VSpecConfig.from_dict(vspec, 4)


def _install(tap_module, proposer, settings):
    """The head tap of `proposer` (no observers), or None without a head."""
    head = tap_module.npu_draft_head(proposer, settings)
    return None if head is None else tap_module.DraftLogitsTap(proposer.model, head,
                                                               ()).install(proposer)


def _tap_proposer(weight, full_graph=False, tp=1):
    return SimpleNamespace(model=_TinyDraft(weight), use_cuda_graph=full_graph,
                           vllm_config=SimpleNamespace(
                               parallel_config=SimpleNamespace(tensor_parallel_size=tp)))


# ------------------------------------------------------------ the head tap
def test_tap_argmax_is_the_cpu_paths_draft_token(tap_module, weight, tmp_path):
    proposer = _tap_proposer(weight)
    tap = _install(
        tap_module, proposer, _settings(draft_active_vocab_ids=_ids_file(tmp_path)))
    assert proposer.model is tap and proposer.model.lm_head is tap.inner.lm_head
    tap.restricted = True
    for rows in (5, 2, 9):   # the kept full-width buffer shrinks and grows
        hidden = torch.randn(rows, HIDDEN)
        hidden[0] = weight[3] * 10   # ids 3 and 5 tie at the top
        got = tap.compute_logits(hidden)
        logits, ids = tap.head.logits(hidden, restricted=True)
        cpu_draft = DraftHead.to_full_ids(logits.argmax(-1), ids)
        assert got.shape == (rows, VOCAB)
        assert got.argmax(-1).tolist() == cpu_draft.tolist()
        assert got.argmax(-1)[0].item() == 3
        off = torch.ones(VOCAB, dtype=torch.bool)
        off[ACTIVE] = False
        assert torch.isinf(got[:, off]).all() and torch.isfinite(got[:, ~off]).all()
    assert tap.name == "active" and proposer.model.host_logits_calls == 0


def test_unrestricted_tap_defers_to_the_host(tap_module, weight, tmp_path):
    proposer = _tap_proposer(weight)
    tap = _install(
        tap_module, proposer, _settings(draft_active_vocab_ids=_ids_file(tmp_path)))
    hidden = torch.randn(3, HIDDEN)
    torch.testing.assert_close(tap.compute_logits(hidden), hidden @ weight.T)
    assert tap.name == "full" and tap.inner.host_logits_calls == 1
    assert _install(tap_module, _tap_proposer(weight), _settings()) is None


def test_int8_tap_returns_the_int8_heads_full_logits(tap_module, weight):
    proposer = _tap_proposer(weight, full_graph=True)   # int8 has no per-step choice
    tap = _install(
        tap_module, proposer, _settings(draft_lm_head_quantization="w8a8"))
    hidden = torch.randn(4, HIDDEN)
    want, _ = tap.head.logits(hidden, restricted=False)
    assert torch.equal(tap.compute_logits(hidden), want)
    assert tap.inner.host_logits_calls == 0


@pytest.mark.parametrize("full_graph, tp, lmhead_tp, key, needle", [
    (True, 1, False, "draft_active_vocab_ids", "ascend_draft_full_graph"),
    (False, 2, False, "draft_active_vocab_ids", "tensor_parallel_size 1"),
    (False, 1, True, "draft_active_vocab_ids", "LM-head tensor parallelism"),
])
def test_tap_refusals_name_the_key(tap_module, npu_host, weight, tmp_path, full_graph, tp,
                                   lmhead_tp, key, needle):
    npu_host.lmhead_tp = lmhead_tp
    with pytest.raises(VSpecConfigError) as err:
        _install(
            tap_module, _tap_proposer(weight, full_graph=full_graph, tp=tp),
            _settings(draft_active_vocab_ids=_ids_file(tmp_path)))
    assert err.value.key == key and needle in str(err.value)


# ------------------------------------------------------------ torch_npu's int8 kernels
def _fake_torch_npu(monkeypatch, drop=()):
    """torch_npu's three ops by their documented contracts (as vLLM-Ascend
    0.23's W8A16 / W8A8-dynamic linear methods call them), asserting the
    argument layout; `drop` leaves ops out."""
    npu = types.ModuleType("torch_npu")
    npu.__version__ = "stand-in"
    half = (torch.float16, torch.bfloat16)

    def npu_weight_quant_batchmatmul(x, weight, antiquant_scale, antiquant_offset=None,
                                     quant_scale=None, quant_offset=None, bias=None,
                                     antiquant_group_size=0):
        (m, k), (k2, n) = x.shape, weight.shape
        assert x.dtype in half and weight.dtype == torch.int8 and k == k2
        assert antiquant_scale.dtype == x.dtype
        if antiquant_group_size == 0:
            assert antiquant_scale.shape == (n,)
            deq = weight.float() * antiquant_scale.float()
        else:
            g = antiquant_group_size
            assert g % 32 == 0 and 32 <= g < k and antiquant_scale.shape == (k // g, n)
            deq = weight.float() * antiquant_scale.float().repeat_interleave(g, dim=0)
        return (x.float() @ deq).to(x.dtype)

    def npu_dynamic_quant(x):
        scale = x.float().abs().amax(-1) / 127
        q = torch.round(x.float() / scale.unsqueeze(-1)).clamp(-127, 127).to(torch.int8)
        return q, scale

    def npu_quant_matmul(x1, x2, scale, *, offset=None, pertoken_scale=None, bias=None,
                         output_dtype=None):
        (m, k), (k2, n) = x1.shape, x2.shape
        assert x1.dtype == x2.dtype == torch.int8 and k == k2
        assert scale.shape == (n,) and pertoken_scale.shape == (m,)
        assert pertoken_scale.dtype == torch.float32 and output_dtype in half
        acc = (x1.long() @ x2.long()).double()
        return (acc * scale.double() * pertoken_scale.double().unsqueeze(1)).to(output_dtype)

    for fn in (npu_weight_quant_batchmatmul, npu_dynamic_quant, npu_quant_matmul):
        if fn.__name__ not in drop:
            setattr(npu, fn.__name__, fn)
    monkeypatch.setitem(sys.modules, "torch_npu", npu)


@pytest.mark.parametrize("mode", ["w8a16", "w8a8"])
@pytest.mark.parametrize("group", [0, 32])
def test_npu_int8_kernels_give_the_reference_result(tap_module, monkeypatch, weight, mode, group):
    _fake_torch_npu(monkeypatch)
    assert draft_head.INT8_MATMULS["npu"] is tap_module.NpuInt8Matmul
    q, scales = quantize_int8(weight, group)
    x = torch.randn(6, HIDDEN).to(torch.bfloat16)
    got = tap_module.NpuInt8Matmul(q, scales, mode, torch.bfloat16)(x)
    want = DequantizedInt8Matmul(q, scales, mode, torch.bfloat16)(x)
    assert got.dtype == torch.bfloat16
    # w8a8 rounds each block's product to bfloat16 (the op's output dtype)
    # before the sum: within one bfloat16 step of outputs below 16.
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=0.0625)


@pytest.mark.parametrize("drop, mode, dtype, group, key, needle", [
    (("npu_quant_matmul",), "w8a8", torch.bfloat16, 0, "draft_lm_head_quantization",
     "torch_npu.npu_quant_matmul"),
    (("npu_weight_quant_batchmatmul",), "w8a16", torch.float16, 0,
     "draft_lm_head_quantization", "torch_npu.npu_weight_quant_batchmatmul"),
    ((), "w8a16", torch.float32, 0, "draft_lm_head_quantization", "float16 or bfloat16"),
    ((), "w8a16", torch.bfloat16, 16, "draft_lm_head_quant_group_size", "multiple of 32"),
])
def test_npu_int8_refusals_name_the_key(tap_module, monkeypatch, weight, drop, mode, dtype,
                                        group, key, needle):
    _fake_torch_npu(monkeypatch, drop)
    q, scales = quantize_int8(weight, group)
    with pytest.raises(VSpecConfigError) as err:
        tap_module.NpuInt8Matmul(q, scales, mode, dtype)
    assert err.value.key == key and needle in str(err.value)


# ------------------------------------------------------------ the NPU proposers
class _LoopHost(_HostProposer):
    """test_overlay's stand-in host with vLLM-Ascend 0.23's merged draft loop
    shape: each position's token is `self.model.compute_logits(h).argmax(-1)`
    of the draft model's output, fed back as the next input."""

    def load_model(self, model):
        self.model = _TinyDraft(self.vllm_config.draft_weight)
        super().load_model(model)

    def _run_merged_draft(self, batch_size):
        self.draft_passes.append(self.num_speculative_tokens)
        hidden, token = self._hidden[:batch_size], self._next[:batch_size]
        drafts = []
        for i in range(self.num_speculative_tokens):
            hidden = self.model(input_ids=token, positions=torch.full_like(token, i),
                                hidden_states=hidden)
            token = self.model.compute_logits(hidden).argmax(-1)
            drafts.append(token)
        return torch.stack(drafts, dim=1)

    def _propose(self, target_token_ids=None, target_positions=None, target_hidden_states=None,
                 next_token_ids=None, common_attn_metadata=None, sampling_metadata=None,
                 scheduler_output=None, num_rejected_tokens_gpu=None):
        self._hidden, self._next = target_hidden_states, next_token_ids
        return self._runnable(batch_size=common_attn_metadata.batch_size())


BATCH = 3


def _npu_proposer(proposers, weight, vspec):
    bases = proposers.VSpecEagleProposer.__bases__
    assert bases[:-1] == (proposers.StepGammaProposer,)
    cls = type("LoopProposer", bases[:-1] + (_LoopHost,), {})
    config = _engine_config("eagle", 4, vspec=vspec)
    config.full_graphs = vspec.get("ascend_draft_full_graph", False)
    config.draft_weight = weight
    config.parallel_config.tensor_parallel_size = 1
    runner = SimpleNamespace(max_num_reqs=8,
                             input_batch=SimpleNamespace(req_ids=["a", "b", "c"]))
    proposer = cls(config, torch.device("cpu"), runner=runner)
    proposer.load_model(model=None)
    proposer.backup_next_token_ids = _Buffer(8)
    return proposer


def _sampling(temperatures):
    t = torch.tensor(temperatures)
    return SimpleNamespace(all_greedy=bool((t == 0).all()), temperature=t,
                           max_num_logprobs=None, no_penalties=True,
                           allowed_token_ids_mask=None, bad_words_token_ids={})


def _step(proposer, gamma, temperatures, hidden, discard=()):
    """One verification commit and one draft step, as NPUModelRunner calls
    them; the step's drafted columns (the proposer may pad with invalid ones)."""
    sampled = torch.tensor([[7, 9, -1], [4, -1, -1], [2, 6, 11]], dtype=torch.int32)
    requests = {r: SimpleNamespace(get_token_id=lambda i: 1) for r in "abc"}
    batch = SimpleNamespace(num_reqs=BATCH, req_ids=list("abc"), vocab_size=VOCAB,
                            num_tokens_no_spec=[5] * BATCH)
    indices = torch.tensor(list(discard) + [0] * 4, dtype=torch.int32)
    next_token, _ = proposer.prepare_next_token_ids_padded(sampled, requests, batch, indices,
                                                           len(discard))
    cad = SimpleNamespace(batch_size=lambda: BATCH, num_reqs=BATCH,
                          query_start_loc=torch.arange(BATCH + 1, dtype=torch.int32))
    drafts = proposer._propose(
        target_token_ids=torch.arange(BATCH), target_positions=torch.arange(BATCH),
        target_hidden_states=hidden, next_token_ids=next_token.long(),
        common_attn_metadata=cad, sampling_metadata=_sampling(temperatures),
        scheduler_output=SimpleNamespace(num_spec_tokens_to_schedule=gamma),
        num_rejected_tokens_gpu=None)
    return drafts[:, :gamma]


def _host_drafts(weight, hidden, next_token, gamma, head=None):
    """The stand-in loop's drafts with the host's head, or with `head`
    restricted (DraftHead on the CPU path)."""
    model, token, out = _TinyDraft(weight), next_token, []
    for i in range(gamma):
        hidden = model(input_ids=token, positions=torch.full_like(token, i), hidden_states=hidden)
        if head is None:
            token = model.compute_logits(hidden).argmax(-1)
        else:
            logits, ids = head.logits(hidden, restricted=True)
            token = DraftHead.to_full_ids(logits.argmax(-1), ids)
        out.append(token)
    return torch.stack(out, dim=1)


def test_pure_greedy_steps_draft_from_the_active_vocabulary(proposers, npu_host, weight,
                                                            tmp_path):
    proposer = _npu_proposer(proposers, weight, {"draft_active_vocab_ids": _ids_file(tmp_path)})
    hidden = torch.randn(BATCH, HIDDEN)
    next_token = torch.tensor([9, 4, 11])   # the commit op's last valid tokens
    greedy = _step(proposer, 3, [0.0, 0.0, 0.0], hidden)
    head = proposer.drafting.tap.head
    assert greedy.tolist() == _host_drafts(weight, hidden, next_token, 3, head).tolist()
    assert set(greedy.flatten().tolist()) <= set(ACTIVE)
    assert proposer.drafting.head_in_use == "active"
    sampled = _step(proposer, 3, [0.0, 0.7, 0.0], hidden)
    assert sampled.tolist() == _host_drafts(weight, hidden, next_token, 3).tolist()
    assert proposer.drafting.head_in_use == "full" and sampled.tolist() != greedy.tolist()


def test_entropy_stop_observes_the_heads_logits(proposers, npu_host, weight, tmp_path):
    proposer = _npu_proposer(proposers, weight, {"draft_active_vocab_ids": _ids_file(tmp_path),
                                                 "entropy_stop": True})
    drafting = proposer.drafting
    assert type(proposer.model).__name__ == "DraftLogitsTap"   # one tap on the model
    assert drafting.tap.observers == (drafting.entropy,)
    drafting.tap.restricted = True
    drafting.new_pass()
    logits = proposer.model.compute_logits(torch.randn(BATCH, HIDDEN))
    off = torch.ones(VOCAB, dtype=torch.bool)
    off[ACTIVE] = False
    assert torch.isinf(logits[:, off]).all()                   # the active vocabulary's
    torch.testing.assert_close(drafting.entropy.entropy[0, :BATCH],
                               drafting.entropy.stop.entropy(logits))


def test_an_active_vocabulary_is_refused_with_full_draft_graphs(proposers, npu_host, weight,
                                                                tmp_path):
    with pytest.raises(VSpecConfigError) as err:
        _npu_proposer(proposers, weight, {"draft_active_vocab_ids": _ids_file(tmp_path),
                                          "ascend_draft_full_graph": True})
    assert err.value.key == "draft_active_vocab_ids"


def test_traces_record_a_step_as_on_cpu(proposers, npu_host, weight, tmp_path):
    from safetensors.torch import load_file

    from vllm_vspec.tools import traces

    paths = {"draft_trace_path": str(tmp_path / "draft.jsonl"),
             "target_argmax_trace_path": str(tmp_path / "argmax.jsonl"),
             "draft_io_trace_dir": str(tmp_path / "io"),
             "target_hidden_trace_dir": str(tmp_path / "hidden")}
    proposer = _npu_proposer(proposers, weight, {**paths,
                                                 "draft_active_vocab_ids": _ids_file(tmp_path)})
    hidden = torch.randn(BATCH, HIDDEN)
    drafts = _step(proposer, 2, [0.0, 0.5, 0.0], hidden, discard=[2])
    proposer.drafting.traces.tracer.close()
    (draft,) = traces.read_jsonl(paths["draft_trace_path"])
    assert (draft["gamma"], draft["head"]) == (2, "full")
    assert [r["draft"] for r in draft["requests"]] == drafts.tolist()
    (argmax,) = traces.read_jsonl(paths["target_argmax_trace_path"])
    assert [(r["id"], r["greedy"], r["tokens"]) for r in argmax["requests"]] == [
        ("a", True, [7, 9]), ("b", False, [4]), ("c", True, [])]   # c discarded
    io = load_file(str(tmp_path / "io" / "step-000001.safetensors"))
    assert sorted(k for k in io if k.endswith(".hidden_states")) == [
        "pass0.hidden_states", "pass1.hidden_states"]
    assert torch.equal(io["draft_token_ids"], drafts)
    target = load_file(str(tmp_path / "hidden" / "step-000001.safetensors"))
    assert torch.equal(target["hidden_states"], hidden)
    assert sorted(target) == ["hidden_states", "next_token_ids", "positions",
                              "query_start_loc", "token_ids"]


# ------------------------------------------------------------ wiring
@pytest.mark.parametrize("key, value", [
    ("draft_lm_head_quantization", "w8a16"), ("draft_trace_path", "d.jsonl"),
    ("draft_active_vocab_ids", "ids.json")])
def test_drafter_keys_run_on_vllm_ascends_worker_only_among_non_vspec_workers(key, value,
                                                                              tmp_path):
    from conftest import engine_config

    from vllm_vspec.hosts import wiring

    if key != "draft_lm_head_quantization":
        # the config checks files before an engine starts: give it real ones
        value = str(tmp_path / value)
        if key == "draft_active_vocab_ids":
            active_vocab.write_ids(value, [0, 1, 2], [0], 2048, 3, "test")

    assert getattr(wiring.resolve(_engine_config("eagle", 4, vspec={key: value})), key) == value
    stock = engine_config("eagle", 4, {key: value}, worker_cls="vllm.v1.worker.cpu_worker.CPUWorker")
    with pytest.raises(VSpecConfigError) as err:
        wiring.resolve(stock)
    assert err.value.key == key and "--worker-cls" in str(err.value)
