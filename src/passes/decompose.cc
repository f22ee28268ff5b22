// Pass: decompose composite ops into meta-ops (and native gathers/iota).
//
// Reductions are written in their numerically stable forms (max-subtracted softmax and
// log-sum-exp, two-pass variance), and f16/bf16 inputs of normalisations compute in f32 and
// round once at the end, as PyTorch does.
#include <cmath>
#include <limits>

#include "passes/passes.h"

namespace dvm::passes {

namespace {

using graph::Node;

class Decomposer {
 public:
  explicit Decomposer(Rewriter* rw) : rw_(rw), em_(rw->em()) {}
  int run(int old_id);

 private:
  const Node& src(int old_id) const { return rw_->src().nodes[old_id]; }
  int in(int old_id, size_t i) const { return rw_->map(src(old_id).inputs[i]); }
  bool has(int old_id, size_t i) const { return src(old_id).inputs.size() > i; }
  const SymShape& shape(int id) const { return em_.node(id).shape; }
  int rank(int id) const { return static_cast<int>(shape(id).size()); }
  DType dtype(int id) const { return em_.node(id).dtype; }

  int to_f32(int x) { return em_.cast(x, DType::kF32); }
  int sym_scalar(SymExpr e) {
    if (e.is_constant()) return em_.scalar(static_cast<double>(e.constant_value()), DType::kF32);
    Node n;
    n.op = GraphOp::kConstant;
    n.dtype = DType::kF32;
    n.sym = {std::move(e)};
    return em_.emit(std::move(n));
  }
  std::vector<int64_t> last_axes(int x, int k) const {
    std::vector<int64_t> axes;
    for (int i = rank(x) - k; i < rank(x); ++i) axes.push_back(i);
    return axes;
  }
  int softmax(int x, int axis, bool log);
  int layer_norm(int id);
  int rms_norm(int id);
  int linear(int id);
  int embedding(int id);
  int variance(int id, bool take_sqrt);
  int cross_entropy(int id);
  int attention(int id);
  static SymShape split_heads(const SymShape& s, SymExpr a, SymExpr b);
  static SymShape stack_rows(const SymShape& s, int64_t hk, int groups);
  int group_mask(int mask, int64_t hk, int groups);
  int clamp(int id);

