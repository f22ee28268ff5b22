// Symbolic shape and dtype deduction for every graph op. Dims must be provably equal (the
// canonical forms of include/dvm/sym.h compare equal) or a constant 1 where they broadcast;
// anything else is a contradiction reported with the op and the dims.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <sstream>
#include <utility>

#include "graph/graph_def.h"
#include "ops/dtype_rules.h"
#include "ops/scalar_ops.h"

namespace dvm::graph {

namespace {

Status fail(const GraphDef& g, const Node& n, const std::string& msg) {
  return invalid_argument(g.name + ": " + graph_op_name(n.op) + ": " + msg);
}

const Node& in(const GraphDef& g, const Node& n, size_t i) {
  return g.nodes[n.inputs[i]];
}

bool is_one(const SymExpr& e) {
  return e.is_constant() && e.constant_value() == 1;
}

Status broadcast(const GraphDef& g, const Node& n, const SymShape& a, const SymShape& b,
                 SymShape* out) {
  size_t r = std::max(a.size(), b.size());
  out->assign(r, SymExpr(1));
  for (size_t i = 0; i < r; ++i) {
    const SymExpr& x = i < r - a.size() ? SymExpr(1) : a[i - (r - a.size())];
    const SymExpr& y = i < r - b.size() ? SymExpr(1) : b[i - (r - b.size())];
    if (x == y || is_one(y)) {
      (*out)[i] = x;
    } else if (is_one(x)) {
      (*out)[i] = y;
    } else {
      return fail(g, n,
                  "cannot broadcast " + shape_str(a) + " with " + shape_str(b) + ": dims " +
                      x.to_string() + " and " + y.to_string() + " are not provably equal or 1");
    }
  }
  return Status::ok();
}

SymExpr numel(const SymShape& s) {
  SymExpr p(1);
  for (const SymExpr& d : s) p = p * d;
  return p;
}

Status normalize_axis(const GraphDef& g, const Node& n, int rank, int* axis) {
  if (*axis < 0) *axis += rank;
  if (*axis < 0 || *axis >= std::max(rank, 1)) {
    return fail(g, n,
                "axis " + std::to_string(*axis) + " out of range for rank " + std::to_string(rank));
  }
  return Status::ok();
}

Status normalize_axes(const GraphDef& g, const Node& n, int rank, std::vector<int64_t>* axes) {
  if (axes->empty())
    for (int i = 0; i < rank; ++i) axes->push_back(i);
  for (int64_t& a : *axes) {
    int ai = static_cast<int>(a);
    DVM_RETURN_IF_ERROR(normalize_axis(g, n, rank, &ai));
    a = ai;
  }
  std::sort(axes->begin(), axes->end());
  axes->erase(std::unique(axes->begin(), axes->end()), axes->end());
  return Status::ok();
}

Status infer_unary(const GraphDef& g, Node& n) {
  n.dtype = ops::unary_result_dtype(static_cast<UnaryOp>(n.sub), in(g, n, 0).dtype);
  n.shape = in(g, n, 0).shape;
  return Status::ok();
}

Status infer_reshape(const GraphDef& g, Node& n) {
  const SymShape& src = in(g, n, 0).shape;
  SymExpr total = numel(src);
  SymExpr known(1);
  int inferred = -1;
  for (size_t i = 0; i < n.sym.size(); ++i) {
    if (n.sym[i].is_constant() && n.sym[i].constant_value() == -1) {
      if (inferred >= 0) return fail(g, n, "at most one -1 dim: " + shape_str(n.sym));
      inferred = static_cast<int>(i);
    } else {
      known = known * n.sym[i];
    }
  }
  if (inferred >= 0) {
    SymExpr d = floordiv(total, known);
    if (d * known != total) {
      return fail(g, n, "cannot infer -1 of " + shape_str(n.sym) + " from " + shape_str(src));
    }
    n.sym[inferred] = d;
  } else if (known != total) {
    return fail(
        g, n,
        "element count of " + shape_str(src) + " is not provably that of " + shape_str(n.sym));
  }
  n.shape = n.sym;
  return Status::ok();
}

Status infer_expand(const GraphDef& g, Node& n) {
  const SymShape& src = in(g, n, 0).shape;
  if (n.sym.size() < src.size()) {
    return fail(g, n, "cannot expand " + shape_str(src) + " to " + shape_str(n.sym));
  }
  size_t off = n.sym.size() - src.size();
  for (size_t i = 0; i < src.size(); ++i) {
    if (n.sym[off + i].is_constant() && n.sym[off + i].constant_value() == -1) {
      n.sym[off + i] = src[i];
    }
    if (!(src[i] == n.sym[off + i]) && !is_one(src[i])) {
      return fail(g, n, "cannot expand " + shape_str(src) + " to " + shape_str(n.sym));
    }
  }
  n.shape = n.sym;
  return Status::ok();
}

Status infer_permute(const GraphDef& g, Node& n) {
  const SymShape& src = in(g, n, 0).shape;
  std::vector<int> seen(src.size(), 0);
  bool valid = n.ints.size() == src.size();
  for (int64_t& p : n.ints) {
    if (p < 0) p += static_cast<int64_t>(src.size());
    if (!valid || p < 0 || p >= static_cast<int64_t>(src.size()) || seen[p]++) valid = false;
  }
  if (!valid) return fail(g, n, "invalid permutation for shape " + shape_str(src));
  n.shape.clear();
  for (int64_t p : n.ints) n.shape.push_back(src[p]);
  return Status::ok();
}

// Canonical slice: 0 <= start, stop <= dim, step >= 1; extent max(0, ceil((stop-start)/step)).
Status infer_slice(const GraphDef& g, Node& n) {
  const SymShape& src = in(g, n, 0).shape;
  DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(src.size()), &n.axis));
  if (n.sym.size() != 2 || n.ints.size() != 1 || n.ints[0] <= 0) {
    return fail(g, n, "needs {start, stop} and a positive step");
  }
  const SymExpr& dim = src[n.axis];
  auto canon = [&dim](SymExpr v) {
    if (v.is_constant() && v.constant_value() >= kSymMax) return dim;
    if (v.is_constant() && v.constant_value() < 0) v = max(dim + v, SymExpr(0));
    return min(v, dim);
  };
  n.sym[0] = canon(n.sym[0]);
  n.sym[1] = max(canon(n.sym[1]), n.sym[0]);
  int64_t step = n.ints[0];
  n.shape = src;
  n.shape[n.axis] = floordiv(n.sym[1] - n.sym[0] + SymExpr(step - 1), SymExpr(step));
  return Status::ok();
}

