// Declarations-only stand-in of torch_npu's OpCommand.h (the part npu_ops.cpp uses).
#pragma once
#include <functional>
#include <string>
namespace at_npu {
namespace native {
using PROC_FUNC = std::function<int()>;
class OpCommand {
 public:
  OpCommand& Name(const std::string& name);
  void SetCustomHandler(PROC_FUNC func);
  void Run();
};
}  // namespace native
}  // namespace at_npu
