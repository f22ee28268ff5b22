// The scalar reference executor. Every node is computed whole, element by element, into a
// dense row-major buffer; all data movement (broadcast, permute, slice, concat, strided
// loads and stores) is expressed as one strided index map, so there is a single place where
// addressing can be wrong. Outputs are written only after every node evaluated, so an error
// anywhere leaves the outputs untouched.
#include "ir/reference.h"

#include <algorithm>
#include <array>
#include <type_traits>
#include <utility>

#include "ops/scalar_ops.h"

namespace dvm {

namespace ir {

namespace {

// The spec's semantics, used throughout this file.
using namespace ops;  // NOLINT(build/namespaces)

using Index = std::array<int64_t, kMaxRank>;

// RefValue::ctype() relies on the variant alternatives following CType's order.
static_assert(static_cast<int>(CType::kF32) == 0 && static_cast<int>(CType::kI32) == 1 &&
              static_cast<int>(CType::kI64) == 2);

// ---- Index arithmetic ------------------------------------------------------------------

// A strided window onto a dense buffer: element `idx` of the window is source element
// offset + sum(idx[i] * strides[i]). Every data-movement op is one of these.
struct View {
  int64_t offset = 0;
  Index strides{};
};

Index dense_strides(const CShape& s) {
  Index st{};
  int64_t acc = 1;
  for (int i = s.rank - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= s.d[i];
  }
  return st;
}

int64_t view_offset(const View& v, const Index& idx, int rank) {
  int64_t off = v.offset;
  for (int i = 0; i < rank; ++i) off += idx[i] * v.strides[i];
  return off;
}

// Calls fn(flat, idx) for every element of `shape` in row-major order; nothing when empty.
template <typename Fn>
void for_each_index(const CShape& shape, Fn&& fn) {
  const int64_t n = shape.numel();
  Index idx{};
  for (int64_t flat = 0; flat < n; ++flat) {
    fn(flat, idx);
    for (int a = shape.rank - 1; a >= 0; --a) {
      if (++idx[a] < shape.d[a]) break;
      idx[a] = 0;
    }
  }
}

// Numpy broadcasting of `in` to `out`: dims are right-aligned; a size-1 dim repeats (stride 0).
View broadcast_view(const CShape& in, const CShape& out) {
  const Index src = dense_strides(in);
  View v;
  const int lead = out.rank - in.rank;
  for (int i = 0; i < in.rank; ++i) v.strides[lead + i] = in.d[i] == 1 ? 0 : src[i];
  return v;
}

// Output axis i walks input axis perm[i].
View permute_view(const CShape& in, const std::vector<int64_t>& perm) {
  const Index src = dense_strides(in);
  View v;
  for (int i = 0; i < in.rank; ++i) v.strides[i] = src[perm[i]];
  return v;
}

View slice_view(const CShape& in, int axis, const ir::SliceBounds& b) {
  View v;
  v.strides = dense_strides(in);
  v.offset = b.start * v.strides[axis];
  v.strides[axis] *= b.step;
  return v;
}

// ---- Values ----------------------------------------------------------------------------

RefValue make_value(CType t, const CShape& shape) {
  RefValue v;
  v.shape = shape;
  const auto n = static_cast<size_t>(shape.numel());
  switch (t) {
    case CType::kF32:
      v.data = std::vector<float>(n);
      break;
    case CType::kI32:
      v.data = std::vector<int32_t>(n);
      break;
    case CType::kI64:
      v.data = std::vector<int64_t>(n);
      break;
  }
  return v;
}

template <typename T>
RefValue wrap_value(const CShape& shape, std::vector<T> data) {
  RefValue v;
  v.shape = shape;
  v.data = std::move(data);
  return v;
}

// `src` seen through `view` as a dense value of `shape`.
RefValue gather(const RefValue& src, const View& view, const CShape& shape) {
  return std::visit(
      [&](const auto& s) {
        std::remove_cvref_t<decltype(s)> out(static_cast<size_t>(shape.numel()));
        for_each_index(shape, [&](int64_t flat, const Index& idx) {
          out[flat] = s[view_offset(view, idx, shape.rank)];
        });
        return wrap_value(shape, std::move(out));
      },
      src.data);
}

// Writes all of `src` into `dst` at the positions `view` maps src's indices to.
void scatter(const RefValue& src, const View& view, RefValue* dst) {
  std::visit(
      [&](auto& d) {
        const auto& s = std::get<std::remove_cvref_t<decltype(d)>>(src.data);
        for_each_index(src.shape, [&](int64_t flat, const Index& idx) {
          d[view_offset(view, idx, src.shape.rank)] = s[flat];
        });
      },
      dst->data);
}

RefValue broadcast_to(const RefValue& x, const CShape& shape) {
  if (x.shape == shape) return x;
  return gather(x, broadcast_view(x.shape, shape), shape);
}

// ---- Scalar conversions (all through scalar_ops.h) --------------------------------------

float to_f32(float x) {
  return x;
}
float to_f32(int32_t x) {
  return i32_to_f32(x);
}
float to_f32(int64_t x) {
  return i64_to_f32(x);
}
int32_t to_i32(float x) {
  return f32_to_i32(x);
}
int32_t to_i32(int32_t x) {
  return x;
}
int32_t to_i32(int64_t x) {
  return i64_to_i32(x);
}
int64_t to_i64(float x) {
  return f32_to_i64(x);
}
int64_t to_i64(int32_t x) {
  return i32_to_i64(x);
}
int64_t to_i64(int64_t x) {
  return x;
}
uint8_t to_bool(float x) {
  return f32_to_bool(x);
}
uint8_t to_bool(int32_t x) {
  return i32_to_bool(x);
}
uint8_t to_bool(int64_t x) {
  return i64_to_bool(x);
}

// A compute value converted to the compute value of dtype `to`. Narrow floats round here
// (and only here and at stores), so f16 intermediates keep f32 precision as on the VM.
template <typename Out, typename In>
Out cast_scalar(DType to, In x) {
  if constexpr (std::is_same_v<Out, float>) {
    if (to == DType::kF16) return round_f16(to_f32(x));
    if (to == DType::kBF16) return round_bf16(to_f32(x));
    return to_f32(x);
  } else if constexpr (std::is_same_v<Out, int32_t>) {
    return to == DType::kBool ? to_bool(x) : to_i32(x);
  } else {
    return to_i64(x);
  }
}

template <typename T>
T read_as(const void* data, int64_t off) {
  return static_cast<const T*>(data)[off];
}

// Storage element `off` of a tensor of dtype `t`, as compute type C.
template <typename C>
C load_scalar(DType t, const void* data, int64_t off) {
  switch (t) {
    case DType::kF32:
      return static_cast<C>(read_as<float>(data, off));
    case DType::kF16:
      return static_cast<C>(f16_bits_to_f32(read_as<uint16_t>(data, off)));
    case DType::kBF16:
      return static_cast<C>(bf16_bits_to_f32(read_as<uint16_t>(data, off)));
    case DType::kI32:
      return static_cast<C>(read_as<int32_t>(data, off));
    case DType::kI64:
      return static_cast<C>(read_as<int64_t>(data, off));
    case DType::kBool:
      return static_cast<C>(read_as<uint8_t>(data, off) != 0 ? 1 : 0);
  }
  return C{};
}

template <typename T>
void write_as(void* data, int64_t off, T v) {
  static_cast<T*>(data)[off] = v;
}

// Compute value `x` stored as dtype `t` at element `off`.
template <typename C>
void store_scalar(DType t, void* data, int64_t off, C x) {
  switch (t) {
    case DType::kF32:
      return write_as(data, off, to_f32(x));
    case DType::kF16:
      return write_as(data, off, f32_to_f16_bits(to_f32(x)));
    case DType::kBF16:
      return write_as(data, off, f32_to_bf16_bits(to_f32(x)));
    case DType::kI32:
      return write_as(data, off, to_i32(x));
    case DType::kI64:
      return write_as(data, off, to_i64(x));
    case DType::kBool:
      return write_as(data, off, to_bool(x));
  }
}

// ---- Op semantics (all through scalar_ops.h) --------------------------------------------

float apply_unary(UnaryOp op, float x) {
  return unary_f32(op, x);
}
int32_t apply_unary(UnaryOp op, int32_t x) {
  return unary_i32(op, x);
}
int64_t apply_unary(UnaryOp op, int64_t x) {
  return unary_i64(op, x);
}
int32_t apply_predicate(UnaryOp op, float x) {
  return predicate_f32(op, x);
}
int32_t apply_predicate(UnaryOp op, int32_t x) {
  return predicate_i32(op, x);
}
int32_t apply_predicate(UnaryOp op, int64_t x) {
  return predicate_i64(op, x);
}
float apply_binary(BinaryOp op, float a, float b) {
  return binary_f32(op, a, b);
}
int32_t apply_binary(BinaryOp op, int32_t a, int32_t b) {
  return binary_i32(op, a, b);
}
int64_t apply_binary(BinaryOp op, int64_t a, int64_t b) {
  return binary_i64(op, a, b);
}
int32_t apply_compare(BinaryOp op, float a, float b) {
  return compare_f32(op, a, b);
}
int32_t apply_compare(BinaryOp op, int32_t a, int32_t b) {
  return compare_i32(op, a, b);
}
int32_t apply_compare(BinaryOp op, int64_t a, int64_t b) {
  return compare_i64(op, a, b);
}
float combine(ReduceOp op, float acc, float x) {
  return reduce_combine_f32(op, acc, x);
}
int32_t combine(ReduceOp op, int32_t acc, int32_t x) {
  return reduce_combine_i32(op, acc, x);
}
int64_t combine(ReduceOp op, int64_t acc, int64_t x) {
  return reduce_combine_i64(op, acc, x);
}

// out[i] = fn(a[i]) over a whole value.
template <typename T, typename Fn>
RefValue map_value(const CShape& shape, const std::vector<T>& a, Fn fn) {
  std::vector<decltype(fn(a[0]))> out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = fn(a[i]);
  return wrap_value(shape, std::move(out));
}

RefValue eval_unary(UnaryOp op, const RefValue& x) {
  return std::visit(
      [&](const auto& a) {
        if (is_predicate(op)) {
          return map_value(x.shape, a, [op](auto v) { return apply_predicate(op, v); });
        }
        return map_value(x.shape, a, [op](auto v) { return apply_unary(op, v); });
      },
      x.data);
}

// out[i] = fn(a[i], b[i]); a and b are already broadcast to one shape and compute type.
template <typename T, typename Fn>
RefValue zip_value(const RefValue& a, const RefValue& b, Fn fn) {
  const auto& av = std::get<std::vector<T>>(a.data);
  const auto& bv = std::get<std::vector<T>>(b.data);
  std::vector<decltype(fn(av[0], bv[0]))> out(av.size());
  for (size_t i = 0; i < av.size(); ++i) out[i] = fn(av[i], bv[i]);
  return wrap_value(a.shape, std::move(out));
}

RefValue eval_binary(BinaryOp op, const RefValue& a, const RefValue& b) {
  return std::visit(
      [&](const auto& av) {
        using T = typename std::remove_cvref_t<decltype(av)>::value_type;
        if (!returns_bool(op)) {
          return zip_value<T>(a, b, [op](T x, T y) { return apply_binary(op, x, y); });
        }
        return zip_value<T>(a, b, [op](T x, T y) { return apply_compare(op, x, y); });
      },
      a.data);
}

RefValue eval_select(const RefValue& cond, const RefValue& t, const RefValue& f) {
  RefValue out = t;
  std::visit(
      [&](auto& o) {
        const auto& fv = std::get<std::remove_cvref_t<decltype(o)>>(f.data);
        for (size_t i = 0; i < o.size(); ++i) {
          if (cond.as_int(static_cast<int64_t>(i)) == 0) o[i] = fv[i];
        }
      },
      out.data);
  return out;
}

RefValue eval_cast(const RefValue& x, DType to) {
  return std::visit(
      [&](const auto& a) {
        switch (compute_type(to)) {
          case CType::kF32:
            return map_value(x.shape, a, [to](auto v) { return cast_scalar<float>(to, v); });
          case CType::kI32:
            return map_value(x.shape, a, [to](auto v) { return cast_scalar<int32_t>(to, v); });
          case CType::kI64:
            break;
        }
        return map_value(x.shape, a, [to](auto v) { return cast_scalar<int64_t>(to, v); });
      },
      x.data);
}

// ---- Reductions ---------------------------------------------------------------------------

// How input elements map to output elements: reduced axes get stride 0, so every input
// index lands on the output element it contributes to.
struct ReducePlan {
  ReduceOp op;
  CShape in;
  View to_out;        // input index -> output flat index
  int64_t outputs;    // output element count
  int64_t count = 1;  // elements folded into each output
  int axis;           // the (first) reduced axis, for arg reductions
};

ReducePlan make_reduce_plan(const ir::Node& n, const CShape& in) {
  // A rank-0 input reduces over no axes (the builder's "all axes" of a scalar).
  ReducePlan p{n.reduce_op(), in, {}, 1, 1, n.attr.empty() ? 0 : static_cast<int>(n.attr[0])};
  CShape kept = in;
  for (int64_t a : n.attr) {
    p.count *= in.d[a];
    kept.d[a] = 1;
  }
  p.outputs = kept.numel();
  p.to_out.strides = dense_strides(kept);
  for (int64_t a : n.attr) p.to_out.strides[a] = 0;
  return p;
}

// Float Sum/Mean/Prod accumulate in double, rounded once, so the spec is tighter than any
// summation order the VM may choose.
RefValue reduce_float_exact(const ReducePlan& p, const std::vector<float>& x) {
  const bool prod = p.op == ReduceOp::kProd;
  std::vector<double> acc(static_cast<size_t>(p.outputs), prod ? 1.0 : 0.0);
  for_each_index(p.in, [&](int64_t flat, const Index& idx) {
    double& a = acc[view_offset(p.to_out, idx, p.in.rank)];
    a = prod ? a * x[flat] : a + x[flat];
  });
  std::vector<float> out(acc.size());
  for (size_t i = 0; i < acc.size(); ++i) {
    // Mean over zero elements is 0/0 = NaN, as in torch.
    const double v = p.op == ReduceOp::kMean ? acc[i] / static_cast<double>(p.count) : acc[i];
    out[i] = static_cast<float>(v);
  }
  return wrap_value(CShape{}, std::move(out));
}

// Sum/Prod/Max/Min through scalar_ops' combine: integers wrap, Max/Min propagate NaN.
template <typename T>
RefValue reduce_combine(const ReducePlan& p, const std::vector<T>& x) {
  std::vector<T> acc(static_cast<size_t>(p.outputs), reduce_identity<T>(p.op));
  for_each_index(p.in, [&](int64_t flat, const Index& idx) {
    T& a = acc[view_offset(p.to_out, idx, p.in.rank)];
    a = combine(p.op, a, x[flat]);
  });
  if constexpr (!std::is_floating_point_v<T>) {
    // The builder makes Mean float; an integer Mean would truncate like integer division.
    if (p.op == ReduceOp::kMean) {
      for (T& a : acc) a = int_div(a, static_cast<T>(p.count));
    }
  }
  return wrap_value(CShape{}, std::move(acc));
}

// ArgMax/ArgMin: input elements arrive in increasing index order along the axis, and
// arg_better keeps the first extreme (the first NaN for floats).
template <typename T>
RefValue reduce_arg(const ReducePlan& p, const std::vector<T>& x) {
  std::vector<T> best(static_cast<size_t>(p.outputs));
  std::vector<int64_t> index(static_cast<size_t>(p.outputs), -1);
  for_each_index(p.in, [&](int64_t flat, const Index& idx) {
    const int64_t o = view_offset(p.to_out, idx, p.in.rank);
    const int64_t i = idx[p.axis];
    if (index[o] < 0 || arg_better(p.op, x[flat], i, best[o], index[o])) {
      best[o] = x[flat];
      index[o] = i;
    }
  });
  return wrap_value(CShape{}, std::move(index));
}

RefValue reduce_dispatch(const ReducePlan& p, const RefValue& x) {
  return std::visit(
      [&](const auto& xv) {
        using T = typename std::remove_cvref_t<decltype(xv)>::value_type;
        const bool exact_sum =
            p.op == ReduceOp::kSum || p.op == ReduceOp::kMean || p.op == ReduceOp::kProd;
        if (ops::is_arg_reduce(p.op)) return reduce_arg(p, xv);
        if constexpr (std::is_same_v<T, float>) {
          if (exact_sum) return reduce_float_exact(p, xv);
        }
        return reduce_combine(p, xv);
      },
      x.data);
}

Status eval_reduce(const ir::KernelDef& def, int node, const RefValue& x, const CShape& shape,
                   RefValue* out) {
  const ReducePlan p = make_reduce_plan(def.nodes[node], x.shape);
  if (p.count == 0 && !ops::reduces_empty(p.op)) {
    return invalid_argument(def.name + ": op " + ir::node_label(def, node) + ": " +
                            reduce_op_name(p.op) + " over an empty axis of " + x.shape.to_string());
  }
  *out = reduce_dispatch(p, x);
  out->shape = shape;
  return Status::ok();
}

// ---- Leaves -------------------------------------------------------------------------------

RefValue load_input(const TensorArg& t, const CShape& shape) {
  View v;
  v.offset = t.offset;
  ir::arg_strides(t, v.strides.data());
  RefValue out = make_value(compute_type(t.dtype), shape);
  std::visit(
      [&](auto& o) {
        using C = typename std::remove_cvref_t<decltype(o)>::value_type;
        for_each_index(shape, [&](int64_t flat, const Index& idx) {
          o[flat] = load_scalar<C>(t.dtype, t.data, view_offset(v, idx, shape.rank));
        });
      },
      out.data);
  return out;
}

// A rank-0 value: the float for float dtypes, the integer otherwise (bool as 0/1).
RefValue scalar_value(DType dtype, double f, int64_t i) {
  RefValue out = make_value(compute_type(dtype), CShape{});
  switch (compute_type(dtype)) {
    case CType::kF32:
      std::get<std::vector<float>>(out.data)[0] = static_cast<float>(f);
      break;
    case CType::kI32:
      std::get<std::vector<int32_t>>(out.data)[0] =
          dtype == DType::kBool ? (i != 0 ? 1 : 0) : i64_to_i32(i);
      break;
    case CType::kI64:
      std::get<std::vector<int64_t>>(out.data)[0] = i;
      break;
  }
  return out;
}

// ---- Nodes --------------------------------------------------------------------------------

RefValue eval_concat(const ir::Node& n, const std::vector<RefValue>& vals, const CShape& shape) {
  const int axis = static_cast<int>(n.attr[0]);
  RefValue out = make_value(compute_type(n.dtype), shape);
  View v;
  v.strides = dense_strides(shape);
  for (int in : n.inputs) {
    scatter(vals[in], v, &out);
    v.offset += vals[in].shape.d[axis] * v.strides[axis];
  }
  return out;
}

// An integer div, floor_divide or remainder whose divisor b has a zero element.
bool integer_division_by_zero(BinaryOp op, const RefValue& b) {
  if (!is_division(op)) return false;
  return std::visit(
      [](const auto& v) {
        using T = typename std::remove_cvref_t<decltype(v)>::value_type;
        if constexpr (std::is_same_v<T, float>) {
          return false;
        } else {
          return std::find(v.begin(), v.end(), T{0}) != v.end();
        }
      },
      b.data);
}

Status eval_elementwise(const ir::KernelDef& def, int node, const std::vector<RefValue>& vals,
                        const CShape& shape, RefValue* out) {
  const ir::Node& n = def.nodes[node];
  std::vector<RefValue> args;
  for (int in : n.inputs) args.push_back(broadcast_to(vals[in], shape));
  const size_t last = args.size() - 1;
  // The builder casts operands to one dtype; a mismatch here is a bug, not a user error.
  if (n.kind != ir::OpKind::kUnary && args[last].ctype() != args[last - 1].ctype()) {
    return internal_error(def.name + ": op " + ir::node_label(def, node) +
                          ": operands differ in compute type");
  }
  switch (n.kind) {
    case ir::OpKind::kUnary:
      *out = eval_unary(n.unary_op(), args[0]);
      break;
    case ir::OpKind::kBinary:
      if (integer_division_by_zero(n.binary_op(), args[1])) {
        // torch raises ZeroDivisionError; the VM reports it too (vm::LaunchArgs::fault).
        return invalid_argument(def.name + ": integer " + binary_op_name(n.binary_op()) +
                                " by zero (a divisor element is 0) at " +
                                ir::node_label(def, node));
      }
      *out = eval_binary(n.binary_op(), args[0], args[1]);
      break;
    default:
      *out = eval_select(args[0], args[1], args[2]);
      break;
  }
  return Status::ok();
}

RefValue eval_movement(const ir::Node& n, const RefValue& x, const CShape& shape) {
  switch (n.kind) {
    case ir::OpKind::kBroadcast:
      return broadcast_to(x, shape);
    case ir::OpKind::kPermute:
      return gather(x, permute_view(x.shape, n.attr), shape);
    case ir::OpKind::kSlice: {
      const int axis = static_cast<int>(n.attr[0]);
      return gather(x, slice_view(x.shape, axis, ir::slice_bounds(n, x.shape.d[axis])), shape);
    }
    default: {  // kReshape: the same row-major elements under a new shape
      RefValue out = x;
      out.shape = shape;
      return out;
    }
  }
}

// out[..., i, j] = sum_p a[..., i, p] * b[..., p, j], batch dims broadcast; accumulated in
// double and rounded once (the VM accumulates in f32: compared within a tolerance).
RefValue eval_matmul(const RefValue& a, const RefValue& b, const CShape& shape) {
  RefValue out = make_value(CType::kF32, shape);
  const auto& av = a.f32();
  const auto& bv = b.f32();
  auto& ov = std::get<std::vector<float>>(out.data);
  const int64_t m = shape.d[shape.rank - 2], n = shape.d[shape.rank - 1];
  const int64_t k = a.shape.d[a.shape.rank - 1];
  const int batch_rank = shape.rank - 2;
  int64_t batches = 1;
  for (int i = 0; i < batch_rank; ++i) batches *= shape.d[i];
  // Offset of batch `bi` (row-major over the output's batch dims) in an operand whose batch
  // dims broadcast against them.
  auto batch_offset = [&](const CShape& s, int64_t bi) {
    int64_t off = 0, stride = s.d[s.rank - 1] * s.d[s.rank - 2];
    for (int i = batch_rank - 1, j = s.rank - 3; i >= 0; --i, --j) {
      int64_t idx = bi % shape.d[i];
      bi /= shape.d[i];
      if (j < 0) continue;
      if (s.d[j] != 1) off += idx * stride;
      stride *= s.d[j];
    }
    return off;
  };
  for (int64_t bi = 0; bi < batches; ++bi) {
    const float* ap = av.data() + batch_offset(a.shape, bi);
    const float* bp = bv.data() + batch_offset(b.shape, bi);
    float* op = ov.data() + bi * m * n;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < k; ++p)
          acc += static_cast<double>(ap[i * k + p]) * static_cast<double>(bp[p * n + j]);
        op[i * n + j] = static_cast<float>(acc);
      }
  }
  return out;
}

Status eval_node(const ir::KernelDef& def, int node, const ir::Binding& binding,
                 std::span<const TensorArg> inputs, std::span<const ScalarArg> params,
                 const std::vector<RefValue>& vals, RefValue* out) {
  const ir::Node& n = def.nodes[node];
  const CShape& shape = binding.shapes[node];
  switch (n.kind) {
    case ir::OpKind::kLoad:
      *out = load_input(inputs[n.slot], shape);
      break;
    case ir::OpKind::kParam:
      *out = scalar_value(n.dtype, params[n.slot].f, params[n.slot].i);
      break;
    case ir::OpKind::kConst:
      *out = scalar_value(n.dtype, n.fconst, n.iconst);
      break;
    case ir::OpKind::kUnary:
    case ir::OpKind::kBinary:
    case ir::OpKind::kSelect:
      return eval_elementwise(def, node, vals, shape, out);
    case ir::OpKind::kCast:
      *out = eval_cast(vals[n.inputs[0]], n.dtype);
      break;
    case ir::OpKind::kConcat:
      *out = eval_concat(n, vals, shape);
      break;
    case ir::OpKind::kReduce:
      return eval_reduce(def, node, vals[n.inputs[0]], shape, out);
    case ir::OpKind::kMatMul:
      *out = eval_matmul(vals[n.inputs[0]], vals[n.inputs[1]], shape);
      break;
    default:
      *out = eval_movement(n, vals[n.inputs[0]], shape);
      break;
  }
  return Status::ok();
}

void store_output(const RefValue& value, const TensorArg& t) {
  View v;
  v.offset = t.offset;
  ir::arg_strides(t, v.strides.data());
  std::visit(
      [&](const auto& x) {
        for_each_index(value.shape, [&](int64_t flat, const Index& idx) {
          store_scalar(t.dtype, t.data, view_offset(v, idx, value.shape.rank), x[flat]);
        });
      },
      value.data);
}

}  // namespace

