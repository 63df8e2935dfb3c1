// AscendC kernel: vspec::commit_accepted (semantics in ../ops.h; the CPU
// reference in ../cpu_ops.cpp is the spec). Not yet compiled or run on NPU.
//
// One pass per request over at most 16 sampled ids: the leading run of ids
// >= 0 is what commits. Requests are split evenly over the launched AI cores.
// The host wrapper has checked that every row commits at least one token.
#include "kernel_operator.h"

using namespace AscendC;

extern "C" __global__ __aicore__ void vspec_commit_accepted(GM_ADDR sampled, GM_ADDR seq_lens,
                                                            GM_ADDR num_accepted,
                                                            GM_ADDR next_token,
                                                            GM_ADDR new_seq_lens, int32_t batch,
                                                            int32_t width) {
  GlobalTensor<int64_t> ids;
  GlobalTensor<int32_t> lens;
  GlobalTensor<int32_t> accepted;
  GlobalTensor<int64_t> next;
  GlobalTensor<int32_t> new_lens;
  ids.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(sampled), batch * width);
  lens.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq_lens), batch);
  accepted.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(num_accepted), batch);
  next.SetGlobalBuffer(reinterpret_cast<__gm__ int64_t*>(next_token), batch);
  new_lens.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(new_seq_lens), batch);

  const int32_t cores = static_cast<int32_t>(GetBlockNum());
  const int32_t core = static_cast<int32_t>(GetBlockIdx());
  const int32_t per_core = (batch + cores - 1) / cores;
  const int32_t begin = core * per_core;
  const int32_t end = begin + per_core < batch ? begin + per_core : batch;
  for (int32_t b = begin; b < end; ++b) {
    int32_t n = 0;
    while (n < width && ids.GetValue(b * width + n) >= 0) {
      ++n;
    }
    accepted.SetValue(b, n);
    next.SetValue(b, ids.GetValue(b * width + (n > 0 ? n - 1 : 0)));
    new_lens.SetValue(b, lens.GetValue(b) + n);
  }
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE>(accepted);
  DataCacheCleanAndInvalid<int64_t, CacheLine::ENTIRE_DATA_CACHE>(next);
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE>(new_lens);
}
