// AscendC kernel: vspec::tree_commit (semantics in ../ops.h; the CPU
// reference in ../cpu_ops.cpp is the spec). Not yet compiled or run on NPU.
// Work split, tiling and synchronisation: vspec_kernel.h. The host sizes
// `tile_rows` so that one tile of every input and output fits the UB budget
// twice (kBufferNum) whatever the tree size N.
#include "vspec_kernel.h"

using namespace AscendC;
using vspec_kernel::InitQueue;
using vspec_kernel::kBufferNum;
using vspec_kernel::LoadTile;
using vspec_kernel::StoreTile;

class TreeCommit {
 public:
  __aicore__ inline TreeCommit() {}

  __aicore__ inline void Init(GM_ADDR path, GM_ADDR target_tokens, GM_ADDR slots,
                              GM_ADDR seq_lens, GM_ADDR new_seq_lens, GM_ADDR next_token,
                              GM_ADDR src_slots, GM_ADDR dst_slots, int32_t batch, int32_t depth,
                              int32_t nodes, int32_t rows_per_core, int32_t tile_rows) {
    const vspec_kernel::RowRange range = vspec_kernel::CoreRows(batch, rows_per_core);
    const int32_t b = range.begin;
    rows_ = range.rows;
    depth_ = depth;
    nodes_ = nodes;
    tile_rows_ = tile_rows;
    path_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(path) + b * depth);
    tokens_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(target_tokens) + b * nodes);
    slots_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(slots) + b * nodes);
    lens_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq_lens) + b);
    new_lens_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(new_seq_lens) + b);
    next_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(next_token) + b);
    src_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(src_slots) + b * depth);
    dst_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(dst_slots) + b * depth);
    InitQueue<int32_t>(pipe_, path_in_, tile_rows * depth);
    InitQueue<int32_t>(pipe_, tokens_in_, tile_rows * nodes);
    InitQueue<int64_t>(pipe_, slots_in_, tile_rows * nodes);
    InitQueue<int32_t>(pipe_, lens_in_, tile_rows);
    InitQueue<int32_t>(pipe_, new_lens_out_, tile_rows);
    InitQueue<int32_t>(pipe_, next_out_, tile_rows);
    InitQueue<int64_t>(pipe_, src_out_, tile_rows * depth);
    InitQueue<int64_t>(pipe_, dst_out_, tile_rows * depth);
  }

  __aicore__ inline void Process() {
    for (int32_t first = 0; first < rows_; first += tile_rows_) {
      const int32_t rows = vspec_kernel::TileRows(first, rows_, tile_rows_);
      CopyInTile(first, rows);
      ComputeTile(rows);
      CopyOutTile(first, rows);
    }
  }

 private:
  __aicore__ inline void CopyInTile(int32_t first, int32_t rows) {
    LoadTile(path_in_, path_gm_[first * depth_], rows * depth_);
    LoadTile(tokens_in_, tokens_gm_[first * nodes_], rows * nodes_);
    LoadTile(slots_in_, slots_gm_[first * nodes_], rows * nodes_);
    LoadTile(lens_in_, lens_gm_[first], rows);
  }

  // Per row: the leading root path (path[0] == 0, then increasing and < N),
  // the bonus token after its last node, and a KV move for every path node
  // not already at its final index.
  __aicore__ inline void ComputeTile(int32_t rows) {
    LocalTensor<int32_t> path = path_in_.DeQue<int32_t>();
    LocalTensor<int32_t> tokens = tokens_in_.DeQue<int32_t>();
    LocalTensor<int64_t> slots = slots_in_.DeQue<int64_t>();
    LocalTensor<int32_t> lens = lens_in_.DeQue<int32_t>();
    LocalTensor<int32_t> new_lens = new_lens_out_.AllocTensor<int32_t>();
    LocalTensor<int32_t> next = next_out_.AllocTensor<int32_t>();
    LocalTensor<int64_t> src = src_out_.AllocTensor<int64_t>();
    LocalTensor<int64_t> dst = dst_out_.AllocTensor<int64_t>();
    vspec_kernel::WaitCopyIn();
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t row = r * depth_;
      const int32_t tree = r * nodes_;
      int32_t n = 0;
      int32_t prev = -1;
      for (; n < depth_; ++n) {
        const int32_t node = path.GetValue(row + n);
        const bool extends = n == 0 ? node == 0 : (node > prev && node < nodes_);
        if (!extends) break;
        const bool moves = node != n;
        src.SetValue(row + n, moves ? slots.GetValue(tree + node) : -1);
        dst.SetValue(row + n, moves ? slots.GetValue(tree + n) : -1);
        prev = node;
      }
      for (int32_t j = n; j < depth_; ++j) {
        src.SetValue(row + j, -1);
        dst.SetValue(row + j, -1);
      }
      new_lens.SetValue(r, lens.GetValue(r) + n);
      next.SetValue(r, n > 0 ? tokens.GetValue(tree + prev) : -1);
    }
    vspec_kernel::WaitScalarWrites();
    new_lens_out_.EnQue(new_lens);
    next_out_.EnQue(next);
    src_out_.EnQue(src);
    dst_out_.EnQue(dst);
    path_in_.FreeTensor(path);
    tokens_in_.FreeTensor(tokens);
    slots_in_.FreeTensor(slots);
    lens_in_.FreeTensor(lens);
  }

  __aicore__ inline void CopyOutTile(int32_t first, int32_t rows) {
    StoreTile(new_lens_out_, new_lens_gm_[first], rows);
    StoreTile(next_out_, next_gm_[first], rows);
    StoreTile(src_out_, src_gm_[first * depth_], rows * depth_);
    StoreTile(dst_out_, dst_gm_[first * depth_], rows * depth_);
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> path_in_, tokens_in_, slots_in_, lens_in_;
  TQue<QuePosition::VECOUT, kBufferNum> new_lens_out_, next_out_, src_out_, dst_out_;
  GlobalTensor<int32_t> path_gm_, tokens_gm_, lens_gm_, new_lens_gm_, next_gm_;
  GlobalTensor<int64_t> slots_gm_, src_gm_, dst_gm_;
  int32_t rows_ = 0;
  int32_t depth_ = 0;
  int32_t nodes_ = 0;
  int32_t tile_rows_ = 0;
};

extern "C" __global__ __aicore__ void vspec_tree_commit(
    GM_ADDR path, GM_ADDR target_tokens, GM_ADDR slots, GM_ADDR seq_lens, GM_ADDR new_seq_lens,
    GM_ADDR next_token, GM_ADDR src_slots, GM_ADDR dst_slots, int32_t batch, int32_t depth,
    int32_t nodes, int32_t rows_per_core, int32_t tile_rows) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  TreeCommit op;
  op.Init(path, target_tokens, slots, seq_lens, new_seq_lens, next_token, src_slots, dst_slots,
          batch, depth, nodes, rows_per_core, tile_rows);
  op.Process();
}
