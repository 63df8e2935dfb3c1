// Declarations-only stand-in of CANN's acl/acl.h: what csrc/npu_ops.cpp calls
// (for tests/unit/test_ops.py's syntax check; not CANN).
#pragma once
#include <cstdint>
typedef int aclError;
typedef void* aclrtStream;
constexpr aclError ACL_SUCCESS = 0;
enum aclDeviceInfo { ACL_DEVICE_INFO_VECTOR_CORE_NUM = 1 };
aclError aclGetDeviceCapability(int32_t deviceId, aclDeviceInfo deviceInfo, int64_t* value);
