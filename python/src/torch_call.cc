// `dvm._dvm_torch`: DvmPartition's call without Python in between, built only when torch is
// installed (it links libtorch; `dvm._dvm` never does). call(exe, args, index) runs the
// dvm.Executable `exe` on the torch tensors args[index[0]], args[index[1]], ... and returns its
// outputs as a tuple of new torch tensors. Arguments are read straight from the at::Tensor
// (data pointer, sizes, strides: no Python attribute calls) and outputs are made once the
// executable has bound the input shapes, large ones from blocks kept for reuse
// (output_allocator.h). A tensor this path does not take (not on the
// CPU, torch's negative bit, a dtype DVM lacks) raises NotImplementedError: the caller then
// uses Executable.call, which reports or handles it.
#include <ATen/EmptyTensor.h>
#include <ATen/Parallel.h>
#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "lazy_front.h"
#include "output_allocator.h"
#include "torch_call_api.h"

namespace {

using dvm::DType;
using dvm::TensorArg;
using dvm::python::TorchCallApi;

const TorchCallApi* g_api = nullptr;

// DVM's parallel work on torch's intra-op pool (dvm::set_parallel_backend): with two pools
// on the same cores, each spun while the other worked (a DVM call right after a small torch
// op ran at half speed) and DVM's workers slept through the Python between a compiled model's
// partitions (~50 us to wake on a VM), where torch's OpenMP threads stay hot. One part per
// index, as DVM deals its tiles.
void torch_parallel_for(int parts, const std::function<void(int)>& task) {
  at::parallel_for(0, parts, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) task(static_cast<int>(p));
  });
}

// Does at::parallel_for, as compiled into this module, run on several threads? A torch built
// with OpenMP needs this module built with -fopenmp against torch's libgomp (python/
// CMakeLists.txt); otherwise it would run every part on the calling thread, and DVM keeps its
// own pool.
bool torch_pool_is_parallel() {
  if (at::get_num_threads() < 2) return true;  // nothing to lose; follows later thread changes
#if defined(_OPENMP) || !AT_PARALLEL_OPENMP
  std::atomic<int> entered{0};
  std::vector<std::thread::id> ids(2);
  at::parallel_for(0, 2, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) ids[static_cast<size_t>(p)] = std::this_thread::get_id();
    entered.fetch_add(1);
  });
  return entered.load() == 2 && ids[0] != ids[1];
#else
  return false;
#endif
}

// DVM's dtypes and torch's, both ways.
constexpr std::pair<c10::ScalarType, DType> kDTypes[] = {
    {c10::ScalarType::Float, DType::kF32},     {c10::ScalarType::Half, DType::kF16},
    {c10::ScalarType::BFloat16, DType::kBF16}, {c10::ScalarType::Int, DType::kI32},
    {c10::ScalarType::Long, DType::kI64},      {c10::ScalarType::Bool, DType::kBool}};

bool dvm_dtype(c10::ScalarType t, DType* d) {
  for (const auto& [st, dt] : kDTypes) {
    if (st == t) {
      *d = dt;
      return true;
    }
  }
  return false;
}

c10::ScalarType torch_dtype(DType d) {
  for (const auto& [st, dt] : kDTypes)
    if (dt == d) return st;
  return c10::ScalarType::Undefined;
}

// The view as DVM's TensorArg: `data` at the view's first element (torch strides are never
// negative), storage exactly the span the view covers.
bool tensor_arg(const at::Tensor& t, TensorArg* out) {
  DType d;
  if (!t.device().is_cpu() || t.is_neg() || t.is_conj() || !t.has_storage() ||
      !dvm_dtype(t.scalar_type(), &d)) {
    return false;
  }
  out->dtype = d;
  out->shape.assign(t.sizes().begin(), t.sizes().end());
  out->strides.assign(t.strides().begin(), t.strides().end());
  out->offset = 0;
  out->data = t.data_ptr();
  int64_t span = 1;
  for (size_t i = 0; i < out->shape.size(); ++i) {
    if (out->shape[i] == 0) span = 0;
  }
  for (size_t i = 0; i < out->shape.size() && span > 0; ++i) {
    if (out->strides[i] < 0) return false;
    span += (out->shape[i] - 1) * out->strides[i];
  }
  out->storage_elems = span;
  return true;
}

// A new contiguous output tensor, its storage from the output allocator.
at::Tensor empty_output(const std::vector<int64_t>& shape, DType dtype) {
  return at::Tensor(at::detail::empty_generic(shape, dvm::python::output_allocator(),
                                              c10::DispatchKeySet(c10::DispatchKey::CPU),
                                              torch_dtype(dtype), std::nullopt));
}

// A fresh output (this module links no DVM code: TensorArg::contiguous lives in libdvm).
TensorArg contiguous(void* data, DType dtype, const std::vector<int64_t>& shape) {
  TensorArg t;
  t.data = data;
  t.dtype = dtype;
  t.shape = shape;
  return t;
}

