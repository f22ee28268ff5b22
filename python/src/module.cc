// The `dvm._dvm` extension module: one bind_* call per public header.
#include "bindings.h"

NB_MODULE(_dvm, m) {
  m.doc() = "DVM: a bytecode virtual machine for dynamic tensor programs (C++ core bindings)";
  dvm::python::bind_status(m);
  dvm::python::bind_dtype(m);
  dvm::python::bind_kernel(m);
  dvm::python::bind_runtime(m);
  dvm::python::bind_sym(m);
  dvm::python::bind_graph(m);
  dvm::python::bind_lazy(m);
}
