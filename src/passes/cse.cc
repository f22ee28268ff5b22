// Pass: common subexpression elimination. Nodes are value-numbered by (op, operands,
// attributes) after operand remapping; inputs are never merged (they are distinct arguments).
#include <unordered_map>

#include "passes/passes.h"

namespace dvm::passes {

namespace {

size_t node_hash(const graph::Node& n) {
  size_t h = static_cast<size_t>(n.op) * 1000003u ^ static_cast<size_t>(n.sub) * 7919u;
  for (int i : n.inputs) h = h * 31 + static_cast<size_t>(i);
  for (int64_t v : n.ints) h = h * 37 + static_cast<size_t>(v);
  for (const SymExpr& e : n.sym) h = h * 41 + e.hash();
  return h ^ (static_cast<size_t>(n.axis) << 7) ^ static_cast<size_t>(n.dtype);
}

}  // namespace

StatusOr<GraphDef> cse(const GraphDef& g) {
  Rewriter rw(g);
  std::unordered_multimap<size_t, int> seen;  // hash -> new id
  return rw.run([&](int id) {
    const graph::Node& src = g.nodes[id];
    if (src.op == GraphOp::kInput) return rw.copy(id);
    graph::Node probe = src;
    for (int& i : probe.inputs) i = rw.map(i);
    size_t h = node_hash(probe);
    auto range = seen.equal_range(h);
    for (auto it = range.first; it != range.second; ++it) {
      if (rw.out().nodes[it->second] == probe) return it->second;
    }
    int made = rw.copy(id);
    if (made >= 0) seen.emplace(h, made);
    return made;
  });
}

}  // namespace dvm::passes
