// KernelBuilder: records meta-ops, inserts the casts that type promotion needs, and checks
// ranks and constant dims as it goes. The first error is kept and returned by build().
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "ir/kernel_def.h"
#include "ops/dtype_rules.h"
#include "shape/shape_rules.h"

namespace dvm {

namespace {

constexpr const char* kUnaryNames[] = {
#define DVM_UNARY(Name, mnemonic, kind) mnemonic,
#include "dvm/ops.def"
};
constexpr const char* kBinaryNames[] = {
#define DVM_BINARY(Name, mnemonic, kind) mnemonic,
#include "dvm/ops.def"
};
constexpr const char* kReduceNames[] = {
#define DVM_REDUCE(Name, mnemonic) mnemonic,
#include "dvm/ops.def"
};

int dtype_rank(DType t) {
  switch (t) {
    case DType::kBool:
      return 0;
    case DType::kI32:
      return 1;
    case DType::kI64:
      return 2;
    case DType::kF16:
    case DType::kBF16:
      return 3;
    case DType::kF32:
      return 4;
  }
  return 0;
}

}  // namespace

const char* unary_op_name(UnaryOp op) {
  return kUnaryNames[static_cast<int>(op)];
}
const char* binary_op_name(BinaryOp op) {
  return kBinaryNames[static_cast<int>(op)];
}
const char* reduce_op_name(ReduceOp op) {
  return kReduceNames[static_cast<int>(op)];
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if ((a == DType::kF16 && b == DType::kBF16) || (a == DType::kBF16 && b == DType::kF16)) {
    return DType::kF32;
  }
  return dtype_rank(a) >= dtype_rank(b) ? a : b;
}

struct KernelBuilder::Impl {
  std::shared_ptr<ir::KernelDef> def = std::make_shared<ir::KernelDef>();
  Status error;
  bool built = false;

  void fail(const std::string& msg) {
    if (error.is_ok()) error = invalid_argument(def->name + ": " + msg);
  }
  bool ok(Value v) const { return v.valid() && v.id < static_cast<int>(def->nodes.size()); }
  const ir::Node& node(Value v) const { return def->nodes[v.id]; }
  Value add(ir::Node n) {
    def->nodes.push_back(std::move(n));
    return Value{static_cast<int>(def->nodes.size()) - 1};
  }
  std::string dims_str(const std::vector<Dim>& dims) const;
  bool check_value(Value v, const char* op) {
    if (ok(v)) return true;
    fail(std::string(op) + ": invalid value handle");
    return false;
  }
  Value cast_to(Value v, DType t);
  bool broadcast_shapes(const char* op, const std::vector<Dim>& a, const std::vector<Dim>& b,
                        std::vector<Dim>* out);
};

std::string KernelBuilder::Impl::dims_str(const std::vector<Dim>& dims) const {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) os << ", ";
    if (dims[i].is_symbol()) {
      os << def->symbols[dims[i].symbol_id()];
    } else {
      os << dims[i].value();
    }
  }
  os << "]";
  return os.str();
}

Value KernelBuilder::Impl::cast_to(Value v, DType t) {
  if (node(v).dtype == t) return v;
  ir::Node n;
  n.kind = ir::OpKind::kCast;
  n.dtype = t;
  n.inputs = {v.id};
  n.shape = node(v).shape;
  return add(std::move(n));
}

// Numpy broadcasting on symbolic dims. Dims that are unequal symbols are checked at bind time.
bool KernelBuilder::Impl::broadcast_shapes(const char* op, const std::vector<Dim>& a,
                                           const std::vector<Dim>& b, std::vector<Dim>* out) {
  int bad = shape::broadcast_dims(std::span<const Dim>(a), std::span<const Dim>(b), out,
                                  shape::Unproven::kDefer);
  if (bad < 0) return true;
  fail(std::string(op) + ": cannot broadcast shapes " + dims_str(a) + " and " + dims_str(b) +
       " (dim " + std::to_string(bad) + ")");
  return false;
}

KernelBuilder::KernelBuilder(std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->def->name = std::move(name);
}
KernelBuilder::~KernelBuilder() = default;

Dim KernelBuilder::symbol(const std::string& name) {
  auto& syms = impl_->def->symbols;
  auto it = std::find(syms.begin(), syms.end(), name);
  if (it != syms.end()) return Dim::symbol(static_cast<int>(it - syms.begin()));
  syms.push_back(name);
  return Dim::symbol(static_cast<int>(syms.size()) - 1);
}