Status infer_concat(const GraphDef& g, Node& n) {
  if (n.inputs.empty()) return fail(g, n, "no inputs");
  const SymShape& first = in(g, n, 0).shape;
  DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(first.size()), &n.axis));
  n.shape = first;
  n.dtype = in(g, n, 0).dtype;
  SymExpr total(0);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    const SymShape& s = in(g, n, i).shape;
    n.dtype = promote_types(n.dtype, in(g, n, i).dtype);
    bool ok = s.size() == first.size();
    for (size_t d = 0; ok && d < s.size(); ++d)
      if (static_cast<int>(d) != n.axis && !(s[d] == first[d])) ok = false;
    if (!ok) return fail(g, n, "shapes " + shape_str(first) + " and " + shape_str(s) + " differ");
    total = total + s[n.axis];
  }
  n.shape[n.axis] = total;
  return Status::ok();
}

Status infer_reduce(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  int r = static_cast<int>(x.shape.size());
  DVM_RETURN_IF_ERROR(normalize_axes(g, n, r, &n.ints));
  auto op = static_cast<ReduceOp>(n.sub);
  bool arg = op == ReduceOp::kArgMax || op == ReduceOp::kArgMin;
  if (arg && n.ints.size() != 1) return fail(g, n, "exactly one axis required");
  DType t = x.dtype;
  if (op == ReduceOp::kMean) t = ops::float_dtype(t);
  if (t == DType::kBool && (op == ReduceOp::kSum || op == ReduceOp::kProd)) t = DType::kI64;
  n.dtype = arg ? DType::kI64 : t;
  n.shape.clear();
  for (int i = 0; i < r; ++i) {
    bool reduced = std::find(n.ints.begin(), n.ints.end(), i) != n.ints.end();
    if (!reduced) {
      n.shape.push_back(x.shape[i]);
    } else if (n.flag) {
      n.shape.push_back(SymExpr(1));
    }
  }
  return Status::ok();
}

