// A declarations-only stand-in for CANN's kernel_operator.h: exactly the
// AscendC names and signatures csrc/kernels/ use, written from the AscendC
// API reference (CANN 8/9). tests/unit/test_ops.py compiles the kernels against
// it with the host C++ compiler (-fsyntax-only): that catches syntax, type
// and arity mistakes in our code. It proves nothing about CANN itself (a
// signature wrong here is wrong in the check too); the kernels are not yet
// compiled with CANN or run on NPU.
#pragma once

#include <cstdint>

#define __aicore__
#define __global__
#define __gm__
#define GM_ADDR uint8_t*
#define KERNEL_TASK_TYPE_DEFAULT(type) (void)(type)

using event_t = int32_t;

enum KernelType { KERNEL_TYPE_AIV_ONLY };

namespace AscendC {

enum class TPosition { VECIN, VECOUT, VECCALC };
using QuePosition = TPosition;
enum class HardEvent { MTE2_S, S_MTE3 };
using TEventID = int8_t;

int64_t GetBlockIdx();

template <typename T>
class GlobalTensor {
 public:
  void SetGlobalBuffer(__gm__ T* buffer, uint64_t size);
  void SetGlobalBuffer(__gm__ T* buffer);
  GlobalTensor operator[](uint64_t offset) const;
};

template <typename T>
class LocalTensor {
 public:
  T GetValue(uint32_t index) const;
  void SetValue(uint32_t index, T value) const;
  LocalTensor operator[](uint32_t offset) const;
};

template <TPosition pos, int32_t depth>
class TQue {
 public:
  template <typename T>
  LocalTensor<T> AllocTensor();
  template <typename T>
  void FreeTensor(LocalTensor<T>& tensor);
  template <typename T>
  bool EnQue(const LocalTensor<T>& tensor);
  template <typename T>
  LocalTensor<T> DeQue();
};

class TPipe {
 public:
  template <class Q>
  bool InitBuffer(Q& que, uint8_t num, uint32_t len);
  TEventID FetchEventID(HardEvent event);
};

TPipe* GetTPipePtr();

template <HardEvent event>
void SetFlag(int32_t event_id);
template <HardEvent event>
void WaitFlag(int32_t event_id);

struct DataCopyExtParams {
  uint16_t blockCount;
  uint32_t blockLen;
  uint32_t srcStride;
  uint32_t dstStride;
  uint32_t rsv;
};

template <typename T>
struct DataCopyPadExtParams {
  bool isPad;
  uint8_t leftPadding;
  uint8_t rightPadding;
  T paddingValue;
};

template <typename T>
void DataCopyPad(const LocalTensor<T>& dst, const GlobalTensor<T>& src,
                 const DataCopyExtParams& params, const DataCopyPadExtParams<T>& pad);
template <typename T>
void DataCopyPad(const GlobalTensor<T>& dst, const LocalTensor<T>& src,
                 const DataCopyExtParams& params);

}  // namespace AscendC
