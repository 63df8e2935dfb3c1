// vspec custom ops: one schema, one set of argument checks, three backends.
//
//   CPU          cpu_ops.cpp (the reference; CI runs it on the engine's hot path)
//   PrivateUse1  npu_ops.cpp + kernels/*.cpp (AscendC; not yet run on NPU)
//   CUDA         cpu_ops.cpp's ATen composites (tensor ops on the device; not
//                run on a GPU)
//   Meta / fake  vllm_vspec/kernels/ops.py (torch.library.register_fake: shapes only,
//                so an op can sit inside a captured graph)
//
// Every wrapper calls the same check_* functions below before it touches
// data, so CPU and NPU accept and refuse exactly the same arguments. The
// checks read only metadata (dtype, shape), never values: a value check on
// the NPU would force a device-to-host sync on the hot path. Instead every op
// defines its result for ANY values (e.g. "the leading run of valid ids"),
// and both backends compute that definition.
//
// ---------------------------------------------------------------------------
// vspec::commit_accepted(Tensor sampled, Tensor discard, Tensor backup,
//                        int vocab_size) -> (Tensor num_valid, Tensor next_token)
//   What a verification step commits, per request: the drafter's
//   prepare_next_token_ids_padded (vLLM 0.32 and vLLM-Ascend 0.23 both have
//   it) computes exactly this, and vspec's proposers call this op there.
//     sampled  int32 [B, W], 1 <= W <= kMaxCommitWidth: the rejection
//              sampler's output, -1 after the first rejected position
//     discard  bool  [B]: requests whose sampled tokens do not count (a
//              partial prefill chunk)
//     backup   int32 [B]: the token to continue from when a row commits nothing
//   Per request b, with valid(x) = 0 <= x < vocab_size:
//     num_valid[b]  = 0 if discard[b], else the length of the leading run of
//                     valid ids in sampled[b] (the accepted drafts + 1 bonus)
//     next_token[b] = sampled[b, num_valid[b] - 1] if num_valid[b] > 0,
//                     else backup[b]
//   A row of -1 (or a discarded row) is therefore not an error: it commits
//   nothing and continues from its backup token, the hosts' own rule.
//   Outputs are int32 [B].
//
// vspec::tree_commit(Tensor path, Tensor target_tokens, Tensor slots,
//                    Tensor seq_lens)
//       -> (Tensor new_seq_lens, Tensor next_token, Tensor src_slots,
//           Tensor dst_slots)
//   Commit of a verified draft TREE. A request's tree of N nodes is laid out
//   in topological order (a node's parent has a smaller index); node 0 is the
//   root, the last committed token, at position seq_lens[b]. Verification
//   wrote node i's KV to slots[b, i] (the slots of positions seq_lens[b] + i)
//   and sampled the target's token after node i, target_tokens[b, i].
//     path           int32 [B, D], 1 <= D <= kMaxCommitWidth: the accepted
//                    path, root first, padded with -1
//     target_tokens  int32 [B, N], 1 <= N <= kMaxTreeNodes
//     slots          int64 [B, N] (vLLM's slot mapping dtype)
//     seq_lens       int32 [B]
//   Per request b, L[b] = the length of the leading run of path[b] that is a
//   root path: path[b, 0] == 0, then each entry greater than the one before
//   and < N (so -1 padding, an out-of-range or a non-increasing entry ends it).
//     new_seq_lens[b]  = seq_lens[b] + L[b]      (root + accepted drafts)
//     next_token[b]    = target_tokens[b, path[b, L[b] - 1]] if L[b] > 0,
//                        else -1 (the bonus token, not yet in the KV cache)
//     src_slots[b, j], dst_slots[b, j] for j < L[b] and path[b, j] != j:
//                        slots[b, path[b, j]] and slots[b, j]; otherwise -1.
//   The caller moves KV from src to dst for every pair that is not -1. The
//   moves are NOT independent: a destination can be an earlier pair's source
//   (path 0, 2, 4 gives 2 -> 1 and 4 -> 2). Since path[b, j] >= j, moving in
//   increasing j, or reading every source before writing any destination
//   (what TreeCPUAttentionBackend.move_slots does), is correct; an unordered
//   parallel in-place move is not.
//   Outputs: int32 [B], int32 [B], int64 [B, D], int64 [B, D].
#pragma once

#include <ATen/ATen.h>

#include <tuple>

namespace vspec {

// Widest sampled row / deepest accepted path the commit ops take; it bounds
// one row's footprint in the NPU kernels' on-chip tiles (64 x 8 bytes).
constexpr int64_t kMaxCommitWidth = 64;
// Most nodes of one request's draft tree (bounds a row's UB footprint, as above).
constexpr int64_t kMaxTreeNodes = 1024;

std::tuple<at::Tensor, at::Tensor> commit_accepted_cpu(const at::Tensor& sampled,
                                                       const at::Tensor& discard,
                                                       const at::Tensor& backup,
                                                       int64_t vocab_size);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_commit_cpu(
    const at::Tensor& path, const at::Tensor& target_tokens, const at::Tensor& slots,
    const at::Tensor& seq_lens);

// Shared argument checks (metadata only): the error names the argument, its
// value and what is allowed.
void check_commit_accepted_args(const at::Tensor& sampled, const at::Tensor& discard,
                                const at::Tensor& backup, int64_t vocab_size);
void check_tree_commit_args(const at::Tensor& path, const at::Tensor& target_tokens,
                            const at::Tensor& slots, const at::Tensor& seq_lens);

}  // namespace vspec
