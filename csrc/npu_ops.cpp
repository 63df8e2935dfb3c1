// NPU (PrivateUse1) implementations of the vspec ops: argument checks shared
// with the CPU reference, then one AscendC kernel launch on the current NPU
// stream. Built only when CANN is present; not yet compiled or run on NPU.
#include <torch/library.h>

#include <algorithm>

#include "aclrtlaunch_vspec_commit_accepted.h"
#include "aclrtlaunch_vspec_uniform_spec_metadata.h"
#include "ops.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"

namespace vspec {
namespace {

// One request per core up to this many cores; more requests share cores.
constexpr int64_t kMaxCores = 40;

uint32_t cores_for(int64_t batch) {
  return static_cast<uint32_t>(std::max<int64_t>(1, std::min(batch, kMaxCores)));
}

std::tuple<at::Tensor, at::Tensor> uniform_spec_metadata_npu(const at::Tensor& seq_lens,
                                                             int64_t gamma) {
  check_gamma(gamma);
  TORCH_CHECK(seq_lens.dim() == 1 && seq_lens.scalar_type() == at::kInt,
              "seq_lens must be int32 [B], got ", seq_lens.scalar_type(), " ", seq_lens.sizes());
  const int64_t batch = seq_lens.size(0);
  auto lens = seq_lens.contiguous();
  auto query_start_loc = at::empty({batch + 1}, lens.options());
  auto positions = at::empty({batch * (1 + gamma)}, lens.options());
  auto stream = c10_npu::getCurrentNPUStream().stream();
  ACLRT_LAUNCH_KERNEL(vspec_uniform_spec_metadata)
  (cores_for(batch), stream, lens.data_ptr(), query_start_loc.data_ptr(), positions.data_ptr(),
   static_cast<int32_t>(batch), static_cast<int32_t>(gamma));
  return {query_start_loc, positions};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> commit_accepted_npu(const at::Tensor& sampled,
                                                                   const at::Tensor& seq_lens) {
  check_commit_args(sampled, seq_lens);
  const int64_t batch = sampled.size(0);
  auto ids = sampled.contiguous();
  auto lens = seq_lens.contiguous();
  auto num_accepted = at::empty({batch}, lens.options());
  auto next_token = at::empty({batch}, ids.options());
  auto new_seq_lens = at::empty({batch}, lens.options());
  auto stream = c10_npu::getCurrentNPUStream().stream();
  ACLRT_LAUNCH_KERNEL(vspec_commit_accepted)
  (cores_for(batch), stream, ids.data_ptr(), lens.data_ptr(), num_accepted.data_ptr(),
   next_token.data_ptr(), new_seq_lens.data_ptr(), static_cast<int32_t>(batch),
   static_cast<int32_t>(ids.size(1)));
  return {num_accepted, next_token, new_seq_lens};
}

}  // namespace
}  // namespace vspec

TORCH_LIBRARY_IMPL(vspec, PrivateUse1, m) {
  m.impl("uniform_spec_metadata", &vspec::uniform_spec_metadata_npu);
  m.impl("commit_accepted", &vspec::commit_accepted_npu);
}
