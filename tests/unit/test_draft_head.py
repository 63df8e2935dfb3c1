"""The draft LM head maths, active-vocabulary files and diagnostics trace
reading (no engine).

Spec:
- quantize_int8 is symmetric per row and block: every weight is within half
  a scale step of its dequantized value, and a block's largest weight maps to
  +-127.
- Int8Linear computes exactly the dequantized formula: w8a16 is x @ deq(W).T,
  w8a8 is deq(q(x)) @ deq(W).T; torch's CPU int8 kernels and the portable
  float formula agree, and the device's kernel comes from INT8_MATMULS.
- DraftHead with active ids scores only those rows (kept sorted) and its
  argmax maps back to the full id, which is the full head's argmax
  restricted to the ids.
- build_ids keeps specials first, then falling frequency (ties by id), and
  `size` ids in all, completed with unseen ids (smallest first) only when
  asked; load_ids rejects files for another vocabulary, foreign
  formats and sizes beyond the file, naming the key.
- The new vspec keys validate by name; target_active_vocab_ids is refused
  with the reason.
- `trace summarize` and `trace active-vocab` read the trace formats of
  diagnostics.py.
"""

from __future__ import annotations

import collections
import json

import pytest
import torch

from conftest import TARGET
from vllm_vspec.core import active_vocab
from vllm_vspec.hosts import diagnostics
from vllm_vspec.tools import traces
from vllm_vspec.config import VSpecConfig, VSpecConfigError
from vllm_vspec.kernels.draft_head import (INT8_MATMULS, CpuInt8Matmul, DequantizedInt8Matmul,
                                   DraftHead, Int8Linear, dequantize_int8, quantize_int8)


@pytest.fixture
def weight() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(96, 64)


