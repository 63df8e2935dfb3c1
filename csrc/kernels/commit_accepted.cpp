// AscendC kernel: vspec::commit_accepted (semantics in ../ops.h; the CPU
// reference in ../cpu_ops.cpp is the spec). Not yet compiled or run on NPU.
// Work split, tiling and synchronisation: vspec_kernel.h.
#include "vspec_kernel.h"

using namespace AscendC;
using vspec_kernel::InitQueue;
using vspec_kernel::kBufferNum;
using vspec_kernel::LoadTile;
using vspec_kernel::StoreTile;

class CommitAccepted {
 public:
  __aicore__ inline CommitAccepted() {}

  __aicore__ inline void Init(GM_ADDR sampled, GM_ADDR discard, GM_ADDR backup,
                              GM_ADDR num_valid, GM_ADDR next_token, int32_t batch,
                              int32_t width, int32_t vocab_size, int32_t rows_per_core,
                              int32_t tile_rows) {
    const vspec_kernel::RowRange range = vspec_kernel::CoreRows(batch, rows_per_core);
    rows_ = range.rows;
    width_ = width;
    vocab_size_ = vocab_size;
    tile_rows_ = tile_rows;
    ids_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(sampled) + range.begin * width);
    discard_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ uint8_t*>(discard) + range.begin);
    backup_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(backup) + range.begin);
    valid_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(num_valid) + range.begin);
    next_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(next_token) + range.begin);
    InitQueue<int32_t>(pipe_, ids_in_, tile_rows * width);
    InitQueue<uint8_t>(pipe_, discard_in_, tile_rows);
    InitQueue<int32_t>(pipe_, backup_in_, tile_rows);
    InitQueue<int32_t>(pipe_, valid_out_, tile_rows);
    InitQueue<int32_t>(pipe_, next_out_, tile_rows);
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
    LoadTile(ids_in_, ids_gm_[first * width_], rows * width_);
    LoadTile(discard_in_, discard_gm_[first], rows);
    LoadTile(backup_in_, backup_gm_[first], rows);
  }

  // Per row: the leading run of valid ids (0 <= id < vocab_size), none for a
  // discarded row; the next token is the run's last id, else the backup.
  __aicore__ inline void ComputeTile(int32_t rows) {
    LocalTensor<int32_t> ids = ids_in_.DeQue<int32_t>();
    LocalTensor<uint8_t> discard = discard_in_.DeQue<uint8_t>();
    LocalTensor<int32_t> backup = backup_in_.DeQue<int32_t>();
    LocalTensor<int32_t> valid = valid_out_.AllocTensor<int32_t>();
    LocalTensor<int32_t> next = next_out_.AllocTensor<int32_t>();
    vspec_kernel::WaitCopyIn();
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t row = r * width_;
      int32_t n = 0;
      if (discard.GetValue(r) == 0) {
        while (n < width_) {
          const int32_t id = ids.GetValue(row + n);
          if (id < 0 || id >= vocab_size_) break;
          ++n;
        }
      }
      valid.SetValue(r, n);
      next.SetValue(r, n > 0 ? ids.GetValue(row + n - 1) : backup.GetValue(r));
    }
    vspec_kernel::WaitScalarWrites();
    valid_out_.EnQue(valid);
    next_out_.EnQue(next);
    ids_in_.FreeTensor(ids);
    discard_in_.FreeTensor(discard);
    backup_in_.FreeTensor(backup);
  }

  __aicore__ inline void CopyOutTile(int32_t first, int32_t rows) {
    StoreTile(valid_out_, valid_gm_[first], rows);
    StoreTile(next_out_, next_gm_[first], rows);
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> ids_in_, discard_in_, backup_in_;
  TQue<QuePosition::VECOUT, kBufferNum> valid_out_, next_out_;
  GlobalTensor<int32_t> ids_gm_, backup_gm_, valid_gm_, next_gm_;
  GlobalTensor<uint8_t> discard_gm_;
  int32_t rows_ = 0;
  int32_t width_ = 0;
  int32_t vocab_size_ = 0;
  int32_t tile_rows_ = 0;
};

extern "C" __global__ __aicore__ void vspec_commit_accepted(
    GM_ADDR sampled, GM_ADDR discard, GM_ADDR backup, GM_ADDR num_valid, GM_ADDR next_token,
    int32_t batch, int32_t width, int32_t vocab_size, int32_t rows_per_core, int32_t tile_rows) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  CommitAccepted op;
  op.Init(sampled, discard, backup, num_valid, next_token, batch, width, vocab_size,
          rows_per_core, tile_rows);
  op.Process();
}
