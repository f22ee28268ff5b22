// The `dvm._dvm` extension module: one bind_* call per public header.
#include <cstdlib>
#include <cstring>

#include "bindings.h"

NB_MODULE(_dvm, m) {
  m.doc() = "DVM: a bytecode virtual machine for dynamic tensor programs (C++ core bindings)";
  // At interpreter exit, objects that outlive this module (executables held by a result's
  // autograd graph, by Dynamo's caches, by module globals torn down later) are not leaks of a
  // running program; nanobind would list each one. The torch backend also releases what it
  // can at exit. DVM_LEAK_WARNINGS=1 keeps the report (debugging reference counts).
  const char* warn = std::getenv("DVM_LEAK_WARNINGS");
  nanobind::set_leak_warnings(warn != nullptr && std::strcmp(warn, "0") != 0);
  dvm::python::bind_status(m);
  dvm::python::bind_dtype(m);
  dvm::python::bind_kernel(m);
  dvm::python::bind_runtime(m);
  dvm::python::bind_sym(m);
  dvm::python::bind_graph(m);
  dvm::python::bind_lazy(m);
}
