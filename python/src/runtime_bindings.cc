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

#include <algorithm>
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

// "input 1 ('b')": built only when an error needs it.
std::string arg_label(const char* what, size_t i, const std::vector<std::string>& names) {
  std::string s = std::string(what) + " " + std::to_string(i);
  if (i < names.size()) s += " ('" + names[i] + "')";
  return s;
}

// A TensorArg over the view starting at `start` (see the file comment for data/offset).
TensorArg view_arg(char* start, DType dtype, std::vector<int64_t> shape,
                   std::vector<int64_t> strides) {
  TensorArg t;
  t.dtype = dtype;
  int64_t lo = 0, hi = 0;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 0) empty = true;
    int64_t ext = (shape[i] - 1) * strides[i];
    (ext < 0 ? lo : hi) += ext;
  }
  t.shape = std::move(shape);
  t.strides = std::move(strides);
  if (empty) {
    t.data = start;
    t.storage_elems = 0;
    return t;
  }
  t.data = start + lo * dtype_size(dtype);
  t.offset = -lo;
  t.storage_elems = hi - lo + 1;
  return t;
}

template <typename A>
TensorArg ndarray_arg(const A& a, const char* what, size_t i,
                      const std::vector<std::string>& names) {
  if (a.device_type() != nb::device::cpu::value) {
    throw StatusError(invalid_argument(arg_label(what, i, names) +
                                       " is not in CPU memory (DLPack device " +
                                       std::to_string(a.device_type()) + ")"));
  }
  StatusOr<DType> dtype = dtype_from_dlpack(a.dtype());
  if (!dtype.is_ok()) {
    throw StatusError(
        invalid_argument(arg_label(what, i, names) + ": " + dtype.status().message()));
  }
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  for (size_t k = 0; k < a.ndim(); ++k) {
    shape[k] = static_cast<int64_t>(a.shape(k));
    strides[k] = a.stride(k);
  }
  auto* start = static_cast<char*>(const_cast<void*>(static_cast<const void*>(a.data())));
  return view_arg(start, *dtype, std::move(shape), std::move(strides));
}

