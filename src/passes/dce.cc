// Pass: dead code elimination. A node is live if an output depends on it; inputs always stay
// (they define the argument list).
#include "passes/passes.h"

namespace dvm::passes {

StatusOr<GraphDef> dce(const GraphDef& g) {
  std::vector<char> live(g.nodes.size(), 0);
  for (int o : g.outputs) live[o] = 1;
  for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
    if (g.nodes[i].op == GraphOp::kInput) live[i] = 1;
    if (!live[i]) continue;
    for (int in : g.nodes[i].inputs) live[in] = 1;
  }
  Rewriter rw(g);
  return rw.run([&](int id) { return live[id] ? rw.copy(id) : Rewriter::kDropped; });
}

}  // namespace dvm::passes
