// Bindings for dvm/kernel.h: Dim, Value, the op enums (members derived from the ops.def
// X-macro table), KernelBuilder and Kernel.
//
// Python's KernelBuilder wraps the C++ one so that a builder used after build() raises instead
// of changing a definition the built Kernel shares, and so that it can record the kernel's
// signature (argument names and dtypes), which the convenience call uses to allocate outputs.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <sstream>

#include "bindings.h"

namespace dvm::python {
namespace {

constexpr const char* kUnaryTableNames[] = {
#define DVM_UNARY(Name, mnemonic, kind) #Name,
#include "dvm/ops.def"
};
constexpr const char* kBinaryTableNames[] = {
#define DVM_BINARY(Name, mnemonic, kind) #Name,
#include "dvm/ops.def"
};
constexpr const char* kReduceTableNames[] = {
#define DVM_REDUCE(Name, mnemonic) #Name,
#include "dvm/ops.def"
};

template <typename Op, size_t N>
void bind_op_enum(nb::module_& m, const char* name, const char* doc,
                  const char* const (&table)[N]) {
  nb::enum_<Op> e(m, name, doc);
  for (size_t i = 0; i < N; ++i) e.value(upper_snake(table[i]).c_str(), static_cast<Op>(i));
}

class PyKernelBuilder {
 public:
  explicit PyKernelBuilder(std::string name)
      : name_(name),
        kb_(std::make_unique<KernelBuilder>(std::move(name))),
        sig_(std::make_shared<KernelSignature>()) {}

  KernelBuilder& kb() {
    if (!kb_) {
      throw StatusError(Status(StatusCode::kFailedPrecondition,
                               name_ + ": KernelBuilder used after build(); start a new one"));
    }
    return *kb_;
  }

  Dim symbol(const std::string& name) {
    Dim d = kb().symbol(name);
    if (static_cast<size_t>(d.symbol_id()) == sig_->symbols.size()) sig_->symbols.push_back(name);
    return d;
  }
  Value load(const std::string& name, DType dtype, std::vector<Dim> dims) {
    Value v = kb().load(name, dtype, std::move(dims));
    sig_->input_names.push_back(name);
    sig_->input_dtypes.push_back(dtype);
    return v;
  }
  Value param(const std::string& name, DType dtype) {
    Value v = kb().param(name, dtype);
    sig_->param_names.push_back(name);
    sig_->param_dtypes.push_back(dtype);
    return v;
  }
  void store(const std::string& name, Value value, std::optional<DType> dtype) {
    KernelBuilder& b = kb();
    DType t = dtype ? *dtype : b.dtype(value);
    if (dtype) {
      b.store(name, value, *dtype);
    } else {
      b.store(name, value);
    }
    sig_->output_names.push_back(name);
    sig_->output_dtypes.push_back(t);
  }
  PyKernel build() {
    StatusOr<Kernel> k = kb().build();
    kb_.reset();
    return PyKernel{value_or_raise(std::move(k)), sig_};
  }