// str(h) in Python.
std::string py_str(nb::handle h) {
  nb::str s = nb::steal<nb::str>(PyObject_Str(h.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return s.c_str();
}

// torch.Tensor and its dtypes, once torch has been imported (DVM never imports it).
struct TorchTypes {
  nb::object tensor;
  nb::object empty;
  nb::object dtypes[kNumDTypes];  // indexed by DType
  // Attribute names interned once: attr("name") would build a new str on every lookup.
  nb::object is_cpu = interned("is_cpu"), dtype = interned("dtype"), is_neg = interned("is_neg"),
             shape = interned("shape"), stride = interned("stride"),
             data_ptr = interned("data_ptr");

  static nb::object interned(const char* s) { return nb::steal(PyUnicode_InternFromString(s)); }
};

// obj.name() without making a bound method (vectorcall).
nb::object call_method(nb::handle obj, const nb::object& name) {
  PyObject* r = PyObject_CallMethodNoArgs(obj.ptr(), name.ptr());
  if (r == nullptr) throw nb::python_error();
  return nb::steal(r);
}

const TorchTypes* torch_types() {
  static const TorchTypes* types = nullptr;  // never freed: torch outlives every call
  if (types != nullptr) return types;
  PyObject* mod = PyImport_GetModule(nb::str("torch").ptr());
  if (mod == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  nb::object torch = nb::steal(mod);
  static_assert(kNumDTypes == 6, "map every DType to its torch dtype");
  const char* names[kNumDTypes] = {"float32", "float16", "bfloat16", "int32", "int64", "bool"};
  auto* t = new TorchTypes;
  t->tensor = torch.attr("Tensor");
  t->empty = torch.attr("empty");
  for (int k = 0; k < kNumDTypes; ++k) t->dtypes[k] = torch.attr(names[k]);
  types = t;
  return types;
}

// torch tensors skip DLPack: torch's __dlpack__ is a Python method costing ~5 us a tensor,
// reading data_ptr/shape/stride/dtype ~1 us. Same memory, same view, no copy.
// A tensor with torch's negative bit (a lazily negated view, e.g. `t.conj().imag` or `-t` of
// such a view) holds the negation of what its memory says: an input is resolved into a copy
// (`item` becomes that copy, kept alive by the caller); an output cannot be written in place.
bool torch_arg(nb::object& item, const char* what, size_t i, const std::vector<std::string>& names,
               TensorArg* out) {
  if (!is_torch_tensor(item)) return false;
  const TorchTypes* tt = torch_types();
  if (!nb::cast<bool>(item.attr(tt->is_cpu))) {
    throw StatusError(invalid_argument(arg_label(what, i, names) + " is on device '" +
                                       py_str(item.attr("device")) + "', not the CPU"));
  }
  nb::object dt = item.attr(tt->dtype);
  int d = 0;
  while (d < kNumDTypes && !dt.is(tt->dtypes[d])) ++d;
  if (d == kNumDTypes) {
    throw StatusError(invalid_argument(arg_label(what, i, names) + ": unsupported element type " +
                                       py_str(dt) +
                                       "; DVM stores f32, f16, bf16, "
                                       "i32, i64 and bool"));
  }
  if (nb::cast<bool>(call_method(item, tt->is_neg))) {
    if (std::string(what) == "output") {
      throw StatusError(invalid_argument(arg_label(what, i, names) +
                                         " has torch's negative bit set (a lazily negated view); "
                                         "pass a tensor without it (resolve_neg())"));
    }
    item = item.attr("resolve_neg")();
  }
  auto shape = nb::cast<std::vector<int64_t>>(item.attr(tt->shape));
  auto strides = nb::cast<std::vector<int64_t>>(call_method(item, tt->stride));
  auto start = reinterpret_cast<char*>(nb::cast<uintptr_t>(call_method(item, tt->data_ptr)));
  *out = view_arg(start, static_cast<DType>(d), std::move(shape), std::move(strides));
  return true;
}

// `dvm.Constant(array, version)`: an input the caller promises not to change while it passes
// the same version (TensorArg::version): the VM packs it once as a matmul operand.
struct PyConstant {
  nb::object array;
  uint64_t version = 0;
};

// Converts a sequence of arrays. `arrays` and `objects` hold what was converted until the call
// returns (the caller's list may change while the GIL is released).
template <typename A>
std::vector<TensorArg> tensor_args(nb::handle seq, const char* what,
                                   const std::vector<std::string>& names, std::vector<A>* arrays,
                                   std::vector<nb::object>* objects) {
  if (!nb::isinstance<nb::list>(seq) && !nb::isinstance<nb::tuple>(seq)) {
    throw StatusError(invalid_argument(std::string(what) + "s must be a list or tuple of arrays"));
  }
  std::vector<TensorArg> args;
  size_t n = nb::len(seq);
  args.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    nb::object item = seq[i];
    uint64_t version = 0;
    if (nb::isinstance<PyConstant>(item)) {
      if (std::string(what) == "output") {
        throw StatusError(
            invalid_argument(arg_label(what, i, names) + ": an output cannot be a dvm.Constant"));
      }
      const PyConstant& c = nb::cast<const PyConstant&>(item);
      version = c.version;
      item = c.array;
    }
    TensorArg t;
    if (!torch_arg(item, what, i, names, &t)) {
      A a;
      if (!nb::try_cast<A>(item, a)) {
        std::string type = nb::type_name(item.type()).c_str();
        throw StatusError(invalid_argument(
            arg_label(what, i, names) +
            ": expected a numpy array or a torch CPU tensor (DLPack, buffer protocol" +
            (std::string(what) == "output" ? ", writable" : "") + "), got " + type));
      }
      t = ndarray_arg(a, what, i, names);
      arrays->push_back(std::move(a));
    }
    t.version = version;
    args.push_back(std::move(t));
    objects->push_back(std::move(item));
  }
  return args;
}

std::vector<ScalarArg> scalar_args(nb::handle seq, const std::vector<std::string>& names) {
  if (!nb::isinstance<nb::sequence>(seq) || nb::isinstance<nb::str>(seq)) {
    throw StatusError(invalid_argument("params must be a list or tuple of numbers"));
  }
  std::vector<ScalarArg> params;
  size_t i = 0;
  for (nb::handle h : nb::borrow<nb::sequence>(seq)) {
    int64_t iv;
    double fv;
    if ((PyBool_Check(h.ptr()) || PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr())) &&
        nb::try_cast<int64_t>(h, iv)) {
      params.push_back(ScalarArg::of_int(iv));
    } else if (!PyLong_Check(h.ptr()) && nb::try_cast<double>(h, fv)) {
      params.push_back(ScalarArg::of_float(fv));
    } else {
      throw StatusError(invalid_argument(arg_label("param", i, names) +
                                         ": expected an int or a float (int64 range), got " +
                                         nb::type_name(h.type()).c_str() + " " + py_str(h)));
    }
    ++i;
  }
  return params;
}

// Converted arguments of one call, alive until it returns.
struct CallArgs {
  std::vector<ReadOnlyArray> in_arrays;
  std::vector<Array> out_arrays;
  std::vector<nb::object> objects;
  std::vector<TensorArg> inputs, outputs;
  std::vector<ScalarArg> params;
};

CallArgs call_args(const PyKernel& k, nb::handle inputs, nb::handle outputs, nb::handle params) {
  CallArgs c;
  c.inputs = tensor_args(inputs, "input", k.signature->input_names, &c.in_arrays, &c.objects);
  if (outputs.is_valid()) {
    c.outputs =
        tensor_args(outputs, "output", k.signature->output_names, &c.out_arrays, &c.objects);
  }
  if (params.is_valid()) c.params = scalar_args(params, k.signature->param_names);
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

bool is_torch_tensor(nb::handle h) {
  const TorchTypes* tt = torch_types();
  return tt != nullptr &&
         PyObject_TypeCheck(h.ptr(), reinterpret_cast<PyTypeObject*>(tt->tensor.ptr()));
}

// Fresh outputs are contiguous and fully known: only their address is read back (one call a
// tensor instead of the five a caller's tensor needs).
std::vector<nb::object> allocate_outputs(const std::vector<std::vector<int64_t>>& shapes,
                                         const std::vector<DType>& dtypes, bool like_torch,
                                         std::vector<TensorArg>* args) {
  std::vector<nb::object> outs;
  const TorchTypes* tt = torch_types();
  bool any_bf16 = std::find(dtypes.begin(), dtypes.end(), DType::kBF16) != dtypes.end();
  if (tt != nullptr && (like_torch || any_bf16)) {
    for (size_t k = 0; k < shapes.size(); ++k) {
      nb::object shape = nb::cast(shapes[k]);
      nb::object t = tt->empty(shape, nb::arg("dtype") = tt->dtypes[static_cast<int>(dtypes[k])]);
      auto* data = reinterpret_cast<void*>(nb::cast<uintptr_t>(call_method(t, tt->data_ptr)));
      args->push_back(TensorArg::contiguous(data, dtypes[k], shapes[k]));
      outs.push_back(std::move(t));
    }
    return outs;
  }
  static nb::object empty = nb::module_::import_("dvm._arrays").attr("empty");  // leaked at exit
  nb::list list;
  for (size_t k = 0; k < shapes.size(); ++k) {
    nb::object a = empty(nb::cast(shapes[k]), dtypes[k]);
    list.append(a);
    outs.push_back(std::move(a));
  }
  ConvertedArrays c = convert_arrays(list, "output", {});
  *args = std::move(c.args);
  return outs;
}

ConvertedArrays convert_arrays(nb::handle seq, const char* what,
                               const std::vector<std::string>& names) {
  struct Keep {
    std::vector<ReadOnlyArray> in_arrays;
    std::vector<Array> out_arrays;
    std::vector<nb::object> objects;
  };
  auto keep = std::make_shared<Keep>();
  ConvertedArrays c;
  if (std::string(what) == "output") {
    c.args = tensor_args(seq, what, names, &keep->out_arrays, &keep->objects);
  } else {
    c.args = tensor_args(seq, what, names, &keep->in_arrays, &keep->objects);
  }
  c.keep = std::move(keep);
  return c;
}

void bind_weight_cache(nb::module_& m) {
  nb::class_<PyConstant>(m, "Constant",
                         "An input array the caller promises not to write while it passes the "
                         "same nonzero version; DVM packs it once as a matmul operand (weights). "
                         "dvm.constant() picks the version of a torch tensor itself.")
      .def(
          "__init__",
          [](PyConstant* c, nb::object array, uint64_t version) {
            if (version == 0) {
              throw StatusError(invalid_argument("dvm.Constant: the version must be nonzero"));
            }
            new (c) PyConstant{std::move(array), version};
          },
          nb::arg("array"), nb::arg("version"))
      .def_ro("array", &PyConstant::array)
      .def_ro("version", &PyConstant::version);
  nb::class_<WeightCacheStats>(m, "WeightCacheStats", "Counters of the packed-weight cache.")
      .def_ro("entries", &WeightCacheStats::entries)
      .def_ro("bytes", &WeightCacheStats::bytes)
      .def_ro("hits", &WeightCacheStats::hits)
      .def_ro("packs", &WeightCacheStats::packs)
      .def_ro("evictions", &WeightCacheStats::evictions)
      .def_ro("replaced", &WeightCacheStats::replaced)
      .def_ro("capacity", &WeightCacheStats::capacity)
      .def_ro("declined", &WeightCacheStats::declined)
      .def_ro("declined_bytes", &WeightCacheStats::declined_bytes)
      .def("__repr__", [](const WeightCacheStats& s) {
        std::ostringstream os;
        os << "WeightCacheStats(entries=" << s.entries << ", bytes=" << s.bytes
           << ", hits=" << s.hits << ", packs=" << s.packs << ", evictions=" << s.evictions
           << ", replaced=" << s.replaced << ", declined=" << s.declined
           << ", capacity=" << s.capacity << ")";
        return os.str();
      });
  m.def("weight_cache_stats", &weight_cache_stats);
  m.def("set_weight_cache_capacity", &set_weight_cache_capacity, nb::arg("bytes"),
        "Bytes of packed weights kept (default 1 GiB or DVM_WEIGHT_CACHE_MB); 0 disables.");
  m.def("clear_weight_cache", &clear_weight_cache, "Drops every entry and zeroes the counters.");
}

void bind_runtime(nb::module_& m) {
  bind_weight_cache(m);
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
