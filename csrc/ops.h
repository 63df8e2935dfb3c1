// vspec custom ops: one schema, two implementations (not yet run on NPU).
//
//   vspec::uniform_spec_metadata(Tensor seq_lens, int gamma)
//       -> (Tensor query_start_loc, Tensor positions)
//     Verification metadata of a uniform decode step where every request
//     verifies 1 + gamma tokens (its last committed token and gamma drafts):
//       query_start_loc[b] = b * (1 + gamma),            b in [0, B]
//       positions[b * (1 + gamma) + j] = seq_lens[b] + j, j in [0, gamma]
//     seq_lens: int32 [B], tokens already in the KV cache of request b.
//
//   vspec::commit_accepted(Tensor sampled, Tensor seq_lens)
//       -> (Tensor num_accepted, Tensor next_token, Tensor new_seq_lens)
//     Commit of one verification step. sampled: int64 [B, 1 + gamma], the
//     rejection sampler's output, -1 after the first rejection. Per request:
//       num_accepted[b] = length of the leading run of ids >= 0 (>= 1: the
//                         bonus / recovered token always commits)
//       next_token[b]   = sampled[b, num_accepted[b] - 1]
//       new_seq_lens[b] = seq_lens[b] + num_accepted[b]
//
// The CPU implementation (cpu_ops.cpp) is the reference; the AscendC kernels
// (kernels/*.cpp, dispatched for PrivateUse1 in npu_ops.cpp) must match it.
// Invariant for both: 1 + gamma <= 16 (FIA verifies at most 16 query tokens).
#pragma once

#include <torch/torch.h>

#include <tuple>

namespace vspec {

constexpr int64_t kMaxVerifyWidth = 16;

std::tuple<at::Tensor, at::Tensor> uniform_spec_metadata_cpu(const at::Tensor& seq_lens,
                                                             int64_t gamma);

std::tuple<at::Tensor, at::Tensor, at::Tensor> commit_accepted_cpu(const at::Tensor& sampled,
                                                                   const at::Tensor& seq_lens);

// Shared argument checks: the error names the argument, its value and what is allowed.
void check_gamma(int64_t gamma);
void check_commit_args(const at::Tensor& sampled, const at::Tensor& seq_lens);

}  // namespace vspec