Status infer_matmul(const GraphDef& g, Node& n) {
  SymShape a = in(g, n, 0).shape, b = in(g, n, 1).shape;
  if (a.size() < 2 || b.size() < 2 || a.size() > 4 || b.size() > 4) {
    return fail(g, n,
                "operands must have rank 2 to 4, got " + shape_str(a) + " and " + shape_str(b));
  }
  if (n.ints.size() != 2) n.ints = {0, 0};
  if (n.ints[0]) std::swap(a[a.size() - 1], a[a.size() - 2]);
  if (n.ints[1]) std::swap(b[b.size() - 1], b[b.size() - 2]);
  if (!(a.back() == b[b.size() - 2])) {
    return fail(g, n, "contraction dims differ: " + shape_str(a) + " x " + shape_str(b));
  }
  n.dtype = promote_types(in(g, n, 0).dtype, in(g, n, 1).dtype);
  if (!is_float(n.dtype)) return fail(g, n, "integer operands are not supported");
  SymShape ba(a.begin(), a.end() - 2), bb(b.begin(), b.end() - 2);
  DVM_RETURN_IF_ERROR(broadcast(g, n, ba, bb, &n.shape));
  n.shape.push_back(a[a.size() - 2]);
  n.shape.push_back(b.back());
  return Status::ok();
}

Status infer_index_select(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  const Node& idx = in(g, n, 1);
  // A 0-d source has no axis to index (normalize_axis accepts axis 0 for rank 0).
  if (x.shape.empty()) return fail(g, n, "the source must have rank >= 1, got a 0-d tensor");
  DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(x.shape.size()), &n.axis));
  if (idx.shape.size() != 1 || !is_integer(idx.dtype)) {
    return fail(g, n,
                "index must be a rank-1 integer tensor, got " + std::string(dtype_name(idx.dtype)) +
                    shape_str(idx.shape));
  }
  n.dtype = x.dtype;
  n.shape = x.shape;
  n.shape[n.axis] = idx.shape[0];
  return Status::ok();
}

Status infer_gather(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  const Node& idx = in(g, n, 1);
  // A 0-d source has no axis to index (normalize_axis accepts axis 0 for rank 0).
  if (x.shape.empty()) return fail(g, n, "the source must have rank >= 1, got a 0-d tensor");
  DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(x.shape.size()), &n.axis));
  if (idx.shape.size() != x.shape.size() || !is_integer(idx.dtype)) {
    return fail(g, n, "index must be an integer tensor of the rank of " + shape_str(x.shape));
  }
  n.dtype = x.dtype;
  n.shape = idx.shape;
  return Status::ok();
}

Status infer_norm(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  int r = static_cast<int>(x.shape.size());
  if (n.axis < 1 || n.axis > r) return fail(g, n, "bad number of normalised axes");
  SymShape tail(x.shape.end() - n.axis, x.shape.end());
  for (size_t i = 1; i < n.inputs.size(); ++i) {
    if (!(in(g, n, i).shape == tail)) {
      return fail(g, n,
                  "weight/bias shape " + shape_str(in(g, n, i).shape) +
                      " does not match the normalised dims " + shape_str(tail));
    }
  }
  n.dtype = ops::float_dtype(x.dtype);
  n.shape = x.shape;
  return Status::ok();
}

Status infer_linear(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  const Node& w = in(g, n, 1);
  if (x.shape.empty() || w.shape.size() != 2 || !(x.shape.back() == w.shape[1])) {
    return fail(g, n,
                "x " + shape_str(x.shape) + " and weight " + shape_str(w.shape) +
                    " do not match (weight is [out, in])");
  }
  if (n.inputs.size() == 3 && !(in(g, n, 2).shape == SymShape{w.shape[0]})) {
    return fail(
        g, n, "bias " + shape_str(in(g, n, 2).shape) + " must be [" + w.shape[0].to_string() + "]");
  }
  n.dtype = promote_types(x.dtype, w.dtype);
  n.shape = x.shape;
  n.shape.back() = w.shape[0];
  return Status::ok();
}

}  // namespace

