// AscendC kernel: vspec::uniform_spec_metadata (semantics in ../ops.h; the
// CPU reference in ../cpu_ops.cpp is the spec). Not yet compiled or run on NPU.
// Work split, tiling and synchronisation: vspec_kernel.h.
//
// query_start_loc is an arithmetic progression (step 1 + gamma): each core
// writes its rows' entries b + 1 with the vector unit (ArithProgression);
// core 0 also writes entry 0. positions[b, j] = seq_lens[b] + j is a short
// scalar fill per row (1 + gamma <= 16) on UB data.
#include "vspec_kernel.h"

using namespace AscendC;
using vspec_kernel::kBufferNum;
using vspec_kernel::UbBytes;

class UniformSpecMetadata {
 public:
  __aicore__ inline UniformSpecMetadata() {}

  __aicore__ inline void Init(GM_ADDR seq_lens, GM_ADDR query_start_loc, GM_ADDR positions,
                              int32_t batch, int32_t gamma, int32_t rows_per_core,
                              int32_t tile_rows) {
    const vspec_kernel::RowRange range = vspec_kernel::CoreRows(batch, rows_per_core);
    begin_ = range.begin;
    rows_ = range.rows;
    width_ = gamma + 1;
    tile_rows_ = tile_rows;
    lens_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq_lens) + begin_);
    qsl_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(query_start_loc));
    pos_gm_.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(positions) + begin_ * width_);
    pipe_.InitBuffer(lens_in_, kBufferNum, UbBytes(tile_rows * sizeof(int32_t)));
    // One extra entry: core 0's first tile also carries query_start_loc[0].
    pipe_.InitBuffer(qsl_out_, kBufferNum, UbBytes((tile_rows + 1) * sizeof(int32_t)));
    pipe_.InitBuffer(pos_out_, kBufferNum, UbBytes(tile_rows * width_ * sizeof(int32_t)));
  }

  __aicore__ inline void Process() {
    if (AscendC::GetBlockIdx() == 0 && rows_ == 0) {
      WriteStarts(0, 0);  // batch 0: query_start_loc = [0]
    }
    for (int32_t first = 0; first < rows_; first += tile_rows_) {
      const int32_t rows = rows_ - first < tile_rows_ ? rows_ - first : tile_rows_;
      LocalTensor<int32_t> lens = lens_in_.AllocTensor<int32_t>();
      vspec_kernel::CopyIn(lens, lens_gm_[first], rows);
      lens_in_.EnQue(lens);
      ComputeTile(first, rows);
      LocalTensor<int32_t> pos = pos_out_.DeQue<int32_t>();
      vspec_kernel::CopyOut(pos_gm_[first * width_], pos, rows * width_);
      pos_out_.FreeTensor(pos);
    }
  }

 private:
  // query_start_loc[from .. begin + first + rows], as (from + i) * width.
  __aicore__ inline void WriteStarts(int32_t from, int32_t count) {
    LocalTensor<int32_t> qsl = qsl_out_.AllocTensor<int32_t>();
    ArithProgression<int32_t>(qsl, from * width_, width_, count + 1);
    qsl_out_.EnQue(qsl);
    qsl = qsl_out_.DeQue<int32_t>();
    vspec_kernel::CopyOut(qsl_gm_[from], qsl, count + 1);
    qsl_out_.FreeTensor(qsl);
  }

  __aicore__ inline void ComputeTile(int32_t first, int32_t rows) {
    // Rows b + 1 of this tile; core 0's first tile starts at entry 0.
    const int32_t row0 = begin_ + first;
    if (row0 == 0) {
      WriteStarts(0, rows);
    } else {
      WriteStarts(row0 + 1, rows - 1);
    }
    LocalTensor<int32_t> lens = lens_in_.DeQue<int32_t>();
    LocalTensor<int32_t> pos = pos_out_.AllocTensor<int32_t>();
    vspec_kernel::WaitCopyIn();
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t base = lens.GetValue(r);
      for (int32_t j = 0; j < width_; ++j) {
        pos.SetValue(r * width_ + j, base + j);
      }
    }
    vspec_kernel::WaitScalarWrites();
    pos_out_.EnQue(pos);
    lens_in_.FreeTensor(lens);
  }

  TPipe pipe_;
  TQue<QuePosition::VECIN, kBufferNum> lens_in_;
  TQue<QuePosition::VECOUT, kBufferNum> qsl_out_, pos_out_;
  GlobalTensor<int32_t> lens_gm_, qsl_gm_, pos_gm_;
  int32_t begin_ = 0;
  int32_t rows_ = 0;
  int32_t width_ = 0;
  int32_t tile_rows_ = 0;
};

extern "C" __global__ __aicore__ void vspec_uniform_spec_metadata(
    GM_ADDR seq_lens, GM_ADDR query_start_loc, GM_ADDR positions, int32_t batch, int32_t gamma,
    int32_t rows_per_core, int32_t tile_rows) {
  KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_AIV_ONLY);
  UniformSpecMetadata op;
  op.Init(seq_lens, query_start_loc, positions, batch, gamma, rows_per_core, tile_rows);
  op.Process();
}
