// Rewriter: the copy-and-remap loop every pass shares.
#include "passes/passes.h"

namespace dvm::passes {

Rewriter::Rewriter(const GraphDef& src) : src_(src), remap_(src.nodes.size(), -1) {
  out_.name = src.name;
  out_.symbols = src.symbols;
}

int Rewriter::copy(int old_id) {
  graph::Node n = src_.nodes[old_id];
  for (int& i : n.inputs) {
    i = remap_[i];
    if (i < 0)
      em_.fail(internal_error(src_.name + ": pass dropped an operand of " +
                              graph::node_str(src_, old_id)));
  }
  int id = em_.emit(std::move(n));
  if (id >= 0 && out_.nodes[id].op == GraphOp::kInput) out_.inputs.push_back(id);
  return id;
}

StatusOr<GraphDef> Rewriter::run(const std::function<int(int)>& fn) {
  for (size_t i = 0; i < src_.nodes.size(); ++i) {
    remap_[i] = fn(static_cast<int>(i));
    DVM_RETURN_IF_ERROR(em_.status());
    if (remap_[i] == -1) return internal_error("pass lost " + graph::node_str(src_, i));
    if (remap_[i] >= 0) {
      const graph::Node& a = src_.nodes[i];
      const graph::Node& b = out_.nodes[remap_[i]];
      if (a.dtype != b.dtype || !(a.shape == b.shape)) {
        return internal_error("pass changed the type of " + graph::node_str(src_, i) + " to " +
                              graph::node_str(out_, remap_[i]));
      }
    }
  }
  for (size_t i = 0; i < src_.outputs.size(); ++i) {
    if (remap_[src_.outputs[i]] < 0) return internal_error("pass dropped an output");
    out_.outputs.push_back(remap_[src_.outputs[i]]);
    out_.output_names.push_back(src_.output_names[i]);
  }
  return std::move(out_);
}

}  // namespace dvm::passes
