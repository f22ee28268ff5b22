// Lazy mode's per-op prologue and output allocation in C++: see lazy_front.h.
#include "lazy_front.h"

#include <ATen/EmptyTensor.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/object_ptr.h>

#include <cstdint>
#include <vector>

#include "output_allocator.h"

namespace dvm::python {
namespace {

// Set once by lazy_configure (strong references, kept for the process: the mode class that
// uses them lives as long).
struct Front {
  PyObject* functions = nullptr;    // dict: torch function -> handler
  PyObject* tensor_type = nullptr;  // torch.Tensor
  PyObject* param_type = nullptr;   // torch.nn.Parameter
  PyObject* state = nullptr;        // lazy mode's threading.local state
  PyObject* fallbacks = nullptr;    // tuple of exception types: the call goes on to torch
  PyObject* depth_name = nullptr;   // "depth"
};
Front g_front;

// Only torch.Tensor and Parameter among the overloaded types (subclasses keep their own
// __torch_function__).
bool plain_types(PyObject* types) {
  if (!PyTuple_Check(types)) return false;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(types); ++i) {
    PyObject* t = PyTuple_GET_ITEM(types, i);
    if (t != g_front.tensor_type && t != g_front.param_type) return false;
  }
  return true;
}

bool tensor_requires_grad(PyObject* o) {
  return THPVariable_Check(o) && THPVariable_Unpack(o).requires_grad();
}

// Does a tensor among the arguments (or in a list or tuple argument) require grad?
bool any_requires_grad(PyObject* args, PyObject* kwargs) {
  const auto check = [](PyObject* a) {
    if (tensor_requires_grad(a)) return true;
    if (PyList_Check(a) || PyTuple_Check(a)) {
      const Py_ssize_t n = PySequence_Fast_GET_SIZE(a);
      PyObject** items = PySequence_Fast_ITEMS(a);
      for (Py_ssize_t i = 0; i < n; ++i) {
        if (tensor_requires_grad(items[i])) return true;
      }
    }
    return false;
  };
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    if (check(PyTuple_GET_ITEM(args, i))) return true;
  }
  if (kwargs != nullptr) {
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (PyDict_Next(kwargs, &pos, &key, &value)) {
      if (check(value)) return true;
    }
  }
  return false;
}

// 1: the handler may take the call; 0: torch takes it; -1: a Python error is set. As the
// Python prologue of DvmLazyFunctionMode: plain tensors only, lazy mode's own dispatch modes
// the only ones on the stack (another, say a FakeTensorMode, must see every op), not inside a
// backward pass, and no input requiring grad while grad mode is on.
int handler_may_run(PyObject* types, PyObject* args, PyObject* kwargs) {
  if (!plain_types(types)) return 0;
  PyObject* depth = PyObject_GetAttr(g_front.state, g_front.depth_name);
  if (depth == nullptr) return -1;
  const long long d = PyLong_AsLongLong(depth);
  Py_DECREF(depth);
  if (d == -1 && PyErr_Occurred()) return -1;
  if (c10::impl::TorchDispatchModeTLS::stack_len() != d) return 0;
  if (torch::autograd::get_current_graph_task_id() != -1) return 0;
  if (c10::GradMode::is_enabled() && any_requires_grad(args, kwargs)) return 0;
  return 1;
}

}  // namespace

PyObject* lazy_configure(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 5 || !PyDict_Check(argv[0]) || !PyTuple_Check(argv[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "lazy_configure(functions: dict, tensor_type, parameter_type, state, "
                    "fallbacks: tuple)");
    return nullptr;
  }
  PyObject* depth_name = PyUnicode_InternFromString("depth");
  if (depth_name == nullptr) return nullptr;
  Front next{argv[0], argv[1], argv[2], argv[3], argv[4], depth_name};
  for (PyObject* o :
       {next.functions, next.tensor_type, next.param_type, next.state, next.fallbacks}) {
    Py_INCREF(o);
  }
  Front old = g_front;
  g_front = next;
  for (PyObject* o :
       {old.functions, old.tensor_type, old.param_type, old.state, old.fallbacks, old.depth_name}) {
    Py_XDECREF(o);
  }
  Py_RETURN_NONE;
}

