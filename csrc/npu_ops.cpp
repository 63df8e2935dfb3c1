// NPU (PrivateUse1) implementations of the vspec ops: the argument checks
// shared with every backend (cpu_ops.cpp), the launch geometry, then one
// AscendC kernel launch queued through torch_npu's OpCommand, the pattern
// vLLM-Ascend's own ops use (csrc/torch_binding.cpp lines 390-419:
// `OpCommand cmd; cmd.Name(...); cmd.SetCustomHandler(lambda); cmd.Run();`).
// The handler runs in torch_npu's task-queue order, so the launch is not a
// direct call beside the queue and the current stream is read inside it
// with `stream(false)`, as the host's aclnn adapter reads it
// (csrc/aclnn_torch_adapter/op_api_common.h line 701): no drain of the
// queue, where a bare `stream()` empties it first, a host stall per call. The handler holds the tensors by value, so
// they outlive the queued launch. Built only when CANN is present; not yet
// compiled or run on NPU (tests/test_ops.py checks its syntax against
// declaration stubs of the torch_npu/ACL headers, not a CANN build).
//
// Launch geometry (what the kernels assume, vspec_kernel.h): rows are split
// over the device's AI vector cores in ranges of a multiple of kRowAlign rows
// (32-byte aligned starts in every tensor), and each core walks its range in
// tiles that fit the UB budget twice (double buffering). The core count is
// the device's (ACL_DEVICE_INFO_VECTOR_CORE_NUM, as vLLM-Ascend's own
// csrc/torch_binding.cpp asks for it), not a constant.
#include <acl/acl.h>
#include <torch/library.h>

#include <algorithm>

#include "aclrtlaunch_vspec_commit_accepted.h"
#include "aclrtlaunch_vspec_tree_commit.h"
#include "ops.h"
#include "torch_npu/csrc/core/npu/NPUStream.h"
#include "torch_npu/csrc/framework/OpCommand.h"