int attention_groups(const SymShape& q, const SymShape& k) {
  if (q.size() < 3 || k.size() != q.size()) return 1;
  const SymExpr& hq = q[q.size() - 3];
  const SymExpr& hk = k[k.size() - 3];
  if (!hq.is_constant() || !hk.is_constant() || hk.constant_value() <= 1) return 1;
  int64_t a = hq.constant_value(), b = hk.constant_value();
  return a > b && a % b == 0 ? static_cast<int>(a / b) : 1;
}

namespace {

Status infer_attention(const GraphDef& g, Node& n) {
  const SymShape& q = in(g, n, 0).shape;
  const SymShape& k = in(g, n, 1).shape;
  const SymShape& v = in(g, n, 2).shape;
  if (q.size() < 2 || k.size() != q.size() || v.size() != q.size() || !(q.back() == k.back()) ||
      !(k[k.size() - 2] == v[v.size() - 2])) {
    return fail(
        g, n,
        "q " + shape_str(q) + ", k " + shape_str(k) + ", v " + shape_str(v) + " do not match");
  }
  SymShape qb(q.begin(), q.end() - 2), kb(k.begin(), k.end() - 2), vb(v.begin(), v.end() - 2);
  if (!(kb == vb)) {
    return fail(g, n, "k " + shape_str(k) + " and v " + shape_str(v) + " differ in batch dims");
  }
  // Grouped-query attention: q's heads (the axis before the sequence) a multiple of k's.
  if (attention_groups(q, k) > 1) kb[kb.size() - 1] = qb.back();
  DVM_RETURN_IF_ERROR(broadcast(g, n, qb, kb, &n.shape));
  n.dtype = ops::float_dtype(in(g, n, 0).dtype);
  n.shape.push_back(q[q.size() - 2]);
  n.shape.push_back(v.back());
  return Status::ok();
}

Status infer_composite(const GraphDef& g, Node& n) {
  const Node& x = in(g, n, 0);
  switch (n.op) {
    case GraphOp::kSoftmax:
    case GraphOp::kLogSoftmax:
      DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(x.shape.size()), &n.axis));
      [[fallthrough]];
    case GraphOp::kGelu:
    case GraphOp::kSilu:
      n.dtype = ops::float_dtype(x.dtype);
      n.shape = x.shape;
      return Status::ok();
    case GraphOp::kSwiglu:
      n.dtype = ops::float_dtype(promote_types(x.dtype, in(g, n, 1).dtype));
      return broadcast(g, n, x.shape, in(g, n, 1).shape, &n.shape);
    case GraphOp::kLayerNorm:
    case GraphOp::kRmsNorm:
      return infer_norm(g, n);
    case GraphOp::kLinear:
      return infer_linear(g, n);
    case GraphOp::kEmbedding: {
      const Node& ids = in(g, n, 1);
      if (x.shape.size() != 2 || !is_integer(ids.dtype)) {
        return fail(g, n, "needs weight [V, D] and integer ids, got " + shape_str(x.shape));
      }
      n.dtype = x.dtype;
      n.shape = ids.shape;
      n.shape.push_back(x.shape[1]);
      return Status::ok();
    }
    case GraphOp::kVariance:
    case GraphOp::kStd: {
      Node r = n;
      r.op = GraphOp::kReduce;
      r.sub = static_cast<int>(ReduceOp::kSum);
      DVM_RETURN_IF_ERROR(infer_reduce(g, r));
      n.ints = r.ints;
      n.shape = r.shape;
      n.dtype = ops::float_dtype(x.dtype);
      return Status::ok();
    }
    case GraphOp::kCrossEntropy: {
      const Node& t = in(g, n, 1);
      if (x.shape.size() != 2 || t.shape.size() != 1 || !(t.shape[0] == x.shape[0]) ||
          !is_integer(t.dtype)) {
        return fail(g, n,
                    "needs logits [N, C] and integer targets [N], got " + shape_str(x.shape) +
                        " and " + shape_str(t.shape));
      }
      n.dtype = ops::float_dtype(x.dtype);
      n.shape = {};
      return Status::ok();
    }
    case GraphOp::kAttention:
      return infer_attention(g, n);
    case GraphOp::kClamp:
      n.dtype = x.dtype;
      n.shape = x.shape;
      return Status::ok();
    default:
      return fail(g, n, "not a composite op");
  }
}

