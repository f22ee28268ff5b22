// Symbolic shape and dtype deduction for every graph op: operand checks here, the rules in
// src/shape/shape_rules.h (shared with the lazy runtime). Dims must be provably equal (the
// canonical forms of include/dvm/sym.h compare equal) or a constant 1 where they broadcast;
// anything else is a contradiction reported with the op and the dims.
#include <cstdint>
#include <utility>

#include "graph/graph_def.h"
#include "shape/shape_rules.h"

namespace dvm::graph {

namespace {

Status fail(const GraphDef& g, const Node& n, const std::string& msg) {
  return invalid_argument(g.name + ": " + graph_op_name(n.op) + ": " + msg);
}

// A node's operands as the shared rules read them.
struct Operands {
  const GraphDef& g;
  const Node& n;
  size_t size() const { return n.inputs.size(); }
  const SymShape& shape(size_t i) const { return g.nodes[n.inputs[i]].shape; }
  DType dtype(size_t i) const { return g.nodes[n.inputs[i]].dtype; }
};

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
  if (n.op != GraphOp::kInput) {
    // Constants, casts and iotas keep the dtype they were built with.
    shape::OpSite<SymExpr> site{n.op, n.sub, &n.axis, n.flag, &n.ints, &n.sym, n.dtype};
    Status st = shape::infer_op(Operands{g, n}, site, &n.shape, &n.dtype);
    if (!st.is_ok()) return fail(g, n, st.message());
  }
  if (n.shape.size() > static_cast<size_t>(kMaxRank)) {
    return fail(g, n,
                "rank " + std::to_string(n.shape.size()) + " exceeds " + std::to_string(kMaxRank));
  }
  return Status::ok();
}

int attention_groups(const SymShape& q, const SymShape& k) {
  return shape::attention_groups(std::span<const SymExpr>(q), std::span<const SymExpr>(k));
}

std::string shape_str(const SymShape& s) {
  return to_string(s);
}

}  // namespace dvm::graph