@pytest.mark.parametrize("group", [0, 16])
def test_quantize_int8_is_within_half_a_step(weight, group):
    q, scales = quantize_int8(weight, group)
    blocks = scales.shape[1]
    assert q.dtype == torch.int8 and blocks == (1 if group == 0 else 64 // group)
    step = scales.repeat_interleave(64 // blocks, dim=1)
    assert ((weight - dequantize_int8(q, scales)).abs() <= step / 2 + 1e-6).all()
    assert (q.reshape(96, blocks, -1).abs().amax(-1) == 127).all()


def test_quantize_int8_rejects_a_group_that_does_not_divide(weight):
    with pytest.raises(ValueError, match="does not divide"):
        quantize_int8(weight, 48)


@pytest.mark.parametrize("group", [0, 32])
def test_w8a16_is_the_dequantized_matmul(weight, group):
    x = torch.randn(5, 64)
    lin = Int8Linear(weight, None, "w8a16", group)
    want = x @ dequantize_int8(lin.q, lin.scales).T
    torch.testing.assert_close(lin(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("group", [0, 32])
def test_w8a8_is_the_matmul_of_both_dequantized(weight, group):
    x = torch.randn(5, 64)
    lin = Int8Linear(weight, None, "w8a8", group)
    xq, xs = quantize_int8(x, group)
    want = dequantize_int8(xq, xs) @ dequantize_int8(lin.q, lin.scales).T
    torch.testing.assert_close(lin(x), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["w8a16", "w8a8"])
def test_cpu_int8_kernels_match_the_portable_formula(weight, mode):
    x = torch.randn(7, 64)
    bias = torch.randn(96)
    fast = Int8Linear(weight, bias, mode, 16)
    portable = Int8Linear(weight, bias, mode, 16, matmul=DequantizedInt8Matmul)
    assert isinstance(fast.matmul, CpuInt8Matmul) and INT8_MATMULS["cpu"] is CpuInt8Matmul
    torch.testing.assert_close(fast(x), portable(x), rtol=1e-4, atol=1e-4)


def test_active_head_maps_its_argmax_back_to_full_ids(weight):
    hidden = torch.randn(20, 64)
    ids = torch.tensor([90, 3, 41, 7, 64, 12])
    head = DraftHead(weight, active_ids=ids)
    logits, got_ids = head.logits(hidden, restricted=True)
    assert logits.shape == (20, 6) and got_ids.tolist() == sorted(ids.tolist())
    full = hidden @ weight.T
    want = ids[full[:, ids].argmax(-1)]
    assert torch.equal(DraftHead.to_full_ids(logits.argmax(-1), got_ids), want)


def test_head_defers_to_the_host_when_it_adds_nothing(weight):
    head = DraftHead(weight, active_ids=torch.tensor([1, 2]))
    assert head.logits(torch.randn(2, 64), restricted=False) is None
    quantized = DraftHead(weight, quantization="w8a16")
    logits, ids = quantized.logits(torch.randn(2, 64), restricted=True)
    assert logits.shape == (2, 96) and ids is None


def test_active_ids_must_be_in_the_vocabulary(weight):
    with pytest.raises(ValueError, match=r"\[0, 96\)"):
        DraftHead(weight, active_ids=torch.tensor([5, 96]))


# ------------------------------------------------------------ ids files
def test_build_ids_keeps_specials_then_frequency():
    counts = collections.Counter({5: 9, 7: 9, 2: 4, 0: 50, 9: 1})
    assert active_vocab.build_ids(counts, [0, 1], 4) == [0, 1, 5, 7]
    assert active_vocab.build_ids(counts, [1, 1], 10) == [1, 0, 5, 7, 2, 9]
    assert active_vocab.build_ids(counts, [3, 4, 6], 2) == [3, 4, 6]


def test_build_ids_fills_with_unseen_ids_only_when_asked():
    counts = collections.Counter({5: 9, 2: 4})
    assert active_vocab.build_ids(counts, [0], 6) == [0, 5, 2]
    assert active_vocab.build_ids(counts, [0], 6, fill_from=16) == [0, 5, 2, 1, 3, 4]


def write_ids_file(tmp_path, ids=(0, 5, 7, 2), vocab=16):
    path = tmp_path / "ids.json"
    active_vocab.write_ids(path, list(ids), [0], vocab, 10, "test")
    return path


def test_load_ids_takes_the_first_n(tmp_path):
    path = write_ids_file(tmp_path)
    assert active_vocab.load_ids(path, 0, 16) == [0, 5, 7, 2]
    assert active_vocab.load_ids(path, 2, 16) == [0, 5]


@pytest.mark.parametrize("size, vocab, key, needle", [
    (5, 16, "draft_active_vocab_size", "at most the 4 ids"),
    (0, 32, "draft_active_vocab_ids", "32-token vocabulary"),
])
def test_load_ids_rejects_by_key(tmp_path, size, vocab, key, needle):
    path = write_ids_file(tmp_path)
    with pytest.raises(VSpecConfigError) as err:
        active_vocab.load_ids(path, size, vocab)
    assert err.value.key == key and needle in str(err.value)


def test_load_ids_rejects_a_foreign_file(tmp_path):
    path = tmp_path / "ids.json"
    path.write_text(json.dumps([1, 2, 3]))
    with pytest.raises(VSpecConfigError, match="vllm-vspec trace active-vocab"):
        active_vocab.load_ids(path, 0, 16)


# ------------------------------------------------------------ config keys
@pytest.mark.parametrize("raw, key", [
    ({"draft_lm_head_quantization": "int4"}, "draft_lm_head_quantization"),
    ({"draft_lm_head_quant_group_size": -1}, "draft_lm_head_quant_group_size"),
    ({"draft_active_vocab_size": 10}, "draft_active_vocab_size"),
    ({"target_active_vocab_ids": "ids.json"}, "target_active_vocab_ids"),
])
def test_bad_draft_head_settings_name_the_key(raw, key):
    with pytest.raises(VSpecConfigError) as err:
        VSpecConfig.from_dict(raw)
    assert err.value.key == key


def test_target_active_vocab_is_refused_as_lossy():
    with pytest.raises(VSpecConfigError, match="lossy"):
        VSpecConfig.from_dict({"target_active_vocab_ids": "ids.json"})


# ------------------------------------------------------------ trace reading
def argmax_trace(tmp_path):
    path = tmp_path / "argmax.jsonl"
    tracer = diagnostics.Tracer(diagnostics.TraceOptions(target_argmax_trace_path=str(path)))
    tracer.begin_step()
    tracer.target_argmax(["a", "b"], [[5, 5, 7], [9]], [True, False])
    tracer.begin_step()
    tracer.target_argmax(["a", "b"], [[7], []], [True, False])
    tracer.close()
    return path


def test_greedy_token_counts_skip_sampled_requests(tmp_path):
    assert traces.greedy_token_counts(argmax_trace(tmp_path)) == {5: 2, 7: 2}


def test_summarize_argmax_trace(tmp_path):
    s = traces.summarize(argmax_trace(tmp_path), top=1)
    assert (s["kind"], s["steps"], s["tokens"], s["greedy_tokens"]) == ("target_argmax", 2, 5, 4)
    assert s["top_ids"] == [[5, 2]]


def test_summarize_draft_trace_and_tensor_dir(tmp_path):
    opts = diagnostics.TraceOptions(draft_trace_path=str(tmp_path / "d.jsonl"),
                                    draft_io_trace_dir=str(tmp_path / "io"))
    tracer = diagnostics.Tracer(opts)
    for gamma in (2, 0):
        tracer.begin_step()
        tracer.draft(["a", "b"], torch.zeros(2, gamma, dtype=torch.long), 1.5, "active")
        tracer.draft_io({"pass0.input_ids": torch.arange(3)})
    tracer.close()
    s = traces.summarize(tmp_path / "d.jsonl")
    assert s["steps_per_gamma"] == {0: 1, 2: 1}
    assert (s["drafted_tokens"], s["steps_per_head"], s["draft_ms_mean"]) == (4, {"active": 2}, 1.5)
    d = traces.summarize(tmp_path / "io")
    assert (d["kind"], d["steps"], d["first_step_tensors"]) == (
        diagnostics.DRAFT_IO_FORMAT, 2, {"pass0.input_ids": [3]})


def test_summarize_rejects_other_files(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text('{"step": 1}\n')
    with pytest.raises(ValueError, match="not a vspec diagnostics trace"):
        traces.summarize(path)


def test_active_vocab_command_writes_an_ids_file(tmp_path):
    from vllm_vspec.cli import main

    out = tmp_path / "ids.json"
    assert main(["trace", "active-vocab", str(argmax_trace(tmp_path)), "--target", str(TARGET),
                 "--size", "4", "-o", str(out)]) == 0
    raw = json.loads(out.read_text())
    specials = raw["special_ids"]
    assert raw["vocab_size"] == 2048 and specials
    assert raw["ids"] == active_vocab.build_ids(collections.Counter({5: 2, 7: 2}), specials, 4)
    assert main(["trace", "active-vocab", str(argmax_trace(tmp_path)), "--target", str(TARGET),
                 "--size", "40", "--fill-unseen", "-o", str(out)]) == 0
    assert len(json.loads(out.read_text())["ids"]) == 40


# ----------------------------------------------------------- bench draft-head
def test_bench_collects_and_measures_on_disjoint_mixed_prompts():
    from vllm_vspec.commands.draft_head_bench import PROMPT_FILES, split_prompts

    collect, held_out = split_prompts(48)
    assert len(collect) == len(held_out) == 48 and not set(collect) & set(held_out)
    files = [{json.loads(line)["prompt"] for line in f.read_text().splitlines() if line.strip()}
             for f in PROMPT_FILES]
    for half in (collect[:4], held_out[:4]):   # every prefix holds code and prose
        assert all(any(p in texts for p in half) for texts in files)


def test_bench_counts_the_rank_one_token_of_each_prompt_position():
    from types import SimpleNamespace

    from vllm_vspec.commands.draft_head_bench import prompt_argmax_counts

    def lp(rank):
        return SimpleNamespace(rank=rank)

    # Each position: the prompt token (any rank) and the argmax (rank 1).
    out = SimpleNamespace(prompt_logprobs=[None, {7: lp(3), 4: lp(1)}, {9: lp(1)},
                                           {4: lp(1), 2: lp(2)}])
    llm = SimpleNamespace(generate=lambda prompts, params, use_tqdm: [out] * len(prompts))
    assert prompt_argmax_counts(llm, ["a", "b"]) == {4: 4, 9: 2}
