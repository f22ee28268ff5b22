// Lazy mode's per-op prologue and output allocation in C++ (`dvm._dvm_torch`): the parts of
// recording a torch call that cost the most in Python (python/dvm/lazy/_mode.py,
// _tensors.py). Recording a plain `x * 0.5` took ~5.5 us, of which ~1.2 us were the Python
// checks before the handler and ~1 us torch.empty (through the dispatcher, under a Python
// exclude guard) for the output: a GPT decode step records ~200 such calls.
#pragma once

#include <Python.h>

namespace dvm::python {

// lazy_configure(functions, tensor_type, parameter_type, state, fallbacks): the function
// table (torch function -> handler), the two plain tensor types, the per-thread state
// (its `depth`: lazy mode's dispatch modes on this thread) and the exception types that
// send a call on to torch.
PyObject* lazy_configure(PyObject* self, PyObject* const* argv, Py_ssize_t argc);
// The function mode's __torch_function__, bound to the mode (torch takes a mode's
// __torch_function__ only as a method): (mode, func, types, args=(), kwargs=None).
PyObject* lazy_torch_function(PyObject* self, PyObject* const* argv, Py_ssize_t argc);
// lazy_empty(shape, dtype) -> (tensor, data address): a new contiguous CPU tensor, without a
// trip through the dispatcher (and so past every mode).
PyObject* lazy_empty(PyObject* self, PyObject* const* argv, Py_ssize_t argc);

}  // namespace dvm::python