Value KernelBuilder::load(const std::string& name, DType dtype, std::vector<Dim> dims) {
  if (dims.size() > static_cast<size_t>(kMaxRank)) {
    impl_->fail("load '" + name + "': rank " + std::to_string(dims.size()) + " exceeds " +
                std::to_string(kMaxRank));
    dims.resize(kMaxRank);
  }
  for (const Dim& d : dims) {
    if (!d.is_symbol() && d.value() < 0) impl_->fail("load '" + name + "': negative dim");
    if (d.is_symbol() && d.symbol_id() >= static_cast<int>(impl_->def->symbols.size())) {
      impl_->fail("load '" + name + "': unknown symbol");
    }
  }
  ir::Node n;
  n.kind = ir::OpKind::kLoad;
  n.dtype = dtype;
  n.slot = static_cast<int>(impl_->def->input_names.size());
  n.shape = std::move(dims);
  impl_->def->input_names.push_back(name);
  Value v = impl_->add(std::move(n));
  impl_->def->input_nodes.push_back(v.id);
  return v;
}

Value KernelBuilder::param(const std::string& name, DType dtype) {
  ir::Node n;
  n.kind = ir::OpKind::kParam;
  n.dtype = dtype;
  n.slot = static_cast<int>(impl_->def->param_names.size());
  impl_->def->param_names.push_back(name);
  impl_->def->param_dtypes.push_back(dtype);
  return impl_->add(std::move(n));
}

