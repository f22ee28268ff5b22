// Bindings for dvm/lazy.h: the `dvm._dvm.lazy` submodule (lazy Tensor, WeakTensor, the ops,
// sync, stats, options). python/dvm/lazy.py builds the PyTorch lazy mode on top.
//
// The GIL stays held while a flush runs: a flush may release the Python objects that keep
// wrapped memory alive, and traces are per thread anyway.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <sstream>
#include <variant>

#include "bindings.h"
#include "dvm/lazy.h"

namespace dvm::python {
namespace {

namespace lz = dvm::lazy;

lz::Tensor checked(lz::Tensor t) {
  raise_if_error(t.status());
  return t;
}

// Releases what keeps wrapped Python memory alive with the GIL held, from whatever thread the
// last reference dies on (a flush at thread exit, say); leaks it after interpreter shutdown.
std::shared_ptr<void> gil_safe(std::shared_ptr<void> keep) {
  auto* holder = new std::shared_ptr<void>(std::move(keep));
  return std::shared_ptr<void>(holder, [](void* p) {
    auto* h = static_cast<std::shared_ptr<void>*>(p);
    if (!Py_IsInitialized()) return;
    nb::gil_scoped_acquire gil;
    delete h;
  });
}

lz::Tensor wrap(nb::handle array) {
  ConvertedArrays c = convert_arrays(nb::make_tuple(array), "input", {"x"});
  return checked(lz::Tensor::wrap(c.args[0], gil_safe(std::move(c.keep))));
}

// A leaf over memory the caller describes (python/dvm/lazy.py: a torch tensor's data_ptr, shape
// and strides, in elements), kept alive by `keep` (the tensor's storage: not the tensor, so a
// leaf cached on the tensor makes no reference cycle). Skips convert_arrays' attribute reads.
lz::Tensor wrap_strided(uintptr_t ptr, DType dtype, std::vector<int64_t> shape,
                        std::vector<int64_t> strides, nb::object keep, uint64_t version) {
  if (strides.size() != shape.size()) {
    raise_if_error(invalid_argument("lazy wrap: strides do not match the rank"));
  }
  TensorArg a;
  a.data = reinterpret_cast<void*>(ptr);
  a.dtype = dtype;
  int64_t hi = 0;
  bool empty = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (strides[i] < 0) raise_if_error(invalid_argument("lazy wrap: negative stride"));
    if (shape[i] == 0) empty = true;
    hi += (shape[i] - 1) * strides[i];
  }
  a.storage_elems = empty ? 0 : hi + 1;
  a.shape = std::move(shape);
  a.strides = std::move(strides);
  a.version = version;
  std::shared_ptr<void> k = std::make_shared<nb::object>(std::move(keep));
  return checked(lz::Tensor::wrap(a, gil_safe(std::move(k))));
}

// Stores a pending value into contiguous memory at `ptr` (a framework tensor allocated with the
// value's shape and dtype, kept alive by the caller until the value is ready).
void set_storage_ptr(lz::Tensor& t, uintptr_t ptr) {
  TensorArg a = TensorArg::contiguous(reinterpret_cast<void*>(ptr), t.dtype(), t.shape());
  raise_if_error(t.set_storage(a));
}

void set_storage(lz::Tensor& t, nb::handle array) {
  ConvertedArrays c = convert_arrays(nb::make_tuple(array), "output", {"storage"});
  raise_if_error(t.set_storage(c.args[0], gil_safe(std::move(c.keep))));
}

// Flushes the trace that holds `t` (any thread's), without the GIL: its owner may be waiting
// for the GIL while holding its trace.
void wait_for(const lz::Tensor& t) {
  Status st;
  {
    nb::gil_scoped_release release;
    st = t.data().status();
  }
  raise_if_error(st);
}

nb::object to_numpy(const lz::Tensor& t) {
  raise_if_error(t.status());
  nb::object np = nb::module_::import_("numpy");
  nb::object dvm_arrays = nb::module_::import_("dvm._arrays");
  nb::object out =
      np.attr("empty")(nb::cast(t.shape()), dvm_arrays.attr("numpy_dtype")(nb::cast(t.dtype())));
  ConvertedArrays c = convert_arrays(nb::make_tuple(out), "output", {"out"});
  raise_if_error(t.copy_to(c.args[0].data, static_cast<size_t>(t.numel() * dtype_size(t.dtype()))));
  return out;
}

// Copies the value into a caller-provided contiguous array (numpy or torch) of its shape.
void copy_into(const lz::Tensor& t, nb::handle array) {
  ConvertedArrays c = convert_arrays(nb::make_tuple(array), "output", {"out"});
  const TensorArg& a = c.args[0];
  if (a.dtype != t.dtype() || a.shape != t.shape()) {
    raise_if_error(invalid_argument("copy_into: the array must match the value's dtype and shape"));
  }
  raise_if_error(t.copy_to(a.data, static_cast<size_t>(t.numel() * dtype_size(t.dtype()))));
}

using Operand = std::variant<lz::Tensor, double>;

lz::Tensor binary_op(BinaryOp op, const Operand& a, const Operand& b) {
  if (auto* x = std::get_if<lz::Tensor>(&a)) {
    if (auto* y = std::get_if<lz::Tensor>(&b)) return checked(lz::binary(op, *x, *y));
    return checked(lz::binary(op, *x, std::get<double>(b)));
  }
  if (auto* y = std::get_if<lz::Tensor>(&b))
    return checked(lz::binary(op, std::get<double>(a), *y));
  raise_if_error(invalid_argument("binary: at least one operand must be a lazy Tensor"));
  return {};
}

lz::Tensor opt(const std::optional<lz::Tensor>& t) {
  return t ? *t : lz::Tensor();
}

std::string stats_repr(const lz::Stats& s) {
  std::ostringstream os;
  os << "lazy.Stats(ops_recorded=" << s.ops_recorded << ", flushes=" << s.flushes
     << ", plan_cache_hits=" << s.plan_cache_hits << ", plan_cache_misses=" << s.plan_cache_misses
     << ", kernels_launched=" << s.kernels_launched << ", values_stored=" << s.values_stored
     << ", bytes_stored=" << s.bytes_stored << ", intermediates_elided=" << s.intermediates_elided
     << ", ops_dropped=" << s.ops_dropped << ")";
  return os.str();
}

void bind_tensor(nb::module_& m) {
  using T = lz::Tensor;
  nb::class_<T>(m, "Tensor",
                "A lazy tensor: a handle to a value that is pending (recorded), ready or an "
                "error. Ops on it record into the calling thread's trace.")
      .def_static("wrap", &wrap, nb::arg("array"),
                  "Wraps a numpy array or torch CPU tensor, zero-copy (kept alive).")
      .def_static("_wrap_strided", &wrap_strided, nb::arg("ptr"), nb::arg("dtype"),
                  nb::arg("shape"), nb::arg("strides"), nb::arg("keep"), nb::arg("version") = 0)
      .def_prop_ro("shape", [](const T& t) { return t.shape(); })
      .def_prop_ro("dtype", [](const T& t) { return t.dtype(); })
      .def_prop_ro("rank", &T::rank)
      .def_prop_ro("numel", &T::numel)
      .def_prop_ro("is_pending", &T::is_pending)
      .def_prop_ro("defined", &T::defined)
      .def("same_as", &T::same_as)
      .def("numpy", &to_numpy, "Flushes if pending; returns a copy as a numpy array.")
      .def("wait", &wait_for, "Flushes the trace holding this value (of any thread) if pending.")
      .def("copy_into", &copy_into, nb::arg("array"))
      .def("item", [](const T& t) { return value_or_raise(t.item()); })
      .def("to_string", &T::to_string, nb::arg("max_elements") = 64)
      .def("__repr__", [](const T& t) { return "lazy.Tensor(" + t.to_string(16) + ")"; })
      .def(
          "prepare_write", [](T& t) { raise_if_error(t.mutable_data().status()); },
          "Flushes what reads or produces this value's memory before it is written in place.")
      .def("set_storage", &set_storage, nb::arg("array"))
      .def("_set_storage_ptr", &set_storage_ptr, nb::arg("ptr"))
      .def("__add__", [](const T& a, const Operand& b) { return binary_op(BinaryOp::kAdd, a, b); })
      .def("__radd__", [](const T& a, double b) { return binary_op(BinaryOp::kAdd, b, a); })
      .def("__sub__", [](const T& a, const Operand& b) { return binary_op(BinaryOp::kSub, a, b); })
      .def("__rsub__", [](const T& a, double b) { return binary_op(BinaryOp::kSub, b, a); })
      .def("__mul__", [](const T& a, const Operand& b) { return binary_op(BinaryOp::kMul, a, b); })
      .def("__rmul__", [](const T& a, double b) { return binary_op(BinaryOp::kMul, b, a); })
      .def("__truediv__",
           [](const T& a, const Operand& b) { return binary_op(BinaryOp::kDiv, a, b); })
      .def("__rtruediv__", [](const T& a, double b) { return binary_op(BinaryOp::kDiv, b, a); })
      .def("__matmul__", [](const T& a, const T& b) { return checked(lz::matmul(a, b)); })
      .def("__neg__", [](const T& a) { return checked(lz::unary(UnaryOp::kNeg, a)); });

  nb::class_<lz::WeakTensor>(m, "WeakTensor",
                             "A reference that does not keep a pending value alive.")
      .def(nb::init<const T&>(), nb::arg("tensor"))
      .def("lock", [](const lz::WeakTensor& w) -> std::optional<T> {
        T t = w.lock();
        if (!t.defined()) return std::nullopt;
        return t;
      });
}

void bind_ops(nb::module_& m) {
  using T = lz::Tensor;
  m.def(
      "scalar", [](double v, DType t) { return checked(lz::scalar(v, t)); }, nb::arg("value"),
      nb::arg("dtype") = DType::kF32);
  m.def("unary", [](UnaryOp op, const T& x) { return checked(lz::unary(op, x)); });
  m.def("binary", &binary_op, nb::arg("op"), nb::arg("a"), nb::arg("b"));
  m.def("select", [](const T& c, const T& a, const T& b) { return checked(lz::select(c, a, b)); });
  m.def("cast", [](const T& x, DType t) { return checked(lz::cast(x, t)); });
  m.def("expand", [](const T& x, std::vector<int64_t> s) { return checked(lz::expand(x, s)); });
  m.def("reshape", [](const T& x, std::vector<int64_t> s) { return checked(lz::reshape(x, s)); });
  m.def("permute", [](const T& x, std::vector<int> p) { return checked(lz::permute(x, p)); });
  m.def("transpose", [](const T& x, int a, int b) { return checked(lz::transpose(x, a, b)); });
  m.def("unsqueeze", [](const T& x, int a) { return checked(lz::unsqueeze(x, a)); });
  m.def("squeeze", [](const T& x, int a) { return checked(lz::squeeze(x, a)); });
  m.def(
      "slice",
      [](const T& x, int axis, int64_t start, int64_t stop, int64_t step) {
        return checked(lz::slice(x, axis, start, stop, step));
      },
      nb::arg("x"), nb::arg("axis"), nb::arg("start"), nb::arg("stop") = kSliceEnd,
      nb::arg("step") = 1);
  m.def("concat", [](const std::vector<T>& xs, int axis) { return checked(lz::concat(xs, axis)); });
  m.def("split", [](const T& x, const std::vector<int64_t>& sizes, int axis) {
    std::vector<T> out = lz::split(x, sizes, axis);
    for (const T& t : out) raise_if_error(t.status());
    return out;
  });
  m.def(
      "reduce",
      [](ReduceOp op, const T& x, std::vector<int> axes, bool keepdims) {
        return checked(lz::reduce(op, x, axes, keepdims));
      },
      nb::arg("op"), nb::arg("x"), nb::arg("axes"), nb::arg("keepdims") = false);
  m.def(
      "matmul",
      [](const T& a, const T& b, bool ta, bool tb) { return checked(lz::matmul(a, b, ta, tb)); },
      nb::arg("a"), nb::arg("b"), nb::arg("transpose_a") = false, nb::arg("transpose_b") = false);
  m.def("index_select",
        [](const T& x, int axis, const T& i) { return checked(lz::index_select(x, axis, i)); });
  m.def("gather", [](const T& x, int axis, const T& i) { return checked(lz::gather(x, axis, i)); });
  m.def("cumsum", [](const T& x, int axis) { return checked(lz::cumsum(x, axis)); });
  m.def(
      "iota",
      [](std::vector<int64_t> s, int axis, DType t) { return checked(lz::iota(s, axis, t)); },
      nb::arg("shape"), nb::arg("axis"), nb::arg("dtype") = DType::kI64);
  m.def("softmax", [](const T& x, int axis) { return checked(lz::softmax(x, axis)); });
  m.def("log_softmax", [](const T& x, int axis) { return checked(lz::log_softmax(x, axis)); });
  m.def(
      "layer_norm",
      [](const T& x, const std::optional<T>& w, const std::optional<T>& b, double eps, int n) {
        return checked(lz::layer_norm(x, opt(w), opt(b), eps, n));
      },
      nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
      nb::arg("eps") = 1e-5, nb::arg("num_axes") = 1);
  m.def(
      "rms_norm",
      [](const T& x, const std::optional<T>& w, double eps, int n) {
        return checked(lz::rms_norm(x, opt(w), eps, n));
      },
      nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("eps") = 1e-6, nb::arg("num_axes") = 1);
  m.def(
      "gelu", [](const T& x, bool tanh) { return checked(lz::gelu(x, tanh)); }, nb::arg("x"),
      nb::arg("tanh_approximation") = false);
  m.def("silu", [](const T& x) { return checked(lz::silu(x)); });
  m.def("swiglu", [](const T& g, const T& u) { return checked(lz::swiglu(g, u)); });
  m.def(
      "linear",
      [](const T& x, const T& w, const std::optional<T>& b) {
        return checked(lz::linear(x, w, opt(b)));
      },
      nb::arg("x"), nb::arg("weight"), nb::arg("bias") = nb::none());
  m.def("embedding", [](const T& w, const T& ids) { return checked(lz::embedding(w, ids)); });
  m.def(
      "variance",
      [](const T& x, std::vector<int> axes, double correction, bool keepdims) {
        return checked(lz::variance(x, axes, correction, keepdims));
      },
      nb::arg("x"), nb::arg("axes"), nb::arg("correction") = 1.0, nb::arg("keepdims") = false);
  m.def(
      "std_dev",
      [](const T& x, std::vector<int> axes, double correction, bool keepdims) {
        return checked(lz::std_dev(x, axes, correction, keepdims));
      },
      nb::arg("x"), nb::arg("axes"), nb::arg("correction") = 1.0, nb::arg("keepdims") = false);
  m.def("cross_entropy", [](const T& l, const T& t) { return checked(lz::cross_entropy(l, t)); });
  m.def(
      "attention",
      [](const T& q, const T& k, const T& v, const std::optional<T>& mask, bool causal,
         double scale) { return checked(lz::attention(q, k, v, opt(mask), causal, scale)); },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask") = nb::none(),
      nb::arg("causal") = false, nb::arg("scale") = 0.0);
  m.def(
      "clamp",
      [](const T& x, std::optional<double> lo, std::optional<double> hi) {
        return checked(lz::clamp(x, lo, hi));
      },
      nb::arg("x"), nb::arg("lo") = nb::none(), nb::arg("hi") = nb::none());
}

void bind_runtime_state(nb::module_& m) {
  nb::enum_<lz::FlushReason>(m, "FlushReason")
      .value("OBSERVE", lz::FlushReason::kObserve)
      .value("SYNC", lz::FlushReason::kSync)
      .value("SIZE_BOUND", lz::FlushReason::kSizeBound)
      .value("UNSUPPORTED", lz::FlushReason::kUnsupported)
      .value("WRITE", lz::FlushReason::kWrite)
      .value("OTHER_THREAD", lz::FlushReason::kOtherThread);

  nb::class_<lz::Options>(m, "Options")
      .def(nb::init<>())
      .def_rw("max_trace_ops", &lz::Options::max_trace_ops)
      .def_rw("plan_cache_capacity", &lz::Options::plan_cache_capacity)
      .def_rw("fuse", &lz::Options::fuse)
      .def_rw("num_threads", &lz::Options::num_threads);

  nb::class_<lz::Stats>(m, "Stats", "Process-wide lazy-runtime counters.")
      .def(nb::init<>())
      .def_ro("ops_recorded", &lz::Stats::ops_recorded)
      .def_ro("flushes", &lz::Stats::flushes)
      .def_prop_ro("flushes_by_reason",
                   [](const lz::Stats& s) {
                     nb::dict d;
                     for (int i = 0; i < lz::kNumFlushReasons; ++i) {
                       d[lz::flush_reason_name(static_cast<lz::FlushReason>(i))] =
                           s.flushes_by_reason[i];
                     }
                     return d;
                   })
      .def_ro("plan_cache_hits", &lz::Stats::plan_cache_hits)
      .def_ro("plan_cache_misses", &lz::Stats::plan_cache_misses)
      .def_ro("specialised_classes", &lz::Stats::specialised_classes)
      .def_ro("kernels_launched", &lz::Stats::kernels_launched)
      .def_ro("native_launched", &lz::Stats::native_launched)
      .def_ro("programs_encoded", &lz::Stats::programs_encoded)
      .def_ro("values_stored", &lz::Stats::values_stored)
      .def_ro("bytes_stored", &lz::Stats::bytes_stored)
      .def_ro("intermediates_elided", &lz::Stats::intermediates_elided)
      .def_ro("ops_dropped", &lz::Stats::ops_dropped)
      .def_ro("compile_us", &lz::Stats::compile_us)
      .def_ro("encode_us", &lz::Stats::encode_us)
      .def_ro("run_us", &lz::Stats::run_us)
      .def_ro("flush_us", &lz::Stats::flush_us)
      .def("__repr__", &stats_repr);

  m.def(
      "sync", [](lz::FlushReason r) { raise_if_error(lz::sync(r)); },
      nb::arg("reason") = lz::FlushReason::kSync, "Flushes the calling thread's trace.");
  m.def("pending_ops", &lz::pending_ops);
  m.def("stats", &lz::stats);
  m.def("reset_stats", &lz::reset_stats);
  m.def("set_options", &lz::set_options, nb::arg("options"));
  m.def("options", &lz::options);
  m.def("clear_plan_cache", &lz::clear_plan_cache);
  m.def("plan_cache_size", &lz::plan_cache_size);
}

}  // namespace

void bind_lazy(nb::module_& m) {
  nb::module_ lazy = m.def_submodule("lazy", "Lazy tensors: runtime fusion of eager ops.");
  bind_tensor(lazy);
  bind_ops(lazy);
  bind_runtime_state(lazy);
}

}  // namespace dvm::python