  Rewriter* rw_;
  graph::GraphEmitter& em_;
};

int Decomposer::softmax(int x, int axis, bool log) {
  int m = em_.reduce(ReduceOp::kMax, x, {axis}, true);
  int d = em_.binary(BinaryOp::kSub, x, m);
  int e = em_.unary(UnaryOp::kExp, d);
  int s = em_.reduce(ReduceOp::kSum, e, {axis}, true);
  if (log) return em_.binary(BinaryOp::kSub, d, em_.unary(UnaryOp::kLog, s));
  return em_.binary(BinaryOp::kDiv, e, s);
}

int Decomposer::layer_norm(int id) {
  int x = to_f32(in(id, 0));
  std::vector<int64_t> axes = last_axes(x, src(id).axis);
  int mean = em_.reduce(ReduceOp::kMean, x, axes, true);
  int d = em_.binary(BinaryOp::kSub, x, mean);
  int var = em_.reduce(ReduceOp::kMean, em_.binary(BinaryOp::kMul, d, d), axes, true);
  int inv = em_.unary(UnaryOp::kRsqrt, em_.binary_scalar(BinaryOp::kAdd, var, src(id).value));
  int y = em_.binary(BinaryOp::kMul, d, inv);
  if (has(id, 1)) y = em_.binary(BinaryOp::kMul, y, in(id, 1));
  if (has(id, 2)) y = em_.binary(BinaryOp::kAdd, y, in(id, 2));
  return em_.cast(y, src(id).dtype);
}

int Decomposer::rms_norm(int id) {
  int x = to_f32(in(id, 0));
  std::vector<int64_t> axes = last_axes(x, src(id).axis);
  int ms = em_.reduce(ReduceOp::kMean, em_.binary(BinaryOp::kMul, x, x), axes, true);
  int inv = em_.unary(UnaryOp::kRsqrt, em_.binary_scalar(BinaryOp::kAdd, ms, src(id).value));
  int y = em_.binary(BinaryOp::kMul, x, inv);
  if (has(id, 1)) y = em_.binary(BinaryOp::kMul, y, in(id, 1));
  return em_.cast(y, src(id).dtype);
}

// x @ W^T + b. Up to rank 4 the matmul's batch dims broadcast against W directly, so the bias
// and whatever follows stay in the matmul's kernel; higher ranks fold the batch dims first.
int Decomposer::linear(int id) {
  int x = in(id, 0), w = in(id, 1);
  SymShape out_shape = src(id).shape;
  bool fold = rank(x) > 4 || rank(x) < 2;
  if (fold) x = em_.reshape(x, {SymExpr(-1), shape(x).back()});
  int y = em_.matmul(x, w, false, true);
  if (has(id, 2)) y = em_.binary(BinaryOp::kAdd, y, in(id, 2));
  if (fold) y = em_.reshape(y, out_shape);
  return y;
}

int Decomposer::embedding(int id) {
  int w = in(id, 0), ids = in(id, 1);
  int flat = em_.reshape(ids, {SymExpr(-1)});
  Node n;
  n.op = GraphOp::kIndexSelect;
  n.inputs = {w, flat};
  n.axis = 0;
  int rows = em_.emit(std::move(n));
  return em_.reshape(rows, src(id).shape);
}

// sum((x - mean)^2) / (N - correction), N the product of the reduced dims (a symbolic
// scalar: the kernel receives its value per call, no re-encoding).
int Decomposer::variance(int id, bool take_sqrt) {
  int x = to_f32(in(id, 0));
  const std::vector<int64_t>& axes = src(id).ints;
  SymExpr count(1);
  for (int64_t a : axes) count = count * shape(x)[a];
  int mean = em_.reduce(ReduceOp::kMean, x, axes, true);
  int d = em_.binary(BinaryOp::kSub, x, mean);
  int ss = em_.reduce(ReduceOp::kSum, em_.binary(BinaryOp::kMul, d, d), axes, src(id).flag);
  // torch divides by max(0, N - correction): a correction of at least N gives inf (or NaN
  // for 0 / 0), never a negative variance.
  int denom = em_.binary_scalar(
      BinaryOp::kMaximum, em_.binary_scalar(BinaryOp::kSub, sym_scalar(count), src(id).value), 0.0);
  int v = em_.binary(BinaryOp::kDiv, ss, denom);
  if (take_sqrt) v = em_.unary(UnaryOp::kSqrt, v);
  return em_.cast(v, src(id).dtype);
}

// mean_i(logsumexp(x_i) - x_i[t_i]): the target logits are gathered from the input (a native
// op on N elements), so no [N, C] intermediate is stored.
int Decomposer::cross_entropy(int id) {
  int x = to_f32(in(id, 0));
  int t = em_.reshape(in(id, 1), {shape(in(id, 1))[0], SymExpr(1)});
  Node g;
  g.op = GraphOp::kGather;
  g.inputs = {x, t};
  g.axis = 1;
  int picked = em_.emit(std::move(g));
  int m = em_.reduce(ReduceOp::kMax, x, {1}, true);
  int e = em_.unary(UnaryOp::kExp, em_.binary(BinaryOp::kSub, x, m));
  int lse = em_.binary(BinaryOp::kAdd,
                       em_.unary(UnaryOp::kLog, em_.reduce(ReduceOp::kSum, e, {1}, true)), m);
  int loss = em_.reduce(ReduceOp::kMean, em_.binary(BinaryOp::kSub, lse, picked), {}, false);
  return em_.cast(loss, src(id).dtype);
}

// Grouped-query attention: the G query heads that share a k/v head are stacked along the
// query rows, q [.., Hk*G, S, D] -> [.., Hk, G*S, D] (a view), so both matmuls read k and v
// once per k/v head instead of repeating them G times; the scores are viewed as
// [.., Hk, G, S, Sk] for the mask, the causal rule and the softmax.
SymShape Decomposer::split_heads(const SymShape& s, SymExpr a, SymExpr b) {
  SymShape r(s.begin(), s.end() - 3);
  r.push_back(std::move(a));
  r.push_back(std::move(b));
  r.insert(r.end(), s.end() - 2, s.end());
  return r;
}

SymShape Decomposer::stack_rows(const SymShape& s, int64_t hk, int groups) {
  SymShape r(s.begin(), s.end() - 3);
  r.push_back(hk);
  r.push_back(SymExpr(groups) * s[s.size() - 2]);
  r.push_back(s.back());
  return r;
}

// A mask for scores [.., Hq, S, Sk], reshaped for grouped scores [.., Hk, G, S, Sk].
int Decomposer::group_mask(int mask, int64_t hk, int groups) {
  const SymShape& m = shape(mask);
  if (m.size() < 3) return mask;  // no head axis: broadcasts as it is
  const SymExpr& h = m[m.size() - 3];
  if (h == SymExpr(1)) return em_.reshape(mask, split_heads(m, 1, 1));
  return em_.reshape(mask, split_heads(m, hk, groups));
}

int Decomposer::attention(int id) {
  int q = in(id, 0), k = in(id, 1), v = in(id, 2);
  const int groups = graph::attention_groups(shape(q), shape(k));
  int64_t hk = 1;
  SymExpr rows;
  if (groups > 1) {
    hk = shape(k)[shape(k).size() - 3].constant_value();
    rows = shape(q)[shape(q).size() - 2];
    q = em_.reshape(q, stack_rows(shape(q), hk, groups));
  }
  double scale = src(id).value;
  int s = em_.matmul(q, k, false, true);
  if (scale > 0) {
    s = em_.binary_scalar(BinaryOp::kMul, s, scale);
  } else {
    const SymExpr& e = shape(q).back();
    if (e.is_constant()) {
      s = em_.binary_scalar(BinaryOp::kMul, s, 1.0 / std::sqrt(double(e.constant_value())));
    } else {
      s = em_.binary(BinaryOp::kMul, s, em_.unary(UnaryOp::kRsqrt, sym_scalar(e)));
    }
  }
  s = to_f32(s);
  if (groups > 1 && s >= 0) {
    const SymShape& st = shape(s);  // [.., Hk, G*S, Sk] -> [.., Hk, G, S, Sk]
    SymShape grouped(st.begin(), st.end() - 2);
    grouped.insert(grouped.end(), {SymExpr(groups), rows, st.back()});
    s = em_.reshape(s, grouped);
  }
  const double kNegInf = -std::numeric_limits<double>::infinity();
  if (has(id, 3)) {
    int mask = in(id, 3);
    if (groups > 1) mask = group_mask(mask, hk, groups);
    if (dtype(mask) == DType::kBool) {
      s = em_.select(mask, s, em_.scalar(kNegInf, DType::kF32));
    } else {
      s = em_.binary(BinaryOp::kAdd, s, mask);
    }
  }
  if (s < 0) return -1;  // the emitter recorded why
  if (src(id).flag) {
    const SymShape& ss = shape(s);
    SymShape ls = {ss[ss.size() - 2], ss.back()};
    int row = em_.iota(ls, 0, DType::kI64);
    int col = em_.iota(ls, 1, DType::kI64);
    s = em_.select(em_.binary(BinaryOp::kLe, col, row), s, em_.scalar(kNegInf, DType::kF32));
  }
  int p = softmax(s, rank(s) - 1, false);
  if (groups > 1 && p >= 0) {
    const SymShape& pt = shape(p);  // [.., Hk, G, S, Sk] -> [.., Hk, G*S, Sk]
    SymShape stacked(pt.begin(), pt.end() - 3);
    stacked.insert(stacked.end(), {pt[pt.size() - 3] * pt[pt.size() - 2], pt.back()});
    p = em_.reshape(p, stacked);
  }
  p = em_.cast(p, dtype(v));
  int out = em_.matmul(p, v, false, false);
  if (groups > 1) out = em_.reshape(out, src(id).shape);
  return em_.cast(out, src(id).dtype);
}

int Decomposer::clamp(int id) {
  int x = in(id, 0);
  const Node& n = src(id);
  if (n.ints.size() == 2 && n.ints[0]) x = em_.binary_scalar(BinaryOp::kMaximum, x, n.value);
  if (n.ints.size() == 2 && n.ints[1]) x = em_.binary_scalar(BinaryOp::kMinimum, x, n.value2);
  return em_.cast(x, n.dtype);
}

int Decomposer::run(int id) {
  const Node& n = src(id);
  switch (n.op) {
    case GraphOp::kSoftmax:
    case GraphOp::kLogSoftmax:
      return em_.cast(softmax(to_f32(in(id, 0)), n.axis, n.op == GraphOp::kLogSoftmax), n.dtype);
    case GraphOp::kLayerNorm:
      return layer_norm(id);
    case GraphOp::kRmsNorm:
      return rms_norm(id);
    case GraphOp::kGelu:
      return em_.unary(n.flag ? UnaryOp::kGeluTanh : UnaryOp::kGeluErf, in(id, 0));
    case GraphOp::kSilu:
      return em_.unary(UnaryOp::kSilu, in(id, 0));
    case GraphOp::kSwiglu:
      return em_.binary(BinaryOp::kMul, em_.unary(UnaryOp::kSilu, in(id, 0)), in(id, 1));
    case GraphOp::kLinear:
      return linear(id);
    case GraphOp::kEmbedding:
      return embedding(id);
    case GraphOp::kVariance:
    case GraphOp::kStd:
      return variance(id, n.op == GraphOp::kStd);
    case GraphOp::kCrossEntropy:
      return cross_entropy(id);
    case GraphOp::kAttention:
      return attention(id);
    case GraphOp::kClamp:
      return clamp(id);
    default:
      return rw_->copy(id);
  }
}

}  // namespace

StatusOr<GraphDef> decompose(const GraphDef& g) {
  Rewriter rw(g);
  Decomposer d(&rw);
  return rw.run([&d](int id) { return d.run(id); });
}

}  // namespace dvm::passes
