// Bindings for dvm/runtime.h: CompileOptions, RunStats, CompiledKernel and run_reference.
//
// Tensors cross zero-copy: any object exporting DLPack or the buffer protocol (numpy arrays,
// torch CPU tensors) becomes a TensorArg over the same memory, with its strides. `data` is the
// lowest address the view touches (the view start unless a stride is negative) and
// `storage_elems` the span of the view, so the runtime's bounds proof covers exactly the view.
// The GIL is released while the VM runs; the arrays stay referenced until the call returns.
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <sstream>

#include "bindings.h"

namespace dvm::python {
namespace {

using Array = nb::ndarray<>;
using ReadOnlyArray = nb::ndarray<nb::ro>;

// `dvm.CompiledKernel`: the C++ CompiledKernel and the kernel (with its signature).
struct PyCompiledKernel {
  std::shared_ptr<CompiledKernel> compiled;
  PyKernel kernel;
};

std::string arg_label(const char* what, size_t i, const std::vector<std::string>& names) {
  std::string s = std::string(what) + " " + std::to_string(i);
  if (i < names.size()) s += " ('" + names[i] + "')";
  return s;
}

template <typename A>
TensorArg to_tensor_arg(const A& a, const std::string& label) {
  if (a.device_type() != nb::device::cpu::value) {
    throw StatusError(invalid_argument(label + " is not in CPU memory (DLPack device " +
                                       std::to_string(a.device_type()) + ")"));
  }
  StatusOr<DType> dtype = dtype_from_dlpack(a.dtype());
  if (!dtype.is_ok()) throw StatusError(invalid_argument(label + ": " + dtype.status().message()));
  TensorArg t;
  t.dtype = *dtype;
  t.shape.resize(a.ndim());
  t.strides.resize(a.ndim());
  int64_t lo = 0, hi = 0;
  bool empty = false;
  for (size_t i = 0; i < a.ndim(); ++i) {
    t.shape[i] = static_cast<int64_t>(a.shape(i));
    t.strides[i] = a.stride(i);
    if (t.shape[i] == 0) empty = true;
    int64_t ext = (t.shape[i] - 1) * t.strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  auto* start = static_cast<char*>(const_cast<void*>(static_cast<const void*>(a.data())));
  if (empty) {
    t.data = start;
    t.storage_elems = 0;
    return t;
  }
  t.data = start + lo * dtype_size(t.dtype);
  t.offset = -lo;
  t.storage_elems = hi - lo + 1;
  return t;
}

// Converts a sequence of arrays; `keep` holds the array objects for the duration of the call.
template <typename A>
std::vector<TensorArg> tensor_args(nb::handle seq, const char* what,
                                   const std::vector<std::string>& names, std::vector<A>* keep) {
  if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq)) {
    throw StatusError(invalid_argument(std::string(what) + "s must be a list or tuple of arrays"));
  }
  std::vector<TensorArg> args;
  size_t n = nb::len(seq);
  for (size_t i = 0; i < n; ++i) {
    nb::object item = seq[i];
    std::string label = arg_label(what, i, names);
    A a;
    if (!nb::try_cast<A>(item, a)) {
      std::string type = nb::type_name(item.type()).c_str();
      throw StatusError(invalid_argument(
          label + ": expected a numpy array or a torch CPU tensor (DLPack, buffer protocol" +
          (std::string(what) == "output" ? ", writable" : "") + "), got " + type));
    }
    args.push_back(to_tensor_arg(a, label));
    keep->push_back(std::move(a));
  }
  return args;
}

std::vector<ScalarArg> scalar_args(nb::handle seq) {
  std::vector<ScalarArg> params;
  for (nb::handle h : nb::cast<nb::sequence>(seq)) {
    if (PyBool_Check(h.ptr()) || PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr())) {
      params.push_back(ScalarArg::of_int(nb::cast<int64_t>(h)));
    } else {
      params.push_back(ScalarArg::of_float(nb::cast<double>(h)));
    }
  }
  return params;
}

// Converted arguments of one call, alive until it returns.
struct CallArgs {
  std::vector<ReadOnlyArray> in_keep;
  std::vector<Array> out_keep;
  std::vector<TensorArg> inputs, outputs;
  std::vector<ScalarArg> params;
};

CallArgs call_args(const PyKernel& k, nb::handle inputs, nb::handle outputs, nb::handle params) {
  CallArgs c;
  c.inputs = tensor_args(inputs, "input", k.signature->input_names, &c.in_keep);
  if (outputs.is_valid()) {
    c.outputs = tensor_args(outputs, "output", k.signature->output_names, &c.out_keep);
  }
  if (params.is_valid()) c.params = scalar_args(params);
  return c;
}

