// The call path that `dvm._dvm_torch` (built against libtorch, only when torch is installed)
// reaches through a capsule of `dvm._dvm`, so that `_dvm` itself never links or imports torch.
// Both modules are built from this tree with the same compiler: TensorArg and std::function
// cross between them as they are.
#pragma once

#include <Python.h>

#include <functional>
#include <string>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/runtime.h"

namespace dvm::python {

struct TorchCallApi {
  static constexpr int kVersion = 2;
  static constexpr const char* kCapsuleName = "dvm._dvm._torch_call_api";

  int version = kVersion;
  // Makes a call's outputs once their shapes are known (called without the GIL); false with
  // *error set to refuse.
  using Allocate = std::function<bool(const std::vector<std::vector<int64_t>>& shapes,
                                      const std::vector<DType>& dtypes,
                                      std::vector<TensorArg>* outputs, std::string* error)>;
  // Runs `exe` (a dvm.Executable) on `inputs` with the GIL released for the binding and the
  // kernels. 0, or -1 with a Python exception set (dvm.DvmError for a DVM error).
  int (*run)(PyObject* exe, const std::vector<TensorArg>& inputs,
             const Allocate& allocate) = nullptr;
  // dvm::set_parallel_backend of `_dvm`'s copy of the library: `_dvm_torch` installs torch's
  // intra-op pool when it loads.
  void (*set_parallel_backend)(ParallelBackend backend) = nullptr;
};

}  // namespace dvm::python
