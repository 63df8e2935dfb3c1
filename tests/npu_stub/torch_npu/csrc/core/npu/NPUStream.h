// Declarations-only stand-in of torch_npu's NPUStream.h (the part npu_ops.cpp uses).
#pragma once
#include "acl/acl.h"
namespace c10_npu {
class NPUStream {
 public:
  aclrtStream stream(const bool need_empty = true) const;
};
NPUStream getCurrentNPUStream(signed char device_index = -1);
}  // namespace c10_npu