double RefValue::as_double(int64_t i) const {
  return std::visit([i](const auto& v) { return static_cast<double>(v[i]); }, data);
}

int64_t RefValue::as_int(int64_t i) const {
  return std::visit(
      [i](const auto& v) -> int64_t {
        if constexpr (std::is_same_v<std::remove_cvref_t<decltype(v)>, std::vector<float>>) {
          return to_i64(v[i]);
        } else {
          return v[i];
        }
      },
      data);
}

Status evaluate_reference(const ir::KernelDef& def, const ir::Binding& binding,
                          std::span<const TensorArg> inputs, std::span<const ScalarArg> params,
                          std::vector<RefValue>* values, bool outputs_only) {
  if (binding.shapes.size() != def.nodes.size() || inputs.size() != def.input_nodes.size() ||
      params.size() != def.param_names.size()) {
    return invalid_argument(def.name + ": binding, inputs or params do not match the kernel");
  }
  // Nodes come in topological order: a node's operands precede it.
  std::vector<bool> live(def.nodes.size(), !outputs_only);
  for (const auto& out : def.outputs) live[out.node] = true;
  for (size_t i = def.nodes.size(); i-- > 0;) {
    if (!live[i]) continue;
    for (int operand : def.nodes[i].inputs) live[operand] = true;
  }
  values->clear();
  values->reserve(def.nodes.size());
  for (size_t i = 0; i < def.nodes.size(); ++i) {
    RefValue v;
    if (live[i]) {
      DVM_RETURN_IF_ERROR(
          eval_node(def, static_cast<int>(i), binding, inputs, params, *values, &v));
    }
    values->push_back(std::move(v));
  }
  return Status::ok();
}

}  // namespace ir

Status run_reference(const Kernel& kernel, std::span<const TensorArg> inputs,
                     std::span<const TensorArg> outputs, std::span<const ScalarArg> params) {
  const ir::KernelDef& def = kernel.def();
  ir::Binding binding;
  DVM_RETURN_IF_ERROR(ir::bind_shapes(def, inputs, &binding));
  DVM_RETURN_IF_ERROR(ir::check_args(def, binding, inputs, outputs, params));
  std::vector<ir::RefValue> values;
  DVM_RETURN_IF_ERROR(ir::evaluate_reference(def, binding, inputs, params, &values,
                                             /*outputs_only=*/true));
  for (size_t k = 0; k < outputs.size(); ++k) {
    ir::store_output(values[def.outputs[k].node], outputs[k]);
  }
  return Status::ok();
}

}  // namespace dvm
