// Internals shared by the binding files of the `dvm._dvm` extension. Each binding file mirrors
// one public header (dtype_bindings.cc <-> dvm/dtype.h, ...); module.cc calls their bind_*
// functions. A non-ok Status leaves C++ as a StatusError, which status_bindings.cc alone
// translates into `dvm.DvmError`.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dvm/dtype.h"
#include "dvm/kernel.h"
#include "dvm/runtime.h"
#include "dvm/status.h"

namespace dvm::python {

namespace nb = nanobind;

// Carries a non-ok Status from a binding to the exception translator.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.to_string()) {}
  const char* what() const noexcept override { return what_.c_str(); }
  const Status& status() const { return status_; }

 private:
  Status status_;
  std::string what_;
};

// User text that may not be UTF-8 (names in a graph parsed from arbitrary bytes, messages
// quoting them) as str: undecodable bytes become U+FFFD instead of a UnicodeDecodeError.
nb::str utf8_text(const std::string& s);
nb::list utf8_texts(const std::vector<std::string>& v);

// Sets dvm.DvmError (with .code and .message) as the current Python exception.
void set_python_error(const Status& status);

inline void raise_if_error(const Status& s) {
  if (!s.is_ok()) throw StatusError(s);
}

template <typename T>
T value_or_raise(StatusOr<T>&& s) {
  if (!s.is_ok()) throw StatusError(s.status());
  return std::move(s).value();
}

// What Python knows of a built kernel besides the C++ Kernel: the signature recorded while
// building (the C++ Kernel does not expose it), used to name arguments and allocate outputs.
struct KernelSignature {
  std::vector<std::string> symbols;
  std::vector<std::string> input_names, output_names, param_names;
  std::vector<DType> input_dtypes, output_dtypes, param_dtypes;
};

// `dvm.Kernel`: an immutable built kernel and its signature. Cheap to copy (shared).
struct PyKernel {
  Kernel kernel;
  std::shared_ptr<const KernelSignature> signature;
};

// The DType a DLPack element type is stored as; InvalidArgument for types DVM lacks.
StatusOr<DType> dtype_from_dlpack(nb::dlpack::dtype t);
// The upper-snake Python member name of a C++ table name: "GeluErf" -> "GELU_ERF".
std::string upper_snake(std::string_view camel);

// Arrays (numpy arrays, torch CPU tensors) of one call converted to TensorArgs over the same
// memory; `keep` holds what the views point into until the call returns.
struct ConvertedArrays {
  std::vector<TensorArg> args;
  std::shared_ptr<void> keep;
};
// `what` is "input" or "output" (outputs must be writable); names label errors.
ConvertedArrays convert_arrays(nb::handle seq, const char* what,
                               const std::vector<std::string>& names);

// Whether `h` is a torch.Tensor (false while torch is not imported).
bool is_torch_tensor(nb::handle h);
// A call's outputs, uninitialised: torch tensors when `like_torch` (an input is one) or an
// output is bf16 (numpy has no bf16), else numpy arrays; `args` receives their views.
std::vector<nb::object> allocate_outputs(const std::vector<std::vector<int64_t>>& shapes,
                                         const std::vector<DType>& dtypes, bool like_torch,
                                         std::vector<TensorArg>* args);

void bind_status(nb::module_& m);
void bind_dtype(nb::module_& m);
void bind_kernel(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_sym(nb::module_& m);
void bind_graph(nb::module_& m);
void bind_lazy(nb::module_& m);

}  // namespace dvm::python