PyObject* lazy_torch_function(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  // Bound to the mode (torch requires a method): argv[0] is the mode.
  if (argc < 3 || argc > 5 || g_front.functions == nullptr) {
    PyErr_SetString(PyExc_TypeError, "__torch_function__(mode, func, types, args=(), kwargs=None)");
    return nullptr;
  }
  ++argv;
  --argc;
  PyObject* func = argv[0];
  PyObject* args = argc > 2 ? argv[2] : nullptr;
  PyObject* kwargs = argc > 3 && argv[3] != Py_None ? argv[3] : nullptr;
  THPObjectPtr owned_args;  // args made here: none given, or not a tuple
  if (args == nullptr || !PyTuple_Check(args)) {
    owned_args = args == nullptr ? PyTuple_New(0) : PySequence_Tuple(args);
    if (!owned_args) return nullptr;
    args = owned_args.get();
  }
  if (kwargs != nullptr && PyDict_Check(kwargs) && PyDict_GET_SIZE(kwargs) == 0) kwargs = nullptr;
  PyObject* handler = PyDict_GetItemWithError(g_front.functions, func);  // borrowed
  if (handler == nullptr && PyErr_Occurred()) PyErr_Clear();  // an unhashable func: torch's
  if (handler != nullptr) {
    const int ok = handler_may_run(argv[1], args, kwargs);
    if (ok < 0) return nullptr;
    if (ok == 1) {
      PyObject* r;
      {
        // The handler's own torch calls (real views of pending values) must not come back
        // through lazy mode's dispatch mode.
        c10::impl::ExcludeDispatchKeyGuard guard(c10::DispatchKeySet(c10::DispatchKey::Python));
        r = PyObject_Call(handler, args, kwargs);
      }
      if (r != nullptr || !PyErr_ExceptionMatches(g_front.fallbacks)) return r;
      PyErr_Clear();  // a refusal: the dispatcher's ATen handlers take the call
    }
  }
  return PyObject_Call(func, args, kwargs);
}

PyObject* lazy_empty(PyObject*, PyObject* const* argv, Py_ssize_t argc) {
  if (argc != 2 || !THPDtype_Check(argv[1])) {
    PyErr_SetString(PyExc_TypeError, "lazy_empty(shape, dtype: torch.dtype)");
    return nullptr;
  }
  THPObjectPtr seq(PySequence_Fast(argv[0], "lazy_empty: shape must be a sequence of ints"));
  if (!seq) return nullptr;
  std::vector<int64_t> shape(static_cast<size_t>(PySequence_Fast_GET_SIZE(seq.get())));
  for (size_t i = 0; i < shape.size(); ++i) {
    shape[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq.get(), static_cast<Py_ssize_t>(i)));
    if (shape[i] < 0) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "lazy_empty: negative size");
      return nullptr;
    }
  }
  const auto dtype = reinterpret_cast<THPDtype*>(argv[1])->scalar_type;
  at::Tensor t;
  try {
    t = at::Tensor(at::detail::empty_generic(shape, output_allocator(),
                                             c10::DispatchKeySet(c10::DispatchKey::CPU), dtype,
                                             std::nullopt));
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  void* data = t.numel() > 0 ? t.data_ptr() : nullptr;
  THPObjectPtr tensor(THPVariable_Wrap(std::move(t)));
  if (!tensor) return nullptr;
  THPObjectPtr address(PyLong_FromVoidPtr(data));
  if (!address) return nullptr;
  return PyTuple_Pack(2, tensor.get(), address.get());
}

}  // namespace dvm::python