namespace vspec {
namespace {

constexpr int64_t kRowAlign = 32;       // vspec_kernel.h kRowAlign
constexpr int64_t kBufferNum = 2;       // vspec_kernel.h kBufferNum
constexpr int64_t kMaxTileRows = 256;
// UB bytes the kernels may fill (a 910B core has 192 KiB; the rest stays
// free for the runtime and for each buffer's round-up to 32 bytes).
constexpr int64_t kUbBudget = 160 * 1024;

int64_t vector_cores(const at::Tensor& t) {
  int64_t cores = 0;
  TORCH_CHECK(aclGetDeviceCapability(t.device().index(), ACL_DEVICE_INFO_VECTOR_CORE_NUM,
                                     &cores) == ACL_SUCCESS && cores > 0,
              "vspec: cannot read the vector core count of ", t.device());
  return cores;
}

struct Geometry {
  uint32_t blocks;        // cores launched (>= 1, also for batch 0)
  int32_t rows_per_core;  // multiple of kRowAlign
  int32_t tile_rows;      // rows per UB tile
};

// `row_bytes`: UB bytes one row needs across all of a kernel's queues.
Geometry geometry(const at::Tensor& t, int64_t batch, int64_t row_bytes) {
  const int64_t cores = vector_cores(t);
  const int64_t per_core = std::max<int64_t>(
      kRowAlign, (batch + cores - 1) / cores + kRowAlign - 1) / kRowAlign * kRowAlign;
  const int64_t fit = kUbBudget / (kBufferNum * row_bytes);
  TORCH_CHECK(fit >= 1, "vspec: one row needs ", kBufferNum * row_bytes,
              " bytes of UB, more than the kernels' budget of ", kUbBudget);
  const int64_t tile = std::min({kMaxTileRows, per_core, fit});
  const int64_t blocks = std::max<int64_t>(1, (batch + per_core - 1) / per_core);
  return {static_cast<uint32_t>(blocks), static_cast<int32_t>(per_core),
          static_cast<int32_t>(tile >= kRowAlign ? tile / kRowAlign * kRowAlign : tile)};
}

std::tuple<at::Tensor, at::Tensor> commit_accepted_npu(const at::Tensor& sampled,
                                                       const at::Tensor& discard,
                                                       const at::Tensor& backup,
                                                       int64_t vocab_size) {
  check_commit_accepted_args(sampled, discard, backup, vocab_size);
  const int64_t batch = sampled.size(0);
  const int64_t width = sampled.size(1);
  auto ids = sampled.contiguous();
  auto skip = discard.contiguous();
  auto fallback = backup.contiguous();
  auto num_valid = at::empty({batch}, ids.options());
  auto next_token = at::empty({batch}, ids.options());
  if (batch == 0) return {num_valid, next_token};
  const Geometry g = geometry(ids, batch, width * 4 + 1 + 4 + 4 + 4);
  at_npu::native::OpCommand cmd;
  cmd.Name("vspec_commit_accepted");
  cmd.SetCustomHandler([ids, skip, fallback, num_valid, next_token, g, batch, width,
                        vocab_size]() -> int {
    ACLRT_LAUNCH_KERNEL(vspec_commit_accepted)
    (g.blocks, c10_npu::getCurrentNPUStream().stream(false), ids.data_ptr(), skip.data_ptr(),
     fallback.data_ptr(), num_valid.data_ptr(), next_token.data_ptr(),
     static_cast<int32_t>(batch), static_cast<int32_t>(width), static_cast<int32_t>(vocab_size),
     g.rows_per_core, g.tile_rows);
    return 0;
  });
  cmd.Run();
  return {num_valid, next_token};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> tree_commit_npu(
    const at::Tensor& path, const at::Tensor& target_tokens, const at::Tensor& slots,
    const at::Tensor& seq_lens) {
  check_tree_commit_args(path, target_tokens, slots, seq_lens);
  const int64_t batch = path.size(0);
  const int64_t depth = path.size(1);
  const int64_t nodes = target_tokens.size(1);
  auto p = path.contiguous();
  auto tok = target_tokens.contiguous();
  auto slot = slots.contiguous();
  auto lens = seq_lens.contiguous();
  auto new_seq_lens = at::empty({batch}, lens.options());
  auto next_token = at::empty({batch}, tok.options());
  auto src_slots = at::empty({batch, depth}, slot.options());
  auto dst_slots = at::empty({batch, depth}, slot.options());
  if (batch == 0) return {new_seq_lens, next_token, src_slots, dst_slots};
  const Geometry g = geometry(p, batch, depth * 4 + nodes * 4 + nodes * 8 + 4 + 4 + 4 +
                                            depth * 8 * 2);
  at_npu::native::OpCommand cmd;
  cmd.Name("vspec_tree_commit");
  cmd.SetCustomHandler([p, tok, slot, lens, new_seq_lens, next_token, src_slots, dst_slots, g,
                        batch, depth, nodes]() -> int {
    ACLRT_LAUNCH_KERNEL(vspec_tree_commit)
    (g.blocks, c10_npu::getCurrentNPUStream().stream(false), p.data_ptr(), tok.data_ptr(),
     slot.data_ptr(), lens.data_ptr(), new_seq_lens.data_ptr(), next_token.data_ptr(),
     src_slots.data_ptr(), dst_slots.data_ptr(), static_cast<int32_t>(batch),
     static_cast<int32_t>(depth), static_cast<int32_t>(nodes), g.rows_per_core, g.tile_rows);
    return 0;
  });
  cmd.Run();
  return {new_seq_lens, next_token, src_slots, dst_slots};
}

}  // namespace
}  // namespace vspec

TORCH_LIBRARY_IMPL(vspec, PrivateUse1, m) {
  m.impl("commit_accepted", &vspec::commit_accepted_npu);
  m.impl("tree_commit", &vspec::tree_commit_npu);
}