namespace {
// v truncated toward zero into int64, saturating (NaN and infinities: 0, as before): casting a
// double outside int64's range is undefined behaviour (a graph text's constant 2.2e49 reached
// it; UBSan, fuzz_graph).
int64_t saturated_int64(double v) {
  constexpr double kTwo63 = 9223372036854775808.0;  // 2^63, exact
  if (!std::isfinite(v)) return 0;
  if (v >= kTwo63) return std::numeric_limits<int64_t>::max();
  if (v < -kTwo63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}
}  // namespace

Value KernelBuilder::constant(double v, DType dtype) {
  ir::Node n;
  n.kind = ir::OpKind::kConst;
  n.dtype = dtype;
  n.fconst = v;
  n.iconst = saturated_int64(v);
  if (dtype == DType::kBool) n.iconst = v != 0;
  return impl_->add(std::move(n));
}

void KernelBuilder::store(const std::string& name, Value value) {
  if (!impl_->check_value(value, "store")) return;
  impl_->def->outputs.push_back({name, value.id});
}

void KernelBuilder::store(const std::string& name, Value value, DType dtype) {
  if (!impl_->check_value(value, "store")) return;
  store(name, cast(value, dtype));
}

Value KernelBuilder::unary(UnaryOp op, Value x) {
  if (!impl_->check_value(x, unary_op_name(op))) return {};
  DType t = impl_->node(x).dtype;
  x = impl_->cast_to(x, ops::unary_operand_dtype(op, t));
  ir::Node n;
  n.kind = ir::OpKind::kUnary;
  n.op = static_cast<uint8_t>(op);
  n.dtype = ops::unary_result_dtype(op, t);
  n.inputs = {x.id};
  n.shape = impl_->node(x).shape;
  return impl_->add(std::move(n));
}

Value KernelBuilder::binary(BinaryOp op, Value a, Value b) {
  if (!impl_->check_value(a, binary_op_name(op)) || !impl_->check_value(b, binary_op_name(op)))
    return {};
  DType ta = impl_->node(a).dtype, tb = impl_->node(b).dtype;
  DType t = ops::binary_operand_dtype(op, ta, tb);
  a = impl_->cast_to(a, t);
  b = impl_->cast_to(b, t);
  ir::Node n;
  n.kind = ir::OpKind::kBinary;
  n.op = static_cast<uint8_t>(op);
  n.dtype = ops::binary_result_dtype(op, ta, tb);
  n.inputs = {a.id, b.id};
  if (!impl_->broadcast_shapes(binary_op_name(op), impl_->node(a).shape, impl_->node(b).shape,
                               &n.shape))
    return {};
  return impl_->add(std::move(n));
}

Value KernelBuilder::binary(BinaryOp op, Value a, double b) {
  if (!impl_->check_value(a, binary_op_name(op))) return {};
  DType t = impl_->node(a).dtype;
  if (!is_float(t) && (std::floor(b) != b || !std::isfinite(b))) t = DType::kF32;
  return binary(op, a, constant(b, t));
}

Value KernelBuilder::binary(BinaryOp op, double a, Value b) {
  if (!impl_->check_value(b, binary_op_name(op))) return {};
  DType t = impl_->node(b).dtype;
  if (!is_float(t) && (std::floor(a) != a || !std::isfinite(a))) t = DType::kF32;
  return binary(op, constant(a, t), b);
}

Value KernelBuilder::select(Value cond, Value if_true, Value if_false) {
  if (!impl_->check_value(cond, "select") || !impl_->check_value(if_true, "select") ||
      !impl_->check_value(if_false, "select"))
    return {};
  cond = impl_->cast_to(cond, DType::kBool);
  DType t = promote_types(impl_->node(if_true).dtype, impl_->node(if_false).dtype);
  if_true = impl_->cast_to(if_true, t);
  if_false = impl_->cast_to(if_false, t);
  std::vector<Dim> s1, s2;
  if (!impl_->broadcast_shapes("select", impl_->node(cond).shape, impl_->node(if_true).shape,
                               &s1) ||
      !impl_->broadcast_shapes("select", s1, impl_->node(if_false).shape, &s2))
    return {};
  ir::Node n;
  n.kind = ir::OpKind::kSelect;
  n.dtype = t;
  n.inputs = {cond.id, if_true.id, if_false.id};
  n.shape = std::move(s2);
  return impl_->add(std::move(n));
}

Value KernelBuilder::cast(Value x, DType dtype) {
  if (!impl_->check_value(x, "cast")) return {};
  if (impl_->node(x).dtype == dtype) return x;
  return impl_->cast_to(x, dtype);
}

Value KernelBuilder::broadcast(Value x, std::vector<Dim> dims) {
  if (!impl_->check_value(x, "broadcast")) return {};
  const auto& in = impl_->node(x).shape;
  int bad = shape::expand_dims(std::span<const Dim>(in), std::span<const Dim>(dims),
                               shape::Unproven::kDefer);
  if (bad >= 0 || dims.size() > static_cast<size_t>(kMaxRank)) {
    impl_->fail("broadcast: cannot broadcast " + impl_->dims_str(in) + " to " +
                impl_->dims_str(dims) + " (dim " + std::to_string(std::max(bad, 0)) + ")");
    return {};
  }
  ir::Node n;
  n.kind = ir::OpKind::kBroadcast;
  n.dtype = impl_->node(x).dtype;
  n.inputs = {x.id};
  n.shape = std::move(dims);
  return impl_->add(std::move(n));
}

Value KernelBuilder::reshape(Value x, std::vector<Dim> dims) {
  if (!impl_->check_value(x, "reshape")) return {};
  shape::ReshapeError e = shape::check_reshape_target(std::span<const Dim>(dims));
  if (e == shape::ReshapeError::kNegativeDim) impl_->fail("reshape: negative dim");
  if (e == shape::ReshapeError::kSeveralInferred || dims.size() > static_cast<size_t>(kMaxRank)) {
    impl_->fail("reshape: at most one -1 dim and rank <= 8 allowed, got " + impl_->dims_str(dims));
    return {};
  }
  // Reshape of a reshape composes: only the final shape matters.
  int src = x.id;
  if (impl_->node(x).kind == ir::OpKind::kReshape) src = impl_->node(x).inputs[0];
  ir::Node n;
  n.kind = ir::OpKind::kReshape;
  n.dtype = impl_->node(x).dtype;
  n.inputs = {src};
  n.shape = std::move(dims);
  return impl_->add(std::move(n));
}

Value KernelBuilder::permute(Value x, std::vector<int> perm) {
  if (!impl_->check_value(x, "permute")) return {};
  const auto& in = impl_->node(x).shape;
  if (!shape::normalize_permutation(std::span<int>(perm), static_cast<int>(in.size()))) {
    impl_->fail("permute: invalid permutation for shape " + impl_->dims_str(in));
    return {};
  }
  ir::Node n;
  n.kind = ir::OpKind::kPermute;
  n.dtype = impl_->node(x).dtype;
  n.inputs = {x.id};
  for (int p : perm) {
    n.attr.push_back(p);
    n.shape.push_back(in[p]);
  }
  return impl_->add(std::move(n));
}

Value KernelBuilder::transpose(Value x, int axis0, int axis1) {
  if (!impl_->check_value(x, "transpose")) return {};
  int r = rank(x);
  if (!shape::normalize_axis(&axis0, r) || !shape::normalize_axis(&axis1, r)) {
    impl_->fail("transpose: axes out of range for rank " + std::to_string(r));
    return {};
  }
  std::vector<int> perm(r);
  for (int i = 0; i < r; ++i) perm[i] = i;
  std::swap(perm[axis0], perm[axis1]);
  return permute(x, perm);
}

Value KernelBuilder::slice(Value x, int axis, int64_t start, int64_t stop, int64_t step) {
  if (!impl_->check_value(x, "slice")) return {};
  int r = rank(x);
  if (!shape::normalize_axis(&axis, r) || step <= 0) {
    impl_->fail("slice: bad axis " + std::to_string(axis) + " or step " + std::to_string(step) +
                " for shape " + impl_->dims_str(impl_->node(x).shape));
    return {};
  }
  ir::Node n;
  n.kind = ir::OpKind::kSlice;
  n.dtype = impl_->node(x).dtype;
  n.inputs = {x.id};
  n.attr = {axis, start, stop, step};
  n.shape = impl_->node(x).shape;
  const Dim& d = n.shape[axis];
  if (!d.is_symbol()) {
    n.shape[axis] = Dim(shape::slice_dims(d.value(), start, stop, step).extent);
  } else {
    n.shape[axis] = Dim::symbol(d.symbol_id());  // extent resolved at bind time
  }
  return impl_->add(std::move(n));
}

Value KernelBuilder::concat(std::vector<Value> xs, int axis) {
  if (xs.empty()) {
    impl_->fail("concat: no inputs");
    return {};
  }
  for (Value v : xs)
    if (!impl_->check_value(v, "concat")) return {};
  int r = rank(xs[0]);
  if (!shape::normalize_axis(&axis, r)) {
    impl_->fail("concat: axis out of range for rank " + std::to_string(r));
    return {};
  }
  DType t = impl_->node(xs[0]).dtype;
  for (Value v : xs) t = promote_types(t, impl_->node(v).dtype);
  ir::Node n;
  n.kind = ir::OpKind::kConcat;
  n.dtype = t;
  n.attr = {axis};
  n.shape = impl_->node(xs[0]).shape;
  for (Value v : xs) {
    const std::vector<Dim>& first = impl_->node(xs[0]).shape;
    const std::vector<Dim>& part = impl_->node(v).shape;
    if (!shape::concat_fits(std::span<const Dim>(first), std::span<const Dim>(part), axis,
                            shape::Unproven::kDefer)) {
      impl_->fail("concat: shapes " + impl_->dims_str(first) + " and " + impl_->dims_str(part) +
                  " differ off axis " + std::to_string(axis));
      return {};
    }
    n.inputs.push_back(impl_->cast_to(v, t).id);
  }
  // The concat dim: the sum when every part is constant; otherwise one of the symbolic parts
  // stands for it (checks against symbols are deferred to bind time, where shapes are exact).
  int64_t total = 0;
  for (Value v : xs) {
    const Dim& d = impl_->node(v).shape[axis];
    if (d.is_symbol()) {
      n.shape[axis] = d;
      return impl_->add(std::move(n));
    }
    total += d.value();
  }
  n.shape[axis] = Dim(total);
  return impl_->add(std::move(n));
}

Value KernelBuilder::reduce(ReduceOp op, Value x, std::vector<int> axes, bool keepdims) {
  if (!impl_->check_value(x, reduce_op_name(op))) return {};
  if (!shape::normalize_axes(&axes, rank(x))) {
    impl_->fail(std::string(reduce_op_name(op)) + ": axis out of range for shape " +
                impl_->dims_str(impl_->node(x).shape));
    return {};
  }
  if (ops::is_arg_reduce(op) && axes.size() != 1) {
    impl_->fail(std::string(reduce_op_name(op)) + ": exactly one axis required");
    return {};
  }
  // Bool and integer inputs compute in a wider dtype; max/min of bool cast back.
  DType in = impl_->node(x).dtype;
  x = impl_->cast_to(x, ops::reduce_compute_dtype(op, in));
  ir::Node n;
  n.kind = ir::OpKind::kReduce;
  n.op = static_cast<uint8_t>(op);
  n.dtype = ops::is_arg_reduce(op) ? DType::kI64 : impl_->node(x).dtype;
  n.keepdims = keepdims;
  n.inputs = {x.id};
  for (int a : axes) n.attr.push_back(a);
  shape::reduce_dims(std::span<const Dim>(impl_->node(x).shape), std::span<const int>(axes),
                     keepdims, &n.shape);
  Value v = impl_->add(std::move(n));
  return impl_->cast_to(v, ops::reduce_result_dtype(op, in));
}

Value KernelBuilder::matmul(Value a, Value b, bool transpose_a, bool transpose_b) {
  if (!impl_->check_value(a, "matmul") || !impl_->check_value(b, "matmul")) return {};
  if (transpose_a && rank(a) >= 2) a = transpose(a, -1, -2);
  if (transpose_b && rank(b) >= 2) b = transpose(b, -1, -2);
  const auto& sa = impl_->node(a).shape;
  const auto& sb = impl_->node(b).shape;
  std::vector<Dim> out;
  switch (shape::matmul_dims(std::span<const Dim>(sa), std::span<const Dim>(sb), false, false, &out,
                             shape::Unproven::kDefer)) {
    case shape::MatMulError::kNone:
      break;
    case shape::MatMulError::kRank:
      impl_->fail("matmul: operands must have rank 2 to 4 (at most two batch dims), got " +
                  impl_->dims_str(sa) + " and " + impl_->dims_str(sb));
      return {};
    case shape::MatMulError::kContraction:
      impl_->fail("matmul: contraction dims differ: " + impl_->dims_str(sa) + " x " +
                  impl_->dims_str(sb));
      return {};
    case shape::MatMulError::kBatch:
      impl_->fail("matmul: cannot broadcast the batch dims of " + impl_->dims_str(sa) + " and " +
                  impl_->dims_str(sb));
      return {};
  }
  DType t = promote_types(impl_->node(a).dtype, impl_->node(b).dtype);
  if (!is_float(t)) {
    impl_->fail("matmul: integer operands are not supported (cast to f32 first)");
    return {};
  }
  a = impl_->cast_to(a, t);
  b = impl_->cast_to(b, t);
  ir::Node n;
  n.kind = ir::OpKind::kMatMul;
  n.dtype = t;
  n.inputs = {a.id, b.id};
  n.shape = std::move(out);
  return impl_->add(std::move(n));
}

std::vector<Dim> KernelBuilder::shape(Value v) const {
  return impl_->ok(v) ? impl_->node(v).shape : std::vector<Dim>{};
}
DType KernelBuilder::dtype(Value v) const {
  return impl_->ok(v) ? impl_->node(v).dtype : DType::kF32;
}
int KernelBuilder::rank(Value v) const {
  return impl_->ok(v) ? static_cast<int>(impl_->node(v).shape.size()) : 0;
}

StatusOr<Kernel> KernelBuilder::build() {
  if (impl_->built) return Status(StatusCode::kFailedPrecondition, "build() called twice");
  impl_->built = true;
  if (!impl_->error.is_ok()) return impl_->error;
  const ir::KernelDef& def = *impl_->def;
  if (def.outputs.empty()) return invalid_argument(def.name + ": kernel has no outputs");
  // Every symbol must be bound by some input dim.
  std::vector<bool> bound(def.symbols.size(), false);
  for (int node : def.input_nodes)
    for (const Dim& d : def.nodes[node].shape)
      if (d.is_symbol()) bound[d.symbol_id()] = true;
  for (size_t s = 0; s < bound.size(); ++s) {
    if (!bound[s]) {
      return invalid_argument(def.name + ": symbol '" + def.symbols[s] +
                              "' is not a dim of any input, so no call can bind it");
    }
  }
  return Kernel(impl_->def);
}

// ---- Kernel ------------------------------------------------------------------------------

const std::string& Kernel::name() const {
  return def_->name;
}
int Kernel::num_inputs() const {
  return static_cast<int>(def_->input_names.size());
}
int Kernel::num_outputs() const {
  return static_cast<int>(def_->outputs.size());
}
int Kernel::num_params() const {
  return static_cast<int>(def_->param_names.size());
}

std::string Kernel::to_string() const {
  std::ostringstream os;
  os << "kernel " << def_->name << "\n";
  for (size_t i = 0; i < def_->nodes.size(); ++i) {
    os << "  " << ir::node_label(*def_, static_cast<int>(i)) << "\n";
  }
  for (const auto& o : def_->outputs) os << "  store " << o.name << " = %" << o.node << "\n";
  return os.str();
}

}  // namespace dvm