PyObject* call(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 3 || !PyTuple_Check(argv[1]) || !PyTuple_Check(argv[2])) {
    PyErr_SetString(PyExc_TypeError, "call(exe, args: tuple, index: tuple)");
    return nullptr;
  }
  PyObject* args = argv[1];
  PyObject* index = argv[2];
  Py_ssize_t n = PyTuple_GET_SIZE(index);
  std::vector<TensorArg> inputs(static_cast<size_t>(n));
  for (Py_ssize_t k = 0; k < n; ++k) {
    Py_ssize_t i = PyLong_AsSsize_t(PyTuple_GET_ITEM(index, k));
    if (i < 0 || i >= PyTuple_GET_SIZE(args)) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_IndexError, "argument index out of range");
      return nullptr;
    }
    PyObject* a = PyTuple_GET_ITEM(args, i);
    if (!THPVariable_Check(a) || !tensor_arg(THPVariable_Unpack(a), &inputs[k])) {
      PyErr_SetString(PyExc_NotImplementedError, "an argument this path does not take");
      return nullptr;
    }
  }
  std::vector<at::Tensor> outs;
  int rc = g_api->run(
      argv[0], inputs,
      [&](const std::vector<std::vector<int64_t>>& shapes, const std::vector<DType>& dtypes,
          std::vector<TensorArg>* args_out, std::string* error) {
        try {
          for (size_t k = 0; k < shapes.size(); ++k) {
            outs.push_back(empty_output(shapes[k], dtypes[k]));
            args_out->push_back(contiguous(outs.back().data_ptr(), dtypes[k], shapes[k]));
          }
          return true;
        } catch (const std::exception& e) {
          *error = e.what();
          return false;
        }
      });
  if (rc != 0) return nullptr;
  PyObject* result = PyTuple_New(static_cast<Py_ssize_t>(outs.size()));
  if (result == nullptr) return nullptr;
  for (size_t k = 0; k < outs.size(); ++k) {
    PyObject* t = THPVariable_Wrap(std::move(outs[k]));
    if (t == nullptr) {
      Py_DECREF(result);
      return nullptr;
    }
    PyTuple_SET_ITEM(result, static_cast<Py_ssize_t>(k), t);
  }
  return result;
}

PyObject* output_cache_stats(PyObject*, PyObject*) {
  const dvm::python::OutputCacheStats s = dvm::python::output_cache_stats();
  return Py_BuildValue("{s:L,s:L,s:L,s:L,s:L}", "hits", static_cast<long long>(s.hits), "misses",
                       static_cast<long long>(s.misses), "idle_bytes",
                       static_cast<long long>(s.idle_bytes), "live_bytes",
                       static_cast<long long>(s.live_bytes), "budget_bytes",
                       static_cast<long long>(s.budget_bytes));
}

PyObject* release_output_cache(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  long long budget = -1;
  if (argc > 1) {
    PyErr_SetString(PyExc_TypeError, "release_output_cache(budget_bytes=-1)");
    return nullptr;
  }
  if (argc == 1) {
    budget = PyLong_AsLongLong(argv[0]);
    if (budget == -1 && PyErr_Occurred()) return nullptr;
  }
  dvm::python::release_output_cache(budget);
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&call)), METH_FASTCALL,
     "call(exe, args, index): exe(*[args[i] for i in index]) for torch tensors, in C++."},
    {"output_cache_stats", &output_cache_stats, METH_NOARGS,
     "output_cache_stats() -> dict: hits, misses, idle_bytes, live_bytes, budget_bytes of the "
     "blocks kept for large outputs."},
    {"release_output_cache",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&release_output_cache)),
     METH_FASTCALL,
     "release_output_cache(budget_bytes=-1): frees every idle output block; a budget >= 0 "
     "replaces DVM_OUTPUT_CACHE_MB's (0: no more caching)."},
    {"lazy_configure",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dvm::python::lazy_configure)),
     METH_FASTCALL,
     "lazy_configure(functions, tensor_type, parameter_type, state, fallbacks): lazy mode's "
     "function table and state for lazy_torch_function."},
    {"lazy_torch_function",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dvm::python::lazy_torch_function)),
     METH_FASTCALL,
     "lazy_torch_function(mode, func, types, args=(), kwargs=None): lazy mode's "
     "function-level __torch_function__ (bound to the mode)."},
    {"lazy_empty",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&dvm::python::lazy_empty)),
     METH_FASTCALL,
     "lazy_empty(shape, dtype) -> (tensor, data address): a new contiguous CPU tensor, past "
     "the dispatcher."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module = {PyModuleDef_HEAD_INIT,
                      "_dvm_torch",
                      "DvmPartition's call path for torch tensors (links libtorch).",
                      -1,
                      methods,
                      nullptr,
                      nullptr,
                      nullptr,
                      nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__dvm_torch() {
  PyObject* dvm = PyImport_ImportModule("dvm._dvm");
  if (dvm == nullptr) return nullptr;
  PyObject* capsule = PyObject_GetAttrString(dvm, "_torch_call_api");
  Py_DECREF(dvm);
  if (capsule == nullptr) return nullptr;
  g_api =
      static_cast<const TorchCallApi*>(PyCapsule_GetPointer(capsule, TorchCallApi::kCapsuleName));
  Py_DECREF(capsule);
  if (g_api == nullptr) return nullptr;
  if (g_api->version != TorchCallApi::kVersion) {
    PyErr_SetString(PyExc_ImportError, "dvm._dvm_torch does not match dvm._dvm: reinstall dvm");
    return nullptr;
  }
  PyObject* m = PyModule_Create(&module);
  if (m != nullptr && torch_pool_is_parallel()) g_api->set_parallel_backend(&torch_parallel_for);
  return m;
}