 private:
  std::string name_;
  std::unique_ptr<KernelBuilder> kb_;  // null once built
  std::shared_ptr<KernelSignature> sig_;
};

// `axes`: None (all axes), an int, or a sequence of ints.
std::vector<int> axes_arg(nb::handle axes) {
  if (axes.is_none()) return {};
  if (nb::isinstance<nb::int_>(axes)) return {nb::cast<int>(axes)};
  return nb::cast<std::vector<int>>(axes);
}

std::string dim_repr(const Dim& d) {
  return d.is_symbol() ? "Dim.symbol(" + std::to_string(d.symbol_id()) + ")"
                       : "Dim(" + std::to_string(d.value()) + ")";
}

// A binary op taking tensors or Python scalars on either side.
template <typename PyClass>
void def_binary(PyClass& cls, const char* name, BinaryOp op) {
  cls.def(
         name, [op](PyKernelBuilder& b, Value x, Value y) { return b.kb().binary(op, x, y); },
         nb::arg("a"), nb::arg("b"))
      .def(
          name, [op](PyKernelBuilder& b, Value x, double y) { return b.kb().binary(op, x, y); },
          nb::arg("a"), nb::arg("b"))
      .def(
          name, [op](PyKernelBuilder& b, double x, Value y) { return b.kb().binary(op, x, y); },
          nb::arg("a"), nb::arg("b"));
}

template <typename PyClass>
void def_reduce(PyClass& cls, const char* name, ReduceOp op) {
  cls.def(
      name,
      [op](PyKernelBuilder& b, Value x, nb::handle axes, bool keepdims) {
        return b.kb().reduce(op, x, axes_arg(axes), keepdims);
      },
      nb::arg("x"), nb::arg("axes").none() = nb::none(), nb::arg("keepdims") = false);
}

void bind_kernel_builder(nb::module_& m) {
  using B = PyKernelBuilder;
  nb::class_<B> cls(m, "KernelBuilder",
                    "Describes a fused operator once as a DAG of meta-ops; build() returns a "
                    "Kernel. Errors are recorded and raised by build() (first error wins).");
  cls.def(nb::init<std::string>(), nb::arg("name"))
      .def("symbol", &B::symbol, nb::arg("name"), "A symbolic dim, bound from input shapes.")
      .def("load", &B::load, nb::arg("name"), nb::arg("dtype"), nb::arg("dims"),
           "An input tensor (argument slot in call order); dims are ints or symbols.")
      .def("param", &B::param, nb::arg("name"), nb::arg("dtype"),
           "A run-time scalar, passed in run(params=...); changing it never re-encodes.")
      .def(
          "constant", [](B& b, double v, DType dtype) { return b.kb().constant(v, dtype); },
          nb::arg("value"), nb::arg("dtype") = DType::kF32)
      .def("store", &B::store, nb::arg("name"), nb::arg("value"),
           nb::arg("dtype").none() = nb::none(),
           "An output (slot in call order), cast to dtype if given.")
      .def(
          "unary", [](B& b, UnaryOp op, Value x) { return b.kb().unary(op, x); }, nb::arg("op"),
          nb::arg("x"))
      .def(
          "binary", [](B& b, BinaryOp op, Value x, Value y) { return b.kb().binary(op, x, y); },
          nb::arg("op"), nb::arg("a"), nb::arg("b"))
      .def(
          "binary", [](B& b, BinaryOp op, Value x, double y) { return b.kb().binary(op, x, y); },
          nb::arg("op"), nb::arg("a"), nb::arg("b"))
      .def(
          "binary", [](B& b, BinaryOp op, double x, Value y) { return b.kb().binary(op, x, y); },
          nb::arg("op"), nb::arg("a"), nb::arg("b"))
      .def(
          "select", [](B& b, Value c, Value t, Value f) { return b.kb().select(c, t, f); },
          nb::arg("cond"), nb::arg("if_true"), nb::arg("if_false"))
      .def(
          "cast", [](B& b, Value x, DType t) { return b.kb().cast(x, t); }, nb::arg("x"),
          nb::arg("dtype"))
      .def(
          "broadcast",
          [](B& b, Value x, std::vector<Dim> dims) { return b.kb().broadcast(x, std::move(dims)); },
          nb::arg("x"), nb::arg("dims"))
      .def(
          "reshape",
          [](B& b, Value x, std::vector<Dim> dims) { return b.kb().reshape(x, std::move(dims)); },
          nb::arg("x"), nb::arg("dims"), "Reshape preserving the element count; one dim may be -1.")
      .def(
          "permute",
          [](B& b, Value x, std::vector<int> perm) { return b.kb().permute(x, std::move(perm)); },
          nb::arg("x"), nb::arg("perm"))
      .def(
          "transpose", [](B& b, Value x, int a0, int a1) { return b.kb().transpose(x, a0, a1); },
          nb::arg("x"), nb::arg("axis0"), nb::arg("axis1"))
      .def(
          "slice",
          [](B& b, Value x, int axis, int64_t start, std::optional<int64_t> stop, int64_t step) {
            return b.kb().slice(x, axis, start, stop ? *stop : kSliceEnd, step);
          },
          nb::arg("x"), nb::arg("axis"), nb::arg("start") = 0, nb::arg("stop").none() = nb::none(),
          nb::arg("step") = 1,
          "x[start:stop:step] along axis (Python semantics; stop=None: to the end).")
      .def(
          "concat",
          [](B& b, std::vector<Value> xs, int axis) { return b.kb().concat(std::move(xs), axis); },
          nb::arg("xs"), nb::arg("axis"))
      .def(
          "reduce",
          [](B& b, ReduceOp op, Value x, nb::handle axes, bool keepdims) {
            return b.kb().reduce(op, x, axes_arg(axes), keepdims);
          },
          nb::arg("op"), nb::arg("x"), nb::arg("axes").none() = nb::none(),
          nb::arg("keepdims") = false, "Reduction over axes (None: all axes).")
      .def(
          "matmul",
          [](B& b, Value x, Value y, bool ta, bool tb) { return b.kb().matmul(x, y, ta, tb); },
          nb::arg("a"), nb::arg("b"), nb::arg("transpose_a") = false,
          nb::arg("transpose_b") = false)
      .def(
          "shape", [](B& b, Value v) { return b.kb().shape(v); }, nb::arg("value"))
      .def(
          "dtype", [](B& b, Value v) { return b.kb().dtype(v); }, nb::arg("value"))
      .def(
          "rank", [](B& b, Value v) { return b.kb().rank(v); }, nb::arg("value"))
      .def("build", &B::build, "Validates and freezes the definition; raises DvmError.");
  def_binary(cls, "add", BinaryOp::kAdd);
  def_binary(cls, "sub", BinaryOp::kSub);
  def_binary(cls, "mul", BinaryOp::kMul);
  def_binary(cls, "div", BinaryOp::kDiv);
  def_reduce(cls, "sum", ReduceOp::kSum);
  def_reduce(cls, "max", ReduceOp::kMax);
  def_reduce(cls, "mean", ReduceOp::kMean);
}

void bind_kernel_class(nb::module_& m) {
  nb::class_<PyKernel>(m, "Kernel", "An immutable, built kernel definition.")
      .def_prop_ro("name", [](const PyKernel& k) { return k.kernel.name(); })
      .def_prop_ro("num_inputs", [](const PyKernel& k) { return k.kernel.num_inputs(); })
      .def_prop_ro("num_outputs", [](const PyKernel& k) { return k.kernel.num_outputs(); })
      .def_prop_ro("num_params", [](const PyKernel& k) { return k.kernel.num_params(); })
      .def_prop_ro("symbols", [](const PyKernel& k) { return k.signature->symbols; })
      .def_prop_ro("input_names", [](const PyKernel& k) { return k.signature->input_names; })
      .def_prop_ro("input_dtypes", [](const PyKernel& k) { return k.signature->input_dtypes; })
      .def_prop_ro("output_names", [](const PyKernel& k) { return k.signature->output_names; })
      .def_prop_ro("output_dtypes", [](const PyKernel& k) { return k.signature->output_dtypes; })
      .def_prop_ro("param_names", [](const PyKernel& k) { return k.signature->param_names; })
      .def_prop_ro("param_dtypes", [](const PyKernel& k) { return k.signature->param_dtypes; })
      .def("to_string", [](const PyKernel& k) { return k.kernel.to_string(); })
      .def("__str__", [](const PyKernel& k) { return k.kernel.to_string(); })
      .def("__repr__", [](const PyKernel& k) {
        std::ostringstream os;
        os << "<dvm.Kernel '" << k.kernel.name() << "': " << k.kernel.num_inputs() << " inputs, "
           << k.kernel.num_outputs() << " outputs, " << k.kernel.num_params() << " params>";
        return os.str();
      });
}

}  // namespace

void bind_kernel(nb::module_& m) {
  bind_op_enum<UnaryOp>(m, "UnaryOp", "Elementwise unary meta-ops (ops.def).", kUnaryTableNames);
  bind_op_enum<BinaryOp>(m, "BinaryOp", "Elementwise binary meta-ops (ops.def).",
                         kBinaryTableNames);
  bind_op_enum<ReduceOp>(m, "ReduceOp", "Reductions (ops.def).", kReduceTableNames);
  m.def("unary_op_name", &unary_op_name, nb::arg("op"), "The op's mnemonic.");
  m.def("binary_op_name", &binary_op_name, nb::arg("op"), "The op's mnemonic.");
  m.def("reduce_op_name", &reduce_op_name, nb::arg("op"), "The op's mnemonic.");
  m.attr("MAX_RANK") = kMaxRank;

  nb::class_<Dim>(m, "Dim", "A dimension: a non-negative constant or a kernel symbol.")
      .def(nb::init<int64_t>(), nb::arg("value") = 0)
      .def_static("symbol", &Dim::symbol, nb::arg("id"))
      .def_prop_ro("is_symbol", &Dim::is_symbol)
      .def_prop_ro("value", &Dim::value)
      .def_prop_ro("symbol_id", &Dim::symbol_id)
      .def("__eq__", [](const Dim& a, const Dim& b) { return a == b; })
      .def("__hash__",
           [](const Dim& d) {
             return std::hash<int64_t>()(d.value()) ^ (std::hash<int>()(d.symbol_id()) << 1);
           })
      .def("__repr__", &dim_repr);
  nb::implicitly_convertible<int64_t, Dim>();

  nb::class_<Value>(m, "Value", "A tensor value inside a KernelBuilder (a handle).")
      .def(nb::init<>(), "An invalid handle.")
      .def_ro("id", &Value::id)
      .def_prop_ro("valid", &Value::valid)
      .def("__eq__", [](const Value& a, const Value& b) { return a.id == b.id; })
      .def("__hash__", [](const Value& v) { return std::hash<int>()(v.id); })
      .def("__repr__", [](const Value& v) { return "Value(%" + std::to_string(v.id) + ")"; });

  bind_kernel_builder(m);
  bind_kernel_class(m);
}

}  // namespace dvm::python
