// AscendC kernel: vspec::uniform_spec_metadata (semantics in ../ops.h; the CPU
// reference in ../cpu_ops.cpp is the spec). Not yet compiled or run on NPU.
//
// Requests are split evenly over the launched AI cores; each core writes the
// positions of its requests and query_start_loc[b + 1] for them, core 0 also
// writes query_start_loc[0]. Scalar global-memory writes go through the data
// cache, which is flushed before the kernel ends so the next op sees them.
#include "kernel_operator.h"

using namespace AscendC;

extern "C" __global__ __aicore__ void vspec_uniform_spec_metadata(GM_ADDR seq_lens,
                                                                  GM_ADDR query_start_loc,
                                                                  GM_ADDR positions,
                                                                  int32_t batch, int32_t gamma) {
  const int32_t width = gamma + 1;
  GlobalTensor<int32_t> lens;
  GlobalTensor<int32_t> qsl;
  GlobalTensor<int32_t> pos;
  lens.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(seq_lens), batch);
  qsl.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(query_start_loc), batch + 1);
  pos.SetGlobalBuffer(reinterpret_cast<__gm__ int32_t*>(positions), batch * width);

  const int32_t cores = static_cast<int32_t>(GetBlockNum());
  const int32_t core = static_cast<int32_t>(GetBlockIdx());
  const int32_t per_core = (batch + cores - 1) / cores;
  const int32_t begin = core * per_core;
  const int32_t end = begin + per_core < batch ? begin + per_core : batch;
  if (core == 0) {
    qsl.SetValue(0, 0);
  }
  for (int32_t b = begin; b < end; ++b) {
    const int32_t base = lens.GetValue(b);
    for (int32_t j = 0; j < width; ++j) {
      pos.SetValue(b * width + j, base + j);
    }
    qsl.SetValue(b + 1, (b + 1) * width);
  }
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE>(pos);
  DataCacheCleanAndInvalid<int32_t, CacheLine::ENTIRE_DATA_CACHE>(qsl);
}
