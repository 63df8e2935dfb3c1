// What the vspec AscendC kernels share (not yet compiled or run on NPU).
//
// Layout of the work: requests (rows) are split over the launched AI vector
// cores in contiguous ranges of `rows_per_core`, a multiple of kRowAlign
// chosen by the host (npu_ops.cpp), so every core's first row starts on a
// 32-byte boundary of every input and output (32 rows x 1 byte for bool,
// x 4 bytes for int32, x 8 bytes for int64). A core moves its rows between
// global memory (GM) and its unified buffer (UB) in tiles of `tile_rows`
// rows through TQue queues of depth kBufferNum, so the copy-out of tile i
// (MTE3) overlaps the copy-in of tile i + 1 (MTE2). At serving batch sizes a
// core holds one tile (a 910B has 40+ vector cores, a range is 32 rows), so
// the gain over the old kernels is elsewhere: whole rows move in one burst
// each way instead of one scalar GM access per element. DataCopyPad moves
// exact byte counts, so a partial tile needs no padding in GM and no core
// writes outside its own rows; nothing goes through the scalar data cache,
// so no cache flush is needed.
//
// The per-row work is a short scan (at most kMaxCommitWidth entries) that
// the scalar unit does on UB-resident data; the events below order it after
// the copy-in (MTE2 -> S) and before the copy-out (S -> MTE3).
#pragma once

#include "kernel_operator.h"

namespace vspec_kernel {

constexpr int32_t kBufferNum = 2;
constexpr int32_t kRowAlign = 32;  // must match npu_ops.cpp

// UB buffers are allocated in whole 32-byte blocks.
__aicore__ inline uint32_t UbBytes(uint32_t bytes) { return (bytes + 31) / 32 * 32; }

// Gives `queue` kBufferNum UB buffers of `elements` values of T each.
template <typename T, typename Queue>
__aicore__ inline void InitQueue(AscendC::TPipe& pipe, Queue& queue, uint32_t elements) {
  pipe.InitBuffer(queue, kBufferNum, UbBytes(elements * sizeof(T)));
}

// One tile in: a buffer from the VECIN `queue`, `count` elements copied
// GM -> UB (exact byte length: no padding values needed because the scan
// never reads past `count`), enqueued for the compute stage to DeQue.
template <typename T, typename Queue>
__aicore__ inline void LoadTile(Queue& queue, const AscendC::GlobalTensor<T>& src,
                                uint32_t count) {
  AscendC::LocalTensor<T> tile = queue.template AllocTensor<T>();
  AscendC::DataCopyExtParams params{1, static_cast<uint32_t>(count * sizeof(T)), 0, 0, 0};
  AscendC::DataCopyPadExtParams<T> pad{false, 0, 0, 0};
  AscendC::DataCopyPad(tile, src, params, pad);
  queue.EnQue(tile);
}

// One tile out: the buffer the compute stage enqueued on the VECOUT `queue`,
// `count` elements copied UB -> GM (exact bytes: no core writes outside its
// own rows), then the buffer goes back to the queue.
template <typename T, typename Queue>
__aicore__ inline void StoreTile(Queue& queue, const AscendC::GlobalTensor<T>& dst,
                                 uint32_t count) {
  AscendC::LocalTensor<T> tile = queue.template DeQue<T>();
  AscendC::DataCopyExtParams params{1, static_cast<uint32_t>(count * sizeof(T)), 0, 0, 0};
  AscendC::DataCopyPad(dst, tile, params);
  queue.FreeTensor(tile);
}

// Scalar reads of UB data that MTE2 just wrote wait for that copy.
__aicore__ inline void WaitCopyIn() {
  const event_t id =
      static_cast<event_t>(AscendC::GetTPipePtr()->FetchEventID(AscendC::HardEvent::MTE2_S));
  AscendC::SetFlag<AscendC::HardEvent::MTE2_S>(id);
  AscendC::WaitFlag<AscendC::HardEvent::MTE2_S>(id);
}

// MTE3 copies out UB data only after the scalar unit has written it.
__aicore__ inline void WaitScalarWrites() {
  const event_t id =
      static_cast<event_t>(AscendC::GetTPipePtr()->FetchEventID(AscendC::HardEvent::S_MTE3));
  AscendC::SetFlag<AscendC::HardEvent::S_MTE3>(id);
  AscendC::WaitFlag<AscendC::HardEvent::S_MTE3>(id);
}

// This core's rows: [begin, begin + rows), rows possibly 0 for trailing cores.
struct RowRange {
  int32_t begin;
  int32_t rows;
};

__aicore__ inline RowRange CoreRows(int32_t batch, int32_t rows_per_core) {
  const int32_t begin = static_cast<int32_t>(AscendC::GetBlockIdx()) * rows_per_core;
  const int32_t left = batch - begin;
  return {begin, left <= 0 ? 0 : (left < rows_per_core ? left : rows_per_core)};
}

// Rows of the tile that starts at row `first` of a core's `rows`.
__aicore__ inline int32_t TileRows(int32_t first, int32_t rows, int32_t tile_rows) {
  return rows - first < tile_rows ? rows - first : tile_rows;
}

}  // namespace vspec_kernel
