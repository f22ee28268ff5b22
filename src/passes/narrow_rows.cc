// Pass: computes only the rows a slice keeps. `logits[:, -1]` of a language model's last
// layer (a compiled step that returns the last token's logits, a lazy trace that keeps only
// them) reads one row of a product that was computed for every position; rows are
// independent through elementwise ops, a matmul's rows, reductions along other axes and
// reshapes that add or drop size-1 dims, so the slice moves up through them to
// where a value is also used whole (attention's keys and values, the residual stream of the
// layers before): the last layer's MLP, its norms and the head then run on the kept rows only.
//
// Backward, every node gets a demand: nothing (dead), whole, or the rows of one slice (the
// slice node and the axis in the node's own dims). A node all of whose users want the same
// slice's rows, of an op that keeps rows apart along that axis, is computed on the slices of
// its operands instead; the slice itself becomes that smaller value.
#include <algorithm>

#include "passes/passes.h"

namespace dvm::passes {

namespace {

using graph::Node;

struct Demand {
  bool whole = false;
  int slice = -1;  // the slice node whose rows are wanted (whole == false); -1: none yet
  int axis = -1;   // the sliced axis in this node's dims
};

constexpr int kNotSliced = -1;    // the operand is used as it is (no such axis, or broadcast)
constexpr int kUnsupported = -2;  // the node must be computed whole

bool is_one(const SymExpr& e) {
  return e.is_constant() && e.constant_value() == 1;
}

// The axis of operand `k` of node `id` that output axis `a` reads (kNotSliced when the operand
// has no such axis or broadcasts along it), or kUnsupported.
int operand_axis(const GraphDef& g, int id, size_t k, int a) {
  const Node& n = g.nodes[id];
  const Node& o = g.nodes[n.inputs[k]];
  const int rank = static_cast<int>(n.shape.size());
  const int orank = static_cast<int>(o.shape.size());
  switch (n.op) {
    case GraphOp::kUnary:
    case GraphOp::kBinary:
    case GraphOp::kSelect:
    case GraphOp::kCast: {
      const int x = a - (rank - orank);  // operands broadcast right-aligned
      if (x < 0 || (is_one(o.shape[x]) && !is_one(n.shape[a]))) return kNotSliced;
      return o.shape[x] == n.shape[a] ? x : kUnsupported;
    }
    case GraphOp::kMatMul: {
      // The rows of A: C's rows. B (and a transposed A) is read whole.
      const bool ta = !n.ints.empty() && n.ints[0] != 0;
      if (ta || a != rank - 2) return kUnsupported;
      if (k == 1) return kNotSliced;
      return orank == rank && o.shape[a] == n.shape[a] ? a : kUnsupported;
    }
    case GraphOp::kReduce: {
      const auto& axes = n.ints;
      if (std::find(axes.begin(), axes.end(), a) != axes.end()) return kUnsupported;
      const bool below = std::all_of(axes.begin(), axes.end(), [&](int64_t r) { return r > a; });
      if (!n.flag && !below) return kUnsupported;  // dropped dims before `a` renumber it
      return o.shape[a] == n.shape[a] ? a : kUnsupported;
    }
    case GraphOp::kReshape: {
      // Size-1 dims inserted or removed only (a batch of one, views around a 2-D matmul):
      // output dim a is the operand's dim with the same rank among the non-1 dims.
      const auto non_ones = [](const SymShape& sh) {
        std::vector<int> v;
        for (int i = 0; i < static_cast<int>(sh.size()); ++i)
          if (!is_one(sh[i])) v.push_back(i);
        return v;
      };
      const std::vector<int> out = non_ones(n.shape), in = non_ones(o.shape);
      if (out.size() != in.size()) return kUnsupported;
      for (size_t i = 0; i < out.size(); ++i)
        if (!(n.shape[out[i]] == o.shape[in[i]])) return kUnsupported;
      const auto at = std::find(out.begin(), out.end(), a);
      return at == out.end() ? kUnsupported : in[at - out.begin()];
    }
    default:
      return kUnsupported;
  }
}

}  // namespace

StatusOr<GraphDef> narrow_rows(const GraphDef& g) {
  const int n = static_cast<int>(g.nodes.size());
  std::vector<Demand> d(n);
  const auto want_whole = [&](int j) {
    d[j].whole = true;
    d[j].slice = -1;
  };
  const auto want_rows = [&](int j, int slice, int axis) {
    if (d[j].whole) return;
    if (d[j].slice < 0) {
      d[j].slice = slice;
      d[j].axis = axis;
    } else if (d[j].slice != slice || d[j].axis != axis) {
      want_whole(j);
    }
  };
  for (int o : g.outputs) want_whole(o);
  std::vector<char> narrowed(n, 0);
  std::vector<std::vector<int>> axes_of(n);  // per narrowed node: its operands' axes
  bool any = false;
  for (int i = n - 1; i >= 0; --i) {
    const Node& nd = g.nodes[i];
    if (!d[i].whole && d[i].slice < 0) continue;  // dead: DCE drops it
    if (nd.op == GraphOp::kSlice && d[i].whole) {
      want_rows(nd.inputs[0], i, nd.axis);
      continue;
    }
    bool ok = !d[i].whole && nd.op != GraphOp::kInput;
    std::vector<int> ax;
    for (size_t k = 0; ok && k < nd.inputs.size(); ++k) {
      ax.push_back(operand_axis(g, i, k, d[i].axis));
      ok = ax.back() != kUnsupported;
    }
    if (!ok) {
      for (int in : nd.inputs) want_whole(in);
      continue;
    }
    narrowed[i] = 1;
    any = true;
    for (size_t k = 0; k < nd.inputs.size(); ++k) {
      if (ax[k] >= 0) {
        want_rows(nd.inputs[k], d[i].slice, ax[k]);
      } else {
        want_whole(nd.inputs[k]);
      }
    }
    axes_of[i] = std::move(ax);
  }
  if (!any) return g;

  Rewriter rw(g);
  std::vector<int> small(n, -1);  // a narrowed node's value on the kept rows
  return rw.run([&](int i) -> int {
    const Node& nd = g.nodes[i];
    if (nd.op == GraphOp::kInput) return rw.copy(i);
    if (narrowed[i]) {
      Node m = nd;
      for (size_t k = 0; k < m.inputs.size(); ++k) {
        const int j = nd.inputs[k];
        const int ax = axes_of[i][k];
        if (ax < 0) {
          m.inputs[k] = rw.map(j);
        } else if (narrowed[j]) {
          m.inputs[k] = small[j];
        } else {  // a value used whole elsewhere: the kept rows of it, as the slice takes them
          Node s = g.nodes[d[i].slice];
          s.inputs = {rw.map(j)};
          s.axis = ax;
          m.inputs[k] = rw.em().emit(std::move(s));
        }
      }
      if (m.op == GraphOp::kReshape) {  // the target shape takes the kept rows' extent
        m.sym[d[i].axis] = rw.em().node(m.inputs[0]).shape[axes_of[i][0]];
      }
      small[i] = rw.em().emit(std::move(m));
      return Rewriter::kDropped;
    }
    if (nd.op == GraphOp::kSlice && narrowed[nd.inputs[0]]) return small[nd.inputs[0]];
    if (!d[i].whole && d[i].slice < 0) return Rewriter::kDropped;  // dead
    return rw.copy(i);
  });
}

}  // namespace dvm::passes