Status infer_meta(const GraphDef& g, Node& n) {
  switch (n.op) {
    case GraphOp::kInput:
    case GraphOp::kCast:
      if (n.op == GraphOp::kCast) n.shape = in(g, n, 0).shape;
      return Status::ok();
    case GraphOp::kConstant:
      n.shape = {};
      return Status::ok();
    case GraphOp::kUnary:
      return infer_unary(g, n);
    case GraphOp::kBinary:
      n.dtype = ops::binary_result_dtype(static_cast<BinaryOp>(n.sub), in(g, n, 0).dtype,
                                         in(g, n, 1).dtype);
      return broadcast(g, n, in(g, n, 0).shape, in(g, n, 1).shape, &n.shape);
    case GraphOp::kSelect: {
      SymShape s;
      n.dtype = promote_types(in(g, n, 1).dtype, in(g, n, 2).dtype);
      DVM_RETURN_IF_ERROR(broadcast(g, n, in(g, n, 0).shape, in(g, n, 1).shape, &s));
      return broadcast(g, n, s, in(g, n, 2).shape, &n.shape);
    }
    case GraphOp::kBroadcast:
      n.dtype = in(g, n, 0).dtype;
      return infer_expand(g, n);
    case GraphOp::kReshape:
      n.dtype = in(g, n, 0).dtype;
      return infer_reshape(g, n);
    case GraphOp::kPermute:
      n.dtype = in(g, n, 0).dtype;
      return infer_permute(g, n);
    case GraphOp::kSlice:
      n.dtype = in(g, n, 0).dtype;
      return infer_slice(g, n);
    case GraphOp::kConcat:
      return infer_concat(g, n);
    case GraphOp::kReduce:
      return infer_reduce(g, n);
    case GraphOp::kMatMul:
      return infer_matmul(g, n);
    case GraphOp::kIndexSelect:
      return infer_index_select(g, n);
    case GraphOp::kGather:
      return infer_gather(g, n);
    case GraphOp::kIota:
      DVM_RETURN_IF_ERROR(normalize_axis(g, n, static_cast<int>(n.sym.size()), &n.axis));
      n.shape = n.sym;
      return Status::ok();
    default:
      return infer_composite(g, n);
  }
}

// Operand counts each op takes: [min, max] (an input with an operand once parsed, then
// failed far away with "kernel has no outputs").
std::pair<size_t, size_t> arity(GraphOp op) {
  switch (op) {
    case GraphOp::kInput:
    case GraphOp::kConstant:
    case GraphOp::kIota:
      return {0, 0};
    case GraphOp::kBinary:
    case GraphOp::kMatMul:
    case GraphOp::kIndexSelect:
    case GraphOp::kGather:
    case GraphOp::kSwiglu:
    case GraphOp::kEmbedding:
    case GraphOp::kCrossEntropy:
      return {2, 2};
    case GraphOp::kSelect:
      return {3, 3};
    case GraphOp::kLinear:
      return {2, 3};
    case GraphOp::kAttention:
      return {3, 4};
    case GraphOp::kLayerNorm:
      return {1, 3};
    case GraphOp::kRmsNorm:
      return {1, 2};
    case GraphOp::kConcat:
      return {1, SIZE_MAX};
    default:
      return {1, 1};
  }
}

}  // namespace

Status infer_node(const GraphDef& g, Node& n) {
  auto [lo, hi] = arity(n.op);
  if (n.inputs.size() < lo || n.inputs.size() > hi) {
    return fail(g, n,
                "takes " +
                    (lo == hi ? std::to_string(lo)
                              : std::to_string(lo) + " to " +
                                    (hi == SIZE_MAX ? "any" : std::to_string(hi))) +
                    " operands, got " + std::to_string(n.inputs.size()));
  }
  for (int i : n.inputs) {
    if (i < 0 || i >= static_cast<int>(g.nodes.size())) {
      return fail(g, n, "operand %" + std::to_string(i) + " is not an earlier value");
    }
  }
  DVM_RETURN_IF_ERROR(infer_meta(g, n));
  if (n.shape.size() > static_cast<size_t>(kMaxRank)) {
    return fail(g, n,
                "rank " + std::to_string(n.shape.size()) + " exceeds " + std::to_string(kMaxRank));
  }
  return Status::ok();
}

std::string shape_str(const SymShape& s) {
  return to_string(s);
}

}  // namespace dvm::graph