RunStats run(const PyCompiledKernel& ck, nb::handle inputs, nb::handle outputs, nb::handle params) {
  CallArgs c = call_args(ck.kernel, inputs, outputs, params);
  RunStats stats;
  Status st;
  {
    nb::gil_scoped_release release;
    st = ck.compiled->run(c.inputs, c.outputs, c.params, &stats);
  }
  raise_if_error(st);
  return stats;
}

void run_reference_py(const PyKernel& k, nb::handle inputs, nb::handle outputs, nb::handle params) {
  CallArgs c = call_args(k, inputs, outputs, params);
  Status st;
  {
    nb::gil_scoped_release release;
    st = run_reference(k.kernel, c.inputs, c.outputs, c.params);
  }
  raise_if_error(st);
}

std::vector<nb::tuple> infer_output_shapes(const PyCompiledKernel& ck, nb::handle inputs) {
  CallArgs c = call_args(ck.kernel, inputs, nb::handle(), nb::handle());
  auto shapes = value_or_raise(ck.compiled->infer_output_shapes(c.inputs));
  std::vector<nb::tuple> out;
  for (const auto& s : shapes) {
    nb::list dims;
    for (int64_t d : s) dims.append(d);
    out.push_back(nb::tuple(dims));
  }
  return out;
}

std::string disassemble(const PyCompiledKernel& ck, nb::handle inputs, nb::handle outputs) {
  CallArgs c = call_args(ck.kernel, inputs, outputs, nb::handle());
  StatusOr<std::string> text = [&] {
    nb::gil_scoped_release release;
    return ck.compiled->disassemble(c.inputs, c.outputs);
  }();
  return value_or_raise(std::move(text));
}

std::string stats_repr(const RunStats& s) {
  std::ostringstream os;
  os << "RunStats(cache_hit=" << (s.cache_hit ? "True" : "False") << ", encode_us=" << s.encode_us
     << ", programs=" << s.programs << ", blocks=" << s.blocks << ", bytes_moved=" << s.bytes_moved
     << ")";
  return os.str();
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::class_<CompileOptions>(m, "CompileOptions")
      .def(
          "__init__",
          [](CompileOptions* o, int num_threads, size_t cache_capacity) {
            new (o) CompileOptions{num_threads, cache_capacity};
          },
          nb::arg("num_threads") = 0, nb::arg("cache_capacity") = 256)
      .def_rw("num_threads", &CompileOptions::num_threads, "0: all hardware threads")
      .def_rw("cache_capacity", &CompileOptions::cache_capacity, "programs kept per kernel");

  nb::class_<RunStats>(m, "RunStats", "Statistics of one run() call.")
      .def(nb::init<>())
      .def_ro("cache_hit", &RunStats::cache_hit)
      .def_ro("encode_us", &RunStats::encode_us, "encode + verify time (0 on a cache hit)")
      .def_ro("programs", &RunStats::programs)
      .def_ro("blocks", &RunStats::blocks)
      .def_ro("bytes_moved", &RunStats::bytes_moved)
      .def("__repr__", &stats_repr);

  nb::class_<PyCompiledKernel>(
      m, "CompiledKernel",
      "A kernel compiled once and run for any shapes: each new shape binding is encoded to "
      "bytecode (microseconds) and cached; a hit only relocates. Safe to run from several "
      "threads.")
      .def_static(
          "create",
          [](const PyKernel& k, const CompileOptions& options) {
            return PyCompiledKernel{value_or_raise(CompiledKernel::create(k.kernel, options)), k};
          },
          nb::arg("kernel"), nb::arg("options") = CompileOptions{})
      .def("run", &run, nb::arg("inputs"), nb::arg("outputs"), nb::arg("params") = nb::tuple(),
           "Runs into caller-provided outputs (written in place, zero-copy); returns RunStats.")
      .def("infer_output_shapes", &infer_output_shapes, nb::arg("inputs"))
      .def("disassemble", &disassemble, nb::arg("inputs"), nb::arg("outputs"),
           "The bytecode for these arguments' shapes and strides (encodes if needed).")
      .def_prop_ro("kernel", [](const PyCompiledKernel& ck) { return ck.kernel; })
      .def_prop_ro("cached_programs",
                   [](const PyCompiledKernel& ck) { return ck.compiled->cached_programs(); });

  m.def("run_reference", &run_reference_py, nb::arg("kernel"), nb::arg("inputs"),
        nb::arg("outputs"), nb::arg("params") = nb::tuple(),
        "Runs the scalar reference executor (the executable spec) into the outputs.");
}

}  // namespace dvm::python
